"""Compiled step loop of the concurrent replay: vLLM v1's scheduler over a ``BlockHashCache``.

:func:`run_loop` is the loop of :func:`radixkv.replay.concurrent.replay_concurrent` with
:class:`radixkv.replay.sched_vllm.VllmScheduler`'s step rules and
:class:`radixkv.policies.block_hash.BlockHashCache`'s pool calls, inside one Numba call:
the same rules in the same order, so the same bytes out (the Python loop stays the path
for every other policy, scheduler and option; :mod:`radixkv.replay.conc_vllm_fast`
decides). Each rule is the one the Python code documents, with its vLLM source:

- the step (``vllm/v1/core/sched/scheduler.py :: Scheduler.schedule``): running requests
  first, in running order — a decode takes 1 token, an unfinished prefill a chunk of
  ``min(remaining, long_prefill_token_threshold, budget)``; a request that cannot get KV
  preempts ``running[-1]`` (``_preempt_request``: blocks freed, progress reset, put at
  the front of the waiting queue) until it fits or has preempted itself; then, in a step
  without preemption, FCFS admission while budget and ``max_num_seqs`` allow, the first
  refusal stopping it (``VllmScheduler._admit_pass``: chunked prefill off, watermark,
  lookup of prompt + generated tokens on re-admission);
- the pool (``vllm/v1/core/kv_cache_manager.py :: KVCacheManager.allocate_slots`` /
  ``get_computed_blocks`` / ``free``): the kernels of
  :mod:`radixkv.policies._hash_kernels` (``admit``, ``extend``, ``free``, ``peek``),
  called with the arguments :class:`BlockHashCache` passes them;
- fast-forward (``Scheduler.max_fast_forward`` / ``VllmScheduler.max_fast_forward`` /
  ``Scheduler.fast_forward``): runs of identical decode steps bounded by the first
  finish, the pool's room and the waiting head's hit growth, applied with the lazy
  ``decode_slot_local`` schedule of
  :func:`radixkv.policies._hash_batch_kernels.decode_run_slot_local`;
- the clock and the time integrals (``concurrent._Integrals``) with the float
  operations of :class:`radixkv.cost.CostModel` (``_step_time_ints``,
  ``decode_steps_time``) or :class:`radixkv.cost.UnitStepCost`, in the same order.

Prefill FLOPs are not summed here: the loop logs each step's prefill items (``pf_*``)
and the caller sums them with the cost model's own functions, as ``_Integrals.prefill``.

State lives in arrays the caller owns, so the loop can return at the top of a step
(status :data:`S_PROGRESS`, :data:`S_GROW_SLOTS`, :data:`S_GROW_LOG`) and be called again
to resume: to report progress, or after the caller enlarged the per-request slot arrays
or the prefill log.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# Kernels here inline _hash_kernels. Numba alone would check only this file's stamp; radixkv keys
# its Numba cache folder by a hash of every kernel source (radixkv.numba_cache.source_key), so a
# change to _hash_kernels is a cold cache here too: nothing to touch in this file.
from radixkv.policies import _hash_kernels as K
from radixkv.policies._hash_batch_kernels import lazy_order
from radixkv.replay import _miss_rec_kernels as MR
from radixkv.trace._seq_kernel import kv_seq_into

# integer state (ist)
I_NXT, I_DONE, I_STEPS, I_PEAK, I_NRUN, I_WHEAD, I_WLEN, I_EV, I_PARTIAL, I_WPEAK, I_NFREE, I_PFN, I_PFG, \
    I_ARG, I_HKI, I_HKL, I_HKM, I_TLN = range(18)
NI = 18  # I_HKI, I_HKL, I_HKM: the request, length and segments the lookup scratch holds (I_HKI −1: none)
# float state (fst)
F_NOW, F_T0, F_AREA, F_BUSY, F_WASTE, F_USED, F_CACHED = range(7)
NFS = 7

# return status
S_DONE = 0  # every request finished
S_PROGRESS = 1  # ist[I_DONE] reached stop_done: call again to go on
S_GROW_SLOTS = 2  # fewer free request slots than this step may admit: enlarge, call again
S_GROW_LOG = 3  # the prefill log may overflow in this step: enlarge, call again
S_IDLE_REFUSED = 4  # request ist[I_ARG] cannot be admitted into an idle pool
S_DECODE_REFUSED = 5  # the pool refused decode tokens of request ist[I_ARG] its room should hold
S_PIECES = 6  # a block has more content pieces than pcid holds (caller must widen it first)
S_GROW_TL = 7  # the timeline may overflow in this step: enlarge, call again
S_GROW_REC = 8  # the miss recorder's logs may overflow in this step: enlarge, call again

# cost kinds
COST_ROOFLINE = 0  # CostModel: cp = params, num_layers, attn_dim, wdb, kvb, peak, mfu, tp, hbm, mbu, overhead
COST_UNIT = 1  # UnitStepCost: cp[0] = step_s


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


@njit(cache=True)
def _step_time(kind, cp, sn, sa, sb):
    """``CostModel._step_time_ints`` from its integer sums (or ``UnitStepCost.step_time``)."""
    if kind == COST_UNIT:
        return cp[0]
    flops = 2.0 * cp[0] * float(sn) + 4.0 * cp[1] * cp[2] * float(sa)
    bytes_ = cp[0] * cp[3] + cp[4] * float(sb)
    t_c = flops / (cp[5] * cp[6] * cp[7])
    t_m = bytes_ / (cp[8] * cp[9] * cp[7])
    return (t_c if t_c >= t_m else t_m) + cp[10]


@njit(cache=True)
def _decode_steps_time(kind, cp, batch, context_sum, k):
    """``CostModel.decode_steps_time`` (or ``UnitStepCost``'s), float64 (k,)."""
    out = np.empty(k, dtype=np.float64)
    if kind == COST_UNIT:
        out[:] = cp[0]
        return out
    fb = float(batch)
    a = 2.0 * cp[0] * fb
    c4 = 4.0 * cp[1] * cp[2]
    w = cp[0] * cp[3]
    dc = cp[5] * cp[6] * cp[7]
    dm = cp[8] * cp[9] * cp[7]
    for j in range(k):
        ctx = float(context_sum) + float(j) * fb
        flops = a + c4 * (ctx + fb)
        bytes_ = w + cp[4] * (ctx + fb)
        t_c = flops / dc
        t_m = bytes_ / dm
        out[j] = (t_c if t_c >= t_m else t_m) + cp[10]
    return out


@njit(cache=True)
def _extend(pol, sa, sl, n, B, ist):
    """``BlockHashCache.extend`` of the request in slot *sl* by *n* tokens; False: refused."""
    blk, b32, kt, k32, pcid, pcs, st, stk = pol
    keys2d, tbl2d, sid2d, send2d, s_nseg, s_nblk, s_ntok = sa
    if n <= 0:
        return True
    n0 = s_ntok[sl]
    m = s_nseg[sl]
    ok, nb, ev = K.extend(blk, b32, kt, k32, pcid, pcs, st, stk, keys2d[sl], sid2d[sl, :m], send2d[sl, :m], B,
                          tbl2d[sl], s_nblk[sl], n0, n)
    if not ok:
        return False
    s_nblk[sl] = nb
    ist[I_PARTIAL] += (n0 + n) % B - n0 % B
    s_ntok[sl] = n0 + n
    ist[I_EV] += ev
    return True


@njit(cache=True)
def _release(pol, sa, sl, B, ist, free_slots):
    """``BlockHashCache.finish`` / ``preempt`` of the request in slot *sl*; the slot is freed."""
    b32 = pol[1]
    st = pol[6]
    tbl2d = sa[1]
    s_nblk = sa[5]
    s_ntok = sa[6]
    ist[I_PARTIAL] -= s_ntok[sl] % B
    K.free(b32, st, tbl2d[sl], s_nblk[sl])
    free_slots[ist[I_NFREE]] = sl
    ist[I_NFREE] += 1


@njit(cache=True)
def _serve(r, nrun, cap, budget, pol, sa, B, ist, run, ctx, target, kv, slot_of, preemptions, wq, wcap,
           free_slots, p_req, p_new, p_ctx, p_pre, np_, rec):
    """``VllmScheduler._serve_running`` for request *r*: its chunk (the rest of its prefill,
    at most *cap* when > 0 and the *budget*; else one decode token), preempting the last
    running request (``running[-1]``, back to the waiting queue's head) until the pool
    holds the chunk; the planned row goes to ``p_*[np_]``. Returns (nrun, preemptions
    made, chunk tokens, scheduled: False when *r* itself was preempted)."""
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
        if _extend(pol, sa, slot_of[r], need_tok, B, ist):
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


@njit(cache=True)
def _head_lookup(pol, tr, i, L, B, key_mask, hk, htbl, hsid, hsend, ist):
    """Side-effect-free lookup of request *i*'s first *L* tokens (``BlockHashCache._lookup``):
    returns (capped hit blocks, segments written to ``hsid``/``hsend``). The segments and
    keys stay in the scratch arrays, reused while the same request and length are asked."""
    blk, b32, kt, k32, pcid, pcs, st, stk = pol
    ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens = tr
    n_look = L // B
    if ist[I_HKI] == i and ist[I_HKL] == L:
        m = ist[I_HKM]
    else:
        m = kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                        hsid, hsend)
        K._block_keys_into(hsid[:m], hsend[:m], B, n_look, key_mask, hk)
        ist[I_HKI] = i
        ist[I_HKL] = L
        ist[I_HKM] = m
    code, h = K.peek(blk, b32, kt, k32, pcid, pcs, hk, n_look, hsid[:m], hsend[:m], B, L, False, htbl)
    return h, m


@njit(cache=True)
def _shared_prefix(ia, ea, na, ib, eb, nb):
    """``sched_vllm.shared_prefix_tokens`` of two segment lists."""
    n = min(na, nb)
    if n == 0:
        return 0
    for k in range(n):
        if ia[k] != ib[k] or ea[k] != eb[k]:
            if ia[k] == ib[k]:
                return min(ea[k], eb[k])
            return ea[k - 1] if k else 0
    return ea[n - 1]


@njit(cache=True)
def _decode_run(pol, sa, slots, kv0, B, k, out, ist):
    """Steps 2 … k of a run of k decode steps (``decode_run_slot_local`` over slots).

    Returns −1 when done, else the item refused by the pool."""
    st = pol[6]
    s_ntok = sa[6]
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
        for q in range(lo, hi):
            i = q if final else order[q]
            m = t - applied[i]
            if m <= 0:
                continue
            if not _extend(pol, sa, slots[i], m, B, ist):
                return i
            A += m
            applied[i] = t
        if final:
            break
        u = st[K.ST_NUSED]
        c = st[K.ST_NCACHED]
        v = st[K.ST_NHASHED] * B + ist[I_PARTIAL]
        out[t, 0] = u
        out[t, 1] = c
        out[t, 2] = v + n * t - A
        last = t + 1
    return -1


@njit(cache=True, inline="always")
def _tl_row(tl_i, tl_t, ist, step, t, running, waiting, tokens, used, cached, num_slots):
    """One timeline row (``concurrent._tl_row``)."""
    r = ist[I_TLN]
    tl_i[0, r] = step
    tl_t[r] = t
    tl_i[1, r] = running
    tl_i[2, r] = waiting
    tl_i[3, r] = tokens
    tl_i[4, r] = used
    tl_i[5, r] = cached
    tl_i[6, r] = num_slots - used - cached
    ist[I_TLN] = r + 1


@njit(cache=True)
def run_loop(tr, pol, key_mask, B, num_slots, cfg, kind, cp, rq, rf, wq, run, plan, sa, free_slots, scratch,
             pf_n, pf_c, pf_g, tl_i, tl_t, ist, fst, stop_done, rec):
    """Run the replay loop until every request finished, or a resumable stop (module docstring).

    Parameters
    ----------
    tr : tuple
        The trace's arrays: ``ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
        output_len, unit_tokens`` (as :func:`radixkv.trace._seq_kernel.kv_seq_into` takes them).
    pol : tuple
        The pool's arrays ``blk, b32, kt, k32, pcid, pcs, st, stk`` (``BlockHashCache``).
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
        Per slot: ``keys (S, W), tbl (S, W), sid (S, G), send (S, G), nseg, nblk, ntok``.
    free_slots : int64 (S,)
        Stack of free slots (``ist[I_NFREE]``).
    scratch : tuple
        ``keys, tbl, sid, send`` for lookups of a waiting request.
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
    blk, b32, kt, k32, pcid, pcs, st, stk = pol
    ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens = tr
    keys2d, tbl2d, sid2d, send2d, s_nseg, s_nblk, s_ntok = sa
    hk, htbl, hsid, hsend = scratch
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
        # ---------------------------------------------------------- schedule (VllmScheduler.schedule)
        steps = ist[I_STEPS]
        np_ = 0
        preempted = 0
        blocked = False
        budget = max_batched
        cap = threshold if nrun + ist[I_WLEN] > 1 else 0
        k = 0
        while k < nrun and budget > 0:
            nrun, made, c, ok = _serve(run[k], nrun, cap, budget, pol, sa, B, ist, run, ctx, target, kv, slot_of,
                                       preemptions, wq, wcap, free_slots, p_req, p_new, p_ctx, p_pre, np_, rec)
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
                    h, _m = _head_lookup(pol, tr, i, n_tok, B, key_mask, hk, htbl, hsid, hsend, ist)
                    rem = n_tok - h * B
                    c = rem if cap <= 0 else min(rem, cap)
                    if min(c, n_tok) > budget:
                        blocked = True
                        break
                if wm > 0 and nrun > 0:
                    h, _m = _head_lookup(pol, tr, i, n_tok, B, key_mask, hk, htbl, hsid, hsend, ist)
                    touch = 0
                    for q in range(h):
                        if b32[htbl[q], K.R_REF] == 0:
                            touch += 1
                    if (n_tok + B - 1) // B - h + touch + wm > num_slots - st[K.ST_NUSED]:
                        blocked = True
                        break
                c = n_tok if cap <= 0 else min(n_tok, cap)
                asked = min(n_tok, min(c, budget))
                # BlockHashCache.admit(i, known seq, asked)
                sl = free_slots[ist[I_NFREE] - 1]
                m = kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens,
                                i, sid2d[sl], send2d[sl])
                mp = K._block_keys_into(sid2d[sl, :m], send2d[sl, :m], B, kvlen[i] // B, key_mask, keys2d[sl])
                if mp - 1 > pcid.shape[1]:
                    return S_PIECES
                code, hb, hd, ev, nblk = K.admit(blk, b32, kt, k32, pcid, pcs, st, stk, keys2d[sl], sid2d[sl, :m],
                                                 send2d[sl, :m], B, n_tok, n_tok, asked, False, tbl2d[sl])
                if code != K.OK:
                    blocked = True
                    break
                ist[I_NFREE] -= 1
                slot_of[i] = sl
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
                nrun, made, c, ok = _serve(i, nrun, cap, budget, pol, sa, B, ist, run, ctx, target, kv, slot_of,
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
                room = num_slots - st[K.ST_NUSED] - nrun
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
                hb, hm = _head_lookup(pol, tr, head, L, B, key_mask, hk, htbl, hsid, hsend, ist)
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
                pools[0, 0] = st[K.ST_NUSED]
                pools[0, 1] = st[K.ST_NCACHED]
                pools[0, 2] = st[K.ST_NHASHED] * B + ist[I_PARTIAL]
                bad = _decode_run(pol, sa, slots, kv0, B, kk, pools, ist)
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
            pools[kk - 1, 0] = st[K.ST_NUSED]
            pools[kk - 1, 1] = st[K.ST_NCACHED]
            pools[kk - 1, 2] = st[K.ST_NHASHED] * B + ist[I_PARTIAL]
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
            used = st[K.ST_NUSED]
            cached = st[K.ST_NCACHED]
            valid = st[K.ST_NHASHED] * B + ist[I_PARTIAL]
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
