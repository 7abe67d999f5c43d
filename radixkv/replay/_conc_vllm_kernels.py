"""The compiled concurrent vLLM loop: ONE scheduler loop over any block pool.

:func:`run_loop` is the loop of :func:`radixkv.replay.concurrent.replay_concurrent` with
:class:`radixkv.replay.sched_vllm.VllmScheduler`'s step rules inside one Numba call: the
same rules in the same order as the Python loop over
:class:`radixkv.policies.block_hash.BlockHashCache`, so the same bytes out (the Python
loop stays the path for every other policy, scheduler and option;
:mod:`radixkv.replay.conc_vllm_fast` decides). Each rule is the one the Python code
documents, with its vLLM source:

- the step (``vllm/v1/core/sched/scheduler.py :: Scheduler.schedule``): running requests
  first, in running order — a decode takes 1 token, an unfinished prefill a chunk of
  ``min(remaining, long_prefill_token_threshold, budget)``; a request that cannot get KV
  preempts ``running[-1]`` (``_preempt_request``: blocks freed, progress reset, put at
  the front of the waiting queue) until it fits or has preempted itself; then, in a step
  without preemption, FCFS admission while budget and ``max_num_seqs`` allow, the first
  refusal stopping it (``VllmScheduler._admit_pass``: chunked prefill off, watermark,
  lookup of prompt + generated tokens on re-admission);
- fast-forward (``Scheduler.max_fast_forward`` / ``VllmScheduler.max_fast_forward`` /
  ``Scheduler.fast_forward``): runs of identical decode steps bounded by the first
  finish, the pool's room and the waiting head's hit growth, applied with the lazy
  ``decode_slot_local`` schedule (:func:`_decode_run`, the step loop of
  :func:`radixkv.policies._hash_batch_kernels.decode_run_slot_local`);
- the clock and the time integrals (``concurrent._Integrals``) with the float
  operations of :class:`radixkv.cost.CostModel` (``_step_time_ints``,
  ``decode_steps_time``) or :class:`radixkv.cost.UnitStepCost`, in the same order; the
  timeline rows and the miss recorder's calls (:mod:`radixkv.replay._miss_rec_kernels`).

Prefill FLOPs are not summed here: the loop logs each step's prefill items (``pf_*``)
and the caller sums them with the cost model's own functions, as ``_Integrals.prefill``.

State lives in arrays the caller owns, so the loop can return at the top of a step
(status :data:`S_PROGRESS`, :data:`S_GROW_SLOTS`, :data:`S_GROW_LOG`, ...) and be called
again to resume: to report progress, or after the caller enlarged the per-request slot
arrays, the prefill log, the timeline, the miss recorder's logs or the pool's own arrays.

Pools and their operations
--------------------------
The loop never reads a pool array. Everything a pool does is one of the *pool
operations* below: stub functions of this module that each pool implements with
``numba.extending.overload``, selected by the pool value's Numba type when the loop is
compiled (one machine-code loop per pool type; a call costs what the implementation
costs, nothing for the dispatch). The pools so far:

- :mod:`radixkv.replay._conc_vllm_block_kernels`: ``BlockHashCache``'s per-block pool
  (:mod:`radixkv.policies._hash_kernels`), the reference, with its free order (vLLM's
  free queue, or ``PriorityBlockHashCache``'s priority) a run-time value in the pool value:
  one compiled loop for every order;
- :mod:`radixkv.replay._conc_vllm_piece_kernels`: a pool without block ids for hash-id traces.

A new pool plugs in without touching this module: (1) a ``collections.namedtuple``
class of its own for the *pool value* (its arrays, its per-request facts and its
``block_size``; the loop passes it through untouched); (2) each operation written as a
plain function with the stub's parameters and registered with :func:`pool_op` (an
``numba.extending.overload`` of the stub taken only for values of that class)::

    @CK.pool_op(CK.pool_counts, MyPool)
    def _counts(pool):
        return pool.q[0], pool.q[1], pool.q[2]

(3) importing that module before the loop is first compiled for the pool (the dispatch
in :mod:`radixkv.replay.conc_vllm_fast` imports it), and a tiny replay on it in
``conc_vllm_fast.warm`` (``radixkv warmup``). A pool type without an operation fails to
compile with Numba's ``No implementation of function pool_...`` naming the operation.

Cost: an operation is inlined into the loop's Numba IR (``pool_op``'s default), so its
dispatch costs nothing, but every array it binds to a name that stays alive across a
branch costs two atomic reference-count operations per call (Numba's NRT; temporaries
used within one basic block are pruned). The operations called every iteration or every
decode growth (``pool_room``, ``pool_counts``, ``pool_grow_slot``) should read arrays
through the pool value (``pool.q[Q_X]``) rather than bind them, and the pool value should
be a flat namedtuple of arrays (reading a field that is itself a tuple counts all its
arrays). Measured: the unit pool's ``pool_room`` with three arrays bound cost ~85 ns a
call, 0 written so; the Mooncake replay's CPU time moved by ~10 %.

Arguments common to the operations: *pool* the pool value; *ps* the pool's per-slot
tuple (arrays with one row per request slot, e.g. block tables; the caller grows every
array of it to the same number of rows, keeping rows); *ls* the loop's per-slot tuple
``(sid, send, nseg, ntok)``: int64 (S, M) content segments of the slot's request (ids
and ends, :func:`radixkv.trace._seq_kernel.kv_seq_into`), int64 (S,) their count, and
int64 (S,) the tokens with KV the slot holds (the loop keeps ``ntok`` and the
partial-block token count; an operation must not write *ls*); *sl* a slot; *tr* the
trace tuple (``run_loop``). Blocks are ``block_size`` B tokens; a slot with *n0*
tokens holds ``ceil(n0 / B)`` blocks, its first ``n0 // B`` full (hashed).

``pool_room(pool, budget, cap_run)`` → int
    0 when the pool has room for one more iteration (at most *budget* =
    ``max_num_batched_tokens`` scheduled tokens and *cap_run* running requests), else a
    status ≥ :data:`S_POOL` the loop returns unchanged (the caller grows the pool's
    arrays and calls again). Called at the top of every iteration; nothing changed yet.
``pool_admit(pool, ps, ls, tr, i, sl, m, n_tok, asked, first)`` → (code, hit blocks,
held tokens, evicted blocks)
    vLLM ``KVCacheManager.get_computed_blocks`` + ``allocate_slots`` of request *i* into
    free slot *sl* (``BlockHashCache.admit``, :func:`radixkv.policies._hash_kernels.admit`
    with ``prompt_len = lookup_len = n_tok``): look up its first *n_tok* known tokens
    (segments ``ls[0][sl, :m]``, ``ls[1][sl, :m]``, written by the loop), hit capped at
    ``(n_tok − 1) // B`` blocks; refuse unless ``ceil(n_tok / B) − hit + hit blocks with
    ref_cnt 0`` blocks fit in the free queue; touch the hit, allocate
    ``ceil(max(asked, hit·B) / B)`` blocks (evicting from the free queue's head) and cache
    the full ones. *held* (``Admission.held_tokens``) is needed only when *first*.
    ``code``: :data:`ADMIT_OK`; :data:`ADMIT_REFUSED` (nothing changed); or a status ≥
    :data:`S_POOL` the loop returns (nothing changed; the caller fixes the pool, calls
    again).
``pool_extend(pool, ps, ls, sl, n0, n)`` → (ok, evicted blocks)
    vLLM ``allocate_slots`` then ``cache_blocks`` (``BlockHashCache.extend``,
    :func:`~radixkv.policies._hash_kernels.extend`): slot *sl* (holding *n0* tokens)
    grows by *n* > 0 tokens; False: refused, nothing changed.
``pool_grow_slot(pool, ps, ls, sl, n0, n)`` → (ok, evicted blocks)
    The same as ``pool_extend``, called once per slot and growth inside the decode-run
    step loop (:func:`_decode_run`: decode tokens only, many calls): a pool may take a
    shorter path there (inline it; see the unit pool).
``pool_release(pool, ps, sl, n0)``
    vLLM ``KVCacheManager.free`` (``BlockHashCache.finish`` / ``preempt``,
    :func:`~radixkv.policies._hash_kernels.free`): slot *sl* (holding *n0* tokens)
    releases its blocks, tail first; a block whose ref_cnt reaches 0 goes to the free
    queue (hashed: tail, unhashed: head).
``pool_lookup(pool, ps, hs, tr, i, L, sid, send, m, fresh, count_free)`` → (hit blocks,
free hit blocks)
    Side-effect-free ``BlockHashCache._lookup`` of request *i*'s first *L* tokens
    (segments ``sid[:m]``, ``send[:m]``): hit blocks capped at ``(L − 1) // B``, and
    when *count_free* how many of them have ref_cnt 0 (the watermark check), else 0.
    *ps* is read only (a pool whose reference counts live with the running requests'
    hit runs reads them there). *hs* is the pool's lookup scratch tuple; *fresh* says what it holds: 0 what it held
    after the last call (same request and length), 1 the same request, another length,
    2 another request.
``pool_views(pool, ps, hs)`` → (pool, ps, hs)
    What the loop passes to the other operations during one :func:`run_loop` call, made
    once at its start: the values themselves, or views of their arrays that carry no
    reference counts (:func:`radixkv.policies._borrowed.borrow` of the fields; valid
    for the call, whose caller keeps the arrays alive), so that operations called per
    decode growth bind arrays for free.
``pool_counts(pool)`` → (used, cached, hashed blocks)
    ``BlockPool`` counters: blocks with ref_cnt > 0, blocks with ref_cnt 0 and a block
    hash, blocks with a block hash (the pool statistics and integrals).
"""
from __future__ import annotations

import inspect

import numpy as np
from numba import njit, types
from numba.core import config as numba_config
from numba.extending import overload

import radixkv.clock._kernels as TK
from radixkv.policies._borrowed import borrow, borrow_py
from radixkv.policies._hash_batch_kernels import lazy_order_into
import radixkv.replay._miss_rec_kernels as MR
from radixkv.replay._conc_sglang_kernels import _np_pairwise_sum
from radixkv.trace._seq_kernel import kv_seq_into

if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run
    borrow = borrow_py  # noqa: F811

# integer state (ist)
I_NXT, I_DONE, I_STEPS, I_PEAK, I_NRUN, I_WHEAD, I_WLEN, I_EV, I_PARTIAL, I_WPEAK, I_NFREE, I_PFN, I_PFG, \
    I_ARG, I_HKI, I_HKL, I_HKM, I_TLN, I_NSRC, I_GNXT, I_FINNOW, I_IVN = range(22)
NI = 22  # I_HKI, I_HKL, I_HKM: the request, length and segments the lookup scratch holds (I_HKI −1: none)
# I_NSRC: rows of ``src`` the loop may enqueue; I_GNXT: arrivals of ``garr`` at or before the
# clock; I_FINNOW: requests that finished at exactly the clock; I_IVN: interval rows used
# float state (fst)
F_NOW, F_T0, F_AREA, F_BUSY, F_WASTE, F_USED, F_CACHED, F_LIMIT = range(8)
NFS = 8  # F_LIMIT: return S_LIMIT before a step that would start at or after it

# return status
S_DONE = 0  # every request finished
S_PROGRESS = 1  # ist[I_DONE] reached stop_done: call again to go on
S_GROW_SLOTS = 2  # fewer free request slots than this step may admit: enlarge, call again
S_GROW_LOG = 3  # the prefill log may overflow in this step: enlarge, call again
S_IDLE_REFUSED = 4  # request ist[I_ARG] cannot be admitted into an idle pool
S_DECODE_REFUSED = 5  # the pool refused decode tokens of request ist[I_ARG] its room should hold
S_GROW_TL = 7  # the timeline may overflow in this step: enlarge, call again
S_GROW_REC = 8  # the miss recorder's logs may overflow in this step: enlarge, call again
S_LIMIT = 9  # the next step would start at or after fst[F_LIMIT]: route the next arrival, call again
S_GROW_IV = 10  # the interval log is full: enlarge, call again
#: statuses from here on are a pool's own (pool_room, pool_admit): the caller asks the pool
S_POOL = 16

# pool_admit codes
ADMIT_OK = 0
ADMIT_REFUSED = 1

# cost kinds
COST_ROOFLINE = 0  # CostModel: cp = params, num_layers, attn_dim, wdb, kvb, peak, mfu, tp, hbm, mbu, overhead
COST_UNIT = 1  # UnitStepCost: cp[0] = step_s
COST_TABLE = 2  # radixkv.clock.calibrated.CalibratedCostModel: cp = its packed() array (radixkv.clock._kernels)


def is_pool(pool, cls) -> bool:
    """In an overload's typing function: True when *pool* (a Numba type) is the type of a
    value of the namedtuple class *cls*."""
    return isinstance(pool, types.BaseNamedTuple) and pool.instance_class is cls


def pool_op(stub, cls, inline: str = "always"):
    """Decorator: the plain function it decorates implements the pool operation *stub*
    (one of ``pool_*`` here, with the same parameters) for pool values of the namedtuple
    class *cls* (``numba.extending.overload``, selected by :func:`is_pool`). *inline*
    ``"always"`` inlines it into the loop's Numba IR (for small, hot operations),
    ``"never"`` compiles it as a function of its own. Returns the function unchanged."""
    def register(impl):
        def typer(*args):
            if is_pool(args[0], cls):
                return impl
        typer.__signature__ = inspect.signature(impl)  # the typing signature Numba checks against impl's
        overload(stub, inline=inline)(typer)
        return impl
    return register


# ---------------------------------------------------------------------- pool operations (stubs)
# Compiled only: each pool module overloads them (module docstring, "Pools and their operations").
def pool_room(pool, budget, cap_run):
    """0, or a pool status ≥ S_POOL: grow the pool's arrays (module docstring)."""
    raise NotImplementedError("a pool operation: compiled only, overloaded per pool type")


def pool_admit(pool, ps, ls, tr, i, sl, m, n_tok, asked, first):
    """Admit request *i* into slot *sl*: (code, hit blocks, held tokens, evicted blocks)."""
    raise NotImplementedError("a pool operation: compiled only, overloaded per pool type")


def pool_extend(pool, ps, ls, sl, n0, n):
    """Grow slot *sl* from *n0* by *n* tokens: (ok, evicted blocks)."""
    raise NotImplementedError("a pool operation: compiled only, overloaded per pool type")


def pool_grow_slot(pool, ps, ls, sl, n0, n):
    """``pool_extend`` inside the decode-run step loop: (ok, evicted blocks)."""
    raise NotImplementedError("a pool operation: compiled only, overloaded per pool type")


def pool_release(pool, ps, sl, n0):
    """Free slot *sl*'s blocks (finish or preemption)."""
    raise NotImplementedError("a pool operation: compiled only, overloaded per pool type")


def pool_lookup(pool, ps, hs, tr, i, L, sid, send, m, fresh, count_free):
    """Side-effect-free lookup: (capped hit blocks, those with ref_cnt 0 when *count_free*)."""
    raise NotImplementedError("a pool operation: compiled only, overloaded per pool type")


def pool_counts(pool):
    """(used, cached, hashed) blocks."""
    raise NotImplementedError("a pool operation: compiled only, overloaded per pool type")


def pool_views(pool, ps, hs):
    """(pool, ps, hs) as the loop passes them to the operations for one call of it."""
    raise NotImplementedError("a pool operation: compiled only, overloaded per pool type")


#: groups longer than this are summed by NumPy itself (its reduction buffers 8192 items)
PAIRWISE_MAX = 8192


@njit(cache=True)
def group_sums(x, starts, ends):
    """``np.sum(x[starts[g]:ends[g]])`` for every group g, bit for bit (float64 (G,)), in
    one call: ``np.sum`` of a contiguous float64 array of at most :data:`PAIRWISE_MAX`
    items is NumPy's pairwise summation of it, which
    :func:`radixkv.replay._conc_sglang_kernels._np_pairwise_sum` reproduces
    (``tests/test_conc_vllm_fast.py`` checks the two agree). Longer groups are left NaN
    for the caller to sum with NumPy."""
    out = np.empty(starts.shape[0], dtype=np.float64)
    for g in range(starts.shape[0]):
        n = ends[g] - starts[g]
        out[g] = _np_pairwise_sum(x, starts[g], n) if n <= PAIRWISE_MAX else np.nan
    return out


@njit(cache=True)
def _step_time(kind, cp, sn, sa, sb):
    """``CostModel._step_time_ints`` from its integer sums (or ``UnitStepCost.step_time``,
    or ``CalibratedCostModel.step_time``: :func:`radixkv.clock._kernels.step_time`)."""
    if kind == COST_UNIT:
        return cp[0]
    if kind == COST_TABLE:
        return TK.step_time(cp, float(sn), float(sa), float(sb))
    flops = 2.0 * cp[0] * float(sn) + 4.0 * cp[1] * cp[2] * float(sa)
    bytes_ = cp[0] * cp[3] + cp[4] * float(sb)
    t_c = flops / (cp[5] * cp[6] * cp[7])
    t_m = bytes_ / (cp[8] * cp[9] * cp[7])
    return (t_c if t_c >= t_m else t_m) + cp[10]


@njit(cache=True)
def _decode_steps_time(kind, cp, batch, context_sum, k):
    """``CostModel.decode_steps_time`` (or ``UnitStepCost``'s), float64 (k,)."""
    out = np.empty(k, dtype=np.float64)
    _decode_steps_time_into(kind, cp, batch, context_sum, k, out)
    return out


@njit(cache=True)
def _decode_steps_time_into(kind, cp, batch, context_sum, k, out):
    """:func:`_decode_steps_time` into ``out[:k]`` (caller-owned, no allocation)."""
    if kind == COST_UNIT:
        for j in range(k):
            out[j] = cp[0]
        return
    if kind == COST_TABLE:
        for j in range(k):
            out[j] = TK.decode_step_time(cp, batch, context_sum, j)
        return
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
    return


# ---------------------------------------------------------------------- the loop's pool calls
@njit(cache=True, inline="always")
def _extend(pool, ps, ls, sl, n, B, ist):
    """``BlockHashCache.extend`` of the request in slot *sl* by *n* tokens
    (:func:`pool_extend`); False: refused, nothing changed."""
    if n <= 0:
        return True
    s_ntok = ls[3]
    n0 = s_ntok[sl]
    ok, ev = pool_extend(pool, ps, ls, sl, n0, n)
    if not ok:
        return False
    ist[I_EV] += ev
    ist[I_PARTIAL] += (n0 + n) % B - n0 % B
    s_ntok[sl] = n0 + n
    return True


@njit(cache=True, inline="always")
def _release(pool, ps, ls, sl, B, ist, free_slots):
    """``BlockHashCache.finish`` / ``preempt`` of the request in slot *sl*
    (:func:`pool_release`); the slot is freed."""
    s_ntok = ls[3]
    n0 = s_ntok[sl]
    ist[I_PARTIAL] -= n0 % B
    pool_release(pool, ps, sl, n0)
    free_slots[ist[I_NFREE]] = sl
    ist[I_NFREE] += 1


@njit(cache=True, inline="always")
def _serve(r, nrun, cap, budget, pool, ps, ls, B, ist, run, ctx, target, kv, slot_of, preemptions, wq, wcap,
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
        if _extend(pool, ps, ls, slot_of[r], need_tok, B, ist):
            kv[r] = upto
            break
        v = run[nrun - 1]
        nrun -= 1
        _release(pool, ps, ls, slot_of[v], B, ist, free_slots)
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
def _head_lookup(pool, ps, hs, tr, i, L, hsid, hsend, ist, count_free):
    """Side-effect-free lookup of request *i*'s first *L* tokens (``BlockHashCache._lookup``,
    :func:`pool_lookup`): returns (capped hit blocks, those with ref_cnt 0 when
    *count_free*, segments written to ``hsid``/``hsend``). The segments (and the pool's
    scratch) are reused while the same request is asked."""
    ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens = tr
    if ist[I_HKI] == i:
        m = ist[I_HKM]
        fresh = 0 if ist[I_HKL] == L else 1
    else:
        m = kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                        hsid, hsend)
        fresh = 2
        ist[I_HKI] = i
        ist[I_HKM] = m
    ist[I_HKL] = L
    h, nfree = pool_lookup(pool, ps, hs, tr, i, L, hsid, hsend, m, fresh, count_free)
    return h, nfree, m


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
def _decode_run(pool, ps, ls, slots, kv0, B, k, out, ist, lz):
    """Steps 2 … k of a run of k decode steps of the requests in *slots* (step 1 applied).

    The lazy schedule of ``Scheduler._lazy_slot_local`` (``decode_slot_local``, the step
    loop of :func:`radixkv.policies._hash_batch_kernels.decode_run_slot_local`): at step
    t (1 ≤ t ≤ k − 2; every request then holds t extra tokens) only the requests whose
    token ``kv0 + t − 1`` starts a block grow, by their lag, in item order
    (:func:`pool_grow_slot`); after step k − 1 every request is brought to k − 1 extra
    tokens. *out* int64 (k, 3): row 0 given (the pool after step 1); rows 1 … k − 2
    filled with used blocks, cached blocks, valid tokens as after each step.

    *lz* is scratch for the schedule's grouping (:func:`lazy_order_into`): int64 (≥ B + 1,),
    (≥ n,), (≥ B,), (≥ n,).

    Returns −1 when done, else the item refused by the pool."""
    s_ntok = ls[3]
    n = slots.shape[0]
    cnt, order, fill, applied = lz
    lazy_order_into(kv0, n, B, cnt, order, fill)
    for x in range(n):
        applied[x] = 0
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
            sl = slots[i]
            n0 = s_ntok[sl]
            ok, ev = pool_grow_slot(pool, ps, ls, sl, n0, m)
            if not ok:
                return i
            ist[I_EV] += ev
            ist[I_PARTIAL] += (n0 + m) % B - n0 % B
            s_ntok[sl] = n0 + m
            A += m
            applied[i] = t
        if final:
            break
        u, c, hashed = pool_counts(pool)
        v = hashed * B + ist[I_PARTIAL]
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
def run_loop(tr, pool, B, num_slots, cfg, kind, cp, rq, rf, wq, run, plan, ls, ps, free_slots, hscr, hs, pf_n,
             pf_c, pf_g, tl_i, tl_t, ist, fst, stop_done, rec, src, garr, iv_t, iv_n):
    """Run the replay loop until every request it was given finished, or a resumable stop
    (module docstring).

    Parameters
    ----------
    tr : tuple
        The trace's arrays: ``ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
        output_len, unit_tokens`` (as :func:`radixkv.trace._seq_kernel.kv_seq_into` takes them).
    pool : namedtuple
        The pool value (module docstring, "Pools and their operations"); one compiled
        loop per pool type.
    B : int
        ``block_size`` (tokens).
    num_slots : int
        The pool's usable blocks (``BlockHashCache.num_slots``).
    cfg : int64 (9,)
        ``max_num_seqs, max_num_batched_tokens, enable_chunked_prefill,
        long_prefill_token_threshold, watermark blocks, fast_forward, timeline, most
        timeline rows one step may add`` (the largest output length + 1), ``intervals``
        (log each step's interval in ``iv_*``).
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
    ls : tuple
        The loop's per-slot arrays ``sid (S, M), send (S, M), nseg (S,), ntok (S,)``
        (int64: the slot's content segments, their count, its tokens with KV).
    ps : tuple
        The pool's per-slot arrays (S rows each), passed to the pool operations.
    free_slots : int64 (S,)
        Stack of free slots (``ist[I_NFREE]``).
    hscr : tuple
        ``sid, send`` (int64 (M,)): segments of a waiting request being looked up.
    hs : tuple
        The pool's lookup scratch (``pool_lookup``).
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
    src : int64 (n,)
        The rows the engine serves, in arrival order; the first ``ist[I_NSRC]`` are given
        (a request joins the waiting queue at the first step boundary at or after its
        arrival ``rf[0]``; an idle engine's clock jumps to it). The single engine: every
        row; a replica of :mod:`radixkv.replay.multi_concurrent`: the rows routed to it.
    garr : float64 (m,)
        Every arrival of the run, non-decreasing: a fast-forwarded run with nothing
        waiting is cut at the first one after the clock (``ist[I_GNXT]`` counts those at or
        before it). The single engine: ``rf[0]``; a replica: the whole trace's.
    iv_t, iv_n : float64 (2, R), int64 (R,)
        When ``cfg[8]``: each step's (or fast-forwarded run's) start and end time and its
        running requests (``ReplicaEngine.intervals``), ``ist[I_IVN]`` rows used.

    Returns
    -------
    int
        A status ``S_*``, or a pool's own status (≥ :data:`S_POOL`). :data:`S_DONE`: every
        given request finished (the engine is idle).
    """
    # the loop runs on borrowed views of the loop's own arrays (radixkv.policies._borrowed: no
    # reference counts where its inlined helpers bind them; valid for this call)
    b_tr = (borrow(tr[0]), borrow(tr[1]), borrow(tr[2]), borrow(tr[3]), tr[4], borrow(tr[5]), borrow(tr[6]), tr[7])
    b_ls = (borrow(ls[0]), borrow(ls[1]), borrow(ls[2]), borrow(ls[3]))
    v_pool, v_ps, v_hs = pool_views(pool, ps, hs)
    return _loop(b_tr, v_pool, B, num_slots, cfg, kind, cp, borrow(rq), borrow(rf), borrow(wq), borrow(run),
                 borrow(plan), b_ls, v_ps, borrow(free_slots), (borrow(hscr[0]), borrow(hscr[1])), v_hs, borrow(pf_n),
                 borrow(pf_c), borrow(pf_g), borrow(tl_i), borrow(tl_t), borrow(ist), borrow(fst), stop_done, rec,
                 borrow(src), borrow(garr), borrow(iv_t), borrow(iv_n))


@njit(cache=True)
def _loop(tr, pool, B, num_slots, cfg, kind, cp, rq, rf, wq, run, plan, ls, ps, free_slots, hscr, hs, pf_n,
          pf_c, pf_g, tl_i, tl_t, ist, fst, stop_done, rec, src, garr, iv_t, iv_n):
    """:func:`run_loop`'s body, on borrowed views."""
    ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens = tr
    sid2d, send2d, s_nseg, s_ntok = ls
    hsid, hsend = hscr
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
    iv_on = cfg[8] != 0
    ng = garr.shape[0]
    cap_run = run.shape[0]
    wcap = wq.shape[0]
    p_req = plan[0]
    p_new = plan[1]
    p_ctx = plan[2]
    p_pre = plan[3]
    S = B
    rec_on = rec[0][MR.RS_ON] != 0
    # the fast-forward branch's scratch (no allocation per decode run): pool rows and step
    # times of at most tl_need steps (the largest output length + 1), the run's slots and
    # KV, the lazy schedule's order (cnt, order, fill, applied)
    ffp = np.empty((tl_need + 1, 3), dtype=np.int64)
    dts = np.empty(tl_need + 1, dtype=np.float64)
    slots_s = np.empty(cap_run, dtype=np.int64)
    kv0_s = np.empty(cap_run, dtype=np.int64)
    lz = (np.empty(B + 1, dtype=np.int64), np.empty(cap_run, dtype=np.int64), np.empty(B, dtype=np.int64),
          np.empty(cap_run, dtype=np.int64))
    while True:
        now = fst[F_NOW]
        nxt = ist[I_NXT]
        nsrc = ist[I_NSRC]
        while nxt < nsrc and arr[src[nxt]] <= now:
            wq[(ist[I_WHEAD] + ist[I_WLEN]) % wcap] = src[nxt]
            ist[I_WLEN] += 1
            nxt += 1
        ist[I_NXT] = nxt
        nrun = ist[I_NRUN]
        if nrun == 0 and ist[I_WLEN] == 0:
            if nxt >= nsrc:
                return S_DONE
            if arr[src[nxt]] > now:
                fst[F_NOW] = arr[src[nxt]]
                ist[I_FINNOW] = 0
            continue
        if now >= fst[F_LIMIT]:
            return S_LIMIT
        if ist[I_DONE] >= stop_done:
            return S_PROGRESS
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
        if iv_on and ist[I_IVN] >= iv_n.shape[0]:
            return S_GROW_IV
        room = pool_room(pool, max_batched, cap_run)
        if room != 0:
            return room
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
            nrun, made, c, ok = _serve(r, nrun, cap, budget, pool, ps, ls, B, ist, run, ctx, target, kv, slot_of,
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
                    h, _f, _m = _head_lookup(pool, ps, hs, tr, i, n_tok, hsid, hsend, ist, False)
                    rem = n_tok - h * B
                    c = rem if cap <= 0 else min(rem, cap)
                    if min(c, n_tok) > budget:
                        blocked = True
                        break
                if wm > 0 and nrun > 0:
                    h, touch, _m = _head_lookup(pool, ps, hs, tr, i, n_tok, hsid, hsend, ist, True)
                    used, _c, _hh = pool_counts(pool)
                    if (n_tok + B - 1) // B - h + touch + wm > num_slots - used:
                        blocked = True
                        break
                c = n_tok if cap <= 0 else min(n_tok, cap)
                asked = min(n_tok, min(c, budget))
                # BlockHashCache.admit(i, known seq, asked)
                sl = free_slots[ist[I_NFREE] - 1]
                m = kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens,
                                i, sid2d[sl], send2d[sl])
                s_nseg[sl] = m
                code, hb, hd, ev = pool_admit(pool, ps, ls, tr, i, sl, m, n_tok, asked, admissions[i] == 0)
                if code == ADMIT_REFUSED:
                    blocked = True
                    break
                if code != ADMIT_OK:
                    return code
                ist[I_NFREE] -= 1
                slot_of[i] = sl
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
                nrun, made, c, ok = _serve(i, nrun, cap, budget, pool, ps, ls, B, ist, run, ctx, target, kv, slot_of,
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
                MR.rec_step(rec, now, now, p_req, p_new, p_ctx, p_pre, np.int64(0), np.int64(0), p_req, np.int64(0))
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
                used, _c, _hh = pool_counts(pool)
                room = num_slots - used - nrun
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
                hb, _f, hm = _head_lookup(pool, ps, hs, tr, head, L, hsid, hsend, ist, False)
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
            _decode_steps_time_into(kind, cp, np.int64(batch), np.int64(csum), np.int64(kk), dts)
            g = ist[I_GNXT]
            while g < ng and garr[g] <= now:
                g += 1
            ist[I_GNXT] = g
            if ist[I_WLEN] == 0 and g < ng:
                acc = 0.0
                a_next = garr[g]
                for j in range(kk):
                    acc = dts[0] if j == 0 else acc + dts[j]
                    if now + acc >= a_next:
                        if j + 1 < kk:
                            kk = j + 1
                        break
            # ------------------------------------------------------ Scheduler.fast_forward
            pools = ffp
            if kk > 1:
                slots = slots_s[:nrun]
                kv0 = kv0_s[:nrun]
                for q in range(nrun):
                    slots[q] = slot_of[run[q]]
                    kv0[q] = kv[run[q]]
                u0, c0, h0 = pool_counts(pool)
                pools[0, 0] = u0
                pools[0, 1] = c0
                pools[0, 2] = h0 * B + ist[I_PARTIAL]
                bad = _decode_run(pool, ps, ls, slots, kv0, B, kk, pools, ist, lz)
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
                    _release(pool, ps, ls, slot_of[r], B, ist, free_slots)
                    slot_of[r] = -1
                    p_new[nfin] = r  # reuse: finished rows in order
                    nfin += 1
            u1, c1, h1 = pool_counts(pool)
            pools[kk - 1, 0] = u1
            pools[kk - 1, 1] = c1
            pools[kk - 1, 2] = h1 * B + ist[I_PARTIAL]
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
            dt = _step_time(kind, cp, np.int64(sn), np.int64(sa_), np.int64(sb))
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
                    _release(pool, ps, ls, slot_of[r], B, ist, free_slots)
                    slot_of[r] = -1
                    p_ctx[nfin] = r
                    nfin += 1
            steps += 1
            ist[I_STEPS] = steps
            used, cached, hashed = pool_counts(pool)
            valid = hashed * B + ist[I_PARTIAL]
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
        if now > t_start:
            ist[I_FINNOW] = nfin
        else:
            ist[I_FINNOW] += nfin
        if iv_on:
            iv_t[0, ist[I_IVN]] = t_start
            iv_t[1, ist[I_IVN]] = now
            iv_n[ist[I_IVN]] = nrun
            ist[I_IVN] += 1
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
            # int64 scalars (np.int64): one rec_step for every caller, not one per literal
            MR.rec_step(rec, t_start, now, i_req, i_new, i_ctx, i_pre, np.int64(i_req.shape[0]),
                        np.int64(kk if can_ff else 1), p_new if can_ff else p_ctx, np.int64(nfin))
