"""Fast-forward is exact: the concurrent replay gives the same metrics with and without it.

Hypothesis generates small traces (shared prefixes, so the cache matters; tight pools, so
requests are preempted) and replays each twice — fast-forward on and off — under vLLM's
and SGLang's rules on the policies that declare different decode behaviours
(``decode_slot_local``: BlockHashCache; ``decode_free_first``: RadixCache, NoCache;
neither: StaticReservedCache). Integer results (hits, preemptions, steps, the pool
peaks) must be equal; float results equal up to the rounding of the clock (fast-forward
sums a run of step times in another order).
"""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import draw_stem_requests
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.no_cache import NoCache
from radixkv.policies.radix import RadixCache
from radixkv.policies.block_priority import PriorityBlockHashCache
from radixkv.policies.radix_priority import PriorityRadixCache
from radixkv.policies.static_reserved import StaticReservedCache
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace.types import Trace

from _conc_cases import COST

POLICIES = {
    "vllm": lambda cap, s: BlockHashCache(cap // s + 1, s),
    "sglang": lambda cap, s: RadixCache(cap // s * s, s),
    "none": lambda cap, s: NoCache(cap // s, s),
    "static": lambda cap, s: StaticReservedCache(cap // s, s, 0.25),
    "radix-lfu": lambda cap, s: PriorityRadixCache(cap // s * s, s, eviction_policy="lfu"),
    "vllm-lfu": lambda cap, s: PriorityBlockHashCache(cap // s + 1, s, eviction_policy="lfu"),
}


@st.composite
def cases(draw):
    prompts, outputs, arrivals = draw_stem_requests(draw, st, 7, 40, 60)
    name = draw(st.sampled_from(sorted(POLICIES)))
    size = draw(st.sampled_from([1, 1, 4])) if name.startswith(("sglang", "radix")) else draw(st.sampled_from([1, 4, 16]))
    extent = max(len(p) + max(o - 1, 0) for p, o in zip(prompts, outputs))
    cap = (extent // size + 2 + draw(st.integers(0, 12))) * size
    if name == "static":
        cap = int(cap / 0.75) + 2 * size
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=draw(st.sampled_from([16, 64, 4096] if size > 4 else [8, 16, 64, 4096])),
        schedule_policy=draw(st.sampled_from(["fcfs", "fcfs", "lpm"])) if name != "none" and name != "static" else "fcfs",
        admission=draw(st.sampled_from([None, "vllm", "sglang"])),
    )
    tr = Trace.from_requests(req_id=[f"q{i}" for i in range(len(prompts))], arrival_s=arrivals,
                             prompt_len=[len(p) for p in prompts], output_len=outputs, prompt_ids=prompts)
    return tr, name, cap, size, cfg


def _same(a, b, key):
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            assert math.isnan(a) and math.isnan(b), key
        else:
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), key
    else:
        assert a == b, key


@settings(max_examples=220, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fast_forward_gives_the_same_metrics(case):
    tr, name, cap, size, cfg = case
    runs = [replay_concurrent(tr, POLICIES[name](cap, size), COST, config=cfg, fast_forward=ff) for ff in (True, False)]
    a, b = (r.summary() for r in runs)
    assert a.keys() == b.keys()
    for key in a:
        _same(a[key], b[key], key)
    for col in runs[0].columns:
        for x, y in zip(runs[0][col].tolist(), runs[1][col].tolist()):
            _same(x, y, col)
    assert runs[0].pool["waste_peak"] == runs[1].pool["waste_peak"]


def test_occupancy_of_one_request_counts_every_decode_step():
    """One request, P = 40, N = 40, vLLM block 16, num_gpu_blocks 7 (6 usable).

    By hand: the prefill step leaves 40 tokens in ceil(40/16) = 3 blocks; decode step d
    (d = 1 … 39) leaves 40 + d tokens: 3 blocks up to 48 tokens (d ≤ 8), 4 up to 64
    (d ≤ 24), 5 up to 79 (d ≤ 39); the last step finishes the request, so its 5 blocks
    (4 full + 1 partial, freed) are not held by it after that step. Held blocks after each
    of the 40 steps: 3 (prefill), 3 × 8, 4 × 16, 5 × 15, 0 (finished) — all between 3
    and 5 of 6 usable blocks, so the time-weighted mean lies in [0.5, 0.84]; the exact
    mean weights each step by its time, which grows with the context. Fast-forward on
    and off must agree.
    """
    tr = Trace.from_requests(req_id=["a"], arrival_s=[0.0], prompt_len=[40], output_len=[40],
                             prompt_ids=[list(range(40))])
    res = [replay_concurrent(tr, BlockHashCache(7, 16), COST, fast_forward=ff) for ff in (True, False)]
    m = [r.summary()["pool_used_share_mean"] for r in res]
    held = [3] + [3] * 8 + [4] * 16 + [5] * 15
    assert len(held) + 0 == 40 and res[0].steps == 40
    # step times by the cost model's own formula for a prefill then 39 decodes
    dts = [COST.step_time([40], [0])] + [COST.step_time([1], [39 + d]) for d in range(1, 40)]
    want = sum(h * dt for h, dt in zip(held[:-1] + [0], dts)) / sum(dts) / 6
    assert 0.5 <= m[0] <= 0.84
    assert m[0] == pytest.approx(want, rel=1e-9)
    assert m[1] == pytest.approx(want, rel=1e-9)


def test_timeline_and_step_columns_of_one_request(tmp_path):
    """The request above, step by step (block 16, 6 usable blocks). Step 1 computes the
    40-token prompt (3 blocks: 40 tokens). Decode step s (s = 2 … 40) leaves 40 + s − 1
    tokens: 3 blocks through s = 9 (48 tokens), 4 through s = 25 (64), 5 after. Step 40
    samples output 40 and finishes: its 4 full blocks stay cached, the partial fifth is
    freed → running 0, cached 4, free 2. Admitted in step 1, finished in step 40; the
    timeline is the same with and without fast-forward."""
    tr = Trace.from_requests(req_id=["a"], arrival_s=[0.0], prompt_len=[40], output_len=[40],
                             prompt_ids=[list(range(40))])
    res = [replay_concurrent(tr, BlockHashCache(7, 16), COST, fast_forward=ff, timeline=True) for ff in (True, False)]
    for r in res:
        t = r.timeline
        assert t["step"].tolist() == list(range(1, 41))
        assert t["running"].tolist() == [1] * 40 and t["waiting"].tolist() == [0] * 40
        assert t["batch_tokens"].tolist() == [40] + [1] * 39
        assert t["pool_running_slots"].tolist() == [3] * 9 + [4] * 16 + [5] * 14 + [0]
        assert t["pool_cached_slots"].tolist() == [0] * 39 + [4]
        assert t["pool_free_slots"].tolist() == [3] * 9 + [2] * 16 + [1] * 14 + [2]
        assert r["admit_step"].tolist() == [1] and r["finish_step"].tolist() == [40]
        assert t["time_s"][-1] == pytest.approx(r["finish_s"][0], rel=1e-12)
    path = tmp_path / "timeline.csv"
    res[0].write_timeline_csv(path)
    lines = path.read_text().splitlines()
    assert lines[0] == ("step,time_s,running,waiting,batch_tokens,pool_running_slots,pool_cached_slots,"
                        "pool_free_slots")
    assert len(lines) == 41 and lines[-1].endswith(",1,0,1,0,4,2")
    with pytest.raises(ValueError, match="timeline"):
        replay_concurrent(tr, BlockHashCache(7, 16), COST).write_timeline_csv(path)
