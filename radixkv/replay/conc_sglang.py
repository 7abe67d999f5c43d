"""The compiled concurrent replay for SGLang's rules over :class:`~radixkv.policies.radix.RadixCache`.

:func:`replay_compiled` gives :func:`radixkv.replay.concurrent.replay_concurrent`'s result,
byte for byte, with the step loop inside Numba
(:mod:`radixkv.replay._conc_sglang_kernels`). ``replay_concurrent`` uses it when
:func:`applicable` says the compiled loop models the run exactly: the policy's class is
``RadixCache`` or ``PriorityRadixCache`` itself (a subclass may change a rule), with
SGLang's batch visibility (``batch_visibility``: the scheduler defers a prefill's inserts
to ``commit``; the loop runs any eviction order of the tree kernels, the policy's
``_order()``) and ``cache_last_token_on_stop`` off,
SGLang's rules (``--admission sglang``) without priority scheduling
(``--enable-priority-scheduling`` runs :mod:`radixkv.replay.sched_sglang_priority` on the
Python loop), a :class:`~radixkv.cost.CostModel` (its class itself), no ``on_step`` hook, and compiled tree kernels (``RADIXKV_JIT`` not
interpreting them). Every other run takes the Python loop, which stays the reference
(``tests/test_conc_sglang.py`` compares the two).

``progress`` is called every 1 % of the requests (the Python loop calls it after each
step that finishes requests).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from radixkv.cost import CostModel
from radixkv.errors import ConfigError
from radixkv.replay._engine_readout import EngineReadout, StateSlots

#: False: always the Python loop (tests compare the two)
ENABLED = True

#: the step's integer sums of ``CostModel.step_time`` must stay exact in float64
_EXACT = 2**53


def applicable(policy, cost, config, on_step, rule: str) -> bool:
    """Whether the compiled loop models this run (module docstring)."""
    from radixkv.clock.calibrated import CalibratedCostModel

    if not ENABLED or on_step is not None or rule != "sglang" or type(cost) not in (CostModel, CalibratedCostModel):
        return False
    if config.enable_priority_scheduling:  # SglangPriorityScheduler: the Python loop
        return False
    import radixkv.policies._radix_kernels as K
    from radixkv.policies.radix import RadixCache
    from radixkv.policies.radix_priority import PriorityRadixCache

    if type(policy) not in (RadixCache, PriorityRadixCache) or not policy.batch_visibility:
        return False
    return not policy.cache_last_token_on_stop and hasattr(K.run_request, "py_func")


def _roofline_fields(CP, cost) -> None:
    """The roofline fields of :class:`~radixkv.cost.CostModel` *cost* into *CP*."""
    import radixkv.replay._conc_sglang_kernels as C

    CP[C.C_KVB] = cost.kv_bytes_per_token
    CP[C.C_PEAK] = cost.peak_flops
    CP[C.C_HBM] = cost.hbm_bytes_per_s
    CP[C.C_WDB] = cost.weight_dtype_bytes
    CP[C.C_MFU] = cost.mfu
    CP[C.C_MBU] = cost.mbu
    CP[C.C_TP] = cost.tp
    CP[C.C_OVERHEAD] = cost.step_overhead_s


def replay_compiled(trace, policy, cost, arrivals, config, progress, fast_forward, timeline, recorder=None):
    """Run the replay in :func:`radixkv.replay._conc_sglang_kernels.run_loop`.

    Parameters are those of :func:`radixkv.replay.concurrent.replay_concurrent` (arrivals
    already checked, float64 shape (n,)); a fresh *recorder*
    (:class:`~radixkv.replay.conc_misses.MissRecorder`) gets the loop's events
    (:mod:`radixkv.replay._miss_rec_kernels`, ``MissRecorder.take_compiled``). Returns a
    :class:`~radixkv.replay.concurrent.ConcurrentResult`, or None when the run's integer
    step sums could leave float64's exact range (the caller then takes the Python loop).

    Raises
    ------
    radixkv.errors.ConfigError
        As the Python loop: a page larger than the step budget, a request that can never
        fit the pool, or one that cannot be admitted into an idle pool.
    RuntimeError
        As the Python loop, when the pool refuses a decode its room promised.
    """
    import radixkv.replay._conc_sglang_kernels as C

    n = len(trace)
    check_pool(trace, policy, config)
    if not exact(trace, config):
        return None
    eng = CompiledSglangEngine(trace, policy, cost, arrivals, config, fast_forward, timeline=timeline,
                               recorder=recorder)
    step_pct = max(n // 100, 1)
    if progress is not None:
        eng.IV[C.I_PROGRESS_AT] = step_pct
    while True:
        st = eng.advance()
        if st == C.ST_DONE:
            break
        if st == C.ST_PROGRESS:
            progress(int(eng.IV[C.I_DONE]), n)
            eng.IV[C.I_PROGRESS_AT] = int(eng.IV[C.I_DONE]) + step_pct
        else:  # ST_NO_FIT
            i = int(eng.IV[C.I_ERR])
            raise ConfigError(
                f"request {str(trace.req_id[i])!r} cannot be admitted into an otherwise idle pool "
                f"({policy.capacity_tokens} tokens)",
                path=trace.name or None,
                field="num_slots",
            )
    if progress is not None:
        progress(n, n)
    return eng.result(eng.now0, float(eng.FV[C.V_NOW]))


def check_pool(trace, policy, config) -> None:
    """The checks of ``SglangScheduler`` / ``Scheduler.__init__``, in their order.

    Raises
    ------
    radixkv.errors.ConfigError
        A page larger than the step budget, or a request that can never fit the pool.
    """
    p = int(policy.slot_tokens)
    B = int(config.max_num_batched_tokens)
    if B < p:
        raise ConfigError(
            f"SGLang's rules cut prefill chunks in whole pages: --max-num-batched-tokens "
            f"(--chunked-prefill-size) {B} is below the page size {p}",
            field="max_num_batched_tokens",
        )
    P = np.asarray(trace.prompt_len, dtype=np.int64)
    Nout = np.asarray(trace.output_len, dtype=np.int64)
    kv = P + np.maximum(Nout - 1, 0)
    over = np.maximum(0, -(-kv // p) - policy.num_slots) * p
    bad = np.flatnonzero(over > 0)
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"request {str(trace.req_id[i])!r} needs {int(over[i])} tokens more than the whole pool "
            f"({policy.capacity_tokens} tokens); it could never run",
            path=trace.name or None,
            field="num_slots",
        )


def exact(trace, config) -> bool:
    """Whether one step's integer sums of the cost model stay exact in float64 (else the
    Python loop runs)."""
    P = np.asarray(trace.prompt_len, dtype=np.int64)
    Nout = np.asarray(trace.output_len, dtype=np.int64)
    B = int(config.max_num_batched_tokens)
    M = int(config.max_num_seqs)
    kv_max = int((P + np.maximum(Nout - 1, 0)).max()) if len(trace) else 0
    return (B + M) * (kv_max + B + M) < _EXACT  # Σ n·c + n(n+1)/2 of one step, an upper bound


class CompiledSglangEngine(EngineReadout):
    """One SGLang engine on the compiled loop (:func:`radixkv.replay._conc_sglang_kernels.run_loop`),
    its state in arrays kept between calls, so that it can be advanced piece by piece.

    The single-engine replay (:func:`replay_compiled`) gives it every request at once; a
    replica of :mod:`radixkv.replay.multi_concurrent` (*replica* True) starts with none,
    is given each request routed to it (:meth:`give`) and is advanced up to each next
    arrival (:meth:`advance_to`), as ``ReplicaEngine`` steps its Python scheduler; its
    fast-forwarded runs are cut at the next arrival of the whole trace. The caller ran
    :func:`check_pool` and :func:`exact`; the policy's inserts are deferred
    (``defer_insert``) from here on.
    """

    def __init__(self, trace, policy, cost, arrivals, config, fast_forward, *, timeline=False, recorder=None,
                 replica=False):
        import radixkv.policies._radix_kernels as K
        import radixkv.replay._conc_sglang_kernels as C
        import radixkv.replay._miss_rec_kernels as MR
        from radixkv.replay.sched_sglang import (SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
                                                 SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS)

        self.trace, self.policy, self.cost, self.config = trace, policy, cost, config
        self.arrivals, self.timeline, self.recorder = arrivals, timeline, recorder
        n = len(trace)
        P = np.asarray(trace.prompt_len, dtype=np.int64)
        Nout = np.asarray(trace.output_len, dtype=np.int64)
        self.P, self.Nout = P, Nout
        B = int(config.max_num_batched_tokens)
        M = int(config.max_num_seqs)
        kv = P + np.maximum(Nout - 1, 0)
        policy.defer_insert = True
        has_out = trace.out_ids is not None
        oids = trace.out_ids if has_out else trace.ids[:0]
        ooff = trace.out_offsets if has_out else trace.id_offsets[:1]
        self.SID, self.SEND, self.SOFF = C.build_seqs(trace.ids, trace.id_offsets, oids, ooff, has_out, P, Nout,
                                                      int(trace.unit_tokens))
        seg_len = np.diff(self.SOFF)
        RQ = self.RQ = np.zeros((n, C.NQ), dtype=np.int64)
        RQ[:, C.Q_P] = P
        RQ[:, C.Q_N] = Nout
        RQ[:, C.Q_ADMIT_STEP] = -1
        RQ[:, C.Q_FINISH_STEP] = -1
        self.RF = np.full((n, C.NFL), np.nan)
        self.R = np.zeros((n, K.NR), dtype=np.int64)
        self._slots = StateSlots(now=C.V_NOW, peak=C.I_PEAK, steps=C.I_STEPS, ivn=C.I_IVN, nsrc=C.I_NSRC,
                                 done=C.I_DONE, finnow=C.I_FINNOW, refused=C.I_ERR, nxt=C.I_NXT, nrun=C.I_NRUN,
                                 wlen=C.I_WLEN)
        IV = self.IV = np.zeros(C.NIV, dtype=np.int64)
        FV = self.FV = np.zeros(C.NFV, dtype=np.float64)
        FV[C.V_LIMIT] = np.inf
        ratio = SGLANG_INIT_NEW_TOKEN_RATIO
        self.ratio_min = ratio * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (ratio - self.ratio_min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        FV[C.V_RATIO] = ratio
        CF = self.CF = np.zeros(C.NCF, dtype=np.int64)
        CF[C.CF_MAX_SEQS] = M
        CF[C.CF_BUDGET] = B
        CF[C.CF_LPM] = 1 if config.schedule_policy == "lpm" else 0
        CF[C.CF_FF] = 1 if fast_forward else 0
        CF[C.CF_TIMELINE] = 1 if timeline else 0
        CF[C.CF_NUM_SLOTS] = policy.num_slots
        CF[C.CF_MAX_SEG] = int(seg_len.max()) if n else 0
        CF[C.CF_INTERVALS] = 1 if replica else 0
        CP = np.zeros(C.NCP, dtype=np.float64)
        CP[C.C_PARAMS] = cost.params
        CP[C.C_LAYERS] = cost.num_layers
        CP[C.C_ATTN] = cost.attn_dim
        if type(cost) is not CostModel:  # CalibratedCostModel: its packed table after the fields
            CP = np.concatenate([CP, cost.packed()])
        else:
            _roofline_fields(CP, cost)
        self.CP = CP
        self.RUN = np.zeros(max(n, 1), dtype=np.int64)
        self.WQ = np.zeros(n + 1, dtype=np.int64)
        self.TLI = np.zeros((1024 if timeline else 1, C.NTL), dtype=np.int64)
        self.TLF = np.zeros(self.TLI.shape[0], dtype=np.float64)
        self.arr = np.ascontiguousarray(arrivals, dtype=np.float64)
        if replica:
            self.src = np.zeros(n, dtype=np.int64)
            self.garr = self.arr
            self.now0 = FV[C.V_NOW] = -np.inf  # no request yet: the first one sets the clock
            self.IVT = np.zeros((2, 1024), dtype=np.float64)
            self.IVN = np.zeros(1024, dtype=np.int64)
        else:
            self.src = np.arange(n, dtype=np.int64)
            self.garr = self.arr
            IV[C.I_NSRC] = n
            self.now0 = float(arrivals[0]) if n else 0.0
            FV[C.V_NOW] = self.now0
            self.IVT = np.zeros((2, 0), dtype=np.float64)
            self.IVN = np.zeros(0, dtype=np.int64)
        if recorder is not None:
            self.rec = MR.new_state(kv, recorder.deferred, on=True)
        else:
            self.rec = MR.new_state(kv, False, on=False)

    def advance(self, limit: float = np.inf) -> int:
        """Run the loop until ``ST_DONE`` (every given request finished), ``ST_PROGRESS``,
        ``ST_LIMIT`` (the next step would start at or after *limit*) or ``ST_NO_FIT``
        (request ``IV[I_ERR]`` cannot be admitted into the otherwise idle pool), growing
        what the loop asks for on the way; returns that status.

        Raises
        ------
        RuntimeError
            When the pool refuses a decode its room promised.
        """
        import radixkv.replay._conc_sglang_kernels as C
        import radixkv.replay._miss_rec_kernels as MR

        policy, IV = self.policy, self.IV
        self.FV[C.V_LIMIT] = limit
        while True:
            st = C.run_loop(policy._S, policy._N, policy._H1, policy._H2, policy._order(), policy._G, policy._Q,
                            self.R, self.RQ, self.RF, IV, self.FV, self.CF, self.CP, self.arr, self.RUN, self.WQ,
                            self.SID, self.SEND, self.SOFF, self.TLI, self.TLF, self.ratio_min, self.ratio_decay,
                            self.rec, self.src, self.garr, self.IVT, self.IVN)
            if st in (C.ST_DONE, C.ST_PROGRESS, C.ST_LIMIT):
                return st
            if st == C.ST_GROW:
                policy.reserve_arrays(int(IV[C.I_NEED_NODES]), int(IV[C.I_NEED_SEGS]), int(IV[C.I_NEED_ROWS]))
            elif st == C.ST_TIMELINE:
                size = max(2 * self.TLI.shape[0], int(IV[C.I_NEED_ROWS]))
                TLI2 = np.zeros((size, C.NTL), dtype=np.int64)
                TLF2 = np.zeros(size, dtype=np.float64)
                TLI2[: self.TLI.shape[0]] = self.TLI
                TLF2[: self.TLF.shape[0]] = self.TLF
                self.TLI, self.TLF = TLI2, TLF2
            elif st == C.ST_GROW_REC:
                self.rec = MR.grow(self.rec)
            elif st == C.ST_GROW_IV:
                self.IVT = np.concatenate((self.IVT, np.zeros_like(self.IVT)), axis=1)
                self.IVN = np.concatenate((self.IVN, np.zeros_like(self.IVN)))
            elif st == C.ST_NO_FIT:
                policy.sync_bounds()
                return st
            elif st == C.ST_REFUSED:
                policy.sync_bounds()
                raise RuntimeError(
                    f"{type(policy).__name__} refused 1 decode tokens of request {int(IV[C.I_ERR])} "
                    "that its reported free + evictable room should hold"
                )
            else:
                policy.sync_bounds()
                raise RuntimeError("decode needs a page but none is free or evictable")

    # ------------------------------------------------------------------ a replica's calls
    # give, in_flight_at, refused_row, now, peak, steps, intervals: EngineReadout
    def _state(self):
        return self.IV, self.FV, self.IVT, self.IVN

    def advance_to(self, limit: float) -> bool:
        """Run every step that starts before *limit*; True when the engine stopped on a
        request it cannot admit into its otherwise idle pool (:attr:`refused_row`)."""
        import radixkv.replay._conc_sglang_kernels as C

        if self._nothing_to_run(limit):
            return False  # no step to run
        return self.advance(limit) == C.ST_NO_FIT

    # ------------------------------------------------------------------ the result
    def result(self, t0: float, t_end: float):
        """The run's :class:`~radixkv.replay.concurrent.ConcurrentResult` over [*t0*,
        *t_end*] (every row; a replica's rows routed elsewhere hold no values); hands the
        recorder its events; sets :attr:`acc`. Call once, after the last advance."""
        import radixkv.replay._conc_sglang_kernels as C
        from radixkv.replay.conc_result import TIMELINE_COLUMNS, _Integrals, _result

        policy, RQ, RF, IV, FV = self.policy, self.RQ, self.RF, self.IV, self.FV
        policy.sync_bounds()
        if self.recorder is not None:
            self.recorder.take_compiled(self.rec)
        sch = SimpleNamespace(
            N=self.Nout, P=self.P, hit=RQ[:, C.Q_HIT], held=RQ[:, C.Q_HELD], evicted=RQ[:, C.Q_EVICTED],
            preemptions=RQ[:, C.Q_PREEMPTIONS], recomputed=RQ[:, C.Q_RECOMPUTED],
        )
        pool = {"waste_area": float(FV[C.V_WASTE_AREA]), "waste_peak": int(IV[C.I_WASTE_PEAK]),
                "used_area": float(FV[C.V_USED_AREA]), "cached_area": float(FV[C.V_CACHED_AREA]),
                "capacity_tokens": policy.capacity_tokens}
        acc = self.acc = _Integrals(policy)
        acc.area, acc.busy, acc.pf_flops = float(FV[C.V_AREA]), float(FV[C.V_BUSY]), float(FV[C.V_PF])
        acc.pool = pool
        res = _result(self.trace, policy, self.cost, self.config, sch, self.arrivals, RF[:, C.F_ADMIT].copy(),
                      RF[:, C.F_FIRST].copy(), RF[:, C.F_FINISH].copy(), t0, t_end, acc.busy, acc.area,
                      int(IV[C.I_PEAK]), int(IV[C.I_STEPS]), acc.pf_flops, pool)
        res.columns["admit_step"] = RQ[:, C.Q_ADMIT_STEP].copy()
        res.columns["finish_step"] = RQ[:, C.Q_FINISH_STEP].copy()
        if self.timeline:
            k = int(IV[C.I_TLN])
            TLI, TLF = self.TLI, self.TLF
            cols = {"step": TLI[:k, C.TL_STEP], "time_s": TLF[:k], "running": TLI[:k, C.TL_RUNNING],
                    "waiting": TLI[:k, C.TL_WAITING], "batch_tokens": TLI[:k, C.TL_TOKENS],
                    "pool_running_slots": TLI[:k, C.TL_USED], "pool_cached_slots": TLI[:k, C.TL_CACHED],
                    "pool_free_slots": TLI[:k, C.TL_FREE]}
            res.timeline = {c: cols[c].copy() for c in TIMELINE_COLUMNS}
        return res
