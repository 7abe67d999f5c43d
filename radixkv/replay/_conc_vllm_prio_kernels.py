"""``PriorityBlockHashCache``'s pool under the compiled concurrent vLLM loop (``vllm:B@lfu``).

The pool operations of :mod:`radixkv.replay._conc_vllm_kernels` (its module docstring
gives the contract) over the arrays of
:class:`radixkv.policies.block_priority.PriorityBlockHashCache`: the per-block pool of
:mod:`radixkv.replay._conc_vllm_block_kernels` (same block records, key table and lookup:
vLLM ``KVCacheManager.get_computed_blocks`` / ``allocate_slots`` / ``cache_blocks`` /
``free``) whose hashed free blocks are taken in the order of the policy's priority
instead of vLLM's free queue — the kernels of :mod:`radixkv.policies._hash_prio_kernels`
(``admit``, ``extend``, ``free``), called with the arguments ``PriorityBlockHashCache``
passes them. The priority function travels as its addresses (``fa``), so one compiled
loop serves every priority. After the replay the policy's state is what the Python loop
would leave.

Pool value :class:`PrioPool`: the :class:`~radixkv.replay._conc_vllm_block_kernels.BlockPool`
fields plus the priority state ``E, H, BK, pst`` (``PriorityBlockHashCache._heap``) and
the priority's ``fa`` (int64 addresses) and ``pp`` (float64 parameters). Per-slot tuple
``ps``: the block pool's ``keys``, ``tbl``, ``nblk`` plus ``tag`` int64 (S,), the tag the
slot's request stores on the blocks it caches (its trace index, as
``PriorityBlockHashCache._tag`` gives an int request handle). Lookup scratch ``hs``: as the
block pool's.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

# Kernels here inline _hash_kernels and _hash_prio_kernels; radixkv keys its Numba cache
# folder by a hash of every kernel source (radixkv.numba_cache.source_key).
import radixkv.policies._hash_kernels as K
import radixkv.policies._hash_prio_kernels as HP
import radixkv.replay._conc_vllm_block_kernels as BPK
import radixkv.replay._conc_vllm_kernels as CK

#: the pool value (module docstring)
PrioPool = namedtuple("PrioPool", ["arrays", "b32", "st", "E", "H", "BK", "pst", "fa", "pp", "key_mask",
                                   "block_size"])

new_scratch = BPK.new_scratch


def new_pool(policy) -> PrioPool:
    """The pool value over *policy*'s (a ``PriorityBlockHashCache``) arrays; the loop changes them in place."""
    arrays = (policy._blk, policy._b32, policy._kt, policy._k32, policy._pcid, policy._pcs, policy._st,
              policy._stk)
    E, H, BK, pst = policy._heap()
    return PrioPool(arrays, policy._b32, policy._st, E, H, BK, pst, policy._pf, policy._pp, policy._key_mask,
                    int(policy.block_size))


def new_slots(n_sl: int, W: int):
    """Per-slot tuple ``ps`` for *n_sl* slots of at most *W* blocks."""
    return BPK.new_slots(n_sl, W) + (np.zeros(n_sl, dtype=np.int64),)


@njit(cache=True)
def _admit(pool, ps, ls, tr, i, sl, m, n_tok, asked):
    """``PriorityBlockHashCache.admit`` of request *i* into slot *sl* (``pool_admit``)."""
    blk, b32, kt, k32, pcid, pcs, st, stk = pool.arrays
    keys2d, tbl2d, s_nblk, s_tag = ps
    sid2d = ls[0]
    send2d = ls[1]
    prompt_len = tr[5]
    output_len = tr[6]
    B = pool.block_size
    kvlen = prompt_len[i] + max(output_len[i] - 1, 0)
    mp = K._block_keys_into(sid2d[sl, :m], send2d[sl, :m], B, kvlen // B, pool.key_mask, keys2d[sl])
    if mp - 1 > pcid.shape[1]:
        return BPK.S_PIECES, 0, 0, 0
    # verify: np.bool_, not the literal False (the sequential replay's admit serves both)
    code, hb, hd, ev, nblk = HP.admit(blk, b32, kt, k32, pcid, pcs, st, stk, pool.E, pool.H, pool.BK, pool.pst,
                                      keys2d[sl], sid2d[sl, :m], send2d[sl, :m], B, n_tok, n_tok, asked, np.bool_(False),
                                      tbl2d[sl], i, pool.fa, pool.pp)
    if code != K.OK:
        return CK.ADMIT_REFUSED, hb, hd, ev
    s_nblk[sl] = nblk
    s_tag[sl] = i
    return CK.ADMIT_OK, hb, hd, ev


@njit(cache=True)
def _extend(pool, ps, ls, sl, n0, n):
    """``PriorityBlockHashCache.extend`` of slot *sl* by *n* tokens (``pool_extend``)."""
    keys2d, tbl2d, s_nblk, s_tag = ps
    B = pool.block_size
    t = n0 + n
    if (t + B - 1) // B == s_nblk[sl] and t // B == n0 // B:
        # no block taken, none filled (most decode tokens): the kernel would change nothing
        # (as BlockHashCache.extend_many skips such steps)
        return True, 0
    blk, b32, kt, k32, pcid, pcs, st, stk = pool.arrays
    m = ls[2][sl]
    ok, nb, ev = HP.extend(blk, b32, kt, k32, pcid, pcs, st, stk, pool.E, pool.H, pool.BK, pool.pst, keys2d[sl],
                           ls[0][sl, :m], ls[1][sl, :m], pool.block_size, tbl2d[sl], s_nblk[sl], n0, n, s_tag[sl],
                           pool.fa, pool.pp)
    if ok:
        s_nblk[sl] = nb
    return ok, ev


# ---------------------------------------------------------------------- the operations
@CK.pool_op(CK.pool_room, PrioPool)
def _room(pool, budget, cap_run):
    return 0


@CK.pool_op(CK.pool_admit, PrioPool)
def _admit_op(pool, ps, ls, tr, i, sl, m, n_tok, asked, first):
    return _admit(pool, ps, ls, tr, i, sl, m, n_tok, asked)


@CK.pool_op(CK.pool_extend, PrioPool)
@CK.pool_op(CK.pool_grow_slot, PrioPool)
def _extend_op(pool, ps, ls, sl, n0, n):
    return _extend(pool, ps, ls, sl, n0, n)


@CK.pool_op(CK.pool_release, PrioPool)
def _release(pool, ps, sl, n0):
    HP.free(pool.b32, pool.st, pool.E, pool.H, pool.BK, pool.pst, ps[1][sl], ps[2][sl], pool.fa, pool.pp)


@CK.pool_op(CK.pool_lookup, PrioPool)
def _lookup_op(pool, ps, hs, tr, i, L, sid, send, m, fresh, count_free):
    # the lookup reads no eviction state: the block pool's (BlockHashCache._lookup)
    return BPK._lookup(pool, hs, i, L, sid, send, m, fresh, count_free)


@CK.pool_op(CK.pool_counts, PrioPool)
def _counts(pool):
    st = pool.st
    return st[K.ST_NUSED], st[K.ST_NCACHED], st[K.ST_NHASHED]


@CK.pool_op(CK.pool_views, PrioPool)
def _views(pool, ps, hs):
    return pool, ps, hs
