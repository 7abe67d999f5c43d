"""``radixkv sweep GRID.toml --out DIR`` and ``radixkv sweep-plot DIR``: argument parsing only
(the work is :mod:`radixkv.sweep`).

Exit status of ``sweep``: 0 every cell finished, 1 some cells failed (listed; the others
are stored, a rerun retries only the failed and unfinished ones), 2 a bad grid or option
(the message names the key), 130 interrupted (finished cells are kept).
"""
from __future__ import annotations

import sys


def add_executor_args(p, *, dask_help: bool = True) -> None:
    """``--executor``, ``--workers`` and ``--scheduler`` (shared with ``compare`` and ``curve``)."""
    g = p.add_argument_group("where cells run")
    g.add_argument("--executor", choices=["local", "processes", "dask"], default=None,
                   help="local: this process (default); processes: a pool of worker processes; "
                        "dask: a dask.distributed cluster (pip install 'radixkv[dask]')")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes (processes, local Dask cluster; default: the CPUs)")
    g.add_argument("--scheduler", default=None, metavar="ADDR",
                   help="address of an existing Dask scheduler, e.g. tcp://host:8786 (implies --executor dask)")


def resolve_executor(args) -> str:
    """The executor the flags ask for (``--scheduler`` alone means Dask), checked."""
    from radixkv.sweep.run import check_executor_args

    ex = args.executor or ("dask" if args.scheduler else "local")
    check_executor_args(ex, args.workers, args.scheduler)
    return ex


def cmd_sweep(args) -> int:
    from radixkv.sweep.grid import load_grid
    from radixkv.sweep.run import SweepReport, run_sweep

    from radixkv.cli._output import inputs
    from radixkv.util import check_output_paths

    executor = resolve_executor(args)
    grid = load_grid(args.grid)
    check_output_paths(args.report, inputs=inputs(args, *(c.trace.path for c in grid.cells)))
    rep = SweepReport()
    try:
        run_sweep(grid, args.out, executor=executor, workers=args.workers, scheduler=args.scheduler,
                  progress=not args.quiet, report=rep)
    except KeyboardInterrupt:
        print(f"radixkv: interrupted: {rep.skipped + rep.done} of {rep.total} cells are stored in {args.out}; "
              f"run the same command again to finish the other {rep.remaining}", file=sys.stderr)
        return 130
    print(f"{rep.total} cells: {rep.skipped} already done, {rep.done} run now ({executor}, {rep.wall_s:.1f} s), "
          f"{len(rep.failed)} failed; results in {args.out}")
    if args.report:
        from radixkv.cli.report_cmd import write_run_report
        from radixkv.html_report import sweep_doc
        from radixkv.sweep.store import read_rows

        write_run_report(args.report, sweep_doc(read_rows(args.out)))
    if rep.failed:
        print(f"radixkv: {len(rep.failed)} cell(s) failed (errors in {args.out}/errors/; a rerun retries them):",
              file=sys.stderr)
        for cell, err in rep.failed:
            print(f"  {cell.key}  {cell.label}: {err['type']}: {err['message']}", file=sys.stderr)
        return 1
    return 0


def cmd_sweep_plot(args) -> int:
    from pathlib import Path

    from radixkv.plots import plot_sweep
    from radixkv.sweep.store import read_rows
    from radixkv.util import check_output_paths

    out = args.out or str(Path(args.dir) / f"{args.metric}_vs_capacity.png")
    check_output_paths(out, inputs=[str(Path(args.dir) / "cells")])
    rows = read_rows(args.dir)
    n = plot_sweep(rows, out, metric=args.metric)
    print(f"wrote {out} ({n} lines from {len(rows)} cells)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of replays (resumable; local, processes or Dask)",
                       description="Run every cell of GRID.toml (traces x policies x sizes x pools x knobs) and "
                                   "store each finished cell in DIR at once; a rerun skips finished cells.")
    p.add_argument("grid", metavar="GRID.toml", help="the grid (keys: traces, policies and `radixkv replay` flags)")
    p.add_argument("--out", required=True, metavar="DIR", help="results directory (created; reused to resume)")
    add_executor_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    from radixkv.cli.report_cmd import add_report_arg

    add_report_arg(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("sweep-plot", help="hit rate against pool capacity per policy, from a sweep's results",
                       description="Plot a sweep's results: one line per policy, the metric against pool capacity "
                                   "(tokens), as a PNG.")
    p.add_argument("dir", metavar="DIR", help="a sweep's results directory")
    p.add_argument("--metric", default="token_hit_rate",
                   choices=["token_hit_rate", "mean_request_hit_ratio", "request_hit_rate"],
                   help="the y axis (a ratio in [0, 1])")
    p.add_argument("--out", default=None, metavar="PNG", help="output PNG path (default DIR/<metric>_vs_capacity.png, inside the sweep's folder)")
    p.set_defaults(func=cmd_sweep_plot)
