"""radixkv's native JSONL trace format: reader and writer.

Format
------
One JSON object per line (UTF-8; blank lines are ignored). An optional **header** may be
the first line::

    {"radixkv_trace": 1, "unit_tokens": U, "partial_last_unit": true|false}

``unit_tokens`` (int ≥ 1) is the number of tokens one id stands for;
``partial_last_unit`` (default false) says how a prompt of ``P`` tokens maps to ids when
``U > 1``: ``true`` → ``ceil(P/U)`` ids, the last covering the leftover tokens (as
Mooncake); ``false`` → ``floor(P/U)`` ids and a ``P mod U``-token unique tail (as WEKA).
Without a header, ``U = 1`` (token ids).

Every other line is one request, with exactly these fields (any other key is an error,
so a misspelt field is never silently ignored):

========================  ===============================================================
``id``                    str; default: the request's 0-based index among the request
                          lines (the header is not counted), as a string
``tokens``                list of int ≥ 0: the prompt's token ids (only when ``U = 1``)
``hash_ids``              list of int ≥ 0: the prompt's unit ids, given with
``input_length``          int ≥ 1: the prompt length in tokens; ``len(hash_ids)`` must
                          match ``U`` and ``partial_last_unit`` as above
``output_length``         int ≥ 0: output tokens
``output_tokens``         list of int ≥ 0: output token ids (``U = 1`` only); real content a
                          later prompt may contain. With ``output_length`` both must agree.
                          Either every request gives it or none does.
``arrival_s``             number ≥ 0, seconds from the trace start. Either every request
                          gives it or none does (then every request arrives at 0).
``session_id``            str (column filled with ``''`` where absent)
``turn``                  int ≥ −1 (−1 = unknown; column filled with −1 where absent)
``tenant``                str: who sent the request (a report attribute, ``--by tenant``)
``cache_salt``            str: the request's cache salt (vLLM ``cache_salt``, SGLang
                          ``extra_key``); requests with different salts share no KV
``lora``                  str: the LoRA adapter ('' = base model); a cache key too
``priority``              int: scheduling priority (vLLM's; lower = first)
``type``                  str: request type (e.g. Qwen-Bailian's text / search / image / file)
``parent_id``             str: id of the request this one continues ('' for a root)
``mm``                    list of ``{"hash": str, "offset": int ≥ 0, "length": int ≥ 1}``:
                          multimodal items (content hash, placeholder span in tokens), in
                          prompt order, not overlapping, inside the prompt
========================  ===============================================================

The string columns are filled with ``''`` (``priority`` with 0, ``mm`` with no item) on
requests that do not give them. Salts, adapters and items change the cache keys
(:mod:`radixkv.trace.cache_keys`); a content hash must name one item length (and, in a
token trace, one run of placeholder tokens) across the file.

A request gives ``tokens`` **or** ``hash_ids`` + ``input_length``, and ``output_length``
and/or ``output_tokens``. Requests are sorted stably by ``arrival_s`` (ties keep file
order), which is replay order.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from radixkv.errors import TraceFormatError
from radixkv.trace import _fields as F
from radixkv.trace._jsonl_fast import read_records
from radixkv.util import atomic_output
from radixkv.trace.types import Trace

#: value of the header's ``radixkv_trace`` key understood by this reader
NATIVE_VERSION = 1

_HEADER_KEYS = {"radixkv_trace", "unit_tokens", "partial_last_unit"}
_REQUEST_KEYS = {"id", "tokens", "hash_ids", "input_length", "output_length", "output_tokens",
                 "arrival_s", "session_id", "turn", "tenant", "cache_salt", "lora", "priority", "type",
                 "parent_id", "mm"}
#: optional string fields → Trace column
_STR_FIELDS = {"tenant": "tenant", "cache_salt": "cache_salt", "lora": "lora", "type": "req_type",
               "parent_id": "parent_id"}
_MM_KEYS = ("hash", "offset", "length")


def _read_header(obj: dict, path, line: int) -> tuple[int, bool]:
    extra = sorted(set(obj) - _HEADER_KEYS)
    if extra:
        raise TraceFormatError("unknown header field", path=path, line=line, field=extra[0])
    version = obj["radixkv_trace"]
    if type(version) is not int or version != NATIVE_VERSION:
        raise TraceFormatError(
            f"unsupported native trace version {version!r} (this reader knows {NATIVE_VERSION})",
            path=path, line=line, field="radixkv_trace",
        )
    U = F.as_int(F.get(obj, "unit_tokens", path, line), path, line, "unit_tokens", minimum=1)
    partial = obj.get("partial_last_unit", False)
    if type(partial) is not bool:
        raise TraceFormatError(f"expected true or false, got {partial!r}", path=path, line=line, field="partial_last_unit")
    return U, partial


def read_native(path) -> Trace:
    """Read a native JSONL trace (format in the module docstring).

    Parameters
    ----------
    path : str or Path
        The ``.jsonl`` file.

    Returns
    -------
    Trace
        In replay order (stable sort by ``arrival_s``); ``name`` is ``str(path)``. A file
        whose ``arrival_s`` are not in line order gets an :class:`~radixkv.errors.InputWarning`
        (count and first line out of order; :func:`radixkv.trace._fields.warn_unsorted`).

    Raises
    ------
    radixkv.errors.TraceFormatError
        Naming the file, the 1-based line and the field: invalid JSON, a bad header, an
        unknown or missing field, a negative / non-integer / boolean length or id, an
        id count that does not match ``input_length`` at the header's granularity, an
        empty prompt, a file with a header and no request, ``output_tokens`` disagreeing with ``output_length``, or
        ``output_tokens`` or ``arrival_s`` given on some lines only, a request id used twice, or a unit id that
        covers two different lengths (:mod:`radixkv.trace.consistency`). Nothing is returned on error.
    """
    path = Path(path)
    lines = read_records(path, ("tokens", "hash_ids", "output_tokens"))
    U, partial = 1, False
    start = 0
    if lines:
        ln, first = lines[0]
        if "radixkv_trace" in first:
            U, partial = _read_header(first, path, ln)
            start = 1
    if U == 1:
        partial = False

    n = len(lines) - start
    if n == 0:
        what = f"it holds only the header (line {lines[0][0]})" if start else "it holds only blank lines"
        raise TraceFormatError(f"no requests in the file: {what}; a trace needs at least one request", path=path)
    req_id = [None] * n
    arrival = np.zeros(n, dtype=np.float64)
    plen = np.zeros(n, dtype=np.int64)
    olen = np.zeros(n, dtype=np.int64)
    pids = [None] * n
    oids = [None] * n
    sess = [""] * n
    turn = np.full(n, -1, dtype=np.int64)
    has_sess = has_turn = False
    attrs: dict = {}  # optional columns given by at least one request
    # optional fields that every request gives or none does (no stand-in value is right)
    out_rule = F.EveryOrNone("output_tokens", path)
    arrival_rule = F.EveryOrNone("arrival_s", path)
    for k in range(n):
        ln, obj = lines[start + k]
        extra = [key for key in obj if key not in _REQUEST_KEYS]
        if extra:
            hint = " (a header is only allowed on the first line)" if extra[0] == "radixkv_trace" else ""
            raise TraceFormatError("unknown field" + hint, path=path, line=ln, field=extra[0])
        rid = obj.get("id", _DEFAULT)
        req_id[k] = str(k) if rid is _DEFAULT else F.as_str(rid, path, ln, "id")
        # prompt
        if "tokens" in obj:
            if "hash_ids" in obj or "input_length" in obj:
                field = "hash_ids" if "hash_ids" in obj else "input_length"
                raise TraceFormatError("give either 'tokens' or 'hash_ids' + 'input_length', not both",
                                       path=path, line=ln, field=field)
            if U != 1:
                raise TraceFormatError(f"'tokens' needs unit_tokens = 1 (the header says {U}); use hash_ids",
                                       path=path, line=ln, field="tokens")
            ids = F.as_id_array(obj["tokens"], path, ln, "tokens")
            P = len(ids)
        elif "hash_ids" in obj:
            ids = F.as_id_array(obj["hash_ids"], path, ln, "hash_ids")
            P = F.as_int(F.get(obj, "input_length", path, ln), path, ln, "input_length", minimum=0)
            expect = P if U == 1 else (-(-P // U) if partial else P // U)
            if len(ids) != expect:
                rule = "input_length" if U == 1 else (
                    f"ceil(input_length/{U})" if partial else f"floor(input_length/{U})")
                raise TraceFormatError(
                    f"{len(ids)} hash_ids for input_length {P}; expected {rule} = {expect}",
                    path=path, line=ln, field="hash_ids",
                )
        elif "input_length" in obj:
            raise TraceFormatError("missing field (input_length is given without hash_ids)",
                                   path=path, line=ln, field="hash_ids")
        else:
            raise TraceFormatError("missing field: a request needs 'tokens' or 'hash_ids' + 'input_length'",
                                   path=path, line=ln, field="tokens")
        if P < 1:
            field = "tokens" if "tokens" in obj else "input_length"
            raise TraceFormatError("empty prompt (a request needs at least one prompt token)",
                                   path=path, line=ln, field=field)
        pids[k] = ids
        plen[k] = P
        # output
        if out_rule.check(obj, ln):
            if U != 1:
                raise TraceFormatError(f"output_tokens needs unit_tokens = 1 (the header says {U})",
                                       path=path, line=ln, field="output_tokens")
            o = F.as_id_array(obj["output_tokens"], path, ln, "output_tokens")
            oids[k] = o
            N = len(o)
            if "output_length" in obj:
                given = F.as_int(obj["output_length"], path, ln, "output_length")
                if given != N:
                    raise TraceFormatError(f"output_length {given} disagrees with {N} output_tokens",
                                           path=path, line=ln, field="output_length")
        else:
            N = F.as_int(F.get(obj, "output_length", path, ln), path, ln, "output_length")
        olen[k] = N
        if arrival_rule.check(obj, ln):
            arrival[k] = F.as_float(obj["arrival_s"], path, ln, "arrival_s")
        if "session_id" in obj:
            sess[k] = F.as_str(obj["session_id"], path, ln, "session_id")
            has_sess = True
        if "turn" in obj:
            turn[k] = F.as_int(obj["turn"], path, ln, "turn", minimum=-1)
            has_turn = True
        for key, col in _STR_FIELDS.items():
            if key in obj:
                attrs.setdefault(col, [""] * n)[k] = F.as_str(obj[key], path, ln, key)
        if "priority" in obj:
            attrs.setdefault("priority", [0] * n)[k] = F.as_int(obj["priority"], path, ln, "priority", minimum=None)
        if "mm" in obj:
            attrs.setdefault("mm", [None] * n)[k] = _read_mm(obj["mm"], P, path, ln)

    line_of = [ln for ln, _ in lines[start:]]
    seen: dict = {}
    for k, rid in enumerate(req_id):
        if rid in seen:
            raise TraceFormatError(f"request id {rid!r} repeats the id of line {line_of[seen[rid]]}: "
                                   f"request ids must be unique", path=path, line=line_of[k], field="id")
        seen[rid] = k
    if arrival_rule.given:
        F.warn_unsorted(arrival, line_of, path, "arrival_s")
    if partial:
        from radixkv.trace.mooncake import _check_covers

        _check_covers(pids, plen, U, line_of, path, "hash_ids")
    if "mm" in attrs:
        _check_mm_hashes(attrs["mm"], pids, U, line_of, path)
    has_out = out_rule.given
    return Trace.from_requests(
        req_id=req_id,
        arrival_s=arrival,
        prompt_len=plen,
        output_len=olen,
        prompt_ids=pids,
        unit_tokens=U,
        partial_last_unit=partial,
        output_ids=oids if has_out else None,
        session_id=sess if has_sess else None,
        turn=turn if has_turn else None,
        name=str(path),
        **attrs,
    )


_DEFAULT = object()


def _read_mm(value, P: int, path, ln) -> list:
    """The ``mm`` field of one request: ``[(hash, offset, length), ...]``, checked (located
    errors: the field is ``mm[q].key``)."""
    if type(value) is not list:
        raise TraceFormatError("expected a list of {\"hash\", \"offset\", \"length\"} objects",
                               path=path, line=ln, field="mm")
    items = []
    end = 0
    for q, it in enumerate(value):
        where = f"mm[{q}]"
        if type(it) is not dict:
            raise TraceFormatError("expected an object with hash, offset, length", path=path, line=ln, field=where)
        extra = [key for key in it if key not in _MM_KEYS]
        if extra:
            raise TraceFormatError("unknown field", path=path, line=ln, field=f"{where}.{extra[0]}")
        h = F.as_str(F.get(it, "hash", path, ln, field=f"{where}.hash"), path, ln, f"{where}.hash")
        if not h:
            raise TraceFormatError("empty content hash", path=path, line=ln, field=f"{where}.hash")
        a = F.as_int(F.get(it, "offset", path, ln, field=f"{where}.offset"), path, ln, f"{where}.offset")
        b = F.as_int(F.get(it, "length", path, ln, field=f"{where}.length"), path, ln, f"{where}.length", minimum=1)
        if a < end:
            raise TraceFormatError(f"starts at {a}, inside or before the previous item (which ends at {end}): items "
                                   f"must be in prompt order and must not overlap", path=path, line=ln,
                                   field=f"{where}.offset")
        if a + b > P:
            raise TraceFormatError(f"ends at {a + b}, past the {P}-token prompt", path=path, line=ln,
                                   field=f"{where}.length")
        end = a + b
        items.append((h, a, b))
    return items


def _check_mm_hashes(mm, pids, U, line_of, path) -> None:
    """Raise a located error for the first item whose content hash names another length
    (or other placeholder tokens) than on the line where the hash first appeared."""
    from radixkv.trace.cache_keys import first_mm_conflict

    items = [x or [] for x in mm]
    off = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in items], out=off[1:])
    flat = [it for x in items for it in x]
    lens = np.fromiter((len(p) for p in pids), dtype=np.int64, count=len(pids))
    id_off = np.zeros(len(pids) + 1, dtype=np.int64)
    np.cumsum(lens, out=id_off[1:])
    ids = np.concatenate([np.asarray(p, dtype=np.int64) for p in pids]) if len(pids) else np.zeros(0, np.int64)
    bad = first_mm_conflict(off, np.asarray([h for h, _, _ in flat], dtype=str),
                            np.asarray([a for _, a, _ in flat], dtype=np.int64),
                            np.asarray([b for _, _, b in flat], dtype=np.int64), ids, id_off, U)
    if bad is not None:
        k, q, kf, why = bad
        raise TraceFormatError(f"content hash {items[k][q][0]!r} {why} on line {line_of[kf]}: one content hash "
                               f"must name one item", path=path, line=line_of[k], field=f"mm[{q}].hash")


def write_native(trace: Trace, path) -> None:
    """Write *trace* as native JSONL, atomically (temp file in the same folder + ``os.replace``).

    The header line is always written. Each request line carries ``id``, ``tokens``
    (``U = 1``) or ``hash_ids`` + ``input_length`` (``U > 1``), ``output_tokens`` when the
    trace has output ids else ``output_length``, ``arrival_s`` (written with Python's
    shortest round-tripping float repr), and ``session_id`` / ``turn`` and the other optional
    columns (``tenant``, ``cache_salt``, ``lora``, ``priority``, ``type``, ``parent_id``,
    ``mm``) when the trace has them (even where they hold ``''`` / −1 / 0 / no item, so their
    presence round-trips). Ids are the file's (``Trace.file_ids``), never the cache key ids.
    ``read_native(path)`` returns a trace equal to *trace* in every column (``name``
    becomes the path). Output is deterministic: same trace, same bytes.

    Raises
    ------
    radixkv.errors.InputError
        When *trace* fails :meth:`Trace.validate`; nothing is written.
    """
    trace.validate()
    U = int(trace.unit_tokens)
    header = {"radixkv_trace": NATIVE_VERSION, "unit_tokens": U,
              "partial_last_unit": bool(trace.partial_last_unit) if U > 1 else False}
    ids = trace.file_ids.tolist()
    off = trace.id_offsets.tolist()
    oids = None if trace.out_ids is None else trace.file_out_ids.tolist()
    ooff = None if trace.out_offsets is None else trace.out_offsets.tolist()
    dumps = json.dumps
    with atomic_output(path) as f:
        f.write(dumps(header) + "\n")
        for i in range(len(trace)):
            rec = {"id": str(trace.req_id[i])}
            if U == 1:
                rec["tokens"] = ids[off[i]:off[i + 1]]
            else:
                rec["hash_ids"] = ids[off[i]:off[i + 1]]
                rec["input_length"] = int(trace.prompt_len[i])
            if oids is not None:
                rec["output_tokens"] = oids[ooff[i]:ooff[i + 1]]
            else:
                rec["output_length"] = int(trace.output_len[i])
            rec["arrival_s"] = float(trace.arrival_s[i])
            if trace.session_id is not None:
                rec["session_id"] = str(trace.session_id[i])
            if trace.turn is not None:
                rec["turn"] = int(trace.turn[i])
            for key, col in _STR_FIELDS.items():
                c = getattr(trace, col)
                if c is not None:
                    rec[key] = str(c[i])
            if trace.priority is not None:
                rec["priority"] = int(trace.priority[i])
            if trace.mm_offsets is not None:
                rec["mm"] = [{"hash": str(trace.mm_hash[j]), "offset": int(trace.mm_start[j]),
                              "length": int(trace.mm_length[j])}
                             for j in range(int(trace.mm_offsets[i]), int(trace.mm_offsets[i + 1]))]
            f.write(dumps(rec, separators=(",", ":")) + "\n")
