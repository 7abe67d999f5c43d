"""The compiled vLLM loop (radixkv.replay.conc_vllm_fast) is the Python loop, bit for bit.

(1) Every committed golden of tests/data/concurrent/vllm made with prefix caching (the
real v1 ``Scheduler`` driven on CPU), replayed through the compiled loop (no per-step
hook), matches vLLM on every request: first-admission hit, admission step, finish step,
preemptions — with and without fast-forward.

(2) Hypothesis traces (shared prefixes, tight pools, every vLLM knob the loop covers, the
roofline and the unit step cost) give byte-identical results — every per-request column,
the summary, the pool integrals, the timeline — through the compiled loop and the Python
loop.

(3) The resumable stops (request slots, prefill log and timeline growing, progress
reports) change nothing; policies and options the loop does not cover take the Python loop.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _vllm_sched_golden import golden_files, load_golden, trace_path
from radixkv.cost import UnitStepCost
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.block_priority import BlockLFU, PriorityBlockHashCache
from radixkv.replay import conc_vllm_fast as F
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace.load import load_trace
from radixkv.trace.types import Trace

from _conc_cases import COST, draw_vllm_case


class _Spy:
    """Counts replays that took the compiled loop."""

    def __init__(self, monkeypatch):
        self.n = 0
        orig = F.replay_compiled

        def wrapped(*a, **k):
            res = orig(*a, **k)
            self.n += res is not None
            return res

        monkeypatch.setattr(F, "replay_compiled", wrapped)


def _replay(tr, pol_fn, cost, cfg, ff, compiled, monkeypatch, **kw):
    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(F, "_eligible", lambda *a: False)
        spy = _Spy(m)
        res = replay_concurrent(tr, pol_fn(), cost, config=cfg, fast_forward=ff, **kw)
        assert spy.n == int(compiled)
        return res


def _assert_identical(a, b):
    assert json.dumps(a.summary(), sort_keys=True) == json.dumps(b.summary(), sort_keys=True)
    assert a.columns.keys() == b.columns.keys()
    for c in a.columns:
        x, y = a.columns[c], b.columns[c]
        assert x.dtype == y.dtype, c
        assert x.tobytes() == y.tobytes(), c
    assert a.pool == b.pool
    if a.timeline is None or b.timeline is None:
        assert a.timeline is None and b.timeline is None
    else:
        assert list(a.timeline) == list(b.timeline)
        for c in a.timeline:
            assert a.timeline[c].dtype == b.timeline[c].dtype and a.timeline[c].tobytes() == b.timeline[c].tobytes(), c
    assert repr((a.steps, a.peak_running, a.busy_s, a.running_area, a.prefill_flops, a.duration_s)) == \
        repr((b.steps, b.peak_running, b.busy_s, b.running_area, b.prefill_flops, b.duration_s))


# ---------------------------------------------------------------------------- (1) goldens
# the compiled loop models FCFS; the priority goldens run on the Python loop (test_concurrent_vllm.py)
GOLDENS = [p for p in golden_files()
           if load_golden(p).config["prefix_caching"] and load_golden(p).config.get("scheduling_policy", "fcfs") == "fcfs"]


@pytest.mark.parametrize("fast_forward", [True, False], ids=["ff", "no-ff"])
@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_compiled_loop_matches_vllm_scheduler_golden(path, fast_forward, monkeypatch):
    g = load_golden(path)
    c = g.config
    tr = load_trace(trace_path(c["trace"]), format="native")
    if c.get("limit"):
        tr = tr.head(int(c["limit"]))
    cfg = SchedulerConfig(max_num_seqs=int(c["max_num_seqs"]), max_num_batched_tokens=int(c["max_num_batched_tokens"]),
                          enable_chunked_prefill=bool(c["chunked_prefill"]),
                          long_prefill_token_threshold=int(c.get("long_prefill_token_threshold", 0)),
                          watermark=float(c.get("watermark", 0.0)), admission="vllm")
    arrivals = np.asarray([r["arrive"] for r in g.requests], dtype=np.float64)
    spy = _Spy(monkeypatch)
    pol = BlockHashCache(int(c["num_gpu_blocks"]), int(c["block_size"]))
    res = replay_concurrent(tr, pol, UnitStepCost(), arrivals=arrivals, config=cfg, fast_forward=fast_forward)
    assert spy.n == 1
    bad = []
    for i, r in enumerate(g.requests):
        mine = (int(res["hit_tokens"][i]), int(res["admit_s"][i]), int(res["finish_s"][i]) - 1,
                int(res["preemptions"][i]))
        if mine != (r["hit"], r["admit"], r["finish"], r["preempt"]):
            bad.append((i, mine))
    assert bad == [], f"{path.name}: {len(bad)} of {len(g.requests)} requests mismatch; first {bad[:2]}"


# ---------------------------------------------------------------------------- (2) hypothesis
@st.composite
def cases(draw):
    tr, nb, size, cfg = draw_vllm_case(draw, st, 9, admissions=(None, "vllm"))
    cost = draw(st.sampled_from([COST, UnitStepCost(), UnitStepCost(0.01)]))
    return tr, nb, size, cfg, cost


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(cases(), st.booleans(), st.booleans())
def test_compiled_loop_equals_python_loop(monkeypatch, case, ff, timeline):
    tr, nb, size, cfg, cost = case
    runs = [_replay(tr, lambda: BlockHashCache(nb, size), cost, cfg, ff, compiled, monkeypatch, timeline=timeline)
            for compiled in (True, False)]
    _assert_identical(*runs)


# ------------------------------------------------- (2b) the priority pool (vllm:B@lfu), same loop
class _HeapLFU(BlockLFU):
    """LFU in heap mode (a priority that does not promise buckets)."""

    buckets = False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(cases(), st.booleans(), st.sampled_from(["lru", "lfu", "heap-lfu"]))
def test_priority_pool_compiled_loop_equals_python_loop(monkeypatch, case, ff, order):
    """``PriorityBlockHashCache`` (``vllm:B@lfu``) runs on the compiled loop (the per-block
    pool of radixkv.replay._conc_vllm_block_kernels with the policy's priority as its free
    order) with the Python loop's bytes, in bucket mode
    (the built-ins) and heap mode (any priority)."""
    tr, nb, size, cfg, cost = case
    ev = _HeapLFU() if order == "heap-lfu" else order
    make = lambda: PriorityBlockHashCache(nb, size, eviction_policy=ev)  # noqa: E731
    runs = [_replay(tr, make, cost, cfg, ff, compiled, monkeypatch, timeline=True) for compiled in (True, False)]
    _assert_identical(*runs)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(cases(), st.booleans())
def test_priority_pool_with_lru_priority_is_vllm(monkeypatch, case, ff):
    """With the priority (release time, 0) the priority pool evicts in vLLM's free-queue
    order (radixkv.policies._hash_kernels.PrioOrder), so its compiled concurrent replay gives
    exactly ``BlockHashCache``'s (whose loop matches vLLM's scheduler goldens, (1))."""
    tr, nb, size, cfg, cost = case
    a = _replay(tr, lambda: PriorityBlockHashCache(nb, size, eviction_policy="lru"), cost, cfg, ff, True,
                monkeypatch, timeline=True)
    b = _replay(tr, lambda: BlockHashCache(nb, size), cost, cfg, ff, True, monkeypatch, timeline=True)
    for c in a.columns:
        assert a.columns[c].tobytes() == b.columns[c].tobytes(), c
    for c in a.timeline:
        assert a.timeline[c].tobytes() == b.timeline[c].tobytes(), c


def test_lfu_keeps_the_block_hit_most_often(monkeypatch):
    """Worked by hand: block 4, 4 usable blocks, each request alone (8 prompt tokens, 1
    output: 2 full blocks), A A B C A. r0 caches a0 a1, released tail first (a1, then
    a0). r1 hits a0 only (cap (P − 1) // B = 1 block; a0 now has 1 hit), takes a
    keyless block x for its second block (a duplicate of a1), releases x then a0. r2 (B)
    takes the last keyless block and evicts one: a1 under both orders (oldest; 0 hits).
    r3 (C) evicts two of x (0 hits), a0 (1 hit), B's blocks (0 hits, released later):
    LRU x and a0, LFU x and B's tail block. So r4 (A) hits a0 under LFU only."""
    pa = list(range(8))
    pb = list(range(100, 108))
    pc = list(range(200, 208))
    prompts = [pa, pa, pb, pc, pa]
    tr = Trace.from_requests(req_id=[f"r{i}" for i in range(5)], arrival_s=[10.0 * i for i in range(5)],
                             prompt_len=[8] * 5, output_len=[1] * 5, prompt_ids=prompts)
    hits = {}
    for order in ("lru", "lfu"):
        spy = _Spy(monkeypatch)
        res = replay_concurrent(tr, PriorityBlockHashCache(5, 4, eviction_policy=order), UnitStepCost())
        assert spy.n == 1
        hits[order] = res.columns["hit_tokens"].tolist()
        monkeypatch.undo()
    assert hits["lru"] == [0, 4, 0, 0, 0]
    assert hits["lfu"] == [0, 4, 0, 0, 4]


# ---------------------------------------------------------------------------- (3) stops, paths
def _shared_prefix_trace(n=60):
    rng = np.random.default_rng(7)
    prompts, outputs, arrivals = [], [], []
    for i in range(n):
        stem = list(range(1000 * (i % 4), 1000 * (i % 4) + int(rng.integers(20, 90))))
        prompts.append(stem + [90000 + 100 * i + j for j in range(int(rng.integers(1, 30)))])
        outputs.append(int(rng.integers(1, 80)))
        arrivals.append(0.002 * i)
    return Trace.from_requests(req_id=[f"q{i}" for i in range(len(prompts))], arrival_s=arrivals,
                               prompt_len=[len(p) for p in prompts], output_len=outputs, prompt_ids=prompts)


def test_growing_slots_and_log_and_progress_change_nothing(monkeypatch):
    """Start the compiled loop with 1 request slot, a 1-step prefill log and a 1-row
    timeline, report progress after every finish: each stop resumes where it left off."""
    tr = _shared_prefix_trace()
    cfg = SchedulerConfig(max_num_seqs=24, max_num_batched_tokens=64)
    calls = []
    with monkeypatch.context() as m:
        m.setattr(F, "_SLOTS0", 1)
        m.setattr(F, "_LOG0", 1)
        m.setattr(F, "_TL0", 1)
        m.setattr(F, "_PROGRESS_EVERY", 1)
        spy = _Spy(m)
        a = replay_concurrent(tr, BlockHashCache(60, 4), COST, config=cfg, timeline=True,
                              progress=lambda done, total: calls.append((done, total)))
        assert spy.n == 1
    b = _replay(tr, lambda: BlockHashCache(60, 4), COST, cfg, True, False, monkeypatch, timeline=True)
    _assert_identical(a, b)
    assert a.summary()["preemptions"] > 0 and a.peak_running > 1
    assert calls[-1] == (len(tr), len(tr))
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_other_policies_options_take_the_python_loop(monkeypatch):
    tr = _shared_prefix_trace(12)
    spy = _Spy(monkeypatch)
    replay_concurrent(tr, BlockHashCache(200, 4, verify=True), COST)
    replay_concurrent(tr, BlockHashCache(200, 4), COST, config=SchedulerConfig(schedule_policy="lpm"))
    replay_concurrent(tr, BlockHashCache(200, 4), COST, on_step=lambda *a: None)
    assert spy.n == 0
    replay_concurrent(tr, BlockHashCache(200, 4), COST)
    replay_concurrent(tr, BlockHashCache(200, 4), COST, timeline=True)
    assert spy.n == 2



@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 300), min_size=1, max_size=12), st.sampled_from([1.0, 1e9, 3e15, -7.5]),
       st.integers(0, 2**32 - 1))
def test_group_sums_are_numpys_sums_bit_for_bit(lens, scale, seed):
    """The compiled loop's prefill FLOPs per step (CK.group_sums) add each group as
    ``np.sum`` does (its pairwise summation: sequential below 8 items, 8 accumulators to
    128, halves above), so the sums are NumPy's to the bit: groups of 1 … 300 items, four
    magnitudes (np.sum itself is the oracle)."""
    from radixkv.replay import _conc_vllm_kernels as CK

    rng = np.random.default_rng(seed)
    x = rng.random(sum(lens)) * scale
    starts = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)
    ends = starts + np.asarray(lens, dtype=np.int64)
    got = CK.group_sums(x, starts, ends)
    want = np.array([np.sum(x[a:b]) for a, b in zip(starts, ends)])
    assert got.tobytes() == want.tobytes()
