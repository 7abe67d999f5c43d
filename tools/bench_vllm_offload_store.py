"""CPU time of ``vllm-offload``'s two CPU stores on one trace, in one process.

Replays the trace sequentially through :class:`radixkv.policies.vllm_offload.OffloadBlockHashCache`
with the dict store (:class:`radixkv.policies.offload_cpu.CPUOffloadStore`, the baseline)
and with the compiled array store (:class:`~radixkv.policies.offload_cpu.ArrayLRUStore`),
checks that every request gets the same GPU hit, CPU hit and store counters, and prints
CPU seconds (``time.process_time``, so other processes on the machine do not count) and
their ratio. The compiled kernels are warmed on the first request before timing::

    PYTHONPATH=. python tools/bench_vllm_offload_store.py \\
        --trace $RADIXKV_SHARED/traces/mooncake-fast25/conversation_trace.jsonl \\
        --gpu-tokens 1000000 --host-tokens 4000000 [--limit 3000]
"""
from __future__ import annotations

import argparse
import json
import time

from radixkv.policies.vllm_offload import OffloadBlockHashCache
from radixkv.trace.load import load_trace


def run(trace, store, gpu, host, B):
    c = OffloadBlockHashCache.from_capacity_tokens(gpu, B, host_tokens=host, cpu_store=store)
    c.run_request(0, trace.kv_seq(0))
    rows = []
    t0 = time.process_time()
    for i in range(1, len(trace)):
        adm = c.run_request(i, trace.kv_seq(i))
        rows.append((adm.hit_tokens if adm is not None else -1, c.last_cpu_hit, c.cpu.stored_total,
                     c.cpu.evicted_total, c.cpu.failed_stores))
    return time.process_time() - t0, rows, c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--gpu-tokens", type=int, default=1_000_000)
    ap.add_argument("--host-tokens", type=int, default=4_000_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args(argv)
    tr = load_trace(a.trace)
    if a.limit:
        tr = tr.head(a.limit)
    td, rd, _ = run(tr, "dict", a.gpu_tokens, a.host_tokens, a.block_size)
    ta, ra, c = run(tr, "array", a.gpu_tokens, a.host_tokens, a.block_size)
    prompt = int(tr.prompt_len.sum())
    print(json.dumps({"requests": len(tr), "identical": rd == ra, "dict_cpu_s": round(td, 2),
                      "array_cpu_s": round(ta, 2), "ratio": round(td / ta, 1),
                      "cpu_hit_rate": c.host_hit_tokens_total / prompt}))
    return 0 if rd == ra else 1


if __name__ == "__main__":
    raise SystemExit(main())
