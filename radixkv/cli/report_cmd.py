"""``radixkv report RESULT... --out report.html``: one self-contained HTML page of results
(:mod:`radixkv.html_report`), and the ``--report PATH`` flag ``replay``, ``compare``,
``curve``, ``sweep`` and ``check`` share."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from radixkv.flags.output import add_report_arg  # noqa: F401  (importable from here, as before)


def cmd_report(args) -> int:
    """Write one self-contained static HTML page (no network, no script) from result files:
    JSON written by replay/compare/curve/plan --json, --timeline CSVs and --per-request CSVs
    (a plan's JSON gets its own section: recommendation, runner-ups, caching verdict, Pareto plot).
    It holds the summary tables, the figures as inline PNG (hit rate vs capacity, hit-length
    histogram, alignment loss by block/page size, pool split over time, evictions over time,
    per-request hit vs prompt length) and the run's provenance."""
    from radixkv.html_report import report_from_files
    from radixkv.util import check_output_paths

    from radixkv.cli._output import inputs

    check_output_paths(args.out, inputs=inputs(args))
    for r in args.results:
        if Path(r).is_dir():
            from radixkv.errors import InputError

            hint = (f"; a sweep's report: radixkv sweep GRID.toml --out {r} --report PATH.html (finished cells are "
                    f"not run again)") if (Path(r) / "cells").is_dir() else ""
            raise InputError("is a folder: give result files (JSON of replay/compare/curve --json, a --timeline "
                             "or --per-request CSV)" + hint, path=r, field="results")
    report_from_files(args.results, args.out, command=_command())
    print(f"wrote {args.out}")
    return 0


def _command() -> str:
    return "radixkv " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv and sys.argv[0] else ""


def write_run_report(path, doc: dict, tables=(), *, stream=None) -> None:
    """Write the report of one run: its JSON *doc* and column *tables* (timelines,
    per-request rows; see :func:`radixkv.html_report.render_report`); say so on *stream*."""
    from radixkv.html_report import write_report

    if path is None:
        return
    write_report([{"kind": "json", "doc": doc, "label": "this run"}, *tables], path, command=_command())
    print(f"wrote {path}", file=stream or sys.stdout)


def run_tables(label: str, rec) -> list:
    """The report tables of one replay's records *rec* (sequential ``Records`` or a
    ``ConcurrentResult``): its per-request rows and, when recorded, its timeline."""
    import numpy as np

    cols = rec.columns
    keep = [c for c in ("prompt_tokens", "hit_tokens", "evicted_tokens", "admit_s") if c in cols]
    out = [{"kind": "per_request", "label": label,
            "columns": {c: np.asarray(cols[c], dtype=np.float64) for c in keep}}]
    tl = getattr(rec, "timeline", None)
    if tl:
        out.append({"kind": "timeline", "label": label,
                    "columns": {c: np.asarray(v, dtype=np.float64) for c, v in tl.items()}})
    return out


def register(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page of results (tables, figures, provenance)",
                       description=cmd_report.__doc__)
    p.add_argument("results", nargs="+", metavar="RESULT",
                   help="result files: JSON of replay/compare/curve --json, --timeline CSV, --per-request CSV")
    p.add_argument("--out", required=True, metavar="PATH.html", help="the HTML page to write (required)")
    p.set_defaults(func=cmd_report)
