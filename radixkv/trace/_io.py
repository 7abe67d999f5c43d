"""File helpers for readers and writers: atomic replacement and line iteration."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from radixkv.errors import TraceFormatError


@contextlib.contextmanager
def atomic_output(path, *, binary: bool = False):
    """Open a temporary file beside *path*; on success rename it onto *path*.

    The temporary file lives in the destination directory, so :func:`os.replace` is an
    atomic rename on POSIX: readers of *path* see either the old file or the complete new
    one, never a partial write. On any exception the temporary file is removed and *path*
    is left untouched.

    Yields
    ------
    file object
        Opened ``"wb"`` when *binary*, else ``"w"`` with UTF-8 and ``"\\n"`` newlines.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        if binary:
            f = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_lines(path):
    """The lines of a UTF-8 text file, with 1-based numbers: a list of ``(line_no, text)``.

    Blank (whitespace-only) lines are skipped. Raises :class:`TraceFormatError` when the
    file cannot be opened or is not UTF-8.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=path) from None
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", path=path) from None
    return [(i + 1, s) for i, s in enumerate(text.split("\n")) if s.strip()]
