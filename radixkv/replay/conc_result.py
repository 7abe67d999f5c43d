"""The result of a concurrent replay, and the helpers that assemble it.

:class:`ConcurrentResult` (per-request columns, run metrics, the optional timeline) and the
pieces every concurrent loop shares to build it: :class:`_Integrals` (the step-by-step
time integrals), :func:`_accumulate`, :func:`_tl_row` (one timeline row) and
:func:`_result` (the columns and meta at the end of a run). The Python loop
(:func:`radixkv.replay.concurrent.replay_concurrent`), the compiled loops
(:mod:`radixkv.replay.conc_vllm_fast`, :mod:`radixkv.replay.conc_sglang`) and the replicas
of :mod:`radixkv.replay.multi_concurrent` import them from here, so that the loops sit below
the driver that picks one (``radixkv.replay.concurrent`` re-exports the public names).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixkv.records import RequestColumns
from radixkv.replay.scheduler import admission_rule_of

#: per-request columns of :class:`ConcurrentResult` (shape (n,) each) and their units
COLUMNS = {
    "arrival_s": "arrival time, s from the start (float64)",
    "admit_s": "first admission time, s (float64)",
    "first_token_s": "time the first output token was sampled, s (float64; NaN if N = 0)",
    "finish_s": "finish time, s (float64)",
    "queue_s": "queueing delay: first admission − arrival, s (float64)",
    "ttft_s": "time to first token: first token (or prefill end if N = 0) − arrival, s (float64)",
    "tpot_s": "time per output token after the first: (finish − first token) / (N − 1), s (float64; NaN if N < 2)",
    "e2e_s": "end-to-end latency: finish − arrival, s (float64)",
    "prompt_tokens": "P (int64)",
    "output_tokens": "N (int64)",
    "hit_tokens": "prompt tokens served from the cache at the first admission (int64)",
    "held_tokens": "prompt tokens the pool held as a token-level prefix at the first admission (int64)",
    "evicted_tokens": "cached tokens evicted by the request's admissions (int64); NaN (not modelled) under "
                      "SGLang's admission rule (float64): it evicts as a batch's pages are allocated, "
                      "charged to no request",
    "preemptions": "times the request was preempted by recompute (int64)",
    "admit_step": "engine step (1-based) of the first admission (int64)",
    "finish_step": "engine step (1-based) in which the request finished (int64)",
    "recomputed_tokens": "tokens computed again by re-admissions after preemption (int64)",
}

#: columns a replay may not model: NaN in :attr:`ConcurrentResult.columns`, an empty cell
#: (n/a) in the per-request CSV, never 0
NA_COLUMNS = ("evicted_tokens",)


#: per-step columns of the optional timeline (shape (steps,) each) and their units
TIMELINE_COLUMNS = {
    "step": "engine step, 1-based (int64)",
    "time_s": "clock at the end of the step, s (the clock of the arrival times) (float64)",
    "running": "requests running during the step (int64)",
    "waiting": "requests waiting while the step runs (int64)",
    "batch_tokens": "tokens computed in the step: prefill chunks + decodes (int64)",
    "pool_running_slots": "slots held by running requests after the step (int64)",
    "pool_cached_slots": "evictable cached slots after the step (int64)",
    "pool_free_slots": "free slots after the step (int64)",
}


@dataclass
class ConcurrentResult(RequestColumns):
    """What a concurrent replay saw: ``req_id`` and ``columns`` of
    :class:`~radixkv.records.RequestColumns` (every key of :data:`COLUMNS`, shape (n,), in
    replay order), and

    Attributes
    ----------
    duration_s : float
        From the first arrival to the last finish.
    busy_s : float
        Time with at least one request running.
    running_area : float
        ∫ (running requests) dt over the run, request·s.
    peak_running : int
        Most requests running in one step.
    steps : int
        Engine steps simulated.
    prefill_flops : float
        FLOPs of every prefill token computed (re-admissions included).
    prefill_flops_saved : float
        FLOPs the first admissions' hits avoided: Σ ``prefill_flops(hit, 0)``.
    pool : dict
        Time-weighted pool occupancy over busy time, from ``policy.stats(detail=False)``
        after every step: ``waste_area`` (∫ allocated-but-invalid tokens dt: partial
        blocks/pages, token·s), ``waste_peak`` (tokens), ``used_area`` (∫ slots held by
        running requests dt), ``cached_area`` (∫ evictable slots dt), ``capacity_tokens``;
        several replicas' sums add ``busy_s`` (the seconds the means are over: the replicas'
        busy times weighted by their pools) and ``waste_peak_share`` (the largest replica's
        peak share).
    meta : dict
        Configuration (policy, scheduler knobs, cost parameters).
    timeline : dict[str, np.ndarray] or None
        One row per engine step when the replay was asked for it (``timeline=True``):
        every key of :data:`TIMELINE_COLUMNS`, shape (steps,).
    """

    duration_s: float
    busy_s: float
    running_area: float
    peak_running: int
    steps: int
    prefill_flops: float
    prefill_flops_saved: float
    pool: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    timeline: dict | None = None

    def write_csv(self, path) -> None:
        """Write one row per request (``id``, then every column of :data:`COLUMNS`) to
        *path* atomically (temporary file, then rename). Floats use ``repr`` (exact and
        deterministic); NaN is written as ``nan``, but in :data:`NA_COLUMNS` (not modelled)
        as an empty cell."""
        from radixkv.util import write_columns_csv

        from radixkv.replay.conc_misses import csv_columns

        names = list(COLUMNS) + csv_columns(self.columns)
        cols = [[None if v != v else v for v in self.columns[c].tolist()] if c in NA_COLUMNS
                else self.columns[c].tolist() for c in names]
        write_columns_csv(path, self.req_id, names, cols, fmt=lambda v: "" if v is None else repr(v))

    def write_timeline_csv(self, path) -> None:
        """Write one row per engine step (the columns of :data:`TIMELINE_COLUMNS`) to *path*
        atomically. Raises ValueError when the replay did not record a timeline."""
        from radixkv.util import atomic_write_text

        if self.timeline is None:
            raise ValueError("this replay recorded no timeline: run replay_concurrent(..., timeline=True)")
        names = list(TIMELINE_COLUMNS)
        cols = [self.timeline[c].tolist() for c in names]
        lines = [",".join(names)]
        lines += [",".join(repr(v) for v in row) for row in zip(*cols)]
        atomic_write_text(path, "\n".join(lines) + "\n")

    def write_json(self, path) -> None:
        """Write ``{"summary": summary(), "meta": meta}`` to *path* atomically (sorted keys;
        NaN as JSON ``null``)."""
        from radixkv.util import atomic_write_text, dumps_json

        atomic_write_text(path, dumps_json({"summary": self.summary(), "meta": self.meta}))

    def _pool_summary(self) -> dict:
        """Pool occupancy means over busy time (shares of the pool's slots or tokens); the
        pool's own ``busy_s`` when it has one (several replicas: their busy times weighted by
        their pools, :func:`radixkv.replay.multi_concurrent.replay_multi_concurrent`)."""
        p = self.pool
        b = p.get("busy_s", self.busy_s) if p else self.busy_s
        if not p or b <= 0:
            return {}
        cap = p["capacity_tokens"]
        slots = cap / self.meta.get("slot_tokens", 1)
        return {
            "internal_fragmentation_share_mean": p["waste_area"] / b / cap,
            "internal_fragmentation_share_peak": p.get("waste_peak_share", p["waste_peak"] / cap),
            "pool_used_share_mean": p["used_area"] / b / slots,
            "pool_cached_share_mean": p["cached_area"] / b / slots,
        }

    def summary(self) -> dict:
        """Run metrics, units in the key names; plain Python numbers, deterministic.

        Keys: ``requests``, ``duration_s``, ``concurrency_mean`` (time-weighted mean of
        running requests over the duration), ``concurrency_busy_mean`` (over busy time
        only), ``concurrency_peak``, ``queue_mean_s``, ``queue_p50_s``, ``queue_p99_s``,
        ``ttft_{mean,p50,p90,p99}_s``, ``tpot_{mean,p50,p99}_s``, ``e2e_{p50,p99}_s``,
        ``throughput_output_tokens_per_s``, ``throughput_total_tokens_per_s`` (prompt +
        output), ``preemptions``, ``preempted_requests``, ``prompt_tokens``, ``hit_tokens``,
        ``token_hit_rate`` (first admissions), ``recomputed_tokens``, ``prefill_flops``,
        ``prefill_flops_saved``, ``steps``, ``scheduler`` (:func:`scheduler_record`: the
        rule, ``max_num_batched_tokens``, ``max_num_seqs`` and their ``source``), and over busy time
        ``internal_fragmentation_share_mean`` / ``_peak`` (allocated tokens holding no valid
        KV, share of the pool's tokens), ``pool_used_share_mean`` (slots held by running
        requests) and ``pool_cached_share_mean`` (evictable cached slots). Percentiles are numpy's linear interpolation;
        NaN when no request has the quantity.
        """
        c = self.columns
        d = self.duration_s

        def pct(x, q):
            x = x[~np.isnan(x)]
            return float(np.percentile(x, q)) if x.size else float("nan")

        def mean(x):
            x = x[~np.isnan(x)]
            return float(x.mean()) if x.size else float("nan")

        prompt = int(c["prompt_tokens"].sum())
        hit = int(c["hit_tokens"].sum())
        out = int(c["output_tokens"].sum())
        return {
            "requests": int(len(self)),
            "duration_s": float(d),
            "concurrency_mean": float(self.running_area / d) if d > 0 else float("nan"),
            "concurrency_busy_mean": float(self.running_area / self.busy_s) if self.busy_s > 0 else float("nan"),
            "concurrency_peak": int(self.peak_running),
            "queue_mean_s": mean(c["queue_s"]),
            "queue_p50_s": pct(c["queue_s"], 50),
            "queue_p99_s": pct(c["queue_s"], 99),
            "ttft_mean_s": mean(c["ttft_s"]),
            "ttft_p50_s": pct(c["ttft_s"], 50),
            "ttft_p90_s": pct(c["ttft_s"], 90),
            "ttft_p99_s": pct(c["ttft_s"], 99),
            "tpot_mean_s": mean(c["tpot_s"]),
            "tpot_p50_s": pct(c["tpot_s"], 50),
            "tpot_p99_s": pct(c["tpot_s"], 99),
            "e2e_p50_s": pct(c["e2e_s"], 50),
            "e2e_p99_s": pct(c["e2e_s"], 99),
            "throughput_output_tokens_per_s": float(out / d) if d > 0 else float("nan"),
            "throughput_total_tokens_per_s": float((out + prompt) / d) if d > 0 else float("nan"),
            "preemptions": int(c["preemptions"].sum()),
            "preempted_requests": int((c["preemptions"] > 0).sum()),
            "prompt_tokens": prompt,
            "hit_tokens": hit,
            "token_hit_rate": float(hit / prompt) if prompt else float("nan"),
            "recomputed_tokens": int(c["recomputed_tokens"].sum()),
            "prefill_flops": float(self.prefill_flops),
            "prefill_flops_saved": float(self.prefill_flops_saved),
            "steps": int(self.steps),
            # the step knobs the replay ran with and where they came from (scheduler_record)
            **({"scheduler": self.meta["scheduler"]} if "scheduler" in self.meta else {}),
            **self._pool_summary(),
            # per KV cache group (hybrid models, HybridBlockHashCache.group_metrics); null
            # for one-group policies
            "kv_cache_groups": self.meta.get("kv_cache_groups"),
            **self.meta.get("host_tier", {}),  # a policy with a host-memory tier only
            **self._miss_summary(prompt, hit),
            # requests the engine refuses for the context length (radixkv.replay.context);
            # the key is there only when a context length applies
            **({"rejected_requests": self.meta["rejected_requests"]} if "rejected_requests" in self.meta else {}),
        }

    def _miss_summary(self, prompt: int, hit: int) -> dict:
        """``miss_causes`` when the replay ran with the miss-cause breakdown (else nothing)."""
        mc = self.meta.get("miss_causes")
        if mc is None:
            return {}
        from radixkv.replay.conc_misses import summarize_concurrent_causes

        out = summarize_concurrent_causes(self.columns, prompt, hit, mc["multi"])
        out["unbounded_pool_tokens"] = mc["unbounded_pool_tokens"]
        return {"miss_causes": out}


def _accumulate(x0: float, xs: np.ndarray) -> float:
    """``x0 + xs[0] + xs[1] + …`` added left to right, as a Python loop adds them
    (``np.cumsum`` adds sequentially, unlike ``np.sum``'s pairwise summation)."""
    return float(np.cumsum(np.concatenate(([x0], xs)))[-1])


class _Integrals:
    """The time integrals of one engine's replay (running requests, busy time, pool slots,
    prefill FLOPs), added step by step in one fixed order, so that a fast-forwarded run of
    decode steps (:meth:`run`) gives the same bits as its steps added one at a time
    (:meth:`step`). Shared by :func:`replay_concurrent` and the replicas of
    :mod:`radixkv.replay.multi_concurrent`."""

    __slots__ = ("area", "busy", "pf_flops", "pool", "S")

    def __init__(self, policy):
        self.area = 0.0
        self.busy = 0.0
        self.pf_flops = 0.0
        self.pool = {"waste_area": 0.0, "waste_peak": 0, "used_area": 0.0, "cached_area": 0.0,
                     "capacity_tokens": policy.capacity_tokens}
        self.S = policy.slot_tokens

    def step(self, now: float, n_run: int, dt: float, used: int, cached: int, valid: int) -> float:
        """Add one step of *dt* seconds with *n_run* requests running and the pool at
        (*used*, *cached*) slots holding *valid* tokens; returns the step's end time."""
        pool = self.pool
        self.area += n_run * dt
        self.busy += dt
        waste = (used + cached) * self.S - valid
        pool["waste_area"] += waste * dt
        pool["waste_peak"] = max(pool["waste_peak"], waste)
        pool["used_area"] += used * dt
        pool["cached_area"] += cached * dt
        return now + dt

    def run(self, now: float, n_run: int, dts: np.ndarray, pools: np.ndarray) -> float:
        """Add a fast-forwarded run: step j lasts ``dts[j]`` seconds with the pool at
        ``pools[j] = (used, cached, valid)`` (int64, shape (k, 3)); the same float
        operations in the same order as k calls of :meth:`step`. Returns the run's end."""
        pool = self.pool
        used, cached = pools[:, 0], pools[:, 1]
        waste = (used + cached) * self.S - pools[:, 2]
        self.area = _accumulate(self.area, n_run * dts)
        self.busy = _accumulate(self.busy, dts)
        pool["waste_area"] = _accumulate(pool["waste_area"], waste * dts)
        pool["waste_peak"] = max(pool["waste_peak"], int(waste.max()))
        pool["used_area"] = _accumulate(pool["used_area"], used * dts)
        pool["cached_area"] = _accumulate(pool["cached_area"], cached * dts)
        return _accumulate(now, dts)

    def prefill(self, cost, plan) -> None:
        """Add the prefill FLOPs of *plan*'s prefilling requests (none: nothing added)."""
        pre_new = [c for c, p in zip(plan.new, plan.prefill) if p]
        if len(pre_new) == 1:  # the sum of one item is the item
            self.pf_flops += float(cost.prefill_flops(pre_new[0], plan.ctx[plan.prefill.index(True)]))
        elif pre_new:
            pre_ctx = [c for c, p in zip(plan.ctx, plan.prefill) if p]
            self.pf_flops += float(np.sum(cost.prefill_flops(np.asarray(pre_new), np.asarray(pre_ctx))))


def _tl_row(tl, step, t, running, waiting, tokens, used, cached, n_slots):
    tl["step"].append(step)
    tl["time_s"].append(t)
    tl["running"].append(running)
    tl["waiting"].append(waiting)
    tl["batch_tokens"].append(tokens)
    tl["pool_running_slots"].append(used)
    tl["pool_cached_slots"].append(cached)
    tl["pool_free_slots"].append(n_slots - used - cached)


def scheduler_record(rule: str, config) -> dict:
    """The ``scheduler`` object of a concurrent result's meta and summary: ``rule`` (the
    engine whose step rules ran, ``"vllm"`` or ``"sglang"``), ``max_num_batched_tokens``
    (tokens per step), ``max_num_seqs`` (running requests) and ``source`` (where the two
    came from: ``config.knob_source``, :func:`radixkv.replay.settings.step_knobs`;
    ``"given"`` for a config built in code)."""
    return {"rule": rule, "max_num_batched_tokens": int(config.max_num_batched_tokens),
            "max_num_seqs": int(config.max_num_seqs), "source": config.knob_source or "given"}


def _result(trace, policy, cost, config, sch, arrivals, admit_s, first_tok, finish,
            t0, t_end, busy, area, peak, steps, pf_flops, pool) -> ConcurrentResult:
    admit = np.asarray(admit_s, dtype=np.float64)
    ftok = np.asarray(first_tok, dtype=np.float64)
    fin = np.asarray(finish, dtype=np.float64)
    N = np.asarray(sch.N, dtype=np.int64)
    P = np.asarray(sch.P, dtype=np.int64)
    # prefill-only requests (N = 0): their "first token" time is the prefill end = finish
    ttft_end = np.where(N > 0, ftok, fin)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(N >= 2, (fin - ftok) / np.maximum(N - 1, 1), np.nan)
    hit = np.asarray(sch.hit, dtype=np.int64)
    rule = config.admission if config.admission is not None else admission_rule_of(policy)
    cols = {
        "arrival_s": arrivals.copy(),
        "admit_s": admit,
        "first_token_s": ftok,
        "finish_s": fin,
        "queue_s": admit - arrivals,
        "ttft_s": ttft_end - arrivals,
        "tpot_s": tpot,
        "e2e_s": fin - arrivals,
        "prompt_tokens": P,
        "output_tokens": N,
        "hit_tokens": hit,
        "held_tokens": np.asarray(sch.held, dtype=np.int64),
        # SGLang evicts as a formed batch's KV is allocated (``prepare_for_extend`` / decode:
        # ``allocation.py :: alloc_token_slots`` -> ``common.py :: evict_from_tree_cache``),
        # for no one request: not modelled per request, so null, never 0
        "evicted_tokens": (np.full(len(P), np.nan) if rule == "sglang"
                           else np.asarray(sch.evicted, dtype=np.int64)),
        "preemptions": np.asarray(sch.preemptions, dtype=np.int64),
        "recomputed_tokens": np.asarray(sch.recomputed, dtype=np.int64),
    }
    saved = float(np.sum(cost.prefill_flops(hit, 0))) if len(hit) else 0.0
    meta = {
        "policy": getattr(policy, "name", type(policy).__name__),
        "num_slots": policy.num_slots,
        "slot_tokens": policy.slot_tokens,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "scheduler": scheduler_record(rule, config),
        "schedule_policy": config.schedule_policy,
        "admission": rule,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "long_prefill_token_threshold": config.long_prefill_token_threshold,
        "watermark": config.watermark,
        # only when set: the FCFS meta keeps its bytes
        **({"scheduling_policy": config.scheduling_policy} if config.scheduling_policy != "fcfs" else {}),
        **({"enable_priority_scheduling": True,
            "schedule_low_priority_values_first": config.schedule_low_priority_values_first,
            "retraction_policy": config.retraction_policy} if config.enable_priority_scheduling else {}),
        "cost": {k: getattr(cost, k) for k in cost.__dataclass_fields__},
        "kv_cache_groups": policy.group_metrics() if hasattr(policy, "group_metrics") else None,
    }
    return ConcurrentResult(
        req_id=np.asarray(trace.req_id),
        columns=cols,
        duration_s=float(t_end - t0),
        busy_s=float(busy),
        running_area=float(area),
        peak_running=int(peak),
        steps=int(steps),
        prefill_flops=float(pf_flops),
        prefill_flops_saved=saved,
        pool=pool,
        meta=meta,
    )
