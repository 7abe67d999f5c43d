"""BlockHashCache's unit-granular pool (:mod:`radixkv.policies._hash_unit_kernels`, used by
the sequential replay of hash-id traces whose unit is a multiple of the block size) gives
the records of its per-block kernels and of the brute-force reference."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.policies import _hash_kernels as K
from radixkv.policies.block_hash import BlockHashCache
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace
from reference_vllm import ReferenceVLLM
from conftest import draw_prompt_len
from test_unit_pool_model import _records_equal, unit_traces

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000)) // 10


def _per_block(blocks, B):
    pol = BlockHashCache(blocks + 1, B)
    pol.unit_granular = False
    return pol


@settings(max_examples=EXAMPLES, deadline=None)
@given(unit_traces())
def test_unit_pool_gives_per_block_records(case):
    t, B, blocks = case
    want = replay_sequential(t, _per_block(blocks, B))
    pol = BlockHashCache(blocks + 1, B)
    got = replay_sequential(t, pol)
    assert pol._unit is not None  # the unit-granular pool ran (every row is a span row, detail rows too)
    _records_equal(want, got)


@settings(max_examples=max(10, EXAMPLES // 4), deadline=None)
@given(unit_traces())
def test_unit_pool_matches_the_brute_force_reference(case):
    t, B, blocks = case
    ref = ReferenceVLLM(blocks + 1, B)
    ref.replay_span = None
    want = replay_sequential(t, ref)
    got = replay_sequential(t, BlockHashCache(blocks + 1, B))
    for c in ("hit_tokens", "held_tokens", "evicted_tokens", "used_slots", "cached_slots", "free_slots",
              "valid_tokens", "cached_tokens", "largest_free_run"):
        assert np.array_equal(want[c], got[c]), c


def test_per_block_hooks_refuse_after_a_unit_replay():
    from radixkv.trace.types import Trace

    t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0.0, 1.0], prompt_len=[10, 9], output_len=[3, 1],
                            prompt_ids=[[1, 2, 3], [1, 2, 4]], unit_tokens=4, partial_last_unit=True)
    pol = BlockHashCache(9, 2)
    replay_sequential(t, pol)
    assert pol._unit is not None
    with pytest.raises(RuntimeError, match="unit granularity"):
        pol.free_queue()
    # token traces and B = 1 stay per block
    pol = BlockHashCache(20, 1)
    replay_sequential(t, pol)
    assert pol._unit is None
    assert len(pol.free_queue()) == 19


def test_a_request_with_more_units_than_the_first_arrays_hold():
    # 1,500 units of 2 blocks (B = 2): the pool's arrays start smaller and grow (the
    # arena is compacted, then sized for the request); a second request hits most of it
    from radixkv.trace.types import Trace

    ids = list(range(1500))
    t = Trace.from_requests(req_id=["a", "b", "c"], arrival_s=[0.0, 1.0, 2.0], prompt_len=[6000, 4806, 3001],
                            output_len=[5, 2, 9], prompt_ids=[ids, ids[:1200] + [9999, 9998], ids[:751]],
                            unit_tokens=4, partial_last_unit=True)
    want = replay_sequential(t, _per_block(5000, 2))
    pol = BlockHashCache(5001, 2)
    got = replay_sequential(t, pol)
    assert pol._unit is not None
    _records_equal(want, got)
    assert got["hit_tokens"].tolist()[1] == 4800  # by hand: 1,200 units of 4 tokens


def test_a_short_request_after_a_long_one_in_one_span():
    """Block 2, units of 4 tokens. Request a (one 1-token unit, 2 outputs) leaves its
    output segment at the second place of the span's segment scratch; b (one whole unit
    [7], KV 4 tokens) has one segment. Its first block [0, 2) must get unit 7's key,
    whatever the scratch holds past b's own segment, so e, whose first unit is [7] again,
    hits b's two blocks: 4 tokens (vLLM: full blocks of identical content; the cap
    (8 − 1) // 2 = 3 blocks does not bind). The filler requests keep a, b and e inside
    one span (the replay's detail rows run on their own)."""
    n_fill = 100
    ids = [[100], [7], [7, 8]] + [[1000 + k] for k in range(n_fill)]
    t = Trace.from_requests(req_id=[f"r{k}" for k in range(len(ids))], arrival_s=list(range(len(ids))),
                            prompt_len=[1, 4, 8] + [4] * n_fill, output_len=[2, 1, 1] + [1] * n_fill,
                            prompt_ids=ids, unit_tokens=4, partial_last_unit=True)
    pol = BlockHashCache(1001, 2)
    hits = replay_sequential(t, pol)["hit_tokens"].tolist()
    assert pol._unit is not None
    assert hits[:3] == [0, 0, 4]


@st.composite
def wide_unit_traces(draw):
    """Hash-id traces with G = U / B around and past 64 blocks per unit (the masks of a
    unit record take more than one 64-bit word): B = 2, G in {63, 64, 65, 130}."""
    B = 2
    G = draw(st.sampled_from([63, 64, 65, 130]))
    U = B * G
    partial = draw(st.booleans())
    stems = [[100 * s + j for j in range(4)] for s in range(2)]
    n = draw(st.integers(1, 12))
    prompts, lens, outs = [], [], []
    for i in range(n):
        stem = stems[draw(st.integers(0, 1))]
        ids = stem[: draw(st.integers(0, 4))] + [1000 + 10 * i + j for j in range(draw(st.integers(0, 2)))]
        if not ids:
            ids = [stem[0]]
        prompts.append(ids)
        lens.append(draw_prompt_len(draw, st, len(ids), U, partial))
        outs.append(draw(st.sampled_from([0, 1, 2, B + 1, 70])))
    t = Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n, prompt_len=lens,
                            output_len=outs, prompt_ids=prompts, unit_tokens=U, partial_last_unit=partial)
    most = max(-(-t.kv_len(i) // B) for i in range(n))
    return t, B, most + draw(st.integers(0, 2 * most))


@settings(max_examples=max(10, EXAMPLES // 4), deadline=None)
@given(wide_unit_traces())
def test_unit_pool_with_multiword_masks_gives_per_block_records(case):
    t, B, blocks = case
    want = replay_sequential(t, _per_block(blocks, B))
    pol = BlockHashCache(blocks + 1, B)
    got = replay_sequential(t, pol)
    assert pol._unit is not None
    _records_equal(want, got)


def test_unit_keys_equal_iff_prefixes_equal():
    """The kernels' chained unit keys against the design model's plain-Python formula, and
    by hand: [5, 6, 7] and [5, 6, 8] share the keys of units 0 and 1 and no later key, and
    the keys of one request's units are distinct (a regular block is named by its unit's
    key and its position in the unit, so the blocks of equal prefixes are named alike)."""
    from radixkv.policies import _hash_unit_kernels as UK
    from unit_pool_model import unit_keys as model_unit_keys

    G, B = 4, 2
    keys = np.empty(6, dtype=np.int64)
    UK.unit_keys_all(np.array([5, 6, 7, 5, 6, 8], dtype=np.int64), np.array([0, 3, 6], dtype=np.int64), keys)
    ka, kb = keys[:3], keys[3:]
    assert ka[0] == kb[0] and ka[1] == kb[1] and ka[2] != kb[2]
    assert len(set(ka.tolist())) == 3
    assert ka[2] not in kb.tolist()
    # the model's independent plain-Python formula gives the same 64 bits
    seq = Trace.from_requests(req_id=["a"], arrival_s=[0.0], prompt_len=[3 * G * B], output_len=[0],
                              prompt_ids=[[5, 6, 7]], unit_tokens=G * B, partial_last_unit=False).kv_seq(0)
    assert [k & ((1 << 64) - 1) for k in ka.tolist()] == model_unit_keys(seq)
