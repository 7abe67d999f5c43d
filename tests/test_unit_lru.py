"""unit-lru against hand-worked cases and a brute-force OrderedDict oracle."""
from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.policies.unit_lru import UnitLRUCache
from radixkv.trace.types import Trace
from conftest import draw_prompt_len

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000))


def oracle(prompts, lens, U, partial, capacity_units):
    """Plain-Python cache study: units keyed by their whole id prefix (a tuple)."""
    cache: OrderedDict = OrderedDict()
    hits = []
    for ids, P in zip(prompts, lens):
        keys = [tuple(ids[: j + 1]) for j in range(len(ids))]
        h = 0
        while h < len(keys) and keys[h] in cache:
            h += 1
        hits.append(min(h * U, P))
        for k in keys:
            if k in cache:
                cache.move_to_end(k)
            else:
                if len(cache) == capacity_units:
                    cache.popitem(last=False)
                cache[k] = True
    return hits


def run(trace, cap_units):
    pol = UnitLRUCache(cap_units, trace.unit_tokens)
    return [pol.run_request(i, trace.kv_seq(i)).hit_tokens for i in range(len(trace))]


def test_hand_worked_mooncake_style():
    # U = 512, partial last unit. Capacity 3 units.
    # r0: ids [1,2] P=900 -> miss; cache (LRU->MRU) [1],[1,2]
    # r1: ids [1,2,3] P=1100 -> hits 2 units = 1024 tokens; cache [1],[1,2],[1,2,3]
    # r2: ids [4] P=10 -> miss; inserting evicts [1] (LRU); cache [1,2],[1,2,3],[4]
    # r3: ids [1,2] P=1024 -> [1] gone: hit 0; touching [1] evicts [1,2]... order:
    #     insert [1] evicts LRU [1,2]; then [1,2] missing -> insert evicts [1,2,3]
    # r4: ids [4] P=100 -> hit one unit, capped at P = 100
    t = Trace.from_requests(
        req_id=list("abcde"), arrival_s=[0] * 5, prompt_len=[900, 1100, 10, 1024, 100],
        output_len=[5] * 5, prompt_ids=[[1, 2], [1, 2, 3], [4], [1, 2], [4]],
        unit_tokens=512, partial_last_unit=True,
    )
    assert run(t, 3) == [0, 1024, 0, 0, 100]


def test_unhashed_tail_is_not_cached():
    # WEKA style: U = 64, floor(P/64) ids. Both prompts are 100 tokens with one id [7]:
    # the second hits exactly the 64 tokens of unit 7; the 36-token tail never hits.
    t = Trace.from_requests(
        req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[100, 100], output_len=[3, 3],
        prompt_ids=[[7], [7]], unit_tokens=64, partial_last_unit=False,
    )
    assert run(t, 10) == [0, 64]


@st.composite
def traces(draw):
    U = draw(st.sampled_from([1, 4, 512]))
    partial = draw(st.booleans())
    n = draw(st.integers(1, 12))
    prompts, lens = [], []
    for _ in range(n):
        k = draw(st.integers(1, 8))
        ids = draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
        P = draw_prompt_len(draw, st, k, U, partial)
        prompts.append(ids)
        lens.append(P)
    cap = draw(st.integers(1, 20))
    return U, partial, prompts, lens, cap


@settings(max_examples=EXAMPLES, deadline=None)
@given(traces())
def test_matches_oracle(case):
    U, partial, prompts, lens, cap = case
    t = Trace.from_requests(
        req_id=[str(i) for i in range(len(prompts))], arrival_s=[0.0] * len(prompts), prompt_len=lens,
        output_len=[1] * len(prompts), prompt_ids=prompts, unit_tokens=U, partial_last_unit=partial,
    )
    assert run(t, cap) == oracle(prompts, lens, U, partial and U > 1, cap)


def test_stats_account_for_every_slot():
    t = Trace.from_requests(
        req_id=["a", "b"], arrival_s=[0, 0], prompt_len=[3, 5], output_len=[0, 0],
        prompt_ids=[[1, 2, 3], [1, 2, 9, 9, 9]],
    )
    pol = UnitLRUCache(4, 1)
    for i in range(2):
        pol.run_request(i, t.kv_seq(i))
    s = pol.stats()
    # units: [1],[1,2],[1,2,3] then [1,2,9],[1,2,9,9],[1,2,9,9,9] -> 6 distinct, capacity 4
    assert (s.cached_slots, s.free_slots, s.used_slots) == (4, 0, 0)
    assert pol.evictions == 2
    assert np.int64(s.valid_tokens) == 4
