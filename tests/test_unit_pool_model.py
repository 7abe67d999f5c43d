"""The unit-granular design of the vLLM pool (``tests/unit_pool_model.py``: block-free
free queue of table pieces, one key record per trace unit, id-free ``largest_free_run``,
reachable keys = distinct keys) gives every sequential-replay record of
``BlockHashCache`` on hash-id traces whose unit is a multiple of the block size."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.policies.block_hash import BlockHashCache
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace
from conftest import draw_prompt_len
from unit_pool_model import UnitPoolModel

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000)) // 10


def _records_equal(a, b):
    for c in a.columns:
        assert np.array_equal(a[c], b[c]), (c, np.flatnonzero(a[c] != b[c])[:5])


@st.composite
def unit_traces(draw):
    """Hash-id traces (U = 2 … 4 blocks) whose prompts share prefixes: a cut of one of
    three stems of unit ids, then fresh ids; partial or whole last units, outputs."""
    B = draw(st.sampled_from([2, 4]))
    U = B * draw(st.integers(2, 4))
    partial = draw(st.booleans())
    stems = [[100 * s + j for j in range(8)] for s in range(3)]
    n = draw(st.integers(1, 30))
    prompts, lens, outs = [], [], []
    for i in range(n):
        stem = stems[draw(st.integers(0, 2))]
        ids = stem[: draw(st.integers(0, 8))] + [1000 + 10 * i + j for j in range(draw(st.integers(0, 3)))]
        if not ids:
            ids = [stem[0]]
        prompts.append(ids)
        lens.append(draw_prompt_len(draw, st, len(ids), U, partial))
        outs.append(draw(st.sampled_from([0, 1, 2, B, B + 1, 3 * B + 1])))
    t = Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n, prompt_len=lens,
                            output_len=outs, prompt_ids=prompts, unit_tokens=U, partial_last_unit=partial)
    most = max(-(-t.kv_len(i) // B) for i in range(n))
    blocks = most + draw(st.integers(0, 3 * most))  # tight pools: evictions on most requests
    return t, B, blocks


@settings(max_examples=EXAMPLES, deadline=None)
@given(unit_traces())
def test_unit_model_gives_block_hash_records(case):
    t, B, blocks = case
    want = replay_sequential(t, BlockHashCache(blocks + 1, B))
    got = replay_sequential(t, UnitPoolModel(blocks + 1, B))
    _records_equal(want, got)


def test_unit_model_by_hand():
    # B = 2, U = 4; pool of 4 blocks. Request a: ids [7, 8], P = 8, no output: 4 full
    # blocks (a0 a1 | a2 a3), hit 0; freed tail first -> queue (by position) a3 a2 a1 a0.
    # Request b: ids [7, 9], P = 7, 2 outputs (kv 8): hits unit 7 (2 blocks, cap (7-1)//2 = 3),
    # touches a0 a1, takes 2 new blocks from the head (a3, a2: 2 evictions), caches
    # b2 (9: 0-1) and b3 (9: 2 + output): 4 keys, 2 of them a's.
    t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[8, 7], output_len=[0, 2],
                            prompt_ids=[[7, 8], [7, 9]], unit_tokens=4, partial_last_unit=True)
    rec = replay_sequential(t, UnitPoolModel(5, 2))
    assert rec["hit_tokens"].tolist() == [0, 4]
    assert rec["evicted_tokens"].tolist() == [0, 4]
    assert rec["cached_slots"].tolist() == [4, 4]
    assert rec["cached_tokens"].tolist()[-1] == 8
    assert rec["largest_free_run"].tolist()[-1] == 0


def _mooncake():
    from radixkv.trace.load import load_trace

    shared = os.environ.get("RADIXKV_SHARED")
    if not shared:
        pytest.skip("RADIXKV_SHARED is not set")
    return load_trace(os.path.join(shared, "traces", "mooncake-fast25", "conversation_trace.jsonl"))


def _per_block(blocks, B):
    pol = BlockHashCache(blocks + 1, B)
    pol.unit_granular = False
    return pol


@pytest.mark.slow
@pytest.mark.parametrize("cap,B", [(1_000_000, 16), (3_000_000, 32)])
def test_unit_model_on_mooncake(cap, B):
    """The plain-Python design model against the per-block kernels, whole Mooncake trace."""
    t = _mooncake()
    blocks = cap // B
    _records_equal(replay_sequential(t, _per_block(blocks, B)),
                   replay_sequential(t, UnitPoolModel(blocks + 1, B)))


@pytest.mark.slow
@pytest.mark.parametrize("cap,B", [(1_000_000, 16), (3_000_000, 32), (10_000_000, 16)])
def test_compiled_unit_pool_on_mooncake(cap, B):
    """The compiled unit pool (the default sequential path on hash-id traces) gives every
    record the per-block kernels give, over the whole Mooncake conversation trace."""
    t = _mooncake()
    blocks = cap // B
    pol = BlockHashCache(blocks + 1, B)
    rec = replay_sequential(t, pol)
    assert pol._unit is not None  # the unit pool ran
    _records_equal(rec, replay_sequential(t, _per_block(blocks, B)))
