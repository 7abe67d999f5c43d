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
========================  ===============================================================

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
                 "arrival_s", "session_id", "turn"}


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
        empty prompt, ``output_tokens`` disagreeing with ``output_length``, or
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
    req_id = [None] * n
    arrival = np.zeros(n, dtype=np.float64)
    plen = np.zeros(n, dtype=np.int64)
    olen = np.zeros(n, dtype=np.int64)
    pids = [None] * n
    oids = [None] * n
    sess = [""] * n
    turn = np.full(n, -1, dtype=np.int64)
    has_sess = has_turn = False
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
    )


_DEFAULT = object()


def write_native(trace: Trace, path) -> None:
    """Write *trace* as native JSONL, atomically (temp file in the same folder + ``os.replace``).

    The header line is always written. Each request line carries ``id``, ``tokens``
    (``U = 1``) or ``hash_ids`` + ``input_length`` (``U > 1``), ``output_tokens`` when the
    trace has output ids else ``output_length``, ``arrival_s`` (written with Python's
    shortest round-tripping float repr), and ``session_id`` / ``turn`` when the trace has
    those columns (even where they hold ``''`` / −1, so their presence round-trips).
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
    ids = trace.ids.tolist()
    off = trace.id_offsets.tolist()
    oids = None if trace.out_ids is None else trace.out_ids.tolist()
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
            f.write(dumps(rec, separators=(",", ":")) + "\n")
