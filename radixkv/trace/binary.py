"""Binary columnar trace file (``.npz``): fast to load, exact round trip of any :class:`Trace`.

Layout: a deflate-compressed numpy ``.npz`` archive (a zip of ``.npy`` arrays, read with
``allow_pickle=False``) holding the trace's columns under their attribute names plus
scalars:

==================  ==================================================================
``radixkv_npz``     int64 scalar, format version (1)
``req_id``          unicode array (n,)
``arrival_s``       float64 (n,)
``prompt_len``      int64 (n,)
``output_len``      int64 (n,)
``ids``             int64 (total_ids,)
``id_offsets``      int64 (n+1,)
``unit_tokens``     int64 scalar
``partial_last_unit`` bool scalar
``name``            unicode scalar
``out_ids``, ``out_offsets``   present only when the trace has output ids
``session_id``      present only when the trace has the column (unicode (n,))
``turn``            present only when the trace has the column (int64 (n,))
``tenant``, ``cache_salt``, ``lora``, ``req_type``, ``parent_id``
                    present only when the trace has the column (unicode (n,))
``priority``        present only when the trace has the column (int64 (n,))
``mm_offsets``, ``mm_hash``, ``mm_start``, ``mm_length``
                    multimodal items, present only when the trace has them (int64 (n+1,),
                    unicode (m,), int64 (m,), int64 (m,))
==================  ==================================================================

``ids`` / ``out_ids`` hold the file's ids (``Trace.file_ids``); the cache key ids are
computed again on reading (:mod:`radixkv.trace.cache_keys`).

Absent keys encode ``None``, so ``read_npz(write_npz(t))`` equals ``t`` in every column,
including which optional columns are None, ``unit_tokens``, ``partial_last_unit`` and
``name``.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from radixkv.errors import InputError, TraceFormatError
from radixkv.util import atomic_output
from radixkv.trace.types import Trace

NPZ_VERSION = 1
_REQUIRED = ("radixkv_npz", "req_id", "arrival_s", "prompt_len", "output_len", "ids", "id_offsets",
             "unit_tokens", "partial_last_unit", "name")
_INT_COLS = ("prompt_len", "output_len", "ids", "id_offsets", "out_ids", "out_offsets", "turn", "priority",
             "mm_offsets", "mm_start", "mm_length")
_STR_COLS = ("session_id", "tenant", "cache_salt", "lora", "req_type", "parent_id", "mm_hash")
_MM_COLS = ("mm_offsets", "mm_hash", "mm_start", "mm_length")


def write_npz(trace: Trace, path) -> None:
    """Write *trace* to *path* (``.npz``), atomically (temp file + ``os.replace``).

    Deterministic: the zip entries carry a fixed timestamp, so the same trace gives the
    same bytes.

    Raises
    ------
    radixkv.errors.InputError
        When *trace* fails :meth:`Trace.validate`; nothing is written.
    """
    trace.validate()
    cols = {
        "radixkv_npz": np.int64(NPZ_VERSION),
        "req_id": np.asarray(trace.req_id, dtype=str),
        "arrival_s": np.asarray(trace.arrival_s, dtype=np.float64),
        "prompt_len": np.asarray(trace.prompt_len, dtype=np.int64),
        "output_len": np.asarray(trace.output_len, dtype=np.int64),
        "ids": np.asarray(trace.file_ids, dtype=np.int64),
        "id_offsets": np.asarray(trace.id_offsets, dtype=np.int64),
        "unit_tokens": np.int64(trace.unit_tokens),
        "partial_last_unit": np.bool_(trace.partial_last_unit),
        "name": np.str_(trace.name),
    }
    if trace.out_ids is not None:
        cols["out_ids"] = np.asarray(trace.file_out_ids, dtype=np.int64)
        cols["out_offsets"] = np.asarray(trace.out_offsets, dtype=np.int64)
    if trace.session_id is not None:
        cols["session_id"] = np.asarray(trace.session_id, dtype=str)
    if trace.turn is not None:
        cols["turn"] = np.asarray(trace.turn, dtype=np.int64)
    for key in _STR_COLS[1:]:
        if getattr(trace, key) is not None:
            cols[key] = np.asarray(getattr(trace, key), dtype=str)
    for key in ("priority", "mm_offsets", "mm_start", "mm_length"):
        if getattr(trace, key) is not None:
            cols[key] = np.asarray(getattr(trace, key), dtype=np.int64)
    with atomic_output(path, binary=True) as f:
        # Written entry by entry with a fixed date_time so the bytes are reproducible
        # (np.savez stamps the current time into the zip headers).
        with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_DEFLATED) as zf:
            for key in sorted(cols):
                info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                with zf.open(info, "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, np.asanyarray(cols[key]), allow_pickle=False)


def read_npz(path) -> Trace:
    """Read a trace written by :func:`write_npz`.

    Raises
    ------
    radixkv.errors.TraceFormatError
        Not a radixkv ``.npz`` file, an unknown version, a missing or mistyped column
        (``field`` names it), or columns that disagree (:meth:`Trace.validate`).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", path=path) from None
    if magic[:4] != b"PK\x03\x04":  # np.load would call a text file "pickled (object) data"
        what = "a single .npy array" if magic == b"\x93NUMPY" else "no zip header"
        raise TraceFormatError(f"not a .npz archive ({what}); a radixkv .npz is written by "
                               f"`radixkv trace convert IN OUT.npz`", path=path)
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise TraceFormatError(f"not a readable .npz file ({e})", path=path) from None
    if not hasattr(z, "files"):
        raise TraceFormatError("not an .npz archive (a single .npy array?)", path=path)
    with z:
        keys = set(z.files)
        for key in _REQUIRED:
            if key not in keys:
                raise TraceFormatError("missing column: not a radixkv trace archive" if key == "radixkv_npz"
                                       else "missing column", path=path, field=key)
        try:
            cols = {k: z[k] for k in keys}
        except ValueError as e:
            raise TraceFormatError(f"unreadable column ({e})", path=path) from None
    version = cols["radixkv_npz"]
    if version.shape != () or int(version) != NPZ_VERSION:
        raise TraceFormatError(f"unsupported version {version!r}", path=path, field="radixkv_npz")
    for key in _INT_COLS:
        if key in cols and cols[key].dtype != np.int64:
            raise TraceFormatError(f"expected int64, got {cols[key].dtype}", path=path, field=key)
    if cols["arrival_s"].dtype != np.float64:
        raise TraceFormatError(f"expected float64, got {cols['arrival_s'].dtype}", path=path, field="arrival_s")
    for key in ("req_id", "name") + _STR_COLS:
        if key in cols and cols[key].dtype.kind != "U":
            raise TraceFormatError(f"expected a unicode array, got {cols[key].dtype}", path=path, field=key)
    have_mm = [k in cols for k in _MM_COLS]
    if any(have_mm) and not all(have_mm):
        raise TraceFormatError("the multimodal columns must all be present or all absent", path=path,
                               field=_MM_COLS[have_mm.index(False)])
    if ("out_ids" in cols) != ("out_offsets" in cols):
        raise TraceFormatError("out_ids and out_offsets must both be present or both absent", path=path,
                               field="out_offsets" if "out_ids" in cols else "out_ids")
    t = Trace(
        req_id=cols["req_id"],
        arrival_s=cols["arrival_s"],
        prompt_len=cols["prompt_len"],
        output_len=cols["output_len"],
        ids=cols["ids"],
        id_offsets=cols["id_offsets"],
        unit_tokens=int(cols["unit_tokens"]),
        partial_last_unit=bool(cols["partial_last_unit"]),
        out_ids=cols.get("out_ids"),
        out_offsets=cols.get("out_offsets"),
        session_id=cols.get("session_id"),
        turn=cols.get("turn"),
        name=str(cols["name"]),
        **{k: cols[k] for k in _INT_COLS[7:] + _STR_COLS[1:] if k in cols},
    )
    try:
        _check_offsets(t)
        t.validate()
        from radixkv.trace.consistency import check_unit_covers

        check_unit_covers(t)
        t.apply_cache_keys()
    except InputError as e:
        raise TraceFormatError(e.reason, path=path, field=e.field) from None
    except (ValueError, IndexError, TypeError) as e:  # columns of impossible shapes
        raise TraceFormatError(f"inconsistent columns ({e})", path=path) from None
    return t


def _check_offsets(t: Trace) -> None:
    for ids, off, field in ((t.ids, t.id_offsets, "id_offsets"), (t.out_ids, t.out_offsets, "out_offsets")):
        if off is None:
            continue
        if off.ndim != 1 or off.size == 0 or off[0] != 0 or off[-1] != len(ids) or np.any(np.diff(off) < 0):
            raise TraceFormatError("offsets must start at 0, be non-decreasing and end at the id count", field=field)
    if t.session_id is not None and len(t.session_id) != len(t.prompt_len):
        raise TraceFormatError("wrong number of rows", field="session_id")
    for key in ("turn", "priority") + _STR_COLS[:-1]:
        if getattr(t, key) is not None and len(getattr(t, key)) != len(t.prompt_len):
            raise TraceFormatError("wrong number of rows", field=key)
    if t.mm_offsets is not None and (t.mm_offsets.ndim != 1 or len(t.mm_offsets) != len(t.prompt_len) + 1):
        raise TraceFormatError("wrong number of rows (n + 1 expected)", field="mm_offsets")
