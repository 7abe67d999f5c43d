"""Hit rate (GPU + CPU) vs CPU offloading capacity at a fixed GPU pool, vLLM.

Replays a trace sequentially through :class:`radixkv.policies.vllm_offload.OffloadBlockHashCache`
at one GPU pool (``--gpu-tokens`` usable tokens, block ``--block-size``) and CPU pools of
``--host-tokens`` each (0 = no CPU tier, equal to ``vllm``), and through plain
:class:`~radixkv.policies.block_hash.BlockHashCache` at GPU + CPU tokens (the single-tier
point of the same total size). Prints one JSON line per point::

    PYTHONPATH=. python tools/vllm_offload_host_curve.py \\
        --trace $RADIXKV_SHARED/traces/mooncake-fast25/conversation_trace.jsonl \\
        --gpu-tokens 1000000 --host-tokens 0,4000000,16000000 [--eviction-policy arc]

Fields: ``host_tokens``, ``hit_rate`` (computed-from tokens / prompt tokens),
``gpu_hit_rate``, ``cpu_hit_rate`` (tokens loaded from CPU / prompt tokens),
``stored_tokens`` (GPU→CPU), ``cpu_evicted_tokens``, ``single_tier_hit_rate`` (``vllm``
at GPU + CPU tokens), ``seconds``.
"""
from __future__ import annotations

import argparse
import json
import time

from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.vllm_offload import OffloadBlockHashCache
from radixkv.trace.load import load_trace


def run(trace, gpu, host, B, ev, bpc):
    c = OffloadBlockHashCache.from_capacity_tokens(gpu, B, host_tokens=host, eviction_policy=ev,
                                                   blocks_per_chunk=bpc)
    prompt = hit = 0
    t0 = time.perf_counter()
    for i in range(len(trace)):
        seq = trace.kv_seq(i)
        adm = c.run_request(i, seq)
        prompt += seq.prompt_len
        hit += adm.hit_tokens if adm is not None else 0
    secs = time.perf_counter() - t0
    single = BlockHashCache.from_capacity_tokens(gpu + host, B)
    shit = 0
    for i in range(len(trace)):
        adm = single.run_request(i, trace.kv_seq(i))
        shit += adm.hit_tokens if adm is not None else 0
    return {"gpu_tokens": gpu, "host_tokens": host, "block_size": B, "blocks_per_chunk": bpc, "eviction_policy": ev,
            "hit_rate": hit / prompt, "gpu_hit_rate": c.device_hit_tokens_total / prompt,
            "cpu_hit_rate": c.host_hit_tokens_total / prompt, "stored_tokens": c.written_tokens_total,
            "cpu_evicted_tokens": c.host_evicted_tokens_total, "single_tier_hit_rate": shit / prompt,
            "seconds": round(secs, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--gpu-tokens", type=int, required=True)
    ap.add_argument("--host-tokens", required=True, help="comma-separated CPU pool sizes in tokens")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--blocks-per-chunk", type=int, default=1)
    ap.add_argument("--eviction-policy", default="lru", choices=("lru", "arc"))
    a = ap.parse_args(argv)
    trace = load_trace(a.trace)
    for h in (int(x) for x in a.host_tokens.split(",")):
        print(json.dumps(run(trace, a.gpu_tokens, h, a.block_size, a.eviction_policy, a.blocks_per_chunk)),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
