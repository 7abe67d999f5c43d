"""Benchmark: the fixed cost of every CLI verb, as a user runs it (one process per command).

Each command runs as ``python -m radixkv ...`` in a fresh process, on a warm cache (one
untimed run of every command first: Numba kernels compiled, the trace's binary cache
written, :mod:`radixkv.trace.cache`), then ``--repeat`` rounds that run every command once,
in turn. Printed per command: best-of-N wall time and CPU time (user + system of the
child, ``resource.getrusage``), and — with ``--tree`` given more than once — each tree's
ratio to the first tree's, measured alternately in the same rounds. The load average is
printed before and after (the development machine is shared: CPU time is the stable
figure, wall time includes the waits for a core).

    python experiments/bench_process.py [--repeat 5] [--tree OTHER_CHECKOUT --tree .]
        [--only help,inspect,...] [--trace PATH]

Commands (Mooncake conversation trace, 12,031 requests, 512-token hash ids):
``help`` (``radixkv --help``), ``inspect`` (``trace inspect``), ``replay`` (``sglang:1``
at 10 M tokens), ``compare`` (``vllm:16,sglang:1`` at 10 M tokens), ``curve`` (``unit-lru``
at 8 capacities, printed) and ``curve_png`` (the same, ``--out`` JSON + PNG).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CAPS = "1e4,1e5,1e6,2e6,3e6,5e6,1e7,5e7"


def commands(trace: str, out: str) -> dict[str, list[str]]:
    """name → radixkv arguments."""
    return {
        "help": ["--help"],
        "inspect": ["trace", "inspect", trace],
        "replay": ["replay", trace, "--policy", "sglang:1", "--capacity-tokens", "1e7"],
        "compare": ["compare", trace, "--policies", "vllm:16,sglang:1", "--capacity-tokens", "1e7"],
        "curve": ["curve", trace, "--policies", "unit-lru", "--capacities", CAPS],
        "curve_png": ["curve", trace, "--policies", "unit-lru", "--capacities", CAPS, "--out", out],
    }


def run_timed(argv: list[str], env: dict, cwd: str) -> tuple[float, float]:
    """(wall s, CPU s of the child) of one run; exits on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=None, help="default: $RADIXKV_SHARED/traces/mooncake-fast25/conversation_trace.jsonl")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tree", action="append", default=None,
                    help="a checkout of radixkv to run (repeatable; the first is the baseline; default: this one)")
    ap.add_argument("--only", default=None, help="comma-separated command names")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    shared = Path(os.environ.get("RADIXKV_SHARED", HERE.parent.parent / "shared"))
    trace = args.trace or str(shared / "traces/mooncake-fast25/conversation_trace.jsonl")
    trees = [str(Path(t).resolve()) for t in (args.tree or [HERE.parent])]
    with tempfile.TemporaryDirectory(prefix="radixkv-bench-process-") as tmp:
        cmds = commands(trace, os.path.join(tmp, "curve"))
        names = list(cmds) if not args.only else [n.strip() for n in args.only.split(",")]
        envs = {t: {**os.environ, "PYTHONPATH": t} for t in trees}
        for t in trees:  # bytecode compiled, as an installed package has it (bench_vs_kvcache_sim.py)
            envs[t].pop("PYTHONDONTWRITEBYTECODE", None)
            subprocess.run([args.python, "-m", "compileall", "-q", os.path.join(t, "radixkv")], env=envs[t],
                           stdout=subprocess.DEVNULL, check=True)
        print(f"load average before: {os.getloadavg()}", flush=True)
        for t in trees:  # warm: compile, write the trace cache
            for n in names:
                run_timed([args.python, "-m", "radixkv", *cmds[n]], envs[t], tmp)
        best = {(t, n): (float("inf"), float("inf")) for t in trees for n in names}
        for _ in range(args.repeat):
            for n in names:
                for t in trees:
                    w, c = run_timed([args.python, "-m", "radixkv", *cmds[n]], envs[t], tmp)
                    bw, bc = best[t, n]
                    best[t, n] = (min(bw, w), min(bc, c))
        print(f"load average after: {os.getloadavg()}")
    print(f"best of {args.repeat}; wall / CPU seconds per process" + ("; ratio to the first tree" if len(trees) > 1 else ""))
    for i, t in enumerate(trees):
        print(f"  tree {i}: {t}")
    head = f"{'command':<10}" + "".join(f"  tree {i} wall   CPU" + ("  ratio w / c" if i else "") for i in range(len(trees)))
    print(head)
    for n in names:
        row = f"{n:<10}"
        w0, c0 = best[trees[0], n]
        for i, t in enumerate(trees):
            w, c = best[t, n]
            row += f"  {w:11.3f} {c:5.3f}" + (f"  {w / w0:5.2f} {c / c0:5.2f}" if i else "")
        print(row)


if __name__ == "__main__":
    main()
