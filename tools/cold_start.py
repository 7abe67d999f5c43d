"""Time the README demo on a cold and a warm Numba cache (wall seconds, several runs).

Each cold run gets a fresh, empty ``NUMBA_CACHE_DIR`` (a new temporary folder), so nothing
compiled before is reused; the warm runs share one folder filled by ``radixkv warmup``
first. Prints every run, min and median, and the load average (the machine may be
shared). Usage::

    python tools/cold_start.py [--runs 5] [--modes auto,compile] [--warm]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = [sys.executable, "-m", "radixkv", "compare", "traces/demo.jsonl", "--policies", "vllm:16,vllm:32,sglang:1,none",
        "--capacity-tokens", "20000", "--quiet"]


def _run(cmd, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--modes", default="auto", help="RADIXKV_JIT values to time cold (auto, compile)")
    ap.add_argument("--warm", action="store_true", help="also time warm runs after radixkv warmup")
    args = ap.parse_args()
    base = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"{os.cpu_count()} cores; load average before: {os.getloadavg()}")
    for mode in args.modes.split(","):
        times = []
        for _ in range(args.runs):
            d = tempfile.mkdtemp(prefix="radixkv-cold-")
            try:
                times.append(_run(DEMO, dict(base, NUMBA_CACHE_DIR=d, RADIXKV_JIT=mode)))
            finally:
                shutil.rmtree(d, ignore_errors=True)
            print(f"cold RADIXKV_JIT={mode}: {times[-1]:.2f} s (load {os.getloadavg()[0]:.2f})", flush=True)
        print(f"cold RADIXKV_JIT={mode}: min {min(times):.2f} s, median {statistics.median(times):.2f} s "
              f"over {len(times)} runs")
    if args.warm:
        d = tempfile.mkdtemp(prefix="radixkv-warm-")
        try:
            env = dict(base, NUMBA_CACHE_DIR=d)
            w = _run([sys.executable, "-m", "radixkv", "warmup", "vllm:16", "sglang:1"], env)
            print(f"radixkv warmup vllm:16 sglang:1 (cold cache): {w:.2f} s")
            times = [_run(DEMO, env) for _ in range(args.runs)]
            print(f"warm: min {min(times):.2f} s, median {statistics.median(times):.2f} s over {len(times)} runs "
                  f"({', '.join(f'{t:.2f}' for t in times)})")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
