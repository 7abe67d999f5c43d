"""LRU stack distances (Mattson et al., "Evaluation techniques for storage hierarchies",
IBM Systems Journal 9(2), 1970) with a Fenwick tree: every capacity of a ``unit-lru``
curve in one pass over the trace (Numba).

LRU is a *stack algorithm*: a cache of C units holds exactly the C most recently used
distinct units. The *stack distance* of a reference to unit k is the number of distinct
units referenced since k's previous reference (∞ on a first reference); the reference
finds k cached in an LRU of C units iff that distance is < C. A Fenwick (binary indexed)
tree over reference times, with a 1 at each unit's latest reference, gives the distance
of a reference in O(log A) (A references in all) and the C-th most recently used unit
(the LRU victim of a cache of C units) by a descent in O(log A).

``unit-lru`` (:mod:`radixkv.policies.unit_lru`) looks a request's units up *before*
touching any of them, then touches them in prompt order; so a request's hit at capacity C
is its number of leading units whose distance at the request's start is < C, and its
insertions and evictions at C follow the distances at touch time. The kernel tracks, for
each capacity of the curve, the cache's size, valid tokens, evictions and evicted tokens
after every request — the same per-request records a replay at that capacity produces.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from radixkv.trace.keys import SEED, mix64

_INF = np.int64(1) << np.int64(62)


@nb.njit(cache=True)
def unit_keys(ids, id_offsets, prompt_len, unit_tokens):
    """Prefix keys and token ends of every request's units, flat in replay order.

    Parameters
    ----------
    ids, id_offsets : np.ndarray, int64
        The trace's prompt ids in CSR form (:class:`radixkv.trace.types.Trace`).
    prompt_len : np.ndarray, int64, shape (n,)
    unit_tokens : int
        U, tokens per id.

    Returns
    -------
    (keys, ends) : np.ndarray uint64 and int64, shape (total_ids,)
        ``keys[j]`` chains every id of the request up to j (:mod:`radixkv.trace.keys`);
        ``ends[j] = min((j' + 1) U, P)`` with j' the id's position in its prompt: the
        prompt token where the unit ends.
    """
    m = ids.shape[0]
    keys = np.empty(m, dtype=np.uint64)
    ends = np.empty(m, dtype=np.int64)
    for r in range(prompt_len.shape[0]):
        h = SEED
        a = id_offsets[r]
        P = prompt_len[r]
        for j in range(a, id_offsets[r + 1]):
            h = mix64(h, np.uint64(ids[j]))
            keys[j] = h
            e = (j - a + 1) * unit_tokens
            ends[j] = e if e < P else P
    return keys, ends


@nb.njit(cache=True)
def dense_index(keys):
    """Number the distinct values of *keys* 0, 1, … in order of first appearance.

    Parameters
    ----------
    keys : np.ndarray, uint64, shape (A,)
        Well-mixed 64-bit keys (:func:`unit_keys`); the low bits index the hash table.

    Returns
    -------
    (idx, n) : np.ndarray int64 of shape (A,), int
        ``idx[j]`` = the number of ``keys[j]``; ``n`` distinct keys. O(A) expected (open
        addressing, linear probing, load ≤ 1/2), against O(A log A) for a sort.
    """
    A = keys.shape[0]
    cap = 16
    while cap < 2 * A:
        cap *= 2
    mask = np.uint64(cap - 1)
    tkey = np.empty(cap, dtype=np.uint64)
    tval = np.zeros(cap, dtype=np.int64)  # number + 1; 0 = empty
    idx = np.empty(A, dtype=np.int64)
    n = 0
    for j in range(A):
        k = keys[j]
        i = np.int64(k & mask)
        while True:
            v = tval[i]
            if v == 0:
                tkey[i] = k
                n += 1
                tval[i] = n
                idx[j] = n - 1
                break
            if tkey[i] == k:
                idx[j] = v - 1
                break
            i = (i + 1) & (cap - 1)
    return idx, n


@nb.njit(cache=True, inline="always")
def _prefix(tree, i):
    s = 0
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return s


@nb.njit(cache=True, inline="always")
def _add(tree, i, v):
    n = tree.shape[0] - 1
    while i <= n:
        tree[i] += v
        i += i & (-i)


@nb.njit(cache=True, inline="always")
def _kth(tree, k, top):
    """Smallest position p with prefix(p) ≥ k (1 ≤ k ≤ total); *top* = largest power of 2 ≤ n."""
    pos = 0
    step = top
    n = tree.shape[0] - 1
    while step > 0:
        q = pos + step
        if q <= n and tree[q] < k:
            pos = q
            k -= tree[q]
        step >>= 1
    return pos + 1


@nb.njit(cache=True)
def lru_curve(key_idx, ends, id_offsets, n_keys, caps,
              hit, evicted, size_after, valid_after, evictions):
    """One pass of the ``unit-lru`` model at every capacity in *caps*.

    Parameters
    ----------
    key_idx : np.ndarray, int64, shape (A,)
        Dense unit number (0 … n_keys−1) of every reference, request after request.
    ends : np.ndarray, int64, shape (A,)
        Prompt token where each referenced unit ends (its tokens: ``ends[j] − ends[j−1]``
        within a request).
    id_offsets : np.ndarray, int64, shape (n+1,)
        Request r references ``key_idx[id_offsets[r]:id_offsets[r+1]]``.
    n_keys : int
    caps : np.ndarray, int64, shape (K,)
        Capacities in units, each ≥ 1.

    Outputs (filled in place), each int64: ``hit`` (n, K) hit tokens; ``evicted`` (n, K)
    tokens evicted while admitting the request; ``size_after`` and ``valid_after`` (n, K)
    units and valid tokens cached after the request; ``evictions`` (K,) eviction events.

    Notes
    -----
    Per capacity C the kernel keeps a pointer to the C-th most recently used unit (the
    next LRU victim). A reference at stack distance d moves it only when d ≥ C (a miss:
    the victim leaves, the old (C−1)-th becomes the C-th) or d = C − 1 (the C-th itself
    becomes the most recent): in both cases to the next more recent reference still
    marked as a unit's latest, so the pointer only moves toward the present and all its
    moves over the run cost O(A). Distances cost O(log A) each (the Fenwick tree).
    Memory: 8 (A + n_keys) + A bytes, plus 8 n_keys K bytes when a unit's token count
    differs between its references (a partial last unit).
    """
    A = key_idx.shape[0]
    K = caps.shape[0]
    n = id_offsets.shape[0] - 1
    # unit token counts: one per unit unless some unit is referenced with different counts
    tok1 = np.full(n_keys, -1, dtype=np.int64)
    varying = False
    for r in range(n):
        a = id_offsets[r]
        for j in range(a, id_offsets[r + 1]):
            nt = ends[j] - (ends[j - 1] if j > a else 0)
            u = key_idx[j]
            if tok1[u] < 0:
                tok1[u] = nt
            elif tok1[u] != nt:
                varying = True
    tokk = np.zeros((K if varying else 0, n_keys), dtype=np.int64)  # tokens a unit was inserted with, per capacity
    tree = np.zeros(A + 1, dtype=np.int64)  # position A − t + 1 ↔ reference time t (1 … A)
    marked = np.zeros(A + 2, dtype=np.uint8)  # 1 at each unit's latest reference
    key_at = np.zeros(A + 1, dtype=np.int64)  # unit referenced at position p
    last = np.zeros(n_keys, dtype=np.int64)  # position of the unit's latest reference (0: none)
    size = np.zeros(K, dtype=np.int64)
    valid = np.zeros(K, dtype=np.int64)
    ptr = np.zeros(K, dtype=np.int64)  # position of the C-th most recent unit once the cache is full
    top = 1
    while top * 2 <= A:
        top *= 2
    t = 0
    distinct = 0
    mx = np.zeros(0, dtype=np.int64)
    for r in range(n):
        a = id_offsets[r]
        b = id_offsets[r + 1]
        # 1. hits: distances at the request's start (nothing of it touched yet)
        if mx.shape[0] < b - a:
            mx = np.zeros(2 * (b - a), dtype=np.int64)
        m = np.int64(-1)
        for j in range(a, b):
            p = last[key_idx[j]]
            d = _INF if p == 0 else _prefix(tree, p - 1)
            if d > m:
                m = d
            mx[j - a] = m
        for k in range(K):
            h = 0
            while h < b - a and mx[h] < caps[k]:
                h += 1
            hit[r, k] = ends[a + h - 1] if h > 0 else 0
        # 2. touch every unit in prompt order
        for j in range(a, b):
            u = key_idx[j]
            p = last[u]
            d = _INF if p == 0 else _prefix(tree, p - 1)
            ntok = ends[j] - (ends[j - 1] if j > a else 0)
            q = A - t  # this reference's position
            for k in range(K):
                c = caps[k]
                if d < c - 1 or (d == c - 1 and size[k] < c):
                    continue  # cached, and the C-th most recent unit stays where it is
                if d == c - 1 or size[k] == c:
                    if d >= c:
                        # a miss on a full cache: evict the C-th most recent unit
                        v = key_at[ptr[k]]
                        vt = tokk[k, v] if varying else tok1[v]
                        valid[k] -= vt
                        evicted[r, k] += vt
                        evictions[k] += 1
                        valid[k] += ntok
                        if varying:
                            tokk[k, u] = ntok
                    # the old (C−1)-th most recent unit becomes the C-th
                    if c == 1:
                        ptr[k] = q
                    else:
                        x = ptr[k] - 1
                        while marked[x] == 0:
                            x -= 1
                        ptr[k] = x
                    continue
                # a miss on a cache not yet full (a first reference)
                size[k] += 1
                valid[k] += ntok
                if varying:
                    tokk[k, u] = ntok
                if size[k] == c:
                    # full now: the C-th most recent unit is the oldest one referenced
                    ptr[k] = q if c == 1 else _kth(tree, distinct, top)
            if p > 0:
                _add(tree, p, -1)
                marked[p] = 0
            else:
                distinct += 1
            t += 1
            _add(tree, q, 1)
            marked[q] = 1
            key_at[q] = u
            last[u] = q
        for k in range(K):
            size_after[r, k] = size[k]
            valid_after[r, k] = valid[k]
