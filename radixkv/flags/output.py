"""The output flags the replay verbs share: ``--json [PATH]`` (:mod:`radixkv.cli._output`
says where each verb's output goes) and ``--report PATH.html`` (:mod:`radixkv.cli.report_cmd`
writes it). They are flags of ``radixkv replay``'s parser, so a sweep grid that names one is
refused by name (:mod:`radixkv.sweep.grid`)."""
from __future__ import annotations

#: the path meaning "standard output"
STDOUT = "-"


def add_json_arg(p, what: str) -> None:
    """``--json [PATH]`` on parser *p*: write *what* as JSON to PATH, or print it (``-``)."""
    p.add_argument("--json", metavar="PATH", nargs="?", const=STDOUT, default=None,
                   help=f"write {what} as JSON (sorted keys) to PATH, atomically; '-' or no PATH prints it "
                        f"on stdout (the table then goes to stderr). Default: no JSON")


def add_report_arg(p) -> None:
    """``--report PATH`` on a replay verb: also write the HTML report of this run."""
    p.add_argument("--report", metavar="PATH.html", default=None,
                   help="also write a self-contained HTML report of this run (tables, figures, provenance) to "
                        "PATH.html (default: not written)")
