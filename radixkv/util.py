"""Small helpers with no radixkv dependencies: atomic file writes, deterministic JSON, TOML."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import sys
import tempfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib  # noqa: F401  (re-exported: ``from radixkv.util import tomllib``)
else:  # pragma: no cover - Python 3.10: the ``tomli`` backport (a declared dependency there)
    import tomli as tomllib  # noqa: F401


def check_output_paths(*paths, inputs=()) -> None:
    """Refuse, before any work is done, output paths that could not be written safely.

    An output must not be an input (nor an existing file inside an input directory, such as
    a trace folder), another output of the same command, a directory or a
    special file (device, fifo), and its folder must exist, be a directory and be
    writable. A missing folder is refused, not created: a typo in an output path must not
    silently grow a tree of folders (a caller that owns a folder, such as ``radixkv
    sweep``'s results directory, creates it itself).

    Raises
    ------
    radixkv.errors.InputError
        Naming the path and why.
    """
    from radixkv.errors import InputError

    seen = {}
    ins = {Path(p).resolve() for p in inputs if p}
    in_dirs = [d for d in ins if d.is_dir()]
    for p in paths:
        if p is None:
            continue
        if str(p) == "":
            raise InputError("an output path is empty", field="output")
        path = Path(p)
        real = path.resolve()
        if real in ins or (real.is_file() and any(real.is_relative_to(d) for d in in_dirs)):
            raise InputError("the output would overwrite an input file", path=p, field="output")
        if real in seen:
            raise InputError(f"the same file is given for two outputs ({seen[real]} and this one)", path=p, field="output")
        seen[real] = str(p)
        if path.exists() and not path.is_file():
            raise InputError("exists and is not a regular file (a directory or a device): refusing to replace it",
                             path=p, field="output")
        parent = real.parent
        if not parent.exists():
            raise InputError(f"folder {path.parent} does not exist (radixkv does not create folders for "
                             f"outputs: check the path, or create the folder first)", path=p, field="output")
        if not parent.is_dir():
            raise InputError(f"{parent} is not a directory", path=p, field="output")
        if not os.access(parent, os.W_OK):
            raise InputError(f"folder {parent} is not writable", path=p, field="output")
        try:  # os.access says yes to root everywhere (/proc, read-only mounts): try it
            fd, probe = tempfile.mkstemp(dir=parent, prefix=".radixkv-probe-")
        except OSError as e:
            raise InputError(f"folder {parent} is not writable ({e.strerror})", path=p, field="output") from None
        os.close(fd)
        os.unlink(probe)


def _default_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file (0o666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_output(path, *, binary: bool = False):
    """Open a temporary file beside *path*; on success rename it onto *path*.

    The temporary file lives in the destination directory, so :func:`os.replace` is an
    atomic rename on POSIX: readers of *path* see either the old file or the complete new
    one, never a partial write. On any exception the temporary file is removed and *path*
    is left untouched. The new file gets the usual mode (0o666 less the umask), not
    ``mkstemp``'s 0o600. The folder of *path* must exist: it is not created (a mistyped
    output path must not grow a tree of folders; callers that own a folder make it).

    Yields
    ------
    file object
        Opened ``"wb"`` when *binary*, else ``"w"`` with UTF-8 and ``"\\n"`` newlines.

    Raises
    ------
    FileNotFoundError, NotADirectoryError
        The folder of *path* does not exist, or is a file (``filename`` is *path*);
        nothing is written.
    OSError
        The folder cannot be written, or writing failed (a full disk): ``filename`` is
        *path* and the message says it was not written.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        if directory.exists():
            raise NotADirectoryError(errno.ENOTDIR, f"{directory} is not a folder", str(path))
        raise FileNotFoundError(errno.ENOENT, f"folder {directory} does not exist (radixkv does not create folders "
                                              f"for outputs: check the path, or create the folder first)", str(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise OSError(e.errno, f"cannot write a file there ({e.strerror})", str(path)) from None
    try:
        os.chmod(tmp, _default_mode())
        f = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:
            # a full disk (ENOSPC), a quota (EDQUOT), an I/O error while writing: name the
            # file that was not written (write() and fsync() give no filename)
            raise OSError(e.errno, f"{e.strerror or e}; {path} was not written (any earlier file is intact)",
                          str(path)) from None
        raise


def atomic_write_bytes(path, data: bytes) -> None:
    """Write *data* to *path* atomically (see :func:`atomic_output`)."""
    with atomic_output(path, binary=True) as f:
        f.write(data)


def atomic_write_text(path, text: str) -> None:
    """Write UTF-8 *text* to *path* atomically (see :func:`atomic_output`)."""
    with atomic_output(path) as f:
        f.write(text)


def write_columns_csv(path, ids, names, columns, fmt=str) -> None:
    """Write a CSV with an ``id`` column then *names*, one row per id, atomically.

    Parameters
    ----------
    path : str or Path
    ids : sequence of str, length n
    names : list of str
        Column names, in order.
    columns : list of sequences, each of length n
        The values of each column (plain Python numbers: call ``.tolist()`` on arrays).
    fmt : callable
        Formats one value (``str`` for integers; ``repr`` for exact floats).

    Ids holding a comma, quote or newline are quoted as RFC 4180 says.
    """
    lines = ["id," + ",".join(names)]
    for i, rid in enumerate(ids):
        rid = str(rid)
        if any(ch in rid for ch in ',"\n'):
            rid = '"' + rid.replace('"', '""') + '"'
        lines.append(rid + "," + ",".join(fmt(c[i]) for c in columns))
    atomic_write_text(path, "\n".join(lines) + "\n")


def _finite(obj):
    """Replace NaN and infinities by None, recursively (JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps_json(obj) -> str:
    """Deterministic standard JSON: sorted keys, two-space indent, NaN as null, trailing newline."""
    return json.dumps(_finite(obj), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
