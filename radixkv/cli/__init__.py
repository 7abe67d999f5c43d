"""``radixkv`` command line. Each verb lives in its own module, which exposes
``register(subparsers)``; every verb is also a Python function in the library.

Exit status: 0 ok, 2 bad input (an :class:`radixkv.errors.InputError`, printed as
``radixkv: error: <where>: <what>``). An :class:`radixkv.errors.InputWarning` (input read
but changed, e.g. sorted into time order) is printed as ``radixkv: warning: <where>: <what>``.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import sys
import warnings
import weakref

from radixkv.errors import InputError, InputWarning

#: verb modules, in the order ``--help`` lists them
_VERB_MODULES = [
    "radixkv.cli.trace_cmd",
    "radixkv.cli.memory_cmd",
    "radixkv.cli.replay_cmd",
    "radixkv.cli.sweep_cmd",
    "radixkv.cli.plan_cmd",
    "radixkv.cli.check_cmd",
    "radixkv.cli.report_cmd",
]

#: verb → the module that registers it. A command line naming one of these imports that
#: module alone (the others pull in Numba, the policies, matplotlib's callers: ~0.5 s);
#: ``--help``, no verb or a verb not listed here imports them all, so a verb missing from
#: this table still works (``tests/test_cli_lazy.py`` checks the table against the modules).
_VERB_MODULE = {
    "trace": "radixkv.cli.trace_cmd",
    "memory": "radixkv.cli.memory_cmd",
    "replay": "radixkv.cli.replay_cmd",
    "compare": "radixkv.cli.replay_cmd",
    "curve": "radixkv.cli.replay_cmd",
    "sweep": "radixkv.cli.sweep_cmd",
    "sweep-plot": "radixkv.cli.sweep_cmd",
    "sweep-show": "radixkv.cli.sweep_cmd",
    "check": "radixkv.cli.check_cmd",
    "warmup": "radixkv.cli.check_cmd",
    "report": "radixkv.cli.report_cmd",
    "plan": "radixkv.cli.plan_cmd",
}


#: True in the ``radixkv`` program (:func:`entry`), whose process ends after its verb (a
#: verb may then skip what only a process that lives on needs: matplotlib's docstrings,
#: :func:`radixkv.plots.png_writer`); False for callers of :func:`main`
PROGRAM = False


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are two lines: the error, and where the
    options are listed. (argparse's default prints the whole usage first, 40 lines
    for ``replay``, which buries the one line that says what is wrong.) Subparsers
    inherit the class. Exit status 2, as argparse's."""

    def error(self, message):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``radixkv`` parser. With *argv* whose first word is a verb of
    :data:`_VERB_MODULE`, only that verb's module is imported and registered;
    otherwise (``None``, ``--help``, no or an unknown verb) every verb module is."""
    parser = Parser(
        prog="radixkv",
        description="Replay request traces through models of vLLM's and SGLang's prefix caches.",
    )
    from radixkv import __version__

    parser.add_argument("--version", action="version", version=f"radixkv {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    first = argv[0] if argv else None
    for name in [_VERB_MODULE[first]] if first in _VERB_MODULE else _VERB_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        mod.register(sub)
    for p in walk_parsers(parser):
        p.formatter_class = DefaultsHelpFormatter
        for a in p._actions:
            if a.option_strings and type(a) in _ONCE:
                a.__class__ = _ONCE[type(a)]
    return parser


#: the flags each parsed namespace was given: ``{id(namespace): (weak reference, {dest:
#: (option string, value)})}`` (argparse's namespaces are unhashable, so not weak keys)
_GIVEN: dict = {}


class _Once:
    """Mixed into a flag's argparse action: the same destination set twice by different
    flags, or by one flag to different values (``--no-enable-prefix-caching
    --enable-prefix-caching``, ``--capacity-tokens 1000 --capacity-tokens 2000``), is a
    usage error naming both, instead of the last one silently winning. The same flag
    repeated with the same value is harmless and accepted."""

    def __call__(self, parser, namespace, values, option_string=None):
        ref, given = _GIVEN.get(id(namespace), (None, None))
        if ref is None or ref() is not namespace:  # a new namespace (argparse's are unhashable)
            given = {}
            _GIVEN[id(namespace)] = (weakref.ref(namespace), given)
            weakref.finalize(namespace, _GIVEN.pop, id(namespace), None)
        seen = given.get(self.dest)
        value = values if self.nargs != 0 else self.const
        if seen is not None and (seen[0] != option_string or seen[1] != value):
            def show(flag, v):
                return flag if self.nargs == 0 else f"{flag} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            parser.error(f"{show(option_string, value)} contradicts {show(*seen)} given before it "
                         f"(both set {self.dest}): give it once")
        given[self.dest] = (option_string, value)
        super().__call__(parser, namespace, values, option_string)


def _once_classes() -> dict:
    kinds = (argparse._StoreAction, argparse._StoreConstAction, argparse._StoreTrueAction,
             argparse._StoreFalseAction, argparse.BooleanOptionalAction)
    return {k: type("Once" + k.__name__.lstrip("_"), (_Once, k), {}) for k in kinds}


_ONCE = _once_classes()


def flag_of(parser: argparse.ArgumentParser, dest: str) -> str | None:
    """The first long option string of *parser*'s (or a sub-parser's) flag stored in *dest*,
    or None."""
    for p in walk_parsers(parser):
        for a in p._actions:
            if a.dest == dest and a.option_strings:
                longs = [o for o in a.option_strings if o.startswith("--")]
                return (longs or a.option_strings)[0]
    return None


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help lines end in ``(default: X)`` for an option whose default is a value (not
    None, not a flag's False/True) and whose help does not already state it."""

    def _get_help_string(self, action):
        h = action.help or ""
        d = action.default
        if (d is None or d is argparse.SUPPRESS or isinstance(d, bool) or d == [] or "default" in h.lower()
                or not action.option_strings):
            return h
        return h + " (default: %(default)s)"


def walk_parsers(parser):
    """*parser* and every sub-parser below it, depth first."""
    yield parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in dict.fromkeys(a.choices.values()):
                yield from walk_parsers(sp)


def _show_input_warning(message, category, filename, lineno, file=None, line=None, _default=None):
    """Print an :class:`~radixkv.errors.InputWarning` as ``radixkv: warning: <message>``
    (other warnings: Python's format)."""
    if issubclass(category, InputWarning):
        print(f"radixkv: warning: {message}", file=sys.stderr)
    else:
        _default(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("default", InputWarning)
        warnings.showwarning = functools.partial(_show_input_warning, _default=warnings.showwarning)
        return _run(args, parser)


def _run(args, parser=None) -> int:
    try:
        from radixkv.cli._output import refuse_dash_outputs

        refuse_dash_outputs(args, _own_flag(parser, args))
        rc = args.func(args)
    except InputError as e:
        print(f"radixkv: error: {_cli_message(e, parser, args)}", file=sys.stderr)
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


def _own_flag(parser, args):
    """``dest -> flag`` on the sub-parser that parsed *args* (``radixkv trace convert``'s
    positional ``OUT`` is ``OUT``, not another verb's ``--out``); None when not found."""
    p = parser
    while p is not None:
        sub = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or getattr(args, sub.dest, None) not in sub.choices:
            break
        p = sub.choices[getattr(args, sub.dest)]

    def flag(dest):
        for a in (p._actions if p is not None else ()):
            if a.dest == dest:
                longs = [o for o in a.option_strings if o.startswith("--")]
                return (longs or a.option_strings or [a.metavar or dest.upper()])[0]
        return None

    return flag


def _cli_message(e: InputError, parser, args=None) -> str:
    """*e* as the command line shows it: an error about a flag (``field`` a destination of
    the parser, no file or line) names the flag (``--disable-priority-preemption``), not the
    destination (``field 'disable_priority_preemption'``)."""
    field = getattr(e, "field", None)
    if parser is None or not field or getattr(e, "path", None) is not None or getattr(e, "line", None) is not None:
        return str(e)
    own = _own_flag(parser, args)(field) if args is not None else None  # the verb's own flag first
    flag = own if own is not None else flag_of(parser, field)
    if flag is None or not flag.startswith("-"):  # a positional argument: the message names it
        return str(e)
    reason = getattr(e, "reason", str(e))
    return reason if flag in reason else f"{flag}: {reason}"


def entry() -> None:
    """The ``radixkv`` program (the console script and ``python -m radixkv``): :func:`main`,
    then :func:`leave`. Never returns.

    The young generation of the garbage collector is collected every 50,000 allocations
    instead of 700: importing Numba and matplotlib and loading the kernels allocates
    ~10^6 objects that all live to the end, and the default thresholds ran ~30 middle and
    2 full collections over them (0.04-0.09 s of CPU of a ~1 s process; the cyclic garbage
    a collection may wait for is at most 50,000 containers)."""
    import gc

    global PROGRAM
    PROGRAM = True
    gc.set_threshold(50_000)
    leave(main())


def leave(rc: int) -> None:
    """End the process with status *rc* without tearing the interpreter down.

    Python's own exit clears every module and runs full garbage collections over the
    objects Numba's kernel loading and matplotlib leave (~10^5-10^6 of them): 0.15-0.2 s
    of CPU after the work is done (measured: docs/performance.md, "Fixed cost of a
    process"). When only the main thread is left, this runs what a normal exit runs that
    can matter to the outside — the :mod:`atexit` functions (temporary folders of
    ``weakref.finalize``, logging's flush) and the flush of stdout and stderr — and then
    calls :func:`os._exit`. Otherwise (another thread alive; a flush that fails, e.g. a
    closed pipe) it exits the normal way, with the behaviour Python gives those cases.
    Outputs are never at stake: radixkv writes and closes every file before :func:`main`
    returns (:func:`radixkv.util.atomic_output`). Not for in-process callers: tests and
    the library call :func:`main`, which returns."""
    import os
    import threading

    import atexit

    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if threading.active_count() == 1 and run_exitfuncs is not None:
        run_exitfuncs()
        try:
            for f in (sys.stdout, sys.stderr):
                if f is not None:
                    f.flush()
        except (OSError, ValueError):
            pass
        else:
            os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
