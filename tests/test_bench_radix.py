"""Benchmark: sequential replay of the Mooncake conversation trace through RadixCache.

Run with ``--benchmark-enable`` to time it; ``RADIXKV_BENCH_LIMIT`` sets how many requests
(default 500 so the single untimed run under ``--benchmark-disable`` stays short; 0 = all
12,031 requests, 145 M prompt tokens). Prompt tokens per second go to ``extra_info``.
Real SGLang's cache code replays about 0.2 M prompt tokens/s at page 1 and 0.05 M at page
16 on this machine (docs/golden.md, "Replay speed of the real code").
"""
from __future__ import annotations

import pytest

from radixkv.policies.radix import RadixCache


@pytest.mark.parametrize("page_size,capacity", [(1, 320_000), (16, 320_000), (1, 3_000_000), (16, 3_000_000)])
def test_bench_radix_mooncake(benchmark, mooncake_seqs, page_size, capacity):
    seqs, prompt_tokens = mooncake_seqs

    def replay():
        cache = RadixCache(capacity, page_size)
        hits = 0
        for i, s in enumerate(seqs):
            hits += cache.run_request(i, s).hit_tokens
        return hits

    hits = benchmark.pedantic(replay, rounds=3, iterations=1, warmup_rounds=1)
    assert 0 <= hits <= prompt_tokens
    if benchmark.stats is not None:
        benchmark.extra_info["prompt_tokens"] = prompt_tokens
        benchmark.extra_info["prompt_tokens_per_s"] = prompt_tokens / benchmark.stats.stats.min
