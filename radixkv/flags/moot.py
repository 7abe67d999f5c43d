"""Flags that would have no effect: one table, checked once per verb before any work.

A flag set away from its default must change what radixkv does; where another flag (or its
absence) makes it moot, the command refuses with a :class:`~radixkv.errors.ConfigError`
naming both flags instead of replaying without it. The table below lists those
combinations for ``replay``, ``compare`` and ``curve``, and a sweep grid's cells for the same
keys (:mod:`radixkv.sweep.grid`, naming the key and its line) (the flags of the concurrent replay in
the sequential mode are refused by
:func:`radixkv.cli.concurrent_args.refuse_concurrent_only_flags`; ``--measure-last`` outside the
one-pool sequential replay by :func:`radixkv.cli.replay_cmd._check_window_arg`; the size, pool and
host-tier flags by their own checks in :mod:`radixkv.cli.replay_cmd` and
:mod:`radixkv.cli.host_tier_args`; ``memory``'s ``--block-size`` / ``--page-size`` /
``--max-num-batched-tokens`` beside the other engine's pool, and ``trace synth --cv`` without
``--arrival gamma``, by :mod:`radixkv.cli.memory_cmd` and :mod:`radixkv.cli.synth_cmd`).

================================= ==================================================================
flag                              takes effect only with
================================= ==================================================================
``--per-request``, ``--report``,  the replay, not ``--explain`` (which replaces it by one
``--timeline``, ``--miss-fix``    request's explanation)
``--verify``                      a policy whose class takes ``verify`` (vLLM's block hash); one
                                  pool (not ``--replicas``)
``--router``,                     ``--replicas N`` with N ≥ 2 (one replica serves every request;
``--kv-pool global``              without ``--replicas``,
                                  :func:`radixkv.replay.settings.routed` refuses them)
``--router-seed``                 ``--replicas N --router random``
``--router-load-window``          ``--replicas N`` and a router that counts load (least-load,
                                  session, prefix-aware)
``--cache-threshold``,            ``--replicas N --router prefix-aware``
``--balance-abs-threshold``,
``--balance-rel-threshold``,
``--max-tree-tokens``
``--time-scale``                  ``--arrival trace`` (poisson/gamma take their times from
                                  ``--request-rate``)
``--burstiness``                  ``--arrival gamma``
``--seed``                        ``--arrival poisson`` or ``gamma``
``--tp``                          ``--model`` (it divides the model's KV heads)
``--model`` beside an explicit    a policy with a host tier (the bytes of its traffic) or
pool, sequential                  ``--mode concurrent`` (the cost model); ``--gpu`` there is refused
                                  by :func:`radixkv.replay.pool_settings.check_pool_args`
``--per-engine-rule``             the pool sized by ``--model``/``--gpu`` (no explicit size)
``--mem-fraction-static``         a pool sized by SGLang's rule: ``compare --per-engine-rule``
                                  with an SGLang policy (``replay`` sizes by vLLM's rule)
``--gpu-memory-utilization``      a pool sized by vLLM's rule (not ``--per-engine-rule`` with
                                  SGLang policies only)
``--max-num-batched-tokens``      ``--mode concurrent``, or a pool sized by vLLM's rule (its
                                  profiling pass)
``--storage-cache-tokens``,       an L3 tier: ``--hicache-storage-backend`` (or the spec's
``--hicache-storage-prefetch-     ``hicache_storage_backend`` option)
policy``
``--workers``                     ``--executor processes`` or ``dask``
``--metric``                      ``curve --out`` (it is the PNG's y axis)
================================= ==================================================================

Left accepted on purpose: ``--quiet`` (no progress bar where there is none is still
quiet), ``--no-timing`` without a JSON output (it asks for determinism, which holds), and
``--miss-causes`` with ``--explain`` (the explanation is the miss causes of one request).
"""
from __future__ import annotations

import inspect

from radixkv.errors import ConfigError

#: routers whose choice depends on the load window (radixkv.replay.routing: least-load,
#: session's first placement, prefix-aware's balance check)
_LOAD_ROUTERS = ("least-load", "session", "prefix-aware")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _given(args, dest: str, default) -> bool:
    return hasattr(args, dest) and getattr(args, dest) != default


def _explaining(args):
    return getattr(args, "explain", None) is not None


def _router_needs(router: str, *, load: bool = False):
    def check(args):
        rs = getattr(args, "replicas", None)
        r = getattr(args, "router", None) or "round-robin"
        if rs is None:
            return f"needs --replicas N{'' if load else f' --router {router}'} (it is a router setting)"
        if (r not in _LOAD_ROUTERS) if load else (r != router):
            want = "least-load, session or prefix-aware (the routers that count load)" if load else router
            return f"is read by --router {want}, not by --router {r}"
        return None

    return check


def _routing_defaults():
    from radixkv.replay import routing as R

    return R.CACHE_THRESHOLD, R.BALANCE_ABS_THRESHOLD, R.BALANCE_REL_THRESHOLD


def _sized_by_model(args) -> bool:
    explicit = (getattr(args, "capacity_tokens", None), getattr(args, "num_gpu_blocks", None),
                getattr(args, "max_total_num_tokens", None), getattr(args, "pool_from_log", None))
    return getattr(args, "model", None) is not None and all(x is None for x in explicit)


def _options(spec) -> dict:
    """A spec's ``@key=value`` options as a dict (empty for a plain ``@VALUE`` option)."""
    o = spec.option
    return dict(o) if isinstance(o, tuple) and all(isinstance(x, tuple) and len(x) == 2 for x in o) else {}


def _rules():
    """(dest, default, check(args) -> reason or None) for the flags of the table."""
    cache, babs, brel = _routing_defaults()
    moot_by_explain = (lambda args: "is not written with --explain, which replaces the replay by one request's "
                                    "explanation: drop one" if _explaining(args) else None)
    fix_by_explain = (lambda args: "adds what would fix the replay's misses; --explain replaces the replay by one "
                                   "request's explanation: drop one" if _explaining(args) else None)
    return [
        ("per_request", None, moot_by_explain),
        ("report", None, moot_by_explain),
        ("timeline", None, moot_by_explain),
        ("miss_fix", False, fix_by_explain),
        ("verify", False, lambda a: "checks the hits of one pool; not with --replicas"
                                    if getattr(a, "replicas", None) is not None else None),
        ("router", None, lambda a: "picks a replica for each request; with --replicas 1 the one replica serves "
                                   "them all: drop --router, or give --replicas 2 or more"
                                   if getattr(a, "replicas", None) == 1 else None),
        ("kv_pool", "local", lambda a: "shares one KV pool among the replicas; with --replicas 1 there is one pool "
                                       "anyway: drop --kv-pool, or give --replicas 2 or more"
                                       if getattr(a, "replicas", None) == 1 else None),
        ("router_seed", 0, _router_needs("random")),
        ("router_load_window", None, _router_needs("", load=True)),
        ("cache_threshold", cache, _router_needs("prefix-aware")),
        ("balance_abs_threshold", babs, _router_needs("prefix-aware")),
        ("balance_rel_threshold", brel, _router_needs("prefix-aware")),
        ("max_tree_tokens", None, _router_needs("prefix-aware")),
        ("time_scale", 1.0, lambda a: None if getattr(a, "arrival", "trace") == "trace" else
                                      f"scales the trace's own times; with --arrival {a.arrival} the times come "
                                      f"from --request-rate: drop --time-scale"),
        ("burstiness", 1.0, lambda a: None if getattr(a, "arrival", "trace") == "gamma" else
                                      f"is the shape of --arrival gamma, not of --arrival "
                                      f"{getattr(a, 'arrival', 'trace')}"),
        ("seed", 0, lambda a: None if getattr(a, "arrival", "trace") != "trace" else
                              "seeds --arrival poisson or gamma; --arrival trace draws nothing"
                              + ("; --router random's seed is --router-seed" if getattr(a, "router", None) == "random"
                                 else "")),
        ("tp", 1, lambda a: None if getattr(a, "model", None) is not None else
                            "divides a model's KV heads: it needs --model"),
        ("per_engine_rule", False, lambda a: None if _sized_by_model(a) else
                                             "chooses the memory model's rule: it needs --model/--gpu without an "
                                             "explicit pool size"),
        ("workers", None, lambda a: None if (getattr(a, "executor", None) or
                                             ("dask" if getattr(a, "scheduler", None) else "local")) != "local"
                                    else "sizes a pool of workers: it needs --executor processes or dask"),
        ("metric", "token_hit_rate", lambda a: None if getattr(a, "out", None) else
                                                "is the y axis of the PNG: it needs --out PREFIX"),
    ]


def refuse_moot_flags(args) -> None:
    """Refuse a flag of the table (module docstring) that is set away from its default
    where the other flags make it moot.

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the flag and the flag that makes it moot (``field`` = the moot flag's dest).
    """
    for dest, default, check in _rules():
        if not _given(args, dest, default):
            continue
        why = check(args)
        if why:
            raise ConfigError(f"{_flag(dest)} {why}", field=dest)


def refuse_moot_policy_flags(args, specs, *, per_engine_rule: bool = False) -> None:
    """The rows of the table that depend on the policies: ``--verify``,
    ``--mem-fraction-static``, ``--gpu-memory-utilization``, ``--max-num-batched-tokens``
    and the L3 flags. *specs*: the parsed :class:`~radixkv.policies.registry.PolicySpec`
    list (after the host-tier flags are merged); *per_engine_rule*: whether the memory
    model sizes each policy by its own engine's rule (``compare --per-engine-rule``).

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the flag and the flag or policy that makes it moot.
    """
    labels = ", ".join(s.label for s in specs)
    if getattr(args, "verify", False):
        bad = [s for s in specs if "verify" not in inspect.signature(s.build_class.__init__).parameters]
        if bad:
            raise ConfigError(f"--verify compares the stored ids of vLLM's block-hash hits; --policy {bad[0].label} "
                              f"has no such check: drop --verify", field="verify")
    by_model = _sized_by_model(args)
    if by_model:
        engines = {(s.cls.engine if per_engine_rule and s.cls.engine in ("vllm", "sglang") else "vllm")
                   for s in specs}
        if getattr(args, "mem_fraction_static", None) is not None and "sglang" not in engines:
            how = ("no policy of --policies " + labels + " is SGLang's") if per_engine_rule else (
                "the memory model sizes every pool by vLLM's rule here (gpu_memory_utilization)"
                + ("; add --per-engine-rule" if hasattr(args, "per_engine_rule") else ""))
            raise ConfigError(f"--mem-fraction-static is SGLang's knob and {how}: it would be ignored",
                              field="mem_fraction_static")
        if "vllm" not in engines:
            for dest in ("gpu_memory_utilization", "max_num_batched_tokens"):
                if getattr(args, dest, None) is not None and not (dest == "max_num_batched_tokens"
                                                                  and getattr(args, "mode", None) == "concurrent"):
                    raise ConfigError(f"{_flag(dest)} is a vLLM knob and --per-engine-rule sizes {labels} by "
                                      f"SGLang's rule: it would be ignored", field=dest)
    elif (getattr(args, "max_num_batched_tokens", None) is not None
          and getattr(args, "mode", "sequential") != "concurrent"):
        raise ConfigError("--max-num-batched-tokens sizes the tokens of a concurrent step (--mode concurrent) or "
                          "vLLM's profiling pass of the memory model (--model/--gpu without an explicit pool "
                          "size): with an explicit pool in a sequential replay it would be ignored",
                          field="max_num_batched_tokens")
    if (getattr(args, "model", None) is not None and not by_model and getattr(args, "mode", "sequential") != "concurrent"
            and not any(getattr(s.build_class, "models_host_tier", False) for s in specs)):
        raise ConfigError(f"--model beside an explicit pool size gives the KV bytes per token of the host-tier "
                          f"traffic, and {labels} {'has' if len(specs) == 1 else 'have'} no host tier: "
                          f"in a sequential replay it would be ignored: drop --model", field="model")
    for dest in ("storage_cache_tokens", "hicache_storage_prefetch_policy"):
        if getattr(args, dest, None) is None:
            continue
        if not any(_options(s).get("hicache_storage_backend") or _options(s).get("storage_backend") for s in specs):
            raise ConfigError(f"{_flag(dest)} sets the L3 storage tier, which --hicache-storage-backend turns on: "
                              f"give --hicache-storage-backend file or drop {_flag(dest)}", field=dest)
