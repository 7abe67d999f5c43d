"""The wall time of a ``radixkv plan`` search with its replays' durations fixed: the search's
critical path, whatever the machine's load.

Every replay is replaced by a sleep of the duration it took in a finished plan's work dir
(``timing_s.cell`` of each stored cell, times ``--scale``) and returns that cell's stored
metrics, so the plan takes the same decisions and writes the same JSON (the script checks
the bytes against ``--expect`` when given). A cell the finished plan never ran (a point
replayed ahead of the search and never asked for) sleeps for the duration of the nearest
replica count of its structure, scaled by the replica ratio. Sleeping needs no CPU, so two
runs of this script — one per tree, e.g. before and after a change to the search — compare
how the search uses its workers, not how busy the machine was.

    PYTHONPATH=TREE python tools/plan_critical_path.py WORK_DIR --scale 0.25 --expect plan.json \\
        -- TRACE --model M --slo ... --executor processes --workers 2

Prints ``critical path: W s wall (scale S; replays slept R s in all, U s of it for cells
the finished plan never ran)``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time


#: the finished plan's rows by cell key; (policy, gpu, tp) -> [(replicas, seconds)]; the scale
_ROWS: dict = {}
_KNOWN: dict = {}
_STATE = {"scale": 1.0}


def sleeping_cell(task, trace=None):
    """:func:`radixkv.sweep.cell.run_cell`'s stand-in: sleep, then the stored row's metrics
    (module level, so that worker processes can unpickle it)."""
    r = _ROWS.get(task.key)
    if r is None:  # never run by the finished plan: the nearest replica count's duration, scaled
        s = task.settings
        rep = s.get("replicas", 1)
        pts = _KNOWN.get((s.get("policy"), s.get("gpu"), s.get("tp", 1))) or [(1, 1.0)]
        r0, t0 = min(pts, key=lambda x: (abs(x[0] - rep), x[0]))
        t = t0 * rep / r0
        time.sleep(t * _STATE["scale"])
        return {"key": task.key, "ok": True, "worker": "sleep", "metrics": {"overloaded": False}, "pool": {},
                "timing_s": {"cell": t, "unrun": t}}
    time.sleep(r["timing_s"]["cell"] * _STATE["scale"])
    return {"key": task.key, "ok": True, "worker": "sleep", "metrics": r["metrics"], "pool": r["pool"],
            "timing_s": r["timing_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work_dir", help="a finished plan's --work-dir (its cells give each replay's duration)")
    ap.add_argument("--scale", type=float, default=1.0, help="sleep this times each replay's duration (1.0)")
    ap.add_argument("--expect", default=None, help="the finished plan's --json: the bytes this run must write")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        ap.error("give the plan's arguments after --")
    cut = argv.index("--")
    a = ap.parse_args(argv[:cut])
    args = argv[cut + 1:]
    rows = {os.path.basename(f)[:-len(".jsonl")]: json.loads(open(f, encoding="utf-8").read())
            for f in glob.glob(os.path.join(a.work_dir, "cells", "*.jsonl"))}
    if not rows:
        print(f"{a.work_dir}: no finished cells", file=sys.stderr)
        return 2
    _ROWS.update(rows)
    _STATE["scale"] = a.scale
    for r in rows.values():
        s = r["settings"]
        _KNOWN.setdefault((s.get("policy"), s.get("gpu"), s.get("tp", 1)), []).append(
            (s.get("replicas", 1), r["timing_s"]["cell"]))

    import radixkv.sweep.cell as cell
    import radixkv.sweep.executors as executors

    cell.run_cell = sleeping_cell  # what the plan's pool and the sweep's executors call
    executors.run_cell = sleeping_cell
    from radixkv.cli import main as radixkv

    with tempfile.TemporaryDirectory(prefix="plan-critical-") as d:
        out = os.path.join(d, "plan.json")
        work = os.path.join(d, "work")
        t0 = time.perf_counter()
        rc = radixkv(["plan", *args, "--work-dir", work, "--json", out])
        wall = time.perf_counter() - t0
        slept = [json.loads(open(f, encoding="utf-8").read())["timing_s"]
                 for f in glob.glob(os.path.join(work, "cells", "*.jsonl"))]
        if rc != 0:
            return rc
        same = None if a.expect is None else open(out, "rb").read() == open(a.expect, "rb").read()
    total = sum(t["cell"] for t in slept) * a.scale
    unrun = sum(t.get("unrun", 0.0) for t in slept) * a.scale
    print(f"critical path: {wall:.1f} s wall (scale {a.scale:g}; replays slept {total:.1f} s in all, {unrun:.1f} s "
          f"of it for cells the finished plan never ran)" + ("" if same is None else f"; JSON bytes "
                                                               f"{'the same' if same else 'DIFFER'}"))
    return rc if same in (None, True) else 1


if __name__ == "__main__":
    sys.exit(main())
