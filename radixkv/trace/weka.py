"""Reader for kv-cache-tester / WEKA agentic-coding conversation traces.

Source of the format: ``callanjfox/kv-cache-tester`` ``traces/trace_NNNN.json`` (the
"v8" Claude Code set; see ``shared/traces/weka-claude-code/SOURCE.md``). Each file is one
JSON object for one conversation::

    {"id": "trace_0001", "block_size": 64, "hash_id_scope": "local", ...,
     "requests": [{"t": 0.0, "type": "n"|"s", "in": 71175, "out": 169,
                   "hash_ids": [1, 2, ...], ...},
                  {"t": 134.227, "type": "subagent", "agent_id": "agent_001",
                   "duration_ms": 126015, "requests": [...]}, ...]}

Granularity
-----------
``unit_tokens = block_size`` (64 in every public file) and ``partial_last_unit=False``:
``hash_ids`` has one id per *full* block, ``len == floor(in / block_size)``, and the
``in mod block_size`` trailing tokens are unique content. Outputs are unique (only the
``out`` lengths are known).

Id namespaces
-------------
``hash_id_scope: "local"``: ids are numbered per file, so id 7 of one file has nothing
to do with id 7 of another. Each file's ids (parent and sub-agent requests together,
which share one namespace) are renumbered densely in ascending order of the original id
(``np.unique``), offset by the number of distinct ids of the files before it in sorted
file-name order. Equality inside a file is preserved exactly, files never collide, and
the numbering is deterministic.

Sub-agent timing (evidence)
---------------------------
A ``type: "subagent"`` marker holds its own ``requests`` whose ``t`` is relative to the
sub-agent's start. This reader takes the marker's ``t`` as the sub-agent's **end** and
places its start at ``t − duration_ms/1000``; an inner request arrives at
``start + inner t``. Evidence from the 11 markers of the public subset:

* trace_0003, marker 1: ``t = 134.227``, ``duration_ms = 126015`` → start 8.212 s. The
  parent request before it is at 0.0 with ``api_time`` 7.27 (ends 7.27 s); the next parent
  request is at 153.0. The inner requests run 0 … 88 s (the last ends at 122.3 s < 126.0).
  Read as a start, the marker would put the sub-agent at 134 … 256 s, overlapping the
  parent's next call although Claude Code's parent waits for its Task tool result.
* In all 11 markers ``t − duration_ms/1000`` falls 0.0–1.0 s after the end (``t +
  api_time``) of the preceding parent request, and sub-agents launched together (three
  in trace_0010, two in trace_0004) get the same start (447.56 s; 440,149.29 s) although
  their markers' ``t`` differ — as expected when ``t`` is each one's completion time.
* The upstream replay tool (``trace_replay_tester.py``) in its live mode spawns a
  sub-agent when the parent reaches the marker (after the preceding parent request) and
  holds the parent's next request until every pending sub-agent has finished — the same
  ordering. (Its offline helper ``flatten_requests`` instead adds the marker's ``t`` as a
  start offset; the data above contradict that reading.)

When a marker lacks ``duration_ms``, the sub-agent is placed so that its last inner
request's ``t + api_time`` (``api_time`` 0 if absent) coincides with the marker's ``t``.
Nested markers inside a sub-agent follow the same rule relative to the sub-agent.

Several files
-------------
A directory of such files (``*.json``, sorted by file name) is **one** trace. Each file's
``t`` is relative to its own conversation start and the files carry no wall clock, so
conversation k (0-based, sorted order) starts at ``k * conversation_spacing_s``; the
default 0 starts every conversation at time 0, as the upstream tool's concurrent replay
starts its users together. Replay order is a stable sort by arrival time (ties: file order,
then position in the file with sub-agent requests at their marker's place).

Request ids are ``r0, r1, …`` in **replay order** (golden/README.md); ``session_id`` is the
file's ``id`` (a sub-agent's requests: ``<file id>/<agent_id>``); ``turn`` is the
request's 0-based position within its session in file order.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from radixkv.errors import TraceFormatError
from radixkv.trace import _fields as F
from radixkv.trace.types import Trace


def _load_json(path: Path) -> dict:
    from radixkv.trace._io import decode_utf8

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", path=path) from None
    try:
        doc = json.loads(decode_utf8(raw, path))
    except json.JSONDecodeError as e:
        hint = ("; a kv-cache-tester conversation is one JSON document, and this one goes on after it ends "
                "(JSON Lines? then not --format weka)") if e.msg == "Extra data" else ""
        raise TraceFormatError(f"invalid JSON: {e.msg} (column {e.colno}){hint}", path=path, line=e.lineno) from None
    if not isinstance(doc, dict):
        raise TraceFormatError(f"expected a JSON object at the top level, got {type(doc).__name__}", path=path, line=1)
    return doc


class _FileRows:
    """Requests of one file in file order (sub-agent requests at their marker's place)."""

    def __init__(self):
        self.t, self.plen, self.olen, self.ids, self.sess, self.turn = [], [], [], [], [], []


def _flatten(reqs, base_t: float, bs: int, session: str, path, record, prefix: str, rows: _FileRows, counters: dict):
    if type(reqs) is not list:
        raise TraceFormatError("expected a list of requests", path=path, line=record, field=prefix.rstrip(".") or "requests")
    for j, r in enumerate(reqs):
        rec = j + 1 if record is None else record  # top level: each request is its own record
        where = f"{prefix}requests[{j}]"
        if not isinstance(r, dict):
            raise TraceFormatError("expected a request object", path=path, line=rec, field=where)
        typ = F.as_str(F.get(r, "type", path, rec, field=f"{where}.type"), path, rec, f"{where}.type")
        t = F.as_float(F.get(r, "t", path, rec, field=f"{where}.t"), path, rec, f"{where}.t")
        if typ == "subagent":
            agent = F.as_str(F.get(r, "agent_id", path, rec, field=f"{where}.agent_id"), path, rec, f"{where}.agent_id")
            inner = F.get(r, "requests", path, rec, field=f"{where}.requests")
            if "duration_ms" in r:
                dur = F.as_float(r["duration_ms"], path, rec, f"{where}.duration_ms") / 1000.0
            else:
                dur = 0.0
                if isinstance(inner, list) and inner and isinstance(inner[-1], dict):
                    last = inner[-1]
                    dur = F.as_float(F.get(last, "t", path, rec, field=f"{where}.requests[{len(inner) - 1}].t"),
                                     path, rec, f"{where}.requests[{len(inner) - 1}].t")
                    if "api_time" in last:
                        dur += F.as_float(last["api_time"], path, rec, f"{where}.requests[{len(inner) - 1}].api_time")
            _flatten(inner, base_t + t - dur, bs, f"{session}/{agent}", path, rec, f"{where}.", rows, counters)
            continue
        if typ not in ("n", "s"):
            raise TraceFormatError(f"unknown request type {typ!r} (expected 'n', 's' or 'subagent')",
                                   path=path, line=rec, field=f"{where}.type")
        P = F.as_int(F.get(r, "in", path, rec, field=f"{where}.in"), path, rec, f"{where}.in")
        if P < 1:
            raise TraceFormatError("empty prompt ('in' must be ≥ 1)", path=path, line=rec, field=f"{where}.in")
        N = F.as_int(F.get(r, "out", path, rec, field=f"{where}.out"), path, rec, f"{where}.out")
        ids = F.as_id_array(F.get(r, "hash_ids", path, rec, field=f"{where}.hash_ids"), path, rec, f"{where}.hash_ids")
        if len(ids) != P // bs:
            raise TraceFormatError(
                f"{len(ids)} hash_ids for in = {P}; expected floor({P}/{bs}) = {P // bs}",
                path=path, line=rec, field=f"{where}.hash_ids",
            )
        abs_t = base_t + t
        if abs_t < 0:
            raise TraceFormatError(f"the request would arrive before its conversation starts ({abs_t:.3f} s)",
                                   path=path, line=rec, field=f"{where}.t")
        rows.t.append(abs_t)
        rows.plen.append(P)
        rows.olen.append(N)
        rows.ids.append(ids)
        rows.sess.append(session)
        rows.turn.append(counters.setdefault(session, 0))
        counters[session] += 1


def read_weka_files(paths, *, conversation_spacing_s: float = 0.0, name: str | None = None) -> Trace:
    """Read kv-cache-tester conversation files into one trace (rules: module docstring).

    Parameters
    ----------
    paths : sequence of str or Path
        The ``.json`` files, taken in the given order (``read_weka`` sorts by name).
    conversation_spacing_s : float, seconds, ≥ 0
        Conversation k starts at ``k * conversation_spacing_s`` (default 0: all at 0).
    name : str, optional
        The trace's ``name`` (default: the single path, or the paths joined by ``,``).

    Returns
    -------
    Trace
        ``unit_tokens = block_size`` (64), ``partial_last_unit = False``, ids renumbered per
        file, ids ``r0 …`` in replay order, ``session_id`` and ``turn`` columns.

    Raises
    ------
    radixkv.errors.TraceFormatError
        Naming the file, the record (1-based index of the top-level request, or of the
        sub-agent marker holding the request) and the field as a JSON path such as
        ``requests[3].requests[0].hash_ids``: invalid JSON, missing or mistyped fields,
        ``len(hash_ids) != floor(in / block_size)``, empty prompts, files whose
        ``block_size`` differ.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceFormatError("no conversation files given", path=name)
    spacing = float(conversation_spacing_s)
    if not np.isfinite(spacing) or spacing < 0:
        raise TraceFormatError(f"conversation_spacing_s must be a finite number ≥ 0, got {conversation_spacing_s}",
                               field="conversation_spacing_s")
    U = None
    t_all, plen_all, olen_all, ids_all, sess_all, turn_all = [], [], [], [], [], []
    id_base = 0
    for k, path in enumerate(paths):
        doc = _load_json(path)
        bs = F.as_int(F.get(doc, "block_size", path, None), path, None, "block_size", minimum=1)
        if U is None:
            U = bs
        elif bs != U:
            raise TraceFormatError(f"block_size {bs} differs from {U} in {paths[0]}; one trace has one granularity",
                                   path=path, field="block_size")
        conv = F.as_str(F.get(doc, "id", path, None), path, None, "id")
        rows = _FileRows()
        _flatten(F.get(doc, "requests", path, None), k * spacing, bs, conv, path, None, "", rows, {})
        if not rows.plen:
            continue
        lens = np.fromiter((len(a) for a in rows.ids), dtype=np.int64, count=len(rows.ids))
        flat = np.concatenate(rows.ids) if lens.sum() else np.zeros(0, dtype=np.int64)
        uniq, inv = np.unique(flat, return_inverse=True)
        dense = inv.astype(np.int64).reshape(-1) + id_base
        id_base += len(uniq)
        ids_all.extend(np.split(dense, np.cumsum(lens)[:-1]))
        t_all.extend(rows.t)
        plen_all.extend(rows.plen)
        olen_all.extend(rows.olen)
        sess_all.extend(rows.sess)
        turn_all.extend(rows.turn)
    n = len(plen_all)
    arrival = np.asarray(t_all, dtype=np.float64).reshape(n)
    order = np.argsort(arrival, kind="stable")
    req_id = np.empty(n, dtype=object)
    req_id[order] = [f"r{k}" for k in range(n)]
    if name is None:
        name = str(paths[0]) if len(paths) == 1 else ",".join(str(p) for p in paths)
    return Trace.from_requests(
        req_id=req_id,
        arrival_s=arrival,
        prompt_len=plen_all,
        output_len=olen_all,
        prompt_ids=ids_all,
        unit_tokens=U,
        partial_last_unit=False,
        session_id=sess_all,
        turn=turn_all,
        name=name,
    )


def read_weka(path, *, conversation_spacing_s: float = 0.0) -> Trace:
    """Read one kv-cache-tester conversation file, or a directory of them as one trace.

    Parameters
    ----------
    path : str or Path
        A ``.json`` file, or a directory whose ``*.json`` files (sorted by name) are read.
    conversation_spacing_s : float, seconds
        See :func:`read_weka_files`.

    Raises
    ------
    radixkv.errors.TraceFormatError
        See :func:`read_weka_files`; also a directory without ``.json`` files.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".json" and p.is_file())
        if not files:
            raise TraceFormatError("directory holds no .json conversation files", path=path)
        return read_weka_files(files, conversation_spacing_s=conversation_spacing_s, name=str(path))
    return read_weka_files([path], conversation_spacing_s=conversation_spacing_s)
