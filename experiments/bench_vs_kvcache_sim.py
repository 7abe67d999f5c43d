"""Benchmark: whole ``radixkv`` processes beside the Mooncake team's C++ kvcache-simulator.

The job (Mooncake FAST'25 conversation trace, 12,031 requests, 512-token hash ids):

- ``radixkv curve TRACE --policies unit-lru --capacities <8 points> --out PREFIX`` (JSON +
  PNG), and ``radixkv compare TRACE --policies vllm:16,sglang:1 --capacity 1e7``;
- ``kvcache-simulator run --trace TRACE --block-size 512 --model llama-3.1-8b
  --policies lru --budgets-gib <the same 8 pools> --format json`` (its C++ backend).
  llama-3.1-8b at bf16 is 131,072 bytes per token, so a 512-token block is 2^26 bytes and
  ``G`` GiB is ``16·G`` blocks exactly: the budgets are ``units / 16`` GiB with ``units =
  capacity_tokens // 512``, the LRU cache sizes ``unit-lru`` runs.

Each command is a fresh process on a warm cache (one untimed run of each first: Numba's
cache and radixkv's trace cache filled, kvcache-simulator's C++ binary built), then
``--repeat`` rounds alternate the commands; printed: best-of-N wall and CPU time (child
user + system), radixkv's ratio to kvcache-simulator, and the load average (the machine is
shared). kvcache-simulator is not a radixkv dependency: ``pip install kvcache-simulator``
into any environment and pass its executable with ``--kvcache-sim``.

    python experiments/bench_vs_kvcache_sim.py --kvcache-sim /path/to/bin/kvcache-simulator [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench_process import CAPS, run_timed

HERE = Path(__file__).resolve().parent

#: tokens per Mooncake hash id; kvcache-simulator's bytes per 512-token block of llama-3.1-8b (bf16)
UNIT = 512
BLOCKS_PER_GIB = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=None, help="default: $RADIXKV_SHARED/traces/mooncake-fast25/conversation_trace.jsonl")
    ap.add_argument("--kvcache-sim", default=shutil.which("kvcache-simulator"), help="its executable")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    if not args.kvcache_sim:
        sys.exit("kvcache-simulator not found: pip install kvcache-simulator, then --kvcache-sim PATH")
    shared = Path(os.environ.get("RADIXKV_SHARED", HERE.parent.parent / "shared"))
    trace = args.trace or str(shared / "traces/mooncake-fast25/conversation_trace.jsonl")
    caps = [int(float(c)) for c in CAPS.split(",")]
    gib = ",".join(repr((c // UNIT) / BLOCKS_PER_GIB) for c in caps)
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    with tempfile.TemporaryDirectory(prefix="radixkv-bench-kvsim-") as tmp:
        cmds = {
            "radixkv curve (JSON + PNG)": [args.python, "-m", "radixkv", "curve", trace, "--policies", "unit-lru",
                                           "--capacities", CAPS, "--out", os.path.join(tmp, "curve")],
            "radixkv compare vllm:16,sglang:1": [args.python, "-m", "radixkv", "compare", trace,
                                                 "--policies", "vllm:16,sglang:1", "--capacity-tokens", "1e7"],
            "kvcache-simulator run (8 LRU)": [args.kvcache_sim, "run", "--trace", trace, "--block-size", str(UNIT),
                                              "--model", "llama-3.1-8b", "--policies", "lru", "--budgets-gib", gib,
                                              "--no-progress", "--format", "json", "-o", os.path.join(tmp, "kvs.json")],
        }
        print(f"load average before: {os.getloadavg()}", flush=True)
        for argv in cmds.values():  # warm
            run_timed(argv, env, tmp)
        best = {n: (float("inf"), float("inf")) for n in cmds}
        for _ in range(args.repeat):
            for n, argv in cmds.items():
                w, c = run_timed(argv, env, tmp)
                best[n] = (min(best[n][0], w), min(best[n][1], c))
        print(f"load average after: {os.getloadavg()}")
        kvs = json.loads(Path(tmp, "kvs.json").read_text())
        ours = json.loads(Path(tmp, "curve.json").read_text())
    ref_w, ref_c = best["kvcache-simulator run (8 LRU)"]
    print(f"best of {args.repeat}, one process each (wall / CPU s); ratio to kvcache-simulator")
    for n, (w, c) in best.items():
        print(f"  {n:<34} {w:7.3f} {c:7.3f}   {w / ref_w:5.2f}x wall {c / ref_c:5.2f}x CPU")
    print("cache sizes (blocks of 512 tokens): kvcache-simulator", [p["cacheBlocks"] for p in kvs["points"]],
          "radixkv", [p["capacity_tokens"] // UNIT for p in ours["curves"][0]["points"]])


if __name__ == "__main__":
    main()
