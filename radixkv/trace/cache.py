"""A binary cache of parsed text traces, so a trace read twice is parsed once.

:func:`radixkv.trace.load.load_trace` keeps, for each text trace file it reads, one
uncompressed ``.npz`` of the resulting :class:`~radixkv.trace.types.Trace`'s columns in a
cache folder (never next to the input, which may be read-only). An entry is used only when
its key equals the file's current one:

- the file's size, modification time (ns) and SHA-256 of its bytes — so an entry is never
  stale, even when a file is rewritten within one time-stamp tick;
- the format, the reader's options and the path as given (the trace's ``name``);
- a digest of the trace readers' sources (``radixkv/trace/*.py``) and the
  ``Trace`` field names, so a changed reader or column set starts afresh.

Entries are written atomically (temp file + rename, :func:`radixkv.util.atomic_output`),
only after a read that raised nothing and warned nothing (a warning must be seen on every
read, so such files are always parsed) and only when the file did not change while it was
read. One entry per (path, format, options): a changed file replaces its entry, so the
cache grows with the number of traces read, not with their versions. Any failure to read
or write the cache falls back to parsing; nothing the cache does can make a read fail.

Folder: ``$RADIXKV_CACHE_DIR/traces`` when set, else
``$XDG_CACHE_HOME/radixkv/traces`` (``~/.cache/radixkv/traces``).
``RADIXKV_TRACE_CACHE=off`` (or ``0``, ``no``, ``false``) turns the cache off.

Cost (docs/performance.md "Process fixed cost"): hashing the file (about 1–2 GB/s) and
loading the arrays, against the JSON parse plus the Numba reader's cache load.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np

from radixkv.trace.types import Trace

#: the cache entry's layout version (in the key)
_VERSION = 1
_META = "__radixkv_trace_cache__"


def cache_dir() -> Path | None:
    """The cache folder, or None when ``RADIXKV_TRACE_CACHE`` turns the cache off."""
    if os.environ.get("RADIXKV_TRACE_CACHE", "").strip().lower() in ("off", "0", "no", "false"):
        return None
    base = os.environ.get("RADIXKV_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "radixkv")
    return Path(base) / "traces"


def _code_key() -> str:
    """Digest of the trace readers' sources and of :class:`Trace`'s field names."""
    h = hashlib.sha256(str(_VERSION).encode())
    for f in dataclasses.fields(Trace):
        h.update(f.name.encode() + b"\0")
    for p in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _file_key(path: Path) -> dict:
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": h.hexdigest()}


def _entry(path, fmt: str, options: dict) -> tuple[Path, dict] | None:
    """(entry file, key) for reading *path* as *fmt* with *options*; None when uncacheable."""
    folder = cache_dir()
    p = Path(path)
    if folder is None or fmt == "npz" or not p.is_file():
        return None
    try:
        where = json.dumps([str(path), str(p.resolve()), fmt, options], sort_keys=True)
    except (TypeError, ValueError):  # options that are not plain values
        return None
    name = hashlib.sha256(where.encode()).hexdigest()[:24] + ".npz"
    return folder / name, {"where": where, "code": _code_key(), **_file_key(p)}


def _load(entry: Path, key: dict) -> Trace | None:
    try:
        with np.load(entry, allow_pickle=False) as z:
            meta = json.loads(bytes(z[_META]).decode())
            if meta.get("key") != key:
                return None
            kw = dict(meta["scalars"])
            for name in meta["arrays"]:
                kw[name] = z[name]
        return Trace(**kw)
    except Exception:  # noqa: BLE001 - a bad entry is a miss, never an error
        return None


def _store(entry: Path, key: dict, trace: Trace) -> None:
    from radixkv.util import atomic_output

    arrays, scalars = {}, {}
    for f in dataclasses.fields(Trace):
        if f.name.startswith("_"):
            continue
        v = getattr(trace, f.name)
        if v is None:
            continue
        if isinstance(v, np.ndarray) and v.dtype.kind in "biufU":
            arrays[f.name] = v
        elif isinstance(v, (bool, int, float, str)):
            scalars[f.name] = v
        else:
            return  # a column this cache cannot hold: never cached
    meta = json.dumps({"key": key, "scalars": scalars, "arrays": sorted(arrays)}).encode()
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(entry, binary=True) as f:
            np.savez(f, **{_META: np.frombuffer(meta, dtype=np.uint8)}, **arrays)
    except (OSError, ValueError):
        pass


def cached_read(path, fmt: str, options: dict, read) -> Trace:
    """``read()`` (which parses *path* as *fmt* with *options*), or the cached result of an
    earlier identical read of the same bytes (module docstring).

    Raises
    ------
    Whatever ``read()`` raises; the cache itself raises nothing.
    """
    try:
        found = _entry(path, fmt, options)
    except OSError:
        found = None
    if found is None:
        return read()
    entry, key = found
    trace = _load(entry, key) if entry.is_file() else None
    if trace is not None:
        return trace
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trace = read()
    for w in seen:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if not seen:
        try:
            st = Path(path).stat()
            unchanged = (st.st_size, st.st_mtime_ns) == (key["size"], key["mtime_ns"])
        except OSError:
            unchanged = False
        if unchanged:
            _store(entry, key, trace)
    return trace
