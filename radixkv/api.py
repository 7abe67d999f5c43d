"""The library calls behind the command line: replay a trace through a policy, summarise.

``radixkv.replay`` runs either replay mode behind one call; ``radixkv.summarize`` turns
either result into the summary dict the CLI prints and writes::

    import radixkv

    trace = radixkv.load_trace("traces/demo.jsonl")
    rec = radixkv.replay(trace, "vllm:16", capacity_tokens=20_000)
    print(radixkv.format_table([radixkv.summarize(rec)], timing=False))
    res = radixkv.replay(trace, "sglang:1", capacity_tokens=20_000, mode="concurrent",
                         model="Llama-3.1-8B", gpu="A100-80GB")
    print(radixkv.summarize(res)["ttft_p50_s"])
"""
from __future__ import annotations

from pathlib import Path

from radixkv.errors import ConfigError

__all__ = ["replay", "summarize"]


def _spec_of(policy, pool_kw: dict):
    """(the PolicySpec of *policy* — a class, a spec text or a PolicySpec —, the one pool
    size given in *pool_kw*)."""
    from radixkv.policies.base import PrefixCache
    from radixkv.policies.registry import PolicySpec, parse_policy

    given = {k: v for k, v in pool_kw.items() if v is not None}
    if len(given) != 1:
        raise ConfigError("give exactly one pool size: capacity_tokens, num_gpu_blocks or max_total_num_tokens",
                          field="capacity")
    if isinstance(policy, type) and issubclass(policy, PrefixCache):
        spec = PolicySpec(policy.name, policy.default_size if policy.size_name in ("block_size", "page_size")
                          else None, policy.default_option, policy, policy.name)
    elif isinstance(policy, PolicySpec):
        spec = policy
    elif isinstance(policy, str):
        spec = parse_policy(policy)
    else:
        raise TypeError(f"policy must be a PrefixCache, its class, a spec text or a PolicySpec, got {policy!r}")
    return spec, given


def replay(
    trace,
    policy,
    *,
    capacity_tokens: int | None = None,
    num_gpu_blocks: int | None = None,
    max_total_num_tokens: int | None = None,
    mode: str = "sequential",
    cost=None,
    model=None,
    gpu=None,
    config=None,
    arrivals=None,
    limit: int | None = None,
    quiet: bool = True,
    miss_causes: bool = False,
    max_model_len: int | None = None,
):
    """Replay *trace* through *policy*, one request at a time or concurrently.

    Parameters
    ----------
    trace : radixkv.trace.Trace, str or Path
        The trace, or a path :func:`radixkv.load_trace` reads (format detected).
    policy : PrefixCache, PrefixCache subclass, str or PolicySpec
        A fresh policy instance (then give no pool size), or what to build on the pool:
        a class, a spec the command line accepts (``"vllm:16"``, ``"sglang:1@lfu"``,
        ``"package.module:Class:16"``) or a parsed spec.
    capacity_tokens, num_gpu_blocks, max_total_num_tokens : int or None
        The pool, exactly one (usable tokens; vLLM's blocks with block 0 reserved;
        SGLang's tokens) unless *policy* is an instance.
    mode : {'sequential', 'concurrent'}
        ``sequential``: each request alone, in trace order (the cache study).
        ``concurrent``: arrivals, continuous batching, chunked prefill and preemption,
        priced by *cost* (:func:`radixkv.replay.concurrent.replay_concurrent`).
    cost : radixkv.cost.CostModel, radixkv.clock.CalibratedCostModel, str or None
        Step pricing of the concurrent mode; or give *model* and *gpu* (preset names or
        specs, :meth:`radixkv.cost.CostModel.from_specs`). A string picks the kind on
        *model* and *gpu*: ``"roofline"``, ``"fitted"``, ``"profiled"`` or a profile
        JSON path (:func:`radixkv.clock.cost_model`, docs/clock.md).
    config : radixkv.replay.scheduler.SchedulerConfig or None
        Scheduler knobs of the concurrent mode (default: 8192 tokens / 256 requests per
        step, as ``radixkv replay`` on an explicit pool,
        :data:`radixkv.replay.settings.STEP_DEFAULTS`; the admission rule from the policy
        class's ``admission_rule``).
    arrivals : np.ndarray (float64, shape (n,), seconds) or None
        Arrival times of the concurrent mode (default: the trace's).
    limit : int or None
        Replay only the first *limit* requests.
    quiet : bool
        No progress bar (sequential mode).
    max_model_len : int or None
        Context length in tokens (default: *model*'s ``max_position_embeddings`` when
        *model* is given, else no limit). Requests the policy's engine refuses for it are
        not served and outputs are capped (:mod:`radixkv.replay.context`); the result's
        ``meta["rejected_requests"]`` and summary ``rejected_requests`` count them.
    miss_causes : bool
        Sequential mode: split every request's prompt into hit and misses by cause
        (:mod:`radixkv.replay.misses`; adds its columns to the records and
        ``miss_causes`` to :func:`summarize`). Needs *policy* as a class, spec text or
        PolicySpec (the capacity shadow builds a second instance).

    Returns
    -------
    radixkv.records.Records (sequential) or
    radixkv.replay.concurrent.ConcurrentResult (concurrent)
        Per-request columns; pass to :func:`summarize`.

    Raises
    ------
    radixkv.errors.ConfigError
        On an unknown policy, a missing or doubled pool size, a concurrent replay without
        a cost model, or a request larger than the pool.
    radixkv.errors.TraceFormatError
        When *trace* is a path that cannot be read.
    """
    from radixkv.trace.types import Trace

    if isinstance(trace, (str, Path)):
        from radixkv.trace.load import load_trace

        trace = load_trace(trace)
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a Trace or a path, got {type(trace).__name__}")
    if mode not in ("sequential", "concurrent"):
        raise ConfigError(f"mode must be 'sequential' or 'concurrent', got {mode!r}", field="mode")
    from radixkv.policies.base import PrefixCache

    sizes = {"capacity_tokens": capacity_tokens, "num_gpu_blocks": num_gpu_blocks,
             "max_total_num_tokens": max_total_num_tokens}
    if miss_causes and (mode != "sequential" or isinstance(policy, PrefixCache)):
        raise ConfigError("miss_causes needs the sequential mode and the policy as a class, spec text or PolicySpec "
                          "(not a built instance)", field="miss_causes")
    if not isinstance(policy, PrefixCache):
        # the library's one replay (radixkv.replay.spec.run), as radixkv replay runs it
        from radixkv.policies.registry import PoolSpec
        from radixkv.replay.spec import ReplaySpec, run

        spec, given = _spec_of(policy, sizes)
        knobs = {"model": model, "gpu": gpu, "max_model_len": max_model_len}
        if mode == "sequential":
            rec, _ = run(ReplaySpec(trace, spec, PoolSpec(**given), limit=limit, quiet=quiet, knobs=knobs,
                                    miss_causes=bool(miss_causes)))
            rec.meta["kv_bytes_per_token"] = _kv_bytes_per_token(model, cost)
            return rec
        cost = _cost_of(cost, model, gpu)
        from radixkv.replay.scheduler import SchedulerConfig

        res, _ = run(ReplaySpec(trace, spec, PoolSpec(**given), mode="concurrent", limit=limit, knobs=knobs,
                                cost=cost, config=config or SchedulerConfig(knob_source="radixkv default"),
                                arrivals=arrivals))
        res.meta["policy"] = spec.label
        res.meta["kv_bytes_per_token"] = _kv_bytes_per_token(model, cost)
        return res
    # a built instance (e.g. a policy class of one's own, configured by hand): replayed as given
    given = [k for k, v in sizes.items() if v is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} sizes a pool, but the policy given is already built on one",
                          field=given[0])
    pol, label = policy, getattr(policy, "label", None) or policy.name
    from radixkv.replay.context import apply_context_limit, engine_of, record, resolve_max_model_len

    full = trace.head(limit)
    trace, ctx = apply_context_limit(full, resolve_max_model_len(model, max_model_len), engine_of(pol))
    if trace is not full:
        limit = None
        if arrivals is not None and ctx.rejected_ids:
            import numpy as np

            arrivals = np.asarray(arrivals)[: len(full)][np.isin(full.req_id, np.asarray(ctx.rejected_ids,
                                                                                          dtype=full.req_id.dtype),
                                                                 invert=True)]
    if mode == "sequential":
        from radixkv.replay.sequential import replay_sequential

        rec = replay_sequential(trace, pol, limit=limit, quiet=quiet, label=label)
        rec.meta["evictions"] = int(pol.evictions)
        rec.meta["kv_bytes_per_token"] = _kv_bytes_per_token(model, cost)
        record(rec.meta, ctx)
        return rec
    from radixkv.replay.concurrent import replay_concurrent

    cost = _cost_of(cost, model, gpu)
    res = replay_concurrent(trace.head(limit), pol, cost, arrivals=arrivals, config=config)
    res.meta["policy"] = label
    res.meta["kv_bytes_per_token"] = _kv_bytes_per_token(model, cost)
    record(res.meta, ctx)
    return res


def _cost_of(cost, model, gpu):
    """The step-time model of a concurrent :func:`replay`: *cost* when it is one; a kind
    (``"roofline"``, ``"fitted"``, ``"profiled"``, a profile path) built on *model* and
    *gpu* (:func:`radixkv.clock.cost_model`); None: the roofline on them
    (:meth:`radixkv.cost.CostModel.from_specs`).

    Raises
    ------
    radixkv.errors.ConfigError
        A kind or None without *model* and *gpu* (field ``model`` or ``gpu``).
    """
    if isinstance(cost, str):
        if model is None or gpu is None:
            raise ConfigError(f"cost={cost!r} is built on a model and a GPU: give model= and gpu=",
                              field="model" if model is None else "gpu")
        from radixkv.clock.calibrated import cost_model

        return cost_model(cost, model, gpu)
    if cost is None:
        if model is None or gpu is None:
            raise ConfigError("the concurrent mode prices each step: give cost=CostModel(...) or model= and gpu=",
                              field="model" if model is None else "gpu")
        from radixkv.cost import CostModel

        return CostModel.from_specs(model, gpu)
    return cost


def _kv_bytes_per_token(model, cost) -> int | None:
    """KV bytes per token per TP rank of *model* (a preset name or a ModelSpec; None: no
    model given, None) at the cost model's ``tp`` and KV dtype when it has them: what the
    host-tier byte counts of :func:`summarize` are priced at, as the CLI's ``--model``."""
    from types import SimpleNamespace

    from radixkv.replay.spec import kv_bytes_per_token

    return kv_bytes_per_token(SimpleNamespace(model=model, tp=getattr(cost, "tp", 1),
                                              kv_cache_dtype=getattr(cost, "kv_cache_dtype", None)))


def summarize(result, *, evictions: int | None = None, measure_last: float | None = None) -> dict:
    """Summary metrics of a replay, as the CLI prints and writes them.

    Parameters
    ----------
    result : Records or ConcurrentResult
        What :func:`replay` returned (or :func:`~radixkv.replay.sequential.replay_sequential`
        / :func:`~radixkv.replay.concurrent.replay_concurrent`).
    evictions : int or None
        Eviction events of the policy (sequential; default the count :func:`replay` kept).
    measure_last : float or None
        Sequential replays: also the hit metrics over the last share F in (0, 1] of the
        requests, under ``measure_window`` (:func:`radixkv.metrics.window_summary`; 0.5 is
        kvcache-simulator's convention, hit rate over the last 50 % of requests). None
        (default): no window; the other keys never change with it.

    Returns
    -------
    dict
        ``policy`` (the label) and the metrics of :func:`radixkv.metrics.summarize`
        (sequential) or :meth:`ConcurrentResult.summary` (concurrent); plain Python
        numbers, deterministic.

    Raises
    ------
    radixkv.errors.ConfigError
        A *measure_last* outside (0, 1], or given for a concurrent result.
    TypeError
        When *result* is not what :func:`replay` returns.
    """
    from radixkv.records import Records

    from radixkv.metrics import fill_tier_bytes

    if isinstance(result, Records):
        from radixkv.metrics import summarize as _summarize

        ev = result.meta.get("evictions") if evictions is None else evictions
        out = _summarize(result, evictions=ev, measure_last=measure_last)
        return fill_tier_bytes(out, result.meta.get("kv_bytes_per_token"))
    if measure_last is not None:
        raise ConfigError("measure_last is a metric of the sequential replay (each request alone, in trace order); "
                          "a concurrent result has none", field="measure_last")
    if hasattr(result, "summary"):
        out = {"policy": result.meta.get("policy"), **result.summary()}
        return fill_tier_bytes(out, result.meta.get("kv_bytes_per_token"))
    raise TypeError(f"cannot summarise a {type(result).__name__}: give what radixkv.replay returned")
