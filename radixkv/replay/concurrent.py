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

Several replicas on one clock (:mod:`radixkv.replay.multi_concurrent`) step each replica
with ``ReplicaEngine.step``, which repeats this loop's body through the same scheduler
calls, or, where this replay runs compiled, on the same compiled loops;
``tests/test_multi_concurrent.py`` checks that one replica gives this replay's
summary byte for byte, so a change here must be mirrored there.
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
    config = config or SchedulerConfig(knob_source="radixkv default")
    n = len(trace)
    if arrivals is None:
        arrivals = np.asarray(trace.arrival_s, dtype=np.float64) - (float(trace.arrival_s[0]) if n else 0.0)
    arrivals = np.asarray(arrivals, dtype=np.float64)
    if arrivals.shape != (n,):
        raise ConfigError(f"{arrivals.shape[0] if arrivals.ndim else 0} arrival times for {n} requests", field="arrivals")
    if n and (np.any(np.diff(arrivals) < 0) or not np.all(np.isfinite(arrivals))):
        raise ConfigError("arrival times must be finite and non-decreasing", field="arrivals")
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
