"""The offline reference BeladyRadixCache: a hand-worked eviction, and a hit-rate curve
lying between LRU's and the infinite-capacity hit rate."""
from __future__ import annotations

import pytest

from _golden_traces import native_trace
from conftest import GOLDEN_LOCAL
from radixkv.errors import ConfigError
from radixkv.policies.radix import RadixCache
from radixkv.policies.radix_belady import BeladyRadixCache
from radixkv.trace.types import Trace


def _hits(cache, trace):
    out = []
    for i in range(len(trace)):
        a = cache.run_request(i, trace.kv_seq(i))
        out.append(None if a is None else a.hit_tokens)
    return out


def test_hand_worked_next_use():
    """Pool of 30 tokens holding X, Y, Z (10 tokens each); W needs 10 → one leaf goes.
    Next uses: X by request 4, Y by request 5, Z never: Belady evicts Z (LRU: X). Request
    4 then needs one slot: Belady evicts W (never used again; LRU: Y, the oldest)."""
    X, Y, Z, W = (list(range(b, b + 10)) for b in (100, 200, 300, 400))
    prompts = [X, Y, Z, W, X + [500], Y + [600]]
    n = len(prompts)
    trace = Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n,
                                prompt_len=[len(p) for p in prompts], output_len=[1] * n,
                                prompt_ids=prompts)
    assert _hits(BeladyRadixCache(30, 1, trace=trace), trace) == [0, 0, 0, 0, 10, 10]
    assert _hits(RadixCache(30, 1), trace) == [0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("page_size", [1, 16])
def test_curve_between_lru_and_infinite(page_size):
    """At every capacity of a curve on mixed200: LRU ≤ Belady ≤ infinite capacity (the
    infinite-capacity rate from the built-in LRU with a pool that never evicts), and
    Belady is strictly better than LRU where LRU evicts."""
    trace = native_trace(GOLDEN_LOCAL / "traces" / "mixed200.jsonl")
    total = int(trace.prompt_len.sum())

    def rate(cache):
        return sum(h or 0 for h in _hits(cache, trace)) / total

    inf = rate(RadixCache(10**6, page_size))
    for cap in (640, 1024, 1904, 3200, 6400):
        lru = rate(RadixCache(cap, page_size))
        bel = rate(BeladyRadixCache(cap, page_size, trace=trace))
        assert lru <= bel <= inf, (cap, lru, bel, inf)
        if lru < inf:
            assert bel > lru


def test_needs_trace_and_trace_indices():
    trace = native_trace(GOLDEN_LOCAL / "traces" / "edge300.jsonl")
    with pytest.raises(ConfigError, match="trace"):
        BeladyRadixCache(640, 1)
    c = BeladyRadixCache(640, 1, trace=trace)
    with pytest.raises(ValueError, match="trace index"):
        c.run_request(len(trace), trace.kv_seq(0))
