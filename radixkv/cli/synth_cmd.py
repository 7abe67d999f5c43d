"""``radixkv trace synth SCENARIO``: write a seeded synthetic token-level trace.

::

    radixkv trace synth SCENARIO --requests N --seed S --out PATH
        [--rate R] [--arrival poisson|gamma] [--cv CV] [--param NAME=VALUE ...]

SCENARIO is one of ``long_doc_qa``, ``agent_tools``, ``enterprise``,
``customer_service``, ``multi_turn``, ``mix`` (see :mod:`radixkv.synth`). PATH ending in
``.npz`` is written with :func:`radixkv.trace.binary.write_npz`, anything else as native
JSONL (:func:`radixkv.trace.native.write_native`); both write a temp file and rename it.
Same arguments → same bytes.

The ``trace`` verb belongs to :mod:`radixkv.cli.trace_cmd`, which attaches this
sub-command by calling :func:`register_synth` on its sub-parsers. Standalone:
``python -m radixkv.cli.synth_cmd SCENARIO ...``.
"""
from __future__ import annotations

import argparse
import sys

from radixkv.errors import InputError
from radixkv.synth.arrivals import ARRIVALS
from radixkv.synth.registry import SCENARIOS, generate


#: ``--cv`` when not given (read by ``--arrival gamma`` only)
_DEFAULT_CV = 2.0


def _scenario_help() -> str:
    return "; ".join(f"{name}: {s.summary}" for name, s in SCENARIOS.items())


def add_synth_args(p: argparse.ArgumentParser) -> None:
    """Add the ``synth`` arguments to parser *p*."""
    p.add_argument("scenario", metavar="SCENARIO", help="one of: " + ", ".join(SCENARIOS))
    p.add_argument("--requests", type=int, required=True, metavar="N", help="number of requests")
    p.add_argument("--seed", type=int, required=True, metavar="S", help="random seed (integer ≥ 0)")
    p.add_argument("--out", required=True, metavar="PATH", help="output file: .npz (binary) or native JSONL")
    p.add_argument("--rate", type=float, default=1.0, metavar="R", help="long-run request rate, requests/s (default 1.0)")
    p.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="session arrival process (default poisson)")
    p.add_argument("--cv", type=float, default=_DEFAULT_CV,
                   help=f"coefficient of variation of the gaps of --arrival gamma (default {_DEFAULT_CV}; "
                        f"refused with poisson, whose cv is 1)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="set a scenario parameter, e.g. document_len=loguniform:5000,20000 or "
                        "long_doc_qa.zipf_s=1.2 (mix); repeatable")
    p.set_defaults(func=run_synth)


def register_synth(trace_subparsers) -> argparse.ArgumentParser:
    """Attach ``synth`` to the ``trace`` verb's sub-parsers; returns the new parser."""
    p = trace_subparsers.add_parser(
        "synth",
        help="write a seeded synthetic token-level trace",
        description=__doc__.split("\n\n")[0] + " Scenarios — " + _scenario_help(),
    )
    add_synth_args(p)
    return p


def synth_to_file(scenario: str, n_requests: int, seed: int, out: str, *, rate: float = 1.0,
                  arrival: str = "poisson", cv: float = 2.0, params=None):
    """Generate a trace (:func:`radixkv.synth.generate`) and write it to *out*.

    Returns the :class:`~radixkv.trace.Trace` written.

    Raises
    ------
    radixkv.errors.InputError
        Bad scenario, parameter or argument; nothing is written.
    """
    trace = generate(scenario, n_requests, seed, rate=rate, arrival=arrival, cv=cv, params=params)
    if str(out).endswith(".npz"):
        from radixkv.trace.binary import write_npz

        write_npz(trace, out)
    else:
        from radixkv.trace.native import write_native

        write_native(trace, out)
    return trace


def run_synth(args) -> int:
    """CLI entry: generate, write, print a one-line summary to stderr."""
    from radixkv.util import check_output_paths

    if args.cv != _DEFAULT_CV and args.arrival != "gamma":
        from radixkv.errors import ConfigError

        raise ConfigError(f"--cv is the coefficient of variation of --arrival gamma's gaps; --arrival "
                          f"{args.arrival} has none: add --arrival gamma or drop --cv", field="cv")
    check_output_paths(args.out)
    t = synth_to_file(args.scenario, args.requests, args.seed, args.out, rate=args.rate,
                      arrival=args.arrival, cv=args.cv, params=args.param or None)
    span = float(t.arrival_s[-1]) if len(t) else 0.0
    print(f"{args.out}: {len(t)} requests, {t.total_prompt_tokens} prompt tokens, "
          f"{t.total_output_tokens} output tokens, {span:.1f} s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m radixkv.cli.synth_cmd``: the same arguments as ``radixkv trace synth``."""
    p = argparse.ArgumentParser(prog="radixkv trace synth", description=__doc__.split("\n\n")[0])
    add_synth_args(p)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except InputError as e:
        print(f"radixkv: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
