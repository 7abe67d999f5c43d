"""A set of 64-bit keys on one int64 array (Numba): open addressing, linear probing.

For kernels that must remember millions of well-mixed 64-bit keys (chained block or page
hashes) at 8 bytes a slot, where a Python ``set`` or ``dict`` costs about 60–100 bytes a
key and a bytecode loop per key. Used by the miss-cause shadow replays
(:mod:`radixkv.replay._miss_kernels`) and SGLang HiCache's L3 page store
(:mod:`radixkv.policies.hicache_store`).

Layout
------
``keys`` : np.ndarray, int64, shape (cap,), cap a power of two; a free slot holds 0. The
key 0 itself cannot be stored in the table, so the set keeps it in a flag, ``zero[0]``
(np.ndarray, int64, shape (1,): 1 when 0 is in the set). A key's probe starts at its low
bits (``key & (cap − 1)``), so keys must be well mixed (a hash's output). There is no
deletion. The caller keeps the load at most a fraction it chooses (the miss kernels: 1/2;
the L3 store: 3/4) and moves to a table twice the size with :func:`regrow`.
"""
from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True)
def slot_of(keys, key):
    """Slot of 64-bit *key* ≠ 0 (np.uint64) in *keys*; the first free slot on its probe
    path when absent (then ``keys[slot] == 0``)."""
    mask = keys.shape[0] - 1
    i = np.int64(key & np.uint64(mask))
    ik = np.int64(key)
    while True:
        k = keys[i]
        if k == ik or k == 0:
            return i
        i = (i + 1) & mask


@nb.njit(cache=True)
def regrow(keys, keys2):
    """Insert every key of table *keys* into the empty table *keys2* (larger, power of two)."""
    for i in range(keys.shape[0]):
        if keys[i] != 0:
            keys2[slot_of(keys2, np.uint64(keys[i]))] = keys[i]


@nb.njit(cache=True)
def contains(keys, zero, key):
    """Whether 64-bit *key* (np.uint64) is in the set (the table *keys*, or ``zero[0]`` for 0)."""
    if key == np.uint64(0):
        return zero[0] != 0
    return keys[slot_of(keys, key)] != 0


@nb.njit(cache=True)
def add(keys, zero, key):
    """Add 64-bit *key* (np.uint64); returns 1 when it was new, else 0. The caller keeps
    room (the table must hold a free slot)."""
    if key == np.uint64(0):
        if zero[0] != 0:
            return 0
        zero[0] = 1
        return 1
    i = slot_of(keys, key)
    if keys[i] != 0:
        return 0
    keys[i] = np.int64(key)
    return 1
