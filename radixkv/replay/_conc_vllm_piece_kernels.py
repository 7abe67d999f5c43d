"""Piece-based vLLM block pool for the compiled concurrent replay of hash-id traces.

The pool of :class:`radixkv.policies.block_hash.BlockHashCache` under vLLM v1's scheduler,
without block ids: the design of the sequential unit pool
(:mod:`radixkv.policies._hash_unit_kernels`) carried over to requests that run at the
same time, hold blocks, share hit blocks and grow block by block. It applies to a hash-id
trace whose unit U is a multiple of ``block_size`` B, G = U / B blocks per unit, ids ≥ 0,
no output ids, on a fresh pool (:func:`radixkv.replay.conc_vllm_fast._unit_eligible`) and
gives the per-block loop's bytes (``tests/test_conc_vllm_unit.py``).

The rules are vLLM's (``vllm/v1/core/block_pool.py``): ``get_new_blocks`` pops the free
queue's head and evicts the popped block's hash, ``touch`` takes a hit block with
ref_cnt 0 out of the queue, ``free_blocks`` releases a request's blocks tail first — a
block whose ref_cnt reaches 0 goes to the queue's tail when it has a hash, to its head
otherwise; ``BlockHashToBlockMap`` serves the first-inserted holder of a hash;
``kv_cache_manager.py`` caps a hit at ``(n − 1) // B`` blocks. Only block ids are gone:
no result depends on them (the concurrent loop reads no id).

How blocks are named. Every admission makes a *table* (its request's own blocks: positions
``h0 … h0 + nown − 1`` of the request's block table, after its ``h0`` hit blocks). A
block is (table, position). The hit blocks of a running request are *runs* (table, lo,
hi) of another table's blocks at the same positions (block j of every request covers
tokens jB … (j+1)B, so a hit is position-aligned).

The free queue is ``[Z keyless blocks] [pieces]``: a freed block without a hash goes to
the head and a freed hashed block to the tail, and pops take the head, so every keyless
block (never used, or a request's partial last block) is ahead of every hashed one and
keyless blocks are interchangeable: a count. A *piece* is a range of one table's
positions ``lo … hi``, highest first (the order a release appends them). Touching a
hit range cuts it out of its pieces (:func:`radixkv.policies._hash_unit_kernels._cut`).

Reference counts without ids: block (t, j) is held by t's owner while it runs, and by each
running request whose hit runs cover j. A released block enters the queue when nothing
covers it: when no run is on t (``T_EXT`` = 0, the common case) a whole range moves at
once; otherwise the covered positions are worked out from the running requests' runs
(:func:`_gaps`).

Keys: a regular block (wholly inside unit u of its request, j < R) is (unit key, k = j
mod G), its holders in the unit record of the key (``rc``/``rs``/``ov``, the sequential
pool's, whose holder functions are reused); an irregular block (a cut unit's end, a
unique tail, output) has a key only its own request produces — only that request,
re-admitted after a preemption, can hit it, and it finds the served holder by walking its
own tables oldest first (:func:`_irr_served`). A *straddle* (a full block that starts
in the cut last unit) is indexed by (unit key, offset) for ``held_tokens``.

Decode runs (the loop's fast-forward) take their blocks without popping them: the blocks
a run takes are the queue's first ones whichever request takes them, and nothing else
enters or leaves the queue during the run, so :func:`grow_deferred` only counts them,
the pool's counters are reported as if they were popped (every pop past the keyless head
blocks evicts one hashed block), and the next other operation pops them in one go
(:func:`_flush`) — one range operation per piece instead of one pop per block.

Array bounds: pieces, live tables, unit records, waiting duplicates and straddles are
each at most the pool's block count (plus the running tables), so :func:`new_pool`
sizes them once (``np.zeros``: pages never touched cost nothing); the two key tables
start small (a table the CPU caches hold) and grow between steps (:data:`S_GROW_TABLES`,
:func:`grow_tables`).

The pool operations (the contract of :mod:`radixkv.replay._conc_vllm_kernels`) call the
kernels here as functions, not inlined: inlined below an operation's own inlining,
Numba's IR inliner lost array writes of a nested inlined kernel (seen with ``_cache``
under ``extend``; ``tests/test_conc_vllm_unit.py`` caught it).
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit
from numba.core import config as numba_config

import radixkv.policies._hash_kernels as K
import radixkv.policies._hash_unit_kernels as HU
from radixkv.policies._borrowed import borrow, borrow_py
from radixkv.policies._hash_unit_kernels import (NPC, P_HI, P_LO, P_TAB, P_TNEXT, RC_ALL, RC_M1, T_FREE, T_GKEY,
                                                  T_LIVE, T_PH, T_SLEN, T_SNEXT, T_SPREV, U_EV, U_NHASHED, U_NKEYS,
                                                  U_NREC, U_NSTRAD, U_PFREE, U_QH, U_QT, U_RFREE, U_TFREE, U_TTOP,
                                                  _add_holder, _bit, _cut, _drop_holder, _empty, _lead, _piece_free,
                                                  _rec_delete, _rec_find, _rec_get, _rng_any, _rng_clear, _rng_set,
                                                  _split, _strad_remove)
import radixkv.replay._conc_vllm_kernels as CK

# table columns beyond the sequential pool's (its T_LIVE: the table's cached blocks; T_PH, T_FREE and
# the straddle links as there; T_OFF, T_R, T_NU unused)
T_OWN = 10  # 1 while the owner runs
T_REQ = 11  # the request
T_H0 = 12  # first own position
T_NOWN = 13  # own blocks allocated
T_HC = 14  # end of the hashed own positions (exclusive)
T_EXT = 15  # running hit runs on this table
T_RPREV = 16  # the request's tables, oldest first
T_RNEXT = 17
NTP = 18

# counters beyond the sequential pool's (us, int64)
U_Z = 20  # keyless blocks at the queue's head
U_NUSED = 21  # blocks with ref_cnt > 0
U_NCACHED = 22  # hashed blocks in the queue
U_PEND = 23  # blocks a decode run took, not yet popped (:func:`grow_deferred`)
NUP = 24

# per-request rows of ``rinfo`` (conc_vllm_fast builds them): regular blocks R, covered
# tokens (the units' tokens in the prompt), unit ids, straddle position (−1: none), the
# straddle's first token in its unit
RI_R, RI_COV, RI_NU, RI_SJ, RI_SOFF = range(5)
# parameters (prm)
M_B, M_G, M_U, M_W, M_NB = range(5)

OK = 0
REFUSED = 1

#: a key table may fill past half in this step: grow it (:func:`grow_tables`), call again
S_GROW_TABLES = CK.S_POOL

#: the pool value (:func:`new_pool`) the loop passes to the pool operations: the arrays as
#: fields (flat: a field read costs one reference count), ``block_size`` B.
PiecePool = namedtuple("PiecePool", ["pc", "tb", "rc", "rs", "ov", "um", "sm", "us", "rt", "uk", "ido", "rinfo",
                                     "prm", "cov", "gap", "block_size"])

if numba_config.DISABLE_JIT:  # plain Python: no views to make
    borrow = borrow_py  # noqa: F811

_STRAD = np.uint64(0x5851F42D4C957F2D)


@njit(cache=True)
def unit_keys_all(ids, id_offsets, out):
    """Chained unit keys of every request (``out`` parallel to ``ids``): for request i,
    ``out[a + u]`` = mix(``out[a + u − 1]``, ``ids[a + u]``) from ``K.SEED`` (a = its
    first id; :func:`radixkv.policies._hash_unit_kernels.unit_keys_into` per request)."""
    for i in range(id_offsets.shape[0] - 1):
        h = np.uint64(K.SEED)
        for x in range(id_offsets[i], id_offsets[i + 1]):
            h = K._mix(h, np.uint64(ids[x]))
            out[x] = np.int64(h)


@njit(cache=True, inline="always")
def _strad_key(uk, off):
    """Group key of the straddles that start *off* tokens into the unit of key *uk*."""
    return np.int64(K._mix(np.uint64(uk) ^ _STRAD, np.uint64(off)))


def new_pool(num_gpu_blocks, block_size, unit_tokens, ids, id_offsets, rinfo, max_running):
    """:class:`PiecePool` ``(pc, tb, rc, rs, ov, um, sm, us, rt, uk, ido, rinfo, prm, cov,
    gap, B)`` of an empty pool for at most *max_running* running requests: every usable
    block (1 … num_gpu_blocks − 1; block 0 is vLLM's null block) keyless in the queue
    (``BlockPool.__init__``). *ids*, *id_offsets*: the trace's unit ids (int64, ≥ 0) and
    each request's range of them; *rinfo* int64 (5, n) the per-request facts ``RI_*``.

    ``pc`` int64 (nb + 2, 7) pieces; ``tb`` int64 (nb + 2 + n + 2, NTP) tables (live ones:
    at most one per cached block plus the running ones);
    ``rc``/``rs``/``ov``/``um`` the unit records, their served tables, waiting duplicate
    holders and key table (layouts of :mod:`radixkv.policies._hash_unit_kernels`);
    ``sm`` the straddle groups; ``us`` int64 (NUP,) counters; ``rt`` int64 (2, n) each
    request's oldest and newest table (−1: none); ``uk`` int64 unit keys parallel to
    ``ids``; ``prm`` int64 (B, G, U, W, nb); ``cov``, ``gap`` int64 (4 max_running + 64, 2)
    scratch of :func:`_gaps`."""
    nb = int(num_gpu_blocks)
    B = int(block_size)
    U = int(unit_tokens)
    G = U // B
    W = (G + 63) // 64
    n = len(id_offsets) - 1
    us = np.zeros(NUP, dtype=np.int64)
    for c in (U_QH, U_QT, U_PFREE, U_TFREE, U_RFREE):
        us[c] = -1
    us[U_Z] = nb - 1
    rows = nb + 2
    pc = np.zeros((rows, NPC), dtype=np.int64)
    tb = np.zeros((rows + n + 2, NTP), dtype=np.int64)  # live tables: cached blocks + running
    rc = np.zeros((rows, RC_M1 + 2 * W), dtype=np.int64)
    rs = np.zeros((rows, G), dtype=np.int64)
    ov = np.zeros((rows, 3), dtype=np.int64)
    um = np.zeros((_pow2(4 * (rows // G + 64)), 4), dtype=np.int64)  # grown by grow_tables
    sm = np.zeros((256, 4), dtype=np.int64)
    rt = np.full((2, max(n, 1)), -1, dtype=np.int64)
    uk = np.zeros(max(len(ids), 1), dtype=np.int64)
    unit_keys_all(np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(id_offsets, dtype=np.int64), uk)
    prm = np.array([B, G, U, W, nb], dtype=np.int64)
    scr = 4 * int(max_running) + 64  # covering runs of one table (more: allocated, _gaps_covered)
    return PiecePool(pc, tb, rc, rs, ov, um, sm, us, rt, uk, np.ascontiguousarray(id_offsets, dtype=np.int64),
                     np.ascontiguousarray(rinfo, dtype=np.int64), prm, np.zeros((scr, 2), dtype=np.int64),
                     np.zeros((scr, 2), dtype=np.int64), B)


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@njit(cache=True, inline="always")
def _pol(pool):
    """The kernels' pool tuple of a :class:`PiecePool`: borrowed views of its arrays
    (:mod:`radixkv.policies._borrowed`: no reference counts where the kernels bind them;
    valid for the operation's call, which the loop's caller keeps the arrays alive for)."""
    return (borrow(pool.pc), borrow(pool.tb), borrow(pool.rc), borrow(pool.rs), borrow(pool.ov), borrow(pool.um),
            borrow(pool.sm), borrow(pool.us), borrow(pool.rt), borrow(pool.uk), borrow(pool.ido),
            borrow(pool.rinfo), borrow(pool.prm))


@njit(cache=True, inline="always")
def _sp(pool, ps):
    """The kernels' per-slot tuple: the loop's ``ps`` (tables, run counts, runs) borrowed,
    then the pool's ``cov`` scratch as it is (a kernel may use a bigger one instead)."""
    return borrow(ps[0]), borrow(ps[1]), borrow(ps[2]), pool.cov


def new_slots(n_slots, W):
    """Per-slot tuple ``ps`` for *n_slots* slots of at most *W* blocks: each slot's own
    table + 1 (0: free) int64 (S,), its hit-run count int64 (S,) and hit runs int64
    (S, W, 3) (table, lo, hi) (rows added zeroed: free slots)."""
    return (np.zeros(n_slots, dtype=np.int64), np.zeros(n_slots, dtype=np.int64),
            np.zeros((n_slots, max(W, 1), 3), dtype=np.int64))


def new_scratch(W):
    """Lookup scratch ``hs``: the hit runs of a waiting request, int64 (W, 3)."""
    return (np.zeros((max(int(W), 1), 3), dtype=np.int64),)


# ---------------------------------------------------------------------- tables
@njit(cache=True, inline="always")
def _tab_new(tb, us, rt, i, h0):
    """A table for an admission of request *i* after *h0* hit blocks (owner running)."""
    t = us[U_TFREE]
    if t >= 0:
        us[U_TFREE] = tb[t, T_FREE]
    else:
        t = us[U_TTOP]
        us[U_TTOP] = t + 1
    tb[t, T_LIVE] = 0
    tb[t, T_PH] = -1
    tb[t, T_SLEN] = 0
    tb[t, T_OWN] = 1
    tb[t, T_REQ] = i
    tb[t, T_H0] = h0
    tb[t, T_NOWN] = 0
    tb[t, T_HC] = h0
    tb[t, T_EXT] = 0
    last = rt[1, i]
    tb[t, T_RPREV] = last
    tb[t, T_RNEXT] = -1
    if last >= 0:
        tb[last, T_RNEXT] = t
    else:
        rt[0, i] = t
    rt[1, i] = t
    return t


@njit(cache=True)
def _tab_free(tb, us, rt, t):
    """Table *t* has no cached block and no running owner: it leaves its request's list."""
    i = tb[t, T_REQ]
    a = tb[t, T_RPREV]
    b = tb[t, T_RNEXT]
    if a >= 0:
        tb[a, T_RNEXT] = b
    else:
        rt[0, i] = b
    if b >= 0:
        tb[b, T_RPREV] = a
    else:
        rt[1, i] = a
    tb[t, T_FREE] = us[U_TFREE]
    us[U_TFREE] = t


@njit(cache=True)
def _strad_add(tb, sm, us, t, gk, slen):
    """Table *t*'s straddle block (cached) joins its group *gk* at the head."""
    tb[t, T_SLEN] = slen
    tb[t, T_GKEY] = gk
    tb[t, T_SPREV] = -1
    x = K._find_or_add(sm, gk)
    if sm[x, 1] != 0:
        h = sm[x, 1] - 1
        tb[t, T_SNEXT] = h
        tb[h, T_SPREV] = t
    else:
        tb[t, T_SNEXT] = -1
        us[U_NSTRAD] += 1
    sm[x, 1] = t + 1


# ---------------------------------------------------------------------- keys held and dropped
@njit(cache=True, inline="always")
def _evict(pol, t, lo, hi):
    """Blocks (t, hi) … (t, lo), popped from the queue's head, lose their hashes
    (``BlockPool._maybe_evict_cached_block``)."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ido, rinfo, prm = pol
    G = prm[M_G]
    W = prm[M_W]
    M2 = RC_M1 + W
    i = tb[t, T_REQ]
    R = rinfo[RI_R, i]
    if hi >= R:  # irregular blocks: only counted
        n = hi - max(lo, R) + 1
        us[U_NHASHED] -= n
        us[U_NKEYS] -= n
        if lo <= R and tb[t, T_SLEN] > 0:
            _strad_remove(tb, sm, us, t)
            tb[t, T_SLEN] = 0
    a0 = ido[i]
    j = min(hi, R - 1)
    while j >= lo:  # regular blocks, a unit at a time
        u = j // G
        a = max(lo, u * G)
        r = _rec_find(um, uk[a0 + u])
        qa = a - u * G
        qe = j - u * G + 1
        sole = not _rng_any(rc, r, M2, qa, qe)
        if sole and rc[r, RC_ALL] != t:
            if rc[r, RC_ALL] >= 0:
                sole = False
            else:
                for q in range(qa, qe):
                    if rs[r, q] != t:
                        sole = False
                        break
        if sole:
            _rng_clear(rc, r, RC_M1, qa, qe)
            us[U_NKEYS] -= qe - qa
            us[U_NHASHED] -= qe - qa
            if _empty(rc, r, W):
                _rec_delete(rc, um, us, r)
        else:
            for q in range(qe - 1, qa - 1, -1):
                _drop_holder(rc, rs, ov, um, us, r, q, t, G)
        j = a - 1
    tb[t, T_LIVE] -= hi - lo + 1
    if tb[t, T_LIVE] == 0 and tb[t, T_OWN] == 0:
        _tab_free(tb, us, rt, t)


@njit(cache=True, inline="always")
def _cache(pol, t, lo, hi):
    """Own positions lo … hi − 1 of running table *t* get their hashes
    (``BlockPool.cache_full_blocks``); each key's holders gain t after any earlier ones."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ido, rinfo, prm = pol
    G = prm[M_G]
    W = prm[M_W]
    i = tb[t, T_REQ]
    R = rinfo[RI_R, i]
    a0 = ido[i]
    j = lo
    e = min(R, hi)
    while j < e:  # regular blocks, a unit at a time
        u = j // G
        b = u * G
        a2 = min(e, b + G)
        r = _rec_get(rc, um, us, uk[a0 + u], W)
        qa = j - b
        qe = a2 - b
        if not _rng_any(rc, r, RC_M1, qa, qe):
            if _empty(rc, r, W):
                rc[r, RC_ALL] = t
            elif rc[r, RC_ALL] != t:
                _split(rc, rs, r, G)
                for q in range(qa, qe):
                    rs[r, q] = t
            _rng_set(rc, r, RC_M1, qa, qe)
            us[U_NKEYS] += qe - qa
            us[U_NHASHED] += qe - qa
        else:
            for q in range(qa, qe):
                _add_holder(rc, rs, ov, us, r, q, t, G)
        j = a2
    if hi > R:  # irregular blocks: only counted
        n = hi - max(lo, R)
        us[U_NHASHED] += n
        us[U_NKEYS] += n
        sj = rinfo[RI_SJ, i]
        if lo <= sj < hi:
            nu = rinfo[RI_NU, i]
            _strad_add(tb, sm, us, t, _strad_key(uk[a0 + nu - 1], rinfo[RI_SOFF, i]),
                       rinfo[RI_COV, i] - R * prm[M_B])
    tb[t, T_LIVE] += hi - lo
    tb[t, T_HC] = hi


@njit(cache=True, inline="always")
def _pop(pol, n):
    """Take *n* blocks from the queue's head (``BlockPool.get_new_blocks``): keyless ones
    first, then pieces from the high end, evicting; returns the evicted count."""
    pc = pol[0]
    us = pol[7]
    k = min(n, us[U_Z])
    us[U_Z] -= k
    n -= k
    ev = 0
    while n > 0:
        p = us[U_QH]
        t = pc[p, P_TAB]
        lo = pc[p, P_LO]
        hi = pc[p, P_HI]
        k = min(n, hi - lo + 1)
        if k == hi - lo + 1:
            _piece_free(pc, us, pol[1], p)
        else:
            pc[p, P_HI] = hi - k
        _evict(pol, t, hi - k + 1, hi)
        ev += k
        n -= k
    us[U_NCACHED] -= ev
    us[U_EV] += ev
    return ev


# ---------------------------------------------------------------------- reference counts
@njit(cache=True, inline="always")
def _gaps(tb, sp, t, lo, hi, out):
    """The positions of lo … hi of table *t* that no running request's hit run covers,
    as ranges (lo', hi') highest first: returns (their count, the array holding them —
    *out*, or a bigger one). Cheap when no run is on t."""
    if tb[t, T_EXT] == 0:
        out[0, 0] = lo
        out[0, 1] = hi
        return 1, out
    return _gaps_covered(tb, sp, t, lo, hi, out)


@njit(cache=True)
def _gaps_covered(tb, sp, t, lo, hi, out):
    """:func:`_gaps` when some running request's run is on table *t*."""
    cov = sp[3]
    if tb[t, T_EXT] > cov.shape[0]:
        return _gaps_fill(tb, sp, t, lo, hi, out, np.empty((tb[t, T_EXT], 2), dtype=np.int64))
    return _gaps_fill(tb, sp, t, lo, hi, out, cov)


@njit(cache=True)
def _gaps_fill(tb, sp, t, lo, hi, out, cov):
    """:func:`_gaps_covered` with the covering ranges collected in *cov* (≥ ``T_EXT`` rows)."""
    s_tab = sp[0]
    s_nr = sp[1]
    runs = sp[2]
    # the covering ranges, clipped, then sorted by their high end, highest first
    m = 0
    for sl in range(s_tab.shape[0]):
        if s_tab[sl] == 0:
            continue
        for q in range(s_nr[sl]):
            if runs[sl, q, 0] == t:
                a = max(runs[sl, q, 1], lo)
                b = min(runs[sl, q, 2], hi)
                if a <= b:
                    cov[m, 0] = a
                    cov[m, 1] = b
                    m += 1
    for x in range(1, m):  # insertion sort on the high end, descending
        a = cov[x, 0]
        b = cov[x, 1]
        y = x - 1
        while y >= 0 and cov[y, 1] < b:
            cov[y + 1, 0] = cov[y, 0]
            cov[y + 1, 1] = cov[y, 1]
            y -= 1
        cov[y + 1, 0] = a
        cov[y + 1, 1] = b
    if out.shape[0] < m + 1:
        out = np.empty((m + 1, 2), dtype=np.int64)
    g = 0
    top = hi  # the highest position not yet placed
    for x in range(m):
        if cov[x, 1] < top:
            out[g, 0] = cov[x, 1] + 1
            out[g, 1] = top
            g += 1
        if cov[x, 0] - 1 < top:
            top = cov[x, 0] - 1
    if top >= lo:
        out[g, 0] = lo
        out[g, 1] = top
        g += 1
    return g, out


@njit(cache=True)
def _irr_served(pc, tb, rt, i, j):
    """The served holder of request *i*'s irregular block *j*: its oldest table still
    caching (t, j) (``BlockHashToBlockMap``: first inserted), or −1. Called only for a
    waiting request, whose tables are released: a cached block of theirs is in a piece."""
    t = rt[0, i]
    while t >= 0:
        if tb[t, T_H0] <= j < tb[t, T_HC]:
            p = tb[t, T_PH]
            while p >= 0:
                if pc[p, P_LO] <= j <= pc[p, P_HI]:
                    return t
                p = pc[p, P_TNEXT]
        t = tb[t, T_RNEXT]
    return -1


# ---------------------------------------------------------------------- lookup
@njit(cache=True)
def lookup(pol, i, L, runs):
    """Cached blocks of request *i*'s first ``L // B`` blocks, uncapped
    (``KVCacheManager.get_computed_blocks`` before its cap): returns (hit blocks, runs),
    the served holders as runs ``runs[:nr]`` (table, lo, hi). No state changes."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ido, rinfo, prm = pol
    B = prm[M_B]
    G = prm[M_G]
    W = prm[M_W]
    n_look = L // B
    R = rinfo[RI_R, i]
    a0 = ido[i]
    h = 0
    nr = 0
    while h < n_look and h < R:  # regular blocks, a unit at a time
        u = h // G
        r = _rec_find(um, uk[a0 + u])
        if r < 0:
            break
        n = min(_lead(rc, r, W), n_look - h, R - h)
        if n == 0:
            break
        t = rc[r, RC_ALL]
        if t >= 0:
            if nr > 0 and runs[nr - 1, 0] == t and runs[nr - 1, 2] == h - 1:
                runs[nr - 1, 2] = h + n - 1
            else:
                runs[nr, 0] = t
                runs[nr, 1] = h
                runs[nr, 2] = h + n - 1
                nr += 1
        else:
            for q in range(n):
                t = rs[r, q]
                if nr > 0 and runs[nr - 1, 0] == t and runs[nr - 1, 2] == h + q - 1:
                    runs[nr - 1, 2] = h + q
                else:
                    runs[nr, 0] = t
                    runs[nr, 1] = h + q
                    runs[nr, 2] = h + q
                    nr += 1
        h += n
        if n < G and h < R:
            return h, nr
    if h == R and rt[0, i] >= 0:  # the request's own irregular blocks (a re-admission)
        while h < n_look:
            t = _irr_served(pc, tb, rt, i, h)
            if t < 0:
                break
            if nr > 0 and runs[nr - 1, 0] == t and runs[nr - 1, 2] == h - 1:
                runs[nr - 1, 2] = h
            else:
                runs[nr, 0] = t
                runs[nr, 1] = h
                runs[nr, 2] = h
                nr += 1
            h += 1
    return h, nr


@njit(cache=True)
def held_tokens(pol, i, h, P):
    """``Admission.held_tokens`` of a first admission after *h* (uncapped) hit blocks:
    ``h × B`` plus the longest common prefix of the prompt's next block with a hashed
    block under the last hit key (a regular block at the same unit position, or a
    straddle of the same unit and offset), at most P."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ido, rinfo, prm = pol
    B = prm[M_B]
    U = prm[M_U]
    start = h * B
    if start >= P:
        return P
    cov = rinfo[RI_COV, i]
    if start >= cov:
        return start  # the unique prompt tail: no other block starts with its token
    end = min(start + B, P)
    u = start // U
    off = start - u * U
    key = uk[ido[i] + u]
    lp = min(min((u + 1) * U, cov), end) - start  # the prompt's tokens of unit u in the block
    best = 0
    r = _rec_find(um, key)
    if r >= 0 and _bit(rc, r, RC_M1, off // B):
        best = lp
    x = K._find(sm, _strad_key(key, off))
    if x >= 0:
        t = sm[x, 1] - 1
        while t >= 0:
            m = min(tb[t, T_SLEN], lp)
            if m > best:
                best = m
            t = tb[t, T_SNEXT]
    return start + best


@njit(cache=True)
def _cap_runs(runs, nr, hcap):
    """The runs cut at position *hcap* (exclusive); returns their count."""
    while nr > 0 and runs[nr - 1, 1] >= hcap:
        nr -= 1
    if nr > 0 and runs[nr - 1, 2] >= hcap:
        runs[nr - 1, 2] = hcap - 1
    return nr


@njit(cache=True)
def touch_count(pol, sp, runs, nr, gap):
    """Hit blocks in the runs with ref_cnt 0 (in the queue): those a touch takes out."""
    tb = pol[1]
    n = 0
    for q in range(nr):
        t = runs[q, 0]
        if tb[t, T_OWN] != 0:
            continue
        g, gp = _gaps(tb, sp, t, runs[q, 1], runs[q, 2], gap)
        for x in range(g):
            n += gp[x, 1] - gp[x, 0] + 1
    return n


# ---------------------------------------------------------------------- the loop's pool calls
@njit(cache=True)
def admit(pol, sp, sl, i, n_tok, asked, first, gap):
    """Look up, touch and allocate request *i* into slot *sl* (``_hash_kernels.admit``
    with ``prompt_len`` = ``lookup_len`` = *n_tok*, ``n_tokens`` = *asked*; ``held`` only
    for a *first* admission). Returns ``(code, hit blocks, held, evicted blocks,
    blocks)``; on REFUSED nothing changed."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ido, rinfo, prm = pol
    s_tab = sp[0]
    s_nr = sp[1]
    runs3 = sp[2]
    B = prm[M_B]
    runs = runs3[sl]
    h, nr = lookup(pol, i, n_tok, runs)
    held = held_tokens(pol, i, h, n_tok) if first else 0
    hcap = min(h, (n_tok - 1) // B)
    nr = _cap_runs(runs, nr, hcap)
    n_touch = touch_count(pol, sp, runs, nr, gap)
    need_full = (n_tok + B - 1) // B - hcap
    if need_full + n_touch > us[U_Z] + us[U_NCACHED]:
        return REFUSED, hcap, held, 0, 0
    # touch (BlockPool.touch): each run's blocks with ref_cnt 0 leave the queue
    s_nr[sl] = 0
    s_tab[sl] = 0  # its runs count as cover once its table is set
    for q in range(nr):
        t = runs[q, 0]
        if tb[t, T_OWN] == 0:
            g, gp = _gaps(tb, sp, t, runs[q, 1], runs[q, 2], gap)
            for x in range(g):
                _cut(pc, us, tb, t, gp[x, 0], gp[x, 1])
                c = gp[x, 1] - gp[x, 0] + 1
                us[U_NUSED] += c
                us[U_NCACHED] -= c
        tb[t, T_EXT] += 1
        s_nr[sl] = q + 1
    t_tok = max(asked, hcap * B)
    nblk = (t_tok + B - 1) // B
    T = _tab_new(tb, us, rt, i, hcap)
    s_tab[sl] = T + 1
    ev = _pop(pol, nblk - hcap)
    tb[T, T_NOWN] = nblk - hcap
    us[U_NUSED] += nblk - hcap
    if t_tok // B > hcap:
        _cache(pol, T, hcap, t_tok // B)
    return OK, hcap, held, ev, nblk


@njit(cache=True)
def extend(pol, sp, sl, n0, n):
    """Grow slot *sl*'s request from *n0* to n0 + *n* tokens (vLLM ``allocate_slots``
    then ``cache_blocks``): returns the evicted count, or −1 when the queue is too short
    (nothing changed)."""
    tb = pol[1]
    us = pol[7]
    B = pol[12][M_B]
    T = sp[0][sl] - 1
    have = tb[T, T_H0] + tb[T, T_NOWN]
    nt = n0 + n
    n_new = (nt + B - 1) // B - have
    ev = 0
    if n_new > 0:
        if n_new > us[U_Z] + us[U_NCACHED]:
            return -1
        ev = _pop(pol, n_new)
        tb[T, T_NOWN] += n_new
        us[U_NUSED] += n_new
    if nt // B > n0 // B:
        _cache(pol, T, n0 // B, nt // B)
    return ev


@njit(cache=True)
def grow_deferred(pol, sp, sl, n0, n, pend, fq0):
    """Decode growth of slot *sl* from *n0* to n0 + *n* tokens inside a decode run whose
    new blocks are popped together at its end (:func:`_pop` of the returned count): the
    blocks a run takes are the queue's first ones whichever slot takes them, and no block
    enters or leaves the queue otherwise during the run. *pend*: blocks taken so far in
    the run; *fq0*: the queue's length at its start. Returns the new count, or −1 when the
    queue is too short (nothing changed)."""
    tb = pol[1]
    us = pol[7]
    B = pol[12][M_B]
    T = sp[0][sl] - 1
    t = n0 + n
    n_new = (t + B - 1) // B - tb[T, T_H0] - tb[T, T_NOWN]
    if n_new > 0:
        if pend + n_new > fq0:
            return -1
        pend += n_new
        tb[T, T_NOWN] += n_new
        us[U_NUSED] += n_new
    if t // B > n0 // B:  # (output blocks alone are counted in the pool operation itself)
        _cache(pol, T, n0 // B, t // B)
    return pend


@njit(cache=True, inline="always")
def _append(pol, t, lo, hi):
    """Hashed blocks (t, hi) … (t, lo) whose ref_cnt reached 0 go to the queue's tail."""
    us = pol[7]
    HU._piece_new(pol[0], us, pol[1], t, lo, hi, us[U_QT])
    c = hi - lo + 1
    us[U_NUSED] -= c
    us[U_NCACHED] += c


@njit(cache=True)
def release(pol, sp, sl, gap):
    """``KVCacheManager.free`` of slot *sl*'s request: its blocks tail first — its own
    (a partial last block to the head), then its hit runs, last first."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ido, rinfo, prm = pol
    s_tab = sp[0]
    s_nr = sp[1]
    runs3 = sp[2]
    T = s_tab[sl] - 1
    h0 = tb[T, T_H0]
    hc = tb[T, T_HC]
    if h0 + tb[T, T_NOWN] > hc:  # the unhashed last block: the head
        us[U_Z] += 1
        us[U_NUSED] -= 1
    tb[T, T_OWN] = 0
    if hc > h0:
        g, gp = _gaps(tb, sp, T, h0, hc - 1, gap)
        for x in range(g):
            _append(pol, T, gp[x, 0], gp[x, 1])
    s_tab[sl] = 0  # free: its runs no longer cover (runs of one request never overlap)
    for q in range(s_nr[sl] - 1, -1, -1):
        t = runs3[sl, q, 0]
        s_nr[sl] = q  # this run no longer covers
        tb[t, T_EXT] -= 1
        if tb[t, T_OWN] == 0:
            g, gp = _gaps(tb, sp, t, runs3[sl, q, 1], runs3[sl, q, 2], gap)
            for x in range(g):
                _append(pol, t, gp[x, 0], gp[x, 1])
    if tb[T, T_LIVE] == 0:
        _tab_free(tb, us, rt, T)


def grow_tables(pol, units_step, strad_step):
    """The pool tuple with its unit-key and straddle tables doubled until one more step
    fits at load ≤ 1/2 (rows rehashed, :func:`radixkv.policies._hash_unit_kernels.rehash`)."""
    pol = list(pol)
    us = pol[7]  # (a PiecePool's fields in order)
    for k, need in ((5, int(us[U_NREC]) + units_step), (6, int(us[U_NSTRAD]) + strad_step)):
        old = pol[k]
        size = old.shape[0]
        while 2 * need > size:
            size *= 2
        if size > old.shape[0]:
            new = np.zeros((size, old.shape[1]), dtype=np.int64)
            HU.rehash(old, new)
            pol[k] = new
    return PiecePool(*pol)


# ---------------------------------------------------------------------- deferred decode pops
@njit(cache=True)
def _flush(pol):
    """Pop the blocks the last decode run took (:func:`grow_deferred`); returns evicted."""
    us = pol[7]
    n = us[U_PEND]
    us[U_PEND] = 0
    return _pop(pol, n)


def flush(pool):
    """:func:`_flush` of a :class:`PiecePool` (the caller, after the loop's last call)."""
    return int(_flush_pool(pool))


@njit(cache=True)
def _flush_pool(pool):
    return _flush(_pol(pool))


# ---------------------------------------------------------------------- the pool operations
# (radixkv.replay._conc_vllm_kernels: the contract). Every operation but pool_counts and
# pool_grow_slot first pops what the last decode run took (_flush): those pops come before any
# other change to the queue, as they did in vLLM, and before any lookup reads the keys.
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
    (borrowed views: no reference counts); other growth calls :func:`grow_deferred`."""
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


@njit(cache=True)
def head_lookup(pol, sp, runs, i, L, count_free, gap):
    """``pool_lookup``: (hit blocks capped at ``(L − 1) // B``, those with ref_cnt 0 when
    *count_free*) of request *i*'s first *L* tokens; the hit runs in *runs*."""
    if pol[7][U_PEND] != 0:
        _flush(pol)
    h, nr = lookup(pol, i, L, runs)
    hcap = min(h, (L - 1) // pol[12][M_B])
    if not count_free:
        return hcap, 0
    nr = _cap_runs(runs, nr, hcap)
    return hcap, touch_count(pol, sp, runs, nr, gap)


@CK.pool_op(CK.pool_counts, PiecePool)
def _counts_op(pool):
    """(used, cached, hashed) with a decode run's pending pops counted as done."""
    ev = max(pool.us[U_PEND] - pool.us[U_Z], 0)
    return pool.us[U_NUSED], pool.us[U_NCACHED] - ev, pool.us[U_NHASHED] - ev


@CK.pool_op(CK.pool_views, PiecePool)
def _views_op(pool, ps, hs):
    return (PiecePool(borrow(pool.pc), borrow(pool.tb), borrow(pool.rc), borrow(pool.rs), borrow(pool.ov),
                      borrow(pool.um), borrow(pool.sm), borrow(pool.us), borrow(pool.rt), borrow(pool.uk),
                      borrow(pool.ido), borrow(pool.rinfo), borrow(pool.prm), pool.cov, pool.gap, pool.block_size),
            (borrow(ps[0]), borrow(ps[1]), borrow(ps[2])), (borrow(hs[0]),))
