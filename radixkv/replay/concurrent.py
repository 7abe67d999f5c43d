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

Per-request results are numpy columns (:class:`ConcurrentResult`, in
:mod:`radixkv.replay.conc_result` with the helpers every loop shares to build it);
``summary()`` gives the run's metrics with their units in the key names.

The loop's body is :class:`StepLoop` (one engine step on a Python scheduler); the replicas
of :mod:`radixkv.replay.multi_concurrent` (``ReplicaEngine``) step on it too, or, where this
replay runs compiled, on the same compiled loops; ``tests/test_multi_concurrent.py`` checks
that one replica gives this replay's summary byte for byte.
"""
from __future__ import annotations

import math

import numpy as np

from radixkv.cost import CostModel
from radixkv.errors import ConfigError
from radixkv.replay.conc_result import (  # noqa: F401 (COLUMNS: re-exported)
    COLUMNS,
    TIMELINE_COLUMNS,
    ConcurrentResult,
    _Integrals,
    _result,
    _tl_row,
)
from radixkv.replay.scheduler import SchedulerConfig, rule_of
from radixkv.replay.schedulers import make_scheduler

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
        Scheduler knobs (default ``SchedulerConfig()``, reported with source
        ``"radixkv default"``; a config given is reported ``"given"`` unless its
        ``knob_source`` says otherwise).
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
    check_holds_running_kv(policy)
    tiered = bool(getattr(type(policy), "models_host_tier", False))
    step_clock = not hasattr(cost, "kv_bytes_per_token")  # UnitStepCost: the goldens' step convention
    if tiered and getattr(policy, "host_capacity", 0) > 0 and host_link is None and not step_clock:
        raise ConfigError(f"{type(policy).__name__} loads KV back from host memory: give the host link "
                          f"(--host-link: a preset or bytes/s) to price the copies", field="host_link")
    if host_link is not None and not tiered:
        raise ConfigError(f"{type(policy).__name__} has no host-memory tier: drop --host-link", field="host_link")
    config = config or SchedulerConfig(knob_source="radixkv default")
    n = len(trace)
    arrivals = checked_arrivals(trace, arrivals)
    import radixkv.replay.conc_sglang as conc_sglang

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
    eng = StepLoop(trace, policy, cost, sch, step_outputs(n), fast_forward=fast_forward, timeline=timeline, host_link=host_link,
                   on_step=on_step, recorder=recorder, progress=progress)
    eng.now = t0 = arr[0] if n else 0.0
    nxt = 0  # next request to arrive
    while eng.done < n:
        while nxt < n and arr[nxt] <= eng.now:
            sch.enqueue(nxt)
            nxt += 1
        if not sch.running and not sch.waiting and not (timed is not None and sch.has_waiting_kv()):
            sch.idle()
            if timed is not None:  # the engine steps on while connector jobs are in flight
                sch.idle_gap(eng.now, arr[nxt])
            eng.now = max(eng.now, arr[nxt])
            continue
        eng.step(arr[nxt] if nxt < n else math.inf)
    res = eng.result(config, arrivals, eng.out, t0, eng.now)
    if tiered:
        from radixkv.policies.host_tier import host_tier_summary

        res.meta["host_tier"] = {**host_tier_summary(policy, int(res.columns["prompt_tokens"].sum())),
                                 "host_load_s": eng.load_s + getattr(sch, "host_load_s", 0.0),
                                 "host_link_bytes_per_s": None if host_link is None else host_link.bytes_per_s}
    for c in ("admit_step", "finish_step"):
        res.columns[c] = np.asarray(eng.out[c], dtype=np.int64)
    if eng.tl is not None:
        res.timeline = {c: np.asarray(v, dtype=np.float64 if c == "time_s" else np.int64) for c, v in eng.tl.items()}
    return res


def check_holds_running_kv(policy) -> None:
    """Raise the ``ConfigError`` of a *policy* that models no running requests
    (``holds_running_kv = False``): it has no concurrent replay."""
    if not getattr(policy, "holds_running_kv", True):
        raise ConfigError(f"{type(policy).__name__} models no running requests "
                          "(holds_running_kv = False), so it has no concurrent replay; "
                          "use the sequential mode", field="mode")


def checked_arrivals(trace, arrivals) -> np.ndarray:
    """The arrival times of a concurrent replay: *arrivals* (seconds, shape (n,)) or, None,
    the trace's shifted to 0; float64, shape (n,). Raises ``ConfigError`` when their shape
    does not match the trace or they are not finite and non-decreasing."""
    n = len(trace)
    if arrivals is None:
        arrivals = np.asarray(trace.arrival_s, dtype=np.float64) - (float(trace.arrival_s[0]) if n else 0.0)
    arrivals = np.asarray(arrivals, dtype=np.float64)
    if arrivals.shape != (n,):
        raise ConfigError(f"{arrivals.shape[0] if arrivals.ndim else 0} arrival times for {n} requests", field="arrivals")
    if n and (np.any(np.diff(arrivals) < 0) or not np.all(np.isfinite(arrivals))):
        raise ConfigError("arrival times must be finite and non-decreasing", field="arrivals")
    return arrivals


def step_outputs(n: int) -> dict:
    """Fresh per-row outputs of a Python step loop: ``admit_s``, ``first_token_s``,
    ``finish_s`` (lists of n floats, seconds, NaN until set) and ``admit_step``,
    ``finish_step`` (lists of n ints, −1 until set)."""
    nan = float("nan")
    return {"admit_s": [nan] * n, "first_token_s": [nan] * n, "finish_s": [nan] * n,
            "admit_step": [-1] * n, "finish_step": [-1] * n}


class StepLoop:
    """One engine on a Python scheduler, advanced one engine step at a time: the body of
    :func:`replay_concurrent`'s loop and of every replica's
    (:class:`radixkv.replay.multi_concurrent.ReplicaEngine`). The driver enqueues the
    arrivals, handles an idle engine and calls :meth:`step` while the engine has work.

    Parameters
    ----------
    trace, policy, cost
        As :func:`replay_concurrent`.
    sch : radixkv.replay.scheduler.Scheduler
        The engine's scheduler (:func:`~radixkv.replay.schedulers.make_scheduler`).
    out : dict of lists
        The per-row outputs (:func:`step_outputs`; replicas share one, each writing its rows).
    fast_forward, timeline, host_link, on_step, recorder, progress
        As :func:`replay_concurrent` (*progress* gets this engine's finished count and n).
    pool_name : str
        Names the pool in the error of a request that cannot be admitted into it idle.

    Attributes
    ----------
    now : float or None
        Start time of the next step, seconds (set by the driver before the first step).
    steps, peak, done : int
        Engine steps made, most requests running in one step, requests finished.
    acc : radixkv.replay.conc_result._Integrals
        The run's time integrals.
    intervals : list of (float, float, int)
        (start, end, running requests) of every step or fast-forwarded run.
    load_s : float
        Seconds of host→GPU copies of HiCache load backs (summed over steps).
    tl : dict of lists or None
        The timeline's columns (*timeline* True).
    """

    def __init__(self, trace, policy, cost, sch, out, *, fast_forward=True, timeline=False, host_link=None,
                 on_step=None, recorder=None, progress=None, pool_name="an otherwise idle pool"):
        self.trace, self.policy, self.cost, self.sch = trace, policy, cost, sch
        self.out = out
        self.fast_forward, self.host_link, self.on_step = fast_forward, host_link, on_step
        self.recorder, self.progress, self.pool_name = recorder, progress, pool_name
        self.timed = getattr(sch, "step_window", None)
        self.tl = {c: [] for c in TIMELINE_COLUMNS} if timeline else None
        self.now = None
        self.steps = self.peak = self.done = 0
        self.load_s = 0.0
        self.intervals: list = []
        self.acc = _Integrals(policy)

    def step(self, next_arrival: float) -> None:
        """Run one iteration of the engine loop at :attr:`now` (< *next_arrival*, the next
        request to arrive, ``inf`` when none is left): schedule, price, apply."""
        sch, cost, policy, out, acc, tl, rec = self.sch, self.cost, self.policy, self.out, self.acc, self.tl, self.recorder
        n_slots = policy.num_slots
        now = self.now
        plan = sch.schedule()
        admitted = sch.admitted_now
        for i in admitted:
            out["admit_s"][i] = now
            out["admit_step"][i] = self.steps + 1
        timed = self.timed
        wait = sch.load_wait(now) if timed is not None and plan.empty and not sch.running else None
        if wait is not None:  # only host→GPU loads in flight: the engine steps until one lands
            timed(now, now + wait)
            sch.complete(plan)
            self.steps += 1
            st = policy.stats(detail=False)
            self.now = acc.step(now, 0, wait, st.used_slots, st.cached_slots, st.valid_tokens)
            if tl is not None:
                _tl_row(tl, self.steps, self.now, 0, len(sch.waiting), 0, st.used_slots, st.cached_slots, n_slots)
            if self.on_step is not None:
                self.on_step(now, plan, 1)
            if rec is not None:
                rec.step(now, self.now, plan, 1, admitted, ())
            return
        if plan.empty:
            if rec is not None:
                rec.step(now, now, plan, 0, admitted, ())
            if not sch.running:
                i = sch.waiting[0] if sch.waiting else sch.holding[0]
                raise ConfigError(
                    f"request {str(self.trace.req_id[i])!r} cannot be admitted into {self.pool_name} "
                    f"({policy.capacity_tokens} tokens)", path=self.trace.name or None, field="num_slots")
            return  # only preemptions happened; schedule again at the same time
        self.peak = max(self.peak, plan.n_running)
        t_start = now
        if self.fast_forward and sch.can_fast_forward(plan):
            k = sch.max_fast_forward()
            batch = len(plan.req)
            dts = cost.decode_steps_time(batch, int(sum(plan.ctx)), k)
            if next_arrival != math.inf and sch.run_ends_at_arrival():
                ends = now + np.cumsum(dts)
                j = int(np.searchsorted(ends, next_arrival, side="left"))
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
                    _tl_row(tl, self.steps + j + 1, now, n_run, len(sch.waiting), batch, used, cached, n_slots)
            self.steps += k
        else:
            if plan.load_tokens:  # a HiCache load back overlaps the step layer by layer
                dt = float(self.host_link.step_time(cost, plan.new, plan.ctx, plan.load_tokens))
                self.load_s += self.host_link.load_time(cost, plan.load_tokens)
            else:
                dt = float(cost.step_time(plan.new, plan.ctx))
            acc.prefill(cost, plan)
            if timed is not None:
                timed(now, now + dt)
            sch.complete(plan)
            self.steps += 1
            k = 1
            st = policy.stats(detail=False)
            now = acc.step(now, plan.n_running, dt, st.used_slots, st.cached_slots, st.valid_tokens)
            if tl is not None:
                _tl_row(tl, self.steps, now, plan.n_running, len(sch.waiting), int(sum(plan.new)),
                        st.used_slots, st.cached_slots, n_slots)
        self.now = now
        self.intervals.append((t_start, now, plan.n_running))
        if self.on_step is not None:
            self.on_step(t_start, plan, k)
        for i in sch.first_token_now:
            if math.isnan(out["first_token_s"][i]):
                out["first_token_s"][i] = now
        sch.first_token_now = []
        for i in sch.finished_now:
            out["finish_s"][i] = now
            out["finish_step"][i] = self.steps
        self.done += len(sch.finished_now)
        if sch.finished_now and self.progress is not None:
            self.progress(self.done, len(self.trace))
        if rec is not None:
            rec.step(t_start, now, plan, k, admitted, sch.finished_now)
        sch.finished_now = []

    def result(self, config, arrivals, out, t0: float, t_end: float) -> ConcurrentResult:
        """The engine's :class:`ConcurrentResult` over [*t0*, *t_end*] from the per-row
        outputs *out* (``admit_step`` / ``finish_step`` not set)."""
        acc = self.acc
        return _result(self.trace, self.policy, self.cost, config, self.sch, arrivals, out["admit_s"],
                       out["first_token_s"], out["finish_s"], t0, t_end, acc.busy, acc.area, self.peak, self.steps,
                       acc.pf_flops, acc.pool)


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
