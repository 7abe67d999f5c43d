#!/usr/bin/env python3
"""Speed of eviction through the priority hook against the built-in LRU kernels.

Replays one trace sequentially through ``sglang:P`` (RadixCache, LRU kernels) and
through priority policies on the same pool (``sglang:P@lfu`` — LFU through the hook —
and the hook with the LRU priority), and through ``vllm:B`` and an LFU over blocks
through the block-pool hook, alternating, in one process, after a warm-up replay of each
(compilation excluded), and prints each one's best replay time and its ratio to the
built-in of its structure::

    RADIXKV_SHARED=/work/shared python tools/bench_eviction_hook.py \\
        [--trace $RADIXKV_SHARED/traces/mooncake-fast25/conversation_trace.jsonl] \\
        [--capacity-tokens 1000000] [--page-size 1] [--repeat 3]

The issue's bar: LFU through the hook within 1.5x of ``sglang:1``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from radixkv.policies.block_hash import BlockHashCache  # noqa: E402
from radixkv.policies.block_priority import BlockLFU, PriorityBlockHashCache  # noqa: E402
from radixkv.policies.radix import RadixCache  # noqa: E402
from radixkv.policies.radix_priority import LRU, PriorityRadixCache, eviction_policy  # noqa: E402
from radixkv.replay.sequential import replay_sequential  # noqa: E402
from radixkv.trace.load import load_trace  # noqa: E402


def main(argv=None):
    shared = os.environ.get("RADIXKV_SHARED", "../shared")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=os.path.join(shared, "traces", "mooncake-fast25", "conversation_trace.jsonl"))
    ap.add_argument("--capacity-tokens", type=int, default=1_000_000)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    trace = load_trace(a.trace)
    p = a.page_size
    makers = {
        f"sglang:{p}": lambda: RadixCache.from_capacity_tokens(a.capacity_tokens, p),
        f"sglang:{p}@lfu (hook)": lambda: PriorityRadixCache.from_capacity_tokens(
            a.capacity_tokens, p, eviction_policy=eviction_policy("lfu")),
        f"sglang:{p}@lru (hook)": lambda: PriorityRadixCache.from_capacity_tokens(
            a.capacity_tokens, p, eviction_policy=LRU()),
        f"vllm:{a.block_size}": lambda: BlockHashCache.from_capacity_tokens(a.capacity_tokens, a.block_size),
        f"vllm:{a.block_size}@lfu (hook)": lambda: PriorityBlockHashCache.from_capacity_tokens(
            a.capacity_tokens, a.block_size, eviction_policy=BlockLFU()),
    }
    best = {k: float("inf") for k in makers}
    hit = {}
    for k, make in makers.items():  # warm-up: compile
        replay_sequential(trace, make(), limit=50)
    for _ in range(a.repeat):
        for k, make in makers.items():
            pol = make()
            t0 = time.perf_counter()
            rec = replay_sequential(trace, pol)
            best[k] = min(best[k], time.perf_counter() - t0)
            hit[k] = (int(rec["hit_tokens"].sum()), int(rec["prompt_tokens"].sum()), pol.evictions)
    bases = {"sglang": best[f"sglang:{p}"], "vllm": best[f"vllm:{a.block_size}"]}
    print(f"trace={os.path.basename(a.trace)} requests={len(trace)} capacity_tokens={a.capacity_tokens} "
          f"page_size={p} repeat={a.repeat} (best of)")
    for k in makers:
        h, tot, ev = hit[k]
        base = bases[k.split(":")[0]]
        print(f"{k:24s} replay {best[k]:7.3f} s  ratio {best[k] / base:5.2f}x  hit rate {h / tot:.4f}  evictions {ev}")


if __name__ == "__main__":
    main()
