"""One replay, either mode, on one engine or on replicas: :class:`ReplaySpec` says what to
replay (trace, policy, pool, mode, knobs) and :func:`run` runs it.

What ``radixkv replay`` and ``compare`` (``--replicas`` and ``--explain`` too),
``radixkv check``, a sweep's cell, the plan's hit bound, :func:`radixkv.replay` (a policy by
name or class) and :mod:`radixkv.testing` call for every (policy, pool) replay. On one
engine the sequential mode is :func:`radixkv.replay.run.run_replay` and the concurrent one
:func:`radixkv.replay.settings.run_concurrent_from_args` on the knobs; the replicas are
:func:`radixkv.replay.routing.replay_replicas` (sequential) and
:func:`radixkv.replay.settings.run_routed_concurrent_result` (concurrent).
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from radixkv.errors import ConfigError
from radixkv.metrics import fill_tier_bytes
from radixkv.policies.registry import PolicySpec, PoolSpec, build_policy
from radixkv.replay.run import compile_seconds, run_replay, warmup
from radixkv.trace.types import Trace

#: the replay modes of :class:`ReplaySpec`
MODES = ("sequential", "concurrent")


@dataclasses.dataclass(frozen=True, eq=False)
class ReplaySpec:
    """One replay: what :func:`run` runs (on the knobs' ``replicas`` when they name some).

    Attributes
    ----------
    trace : radixkv.trace.types.Trace, str or Path
        The requests, in arrival order (a path is read, format detected).
    policy : radixkv.policies.registry.PolicySpec or str
        The policy (a spec text is parsed: :func:`radixkv.policies.registry.parse_policy`);
        a fresh one is built on *pool* for the replay.
    pool : radixkv.policies.registry.PoolSpec
        The pool, in tokens or the engines' own terms
        (:func:`radixkv.replay.pool_settings.pool_for_policy` sizes it from flags).
    mode : {'sequential', 'concurrent'}
        ``sequential``: each request alone, in trace order (the cache study).
        ``concurrent``: arrivals, continuous batching, chunked prefill and preemption on a
        step clock (:func:`radixkv.replay.settings.run_concurrent_from_args`).
    limit : int or None
        Replay only the first *limit* requests.
    knobs : argparse.Namespace, Mapping or None
        The replay's settings by their ``radixkv replay`` flag names (``dest``: ``model``,
        ``gpu``, ``max_model_len``, ``max_num_seqs``, ``arrival``, ``time_scale``,
        ``cost_model``, ...: the flags' destinations, ``max_num_seqs`` for
        ``--max-num-seqs``; :data:`radixkv.replay.settings.KNOBS`); a knob not given has its
        flag's default. On one engine the sequential mode reads the context length
        (``max_model_len``, else ``model``'s) and prices host-tier bytes on ``model``,
        ``tp``, ``kv_cache_dtype``; the routing knobs (``replicas``, ``router``, ...) apply
        to both modes. See :meth:`settings` for how a Mapping meets the pool.
    options : Mapping
        Keywords for the policy's constructor (``{"verify": True}``: ``--verify``; one
        engine only: the replicas build their policies from *policy* alone).
    miss_causes : bool or 'fix'
        Split each prompt's misses by cause (:mod:`radixkv.replay.misses`,
        :mod:`radixkv.replay.conc_misses`); ``'fix'`` also asks what would fix them
        (more replays: ``summary["miss_causes"]["fix"]``).
    measure_last : float or None
        Sequential mode on one engine: the hit metrics over the last share F in (0, 1] of
        the requests (``summary["measure_window"]``).
    quiet : bool
        No progress bar (sequential mode; the concurrent mode reports through
        :func:`run`'s *progress*).
    cost, config, arrivals : objects or None
        Concurrent mode (one engine or replicas; refused in the sequential one), for a
        library caller that holds them: a step-time model
        (:class:`radixkv.cost.CostModel`, :class:`radixkv.clock.CalibratedCostModel`), a
        :class:`radixkv.replay.scheduler.SchedulerConfig` and arrival times (float64
        seconds, shape (n,) or longer: the first ``len(trace.head(limit))`` are used). Each
        given replaces what the knobs describe (``cost_model``/``model``/``gpu``/``tp``...;
        the scheduler knobs; ``arrival``/``time_scale``/``request_rate``...).
    """

    trace: Trace
    policy: PolicySpec
    pool: PoolSpec
    mode: str = "sequential"
    limit: int | None = None
    knobs: object = None
    options: Mapping = dataclasses.field(default_factory=dict)
    miss_causes: bool | str = False
    measure_last: float | None = None
    quiet: bool = True
    cost: object = None
    config: object = None
    arrivals: object = None

    def __post_init__(self):
        """A trace path is read (:func:`radixkv.trace.load.load_trace`), a policy text parsed
        (:func:`radixkv.policies.registry.parse_policy`); the other fields are checked.

        Raises
        ------
        TypeError
            A trace, policy, pool or knobs of another kind.
        radixkv.errors.ConfigError
            A *limit* that is not an int ≥ 0 (field ``limit``), a *mode* not in
            :data:`MODES` (field ``mode``)."""
        if isinstance(self.trace, (str, Path)):
            from radixkv.trace.load import load_trace

            object.__setattr__(self, "trace", load_trace(self.trace))
        if isinstance(self.policy, str):
            from radixkv.policies.registry import parse_policy

            object.__setattr__(self, "policy", parse_policy(self.policy))
        for name, kind in (("trace", Trace), ("policy", PolicySpec), ("pool", PoolSpec)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"ReplaySpec.{name} must be a {kind.__name__}, got "
                                f"{type(getattr(self, name)).__name__}")
        if self.knobs is not None and not isinstance(self.knobs, (Mapping, argparse.Namespace)):
            raise TypeError(f"ReplaySpec.knobs must be a Mapping or an argparse.Namespace, got "
                            f"{type(self.knobs).__name__}")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, (int, np.integer))
                                       or self.limit < 0):
            raise ConfigError(f"limit must be an int ≥ 0 or None, got {self.limit!r}", field="limit")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be 'sequential' or 'concurrent', got {self.mode!r}", field="mode")

    def settings(self) -> argparse.Namespace:
        """:attr:`knobs` as the namespace the replay reads. A namespace is used as given (the
        command line's flags, ``mode`` and the pool size flags included). A Mapping (or None)
        is copied with :attr:`mode` as its ``mode``, and the pool size knobs it lacks
        (``capacity_tokens``, ``num_gpu_blocks``, ``max_total_num_tokens``) are
        :attr:`pool`'s: the replay then sees an explicit pool, as ``radixkv replay
        --capacity-tokens N`` does, and its step budget defaults to
        :data:`radixkv.replay.settings.STEP_DEFAULTS` rather than the engine's on ``gpu``
        (:func:`radixkv.replay.settings.step_defaults`).

        Raises
        ------
        radixkv.errors.ConfigError
            A Mapping key that is no knob of the replay
            (:data:`radixkv.replay.settings.KNOBS`; a misspelt knob would otherwise be
            ignored), or knobs whose ``mode`` is not :attr:`mode` (field ``mode``)."""
        k = self.knobs
        if k is not None and not isinstance(k, Mapping):
            if getattr(k, "mode", self.mode) != self.mode:
                raise ConfigError(f"knobs give mode {k.mode!r} but the ReplaySpec's mode is {self.mode!r}",
                                  field="mode")
            return k
        from radixkv.replay.settings import KNOBS

        for name in (k or {}):
            if name not in KNOBS:
                import difflib

                near = difflib.get_close_matches(str(name), sorted(KNOBS), n=3)
                hint = f"; did you mean {' or '.join(near)}?" if near else ""
                own = " (a ReplaySpec field: give it as ReplaySpec(" + str(name) + "=...))" if name in {
                    f.name for f in dataclasses.fields(self)} else ""
                raise ConfigError(f"knobs: {name!r} is not a knob of the replay{own}{hint} (the knobs are radixkv "
                                  "replay's flag names: radixkv.replay.settings.KNOBS)", field=str(name))
        if k and k.get("mode", self.mode) != self.mode:
            raise ConfigError(f"knobs give mode {k['mode']!r} but the ReplaySpec's mode is {self.mode!r}: "
                              "set the mode once, as ReplaySpec(mode=...)", field="mode")
        ns = argparse.Namespace(**{**(k or {}), "mode": self.mode})
        for f in ("capacity_tokens", "num_gpu_blocks", "max_total_num_tokens"):
            if getattr(ns, f, None) is None:
                setattr(ns, f, getattr(self.pool, f))
        return ns


def run(spec: ReplaySpec, *, progress=None, recorder_factory=None) -> tuple:
    """Run the replay *spec* describes: warm the policy's kernels, build a fresh policy on
    the pool, replay, summarise.

    Parameters
    ----------
    spec : ReplaySpec
    progress : callable or None
        Concurrent mode: ``progress(done, total)`` as requests finish.
    recorder_factory : callable or None
        Concurrent mode with :attr:`ReplaySpec.miss_causes`: builds each engine's miss
        recorder instead of :class:`~radixkv.replay.conc_misses.MissRecorder`,
        ``factory(trace, policy, config)`` on one engine and ``factory(trace, policy,
        config, replica)`` for replicas (``--explain``:
        :class:`~radixkv.replay.conc_explain.ExplainRecorder`).

    Returns
    -------
    (result, summary)
        ``result``: :class:`radixkv.records.Records` (sequential) or
        :class:`radixkv.replay.conc_result.ConcurrentResult` (concurrent). ``summary``: the
        metrics (:func:`radixkv.metrics.summarize`, :meth:`ConcurrentResult.summary`) with
        ``policy`` (the label) and ``timing_s`` (``compile``, ``replay`` and
        ``prompt_tokens_per_s``; seconds and tokens per second), the host-tier byte counts
        priced at the knobs' model (:func:`kv_bytes_per_token`; None without one): what
        ``radixkv replay --json`` writes per result.

    Raises
    ------
    radixkv.errors.ConfigError
        An unknown mode; an empty replay (concurrent, replicas); routing knobs without
        ``replicas``; miss causes or *measure_last* on the sequential replicas; what the
        policy, the pool or the replay refuse (a request larger than the pool, a bad knob).
    """
    knobs = spec.settings()
    from radixkv.replay.context import resolve_max_model_len
    from radixkv.replay.settings import routed

    on_replicas = routed(knobs)  # also refuses routing knobs without replicas
    if spec.mode == "sequential":
        given = [f for f in ("cost", "config", "arrivals") if getattr(spec, f) is not None]
        if given:
            raise ConfigError(f"{given[0]} prices or schedules the concurrent replay: the sequential one has no "
                              "clock (drop it, or mode='concurrent')", field=given[0])
    if spec.mode == "sequential" and not on_replicas:
        miss = {"miss_causes": spec.miss_causes} if spec.miss_causes else {}
        rec, summ = run_replay(spec.trace, spec.policy, spec.pool, limit=spec.limit, quiet=spec.quiet,
                               **spec.options, **miss,
                               max_model_len=resolve_max_model_len(getattr(knobs, "model", None),
                                                                   getattr(knobs, "max_model_len", None)),
                               measure_last=spec.measure_last)
        return rec, fill_tier_bytes(summ, kv_bytes_per_token(knobs))
    if spec.measure_last is not None:
        raise ConfigError("measure_last is a metric of the one-pool sequential replay (each request alone, in trace "
                          "order)", field="measure_last")
    if spec.miss_causes and spec.mode == "sequential":
        raise ConfigError("miss causes with replicas need mode 'concurrent' (the sequential replicas' causes are not "
                          "modelled)", field="miss_causes")
    trace = spec.trace.head(spec.limit)
    if len(trace) == 0:
        raise ConfigError("no requests to replay (empty trace or --limit 0)", path=trace.name or None, field="limit")
    if on_replicas:
        res, summ = _routed(spec, knobs, recorder_factory)
    else:
        res, summ = _one_engine(spec, knobs, trace, progress, recorder_factory)
    if spec.miss_causes == "fix" and "miss_causes" in summ:
        from radixkv.replay.misses import what_would_fix_concurrent

        def run_at(s, c):  # the same replay at capacity c tokens, with the causes and no fix
            return run(dataclasses.replace(spec, policy=s, pool=PoolSpec(capacity_tokens=int(c)),
                                           miss_causes=True))[1]

        t0 = time.perf_counter()
        cap = int(build_policy(spec.policy, spec.pool, unit_tokens=trace.unit_tokens).capacity_tokens)
        summ["miss_causes"]["fix"] = what_would_fix_concurrent(spec.policy, cap, summ, run_at)
        summ["timing_s"]["miss_fix"] = time.perf_counter() - t0
    return res, fill_tier_bytes(summ, kv_bytes_per_token(knobs))


def _one_engine(spec: ReplaySpec, knobs, trace: Trace, progress, recorder_factory=None) -> tuple:
    """The concurrent replay on one engine: (ConcurrentResult, summary without host-tier bytes)."""
    from radixkv.replay.settings import run_concurrent_from_args

    compile_s = warmup(spec.policy, lean=trace.unit_tokens == 1) or compile_seconds(spec.policy)
    policy = build_policy(spec.policy, spec.pool, unit_tokens=trace.unit_tokens, **spec.options)
    t0 = time.perf_counter()
    arr = None if spec.arrivals is None else np.asarray(spec.arrivals, dtype=np.float64)[: len(trace)]
    res = run_concurrent_from_args(trace, policy, knobs, progress=progress,
                                   miss_spec=spec.policy if spec.miss_causes else None,
                                   recorder_factory=recorder_factory, cost=spec.cost, config=spec.config,
                                   arrivals=arr)
    elapsed = time.perf_counter() - t0
    summ = {"policy": spec.policy.label, **res.summary()}
    summ["timing_s"] = {"compile": compile_s, "replay": elapsed,
                        "prompt_tokens_per_s": summ["prompt_tokens"] / elapsed if elapsed > 0 else None}
    return res, summ


def _routed(spec: ReplaySpec, knobs, recorder_factory=None) -> tuple:
    """The knobs' ``replicas`` replicas behind their ``router``, each a fresh policy on the
    pool (:func:`run` has checked the routing knobs: :func:`radixkv.replay.settings.routed`).

    Concurrent mode: the replicas on one clock
    (:func:`radixkv.replay.settings.run_routed_concurrent_result`); result the
    :class:`~radixkv.replay.multi_concurrent.MultiConcurrentResult`, summary its aggregate.
    Sequential mode: :func:`radixkv.replay.routing.replay_replicas` (``kv_pool`` local or
    global); result its dict, summary the aggregate metrics (those that do not add up over
    pools absent) with ``replicas`` (each replica's summary, host-tier bytes priced) and
    ``routing``. Both summaries' ``policy`` is ``"<label> x<N> <router>"``."""
    from radixkv.replay.settings import routing_knobs, run_routed_concurrent_result

    label = spec.policy.label
    if spec.mode == "concurrent":
        t = spec.trace.head(spec.limit)
        res, _, compile_s, el = run_routed_concurrent_result(
            t, spec.policy, spec.pool, knobs, recorder_factory=recorder_factory, miss_causes=bool(spec.miss_causes),
            cost=spec.cost, config=spec.config,
            arrivals=None if spec.arrivals is None else np.asarray(spec.arrivals, dtype=np.float64)[: len(t)])
        summ = {"policy": f"{label} x{res.n_replicas} {res.router}", **res.summary()}
        summ["timing_s"] = {"compile": compile_s, "replay": el,
                            "prompt_tokens_per_s": summ["prompt_tokens"] / el if el > 0 else None}
        return res, summ
    import radixkv.replay.routing as R
    from radixkv.replay.context import apply_context_limit, engine_of, resolve_max_model_len

    # requests past the model's context: refused before routing (radixkv/replay/context.py)
    limit = spec.limit
    trace, ctx = apply_context_limit(spec.trace.head(limit), resolve_max_model_len(
        getattr(knobs, "model", None), getattr(knobs, "max_model_len", None)), engine_of(spec.policy))
    if ctx is not None:
        limit = None
    rk = routing_knobs(knobs)
    window = getattr(knobs, "router_load_window", None)
    t0 = time.perf_counter()
    res = R.replay_replicas(trace, spec.policy, spec.pool, int(knobs.replicas), rk["router"],
                            global_pool=getattr(knobs, "kv_pool", "local") == "global", limit=limit, quiet=spec.quiet,
                            seed=rk["seed"], load_window_s=R.LOAD_WINDOW_S if window is None else window,
                            cache_threshold=rk["cache_threshold"], balance_abs_threshold=rk["balance_abs_threshold"],
                            balance_rel_threshold=rk["balance_rel_threshold"], max_tree_tokens=rk["max_tree_tokens"])
    el = time.perf_counter() - t0
    bpt = kv_bytes_per_token(knobs)
    summ = dict(res["aggregate"])  # host-tier totals over replicas: priced by run()
    summ["policy"] = f"{label} x{res['n_replicas']} {res['router']} ({res['kv_pool']})"
    reps, rep_timing = [], []
    for r in res["replicas"]:
        if r is not None:
            r = fill_tier_bytes(dict(r), bpt)
            rep_timing.append(r.pop("timing_s"))
        reps.append(r)
    summ["replicas"] = reps
    summ["routing"] = {"n_replicas": res["n_replicas"], "router": res["router"], "kv_pool": res["kv_pool"],
                       **res["routing"]}
    summ["timing_s"] = {"compile": 0.0, "replay": el, "replicas": rep_timing,
                        "prompt_tokens_per_s": summ["prompt_tokens"] / el if el > 0 else None}
    if ctx is not None:
        summ["rejected_requests"] = ctx.rejected_requests
    return res, summ


def kv_bytes_per_token(knobs) -> int | None:
    """KV bytes per token per TP rank of the knobs' ``model`` (a preset name or a
    :class:`~radixkv.memory.specs.ModelSpec`) at their ``tp`` and ``kv_cache_dtype``
    (:meth:`radixkv.memory.specs.ModelSpec.kv_bytes_per_token`); None without a model. What
    the host-tier byte counts of a summary are priced at
    (:func:`radixkv.metrics.fill_tier_bytes`)."""
    model = getattr(knobs, "model", None)
    if model is None:
        return None
    from radixkv.memory.presets import get_model

    m = get_model(model) if isinstance(model, str) else model
    return int(m.kv_bytes_per_token(int(getattr(knobs, "tp", 1) or 1), getattr(knobs, "kv_cache_dtype", None)))
