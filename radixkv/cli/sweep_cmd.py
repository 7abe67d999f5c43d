"""``radixkv sweep GRID.toml --out DIR``, ``radixkv sweep-show DIR`` and ``radixkv sweep-plot
DIR``: argument parsing only (the work is :mod:`radixkv.sweep`).

Exit status of ``sweep``: 0 every cell finished, 1 some cells failed (listed; the others
are stored, a rerun retries only the failed and unfinished ones), 2 a bad grid or option
(the message names the key), 130 interrupted (finished cells are kept). Of ``sweep-show``
and ``sweep-plot``: 0, or 2 when there is nothing to show or draw (the message says why
and what to ask instead; nothing is written).
"""
from __future__ import annotations

import sys

from radixkv.flags.executor import add_executor_args


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
    """``sweep-plot DIR``: one metric against one swept knob, a PNG; exit 2, writing
    nothing, when there is nothing to draw (the reason names the knob to use)."""
    from pathlib import Path

    from radixkv.plots import plot_sweep
    from radixkv.sweep.store import read_rows
    from radixkv.util import check_output_paths

    x = args.x
    out = args.out or str(Path(args.dir) / f"{args.metric}_vs_{'capacity' if x == 'capacity_tokens' else x}.png")
    check_output_paths(out, inputs=[str(Path(args.dir) / "cells")])
    rows = read_rows(args.dir)
    n = plot_sweep(rows, out, metric=args.metric, x=x)
    print(f"wrote {out} ({n} lines from {len(rows)} cells)")
    return 0


def cmd_sweep_show(args) -> int:
    """``sweep-show DIR``: the finished cells as a table (one line per cell: the swept
    knobs, the pool's usable tokens, the metrics), ``--json`` the same records."""
    from radixkv.cli._output import emit, files, human
    from radixkv.sweep.show import format_results, table_rows
    from radixkv.sweep.store import read_errors, read_rows
    from radixkv.util import check_output_paths, dumps_json

    from pathlib import Path

    check_output_paths(*files(args.json), inputs=[str(Path(args.dir) / "cells")])
    rows = read_rows(args.dir)
    errs = read_errors(args.dir)
    if not rows:
        from radixkv.errors import InputError

        raise InputError(f"no finished cell to show ({len(errs)} failed: see {args.dir}/errors/)", path=args.dir)
    metrics = None if args.metrics is None else [m.strip() for m in args.metrics.split(",") if m.strip()]
    cols, recs = table_rows(rows, metrics)
    out = human(args.json)
    print(f"{args.dir}: {len(rows)} finished cells" + (f", {len(errs)} failed (see {args.dir}/errors/)"
                                                       if errs else ""), file=out)
    if recs:
        print(format_results(cols, recs), file=out)
    emit(args.json, dumps_json({"dir": str(args.dir), "columns": cols, "cells": recs,
                                "failed": [e["key"] for e in errs]}), args.json)
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

    p = sub.add_parser("sweep-show", help="a sweep's results as a table (one line per cell)",
                       description="Print the finished cells of a sweep's results directory: the knobs the grid "
                                   "sweeps, the pool's usable tokens and the metrics, one line per cell.")
    p.add_argument("dir", metavar="DIR", help="a sweep's results directory")
    p.add_argument("--metrics", default=None, metavar="M,M",
                   help="the metric columns, comma-separated (default: token_hit_rate, hit_tokens, evictions, "
                        "and TTFT p50/p99 when a cell is concurrent)")
    from radixkv.cli._output import add_json_arg

    add_json_arg(p, "the table's records")
    p.set_defaults(func=cmd_sweep_show)

    p = sub.add_parser("sweep-plot", help="a metric against a swept knob per policy, from a sweep's results",
                       description="Plot a sweep's results: one line per policy (and per value of any other knob "
                                   "the grid varies), the metric against a knob, as a PNG. Exit 2, writing "
                                   "nothing, when there is nothing to draw.")
    p.add_argument("dir", metavar="DIR", help="a sweep's results directory")
    p.add_argument("--x", default="capacity_tokens", metavar="KNOB",
                   help="the x axis: a grid knob (capacity_tokens is the pool's usable tokens however the grid "
                        "sized it, log scale; or gpu_memory_utilization, max_num_seqs, request_rate, ...)")
    p.add_argument("--y", "--metric", dest="metric", default="token_hit_rate", metavar="METRIC",
                   help="the y axis: a summary metric (token_hit_rate, hit_tokens, evictions, ttft_p99_s, ...)")
    p.add_argument("--out", default=None, metavar="PNG",
                   help="output PNG path (default DIR/<metric>_vs_capacity.png or DIR/<metric>_vs_<knob>.png, "
                        "inside the sweep's folder)")
    p.set_defaults(func=cmd_sweep_plot)
