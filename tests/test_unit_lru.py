"""unit-lru against hand-worked cases and a brute-force OrderedDict oracle."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.policies.unit_lru import UnitLRUCache
from radixkv.trace.types import Trace
from _unit_lru_oracle import draw_unit_prompts, unit_lru_oracle, unit_trace

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000))


def oracle(prompts, lens, U, capacity_units):
    """Hit tokens per request (:func:`_unit_lru_oracle.unit_lru_oracle`)."""
    return [r[0] for r in unit_lru_oracle(prompts, lens, U, capacity_units)]


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
    U, partial, prompts, lens = draw_unit_prompts(draw, st, 12)
    return U, partial, prompts, lens, draw(st.integers(1, 20))


@settings(max_examples=EXAMPLES, deadline=None)
@given(traces())
def test_matches_oracle(case):
    U, partial, prompts, lens, cap = case
    assert run(unit_trace(prompts, lens, U, partial), cap) == oracle(prompts, lens, U, cap)


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
