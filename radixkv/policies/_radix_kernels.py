"""Numba kernels for :mod:`radixkv.policies.radix`: comparisons of KV segment runs.

A request's KV content is a :class:`radixkv.trace.types.KVSeq`: segments ``(seg_id,
seg_end)`` where segment ``s`` covers token positions ``[seg_end[s-1], seg_end[s])`` (0 for
``s = 0``). The token at position ``t`` is identified by the pair *(id, start)* of the
segment holding it; two sequences hold the same token at ``t`` iff those pairs are equal
(see the module docstring of :mod:`radixkv.trace.types`).

Every function here is a pure function of its arguments (no globals, no Python objects),
so it behaves the same with ``NUMBA_DISABLE_JIT=1``.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def segment_at(seg_end, t):
    """Index of the segment that holds token position *t*.

    Parameters
    ----------
    seg_end : np.ndarray, int64, shape (S,)
        Exclusive segment ends (tokens), strictly increasing.
    t : int
        Token position, ``0 <= t < seg_end[-1]``.

    Returns
    -------
    int
        ``s`` with ``seg_end[s-1] <= t < seg_end[s]``.
    """
    return np.searchsorted(seg_end, t, side="right")


@njit(cache=True)
def common_prefix_end(a_id, a_end, b_id, b_end, pos, limit):
    """First position in ``[pos, limit)`` where sequences *a* and *b* hold different tokens.

    This is the longest-common-prefix scan of two token runs that start at the same
    position (in a radix tree a node's depth equals the token position, so the tokens
    below a node and the request's tokens from that depth are compared position by
    position). The scan moves segment by segment, never token by token.

    Parameters
    ----------
    a_id, a_end : np.ndarray, int64, shape (Sa,)
        Segments of sequence *a* (ids and exclusive ends, tokens).
    b_id, b_end : np.ndarray, int64, shape (Sb,)
        Segments of sequence *b*.
    pos : int
        Start position (tokens).
    limit : int
        End of the comparison (tokens); must not exceed either sequence's length.

    Returns
    -------
    int
        The first differing position, or *limit* when ``[pos, limit)`` is equal (also when
        ``pos >= limit``).
    """
    if pos >= limit:
        return limit
    i = np.searchsorted(a_end, pos, side="right")
    j = np.searchsorted(b_end, pos, side="right")
    t = pos
    while t < limit:
        a_start = a_end[i - 1] if i > 0 else 0
        b_start = b_end[j - 1] if j > 0 else 0
        if a_id[i] != b_id[j] or a_start != b_start:
            return t
        e = a_end[i] if a_end[i] < b_end[j] else b_end[j]
        if e >= limit:
            return limit
        t = e
        if a_end[i] == e:
            i += 1
        if b_end[j] == e:
            j += 1
    return limit


@njit(cache=True)
def token_key(seg_id, seg_end, t):
    """Canonical identity ``(id, start)`` of the token at position *t* (int64 pair)."""
    s = np.searchsorted(seg_end, t, side="right")
    start = seg_end[s - 1] if s > 0 else 0
    return seg_id[s], start


@njit(cache=True)
def page_span(seg_id, seg_end, t, p):
    """Segments covering the page ``[t, t+p)``: ``(first, last, start_of_first)``.

    The page's content is determined by ``seg_id[first:last+1]``, the internal boundaries
    ``seg_end[first:last]`` and the start of the first segment; equal content <=> equal
    triple of those (the tuple is the run-length encoding of the page's token identities).
    Requires ``t + p <= seg_end[-1]``.
    """
    first = np.searchsorted(seg_end, t, side="right")
    last = np.searchsorted(seg_end, t + p - 1, side="right")
    start = seg_end[first - 1] if first > 0 else 0
    return first, last, start
