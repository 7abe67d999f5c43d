#!/usr/bin/env python3
"""Golden per-request hits of SGLang 0.5.23's hybrid radix caches (SWA and Mamba).

Runs ``sglang_hybrid_replay.py`` (this folder: SGLang's own ``UnifiedRadixCache`` with
``(FULL, SWA)`` / ``(FULL, MAMBA)`` components, its ``SWATokenToKVPoolAllocator`` /
``HybridReqToTokenPool``, default Rust tree core) for every run below and writes
``<out>/<name>.jsonl`` plus ``<out>/manifest.jsonl``. Needs the SGLang 0.5.23 CPU venv
(docs/golden.md)::

    HF_HUB_OFFLINE=1 $SGLANG_VENV/bin/python tools/engines/gen_sglang_hybrid_goldens.py \\
        --traces tests/data/golden/traces --out tests/data/golden/sglang_hybrid

Pools are tight enough that both the full-attention pool and the SWA pool / Mamba
slots evict. ``--check`` (free + cached == capacity in every pool, nothing locked)
runs after every request. About 30 s.

Chunked runs use the harness's default ``--chunk-rule adder``: SGLang's own
``PrefillAdder`` admits each request and picks every chunk end (``add_one_req``: the
first chunk rounded down to a page; ``add_chunked_req``: each later one as given, so
with 300 at page 16 the later ends leave the page grid), with the allocator's own
prefill budget (``SWAPrefillBudget`` for SWA). Each record of a chunked run carries
``chunk_ends`` (the ``extend_end`` of every prefill pass). Before this, the harness
rounded every chunk end to a page; of the three chunked runs only
``..._p16_..._chunk300`` changed (29776 -> 30032 hit tokens, 1 request's hit, 112
requests' pool state); the two page-1 runs are unchanged but for ``chunk_ends``.
``..._edge300_p16_c800_w48_s256_chunk100`` (off the grid, a 256-token SWA pool) was added
with the adder: it checks the model's SWA admission estimate for chunked requests.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_hybrid_replay as hr  # noqa: E402

#: (mode, trace, page_size, full tokens, sliding window or mamba slots, swa tokens,
#: chunked_prefill_size or -1)
RUNS = (
    ("swa", "mixed200.jsonl", 1, 6400, 64, 2400, -1),
    ("swa", "mixed200.jsonl", 1, 3000, 256, 2000, -1),
    ("swa", "edge300.jsonl", 1, 640, 32, 450, -1),
    ("swa", "mixed200.jsonl", 16, 4000, 128, 2048, -1),
    ("swa", "edge300.jsonl", 16, 800, 48, 512, -1),
    ("swa", "mixed200.jsonl", 1, 6400, 64, 1200, 256),
    ("swa", "mixed200.jsonl", 16, 4000, 128, 1024, 300),
    ("swa", "edge300.jsonl", 16, 800, 48, 256, 100),
    ("mamba", "mixed200.jsonl", 1, 6400, 16, None, -1),
    ("mamba", "mixed200.jsonl", 1, 3000, 8, None, -1),
    ("mamba", "edge300.jsonl", 1, 640, 6, None, -1),
    ("mamba", "edge300.jsonl", 1, 100000, 4, None, -1),
    ("mamba", "mixed200.jsonl", 1, 6400, 16, None, 256),
)


def run_name(mode, trace, ps, full, x, swa, chunk=-1):
    base = f"sglang_{mode}_{trace.split('.')[0]}_p{ps}_c{full}"
    base += f"_w{x}_s{swa}" if mode == "swa" else f"_m{x}"
    return base + (f"_chunk{chunk}" if chunk > 0 else "")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tree-core", choices=["rust", "python"], default=None)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    manifest = []
    for mode, trace, ps, full, x, swa, chunk in RUNS:
        name = run_name(mode, trace, ps, full, x, swa, chunk)
        argv = ["--trace", os.path.join(a.traces, trace), "--out", os.path.join(a.out, name + ".jsonl"),
                "--mode", mode, "--page-size", str(ps), "--capacity-tokens", str(full), "--check",
                "--chunked-prefill-size", str(chunk)]
        if mode == "swa":
            argv += ["--sliding-window", str(x), "--swa-capacity-tokens", str(swa)]
        else:
            argv += ["--mamba-slots", str(x)]
        if a.tree_core:
            argv += ["--tree-core", a.tree_core]
        args = hr.parse_args(argv)
        t0 = time.perf_counter()
        rep, recs, _ = hr.run(args)
        dt = time.perf_counter() - t0
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, args.out)
        m = {"name": name, "engine": "sglang 0.5.23", "impl": "UnifiedRadixCache",
             "tree_core": rep.tree_core_name, "mode": mode, "trace": trace, "page_size": ps,
             "capacity_tokens": full, "chunked_prefill_size": chunk if chunk > 0 else None,
             "chunk_rule": "PrefillAdder" if chunk > 0 else None,
             "hit_tokens": sum(r["hit_tokens"] for r in recs),
             "evicted_tokens": sum(r.get("evicted_tokens", 0) for r in recs)}
        if mode == "swa":
            m.update(components="FULL,SWA", sliding_window_size=x, swa_capacity_tokens=swa,
                     evicted_swa_tokens=sum(r.get("evicted_swa_tokens", 0) for r in recs))
        else:
            m.update(components="FULL,MAMBA", mamba_slots=x, mamba_radix_cache_strategy="no_buffer",
                     evicted_mamba=sum(r.get("evicted_mamba", 0) for r in recs))
        manifest.append(m)
        print(name, m["hit_tokens"], f"{dt:.1f}s", file=sys.stderr)
    tmp = os.path.join(a.out, "manifest.jsonl.tmp")
    with open(tmp, "w") as f:
        for m in manifest:
            f.write(json.dumps(m) + "\n")
    os.replace(tmp, os.path.join(a.out, "manifest.jsonl"))


if __name__ == "__main__":
    main()
