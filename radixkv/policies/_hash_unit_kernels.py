"""Unit-granular pool of :class:`radixkv.policies.block_hash.BlockHashCache` for the
sequential replay of hash-id traces (Numba kernels and their Python owner).

When a trace's unit is U tokens, ``U % block_size == 0`` (G = U / B blocks per unit),
the trace has no output ids and the requests run one at a time (the sequential replay:
between requests every block is in vLLM's free queue), the pool is modelled without
block ids and without one key-table row per block, and gives every record of the
per-block kernels (:mod:`radixkv.policies._hash_kernels`): hit, held and evicted tokens,
used / cached / free blocks, valid / duplicate / cached tokens, metadata bytes and
``largest_free_run``. The rules are vLLM's (``vllm/v1/core/block_pool.py``:
``get_new_blocks`` pops the free queue's head and evicts, ``touch`` takes hit blocks out,
``free_blocks`` appends hashed blocks tail first and pushes an unhashed block on the
head; ``kv_cache_manager.py``: the hit is capped at ``(P − 1) // B`` blocks). The design
and its proof obligations are checked by ``tests/unit_pool_model.py`` (plain Python)
and ``tests/test_unit_pool.py`` (these kernels against the per-block ones).

State (int64 arrays, grown by :class:`UnitPool` when a kernel asks for room):

``us`` : counters ``U_*``.
``pc`` : (cap, 7) pieces of the free queue. A block is named by the request *table*
    that cached it and its position there, ``(t, j)``; a piece is a range of positions
    ``lo … hi`` of one table, highest first (queue order). The queue is
    ``[≤ 1 keyless block at the head] [never-used ids, ascending] [pieces]``. Columns
    ``P_*``: queue links, table, range, links of the table's own piece list.
``tb`` : (cap, 10) tables (``T_*``): blocks still cached, offset of its unit records in
    ``ar``, its regular block count R, its piece list, the straddle block (below).
``rc`` : (cap, 2 + 2W) unit records (W = ⌈G / 64⌉ mask words; ``RC_*`` columns):
    the unit's key, the table serving every cached position (or −1: per position, in
    ``rs``), the mask of cached positions (holder count ≥ 1), the mask of positions held
    twice or more. 32 bytes at G ≤ 64: the records a replay touches stay in the CPU cache.
``rs`` : (cap, G) per position the served table of a record (vLLM's first-inserted
    holder, ``BlockHashToBlockMap.get_one_block``), read only when its ``RC_ALL`` is −1.
    Later holders of a position (duplicates) wait in ``ov`` in insertion order; a
    position's holder count is 1 + its waiting holders. A request caches or evicts a
    range of a unit's positions with a few mask operations when it is the only holder
    (the common case); the per-position path handles duplicates.
``um``, ``sm`` : key tables (the row layout of ``_hash_kernels``'s, column 1 = value + 1):
    unit key → record (:func:`unit_keys_into`: one hash round per unit; block k of a
    unit has the unit's key stepped by k, :func:`block_key`); (parent key, first token) of a *straddle* block → its first
    table. A straddle is a full block whose first piece is the end of a unit cut by the
    prompt's end (then output or a unique tail): it has its own key, never hit, but
    its unit part counts for ``held_tokens``.
``ar`` : per table, the record of each of its units.

Other irregular blocks (output, unique tails) have unique keys: only counted.
``largest_free_run`` needs no ids: the keyless blocks are the never-used range and at
most one partial block at the head, adjacent to the range iff it was taken from it.
Reachable keys equal distinct keys (a cached key's parent key is held by a block behind
it in the queue, so the cached keys are closed under prefixes).
"""
from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.core import config as numba_config
from numba.extending import intrinsic

# These kernels inline _hash_kernels; the Numba cache folder is keyed by a hash of every kernel
# source (radixkv.numba_cache.source_key), so a change there recompiles these too.
import radixkv.policies._hash_kernels as K
from radixkv.trace._seq_kernel import kv_seq_into, kv_seq_len

# counters
U_UNUSED = 0  # first never-used block id
U_HEADKL = 1  # keyless blocks at the head (0 or 1)
U_HEADADJ = 2  # that block's id is U_UNUSED − 1
U_QH = 3
U_QT = 4
U_NHASHED = 5
U_NKEYS = 6
U_NDUP = 7
U_EV = 8
U_PFREE = 9
U_PTOP = 10
U_NP = 11
U_TFREE = 12
U_TTOP = 13
U_RFREE = 14
U_RTOP = 15
U_NREC = 16
U_NOV = 17
U_ATOP = 18
U_NSTRAD = 19
NU = 20

P_PREV, P_NEXT, P_TAB, P_LO, P_HI, P_TPREV, P_TNEXT = range(7)
NPC = 7
T_LIVE, T_OFF, T_R, T_PH, T_SLEN, T_SPREV, T_SNEXT, T_GKEY, T_NU, T_FREE = range(10)
NTB = 10

OK = 0
REFUSED = 1
GROW = 3
NOT_UNIT = 4
# growth bits
G_PC, G_TB, G_RC, G_OV, G_AR, G_UM, G_SM = 1, 2, 4, 8, 16, 32, 64

C_PROMPT, C_HIT, C_HELD, C_EVICTED, C_USED, C_CACHED, C_FREE, C_VALID, C_DUP, C_META = range(10)
NC = 10


# ---------------------------------------------------------------------- pieces
@njit(cache=True, inline="always")
def _piece_new(pc, us, tb, t, lo, hi, after):
    """A piece (t, lo … hi) linked into the queue after piece *after* (−1: at the head)."""
    p = us[U_PFREE]
    if p >= 0:
        us[U_PFREE] = pc[p, P_NEXT]
    else:
        p = us[U_PTOP]
        us[U_PTOP] = p + 1
    us[U_NP] += 1
    n = pc[after, P_NEXT] if after >= 0 else us[U_QH]
    pc[p, P_PREV] = after
    pc[p, P_NEXT] = n
    if after >= 0:
        pc[after, P_NEXT] = p
    else:
        us[U_QH] = p
    if n >= 0:
        pc[n, P_PREV] = p
    else:
        us[U_QT] = p
    pc[p, P_TAB] = t
    pc[p, P_LO] = lo
    pc[p, P_HI] = hi
    h = tb[t, T_PH]
    pc[p, P_TPREV] = -1
    pc[p, P_TNEXT] = h
    if h >= 0:
        pc[h, P_TPREV] = p
    tb[t, T_PH] = p
    return p


@njit(cache=True, inline="always")
def _piece_free(pc, us, tb, p):
    a = pc[p, P_PREV]
    n = pc[p, P_NEXT]
    if a >= 0:
        pc[a, P_NEXT] = n
    else:
        us[U_QH] = n
    if n >= 0:
        pc[n, P_PREV] = a
    else:
        us[U_QT] = a
    t = pc[p, P_TAB]
    a = pc[p, P_TPREV]
    n = pc[p, P_TNEXT]
    if a >= 0:
        pc[a, P_TNEXT] = n
    else:
        tb[t, T_PH] = n
    if n >= 0:
        pc[n, P_TPREV] = a
    pc[p, P_NEXT] = us[U_PFREE]
    us[U_PFREE] = p
    us[U_NP] -= 1


@njit(cache=True)
def _cut(pc, us, tb, t, lo, hi):
    """Take positions lo … hi of table t out of the queue (a hit touches them)."""
    j = hi
    while j >= lo:
        p = tb[t, T_PH]
        while not (pc[p, P_LO] <= j <= pc[p, P_HI]):
            p = pc[p, P_TNEXT]
        plo = pc[p, P_LO]
        phi = pc[p, P_HI]
        a = max(lo, plo)
        if j < phi and a > plo:
            pc[p, P_LO] = j + 1
            _piece_new(pc, us, tb, t, plo, a - 1, p)
        elif j < phi:
            pc[p, P_LO] = j + 1
        elif a > plo:
            pc[p, P_HI] = a - 1
        else:
            _piece_free(pc, us, tb, p)
        j = a - 1


# ---------------------------------------------------------------------- keys
#: step between the keys of a unit's blocks (odd: the G keys of a unit are distinct)
_STEP = np.uint64(0xD1B54A32D192ED03)


@njit(cache=True, inline="always")
def unit_keys_into(seg_id, nu, ukeys):
    """Chained keys of a request's first *nu* units: ``ukeys[u]`` = mix(``ukeys[u − 1]``,
    unit u's id), ``ukeys[−1]`` = ``SEED`` (one splitmix64 round per unit,
    :func:`radixkv.policies._hash_kernels._mix`). The key of block k of unit u is
    :func:`block_key` = ``ukeys[u] + k × _STEP``: two blocks get equal keys iff their
    units up to their own and their positions are equal, i.e. iff their whole prefixes
    are (up to 64-bit collisions, as the per-block chain). Only key equality is
    observable, so these keys need not equal the per-block kernels' keys."""
    h = np.uint64(K.SEED)
    for u in range(nu):
        h = K._mix(h, np.uint64(seg_id[u]))
        ukeys[u] = np.int64(h)


@njit(cache=True, inline="always")
def block_key(ukeys, j, G):
    """Key of regular block *j* (unit ``j // G``, position ``j % G``); ``SEED`` for j < 0."""
    if j < 0:
        return K.SEED
    return np.int64(np.uint64(ukeys[j // G]) + np.uint64(j % G) * _STEP)


# ---------------------------------------------------------------------- unit records
# A record row: key, uniform served table (or −1), W words of the cached-position mask,
# W words of the duplicate mask, then G served tables (valid only when column 1 is −1).
RC_KEY = 0  # the unit's key (the free-list link while the row is free)
RC_ALL = 1  # the table serving every cached position, or −1: per position (``rs``)
RC_M1 = 2  # first word of the mask of cached positions (holder count ≥ 1)


@njit(cache=True, inline="always")
def _words(G):
    return (G + 63) >> 6


@intrinsic
def _ctz(typingctx, x):
    """Trailing zero bits of the int64 *x* ≠ 0 (LLVM ``llvm.cttz``)."""
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64, ir.IntType(1)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 1)])

    return sig, codegen


if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run

    def _ctz(x):  # noqa: F811
        """Python twin of the trailing-zero count."""
        x = int(x) & ((1 << 64) - 1)
        return (x & -x).bit_length() - 1


@njit(cache=True, inline="always")
def _wbits(lo, hi):
    """int64 word with bits lo … hi − 1 set (0 ≤ lo < hi ≤ 64)."""
    n = hi - lo
    if n >= 64:
        return np.int64(-1)
    return ((np.int64(1) << n) - 1) << lo


@njit(cache=True, inline="always")
def _rng_any(rc, r, c0, a, b):
    """Any of positions a … b − 1 (a < b) set in the mask starting at column c0."""
    w = a >> 6
    we = (b - 1) >> 6
    while w <= we:
        if rc[r, c0 + w] & _wbits(max(a - 64 * w, 0), min(b - 64 * w, 64)) != 0:
            return True
        w += 1
    return False


@njit(cache=True, inline="always")
def _rng_set(rc, r, c0, a, b):
    w = a >> 6
    we = (b - 1) >> 6
    while w <= we:
        rc[r, c0 + w] |= _wbits(max(a - 64 * w, 0), min(b - 64 * w, 64))
        w += 1


@njit(cache=True, inline="always")
def _rng_clear(rc, r, c0, a, b):
    w = a >> 6
    we = (b - 1) >> 6
    while w <= we:
        rc[r, c0 + w] &= ~_wbits(max(a - 64 * w, 0), min(b - 64 * w, 64))
        w += 1


@njit(cache=True, inline="always")
def _bit(rc, r, c0, k):
    return (rc[r, c0 + (k >> 6)] >> (k & 63)) & 1 != 0


@njit(cache=True, inline="always")
def _empty(rc, r, W):
    for w in range(W):
        if rc[r, RC_M1 + w] != 0:
            return False
    return True


@njit(cache=True, inline="always")
def _lead(rc, r, W):
    """Cached positions 0, 1, … before the first uncached one."""
    n = 0
    for w in range(W):
        x = ~rc[r, RC_M1 + w]
        if x != 0:
            return n + _ctz(x)
        n += 64
    return n


@njit(cache=True, inline="always")
def _split(rc, rs, r, G):
    """Make the served tables per position (column RC_ALL → −1)."""
    t = rc[r, RC_ALL]
    if t >= 0:
        for k in range(G):
            rs[r, k] = t
        rc[r, RC_ALL] = -1


@njit(cache=True, inline="always")
def _rec_find(um, key):
    i = K._find(um, key)
    return um[i, 1] - 1 if i >= 0 else -1


@njit(cache=True, inline="always")
def _rec_get(rc, um, us, key, W):
    """The unit record of *key*, created empty when absent."""
    i = K._find_or_add(um, key)
    if um[i, 1] != 0:
        return um[i, 1] - 1
    r = us[U_RFREE]
    if r >= 0:
        us[U_RFREE] = rc[r, RC_KEY]
    else:
        r = us[U_RTOP]
        us[U_RTOP] = r + 1
    us[U_NREC] += 1
    rc[r, RC_KEY] = key
    rc[r, RC_ALL] = -1
    for w in range(2 * W):
        rc[r, RC_M1 + w] = 0
    um[i, 1] = r + 1
    return r


@njit(cache=True, inline="always")
def _rec_delete(rc, um, us, r):
    K._delete_slot(um, K._find(um, rc[r, RC_KEY]))
    rc[r, RC_KEY] = us[U_RFREE]
    us[U_RFREE] = r
    us[U_NREC] -= 1


@njit(cache=True)
def _add_holder(rc, rs, ov, us, r, k, t, G):
    """Table t holds position k of record r (after any earlier holders)."""
    W = _words(G)
    M2 = RC_M1 + W
    if not _bit(rc, r, RC_M1, k):
        if _empty(rc, r, W):
            rc[r, RC_ALL] = t
        elif rc[r, RC_ALL] != t:
            _split(rc, rs, r, G)
            rs[r, k] = t
        _rng_set(rc, r, RC_M1, k, k + 1)
        us[U_NKEYS] += 1
    else:
        n = us[U_NOV]
        ov[n, 0] = r
        ov[n, 1] = k
        ov[n, 2] = t
        us[U_NOV] = n + 1
        if not _bit(rc, r, M2, k):
            _rng_set(rc, r, M2, k, k + 1)
            us[U_NDUP] += 1
    us[U_NHASHED] += 1


@njit(cache=True)
def _ov_take(ov, us, r, k, t):
    """Remove the first waiting holder of (r, k) (t < 0) or holder t; returns (its table,
    whether another holder of (r, k) still waits)."""
    n = us[U_NOV]
    got = -1
    more = False
    w = 0
    for i in range(n):
        match = ov[i, 0] == r and ov[i, 1] == k
        if match and got < 0 and (t < 0 or ov[i, 2] == t):
            got = ov[i, 2]
            continue
        if match:
            more = True
        if w != i:
            ov[w, 0] = ov[i, 0]
            ov[w, 1] = ov[i, 1]
            ov[w, 2] = ov[i, 2]
        w += 1
    us[U_NOV] = w
    return got, more


@njit(cache=True)
def _drop_holder(rc, rs, ov, um, us, r, k, t, G):
    """Table t no longer holds position k of record r (a waiting holder, if any, is served
    next); the record is deleted when no position is cached."""
    W = _words(G)
    M2 = RC_M1 + W
    s = rc[r, RC_ALL]
    if s < 0:
        s = rs[r, k]
    if s == t:
        if not _bit(rc, r, M2, k):
            _rng_clear(rc, r, RC_M1, k, k + 1)
            us[U_NKEYS] -= 1
        else:
            nt, more = _ov_take(ov, us, r, k, -1)
            _split(rc, rs, r, G)
            rs[r, k] = nt
            if not more:
                _rng_clear(rc, r, M2, k, k + 1)
                us[U_NDUP] -= 1
    else:
        _, more = _ov_take(ov, us, r, k, t)
        if not more:
            _rng_clear(rc, r, M2, k, k + 1)
            us[U_NDUP] -= 1
    us[U_NHASHED] -= 1
    if _empty(rc, r, W):
        _rec_delete(rc, um, us, r)


@njit(cache=True)
def _strad_remove(tb, sm, us, t):
    a = tb[t, T_SPREV]
    n = tb[t, T_SNEXT]
    if a >= 0:
        tb[a, T_SNEXT] = n
    else:
        i = K._find(sm, tb[t, T_GKEY])
        if n >= 0:
            sm[i, 1] = n + 1
        else:
            K._delete_slot(sm, i)
            us[U_NSTRAD] -= 1
    if n >= 0:
        tb[n, T_SPREV] = a


@njit(cache=True, inline="always")
def _evict(tb, rc, rs, ov, um, sm, ar, us, t, lo, hi, G):
    """Blocks (t, hi) … (t, lo) taken from the queue's head lose their keys."""
    R = tb[t, T_R]
    off = tb[t, T_OFF]
    if hi >= R:  # irregular blocks: unique keys, only counted
        n = hi - max(lo, R) + 1
        us[U_NHASHED] -= n
        us[U_NKEYS] -= n
        if lo <= R and tb[t, T_SLEN] > 0:
            _strad_remove(tb, sm, us, t)
    W = _words(G)
    M2 = RC_M1 + W
    j = min(hi, R - 1)
    ulo = lo // G
    umask = um.shape[0] - 1
    while j >= lo:  # regular blocks, one unit at a time
        u = j // G
        a = max(lo, u * G)
        r = ar[off + u]
        # prefetch hints (no result depends on them): the record two units on, the key
        # row of the next one (its record was hinted a unit ago)
        if u - 2 >= ulo:
            K._prefetch_row(rc, ar[off + u - 2])
        if u - 1 >= ulo:
            K._prefetch_row(um, rc[ar[off + u - 1], RC_KEY] & umask)
        b = u * G
        qa = a - b
        qe = j - b + 1
        # t is the only holder of every position: clear them at once
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
            n = qe - qa
            us[U_NKEYS] -= n
            us[U_NHASHED] -= n
            if _empty(rc, r, W):
                _rec_delete(rc, um, us, r)
        else:
            for q in range(qe - 1, qa - 1, -1):
                _drop_holder(rc, rs, ov, um, us, r, q, t, G)
        j = a - 1
    tb[t, T_LIVE] -= hi - lo + 1
    if tb[t, T_LIVE] == 0:
        tb[t, T_FREE] = us[U_TFREE]
        us[U_TFREE] = t


@njit(cache=True, inline="always")
def _pop(pc, tb, rc, rs, ov, um, sm, ar, us, n, nb, G):
    """Take n blocks from the head; returns (evicted, source of the last one: −1 the head
    block again, 1 the never-used range, 0 a piece)."""
    ev = 0
    src = -1
    if n > 0 and us[U_HEADKL] > 0:
        us[U_HEADKL] = 0
        n -= 1
    k = min(n, nb - us[U_UNUSED])
    if k > 0:
        us[U_UNUSED] += k
        n -= k
        src = 1
    while n > 0:
        p = us[U_QH]
        t = pc[p, P_TAB]
        lo = pc[p, P_LO]
        hi = pc[p, P_HI]
        k = min(n, hi - lo + 1)
        if k == hi - lo + 1:
            _piece_free(pc, us, tb, p)
        else:
            pc[p, P_HI] = hi - k
        _evict(tb, rc, rs, ov, um, sm, ar, us, t, hi - k + 1, hi, G)
        ev += k
        n -= k
        src = 0
    us[U_EV] += ev
    return ev, src


# ---------------------------------------------------------------------- a request
@njit(cache=True)
def unit_request(pc, tb, rc, rs, ov, um, sm, ar, us, ukeys, runs, seg_id, seg_end, nseg, B, U, P, kv, nb):
    """One request (admit, decode to *kv*, release) on the unit pool.

    Returns ``(code, hit blocks, held tokens, evicted blocks at admission, grow bits)``;
    ``code`` GROW (nothing changed: grow the arrays of the bits), NOT_UNIT (the segments
    are not units of U tokens then unique content), REFUSED (does not fit the pool).
    Scratch: ``ukeys`` (≥ the request's units), ``runs`` (≥ its blocks, 3 columns).
    """
    G = U // B
    W = _words(G)
    n_full = kv // B
    # units: the leading segments with ids ≥ 0, U tokens each (the last may be cut)
    nu = 0
    while nu < nseg and seg_id[nu] >= 0:
        if (nu + 1 < nseg and seg_id[nu + 1] >= 0 and seg_end[nu] != (nu + 1) * U) or seg_end[nu] > (nu + 1) * U:
            return NOT_UNIT, 0, 0, 0, 0
        nu += 1
    for s in range(nu, nseg):
        if seg_id[s] >= 0:
            return NOT_UNIT, 0, 0, 0, 0
    covered = seg_end[nu - 1] if nu > 0 else 0
    R = covered // B
    if -(-kv // B) > nb - 1:
        return REFUSED, 0, 0, 0, 0
    grow = 0
    if us[U_NP] + 2 * n_full + 3 > pc.shape[0]:
        grow |= G_PC
    if us[U_TTOP] + 1 > tb.shape[0] and us[U_TFREE] < 0:
        grow |= G_TB
    if us[U_NREC] + nu + 1 > rc.shape[0]:
        grow |= G_RC
    if us[U_NOV] + n_full + 1 > ov.shape[0]:
        grow |= G_OV
    if us[U_ATOP] + nu + 1 > ar.shape[0]:
        grow |= G_AR
    if 2 * (us[U_NREC] + nu + 1) > um.shape[0]:
        grow |= G_UM
    if 2 * (us[U_NSTRAD] + 2) > sm.shape[0]:
        grow |= G_SM
    if grow:
        return GROW, 0, 0, 0, grow | ((nu + 1) << 8)  # (bits, then the arena slots needed)
    unit_keys_into(seg_id, nu, ukeys)
    # lookup (FullAttentionManager.find_longest_cache_hit): regular blocks only (the
    # others have unique keys), a unit at a time; hit positions go into runs of one
    # serving table (runs, columns table, first, last position)
    n_look = min(P // B, R)
    h = 0
    nr = 0
    umask = um.shape[0] - 1
    for u in range(min(2, nu)):
        K._prefetch_row(um, ukeys[u] & umask)
    while h < n_look:
        if h // G + 2 < nu:
            K._prefetch_row(um, ukeys[h // G + 2] & umask)
        r = _rec_find(um, ukeys[h // G])
        if r < 0:
            break
        L = min(_lead(rc, r, W), n_look - h)
        if L == 0:
            break
        t = rc[r, RC_ALL]
        if t >= 0:  # one table serves the unit's cached positions
            if nr > 0 and runs[nr - 1, 0] == t:
                runs[nr - 1, 2] = h + L - 1
            else:
                runs[nr, 0] = t
                runs[nr, 1] = h
                runs[nr, 2] = h + L - 1
                nr += 1
        else:
            for q in range(L):
                t = rs[r, q]
                if nr > 0 and runs[nr - 1, 0] == t:
                    runs[nr - 1, 2] = h + q
                else:
                    runs[nr, 0] = t
                    runs[nr, 1] = h + q
                    runs[nr, 2] = h + q
                    nr += 1
        h += L
        if L < G:
            break
    # held tokens: h blocks, then the longest common prefix of the prompt's next block
    # with a block cached under the last hit key
    if h * B >= P:
        held = P
    else:
        start = h * B
        end = min(start + B, P)
        held = start
        if start < covered:
            u = h // G
            sid = seg_id[u]
            off = start - u * U
            lp = min(seg_end[u], end) - start
            pkey = block_key(ukeys, h - 1, G)
            best = 0
            r2 = _rec_find(um, ukeys[u])  # a regular block of this unit at this position
            if r2 >= 0 and _bit(rc, r2, RC_M1, off // B):
                best = lp
            i = K._find(sm, K._group_key(pkey, sid, off))
            if i >= 0:
                t = sm[i, 1] - 1
                while t >= 0:
                    m = min(tb[t, T_SLEN], lp)
                    if m > best:
                        best = m
                    t = tb[t, T_SNEXT]
            held = start + best
    hcap = min(h, (P - 1) // B)
    # touch: runs of hit positions served by one table leave the queue (the runs cut at hcap)
    while nr > 0 and runs[nr - 1, 1] >= hcap:
        nr -= 1
    if nr > 0 and runs[nr - 1, 2] >= hcap:
        runs[nr - 1, 2] = hcap - 1
    for q in range(nr):
        _cut(pc, us, tb, runs[q, 0], runs[q, 1], runs[q, 2])
    # new blocks: the prompt's, then decode's
    n_prompt = -(-P // B) - hcap
    n_kv = -(-kv // B) - hcap
    ev0, src = _pop(pc, tb, rc, rs, ov, um, sm, ar, us, n_prompt, nb, G)
    if n_kv > n_prompt:
        _, src = _pop(pc, tb, rc, rs, ov, um, sm, ar, us, n_kv - n_prompt, nb, G)
    # cache the new full blocks as a table of their own
    if n_full > hcap:
        t = us[U_TFREE]
        if t >= 0:
            us[U_TFREE] = tb[t, T_FREE]
        else:
            t = us[U_TTOP]
            us[U_TTOP] = t + 1
        off0 = us[U_ATOP]
        us[U_ATOP] = off0 + nu
        tb[t, T_LIVE] = n_full - hcap
        tb[t, T_OFF] = off0
        tb[t, T_R] = R
        tb[t, T_PH] = -1
        tb[t, T_SLEN] = 0
        tb[t, T_NU] = nu
        j = hcap
        e = min(R, n_full)
        umask = um.shape[0] - 1
        for u in range(j // G, min(j // G + 2, nu)):
            K._prefetch_row(um, ukeys[u] & umask)
        while j < e:  # regular blocks, one unit at a time
            b = j - j % G
            a2 = min(e, b + G)
            if b // G + 2 < nu:
                K._prefetch_row(um, ukeys[b // G + 2] & umask)
            r = _rec_get(rc, um, us, ukeys[b // G], W)
            ar[off0 + j // G] = r
            qa = j - b
            qe = a2 - b
            if not _rng_any(rc, r, RC_M1, qa, qe):  # no position held yet: t holds them all at once
                if _empty(rc, r, W):
                    rc[r, RC_ALL] = t
                elif rc[r, RC_ALL] != t:
                    _split(rc, rs, r, G)
                    for q in range(qa, qe):
                        rs[r, q] = t
                _rng_set(rc, r, RC_M1, qa, qe)
                n = qe - qa
                us[U_NKEYS] += n
                us[U_NHASHED] += n
            else:
                for q in range(qa, qe):
                    _add_holder(rc, rs, ov, us, r, q, t, G)
            j = a2
        n = n_full - max(hcap, R)
        if n > 0:  # irregular blocks: unique keys, only counted
            us[U_NHASHED] += n
            us[U_NKEYS] += n
        if covered % B != 0 and R < n_full:  # a straddle block at position R
            pkey = block_key(ukeys, R - 1, G)
            gk = K._group_key(pkey, seg_id[nu - 1], R * B - (nu - 1) * U)
            tb[t, T_SLEN] = covered - R * B
            tb[t, T_GKEY] = gk
            tb[t, T_SPREV] = -1
            i = K._find_or_add(sm, gk)
            if sm[i, 1] != 0:
                hd = sm[i, 1] - 1
                tb[t, T_SNEXT] = hd
                tb[hd, T_SPREV] = t
            else:
                tb[t, T_SNEXT] = -1
                us[U_NSTRAD] += 1
            sm[i, 1] = t + 1
        # release tail first: the new blocks, then each run of hit blocks
        _piece_new(pc, us, tb, t, hcap, n_full - 1, us[U_QT])
    for q in range(nr - 1, -1, -1):
        _piece_new(pc, us, tb, runs[q, 0], runs[q, 1], runs[q, 2], us[U_QT])
    if kv % B:  # the partial block goes to the head
        if src >= 0:
            us[U_HEADADJ] = src
        us[U_HEADKL] = 1
    return OK, hcap, held, ev0, 0


@njit(cache=True)
def unit_span(pc, tb, rc, rs, ov, um, sm, ar, us, ids, id_offsets, prompt_len, output_len, unit_tokens, i0, i1,
              nb, B, key_bytes, dup_bytes, out):
    """Requests ``i0 … i1−1`` of a hash-id trace without output ids; returns
    ``(next, code, grow bits)``: code OK when all ran, otherwise request ``next`` stopped
    with that code (nothing changed for it)."""
    n_max = 1
    kv_max = 1
    empty = np.zeros(1, dtype=np.int64)
    for i in range(i0, i1):
        m = kv_seq_len(id_offsets, empty, False, prompt_len, output_len, unit_tokens, i)
        n_max = max(n_max, m)
        kv_max = max(kv_max, prompt_len[i] + max(output_len[i] - 1, 0))
    sid = np.empty(n_max, dtype=np.int64)
    send = np.empty(n_max, dtype=np.int64)
    nbk = kv_max // B + 1
    ukeys = np.empty(n_max, dtype=np.int64)
    runs = np.empty((nbk, 3), dtype=np.int64)
    for i in range(i0, i1):
        P = prompt_len[i]
        kv = P + max(output_len[i] - 1, 0)
        m = kv_seq_into(ids, id_offsets, ids[:0], empty, False, prompt_len, output_len, unit_tokens, i, sid, send)
        before = us[U_EV]
        # the segments are sid[:m], send[:m]: the key kernel reads the arrays' length as the
        # segment count, and the rest of these scratch arrays holds an earlier request's
        code, hcap, held, ev0, grow = unit_request(pc, tb, rc, rs, ov, um, sm, ar, us, ukeys, runs, sid[:m],
                                                   send[:m], m, B, unit_tokens, P, kv, nb)
        if code != OK:
            return i, code, grow
        r = i - i0
        nh = us[U_NHASHED]
        nk = us[U_NKEYS]
        out[r, C_PROMPT] = P
        out[r, C_HIT] = hcap * B
        out[r, C_HELD] = held if held < P else P
        out[r, C_EVICTED] = (us[U_EV] - before) * B
        out[r, C_USED] = 0
        out[r, C_CACHED] = nh
        out[r, C_FREE] = nb - 1 - nh
        out[r, C_VALID] = nh * B
        out[r, C_DUP] = (nh - nk) * B
        out[r, C_META] = nk * key_bytes + us[U_NDUP] * dup_bytes
    return i1, OK, 0


@njit(cache=True)
def unit_one(pc, tb, rc, rs, ov, um, sm, ar, us, seg_id, seg_end, B, U, P, kv, nb):
    """:func:`unit_request` for one KVSeq (its own scratch)."""
    nbk = kv // B + 1
    ukeys = np.empty(seg_id.shape[0] + 1, dtype=np.int64)
    runs = np.empty((nbk, 3), dtype=np.int64)
    before = us[U_EV]
    code, hcap, held, ev0, grow = unit_request(pc, tb, rc, rs, ov, um, sm, ar, us, ukeys, runs, seg_id, seg_end,
                                               seg_id.shape[0], B, U, P, kv, nb)
    return code, hcap, held, ev0, us[U_EV] - before, grow


@njit(cache=True)
def rehash(old, new):
    """Insert every occupied row of key table *old* into the empty table *new* (int64,
    shape (cap, w), any width w, cap a power of 2; column 0 the key, column 1 non-zero iff
    the row is occupied — the rule of :func:`radixkv.policies._hash_kernels._find`). Also
    grows the concurrent piece pool's tables (``radixkv.replay._conc_vllm_piece_kernels``)."""
    for i in range(old.shape[0]):
        if old[i, 1] != 0:
            j = K._slot_for_insert(new, old[i, 0])
            for c in range(old.shape[1]):
                new[j, c] = old[i, c]


@njit(cache=True)
def compact_arena(tb, us, ar, new):
    """Copy the live tables' unit records into *new* (packed); returns its top."""
    top = 0
    for t in range(us[U_TTOP]):
        if tb[t, T_LIVE] > 0:
            o = tb[t, T_OFF]
            n = tb[t, T_NU]
            for k in range(n):
                new[top + k] = ar[o + k]
            tb[t, T_OFF] = top
            top += n
    return top


class UnitPool:
    """The arrays of the unit-granular pool and the Python side of its kernels.

    Parameters
    ----------
    num_gpu_blocks : int
        As :class:`~radixkv.policies.block_hash.BlockHashCache` (block 0 is the null block).
    block_size : int
        B (≥ 2).
    unit_tokens : int
        U, a multiple of B.

    Host memory grows with what is cached, not with the pool: 56 B per piece, 80 B per
    table, (16 + 16 W + 8 G) B per unit record (W = ⌈G / 64⌉; its served tables apart),
    24 B per waiting duplicate, 8 B per table unit, two key tables of 32 B rows at load
    ≤ 1/2.
    """

    def __init__(self, num_gpu_blocks: int, block_size: int, unit_tokens: int):
        self.nb = int(num_gpu_blocks)
        self.B = int(block_size)
        self.U = int(unit_tokens)
        self.G = self.U // self.B
        self.us = np.zeros(NU, dtype=np.int64)
        self.us[U_UNUSED] = 1
        for c in (U_QH, U_QT, U_PFREE, U_TFREE, U_RFREE):
            self.us[c] = -1
        self.pc = np.zeros((256, NPC), dtype=np.int64)
        self.tb = np.zeros((64, NTB), dtype=np.int64)
        self.rc = np.zeros((64, RC_M1 + 2 * ((self.G + 63) // 64)), dtype=np.int64)
        self.rs = np.zeros((64, self.G), dtype=np.int64)
        self.ov = np.zeros((256, 3), dtype=np.int64)
        self.ar = np.zeros(1024, dtype=np.int64)
        self.um = np.zeros((128, 4), dtype=np.int64)
        self.sm = np.zeros((64, 4), dtype=np.int64)

    def _args(self):
        return self.pc, self.tb, self.rc, self.rs, self.ov, self.um, self.sm, self.ar, self.us

    def grow(self, bits: int) -> None:
        """Double the arrays named by the low 8 bits of *bits* (``G_*``); the arena is
        compacted, then sized for ``bits >> 8`` more slots."""
        def bigger(a):
            b = np.zeros((2 * a.shape[0],) + a.shape[1:], dtype=a.dtype)
            b[: a.shape[0]] = a
            return b

        if bits & G_PC:
            self.pc = bigger(self.pc)
        if bits & G_TB:
            self.tb = bigger(self.tb)
        if bits & G_RC:
            self.rc = bigger(self.rc)
            self.rs = bigger(self.rs)
        if bits & G_OV:
            self.ov = bigger(self.ov)
        if bits & G_AR:
            new = np.zeros(self.ar.shape[0], dtype=np.int64)
            top = compact_arena(self.tb, self.us, self.ar, new)
            size = new.shape[0]
            while size < 2 * (top + (bits >> 8)):
                size *= 2
            if size > new.shape[0]:
                new2 = np.zeros(size, dtype=np.int64)
                new2[:top] = new[:top]
                new = new2
            self.ar = new
            self.us[U_ATOP] = top
        for bit, name in ((G_UM, "um"), (G_SM, "sm")):
            if bits & bit:
                old = getattr(self, name)
                new = np.zeros((2 * old.shape[0], 4), dtype=np.int64)
                rehash(old, new)
                setattr(self, name, new)

    def run_request(self, seq):
        """(code, hit blocks, held tokens, evicted blocks at admission, evicted blocks in all)."""
        while True:
            code, h, held, ev0, ev, grow = unit_one(*self._args(), seq.seg_id, seq.seg_end, self.B, self.U,
                                                    seq.prompt_len, seq.kv_len, self.nb)
            if code != GROW:
                return code, int(h), int(held), int(ev0), int(ev)
            self.grow(int(grow))

    def span(self, trace, i0, i1, key_bytes, dup_bytes):
        """Rows ``i0 …`` of the sequential replay: (next, code, out rows)."""
        out = np.zeros((i1 - i0, NC), dtype=np.int64)
        i = i0
        while True:
            nxt, code, grow = unit_span(*self._args(), trace.ids, trace.id_offsets, trace.prompt_len,
                                        trace.output_len, int(trace.unit_tokens), i, i1, self.nb, self.B,
                                        key_bytes, dup_bytes, out[i - i0:])
            i = int(nxt)
            if code != GROW:
                return i, int(code), out
            self.grow(int(grow))

    def largest_free_run(self) -> int:
        """Longest run of consecutive free block ids (no ids kept: see the module docstring)."""
        us = self.us
        unused = self.nb - int(us[U_UNUSED])
        kl = int(us[U_HEADKL])
        if unused:
            return max(unused + (1 if kl and us[U_HEADADJ] == 1 else 0), kl)
        return kl

    def counters(self):
        """(hashed blocks, distinct keys, keys held twice or more, evicted blocks)."""
        us = self.us
        return int(us[U_NHASHED]), int(us[U_NKEYS]), int(us[U_NDUP]), int(us[U_EV])


def warm(block_size: int) -> None:
    """Compile (or load) these kernels on a tiny hash-id trace (2 blocks per unit)."""
    from radixkv.trace.types import Trace

    B = int(block_size)
    t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0.0, 0.0], prompt_len=[4 * B - 1, 3 * B],
                            output_len=[2, 0], prompt_ids=[[1, 2], [1, 3]], unit_tokens=2 * B,
                            partial_last_unit=True)
    pool = UnitPool(6, B, 2 * B)
    pool.span(t, 0, 1, 1, 1)
    pool.run_request(t.kv_seq(1))
