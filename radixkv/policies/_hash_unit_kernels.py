"""The piece pool: :class:`radixkv.policies.block_hash.BlockHashCache`'s vLLM block pool
without block ids, for hash-id traces, under both replays (Numba kernels and their
Python owners).

It applies to a hash-id trace whose unit U is a multiple of ``block_size`` B (G = U / B
blocks per unit), ids ≥ 0, no output ids, on a fresh pool. The sequential replay drives
it one request at a time (:func:`seq_span`, :class:`UnitPool`:
``BlockHashCache.replay_span``); the compiled concurrent loop drives it with requests
that run at the same time, hold blocks, share hit blocks and grow block by block
(:mod:`radixkv.replay._conc_vllm_piece_kernels` registers these functions as the loop's
pool operations). Both give the per-block kernels' records
(:mod:`radixkv.policies._hash_kernels`; ``tests/test_unit_pool.py``,
``tests/test_conc_vllm_unit.py``); the design was first written as plain Python
(``tests/unit_pool_model.py``).

The rules are vLLM's, each written once here (``vllm/v1/core/block_pool.py``):
``get_new_blocks`` pops the free queue's head and evicts the popped block's hash
(:func:`_pop`, :func:`_evict`), ``touch`` takes a hit block with ref_cnt 0 out of the
queue (:func:`admit`), ``cache_full_blocks`` hashes a request's full blocks
(:func:`_cache`), ``free_blocks`` releases a request's blocks tail first — a block whose
ref_cnt reaches 0 goes to the queue's tail when it has a hash, to its head otherwise
(:func:`release`); ``BlockHashToBlockMap`` serves the first-inserted holder of a hash;
``kv_cache_manager.py``: ``get_computed_blocks`` caps a hit at ``(n − 1) // B`` blocks
(:func:`admit`, :func:`head_lookup`) and ``allocate_slots`` takes the blocks a request's
new tokens need (:func:`admit`, :func:`extend`, :func:`grow_deferred`). Only block ids are
gone: no result depends on them.

How blocks are named. Every admission makes a *table* (its request's own blocks: positions
``h0 … h0 + nown − 1`` of the request's block table, after its ``h0`` hit blocks). A
block is (table, position). The hit blocks of a running request are *runs* (table, lo,
hi) of another table's blocks at the same positions (block j of every request covers
tokens jB … (j+1)B, so a hit is position-aligned).

The free queue is ``[Z keyless blocks] [pieces]``: a freed block without a hash goes to
the head and a freed hashed block to the tail, and pops take the head, so every keyless
block (never used, or a request's partial last block) is ahead of every hashed one and
keyless blocks are interchangeable: a count. A *piece* is a range of one table's
positions ``lo … hi``, highest first (the order a release appends them), linked in the
queue and in its table's piece list. Touching a hit range cuts it out of its pieces
(:func:`_cut`).

Reference counts without ids: block (t, j) is held by t's owner while it runs, and by each
running request whose hit runs cover j. A released block enters the queue when nothing
covers it: when no run is on t (``T_EXT`` = 0, always so in the sequential replay) a whole
range moves at once; otherwise the covered positions are worked out from the running
requests' runs (:func:`_gaps`).

Keys: block k of unit u of a request is *regular* when wholly inside the unit (j < R);
it is named by (unit key, k), the unit key chaining the request's unit ids
(:func:`unit_keys_all`: equal iff the prefixes up to the unit are, up to 64-bit
collisions; only key equality is observable, so these need not equal the per-block
kernels' keys). Its holders are in the *unit record* of the key: ``rc`` (cap, 2 + 2W)
rows (``RC_*``; W = ⌈G / 64⌉ mask words): the key, the table serving every cached
position (or −1: per position, in ``rs`` (cap, G)), the mask of cached positions
(holder count ≥ 1) and of positions held twice or more — 32 B at G ≤ 64, so the records a
replay touches stay in the CPU cache; later holders of a position (duplicates) wait in
``ov`` in insertion order (a holder count is 1 + its waiting holders). A request caches
or evicts a range of a unit's positions with a few mask operations when it is the only
holder (the common case); the per-position path handles duplicates. ``um`` maps a unit
key to its record (``_hash_kernels``' key-table rows, column 1 = record + 1); ``ur``
keeps, per unit of a request, the record its tables' blocks are in. An irregular block
(a cut unit's end, a unique tail, output) has a key only its own request produces — only
that request, re-admitted after a preemption, can hit it, and it finds the served holder
by walking its own tables oldest first (:func:`_irr_served`). A *straddle* (a full block
that starts in the cut last unit) is indexed by (unit key, offset) in ``sm`` for
``held_tokens``. Reachable keys equal distinct keys (a cached key's parent key is held
by a block behind it in the queue, so the cached keys are closed under prefixes).

The sequential driver adds the one record the concurrent loop has no use for,
``largest_free_run``, without ids: between requests the keyless blocks are the
never-used ids (a range) and at most one partial block at the head, adjacent to that
range iff it was taken from it (``U_UNUSED``, ``U_HEADKL``, ``U_HEADADJ``).

Decode runs (the concurrent loop's fast-forward) take their blocks without popping them:
the blocks a run takes are the queue's first ones whichever request takes them, and
nothing else enters or leaves the queue during the run, so :func:`grow_deferred` only
counts them, the pool's counters are reported as if they were popped (every pop past the
keyless head blocks evicts one hashed block), and the next other operation pops them in
one go (:func:`_flush`) — one range operation per piece instead of one pop per block.

Array bounds: pieces, live tables, unit records, waiting duplicates and straddles are
each at most the pool's block count (plus the running tables), so :func:`new_pool`
sizes them once (``np.zeros``: pages never touched cost nothing); the two key tables
start small (a table the CPU caches hold) and grow between requests or steps
(:func:`grow_tables`).

The drivers' operations call the kernels here as functions, not inlined: inlined below
an operation's own inlining, Numba's IR inliner lost array writes of a nested inlined
kernel (seen with ``_cache`` under ``extend``; ``tests/test_conc_vllm_unit.py`` caught
it).
"""
from __future__ import annotations

from collections import namedtuple

import llvmlite.ir as ir
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.core import config as numba_config
from numba.extending import intrinsic

# The key tables use _hash_kernels' row layout and probing; the Numba cache folder is keyed
# by a hash of every kernel source (radixkv.numba_cache.source_key), so a change there
# recompiles these too.
import radixkv.policies._hash_kernels as K
from radixkv.policies._borrowed import borrow, borrow_py

# counters (``us``, int64)
U_UNUSED = 0  # sequential driver: first never-used block id (for largest_free_run)
U_HEADKL = 1  # sequential driver: keyless blocks at the head that are not never-used (0 or 1)
U_HEADADJ = 2  # sequential driver: that block's id is U_UNUSED − 1
U_QH = 3  # the queue's first piece (−1: none)
U_QT = 4  # its last piece
U_NHASHED = 5  # blocks with a hash (cached or held)
U_NKEYS = 6  # distinct hashes
U_NDUP = 7  # hashes held by two blocks or more
U_EV = 8  # evicted blocks, in all
U_PFREE = 9  # free-list head of the piece rows
U_PTOP = 10  # piece rows ever used
U_NP = 11  # pieces
U_TFREE = 12  # free-list head of the table rows
U_TTOP = 13  # table rows ever used
U_RFREE = 14  # free-list head of the unit-record rows
U_RTOP = 15  # unit-record rows ever used
U_NREC = 16  # unit records
U_NOV = 17  # waiting duplicate holders (rows of ``ov``)
U_NSTRAD = 18  # straddle groups
U_Z = 19  # keyless blocks at the queue's head
U_NUSED = 20  # blocks with ref_cnt > 0
U_NCACHED = 21  # hashed blocks in the queue
U_PEND = 22  # blocks a decode run took, not yet popped (:func:`grow_deferred`)
NUP = 23

# piece columns (``pc``)
P_PREV, P_NEXT, P_TAB, P_LO, P_HI, P_TPREV, P_TNEXT = range(7)
NPC = 7
# table columns (``tb``)
T_LIVE = 0  # the table's hashed blocks
T_PH = 1  # its piece list (−1: none)
T_SLEN = 2  # tokens of its straddle block in the cut unit (0: none cached)
T_SPREV = 3  # the straddle group's links
T_SNEXT = 4
T_GKEY = 5  # the straddle group's key
T_FREE = 6  # free-list link while the row is free
T_OWN = 7  # 1 while the owner runs
T_REQ = 8  # the request
T_H0 = 9  # first own position
T_NOWN = 10  # own blocks allocated
T_HC = 11  # end of the hashed own positions (exclusive)
T_EXT = 12  # running hit runs on this table
T_RPREV = 13  # the request's tables, oldest first
T_RNEXT = 14
NTP = 15

# per-request rows of ``rinfo`` (:func:`request_info`): regular blocks R, covered tokens
# (the units' tokens in the prompt), unit ids, straddle position (−1: none), the
# straddle's first token in its unit
RI_R, RI_COV, RI_NU, RI_SJ, RI_SOFF = range(5)
# parameters (prm)
M_B, M_G, M_U, M_W, M_NB = range(5)

OK = 0
REFUSED = 1
GROW = 3  # sequential driver: a key table may fill past half (grow_tables), call again
NOT_UNIT = 4  # sequential driver: the request's segments are not units of U tokens then unique content

# columns of the sequential driver's rows (:func:`seq_span`)
C_PROMPT, C_HIT, C_HELD, C_EVICTED, C_USED, C_CACHED, C_FREE, C_VALID, C_DUP, C_META, C_EV0 = range(11)
NC = 11

#: the pool value (:func:`new_pool`) both drivers pass around: the arrays as fields (flat:
#: a field read costs one reference count), ``block_size`` B.
PiecePool = namedtuple("PiecePool", ["pc", "tb", "rc", "rs", "ov", "um", "sm", "us", "rt", "uk", "ur", "ido",
                                     "rinfo", "prm", "cov", "gap", "block_size"])

if numba_config.DISABLE_JIT:  # plain Python: no views to make
    borrow = borrow_py  # noqa: F811

_STRAD = np.uint64(0x5851F42D4C957F2D)

# ---------------------------------------------------------------------- rows and pieces
@njit(cache=True)
def _take_row(a, link, us, free, top):
    """A row of *a* for a new piece, table or unit record: the head of its free list
    (``us[free]``, −1: empty; linked through column *link*), else the next row never used
    (``us[top]``)."""
    r = us[free]
    if r >= 0:
        us[free] = a[r, link]
    else:
        r = us[top]
        us[top] = r + 1
    return r


@njit(cache=True)
def _unlink(a, r, prev, nxt):
    """Row *r* leaves the doubly linked list threaded through columns *prev* and *nxt* of
    *a*: its neighbours are linked to each other. Returns (its previous, its next row);
    −1 where it was the first / last, whose list head / tail the caller moves."""
    p = a[r, prev]
    n = a[r, nxt]
    if p >= 0:
        a[p, nxt] = n
    if n >= 0:
        a[n, prev] = p
    return p, n


@njit(cache=True, inline="always")
def _piece_new(pc, us, tb, t, lo, hi, after):
    """A piece (t, lo … hi) linked into the queue after piece *after* (−1: at the head)."""
    p = _take_row(pc, P_NEXT, us, U_PFREE, U_PTOP)
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
    """Piece *p* leaves the queue and its table's piece list; its row is free."""
    a, n = _unlink(pc, p, P_PREV, P_NEXT)
    if a < 0:
        us[U_QH] = n
    if n < 0:
        us[U_QT] = a
    a, n = _unlink(pc, p, P_TPREV, P_TNEXT)
    if a < 0:
        tb[pc[p, P_TAB], T_PH] = n
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



def request_info(id_offsets, prompt_len, unit_tokens, block_size):
    """The per-request facts ``rinfo`` int64 (5, n) (rows ``RI_*``) of a hash-id trace's
    requests (``id_offsets`` int64 (n + 1,), ``prompt_len`` int64 (n,) tokens, unit U,
    block B): the units' tokens in the prompt ``covered`` = min(ids × U, P) (0 without
    ids), regular blocks R = covered // B, unit ids, the straddle position (R when
    ``covered`` is not a multiple of B, else −1) and its first token's offset in the last
    unit (R B − (ids − 1) U)."""
    U = int(unit_tokens)
    B = int(block_size)
    nu = np.diff(np.asarray(id_offsets, dtype=np.int64))
    covered = np.where(nu > 0, np.minimum(nu * U, np.asarray(prompt_len, dtype=np.int64)), 0)
    R = covered // B
    sj = np.where(covered % B != 0, R, -1)
    soff = np.where(nu > 0, R * B - (nu - 1) * U, 0)
    return np.ascontiguousarray(np.stack((R, covered, nu, sj, soff)), dtype=np.int64)


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
    r = _take_row(rc, RC_KEY, us, U_RFREE, U_RTOP)
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


# ---------------------------------------------------------------------- tables
@njit(cache=True, inline="always")
def _tab_new(tb, us, rt, i, h0):
    """A table for an admission of request *i* after *h0* hit blocks (owner running)."""
    t = _take_row(tb, T_FREE, us, U_TFREE, U_TTOP)
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
    a, b = _unlink(tb, t, T_RPREV, T_RNEXT)
    if a < 0:
        rt[0, i] = b
    if b < 0:
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


@njit(cache=True)
def _strad_remove(tb, sm, us, t):
    """Table *t*'s straddle block leaves its group (the group's key row goes with its last)."""
    a, n = _unlink(tb, t, T_SPREV, T_SNEXT)
    if a < 0:
        i = K._find(sm, tb[t, T_GKEY])
        if n >= 0:
            sm[i, 1] = n + 1
        else:
            K._delete_slot(sm, i)
            us[U_NSTRAD] -= 1


# ---------------------------------------------------------------------- keys held and dropped
@njit(cache=True, inline="always")
def _evict(pol, t, lo, hi):
    """Blocks (t, hi) … (t, lo), popped from the queue's head, lose their hashes
    (``BlockPool._maybe_evict_cached_block``)."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ur, ido, rinfo, prm = pol
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
    ulo = a0 + lo // G
    umask = um.shape[0] - 1
    while j >= lo:  # regular blocks, a unit at a time
        u = j // G
        a = max(lo, u * G)
        r = ur[a0 + u]
        # prefetch hints (no result depends on them): the record two units on, the key
        # row of the next unit (its record was hinted a unit ago)
        if a0 + u - 2 >= ulo:
            K._prefetch_row(rc, ur[a0 + u - 2])
        if a0 + u - 1 >= ulo:
            K._prefetch_row(um, uk[a0 + u - 1] & umask)
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
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ur, ido, rinfo, prm = pol
    G = prm[M_G]
    W = prm[M_W]
    i = tb[t, T_REQ]
    R = rinfo[RI_R, i]
    a0 = ido[i]
    j = lo
    e = min(R, hi)
    umask = um.shape[0] - 1
    ue = a0 + (e + G - 1) // G  # past the last unit cached here
    if j < e:
        for x in range(a0 + j // G, min(a0 + j // G + 2, ue)):
            K._prefetch_row(um, uk[x] & umask)
    while j < e:  # regular blocks, a unit at a time
        u = j // G
        b = u * G
        a2 = min(e, b + G)
        if a0 + u + 2 < ue:  # a hint: the key row of the unit two on
            K._prefetch_row(um, uk[a0 + u + 2] & umask)
        r = _rec_get(rc, um, us, uk[a0 + u], W)
        ur[a0 + u] = r
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
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ur, ido, rinfo, prm = pol
    B = prm[M_B]
    G = prm[M_G]
    W = prm[M_W]
    n_look = L // B
    R = rinfo[RI_R, i]
    a0 = ido[i]
    h = 0
    nr = 0
    umask = um.shape[0] - 1
    ue = a0 + rinfo[RI_NU, i]
    for x in range(a0, min(a0 + 2, ue)):
        K._prefetch_row(um, uk[x] & umask)
    while h < n_look and h < R:  # regular blocks, a unit at a time
        u = h // G
        if a0 + u + 2 < ue:  # a hint: the key row of the unit two on
            K._prefetch_row(um, uk[a0 + u + 2] & umask)
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
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ur, ido, rinfo, prm = pol
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


@njit(cache=True, inline="always")
def _hit(pol, i, L, runs):
    """:func:`lookup` of request *i*'s first *L* tokens with the hit capped at
    ``(L − 1) // B`` blocks (``KVCacheManager.get_computed_blocks``: the last token is
    always computed, so a fully cached prompt still computes its last block): returns
    (uncapped hit blocks, capped hit blocks, count of the runs ``runs[:nr]`` cut at the
    cap)."""
    h, nr = lookup(pol, i, L, runs)
    hcap = K.hit_cap(h, L, pol[13][M_B])
    while nr > 0 and runs[nr - 1, 1] >= hcap:
        nr -= 1
    if nr > 0 and runs[nr - 1, 2] >= hcap:
        runs[nr - 1, 2] = hcap - 1
    return h, hcap, nr


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


# ---------------------------------------------------------------------- a request's pool calls (both drivers)
@njit(cache=True)
def admit(pol, sp, sl, i, n_tok, asked, first, gap):
    """Admit request *i* into slot *sl* of the per-slot tuple *sp* (:func:`_sp`) of the
    pool tuple *pol* (:func:`_pol`): look up its first *n_tok* tokens, cap the hit at
    ``(n_tok − 1) // B`` blocks (``KVCacheManager.get_computed_blocks``: the last token
    is always computed), touch the hit blocks, take the blocks of max(*asked*, hit)
    tokens and hash the full ones (``allocate_slots``, ``cache_blocks``) — the rule of
    ``_hash_kernels.admit`` with ``prompt_len`` = ``lookup_len`` = *n_tok*, ``n_tokens``
    = *asked*; ``held`` (tokens) only for a *first* admission, else 0. Returns ``(code,
    hit blocks, held, evicted blocks, blocks)``; on REFUSED nothing changed."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ur, ido, rinfo, prm = pol
    s_tab = sp[0]
    s_nr = sp[1]
    runs3 = sp[2]
    B = prm[M_B]
    runs = runs3[sl]
    h, hcap, nr = _hit(pol, i, n_tok, runs)
    held = held_tokens(pol, i, h, n_tok) if first else 0
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
    B = pol[13][M_B]
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
    B = pol[13][M_B]
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
    _piece_new(pol[0], us, pol[1], t, lo, hi, us[U_QT])
    c = hi - lo + 1
    us[U_NUSED] -= c
    us[U_NCACHED] += c


@njit(cache=True)
def release(pol, sp, sl, gap):
    """``KVCacheManager.free`` of slot *sl*'s request: its blocks tail first — its own
    (a partial last block to the head), then its hit runs, last first."""
    pc, tb, rc, rs, ov, um, sm, us, rt, uk, ur, ido, rinfo, prm = pol
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


@njit(cache=True)
def head_lookup(pol, sp, runs, i, L, count_free, gap):
    """``pool_lookup``: (hit blocks capped at ``(L − 1) // B``, those with ref_cnt 0 when
    *count_free*) of request *i*'s first *L* tokens; the hit runs in *runs*."""
    if pol[7][U_PEND] != 0:
        _flush(pol)
    h, hcap, nr = _hit(pol, i, L, runs)
    if not count_free:
        return hcap, 0
    return hcap, touch_count(pol, sp, runs, nr, gap)


# ---------------------------------------------------------------------- the pool value
def new_pool(num_gpu_blocks, block_size, unit_tokens, ids, id_offsets, rinfo, max_running):
    """:class:`PiecePool` ``(pc, tb, rc, rs, ov, um, sm, us, rt, uk, ur, ido, rinfo, prm,
    cov, gap, B)`` of an empty pool for at most *max_running* running requests: every
    usable block (1 … num_gpu_blocks − 1; block 0 is vLLM's null block) keyless in the
    queue (``BlockPool.__init__``). *ids*, *id_offsets*: the trace's unit ids (int64, ≥ 0)
    and each request's range of them; *rinfo* int64 (5, n) the per-request facts ``RI_*``
    (:func:`request_info`).

    ``pc`` int64 (nb + 2, 7) pieces; ``tb`` int64 (nb + 2 + n + 2, NTP) tables (live ones:
    at most one per cached block plus the running ones); ``rc`` int64 (nb + 2, 2 + 2W),
    ``rs`` int64 (nb + 2, G), ``ov`` int64 (nb + 2, 3) the unit records, their served
    tables and the waiting duplicate holders; ``um``, ``sm`` the unit-key and straddle
    key tables (rows of 4 int64, a power of 2; grown by :func:`grow_tables`); ``us``
    int64 (NUP,) counters; ``rt`` int64 (2, n) each request's oldest and newest table
    (−1: none); ``uk`` int64 unit keys parallel to ``ids`` (:func:`unit_keys_all`),
    ``ur`` int64 parallel to them: the unit record of each unit a table of its request
    holds; ``ido`` the id offsets; ``prm`` int64 (B, G, U, W, nb); ``cov``, ``gap``
    int64 (4 max_running + 64, 2) scratch of :func:`_gaps`. Arrays are ``np.zeros``:
    pages never touched cost nothing."""
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
    us[U_UNUSED] = 1
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
    return PiecePool(pc, tb, rc, rs, ov, um, sm, us, rt, uk, np.zeros_like(uk),
                     np.ascontiguousarray(id_offsets, dtype=np.int64), np.ascontiguousarray(rinfo, dtype=np.int64),
                     prm, np.zeros((scr, 2), dtype=np.int64), np.zeros((scr, 2), dtype=np.int64), B)


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@njit(cache=True, inline="always")
def _pol(pool):
    """The kernels' pool tuple of a :class:`PiecePool`: borrowed views of its arrays
    (:mod:`radixkv.policies._borrowed`: no reference counts where the kernels bind them;
    valid for the call of the function whose argument *pool* is)."""
    return (borrow(pool.pc), borrow(pool.tb), borrow(pool.rc), borrow(pool.rs), borrow(pool.ov), borrow(pool.um),
            borrow(pool.sm), borrow(pool.us), borrow(pool.rt), borrow(pool.uk), borrow(pool.ur), borrow(pool.ido),
            borrow(pool.rinfo), borrow(pool.prm))


@njit(cache=True, inline="always")
def _sp(pool, ps):
    """The kernels' per-slot tuple: the driver's ``ps`` (tables, run counts, runs)
    borrowed, then the pool's ``cov`` scratch as it is (a kernel may use a bigger one)."""
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


def grow_tables(pool, units_step, strad_step):
    """The :class:`PiecePool` with its unit-key and straddle tables doubled until
    *units_step* more unit records and *strad_step* more straddle groups fit at load
    ≤ 1/2 (rows rehashed, :func:`rehash`)."""
    us = pool.us
    new = {}
    for name, need in (("um", int(us[U_NREC]) + units_step), ("sm", int(us[U_NSTRAD]) + strad_step)):
        old = getattr(pool, name)
        size = old.shape[0]
        while 2 * need > size:
            size *= 2
        if size > old.shape[0]:
            new[name] = np.zeros((size, old.shape[1]), dtype=np.int64)
            rehash(old, new[name])
    return pool._replace(**new) if new else pool


@njit(cache=True)
def rehash(old, new):
    """Insert every occupied row of key table *old* into the empty table *new* (int64,
    shape (cap, w), any width w, cap a power of 2; column 0 the key, column 1 non-zero iff
    the row is occupied — the rule of :func:`radixkv.policies._hash_kernels._find`)."""
    for i in range(old.shape[0]):
        if old[i, 1] != 0:
            j = K._slot_for_insert(new, old[i, 0])
            for c in range(old.shape[1]):
                new[j, c] = old[i, c]


# ---------------------------------------------------------------------- the sequential driver
@njit(cache=True)
def seq_span(pool, ps, base, prompt_len, output_len, i0, i1, stop, key_bytes, dup_bytes, out):
    """Rows ``i0 … i1 − 1`` of the sequential replay on the :class:`PiecePool` *pool*: row x
    is pool request ``base + x``, prompt ``prompt_len[x]`` tokens (int64), KV extent
    kv = P + max(``output_len[x]`` − 1, 0); each is admitted (:func:`admit`, all P
    tokens), grown to kv (:func:`extend`) and released (:func:`release`) alone on the
    pool, in slot 0 of *ps* (:func:`new_slots`, 1 slot of ≥ ⌈kv / B⌉ blocks).

    Writes row x − i0 of *out* (int64, columns ``C_*``): prompt tokens, hit tokens (the
    capped hit × B), held tokens (≤ P), evicted tokens (admission and decode), used blocks
    (0: none runs between requests), cached blocks (hashed ones, all in the queue), free
    blocks (nb − 1 − cached), valid tokens (hashed × B), duplicate tokens ((hashed −
    distinct hashes) × B), metadata bytes (distinct hashes × *key_bytes* + hashes held
    twice or more × *dup_bytes*), blocks evicted at admission. Returns ``(next, code)``:
    OK when every row ran; otherwise row ``next`` did not run (nothing changed for it):
    REFUSED (⌈kv / B⌉ > nb − 1 blocks: it cannot fit), GROW (a key table could fill past
    half: :func:`grow_tables`, call again), NOT_UNIT (``next == stop``)."""
    pol = _pol(pool)
    sp = _sp(pool, ps)
    um = pol[5]
    sm = pol[6]
    us = pol[7]
    rinfo = pol[12]
    nb = pol[13][M_NB]
    B = pool.block_size
    gap = pool.gap
    for x in range(i0, i1):
        if x == stop:
            return x, NOT_UNIT
        P = prompt_len[x]
        kv = P + max(output_len[x] - 1, 0)
        if (kv + B - 1) // B > nb - 1:
            return x, REFUSED
        i = base + x
        if 2 * (us[U_NREC] + rinfo[RI_NU, i] + 1) > um.shape[0] or 2 * (us[U_NSTRAD] + 2) > sm.shape[0]:
            return x, GROW
        z0 = us[U_Z]
        e0 = us[U_EV]
        _, hcap, held, ev0, _ = admit(pol, sp, np.int64(0), i, P, P, np.bool_(True), gap)
        if kv > P:
            extend(pol, sp, np.int64(0), P, kv - P)
        # largest_free_run's bookkeeping (UnitPool.largest_free_run): the keyless blocks
        # taken were the head block (if any), then never-used ids; which kind of block the
        # last one taken was (−1 the head block, 1 a never-used id, 0 from a piece)
        taken = z0 - us[U_Z]
        if taken > 0 and us[U_HEADKL] > 0:
            us[U_HEADKL] = 0
            taken -= 1
        src = -1
        if taken > 0:
            us[U_UNUSED] += taken
            src = 1
        if us[U_EV] > e0:
            src = 0
        release(pol, sp, np.int64(0), gap)
        if kv % B != 0:  # the partial last block went to the head
            if src >= 0:
                us[U_HEADADJ] = src
            us[U_HEADKL] = 1
        r = x - i0
        nh = us[U_NHASHED]
        nk = us[U_NKEYS]
        out[r, C_PROMPT] = P
        out[r, C_HIT] = hcap * B
        out[r, C_HELD] = held if held < P else P
        out[r, C_EVICTED] = (us[U_EV] - e0) * B
        out[r, C_USED] = 0
        out[r, C_CACHED] = nh
        out[r, C_FREE] = nb - 1 - nh
        out[r, C_VALID] = nh * B
        out[r, C_DUP] = (nh - nk) * B
        out[r, C_META] = nk * key_bytes + us[U_NDUP] * dup_bytes
        out[r, C_EV0] = ev0
    return i1, OK


class UnitPool:
    """The sequential replay's pool (a :class:`PiecePool` driven by :func:`seq_span`)
    and the Python side of its driver.

    Parameters
    ----------
    num_gpu_blocks : int
        As :class:`~radixkv.policies.block_hash.BlockHashCache` (block 0 is the null block).
    block_size : int
        B (≥ 2).
    unit_tokens : int
        U, a multiple of B.

    The pool names a request by its row in a registry: the rows of each trace
    :meth:`span` ran (a trace's rows once, when first seen) and each KVSeq
    :meth:`run_request` ran, with their unit keys (``uk``) and facts (``rinfo``).
    Host memory: the pool's arrays are sized by the block count but zeros until used
    (``np.zeros``): 56 B per piece, 120 B per table, (16 + 16 W + 8 G) B per unit record
    (W = ⌈G / 64⌉), 24 B per waiting duplicate, 16 B per registered unit id, two key
    tables of 32 B rows at load ≤ 1/2.
    """

    def __init__(self, num_gpu_blocks: int, block_size: int, unit_tokens: int):
        self.nb = int(num_gpu_blocks)
        self.B = int(block_size)
        self.U = int(unit_tokens)
        self.G = self.U // self.B
        z = np.zeros(0, dtype=np.int64)
        self.pool = new_pool(self.nb, self.B, self.U, z, np.zeros(1, dtype=np.int64), np.zeros((5, 0), dtype=np.int64), 1)
        self._n = 0  # registered requests
        self._traces = []  # (trace, its first registry row, its first row with a negative id or −1)
        self._ps = new_slots(1, 1)

    def _register(self, ids, id_offsets, prompt_len, kv_len) -> int:
        """Append requests (unit ids int64 ≥ 0 and their (n + 1,) offsets, prompt and KV
        lengths in tokens) to the registry; returns the first one's registry row."""
        p = self.pool
        n0 = self._n
        a = int(p.ido[n0])
        n = len(id_offsets) - 1
        uk = np.zeros(len(ids), dtype=np.int64)
        unit_keys_all(np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(id_offsets, dtype=np.int64), uk)
        self.pool = p._replace(
            rt=np.concatenate((p.rt[:, :n0], np.full((2, max(n, 1)), -1, dtype=np.int64)), axis=1),
            uk=np.concatenate((p.uk[:a], uk)), ur=np.concatenate((p.ur[:a], np.zeros_like(uk))),
            ido=np.concatenate((p.ido[:n0], a + np.asarray(id_offsets, dtype=np.int64))),
            rinfo=np.concatenate((p.rinfo[:, :n0], request_info(id_offsets, prompt_len, self.U, self.B)), axis=1))
        self._n = n0 + n
        W = int(-(-np.max(kv_len, initial=1) // self.B))
        if W > self._ps[2].shape[1]:
            self._ps = new_slots(1, W)
        return n0

    def _rows(self, trace, i0, i1, base, stop, key_bytes, dup_bytes):
        """:func:`seq_span` of rows ``i0 … i1 − 1``, the key tables grown as it asks:
        (next, code, out rows)."""
        out = np.zeros((i1 - i0, NC), dtype=np.int64)
        i = i0
        while True:
            nxt, code = seq_span(self.pool, self._ps, base, trace.prompt_len, trace.output_len, i, i1, stop,
                                 key_bytes, dup_bytes, out[i - i0:])
            i = int(nxt)
            if code != GROW:
                return i, int(code), out
            self.pool = grow_tables(self.pool, int(self.pool.rinfo[RI_NU, base + i]) + 1, 2)

    def span(self, trace, i0, i1, key_bytes, dup_bytes):
        """Rows ``i0 …`` of the sequential replay of *trace* (:func:`seq_span`):
        (next, code, out rows)."""
        for t, base, stop in self._traces:
            if t is trace:
                break
        else:
            neg = np.flatnonzero(trace.ids < 0)
            stop = int(np.searchsorted(trace.id_offsets, neg[0], side="right") - 1) if neg.size else -1
            base = self._register(trace.ids, trace.id_offsets, trace.prompt_len,
                                  trace.prompt_len + np.maximum(trace.output_len - 1, 0))
            self._traces.append((trace, base, stop))
        return self._rows(trace, i0, i1, base, stop, key_bytes, dup_bytes)

    def run_request(self, seq):
        """One request (a :class:`~radixkv.trace.types.KVSeq`) on the pool: (code, hit
        blocks, held tokens, evicted blocks at admission, evicted blocks in all); code
        NOT_UNIT (its segments are not units of U tokens then unique content: nothing
        ran), REFUSED (it cannot fit the pool: nothing changed) or OK."""
        sid = np.asarray(seq.seg_id)
        send = np.asarray(seq.seg_end)
        U = self.U
        nu = 0
        while nu < len(sid) and sid[nu] >= 0:
            last = nu + 1 == len(sid) or sid[nu + 1] < 0
            if send[nu] > (nu + 1) * U or (not last and send[nu] != (nu + 1) * U):
                return NOT_UNIT, 0, 0, 0, 0
            nu += 1
        if np.any(sid[nu:] >= 0):
            return NOT_UNIT, 0, 0, 0, 0
        P = int(seq.prompt_len)
        kv = int(seq.kv_len)
        if -(-kv // self.B) > self.nb - 1:
            return REFUSED, 0, 0, 0, 0
        covered = int(send[nu - 1]) if nu else 0
        base = self._register(sid[:nu], np.array([0, nu]), np.array([covered]), np.array([kv]))
        row = (np.array([P]), np.array([kv - P + 1]))
        nxt, code, out = self._rows(_Rows(*row), 0, 1, base, -1, 0, 0)
        return code, int(out[0, C_HIT]) // self.B, int(out[0, C_HELD]), int(out[0, C_EV0]), \
            int(out[0, C_EVICTED]) // self.B

    def largest_free_run(self) -> int:
        """Longest run of consecutive free block ids, without ids: between requests the
        keyless blocks are the never-used ids ``U_UNUSED … nb − 1`` and at most one
        partial block at the head, adjacent to them iff it was the never-used id
        ``U_UNUSED − 1`` (every request takes at least one new block, the head first)."""
        us = self.pool.us
        unused = self.nb - int(us[U_UNUSED])
        kl = int(us[U_HEADKL])
        if unused:
            return max(unused + (1 if kl and us[U_HEADADJ] == 1 else 0), kl)
        return kl

    def counters(self):
        """(hashed blocks, distinct keys, keys held twice or more, evicted blocks)."""
        us = self.pool.us
        return int(us[U_NHASHED]), int(us[U_NKEYS]), int(us[U_NDUP]), int(us[U_EV])


#: the two columns :meth:`UnitPool._rows` reads of a trace, for a lone KVSeq
_Rows = namedtuple("_Rows", ["prompt_len", "output_len"])


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
