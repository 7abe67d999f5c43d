"""Reader for Mooncake-format JSONL traces (Kimi / Moonshot AI, FAST'25 release).

Source of the format: ``kvcache-ai/Mooncake`` ``FAST25-release/traces/*.jsonl`` and the
paper (Qin et al., "Mooncake: Trading More Storage for Less Computation", USENIX FAST
2025, Table 2); see ``shared/traces/mooncake-fast25/SOURCE.md``. One request per line:

=================  ===========================================================
``timestamp``      int (or float) ≥ 0, **milliseconds** since the trace start
``input_length``   int ≥ 1, prompt tokens
``output_length``  int ≥ 0, output tokens
``hash_ids``       list of int ≥ 0, one prefix-chained id per **512-token** block;
                   the last block is partial when ``input_length`` is not a
                   multiple of 512, so ``len(hash_ids) == ceil(input_length/512)``
=================  ===========================================================

Other keys are ignored. Outputs are unique content (the trace has no output ids).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from radixkv.errors import TraceFormatError
from radixkv.trace import _fields as F
from radixkv.trace._jsonl_fast import read_records
from radixkv.trace.types import Trace

#: tokens per Mooncake hash id (Mooncake FAST'25 release, traces README and SOURCE.md)
MOONCAKE_BLOCK_TOKENS = 512


def read_mooncake(path, *, unit_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """Read a Mooncake JSONL trace.

    Parameters
    ----------
    path : str or Path
    unit_tokens : int
        Tokens per hash id; 512 for every file Mooncake published.

    Returns
    -------
    Trace
        ``unit_tokens = 512``, ``partial_last_unit = True``; ``arrival_s = timestamp/1000``;
        request ids ``r<i>`` with ``i`` the 0-based index of the request's line among the
        non-blank lines (the golden convention, ``golden/README.md``); stable-sorted by
        arrival (the public file is already non-decreasing; a file that is not gets an
        :class:`~radixkv.errors.InputWarning` naming the count and the first line out of
        order, :func:`radixkv.trace._fields.warn_unsorted`).

    Raises
    ------
    radixkv.errors.TraceFormatError
        Naming file, 1-based line and field: invalid JSON, a missing field, a negative,
        boolean or non-integer length or id, an empty prompt, or
        ``len(hash_ids) != ceil(input_length / 512)``, or a hash id that covers a different
        number of tokens than where it first appeared (:mod:`radixkv.trace.consistency`).
    """
    path = Path(path)
    U = int(unit_tokens)
    lines = read_records(path, ("hash_ids",))
    n = len(lines)
    ts = np.zeros(n, dtype=np.float64)  # milliseconds, as the file gives them
    plen = np.zeros(n, dtype=np.int64)
    olen = np.zeros(n, dtype=np.int64)
    pids = [None] * n
    for k, (ln, obj) in enumerate(lines):
        ts[k] = F.as_float(F.get(obj, "timestamp", path, ln), path, ln, "timestamp")
        plen[k], olen[k], pids[k] = read_block_request(obj, U, path, ln)
    line_of = [ln for ln, _ in lines]
    _check_covers(pids, plen, U, line_of, path, "hash_ids")
    F.warn_unsorted(ts, line_of, path, "timestamp")
    return Trace.from_requests(
        req_id=[f"r{k}" for k in range(n)],
        arrival_s=ts / 1000.0,
        prompt_len=plen,
        output_len=olen,
        prompt_ids=pids,
        unit_tokens=U,
        partial_last_unit=True,
        name=str(path),
    )


def read_block_request(obj: dict, U: int, path, ln) -> tuple:
    """``(input_length, output_length, hash_ids)`` of one record whose ``hash_ids`` hold one
    id per *U*-token block with a partial last block (Mooncake, Qwen-Bailian): lengths
    checked (prompt ≥ 1 token), ``len(hash_ids) == ceil(input_length / U)``; located errors."""
    P = F.as_int(F.get(obj, "input_length", path, ln), path, ln, "input_length")
    if P < 1:
        raise TraceFormatError("empty prompt (input_length must be ≥ 1)", path=path, line=ln, field="input_length")
    N = F.as_int(F.get(obj, "output_length", path, ln), path, ln, "output_length")
    ids = F.as_id_array(F.get(obj, "hash_ids", path, ln), path, ln, "hash_ids")
    expect = -(-P // U)
    if len(ids) != expect:
        raise TraceFormatError(
            f"{len(ids)} hash_ids for input_length {P}; expected ceil({P}/{U}) = {expect}",
            path=path, line=ln, field="hash_ids",
        )
    return P, N, ids


def _check_covers(pids, plen, U, line_of, path, field) -> None:
    """Raise a located :class:`TraceFormatError` for the first unit id that covers two
    lengths (:func:`radixkv.trace.consistency.first_cover_conflict`); *pids* and *plen* in
    file order, *line_of[k]* request ``k``'s 1-based line."""
    from radixkv.trace.consistency import cover_message, first_cover_conflict

    if U <= 1 or not len(pids):
        return
    lens = np.fromiter((len(p) for p in pids), dtype=np.int64, count=len(pids))
    offsets = np.zeros(len(pids) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in pids])
    bad = first_cover_conflict(flat, offsets, np.asarray(plen, dtype=np.int64), U)
    if bad is not None:
        raise TraceFormatError(cover_message(bad, lambda k: f"line {line_of[k]}"),
                               path=path, line=line_of[bad[0]], field=field)
