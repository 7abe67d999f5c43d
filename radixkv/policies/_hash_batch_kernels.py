"""Batched decode of :class:`radixkv.policies.block_hash.BlockHashCache` (one kernel call
for a fast-forwarded run of decode steps of the concurrent replay).

The per-token rules are those of :func:`radixkv.policies._hash_kernels.extend` (vLLM
``KVCacheManager.allocate_slots`` then ``cache_blocks``), called here in the order the
step-by-step replay calls them; only the Python ↔ kernel round trips are saved.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.core import config as numba_config

# Kernels here inline _hash_kernels. Numba alone would check only this file's stamp; radixkv keys
# its Numba cache folder by a hash of every kernel source (radixkv.numba_cache.source_key), so a
# change to _hash_kernels is a cold cache here too: nothing to touch in this file.
from radixkv.policies._borrowed import borrow, borrow_py
import radixkv.policies._hash_kernels as K

if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run
    borrow = borrow_py  # noqa: F811


@njit(cache=True)
def lazy_order(kv0, B):
    """The items of a decode run grouped by ``kv0 mod B``, in item order within a group
    (a counting sort; the grouping of the lazy schedule, ``Scheduler._lazy_slot_local``).

    *kv0*: int64 array, shape (n,), KV tokens per item at step 1; *B*: ``block_size``.
    Returns ``(cnt, order)``, int64 arrays of shapes (B + 1,) and (n,): group r is
    ``order[cnt[r]:cnt[r + 1]]``."""
    n = kv0.shape[0]
    cnt = np.zeros(B + 1, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    lazy_order_into(kv0, n, B, cnt, order, np.empty(B, dtype=np.int64))
    return cnt, order


@njit(cache=True, inline="always")
def lazy_order_into(kv0, n, B, cnt, order, fill):
    """:func:`lazy_order` of ``kv0[:n]`` into caller-owned arrays (no allocation): *cnt*
    int64 (≥ B + 1,), *order* int64 (≥ n,), *fill* int64 scratch (≥ B,)."""
    for r in range(B + 1):
        cnt[r] = 0
    for i in range(n):
        cnt[kv0[i] % B + 1] += 1
    for r in range(B):
        cnt[r + 1] += cnt[r]
    for r in range(B):
        fill[r] = cnt[r]
    for i in range(n):
        rr = kv0[i] % B
        order[fill[rr]] = i
        fill[rr] += 1


@njit(cache=True)
def decode_run_slot_local(blk, b32, kt, k32, pcid, pcs, st, stk, keys_l, segid_l, segend_l, tbl_l, at,
                          nblk, ntok, kvlen, kv0, block_size, k, out, partial, fo):
    """Steps 2 … k of a run of k decode steps of every request (step 1 already applied).

    The lazy schedule of ``Scheduler._lazy_slot_local`` (``decode_slot_local``): at step
    t (1 ≤ t ≤ k − 2; every request then holds t extra tokens) only the requests whose
    token ``kv0 + t − 1`` starts a block are extended, by their lag, in item order; after
    step k − 1 every request is brought to k − 1 extra tokens.

    Parameters
    ----------
    keys_l, segid_l, segend_l, tbl_l : numba typed List of 1-D int64 arrays
        Block keys, content segments and block table of each request (tables are
        updated); item i's are at position ``at[i]``.
    at : int64 array, shape (n,)
        Position of each item in the lists.
    nblk, ntok : int64 arrays, shape (n,)
        Blocks held and tokens with KV per item (updated in place).
    kvlen : int64 array, shape (n,)
        KV extent of each item (tokens); extending past it is an error.
    kv0 : int64 array, shape (n,)
        The scheduler's KV tokens per item at step 1 (decides the lazy schedule).
    out : int64 array, shape (k, 3)
        Row 0 given (pool after step 1); rows 1 … k − 2 filled: used blocks, cached
        blocks, valid tokens, as ``stats`` would report after each step.
    partial : int
        Filled tokens of the partial blocks of all running requests before the call.
    fo : PrioOrder
        The free order: :data:`radixkv.policies._hash_kernels.FREE_QUEUE` (the batched
        decode serves vLLM's free queue only).

    Returns
    -------
    (status, evicted blocks, partial after)
        status −1: done; ≥ 0: item refused by the pool (state changed up to it); −2 − j:
        item j would pass its KV extent.
    """
    B = block_size
    n = nblk.shape[0]
    # items grouped by kv0 mod B, in item order within a group
    cnt, order = lazy_order(kv0, B)
    applied = [0] * n
    ev_total = 0
    u = out[0, 0]
    c = out[0, 1]
    v = out[0, 2]
    A = 0
    last = 1
    for t in range(1, k):
        final = t == k - 1
        if final:
            lo, hi = 0, n
            for s in range(last, k - 1):
                out[s, 0] = u
                out[s, 1] = c
                out[s, 2] = v + n * s - A
        else:
            rr = (1 - t) % B
            lo, hi = cnt[rr], cnt[rr + 1]
            if lo == hi:
                continue
            for s in range(last, t):
                out[s, 0] = u
                out[s, 1] = c
                out[s, 2] = v + n * s - A
        for q in range(lo, hi):
            i = q if final else order[q]
            m = t - applied[i]
            if m <= 0:
                continue
            n0 = ntok[i]
            if n0 + m > kvlen[i]:
                return -2 - i, ev_total, partial
            a = at[i]
            # borrowed views, as the sequential replay calls it: one specialisation of the
            # pool's kernels for both
            ok, nb, ev = K.extend(borrow(blk), borrow(b32), borrow(kt), borrow(k32), borrow(pcid), borrow(pcs),
                                  borrow(st), borrow(stk), borrow(keys_l[a]), borrow(segid_l[a]),
                                  borrow(segend_l[a]), B, borrow(tbl_l[a]), nblk[i], n0, m, K.borrow_order(fo))
            if not ok:
                return i, ev_total, partial
            nblk[i] = nb
            ev_total += ev
            partial += (n0 + m) % B - n0 % B
            ntok[i] = n0 + m
            A += m
            applied[i] = t
        if final:
            break
        u = st[K.ST_NUSED]
        c = st[K.ST_NCACHED]
        v = st[K.ST_NHASHED] * B + partial
        out[t, 0] = u
        out[t, 1] = c
        out[t, 2] = v + n * t - A
        last = t + 1
    return -1, ev_total, partial
