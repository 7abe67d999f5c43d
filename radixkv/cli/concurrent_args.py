"""Command-line flags of the concurrent replay, shared by ``radixkv replay`` and ``compare``.

``add_concurrent_args(parser)`` adds the flags (engine names where the engines have one);
``run_concurrent_from_args(trace, policy, args)`` runs the replay they describe. A flag
the verb already defines (``--max-num-batched-tokens``, which also sizes vLLM's profiling
pass; ``--model``, ``--gpu``, ``--tp``, ``--kv-cache-dtype`` of the pool) is not added
again: the concurrent replay reads the verb's value, so one knob means one thing.

=============================================== =========================================
flag                                            meaning (default)
=============================================== =========================================
``--mode {sequential,concurrent}``              replay mode (sequential)
``--max-num-seqs N``                            most running requests (256)
``--max-num-batched-tokens N``                  tokens per step, chunked prefill (8192)
``--enable-prefix-caching`` /                   off: replace the policy by ``NoCache`` on
``--no-enable-prefix-caching``                  the same pool (on)
``--static-reserved-fraction F``                replace the policy by ``StaticReservedCache``
                                                reserving F of the same pool (unset)
``--arrival {trace,poisson,gamma}``             arrival process (trace)
``--time-scale X``                              multiply the trace's times (1.0)
``--request-rate R``                            req/s for poisson/gamma
``--burstiness K``                              gamma shape, vLLM's benchmark flag (1.0)
``--seed S``                                    arrival seed (0)
``--schedule-policy {fcfs,lpm}``                waiting-queue order (fcfs)
``--admission {vllm,sglang}``                   admission/preemption rules (the policy
                                                class's ``admission_rule``)
``--enable-chunked-prefill`` /                   vLLM rules: off admits a request only when
``--no-enable-chunked-prefill``                 its un-hit tokens fit the step (on)
``--long-prefill-token-threshold N``            vLLM rules: cap on one prefill chunk when
                                                more than one request is eligible (0 = off)
``--timeline PATH``                              write one CSV row per engine step (``replay``)
``--watermark F``                               vLLM rules: share of the pool's blocks an
                                                admission leaves free (0.0)
``--scheduling-policy {fcfs,priority}``         vLLM rules: waiting order and preemption
                                                victim by the trace's ``priority`` column
                                                (vLLM's flag; fcfs)
``--enable-priority-scheduling``                SGLang rules: waiting queue by the trace's
                                                ``priority`` (higher first), then queue
                                                entry (off); needs
                                                ``--disable-priority-preemption``
``--schedule-low-priority-values-first``        SGLang rules: lower values first (off)
``--disable-priority-preemption``               SGLang rules: no priority preemption (off)
``--retraction-policy {length,priority}``       SGLang rules: decode retraction order (length)
``--cost-model {roofline,fitted,profiled,PATH}`` step-time model (roofline): the assumed
                                                roofline, the roofline fitted on measured
                                                GPU timings, the measured profiles, or a
                                                profile JSON (radixkv.clock, docs/clock.md)
``--mfu F``, ``--mbu F``                        cost-model efficiencies (0.6, 0.8); with a
                                                calibrated model, of its attention term
``--step-overhead-s T``                         fixed seconds per step (0)
``--request-intake-s T``                        seconds a single-threaded server front end
                                                spends per request before the engine sees
                                                it (0; radixkv.cost.intake_arrivals, a
                                                fitted value in docs/clock-e2e.md)
=============================================== =========================================
"""
from __future__ import annotations

import argparse

from radixkv.errors import ConfigError


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, got {v}")
    return v


def _has(parser: argparse.ArgumentParser, flag: str) -> bool:
    return flag in parser._option_string_actions  # argparse keeps every option string here


def add_concurrent_args(parser: argparse.ArgumentParser) -> None:
    """Add the concurrent-replay flags to *parser* (skipping flags it already has)."""
    g = parser.add_argument_group("concurrent replay (--mode concurrent)")

    def add(flag, *more, **kw):
        if not _has(parser, flag):
            g.add_argument(flag, *more, **kw)

    add("--mode", choices=["sequential", "concurrent"], default="sequential",
        help="sequential: one request at a time (cache study); concurrent: arrivals, batching, preemption")
    add("--max-num-seqs", type=int, default=256, help="most running requests (vLLM --max-num-seqs; default 256)")
    add("--max-num-batched-tokens", type=int, default=None,
        help="tokens per engine step, chunked prefill (vLLM's knob; default 8192)")
    if not _has(parser, "--enable-prefix-caching"):
        g.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_true", default=True,
                       help="replay the given policy (default)")
        g.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                       help="replay with caching off (NoCache) on the same pool")
    add("--static-reserved-fraction", type=float, default=None, metavar="F",
        help="replay a statically partitioned pool reserving F of it for cached prefixes")
    add("--arrival", choices=["trace", "poisson", "gamma"], default="trace",
        help="trace timestamps, or re-timing at --request-rate")
    add("--time-scale", type=float, default=1.0, help="multiply the trace's arrival times (<1 compresses)")
    add("--request-rate", type=float, default=None, help="requests per second for --arrival poisson/gamma")
    add("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson; <1 burstier)")
    add("--seed", type=_nonneg_int, default=0, help="seed of the arrival process (≥ 0)")
    add("--schedule-policy", choices=["fcfs", "lpm"], default="fcfs",
        help="waiting-queue order (SGLang --schedule-policy; lpm needs a policy with peek_hit)")
    add("--admission", choices=["vllm", "sglang"], default=None,
        help="admission and preemption rules (default: the policy class's admission_rule)")
    if not _has(parser, "--enable-chunked-prefill"):
        g.add_argument("--enable-chunked-prefill", dest="enable_chunked_prefill", action="store_true", default=True,
                       help="split long prefills over steps (vLLM's default)")
        g.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                       help="vLLM rules: admit a request only when its un-hit tokens fit the step's budget")
    add("--long-prefill-token-threshold", type=_nonneg_int, default=0, metavar="N",
        help="vLLM rules: most tokens of one prefill chunk when more than one request is eligible (0 = off)")
    add("--timeline", metavar="OUT.csv", default=None,
        help="write one CSV row per engine step: running, waiting, batch tokens, pool running/cached/free slots")
    add("--watermark", type=float, default=0.0, metavar="F",
        help="vLLM rules: share of the pool's blocks an admission must leave free while others run (0.0)")
    add("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
        help="vLLM rules: fcfs, or priority (waiting queue by the trace's priority then arrival, lower first; "
             "preempt the running request with the largest (priority, arrival)); vLLM's --scheduling-policy")
    add("--enable-priority-scheduling", action="store_true", default=False,
        help="SGLang rules: sort the waiting queue by the trace's priority (higher values first), then queue entry; "
             "needs --disable-priority-preemption (SGLang's priority preemption is not modelled)")
    add("--schedule-low-priority-values-first", action="store_true", default=False,
        help="SGLang rules, with --enable-priority-scheduling: lower priority values first")
    add("--disable-priority-preemption", action="store_true", default=False,
        help="SGLang rules, with --enable-priority-scheduling: no preemption of running requests by priority")
    add("--retraction-policy", choices=["length", "priority"], default="length",
        help="SGLang rules: decode retraction order (priority: least preferred priority first; "
             "needs --enable-priority-scheduling)")
    add("--cost-model", default="roofline", metavar="{roofline,fitted,profiled,PATH}",
        help="step-time model: roofline (assumed MFU/MBU, the default), fitted (MFU/MBU/per-layer time fitted "
             "on Vidur's measured GPU timings), profiled (the measured per-layer tables), or a profile JSON "
             "(docs/clock.md)")
    add("--mfu", type=float, default=0.6, help="achieved fraction of peak FLOP/s (cost model)")
    add("--mbu", type=float, default=0.8, help="achieved fraction of HBM bandwidth (cost model)")
    add("--step-overhead-s", type=float, default=0.0, help="fixed seconds added to every step")
    add("--request-intake-s", type=float, default=0.0, metavar="T",
        help="seconds a single-threaded server front end (HTTP, tokenisation) spends per request before the "
             "engine sees it; TTFT counts it (0 = none; ~0.003 fitted on vLLM 0.6 runs, docs/clock-e2e.md)")
    for a in g._group_actions:  # argparse keeps a group's actions here
        if a.dest not in _READ_BY_SEQUENTIAL:
            _CONCURRENT_ONLY.setdefault(a.dest, (a.default, []))[1].append(a)


#: flags of the group that the sequential replay reads too (--timeline has its own message)
_READ_BY_SEQUENTIAL = {"mode", "max_num_batched_tokens", "timeline"}
#: dest -> (default, actions) of the flags only the concurrent replay reads
_CONCURRENT_ONLY: dict = {}


def refuse_concurrent_only_flags(args) -> None:
    """Refuse a concurrent-replay flag set away from its default when ``--mode`` is not
    ``concurrent`` (the sequential replay would ignore it silently).

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the first such flag (field = its dest).
    """
    if getattr(args, "mode", "sequential") == "concurrent":
        return
    for dest, (default, actions) in _CONCURRENT_ONLY.items():
        value = getattr(args, dest, default)
        if value != default:
            # the flag that sets this value: --no-X of a store_false pair, else the first
            flag = next((a.option_strings[0] for a in actions if a.nargs == 0 and a.const == value),
                        actions[0].option_strings[0])
            raise ConfigError(f"{flag} applies to the concurrent replay only: add --mode concurrent or drop it",
                              field=dest)


def concurrent_config_from_args(args, policy=None):
    """The :class:`~radixkv.replay.scheduler.SchedulerConfig` the flags describe.

    Without ``--admission``, the policy class's ``admission_rule`` decides
    (:func:`radixkv.replay.scheduler.admission_rule_of`): SGLang's rules for
    ``RadixCache``, whose admission leaves the whole-prompt check to SGLang's budget,
    vLLM's for every other policy.
    """
    from radixkv.replay.scheduler import SchedulerConfig

    mnbt = getattr(args, "max_num_batched_tokens", None)
    admission = getattr(args, "admission", None)
    return SchedulerConfig(
        max_num_seqs=int(getattr(args, "max_num_seqs", 256)),
        max_num_batched_tokens=8192 if mnbt is None else int(mnbt),
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
    )


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


def run_concurrent_from_args(trace, policy, args, progress=None, miss_spec=None, recorder_factory=None):
    """Run the concurrent replay the flags describe.

    Parameters
    ----------
    trace : radixkv.trace.Trace
    policy : radixkv.policies.base.PrefixCache
        A fresh policy on the pool to replay (replaced per :func:`policy_from_args`).
    args : argparse.Namespace
        Parsed flags of :func:`add_concurrent_args` plus ``--model``/``--gpu``.
    progress : callable or None
        ``progress(done, total)``.
    miss_spec : radixkv.policies.registry.PolicySpec or None
        ``--miss-causes``: the policy's spec; the result then carries the concurrent miss
        causes (:func:`radixkv.replay.conc_misses.attach_concurrent_causes`).
    recorder_factory : callable or None
        With *miss_spec*: ``recorder_factory(trace, policy, config)`` builds the recorder
        instead of :class:`~radixkv.replay.conc_misses.MissRecorder` (``--explain``:
        :class:`~radixkv.replay.conc_explain.ExplainRecorder`).

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

    cost = cost_model_from_args(args)
    pol = policy_from_args(policy, args)
    cfg = concurrent_config_from_args(args, pol)
    arr = arrival_times(
        trace,
        arrival=getattr(args, "arrival", "trace"),
        time_scale=float(getattr(args, "time_scale", 1.0)),
        request_rate=getattr(args, "request_rate", None),
        burstiness=float(getattr(args, "burstiness", 1.0)),
        seed=int(getattr(args, "seed", 0)),
    )
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
