"""The concurrent vLLM loop on the piece pool (radixkv.replay._conc_vllm_piece_kernels,
hash-id traces whose unit is a multiple of block_size) gives the per-block loop's results
byte for byte.

The per-block loop (``BlockHashCache.unit_granular = False``: ``_conc_vllm_kernels`` over
``_hash_kernels``) is the oracle: it is checked against vLLM's real v1 scheduler on the
committed goldens (tests/test_conc_vllm_fast.py) and against the Python loop. Here
hypothesis draws hash-id traces with shared unit prefixes, cut last units (straddle
blocks), unique prompt tails, outputs, staggered arrivals and pools tight enough to
preempt (re-admissions hit their own output blocks), over the loop's knobs (chunked
prefill, budgets, max_num_seqs, the chunk threshold, the watermark, fast-forward, both
cost models); every per-request column, the summary, the pool integrals, the timeline
and the miss recorder's events must be equal, and the unit path must be the one taken.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import draw_prompt_len
from radixkv.cost import CostModel, UnitStepCost
from radixkv.policies.block_hash import BlockHashCache
from radixkv.replay import conc_vllm_fast as F
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace.types import Trace

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000)) // 20
COST = CostModel(params=1e9, num_layers=8, attn_dim=1024, kv_bytes_per_token=1e5, peak_flops=1e14,
                 hbm_bytes_per_s=1e12)


def _pool(blocks, B, unit):
    pol = BlockHashCache(blocks + 1, B)
    pol.unit_granular = unit
    return pol


def _replay(tr, blocks, B, unit, **kw):
    pol = _pool(blocks, B, unit)
    res = replay_concurrent(tr, pol, kw.pop("cost", UnitStepCost()), timeline=True, **kw)
    assert isinstance(pol._unit, F._UnitConsumed) == unit  # the path asked for is the one taken
    return res


def _assert_identical(a, b):
    assert json.dumps(a.summary(), sort_keys=True) == json.dumps(b.summary(), sort_keys=True)
    assert a.columns.keys() == b.columns.keys()
    for c in a.columns:
        assert a.columns[c].dtype == b.columns[c].dtype and a.columns[c].tobytes() == b.columns[c].tobytes(), c
    assert a.pool == b.pool
    assert list(a.timeline) == list(b.timeline)
    for c in a.timeline:
        assert a.timeline[c].tobytes() == b.timeline[c].tobytes(), c
    assert repr((a.steps, a.peak_running, a.busy_s, a.running_area, a.prefill_flops, a.duration_s)) == \
        repr((b.steps, b.peak_running, b.busy_s, b.running_area, b.prefill_flops, b.duration_s))


@st.composite
def conc_unit_cases(draw):
    B = draw(st.sampled_from([2, 4]))
    U = B * draw(st.integers(1, 4))
    partial = draw(st.booleans())
    stems = [[100 * s + j for j in range(6)] for s in range(3)]
    n = draw(st.integers(1, 14))
    prompts, lens, outs, arr = [], [], [], []
    t = 0.0
    for i in range(n):
        stem = stems[draw(st.integers(0, 2))]
        ids = stem[: draw(st.integers(0, 6))] + [1000 + 10 * i + j for j in range(draw(st.integers(0, 2)))]
        if not ids:
            ids = [stem[0]]
        prompts.append(ids)
        lens.append(draw_prompt_len(draw, st, len(ids), U, partial))  # a cut last unit, or a unique tail
        outs.append(draw(st.sampled_from([0, 1, 2, B, B + 1, 3 * B + 1, 5 * B])))
        t += draw(st.sampled_from([0.0, 0.0, 0.003, 0.05, 0.4]))
        arr.append(t)
    tr = Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=arr, prompt_len=lens, output_len=outs,
                             prompt_ids=prompts, unit_tokens=U, partial_last_unit=partial)
    kv = [tr.kv_len(i) for i in range(n)]
    most = max(-(-x // B) for x in kv)
    blocks = most + draw(st.integers(0, 2 * most))  # tight: preemptions and evictions
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([4, 8, 16, 64, 4096]))
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=budget if chunked else max(budget, max(kv)),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 4, 12])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1])),
    )
    return tr, B, blocks, cfg, draw(st.booleans()), draw(st.sampled_from([UnitStepCost(), COST]))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conc_unit_cases())
def test_unit_pool_loop_gives_the_per_block_loop_bytes(case):
    tr, B, blocks, cfg, ff, cost = case
    want = _replay(tr, blocks, B, False, config=cfg, fast_forward=ff, cost=cost)
    got = _replay(tr, blocks, B, True, config=cfg, fast_forward=ff, cost=cost)
    _assert_identical(want, got)
    _assert_identical(got, _replay(tr, blocks, B, True, config=cfg, fast_forward=ff, cost=cost))  # same bytes again


@settings(max_examples=max(10, EXAMPLES // 4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conc_unit_cases())
def test_unit_pool_loop_feeds_the_miss_recorder_the_same_events(case):
    from radixkv.replay.conc_misses import MissRecorder

    tr, B, blocks, cfg, ff, cost = case
    out = []
    for unit in (False, True):
        pol = _pool(blocks, B, unit)
        rec = MissRecorder(tr, pol, cfg)
        res = replay_concurrent(tr, pol, cost, config=cfg, fast_forward=ff, recorder=rec)
        assert isinstance(pol._unit, F._UnitConsumed) == unit
        out.append((rec, res))
    (ra, a), (rb, b) = out
    for x, y in zip(ra.events(), rb.events()):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert ra.admission_runs() == rb.admission_runs()
    assert ra.pend == rb.pend
    for c in a.columns:
        assert a.columns[c].tobytes() == b.columns[c].tobytes(), c


def test_unit_pool_loop_by_hand():
    # B = 2, U = 4 (G = 2 blocks per unit), 12 usable blocks, one step = 1 s.
    # a: units [7, 8], P = 8, N = 1, at t = 0: 4 prompt blocks, no hit; finishes after
    #    its prefill step (t = 1), its blocks freed tail first (all four hashed).
    # b: units [7, 9], P = 7 (unit 9 cut at 3 tokens), N = 3, at t = 5: hits unit 7 (2
    #    blocks = 4 tokens; cap (7 − 1) // 2 = 3 blocks); held: the next block starts unit
    #    9, which no cached block starts → 4. Its KV extent is 7 + 2 = 9 tokens: block 3
    #    (tokens 6–7) is a straddle (unit 9's last token, then output).
    # c: units [7, 9], P = 6, N = 1, at t = 20 (after b finished): hits unit 7 and b's
    #    block 2 (tokens 4–5 of unit 9, wholly inside it) → min(3, (6 − 1) // 2 = 2) = 2
    #    blocks = 4 tokens; held: 6 (h = 3 uncapped covers the prompt).
    # d: units [7, 9], P = 7, N = 1, at t = 40: hits 3 blocks (cap 3) = 6 tokens; held: 6
    #    + b's straddle shares 1 token (unit 9's token 2) with d's last prompt block → 7.
    tr = Trace.from_requests(req_id=["a", "b", "c", "d"], arrival_s=[0, 5, 20, 40], prompt_len=[8, 7, 6, 7],
                             output_len=[1, 3, 1, 1], prompt_ids=[[7, 8], [7, 9], [7, 9], [7, 9]], unit_tokens=4,
                             partial_last_unit=True)
    res = _replay(tr, 12, 2, True)
    assert res.columns["hit_tokens"].tolist() == [0, 4, 4, 6]
    assert res.columns["held_tokens"].tolist() == [0, 4, 6, 7]
    assert res.columns["preemptions"].tolist() == [0, 0, 0, 0]


def test_per_block_hooks_refuse_after_a_unit_pool_replay():
    tr = Trace.from_requests(req_id=["a"], arrival_s=[0], prompt_len=[8], output_len=[2], prompt_ids=[[7, 8]],
                             unit_tokens=4, partial_last_unit=True)
    pol = _pool(10, 2, True)
    replay_concurrent(tr, pol, UnitStepCost())
    with pytest.raises(RuntimeError, match="piece pool"):
        pol.stats()
    with pytest.raises(RuntimeError, match="per-block state"):
        pol.free_queue()


@pytest.mark.parametrize("why", ["token trace", "unit not a multiple", "block_size 1", "switch off", "used pool"])
def test_other_replays_keep_the_per_block_loop(why):
    B, U, ids = 2, 4, [[7, 8], [7, 9]]
    if why == "token trace":
        U, ids = 1, [list(range(8)), list(range(7))]
    elif why == "unit not a multiple":
        U = 5
    elif why == "block_size 1":
        B = 1
    tr = Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[8, 7], output_len=[1, 2],
                             prompt_ids=ids, unit_tokens=U, partial_last_unit=True)
    pol = _pool(12, B, why != "switch off")
    if why == "used pool":
        pol.run_request("x", tr.kv_seq(0))
    replay_concurrent(tr, pol, UnitStepCost())
    assert pol._unit is None
    assert np.asarray(pol.free_queue()).size > 0  # per-block state, still usable
