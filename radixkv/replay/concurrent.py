"""Concurrent replay: requests arrive over time and share the pool while they run.

The loop is a discrete-step simulation of a continuous-batching engine:

1. requests whose arrival time has come join the waiting queue
   (:mod:`radixkv.replay.arrivals` gives the times);
2. the scheduler (:func:`~radixkv.replay.schedulers.make_scheduler`: vLLM's or SGLang's
   step rules, from the policy class) builds one step's batch (prefill
   chunks and decodes), making the policy calls the step implies;
3. the :class:`~radixkv.cost.CostModel` prices the step; the clock advances by its time;
4. the scheduler applies the step (tokens sampled, requests finished).

When the engine is idle the clock jumps to the next arrival. A run of identical
pure-decode steps (nothing to admit until a request finishes or a request arrives) is
priced and applied in one go (``Scheduler.fast_forward``); it gives the same result as
stepping one token at a time, because nothing is looked up or freed in between, and
``fast_forward`` returns the pool after each skipped step, so that every time-averaged
metric (running requests, pool shares, fragmentation) is integrated step by step.
``fast_forward=False`` steps every decode (same metrics, up to float rounding of the
clock; slower).

Under vLLM's rules over :class:`~radixkv.policies.block_hash.BlockHashCache` itself (FCFS,
no ``on_step`` hook, a :class:`~radixkv.cost.CostModel` or
:class:`~radixkv.cost.UnitStepCost`) the whole loop runs as one compiled kernel
(:mod:`radixkv.replay.conc_vllm_fast`): the same rules in the same order, the same bytes.

Per-request results are numpy columns (:class:`ConcurrentResult`); ``summary()`` gives the
run's metrics with their units in the key names.

Several replicas on one clock (:mod:`radixkv.replay.multi_concurrent`) step each replica
with ``ReplicaEngine.step``, which repeats this loop's body through the same scheduler
calls; ``tests/test_multi_concurrent.py`` checks that one replica gives this replay's
summary byte for byte, so a change here must be mirrored there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from radixkv.cost import CostModel
from radixkv.errors import ConfigError
from radixkv.replay.scheduler import SchedulerConfig, admission_rule_of, rule_of
from radixkv.replay.schedulers import make_scheduler

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
    "evicted_tokens": "cached tokens evicted by the request's admissions (int64)",
    "preemptions": "times the request was preempted by recompute (int64)",
    "admit_step": "engine step (1-based) of the first admission (int64)",
    "finish_step": "engine step (1-based) in which the request finished (int64)",
    "recomputed_tokens": "tokens computed again by re-admissions after preemption (int64)",
}


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
class ConcurrentResult:
    """What a concurrent replay saw.

    Attributes
    ----------
    req_id : np.ndarray of str, shape (n,)
    columns : dict[str, np.ndarray]
        Every key of :data:`COLUMNS`, shape (n,), in replay order.
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
        running requests dt), ``cached_area`` (∫ evictable slots dt), ``capacity_tokens``.
    meta : dict
        Configuration (policy, scheduler knobs, cost parameters).
    timeline : dict[str, np.ndarray] or None
        One row per engine step when the replay was asked for it (``timeline=True``):
        every key of :data:`TIMELINE_COLUMNS`, shape (steps,).
    """

    req_id: np.ndarray
    columns: dict
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

    def __len__(self) -> int:
        return len(self.req_id)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def write_csv(self, path) -> None:
        """Write one row per request (``id``, then every column of :data:`COLUMNS`) to
        *path* atomically (temporary file, then rename). Floats use ``repr`` (exact and
        deterministic); NaN is written as ``nan``."""
        from radixkv.util import write_columns_csv

        from radixkv.replay.conc_misses import csv_columns

        names = list(COLUMNS) + csv_columns(self.columns)
        write_columns_csv(path, self.req_id, names, [self.columns[c].tolist() for c in names], fmt=repr)

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
        """Pool occupancy means over busy time (shares of the pool's slots or tokens)."""
        p, b = self.pool, self.busy_s
        if not p or b <= 0:
            return {}
        cap = p["capacity_tokens"]
        slots = cap / self.meta.get("slot_tokens", 1)
        return {
            "internal_fragmentation_share_mean": p["waste_area"] / b / cap,
            "internal_fragmentation_share_peak": p["waste_peak"] / cap,
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
        ``prefill_flops_saved``, ``steps``, and over busy time
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


def replay_concurrent(
    trace,
    policy,
    cost: CostModel,
    *,
    arrivals: np.ndarray | None = None,
    config: SchedulerConfig | None = None,
    progress=None,
    on_step=None,
    fast_forward: bool = True,
    timeline: bool = False,
    host_link=None,
    recorder=None,
    request_intake_s: float = 0.0,
) -> ConcurrentResult:
    """Replay *trace* through *policy* with requests running concurrently.

    Parameters
    ----------
    trace : radixkv.trace.Trace
        Requests in replay order.
    policy : radixkv.policies.base.PrefixCache
        A fresh policy; the request row is its ``rid``.
    cost : radixkv.cost.CostModel
        Prices each step.
    arrivals : np.ndarray of float64, shape (n,), or None
        Arrival times in seconds, non-decreasing (default: the trace's, shifted to 0).
    config : SchedulerConfig or None
        Scheduler knobs (default ``SchedulerConfig()``).
    progress : callable or None
        Called as ``progress(done, total)`` after each step that finishes requests.
    on_step : callable or None
        Called as ``on_step(start_s, plan, k)`` after each scheduled step is applied:
        ``start_s`` the time the step started, ``plan`` its
        :class:`~radixkv.replay.scheduler.StepPlan` (requests, tokens, preempted rows),
        ``k`` the steps it stands for (k > 1: a fast-forwarded run of k identical decode
        steps, every request of ``plan`` decoding one token in each).
    fast_forward : bool
        Apply runs of identical decode steps in one go (default True; same metrics).
    timeline : bool
        Record one row per engine step (``ConcurrentResult.timeline``; default False).
    host_link : radixkv.cost.HostLink or None
        The host↔GPU link of a policy with a host-memory tier (``models_host_tier``): a
        step whose admissions load KV back (``StepPlan.load_tokens``) takes
        ``host_link.step_time`` instead of ``cost.step_time``. Required for such a policy
        with a non-empty host pool. The summary then gains the host-tier keys
        (:func:`radixkv.policies.host_tier.host_tier_summary`) and ``host_load_s`` (seconds
        of copies, summed over steps) and ``host_link_bytes_per_s``.
    recorder : radixkv.replay.conc_misses.MissRecorder or None
        Told every step's plan, first admissions and finishes (the miss-cause
        breakdown, ``--miss-causes``); it changes nothing in the replay. The compiled
        loops record the same events inside the loop
        (:mod:`radixkv.replay._miss_rec_kernels`) and hand them over at the end.
    request_intake_s : float
        Seconds a server front end spends taking in each request before the engine sees
        it (:func:`radixkv.cost.intake_arrivals`: a single-threaded FIFO front end; a
        **fitted** value, docs/clock-e2e.md). Default 0: requests reach the engine when
        they arrive, and nothing below changes. When > 0 the engine runs on the intake
        arrivals and the request columns are measured from *arrivals* (the send times):
        ``arrival_s``, ``queue_s``, ``ttft_s`` and ``e2e_s`` include the intake,
        ``duration_s`` runs from the first send, and ``meta`` gains ``request_intake_s``.

    Returns
    -------
    ConcurrentResult

    Raises
    ------
    radixkv.errors.ConfigError
        When arrivals do not match the trace, a request can never fit the pool, or the
        policy models no running requests (class attribute ``holds_running_kv = False``,
        e.g. ``unit-lru``): its pool occupancy, concurrency and preemptions would be
        numbers it does not model.
    """
    if request_intake_s != 0.0:
        return _with_intake(trace, policy, cost, arrivals, request_intake_s,
                            dict(config=config, progress=progress, on_step=on_step, fast_forward=fast_forward,
                                 timeline=timeline, host_link=host_link, recorder=recorder))
    if not getattr(policy, "holds_running_kv", True):
        raise ConfigError(f"{type(policy).__name__} models no running requests "
                          "(holds_running_kv = False), so it has no concurrent replay; "
                          "use the sequential mode", field="mode")
    tiered = bool(getattr(type(policy), "models_host_tier", False))
    step_clock = not hasattr(cost, "kv_bytes_per_token")  # UnitStepCost: the goldens' step convention
    if tiered and getattr(policy, "host_capacity", 0) > 0 and host_link is None and not step_clock:
        raise ConfigError(f"{type(policy).__name__} loads KV back from host memory: give the host link "
                          f"(--host-link: a preset or bytes/s) to price the copies", field="host_link")
    if host_link is not None and not tiered:
        raise ConfigError(f"{type(policy).__name__} has no host-memory tier: drop --host-link", field="host_link")
    load_s = 0.0
    config = config or SchedulerConfig()
    n = len(trace)
    if arrivals is None:
        arrivals = np.asarray(trace.arrival_s, dtype=np.float64) - (float(trace.arrival_s[0]) if n else 0.0)
    arrivals = np.asarray(arrivals, dtype=np.float64)
    if arrivals.shape != (n,):
        raise ConfigError(f"{arrivals.shape[0] if arrivals.ndim else 0} arrival times for {n} requests", field="arrivals")
    if n and (np.any(np.diff(arrivals) < 0) or not np.all(np.isfinite(arrivals))):
        raise ConfigError("arrival times must be finite and non-decreasing", field="arrivals")
    from radixkv.replay import conc_sglang

    compiled_rec = recorder is None or recorder.records_in_compiled_loop
    if compiled_rec and conc_sglang.applicable(policy, cost, config, on_step, rule_of(policy, config)):
        res = conc_sglang.replay_compiled(trace, policy, cost, arrivals, config, progress, fast_forward, timeline,
                                          recorder=recorder)
        if res is not None:
            return res
    sch = make_scheduler(trace, policy, config, arrivals)
    timed = getattr(sch, "step_window", None)  # async host loads (vllm-offload) land by the clock
    if timed is not None:
        sch.attach_link(cost, host_link)
    if on_step is None and compiled_rec:  # vLLM's rules over BlockHashCache: one compiled loop
        from radixkv.replay.conc_vllm_fast import replay_compiled

        res = replay_compiled(trace, policy, cost, config, sch, arrivals, fast_forward, progress, timeline,
                              recorder=recorder)
        if res is not None:
            return res
    arr = arrivals.tolist()
    nan = float("nan")
    admit_s = [nan] * n
    first_tok = [nan] * n
    finish = [nan] * n
    admit_step = [-1] * n
    finish_step = [-1] * n
    tl = {c: [] for c in TIMELINE_COLUMNS} if timeline else None
    n_slots = policy.num_slots
    now = arr[0] if n else 0.0
    t0 = now
    nxt = 0  # next request to arrive
    done = 0
    steps = 0
    peak = 0
    acc = _Integrals(policy)
    while done < n:
        while nxt < n and arr[nxt] <= now:
            sch.enqueue(nxt)
            nxt += 1
        if not sch.running and not sch.waiting and not (timed is not None and sch.has_waiting_kv()):
            sch.idle()
            if timed is not None:  # the engine steps on while connector jobs are in flight
                sch.idle_gap(now, arr[nxt])
            now = max(now, arr[nxt])
            continue
        plan = sch.schedule()
        admitted = sch.admitted_now
        for i in admitted:
            admit_s[i] = now
            admit_step[i] = steps + 1
        wait = sch.load_wait(now) if timed is not None and plan.empty and not sch.running else None
        if wait is not None:  # only host→GPU loads in flight: the engine steps until one lands
            timed(now, now + wait)
            sch.complete(plan)
            steps += 1
            st = policy.stats(detail=False)
            t_start = now
            now = acc.step(now, 0, wait, st.used_slots, st.cached_slots, st.valid_tokens)
            if tl is not None:
                _tl_row(tl, steps, now, 0, len(sch.waiting), 0, st.used_slots, st.cached_slots, n_slots)
            if on_step is not None:
                on_step(t_start, plan, 1)
            if recorder is not None:
                recorder.step(t_start, now, plan, 1, admitted, ())
            continue
        if plan.empty:
            if recorder is not None:
                recorder.step(now, now, plan, 0, admitted, ())
            if not sch.running:
                i = sch.waiting[0] if sch.waiting else sch.holding[0]
                raise ConfigError(
                    f"request {str(trace.req_id[i])!r} cannot be admitted into an otherwise idle pool "
                    f"({policy.capacity_tokens} tokens)",
                    path=trace.name or None,
                    field="num_slots",
                )
            continue  # only preemptions happened; schedule again at the same time
        peak = max(peak, plan.n_running)
        t_start = now
        if fast_forward and sch.can_fast_forward(plan):
            k = sch.max_fast_forward()
            batch = len(plan.req)
            dts = cost.decode_steps_time(batch, int(sum(plan.ctx)), k)
            if nxt < n and sch.run_ends_at_arrival():
                ends = now + np.cumsum(dts)
                j = int(np.searchsorted(ends, arr[nxt], side="left"))
                if j + 1 < k:
                    k = j + 1
                    dts = dts[:k]
            pools = sch.fast_forward(k)
            # every skipped step is integrated as the step-by-step loop integrates it
            n_run = plan.n_running
            if tl is None:  # the same float operations in the same order, vectorised
                now = acc.run(now, n_run, dts[:k], pools)
            else:
                for j, (used, cached, valid) in enumerate(pools.tolist()):
                    now = acc.step(now, n_run, float(dts[j]), used, cached, valid)
                    _tl_row(tl, steps + j + 1, now, n_run, len(sch.waiting), batch, used, cached, n_slots)
            steps += k
        else:
            if plan.load_tokens:  # a HiCache load back overlaps the step layer by layer
                dt = float(host_link.step_time(cost, plan.new, plan.ctx, plan.load_tokens))
                load_s += host_link.load_time(cost, plan.load_tokens)
            else:
                dt = float(cost.step_time(plan.new, plan.ctx))
            acc.prefill(cost, plan)
            if timed is not None:
                timed(now, now + dt)
            sch.complete(plan)
            steps += 1
            k = 1
            st = policy.stats(detail=False)
            now = acc.step(now, plan.n_running, dt, st.used_slots, st.cached_slots, st.valid_tokens)
            if tl is not None:
                _tl_row(tl, steps, now, plan.n_running, len(sch.waiting), int(sum(plan.new)),
                        st.used_slots, st.cached_slots, n_slots)
        if on_step is not None:
            on_step(t_start, plan, k)
        for i in sch.first_token_now:
            if math.isnan(first_tok[i]):
                first_tok[i] = now
        sch.first_token_now = []
        for i in sch.finished_now:
            finish[i] = now
            finish_step[i] = steps
        done += len(sch.finished_now)
        if sch.finished_now and progress is not None:
            progress(done, n)
        if recorder is not None:
            recorder.step(t_start, now, plan, k, admitted, sch.finished_now)
        sch.finished_now = []
    res = _result(trace, policy, cost, config, sch, arrivals, admit_s, first_tok, finish,
                  t0, now, acc.busy, acc.area, peak, steps, acc.pf_flops, acc.pool)
    if tiered:
        from radixkv.policies.host_tier import host_tier_summary

        res.meta["host_tier"] = {**host_tier_summary(policy, int(res.columns["prompt_tokens"].sum())),
                                 "host_load_s": load_s + getattr(sch, "host_load_s", 0.0),
                                 "host_link_bytes_per_s": None if host_link is None else host_link.bytes_per_s}
    res.columns["admit_step"] = np.asarray(admit_step, dtype=np.int64)
    res.columns["finish_step"] = np.asarray(finish_step, dtype=np.int64)
    if tl is not None:
        res.timeline = {c: np.asarray(v, dtype=np.float64 if c == "time_s" else np.int64) for c, v in tl.items()}
    return res


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


def _with_intake(trace, policy, cost, arrivals, request_intake_s, kw) -> ConcurrentResult:
    """:func:`replay_concurrent` with a request-intake front end (its docstring)."""
    from radixkv.cost import intake_arrivals

    n = len(trace)
    send = (np.asarray(trace.arrival_s, dtype=np.float64) - (float(trace.arrival_s[0]) if n else 0.0)
            if arrivals is None else np.asarray(arrivals, dtype=np.float64))
    eng = intake_arrivals(send, request_intake_s)  # raises on a bad intake time
    res = replay_concurrent(trace, policy, cost, arrivals=eng, **kw)
    if n:
        shift = eng - send
        c = res.columns
        c["arrival_s"] = send.copy()
        for k in ("queue_s", "ttft_s", "e2e_s"):
            c[k] = c[k] + shift
        res.duration_s = float(res.duration_s + shift[0])
    res.meta["request_intake_s"] = float(request_intake_s)
    return res


def _tl_row(tl, step, t, running, waiting, tokens, used, cached, n_slots):
    tl["step"].append(step)
    tl["time_s"].append(t)
    tl["running"].append(running)
    tl["waiting"].append(waiting)
    tl["batch_tokens"].append(tokens)
    tl["pool_running_slots"].append(used)
    tl["pool_cached_slots"].append(cached)
    tl["pool_free_slots"].append(n_slots - used - cached)


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
        "evicted_tokens": np.asarray(sch.evicted, dtype=np.int64),
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
        "schedule_policy": config.schedule_policy,
        "admission": config.admission if config.admission is not None else admission_rule_of(policy),
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
