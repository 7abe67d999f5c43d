"""Speed of a 24-cell sweep on the ``local``, ``processes`` and ``dask`` executors, in one process.

The grid: one seeded synthetic trace (``mix``, 1,500 requests, written as ``.npz``) x
4 policies (vLLM block 16 and 32, SGLang page 1, no cache) x 3 pool sizes x 2 values of
``max_num_seqs``, all in concurrent mode (Llama-3.1-8B on an A100-80GB) — 24 cells.
Each executor runs the whole sweep into a fresh results directory (trace load, trace
cache, kernel warm-up, cells, stores) and the best wall time of ``--repeats`` runs is
kept. The kernels are compiled before the clock (Numba's disk cache is warm). The Dask
executor is timed twice: on a ``LocalCluster`` started and used once before the clock (an
existing cluster, ``--scheduler``, whose workers hold warm kernels), and end to end with a
new cluster's start-up (spawned workers that import radixkv and load the kernels).

Every executor's per-cell metrics are checked to be byte-identical to the local run.
Prints the load average before and after (the machine is shared; measure when quiet)
and the speed ratios against the local executor. Writes
``experiments/results/bench_sweep.json``.

Usage: ``python experiments/bench_sweep.py [--repeats 3] [--workers 2]``
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from radixkv.sweep import read_rows, run_sweep  # noqa: E402

GRID = """
traces = ["{trace}"]
policies = ["vllm:16", "vllm:32", "sglang:1", "none"]
capacity_tokens = [60000, 200000, 1000000]
mode = "concurrent"
model = "Llama-3.1-8B"
gpu = "A100-80GB"
max_num_seqs = [32, 256]
"""


def _metrics(out) -> dict:
    return {r["key"]: json.dumps(r["metrics"], sort_keys=True) for r in read_rows(out)}


def _timed(grid, root, name, **kw) -> tuple[float, dict]:
    out = Path(root) / name
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    rep = run_sweep(grid, out, progress=False, **kw)
    wall = time.perf_counter() - t0
    assert rep.done == 24 and not rep.failed, (name, [(c.label, e["message"]) for c, e in rep.failed])
    return wall, _metrics(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--no-dask", action="store_true")
    args = ap.parse_args()

    from radixkv.synth import generate
    from radixkv.trace.load import save_trace

    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}  (CPUs: {os.cpu_count()})")
    root = Path(tempfile.mkdtemp(prefix="radixkv-bench-sweep-"))
    try:
        trace = generate("mix", args.requests, seed=1, rate=4.0)
        save_trace(trace, root / "mix.npz")
        grid = root / "grid.toml"
        grid.write_text(GRID.format(trace=root / "mix.npz"))

        # compile / load the kernels once, outside the clock (every executor then starts warm)
        _timed(grid, root, "warm", executor="local")

        cluster = None
        if not args.no_dask:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
            # an existing cluster has done work before: its workers hold warm kernels
            _timed(grid, root, "dask-warm", executor="dask", scheduler=cluster.scheduler_address)
        times: dict = {"local": [], "processes": [], "dask": [], "dask_with_startup": []}
        ref = None
        for r in range(args.repeats):
            t, m = _timed(grid, root, "local", executor="local")
            times["local"].append(t)
            ref = ref or m
            assert m == ref
            t, m = _timed(grid, root, "processes", executor="processes", workers=args.workers)
            times["processes"].append(t)
            assert m == ref, "processes executor: metrics differ from local"
            if cluster is not None:
                t, m = _timed(grid, root, "dask", executor="dask", scheduler=cluster.scheduler_address)
                times["dask"].append(t)
                assert m == ref, "dask executor: metrics differ from local"
                t, m = _timed(grid, root, "dask2", executor="dask", workers=args.workers)
                times["dask_with_startup"].append(t)
                assert m == ref, "dask executor: metrics differ from local"
            print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items() if v), flush=True)
        if cluster is not None:
            cluster.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load1 = os.getloadavg()
    best = {k: min(v) for k, v in times.items() if v}
    ratios = {k: best["local"] / v for k, v in best.items() if k != "local"}
    print(f"24 cells, best of {args.repeats}: " + ", ".join(f"{k} {v:.2f} s" for k, v in best.items()))
    for k, v in ratios.items():
        print(f"speed-up {k} / local: {v:.2f}x")
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    print("per-cell metrics identical on every executor: yes")
    doc = {"cells": 24, "workers": args.workers, "requests": args.requests, "repeats": args.repeats,
           "best_s": best, "all_s": times, "speedup_vs_local": ratios,
           "loadavg_before": list(load0), "loadavg_after": list(load1), "metrics_identical": True}
    out = HERE / "results" / "bench_sweep.json"
    from radixkv.util import dumps_json, atomic_write_text

    atomic_write_text(out, dumps_json(doc))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
