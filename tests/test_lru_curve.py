"""One-pass unit-lru curves (LRU stack distances) against a brute-force oracle and against
one replay per capacity, column by column."""
from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.policies.unit_lru import UnitLRUCache
from radixkv.replay.curve import run_curve
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace
from _unit_lru_oracle import draw_unit_prompts, unit_lru_oracle, unit_trace

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000)) // 4
TRACES = Path(__file__).resolve().parent.parent / "traces"


oracle = unit_lru_oracle


def _oracle_hits_on_touch(prompts, capacity_units):
    """References that find their unit cached when touched (plain OrderedDict LRU)."""
    cache: OrderedDict = OrderedDict()
    hits = 0
    for ids in prompts:
        for j in range(len(ids)):
            k = tuple(ids[: j + 1])
            if k in cache:
                hits += 1
                cache.move_to_end(k)
            else:
                if len(cache) == capacity_units:
                    cache.popitem(last=False)
                cache[k] = True
    return hits


@st.composite
def cases(draw):
    U, partial, prompts, lens = draw_unit_prompts(draw, st, 14)
    caps = draw(st.lists(st.integers(1, 24), min_size=1, max_size=5))
    return U, partial, prompts, lens, caps


@settings(max_examples=EXAMPLES, deadline=None)
@given(cases())
def test_one_pass_matches_oracle(case):
    U, partial, prompts, lens, caps = case
    t = unit_trace(prompts, lens, U, partial)
    recs = UnitLRUCache.replay_curve(t, [UnitLRUCache(c, U) for c in caps])
    for c, rec in zip(caps, recs):
        want = oracle(prompts, lens, U, c)
        got = list(zip(rec["hit_tokens"].tolist(), rec["evicted_tokens"].tolist(),
                       rec["cached_slots"].tolist(), rec["valid_tokens"].tolist()))
        assert got == want
        # every miss inserts a unit; the cache ends with cached_slots of them: the rest were evicted
        misses = sum(len(p) for p in prompts) - _oracle_hits_on_touch(prompts, c)
        assert rec.meta["evictions"] == misses - want[-1][2]


def test_hand_worked_partial_units():
    # U = 4, capacity 2 units. r0: ids [1,2], P = 6 -> units [1] (4 tok), [1,2] (2 tok): miss, valid 6.
    # r1: ids [1,2,5], P = 9 -> hit [1],[1,2]: 2 units x 4 = 8 tokens (capped at P = 9 only);
    #     the hit keeps [1,2]'s 2 tokens; [1,2,5] (1 tok) evicts LRU [1] (4 tok): valid 2 + 1 = 3.
    # r2: ids [1], P = 4 -> [1] was evicted: hit 0; inserting it evicts [1,2] (2 tok): valid 1 + 4 = 5.
    t = Trace.from_requests(
        req_id=list("abc"), arrival_s=[0] * 3, prompt_len=[6, 9, 4], output_len=[0] * 3,
        prompt_ids=[[1, 2], [1, 2, 5], [1]], unit_tokens=4, partial_last_unit=True,
    )
    (rec,) = UnitLRUCache.replay_curve(t, [UnitLRUCache(2, 4)])
    assert rec["hit_tokens"].tolist() == [0, 8, 0]
    assert rec["evicted_tokens"].tolist() == [0, 4, 2]
    assert rec["valid_tokens"].tolist() == [6, 3, 5]
    assert rec["cached_slots"].tolist() == [2, 2, 2]
    assert rec.meta["evictions"] == 2


def _same(a, b):
    """Every column and every summary value (but timings) of two run_curve answers agree."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if not isinstance(y, tuple):
            assert type(x) is type(y) and str(x) == str(y)
            continue
        (ra, sa), (rb, sb) = x, y
        assert ra.num_slots == rb.num_slots
        for c in rb.columns:
            assert np.array_equal(ra[c], rb[c]), c
        sa = {k: v for k, v in sa.items() if k != "timing_s"}
        sb = {k: v for k, v in sb.items() if k != "timing_s"}
        assert sa == sb


@pytest.mark.parametrize("name", ["demo.jsonl", "multi_turn.jsonl", "customer_service.jsonl", "agent_tools.jsonl"])
def test_bundled_traces_every_capacity(name):
    from radixkv.trace.load import load_trace

    t = load_trace(TRACES / name).head(150)
    tot = int(t.prompt_len.sum())
    caps = [1, 3, tot // 1000, tot // 100, tot // 20, tot // 5, tot, 2 * tot]
    spec = parse_policy("unit-lru")
    one = run_curve(t, spec, caps)
    assert all(s["timing_s"]["one_pass"] for _, s in one)
    _same(one, run_curve(t, spec, caps, one_pass=False))


def test_too_small_capacity_is_the_same_error():
    t = Trace.from_requests(req_id=["a"], arrival_s=[0], prompt_len=[900], output_len=[1], prompt_ids=[[1, 2]],
                            unit_tokens=512, partial_last_unit=True)
    spec = parse_policy("unit-lru")
    one = run_curve(t, spec, [100, 1024])
    _same(one, run_curve(t, spec, [100, 1024], one_pass=False))
    assert "at least one unit" in str(one[0])


def test_replay_curve_does_not_touch_the_policies():
    t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 0], prompt_len=[3, 3], output_len=[0, 0],
                            prompt_ids=[[1, 2, 3], [1, 2, 3]])
    pol = build_policy(parse_policy("unit-lru"), PoolSpec(capacity_tokens=8))
    UnitLRUCache.replay_curve(t, [pol])
    rec = replay_sequential(t, pol)
    assert rec["hit_tokens"].tolist() == [0, 3]


def test_dense_index_numbers_keys_in_order_of_first_appearance():
    import numpy as np

    from radixkv.policies._lru_stack import dense_index

    rng = np.random.default_rng(3)
    # few distinct values, many repeats, and keys that share their low bits (probe chains)
    base = np.array([0, 1, 2**63, 2**40 + 5, 5, 2**32 + 5, 17], dtype=np.uint64)
    keys = base[rng.integers(0, len(base), 500)]
    idx, n = dense_index(keys)
    seen = {}
    want = [seen.setdefault(int(k), len(seen)) for k in keys]
    assert n == len(seen)
    assert idx.tolist() == want
    idx0, n0 = dense_index(np.zeros(0, dtype=np.uint64))
    assert (len(idx0), n0) == (0, 0)
