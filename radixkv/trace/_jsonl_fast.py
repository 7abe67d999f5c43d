"""JSONL records with their id lists parsed at C speed (Numba), for the trace readers.

A token trace is mostly digits: 4.45 M token ids take ~25 MB of JSON, and decoding them
into Python ints and then into numpy costs about 0.5 µs per id. :func:`read_records`
finds each record's id arrays (``"tokens": [...]`` and the like) in the raw bytes,
parses them straight into int64 arrays with a Numba kernel, and hands only the rest of
the line (a few short fields) to :func:`json.loads`.

The fast path is taken only where it cannot change the answer: an ASCII file without
``\\r``; per record, each id key present once, its array holding nothing but unsigned
JSON integers (no sign, fraction, exponent or leading zero; at most 18 digits) separated
by commas. Anything else — and every error — goes through the ordinary per-line path
(:func:`radixkv.trace._fields.parse_json_line` on the whole line), so the records and
the error messages (file, line, field, column) are exactly the plain reader's.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from radixkv.errors import TraceFormatError
from radixkv.trace import _fields as F

# whitespace as str.strip() sees it, restricted to ASCII (read_lines skips such lines)
_ASCII_SPACE = b" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"


@nb.njit(cache=True)
def _parse_uints(buf, a, b):
    """Parse ``buf[a:b]`` (the inside of a JSON array) as unsigned integers.

    Returns ``(ok, ids)``: ok is False (and ids empty) unless the text is a comma-separated
    list of JSON integers ≥ 0 of at most 18 digits with optional JSON whitespace.
    """
    out = np.empty((b - a + 2) // 2, dtype=np.int64)  # every id takes a digit and a comma
    bad = np.zeros(0, dtype=np.int64)
    k = 0
    i = a
    while i < b and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
        i += 1
    if i == b:
        return True, out[:0].copy()
    while True:
        s = i
        v = np.int64(0)
        while i < b:
            c = buf[i]
            if c < 48 or c > 57:
                break
            v = v * 10 + (c - 48)
            i += 1
        nd = i - s
        if nd == 0 or nd > 18 or (nd > 1 and buf[s] == 48):
            return False, bad
        out[k] = v
        k += 1
        while i < b and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
            i += 1
        if i == b:
            break
        if buf[i] != 44:
            return False, bad
        i += 1
        while i < b and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
            i += 1
    return True, out[:k].copy()


def _find_outside(seg: bytes, name: bytes, spans) -> int:
    """First index of *name* in *seg* outside the (lo, hi) *spans*; −1 when absent."""
    lo = 0
    for a, b in sorted(spans):
        at = seg.find(name, lo, a)
        if at >= 0:
            return at
        lo = b
    return seg.find(name, lo)


def _fast_line(seg: bytes, base: int, arr: np.ndarray, keys: tuple):
    """The line's JSON with its id arrays cut out, and the arrays; None when not simple."""
    spans = []
    cut = []  # (lo, hi) of the arrays found so far: no key is searched inside them
    for key in keys:
        name = b'"' + key.encode() + b'"'
        at = _find_outside(seg, name, cut)
        if at < 0:
            continue
        i = at + len(name)
        n = len(seg)
        while i < n and seg[i] in b" \t\n\r":
            i += 1
        if i >= n or seg[i] != 58:  # ':'
            return None
        i += 1
        while i < n and seg[i] in b" \t\n\r":
            i += 1
        if i >= n or seg[i] != 91:  # '['
            return None
        close = seg.find(b"]", i + 1)
        if close < 0:
            return None
        ok, ids = _parse_uints(arr, base + i + 1, base + close)
        if not ok:
            return None
        spans.append((i, close + 1, key, ids))
        cut.append((at, close + 1))
    for key in keys:
        # a repeated key (json.loads keeps the last one): the plain path decides
        if _find_outside(seg, b'"' + key.encode() + b'"', cut) >= 0 and any(k == key for _, _, k, _ in spans):
            return None
    if not spans:
        return seg.decode("ascii"), {}
    spans.sort(key=lambda s: s[0])
    parts = []
    prev = 0
    for lo, hi, _, _ in spans:
        parts.append(seg[prev:lo])
        parts.append(b"[]")
        prev = hi
    parts.append(seg[prev:])
    return b"".join(parts).decode("ascii"), {key: ids for _, _, key, ids in spans}


#: files up to this size (bytes) are read by the plain path when the kernel is not in
#: Numba's cache: compiling it (~2–3 s on 2 cores) costs more than it saves (~0.5 µs per id)
COLD_PLAIN_MAX_BYTES = 16 << 20


def _fast_path_pays(nbytes: int) -> bool:
    """Use the Numba fast path? Yes when it is compiled or cached, or the file is big
    enough to repay compiling it; ``RADIXKV_JIT=compile`` / ``interpret`` force yes / no."""
    from radixkv.numba_cache import is_cached, mode

    m = mode()
    if m != "auto":
        return m == "compile"
    return nbytes > COLD_PLAIN_MAX_BYTES or is_cached(_parse_uints, np.frombuffer(b"1", dtype=np.uint8), 0, 1)


def warmup() -> None:
    """Compile (or load from Numba's cache) the id-array kernel (``radixkv warmup``)."""
    _parse_uints(np.frombuffer(b"1", dtype=np.uint8), 0, 1)


def read_records(path, keys: tuple = ()):
    """The JSON objects of a JSONL file, with 1-based line numbers.

    Parameters
    ----------
    path : str or Path
    keys : tuple of str
        Fields holding lists of ids (integers ≥ 0). Where the fast path applies, their
        values come back as int64 numpy arrays of shape (len,) (already checked: every
        element an integer ≥ 0 that fits int64); elsewhere as the decoded JSON value,
        for the reader's own checks (:func:`radixkv.trace._fields.as_id_array` accepts both).

    Returns
    -------
    list of (line_no, dict)
        Blank lines skipped, as :func:`radixkv.trace._io.read_lines`.

    Raises
    ------
    TraceFormatError
        Unreadable file, not UTF-8, invalid JSON or a line that is not an object (naming
        file, line and column exactly as the plain path does).
    """
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", path=path) from None
    if not buf.isascii() or b"\r" in buf:
        # non-ASCII text or universal-newline subtleties: the plain path
        from radixkv.trace._io import read_lines

        return [(ln, F.parse_json_line(text, path, ln)) for ln, text in read_lines(path)]
    if keys and not _fast_path_pays(len(buf)):
        keys = ()  # every line through the plain path: the same records
    arr = np.frombuffer(buf, dtype=np.uint8)
    out = []
    start = 0
    ln = 0
    n = len(buf)
    while start <= n:
        end = buf.find(b"\n", start)
        if end < 0:
            end = n
        ln += 1
        seg = buf[start:end]
        if seg.strip(_ASCII_SPACE):
            fast = _fast_line(seg, start, arr, keys) if keys else None
            obj = None
            if fast is not None:
                text, ids = fast
                try:
                    obj = F.parse_json_line(text, path, ln)
                except TraceFormatError:
                    obj = None  # report the error on the whole line below
                if obj is not None:
                    for key, a in ids.items():
                        if obj.get(key) != []:
                            obj = None
                            break
                        obj[key] = a
            if obj is None:
                obj = F.parse_json_line(seg.decode("ascii"), path, ln)
            out.append((ln, obj))
        start = end + 1
    return out
