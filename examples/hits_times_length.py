"""Tutorial: a radix-tree eviction policy in a few lines — keep what saved the most.

SGLang's LRU evicts the leaf used longest ago. This policy evicts the leaf whose
**hits × length** is smallest (a node's hit count times its tokens: roughly the prefill
work it has saved), older last access first on ties. It runs on radixkv's compiled
radix tree through the eviction hook (radixkv.policies.radix_priority), so it replays at
the speed of the built-in policies.

    python examples/hits_times_length.py [TRACE] [--capacity-tokens 1904] [--page-size 1]

prints the token hit rate of LRU (sglang:P), SGLang's LFU and this policy on TRACE
(default: the bundled mixed200 golden trace).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from radixkv.policies.radix import RadixCache
from radixkv.policies.radix_priority import (
    F_END, F_HITS, F_START, F_TIME, EvictionPriority, PriorityRadixCache, eviction_policy,
    priority_function)


@priority_function
def hits_times_length(N, x, params):
    """(hits × tokens, last access) of node x: smallest is evicted first."""
    return float(N[x, F_HITS] * (N[x, F_END] - N[x, F_START])), float(N[x, F_TIME])


class HitsTimesLength(EvictionPriority):
    name = "hits-x-len"
    function = hits_times_length


class HitsTimesLengthCache(PriorityRadixCache):
    """SGLang's radix tree evicting the leaf of least hits × length."""

    name = "radix-hits-x-len"
    eviction = HitsTimesLength


def hit_rate(cache, trace) -> float:
    """Token hit rate of a sequential replay of *trace* through *cache*."""
    hit = total = 0
    for i in range(len(trace)):
        adm = cache.run_request(i, trace.kv_seq(i))
        hit += adm.hit_tokens if adm is not None else 0
        total += trace.prompt_len[i]
    return hit / total


def main(argv=None) -> dict:
    from radixkv.trace.load import load_trace

    here = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description="LRU vs LFU vs hits × length on a radix tree")
    ap.add_argument("trace", nargs="?", default=here / "tests/data/golden/traces/mixed200.jsonl")
    ap.add_argument("--capacity-tokens", type=int, default=1904)
    ap.add_argument("--page-size", type=int, default=1)
    a = ap.parse_args(argv)
    trace = load_trace(a.trace)
    c, p = a.capacity_tokens, a.page_size
    rates = {
        f"sglang:{p} (LRU)": hit_rate(RadixCache.from_capacity_tokens(c, p), trace),
        f"sglang:{p}@lfu": hit_rate(PriorityRadixCache.from_capacity_tokens(c, p, eviction_policy=eviction_policy("lfu")), trace),
        "hits x length": hit_rate(HitsTimesLengthCache.from_capacity_tokens(c, p), trace),
    }
    for k, v in rates.items():
        print(f"{k:20s} token hit rate {v:.4f}")
    return rates


if __name__ == "__main__":
    main()
