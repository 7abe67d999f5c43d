"""A unit-keyed block pool (hash-id traces) under the compiled concurrent vLLM loop.

:func:`radixkv.replay._conc_vllm_kernels.run_loop` — vLLM v1's scheduler over
:class:`radixkv.policies.block_hash.BlockHashCache` (the step, admission, preemption,
fast-forward, the clock and the integrals are that module's, cited there) — runs on this
module's pool (value :class:`UnitPool`) through the pool operations registered at the
end of this module, in place of the per-block pool of
:mod:`radixkv.replay._conc_vllm_block_kernels`. It applies to a hash-id trace whose
unit U is a multiple of ``block_size`` B (G = U / B blocks per unit), every id ≥ 0,
without output ids (:func:`radixkv.replay.conc_vllm_fast.replay_compiled` decides). Own
status: :data:`S_GROW_UNITS` (``pool_room``).

What is the same as the per-block pool: the block ids, the free queue's order (vLLM
``FreeKVCacheBlockQueue``: ``get_new_blocks`` pops the head, ``touch`` takes a hit block
out, ``free_blocks`` appends a hashed block to the tail and pushes an unhashed one on the
head, tail first — kept here as a ring of block ids in which a touched block leaves a
hole, so a pop reads the next id from an array and the block records can be prefetched
ahead, instead of chasing a linked list), each block's ref_cnt, the hit rule
(first-inserted holder served, vLLM ``BlockHashToBlockMap``) and the counters the loop
reads (used / cached / hashed blocks, free-queue length, evictions). So block tables and
every output are those of the per-block loop.

What differs is how a cached block is found — the work that dominates the per-block pool
(a key-table row, a parent row, sibling and duplicate chains per block):

- A *regular* block (wholly inside unit u of a request) is named by (unit key, position
  k = j mod G); the unit key chains the unit ids from the start of the sequence (uk_u =
  mix(uk_{u−1}, id_u)), so two blocks have equal vLLM block hashes iff they have the same
  unit key and position (the chained block hash of block j is a function of the tokens
  0 … (j+1)B, which are the units 0 … u). One record per unit key (``rc``) keeps, per
  position, the holders' chain (head = served block, tail, count); one key-table row per
  unit (``um``) instead of one per block.
- An *irregular* block (touching the request's unique prompt tail or its output) has a
  block hash no other request can produce: it is named by (request, position), in a
  per-request arena (``ir``) — only the same request, re-admitted after a preemption,
  can hit it.
- ``held_tokens`` (the longest common prefix of the prompt's next block with a hashed
  block under the last hit key, ``_hash_kernels.lookup``): the candidates are the
  regular block at the same unit position and the *straddles* — full blocks whose first
  piece is the tail of a unit cut by the prompt's end, indexed by (unit key, offset)
  in ``sm`` with their unit-part length.

Equal keys here mean equal 64-bit hashes there except under a hash collision (either
side), the same assumption as the per-block pool's (``_hash_kernels`` module docstring).
The reachable-key count, content pieces and metadata are not kept: the concurrent loop
reads none of them.

Arrays (``pol`` tuple ``bk, rc, um, ir, sm, skey, q, ring``, the caller owns them):
``bk`` int32 (nb, NBK) block records (``B_*``: ref_cnt, ring slot or −1, kind, unit
record or arena row, position, holders' chain links, straddle links and length); ``rc`` int64 (cap, 2 + 3G) unit records (cached positions / free-list link,
unit key, per position head, tail, count); ``um`` int64 (2^k, 2) unit key → record + 1;
``ir`` int64 (n_irr, 3) per-request irregular positions (head, tail, count); ``sm``
int64 (2^k, 2) straddle group key → first straddle block + 1; ``skey`` int64 (nb,) a
straddle's group key; ``q`` int64 (NQ,) counters ``Q_*`` (the ring's head and tail are
positions that only grow, except a push on the head; a slot is position & (size − 1));
``ring`` int32 (2^k ≥ 2 nb,) the free queue, −1 = a hole.

Speed (docs/performance.md): the per-block work is written out inside the loops, and the
commonest decode growth is written out in ``pool_grow_slot`` (the loop itself does a
decode token that needs no new block and fills none without a pool call), because every
array bound by an inlined call or a tuple unpack costs Numba two atomic reference-count
operations.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from radixkv._intrinsics import for_mode, prefetch_row
from radixkv.policies._hash_kernels import _mix
from radixkv.policies._hash_unit_kernels import rehash
from radixkv.policies._static_kernels import _tab_delete_row as _hdel
from radixkv.policies._static_kernels import _tab_probe as _hfind
from radixkv.replay import _conc_vllm_kernels as CK

#: the unit records or the unit-key table may run out in this step: grow them, call again
S_GROW_UNITS = CK.S_POOL

#: the pool value (:func:`unit_pool`): the arrays of :func:`new_pool` as fields (:func:`_pol`
#: is the ``pol`` tuple the block-level kernels take), ``rinfo`` int64 (6, n) the per-request
#: facts (``RI_*``), ``G`` blocks per unit, ``U`` the unit (tokens), ``block_size``. (Flat:
#: a field read in an operation costs one reference count, a nested tuple's all of them.)
UnitPool = namedtuple("UnitPool", ["bk", "rc", "um", "ir", "sm", "skey", "q", "ring", "rinfo", "G", "U",
                                   "block_size"])


def unit_pool(arrays, rinfo, G: int, U: int, block_size: int) -> UnitPool:
    """The pool value over *arrays* (:func:`new_pool`)."""
    return UnitPool(*arrays, rinfo, int(G), int(U), int(block_size))


@njit(cache=True, inline="always")
def _pol(pool):
    """The ``pol`` tuple (``bk, rc, um, ir, sm, skey, q, ring``) of a :class:`UnitPool`."""
    return pool.bk, pool.rc, pool.um, pool.ir, pool.sm, pool.skey, pool.q, pool.ring

# block record (int32 columns of bk)
B_REF, B_QPOS, B_UNUSED, B_KIND, B_REC, B_POS, B_DNEXT, B_DPREV, B_SNEXT, B_SPREV, B_SLEN = range(11)
NBK = 16  # 64-byte records
KIND_NONE, KIND_UNIT, KIND_IRR = 0, 1, 2

# counters (q)
Q_QH, Q_QT, Q_FQLEN, Q_NHASHED, Q_NUSED, Q_NCACHED, Q_EV, Q_RFREE, Q_RTOP, Q_NREC = range(10)
NQ = 10

OK = 0
REFUSED = 1

#: the unit-key chain's seed and the straddle groups' domain constant
SEED = np.uint64(0x1E3779B97F4A7C15)
_STRAD = np.uint64(0x5851F42D4C957F2D)


#: a cache-line hint (radixkv._intrinsics; a no-op stand-in without the JIT)
_prefetch = for_mode(prefetch_row)

#: pops / releases ahead whose block records are prefetched
_AHEAD = 8


@njit(cache=True)
def unit_keys_into(ids, id_offsets, i, out):
    """Unit keys of request *i* (``out[:k]``, k = its unit ids): uk_u = mix(uk_{u−1}, id_u)."""
    a = id_offsets[i]
    k = id_offsets[i + 1] - a
    h = SEED
    for u in range(k):
        h = _mix(h, np.uint64(ids[a + u]))
        out[u] = np.int64(h)
    return k


@njit(cache=True, inline="always")
def _strad_key(uk, off):
    return np.int64(_mix(np.uint64(uk) ^ _STRAD, np.uint64(off)))


# ---------------------------------------------------------------------- key tables
# ``um`` and ``sm`` have the layout of the static pool's index (row ``(key, value + 1)``,
# 0 = empty): ``_hfind`` / ``_hdel`` are ``_static_kernels._tab_probe`` / ``_tab_delete_row``
# and ``rehash`` is ``_hash_unit_kernels.rehash`` (imported above).


def new_pool(num_gpu_blocks: int, G: int, n_irr: int, n_strad: int, records: int = 64):
    """Empty pool arrays ``(bk, rc, um, ir, sm, skey, q)``: every usable block 1 … nb−1 in
    the free queue in ascending id order (vLLM ``BlockPool.__init__``; block 0 is the
    null block); room for *records* unit records, *n_irr* irregular positions and
    *n_strad* straddle groups."""
    nb = int(num_gpu_blocks)
    raw = np.zeros(nb * NBK + 16, dtype=np.int32)  # records on 64-byte lines
    o = (-raw.ctypes.data % 64) // 4
    bk = raw[o:o + nb * NBK].reshape(nb, NBK)
    bk[:, [B_QPOS, B_DNEXT, B_DPREV, B_SNEXT, B_SPREV]] = -1
    ring = np.full(_pow2(2 * nb), -1, dtype=np.int32)
    ring[: nb - 1] = np.arange(1, nb, dtype=np.int32)
    bk[1:, B_QPOS] = np.arange(nb - 1, dtype=np.int32)
    q = np.zeros(NQ, dtype=np.int64)
    q[Q_QH] = 0
    q[Q_QT] = nb - 1
    q[Q_FQLEN] = nb - 1
    q[Q_RFREE] = -1
    rc = np.zeros((max(int(records), 1), 2 + 3 * G), dtype=np.int64)
    um = np.zeros((_pow2(2 * max(int(records), 1)), 2), dtype=np.int64)
    ir = np.zeros((max(int(n_irr), 1), 3), dtype=np.int64)
    ir[:, 0] = -1
    ir[:, 1] = -1
    sm = np.zeros((_pow2(2 * int(n_strad) + 2), 2), dtype=np.int64)
    skey = np.zeros(nb, dtype=np.int64)
    return bk, rc, um, ir, sm, skey, q, ring


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


# ---------------------------------------------------------------------- unit records, straddles
@njit(cache=True)
def _compact(bk, ring, q):
    """Close the holes of the free queue's ring (its span reached the ring's size; at most
    half of it is live, so this runs at most once per ring-size / 2 holes)."""
    mask = ring.shape[0] - 1
    w = q[Q_QH]
    for idx in range(q[Q_QH], q[Q_QT]):
        b = ring[idx & mask]
        if b >= 0:
            ring[idx & mask] = -1
            ring[w & mask] = b
            bk[b, B_QPOS] = w & mask
            w += 1
    q[Q_QT] = w


@njit(cache=True)
def _strad_drop(bk, sm, skey, b):
    """Straddle block *b* leaves its group (rare: one per cached straddle)."""
    p = bk[b, B_SPREV]
    n = bk[b, B_SNEXT]
    if p >= 0:
        bk[p, B_SNEXT] = n
    else:
        i = _hfind(sm, skey[b])
        if n >= 0:
            sm[i, 1] = n + 1
        else:
            _hdel(sm, i)
    if n >= 0:
        bk[n, B_SPREV] = p
    bk[b, B_SLEN] = 0
    bk[b, B_SNEXT] = -1
    bk[b, B_SPREV] = -1


@njit(cache=True)
def _strad_add(bk, sm, skey, b, gk, slen):
    """Straddle block *b* joins its group *gk* at the head (rare)."""
    skey[b] = gk
    bk[b, B_SLEN] = slen
    bk[b, B_SPREV] = -1
    x = _hfind(sm, gk)
    if x >= 0:
        h = sm[x, 1] - 1
        bk[b, B_SNEXT] = h
        bk[h, B_SPREV] = b
    else:
        x = -1 - x
        sm[x, 0] = gk
        bk[b, B_SNEXT] = -1
    sm[x, 1] = b + 1


@njit(cache=True)
def _rec_get(rc, um, q, key, G):
    """The unit record of *key*, created empty when absent (room checked by the loop)."""
    i = _hfind(um, key)
    if i >= 0:
        return um[i, 1] - 1
    i = -1 - i
    r = q[Q_RFREE]
    if r >= 0:
        q[Q_RFREE] = rc[r, 0]
    else:
        r = q[Q_RTOP]
        q[Q_RTOP] = r + 1
    q[Q_NREC] += 1
    rc[r, 0] = 0
    rc[r, 1] = key
    for k in range(G):
        rc[r, 2 + 3 * k] = -1
        rc[r, 3 + 3 * k] = -1
        rc[r, 4 + 3 * k] = 0
    um[i, 0] = key
    um[i, 1] = r + 1
    return r


@njit(cache=True)
def _rec_free(rc, um, q, r):
    """Unit record *r* has no cached position left: its key row and the record go."""
    _hdel(um, _hfind(um, rc[r, 1]))
    rc[r, 0] = q[Q_RFREE]
    q[Q_RFREE] = r
    q[Q_NREC] -= 1


# ---------------------------------------------------------------------- per-request facts
# rinfo rows (int64 (6, n)): regular blocks R, covered tokens, unit ids, irregular arena
# offset, straddle position (−1: none), straddle group offset in its unit
RI_R, RI_COV, RI_NU, RI_IOFF, RI_SJ, RI_SOFF = range(6)


@njit(cache=True, inline="always")
def _take_new(bk, rc, um, ir, sm, skey, q, ring, tbl2d, sl, at, n_new):
    """Pop *n_new* blocks from the free queue's head into ``tbl2d[sl, at:]``, evicting
    their keys (vLLM ``BlockPool.get_new_blocks``); returns the evicted count. (The
    per-block work is written out in the loop: a helper call or a tuple unpacked per
    block costs Numba's atomic reference counts on every array.)"""
    ev = 0
    mask = ring.shape[0] - 1
    qh = q[Q_QH]
    for k in range(n_new):
        if k < n_new - _AHEAD:
            y = ring[(qh + _AHEAD) & mask]
            if y >= 0:
                _prefetch(bk, y)
        x = qh & mask
        b = ring[x]
        while b < 0:  # skip the holes left by touched blocks
            qh += 1
            x = qh & mask
            b = ring[x]
        ring[x] = -1
        qh += 1
        tbl2d[sl, at + k] = b
        bk[b, B_QPOS] = -1
        kind = bk[b, B_KIND]
        if kind != KIND_NONE:  # evict its key: unlink b from its holders' chain
            ev += 1
            dn = bk[b, B_DNEXT]
            dp = bk[b, B_DPREV]
            if kind == KIND_UNIT:
                r = bk[b, B_REC]
                c = 2 + 3 * bk[b, B_POS]
                if dp >= 0:
                    bk[dp, B_DNEXT] = dn
                else:
                    rc[r, c] = dn
                if dn >= 0:
                    bk[dn, B_DPREV] = dp
                else:
                    rc[r, c + 1] = dp
                cnt = rc[r, c + 2] - 1
                rc[r, c + 2] = cnt
                if cnt == 0:
                    left = rc[r, 0] - 1
                    rc[r, 0] = left
                    if left == 0:
                        _rec_free(rc, um, q, r)
            else:
                a = bk[b, B_POS]
                if dp >= 0:
                    bk[dp, B_DNEXT] = dn
                else:
                    ir[a, 0] = dn
                if dn >= 0:
                    bk[dn, B_DPREV] = dp
                else:
                    ir[a, 1] = dp
                ir[a, 2] -= 1
                if bk[b, B_SLEN] > 0:
                    _strad_drop(bk, sm, skey, b)
            bk[b, B_DNEXT] = -1
            bk[b, B_DPREV] = -1
            bk[b, B_KIND] = KIND_NONE
        bk[b, B_REF] = 1
    q[Q_QH] = qh
    q[Q_FQLEN] -= n_new
    q[Q_NHASHED] -= ev
    q[Q_NCACHED] -= ev
    q[Q_NUSED] += n_new
    q[Q_EV] += ev
    return ev


@njit(cache=True, inline="always")
def _cache_full(pol, tbl2d, sl, lo, hi, i, uk2d, usl, rinfo, G, U, B):
    """Give blocks ``tbl2d[sl, lo:hi]`` of request *i* (unit keys ``uk2d[usl]``) their
    keys (vLLM ``BlockPool.cache_full_blocks``); holders join their chain's tail."""
    bk, rc, um, ir, sm, skey, q, ring = pol
    R = rinfo[RI_R, i]
    cur = -1
    r = 0
    for j in range(lo, hi):
        b = tbl2d[sl, j]
        bk[b, B_DNEXT] = -1
        if j < R:
            u = j // G
            if u != cur:
                r = _rec_get(rc, um, q, uk2d[usl, u], G)
                cur = u
            k = j - u * G
            c = 2 + 3 * k
            cnt = rc[r, c + 2]
            if cnt == 0:
                rc[r, c] = b
                bk[b, B_DPREV] = -1
                rc[r, 0] += 1
            else:
                t = rc[r, c + 1]
                bk[t, B_DNEXT] = b
                bk[b, B_DPREV] = t
            rc[r, c + 1] = b
            rc[r, c + 2] = cnt + 1
            bk[b, B_KIND] = KIND_UNIT
            bk[b, B_REC] = r
            bk[b, B_POS] = k
        else:
            a = rinfo[RI_IOFF, i] + j - R
            cnt = ir[a, 2]
            if cnt == 0:
                ir[a, 0] = b
                bk[b, B_DPREV] = -1
            else:
                t = ir[a, 1]
                bk[t, B_DNEXT] = b
                bk[b, B_DPREV] = t
            ir[a, 1] = b
            ir[a, 2] = cnt + 1
            bk[b, B_KIND] = KIND_IRR
            bk[b, B_POS] = a
            if j == rinfo[RI_SJ, i]:  # a straddle joins its group (unit key, offset)
                _strad_add(bk, sm, skey, b, _strad_key(uk2d[usl, rinfo[RI_NU, i] - 1], rinfo[RI_SOFF, i]),
                           rinfo[RI_COV, i] - R * B)
    if hi > lo:
        q[Q_NHASHED] += hi - lo


@njit(cache=True, inline="always")
def lookup(pol, i, uk2d, usl, rinfo, L, G, B, hit2d, hsl, blocks):
    """Consecutive cached blocks of request *i*'s first ``L // B`` blocks (uncapped; unit
    keys ``uk2d[usl]``), the served block of each in ``hit2d[hsl]`` when *blocks*
    (``_hash_kernels.lookup``); without *blocks* a unit whose G positions are all cached
    is passed in one step."""
    bk, rc, um, ir, sm, skey, q, ring = pol
    n_look = L // B
    R = rinfo[RI_R, i]
    h = 0
    cur = -1
    r = 0
    while h < n_look:
        if h < R:
            u = h // G
            if u != cur:
                x = _hfind(um, uk2d[usl, u])
                if x < 0:
                    break
                r = um[x, 1] - 1
                cur = u
                if not blocks and rc[r, 0] == G:
                    h = min(u * G + G, R, n_look)
                    continue
            c = 2 + 3 * (h - u * G)
            if rc[r, c + 2] == 0:
                break
            if blocks:
                hit2d[hsl, h] = rc[r, c]
        else:
            a = rinfo[RI_IOFF, i] + h - R
            if ir[a, 2] == 0:
                break
            if blocks:
                hit2d[hsl, h] = ir[a, 0]
        h += 1
    return h


@njit(cache=True)
def held_tokens(pol, i, uk, rinfo, seg_end, h, P, G, U, B):
    """``Admission.held_tokens`` of a first admission after *h* (uncapped) hit blocks:
    ``h × B`` plus the longest common prefix of the prompt's next block with a hashed
    block under the last hit key (``_hash_kernels.lookup``), at most P."""
    bk, rc, um, ir, sm, skey, q, ring = pol
    start = h * B
    if start >= P:
        return P
    if start >= rinfo[RI_COV, i]:
        return start  # the unique prompt tail: no other block starts with its token
    end = min(start + B, P)
    u = start // U
    off = start - u * U
    lp = min(seg_end[u], end) - start  # the prompt's tokens of unit u in the block
    best = 0
    x = _hfind(um, uk[u])
    if x >= 0 and rc[um[x, 1] - 1, 4 + 3 * (off // B)] > 0:
        best = lp
    x = _hfind(sm, _strad_key(uk[u], off))
    if x >= 0:
        b = sm[x, 1] - 1
        while b >= 0:
            m = min(bk[b, B_SLEN], lp)
            if m > best:
                best = m
            b = bk[b, B_SNEXT]
    return start + best


@njit(cache=True, inline="always")
def admit(pol, i, uk2d, sl, rinfo, send2d, G, U, B, n_tok, asked, first, tbl2d):
    """Look up and allocate request *i* in slot *sl* (``_hash_kernels.admit`` with
    ``prompt_len`` = ``lookup_len`` = *n_tok*, ``n_tokens`` = *asked*; ``held`` only for
    a *first* admission, else 0). Returns ``(code, hit blocks, held, evicted blocks,
    blocks)``."""
    bk = pol[0]
    q = pol[6]
    ring = pol[7]
    h = lookup(pol, i, uk2d, sl, rinfo, n_tok, G, B, tbl2d, sl, True)
    held = held_tokens(pol, i, uk2d[sl], rinfo, send2d[sl], h, n_tok, G, U, B) if first else 0
    hcap = min(h, (n_tok - 1) // B)
    n_touch = 0
    for k in range(hcap):
        if bk[tbl2d[sl, k], B_REF] == 0:
            n_touch += 1
    need_full = (n_tok + B - 1) // B - hcap
    if need_full + n_touch > q[Q_FQLEN]:
        return REFUSED, hcap, held, 0, 0
    for k in range(hcap):  # touch (BlockPool.touch): hit blocks with ref_cnt 0 leave the queue
        b = tbl2d[sl, k]
        if bk[b, B_REF] == 0:
            ring[bk[b, B_QPOS]] = -1  # a hole in the queue
            bk[b, B_QPOS] = -1
            q[Q_FQLEN] -= 1
            q[Q_NUSED] += 1
            q[Q_NCACHED] -= 1
        bk[b, B_REF] += 1
    t = max(asked, hcap * B)
    nblk = (t + B - 1) // B
    ev = _take_new(bk, pol[1], pol[2], pol[3], pol[4], pol[5], q, ring, tbl2d, sl, hcap, nblk - hcap)
    _cache_full(pol, tbl2d, sl, hcap, t // B, i, uk2d, sl, rinfo, G, U, B)
    return OK, hcap, held, ev, nblk


@njit(cache=True, inline="always")
def free(pol, tbl2d, sl, n_blocks):
    """``_hash_kernels.free``: release tail first; a hashed block whose ref_cnt reaches 0
    goes to the free queue's tail, an unhashed one to its head."""
    bk = pol[0]
    q = pol[6]
    ring = pol[7]
    mask = ring.shape[0] - 1
    for k in range(n_blocks - 1, -1, -1):
        if k >= _AHEAD:
            _prefetch(bk, tbl2d[sl, k - _AHEAD])
        b = tbl2d[sl, k]
        ref = bk[b, B_REF] - 1
        bk[b, B_REF] = ref
        if ref == 0:
            q[Q_NUSED] -= 1
            q[Q_FQLEN] += 1
            if q[Q_QT] - q[Q_QH] == ring.shape[0]:
                _compact(bk, ring, q)
            if bk[b, B_KIND] != KIND_NONE:  # to the tail
                x = q[Q_QT] & mask
                q[Q_QT] += 1
                q[Q_NCACHED] += 1
            else:  # to the head
                q[Q_QH] -= 1
                x = q[Q_QH] & mask
            ring[x] = b
            bk[b, B_QPOS] = x


# ---------------------------------------------------------------------- the pool operations
# (radixkv.replay._conc_vllm_kernels: the contract). Per-slot tuple ps: unit keys int64 (S, NU),
# block table int64 (S, W), blocks held int64 (S,), the slot's request int64 (S,); lookup
# scratch hs: unit keys int64 (1, NU), served blocks int64 (1, W) (rows of 2-D arrays: the
# kernels index a table and a row, not a view).
def new_slots(n_sl: int, W: int, NU: int):
    """Per-slot tuple ``ps`` for *n_sl* slots of at most *W* blocks and *NU* unit ids."""
    return (np.zeros((n_sl, max(int(NU), 1)), dtype=np.int64), np.zeros((n_sl, max(int(W), 1)), dtype=np.int64),
            np.zeros(n_sl, dtype=np.int64), np.zeros(n_sl, dtype=np.int64))


def new_scratch(W: int, NU: int):
    """Lookup scratch ``hs``."""
    return np.zeros((1, max(int(NU), 1)), dtype=np.int64), np.zeros((1, max(int(W), 1)), dtype=np.int64)


@njit(cache=True)
def units_per_step(B, budget, cap_run):
    """Unit records one iteration may create: each is a unit's first cached position, and an
    iteration caches at most 2 × its token budget / B + 4 blocks per item."""
    return 2 * (budget // B) + 4 * cap_run + 4


@njit(cache=True, inline="always")
def _extend(pool, ps, sl, n0, n):
    """``BlockHashCache.extend`` of the request in slot *sl* by *n* tokens (vLLM
    ``allocate_slots`` then ``cache_blocks``, ``_hash_kernels.extend``): (ok, evicted
    blocks); ok False: refused, nothing changed."""
    B = pool.block_size
    tbl2d = ps[1]
    s_nblk = ps[2]
    nb0 = s_nblk[sl]
    t = n0 + n
    nblk = (t + B - 1) // B
    n_new = nblk - nb0
    if n_new > pool.q[Q_FQLEN]:
        return False, 0
    ev = 0
    if n_new > 0:
        ev = _take_new(pool.bk, pool.rc, pool.um, pool.ir, pool.sm, pool.skey, pool.q, pool.ring, tbl2d, sl, nb0,
                       n_new)
    if t // B > n0 // B:
        _cache_full(_pol(pool), tbl2d, sl, n0 // B, t // B, ps[3][sl], ps[0], sl, pool.rinfo, pool.G, pool.U, B)
    s_nblk[sl] = nblk
    return True, ev


@CK.pool_op(CK.pool_room, UnitPool)
def _room(pool, budget, cap_run):
    # (no array bound to a name across a branch: this runs every iteration, and such a name
    # costs Numba's atomic reference counts, ~80 ns here)
    need = 2 * (budget // pool.block_size) + 4 * cap_run + 4  # units_per_step
    nrec = pool.q[Q_NREC]
    full = (pool.rc.shape[0] - nrec < need) | (2 * (nrec + need) > pool.um.shape[0])
    return S_GROW_UNITS if full else 0


@CK.pool_op(CK.pool_admit, UnitPool)
def _admit_op(pool, ps, ls, tr, i, sl, m, n_tok, asked, first):
    uk2d = ps[0]
    unit_keys_into(tr[0], tr[1], i, uk2d[sl])
    code, hb, hd, ev, nblk = admit(_pol(pool), i, uk2d, sl, pool.rinfo, ls[1], pool.G, pool.U, pool.block_size,
                                   n_tok, asked, first, ps[1])
    if code != OK:
        return CK.ADMIT_REFUSED, hb, hd, ev
    ps[2][sl] = nblk
    ps[3][sl] = i
    return CK.ADMIT_OK, hb, hd, ev


@CK.pool_op(CK.pool_extend, UnitPool)
def _extend_op(pool, ps, ls, sl, n0, n):
    return _extend(pool, ps, sl, n0, n)


@CK.pool_op(CK.pool_grow_slot, UnitPool)
def _grow_slot(pool, ps, ls, sl, n0, n):
    """A slot's decode growth that takes at most one new block and caches only irregular
    blocks (output: the common case) is written out here; other growth goes through
    :func:`_extend`. (Arrays are read through the pool value, not bound to names: a name
    alive across a branch costs Numba's atomic reference counts on every call.)"""
    B = pool.block_size
    nt = n0 + n
    nb0 = ps[2][sl]
    nblk = (nt + B - 1) // B
    n_new = nblk - nb0
    rq_ = ps[3][sl]
    lo_ = n0 // B
    hi_ = nt // B
    sj = pool.rinfo[RI_SJ, rq_]
    R = pool.rinfo[RI_R, rq_]
    if not (n_new <= 1 and lo_ >= R and not (lo_ <= sj < hi_)):
        return _extend(pool, ps, sl, n0, n)
    if n_new > pool.q[Q_FQLEN]:
        return False, 0
    ev = 0
    if n_new == 1:
        ev = _take_new(pool.bk, pool.rc, pool.um, pool.ir, pool.sm, pool.skey, pool.q, pool.ring, ps[1], sl, nb0, 1)
    a0 = pool.rinfo[RI_IOFF, rq_] - R
    for j in range(lo_, hi_):  # irregular blocks join their position's holders
        b = ps[1][sl, j]
        a = a0 + j
        cn = pool.ir[a, 2]
        pool.bk[b, B_DNEXT] = -1
        if cn == 0:
            pool.ir[a, 0] = b
            pool.bk[b, B_DPREV] = -1
        else:
            tt = pool.ir[a, 1]
            pool.bk[tt, B_DNEXT] = b
            pool.bk[b, B_DPREV] = tt
        pool.ir[a, 1] = b
        pool.ir[a, 2] = cn + 1
        pool.bk[b, B_KIND] = KIND_IRR
        pool.bk[b, B_POS] = a
    if hi_ > lo_:
        pool.q[Q_NHASHED] += hi_ - lo_
    ps[2][sl] = nblk
    return True, ev


@CK.pool_op(CK.pool_release, UnitPool)
def _release(pool, ps, sl, n0):
    free(_pol(pool), ps[1], sl, ps[2][sl])


@CK.pool_op(CK.pool_lookup, UnitPool)
def _lookup_op(pool, hs, tr, i, L, sid, send, m, fresh, count_free):
    huk = hs[0]
    htbl = hs[1]
    if fresh == 2:
        unit_keys_into(tr[0], tr[1], i, huk[0])
    h = lookup(_pol(pool), i, huk, 0, pool.rinfo, L, pool.G, pool.block_size, htbl, 0, count_free)
    h = min(h, (L - 1) // pool.block_size)
    nfree = 0
    if count_free:
        bk = pool.bk
        for k in range(h):
            if bk[htbl[0, k], B_REF] == 0:
                nfree += 1
    return h, nfree


@CK.pool_op(CK.pool_counts, UnitPool)
def _counts(pool):
    q = pool.q
    return q[Q_NUSED], q[Q_NCACHED], q[Q_NHASHED]
