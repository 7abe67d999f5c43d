"""Benchmark: sequential replay of the Mooncake conversation trace through sglang-hicache.

Run with ``--benchmark-enable`` to time it; ``RADIXKV_BENCH_LIMIT`` sets how many requests
(default 500 so the single untimed run under ``--benchmark-disable`` stays short; 0 = all
12,031 requests, 145 M prompt tokens). GPU pool 1 M tokens, page 1, host pools of 4 M
and 50 M tokens, write-through and write-back (the points of experiments/fig_hicache.py).
Prompt tokens per second go to ``extra_info``; docs/hicache.md "Replay speed" has the
before/after figures.
"""
from __future__ import annotations

import pytest

from radixkv.policies.hicache import HiCacheRadixCache


@pytest.mark.parametrize("host_tokens,write_policy", [(4_000_000, "write_through"), (50_000_000, "write_back")])
def test_bench_hicache_mooncake(benchmark, mooncake_seqs, host_tokens, write_policy):
    seqs, prompt_tokens = mooncake_seqs

    def replay():
        cache = HiCacheRadixCache(1_000_000, 1, write_policy=write_policy, host_tokens=host_tokens)
        hits = 0
        for i, s in enumerate(seqs):
            hits += cache.run_request(i, s).hit_tokens
        return hits

    hits = benchmark.pedantic(replay, rounds=3, iterations=1, warmup_rounds=1)
    assert 0 <= hits <= prompt_tokens
    if benchmark.stats is not None:
        benchmark.extra_info["prompt_tokens"] = prompt_tokens
        benchmark.extra_info["prompt_tokens_per_s"] = prompt_tokens / benchmark.stats.stats.min
