"""The concurrent miss causes on the compiled loops are the Python loop's, byte for byte.

With a :class:`~radixkv.replay.conc_misses.MissRecorder` the compiled vLLM and SGLang
loops record the recorder's events inside the loop
(:mod:`radixkv.replay._miss_rec_kernels`) instead of falling back to the Python loop. On
hypothesis traces (shared stems, pools small enough to evict and preempt/retract, step
budgets that chunk, fast-forward on and off, vLLM with and without chunked prefill, SGLang
fcfs and lpm) both paths must give the same event stream, the same preemption
bookkeeping, and the same per-request CSV and summary JSON bytes; the compiled path must
be the one that ran.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixkv.cost import UnitStepCost
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.policies.registry import parse_policy
from radixkv.replay import conc_sglang
from radixkv.replay import conc_vllm_fast as F
from radixkv.replay.conc_misses import MissRecorder, attach_concurrent_causes, replay_events, trie_nodes
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.misses import trace_segments
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace.types import Trace
from test_radix_property import token_traces, unit_traces

from _conc_cases import COST_OVERHEAD as COST
from _conc_cases import draw_sglang_case, draw_vllm_case
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _run(monkeypatch, tr, make_policy, spec_text, cfg, ff, compiled, cost, tmp_path, tag):
    """Replay with a recorder through the compiled (or the Python) loop; returns the
    recorder, the result and the bytes of its CSV and JSON."""
    taken = []
    with monkeypatch.context() as m:
        m.setattr(conc_sglang, "ENABLED", compiled)
        if not compiled:
            m.setattr(F, "_eligible", lambda *a: False)
        orig_v, orig_s = F.replay_compiled, conc_sglang.replay_compiled

        def spy_v(*a, **k):
            res = orig_v(*a, **k)
            taken.append(res is not None)
            return res

        def spy_s(*a, **k):
            res = orig_s(*a, **k)
            taken.append(res is not None)
            return res

        m.setattr(F, "replay_compiled", spy_v)
        m.setattr(conc_sglang, "replay_compiled", spy_s)
        pol = make_policy()
        rec = MissRecorder(tr, pol, cfg)
        res = replay_concurrent(tr, pol, cost, config=cfg, fast_forward=ff, recorder=rec)
    assert any(taken) == compiled
    attach_concurrent_causes(tr, parse_policy(spec_text), res, [rec])
    csv, js = tmp_path / f"{tag}.csv", tmp_path / f"{tag}.json"
    res.write_csv(csv)
    res.write_json(js)
    return rec, res, csv.read_bytes(), js.read_bytes()


def _assert_same(monkeypatch, tr, make_policy, spec_text, cfg, ff, cost, tmp_path):
    ra, resa, csva, jsa = _run(monkeypatch, tr, make_policy, spec_text, cfg, ff, True, cost, tmp_path, "compiled")
    rb, resb, csvb, jsb = _run(monkeypatch, tr, make_policy, spec_text, cfg, ff, False, cost, tmp_path, "python")
    for x, y in zip(ra.events(), rb.events()):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert ra.admission_runs() == rb.admission_runs()
    if rb.admission_runs():
        assert int(resb.columns["preemptions"].sum()) > 0
    assert ra.pend == rb.pend
    assert csva == csvb
    assert jsa == jsb
    return resb


@st.composite
def vllm_cases(draw):
    tr, nb, size, cfg = draw_vllm_case(draw, st, 10)
    return tr, nb, size, cfg, draw(st.sampled_from([COST, UnitStepCost()]))


@SETTINGS
@given(vllm_cases(), st.booleans())
def test_vllm_compiled_recorder_equals_python_loop(monkeypatch, tmp_path_factory, case, ff):
    tr, nb, size, cfg, cost = case
    _assert_same(monkeypatch, tr, lambda: BlockHashCache(nb, size), f"vllm:{size}", cfg, ff, cost,
                 tmp_path_factory.mktemp("v"))


@st.composite
def sglang_cases(draw):
    return draw_sglang_case(draw, st)


@SETTINGS
@given(sglang_cases(), st.booleans())
def test_sglang_compiled_recorder_equals_python_loop(monkeypatch, tmp_path_factory, case, ff):
    tr, cap, size, cfg = case
    _assert_same(monkeypatch, tr, lambda: RadixCache(cap, size), f"sglang:{size}", cfg, ff, COST,
                 tmp_path_factory.mktemp("s"))


def test_retractions_and_readmissions_recorded(monkeypatch, tmp_path):
    """SGLang: a tight pool retracts decodes and re-admits them (the case of
    tests/test_conc_sglang.py); vLLM: a pool that preempts. The recorded preemption
    bookkeeping is the Python loop's, and non-trivial."""
    prompts = [list(range(8))] + [list(range(8)) + [1000 + 10 * i + j for j in range(4)] for i in range(1, 5)]
    tr = Trace.from_requests(req_id=[f"r{i}" for i in range(5)], arrival_s=[0.0] + [0.5 + 0.01 * i for i in range(4)],
                             prompt_len=[len(p) for p in prompts], output_len=[280] + [200] * 4, prompt_ids=prompts)
    res = _assert_same(monkeypatch, tr, lambda: RadixCache(300, 1), "sglang:1", SchedulerConfig(), True, COST,
                       tmp_path)
    assert res.summary()["preemptions"] > 0
    # vLLM, block 4, 6 blocks: two 4-token prompts decoding 13 tokens (test_misses_concurrent's case)
    tr = Trace.from_requests(req_id=["a", "b"], arrival_s=[0.0, 0.0], prompt_len=[4, 4], output_len=[13, 13],
                             prompt_ids=[[1, 2, 3, 4], [5, 6, 7, 8]])
    res = _assert_same(monkeypatch, tr, lambda: BlockHashCache(6, 4), "vllm:4", SchedulerConfig(), True,
                       UnitStepCost(), tmp_path)
    assert res.summary()["preemptions"] > 0


def test_log_growth_changes_nothing(monkeypatch, tmp_path):
    """Logs that start tiny and grow many times (the loops hand back, the wrapper doubles
    them) record the same events."""
    from radixkv.replay import _miss_rec_kernels as MR

    prompts = [list(range(20)) + [500 + i] for i in range(40)]
    tr = Trace.from_requests(req_id=[f"r{i}" for i in range(40)], arrival_s=[0.001 * i for i in range(40)],
                             prompt_len=[21] * 40, output_len=[5 + i % 7 for i in range(40)], prompt_ids=prompts)
    orig = MR.new_state
    monkeypatch.setattr(MR, "new_state", lambda *a, **k: orig(*a, **{**k, "events": 1, "facts": 1}))
    _assert_same(monkeypatch, tr, lambda: BlockHashCache(40, 4), "vllm:4", SchedulerConfig(max_num_seqs=8), True,
                 COST, tmp_path)
    _assert_same(monkeypatch, tr, lambda: RadixCache(120, 1), "sglang:1", SchedulerConfig(max_num_seqs=8), True,
                 COST, tmp_path)


def test_event_replay_by_hand():
    """The trie replay of hand-made events: a (10 tokens) then b sharing its first 6; b
    queried after a's first 4 tokens were inserted holds 4, and its full-extent shadow
    (a complete, admitted first) holds 6."""
    tr = Trace.from_requests(req_id=["a", "b"], arrival_s=[0.0, 0.0], prompt_len=[10, 8], output_len=[1, 1],
                             prompt_ids=[list(range(10)), list(range(6)) + [90, 91]])
    segs = trace_segments(tr)
    kind = np.array([0, 1, 0], dtype=np.int64)
    req = np.array([0, 0, 1], dtype=np.int64)
    ext = np.array([0, 4, 0], dtype=np.int64)
    held, held_adm = replay_events(tr, segs, kind, req, ext, np.zeros(3, dtype=np.int64), 1, True,
                                   nodes=trie_nodes(segs))
    assert held.tolist() == [0, 4]
    assert held_adm.tolist() == [0, 6]
    # two roots (replicas): a's insert below root 1 is not seen from root 0
    held2, _ = replay_events(tr, segs, kind, req, ext, np.array([1, 1, 0], dtype=np.int64), 2, False)
    assert held2.tolist() == [0, 0]


@pytest.mark.parametrize("unit", [1, 4])
def test_trie_nodes_share_prefixes(unit):
    """Two requests sharing their first two segments share those two nodes, then branch."""
    tr = Trace.from_requests(req_id=["a", "b"], arrival_s=[0.0, 0.0], prompt_len=[3 * unit, 3 * unit],
                             output_len=[1, 1], prompt_ids=[[7, 8, 9], [7, 8, 5]], unit_tokens=unit)
    segs = trace_segments(tr)
    node_of, nn = trie_nodes(segs)
    a = node_of[segs[2][0]:segs[2][1]].tolist()
    b = node_of[segs[2][1]:segs[2][2]].tolist()
    assert a[:2] == b[:2] and a[2] != b[2]
    assert nn == 1 + len(set(a) | set(b))


def _unit_lru_unbounded_oracle(t):
    """Brute force: unit-lru on memory that never evicts hits a request's leading prompt
    units (ids >= 0; a unit ends at min((j + 1) U, P)) whose whole id chain from unit 0 an
    earlier prompt had; tokens to the end of the last such unit."""
    seen, hit = set(), []
    for r in range(len(t)):
        P, U = int(t.prompt_len[r]), int(t.unit_tokens)
        chain = []
        for j, x in enumerate(t.ids[t.id_offsets[r]:t.id_offsets[r + 1]].tolist()):
            if x < 0 or j * U >= P:
                break
            chain.append(x)
        k = 0
        while k < len(chain) and tuple(chain[:k + 1]) in seen:
            k += 1
        hit.append(min(k * U, P))
        seen.update(tuple(chain[:j + 1]) for j in range(len(chain)))
    return np.array(hit, dtype=np.int64)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(token_traces(), unit_traces()))
def test_fused_unit_lru_shadows_equal_separate_passes(t):
    """unit-lru's two shadows in one pass (``prefix_lengths_and_unit_lru_hits``): L equals
    the kernel run alone (``prefix_lengths``, which tests/test_misses.py checks against a
    brute-force oracle) and unit-lru's unbounded hits equal a brute-force oracle, whether
    read from the prefix table or from unit-lru's own keys; also when the tables start tiny
    and regrow."""
    from radixkv.replay import _miss_kernels as MK

    want = (MK.prefix_lengths(t).tobytes(), _unit_lru_unbounded_oracle(t).tobytes())
    for derive in (None, False):  # unit traces (no output ids) read unit-lru's hits from the prefix table
        out, hit = MK.prefix_lengths_and_unit_lru_hits(t, derive=derive)
        assert (out.tobytes(), hit.tobytes()) == want


def test_fused_unit_lru_shadows_regrow(monkeypatch):
    """Tables that start at 4 rows regrow many times: same values."""
    from radixkv.replay import _miss_kernels as MK

    prompts = [[i % 5, (i * 7) % 3, i] for i in range(60)]
    t = Trace.from_requests(req_id=[f"r{i}" for i in range(60)], arrival_s=[0.0] * 60, prompt_len=[3 * 4] * 60,
                            output_len=[2] * 60, prompt_ids=prompts, unit_tokens=4)
    want = (MK.prefix_lengths(t).tobytes(), _unit_lru_unbounded_oracle(t).tobytes())
    monkeypatch.setattr(MK, "_initial_rows", lambda segments: 4)
    for derive in (True, False):
        out, hit = MK.prefix_lengths_and_unit_lru_hits(t, derive=derive)
        assert (out.tobytes(), hit.tobytes()) == want
    assert int(hit.sum()) > 0
