"""Compiled concurrent vLLM loop on a unit-keyed block pool (hash-id traces).

:func:`run_loop` is :func:`radixkv.replay._conc_vllm_kernels.run_loop` — vLLM v1's
scheduler over :class:`radixkv.policies.block_hash.BlockHashCache`, the same rules in the
same order (the step, admission, preemption, fast-forward, the clock and the integrals
are that module's, cited there) — with the pool of this module in place of the per-block
kernels of :mod:`radixkv.policies._hash_kernels`. It applies to a hash-id trace whose
unit U is a multiple of ``block_size`` B (G = U / B blocks per unit), every id ≥ 0,
without output ids (:func:`radixkv.replay.conc_vllm_fast.replay_compiled` decides).

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
commonest decode growth is done without a pool call, because every array bound by an
inlined call or a tuple unpack costs Numba two atomic reference-count operations.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from radixkv._intrinsics import for_mode, prefetch_row
from radixkv.policies._hash_batch_kernels import lazy_order
from radixkv.policies._hash_kernels import _mix
from radixkv.policies._hash_unit_kernels import rehash
from radixkv.policies._static_kernels import _tab_delete_row as _hdel
from radixkv.policies._static_kernels import _tab_probe as _hfind
from radixkv.replay import _miss_rec_kernels as MR
from radixkv.replay._conc_vllm_kernels import (F_AREA, F_BUSY, F_CACHED, F_NOW, F_USED, F_WASTE, I_ARG, I_DONE,
                                               I_EV, I_HKI, I_HKL, I_HKM, I_NFREE, I_NRUN, I_NXT, I_PARTIAL,
                                               I_PEAK, I_PFG, I_PFN, I_STEPS, I_TLN, I_WHEAD, I_WLEN, I_WPEAK,
                                               S_DECODE_REFUSED, S_DONE, S_GROW_LOG, S_GROW_REC, S_GROW_SLOTS,
                                               S_GROW_TL, S_IDLE_REFUSED, S_PROGRESS, _decode_steps_time,
                                               _shared_prefix, _step_time, _tl_row)
from radixkv.trace._seq_kernel import kv_seq_into

#: the unit records or the unit-key table may run out in this step: grow them, call again
S_GROW_UNITS = 9

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


# ---------------------------------------------------------------------- the loop's pool calls
@njit(cache=True, inline="always")
def _extend(pol, sa, sl, n, B, G, U, rinfo, ist):
    """``BlockHashCache.extend`` of the request in slot *sl* by *n* tokens (vLLM
    ``allocate_slots`` then ``cache_blocks``, ``_hash_kernels.extend``); False: refused,
    nothing changed."""
    if n <= 0:
        return True
    uk2d = sa[0]
    tbl2d = sa[1]
    s_nblk = sa[5]
    s_ntok = sa[6]
    n0 = s_ntok[sl]
    nb0 = s_nblk[sl]
    t = n0 + n
    nblk = (t + B - 1) // B
    n_new = nblk - nb0
    if n_new > pol[6][Q_FQLEN]:
        return False
    if n_new > 0:
        ist[I_EV] += _take_new(pol[0], pol[1], pol[2], pol[3], pol[4], pol[5], pol[6], pol[7], tbl2d, sl, nb0,
                               n_new)
    if t // B > n0 // B:
        _cache_full(pol, tbl2d, sl, n0 // B, t // B, sa[7][sl], uk2d, sl, rinfo, G, U, B)
    s_nblk[sl] = nblk
    ist[I_PARTIAL] += t % B - n0 % B
    s_ntok[sl] = t
    return True


@njit(cache=True, inline="always")
def _release(pol, sa, sl, B, ist, free_slots):
    """``BlockHashCache.finish`` / ``preempt`` of the request in slot *sl*; the slot is freed."""
    s_nblk = sa[5]
    s_ntok = sa[6]
    ist[I_PARTIAL] -= s_ntok[sl] % B
    free(pol, sa[1], sl, s_nblk[sl])
    free_slots[ist[I_NFREE]] = sl
    ist[I_NFREE] += 1


@njit(cache=True, inline="always")
def _serve(r, nrun, cap, budget, pol, sa, B, G, U, rinfo, ist, run, ctx, target, kv, slot_of, preemptions, wq,
           wcap, free_slots, p_req, p_new, p_ctx, p_pre, np_, rec):
    """``_conc_vllm_kernels._serve`` on this pool."""
    pre = ctx[r] < target[r]
    if pre:
        c = target[r] - ctx[r]
        if cap > 0 and cap < c:
            c = cap
        if budget < c:
            c = budget
    else:
        c = 1
    upto = ctx[r] + c
    need_tok = upto - kv[r]
    made = 0
    while need_tok > 0:
        if _extend(pol, sa, slot_of[r], need_tok, B, G, U, rinfo, ist):
            kv[r] = upto
            break
        v = run[nrun - 1]
        nrun -= 1
        _release(pol, sa, slot_of[v], B, ist, free_slots)
        slot_of[v] = -1
        ctx[v] = 0
        kv[v] = 0
        target[v] = 0
        preemptions[v] += 1
        if rec[0][MR.RS_ON] != 0:
            MR.rec_preempted(rec, v)
        ist[I_WHEAD] = (ist[I_WHEAD] - 1) % wcap
        wq[ist[I_WHEAD]] = v
        ist[I_WLEN] += 1
        made += 1
        if v == r:
            return nrun, made, c, False
    p_req[np_] = r
    p_new[np_] = c
    p_ctx[np_] = ctx[r]
    p_pre[np_] = 1 if pre else 0
    return nrun, made, c, True


@njit(cache=True, inline="always")
def _head_lookup(pol, tr, i, L, B, G, rinfo, huk, htbl, hsid, hsend, ist, blocks):
    """Side-effect-free lookup of request *i*'s first *L* tokens: (capped hit blocks,
    segments in ``hsid``/``hsend``); the served blocks in ``htbl`` when *blocks*. The segments and unit
    keys stay in the scratch arrays while the same request is asked."""
    ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens = tr
    if ist[I_HKI] == i:
        m = ist[I_HKM]
    else:
        m = kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                        hsid, hsend)
        unit_keys_into(ids, id_offsets, i, huk[0])
        ist[I_HKI] = i
        ist[I_HKL] = L
        ist[I_HKM] = m
    h = lookup(pol, i, huk, 0, rinfo, L, G, B, htbl, 0, blocks)
    return min(h, (L - 1) // B), m


@njit(cache=True)
def _decode_run(pol, sa, slots, kv0, B, G, U, rinfo, k, out, ist):
    """``_conc_vllm_kernels._decode_run`` on this pool. A slot's growth that takes at most
    one new block and caches only irregular blocks (output: the common case) is done here
    with the arrays bound once (each inlined call binding arrays costs Numba's atomic
    reference counts); other growth goes through :func:`_extend`."""
    bk, rc, um, ir, sm, skey, q, ring = pol
    tbl2d = sa[1]
    s_nblk = sa[5]
    s_ntok = sa[6]
    s_req = sa[7]
    n = slots.shape[0]
    cnt, order = lazy_order(kv0, B)
    applied = np.zeros(n, dtype=np.int64)
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
        for qq in range(lo, hi):
            i = qq if final else order[qq]
            m = t - applied[i]
            if m <= 0:
                continue
            sl = slots[i]
            n0 = s_ntok[sl]
            nt = n0 + m
            nb0 = s_nblk[sl]
            nblk = (nt + B - 1) // B
            n_new = nblk - nb0
            rq_ = s_req[sl]
            lo_ = n0 // B
            hi_ = nt // B
            sj = rinfo[RI_SJ, rq_]
            if n_new <= 1 and lo_ >= rinfo[RI_R, rq_] and not (lo_ <= sj < hi_):
                if n_new > q[Q_FQLEN]:
                    return i
                if n_new == 1:
                    ist[I_EV] += _take_new(bk, rc, um, ir, sm, skey, q, ring, tbl2d, sl, nb0, 1)
                for j in range(lo_, hi_):  # irregular blocks join their position's holders
                    b = tbl2d[sl, j]
                    a = rinfo[RI_IOFF, rq_] + j - rinfo[RI_R, rq_]
                    cn = ir[a, 2]
                    bk[b, B_DNEXT] = -1
                    if cn == 0:
                        ir[a, 0] = b
                        bk[b, B_DPREV] = -1
                    else:
                        tt = ir[a, 1]
                        bk[tt, B_DNEXT] = b
                        bk[b, B_DPREV] = tt
                    ir[a, 1] = b
                    ir[a, 2] = cn + 1
                    bk[b, B_KIND] = KIND_IRR
                    bk[b, B_POS] = a
                if hi_ > lo_:
                    q[Q_NHASHED] += hi_ - lo_
                s_nblk[sl] = nblk
                ist[I_PARTIAL] += nt % B - n0 % B
                s_ntok[sl] = nt
            elif not _extend(pol, sa, sl, m, B, G, U, rinfo, ist):
                return i
            A += m
            applied[i] = t
        if final:
            break
        u = q[Q_NUSED]
        c = q[Q_NCACHED]
        v = q[Q_NHASHED] * B + ist[I_PARTIAL]
        out[t, 0] = u
        out[t, 1] = c
        out[t, 2] = v + n * t - A
        last = t + 1
    return -1


@njit(cache=True)
def run_loop(tr, pol, rinfo, B, G, num_slots, cfg, kind, cp, rq, rf, wq, run, plan, sa, free_slots, scratch,
             pf_n, pf_c, pf_g, tl_i, tl_t, ist, fst, stop_done, rec):
    """``_conc_vllm_kernels.run_loop`` on this module's pool (module docstring); also returns
    :data:`S_GROW_UNITS` (grow ``rc`` / ``um``, call again).

    Parameters
    ----------
    tr : tuple
        The trace's arrays: ``ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
        output_len, unit_tokens`` (as :func:`radixkv.trace._seq_kernel.kv_seq_into` takes them).
    pol : tuple
        This module's pool ``bk, rc, um, ir, sm, skey, q`` (:func:`new_pool`).
    rinfo : int64 (6, n)
        Per request ``RI_*``: regular blocks, covered tokens, unit ids, irregular-arena
        offset, straddle position (−1: none), the straddle's offset in its unit.
    B, G : int
        ``block_size``; blocks per unit (U / B).
    cfg : int64 (8,)
        ``max_num_seqs, max_num_batched_tokens, enable_chunked_prefill,
        long_prefill_token_threshold, watermark blocks, fast_forward, timeline, most
        timeline rows one step may add`` (the largest output length + 1).
    kind, cp : int, float64 array
        Cost model (``COST_*``) and its parameters.
    rq : int64 (16, n)
        Per request: P, N, gen, ctx, kv, target, hit, held, evicted, admissions,
        preemptions, recomputed, admit_step, finish_step, slot, kv_len.
    rf : float64 (5, n)
        Per request: arrival, admit, first token, finish times (s); row 4 unused.
    wq : int64 (n,)
        Waiting queue (ring buffer: ``ist[I_WHEAD]``, ``ist[I_WLEN]``).
    run : int64 (cap,)
        Running requests in order (``ist[I_NRUN]``).
    plan : int64 (4, cap)
        The step's items: request, new tokens, KV before, prefill flag.
    sa : tuple
        Per slot: ``unit keys (S, NU), tbl (S, W), sid (S, M), send (S, M), nseg, nblk,
        ntok, request``.
    free_slots : int64 (S,)
        Stack of free slots (``ist[I_NFREE]``).
    scratch : tuple
        ``unit keys, tbl, sid, send`` for lookups of a waiting request.
    pf_n, pf_c, pf_g : int64
        Prefill log: items (new tokens, KV before) and each logged step's first item.
    tl_i, tl_t : int64 (7, R), float64 (R,)
        Timeline rows (``ist[I_TLN]`` used), when ``cfg[6]``: step, running, waiting,
        batch tokens, running / cached / free slots; and the clock (``TIMELINE_COLUMNS``
        of :mod:`radixkv.replay.concurrent`).
    ist, fst : int64 (NI,), float64 (NFS,)
        Loop state (``I_*``, ``F_*``).
    stop_done : int
        Return :data:`S_PROGRESS` once this many requests finished.
    rec : tuple
        The miss recorder's arrays (:func:`radixkv.replay._miss_rec_kernels.new_state`);
        when on, every iteration is told to :func:`~radixkv.replay._miss_rec_kernels.rec_step`
        as the Python loop tells ``MissRecorder.step``.

    Returns
    -------
    int
        A status ``S_*``.
    """
    bk, rc, um, ir, sm, skey, st, ring = pol
    ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens = tr
    uk2d, tbl2d, sid2d, send2d, s_nseg, s_nblk, s_ntok, s_req = sa
    huk, htbl, hsid, hsend = scratch
    U = unit_tokens
    # unit records one iteration may create: each is a unit's first cached position, and an
    # iteration caches at most 2 × its token budget / B + 4 blocks per item
    units_step = 2 * (cfg[1] // B) + 4 * run.shape[0] + 4
    P = rq[0]
    N = rq[1]
    gen = rq[2]
    ctx = rq[3]
    kv = rq[4]
    target = rq[5]
    hit = rq[6]
    held = rq[7]
    evicted = rq[8]
    admissions = rq[9]
    preemptions = rq[10]
    recomputed = rq[11]
    admit_step = rq[12]
    finish_step = rq[13]
    slot_of = rq[14]
    kvlen = rq[15]
    arr = rf[0]
    admit_s = rf[1]
    first_tok = rf[2]
    finish = rf[3]
    max_num_seqs = cfg[0]
    max_batched = cfg[1]
    chunked = cfg[2] != 0
    threshold = cfg[3]
    wm = cfg[4]
    ff_on = cfg[5] != 0
    tl_on = cfg[6] != 0
    tl_need = cfg[7]
    n = P.shape[0]
    cap_run = run.shape[0]
    wcap = wq.shape[0]
    p_req = plan[0]
    p_new = plan[1]
    p_ctx = plan[2]
    p_pre = plan[3]
    S = B
    rec_on = rec[0][MR.RS_ON] != 0
    while ist[I_DONE] < n:
        if ist[I_DONE] >= stop_done:
            return S_PROGRESS
        now = fst[F_NOW]
        nxt = ist[I_NXT]
        while nxt < n and arr[nxt] <= now:
            wq[(ist[I_WHEAD] + ist[I_WLEN]) % wcap] = nxt
            ist[I_WLEN] += 1
            nxt += 1
        ist[I_NXT] = nxt
        nrun = ist[I_NRUN]
        if nrun == 0 and ist[I_WLEN] == 0:
            if arr[nxt] > now:
                fst[F_NOW] = arr[nxt]
            continue
        # room for this step's admissions and prefill log (resumable stops)
        need = min(cap_run - nrun, ist[I_WLEN])
        if ist[I_NFREE] < need:
            return S_GROW_SLOTS
        if pf_n.shape[0] - ist[I_PFN] < cap_run or pf_g.shape[0] - ist[I_PFG] < 1:
            return S_GROW_LOG
        if tl_on and tl_t.shape[0] - ist[I_TLN] < tl_need:
            return S_GROW_TL
        # (the running and the admitted of one iteration are at most max_num_seqs: an admission
        # can only preempt itself, and none follows a preemption)
        if rec_on and not MR.rec_room(rec, cap_run):
            return S_GROW_REC
        if rc.shape[0] - st[Q_NREC] < units_step or 2 * (st[Q_NREC] + units_step) > um.shape[0]:
            return S_GROW_UNITS
        # ---------------------------------------------------------- schedule (VllmScheduler.schedule)
        steps = ist[I_STEPS]
        np_ = 0
        preempted = 0
        blocked = False
        budget = max_batched
        cap = threshold if nrun + ist[I_WLEN] > 1 else 0
        k = 0
        while k < nrun and budget > 0:
            r = run[k]
            if ctx[r] >= target[r]:
                # a decode whose token needs no new block and fills none: _serve's outcome
                # without the pool call (most decode steps)
                sl = slot_of[r]
                n0 = s_ntok[sl]
                need = ctx[r] + 1 - kv[r]
                if need <= 0 or (need == 1 and n0 % B != 0 and (n0 + 1) % B != 0):
                    if need == 1:
                        s_ntok[sl] = n0 + 1
                        ist[I_PARTIAL] += 1
                        kv[r] = n0 + 1
                    p_req[np_] = r
                    p_new[np_] = 1
                    p_ctx[np_] = ctx[r]
                    p_pre[np_] = 0
                    np_ += 1
                    budget -= 1
                    k += 1
                    continue
            nrun, made, c, ok = _serve(r, nrun, cap, budget, pol, sa, B, G, U, rinfo, ist, run, ctx, target, kv,
                                       slot_of, preemptions, wq, wcap, free_slots, p_req, p_new, p_ctx, p_pre, np_,
                                       rec)
            preempted += made
            if not ok:
                break
            np_ += 1
            budget -= c
            k += 1
        ist[I_NRUN] = nrun
        if preempted == 0 and ist[I_WLEN] > 0:
            # ------------------------------------------------------ admission (VllmScheduler._admit_pass)
            while ist[I_WLEN] > 0 and budget > 0:
                if nrun >= max_num_seqs:
                    blocked = True
                    break
                i = wq[ist[I_WHEAD]]
                n_tok = P[i] + gen[i]
                if not chunked:
                    h, _m = _head_lookup(pol, tr, i, n_tok, B, G, rinfo, huk, htbl, hsid, hsend, ist, False)
                    rem = n_tok - h * B
                    c = rem if cap <= 0 else min(rem, cap)
                    if min(c, n_tok) > budget:
                        blocked = True
                        break
                if wm > 0 and nrun > 0:
                    h, _m = _head_lookup(pol, tr, i, n_tok, B, G, rinfo, huk, htbl, hsid, hsend, ist, True)
                    touch = 0
                    for q in range(h):
                        if bk[htbl[0, q], B_REF] == 0:
                            touch += 1
                    if (n_tok + B - 1) // B - h + touch + wm > num_slots - st[Q_NUSED]:
                        blocked = True
                        break
                c = n_tok if cap <= 0 else min(n_tok, cap)
                asked = min(n_tok, min(c, budget))
                # BlockHashCache.admit(i, known seq, asked)
                sl = free_slots[ist[I_NFREE] - 1]
                m = kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens,
                                i, sid2d[sl], send2d[sl])
                unit_keys_into(ids, id_offsets, i, uk2d[sl])
                code, hb, hd, ev, nblk = admit(pol, i, uk2d, sl, rinfo, send2d, G, U, B, n_tok, asked,
                                               admissions[i] == 0, tbl2d)
                if code != OK:
                    blocked = True
                    break
                ist[I_NFREE] -= 1
                slot_of[i] = sl
                s_req[sl] = i
                s_nseg[sl] = m
                s_nblk[sl] = nblk
                ntok = max(asked, hb * B)
                s_ntok[sl] = ntok
                ist[I_PARTIAL] += ntok % B
                ist[I_EV] += ev
                ist[I_WHEAD] = (ist[I_WHEAD] + 1) % wcap
                ist[I_WLEN] -= 1
                h = hb * B
                if admissions[i] == 0:
                    hit[i] = h
                    held[i] = min(hd, n_tok)
                    admit_s[i] = now
                    admit_step[i] = steps + 1
                    if rec_on:
                        MR.rec_admitted(rec, i)
                else:
                    recomputed[i] += n_tok - h
                evicted[i] += ev * B
                admissions[i] += 1
                ctx[i] = h
                target[i] = n_tok
                kv[i] = max(asked, h)
                run[nrun] = i
                nrun += 1
                nrun, made, c, ok = _serve(i, nrun, cap, budget, pol, sa, B, G, U, rinfo, ist, run, ctx, target, kv, slot_of,
                                           preemptions, wq, wcap, free_slots, p_req, p_new, p_ctx, p_pre, np_, rec)
                preempted += made
                if not ok:
                    blocked = True
                    break
                np_ += 1
                budget -= c
            ist[I_NRUN] = nrun
        if np_ == 0:
            if nrun == 0:
                ist[I_ARG] = wq[ist[I_WHEAD]]
                return S_IDLE_REFUSED
            if rec_on:
                MR.rec_step(rec, now, now, p_req, p_new, p_ctx, p_pre, 0, 0, p_req, 0)
            continue  # only preemptions happened; schedule again at the same time
        # the plan as scheduled, for the miss recorder (complete reuses its rows)
        i_req = p_req[:np_].copy() if rec_on else p_req[:0]
        i_new = p_new[:np_].copy() if rec_on else p_new[:0]
        i_ctx = p_ctx[:np_].copy() if rec_on else p_ctx[:0]
        i_pre = p_pre[:np_].copy() if rec_on else p_pre[:0]
        t_start = now
        if nrun > ist[I_PEAK]:
            ist[I_PEAK] = nrun
        pure = True
        for q in range(np_):
            if p_pre[q] != 0:
                pure = False
                break
        can_ff = False
        if ff_on and pure and preempted == 0 and np_ == nrun:
            can_ff = ist[I_WLEN] == 0 or blocked
        nfin = 0
        kk = 1
        if can_ff:
            # ------------------------------------------------------ Scheduler.max_fast_forward
            k_fin = N[run[0]] - gen[run[0]]
            for q in range(1, nrun):
                x = N[run[q]] - gen[run[q]]
                if x < k_fin:
                    k_fin = x
            if k_fin <= 1:
                kk = max(k_fin, 1)
            else:
                room = num_slots - st[Q_NUSED] - nrun
                nd = 0
                for q in range(nrun):
                    x = kv[run[q]]
                    nd += (x + k_fin - 1 + S - 1) // S - (x + S - 1) // S
                if nd <= room:
                    kk = k_fin
                else:
                    lo, hi = 1, k_fin
                    while hi - lo > 1:
                        mid = (lo + hi) // 2
                        nd = 0
                        for q in range(nrun):
                            x = kv[run[q]]
                            nd += (x + mid - 1 + S - 1) // S - (x + S - 1) // S
                        if nd <= room:
                            lo = mid
                        else:
                            hi = mid
                    kk = lo
            if kk > 1 and ist[I_WLEN] > 0 and nrun < max_num_seqs:
                # VllmScheduler._hit_growth_bound
                head = wq[ist[I_WHEAD]]
                L = P[head] + gen[head]
                hb, hm = _head_lookup(pol, tr, head, L, B, G, rinfo, huk, htbl, hsid, hsend, ist, False)
                mblk = (hb * B) // S
                for q in range(nrun):
                    r = run[q]
                    K0 = kv[r]
                    end = (mblk + 1) * S
                    if K0 >= end or end > L:
                        continue
                    j = end - K0
                    if j >= kk:
                        continue
                    if end > kvlen[r]:
                        continue
                    sl = slot_of[r]
                    if _shared_prefix(hsid, hsend, hm, sid2d[sl], send2d[sl], s_nseg[sl]) >= end:
                        kk = j
            batch = np_
            csum = 0
            for q in range(np_):
                csum += p_ctx[q]
            dts = _decode_steps_time(kind, cp, batch, csum, kk)
            if ist[I_WLEN] == 0 and nxt < n:
                acc = 0.0
                a_next = arr[nxt]
                for j in range(kk):
                    acc = dts[0] if j == 0 else acc + dts[j]
                    if now + acc >= a_next:
                        if j + 1 < kk:
                            kk = j + 1
                        break
            # ------------------------------------------------------ Scheduler.fast_forward
            pools = np.empty((kk, 3), dtype=np.int64)
            if kk > 1:
                slots = np.empty(nrun, dtype=np.int64)
                kv0 = np.empty(nrun, dtype=np.int64)
                for q in range(nrun):
                    slots[q] = slot_of[run[q]]
                    kv0[q] = kv[run[q]]
                pools[0, 0] = st[Q_NUSED]
                pools[0, 1] = st[Q_NCACHED]
                pools[0, 2] = st[Q_NHASHED] * B + ist[I_PARTIAL]
                bad = _decode_run(pol, sa, slots, kv0, B, G, U, rinfo, kk, pools, ist)
                if bad >= 0:
                    ist[I_ARG] = run[bad]
                    return S_DECODE_REFUSED
                for q in range(nrun):
                    kv[run[q]] += kk - 1
            for q in range(nrun):
                r = run[q]
                ctx[r] += kk
                gen[r] += kk
                if gen[r] >= N[r]:
                    _release(pol, sa, slot_of[r], B, ist, free_slots)
                    slot_of[r] = -1
                    p_new[nfin] = r  # reuse: finished rows in order
                    nfin += 1
            pools[kk - 1, 0] = st[Q_NUSED]
            pools[kk - 1, 1] = st[Q_NCACHED]
            pools[kk - 1, 2] = st[Q_NHASHED] * B + ist[I_PARTIAL]
            # _Integrals.run: the float operations of _Integrals.step, step by step
            fr = float(nrun)
            for j in range(kk):
                dt = dts[j]
                used = pools[j, 0]
                cached = pools[j, 1]
                waste = (used + cached) * S - pools[j, 2]
                fst[F_AREA] += fr * dt
                fst[F_BUSY] += dt
                fst[F_WASTE] += float(waste) * dt
                if waste > ist[I_WPEAK]:
                    ist[I_WPEAK] = waste
                fst[F_USED] += float(used) * dt
                fst[F_CACHED] += float(cached) * dt
                now += dt
                if tl_on:
                    _tl_row(tl_i, tl_t, ist, steps + j + 1, now, nrun, ist[I_WLEN], batch, used, cached, num_slots)
            ist[I_STEPS] = steps + kk
            steps += kk
            nfirst = 0
        else:
            # ------------------------------------------------------ one step: cost, prefill log, complete
            sn = 0
            sa_ = 0
            sb = 0
            npf = 0
            for q in range(np_):
                a = p_new[q]
                cc = p_ctx[q]
                sn += a
                sa_ += a * cc + a * (a + 1) // 2
                sb += cc + a
                if p_pre[q] != 0:
                    if npf == 0:
                        pf_g[ist[I_PFG]] = ist[I_PFN]
                        ist[I_PFG] += 1
                    pf_n[ist[I_PFN]] = a
                    pf_c[ist[I_PFN]] = cc
                    ist[I_PFN] += 1
                    npf += 1
            dt = _step_time(kind, cp, sn, sa_, sb)
            # Scheduler.complete (finished rows collected in p_ctx, first tokens in plan row 3)
            nfirst = 0
            for q in range(np_):
                r = p_req[q]
                a = p_new[q]
                if p_pre[q] != 0:
                    ctx[r] += a
                    if ctx[r] < target[r]:
                        continue
                    if N[r] > 0:
                        if gen[r] == 0:
                            p_pre[nfirst] = -1 - r  # rows < q already read
                            nfirst += 1
                        gen[r] += 1
                else:
                    ctx[r] += 1
                    gen[r] += 1
                if gen[r] >= N[r]:
                    _release(pol, sa, slot_of[r], B, ist, free_slots)
                    slot_of[r] = -1
                    p_ctx[nfin] = r
                    nfin += 1
            steps += 1
            ist[I_STEPS] = steps
            used = st[Q_NUSED]
            cached = st[Q_NCACHED]
            valid = st[Q_NHASHED] * B + ist[I_PARTIAL]
            waste = (used + cached) * S - valid
            fst[F_AREA] += float(nrun) * dt
            fst[F_BUSY] += dt
            fst[F_WASTE] += float(waste) * dt
            if waste > ist[I_WPEAK]:
                ist[I_WPEAK] = waste
            fst[F_USED] += float(used) * dt
            fst[F_CACHED] += float(cached) * dt
            now += dt
            if tl_on:
                _tl_row(tl_i, tl_t, ist, steps, now, nrun, ist[I_WLEN], sn, used, cached, num_slots)
            for q in range(nfirst):
                r = -1 - p_pre[q]
                if np.isnan(first_tok[r]):
                    first_tok[r] = now
        fst[F_NOW] = now
        if nfin:
            fin_rows = p_new if can_ff else p_ctx
            for q in range(nfin):
                r = fin_rows[q]
                finish[r] = now
                finish_step[r] = steps
            # running order without the finished (Scheduler.complete / fast_forward)
            w = 0
            for q in range(nrun):
                r = run[q]
                if slot_of[r] >= 0:
                    run[w] = r
                    w += 1
            ist[I_NRUN] = w
            ist[I_DONE] += nfin
        if rec_on:
            MR.rec_step(rec, t_start, now, i_req, i_new, i_ctx, i_pre, i_req.shape[0], kk if can_ff else 1,
                        p_new if can_ff else p_ctx, nfin)
    return S_DONE
