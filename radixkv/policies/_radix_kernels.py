"""Numba kernels for :mod:`radixkv.policies.radix`: comparisons of KV segment runs.

A request's KV content is a :class:`radixkv.trace.types.KVSeq`: segments ``(seg_id,
seg_end)`` where segment ``s`` covers token positions ``[seg_end[s-1], seg_end[s])`` (0 for
``s = 0``). The token at position ``t`` is identified by the pair *(id, start)* of the
segment holding it; two sequences hold the same token at ``t`` iff those pairs are equal
(see the module docstring of :mod:`radixkv.trace.types`).

The segment kernels below are pure functions of their arguments (no globals, no Python
objects), so they behave the same with ``NUMBA_DISABLE_JIT=1``. The tree kernels further
down mutate the int64 state arrays they are given (and nothing else); they give the same
results uncompiled, only slowly (a keyed order calls its priority function by address
when compiled; uncompiled, :func:`radixkv.policies._priority_fn.priority_at_python` finds the
same compiled function from its address).

The tree is written once for every eviction order: the order is a plug-in value passed
through the tree kernels, chosen at run time, so one compile serves every order (section
"Eviction orders" below), LRU for
:class:`~radixkv.policies.radix.RadixCache`, a keyed priority for
:class:`~radixkv.policies.radix_priority.PriorityRadixCache`.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.core import config as numba_config

from radixkv.policies._borrowed import borrow, borrow_each, borrow_py
from radixkv.policies._priority_fn import priority_at

if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run
    borrow = borrow_py  # noqa: F811

# int64 (not literal) constants for call arguments: a literal 0 or -1 passed to a jitted
# function makes Numba compile a second specialisation of it (and of all it calls)
_Z = np.int64(0)
_M1 = np.int64(-1)


@njit(cache=True)
def _seg_index(seg_end, t):
    """``np.searchsorted(seg_end, t, side="right")``, first trying the index a run of
    single-token segments gives (token traces: ``seg_end[s] = seg_end[0] + s``); the
    guess is checked, so the result is the same for any segments."""
    n = seg_end.shape[0]
    if n > 0:
        g = t - seg_end[0] + 1
        if 0 <= g < n and seg_end[g] > t and (g == 0 or seg_end[g - 1] <= t):
            return g
    return np.searchsorted(seg_end, t, side="right")


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
    return _seg_index(seg_end, t)


@njit(cache=True)
def _equal_blocks(a_id, a_end, b_id, b_end, i0, j0, limit):
    """Equal segment pairs to skip from (i0, j0), in blocks of 64 single-token segments,
    then of 32 and 8 segments of any length (see :func:`common_prefix_end`)."""
    na = a_end.shape[0] - i0
    nb = b_end.shape[0] - j0
    a_id = a_id[i0:]
    a_end = a_end[i0:]
    b_id = b_id[j0:]
    b_end = b_end[j0:]
    i = 0
    # runs of single-token segments (token traces): ends strictly increase, so ends 63
    # apart over 63 steps rise by exactly 1 each; two such runs from the same end hold
    # the same ends, and only the ids are compared (half the loads)
    while i + 64 < na and i + 64 < nb and a_end[i + 63] < limit:
        e = a_end[i]
        if b_end[i] != e or a_end[i + 63] - e != 63 or b_end[i + 63] - e != 63:
            break
        d = 0
        for k in range(64):
            d |= a_id[i + k + 1] ^ b_id[i + k + 1]
        if d != 0:
            break
        i += 64
    while i + 32 < na and i + 32 < nb and a_end[i + 31] < limit:
        d = 0
        for k in range(32):
            d |= (a_end[i + k] ^ b_end[i + k]) | (a_id[i + k + 1] ^ b_id[i + k + 1])
        if d != 0:
            break
        i += 32
    while i + 8 < na and i + 8 < nb and a_end[i + 7] < limit:
        d = 0
        for k in range(8):
            d |= (a_end[i + k] ^ b_end[i + k]) | (a_id[i + k + 1] ^ b_id[i + k + 1])
        if d != 0:
            break
        i += 8
    return i


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
    i = _seg_index(a_end, pos)
    j = _seg_index(b_end, pos)
    a_start = a_end[i - 1] if i > 0 else 0
    b_start = b_end[j - 1] if j > 0 else 0
    if a_id[i] != b_id[j] or a_start != b_start:
        return pos
    # here and at the top of the scalar loop, segments i and j start at the same
    # position with the same id. Skip blocks of 64 single-token segment pairs (ids only),
    # then of 32 and 8 segment pairs, that are equal (same ends, same next ids) and end
    # before *limit*, branch-free so the compiler can vectorise (token traces have one
    # segment per token).
    k = _equal_blocks(a_id, a_end, b_id, b_end, i, j, limit)
    i += k
    j += k
    while True:
        ae = a_end[i]
        be = b_end[j]
        if ae != be:
            # the segment ending first is followed by one starting at its end, the
            # other continues a segment that started earlier: the tokens differ there
            e = ae if ae < be else be
            return limit if e >= limit else e
        if ae >= limit:
            return limit
        i += 1
        j += 1
        if a_id[i] != b_id[j]:
            return ae


@njit(cache=True)
def token_key(seg_id, seg_end, t):
    """Canonical identity ``(id, start)`` of the token at position *t* (int64 pair)."""
    s = _seg_index(seg_end, t)
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
    first = _seg_index(seg_end, t)
    last = _seg_index(seg_end, t + p - 1)
    start = seg_end[first - 1] if first > 0 else 0
    return first, last, start


# ---------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------
# The radix tree in arrays (:class:`radixkv.policies.radix.RadixCache` and its subclasses)
# ---------------------------------------------------------------------------------------
# The tree, its child index, its eviction heap and the token runs the nodes refer to live
# in a handful of int64 arrays, so that a whole request (lookup, split, insert, eviction,
# lock moves) runs in one compiled call. Layout:
#
# S, shape (NS,): scalars (indices S_*).
# N, shape (node capacity, NF): one row per node (fields F_*); node 0 is the root. A
#     free row has F_ALIVE = 0 and links the free list through F_PARENT.
# H1, shape (2**k, 4): open-addressing (linear probing) table of children:
#     (parent, key1, key2, child); child = -1 marks an empty slot. The key is the
#     child's first token (id, segment start) when p = 1, and a hash of its first page
#     plus the page's first segment start when p > 1 (a match is then confirmed by
#     comparing the page's tokens, so hash collisions cannot change a result).
# H2, same shape: p > 1 only, children by first token (several may share one), for the
#     token-granular walk (held tokens).
# o: the eviction order, a tuple (see "Eviction orders" below): the heap arrays and, for
#     a keyed order, its priority function.
# G, shape (2, store capacity): the segment store: ids (row 0) and ends (row 1) of every
#     stored KV sequence, back to back; Q, shape (seq capacity, 4): per stored sequence
#     (offset in G, number of segments, references, free-list link). References: one per
#     node whose run points into the sequence, one per running request. A request's
#     sequence is stored from the segment before the one holding its hit position: its
#     own inserts walk its locked path without reading the tokens before the hit.
#     Freed space is reclaimed by compaction (``compact_store``).
# R, shape (NR,): one running request (fields R_*).

F_PARENT, F_START, F_END, F_SEQ, F_LOCK, F_TIME, F_NCHILD, F_ALIVE, F_K1, F_K2, F_T1, F_T2, F_DOWN = range(13)
#: per-node statistics SGLang's ``UnifiedTreeNode`` keeps for its eviction strategies
#: (``srt/mem_cache/unified_cache/unified_tree_core.py``), kept for keyed orders only:
#: creation time, hit count, request priority, T-LRU branch high-water depth; the valid
#: heap entry's push id; the creating request's tag (``F_TIME`` is the last access)
F_CREATED, F_HITS, F_PRIO, F_HIST, F_VER, F_TAG = range(13, 19)
NF = 19  # F_DOWN: scratch link to the next node of a path being walked down
(S_CLOCK, S_PUSH, S_HLEN, S_NNODES, S_FREE, S_PRIV, S_EVTOK, S_PROT, S_EVTOT, S_EVN, S_NFREE,
 S_HW, S_GUSED, S_GGARB, S_QFREE, S_QHW, S_P, S_CHUNK, S_NCOMPACT, S_DEFER) = range(20)
NS = 20  # S_DEFER ≠ 0: admit/extend leave the prefill checkpoint to ``commit``
Q_OFF, Q_LEN, Q_REFS, Q_NEXT = range(4)
#: R_INS: inserted length (SGLang ``req.kv.cache_inserted_len``), R_PRI: request
#: priority (``req.priority or 0``), R_TAG: a tag the caller gives the request (its trace
#: index), copied to the nodes it creates
R_NODE, R_OWNED, R_COMP, R_KVMAX, R_EVICTED, R_SEQ, R_PLEN, R_INS, R_PRI, R_TAG = range(10)
NR = 10
#: bits of an LRU time stamp below the counter draw (room for the per-level steps)
STAMP_SHIFT = 20

_C1 = -7046029254386353131
_C2 = -4658895280553007687
_C3 = 7640891576956012809
_M63 = (1 << 63) - 1


@njit(cache=True)
def _hslot(H, a, b, c):
    h = a * _C1 + b * _C2 + c * _C3
    h ^= h >> 29
    h *= _C2
    h ^= h >> 32
    return h & (H.shape[0] - 1)


@njit(cache=True)
def _h_insert(H, a, b, c, x):
    mask = H.shape[0] - 1
    i = _hslot(H, a, b, c)
    while H[i, 3] != -1:
        i = (i + 1) & mask
    H[i, 0] = a
    H[i, 1] = b
    H[i, 2] = c
    H[i, 3] = x


@njit(cache=True)
def _h_delete(H, a, b, c, x):
    mask = H.shape[0] - 1
    i = _hslot(H, a, b, c)
    while H[i, 3] != x:
        i = (i + 1) & mask
    j = i
    while True:  # backward-shift deletion
        j = (j + 1) & mask
        if H[j, 3] == -1:
            break
        k = _hslot(H, H[j, 0], H[j, 1], H[j, 2])
        if i <= j:
            stays = i < k <= j
        else:
            stays = k > i or k <= j
        if not stays:
            for f in range(4):
                H[i, f] = H[j, f]
            i = j
    H[i, 3] = -1


@njit(cache=True)
def child_key(qid, qend, t, p):
    """Child key of the run starting at *t*: ``(id, start)`` of its first token (p = 1),
    or (hash of the first page's run-length encoding, start of its first segment)."""
    if p == 1:
        return token_key(qid, qend, t)
    first, last, start = page_span(qid, qend, t, p)
    # every step is masked to 63 bits, so the value is the same whether the int64
    # products wrap (compiled) or not (NUMBA_DISABLE_JIT=1)
    h = (start * _C1 + 1) & _M63
    for s in range(first, last + 1):
        h = ((h ^ qid[s]) * _C2) & _M63
        h ^= h >> 31
        if s < last:
            h = ((h ^ qend[s]) * _C3) & _M63
    return h, start


@njit(cache=True)
def _lcp(N, G, Q, c, qid, qend, qref, pos, limit):
    s = N[c, F_SEQ]
    if s == qref:
        return limit
    off = Q[s, Q_OFF]
    n = Q[s, Q_LEN]
    return common_prefix_end(qid, qend, G[0, off:off + n], G[1, off:off + n], pos, limit)


@njit(cache=True)
def _find_child(S, N, H1, G, Q, node, qid, qend, qref, pos):
    p = S[S_P]
    k1, k2 = child_key(qid, qend, pos, p)
    mask = H1.shape[0] - 1
    i = _hslot(H1, node, k1, k2)
    while H1[i, 3] != -1:
        if H1[i, 0] == node and H1[i, 1] == k1 and H1[i, 2] == k2:
            c = H1[i, 3]
            if p == 1 or _lcp(N, G, Q, c, qid, qend, qref, pos, pos + p) == pos + p:
                return c
        i = (i + 1) & mask
    return -1



@njit(cache=True)
def _tick(S):
    t = S[S_CLOCK] << STAMP_SHIFT
    S[S_CLOCK] += 1
    return t


# ---------------------------------------------------------------------------------------
# Eviction orders
# ---------------------------------------------------------------------------------------
# The tree evicts whole evictable leaves (alive, unlocked, childless, not the root), the
# smallest first in an order that is a plug-in chosen at run time: a tuple
# ``o = (HP, HK, HI, fa, pp)`` that every tree kernel passes through, of one Numba type for
# every order (so the tree kernels and the replay loops are compiled once for all orders:
# ``sglang:1`` and ``sglang:1@lfu`` share one machine code), and three operations on it below
# (``order_push``, ``order_victim``, ``order_rebuild``) that branch on ``fa[0]``:
#
# - LRU (:func:`lru_order`), ``fa[0] == 0``: HP int64 (cap, 3), a binary min-heap of
#   (last access, push id, node), entries [0, S[S_HLEN]), lazily invalidated: an entry
#   is stale when the node's last access changed since it was pushed (SGLang's
#   ``LRUStrategy``; :class:`~radixkv.policies.radix.RadixCache`). HK, HI are empty.
# - keyed (:func:`keyed_order`), ``fa[0] != 0``: HK float64 (cap, 3) and HI int64 (cap, 2),
#   a min-heap of ((k1, k2, last access), (push id, node)) where
#   ``(k1, k2) = priority(N, x, pp)`` is the priority function at addresses *fa*
#   (:mod:`radixkv.policies._priority_fn`; SGLang's ``EvictionStrategy.get_priority``;
#   ties fall to the older last access, as ``UnifiedTreeNode.__lt__`` breaks ``heapq``
#   ties). A node's valid entry is the one whose push id equals ``N[x, F_VER]``. The
#   tree keeps the node statistics (``F_CREATED`` … ``F_TAG``) for keyed orders only.
#   HP is unused.
#
# Exactness of the lazy heaps: SGLang rebuilds its heap from all evictable leaves at each
# eviction call (``components/full.py :: _evict_device_start``). Here every evictable leaf
# has a valid heap entry with its current key: a node is (re)pushed whenever it becomes an
# evictable leaf and whenever a field its key reads changes while it is one (a touch, a
# hit count or priority update in an insert walk). So the minimum valid entry is SGLang's
# heap minimum, provided a priority reads only the node's row and *pp* (not the clock or
# other nodes), which is the contract of the hook. Ties between different nodes cannot
# happen in LRU order (every node's last access is a distinct stamp), so push ids, heap
# rebuilds and repeated pushes of one node never change which node is evicted.

#: an LRU order's empty keyed parts (read-only: no kernel writes them)
_NO_HK = np.zeros((0, 3), dtype=np.float64)
_NO_HI = np.zeros((0, 2), dtype=np.int64)
_NO_FA = np.zeros(2, dtype=np.int64)
_NO_PP = np.zeros(1, dtype=np.float64)
#: a keyed order's unused LRU heap
_NO_HP = np.zeros((1, 3), dtype=np.int64)


def lru_order(HP):
    """The LRU order value ``(HP, HK, HI, fa, pp)`` over the heap HP int64 (cap, 3) (module
    layout); its keyed parts are empty and ``fa`` is ``[0, 0]`` (no priority function)."""
    return (HP, _NO_HK, _NO_HI, _NO_FA, _NO_PP)


def keyed_order(HK, HI, fa, pp):
    """The keyed order value ``(HP, HK, HI, fa, pp)``: heap keys float64 (cap, 3), heap ids
    int64 (cap, 2), the priority function's addresses int64 (2,), nonzero
    (:func:`radixkv.policies._priority_fn.function_addresses`), its parameters float64 (k,);
    HP is an unused one-row LRU heap.

    Raises
    ------
    ValueError
        *fa* is not two nonzero addresses (an address of 0 means the LRU order)."""
    if fa.shape != (2,) or fa[0] == 0:
        raise ValueError(f"keyed_order: fa must be the two nonzero addresses of a priority function, got {fa!r}")
    return (_NO_HP, HK, HI, fa, pp)


# LRU heap ------------------------------------------------------------------------------

@njit(cache=True)
def _heap_less(HP, i, j):
    return HP[i, 0] < HP[j, 0] or (HP[i, 0] == HP[j, 0] and HP[i, 1] < HP[j, 1])


@njit(cache=True)
def _heap_swap(HP, i, j):
    for f in range(3):
        v = HP[i, f]
        HP[i, f] = HP[j, f]
        HP[j, f] = v


@njit(cache=True)
def _sift_down(HP, i, n):
    while True:
        a = 2 * i + 1
        if a >= n:
            return
        b = a + 1
        m = b if b < n and _heap_less(HP, b, a) else a
        if _heap_less(HP, m, i):
            _heap_swap(HP, i, m)
            i = m
        else:
            return


@njit(cache=True)
def _lru_rebuild(S, N, HP):
    k = _Z
    for x in range(1, S[S_HW]):
        if N[x, F_ALIVE] == 1 and N[x, F_LOCK] == 0 and N[x, F_NCHILD] == 0:
            S[S_PUSH] += 1
            HP[k, 0] = N[x, F_TIME]
            HP[k, 1] = S[S_PUSH]
            HP[k, 2] = x
            k += 1
    S[S_HLEN] = k
    for i in range(k // 2 - 1, -1, -1):
        _sift_down(HP, i, k)


@njit(cache=True)
def _lru_push(S, N, HP, x):
    if N[x, F_LOCK] == 0 and N[x, F_NCHILD] == 0 and N[x, F_PARENT] != -1:
        if S[S_HLEN] == HP.shape[0]:
            _lru_rebuild(S, N, HP)  # x is an evictable leaf: it is in the rebuilt heap
            return
        S[S_PUSH] += 1
        i = S[S_HLEN]
        S[S_HLEN] = i + 1
        HP[i, 0] = N[x, F_TIME]
        HP[i, 1] = S[S_PUSH]
        HP[i, 2] = x
        while i > 0:
            up = (i - 1) // 2
            if _heap_less(HP, i, up):
                _heap_swap(HP, i, up)
                i = up
            else:
                break


@njit(cache=True)
def _lru_victim(S, N, HP):
    while S[S_HLEN] > 0:
        n = S[S_HLEN] - 1
        t = HP[0, 0]
        x = HP[0, 2]
        if n > 0:
            for f in range(3):
                HP[0, f] = HP[n, f]
            _sift_down(HP, _Z, n)
        S[S_HLEN] = n
        if N[x, F_ALIVE] == 1 and N[x, F_LOCK] == 0 and N[x, F_NCHILD] == 0 and N[x, F_TIME] == t:
            return x
    return _M1


# keyed heap ----------------------------------------------------------------------------

@njit(cache=True)
def _key_less(HK, HI, i, j):
    for f in range(3):
        if HK[i, f] != HK[j, f]:
            return HK[i, f] < HK[j, f]
    return HI[i, 0] < HI[j, 0]


@njit(cache=True)
def _key_swap(HK, HI, i, j):
    for f in range(3):
        v = HK[i, f]
        HK[i, f] = HK[j, f]
        HK[j, f] = v
    for f in range(2):
        w = HI[i, f]
        HI[i, f] = HI[j, f]
        HI[j, f] = w


@njit(cache=True)
def _key_sift_down(HK, HI, i, n):
    while True:
        a = 2 * i + 1
        if a >= n:
            return
        b = a + 1
        m = b if b < n and _key_less(HK, HI, b, a) else a
        if _key_less(HK, HI, m, i):
            _key_swap(HK, HI, i, m)
            i = m
        else:
            return


@njit(cache=True)
def _evictable_leaf(N, x):
    return N[x, F_ALIVE] == 1 and N[x, F_LOCK] == 0 and N[x, F_NCHILD] == 0 and N[x, F_PARENT] != -1


@njit(cache=True)
def _key_fill(S, N, HK, HI, i, x, pf, pp):
    # full slices: plain arrays of the function's signature also when N, pp are borrowed
    # views (radixkv.policies._borrowed; a slice of one holds no reference)
    k1, k2 = pf(N[:], x, pp[:])
    S[S_PUSH] += 1
    HK[i, 0] = k1
    HK[i, 1] = k2
    HK[i, 2] = N[x, F_TIME]
    HI[i, 0] = S[S_PUSH]
    HI[i, 1] = x
    N[x, F_VER] = S[S_PUSH]


@njit(cache=True)
def _key_rebuild(S, N, HK, HI, fa, pp):
    pf = priority_at(fa)
    k = _Z
    for x in range(1, S[S_HW]):
        if N[x, F_ALIVE] == 1:
            N[x, F_VER] = 0
            if N[x, F_LOCK] == 0 and N[x, F_NCHILD] == 0:
                _key_fill(S, N, HK, HI, k, x, pf, pp)
                k += 1
    S[S_HLEN] = k
    for i in range(k // 2 - 1, -1, -1):
        _key_sift_down(HK, HI, i, k)


@njit(cache=True)
def _key_push(S, N, HK, HI, fa, pp, x):
    if not _evictable_leaf(N, x):
        return
    if S[S_HLEN] == HK.shape[0]:
        _key_rebuild(S, N, HK, HI, fa, pp)  # x is an evictable leaf: it is in the rebuilt heap
        return
    i = S[S_HLEN]
    S[S_HLEN] = i + 1
    _key_fill(S, N, HK, HI, i, x, priority_at(fa), pp)
    while i > 0:
        up = (i - 1) // 2
        if _key_less(HK, HI, i, up):
            _key_swap(HK, HI, i, up)
            i = up
        else:
            break


@njit(cache=True)
def _key_victim(S, N, HK, HI):
    while S[S_HLEN] > 0:
        n = S[S_HLEN] - 1
        ver = HI[0, 0]
        x = HI[0, 1]
        if n > 0:
            for f in range(3):
                HK[0, f] = HK[n, f]
            for f in range(2):
                HI[0, f] = HI[n, f]
            _key_sift_down(HK, HI, _Z, n)
        S[S_HLEN] = n
        if N[x, F_VER] == ver and _evictable_leaf(N, x):
            N[x, F_VER] = 0
            return x
    return _M1


# the operations ------------------------------------------------------------------------

@njit(cache=True)
def order_keyed(o):
    """Whether *o* is a keyed order (the tree then keeps the node statistics)."""
    return o[3][0] != 0


@njit(cache=True)
def order_push(S, N, o, x):
    """Push node *x* with its current key when it is an evictable leaf."""
    if o[3][0] == 0:
        _lru_push(S, N, o[0], x)
    else:
        _key_push(S, N, o[1], o[2], o[3], o[4], x)


@njit(cache=True)
def order_victim(S, N, o):
    """Pop the next evictable leaf (stale entries are dropped): its node, or −1 when none."""
    if o[3][0] == 0:
        return _lru_victim(S, N, o[0])
    return _key_victim(S, N, o[1], o[2])


@njit(cache=True)
def order_rebuild(S, N, o):
    """Replace the heap by one entry per evictable leaf (drops stale entries)."""
    if o[3][0] == 0:
        _lru_rebuild(S, N, o[0])
    else:
        _key_rebuild(S, N, o[1], o[2], o[3], o[4])


@njit(cache=True)
def heap_rebuild(S, N, o):
    """:func:`order_rebuild` (a kernel: callable from Python)."""
    order_rebuild(S, N, o)


# ---------------------------------------------------------------------------------------
# Tree operations
# ---------------------------------------------------------------------------------------

@njit(cache=True)
def _set_keys(S, N, G, Q, x):
    s = N[x, F_SEQ]
    off = Q[s, Q_OFF]
    n = Q[s, Q_LEN]
    qid = G[0, off:off + n]
    qend = G[1, off:off + n]
    t = N[x, F_START]
    k1, k2 = child_key(qid, qend, t, S[S_P])
    N[x, F_K1] = k1
    N[x, F_K2] = k2
    t1, t2 = token_key(qid, qend, t)
    N[x, F_T1] = t1
    N[x, F_T2] = t2


@njit(cache=True)
def _attach(S, N, H1, H2, parent, x):
    N[x, F_PARENT] = parent
    _h_insert(H1, parent, N[x, F_K1], N[x, F_K2], x)
    if S[S_P] > 1:
        _h_insert(H2, parent, N[x, F_T1], N[x, F_T2], x)
    N[parent, F_NCHILD] += 1


@njit(cache=True)
def _detach(S, N, H1, H2, parent, x):
    _h_delete(H1, parent, N[x, F_K1], N[x, F_K2], x)
    if S[S_P] > 1:
        _h_delete(H2, parent, N[x, F_T1], N[x, F_T2], x)
    N[parent, F_NCHILD] -= 1


@njit(cache=True)
def _new_node(S, N, Q, seq, start, end):
    x = S[S_NFREE]
    if x != -1:
        S[S_NFREE] = N[x, F_PARENT]
    else:
        x = S[S_HW]
        S[S_HW] = x + 1
    for f in range(NF):
        N[x, f] = 0
    N[x, F_PARENT] = -1
    N[x, F_SEQ] = seq
    N[x, F_START] = start
    N[x, F_END] = end
    N[x, F_ALIVE] = 1
    Q[seq, Q_REFS] += 1
    return x


@njit(cache=True)
def _seq_decref(S, Q, s):
    Q[s, Q_REFS] -= 1
    if Q[s, Q_REFS] == 0:
        S[S_GGARB] += Q[s, Q_LEN]
        Q[s, Q_OFF] = -1
        Q[s, Q_NEXT] = S[S_QFREE]
        S[S_QFREE] = s


@njit(cache=True)
def register_seq(S, G, Q, sid, send):
    """Copy a sequence into the store (room checked by the caller); one reference."""
    s = S[S_QFREE]
    if s != -1:
        S[S_QFREE] = Q[s, Q_NEXT]
    else:
        s = S[S_QHW]
        S[S_QHW] = s + 1
    off = S[S_GUSED]
    n = sid.shape[0]
    # loops over slices (indices from the loop's range): the compiler vectorises them
    g0 = G[0, off:off + n]
    g1 = G[1, off:off + n]
    for k in range(n):
        g0[k] = sid[k]
    for k in range(n):
        g1[k] = send[k]
    S[S_GUSED] = off + n
    Q[s, Q_OFF] = off
    Q[s, Q_LEN] = n
    Q[s, Q_REFS] = 1
    Q[s, Q_NEXT] = -1
    return s


@njit(cache=True)
def compact_store(S, G, Q):
    """Move the live sequences of the store to its start, back to back, in place."""
    live = np.empty(S[S_QHW], dtype=np.int64)
    n_live = 0
    for s in range(S[S_QHW]):
        if Q[s, Q_REFS] > 0:
            live[n_live] = s
            n_live += 1
    offs = np.empty(n_live, dtype=np.int64)
    for k in range(n_live):
        offs[k] = Q[live[k], Q_OFF]
    u = 0
    for k in np.argsort(offs):  # ascending offsets: a move never overwrites live data
        s = live[k]
        off = Q[s, Q_OFF]
        n = Q[s, Q_LEN]
        if off != u:  # u < off: a forward copy reads each element before it is overwritten
            for r in range(2):
                src = G[r, off:off + n]
                dst = G[r, u:u + n]
                for t in range(n):
                    dst[t] = src[t]
        Q[s, Q_OFF] = u
        u += n
    S[S_GUSED] = u
    S[S_GGARB] = 0
    S[S_NCOMPACT] += 1


@njit(cache=True)
def rehash(S, N, H1, H2):
    """Fill empty tables *H1*, *H2* from the live nodes."""
    for x in range(1, S[S_HW]):
        if N[x, F_ALIVE] == 1:
            _h_insert(H1, N[x, F_PARENT], N[x, F_K1], N[x, F_K2], x)
            if S[S_P] > 1:
                _h_insert(H2, N[x, F_PARENT], N[x, F_T1], N[x, F_T2], x)


@njit(cache=True)
def _split(S, N, H1, H2, o, G, Q, child, at):
    """``_split_node``: the upper half inherits the lock (and, for a keyed order, the hit
    count, priority, creation time, T-LRU history and tag); fresh last access for the
    upper node, then for the suffix."""
    parent = N[child, F_PARENT]
    upper = _new_node(S, N, Q, N[child, F_SEQ], N[child, F_START], at)
    N[upper, F_LOCK] = N[child, F_LOCK]
    for f in (F_K1, F_K2, F_T1, F_T2):  # the upper half keeps the child's keys
        N[upper, f] = N[child, f]
    if order_keyed(o):
        for f in (F_CREATED, F_HITS, F_PRIO, F_HIST, F_TAG):
            N[upper, f] = N[child, f]
    _detach(S, N, H1, H2, parent, child)
    _attach(S, N, H1, H2, parent, upper)
    N[child, F_START] = at
    _set_keys(S, N, G, Q, child)
    _attach(S, N, H1, H2, upper, child)
    N[upper, F_TIME] = _tick(S)  # new node: fresh draw
    N[child, F_TIME] = _tick(S)  # the suffix half is "used now"
    order_push(S, N, o, child)
    S[S_NNODES] += 1
    return upper


@njit(cache=True)
def match_plan(S, N, H1, G, Q, qid, qend, K):
    """Read-only lookup of the first *K* tokens: (hit, last whole node, split node or −1,
    tokens of unlocked nodes the match would lock)."""
    p = S[S_P]
    node = _Z
    pos = _Z
    gain = 0
    while pos < K:
        c = _find_child(S, N, H1, G, Q, node, qid, qend, _M1, pos)
        if c == -1:
            break
        end = N[c, F_END]
        m = _lcp(N, G, Q, c, qid, qend, _M1, pos, min(end, K))
        if p > 1:
            m = pos + (m - pos) // p * p
        if m < end:
            if N[c, F_LOCK] == 0:
                gain += m - N[c, F_START]
            return m, node, c, gain
        if N[c, F_LOCK] == 0:
            gain += end - N[c, F_START]
        node = c
        pos = end
    return pos, node, -1, gain


@njit(cache=True)
def token_walk(S, N, H1, H2, G, Q, qid, qend, qref, node, pos, limit):
    """Read-only token-level match of ``[pos, limit)`` below *node* (which ends at
    *pos*); returns the end of the match. With p > 1 a partial first page is found
    through the children's first-token index *H2*."""
    p = S[S_P]
    while pos < limit:
        c = -1
        if p == 1 or limit - pos >= p:
            c = _find_child(S, N, H1, G, Q, node, qid, qend, qref, pos)
        if c != -1:
            end = N[c, F_END]
            m = _lcp(N, G, Q, c, qid, qend, qref, pos, min(end, limit))
            if m == end:
                node = c
                pos = m
                continue
            return m
        if p > 1:
            best = pos
            t1, t2 = token_key(qid, qend, pos)
            mask = H2.shape[0] - 1
            i = _hslot(H2, node, t1, t2)
            while H2[i, 3] != -1:
                if H2[i, 0] == node and H2[i, 1] == t1 and H2[i, 2] == t2:
                    c = H2[i, 3]
                    m = _lcp(N, G, Q, c, qid, qend, qref, pos, min(N[c, F_END], limit))
                    if m > best:
                        best = m
                i = (i + 1) & mask
            return best
        return pos
    return pos


@njit(cache=True)
def token_walk_seq(S, N, H1, H2, G, Q, s, node, pos, limit):
    """:func:`token_walk` of stored sequence *s*."""
    off = Q[s, Q_OFF]
    n = Q[s, Q_LEN]
    return token_walk(S, N, H1, H2, G, Q, G[0, off:off + n], G[1, off:off + n], s, node, pos, limit)


@njit(cache=True)
def _walked(N, o, x, ins_len, prio):
    """An insert walked node *x* (after its split), keyed orders: ``node.priority =
    max(...)`` and ``_finish_insert_walk_node``'s hit count (only past what the request
    had inserted)."""
    if order_keyed(o):
        if N[x, F_END] > ins_len:
            N[x, F_HITS] += 1
        if prio > N[x, F_PRIO]:
            N[x, F_PRIO] = prio


@njit(cache=True)
def _insert(S, N, H1, H2, o, G, Q, s, L, known, ins_len, prio, tag):
    """Insert tokens ``[0, L)`` of stored sequence *s* (L page-aligned): (overlap, target).

    *known*: a node whose path from the root holds the sequence's tokens (the request's
    locked node), or 0. *ins_len*, *prio*, *tag*: the request's inserted length,
    priority and tag (node statistics of keyed orders)."""
    off = Q[s, Q_OFF]
    n = Q[s, Q_LEN]
    qid = G[0, off:off + n]
    qend = G[1, off:off + n]
    p = S[S_P]
    node = _Z
    pos = _Z
    if known != 0 and L > 0:
        # the path root -> *known* holds this sequence's tokens: the walk below would
        # find exactly these nodes and match each in full, so it runs without comparing
        x = known
        while x != 0:
            N[N[x, F_PARENT], F_DOWN] = x
            x = N[x, F_PARENT]
        c = _Z
        while c != known:
            c = N[c, F_DOWN]
            N[c, F_TIME] = _tick(S)
            end = N[c, F_END]
            if L < end:
                node = _split(S, N, H1, H2, o, G, Q, c, L)
                _walked(N, o, node, ins_len, prio)
                pos = L
                break
            _walked(N, o, c, ins_len, prio)
            order_push(S, N, o, c)
            node = c
            pos = end
            if pos >= L:
                break
    while pos < L:
        c = _find_child(S, N, H1, G, Q, node, qid, qend, s, pos)
        if c == -1:
            break
        N[c, F_TIME] = _tick(S)
        end = N[c, F_END]
        m = _lcp(N, G, Q, c, qid, qend, s, pos, min(end, L))
        if p > 1:
            m = pos + (m - pos) // p * p
        if m < end:
            node = _split(S, N, H1, H2, o, G, Q, c, m)
            _walked(N, o, node, ins_len, prio)
            pos = m
            break
        _walked(N, o, c, ins_len, prio)
        order_push(S, N, o, c)
        node = c
        pos = end
    overlap = pos
    if pos < L:
        leaf = _new_node(S, N, Q, s, pos, L)
        _set_keys(S, N, G, Q, leaf)
        _attach(S, N, H1, H2, node, leaf)
        N[leaf, F_TIME] = _tick(S)
        if order_keyed(o):
            N[leaf, F_CREATED] = _tick(S)  # ``UnifiedTreeNode.__init__``: a second draw
            N[leaf, F_PRIO] = prio
            N[leaf, F_TAG] = tag
            N[leaf, F_HITS] = 1 if L > ins_len else 0
            # ``_set_tlru_lens_and_raise_history``: the branch's high-water depth
            N[leaf, F_HIST] = L
            a = node
            while a != 0 and N[a, F_HIST] < L:
                N[a, F_HIST] = L
                a = N[a, F_PARENT]
        S[S_EVTOK] += L - pos
        S[S_NNODES] += 1
        order_push(S, N, o, leaf)
        node = leaf
    return overlap, node


@njit(cache=True)
def _inc_lock(S, N, x):
    while x != 0:
        if N[x, F_LOCK] == 0:
            n = N[x, F_END] - N[x, F_START]
            S[S_EVTOK] -= n
            S[S_PROT] += n
        N[x, F_LOCK] += 1
        x = N[x, F_PARENT]


@njit(cache=True)
def _dec_lock(S, N, o, x):
    while x != 0:
        N[x, F_LOCK] -= 1
        if N[x, F_LOCK] == 0:
            n = N[x, F_END] - N[x, F_START]
            S[S_EVTOK] += n
            S[S_PROT] -= n
            order_push(S, N, o, x)
        x = N[x, F_PARENT]


@njit(cache=True)
def _evict(S, N, H1, H2, o, Q, num_tokens):
    """Evict whole leaves, smallest in order *o* first, until *num_tokens* tokens are freed."""
    freed = 0
    p = S[S_P]
    while freed < num_tokens:
        x = order_victim(S, N, o)
        if x == -1:
            break
        parent = N[x, F_PARENT]
        _detach(S, N, H1, H2, parent, x)
        N[x, F_ALIVE] = 0
        n = N[x, F_END] - N[x, F_START]
        _seq_decref(S, Q, N[x, F_SEQ])
        N[x, F_PARENT] = S[S_NFREE]
        S[S_NFREE] = x
        freed += n
        S[S_EVTOK] -= n
        S[S_FREE] += n // p
        S[S_NNODES] -= 1
        S[S_EVN] += 1
        order_push(S, N, o, parent)
    S[S_EVTOT] += freed
    return freed


@njit(cache=True)
def _evict_for(S, N, H1, H2, o, Q, need):
    avail = S[S_FREE] * S[S_P]
    if need > avail:
        return _evict(S, N, H1, H2, o, Q, need - avail)
    return 0


@njit(cache=True)
def _alloc(S, R, end):
    p = S[S_P]
    slots = -(-end // p) - -(-R[R_COMP] // p)
    S[S_FREE] -= slots
    S[S_PRIV] += slots
    R[R_COMP] = end


@njit(cache=True)
def _checkpoint(S, N, H1, H2, o, G, Q, R, L):
    overlap, target = _insert(S, N, H1, H2, o, G, Q, R[R_SEQ], L, R[R_NODE], R[R_INS], R[R_PRI], R[R_TAG])
    if L > R[R_INS]:
        R[R_INS] = L
    if L > R[R_OWNED]:
        p = S[S_P]
        dup = (overlap - R[R_OWNED]) // p
        S[S_FREE] += dup
        S[S_PRIV] -= dup + (L - overlap) // p
        R[R_OWNED] = L
    return target


@njit(cache=True)
def _after_prefill(S, N, H1, H2, o, G, Q, R):
    if S[S_DEFER] == 0:
        commit(S, N, H1, H2, o, G, Q, R)


@njit(cache=True)
def commit(S, N, H1, H2, o, G, Q, R):
    """Checkpoint a prefill: insert the computed prefix (page-aligned) unless the
    request is past its prompt or ends with it; move the lock to the new node."""
    P = R[R_PLEN]
    c = R[R_COMP]
    if c > P or (c == P and R[R_KVMAX] == P):
        return
    p = S[S_P]
    target = _checkpoint(S, N, H1, H2, o, G, Q, R, c // p * p)
    if target != R[R_NODE]:
        _inc_lock(S, N, target)
        _dec_lock(S, N, o, R[R_NODE])
        R[R_NODE] = target


@njit(cache=True)
def admit(S, N, H1, H2, o, G, Q, R, sid, send, P, n_tokens, prio, tag):
    """Lookup, room check, split, LRU stamp, lock, evict, allocate, checkpoint.

    *sid*, *send*: the request's KV content (stored on success). *n_tokens* < 0: the
    default target. *prio*: the request's priority, *tag*: copied to the nodes it
    creates (keyed orders). Returns (admitted, hit, held, evicted); R is filled on success.
    """
    p = S[S_P]
    chunk = S[S_CHUNK]
    K = (P - 1) // p * p
    hit, last, split, gain = match_plan(S, N, H1, G, Q, sid, send, K)
    if p > 1:
        held = token_walk(S, N, H1, H2, G, Q, sid, send, _M1, _Z, _Z, P)
    elif hit < K:
        held = hit  # the token walk to P stops where the lookup did
    elif split != -1:  # the lookup ended inside *split*: go on from there
        end = N[split, F_END]
        held = _lcp(N, G, Q, split, sid, send, _M1, K, min(end, P))
        if held == end:
            held = token_walk(S, N, H1, H2, G, Q, sid, send, _M1, split, end, P)
    else:
        held = token_walk(S, N, H1, H2, G, Q, sid, send, _M1, last, K, P)
    if n_tokens < 0:
        # first chunk (``PrefillAdder._select_prefill_admission``): the chunk size rounded
        # down to a page, the end on the page grid (*hit* is page-aligned)
        target = P
        first = chunk // p * p
        if chunk > 0 and P - hit > first:
            target = hit + first
    else:
        target = max(n_tokens, hit)
    new_slots = -(-target // p) - hit // p
    if new_slots > S[S_FREE] + (S[S_EVTOK] - gain) // p:
        return False, hit, held, _Z
    # the request's tokens before the hit are never read from the store (its inserts
    # walk its locked path without comparing): store from the segment before the one
    # holding position *hit*, whose end gives that segment's start
    f = _seg_index(send, hit)
    f = f - 1 if f > 0 else 0
    s = register_seq(S, G, Q, sid[f:], send[f:])
    if split != -1:
        last = _split(S, N, H1, H2, o, G, Q, split, hit)
    if K > 0:
        cur = _tick(S)
        x = last
        k = 0
        while x != 0:
            N[x, F_TIME] = cur - k
            k += 1
            x = N[x, F_PARENT]
        order_push(S, N, o, last)
    _inc_lock(S, N, last)
    extra = p if p > 1 else 0
    ev = _evict_for(S, N, H1, H2, o, Q, target - hit + extra)
    R[R_NODE] = last
    R[R_OWNED] = hit
    R[R_COMP] = hit
    R[R_KVMAX] = send[send.shape[0] - 1]
    R[R_SEQ] = s
    R[R_PLEN] = P
    R[R_INS] = 0
    R[R_PRI] = prio
    R[R_TAG] = tag
    _alloc(S, R, target)
    R[R_EVICTED] = ev
    _after_prefill(S, N, H1, H2, o, G, Q, R)
    return True, hit, held, ev


@njit(cache=True)
def _decode(S, N, H1, H2, o, Q, R, end):
    p = S[S_P]
    q = R[R_COMP]
    while q < end:
        if S[S_FREE] == 0:
            R[R_EVICTED] += _evict(S, N, H1, H2, o, Q, p)
        first_b = -(-q // p) * p
        nb = 0 if first_b >= end else (end - 1 - first_b) // p + 1
        if nb < S[S_FREE] or nb == 0:
            S[S_FREE] -= nb
            S[S_PRIV] += nb
            q = end
        else:
            F = S[S_FREE]
            if F == 0:  # excluded by the room check in ``extend``
                return False
            S[S_FREE] = 0
            S[S_PRIV] += F
            q = first_b + (F - 1) * p + 1
    R[R_COMP] = end
    return True


@njit(cache=True)
def extend(S, N, H1, H2, o, G, Q, R, n_tokens):
    """Compute *n_tokens* more tokens (end ≤ kv_max checked by the caller). Returns 1,
    0 (no room, state unchanged) or −1 (decode found no page: cannot happen)."""
    p = S[S_P]
    end = R[R_COMP] + n_tokens
    need = -(-end // p) - -(-R[R_COMP] // p)
    if need > S[S_FREE] + S[S_EVTOK] // p:
        return 0
    P = R[R_PLEN]
    chunk = S[S_CHUNK]
    extra = p if p > 1 else 0
    while R[R_COMP] < P and R[R_COMP] < end:
        step = min(end, P) - R[R_COMP]
        # a continuing chunk (``PrefillAdder.add_chunked_req``) takes the chunk size as
        # is, not rounded to a page: with a size that is not a multiple of p its end
        # leaves the page grid (the checkpoint inserts the whole pages before it)
        if chunk > 0 and step > chunk:
            step = chunk
        R[R_EVICTED] += _evict_for(S, N, H1, H2, o, Q, step + extra)
        _alloc(S, R, R[R_COMP] + step)
        _after_prefill(S, N, H1, H2, o, G, Q, R)
    if R[R_COMP] < end:
        if not _decode(S, N, H1, H2, o, Q, R, end):
            return -1
    return 1


@njit(cache=True)
def release(S, N, o, Q, R):
    """Free the request's private slots, unlock its path, drop its sequence reference."""
    p = S[S_P]
    slots = -(-R[R_COMP] // p) - R[R_OWNED] // p
    S[S_FREE] += slots
    S[S_PRIV] -= slots
    _dec_lock(S, N, o, R[R_NODE])
    _seq_decref(S, Q, R[R_SEQ])
    if S[S_HLEN] > 4 * S[S_NNODES] + 1024:
        order_rebuild(S, N, o)


@njit(cache=True)
def finish(S, N, H1, H2, o, G, Q, R):
    """Insert the KV computed, then the prompt (when it ends before that KV); free the
    rest; unlock.

    ``checkpoint_into_tree``: the prompt is inserted again, with priority + 1 and counted
    as already inserted, only when it ends before the KV inserted (a prompt that does not
    end before it would walk the path just inserted: for LRU a second touch of the same
    nodes in the same order, which changes no eviction; for a keyed order SGLang skips it)."""
    p = S[S_P]
    L = R[R_COMP] // p * p
    _checkpoint(S, N, H1, H2, o, G, Q, R, L)
    Pal = R[R_PLEN] // p * p
    if 0 < Pal < L:
        _insert(S, N, H1, H2, o, G, Q, R[R_SEQ], Pal, R[R_NODE], Pal, R[R_PRI] + 1, R[R_TAG])
    release(S, N, o, Q, R)


@njit(cache=True)
def run_request(S, N, H1, H2, o, G, Q, R, sid, send, P, prio, tag):
    """admit, extend to the KV extent, finish, in one call: (status, hit, held, evicted,
    evicted tokens in total, evictions in total);
    status 1 done, 0 refused at admission, 2 refused at extension (finished), −1 decode
    found no page."""
    ok, hit, held, ev = admit(S, N, H1, H2, o, G, Q, R, sid, send, P, _M1, prio, tag)
    if not ok:
        return _Z, hit, held, ev, S[S_EVTOT], S[S_EVN]
    status = np.int64(1)
    if R[R_COMP] < R[R_KVMAX]:
        e = extend(S, N, H1, H2, o, G, Q, R, R[R_KVMAX] - R[R_COMP])
        if e < 0:
            return _M1, hit, held, ev, S[S_EVTOT], S[S_EVN]
        if e == 0:
            status = np.int64(2)
    finish(S, N, H1, H2, o, G, Q, R)
    return status, hit, held, ev, S[S_EVTOT], S[S_EVN]


# ---------------------------------------------------------------------- entries from Python
# RadixCache's Python methods call these: each borrows the tree's arrays, the eviction order's
# and the request's row (radixkv.policies._borrowed) and calls the kernel it is named after.
# That kernel, and all it inlines, then compiles once per eviction-order type, for borrowed
# views, whoever calls it: the sequential span and the compiled concurrent loop borrow the same.

@njit(cache=True)
def py_commit(S, N, H1, H2, o, G, Q, R):
    """:func:`commit` on borrowed views (same arguments)."""
    commit(borrow(S), borrow(N), borrow(H1), borrow(H2), borrow_each(o), borrow(G), borrow(Q), borrow(R))


@njit(cache=True)
def py_admit(S, N, H1, H2, o, G, Q, R, sid, send, P, n_tokens, prio, tag):
    """:func:`admit` on borrowed views (same arguments and result)."""
    return admit(borrow(S), borrow(N), borrow(H1), borrow(H2), borrow_each(o), borrow(G), borrow(Q), borrow(R), sid,
                 send, P, n_tokens, prio, tag)


@njit(cache=True)
def py_extend(S, N, H1, H2, o, G, Q, R, n_tokens):
    """:func:`extend` on borrowed views (same arguments and result)."""
    return extend(borrow(S), borrow(N), borrow(H1), borrow(H2), borrow_each(o), borrow(G), borrow(Q), borrow(R),
                  n_tokens)


@njit(cache=True)
def py_release(S, N, o, Q, R):
    """:func:`release` on borrowed views (same arguments)."""
    release(borrow(S), borrow(N), borrow_each(o), borrow(Q), borrow(R))


@njit(cache=True)
def py_finish(S, N, H1, H2, o, G, Q, R):
    """:func:`finish` on borrowed views (same arguments)."""
    finish(borrow(S), borrow(N), borrow(H1), borrow(H2), borrow_each(o), borrow(G), borrow(Q), borrow(R))


@njit(cache=True)
def py_run_request(S, N, H1, H2, o, G, Q, R, sid, send, P, prio, tag):
    """:func:`run_request` on borrowed views (same arguments and result)."""
    return run_request(borrow(S), borrow(N), borrow(H1), borrow(H2), borrow_each(o), borrow(G), borrow(Q),
                       borrow(R), sid, send, P, prio, tag)
