"""Field checks shared by the trace readers.

Each helper takes the decoded JSON object of one record and the location of that record
(``path``, ``line``) and either returns the field's value in the type radixkv needs or
raises :class:`radixkv.errors.TraceFormatError` naming the file, the line (or record) and
the field. JSON booleans are rejected wherever a number is expected (Python's ``bool``
is a subclass of ``int``, so an unchecked ``true`` would silently read as 1).
"""
from __future__ import annotations

import json
import math

import numpy as np

from radixkv.errors import TraceFormatError

_MISSING = object()


class _DuplicateKey(Exception):
    """A key given twice in one JSON object (raised by :func:`_unique_keys`)."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """``object_pairs_hook`` of the record decoder: the object as a dict, refusing a key
    given twice (``json.loads`` would keep the last value without a word)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


#: the record decoder (built once: ``json.loads`` with a hook would build one per call)
_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


def parse_json_line(text: str, path, line: int):
    """Decode one JSONL line; the line must hold a JSON object, each of whose keys (at any
    depth) appears once.

    Raises
    ------
    TraceFormatError
        Invalid JSON, a value that is not an object, or a key given twice in one object
        (``field`` = that key).
    """
    try:
        obj = _DECODER.decode(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"invalid JSON: {e.msg} (column {e.colno})", path=path, line=line) from None
    except _DuplicateKey as e:
        raise TraceFormatError("the key is given twice in one record (JSON readers differ on which value "
                               "counts): give it once", path=path, line=line, field=e.key) from None
    if not isinstance(obj, dict):
        raise TraceFormatError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line)
    return obj


def get(obj: dict, key: str, path, line, *, field: str | None = None, default=_MISSING):
    """``obj[key]``, or *default*, or a 'missing field' error."""
    if key in obj:
        return obj[key]
    if default is _MISSING:
        raise TraceFormatError("missing field", path=path, line=line, field=field or key)
    return default


class EveryOrNone:
    """An optional per-record field that must be given on every record or on none.

    A field such as ``arrival_s`` or ``output_tokens`` has no value that could stand in
    for it on one record while the others give it (an arrival of 0, or no output ids, would
    silently be a different trace), so the readers accept it on all records or on none.

    Use: one instance per field and file; call :meth:`check` once per record, in file
    order; :attr:`given` then says whether the field was given (False for an empty file).

    Raises
    ------
    TraceFormatError
        From :meth:`check`, at the first record that disagrees with the first record,
        naming the file, that record's line, the field and the first record's line.
    """

    def __init__(self, field: str, path):
        self.field = field
        self.path = path
        self._first = None  # (line, present) of the first record

    def check(self, obj: dict, line) -> bool:
        """Whether *obj* (the record on *line*) gives the field; raises as above."""
        present = self.field in obj
        if self._first is None:
            self._first = (line, present)
        elif present != self._first[1]:
            said = "gives" if self._first[1] else "does not give"
            raise TraceFormatError(
                f"{self.field} must be given on every request or on none; line {self._first[0]} {said} it",
                path=self.path, line=line, field=self.field,
            )
        return present

    @property
    def given(self) -> bool:
        """True when the records give the field (all of them, by :meth:`check`)."""
        return bool(self._first and self._first[1])


def warn_unsorted(times, line_of, path, field: str, show=None) -> int:
    """Warn (:class:`radixkv.errors.InputWarning`) when the requests of a file are not in
    time order; the readers then sort them stably, as :meth:`Trace.from_requests` does.

    Parameters
    ----------
    times : np.ndarray, int64 or float64, shape (n,)
        Each request's time as the file gives it (its unit: *field*'s), in file order.
    line_of : sequence of int, length n
        The 1-based line of each request.
    path, field
        Named in the warning.
    show : callable, optional
        ``show(k)``: request ``k``'s time as the file writes it (default: the number).

    Returns
    -------
    int
        The number of requests out of order: those earlier than a request on a line before
        them (0: no warning). The warning gives that count, the first such line and the
        earlier line it should precede; same file, same message.
    """
    t = np.asarray(times)  # int64 kept as it is (Azure's 100 ns ticks exceed float64's 2^53)
    if len(t) < 2:
        return 0
    run = np.maximum.accumulate(t)
    late = t[1:] < run[:-1]
    n = int(np.count_nonzero(late))
    if n:
        import warnings

        from radixkv.errors import InputWarning

        k = int(np.flatnonzero(late)[0]) + 1
        j = int(np.argmax(t[:k]))  # the first line holding the latest time before request k
        show = show or (lambda i: _num(t[i]))
        warnings.warn(InputWarning(
            f"{n} of {len(t)} requests are out of time order (earlier than a request on a line before them); "
            f"they are sorted into time order (stable: ties keep file order). First: line {line_of[k]} "
            f"({show(k)}) comes after line {line_of[j]} ({show(j)})",
            path=path, line=line_of[k], field=field), stacklevel=3)
    return n


def _num(v) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def as_int(value, path, line, field: str, *, minimum: int | None = 0) -> int:
    """A JSON integer (not a bool, not a float) ≥ *minimum* (no bound when None)."""
    if type(value) is not int:
        raise TraceFormatError(
            f"expected an integer, got {_describe(value)}", path=path, line=line, field=field
        )
    if minimum is not None and value < minimum:
        raise TraceFormatError(f"must be ≥ {minimum}, got {value}", path=path, line=line, field=field)
    if not _INT64_MIN <= value <= _INT64_MAX:  # every integer column is int64
        raise TraceFormatError(f"{value} does not fit in a signed 64-bit integer", path=path, line=line, field=field)
    return value


#: the range of the int64 columns a trace's integers land in
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def as_float(value, path, line, field: str, *, minimum: float | None = 0.0) -> float:
    """A finite JSON number (int or float, not a bool) ≥ *minimum*."""
    if type(value) not in (int, float):
        raise TraceFormatError(f"expected a number, got {_describe(value)}", path=path, line=line, field=field)
    try:
        v = float(value)
    except OverflowError:  # an integer beyond any float
        v = math.inf
    if not math.isfinite(v):
        raise TraceFormatError(f"must be finite, got {value}", path=path, line=line, field=field)
    if minimum is not None and v < minimum:
        raise TraceFormatError(f"must be ≥ {minimum}, got {value}", path=path, line=line, field=field)
    return v


def as_str(value, path, line, field: str) -> str:
    """A JSON string."""
    if type(value) is not str:
        raise TraceFormatError(f"expected a string, got {_describe(value)}", path=path, line=line, field=field)
    return value


def as_id_array(value, path, line, field: str) -> np.ndarray:
    """A JSON list of integers ≥ 0 as an int64 array of shape (len,).

    An int64 array is returned as it is: :func:`radixkv.trace._jsonl_fast.read_records`
    has already parsed and checked it.

    The element-type check runs at C speed (``map(type, ...)``), so a 5 M-id file costs
    about 0.1 s here; no per-id Python bytecode.
    """
    if type(value) is np.ndarray:
        return value  # parsed and checked by radixkv.trace._jsonl_fast
    if type(value) is not list:
        raise TraceFormatError(f"expected a list of integers, got {_describe(value)}", path=path, line=line, field=field)
    if not value:
        return np.zeros(0, dtype=np.int64)
    types = set(map(type, value))
    if types != {int}:
        pos, bad = next((i, x) for i, x in enumerate(value) if type(x) is not int)  # error path only
        raise TraceFormatError(
            f"element {pos} is {_describe(bad)}, expected an integer", path=path, line=line, field=field
        )
    try:
        arr = np.array(value, dtype=np.int64)
    except OverflowError:
        raise TraceFormatError("an id does not fit in a signed 64-bit integer", path=path, line=line, field=field) from None
    if arr.min() < 0:
        pos = int(np.flatnonzero(arr < 0)[0])
        raise TraceFormatError(f"element {pos} is negative ({arr[pos]}); ids must be ≥ 0", path=path, line=line, field=field)
    return arr


def _describe(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, str):
        s = value if len(value) <= 20 else value[:17] + "..."
        return f"a string ({s!r})"
    return f"a {type(value).__name__}"
