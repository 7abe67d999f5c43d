"""Numba twin of :meth:`radixkv.trace.types.Trace.kv_seq`, for replay loops inside kernels.

:func:`kv_seq_into` writes request i's segments (``seg_id``, ``seg_end``) into scratch
buffers; the result equals ``Trace.kv_seq(i)`` element for element (the segment model
of :mod:`radixkv.trace.types`: prompt ids — tokens or units, the last unit capped at P —
then a unique prompt tail when the ids cover fewer than P tokens, then the output ids,
or one unique output segment, up to the KV extent ``P + max(N − 1, 0)``).
"""
from __future__ import annotations

import numba as nb
import numpy as np


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
def kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                seg_id, seg_end):
    """Write request *i*'s segments into ``seg_id[:n]``, ``seg_end[:n]`` (int64); returns n."""
    P = prompt_len[i]
    kv = P + max(output_len[i] - 1, 0)
    a = id_offsets[i]
    k = id_offsets[i + 1] - a
    n = 0
    if unit_tokens == 1:
        for j in range(k):
            seg_id[n] = ids[a + j]
            seg_end[n] = j + 1
            n += 1
    else:
        for j in range(k):
            seg_id[n] = ids[a + j]
            seg_end[n] = (j + 1) * unit_tokens
            n += 1
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
            for j in range(kv - P):
                seg_id[n] = out_ids[b + j]
                seg_end[n] = P + 1 + j
                n += 1
        else:
            seg_id[n] = -(2 * i + 2)  # types._unique_output_id
            seg_end[n] = kv
            n += 1
    return n
