"""``radixkv`` command line. Each verb lives in its own module, which exposes
``register(subparsers)``; every verb is also a Python function in the library.

Exit status: 0 ok, 2 bad input (an :class:`radixkv.errors.InputError`, printed as
``radixkv: error: <where>: <what>``).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from radixkv.errors import InputError

#: verb modules, in the order ``--help`` lists them
_VERB_MODULES = [
    "radixkv.cli.trace_cmd",
    "radixkv.cli.memory_cmd",
    "radixkv.cli.replay_cmd",
    "radixkv.cli.sweep_cmd",
    "radixkv.cli.check_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixkv",
        description="Replay request traces through models of vLLM's and SGLang's prefix caches.",
    )
    from radixkv import __version__

    parser.add_argument("--version", action="version", version=f"radixkv {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for name in _VERB_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except InputError as e:
        print(f"radixkv: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            return 0
        where = f"{e.filename}: " if e.filename else ""
        print(f"radixkv: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("radixkv: error: out of memory: the pool or trace is too large for this machine", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("radixkv: interrupted; no output was replaced", file=sys.stderr)
        return 130
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    sys.exit(main())
