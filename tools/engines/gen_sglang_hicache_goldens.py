#!/usr/bin/env python3
"""Golden per-request device and host hits of SGLang 0.5.23's HiCache (host-memory tier).

Runs ``sglang_replay.py`` (this folder) in HiCache mode — the real ``UnifiedRadixCache``
with ``init_hicache``, its default (Rust) tree core, the real ``HybridCacheController``,
host KV pool and host allocator, made to run on a CPU-only torch by
``sglang_replay._cpu_hicache_patches`` (no-op copy kernels and host-register; the tree's
decisions never read KV values) — for every write policy x run below, in one process,
and writes ``<out>/hicache_<policy>_<trace>_p<page>_c<capacity>_r<ratio>.jsonl`` plus
``<out>/manifest.jsonl``. Needs the SGLang 0.5.23 CPU venv (docs/golden.md)::

    $SGLANG_VENV/bin/python tools/engines/gen_sglang_hicache_goldens.py \\
        --traces tests/data/golden/traces --out tests/data/golden/sglang_hicache

``--storage`` runs STORAGE_RUNS with an L3 store (``--hicache-storage-backend file``, the
real ``HiCacheFile`` in a fresh temporary folder, unbounded as SGLang's default, the
controller's real prefetch / backup threads) into ``tests/data/golden/sglang_hicache_storage``;
per request it adds ``storage_hit_tokens`` (tokens the arrival-time prefetch inserted on
host, ``prefetch_loaded_tokens_by_reqid``). Stand-ins (``sglang_replay._storage_prefetch``,
``_drain_storage_writes``): the harness waits until each prefetch has landed and
``check_prefetch_progress`` admits the request (``wait_complete``), and until every
storage write is reaped, before the next scheduler step; ranks are published as world rank
0 of one; the host pool's ``pin_memory`` is switched off (a CPU torch has no pinned
allocator). Per request the files hold ``hit_tokens`` (device prefix from ``match_prefix``),
``host_hit_tokens`` (``MatchResult.host_hit_length``), ``loaded_tokens`` (what
``init_load_back`` spliced onto the device), plus diagnostics: tokens written GPU→host and
loaded host→GPU by the controller, host tokens evicted, host tokens held after the
request. Conventions: sglang_replay.py's lone-request lifecycle; every HiCache
transfer (write-through ack, load-back) completes before the next scheduler step
(``check_hicache_events`` after the prefill, after each decode step and after the finish).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_replay  # noqa: E402

POLICIES = ("write_through", "write_through_selective", "write_back")
#: (trace file, page_size, capacity_tokens, hicache_ratio): tight device pools that
#: evict, host pools that evict too
RUNS = (
    ("mixed200.jsonl", 1, 1904, 2.0),
    ("mixed200.jsonl", 16, 1904, 2.0),
    ("mixed200.jsonl", 64, 1920, 2.0),
    ("mixed200.jsonl", 1, 1904, 1.0),
    ("edge300.jsonl", 1, 640, 2.0),
    ("edge300.jsonl", 16, 640, 2.0),
    ("edge300.jsonl", 64, 640, 3.0),
)
#: L3 runs (``--storage``): (trace, page_size, capacity_tokens, hicache_ratio,
#: prefetch_threshold) with an unbounded ``file`` store; host pools small enough that
#: host copies are evicted while the store keeps them
STORAGE_POLICIES = ("write_through", "write_back")
STORAGE_RUNS = (
    ("mixed200.jsonl", 1, 1904, 1.0, 32),
    ("mixed200.jsonl", 1, 1904, 0.5, 256),
    ("mixed200.jsonl", 16, 1904, 0.5, 64),
    ("mixed200.jsonl", 64, 1920, 1.0, 64),
    ("edge300.jsonl", 1, 640, 1.0, 32),
    ("edge300.jsonl", 64, 640, 1.0, 64),
    ("mixed200.jsonl", 64, 1920, 2.0, 64),
    ("mixed200.jsonl", 16, 1904, 2.0, 32),
)
#: Mooncake conversation slice (``--mooncake``: the first 800 lines expanded to tokens by
#: the shared harness's ``to_tokens.py mooncake --limit 800``; docs/golden.md conventions)
MOON_RUNS = (
    ("moon_conv_800.jsonl", 1, 200000, 2.0),
    ("moon_conv_800.jsonl", 16, 200000, 2.0),
    ("moon_conv_800.jsonl", 1, 100000, 8.0),
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", required=True, help="folder holding the token traces")
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--mooncake", action="store_true",
                    help="run MOON_RUNS (the traces folder must hold moon_conv_800.jsonl) instead of RUNS")
    ap.add_argument("--only", default="", help="run only the runs whose name contains this text")
    ap.add_argument("--storage", action="store_true",
                    help="run STORAGE_RUNS (an L3 file store behind the host pool) for STORAGE_POLICIES")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    manifest = []
    if a.storage:
        todo = [(pol, t, ps, cap, r, thr) for pol in STORAGE_POLICIES for t, ps, cap, r, thr in STORAGE_RUNS]
    else:
        todo = [(pol, *run, None) for pol in a.policies.split(",") for run in (MOON_RUNS if a.mooncake else RUNS)]
    for pol, trace, ps, cap, ratio, thr in todo:
            name = f"hicache_{pol}_{trace.split('.')[0]}_p{ps}_c{cap}_r{ratio:g}"
            if thr is not None:
                name += f"_file_t{thr}"
            if a.only not in name:
                continue
            argv = ["--trace", os.path.join(a.traces, trace), "--out", "-", "--page-size", str(ps),
                    "--capacity-tokens", str(cap), "--hicache-write-policy", pol,
                    "--hicache-ratio", str(ratio), "--check", "--quiet"]
            if thr is not None:
                argv += ["--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", "wait_complete",
                         "--hicache-storage-prefetch-threshold", str(thr)]
            args = sglang_replay.parse_args(argv)
            rep = sglang_replay.SGLangReplayer(args)
            t0 = time.perf_counter()
            recs = []
            try:
                for rid, prompt, output, prio in sglang_replay.iter_trace(args.trace):
                    recs.append(rep.run_request(rid, prompt, output, prio))
                    rep.check()
            except RuntimeError as e:
                if thr is None:
                    raise
                # e.g. write_back + L3: evictions declined while storage writes hold host
                # locks can leave a lone request out of memory; no golden for the run
                print(f"{name}: SGLang failed at request {len(recs)} ({str(e).splitlines()[0]}); skipped",
                      file=sys.stderr, flush=True)
                manifest.append({"name": name, "engine": "sglang 0.5.23", "trace": trace, "page_size": ps,
                                 "capacity_tokens": rep.capacity, "hicache_write_policy": pol,
                                 "hicache_ratio": ratio, "host_capacity_tokens": rep.host_capacity,
                                 "hicache_storage_backend": "file", "hicache_storage_prefetch_policy": "wait_complete",
                                 "prefetch_threshold": thr, "failed_at_request": len(recs),
                                 "error": str(e).splitlines()[0]})
                continue
            dt = time.perf_counter() - t0
            tmp = os.path.join(a.out, name + ".jsonl.tmp")
            with open(tmp, "w") as f:
                for r in recs:
                    f.write(json.dumps(r) + "\n")
            os.replace(tmp, os.path.join(a.out, name + ".jsonl"))
            keys = ("hit_tokens", "host_hit_tokens", "loaded_tokens") + (("storage_hit_tokens",) if thr else ())
            tot = {k: sum(r.get(k, 0) for r in recs) for k in keys}
            extra = {} if thr is None else {"hicache_storage_backend": "file",
                                            "hicache_storage_prefetch_policy": "wait_complete",
                                            "prefetch_threshold": thr}
            manifest.append({"name": name, "engine": "sglang 0.5.23", "impl": rep.impl_name,
                             "tree_core": rep.tree_core_name, "trace": trace, "page_size": ps,
                             "capacity_tokens": rep.capacity, "hicache_write_policy": pol,
                             "hicache_ratio": ratio, "host_capacity_tokens": rep.host_capacity, **extra, **tot})
            print(name, tot, f"{dt:.1f}s", file=sys.stderr, flush=True)
    mpath = os.path.join(a.out, "manifest.jsonl")
    if os.path.exists(mpath):  # keep the other runs' lines
        names = {m["name"] for m in manifest}
        with open(mpath) as f:
            manifest = [m for m in map(json.loads, f) if m["name"] not in names] + manifest
    tmp = mpath + ".tmp"
    with open(tmp, "w") as f:
        for m in manifest:
            f.write(json.dumps(m) + "\n")
    os.replace(tmp, os.path.join(a.out, "manifest.jsonl"))


if __name__ == "__main__":
    main()
