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
    import radixkv.policies._radix_kernels as K
    import radixkv.replay._conc_sglang_kernels as C
    from radixkv.replay.conc_result import TIMELINE_COLUMNS, _result
    from radixkv.replay.sched_sglang import (SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
                                             SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS)

    n = len(trace)
    p = int(policy.slot_tokens)
    P = np.asarray(trace.prompt_len, dtype=np.int64)
    Nout = np.asarray(trace.output_len, dtype=np.int64)
    B = int(config.max_num_batched_tokens)
    M = int(config.max_num_seqs)
    # the checks of SglangScheduler / Scheduler.__init__, in their order
    if B < p:
        raise ConfigError(
            f"SGLang's rules cut prefill chunks in whole pages: --max-num-batched-tokens "
            f"(--chunked-prefill-size) {B} is below the page size {p}",
            field="max_num_batched_tokens",
        )
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
    kv_max = int(kv.max()) if n else 0
    if (B + M) * (kv_max + B + M) >= _EXACT:  # Σ n·c + n(n+1)/2 of one step, an upper bound
        return None
    policy.defer_insert = True
    has_out = trace.out_ids is not None
    oids = trace.out_ids if has_out else trace.ids[:0]
    ooff = trace.out_offsets if has_out else trace.id_offsets[:1]
    SID, SEND, SOFF = C.build_seqs(trace.ids, trace.id_offsets, oids, ooff, has_out, P, Nout,
                                   int(trace.unit_tokens))
    seg_len = np.diff(SOFF)
    RQ = np.zeros((n, C.NQ), dtype=np.int64)
    RQ[:, C.Q_P] = P
    RQ[:, C.Q_N] = Nout
    RQ[:, C.Q_ADMIT_STEP] = -1
    RQ[:, C.Q_FINISH_STEP] = -1
    RF = np.full((n, C.NFL), np.nan)
    R = np.zeros((n, K.NR), dtype=np.int64)
    IV = np.zeros(C.NIV, dtype=np.int64)
    FV = np.zeros(C.NFV, dtype=np.float64)
    now0 = float(arrivals[0]) if n else 0.0
    FV[C.V_NOW] = now0
    ratio = SGLANG_INIT_NEW_TOKEN_RATIO
    ratio_min = SGLANG_INIT_NEW_TOKEN_RATIO * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    ratio_decay = (ratio - ratio_min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    FV[C.V_RATIO] = ratio
    CF = np.zeros(C.NCF, dtype=np.int64)
    CF[C.CF_MAX_SEQS] = M
    CF[C.CF_BUDGET] = B
    CF[C.CF_LPM] = 1 if config.schedule_policy == "lpm" else 0
    CF[C.CF_FF] = 1 if fast_forward else 0
    CF[C.CF_TIMELINE] = 1 if timeline else 0
    CF[C.CF_NUM_SLOTS] = policy.num_slots
    CF[C.CF_MAX_SEG] = int(seg_len.max()) if n else 0
    CP = np.zeros(C.NCP, dtype=np.float64)
    CP[C.C_PARAMS] = cost.params
    CP[C.C_LAYERS] = cost.num_layers
    CP[C.C_ATTN] = cost.attn_dim
    if type(cost) is not CostModel:  # CalibratedCostModel: its packed table after the fields
        CP = np.concatenate([CP, cost.packed()])
    else:
        _roofline_fields(CP, cost)
    RUN = np.zeros(max(n, 1), dtype=np.int64)
    WQ = np.zeros(n + 1, dtype=np.int64)
    TLI = np.zeros((1024 if timeline else 1, C.NTL), dtype=np.int64)
    TLF = np.zeros(TLI.shape[0], dtype=np.float64)
    step_pct = max(n // 100, 1)
    if progress is not None:
        IV[C.I_PROGRESS_AT] = step_pct
    arr = np.ascontiguousarray(arrivals, dtype=np.float64)
    import radixkv.replay._miss_rec_kernels as MR

    rec = MR.new_state(kv, recorder.deferred, on=True) if recorder is not None else MR.new_state(kv, False, on=False)
    while True:
        st = C.run_loop(policy._S, policy._N, policy._H1, policy._H2, policy._order(), policy._G, policy._Q, R,
                        RQ, RF, IV, FV, CF, CP, arr, RUN, WQ, SID, SEND, SOFF, TLI, TLF, ratio_min, ratio_decay, rec)
        if st == C.ST_DONE:
            break
        if st == C.ST_GROW:
            policy.reserve_arrays(int(IV[C.I_NEED_NODES]), int(IV[C.I_NEED_SEGS]), int(IV[C.I_NEED_ROWS]))
        elif st == C.ST_TIMELINE:
            size = max(2 * TLI.shape[0], int(IV[C.I_NEED_ROWS]))
            TLI2 = np.zeros((size, C.NTL), dtype=np.int64)
            TLF2 = np.zeros(size, dtype=np.float64)
            TLI2[: TLI.shape[0]] = TLI
            TLF2[: TLF.shape[0]] = TLF
            TLI, TLF = TLI2, TLF2
        elif st == C.ST_GROW_REC:
            rec = MR.grow(rec)
        elif st == C.ST_PROGRESS:
            progress(int(IV[C.I_DONE]), n)
            IV[C.I_PROGRESS_AT] = int(IV[C.I_DONE]) + step_pct
        elif st == C.ST_NO_FIT:
            policy.sync_bounds()
            i = int(IV[C.I_ERR])
            raise ConfigError(
                f"request {str(trace.req_id[i])!r} cannot be admitted into an otherwise idle pool "
                f"({policy.capacity_tokens} tokens)",
                path=trace.name or None,
                field="num_slots",
            )
        elif st == C.ST_REFUSED:
            policy.sync_bounds()
            raise RuntimeError(
                f"{type(policy).__name__} refused 1 decode tokens of request {int(IV[C.I_ERR])} "
                "that its reported free + evictable room should hold"
            )
        else:
            policy.sync_bounds()
            raise RuntimeError("decode needs a page but none is free or evictable")
    policy.sync_bounds()
    if progress is not None:
        progress(n, n)
    if recorder is not None:
        recorder.take_compiled(rec)
    sch = SimpleNamespace(
        N=Nout, P=P, hit=RQ[:, C.Q_HIT], held=RQ[:, C.Q_HELD], evicted=RQ[:, C.Q_EVICTED],
        preemptions=RQ[:, C.Q_PREEMPTIONS], recomputed=RQ[:, C.Q_RECOMPUTED],
    )
    pool = {"waste_area": float(FV[C.V_WASTE_AREA]), "waste_peak": int(IV[C.I_WASTE_PEAK]),
            "used_area": float(FV[C.V_USED_AREA]), "cached_area": float(FV[C.V_CACHED_AREA]),
            "capacity_tokens": policy.capacity_tokens}
    res = _result(trace, policy, cost, config, sch, arrivals, RF[:, C.F_ADMIT].copy(), RF[:, C.F_FIRST].copy(),
                  RF[:, C.F_FINISH].copy(), now0, float(FV[C.V_NOW]), float(FV[C.V_BUSY]), float(FV[C.V_AREA]),
                  int(IV[C.I_PEAK]), int(IV[C.I_STEPS]), float(FV[C.V_PF]), pool)
    res.columns["admit_step"] = RQ[:, C.Q_ADMIT_STEP].copy()
    res.columns["finish_step"] = RQ[:, C.Q_FINISH_STEP].copy()
    if timeline:
        k = int(IV[C.I_TLN])
        cols = {"step": TLI[:k, C.TL_STEP], "time_s": TLF[:k], "running": TLI[:k, C.TL_RUNNING],
                "waiting": TLI[:k, C.TL_WAITING], "batch_tokens": TLI[:k, C.TL_TOKENS],
                "pool_running_slots": TLI[:k, C.TL_USED], "pool_cached_slots": TLI[:k, C.TL_CACHED],
                "pool_free_slots": TLI[:k, C.TL_FREE]}
        res.timeline = {c: cols[c].copy() for c in TIMELINE_COLUMNS}
    return res
