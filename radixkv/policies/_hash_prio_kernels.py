"""Numba kernels of the vLLM block pool evicting by a policy-defined priority (the hook).

The built-in :class:`~radixkv.policies.block_hash.BlockHashCache` evicts through vLLM's
free queue (:mod:`radixkv.policies._hash_kernels`, left untouched). vLLM's queue always
holds every free block *without* a key before every free block *with* one (the pool
starts with keyless blocks; ``free_blocks`` prepends keyless blocks and appends hashed
ones; a key is dropped only when its block leaves the queue), so taking a block is:
the first keyless free block if there is one, else evicting the oldest released hashed
block. This module keeps the keyless part as vLLM's linked list and puts the hashed free
blocks in a heap ordered by ``(k1, k2, release time, push id)``, ``(k1, k2) =
priority(E, b, params)`` — a jitted function of the block's statistics row ``E[b]``
(signature :data:`~radixkv.policies._priority_fn.PRIORITY_SIG`, passed as its
addresses like the radix hook). With the priority ``(release time, 0)`` the order is
vLLM's exactly.

``E`` : int64, shape (nb, NE): per block
    ``E_TIME`` release time (a counter draw when its ref_cnt reached 0 with a key: vLLM's
    free-queue order); ``E_HITS`` hits served since it got its key; ``E_CACHED`` the draw
    when it got its key; ``E_DEPTH`` its index in its chain (block j of a sequence covers
    tokens ``[jB, (j+1)B)``); ``E_TAG`` the request that cached it; ``E_VER`` the push id
    of its valid heap entry.
``pst`` : int64, shape (NP,): clock, push counter, heap length.

Block statistics change only while a block is out of the heap (a hit takes it out of the
free set), so a block is pushed once per release and the heap is exact.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# Kernels here inline _hash_kernels. Numba alone would check only this file's stamp; radixkv keys
# its Numba cache folder by a hash of every kernel source (radixkv.numba_cache.source_key), so a
# change to _hash_kernels is a cold cache here too: nothing to touch in this file.
from radixkv.policies._hash_kernels import (
    NST, OK, REFUSED, R_PCN, R_REF, ST_EVICTIONS, ST_FQH, ST_FQLEN, ST_NCACHED, ST_NUSED,
    W_KEY, W_PKEY, _PF, _block_keys_into, _cache_full, _drop_key, _fq_prepend, _fq_remove,
    _prefetch_row, lookup,
)
from radixkv.policies._priority_fn import priority_at as _fn

E_TIME, E_HITS, E_CACHED, E_DEPTH, E_TAG, E_VER, E_BNEXT, E_BPREV = range(8)
#: bucket mode: the block's bucket (shares the heap mode's version column)
E_BKT = E_VER
NE = 8  # 64-byte rows
#: pst: clock, push counter, heap length, mode (0 heap, 1 buckets), non-empty bucket mask
P_CLOCK, P_PUSH, P_HLEN, P_MODE, P_BMASK = range(5)
NP = 5
#: bucket mode: buckets 0 … NBUCKETS − 1 (k1 clamped), each in release order
NBUCKETS = 63
NEED_PIECES = 3


# The heap: H, float64 shape (cap, 5): (k1, k2, release time, push id, block), exact
# for integers < 2**53; one row per entry keeps a sift to one cache line per level.

@njit(cache=True, inline="always")
def _less(H, i, j):
    for f in range(4):
        if H[i, f] != H[j, f]:
            return H[i, f] < H[j, f]
    return False


@njit(cache=True, inline="always")
def _swap(H, i, j):
    for f in range(5):
        v = H[i, f]
        H[i, f] = H[j, f]
        H[j, f] = v


@njit(cache=True)
def _sift_down(H, i, n):
    # a 4-ary heap: half the levels of a binary one, its four children often in one or
    # two cache lines (rows of 40 bytes)
    while True:
        a = 4 * i + 1
        if a >= n:
            return
        m = a
        for c in range(a + 1, min(a + 4, n)):
            if _less(H, c, m):
                m = c
        if _less(H, m, i):
            _swap(H, i, m)
            i = m
        else:
            return


@njit(cache=True)
def _fill(E, H, pst, i, b, pf, pp):
    k1, k2 = pf(E, b, pp)
    pst[P_PUSH] += 1
    H[i, 0] = k1
    H[i, 1] = k2
    H[i, 2] = E[b, E_TIME]
    H[i, 3] = pst[P_PUSH]
    H[i, 4] = b
    E[b, E_VER] = pst[P_PUSH]


@njit(cache=True)
def _rebuild(b32, E, H, pst, pf, pp):
    k = np.int64(0)  # not the literal 0: one _fill and _sift_down for every caller
    for b in range(1, b32.shape[0]):
        E[b, E_VER] = 0
        if b32[b, R_REF] == 0 and b32[b, R_PCN] != 0:
            _fill(E, H, pst, k, b, pf, pp)
            k += 1
    pst[P_HLEN] = k
    for i in range((k - 2) // 4, -1, -1):
        _sift_down(H, i, k)


@njit(cache=True)
def _push(b32, E, H, pst, b, pf, pp):
    if pst[P_HLEN] == H.shape[0]:
        _rebuild(b32, E, H, pst, pf, pp)  # b is hashed and free: it is in the rebuilt heap
        return
    i = pst[P_HLEN]
    pst[P_HLEN] = i + 1
    _fill(E, H, pst, i, b, pf, pp)
    while i > 0:
        up = (i - 1) // 4
        if _less(H, i, up):
            _swap(H, i, up)
            i = up
        else:
            break


@njit(cache=True)
def _pop_valid(b32, E, H, pst):
    """The hashed free block of smallest priority (removed from the heap)."""
    while pst[P_HLEN] > 0:
        n = pst[P_HLEN] - 1
        ver = np.int64(H[0, 3])
        b = np.int64(H[0, 4])
        if n > 0:
            for f in range(5):
                H[0, f] = H[n, f]
            _sift_down(H, np.int64(0), n)
        pst[P_HLEN] = n
        if E[b, E_VER] == ver and b32[b, R_REF] == 0 and b32[b, R_PCN] != 0:
            E[b, E_VER] = 0
            return b
    return -1


# ---------------------------------------------------------------- bucket mode
# For priorities (k1, release time) with k1 a small integer class (LFU by saturating hit
# count, segments, priority classes): one FIFO list per class, appended at release — a
# release has the latest time, so each list stays in priority order — and popped from
# the lowest non-empty class (a 63-bit mask). O(1) per block. BK, int64 (NBUCKETS, 2):
# head and tail of each list (−1 = empty); E_BNEXT / E_BPREV link the blocks.

@njit(cache=True, inline="always")
def _bappend(E, BK, pst, b, k):
    E[b, E_BKT] = k
    t = BK[k, 1]
    E[b, E_BPREV] = t
    E[b, E_BNEXT] = -1
    if t >= 0:
        E[t, E_BNEXT] = b
    else:
        BK[k, 0] = b
        pst[P_BMASK] |= np.int64(1) << k
    BK[k, 1] = b


@njit(cache=True, inline="always")
def _bunlink(E, BK, pst, b):
    k = E[b, E_BKT]
    p = E[b, E_BPREV]
    n = E[b, E_BNEXT]
    if p >= 0:
        E[p, E_BNEXT] = n
    else:
        BK[k, 0] = n
    if n >= 0:
        E[n, E_BPREV] = p
    else:
        BK[k, 1] = p
    if BK[k, 0] < 0:
        pst[P_BMASK] &= ~(np.int64(1) << k)


@njit(cache=True, inline="always")
def _bpop(E, BK, pst):
    m = pst[P_BMASK]
    k = 0
    while (m >> k) & 1 == 0:
        k += 1
    b = BK[k, 0]
    _bunlink(E, BK, pst, b)
    return b


@njit(cache=True)
def _release_hashed(b32, E, H, BK, pst, b, pf, pp):
    pst[P_CLOCK] += 1
    E[b, E_TIME] = pst[P_CLOCK]
    if pst[P_MODE] == 1:
        k1, _ = pf(E, b, pp)
        k = 0 if k1 < 0 else (NBUCKETS - 1 if k1 > NBUCKETS - 1 else np.int64(k1))
        _bappend(E, BK, pst, b, k)
    else:
        _push(b32, E, H, pst, b, pf, pp)


@njit(cache=True)
def _take_new(blk, b32, kt, k32, st, stk, E, H, BK, pst, tbl, at, n_new, pf, pp):
    """``get_new_blocks``: keyless free blocks first (vLLM's queue head), then evict the
    hashed free blocks of smallest priority (popped a batch at a time, the key-table rows
    of the batch prefetched before the keys are dropped, as ``_hash_kernels._take_new``).
    The caller checked ``n_new ≤ free``."""
    ev = 0
    mask = kt.shape[0] - 1
    k = 0
    while k < n_new:
        b = st[ST_FQH]
        if b >= 0:
            _fq_remove(b32, st, b)
            if b32[b, R_PCN] != 0:  # not produced (keyless blocks only in the list)
                _drop_key(blk, b32, kt, k32, st, stk, b)
                ev += 1
            tbl[at + k] = b
            b32[b, R_REF] = 1
            k += 1
            continue
        k1 = min(k + _PF, n_new)
        for j in range(k, k1):
            b = _bpop(E, BK, pst) if pst[P_MODE] == 1 else _pop_valid(b32, E, H, pst)
            tbl[at + j] = b
            _prefetch_row(kt, blk[b, W_KEY] & mask)
            _prefetch_row(kt, blk[b, W_PKEY] & mask)
        for j in range(k, k1):
            b = tbl[at + j]
            st[ST_FQLEN] -= 1
            _drop_key(blk, b32, kt, k32, st, stk, b)
            ev += 1
            b32[b, R_REF] = 1
        k = k1
    st[ST_NCACHED] -= ev
    st[ST_NUSED] += n_new
    st[ST_EVICTIONS] += ev
    return ev


@njit(cache=True)
def _cache(blk, b32, kt, k32, pcid, pcs, st, stk, E, pst, tbl, keys, lo, hi, seg_id, seg_end, block_size, tag):
    _cache_full(blk, b32, kt, k32, pcid, pcs, st, stk, tbl, keys, lo, hi, seg_id, seg_end, block_size)
    for j in range(lo, hi):
        b = tbl[j]
        pst[P_CLOCK] += 1
        E[b, E_CACHED] = pst[P_CLOCK]
        E[b, E_HITS] = 0
        E[b, E_DEPTH] = j
        E[b, E_TAG] = tag


@njit(cache=True)
def _admit(blk, b32, kt, k32, pcid, pcs, st, stk, E, H, BK, pst, keys, seg_id, seg_end, block_size,
           prompt_len, lookup_len, n_tokens, verify, tbl, tag, pf, pp):
    B = block_size
    code, h, held = lookup(blk, b32, kt, k32, pcid, pcs, keys, lookup_len // B, seg_id, seg_end, B,
                           prompt_len, verify, tbl)
    if code != OK:
        return code, 0, 0, 0, 0
    hcap = min(h, (lookup_len - 1) // B)
    n_touch = 0
    for k in range(hcap):
        if b32[tbl[k], R_REF] == 0:
            n_touch += 1
    need_full = (lookup_len + B - 1) // B - hcap
    if need_full + n_touch > st[ST_FQLEN]:
        return REFUSED, hcap, held, 0, 0
    for k in range(hcap):
        b = tbl[k]
        if b32[b, R_REF] == 0:  # a hit block always has a key: it is in the heap / a bucket
            if pst[P_MODE] == 1:
                _bunlink(E, BK, pst, b)
            E[b, E_VER] = 0
            st[ST_FQLEN] -= 1
            st[ST_NUSED] += 1
            st[ST_NCACHED] -= 1
        b32[b, R_REF] += 1
        E[b, E_HITS] += 1
    t = max(n_tokens, hcap * B)
    nblk = (t + B - 1) // B
    ev = _take_new(blk, b32, kt, k32, st, stk, E, H, BK, pst, tbl, hcap, nblk - hcap, pf, pp)
    _cache(blk, b32, kt, k32, pcid, pcs, st, stk, E, pst, tbl, keys, hcap, t // B, seg_id, seg_end, B, tag)
    return OK, hcap, held, ev, nblk


@njit(cache=True)
def admit(blk, b32, kt, k32, pcid, pcs, st, stk, E, H, BK, pst, keys, seg_id, seg_end, block_size,
          prompt_len, lookup_len, n_tokens, verify, tbl, tag, fa, pp):
    """``_hash_kernels.admit`` with priority eviction; *tag* is stored on the blocks the
    request caches. Returns (code, hit_blocks, held_tokens, evicted_blocks, n_blocks)."""
    pf = _fn(fa)
    return _admit(blk, b32, kt, k32, pcid, pcs, st, stk, E, H, BK, pst, keys, seg_id, seg_end, block_size,
                  prompt_len, lookup_len, n_tokens, verify, tbl, tag, pf, pp)


@njit(cache=True)
def _extend(blk, b32, kt, k32, pcid, pcs, st, stk, E, H, BK, pst, keys, seg_id, seg_end, block_size, tbl,
            n_blocks, n_computed, n_more, tag, pf, pp):
    B = block_size
    t = n_computed + n_more
    nblk = (t + B - 1) // B
    n_new = nblk - n_blocks
    if n_new > st[ST_FQLEN]:
        return False, n_blocks, 0
    ev = 0
    if n_new > 0:
        ev = _take_new(blk, b32, kt, k32, st, stk, E, H, BK, pst, tbl, n_blocks, n_new, pf, pp)
    _cache(blk, b32, kt, k32, pcid, pcs, st, stk, E, pst, tbl, keys, n_computed // B, t // B, seg_id, seg_end, B,
           tag)
    return True, nblk, ev


@njit(cache=True)
def extend(blk, b32, kt, k32, pcid, pcs, st, stk, E, H, BK, pst, keys, seg_id, seg_end, block_size, tbl,
           n_blocks, n_computed, n_more, tag, fa, pp):
    """``_hash_kernels.extend`` with priority eviction: (ok, n_blocks, evicted blocks)."""
    pf = _fn(fa)
    return _extend(blk, b32, kt, k32, pcid, pcs, st, stk, E, H, BK, pst, keys, seg_id, seg_end, block_size,
                   tbl, n_blocks, n_computed, n_more, tag, pf, pp)


@njit(cache=True)
def _free(b32, st, E, H, BK, pst, tbl, n_blocks, pf, pp):
    for k in range(n_blocks - 1, -1, -1):
        b = tbl[k]
        b32[b, R_REF] -= 1
        if b32[b, R_REF] == 0:
            st[ST_NUSED] -= 1
            if b32[b, R_PCN] != 0:
                _release_hashed(b32, E, H, BK, pst, b, pf, pp)
                st[ST_FQLEN] += 1
                st[ST_NCACHED] += 1
            else:
                _fq_prepend(b32, st, b)


@njit(cache=True)
def free(b32, st, E, H, BK, pst, tbl, n_blocks, fa, pp):
    """Release a request's blocks tail first: keyless ones to the list head, hashed ones
    into the heap with a fresh release time (vLLM ``free_blocks``' tail append)."""
    pf = _fn(fa)
    _free(b32, st, E, H, BK, pst, tbl, n_blocks, pf, pp)


@njit(cache=True)
def rebuild(b32, E, H, pst, fa, pp):
    """Replace the heap by one entry per hashed free block (drops stale entries)."""
    pf = _fn(fa)
    _rebuild(b32, E, H, pst, pf, pp)


@njit(cache=True)
def run_seq(blk, kt, pcid, pcs, state, scratch, seg_id, seg_end, block_size, prompt_len, kv_len, verify,
            key_mask, E, H, BK, pst, tag, fa, pp):
    """``_hash_kernels.run_seq`` with priority eviction: (code, hit_blocks, held,
    evicted_blocks, decoded, total evictions)."""
    pf = _fn(fa)
    b32 = blk.view(np.int32)
    k32 = kt.view(np.int32)
    st = state[:NST]
    stk = state[NST:]
    keys = scratch[0]
    tbl = scratch[1]
    mp = _block_keys_into(seg_id, seg_end, block_size, kv_len // block_size, key_mask, keys)
    if mp - 1 > pcid.shape[1]:
        return NEED_PIECES, mp, 0, 0, False, st[ST_EVICTIONS]
    code, hcap, held, ev, nblk = _admit(blk, b32, kt, k32, pcid, pcs, st, stk, E, H, BK, pst, keys, seg_id,
                                        seg_end, block_size, prompt_len, prompt_len, prompt_len, verify, tbl,
                                        tag, pf, pp)
    if code != OK:
        return code, hcap, held, ev, False, st[ST_EVICTIONS]
    ok = True
    if kv_len > prompt_len:
        ok, nblk2, ev2 = _extend(blk, b32, kt, k32, pcid, pcs, st, stk, E, H, BK, pst, keys, seg_id, seg_end,
                                 block_size, tbl, nblk, prompt_len, kv_len - prompt_len, tag, pf, pp)
        if ok:
            nblk = nblk2
    _free(b32, st, E, H, BK, pst, tbl, nblk, pf, pp)
    return OK, hcap, held, ev, ok, st[ST_EVICTIONS]
