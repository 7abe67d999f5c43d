"""File helpers for readers: line iteration. (Atomic writes: :func:`radixkv.util.atomic_output`.)"""
from __future__ import annotations

from radixkv.errors import TraceFormatError


def read_lines(path):
    """The lines of a UTF-8 text file, with 1-based numbers: a list of ``(line_no, text)``.

    A leading UTF-8 byte-order mark is accepted and dropped (every reader goes through here
    or opens its file as ``utf-8-sig``).

    Blank (whitespace-only) lines are skipped. Raises :class:`TraceFormatError` when the
    file cannot be opened or is not UTF-8.
    """
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=path) from None
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", path=path) from None
    return [(i + 1, s) for i, s in enumerate(text.split("\n")) if s.strip()]
