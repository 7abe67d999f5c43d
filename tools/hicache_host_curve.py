"""Hit rate (GPU + host) vs host capacity at a fixed GPU pool, SGLang HiCache.

Replays a trace sequentially through :class:`radixkv.policies.hicache.HiCacheRadixCache`
at one device pool (``--gpu-tokens``, SGLang ``max_total_num_tokens``) and host pools of
``--host-tokens`` each (0 = no host tier, equal to ``sglang``), and through plain
:class:`~radixkv.policies.radix.RadixCache` at device pools of GPU + host tokens (the
single-tier curve of the same total size). Prints one JSON line per point::

    PYTHONPATH=. RADIXKV_SHARED=/work/shared python tools/hicache_host_curve.py \\
        --trace $RADIXKV_SHARED/traces/mooncake-fast25/conversation_trace.jsonl \\
        --gpu-tokens 1000000 --host-tokens 0,1000000,2000000,4000000

Fields: ``host_tokens``, ``hit_rate`` (device + loaded-back hit tokens / prompt tokens),
``device_hit_rate``, ``host_hit_rate`` (tokens loaded back / prompt tokens),
``written_tokens`` (GPU→host), ``loaded_tokens`` (host→GPU), ``single_tier_hit_rate``
(RadixCache at GPU + host tokens), ``seconds``.
"""
from __future__ import annotations

import argparse
import json
import time

from radixkv.policies.hicache import HiCacheRadixCache
from radixkv.policies.radix import RadixCache


def run(trace, gpu, host, page, write_policy, n):
    c = HiCacheRadixCache(gpu // page * page, page, write_policy=write_policy, host_tokens=host)
    prompt = hit = loaded = 0
    t0 = time.perf_counter()
    for i in range(n):
        seq = trace.kv_seq(i)
        if c.fits_alone(seq):
            continue
        adm = c.run_request(i, seq)
        prompt += seq.prompt_len
        hit += adm.hit_tokens
        loaded += c.last_loaded
    single = RadixCache((gpu + host) // page * page, page)
    shit = 0
    for i in range(n):
        seq = trace.kv_seq(i)
        if c.fits_alone(seq):
            continue
        shit += single.run_request(i, seq).hit_tokens
    return {"gpu_tokens": gpu, "host_tokens": host, "host_capacity": c.host_capacity, "page_size": page,
            "write_policy": write_policy, "prompt_tokens": prompt, "hit_rate": hit / prompt,
            "device_hit_rate": (hit - loaded) / prompt, "host_hit_rate": loaded / prompt,
            "written_tokens": c.written_tokens_total, "loaded_tokens": c.loaded_tokens_total,
            "host_evicted_tokens": c.host_evicted_tokens_total, "single_tier_hit_rate": shit / prompt,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--limit", type=int, default=None, help="replay the first K requests")
    ap.add_argument("--gpu-tokens", type=int, default=1_000_000)
    ap.add_argument("--host-tokens", default="0,1000000,2000000,4000000")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--write-policy", default="write_through")
    a = ap.parse_args(argv)
    from radixkv.trace.load import load_trace

    trace = load_trace(a.trace)
    n = len(trace) if a.limit is None else min(a.limit, len(trace))
    for h in (int(float(x)) for x in a.host_tokens.split(",")):
        print(json.dumps(run(trace, a.gpu_tokens, h, a.page_size, a.write_policy, n)), flush=True)


if __name__ == "__main__":
    main()
