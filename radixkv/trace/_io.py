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
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", path=path) from None
    text = decode_utf8(raw, path)
    return [(i + 1, s) for i, s in enumerate(text.split("\n")) if s.strip()]


def decode_utf8(raw: bytes, path) -> str:
    """*raw* decoded as UTF-8 (a leading byte-order mark dropped).

    Raises :class:`TraceFormatError` naming the file, the 1-based line and the byte offset
    (in the file) of the first byte that is not UTF-8."""
    bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
    try:
        return raw[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = bom + e.start
        raise TraceFormatError(f"not UTF-8 text ({e.reason} at byte {at} of the file)", path=path,
                               line=raw.count(b"\n", 0, at) + 1) from None
