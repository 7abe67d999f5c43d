"""Cross-request checks every reader applies (issue 16's input faults).

* **One id, one length.** A unit id names the content of one block of ``U`` tokens; in a
  trace whose last unit may be partial (Mooncake's ``hash_ids``, native JSONL with
  ``partial_last_unit``, ``.npz``), an id that covers 40 tokens in one request and 500 in
  another names two different contents. Every file reader rejects such a trace with a
  located error rather than guess: ``unit-lru`` would count the whole unit as a hit while ``vllm`` and ``sglang``
  (which expand units to tokens) hit only the tokens first cached, so the policies would
  disagree. The public Mooncake trace has no such id (checked over all 12,031 lines of
  ``conversation_trace.jsonl``).
* **Unique request ids.** Two requests with the same id would write two per-request rows
  nobody can tell apart; the second is rejected naming both.
"""
from __future__ import annotations

import numpy as np


def unit_covers(ids_len: int, offsets: np.ndarray, prompt_len: np.ndarray, unit_tokens: int) -> np.ndarray:
    """Tokens each unit id covers: ``U`` for every unit but a request's last, which covers
    ``prompt_len − (units − 1)·U`` (int64 array of shape ``(ids_len,)``, tokens)."""
    cover = np.full(ids_len, int(unit_tokens), dtype=np.int64)
    nunits = np.diff(offsets)
    has = nunits > 0
    cover[offsets[1:][has] - 1] = prompt_len[has] - (nunits[has] - 1) * int(unit_tokens)
    return cover


def first_cover_conflict(ids: np.ndarray, offsets: np.ndarray, prompt_len: np.ndarray, unit_tokens: int):
    """The first unit id that covers a different token count than where it first appeared.

    Parameters
    ----------
    ids : int64 array, shape (m,) — every request's unit ids, concatenated in order
    offsets : int64 array, shape (n + 1,) — request ``k``'s ids are ``ids[offsets[k]:offsets[k+1]]``
    prompt_len : int64 array, shape (n,) — tokens
    unit_tokens : int — ``U``; the last unit of a request may be partial

    Returns
    -------
    None, or ``(k, position, id, k_first, cover_first, cover)``: request ``k``'s unit at
    *position* (0-based) reuses *id*, which request ``k_first`` used for *cover_first*
    tokens, for *cover* tokens.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        return None
    offsets = np.asarray(offsets, dtype=np.int64)
    cover = unit_covers(ids.size, offsets, np.asarray(prompt_len, dtype=np.int64), unit_tokens)
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    bad = np.flatnonzero(cover != cover[first[inv.ravel()]])
    if not bad.size:
        return None
    j = int(bad[0])
    f = int(first[inv.ravel()[j]])
    k = int(np.searchsorted(offsets, j, side="right") - 1)
    kf = int(np.searchsorted(offsets, f, side="right") - 1)
    return k, j - int(offsets[k]), int(ids[j]), kf, int(cover[f]), int(cover[j])


def first_duplicate_id(req_id) -> tuple[int, int] | None:
    """``(k_first, k)``: the first request ``k`` whose id request ``k_first`` already used,
    in the given order; None when every id is unique."""
    arr = np.asarray(req_id, dtype=str)
    if arr.size < 2:
        return None
    _, first, inv = np.unique(arr, return_index=True, return_inverse=True)
    dup = np.flatnonzero(first[inv.ravel()] != np.arange(arr.size))
    if not dup.size:
        return None
    k = int(dup[0])
    return int(first[inv.ravel()[k]]), k


def check_unit_covers(trace) -> None:
    """Raise :class:`radixkv.errors.InputError` naming the request when a unit id of
    *trace* (a :class:`~radixkv.trace.types.Trace` with a partial last unit) covers two
    lengths. Every file reader applies this rule (Mooncake and native JSONL name the line);
    a Trace built in memory is not checked, so library code may still use a shorter cover
    as a prefix of a unit's content (the token-level policies read it that way)."""
    from radixkv.errors import InputError

    if not trace.partial_last_unit or trace.unit_tokens <= 1:
        return
    bad = first_cover_conflict(trace.ids, trace.id_offsets, trace.prompt_len, trace.unit_tokens)
    if bad is not None:
        name = lambda k: f"request {str(trace.req_id[k])!r}"  # noqa: E731
        raise InputError(f"{name(bad[0])}: " + cover_message(bad, name), path=trace.name or None, field="ids")


def cover_message(conflict, name_of) -> str:
    """Text for :func:`first_cover_conflict`'s answer; *name_of(k)* names request ``k``."""
    k, pos, uid, kf, cf, c = conflict
    return (f"unit id {uid} (unit {pos} of this request) covers {c} tokens here but {cf} tokens in "
            f"{name_of(kf)}: one id must name one content of one length (radixkv rejects such traces)")
