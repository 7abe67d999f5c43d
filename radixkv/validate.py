"""One validation layer for the files radixkv reads besides traces: check baselines and
golden files, sweep cell and error records, result JSON given to ``radixkv report``
(check configurations and sweep grids are TOML: they use :func:`finite` and
:func:`read_text`).

Every problem is a :class:`radixkv.errors.InputError` naming the file, the line (where the
file has lines: the line of the offending key in a JSON document, the record's line in
JSON lines) and the key — the CLI's exit 2, never a traceback, never the exit 1 that CI
reads as a regression. Rules, the same for every file:

* text is UTF-8 (a leading BOM is accepted, as in traces); another encoding is refused
  naming the line of the first bad byte;
* JSON is standard JSON: Python's parser accepts ``NaN``, ``Infinity`` and
  ``-Infinity``, which no JSON writer emits and which would switch a CI gate off
  (``-Infinity`` as a baseline hit rate makes every run pass) — they are refused;
* numbers are numbers: a string or a boolean where a number belongs is refused, as is a
  non-finite float from TOML (``inf``, ``nan``).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from radixkv.errors import InputError


def read_text(path, *, field=None) -> str:
    """The UTF-8 text of *path* (a leading BOM dropped).

    Raises
    ------
    FileNotFoundError
        *path* does not exist (the caller says what the file is for).
    radixkv.errors.InputError
        Not UTF-8: names the line of the first byte that is not, and the byte.
    """
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); save the file as UTF-8",
                         path=path, line=line, field=field) from None


class _Constant(str):
    """A ``NaN`` / ``Infinity`` / ``-Infinity`` met while parsing (to find where it is)."""


def _find_constant(v, path=()):
    """The key path of the first :class:`_Constant` in a parsed document, or None."""
    if isinstance(v, _Constant):
        return path
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        found = _find_constant(x, path + (k,))
        if found is not None:
            return found
    return None


def _dotted(keys) -> str:
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def loads(text: str, *, path, line=None, field=None):
    """Parse one JSON document (or one JSON line, *line* its number); refuse ``NaN`` and
    ``±Infinity``.

    Raises
    ------
    radixkv.errors.InputError
        Invalid JSON (naming the line and column), or a non-finite constant.
    """
    try:
        doc = json.loads(text, parse_constant=_Constant)
    except json.JSONDecodeError as e:
        ln = e.lineno if line is None else line
        raise InputError(f"invalid JSON: {e.msg} (column {e.colno})", path=path, line=ln, field=field) from None
    keys = _find_constant(doc)
    if keys is None:
        return doc
    bad = doc
    for k in keys:
        bad = bad[k]
    named = [k for k in keys if not isinstance(k, int)]
    ln = line
    if ln is None:
        ln = line_of(text, *named) if named else None
        if ln is None:
            m = re.search(r"-?\b" + re.escape(bad.lstrip("-")) + r"\b", text)
            ln = text.count("\n", 0, m.start()) + 1 if m else None
    raise InputError(f"{bad} is not a JSON number (JSON has no NaN or infinity): write a finite number or null",
                     path=path, line=ln, field=_dotted(keys) or field)


def read_json(path, *, field=None):
    """``(document, text)`` of a JSON file, with :func:`read_text`'s and :func:`loads`'s rules."""
    text = read_text(path, field=field)
    return loads(text, path=path, field=field), text


def json_lines(path):
    """``(line number, object)`` for every non-blank line of a JSON-lines file."""
    text = read_text(path)
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield n, loads(line, path=path, line=n)


def line_of(text: str, *keys) -> int | None:
    """The line of a JSON document where the nested key path *keys* is, found by reading
    the quoted keys in order (the first occurrence of each after the previous one); None
    when one is not found."""
    pos, line = 0, None
    for k in keys:
        i = text.find(json.dumps(str(k), ensure_ascii=False), pos)
        if i < 0:
            j = text.find(json.dumps(str(k)), pos)
            if j < 0:
                return line
            i = j
        pos = i + 1
        line = text.count("\n", 0, i) + 1
    return line


def number(v, *, path, field, line=None, integer=False, minimum=None, maximum=None, null=False):
    """*v* checked as a finite number (a whole one when *integer*) within
    [*minimum*, *maximum*]; None passes when *null*. Returns *v*.

    Raises
    ------
    radixkv.errors.InputError
        A string, a boolean, a list, a non-finite float, a fraction where a whole number
        belongs, or a value out of range; naming *path*, *line* and *field*.
    """
    if v is None and null:
        return v
    what = "a whole number" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise InputError(f"must be {what}{' or null' if null else ''}, got {v!r}", path=path, line=line, field=field)
    if not math.isfinite(v):
        raise InputError(f"must be a finite number, got {v!r}", path=path, line=line, field=field)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        rng = f"[{minimum if minimum is not None else '-inf'}, {maximum if maximum is not None else 'inf'}]"
        raise InputError(f"out of range {rng}: {v!r}", path=path, line=line, field=field)
    return v


def finite(v) -> bool:
    """Whether *v* is an int or a finite float (and not a boolean)."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def table(v, *, path, field, line=None, what="a table (JSON object)") -> dict:
    """*v* checked as a dict; returns it."""
    if not isinstance(v, dict):
        raise InputError(f"must be {what}, got {type(v).__name__} {_short(v)}", path=path, line=line, field=field)
    return v


def _short(v) -> str:
    s = json.dumps(v, ensure_ascii=False, default=str)
    return s if len(s) <= 40 else s[:37] + "..."
