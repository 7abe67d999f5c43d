"""Regression check by instruction count: a small replay under ``valgrind --tool=callgrind``.

Wall time on a shared machine varies by tens of percent; the number of instructions a
replay executes does not (same input, same compiled kernels, same count run after run).
For each policy this script starts a child Python under callgrind with instrumentation
off (``--instr-atstart=no``: imports, kernel loading and trace reading run uninstrumented),
switches instrumentation on with ``callgrind_control -i on`` just around the replay (the
child waits for it), and reads the instructions executed (``Ir``) from the output file.
It prints each count and its ratio to the committed baseline
(experiments/results/callgrind_baseline.json); ``--update`` rewrites the baseline.
The Numba cache must be warm (``radixkv warmup``), else compiling is counted.

    python experiments/bench_callgrind.py [--policies sglang:1,vllm:16,unit-lru] [--requests 60] [--update]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, result

from radixkv.util import atomic_write_text, dumps_json

TRACE = REPO / "traces" / "demo.jsonl"
CAPACITY = 20_000

CHILD = r"""
import os, sys, time
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import run_replay, warmup
from radixkv.trace.load import load_trace
spec = parse_policy(sys.argv[1])
trace = load_trace(sys.argv[2]).head(int(sys.argv[3]))
warmup(spec)
run_replay(trace, spec, PoolSpec(capacity_tokens=int(sys.argv[4])))  # every path loaded once
go = sys.argv[5]
open(go + ".ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
run_replay(trace, spec, PoolSpec(capacity_tokens=int(sys.argv[4])))
open(go + ".done", "w").close()
while not os.path.exists(go + ".off"):
    time.sleep(0.05)
"""


def _wait(path: Path, proc, timeout: float = 3600) -> None:
    t0 = time.time()
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"child ended early: {proc.stderr.read()[-2000:]}")
        if time.time() - t0 > timeout:
            raise TimeoutError(path)
        time.sleep(0.2)


def count(policy: str, requests: int) -> int:
    """Instructions (Ir) of one replay of the first *requests* demo requests."""
    tmp = Path(tempfile.mkdtemp())
    child = tmp / "child.py"
    child.write_text(CHILD)
    out = tmp / "cg.out"
    go = tmp / "go"
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="0")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         sys.executable, str(child), policy, str(TRACE), str(requests), str(CAPACITY), str(go)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait(Path(str(go) + ".ready"), proc)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, stdout=subprocess.DEVNULL)
        go.touch()
        _wait(Path(str(go) + ".done"), proc)
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, stdout=subprocess.DEVNULL)
        Path(str(go) + ".off").touch()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text(errors="replace")
    # "totals:" counts the instrumented part ("summary:" stays 0 with --instr-atstart=no)
    m = re.search(r"^totals:\s+(\d+)", text, re.M)
    if m is None:
        raise RuntimeError(f"no instruction count in {out}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", default="sglang:1,vllm:16,unit-lru")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--update", action="store_true", help="write the counts as the new baseline")
    args = ap.parse_args()
    base_path = result("callgrind_baseline.json")
    base = json.loads(base_path.read_text()) if base_path.exists() else {}
    key = f"demo[:{args.requests}]@{CAPACITY}"
    rows = {}
    for pol in args.policies.split(","):
        ir = count(pol.strip(), args.requests)
        ref = base.get(key, {}).get(pol)
        rows[pol] = ir
        ratio = f"{ir / ref:.4f}" if ref else "n/a (no baseline)"
        print(f"{pol:10} {key}: {ir:,} instructions; ratio to baseline {ratio}")
    if args.update:
        base.setdefault(key, {}).update(rows)
        atomic_write_text(base_path, dumps_json(base))
        print(f"wrote {base_path}")


if __name__ == "__main__":
    main()
