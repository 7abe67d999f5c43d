"""The concurrent replay's step loop for SGLang's rules over :class:`~radixkv.policies.radix.RadixCache`,
inside Numba calls.

:func:`run_loop` is :func:`radixkv.replay.concurrent.replay_concurrent` with
:class:`~radixkv.replay.sched_sglang.SglangScheduler` and a
:class:`~radixkv.cost.CostModel`, written over int64/float64 arrays: the waiting queue
(a ring), the running list, the per-request state of :class:`~radixkv.replay.scheduler.Scheduler`,
the step integrals of ``_Integrals`` and the optional timeline. It calls the tree kernels of
:mod:`radixkv.policies._radix_kernels` directly on the policy's arrays, in the order the
Python path calls them through ``RadixCache`` (``match_and_lock`` → ``admit``,
``extend``, ``commit``, ``finish``, ``preempt`` → ``release``), so the tree, its LRU
clock and every result are the same. Each rule is the Python path's, which names its
SGLang source (:mod:`radixkv.replay.sched_sglang`): ``PrefillAdder`` budget
(``schedule_policy.py :: PrefillAdder.add_one_req`` / ``add_chunked_req``,
``mem_cache/prefill_budget.py``), prefill-first steps
(``scheduler.py :: Scheduler.get_next_batch_to_run``), per-chunk insertion
(``cache_unfinished_req``), decode retraction (``schedule_batch.py ::
ScheduleBatch.retract_decode`` / ``_get_decode_retraction_order``), ``new_token_ratio``
(``NewTokenRatioTracker``), ``lpm`` with in-batch deprioritisation
(``SchedulePolicy.calc_priority`` / ``_compute_prefix_matches``).

Floating point: every float is formed by the same IEEE operations in the same order as
the Python path. In particular the admission offset ``Σ_running min(N − g, 4096) ·
new_token_ratio`` is added left to right in running order starting from 0.0 (the Python
path adds it with an explicit loop in the same order — not ``sum()``, whose float
summation changed in Python 3.12); the FLOPs of several prefill items are summed as
``np.sum`` sums them (numpy's pairwise summation, :func:`_np_pairwise_sum`); the step
integrals and the clock are added step by step (``np.cumsum`` order); the arrival cut of a
fast-forwarded run uses ``now + cumsum(dts)``.

The loop runs until every request finished or it must hand control back (``status``):
arrays of the tree to grow (:data:`ST_GROW`; checked before each step against what one
step can use at most; a store that compaction frees enough is compacted in place instead,
:func:`_compact_in_place`), the timeline buffer full (:data:`ST_TIMELINE`), a progress report
due (:data:`ST_PROGRESS`), or an error the Python path raises (:data:`ST_NO_FIT`,
:data:`ST_DECODE`, :data:`ST_REFUSED`). All its state is in the arrays, so the caller
(:mod:`radixkv.replay.conc_sglang`) grows what is needed and calls it again.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba.core import config as numba_config

import radixkv.clock._kernels as TK
import radixkv.policies._radix_kernels as K
from radixkv.policies._borrowed import borrow, borrow_each, borrow_py
import radixkv.replay._miss_rec_kernels as MR
from radixkv.trace._seq_kernel import kv_seq_into, kv_seq_len

if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run
    borrow = borrow_py  # noqa: F811

# per-request int64 fields (array RQ, shape (n, NQ))
(Q_P, Q_N, Q_GEN, Q_CTX, Q_KV, Q_TARGET, Q_HIT, Q_HELD, Q_EVICTED, Q_ADMISSIONS, Q_PREEMPTIONS,
 Q_RECOMPUTED, Q_ADMIT_STEP, Q_FINISH_STEP, Q_RUNNING) = range(15)
NQ = 15
# per-request float64 fields (array RF, shape (n, NFL))
F_ADMIT, F_FIRST, F_FINISH = range(3)
NFL = 3
# int64 scalars (array IV)
(I_NXT, I_DONE, I_STEPS, I_PEAK, I_WHEAD, I_WLEN, I_NRUN, I_TLN, I_WASTE_PEAK, I_STATUS, I_ERR,
 I_NEED_NODES, I_NEED_SEGS, I_NEED_ROWS, I_PROGRESS_AT, I_NSRC, I_GNXT, I_FINNOW, I_IVN) = range(19)
NIV = 19
# I_NSRC: rows of ``src`` the loop may enqueue; I_GNXT: arrivals of ``garr`` at or before the
# clock; I_FINNOW: requests that finished at exactly the clock; I_IVN: interval rows used
# float64 scalars (array FV)
V_NOW, V_AREA, V_BUSY, V_PF, V_WASTE_AREA, V_USED_AREA, V_CACHED_AREA, V_RATIO, V_LIMIT = range(9)
NFV = 9  # V_LIMIT: return ST_LIMIT before a step that would start at or after it
# cost model parameters (array CP): CostModel fields as float64; for a
# radixkv.clock.calibrated.CalibratedCostModel, CP[:NCP] holds the fields prefill FLOPs
# need (C_PARAMS, C_LAYERS, C_ATTN) and CP[NCP:] its packed() array (radixkv.clock._kernels)
(C_PARAMS, C_LAYERS, C_ATTN, C_KVB, C_PEAK, C_HBM, C_WDB, C_MFU, C_MBU, C_TP, C_OVERHEAD) = range(11)
NCP = 11
# configuration (array CF, int64)
CF_MAX_SEQS, CF_BUDGET, CF_LPM, CF_FF, CF_TIMELINE, CF_NUM_SLOTS, CF_MAX_SEG, CF_INTERVALS = range(8)
NCF = 8  # CF_INTERVALS: log each step's interval (IVT, IVN)
# timeline int64 columns (array TLI); the clock is TLF
TL_STEP, TL_RUNNING, TL_WAITING, TL_TOKENS, TL_USED, TL_CACHED, TL_FREE = range(7)
NTL = 7

ST_DONE, ST_GROW, ST_TIMELINE, ST_PROGRESS, ST_NO_FIT, ST_DECODE, ST_REFUSED = range(7)
ST_GROW_REC = 7  # the miss recorder's logs (radixkv.replay._miss_rec_kernels) must grow
ST_LIMIT = 8  # the next step would start at or after FV[V_LIMIT]: route the next arrival, call again
ST_GROW_IV = 9  # the interval log is full

#: SGLang defaults, the values of :mod:`radixkv.replay.sched_sglang`
CLIP = 4096
INIT_RATIO = 0.7
RETRACT_DECODE_STEPS = 20
LPM_MAX_WAITING = 128
PREFIX_THRESHOLD = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = ..._DEPRIORITIZE_THRESHOLD

_ONE = np.int64(1)
_Z = np.int64(0)


@nb.njit(cache=True)
def build_seqs(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens):
    """Every request's KV segments, back to back: ``(seg_id, seg_end, offsets)`` (int64;
    request i is ``[offsets[i], offsets[i+1])``), equal to ``Trace.kv_seq(i)``."""
    n = prompt_len.shape[0]
    off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        off[i + 1] = off[i] + kv_seq_len(id_offsets, out_offsets, has_out, prompt_len, output_len, unit_tokens, i)
    sid = np.empty(off[n], dtype=np.int64)
    send = np.empty(off[n], dtype=np.int64)
    for i in range(n):
        kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                    sid[off[i]:off[i + 1]], send[off[i]:off[i + 1]])
    return sid, send, off


@nb.njit(cache=True)
def _pairwise_block(a, lo, n):
    """numpy's ``pairwise_sum`` of ``a[lo:lo+n]`` for n ≤ 128 (no further split)."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    m = n - (n % 8)
    while i < m:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@nb.njit(cache=True)
def _np_pairwise_sum(a, lo, n):
    """``np.sum`` of ``a[lo:lo+n]`` (float64, contiguous) with numpy's own pairwise
    summation (``pairwise_sum`` of ``numpy/_core/src/umath/loops_utils.h.src``: below 8
    items a plain loop from 0.0; up to 128 items eight interleaved partial sums combined
    as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the rest; above, the two halves, cut at
    a multiple of 8, summed recursively and added). The recursion runs on an explicit
    stack (post-order), so the additions are numpy's, in its order."""
    if n <= 128:
        return _pairwise_block(a, lo, n)
    # frames: (lo, n, state); state 0 = to expand, 1 = left done (value pushed)
    st_lo = np.empty(128, dtype=np.int64)
    st_n = np.empty(128, dtype=np.int64)
    st_s = np.empty(128, dtype=np.int64)
    vals = np.empty(128, dtype=np.float64)
    nv = 0
    sp = 0
    st_lo[0], st_n[0], st_s[0] = lo, n, 0
    sp = 1
    while sp > 0:
        top = sp - 1
        lo_, n_, s_ = st_lo[top], st_n[top], st_s[top]
        if n_ <= 128:
            vals[nv] = _pairwise_block(a, lo_, n_)
            nv += 1
            sp -= 1
            continue
        n2 = n_ // 2
        n2 -= n2 % 8
        if s_ == 0:  # evaluate the left half first
            st_s[top] = 1
            st_lo[sp], st_n[sp], st_s[sp] = lo_, n2, 0
            sp += 1
        elif s_ == 1:  # then the right half
            st_s[top] = 2
            st_lo[sp], st_n[sp], st_s[sp] = lo_ + n2, n_ - n2, 0
            sp += 1
        else:  # left + right
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            sp -= 1
    return vals[0]


@nb.njit(cache=True, inline="always")
def _prefill_flops(CP, n, c):
    """``CostModel.prefill_flops(n, c)`` of two ints (the same float operations)."""
    nf = float(n)
    cf = float(c)
    return 2.0 * CP[C_PARAMS] * nf + 4.0 * CP[C_LAYERS] * CP[C_ATTN] * (nf * cf + nf * (nf + 1) / 2)


@nb.njit(cache=True, inline="always")
def _time(CP, flops, bytes_):
    t_c = flops / (CP[C_PEAK] * CP[C_MFU] * CP[C_TP])
    t_m = bytes_ / (CP[C_HBM] * CP[C_MBU] * CP[C_TP])
    return (t_c if t_c >= t_m else t_m) + CP[C_OVERHEAD]


@nb.njit(cache=True, inline="always")
def _step_time(CP, pnew, pctx, m):
    """``CostModel._step_time_ints`` of the plan's items (integer sums, exact: the caller
    checked they stay below 2**53)."""
    if m == 0:
        return 0.0
    sn = 0
    sa = 0
    sb = 0
    for j in range(m):
        n = pnew[j]
        c = pctx[j]
        sn += n
        sa += n * c + n * (n + 1) // 2
        sb += c + n
    if CP.shape[0] > NCP:
        return TK.step_time(CP[NCP:], float(sn), float(sa), float(sb))
    flops = 2.0 * CP[C_PARAMS] * float(sn) + 4.0 * CP[C_LAYERS] * CP[C_ATTN] * float(sa)
    bytes_ = CP[C_PARAMS] * CP[C_WDB] + CP[C_KVB] * float(sb)
    return _time(CP, flops, bytes_)


@nb.njit(cache=True, inline="always")
def _decode_step_time(CP, batch, ctx_sum, j):
    """Element j of ``CostModel.decode_steps_time(batch, ctx_sum, k)``."""
    ctx = float(ctx_sum) + float(j) * batch
    flops = 2.0 * CP[C_PARAMS] * batch + 4.0 * CP[C_LAYERS] * CP[C_ATTN] * (ctx + batch)
    bytes_ = CP[C_PARAMS] * CP[C_WDB] + CP[C_KVB] * (ctx + batch)
    return _time(CP, flops, bytes_)


# ----------------------------------------------------------------------------- queues
@nb.njit(cache=True, inline="always")
def _w_push(IV, WQ, i):
    cap = WQ.shape[0]
    WQ[(IV[I_WHEAD] + IV[I_WLEN]) % cap] = i
    IV[I_WLEN] += 1


@nb.njit(cache=True, inline="always")
def _w_at(IV, WQ, k):
    return WQ[(IV[I_WHEAD] + k) % WQ.shape[0]]


@nb.njit(cache=True, inline="always")
def _w_pop(IV, WQ):
    i = WQ[IV[I_WHEAD]]
    IV[I_WHEAD] = (IV[I_WHEAD] + 1) % WQ.shape[0]
    IV[I_WLEN] -= 1
    return i


@nb.njit(cache=True, inline="always")
def _run_remove(IV, RUN, v):
    n = IV[I_NRUN]
    j = 0
    while RUN[j] != v:
        j += 1
    for t in range(j, n - 1):
        RUN[t] = RUN[t + 1]
    IV[I_NRUN] = n - 1


# ----------------------------------------------------------------------------- pool
@nb.njit(cache=True, inline="always")
def _room_slots(S, num_slots):
    """``RadixCache.room_slots``: free + evictable slots."""
    p = S[K.S_P]
    return num_slots - S[K.S_PRIV] - (S[K.S_PROT] if p == 1 else S[K.S_PROT] // p)


@nb.njit(cache=True, inline="always")
def _sample(S, R, RUN, nrun, num_slots):
    """``RadixCache.stats(detail=False)``: (used, cached, valid) slots/tokens."""
    p = S[K.S_P]
    if p == 1:
        priv = 0
        for t in range(nrun):
            r = RUN[t]
            priv += R[r, K.R_COMP] - R[r, K.R_OWNED]
        return S[K.S_PRIV] + S[K.S_PROT], S[K.S_EVTOK], S[K.S_EVTOK] + S[K.S_PROT] + priv
    priv = 0
    for t in range(nrun):
        r = RUN[t]
        priv += R[r, K.R_COMP] - R[r, K.R_OWNED]
    used = S[K.S_PRIV] + S[K.S_PROT] // p
    cached = S[K.S_EVTOK] // p
    return used, cached, S[K.S_EVTOK] + S[K.S_PROT] + priv


@nb.njit(cache=True, inline="always")
def _integrate(FV, IV, n_run, dt, used, cached, valid, p):
    """``_Integrals.step``."""
    FV[V_AREA] += n_run * dt
    FV[V_BUSY] += dt
    waste = (used + cached) * p - valid
    FV[V_WASTE_AREA] += waste * dt
    if waste > IV[I_WASTE_PEAK]:
        IV[I_WASTE_PEAK] = waste
    FV[V_USED_AREA] += used * dt
    FV[V_CACHED_AREA] += cached * dt
    FV[V_NOW] += dt


@nb.njit(cache=True, inline="always")
def _tl_row(IV, TLI, TLF, step, t, running, waiting, tokens, used, cached, num_slots):
    k = IV[I_TLN]
    TLI[k, TL_STEP] = step
    TLF[k] = t
    TLI[k, TL_RUNNING] = running
    TLI[k, TL_WAITING] = waiting
    TLI[k, TL_TOKENS] = tokens
    TLI[k, TL_USED] = used
    TLI[k, TL_CACHED] = cached
    TLI[k, TL_FREE] = num_slots - used - cached
    IV[I_TLN] = k + 1


@nb.njit(cache=True, inline="always")
def _extend(S, N, H1, H2, o, G, Q, R, r, n_tokens):
    """``RadixCache.extend_many`` of one item: a decode that takes only free slots (no
    eviction, no prompt left) is the slot arithmetic of the ``_decode`` kernel
    (``alloc_for_decode``: a new page when the position starts one, taken from the free
    slots while one stays free); anything else is ``_radix_kernels.extend``."""
    comp = R[r, K.R_COMP]
    end = comp + n_tokens
    if n_tokens > 0 and comp >= R[r, K.R_PLEN] and end <= R[r, K.R_KVMAX]:
        p = S[K.S_P]
        nb = n_tokens if p == 1 else -(-end // p) - -(-comp // p)
        free = S[K.S_FREE]
        if free > nb or (nb == 0 and free > 0):
            S[K.S_FREE] = free - nb
            S[K.S_PRIV] += nb
            R[r, K.R_COMP] = end
            return 1
    # a request's row of R goes to the tree's kernels borrowed, as the sequential span passes
    # its R: one compiled specialisation of each kernel serves both drivers
    return K.extend(S, N, H1, H2, o, G, Q, borrow(R[r]), n_tokens)


# ----------------------------------------------------------------------------- scheduler
@nb.njit(cache=True, inline="always")
def _preempt(S, N, o, Q, R, RQ, IV, RUN, WQ, v, PL, m):
    """``Scheduler._preempt`` (SGLang: ``release_req``; the request is appended to the
    waiting queue, ``_add_request_to_queue``); returns the plan's new length."""
    for j in range(m):
        if PL[j, 0] == v:
            for t in range(j, m - 1):
                for f in range(4):
                    PL[t, f] = PL[t + 1, f]
            m -= 1
            break
    _run_remove(IV, RUN, v)
    RQ[v, Q_RUNNING] = 0
    K.release(S, N, o, Q, borrow(R[v]))
    RQ[v, Q_CTX] = 0
    RQ[v, Q_KV] = 0
    RQ[v, Q_TARGET] = 0
    RQ[v, Q_PREEMPTIONS] += 1
    _w_push(IV, WQ, v)
    return m


@nb.njit(cache=True, inline="always")
def _victim(RQ, IV, RUN):
    """``ScheduleBatch._get_decode_retraction_order``: fewest outputs, then the longest
    prompt, then the latest in the batch."""
    best = -1
    for t in range(IV[I_NRUN]):
        r = RUN[t]
        if best == -1:
            best = t
            continue
        b = RUN[best]
        g, gb = RQ[r, Q_GEN], RQ[b, Q_GEN]
        if g < gb or (g == gb and (RQ[r, Q_P] > RQ[b, Q_P] or (RQ[r, Q_P] == RQ[b, Q_P] and t > best))):
            best = t
    return RUN[best]


@nb.njit(cache=True, inline="always")
def _grow(S, N, H1, H2, o, G, Q, R, RQ, IV, RUN, WQ, r, upto, PL, m, pre_cnt):
    """``Scheduler._grow``: returns (ok, r not preempted, plan length, preemptions)."""
    need = upto - RQ[r, Q_KV]
    while need > 0:
        e = _extend(S, N, H1, H2, o, G, Q, R, r, need)
        if e < 0:
            return -1, m, pre_cnt
        if e == 1:
            RQ[r, Q_KV] = upto
            return 1, m, pre_cnt
        v = _victim(RQ, IV, RUN)
        m = _preempt(S, N, o, Q, R, RQ, IV, RUN, WQ, v, PL, m)
        pre_cnt += 1
        if v == r:
            return 0, m, pre_cnt
    return 1, m, pre_cnt


@nb.njit(cache=True, inline="always")
def _plan_add(PL, m, r, c, ctx, pre):
    PL[m, 0] = r
    PL[m, 1] = c
    PL[m, 2] = ctx
    PL[m, 3] = pre
    return m + 1


@nb.njit(cache=True, inline="always")
def _ceil_page(t, p):
    return -(-t // p) * p


@nb.njit(cache=True)
def _order_waiting_lpm(S, N, H1, G, Q, RQ, IV, WQ, SID, SEND, SOFF, KEYS):
    """``SglangScheduler._order_waiting`` (``SchedulePolicy.calc_priority`` for ``lpm``)."""
    w = IV[I_WLEN]
    p = S[K.S_P]
    sk = np.empty(w, dtype=np.int64)
    items = np.empty(w, dtype=np.int64)
    klen = np.zeros(w, dtype=np.int64)
    nseen = 0
    seen = np.empty(w, dtype=np.int64)
    for k in range(w):
        i = _w_at(IV, WQ, k)
        items[k] = i
        a, b = SOFF[i], SOFF[i + 1]
        fill = RQ[i, Q_P] + RQ[i, Q_GEN]
        kv_len = SEND[b - 1]
        key = (min(fill, kv_len) - 1) // p * p
        hit = K.match_plan(S, N, H1, G, Q, SID[a:b], SEND[a:b], key)[0]
        late = False
        if hit <= PREFIX_THRESHOLD and fill >= PREFIX_THRESHOLD:
            # _fill_key: (id, start) of the segments starting before the threshold
            n = 0
            start = 0
            for s in range(a, b):
                if start >= PREFIX_THRESHOLD:
                    break
                KEYS[k, 2 * n] = SID[s]
                KEYS[k, 2 * n + 1] = start
                n += 1
                start = SEND[s]
            klen[k] = n
            for u in range(nseen):
                o = seen[u]
                if klen[o] == n:
                    same = True
                    for f in range(2 * n):
                        if KEYS[o, f] != KEYS[k, f]:
                            same = False
                            break
                    if same:
                        late = True
                        break
            if not late:
                seen[nseen] = k
                nseen += 1
        sk[k] = (1 << 62) if late else -hit
    order = np.argsort(sk, kind="mergesort")
    for k in range(w):
        WQ[(IV[I_WHEAD] + k) % WQ.shape[0]] = items[order[k]]


@nb.njit(cache=True, inline="always")
def _schedule(S, N, H1, H2, o, G, Q, R, RQ, RF, IV, FV, CF, RUN, WQ, SID, SEND, SOFF, PL, ALLOC, KEYS,
              HC, SNAP, ratio_min, ratio_decay, RA):
    """``SglangScheduler.schedule``: fills PL[:m] (request, tokens, ctx, prefill) and
    returns (m, n_running, preempted, blocked). SNAP: scratch, shape (≥ running,). With
    the miss recorder on (``RA`` longer than 1) its admissions go to
    ``RA[1 : 1 + RA[0]]`` in order: i for a first admission, −1 − i for a re-admission."""
    p = S[K.S_P]
    num_slots = CF[CF_NUM_SLOTS]
    HC[0] = 0  # _head_check = None
    m = 0
    pre_cnt = 0
    blocked = False
    budget = CF[CF_BUDGET]
    ratio = FV[V_RATIO]
    now = FV[V_NOW]
    # offset: added left to right in running order, from 0.0 (module docstring)
    offset = 0.0
    nrun0 = IV[I_NRUN]
    for t in range(nrun0):
        r = RUN[t]
        if RQ[r, Q_CTX] >= RQ[r, Q_TARGET]:
            offset += min(RQ[r, Q_N] - RQ[r, Q_GEN], CLIP) * ratio
    na = 0
    # 1. the unfinished chunked prefills (PrefillAdder.add_chunked_req)
    for t in range(nrun0):
        r = RUN[t]
        if RQ[r, Q_CTX] >= RQ[r, Q_TARGET]:
            continue
        if budget <= 0:
            break
        room = float(_room_slots(S, num_slots) * p) - offset
        avail = min(budget, int(room))  # available_chunk_tokens
        if avail <= 0:
            avail = budget
        left = RQ[r, Q_TARGET] - RQ[r, Q_CTX]
        c = min(left, avail)
        offset += _ceil_page(c, p) + p + (min(RQ[r, Q_N], CLIP) if c >= left else 0)
        budget -= _ceil_page(c, p)
        m = _plan_add(PL, m, r, c, RQ[r, Q_CTX], 1)
        ALLOC[na, 0] = r
        ALLOC[na, 1] = c
        na += 1
    # 2. new requests (_get_new_batch_prefill_raw)
    if IV[I_WLEN] > 0 and budget > 0:
        if CF[CF_LPM] == 1 and IV[I_WLEN] <= LPM_MAX_WAITING:
            _order_waiting_lpm(S, N, H1, G, Q, RQ, IV, WQ, SID, SEND, SOFF, KEYS)
        while IV[I_WLEN] > 0:
            if budget <= 0:
                break
            if IV[I_NRUN] >= CF[CF_MAX_SEQS]:
                blocked = True
                break
            i = _w_at(IV, WQ, 0)
            a, b = SOFF[i], SOFF[i + 1]
            fill = RQ[i, Q_P] + RQ[i, Q_GEN]
            R[i, :] = 0
            ok_, h, held, ev = K.admit(S, N, H1, H2, o, G, Q, borrow(R[i]), SID[a:b], SEND[a:b], fill, _Z, _Z,
                                       i)
            extend = fill - h
            max_new = min(max(RQ[i, Q_N] - RQ[i, Q_GEN], 0), CLIP)
            lone = IV[I_NRUN] == 0 and m == 0
            fits = extend + max_new + p < float(_room_slots(S, num_slots) * p) - offset  # check_prefill
            c = extend
            if _ceil_page(extend, p) > budget:  # truncated: the new chunked request
                c = (h + budget // p * p) // p * p - h
            ok = c > 0 and (fits or (lone and (-(-(h + c) // p) - h // p <= _room_slots(S, num_slots))))
            if not ok:
                room_locked = _room_slots(S, num_slots) * p
                K.release(S, N, o, Q, borrow(R[i]))  # drop the lock; nothing was allocated
                if not lone:
                    HC[0] = 1
                    HC[1] = i
                    HC[2] = c
                    HC[3] = extend + max_new + p
                    HC[4] = room_locked
                    HC[5] = _room_slots(S, num_slots)
                blocked = True
                break
            _w_pop(IV, WQ)
            # Scheduler._record (scheduler.py)
            if RA.shape[0] > 1:
                RA[1 + RA[0]] = i if RQ[i, Q_ADMISSIONS] == 0 else -1 - i
                RA[0] += 1
            if RQ[i, Q_ADMISSIONS] == 0:
                RQ[i, Q_HIT] = h
                RQ[i, Q_HELD] = held
                RF[i, F_ADMIT] = now
                RQ[i, Q_ADMIT_STEP] = IV[I_STEPS] + 1
            else:
                RQ[i, Q_RECOMPUTED] += fill - h
            RQ[i, Q_EVICTED] += ev
            RQ[i, Q_ADMISSIONS] += 1
            RQ[i, Q_CTX] = h
            RQ[i, Q_TARGET] = fill
            RUN[IV[I_NRUN]] = i
            IV[I_NRUN] += 1
            RQ[i, Q_RUNNING] = 1
            chunked = h + c < fill
            offset += _ceil_page(c, p) + p + (0 if chunked else min(RQ[i, Q_N], CLIP))
            budget -= _ceil_page(c, p)
            RQ[i, Q_KV] = h
            ALLOC[na, 0] = i
            ALLOC[na, 1] = c
            na += 1
            if c > 0:
                m = _plan_add(PL, m, i, c, RQ[i, Q_CTX], 1)
            if float(_room_slots(S, num_slots) * p) - offset <= 0:  # budget_state: NO_TOKEN
                blocked = IV[I_WLEN] > 0
                break
    # 3. allocate the batch's KV (ScheduleBatch.prepare_for_extend)
    for u in range(na):
        r = ALLOC[u, 0]
        if RQ[r, Q_RUNNING] == 1:
            st, m, pre_cnt = _grow(S, N, H1, H2, o, G, Q, R, RQ, IV, RUN, WQ, r, RQ[r, Q_CTX] + ALLOC[u, 1],
                                   PL, m, pre_cnt)
            if st < 0:
                return -1, 0, pre_cnt, blocked
    if m > 0:
        return m, IV[I_NRUN], pre_cnt, blocked
    # 4. decode (update_running_batch): retract until it fits, else decay the ratio
    nsnap = IV[I_NRUN]
    snap = SNAP
    for u in range(nsnap):
        snap[u] = RUN[u]
    j = 0
    while j < nsnap and RQ[snap[j], Q_CTX] >= RQ[snap[j], Q_TARGET] and RQ[snap[j], Q_KV] == RQ[snap[j], Q_CTX]:
        j += 1
    done_ = 0  # RadixCache.extend_many(snap[:j], 1)
    while done_ < j:
        r = snap[done_]
        e = _extend(S, N, H1, H2, o, G, Q, R, r, _ONE)
        if e < 0:
            return -1, 0, pre_cnt, blocked
        if e == 0:
            break
        done_ += 1
    for u in range(done_):
        r = snap[u]
        RQ[r, Q_KV] += 1
        m = _plan_add(PL, m, r, 1, RQ[r, Q_CTX], 0)
    for u in range(done_, nsnap):  # from the first refusal on: one by one, retracting as needed
        r = snap[u]
        if RQ[r, Q_RUNNING] == 0:
            continue
        pre = RQ[r, Q_CTX] < RQ[r, Q_TARGET]
        c = min(RQ[r, Q_TARGET] - RQ[r, Q_CTX], 1) if pre else 1
        st, m, pre_cnt = _grow(S, N, H1, H2, o, G, Q, R, RQ, IV, RUN, WQ, r, RQ[r, Q_CTX] + c, PL, m, pre_cnt)
        if st < 0:
            return -1, 0, pre_cnt, blocked
        if st == 1:
            m = _plan_add(PL, m, r, c, RQ[r, Q_CTX], 1 if pre else 0)
    if pre_cnt > 0:  # estimate_new_token_ratio_after_retract
        sg = 0
        sn = 0
        for t in range(IV[I_NRUN]):
            r = RUN[t]
            sg += RQ[r, Q_GEN]
            sn += RQ[r, Q_N]
        FV[V_RATIO] = min(1.0, (sg + RETRACT_DECODE_STEPS * IV[I_NRUN]) / (sn + 1))
    elif m > 0:
        FV[V_RATIO] = max(FV[V_RATIO] - ratio_decay, ratio_min)
    return m, IV[I_NRUN], pre_cnt, blocked


@nb.njit(cache=True, inline="always")
def _max_fast_forward(S, RQ, IV, RUN, num_slots):
    """``Scheduler.max_fast_forward`` (the base bound)."""
    nrun = IV[I_NRUN]
    k_fin = RQ[RUN[0], Q_N] - RQ[RUN[0], Q_GEN]
    for t in range(1, nrun):
        r = RUN[t]
        x = RQ[r, Q_N] - RQ[r, Q_GEN]
        if x < k_fin:
            k_fin = x
    if k_fin <= 1:
        return max(k_fin, 1)
    p = S[K.S_P]
    room = _room_slots(S, num_slots) - nrun
    if _ff_need(RQ, RUN, nrun, p, k_fin) <= room:
        return k_fin
    lo = 1
    hi = k_fin
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _ff_need(RQ, RUN, nrun, p, mid) <= room:
            lo = mid
        else:
            hi = mid
    return lo


@nb.njit(cache=True, inline="always")
def _ff_need(RQ, RUN, nrun, p, k):
    """New slots of k − 1 more tokens for every running request (whole slots)."""
    if p == 1:
        return nrun * (k - 1)
    s = 0
    for t in range(nrun):
        kv = RQ[RUN[t], Q_KV]
        s += -(-(kv + k - 1) // p) - (-(-kv // p))
    return s


@nb.njit(cache=True)
def _blocked_bound(S, RQ, IV, FV, RUN, HC, k, num_slots, ratio_min, ratio_decay):
    """``SglangScheduler._blocked_bound``, the same float operations in the same order."""
    c = HC[2]
    need_tokens = HC[3]
    room_locked = HC[4]
    room_unlocked = HC[5]
    p = S[K.S_P]
    nrun = IV[I_NRUN]
    newc = np.zeros(k, dtype=np.int64)
    for t in range(k):
        newc[t] = _ff_need(RQ, RUN, nrun, p, t + 1)
    used = S[K.S_PRIV] + S[K.S_PROT] // p
    cached = S[K.S_EVTOK] // p
    free = num_slots - used - cached
    # searchsorted(newc, free - 1, side="right")
    cnt = 0
    while cnt < k and newc[cnt] <= free - 1:
        cnt += 1
    k = min(k, cnt)
    if k <= 1 or c <= 0:
        return max(k, 1)
    lock = room_unlocked - room_locked // p
    room_now = _room_slots(S, num_slots)
    ratios = np.empty(k - 1, dtype=np.float64)
    acc = FV[V_RATIO]
    ratios[0] = acc
    for t in range(1, k - 1):
        acc = acc + (-ratio_decay)
        ratios[t] = acc
    for t in range(k - 1):
        if ratios[t] < ratio_min:  # np.maximum(..., ratio_min)
            ratios[t] = ratio_min
    for t in range(k - 1):
        j = t + 1
        room_j = (room_now - newc[j - 1] - lock) * p
        ratio = ratios[t]
        off = 0.0
        first = True
        for u in range(nrun):
            r = RUN[u]
            x = float(min(RQ[r, Q_N] - RQ[r, Q_GEN] - j, CLIP)) * ratio
            if first:
                off = x
                first = False
            else:
                off += x
        margin = (room_j - off) - need_tokens
        near = abs(margin) <= 1e-6 * max(1.0, abs(off))
        if near:  # exact recomputation near the boundary (a loop from 0, as the Python path)
            off2 = 0.0
            for u in range(nrun):
                r = RUN[u]
                off2 += min(RQ[r, Q_N] - RQ[r, Q_GEN] - j, CLIP) * ratio
            margin = 1.0 if need_tokens < room_j - off2 else -1.0
        if margin > 0:
            return t + 1
    return k


@nb.njit(cache=True, inline="always")
def _drop_finished(RQ, IV, RUN):
    n = IV[I_NRUN]
    k = 0
    for t in range(n):
        r = RUN[t]
        if RQ[r, Q_RUNNING] == 1:
            RUN[k] = r
            k += 1
    IV[I_NRUN] = k


@nb.njit(cache=True, inline="always")
def _step_headroom(S, N, G, Q, RQ, IV, CF, WQ, SOFF):
    """What one step can take from the tree's arrays at most; False (needs in IV) when
    the arrays must grow first: nodes (a split per lookup, ≤ 3 per insert of a finish or
    checkpoint), segments and rows of the sequences admitted."""
    room_seats = CF[CF_MAX_SEQS] - IV[I_NRUN]
    if room_seats < 0:
        room_seats = 0
    A = min(IV[I_WLEN], room_seats + 1)
    nodes = 4 * (CF[CF_MAX_SEQS] + 2) + 16
    segs = 0
    if CF[CF_LPM] == 1:
        segs = A * CF[CF_MAX_SEG]
        tot = 0
        for k in range(IV[I_WLEN]):
            i = _w_at(IV, WQ, k)
            tot += SOFF[i + 1] - SOFF[i]
            if tot >= segs:
                break
        segs = min(segs, tot)
    else:
        for k in range(A):
            i = _w_at(IV, WQ, k)
            segs += SOFF[i + 1] - SOFF[i]
    rows = A + 2
    if (S[K.S_NNODES] + 1 + nodes > N.shape[0] or S[K.S_GUSED] + segs > G.shape[1]
            or S[K.S_QHW] + rows >= Q.shape[0]):
        IV[I_NEED_NODES] = nodes
        IV[I_NEED_SEGS] = segs
        IV[I_NEED_ROWS] = rows
        return False
    return True


@nb.njit(cache=True, inline="always")
def _compact_in_place(S, N, G, Q, IV):
    """When only the store lacks room for the step's needs (``IV[I_NEED_*]``) and
    compaction frees enough of it (live + needed segments ≤ half the store), compact it in
    place (``_radix_kernels.compact_store``, the choice ``RadixCache._reserve_exact``
    makes for that case) and return True; else False (the caller hands back to grow)."""
    if S[K.S_NNODES] + 1 + IV[I_NEED_NODES] > N.shape[0] or S[K.S_QHW] + IV[I_NEED_ROWS] >= Q.shape[0]:
        return False
    live = S[K.S_GUSED] - S[K.S_GGARB]
    if live + IV[I_NEED_SEGS] > G.shape[1] // 2:
        return False
    K.compact_store(S, G, Q)
    return True


@nb.njit(cache=True)
def run_loop(S, N, H1, H2, o, G, Q, R, RQ, RF, IV, FV, CF, CP, arr, RUN, WQ, SID, SEND, SOFF, TLI, TLF,
             ratio_min, ratio_decay, rec, src, garr, IVT, IVN):
    """Run the replay loop from the state in the arrays until done or a hand-back
    (module docstring); returns the status (also in ``IV[I_STATUS]``). *rec*: the miss
    recorder's arrays (:func:`radixkv.replay._miss_rec_kernels.new_state`); when on,
    every iteration is told to ``rec_step`` as the Python loop tells ``MissRecorder.step``
    (:data:`ST_GROW_REC`: its logs must grow first). The loop runs on borrowed views of
    the arrays (:mod:`radixkv.policies._borrowed`: no reference counts where its inlined
    helpers bind them; valid for this call, the caller keeps the arrays).

    The engine serves the rows ``src[:IV[I_NSRC]]`` (arrival order; a request joins the
    waiting queue at the first step boundary at or after ``arr[row]``, an idle engine's
    clock jumps to it; :data:`ST_DONE` when all of them finished); a fast-forwarded run
    with nothing waiting is cut at the first arrival of ``garr`` (non-decreasing) after
    its start. The single engine: every row and its own arrivals; a replica of
    :mod:`radixkv.replay.multi_concurrent`: its routed rows and every arrival, with
    ``CF[CF_INTERVALS]`` logging each step's (start, end) in ``IVT`` (float64 (2, R)) and
    running requests in ``IVN`` (int64 (R,))."""
    return _loop(borrow(S), borrow(N), borrow(H1), borrow(H2), borrow_each(o), borrow(G), borrow(Q), borrow(R),
                 borrow(RQ), borrow(RF), borrow(IV), borrow(FV), borrow(CF), borrow(CP), borrow(arr), borrow(RUN),
                 borrow(WQ), borrow(SID), borrow(SEND), borrow(SOFF), borrow(TLI), borrow(TLF), ratio_min,
                 ratio_decay, rec, borrow(src), borrow(garr), borrow(IVT), borrow(IVN))


@nb.njit(cache=True)
def _loop(S, N, H1, H2, o, G, Q, R, RQ, RF, IV, FV, CF, CP, arr, RUN, WQ, SID, SEND, SOFF, TLI, TLF,
          ratio_min, ratio_decay, rec, src, garr, IVT, IVN):
    """:func:`run_loop`'s body, on borrowed views."""
    n = RQ.shape[0]
    p = S[K.S_P]
    num_slots = CF[CF_NUM_SLOTS]
    ms = CF[CF_MAX_SEQS]
    PL = np.empty((n + 1, 4), dtype=np.int64)  # rows [0, m) are written before they are read
    ALLOC = np.empty((n + 1, 2), dtype=np.int64)
    KEYS = np.zeros((LPM_MAX_WAITING + 1, 2 * PREFIX_THRESHOLD + 2), dtype=np.int64)
    HC = np.zeros(6, dtype=np.int64)
    SNAP = np.empty(n + 1, dtype=np.int64)  # scratch: the running list of one step
    RUNC = np.empty(n + 1, dtype=np.int64)
    CNT = np.zeros(max(p, 1), dtype=np.int64)
    DT = np.empty(1024, dtype=np.float64)  # step times of a fast-forwarded run
    tl = CF[CF_TIMELINE] == 1
    rec_on = rec[0][MR.RS_ON] != 0
    RA = np.zeros(n + 2 if rec_on else 1, dtype=np.int64)  # this step's admissions (_schedule)
    RSNAP = np.zeros(n + 1 if rec_on else 1, dtype=np.int64)  # running before the step (recorder)
    FIN = np.zeros(n + 1 if rec_on else 1, dtype=np.int64)  # finished in the step
    iv_on = CF[CF_INTERVALS] == 1
    ng = garr.shape[0]
    while True:
        now = FV[V_NOW]
        while IV[I_NXT] < IV[I_NSRC] and arr[src[IV[I_NXT]]] <= now:
            _w_push(IV, WQ, src[IV[I_NXT]])
            IV[I_NXT] += 1
        if IV[I_NRUN] == 0 and IV[I_WLEN] == 0:
            if IV[I_NXT] >= IV[I_NSRC]:
                IV[I_STATUS] = ST_DONE
                return ST_DONE
            FV[V_RATIO] = INIT_RATIO  # idle: NewTokenRatioTracker.reset
            FV[V_NOW] = max(now, arr[src[IV[I_NXT]]])
            IV[I_FINNOW] = 0
            continue
        if now >= FV[V_LIMIT]:
            IV[I_STATUS] = ST_LIMIT
            return ST_LIMIT
        if iv_on and IV[I_IVN] >= IVN.shape[0]:
            IV[I_STATUS] = ST_GROW_IV
            return ST_GROW_IV
        # hand-backs, before the step changes anything (a new call resumes here); a store
        # that compaction frees enough is compacted here, as RadixCache.reserve_arrays would
        if not _step_headroom(S, N, G, Q, RQ, IV, CF, WQ, SOFF):
            if not _compact_in_place(S, N, G, Q, IV):
                IV[I_STATUS] = ST_GROW
                return ST_GROW
        if tl:
            most = 1  # rows this step can write: 1, or a fast-forwarded run (≤ min outputs left)
            for t in range(IV[I_NRUN]):
                x = RQ[RUN[t], Q_N] - RQ[RUN[t], Q_GEN]
                if x > most:
                    most = x
            if IV[I_TLN] + most + 1 > TLI.shape[0]:
                IV[I_NEED_ROWS] = IV[I_TLN] + most + 1
                IV[I_STATUS] = ST_TIMELINE
                return ST_TIMELINE
        if IV[I_PROGRESS_AT] > 0 and IV[I_DONE] >= IV[I_PROGRESS_AT]:
            IV[I_STATUS] = ST_PROGRESS
            return ST_PROGRESS
        nsnap = 0
        if rec_on:
            if not MR.rec_room(rec, IV[I_NRUN] + min(IV[I_WLEN], CF[CF_MAX_SEQS])):
                IV[I_STATUS] = ST_GROW_REC
                return ST_GROW_REC
            nsnap = IV[I_NRUN]
            RSNAP[:nsnap] = RUN[:nsnap]
            RA[0] = 0
        done0 = IV[I_DONE]
        m, n_running, pre_cnt, blocked = _schedule(S, N, H1, H2, o, G, Q, R, RQ, RF, IV, FV, CF, RUN, WQ,
                                                   SID, SEND, SOFF, PL, ALLOC, KEYS, HC, SNAP, ratio_min, ratio_decay,
                                                   RA)
        m_plan = m
        if rec_on and m >= 0:
            _rec_schedule(rec, RQ, RSNAP, nsnap, RA)
        if m < 0:
            IV[I_STATUS] = ST_DECODE
            return ST_DECODE
        if m == 0:
            if IV[I_NRUN] == 0:
                IV[I_ERR] = _w_at(IV, WQ, 0)
                IV[I_STATUS] = ST_NO_FIT
                return ST_NO_FIT
            if rec_on:
                MR.rec_step(rec, now, now, PL[:0, 0], PL[:0, 1], PL[:0, 2], PL[:0, 3], _Z, _Z, FIN, _Z)
            continue  # only preemptions happened
        if n_running > IV[I_PEAK]:
            IV[I_PEAK] = n_running
        pure_decode = True
        for j in range(m):
            if PL[j, 3] == 1:
                pure_decode = False
                break
        ff_blocked = False
        can_ff = False
        k = 1
        if CF[CF_FF] == 1 and pure_decode and pre_cnt == 0 and m == IV[I_NRUN]:  # can_fast_forward
            if IV[I_WLEN] == 0:
                can_ff = True
            elif blocked and CF[CF_LPM] == 0:
                if IV[I_NRUN] >= ms:
                    can_ff = True
                else:
                    ff_blocked = HC[0] == 1
                    can_ff = ff_blocked
        if can_ff:
            k = _max_fast_forward(S, RQ, IV, RUN, num_slots)
            if ff_blocked and k > 1:
                k = _blocked_bound(S, RQ, IV, FV, RUN, HC, k, num_slots, ratio_min, ratio_decay)
            batch = m
            cs = 0
            for j in range(m):
                cs += PL[j, 2]
            g = IV[I_GNXT]
            while g < ng and garr[g] <= now:
                g += 1
            IV[I_GNXT] = g
            if k > DT.shape[0]:
                DT = np.empty(2 * k, dtype=np.float64)
            # DT[j]: cost.decode_steps_time(batch, Σ ctx, k)[j], up to the arrival cut
            # (searchsorted(now + cumsum(dts), next arrival, "left") when nothing waits)
            cut = IV[I_WLEN] == 0 and g < ng
            # _decode_step_time's operations, its step-invariant products formed once
            bf = float(batch)
            csf = float(cs)
            a_fl = 2.0 * CP[C_PARAMS] * bf
            a_at = 4.0 * CP[C_LAYERS] * CP[C_ATTN]
            a_w = CP[C_PARAMS] * CP[C_WDB]
            kvb = CP[C_KVB]
            d_c = CP[C_PEAK] * CP[C_MFU] * CP[C_TP]
            d_m = CP[C_HBM] * CP[C_MBU] * CP[C_TP]
            ovh = CP[C_OVERHEAD]
            t_arr = garr[g] if cut else 0.0
            acc = 0.0
            tab = CP.shape[0] > NCP
            for j in range(k):
                if tab:
                    d = TK.decode_step_time(CP[NCP:], batch, cs, j)
                else:
                    x = (csf + float(j) * bf) + bf
                    t_c = (a_fl + a_at * x) / d_c
                    t_m = (a_w + kvb * x) / d_m
                    d = (t_c if t_c >= t_m else t_m) + ovh
                DT[j] = d
                if cut:
                    acc = d if j == 0 else acc + d
                    if now + acc >= t_arr:
                        k = j + 1
                        break
            # fast_forward(k): the k − 1 decode steps after the scheduled one
            nrun = IV[I_NRUN]
            run = RUNC
            for u in range(nrun):
                run[u] = RUN[u]
            wl = IV[I_WLEN]
            st0 = IV[I_STEPS]
            # the pool after t extra tokens per request, t = 0 … k − 2, integrated per step
            # (Scheduler._decode_run): stretches of steps whose new pages leave a slot
            # free evict nothing, so they are extended in one call per request and their
            # samples follow by arithmetic; other steps go one token at a time
            used, cached, valid = _sample(S, R, run, nrun, num_slots)
            if k > 1:
                _integrate(FV, IV, nrun, DT[0], used, cached, valid, p)
                if tl:
                    _tl_row(IV, TLI, TLF, st0 + 1, FV[V_NOW], nrun, wl, batch, used, cached, num_slots)
            cntres = CNT
            if p > 1:  # requests by KV length mod p: extra token s starts pages of class (1 − s) mod p
                cntres[:] = 0
                for u in range(nrun):
                    cntres[RQ[run[u], Q_KV] % p] += 1
            t = 0
            while t < k - 1:
                free = S[K.S_FREE]
                m = 0
                if p == 1:
                    if free >= 1:
                        m = min(k - 1 - t, (free - 1) // nrun)
                else:
                    pages = 0
                    while t + m < k - 1:
                        pg = cntres[(-(t + m)) % p]  # pages started by extra token t + m + 1
                        if pages + pg > free - 1:
                            break
                        pages += pg
                        m += 1
                if m >= 1:
                    # _integrate of each step, the same operations on local accumulators
                    a_area, a_busy, a_now = FV[V_AREA], FV[V_BUSY], FV[V_NOW]
                    a_waste, a_used, a_cached = FV[V_WASTE_AREA], FV[V_USED_AREA], FV[V_CACHED_AREA]
                    wpeak = IV[I_WASTE_PEAK]
                    for sidx in range(1, m + 1):
                        tt = t + sidx
                        if tt > k - 2:
                            break
                        if p == 1:
                            used += nrun
                        else:
                            used += cntres[(1 - tt) % p]
                        valid += nrun
                        dt = DT[tt]
                        a_area += nrun * dt
                        a_busy += dt
                        waste = (used + cached) * p - valid
                        a_waste += waste * dt
                        if waste > wpeak:
                            wpeak = waste
                        a_used += used * dt
                        a_cached += cached * dt
                        a_now += dt
                        if tl:
                            _tl_row(IV, TLI, TLF, st0 + tt + 1, a_now, nrun, wl, batch, used, cached, num_slots)
                    FV[V_AREA], FV[V_BUSY], FV[V_NOW] = a_area, a_busy, a_now
                    FV[V_WASTE_AREA], FV[V_USED_AREA], FV[V_CACHED_AREA] = a_waste, a_used, a_cached
                    IV[I_WASTE_PEAK] = wpeak
                    step_n = m
                else:
                    step_n = 1
                for u in range(nrun):
                    r = run[u]
                    e = _extend(S, N, H1, H2, o, G, Q, R, r, np.int64(step_n))
                    if e != 1:
                        IV[I_ERR] = r
                        IV[I_STATUS] = ST_REFUSED
                        return ST_REFUSED
                t += step_n
                if m == 0 and t <= k - 2:
                    used, cached, valid = _sample(S, R, run, nrun, num_slots)
                    _integrate(FV, IV, nrun, DT[t], used, cached, valid, p)
                    if tl:
                        _tl_row(IV, TLI, TLF, st0 + t + 1, FV[V_NOW], nrun, wl, batch, used, cached, num_slots)
            for u in range(nrun):
                r = run[u]
                if k > 1:
                    RQ[r, Q_KV] += k - 1
                RQ[r, Q_CTX] += k
                RQ[r, Q_GEN] += k
            dt = DT[k - 1]
            t_end = FV[V_NOW] + dt
            IV[I_STEPS] = st0 + k
            any_fin = False
            for u in range(nrun):
                r = run[u]
                if RQ[r, Q_GEN] >= RQ[r, Q_N]:
                    K.finish(S, N, H1, H2, o, G, Q, borrow(R[r]))
                    RQ[r, Q_RUNNING] = 0
                    RF[r, F_FINISH] = t_end
                    RQ[r, Q_FINISH_STEP] = st0 + k
                    IV[I_DONE] += 1
                    any_fin = True
            if any_fin:
                _drop_finished(RQ, IV, RUN)
            used, cached, valid = _sample(S, R, RUN, IV[I_NRUN], num_slots)
            _integrate(FV, IV, nrun, dt, used, cached, valid, p)
            if tl:
                _tl_row(IV, TLI, TLF, st0 + k, FV[V_NOW], nrun, wl, batch, used, cached, num_slots)
            # _on_fast_forward
            if ff_blocked:
                for _ in range(k - 1):
                    FV[V_RATIO] = max(FV[V_RATIO] - ratio_decay, ratio_min)
            else:
                FV[V_RATIO] = max(FV[V_RATIO] - ratio_decay * (k - 1), ratio_min)
        else:
            dt = _step_time(CP, PL[:, 1], PL[:, 2], m)
            # _Integrals.prefill
            npre = 0
            jpre = -1
            for j in range(m):
                if PL[j, 3] == 1:
                    npre += 1
                    if jpre < 0:
                        jpre = j
            if npre == 1:
                FV[V_PF] += _prefill_flops(CP, PL[jpre, 1], PL[jpre, 2])
            elif npre > 1:
                fl = np.empty(npre, dtype=np.float64)
                q = 0
                for j in range(m):
                    if PL[j, 3] == 1:
                        fl[q] = _prefill_flops(CP, PL[j, 1], PL[j, 2])
                        q += 1
                FV[V_PF] += _np_pairwise_sum(fl, _Z, np.int64(npre))
            # complete(plan), with the clock of the step's end
            t_end = FV[V_NOW] + dt
            IV[I_STEPS] += 1
            any_fin = False
            for j in range(m):
                r = PL[j, 0]
                c = PL[j, 1]
                pre = PL[j, 3] == 1
                if pre:
                    RQ[r, Q_CTX] += c
                    if RQ[r, Q_CTX] < RQ[r, Q_TARGET]:
                        K.commit(S, N, H1, H2, o, G, Q, borrow(R[r]))  # cache_unfinished_req
                        continue
                    if RQ[r, Q_N] > 0:
                        if RQ[r, Q_GEN] == 0 and np.isnan(RF[r, F_FIRST]):
                            RF[r, F_FIRST] = t_end
                        RQ[r, Q_GEN] += 1
                else:
                    RQ[r, Q_CTX] += 1
                    RQ[r, Q_GEN] += 1
                if RQ[r, Q_GEN] >= RQ[r, Q_N]:
                    K.finish(S, N, H1, H2, o, G, Q, borrow(R[r]))
                    RQ[r, Q_RUNNING] = 0
                    RF[r, F_FINISH] = t_end
                    RQ[r, Q_FINISH_STEP] = IV[I_STEPS]
                    IV[I_DONE] += 1
                    any_fin = True
                elif pre:
                    K.commit(S, N, H1, H2, o, G, Q, borrow(R[r]))
            if any_fin:
                _drop_finished(RQ, IV, RUN)
            used, cached, valid = _sample(S, R, RUN, IV[I_NRUN], num_slots)
            _integrate(FV, IV, n_running, dt, used, cached, valid, p)
            if tl:
                tok = 0
                for j in range(m):
                    tok += PL[j, 1]
                _tl_row(IV, TLI, TLF, IV[I_STEPS], FV[V_NOW], n_running, IV[I_WLEN], tok, used, cached, num_slots)
        nfin = IV[I_DONE] - done0
        if FV[V_NOW] > now:
            IV[I_FINNOW] = nfin
        else:
            IV[I_FINNOW] += nfin
        if iv_on:
            IVT[0, IV[I_IVN]] = now
            IVT[1, IV[I_IVN]] = FV[V_NOW]
            IVN[IV[I_IVN]] = n_running
            IV[I_IVN] += 1
        if rec_on:  # finished: the plan's requests no longer running, in plan order
            nfin = 0
            for j in range(m_plan):
                if RQ[PL[j, 0], Q_RUNNING] == 0:
                    FIN[nfin] = PL[j, 0]
                    nfin += 1
            MR.rec_step(rec, now, FV[V_NOW], PL[:m_plan, 0], PL[:m_plan, 1], PL[:m_plan, 2], PL[:m_plan, 3],
                        np.int64(m_plan), np.int64(k if can_ff else 1), FIN, np.int64(nfin))


@nb.njit(cache=True)
def _rec_schedule(rec, RQ, SNAP, nsnap, RA):
    """Tell the miss recorder this step's first admissions (``RA``, in order) and its
    preempted rows: the requests running before it (``SNAP[:nsnap]``) or admitted in it
    that ``_schedule`` left not running."""
    for u in range(RA[0]):
        i = RA[1 + u]
        if i >= 0:
            MR.rec_admitted(rec, i)
    for u in range(nsnap):
        v = SNAP[u]
        if RQ[v, Q_RUNNING] == 0:
            MR.rec_preempted(rec, v)
    for u in range(RA[0]):
        i = RA[1 + u]
        if i < 0:
            i = -1 - i
        if RQ[i, Q_RUNNING] == 0:
            MR.rec_preempted(rec, i)
