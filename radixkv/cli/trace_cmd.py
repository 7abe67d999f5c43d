"""``radixkv trace inspect | convert``: look at a trace, or rewrite it in a native format.

- ``inspect PATH [--format F] [--limit K] [--json]``: request count, prompt / output token
  totals and percentiles, unit_tokens, distinct ids, time span and the infinite-cache
  prefix hit ratio (:func:`radixkv.trace.stats.describe`).
- ``convert IN OUT [--format F] [--limit K]``: read any supported format, write ``.npz``
  (binary) or ``.jsonl`` (native) by OUT's extension, atomically
  (:func:`radixkv.trace.load.save_trace`).
- ``synth SCENARIO ...``: attached from :mod:`radixkv.cli.synth_cmd` when present.
"""
from __future__ import annotations

import json
import sys

from radixkv.cli._output import add_json_arg
from radixkv.errors import InputError
from radixkv.trace.detect import ALIASES, FORMATS


def _limit(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise InputError(f"--limit expects a whole number, got {text!r}", field="limit") from None
    if v < 0:
        raise InputError(f"--limit must be ≥ 0, got {v}", field="limit")
    return v


def _load(args):
    from radixkv.trace.load import load_trace

    trace = load_trace(args.path, format=args.format)
    if args.limit is not None:
        trace = trace.head(_limit(args.limit))
    return trace


def cmd_inspect(args) -> int:
    """Print a trace's statistics: request count, prompt/output tokens (totals and
    percentiles), unit_tokens, distinct ids, time span (seconds) and the infinite-cache
    prefix hit ratio; ``--json -`` prints them as JSON instead, ``--json PATH`` writes them."""
    from radixkv.cli._output import emit, files, inputs
    from radixkv.trace.stats import describe, format_description
    from radixkv.util import check_output_paths

    check_output_paths(*files(args.json), inputs=inputs(args))
    trace = _load(args)
    d = describe(trace)
    if trace.name and trace.name != str(args.path):
        # a converted trace (.npz) keeps its source's name: show the file read, and the source
        d["name"], d["source"] = str(args.path), trace.name
    if args.json is None or args.json != "-":
        sys.stdout.write(format_description(d) + "\n")
    emit(args.json, json.dumps(d, indent=2, sort_keys=True) + "\n", args.json)
    return 0


def cmd_convert(args) -> int:
    """Read IN, write OUT (format by extension); prints one line saying what was written."""
    from radixkv.cli._output import inputs
    from radixkv.trace.load import output_format, save_trace
    from radixkv.util import check_output_paths

    check_output_paths(args.out, inputs=inputs(args))
    output_format(args.out)  # an extension it cannot write is refused before the (maybe long) read
    trace = _load(args)
    save_trace(trace, args.out)
    print(f"wrote {len(trace):,} requests (unit_tokens {trace.unit_tokens}) to {args.out}")
    return 0


def register(subparsers) -> None:
    fmt_help = f"input format: {', '.join(FORMATS)} (aliases {', '.join(sorted(ALIASES))}); default: detected"
    p = subparsers.add_parser("trace", help="inspect or convert a trace file",
                              description="Look at a trace (inspect), rewrite it (convert) or generate one (synth).")
    sub = p.add_subparsers(dest="trace_verb", metavar="ACTION")
    sub.required = True

    pi = sub.add_parser("inspect", help="summary statistics and infinite-cache prefix hit ratio",
                        description=cmd_inspect.__doc__)
    pi.add_argument("path", metavar="PATH", help="trace file or directory")
    pi.add_argument("--format", default=None, help=fmt_help)
    pi.add_argument("--limit", default=None, metavar="K", help="only the first K requests in replay order")
    add_json_arg(pi, "the statistics")
    pi.set_defaults(func=cmd_inspect)

    pc = sub.add_parser("convert", help="rewrite a trace as .npz (binary) or .jsonl (native)",
                        description=cmd_convert.__doc__)
    pc.add_argument("path", metavar="IN", help="input trace file or directory")
    pc.add_argument("out", metavar="OUT", help="output file: .npz or .jsonl")
    pc.add_argument("--format", default=None, help=fmt_help)
    pc.add_argument("--limit", default=None, metavar="K", help="only the first K requests in replay order")
    pc.set_defaults(func=cmd_convert)

    # ``trace synth`` lives in radixkv.cli.synth_cmd (the synthetic-workload owner's module)
    try:
        from radixkv.cli.synth_cmd import register_synth
    except ModuleNotFoundError as e:
        if e.name != "radixkv.cli.synth_cmd":
            raise
    else:
        register_synth(sub)
