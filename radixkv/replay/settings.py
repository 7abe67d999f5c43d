"""The concurrent replay a settings object describes (the library side of ``radixkv replay
--mode concurrent`` and ``--replicas``).

A *settings* object is anything with the destinations of ``radixkv replay``'s flags as
attributes: an :class:`argparse.Namespace` the command line parsed
(:mod:`radixkv.cli.concurrent_args` and :mod:`radixkv.cli.routing_args` define the flags),
or one a sweep cell builds from its settings dict (:func:`radixkv.sweep.cell.replay_cell`).
A missing attribute takes the flag's default, except the routing ones that
:func:`routed` and :func:`run_routed_concurrent_result` read (``replicas``, ``router``,
``kv_pool``, ``router_load_window``, ``router_seed``, ``cache_threshold``,
``balance_abs_threshold``, ``balance_rel_threshold``, ``max_tree_tokens``, ``limit``).
Messages name the command-line flags (a sweep grid names its key, from the error's
``field``).

- :func:`concurrent_config_from_args`  the scheduler's knobs
  (:class:`~radixkv.replay.scheduler.SchedulerConfig`); :func:`step_defaults` those not
  given (the engine's on the GPU when the pool is sized on it, else 8192 tokens / 256).
- :func:`cost_model_from_args`  the step-time model (:mod:`radixkv.clock.calibrated`).
- :func:`policy_from_args`  the policy, or ``NoCache`` / ``StaticReservedCache`` on its pool.
- :func:`run_concurrent_from_args`  one engine's concurrent replay.
- :func:`routed`, :func:`run_routed_concurrent_result`  several replicas on one clock.
"""
from __future__ import annotations

import time

import numpy as np

from radixkv.errors import ConfigError
from radixkv.replay.scheduler import SchedulerConfig


#: the scheduler's step knobs when the pool is not sized on a GPU (``--capacity-tokens``,
#: ``--num-gpu-blocks``, ``--max-total-num-tokens``, ``--pool-from-log``):
#: ``(max_num_batched_tokens, max_num_seqs)``: :class:`SchedulerConfig`'s own (8192, 256)
STEP_DEFAULTS = (SchedulerConfig.max_num_batched_tokens, SchedulerConfig.max_num_seqs)


#: the knobs a replay reads from its settings (``radixkv replay``'s flag destinations), what
#: :class:`radixkv.replay.spec.ReplaySpec` accepts as a Mapping's keys: the concurrent
#: replay's (scheduler, arrivals, step time, caching), the model and GPU it is priced on,
#: the pool size flags the step defaults read, and the replicas' routing
KNOBS = frozenset({
    # model, GPU, context (radixkv.cost, radixkv.replay.context)
    "model", "gpu", "tp", "kv_cache_dtype", "max_model_len",
    # the pool as the flags gave it (step_defaults: a pool sized on the GPU or an explicit one)
    "capacity_tokens", "num_gpu_blocks", "max_total_num_tokens", "pool_from_log",
    # the scheduler (concurrent_config_from_args)
    "admission", "max_num_batched_tokens", "max_num_seqs", "schedule_policy", "enable_chunked_prefill",
    "long_prefill_token_threshold", "watermark", "scheduling_policy", "enable_priority_scheduling",
    "schedule_low_priority_values_first", "disable_priority_preemption", "retraction_policy",
    # arrivals (radixkv.replay.arrivals), step time (cost_model_from_args), caching (policy_from_args)
    "arrival", "time_scale", "request_rate", "burstiness", "seed", "cost_model", "mfu", "mbu", "step_overhead_s",
    "request_intake_s", "host_link", "enable_prefix_caching", "static_reserved_fraction", "timeline",
    # replicas (routed, routing_knobs)
    "replicas", "router", "kv_pool", "router_seed", "router_load_window", "cache_threshold",
    "balance_abs_threshold", "balance_rel_threshold", "max_tree_tokens",
    "mode",
})


def _rule_of_policy(policy) -> str:
    if policy is None:
        return "vllm"
    from radixkv.replay.scheduler import admission_rule_of

    return admission_rule_of(policy)


def step_defaults(args, rule: str) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` of a concurrent replay under scheduler
    *rule* (``"vllm"`` or ``"sglang"``) when ``--max-num-batched-tokens`` /
    ``--max-num-seqs`` are not given: the one place that decides them for ``replay``,
    ``compare``, ``curve`` and sweep cells (:func:`step_knobs` also says where each came
    from).

    - The pool sized by the memory model on ``--model``/``--gpu`` (no explicit pool size,
      no ``--pool-from-log``): what the engine's server runs with on that GPU
      (:func:`radixkv.memory.engine_batch_defaults`, the values ``radixkv plan`` starts
      from). vLLM rules: both knobs (``vllm/engine/arg_utils.py ::
      EngineArgs.get_batch_defaults``: 2048 / 256 on an A100 or a GPU under 70 GiB,
      8192 / 1024 on an H100/H200 class, 16384 / 1024 at ≥ 160 GiB). SGLang rules: the
      token budget is SGLang's ``chunked_prefill_size`` on the GPU
      (``arg_groups/memory_hook.py :: handle_gpu_memory_settings``), which is the
      ``rem_chunk_tokens`` budget of ``PrefillAdder`` that :mod:`radixkv.replay.sched_sglang`
      models; ``max_num_seqs`` is SGLang's ``max_running_requests`` left unset, **assumed**
      2048 (:data:`radixkv.memory.engine_defaults.SGLANG_DEFAULT_MAX_RUNNING_REQUESTS`:
      SGLang derives it from the pool and the context length, 2048 to 4096).
    - Otherwise :data:`STEP_DEFAULTS` (8192 tokens, 256 requests).

    Raises
    ------
    radixkv.errors.InputError
        An unknown GPU name (field ``gpu``), when the pool is sized on it.
    """
    from radixkv.replay.pool_settings import pool_sized_by_model

    if not pool_sized_by_model(args):
        return STEP_DEFAULTS
    from radixkv.memory import engine_batch_defaults

    d = engine_batch_defaults("sglang" if rule == "sglang" else "vllm", args.gpu)
    return d["max_num_batched_tokens"], d["max_num_seqs"]


#: ``source`` of :func:`step_knobs` when the user gave a knob
SOURCE_GIVEN = "given"
#: ``source`` of :func:`step_knobs` for :data:`STEP_DEFAULTS` (an explicit pool)
SOURCE_RADIXKV = "radixkv default"


def engine_default_source(gpu) -> str:
    """The ``source`` wording of a knob :func:`step_defaults` took from the engine on *gpu*:
    ``"engine default for <GPU preset name>"``.

    Raises
    ------
    radixkv.errors.InputError
        An unknown GPU name (field ``gpu``).
    """
    from radixkv.memory.presets import get_gpu

    return f"engine default for {get_gpu(gpu).name}"


def step_knobs(args, rule: str) -> tuple[int, int, str]:
    """``(max_num_batched_tokens, max_num_seqs, source)``: the step knobs a concurrent
    replay under *rule* runs with (the flags when given, else :func:`step_defaults`) and
    where they came from, as the outputs report it (``scheduler.source``):

    - ``"given"``: both flags given;
    - ``"engine default for <GPU>"``: neither given, the engine's own on the GPU the pool is
      sized on (under SGLang's rules ``max_num_seqs`` is assumed: the wording adds
      ``"; max_num_seqs assumed"``);
    - ``"radixkv default"``: neither given, :data:`STEP_DEFAULTS` (an explicit pool);
    - one given: ``"max_num_batched_tokens given, max_num_seqs <default source>"`` (or the
      other way round; ``", assumed"`` after SGLang's assumed ``max_num_seqs``).

    Raises
    ------
    radixkv.errors.InputError
        An unknown GPU name (field ``gpu``), when the pool is sized on it.
    """
    from radixkv.replay.pool_settings import pool_sized_by_model

    mnbt, seqs = getattr(args, "max_num_batched_tokens", None), getattr(args, "max_num_seqs", None)
    if mnbt is not None and seqs is not None:
        return int(mnbt), int(seqs), SOURCE_GIVEN
    d_mnbt, d_seqs = step_defaults(args, rule)
    dflt = engine_default_source(args.gpu) if pool_sized_by_model(args) else SOURCE_RADIXKV
    assumed = dflt != SOURCE_RADIXKV and rule == "sglang"  # SGLang's max_running_requests: assumed
    if mnbt is None and seqs is None:
        return int(d_mnbt), int(d_seqs), dflt + ("; max_num_seqs assumed" if assumed else "")
    if mnbt is None:
        return int(d_mnbt), int(seqs), f"max_num_seqs given, max_num_batched_tokens {dflt}"
    return int(mnbt), int(d_seqs), (f"max_num_batched_tokens given, max_num_seqs {dflt}"
                                    + (", assumed" if assumed else ""))


def check_step_knobs(args, rule: str, max_num_batched_tokens: int, max_num_seqs: int) -> None:
    """Refuse, under vLLM's rules, a step token budget below the running-request cap: vLLM
    refuses to start with ``max_num_batched_tokens < max_num_seqs`` (every running request
    needs at least one token per step; ``vllm/config/scheduler.py ::
    SchedulerConfig.verify_max_model_len``, called from ``SchedulerConfig.__post_init__``).
    The values are the effective ones (after :func:`step_defaults`); SGLang has no such
    check and is not refused.

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the flag(s) the user gave (field: ``max_num_batched_tokens`` when it was
        given, else ``max_num_seqs``).
    """
    if rule == "sglang" or int(max_num_batched_tokens) >= int(max_num_seqs):
        return
    from radixkv.replay.pool_settings import pool_sized_by_model

    given_t = getattr(args, "max_num_batched_tokens", None) is not None
    given_s = getattr(args, "max_num_seqs", None) is not None
    dflt = engine_default_source(args.gpu) if pool_sized_by_model(args) else SOURCE_RADIXKV
    t = (f"--max-num-batched-tokens {max_num_batched_tokens}" if given_t
         else f"max_num_batched_tokens {max_num_batched_tokens} ({dflt})")
    q = f"--max-num-seqs {max_num_seqs}" if given_s else f"max_num_seqs {max_num_seqs} ({dflt})"
    fix = ("raise --max-num-batched-tokens or lower --max-num-seqs" if given_t and given_s
           else "raise --max-num-batched-tokens" if given_t and not given_s
           else "lower --max-num-seqs or give --max-num-batched-tokens")
    raise ConfigError(f"{t} is below {q}: vLLM refuses max_num_batched_tokens < max_num_seqs (every running "
                      f"request takes at least one token a step; vllm/config/scheduler.py :: SchedulerConfig); "
                      f"{fix}", field="max_num_batched_tokens" if given_t else "max_num_seqs")


def concurrent_config_from_args(args, policy=None, *, rule: str | None = None):
    """The :class:`~radixkv.replay.scheduler.SchedulerConfig` the flags describe.

    ``--max-num-batched-tokens`` and ``--max-num-seqs`` when given, else
    :func:`step_defaults` under the replay's rule: *rule* when given, else ``--admission``,
    else the policy's (vLLM's without a policy). The config's ``knob_source`` says where
    the two came from (:func:`step_knobs`).

    Without ``--admission``, the policy class's ``admission_rule`` decides
    (:func:`radixkv.replay.scheduler.admission_rule_of`): SGLang's rules for
    ``RadixCache``, whose admission leaves the whole-prompt check to SGLang's budget,
    vLLM's for every other policy.

    Raises
    ------
    radixkv.errors.ConfigError
        A knob out of range (:class:`SchedulerConfig`), or, under vLLM's rules,
        ``max_num_batched_tokens < max_num_seqs`` (:func:`check_step_knobs`).
    radixkv.errors.InputError
        An unknown GPU name, when the pool is sized on it.
    """
    admission = getattr(args, "admission", None)
    rule = rule or admission or _rule_of_policy(policy)
    mnbt, seqs, source = step_knobs(args, rule)
    cfg = SchedulerConfig(
        max_num_seqs=int(seqs),
        max_num_batched_tokens=int(mnbt),
        schedule_policy=getattr(args, "schedule_policy", "fcfs"),
        admission=admission,
        enable_chunked_prefill=bool(getattr(args, "enable_chunked_prefill", True)),
        long_prefill_token_threshold=int(getattr(args, "long_prefill_token_threshold", 0) or 0),
        watermark=float(getattr(args, "watermark", 0.0) or 0.0),
        scheduling_policy=getattr(args, "scheduling_policy", "fcfs") or "fcfs",
        enable_priority_scheduling=bool(getattr(args, "enable_priority_scheduling", False)),
        schedule_low_priority_values_first=bool(getattr(args, "schedule_low_priority_values_first", False)),
        disable_priority_preemption=bool(getattr(args, "disable_priority_preemption", False)),
        retraction_policy=getattr(args, "retraction_policy", "length") or "length",
        knob_source=source,
    )
    check_step_knobs(args, rule, mnbt, seqs)
    return cfg


#: scheduler knobs (flag destinations and defaults) that only vLLM's rules read; SGLang's
#: refuse them (:func:`radixkv.replay.scheduler.rule_of`)
VLLM_ONLY_KNOBS = {"scheduling_policy": "fcfs", "enable_chunked_prefill": True, "long_prefill_token_threshold": 0,
                   "watermark": 0.0}
#: scheduler knobs that only SGLang's rules read (``--enable-priority-scheduling`` and the
#: flags that need it, :class:`radixkv.replay.scheduler.SchedulerConfig`)
SGLANG_ONLY_KNOBS = {"enable_priority_scheduling": False, "schedule_low_priority_values_first": False,
                     "disable_priority_preemption": False, "retraction_policy": "length"}


def args_for_rule(args, rule: str, rules) -> object:
    """The flags as one policy of a comparison reads them.

    *rule* is the policy's scheduler rule (``"vllm"`` or ``"sglang"``), *rules* those of
    every policy compared. When *rules* holds both, each engine's own scheduler knobs
    (:data:`VLLM_ONLY_KNOBS`, :data:`SGLANG_ONLY_KNOBS`) apply to its policies only: a copy
    of *args* with the other engine's knobs at their defaults is returned, so ``compare
    --policies vllm:16,sglang:1 --scheduling-policy priority --enable-priority-scheduling``
    runs each engine's priority scheduler. Otherwise *args* itself (a knob the policies'
    engine does not read is then refused by :func:`radixkv.replay.scheduler.rule_of`)."""
    if len(set(rules)) < 2:
        return args
    import copy

    view = copy.copy(args)
    for dest, default in (SGLANG_ONLY_KNOBS if rule == "vllm" else VLLM_ONLY_KNOBS).items():
        if hasattr(view, dest):
            setattr(view, dest, default)
    return view


def cost_model_from_args(args):
    """The step-time model of ``--cost-model`` (:func:`radixkv.clock.calibrated.cost_model`;
    default the roofline :class:`~radixkv.cost.CostModel`) on
    ``--model``/``--gpu``/``--tp``/``--kv-cache-dtype``.

    Raises
    ------
    radixkv.errors.ConfigError
        When ``--model`` or ``--gpu`` is missing.
    """
    from radixkv.clock.calibrated import cost_model

    model, gpu = getattr(args, "model", None), getattr(args, "gpu", None)
    if not model or not gpu:
        raise ConfigError("--mode concurrent prices each step on a model and a GPU: give --model and --gpu",
                          field="model" if not model else "gpu")
    return cost_model(
        getattr(args, "cost_model", None) or "roofline", model, gpu, tp=int(getattr(args, "tp", 1) or 1),
        kv_cache_dtype=getattr(args, "kv_cache_dtype", None),
        mfu=float(getattr(args, "mfu", 0.6)), mbu=float(getattr(args, "mbu", 0.8)),
        step_overhead_s=float(getattr(args, "step_overhead_s", 0.0)),
    )


def policy_from_args(policy, args):
    """*policy*, or the policy the caching flags ask for on the same pool.

    ``--no-enable-prefix-caching`` gives ``NoCache(policy.num_slots, policy.slot_tokens)``;
    ``--static-reserved-fraction F`` gives ``StaticReservedCache(policy.num_slots,
    policy.slot_tokens, F)``. Both at once is a :class:`ConfigError`.
    """
    if getattr(policy, "sequential_only", False):
        raise ConfigError(f"policy {policy.name!r} is modelled for the sequential replay only: "
                          f"drop --mode concurrent", field="mode")
    frac = getattr(args, "static_reserved_fraction", None)
    on = getattr(args, "enable_prefix_caching", True)
    if frac is not None and not on:
        raise ConfigError("--static-reserved-fraction caches prefixes: drop --no-enable-prefix-caching",
                          field="static_reserved_fraction")
    if not on:
        from radixkv.policies.no_cache import NoCache

        return NoCache(policy.num_slots, policy.slot_tokens)
    if frac is not None:
        from radixkv.policies.static_reserved import StaticReservedCache

        return StaticReservedCache(policy.num_slots, policy.slot_tokens, frac)
    return policy


def run_concurrent_from_args(trace, policy, args, progress=None, miss_spec=None, recorder_factory=None, *,
                             cost=None, config=None, arrivals=None):
    """Run the concurrent replay the flags describe.

    Parameters
    ----------
    trace : radixkv.trace.Trace
    policy : radixkv.policies.base.PrefixCache
        A fresh policy on the pool to replay (replaced per :func:`policy_from_args`).
    args : argparse.Namespace
        Settings (see the module docstring): the flags of
        :func:`radixkv.cli.concurrent_args.add_concurrent_args` plus ``--model``/``--gpu``.
    progress : callable or None
        ``progress(done, total)``.
    miss_spec : radixkv.policies.registry.PolicySpec or None
        ``--miss-causes``: the policy's spec; the result then carries the concurrent miss
        causes (:func:`radixkv.replay.conc_misses.attach_concurrent_causes`).
    recorder_factory : callable or None
        With *miss_spec*: ``recorder_factory(trace, policy, config)`` builds the recorder
        instead of :class:`~radixkv.replay.conc_misses.MissRecorder` (``--explain``:
        :class:`~radixkv.replay.conc_explain.ExplainRecorder`).
    cost, config, arrivals : objects or None
        Given (the library's callers: :func:`radixkv.replay`), they replace what the flags
        describe: the step-time model (:func:`cost_model_from_args`), the
        :class:`~radixkv.replay.scheduler.SchedulerConfig`
        (:func:`concurrent_config_from_args`) and the arrival times (float64 seconds, shape
        (len(trace),), before the context-length step; :func:`arrival_times`).

    Returns
    -------
    radixkv.replay.concurrent.ConcurrentResult

    Raises
    ------
    radixkv.errors.ConfigError
        On a bad flag combination or a request that can never fit.
    """
    from radixkv.replay.arrivals import arrival_times
    from radixkv.replay.concurrent import replay_concurrent

    from radixkv.replay.context import engine_of, record, resolve_max_model_len, serve_with_arrivals

    cost = cost_model_from_args(args) if cost is None else cost
    pol = policy_from_args(policy, args)
    cfg = concurrent_config_from_args(args, pol) if config is None else config
    arr = arrival_times(
        trace,
        arrival=getattr(args, "arrival", "trace"),
        time_scale=float(getattr(args, "time_scale", 1.0)),
        request_rate=getattr(args, "request_rate", None),
        burstiness=float(getattr(args, "burstiness", 1.0)),
        seed=int(getattr(args, "seed", 0)),
    ) if arrivals is None else arrivals
    # the engine refuses prompts past the model's context and caps outputs: a step before
    # the replay, after the arrivals are drawn for every request (so the others keep
    # theirs); nothing changes without --model or --max-model-len
    trace, arr, ctx = serve_with_arrivals(trace, arr, resolve_max_model_len(getattr(args, "model", None),
                                                                          getattr(args, "max_model_len", None)),
                                          engine_of(policy))
    link = getattr(args, "host_link", None)
    if link is not None:
        from radixkv.cost import HostLink

        link = HostLink.parse(link)
    rec = None
    if miss_spec is not None:
        from radixkv.replay.conc_misses import MissRecorder, check_policy

        check_policy(pol, policy)
        rec = (recorder_factory or MissRecorder)(trace, pol, cfg)
    res = replay_concurrent(trace, pol, cost, arrivals=arr, config=cfg, progress=progress,
                            timeline=bool(getattr(args, "timeline", None) or getattr(args, "report", None)),
                            host_link=link, recorder=rec,
                            request_intake_s=float(getattr(args, "request_intake_s", 0.0) or 0.0))
    if rec is not None:
        from radixkv.replay.conc_misses import attach_concurrent_causes

        attach_concurrent_causes(trace, miss_spec, res, [rec])
    record(res.meta, ctx)
    return res


def routed(args) -> bool:
    """True when the flags ask for the multi-replica replay; refuses combinations it does not model."""
    if getattr(args, "replicas", None) is None:
        if getattr(args, "router", None) is not None or getattr(args, "kv_pool", "local") != "local":
            raise ConfigError("--router and --kv-pool need --replicas N", field="replicas")
        return False
    if args.replicas < 1:
        raise ConfigError(f"--replicas must be ≥ 1, got {args.replicas}", field="replicas")
    if getattr(args, "kv_pool", "local") not in ("local", "global"):
        raise ConfigError(f"--kv-pool must be local or global, got {args.kv_pool!r}", field="kv_pool")
    if getattr(args, "mode", "sequential") == "concurrent" and getattr(args, "router_load_window", None) is not None:
        raise ConfigError("--router-load-window applies to the sequential replicas only: with --mode concurrent a "
                          "replica's load is its requests in flight at the arrival", field="router_load_window")
    if getattr(args, "mode", "sequential") == "concurrent" and getattr(args, "kv_pool", "local") == "global":
        from radixkv.replay.multi_concurrent import GLOBAL_POOL_REFUSAL

        raise ConfigError(GLOBAL_POOL_REFUSAL, field="kv_pool")
    return True


def routing_knobs(args) -> dict:
    """The router's knobs of *args* (``--router`` and the prefix-aware router's thresholds),
    a knob not given at its flag's default (the constants of :mod:`radixkv.replay.routing`):
    ``router``, ``seed``, ``cache_threshold``, ``balance_abs_threshold``,
    ``balance_rel_threshold``, ``max_tree_tokens``."""
    import radixkv.replay.routing as R

    def get(name, default):
        v = getattr(args, name, None)
        return default if v is None else v

    return {"router": get("router", "round-robin"), "seed": int(get("router_seed", 0)),
            "cache_threshold": get("cache_threshold", R.CACHE_THRESHOLD),
            "balance_abs_threshold": get("balance_abs_threshold", R.BALANCE_ABS_THRESHOLD),
            "balance_rel_threshold": get("balance_rel_threshold", R.BALANCE_REL_THRESHOLD),
            "max_tree_tokens": getattr(args, "max_tree_tokens", None)}


def run_routed_concurrent_result(trace, spec, pool, args, recorder_factory=None, *, miss_causes=None, cost=None,
                                 config=None, arrivals=None):
    """The concurrent replay of ``replicas`` replicas behind ``router`` on one clock
    (:func:`radixkv.replay.multi_concurrent.replay_multi_concurrent`), each a fresh policy
    of *spec* on *pool* (then :func:`policy_from_args`): returns ``(MultiConcurrentResult,
    recorders or None, compile seconds, replay seconds)``. *recorder_factory*
    (``factory(trace, policy, config, replica)``; with ``--miss-causes``) builds each
    replica's recorder instead of :class:`~radixkv.replay.conc_misses.MissRecorder`.
    *miss_causes* (None: ``args.miss_causes``) records the concurrent miss causes. *cost*,
    *config*, *arrivals*: as :func:`run_concurrent_from_args`'s (given, they replace what
    the flags describe; *arrivals* one per request of ``trace.head(limit)``)."""
    from radixkv.policies.registry import build_policy
    from radixkv.replay.arrivals import arrival_times
    from radixkv.replay.multi_concurrent import replay_multi_concurrent
    from radixkv.replay.run import warmup

    t = trace.head(getattr(args, "limit", None))
    if len(t) == 0:
        raise ConfigError("no requests to replay (empty trace or --limit 0)", path=trace.name or None, field="limit")
    compile_s = warmup(spec, lean=t.unit_tokens == 1)
    cost = cost_model_from_args(args) if cost is None else cost
    pols = [policy_from_args(build_policy(spec, pool, unit_tokens=t.unit_tokens), args) for _ in range(args.replicas)]
    if arrivals is None:
        arr = arrival_times(t, arrival=getattr(args, "arrival", "trace"),
                            time_scale=float(getattr(args, "time_scale", 1.0)),
                            request_rate=getattr(args, "request_rate", None),
                            burstiness=float(getattr(args, "burstiness", 1.0)), seed=int(getattr(args, "seed", 0)))
    else:
        arr = np.asarray(arrivals, dtype=np.float64)
        if arr.shape != (len(t),):
            raise ConfigError(f"arrivals: {arr.shape[0] if arr.ndim == 1 else arr.shape} times for {len(t)} "
                              "requests (one per request, in replay order)", field="arrivals")
    from radixkv.replay.context import engine_of, record, resolve_max_model_len, serve_with_arrivals

    # requests past the model's context: refused before routing (radixkv/replay/context.py)
    t, arr, ctx = serve_with_arrivals(t, arr, resolve_max_model_len(getattr(args, "model", None),
                                                                    getattr(args, "max_model_len", None)),
                                      engine_of(spec))
    cfg = concurrent_config_from_args(args, pols[0]) if config is None else config
    recs = None
    if getattr(args, "miss_causes", False) if miss_causes is None else miss_causes:
        from radixkv.replay.conc_misses import MissRecorder, check_policy

        check_policy(pols[0], build_policy(spec, pool, unit_tokens=t.unit_tokens))
        make = recorder_factory or (lambda tr, p, c, r: MissRecorder(tr, p, c, replica=r))
        recs = [make(t, p, cfg, r) for r, p in enumerate(pols)]
    from radixkv.numba_cache import compile_notice

    t0 = time.perf_counter()
    # the replicas' compiled engines may compile kernels the single-engine warm-up does not
    # (a priority pool's replica loop: 30+ s cold); say so, as the warm-up does
    with compile_notice(spec.label):
        rk = routing_knobs(args)
        res = replay_multi_concurrent(
            t, pols, cost, rk["router"], arrivals=arr, config=cfg, seed=rk["seed"],
            cache_threshold=rk["cache_threshold"], balance_abs_threshold=rk["balance_abs_threshold"],
            balance_rel_threshold=rk["balance_rel_threshold"], max_tree_tokens=rk["max_tree_tokens"],
            recorders=recs)
    if recs is not None:
        from radixkv.replay.conc_misses import attach_concurrent_causes

        attach_concurrent_causes(t, spec, res.aggregate, recs, replica=res.replica)
    record(res.aggregate.meta, ctx)
    return res, recs, compile_s, time.perf_counter() - t0
