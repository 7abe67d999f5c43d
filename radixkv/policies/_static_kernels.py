"""Numba kernels of :class:`radixkv.policies.static_reserved.StaticReservedCache`: one LRU
list of block keys.

The cache part of the static pool is an ordered set of 64-bit block keys, least recently
used first: a doubly linked list of nodes plus an open-addressing index from key to
node. Every operation a request needs (lookup, refresh, insert-then-evict) is one kernel
call over a run of the request's keys, so a request costs a few calls whatever its
length, and the cache costs 16 bytes per node (key and two int32 links) plus 32–64 bytes
of index per node, instead of a Python ``OrderedDict`` entry per block.

Arrays (owned by the class):

``nk`` : int64, shape (M,)
    Node keys (uint64 bits).
``nl`` : int32, shape (2, M)
    ``nl[0]`` previous node (−1 = none: the least recent), ``nl[1]`` next node (−1 =
    none: the most recent); for a free node, ``nl[1]`` links the free list.
``tab`` : int64, shape (T, 2), T a power of two ≥ 2 M
    Open-addressing index (linear probing, backward-shift deletion): row ``(key, node +
    1)``, node + 1 = 0 for an empty row; the key sits in the row so that a probe reads one
    cache line. A key's home row is ``key & (T − 1)`` (keys are already well-mixed 64-bit
    hashes).
``st`` : int64, shape (NST,)
    ``LEN`` nodes in the list, ``HEAD`` least recent node, ``TAIL`` most recent node,
    ``FREE`` first free node (−1 = none), ``BUMP`` nodes ever handed out.

M = the cache's capacity in blocks plus the most blocks one call inserts before it
evicts (the class grows the arrays before a call that could need more).
"""
from __future__ import annotations

import numpy as np
from numba import njit

LEN = 0
HEAD = 1
TAIL = 2
FREE = 3
BUMP = 4
NST = 5


@njit(cache=True)
def init(st):
    """An empty list."""
    st[LEN] = 0
    st[HEAD] = -1
    st[TAIL] = -1
    st[FREE] = -1
    st[BUMP] = 0


@njit(cache=True, inline="always")
def _find(nk, tab, key):
    """Node holding *key*, or −1."""
    mask = tab.shape[0] - 1
    i = key & mask
    while tab[i, 1] != 0:
        if tab[i, 0] == key:
            return tab[i, 1] - 1
        i = (i + 1) & mask
    return -1


@njit(cache=True, inline="always")
def _tab_probe(tab, key):
    """Row of *key* (≥ 0), or −1 − (the empty row where it would go). Any table of this
    layout (int64, shape (T, 2), T a power of two; row ``(key, value + 1)``, 0 = empty)."""
    mask = tab.shape[0] - 1
    i = key & mask
    while tab[i, 1] != 0:
        if tab[i, 0] == key:
            return i
        i = (i + 1) & mask
    return -1 - i


@njit(cache=True, inline="always")
def _tab_delete_row(tab, i):
    """Empty the occupied row *i* and close the gap (backward-shift deletion, Knuth vol. 3,
    6.4 R); the table layout of :func:`_tab_probe`."""
    mask = tab.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if tab[j, 1] == 0:
            break
        k = tab[j, 0] & mask
        # move j into the hole i unless its home k lies cyclically in (i, j]
        if i <= j:
            stay = i < k <= j
        else:
            stay = k > i or k <= j
        if not stay:
            tab[i, 0] = tab[j, 0]
            tab[i, 1] = tab[j, 1]
            i = j
    tab[i, 0] = 0
    tab[i, 1] = 0


@njit(cache=True, inline="always")
def _tab_delete(tab, key):
    """Remove *key*'s row (present) and close the gap (backward-shift deletion)."""
    mask = tab.shape[0] - 1
    i = key & mask
    while tab[i, 0] != key or tab[i, 1] == 0:
        i = (i + 1) & mask
    _tab_delete_row(tab, i)


@njit(cache=True, inline="always")
def _unlink(nl, st, x):
    p = nl[0, x]
    n = nl[1, x]
    if p >= 0:
        nl[1, p] = n
    else:
        st[HEAD] = n
    if n >= 0:
        nl[0, n] = p
    else:
        st[TAIL] = p


@njit(cache=True, inline="always")
def _append(nl, st, x):
    t = st[TAIL]
    nl[0, x] = t
    nl[1, x] = -1
    if t >= 0:
        nl[1, t] = x
    else:
        st[HEAD] = x
    st[TAIL] = x


@njit(cache=True)
def found(nk, tab, keys, lo, hi):
    """First ``j`` in ``[lo, hi)`` whose key is not cached (``hi`` when all are)."""
    j = lo
    while j < hi and _find(nk, tab, keys[j]) >= 0:
        j += 1
    return j


@njit(cache=True)
def touch(nk, nl, tab, st, keys, n):
    """Make ``keys[n−1], …, keys[0]`` (all cached) the most recent, in that order."""
    for j in range(n - 1, -1, -1):
        x = _find(nk, tab, keys[j])
        if x != st[TAIL]:
            _unlink(nl, st, x)
            _append(nl, st, x)


@njit(cache=True)
def insert(nk, nl, tab, st, keys, lo, hi, capacity):
    """Refresh or append ``keys[hi−1], …, keys[lo]`` in that order, then evict the least
    recent keys while more than *capacity* are cached; returns the number evicted.

    The caller guarantees room for ``hi − lo`` nodes beyond *capacity*.
    """
    mask = tab.shape[0] - 1
    for j in range(hi - 1, lo - 1, -1):
        key = keys[j]
        i = key & mask
        x = -1
        while tab[i, 1] != 0:
            if tab[i, 0] == key:
                x = tab[i, 1] - 1
                break
            i = (i + 1) & mask
        if x >= 0:
            if x != st[TAIL]:
                _unlink(nl, st, x)
                _append(nl, st, x)
            continue
        if st[FREE] >= 0:
            x = st[FREE]
            st[FREE] = nl[1, x]
        else:
            x = st[BUMP]
            st[BUMP] = x + 1
        nk[x] = key
        tab[i, 0] = key
        tab[i, 1] = x + 1
        _append(nl, st, x)
        st[LEN] += 1
    ev = 0
    while st[LEN] > capacity:
        x = st[HEAD]
        _unlink(nl, st, x)
        _tab_delete(tab, nk[x])
        nl[1, x] = st[FREE]
        st[FREE] = x
        st[LEN] -= 1
        ev += 1
    return ev


@njit(cache=True)
def rebuild(nk, nl, st, tab):
    """Fill an empty index *tab* with the listed nodes (after the arrays grew)."""
    mask = tab.shape[0] - 1
    x = st[HEAD]
    while x >= 0:
        i = nk[x] & mask
        while tab[i, 1] != 0:
            i = (i + 1) & mask
        tab[i, 0] = nk[x]
        tab[i, 1] = x + 1
        x = nl[1, x]


def table_rows(nodes: int) -> int:
    """Index rows for *nodes* nodes: a power of two ≥ 2 × nodes (load ≤ 1/2), at least 8."""
    t = 8
    while t < 2 * nodes:
        t *= 2
    return t


def empty_state() -> np.ndarray:
    """A fresh ``st`` array."""
    st = np.zeros(NST, dtype=np.int64)
    init(st)
    return st
