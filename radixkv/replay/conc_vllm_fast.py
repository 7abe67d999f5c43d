"""The compiled path of the concurrent replay for vLLM's scheduler over vLLM's prefix cache.

:func:`replay_compiled` runs :func:`radixkv.replay.concurrent.replay_concurrent`'s loop
as one Numba kernel (:func:`radixkv.replay._conc_vllm_kernels.run_loop`) when the
replay is one it reproduces bit for bit: the policy is exactly
:class:`~radixkv.policies.block_hash.BlockHashCache` or
:class:`~radixkv.policies.block_priority.PriorityBlockHashCache` (``vllm:B@lfu``; no other
subclass, ``verify`` off), the
scheduler is :class:`~radixkv.replay.sched_vllm.VllmScheduler` with FCFS order (not
:class:`~radixkv.replay.sched_vllm_priority.VllmPriorityScheduler`, which runs on the Python
loop), the cost
model is :class:`~radixkv.cost.CostModel` or :class:`~radixkv.cost.UnitStepCost`, no
per-step hook is asked for, and the kernels are compiled. Otherwise it
returns None and the Python loop runs. Both paths give the same
:class:`~radixkv.replay.concurrent.ConcurrentResult`, byte for byte
(``tests/test_conc_vllm_fast.py`` compares them).

The loop runs on a pool value whose type selects the pool operations it compiles with
(:mod:`radixkv.replay._conc_vllm_kernels`, "Pools and their operations"): by default the
policy's own per-block pool (:mod:`radixkv.replay._conc_vllm_block_kernels`; for a
``PriorityBlockHashCache`` the same pool evicting by its priority, its free order part of
the pool value's type). On a
hash-id trace whose unit is a multiple of ``block_size`` (≥ 2), without output ids,
on a fresh ``BlockHashCache`` with ``unit_granular`` on (:func:`_unit_eligible`), the loop runs on the
piece pool of :mod:`radixkv.replay._conc_vllm_piece_kernels` instead (no block ids: the
free queue as ranges of the requests' blocks, cached blocks found per unit, reference
counts from the running requests' hit ranges): the same bytes again
(``tests/test_conc_vllm_unit.py``), about 20× less CPU than the per-block loop on the
Mooncake trace (docs/performance.md, "The concurrent replay against the sequential
one"). Afterwards the
policy keeps no per-block state: its per-block hooks and ``stats`` raise
``RuntimeError``. ``unit_granular = False`` keeps the per-block loop (the reference).
"""
from __future__ import annotations

import sys

import numpy as np

from radixkv.errors import ConfigError
import radixkv.policies._hash_kernels as K
import radixkv.replay._conc_vllm_block_kernels as BPK
import radixkv.replay._conc_vllm_kernels as CK
import radixkv.replay._conc_vllm_piece_kernels as PK
from radixkv.replay._engine_readout import EngineReadout, StateSlots

_EXACT = 2**53
#: requests finished between two progress reports of the compiled loop
_PROGRESS_EVERY = 256
#: request slots and prefill-log rows the compiled loop starts with (it asks for more)
_SLOTS0 = 16
_LOG0 = 1024
_TL0 = 4096  # timeline rows
_NEVER = 2**62  # a stop_done never reached


def _eligible(trace, policy, cost, config, sch) -> bool:
    from radixkv.cost import CostModel, UnitStepCost
    from radixkv.policies.block_hash import BlockHashCache
    from radixkv.replay.sched_vllm import VllmScheduler

    if type(policy) is not BlockHashCache and _prio_class(policy) is None:
        return False
    if policy.verify or policy._running or policy._partial:
        return False
    if type(sch) is not VllmScheduler or config.schedule_policy != "fcfs" or config.scheduling_policy != "fcfs":
        return False
    from radixkv.clock.calibrated import CalibratedCostModel

    if type(cost) not in (CostModel, UnitStepCost, CalibratedCostModel):
        return False
    if not hasattr(K.extend, "py_func") or not hasattr(CK.run_loop, "py_func"):
        return False  # the kernels run interpreted (radixkv.replay.jit)
    if len(trace) == 0:
        return False
    # the step time's integer sums stay exact (CostModel._step_time_ints)
    budget = int(config.max_num_batched_tokens)
    kv_max = int(np.max(trace.prompt_len + np.maximum(trace.output_len - 1, 0)))
    if budget * (kv_max + budget) >= _EXACT // 4:
        return False
    return True


def _prio_class(policy):
    """``PriorityBlockHashCache`` when *policy* is exactly one (its loop runs on the pool of
    :mod:`radixkv.replay._conc_vllm_block_kernels` with its priority as the free order), else None. The class's module is looked
    up only when loaded (it compiles its priority functions on import)."""
    mod = sys.modules.get("radixkv.policies.block_priority")
    if mod is not None and type(policy) is mod.PriorityBlockHashCache:
        return mod.PriorityBlockHashCache
    return None


def _unit_eligible(trace, policy) -> bool:
    """True when the loop may run on the piece pool (:mod:`radixkv.replay._conc_vllm_piece_kernels`):
    ``policy.unit_granular`` (the switch the sequential replay uses too), a fresh pool with
    64-bit keys, ``block_size`` ≥ 2, a hash-id trace whose unit is a multiple of it with
    every id ≥ 0 and no output ids, compiled kernels."""
    from radixkv.policies.block_hash import BlockHashCache

    U = int(trace.unit_tokens)
    B = int(policy.block_size)
    if not (type(policy) is BlockHashCache and getattr(policy, "unit_granular", False)
            and B >= 2 and U >= B and U % B == 0
            and trace.out_ids is None and int(policy._key_mask) == 0xFFFFFFFFFFFFFFFF
            and getattr(policy, "_unit", None) is None and hasattr(PK.unit_keys_all, "py_func")):
        return False
    if len(trace.ids) and int(np.min(trace.ids)) < 0:
        return False
    if policy._arrays is not None:
        st = policy._st
        if st[K.ST_NHASHED] != 0 or st[K.ST_NUSED] != 0 or st[K.ST_EVICTIONS] != 0:
            return False
    # the block records' int32 fields hold irregular-arena rows
    return int(np.sum(np.maximum((trace.prompt_len + np.maximum(trace.output_len - 1, 0)) // B, 0))) < 2**31


#: the state slots a driver reads (:class:`~radixkv.replay._engine_readout.EngineReadout`)
_SLOTS = StateSlots(now=CK.F_NOW, peak=CK.I_PEAK, steps=CK.I_STEPS, ivn=CK.I_IVN, nsrc=CK.I_NSRC, done=CK.I_DONE,
                    finnow=CK.I_FINNOW, refused=CK.I_ARG, nxt=CK.I_NXT, nrun=CK.I_NRUN, wlen=CK.I_WLEN)


class _UnitConsumed:
    """Stands in for ``BlockHashCache._unit`` after a concurrent replay on the piece
    pool: that pool's state is not the policy's per-block state, so the policy cannot go on."""

    def _refuse(self, *a, **k):
        raise RuntimeError("this BlockHashCache ran a concurrent replay on the piece pool "
                           "(radixkv.replay._conc_vllm_piece_kernels) and keeps no per-block state; "
                           "use a fresh pool (or unit_granular = False)")

    run_request = span = counters = largest_free_run = _refuse


def replay_compiled(trace, policy, cost, config, sch, arrivals: np.ndarray, fast_forward: bool, progress,
                    timeline: bool = False, recorder=None):
    """The replay of :func:`~radixkv.replay.concurrent.replay_concurrent` in one compiled
    loop, or None when it does not apply (module docstring).

    Parameters
    ----------
    trace, policy, cost, config, arrivals, fast_forward, progress, timeline
        As :func:`~radixkv.replay.concurrent.replay_concurrent` (arrivals validated,
        float64 (n,)).
    sch : radixkv.replay.sched_vllm.VllmScheduler
        The replay's (fresh) scheduler; its per-request lists are filled on return.
    recorder : radixkv.replay.conc_misses.MissRecorder or None
        A fresh miss recorder: the loop records its events
        (:mod:`radixkv.replay._miss_rec_kernels`) and hands them over on return
        (``MissRecorder.take_compiled``), the same events as the Python loop's calls.

    Returns
    -------
    radixkv.replay.concurrent.ConcurrentResult or None

    Raises
    ------
    radixkv.errors.ConfigError
        When a request cannot be admitted into an otherwise idle pool.
    RuntimeError
        When the pool refuses decode tokens its reported room should hold.
    """
    if not _eligible(trace, policy, cost, config, sch):
        return None
    n = len(trace)
    eng = CompiledVllmEngine(trace, policy, cost, config, sch, arrivals, fast_forward, timeline=timeline,
                             recorder=recorder)
    step = _PROGRESS_EVERY if progress is not None else n
    stop = step
    reported = 0
    while True:
        status = eng.advance(stop)
        if status == CK.S_DONE:
            break
        if status == CK.S_PROGRESS:
            reported = int(eng.ist[CK.I_DONE])
            progress(reported, n)
            stop = reported + step
        else:  # S_IDLE_REFUSED
            i = int(eng.ist[CK.I_ARG])
            raise ConfigError(
                f"request {str(trace.req_id[i])!r} cannot be admitted into an otherwise idle pool "
                f"({policy.capacity_tokens} tokens)",
                path=trace.name or None,
                field="num_slots",
            )
    if progress is not None and reported != n:
        progress(n, n)
    return eng.result(float(eng.fst[CK.F_T0]), float(eng.fst[CK.F_NOW]))


class CompiledVllmEngine(EngineReadout):
    """One vLLM engine on the compiled loop (:func:`radixkv.replay._conc_vllm_kernels.run_loop`),
    its state in arrays kept between calls, so that it can be advanced piece by piece.

    The single-engine replay (:func:`replay_compiled`) gives it every request at once;
    a replica of :mod:`radixkv.replay.multi_concurrent` (*replica* True) starts with none,
    is given each request routed to it (:meth:`give`) and is advanced up to each next
    arrival (:meth:`advance` with a limit), as ``ReplicaEngine`` steps its Python scheduler.

    Parameters
    ----------
    trace, policy, cost, config, sch, arrivals, fast_forward, timeline, recorder
        As :func:`replay_compiled` (the caller checked :func:`_eligible`).
    replica : bool
        Start with no request given; log every step's interval (:attr:`intervals`); cut
        fast-forwarded runs at the next arrival of *all_arrivals*.
    all_arrivals : np.ndarray of float64, shape (n,) or None
        With *replica*: every request's arrival (those routed elsewhere too).

    Attributes
    ----------
    ist, fst : np.ndarray
        The loop's integer and float state (``CK.I_*``, ``CK.F_*``).
    """

    def __init__(self, trace, policy, cost, config, sch, arrivals, fast_forward, *, timeline=False, recorder=None,
                 replica=False, all_arrivals=None):
        from radixkv.cost import UnitStepCost
        import radixkv.replay._miss_rec_kernels as MR

        self.trace, self.policy, self.cost, self.config, self.sch = trace, policy, cost, config, sch
        self.arrivals, self.timeline, self.recorder = arrivals, timeline, recorder
        n = len(trace)
        B = int(policy.block_size)
        P = np.ascontiguousarray(trace.prompt_len, dtype=np.int64)
        N = np.ascontiguousarray(trace.output_len, dtype=np.int64)
        kvlen = P + np.maximum(N - 1, 0)
        has_out = trace.out_ids is not None
        ids = np.ascontiguousarray(trace.ids, dtype=np.int64)
        id_off = np.ascontiguousarray(trace.id_offsets, dtype=np.int64)
        oids = np.ascontiguousarray(trace.out_ids if has_out else ids[:0], dtype=np.int64)
        ooff = np.ascontiguousarray(trace.out_offsets if has_out else id_off[:1], dtype=np.int64)
        U = int(trace.unit_tokens)
        # segments per request (radixkv.trace._seq_kernel.kv_seq_len)
        nprompt = np.diff(id_off)
        nseg = nprompt.copy()
        if U > 1:
            covered = np.where(nprompt > 0, np.minimum(nprompt * U, P), 0)
            nseg += covered < P
        nseg += np.where(kvlen > P, (kvlen - P) if has_out else 1, 0)
        G = int(nseg.max())
        W = int(-(-int(kvlen.max()) // B))
        self.tr = (ids, id_off, oids, ooff, has_out, P, N, U)
        self.unit = unit = _unit_eligible(trace, policy)
        if unit:
            rinfo = PK.request_info(id_off, P, U, B)
            self.pool = PK.new_pool(int(policy.num_gpu_blocks), B, U, ids, id_off, rinfo,
                                    min(int(config.max_num_seqs), n))
            new_ps = lambda n_sl: PK.new_slots(n_sl, W)  # noqa: E731
            self.hs = PK.new_scratch(W)
        else:
            # widen the content-piece arrays once to what the whole trace needs
            mp = int(BPK.max_block_pieces(ids, id_off, oids, ooff, has_out, P, N, U, B, G))
            if mp - 1 > policy._pcid.shape[1]:
                policy._grow_pieces(mp)
            # the policy's per-block pool; evicting by a priority: its heap too
            self.pool = BPK.new_pool(policy)
            new_ps = lambda n_sl: BPK.new_slots(n_sl, W)  # noqa: E731
            self.hs = BPK.new_scratch(W)
        self.cap_run = cap_run = int(min(int(config.max_num_seqs), n))
        rq = self.rq = np.zeros((16, n), dtype=np.int64)
        rq[0] = P
        rq[1] = N
        rq[12] = -1
        rq[13] = -1
        rq[14] = -1
        rq[15] = kvlen
        rf = self.rf = np.full((5, n), np.nan, dtype=np.float64)
        rf[0] = arrivals
        self.wq = np.zeros(n, dtype=np.int64)
        self.run = np.zeros(cap_run, dtype=np.int64)
        self.plan = np.zeros((4, cap_run), dtype=np.int64)
        self.hscr = (np.zeros(G, dtype=np.int64), np.zeros(G, dtype=np.int64))
        n_sl = min(cap_run, _SLOTS0)
        self.ls = _loop_slots(n_sl, G)
        self.ps = new_ps(n_sl)
        self.free_slots = np.arange(n_sl - 1, -1, -1, dtype=np.int64)
        self.pf_n = np.zeros(_LOG0 + cap_run, dtype=np.int64)
        self.pf_c = np.zeros_like(self.pf_n)
        self.pf_g = np.zeros(_LOG0, dtype=np.int64)
        self._slots = _SLOTS
        ist = self.ist = np.zeros(CK.NI, dtype=np.int64)
        ist[CK.I_NFREE] = n_sl
        ist[CK.I_HKI] = -1
        fst = self.fst = np.zeros(CK.NFS, dtype=np.float64)
        fst[CK.F_LIMIT] = np.inf
        if replica:
            self.src = np.zeros(n, dtype=np.int64)
            self.garr = np.ascontiguousarray(all_arrivals, dtype=np.float64)
            fst[CK.F_NOW] = fst[CK.F_T0] = -np.inf  # no request yet: the first one sets the clock
            self.iv_t = np.zeros((2, _LOG0), dtype=np.float64)
            self.iv_n = np.zeros(_LOG0, dtype=np.int64)
        else:
            self.src = np.arange(n, dtype=np.int64)
            self.garr = rf[0]
            ist[CK.I_NSRC] = n
            fst[CK.F_NOW] = fst[CK.F_T0] = float(arrivals[0])
            self.iv_t = np.zeros((2, 0), dtype=np.float64)
            self.iv_n = np.zeros(0, dtype=np.int64)
        if isinstance(cost, UnitStepCost):
            self.kind, self.cp = CK.COST_UNIT, np.array([float(cost.step_s)])
        elif hasattr(cost, "packed"):  # CalibratedCostModel
            self.kind, self.cp = CK.COST_TABLE, cost.packed()
        else:
            self.kind = CK.COST_ROOFLINE
            self.cp = np.array([float(cost.params), float(cost.num_layers), float(cost.attn_dim),
                                float(cost.weight_dtype_bytes), float(cost.kv_bytes_per_token), float(cost.peak_flops),
                                float(cost.mfu), float(cost.tp), float(cost.hbm_bytes_per_s), float(cost.mbu),
                                float(cost.step_overhead_s)], dtype=np.float64)
        self.cfg = np.array([int(config.max_num_seqs), int(config.max_num_batched_tokens),
                             1 if config.enable_chunked_prefill else 0, int(config.long_prefill_token_threshold),
                             int(sch._wm), 1 if fast_forward else 0, 1 if timeline else 0, int(N.max()) + 1,
                             1 if replica else 0], dtype=np.int64)
        rows = _TL0 if timeline else 0
        self.tl_i = np.zeros((7, rows), dtype=np.int64)
        self.tl_t = np.zeros(rows, dtype=np.float64)
        if recorder is not None:
            self.rec = MR.new_state(kvlen, recorder.deferred, preempt_rows=int(config.max_num_batched_tokens) + 1)
        else:
            self.rec = MR.new_state(kvlen, False, on=False)
        self.ev0 = 0 if unit else int(policy._st[K.ST_EVICTIONS])

    # ------------------------------------------------------------------ a replica's calls
    # give, in_flight_at, refused_row, now, peak, steps, intervals: EngineReadout
    def _state(self):
        return self.ist, self.fst, self.iv_t, self.iv_n

    def advance_to(self, limit: float) -> bool:
        """Run every step that starts before *limit* (``inf``: to the end of the given
        requests); True when the engine stopped on a request it cannot admit into its
        otherwise idle pool (:attr:`refused_row`)."""
        if self._nothing_to_run(limit):
            return False  # no step to run (the call would change nothing that is read)
        return self.advance(_NEVER, limit) == CK.S_IDLE_REFUSED

    # ------------------------------------------------------------------ the loop
    def advance(self, stop_done: int, limit: float = np.inf) -> int:
        """Run the loop until :data:`CK.S_DONE` (every given request finished),
        :data:`CK.S_PROGRESS` (*stop_done* requests finished), :data:`CK.S_LIMIT` (the
        next step would start at or after *limit*) or :data:`CK.S_IDLE_REFUSED` (request
        ``ist[I_ARG]`` cannot be admitted into the otherwise idle pool); enlarges what
        the loop asks for on the way. Returns that status.

        Raises
        ------
        RuntimeError
            When the pool refuses decode tokens its reported room should hold.
        """
        import radixkv.replay._miss_rec_kernels as MR

        self.fst[CK.F_LIMIT] = limit
        cap_run, ist = self.cap_run, self.ist
        while True:
            status = CK.run_loop(self.tr, self.pool, int(self.policy.block_size), int(self.policy.num_slots), self.cfg,
                                 self.kind, self.cp, self.rq, self.rf, self.wq, self.run, self.plan, self.ls, self.ps,
                                 self.free_slots, self.hscr, self.hs, self.pf_n, self.pf_c, self.pf_g, self.tl_i,
                                 self.tl_t, ist, self.fst, stop_done, self.rec, self.src, self.garr, self.iv_t,
                                 self.iv_n)
            if status in (CK.S_DONE, CK.S_PROGRESS, CK.S_LIMIT, CK.S_IDLE_REFUSED):
                return status
            if self.unit and status == PK.S_GROW_TABLES:
                self.pool = PK.grow_tables(self.pool, 2 * (int(self.cfg[1]) // int(self.policy.block_size))
                                           + 4 * cap_run + 4, 2 * cap_run + 2)
            elif status == CK.S_GROW_SLOTS:
                old = self.ls[0].shape[0]
                new = min(cap_run, 2 * old)
                self.ls = _grow_rows(self.ls, new)
                self.ps = _grow_rows(self.ps, new)
                fs = np.zeros(new, dtype=np.int64)
                k = int(ist[CK.I_NFREE])
                fs[:k] = self.free_slots[:k]
                fs[k:k + new - old] = np.arange(new - 1, old - 1, -1)
                self.free_slots = fs
                ist[CK.I_NFREE] = k + new - old
            elif status == CK.S_GROW_LOG:
                self.pf_n = np.concatenate((self.pf_n, np.zeros_like(self.pf_n)))
                self.pf_c = np.concatenate((self.pf_c, np.zeros_like(self.pf_c)))
                self.pf_g = np.concatenate((self.pf_g, np.zeros_like(self.pf_g)))
            elif status == CK.S_GROW_TL:
                rows = max(2 * self.tl_t.shape[0], int(ist[CK.I_TLN]) + int(self.cfg[7]))
                self.tl_i = np.concatenate((self.tl_i, np.zeros((7, rows - self.tl_t.shape[0]), dtype=np.int64)),
                                           axis=1)
                self.tl_t = np.concatenate((self.tl_t, np.zeros(rows - self.tl_t.shape[0], dtype=np.float64)))
            elif status == CK.S_GROW_REC:
                self.rec = MR.grow(self.rec)
            elif status == CK.S_GROW_IV:
                self.iv_t = np.concatenate((self.iv_t, np.zeros_like(self.iv_t)), axis=1)
                self.iv_n = np.concatenate((self.iv_n, np.zeros_like(self.iv_n)))
            elif status == CK.S_DECODE_REFUSED:
                raise RuntimeError(f"{type(self.policy).__name__} refused decode tokens of request "
                                   f"{int(ist[CK.I_ARG])} that its reported free + evictable room should hold")
            else:
                raise RuntimeError(f"compiled concurrent loop: unexpected status {status}")

    # ------------------------------------------------------------------ the result
    def result(self, t0: float, t_end: float):
        """The run's :class:`~radixkv.replay.concurrent.ConcurrentResult` over [*t0*,
        *t_end*] (every row; a replica's rows routed elsewhere hold no values); fills
        the scheduler's per-request lists and the policy's eviction counters, hands the
        recorder its events. Call once, after the last :meth:`advance`."""
        from radixkv.replay.conc_result import _Integrals, _accumulate, _result

        policy, cost, ist, fst, rq = self.policy, self.cost, self.ist, self.fst, self.rq
        B = int(policy.block_size)
        if self.recorder is not None:
            self.recorder.take_compiled(self.rec)
        if self.unit:
            PK.flush(self.pool)
            ev = int(self.pool.us[PK.U_EV])
            policy._unit = _UnitConsumed()
        else:
            ev = int(policy._st[K.ST_EVICTIONS]) - self.ev0
        policy.evictions += ev
        policy.evicted_tokens_total += ev * B
        # prefill FLOPs: each logged step's items summed as _Integrals.prefill sums them
        acc = _Integrals(policy)
        g = int(ist[CK.I_PFG])
        if g:
            npf = int(ist[CK.I_PFN])
            starts = self.pf_g[:g]
            ends = np.append(starts[1:], npf)
            # every item's FLOPs at once (elementwise: the values of per-step calls), then each
            # step's sum as np.sum adds it (CK.group_sums)
            f = np.ascontiguousarray(cost.prefill_flops(self.pf_n[:npf], self.pf_c[:npf]), dtype=np.float64)
            sums = CK.group_sums(f, starts, ends)
            for q in np.flatnonzero(ends - starts > CK.PAIRWISE_MAX).tolist():
                sums[q] = float(np.sum(f[int(starts[q]):int(ends[q])]))
            acc.pf_flops = _accumulate(0.0, sums)
        acc.area = float(fst[CK.F_AREA])
        acc.busy = float(fst[CK.F_BUSY])
        acc.pool["waste_area"] = float(fst[CK.F_WASTE])
        acc.pool["waste_peak"] = int(ist[CK.I_WPEAK])
        acc.pool["used_area"] = float(fst[CK.F_USED])
        acc.pool["cached_area"] = float(fst[CK.F_CACHED])
        self.acc = acc
        sch = self.sch
        sch.hit = rq[6]
        sch.held = rq[7]
        sch.evicted = rq[8]
        sch.preemptions = rq[10]
        sch.recomputed = rq[11]
        rf = self.rf
        res = _result(self.trace, policy, cost, self.config, sch, self.arrivals, rf[1], rf[2], rf[3], t0, t_end,
                      acc.busy, acc.area, int(ist[CK.I_PEAK]), int(ist[CK.I_STEPS]), acc.pf_flops, acc.pool)
        res.columns["admit_step"] = rq[12].copy()
        res.columns["finish_step"] = rq[13].copy()
        if self.timeline:
            m = int(ist[CK.I_TLN])
            tl_i, tl_t = self.tl_i, self.tl_t
            res.timeline = {"step": tl_i[0, :m].copy(), "time_s": tl_t[:m].copy(), "running": tl_i[1, :m].copy(),
                            "waiting": tl_i[2, :m].copy(), "batch_tokens": tl_i[3, :m].copy(),
                            "pool_running_slots": tl_i[4, :m].copy(), "pool_cached_slots": tl_i[5, :m].copy(),
                            "pool_free_slots": tl_i[6, :m].copy()}
        return res


def _loop_slots(n_sl, G):
    """The loop's per-slot tuple ``ls``: segment ids and ends (S, G), their count, tokens with KV."""
    return (np.zeros((n_sl, G), dtype=np.int64), np.zeros((n_sl, G), dtype=np.int64),
            np.zeros(n_sl, dtype=np.int64), np.zeros(n_sl, dtype=np.int64))


def _grow_rows(old, n_sl):
    """The per-slot tuple *old* with *n_sl* rows in every array, keeping the old rows."""
    new = []
    for a in old:
        b = np.zeros((n_sl,) + a.shape[1:], dtype=a.dtype)
        b[: a.shape[0]] = a
        new.append(b)
    return tuple(new)
