"""One output convention for every verb (issue 16).

* ``--json PATH`` writes JSON to PATH atomically (temp file, then rename); ``--json -``
  prints it on stdout; a bare ``--json`` means ``-``. When an output goes to stdout, the
  human-readable table and "wrote ..." lines go to stderr, so stdout holds only the JSON.
* ``--out`` names a file or directory the verb writes; no verb writes into the current
  folder unless asked.
"""
from __future__ import annotations

import sys

# the path meaning "standard output" and --json are defined below the CLI (a sweep grid refuses
# replay's --json by name); importable from here
from radixkv.flags.output import STDOUT, add_json_arg  # noqa: F401


def human(*paths):
    """The stream for human-readable text: stderr when one of *paths* is stdout."""
    return sys.stderr if any(p == STDOUT for p in paths) else sys.stdout


def files(*paths):
    """*paths* without None and ``-`` (the ones that name files, for
    :func:`radixkv.util.check_output_paths`)."""
    return [p for p in paths if p is not None and p != STDOUT]


def emit(path, text: str, *paths) -> None:
    """Write *text* to *path* (atomically) or, for ``-``, to stdout; say what was written on
    the human stream of *paths* (all the verb's outputs)."""
    from radixkv.util import atomic_write_text

    if path is None:
        return
    if path == STDOUT:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    atomic_write_text(path, text)
    print(f"wrote {path}", file=human(*paths))


#: argument destinations that name files a verb reads (the trace, a start-up log, a
#: Hugging Face config, a check configuration, a sweep grid or results folder, report inputs)
_INPUT_DESTS = ("trace", "path", "pool_from_log", "model", "config", "grid", "dir", "results")


def inputs(args, *more) -> list:
    """Every file or folder *args* names as an input, plus *more* (files a verb found in
    them: a configuration's traces and golden files, a grid's traces): what
    :func:`radixkv.util.check_output_paths` must never let an output replace. A
    ``--model`` that names no file (a preset) is left out."""
    import os

    out = []
    for dest in _INPUT_DESTS:
        v = getattr(args, dest, None)
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if x is not None and x != STDOUT and (dest != "model" or os.path.exists(x)):
                out.append(str(x))
    return out + [str(x) for x in more if x is not None]


#: output destinations that are written to a file only: ``-`` there named a file called
#: ``-`` in the current folder (the fresh-user trial found ``--per-request -`` did that)
FILE_ONLY_OUTPUTS = ("per_request", "timeline", "report", "miss_plot", "plot", "out")
#: output destinations that ``-`` prints on stdout (:func:`emit`)
STDOUT_OUTPUTS = ("json", "junit_xml", "markdown")


def refuse_dash_outputs(args, flag_of=lambda dest: None) -> None:
    """Refuse ``-`` where it cannot mean stdout, and two outputs on stdout at once.

    ``--json -`` (and ``check``'s ``--junit-xml -`` / ``--markdown -``) print on stdout; every
    other output (:data:`FILE_ONLY_OUTPUTS`: CSVs, HTML, PNGs, ``--out``) needs a file path.
    Two of :data:`STDOUT_OUTPUTS` given ``-`` would interleave on stdout.

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the flag (``field`` = its destination); for two stdout outputs, both flags.
    """
    from radixkv.errors import ConfigError

    def name(dest):
        return flag_of(dest) or dest.upper()

    for dest in FILE_ONLY_OUTPUTS:
        if getattr(args, dest, None) == STDOUT:
            printers = [flag_of(d) or d for d in STDOUT_OUTPUTS if hasattr(args, d)]
            where = f"'-' (stdout) is for {' and '.join(printers)} only" if printers else "'-' is not stdout here"
            raise ConfigError(f"{name(dest)} - would write a file named '-' in the current folder: {where}; "
                              f"give {name(dest)} a file path", field=dest)
    on_stdout = [d for d in STDOUT_OUTPUTS if getattr(args, d, None) == STDOUT]
    if len(on_stdout) > 1:
        raise ConfigError(f"{name(on_stdout[1])} - and {name(on_stdout[0])} - would both print on stdout, one "
                          f"after the other: give one of them a file path", field=on_stdout[1])
