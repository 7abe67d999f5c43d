"""The unit-lru curve on the Mooncake conversation trace, pinned against a brute-force oracle.

Definition stated (and used in the closing note / paper): token hit rate = Σ hit tokens /
Σ prompt tokens over all 12,031 requests, no warm-up excluded, hit = leading cached 512-token
units × 512 capped at the prompt length; the request touches its units in prompt order.
The expected values come from a plain-Python OrderedDict model (tests/_unit_lru_oracle.py), not
from radixkv.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_path
from _unit_lru_oracle import unit_lru_oracle
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import run_replay

CAPACITIES = [10_000, 100_000, 1_000_000, 2_000_000, 3_000_000, 5_000_000, 10_000_000, 50_000_000]


def oracle_hit_tokens(trace, capacity_tokens):
    """Σ hit tokens of the plain-Python OrderedDict model of tests/_unit_lru_oracle.py."""
    prompts = [trace.prompt_ids(i).tolist() for i in range(len(trace))]
    return sum(r[0] for r in unit_lru_oracle(prompts, trace.prompt_len.tolist(), 512, capacity_tokens // 512))


@pytest.fixture(scope="module")
def mooncake():
    from radixkv.trace.load import load_trace

    return load_trace(shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl"))


@pytest.mark.parametrize("cap", CAPACITIES)
def test_unit_lru_curve_matches_oracle(mooncake, cap):
    _, s = run_replay(mooncake, parse_policy("unit-lru"), PoolSpec(capacity_tokens=cap))
    assert s["hit_tokens"] == oracle_hit_tokens(mooncake, cap)


def test_unit_lru_curve_pinned_values(mooncake):
    # token-weighted hit rates, computed by the oracle above (rounded to 4 places):
    expected = [0.0258, 0.0425, 0.0542, 0.0855, 0.1382, 0.2102, 0.2908, 0.3707]
    got = []
    for cap in CAPACITIES:
        _, s = run_replay(mooncake, parse_policy("unit-lru"), PoolSpec(capacity_tokens=cap))
        got.append(round(s["token_hit_rate"], 4))
    assert got == expected
    # the curve never decreases with capacity (LRU is a stack algorithm on a fixed key order)
    assert np.all(np.diff(got) >= 0)


def test_one_pass_curve_equals_per_point_replays(mooncake):
    # LRU stack distances (one pass) against one replay per capacity: every record column
    from radixkv.replay.curve import run_curve

    spec = parse_policy("unit-lru")
    one = run_curve(mooncake, spec, CAPACITIES)
    assert all(s["timing_s"]["one_pass"] for _, s in one)
    for cap, (ra, sa) in zip(CAPACITIES, one):
        rb, sb = run_replay(mooncake, spec, PoolSpec(capacity_tokens=cap))
        for c in rb.columns:
            assert np.array_equal(ra[c], rb[c]), (cap, c)
        assert {k: v for k, v in sa.items() if k != "timing_s"} == {k: v for k, v in sb.items() if k != "timing_s"}
