"""Numba twin of :meth:`radixkv.trace.types.Trace.kv_seq`, for replay loops inside kernels.

:func:`kv_seq_into` writes request i's segments (``seg_id``, ``seg_end``) into scratch
buffers; the result equals ``Trace.kv_seq(i)`` element for element (the segment model
of :mod:`radixkv.trace.types`: prompt ids — tokens or units, the last unit capped at P —
then a unique prompt tail when the ids cover fewer than P tokens, then the output ids,
or one unique output segment, up to the KV extent ``P + max(N − 1, 0)``).

:func:`prefetch_request` asks the CPU to start loading a request's ids (a hint that
changes no result): a span loop issues it for request i + 1 before it runs request i,
so that the trace's ids — read once per replay, from memory rather than the CPU cache —
arrive while request i's cache work runs.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from radixkv._intrinsics import for_mode, prefetch_once

#: a cache-line hint (radixkv._intrinsics; a no-op stand-in without the JIT)
_prefetch = for_mode(prefetch_once)


@nb.njit(cache=True)
def prefetch_request(ids, id_offsets, out_ids, out_offsets, has_out, i):
    """Prefetch request *i*'s prompt ids (and output ids) one 64-byte line at a time; does
    nothing when *i* is past the last request."""
    if i + 1 >= id_offsets.shape[0]:
        return
    for j in range(id_offsets[i], id_offsets[i + 1], 8):
        _prefetch(ids, j)
    if has_out and i + 1 < out_offsets.shape[0]:
        for j in range(out_offsets[i], out_offsets[i + 1], 8):
            _prefetch(out_ids, j)


@nb.njit(cache=True)
def kv_seq_len(id_offsets, out_offsets, has_out, prompt_len, output_len, unit_tokens, i):
    """Number of segments of request *i* (the length ``kv_seq_into`` writes)."""
    P = prompt_len[i]
    kv = P + max(output_len[i] - 1, 0)
    k = id_offsets[i + 1] - id_offsets[i]
    n = k
    if unit_tokens > 1:
        covered = min(k * unit_tokens, P) if k > 0 else 0
        if covered < P:
            n += 1
    if kv > P:
        n += (kv - P) if has_out else 1
    return n


@nb.njit(cache=True)
def kv_seq_is_prompt_ids(id_offsets, prompt_len, output_len, unit_tokens, i):
    """Whether request *i*'s segments are exactly its P prompt ids, one token each: a
    token trace's request (unit 1) whose ids cover the prompt and whose KV extent is the
    prompt (at most one output token). Then :func:`kv_seq_into` would write
    ``seg_id = ids[a:a + P]`` and ``seg_end = 1 … P`` (a = ``id_offsets[i]``), so a loop
    may use views of the ids instead of copying them."""
    return unit_tokens == 1 and output_len[i] <= 1 and id_offsets[i + 1] - id_offsets[i] == prompt_len[i]


@nb.njit(cache=True)
def kv_seq_is_ids_then_output(id_offsets, prompt_len, output_len, unit_tokens, has_out, i):
    """Whether request *i*'s segments are its P prompt ids, one token each, then one unique
    output segment: a token trace's request (unit 1) whose ids cover the prompt, without
    output ids, whose KV extent ``kv = P + N − 1`` passes the prompt (N ≥ 2 output tokens).
    Then :func:`kv_seq_into` would write ``seg_id`` = the P ids followed by the request's
    output id, and ``seg_end = 1 … P`` followed by kv (:func:`kv_seq_ids_then_output_into`
    writes the ids alone, so a loop may keep the ends ``1 … P`` in an array it shares
    between requests and set only the last)."""
    return (unit_tokens == 1 and not has_out and output_len[i] > 1
            and id_offsets[i + 1] - id_offsets[i] == prompt_len[i])


@nb.njit(cache=True)
def kv_seq_ids_then_output_into(ids, id_offsets, prompt_len, i, seg_id):
    """``seg_id`` of a request for which :func:`kv_seq_is_ids_then_output` holds, as
    :func:`kv_seq_into` writes it (its P prompt ids, then its unique output id); returns
    the segment count P + 1."""
    P = prompt_len[i]
    a = id_offsets[i]
    src = ids[a:a + P]  # a view indexed from 0 (kv_seq_into: the copy vectorizes)
    for j in range(P):
        seg_id[j] = src[j]
    seg_id[P] = -(2 * i + 2)  # types._unique_output_id
    return P + 1


@nb.njit(cache=True)
def kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                seg_id, seg_end):
    """Write request *i*'s segments into ``seg_id[:n]``, ``seg_end[:n]`` (int64); returns n."""
    P = prompt_len[i]
    kv = P + max(output_len[i] - 1, 0)
    a = id_offsets[i]
    k = id_offsets[i + 1] - a
    # the ids are read through a view (indices from 0 that Numba need not wrap when
    # negative), which lets the compiler vectorize the copy: the trace is read from memory
    # once per replay, and an index ``a + j`` of unknown sign made this loop scalar
    src = ids[a:a + k]
    n = k
    if unit_tokens == 1:
        for j in range(k):
            seg_id[j] = src[j]
            seg_end[j] = j + 1
    else:
        for j in range(k):
            seg_id[j] = src[j]
            seg_end[j] = (j + 1) * unit_tokens
        covered = 0
        if k > 0:
            if seg_end[n - 1] > P:
                seg_end[n - 1] = P
            covered = seg_end[n - 1]
        if covered < P:
            seg_id[n] = -(2 * i + 1)  # types._unique_prompt_id
            seg_end[n] = P
            n += 1
    if kv > P:
        if has_out:
            b = out_offsets[i]
            osrc = out_ids[b:b + kv - P]
            for j in range(kv - P):
                seg_id[n + j] = osrc[j]
                seg_end[n + j] = P + 1 + j
            n += kv - P
        else:
            seg_id[n] = -(2 * i + 2)  # types._unique_output_id
            seg_end[n] = kv
            n += 1
    return n
