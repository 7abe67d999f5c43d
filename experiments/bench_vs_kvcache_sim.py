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
cache and radixkv's trace cache filled, kvcache-simulator's C++ binary built; radixkv's
bytecode compiled, as ``pip install`` does — with ``PYTHONDONTWRITEBYTECODE`` set and no
``.pyc`` files, every process would compile ~90 modules from source, ~0.2 s of CPU), then
``--repeat`` rounds alternate the commands; printed: the median and best of N wall and CPU
time (child user + system, ``resource.getrusage(RUSAGE_CHILDREN)``), radixkv's ratio to
kvcache-simulator (medians), and the load average before and after (the machine is
shared: CPU time is the stable figure). ``--tree A --tree B`` runs radixkv's commands from
each checkout in the same rounds (before/after). kvcache-simulator is not a radixkv
dependency: ``pip install kvcache-simulator`` into any environment and pass its executable
with ``--kvcache-sim``.

    python experiments/bench_vs_kvcache_sim.py --kvcache-sim /path/to/bin/kvcache-simulator [--repeat 5]
        [--tree OTHER_CHECKOUT --tree .]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
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
    ap.add_argument("--kvcache-sim", help="its executable (default: on PATH, or beside this Python)",
                    default=shutil.which("kvcache-simulator")
                    or shutil.which("kvcache-simulator", path=os.path.dirname(sys.executable)))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--tree", action="append", default=None,
                    help="a checkout of radixkv to run (repeatable; default: this one)")
    args = ap.parse_args()
    if not args.kvcache_sim:
        sys.exit("kvcache-simulator not found: pip install kvcache-simulator, then --kvcache-sim PATH")
    shared = Path(os.environ.get("RADIXKV_SHARED", HERE.parent.parent / "shared"))
    trace = args.trace or str(shared / "traces/mooncake-fast25/conversation_trace.jsonl")
    caps = [int(float(c)) for c in CAPS.split(",")]
    gib = ",".join(repr((c // UNIT) / BLOCKS_PER_GIB) for c in caps)
    trees = [str(Path(t).resolve()) for t in (args.tree or [HERE.parent])]
    label = (lambda t: "") if len(trees) == 1 else (lambda t: f" [{Path(t).name}]")
    with tempfile.TemporaryDirectory(prefix="radixkv-bench-kvsim-") as tmp:
        cmds, envs = {}, {}
        for t in trees:
            env = {**os.environ, "PYTHONPATH": t}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            subprocess.run([args.python, "-m", "compileall", "-q", os.path.join(t, "radixkv")], env=env,
                           stdout=subprocess.DEVNULL, check=True)
            n = f"radixkv curve (JSON + PNG){label(t)}"
            cmds[n] = [args.python, "-m", "radixkv", "curve", trace, "--policies", "unit-lru",
                       "--capacities", CAPS, "--out", os.path.join(tmp, "curve")]
            envs[n] = env
            n = f"radixkv compare vllm:16,sglang:1{label(t)}"
            cmds[n] = [args.python, "-m", "radixkv", "compare", trace,
                       "--policies", "vllm:16,sglang:1", "--capacity-tokens", "1e7"]
            envs[n] = env
        ref = "kvcache-simulator run (8 LRU)"
        cmds[ref] = [args.kvcache_sim, "run", "--trace", trace, "--block-size", str(UNIT),
                     "--model", "llama-3.1-8b", "--policies", "lru", "--budgets-gib", gib,
                     "--no-progress", "--format", "json", "-o", os.path.join(tmp, "kvs.json")]
        envs[ref] = dict(os.environ)
        load_before = os.getloadavg()
        print(f"load average before: {load_before}", flush=True)
        for n, argv in cmds.items():  # warm
            run_timed(argv, envs[n], tmp)
        runs = {n: [] for n in cmds}
        for _ in range(args.repeat):
            for n, argv in cmds.items():
                runs[n].append(run_timed(argv, envs[n], tmp))
        print(f"load average after: {os.getloadavg()}")
        kvs = json.loads(Path(tmp, "kvs.json").read_text())
        ours = json.loads(Path(tmp, "curve.json").read_text())
    med = {n: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for n, v in runs.items()}
    ref_w, ref_c = med[ref]
    print(f"{args.repeat} alternating rounds, one process each: median (best) wall / CPU s; ratio of the medians "
          f"to kvcache-simulator's")
    for n, v in runs.items():
        (w, c), bw, bc = med[n], min(x for x, _ in v), min(x for _, x in v)
        print(f"  {n:<44} {w:7.3f} ({bw:6.3f}) {c:7.3f} ({bc:6.3f})   {w / ref_w:5.2f}x wall {c / ref_c:5.2f}x CPU")
    print("cache sizes (blocks of 512 tokens): kvcache-simulator", [p["cacheBlocks"] for p in kvs["points"]],
          "radixkv", [p["capacity_tokens"] // UNIT for p in ours["curves"][0]["points"]])


if __name__ == "__main__":
    main()
