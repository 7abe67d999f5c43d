"""``BlockHashCache``'s per-block pool under the compiled concurrent vLLM loop (the reference).

The pool operations of :mod:`radixkv.replay._conc_vllm_kernels` (its module docstring
gives the contract) over the arrays of :class:`radixkv.policies.block_hash.BlockHashCache`
or of its subclass :class:`radixkv.policies.block_priority.PriorityBlockHashCache`
(``vllm:B@lfu``), calling the kernels of :mod:`radixkv.policies._hash_kernels` with the
arguments the policy passes them (``admit``, ``extend``, ``free``, ``peek``, and the
policy's free order ``fo``): vLLM ``KVCacheManager.get_computed_blocks`` /
``allocate_slots`` / ``cache_blocks`` / ``free`` block by block, each block's hash kept in
the policy's key table. The free order is a value of one Numba type for every order (a
``PrioOrder``: vLLM's free queue, ``FREE_QUEUE``, or the policy's priority, its function
travelling as its addresses), so one compiled loop serves ``vllm:B`` and every ``vllm:B@ORDER``. After the replay the
policy's state is what the Python loop would leave.

Pool value :class:`BlockPool`: ``arrays`` the policy's ``blk, b32, kt, k32, pcid, pcs,
st, stk`` (``b32`` and ``st`` again as fields); ``key_mask``
(``BlockHashCache._key_mask``); ``block_size``; ``order`` the free order
(``BlockHashCache._order``). Per-slot tuple ``ps``: ``keys`` int64 (S, W) the request's
block keys, ``tbl`` int64 (S, W) its block table, ``nblk`` int64 (S,) blocks held,
``tag`` int64 (S,) the tag a priority order stores on the blocks the slot's request
caches (its trace index, as ``PriorityBlockHashCache._tag`` gives an int request
handle). Lookup scratch ``hs``: ``keys`` int64 (W,), ``tbl`` int64 (W,). Own status:
:data:`S_PIECES`.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit
from numba.core import config as numba_config

# Kernels here inline _hash_kernels. Numba alone would check only this file's stamp; radixkv keys
# its Numba cache folder by a hash of every kernel source (radixkv.numba_cache.source_key), so a
# change to _hash_kernels is a cold cache here too: nothing to touch in this file.
from radixkv.policies._borrowed import borrow, borrow_py
import radixkv.policies._hash_kernels as K
import radixkv.replay._conc_vllm_kernels as CK
from radixkv.trace._seq_kernel import kv_seq_into

if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run
    borrow = borrow_py  # noqa: F811

#: a block has more content pieces than ``pcid`` holds: widen it (``BlockHashCache._grow_pieces``), call again
S_PIECES = CK.S_POOL

#: the pool value (module docstring; ``b32`` and ``st`` also as fields of their own: one reference
#: count to bind, the tuple's eight)
BlockPool = namedtuple("BlockPool", ["arrays", "b32", "st", "key_mask", "block_size", "order"])


def new_pool(policy) -> BlockPool:
    """The pool value over *policy*'s (a ``BlockHashCache``) arrays; the loop changes them in place."""
    arrays = (policy._blk, policy._b32, policy._kt, policy._k32, policy._pcid, policy._pcs, policy._st,
              policy._stk)
    return BlockPool(arrays, policy._b32, policy._st, policy._key_mask, int(policy.block_size),
                     policy._order(0)[0])


def new_slots(n_sl: int, W: int):
    """Per-slot tuple ``ps`` for *n_sl* slots of at most *W* blocks."""
    W = max(int(W), 1)
    return (np.zeros((n_sl, W), dtype=np.int64), np.zeros((n_sl, W), dtype=np.int64), np.zeros(n_sl, dtype=np.int64),
            np.zeros(n_sl, dtype=np.int64))


def new_scratch(W: int):
    """Lookup scratch ``hs`` for requests of at most *W* blocks."""
    W = max(int(W), 1)
    return np.zeros(W, dtype=np.int64), np.zeros(W, dtype=np.int64)


@njit(cache=True)
def max_block_pieces(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens,
                     block_size, n_max):
    """Most content pieces (segments it overlaps) of any full block of any request's KV
    extent: the width ``BlockHashCache._keys`` would grow its piece arrays to."""
    sid = np.empty(max(n_max, 1), dtype=np.int64)
    send = np.empty(max(n_max, 1), dtype=np.int64)
    B = block_size
    best = 1
    for i in range(prompt_len.shape[0]):
        kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i, sid,
                    send)
        nfull = (prompt_len[i] + max(output_len[i] - 1, 0)) // B
        s = 0
        for j in range(nfull):
            start = j * B
            end = start + B
            while send[s] <= start:
                s += 1
            e = s
            while send[e] < end:
                e += 1
            if e - s + 1 > best:
                best = e - s + 1
    return best


@njit(cache=True, inline="always")
def _arrays(pool):
    """The pool's eight arrays as borrowed views (:mod:`radixkv.policies._borrowed`; inlined,
    so the views stay in the caller, which holds *pool* for its call). The kernels of
    :mod:`radixkv.policies._hash_kernels` are called on borrowed views here as in the
    sequential replay (``run_seq``), so both compile and share one specialisation."""
    return (borrow(pool.arrays[0]), borrow(pool.arrays[1]), borrow(pool.arrays[2]), borrow(pool.arrays[3]),
            borrow(pool.arrays[4]), borrow(pool.arrays[5]), borrow(pool.arrays[6]), borrow(pool.arrays[7]))


@njit(cache=True)
def _admit(pool, ps, ls, tr, i, sl, m, n_tok, asked):
    """``BlockHashCache.admit`` of request *i* into slot *sl* (``pool_admit``)."""
    blk, b32, kt, k32, pcid, pcs, st, stk = _arrays(pool)
    s_nblk, s_tag = ps[2], ps[3]
    sid2d = ls[0]
    send2d = ls[1]
    prompt_len = tr[5]
    output_len = tr[6]
    B = pool.block_size
    kvlen = prompt_len[i] + max(output_len[i] - 1, 0)
    keys = borrow(ps[0][sl])
    sid = borrow(sid2d[sl, :m])
    send = borrow(send2d[sl, :m])
    mp = K._block_keys_into(sid, send, B, kvlen // B, pool.key_mask, keys)
    if mp - 1 > pcid.shape[1]:
        return S_PIECES, 0, 0, 0
    fo = K.borrow_order(pool.order)
    K.order_tag(fo, i)
    # verify: np.bool_, not the literal False (the sequential replay's admit serves both)
    code, hb, hd, ev, nblk = K.admit(blk, b32, kt, k32, pcid, pcs, st, stk, keys, sid, send, B, n_tok, n_tok,
                                     asked, np.bool_(False), borrow(ps[1][sl]), fo)
    if code != K.OK:
        return CK.ADMIT_REFUSED, hb, hd, ev
    s_nblk[sl] = nblk
    s_tag[sl] = i
    return CK.ADMIT_OK, hb, hd, ev


@njit(cache=True)
def _extend(pool, ps, ls, sl, n0, n):
    """``BlockHashCache.extend`` of slot *sl* by *n* tokens (``pool_extend``)."""
    s_nblk, s_tag = ps[2], ps[3]
    B = pool.block_size
    t = n0 + n
    if (t + B - 1) // B == s_nblk[sl] and t // B == n0 // B:
        # no block taken, none filled (most decode tokens): the kernel would change nothing
        # (as BlockHashCache.extend_many skips such steps)
        return True, 0
    blk, b32, kt, k32, pcid, pcs, st, stk = _arrays(pool)
    m = ls[2][sl]
    fo = K.borrow_order(pool.order)
    K.order_tag(fo, s_tag[sl])
    ok, nb, ev = K.extend(blk, b32, kt, k32, pcid, pcs, st, stk, borrow(ps[0][sl]), borrow(ls[0][sl, :m]),
                          borrow(ls[1][sl, :m]), B, borrow(ps[1][sl]), s_nblk[sl], n0, n, fo)
    if ok:
        s_nblk[sl] = nb
    return ok, ev


@njit(cache=True)
def _lookup(pool, hs, i, L, hsid, hsend, m, fresh, count_free):
    """``BlockHashCache._lookup`` (``pool_lookup``): ``peek`` over the scratch keys."""
    blk, b32, kt, k32, pcid, pcs, st, stk = _arrays(pool)
    hk = borrow(hs[0])
    htbl = borrow(hs[1])
    B = pool.block_size
    n_look = L // B
    sid = borrow(hsid[:m])
    send = borrow(hsend[:m])
    if fresh != 0:
        K._block_keys_into(sid, send, B, n_look, pool.key_mask, hk)
    code, h = K.peek(blk, b32, kt, k32, pcid, pcs, hk, n_look, sid, send, B, L, np.bool_(False), htbl)
    nfree = 0
    if count_free:
        for q in range(h):
            if b32[htbl[q], K.R_REF] == 0:
                nfree += 1
    return h, nfree


# ---------------------------------------------------------------------- the operations
@CK.pool_op(CK.pool_room, BlockPool)
def _room(pool, budget, cap_run):
    return 0


@CK.pool_op(CK.pool_admit, BlockPool)
def _admit_op(pool, ps, ls, tr, i, sl, m, n_tok, asked, first):
    return _admit(pool, ps, ls, tr, i, sl, m, n_tok, asked)


@CK.pool_op(CK.pool_extend, BlockPool)
@CK.pool_op(CK.pool_grow_slot, BlockPool)
def _extend_op(pool, ps, ls, sl, n0, n):
    return _extend(pool, ps, ls, sl, n0, n)


@CK.pool_op(CK.pool_release, BlockPool)
def _release(pool, ps, sl, n0):
    K.free(borrow(pool.b32), borrow(pool.st), borrow(ps[1][sl]), ps[2][sl], K.borrow_order(pool.order))


@CK.pool_op(CK.pool_lookup, BlockPool)
def _lookup_op(pool, ps, hs, tr, i, L, sid, send, m, fresh, count_free):
    return _lookup(pool, hs, i, L, sid, send, m, fresh, count_free)


@CK.pool_op(CK.pool_counts, BlockPool)
def _counts(pool):
    st = pool.st
    return st[K.ST_NUSED], st[K.ST_NCACHED], st[K.ST_NHASHED]


@CK.pool_op(CK.pool_views, BlockPool)
def _views(pool, ps, hs):
    return pool, ps, hs
