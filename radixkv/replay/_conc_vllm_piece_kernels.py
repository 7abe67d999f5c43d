"""The piece pool as the compiled concurrent vLLM loop's pool: its pool operations.

The pool itself — its state, the vLLM block-pool rules written once (lookup with the
last-token cap, ``allocate_slots``, caching full blocks, tail-first freeing) and the
sequential replay's driver — is :mod:`radixkv.policies._hash_unit_kernels`; this module
registers its :class:`~radixkv.policies._hash_unit_kernels.PiecePool` as a pool type of
:mod:`radixkv.replay._conc_vllm_kernels` (the contract, "Pools and their operations")
and maps each operation the loop calls onto the pool's functions. It applies to a
hash-id trace whose unit U is a multiple of ``block_size`` B, ids ≥ 0, no output ids, on a
fresh pool (:func:`radixkv.replay.conc_vllm_fast._unit_eligible`), and gives the
per-block loop's bytes (``tests/test_conc_vllm_unit.py``).

Every operation but ``pool_counts`` and ``pool_grow_slot`` first pops what the last decode
run took (``_flush``): those pops come before any other change to the queue, as they did
in vLLM, and before any lookup reads the keys.
"""
from __future__ import annotations

import radixkv.replay._conc_vllm_kernels as CK
from radixkv.policies._borrowed import borrow
from radixkv.policies._hash_unit_kernels import (  # noqa: F401  (also the names conc_vllm_fast and tests read)
    OK, RI_R, RI_SJ, T_H0, T_HC, T_LIVE, T_NOWN, T_REQ, U_EV, U_NCACHED, U_NHASHED, U_NKEYS, U_NREC, U_NSTRAD, U_NUSED,
    U_PEND, U_Z, PiecePool, _flush, _flush_pool, _pol, _sp, admit, extend, flush, grow_deferred, grow_tables,
    head_lookup, new_pool, new_scratch, new_slots, release, request_info, unit_keys_all)

#: a key table may fill past half in this step: grow it (``grow_tables``), call again
S_GROW_TABLES = CK.S_POOL


@CK.pool_op(CK.pool_room, PiecePool)
def _room_op(pool, budget, cap_run):
    if pool.us[U_PEND] != 0:
        _flush_pool(pool)
    nrec = pool.us[U_NREC]
    nst = pool.us[U_NSTRAD]
    need = 2 * (budget // pool.block_size) + 4 * cap_run + 4  # unit records one step may create
    full = (2 * (nrec + need) > pool.um.shape[0]) | (2 * (nst + 2 * cap_run + 2) > pool.sm.shape[0])
    return S_GROW_TABLES if full else 0


@CK.pool_op(CK.pool_admit, PiecePool)
def _admit_op(pool, ps, ls, tr, i, sl, m, n_tok, asked, first):
    pol = _pol(pool)
    if pool.us[U_PEND] != 0:
        _flush(pol)
    code, hb, hd, ev, nblk = admit(pol, _sp(pool, ps), sl, i, n_tok, asked, first, pool.gap)
    if code != OK:
        return CK.ADMIT_REFUSED, hb, hd, ev
    return CK.ADMIT_OK, hb, hd, ev


@CK.pool_op(CK.pool_extend, PiecePool)
def _extend_op(pool, ps, ls, sl, n0, n):
    pol = _pol(pool)
    if pool.us[U_PEND] != 0:
        _flush(pol)
    ev = extend(pol, _sp(pool, ps), sl, n0, n)
    if ev < 0:
        return False, 0
    return True, ev


@CK.pool_op(CK.pool_grow_slot, PiecePool)
def _grow_slot_op(pool, ps, ls, sl, n0, n):
    """Deferred (:func:`grow_deferred`): the evicted count returned is what the pops this
    growth adds will evict (every pop past the keyless head blocks evicts one). Output
    blocks (the common case) are counted here, reading the arrays through the pool value
    (borrowed views: no reference counts) — ``grow_deferred`` and ``_cache`` written out for them,
    since calling ``grow_deferred`` through the pool tuple for them cost 7–14 % of the
    concurrent Mooncake replay; other growth calls ``grow_deferred``."""
    B = pool.block_size
    T = ps[0][sl] - 1
    i = pool.tb[T, T_REQ]
    lo = n0 // B
    hi = (n0 + n) // B
    z = pool.us[U_Z]
    p0 = pool.us[U_PEND]
    if hi > lo and (lo < pool.rinfo[RI_R, i] or lo <= pool.rinfo[RI_SJ, i] < hi):
        p1 = grow_deferred(_pol(pool), _sp(pool, ps), sl, n0, n, p0, z + pool.us[U_NCACHED])
        if p1 < 0:
            return False, 0
        pool.us[U_PEND] = p1
        return True, max(p1 - z, 0) - max(p0 - z, 0)
    n_new = (n0 + n + B - 1) // B - pool.tb[T, T_H0] - pool.tb[T, T_NOWN]
    p1 = p0
    if n_new > 0:
        if p0 + n_new > z + pool.us[U_NCACHED]:
            return False, 0
        p1 = p0 + n_new
        pool.us[U_PEND] = p1
        pool.tb[T, T_NOWN] += n_new
        pool.us[U_NUSED] += n_new
    if hi > lo:  # output blocks: only counted (as _cache)
        pool.us[U_NHASHED] += hi - lo
        pool.us[U_NKEYS] += hi - lo
        pool.tb[T, T_LIVE] += hi - lo
        pool.tb[T, T_HC] = hi
    return True, max(p1 - z, 0) - max(p0 - z, 0)


@CK.pool_op(CK.pool_release, PiecePool)
def _release_op(pool, ps, sl, n0):
    pol = _pol(pool)
    if pool.us[U_PEND] != 0:
        _flush(pol)
    release(pol, _sp(pool, ps), sl, pool.gap)


@CK.pool_op(CK.pool_lookup, PiecePool)
def _lookup_op(pool, ps, hs, tr, i, L, sid, send, m, fresh, count_free):
    return head_lookup(_pol(pool), _sp(pool, ps), hs[0], i, L, count_free, pool.gap)


@CK.pool_op(CK.pool_counts, PiecePool)
def _counts_op(pool):
    """(used, cached, hashed) with a decode run's pending pops counted as done."""
    ev = max(pool.us[U_PEND] - pool.us[U_Z], 0)
    return pool.us[U_NUSED], pool.us[U_NCACHED] - ev, pool.us[U_NHASHED] - ev


@CK.pool_op(CK.pool_views, PiecePool)
def _views_op(pool, ps, hs):
    return (PiecePool(borrow(pool.pc), borrow(pool.tb), borrow(pool.rc), borrow(pool.rs), borrow(pool.ov),
                      borrow(pool.um), borrow(pool.sm), borrow(pool.us), borrow(pool.rt), borrow(pool.uk),
                      borrow(pool.ur), borrow(pool.ido), borrow(pool.rinfo), borrow(pool.prm), pool.cov, pool.gap,
                      pool.block_size),
            (borrow(ps[0]), borrow(ps[1]), borrow(ps[2])), (borrow(hs[0]),))

