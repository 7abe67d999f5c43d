"""Benchmark: sequential replay of the Mooncake conversation trace through BlockHashCache.

Run with ``--benchmark-enable`` to time it; ``RADIXKV_BENCH_LIMIT`` sets how many requests
(default 500 so the single untimed run under ``--benchmark-disable`` stays short; 0 = all
12,031 requests, 145 M prompt tokens). Prompt tokens per second go to ``extra_info``.
Real vLLM's cache code replays about 1.0–1.5 M prompt tokens/s on this machine
(docs/golden.md, "Replay speed of the real code").

The pool sizes are those of the vLLM golden runs on this trace, so every replay is also
checked request for request against the real engine's hits (first 1,500 requests).
"""
from __future__ import annotations

import json

import pytest

from conftest import shared_path
from radixkv.policies.block_hash import BlockHashCache


@pytest.mark.parametrize("block_size,num_gpu_blocks", [(16, 20_000), (512, 600)])
def test_bench_block_hash_mooncake(benchmark, mooncake_seqs, block_size, num_gpu_blocks):
    seqs, prompt_tokens = mooncake_seqs
    name = f"vllm_mooncake_conv1500_b{block_size}_n{num_gpu_blocks}"
    golden = [json.loads(line)["hit_tokens"]
              for line in shared_path("golden", "vllm", f"{name}.jsonl").read_text().splitlines() if line]

    def replay():
        cache = BlockHashCache(num_gpu_blocks, block_size)
        return [cache.run_request(i, s).hit_tokens for i, s in enumerate(seqs)]

    hits = benchmark.pedantic(replay, rounds=3, iterations=1, warmup_rounds=1)
    n = min(len(hits), len(golden))
    assert hits[:n] == golden[:n]
    if benchmark.stats is not None:
        benchmark.extra_info["prompt_tokens"] = prompt_tokens
        benchmark.extra_info["prompt_tokens_per_s"] = prompt_tokens / benchmark.stats.stats.min
