"""Concurrent replay on several replicas behind a request router, on one global clock.

N replicas (data parallelism), each a continuous-batching engine with its own scheduler
(vLLM's or SGLang's step rules, :func:`~radixkv.replay.schedulers.make_scheduler`) and its
own policy instance on its own pool. One clock drives them all:

1. Requests arrive in time order (:mod:`radixkv.replay.arrivals`).
2. Before request *i* (arrival ``a``) is routed, every replica runs every step that
   STARTS before ``a`` (a step starting at ``a`` or later may already see request *i*, as
   in the single-engine loop, which enqueues every arrival ``≤ now`` before it schedules).
   Replicas share nothing, so the order in which they are advanced does not matter.
3. The router (:class:`radixkv.replay.routing.Router`) picks a replica from the replicas'
   state at time ``a``; the request joins that replica's waiting queue at its next step
   boundary (at once if it is idle: the clock of an idle replica jumps to ``a``).
4. After the last arrival every replica runs to completion.

Each replica's step is the single-engine loop's step (:func:`radixkv.replay.concurrent.
replay_concurrent`): schedule, price with the :class:`~radixkv.cost.CostModel`, apply;
runs of identical decode steps are fast-forwarded and cut at the next arrival (any
replica's: the next request may be routed to it). With one replica every router sends
every request to it and the run is the single-engine replay exactly (same summary, byte
for byte: ``tests/test_multi_concurrent.py``).

Load (what ``least-load``, ``session`` and ``prefix-aware`` read)
---------------------------------------------------------------
A replica's load at time ``a`` is its number of requests IN FLIGHT: routed to it at or
before ``a`` and not finished by ``a`` — its running plus waiting requests (a request
finishing in a step that ends after ``a`` still counts). This is the router-side counter
of SGLang's router (sgl-router ``src/core/worker.rs``: ``Worker::load``, incremented when
a request is routed to the worker, decremented when its response completes; read by the
``cache_aware`` and ``power_of_two`` policies), and the number vLLM's production-stack
router scrapes per engine as ``num_running_requests + num_queuing_requests``
(``src/vllm_router/stats/engine_stats.py``). Ties: fewest requests sent so far, then the
lowest index (as in the sequential replay).

Metrics
-------
Per replica: a :class:`~radixkv.replay.concurrent.ConcurrentResult` of its own requests
(``summary()`` as the single-engine replay's), over the run's duration (first arrival to
the last finish on ANY replica, so per-replica throughputs and mean concurrencies add up
to the aggregate's). Aggregate: every request's columns (steps numbered per replica);
``concurrency_*`` of all running requests together (peak: the most running at one time
over all replicas; busy time: time at least one replica runs a request); pool shares over
all replicas' slots; ``internal_fragmentation_share_peak``: the largest replica's peak
share. Load imbalance: max / mean of requests, prompt tokens and busy time per replica.

Compiled replicas
-----------------
Without miss recorders, replicas whose single-engine replay runs on a compiled loop run
on it here too (:func:`_compiled_engines`: vLLM's rules over ``BlockHashCache`` /
``PriorityBlockHashCache``, :class:`radixkv.replay.conc_vllm_fast.CompiledVllmEngine`;
SGLang's over ``RadixCache`` / ``PriorityRadixCache``,
:class:`radixkv.replay.conc_sglang.CompiledSglangEngine`), each engine's state kept in its
arrays between calls: the same steps, the same float operations in the same order, the
same bytes (``tests/test_multi_concurrent_compiled.py`` compares the two paths). A replica
is given the requests routed to it and is run up to each next arrival; the step at or
after an arrival sees it, as above, and a fast-forwarded run with nothing waiting is cut
at the first arrival (to any replica) after its start, which is the next request to be
routed. Under a router that reads no load (``round-robin``, ``random``) the routes do not
depend on the replicas, so every request is routed first and each replica then runs in
one call. :data:`COMPILED` False keeps the Python loop.

The global KV pool is not modelled here (:data:`GLOBAL_POOL_REFUSAL`).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from radixkv.errors import ConfigError
from radixkv.replay.conc_result import ConcurrentResult
from radixkv.replay.concurrent import StepLoop, check_holds_running_kv, checked_arrivals, step_outputs
from radixkv.replay.routing import Router
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.replay.schedulers import make_scheduler

#: False: the replicas always run on the Python schedulers (tests compare the two paths)
COMPILED = True

#: why ``--kv-pool global`` is refused in the concurrent mode (CLI and API)
GLOBAL_POOL_REFUSAL = (
    "--kv-pool global is not modelled in the concurrent mode: there a replica's pool is its GPU "
    "memory, which also holds its running requests' KV, and N GPUs do not share one HBM pool. A "
    "global cache (Mooncake Store, LMCache, Dynamo's KV store) is a second tier behind the "
    "replicas' pools whose hits must be copied over the network into a replica's pool before "
    "the prefill can use them; the concurrent replay has no network-transfer cost and no second "
    "tier, so it would report those hits as free. Use the sequential mode for the hit rate of a "
    "global pool (--mode sequential --kv-pool global)")


class ReplicaEngine(StepLoop):
    """One replica of the concurrent replay, advanced one engine step at a time
    (:class:`~radixkv.replay.concurrent.StepLoop`, the single-engine loop's body) on its own
    scheduler.

    Parameters
    ----------
    trace : radixkv.trace.Trace
        The WHOLE trace: rows are global request rows (the policy's ``rid``); the replica
        only ever sees the rows routed to it.
    policy : radixkv.policies.base.PrefixCache
        A fresh policy instance of this replica (its own pool).
    cost : radixkv.cost.CostModel
    config : SchedulerConfig
    arrivals : list of float
        Every request's arrival time, seconds.
    index : int
        The replica's index (error messages).
    out : dict of lists
        Shared per-row outputs ``admit_s``, ``first_token_s``, ``finish_s``,
        ``admit_step``, ``finish_step`` (length n); this replica writes its rows only.
    fast_forward : bool
        As :func:`radixkv.replay.concurrent.replay_concurrent`.

    Attributes
    ----------
    now : float or None
        Start time of the replica's next step, seconds; None before its first request.
    rows : list of int
        Rows routed here, in routing (= arrival) order.
    intervals : list of (float, float, int)
        (start, end, running requests) of every step or fast-forwarded run.
    recorder : radixkv.replay.conc_misses.MissRecorder or None
        Told every step (``--miss-causes``), set after construction.
    """

    def __init__(self, trace, policy, cost, config, arrivals, index, out, *, fast_forward=True):
        sch = make_scheduler(trace, policy, config, arrivals)
        if hasattr(sch, "step_window"):  # asynchronous host loads need the single-engine loop's clock hooks
            raise ConfigError(f"{type(policy).__name__} loads KV from host memory asynchronously, which the "
                              "multi-replica concurrent replay does not model: use one replica", field="replicas")
        super().__init__(trace, policy, cost, sch, out, fast_forward=fast_forward,
                         pool_name=f"replica {index}'s otherwise idle pool")
        self.index = index
        self.rows: list = []
        self.in_flight = 0
        self._finishing: deque = deque()  # (finish time, count) not yet taken off in_flight

    # ------------------------------------------------------------------ router's view
    def load_at(self, t: float) -> int:
        """Requests in flight at time *t* (module docstring, "Load"); *t* never decreases
        between calls."""
        f = self._finishing
        while f and f[0][0] <= t:
            self.in_flight -= f.popleft()[1]
        return self.in_flight

    @property
    def busy_now(self) -> bool:
        """Whether the replica has a running or waiting request."""
        return bool(self.sch.running or self.sch.waiting)

    def receive(self, i: int, a: float) -> None:
        """Request row *i*, arriving at *a* seconds, is routed here."""
        if self.now is None:
            self.now = a
        elif not self.busy_now and a > self.now:
            self.sch.idle()
            self.now = a
        self.sch.enqueue(i)
        self.rows.append(i)
        self.in_flight += 1

    def step(self, next_arrival: float) -> None:
        """One engine step (:meth:`StepLoop.step`); the requests it finishes leave
        :attr:`in_flight` at its end."""
        done = self.done
        super().step(next_arrival)
        if self.done > done:
            self._finishing.append((self.now, self.done - done))


@dataclass
class MultiConcurrentResult:
    """What a concurrent multi-replica replay saw.

    Attributes
    ----------
    aggregate : ConcurrentResult
        Every request (replay order) and the run's metrics over all replicas (module
        docstring, "Metrics"); ``admit_step`` / ``finish_step`` count steps of the
        request's replica.
    replicas : list of (ConcurrentResult or None)
        Per replica, its requests only (None for a replica that got none).
    replica : np.ndarray, int64, shape (n,)
        The replica of each request.
    n_replicas : int
    router : str
    routing : dict
        ``requests_per_replica``, ``prompt_tokens_per_replica``, ``busy_s_per_replica``,
        ``load_imbalance`` (max / mean requests per replica), ``prompt_token_imbalance``,
        ``busy_imbalance`` (max / mean busy seconds), and the router's own statistics
        (:meth:`radixkv.replay.routing.Router.stats`).
    """

    aggregate: ConcurrentResult
    replicas: list
    replica: np.ndarray
    n_replicas: int
    router: str
    routing: dict = field(default_factory=dict)

    def write_csv(self, path) -> None:
        """Write one row per request to *path* atomically: the aggregate's per-request
        columns (:meth:`ConcurrentResult.write_csv`) and ``replica``, the replica (0-based)
        that served the request."""
        from radixkv.replay.conc_misses import csv_columns
        from radixkv.replay.conc_result import COLUMNS
        from radixkv.util import write_columns_csv

        agg = self.aggregate
        names = list(COLUMNS) + csv_columns(agg.columns)
        cols = [agg.columns[c].tolist() for c in names] + [np.asarray(self.replica, dtype=np.int64).tolist()]
        write_columns_csv(path, agg.req_id, names + ["replica"], cols, fmt=repr)

    def summary(self) -> dict:
        """``aggregate.summary()`` with ``replicas`` (each replica's ``summary()`` or None)
        and ``routing`` (:attr:`routing` plus ``n_replicas``, ``router``, ``kv_pool``
        "local")."""
        s = self.aggregate.summary()
        if self.n_replicas > 1:
            peaks = [r.summary()["internal_fragmentation_share_peak"] for r in self.replicas
                     if r is not None and "internal_fragmentation_share_peak" in r.summary()]
            if peaks:
                s["internal_fragmentation_share_peak"] = max(peaks)
        s["replicas"] = [None if r is None else r.summary() for r in self.replicas]
        s["routing"] = {"n_replicas": self.n_replicas, "router": self.router, "kv_pool": "local", **self.routing}
        return s


def _overlap_s(intervals) -> tuple:
    """Over (start, end, running) intervals of several replicas: the time counted more
    than once in the sum of their busy times, and the most requests running at one time.
    Returns (seconds: float, peak: int)."""
    ev = []
    for a, b, k in intervals:
        if b > a:
            ev.append((a, 1, k))
            ev.append((b, -1, -k))
    ev.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same time
    extra = 0.0
    active = run = peak = 0
    last = None
    for t, d, k in ev:
        if last is not None and active > 1:
            extra += (active - 1) * (t - last)
        active += d
        run += k
        peak = max(peak, run)
        last = t
    return extra, peak


def replay_multi_concurrent(
    trace,
    policies: list,
    cost,
    router: str,
    *,
    arrivals: np.ndarray | None = None,
    config: SchedulerConfig | None = None,
    fast_forward: bool = True,
    progress=None,
    recorders: list | None = None,
    **router_options,
) -> MultiConcurrentResult:
    """Replay *trace* concurrently on ``len(policies)`` replicas behind *router*.

    Parameters
    ----------
    trace : radixkv.trace.Trace
        Requests in replay order.
    policies : list of radixkv.policies.base.PrefixCache
        One FRESH policy instance per replica (each replica's own pool); N = its length.
    cost : radixkv.cost.CostModel
        Prices each replica's steps (the replicas are identical GPUs).
    router : str
        One of :data:`radixkv.replay.routing.ROUTERS`.
    arrivals : np.ndarray of float64, shape (n,), or None
        Arrival times, seconds, non-decreasing (default: the trace's, shifted to 0).
    config : SchedulerConfig or None
        Every replica's scheduler knobs.
    fast_forward : bool
        As :func:`radixkv.replay.concurrent.replay_concurrent`.
    progress : callable or None
        ``progress(done, total)`` after each routed request.
    recorders : list of radixkv.replay.conc_misses.MissRecorder or None
        One per replica (index = replica), told every step of it (the miss-cause
        breakdown, ``--miss-causes``); they change nothing in the replay.
    **router_options
        ``seed``, ``cache_threshold``, ``balance_abs_threshold``, ``balance_rel_threshold``,
        ``max_tree_tokens`` (:class:`~radixkv.replay.routing.Router`; the tree bound
        defaults to one replica's pool, ``policies[0].capacity_tokens``).

    Returns
    -------
    MultiConcurrentResult

    Raises
    ------
    radixkv.errors.ConfigError
        No policy, a policy that models no running requests (``holds_running_kv = False``),
        bad arrivals, a router the trace cannot feed (``session`` without session ids), or a
        request that can never fit a replica's pool.
    """
    N = len(policies)
    if N < 1:
        raise ConfigError("the concurrent multi-replica replay needs ≥ 1 replica", field="replicas")
    for p in policies:
        check_holds_running_kv(p)
        if getattr(type(p), "models_host_tier", False) and getattr(p, "host_capacity", 0) > 0:
            # the replicas' steps do not price host→GPU load backs (replay_concurrent does)
            raise ConfigError(f"{type(p).__name__} with a host tier has no multi-replica concurrent replay "
                              "(its load backs are priced on one replica only): drop --replicas",
                              field="replicas")
    if len({id(p) for p in policies}) != N:
        raise ConfigError("each replica needs its own policy instance", field="replicas")
    config = config or SchedulerConfig(knob_source="radixkv default")
    n = len(trace)
    arrivals = checked_arrivals(trace, arrivals)
    router_options.setdefault("capacity_tokens", policies[0].capacity_tokens)
    ro = Router(trace, N, router, **router_options)
    if COMPILED and not recorders and n:
        eng = _compiled_engines(trace, policies, cost, config, arrivals, fast_forward)
        if eng is not None:
            return _replay_compiled(trace, policies, cost, config, arrivals, eng, ro, progress)
    arr = arrivals.tolist()
    out = step_outputs(n)
    eng = [ReplicaEngine(trace, p, cost, config, arr, r, out, fast_forward=fast_forward)
           for r, p in enumerate(policies)]
    for e, rec in zip(eng, recorders or ()):
        e.recorder = rec
    replica = np.zeros(n, dtype=np.int64)
    load = np.zeros(N, dtype=np.int64)
    inf = math.inf
    for i in range(n + 1):
        a = arr[i] if i < n else inf
        for e in eng:
            while e.now is not None and e.now < a and e.busy_now:
                e.step(a)
        if i == n:
            break
        if ro.needs_load:
            for r, e in enumerate(eng):
                load[r] = e.load_at(a)
        r = ro.choose(i, load)
        eng[r].receive(i, a)
        replica[i] = r
        if progress is not None:
            progress(i + 1, n)
    return _assemble(trace, policies, cost, config, arrivals, eng, out, replica, ro)


def _compiled_engines(trace, policies, cost, config, arrivals, fast_forward):
    """One compiled engine per replica (module docstring, "Compiled replicas"), or None
    when some replica's single-engine replay would not run on a compiled loop. Raises the
    ``ConfigError`` the replicas' Python schedulers raise when built (it builds them)."""
    import radixkv.replay.conc_sglang as conc_sglang
    from radixkv.replay.conc_vllm_fast import CompiledVllmEngine, _eligible
    from radixkv.replay.scheduler import rule_of

    p0 = policies[0]
    if any(type(p) is not type(p0) for p in policies):
        return None
    schs = [make_scheduler(trace, p, config, arrivals) for p in policies]
    if all(conc_sglang.applicable(p, cost, config, None, rule_of(p, config)) for p in policies):
        if not conc_sglang.exact(trace, config):
            return None
        return [conc_sglang.CompiledSglangEngine(trace, p, cost, arrivals, config, fast_forward, replica=True)
                for p in policies]
    if not all(_eligible(trace, p, cost, config, s) for p, s in zip(policies, schs)):
        return None
    return [CompiledVllmEngine(trace, p, cost, config, s, arrivals, fast_forward, replica=True, all_arrivals=arrivals)
            for p, s in zip(policies, schs)]


def _replay_compiled(trace, policies, cost, config, arrivals, eng, ro, progress) -> MultiConcurrentResult:
    """:func:`replay_multi_concurrent` on compiled engines *eng* (module docstring,
    "Compiled replicas")."""
    N, n = len(eng), len(trace)
    arr = arrivals.tolist()
    replica = np.zeros(n, dtype=np.int64)
    rows: list = [[] for _ in range(N)]
    inf = math.inf
    refused = []  # (round, replica, row) of each replica that cannot admit a request into its idle pool

    def route(i, load):
        r = ro.choose(i, load)
        eng[r].give(i)
        rows[r].append(i)
        replica[i] = r
        if progress is not None:
            progress(i + 1, n)

    if not ro.needs_load:  # the routes read no replica state: route all, then run each replica through
        for i in range(n):
            route(i, None)
        for r, e in enumerate(eng):
            if e.advance_to(inf):
                # the Python loop runs the replicas round by round (a round: the steps before
                # one arrival, replicas in index order): the refusal it meets first
                refused.append((int(np.searchsorted(arrivals, e.now, side="right")), r, e.refused_row))
    else:
        load = np.zeros(N, dtype=np.int64)
        for i in range(n + 1):
            a = arr[i] if i < n else inf
            for r, e in enumerate(eng):
                if e.advance_to(a):
                    refused.append((i, r, e.refused_row))
                    break
            if refused or i == n:
                break
            for r, e in enumerate(eng):
                load[r] = e.in_flight_at(a)
            route(i, load)
    if refused:
        _, r, i = min(refused)
        raise ConfigError(
            f"request {str(trace.req_id[i])!r} cannot be admitted into replica {r}'s "
            f"otherwise idle pool ({policies[r].capacity_tokens} tokens)",
            path=trace.name or None, field="num_slots")
    t0 = float(arrivals[0])
    t_end = max((e.now for e, rs in zip(eng, rows) if rs), default=t0)
    full = [e.result(t0, t_end) for e in eng]
    out = {c: np.empty(n, dtype=np.float64) for c in ("admit_s", "first_token_s", "finish_s")}
    out.update({c: np.empty(n, dtype=np.int64) for c in ("admit_step", "finish_step")})
    for r in range(N):
        m = replica == r
        for c in out:
            out[c][m] = full[r].columns[c][m]
    views = [_CompiledView(e, rs, p) for e, rs, p in zip(eng, rows, policies)]
    return _assemble(trace, policies, cost, config, arrivals, views, out, replica, ro, full=full)


class _CompiledView:
    """What :func:`_assemble` reads of a replica (``ReplicaEngine``'s attributes), from a
    compiled engine after its run."""

    def __init__(self, e, rows, policy):
        self.policy = policy
        self.rows = rows
        self.now = e.now if rows else None
        self.acc = e.acc
        self.peak = e.peak
        self.steps = e.steps
        self.intervals = e.intervals


def _assemble(trace, policies, cost, config, arrivals, eng, out, replica, ro, full=None) -> MultiConcurrentResult:
    N, n = len(eng), len(trace)
    t0 = float(arrivals[0]) if n else 0.0
    t_end = max((e.now for e in eng if e.now is not None), default=t0)
    if full is None:
        full = [e.result(config, arrivals, out, t0, t_end) for e in eng]
    step_cols = {c: np.asarray(out[c], dtype=np.int64) for c in ("admit_step", "finish_step")}
    # aggregate: each row's columns from its replica
    cols = {}
    for c in full[0].columns:
        col = full[0].columns[c].copy()
        for r in range(1, N):
            m = replica == r
            col[m] = full[r].columns[c][m]
        cols[c] = col
    cols.update({c: v.copy() for c, v in step_cols.items()})
    extra, peak = _overlap_s([iv for e in eng for iv in e.intervals])
    peak = max([peak] + [e.peak for e in eng])  # a zero-length step still had its requests running
    pool = {"waste_area": sum(e.acc.pool["waste_area"] for e in eng),
            "waste_peak": sum(e.acc.pool["waste_peak"] for e in eng),
            "used_area": sum(e.acc.pool["used_area"] for e in eng),
            "cached_area": sum(e.acc.pool["cached_area"] for e in eng),
            "capacity_tokens": sum(e.acc.pool["capacity_tokens"] for e in eng)}
    # each replica's areas are integrated over ITS busy time, so the shares' mean is over the
    # replicas' busy times weighted by their pools: Σ area_r / Σ (busy_r · capacity_r), not
    # over the union of busy times (a replica idle while another runs would count as empty)
    if pool["capacity_tokens"] > 0:
        cap = pool["capacity_tokens"]  # weights cap_r / cap: one replica's is 1.0, its busy time exactly
        pool["busy_s"] = math.fsum(e.acc.busy * (e.acc.pool["capacity_tokens"] / cap) for e in eng)
        pool["waste_peak_share"] = max(e.acc.pool["waste_peak"] / e.acc.pool["capacity_tokens"] for e in eng
                                       if e.acc.pool["capacity_tokens"] > 0)
    hit = cols["hit_tokens"]
    meta = dict(full[0].meta, n_replicas=N, router=ro.router)
    agg = ConcurrentResult(
        req_id=np.asarray(trace.req_id), columns=cols, duration_s=float(t_end - t0),
        busy_s=float(sum(e.acc.busy for e in eng) - extra), running_area=float(sum(e.acc.area for e in eng)),
        peak_running=int(peak), steps=int(sum(e.steps for e in eng)),
        prefill_flops=float(sum(e.acc.pf_flops for e in eng)),
        prefill_flops_saved=float(np.sum(cost.prefill_flops(hit, 0))) if n else 0.0, pool=pool, meta=meta)
    reps = []
    for r, e in enumerate(eng):
        idx = np.asarray(e.rows, dtype=np.int64)
        if idx.size == 0:
            reps.append(None)
            continue
        res = full[r]
        rc = {c: v[idx] for c, v in res.columns.items()}
        rc.update({c: v[idx] for c, v in step_cols.items()})
        reps.append(ConcurrentResult(
            req_id=np.asarray(trace.req_id)[idx], columns=rc, duration_s=res.duration_s, busy_s=res.busy_s,
            running_area=res.running_area, peak_running=res.peak_running, steps=res.steps,
            prefill_flops=res.prefill_flops, prefill_flops_saved=float(np.sum(cost.prefill_flops(rc["hit_tokens"], 0))),
            pool=res.pool, meta=dict(res.meta, replica=r)))
    per = np.bincount(replica, minlength=N)
    ptok = np.bincount(replica, weights=np.asarray(trace.prompt_len, dtype=np.float64), minlength=N)
    busy = np.asarray([e.acc.busy for e in eng], dtype=np.float64)

    def imb(x):
        return float(x.max() / x.mean()) if n and x.mean() > 0 else None

    routing = {"requests_per_replica": per.tolist(), "prompt_tokens_per_replica": [int(x) for x in ptok],
               "busy_s_per_replica": busy.tolist(), "load_imbalance": imb(per),
               "prompt_token_imbalance": imb(ptok), "busy_imbalance": imb(busy), **ro.stats()}
    return MultiConcurrentResult(aggregate=agg, replicas=reps, replica=replica, n_replicas=N,
                                 router=ro.router, routing=routing)
