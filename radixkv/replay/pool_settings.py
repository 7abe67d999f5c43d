"""The KV pool a replay runs on, from its settings (the library side of ``radixkv replay``'s pool flags).

A *settings* object is anything with the destinations of ``radixkv replay``'s flags as
attributes (an :class:`argparse.Namespace` the command line parsed, or one a sweep cell
builds from its settings dict, :func:`radixkv.sweep.cell.replay_cell`). The attributes read
here: ``capacity_tokens``, ``num_gpu_blocks``, ``max_total_num_tokens``, ``pool_from_log``
(optional), ``model``, ``gpu``, ``gpu_memory_utilization``, ``mem_fraction_static``,
``kv_cache_dtype``, ``tp``, ``max_num_batched_tokens`` and ``mode`` (optional). Messages
name the command-line flags, since that is how users set them (a sweep grid names the
key instead, from the error's ``field``).

- :func:`check_pool_args`  one pool size, or ``model`` and ``gpu``; the memory-model knobs
  only where the memory model sizes the pool.
- :func:`pool_sized_by_model`  whether the memory model sizes the pool on ``--gpu``.
- :func:`pool_for_policy`  the :class:`~radixkv.policies.registry.PoolSpec` a policy runs
  on (explicit size, engine start-up log, or the memory model's vLLM / SGLang rule,
  :func:`radixkv.memory.pool_for`) and where it came from.
"""
from __future__ import annotations

from radixkv.errors import ConfigError
from radixkv.policies.registry import PolicySpec, PoolSpec


def check_pool_args(args):
    """One explicit pool size, or ``--model`` and ``--gpu`` (which the concurrent mode's
    cost model needs anyway; an explicit size then overrides the memory model's pool).

    Parameters
    ----------
    args : settings object (see the module docstring)

    Raises
    ------
    radixkv.errors.ConfigError
        Two pool sizes (field ``capacity``), none, ``--model`` without ``--gpu`` or the
        reverse (where both are needed), a memory-model knob beside an explicit size, or
        both engines' memory knobs; ``field`` names the setting.
    """
    k = sum(x is not None for x in (args.capacity_tokens, args.num_gpu_blocks, args.max_total_num_tokens,
                                    getattr(args, "pool_from_log", None)))
    if k > 1:
        raise ConfigError("give only one of --capacity-tokens, --num-gpu-blocks, --max-total-num-tokens, "
                          "--pool-from-log",
                          field="capacity")
    if (args.model is None) != (args.gpu is None) and not (k and args.gpu is None):
        # --model alone is fine beside an explicit pool: it gives the KV bytes per token of
        # the host-tier traffic (radixkv.flags.moot.refuse_moot_policy_flags refuses it where unread)
        raise ConfigError("--model and --gpu go together (with an explicit pool size, --model alone gives the "
                          "KV bytes per token of the host-tier traffic)",
                          field="model" if args.model is None else "gpu")
    if k == 0 and args.model is None:
        raise ConfigError(
            "give a pool size: --capacity-tokens N, --num-gpu-blocks N, --max-total-num-tokens N, or --model M --gpu G",
            field="capacity",
        )
    sized_by_model = k == 0
    for flag in ("gpu_memory_utilization", "mem_fraction_static", "kv_cache_dtype"):
        if flag == "kv_cache_dtype" and args.model is not None:
            continue  # with --model it also sets the KV bytes per token (host-tier bytes, cost model)
        if getattr(args, flag, None) is not None and not sized_by_model:
            raise ConfigError(f"--{flag.replace('_', '-')} sizes the pool through the memory model, "
                              f"but an explicit pool size is given: drop one", field=flag)
    if k and args.gpu is not None and getattr(args, "mode", "sequential") == "sequential":
        raise ConfigError("--model/--gpu size the pool (and price steps in --mode concurrent); "
                          "with an explicit pool size in a sequential replay --gpu would be ignored: drop --gpu "
                          "(--model alone gives the host tier's KV bytes per token)",
                          field="gpu")
    if args.gpu_memory_utilization is not None and args.mem_fraction_static is not None:
        raise ConfigError("--gpu-memory-utilization is vLLM's knob and --mem-fraction-static SGLang's: give one",
                          field="gpu_memory_utilization")


def pool_sized_by_model(args) -> bool:
    """Whether the memory model sizes the pool on ``--model``/``--gpu``: a GPU is given and
    no explicit pool size (``--capacity-tokens``, ``--num-gpu-blocks``,
    ``--max-total-num-tokens``) nor ``--pool-from-log`` (as :func:`pool_for_policy` decides)."""
    return getattr(args, "gpu", None) is not None and all(
        getattr(args, k, None) is None for k in ("capacity_tokens", "num_gpu_blocks", "max_total_num_tokens",
                                                 "pool_from_log"))


#: the engines' default slot size, when the memory model prices a policy of another engine
_ENGINE_SIZE = {"vllm": ("block_size", 16), "sglang": ("page_size", 1)}
#: the pool knob each engine states its pool in
_ENGINE_KNOB = {"vllm": "num_gpu_blocks", "sglang": "max_total_num_tokens"}


def _memory_pool(args, engine: str, spec: PolicySpec):
    """The pool the memory model gives *engine* on ``--model``/``--gpu`` (the policy's
    own size when it is that engine's policy, else the engine's default size)."""
    from radixkv.memory import pool_for, vllm_profile_tokens

    kw = {"tp": args.tp, "kv_cache_dtype": args.kv_cache_dtype}
    knob, default = _ENGINE_SIZE[engine]
    kw[knob] = spec.size if (spec.cls.engine == engine and spec.cls.size_name == knob and spec.size) else default
    if engine == "vllm":
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
        kw["max_num_batched_tokens"] = vllm_profile_tokens(args.max_num_batched_tokens, args.gpu)
    else:
        kw["mem_fraction_static"] = args.mem_fraction_static
    kw = {k: v for k, v in kw.items() if v is not None}
    return pool_for(engine, args.model, args.gpu, **kw)


def _pool_from_log(path, spec: PolicySpec) -> tuple[PoolSpec, dict]:
    """The pool a start-up log shows (:mod:`radixkv.memory.startup_log`): the engine's own
    unit when the policy is that engine's with the logged block/page size, else the logged
    capacity in tokens."""
    from radixkv.memory.startup_log import read_startup_log

    lp = read_startup_log(path)
    desc = {"pool_from_log": str(path), "log_engine": lp.engine, "log_line": lp.line}
    own = spec.cls.engine
    if lp.engine == "vllm" and own == "vllm" and spec.size == lp.unit_tokens:
        desc["num_gpu_blocks"] = lp.num_gpu_blocks
        return PoolSpec(num_gpu_blocks=lp.num_gpu_blocks), desc
    if lp.engine == "sglang" and own == "sglang":
        desc["max_total_num_tokens"] = lp.max_total_num_tokens
        return PoolSpec(max_total_num_tokens=lp.max_total_num_tokens), desc
    desc["capacity_tokens"] = lp.capacity_tokens
    return PoolSpec(capacity_tokens=lp.capacity_tokens), desc


def pool_for_policy(args, spec: PolicySpec, *, per_engine_rule: bool = False) -> tuple[PoolSpec, dict]:
    """The :class:`PoolSpec` a policy runs on, and a description of where it came from.

    A pool in an engine's terms (``--num-gpu-blocks``, ``--max-total-num-tokens``, or the
    memory model) stays in those terms for a policy whose class declares that ``engine``;
    other policies get the usable tokens (:meth:`PoolSpec.usable_tokens`). The memory
    model uses vLLM's rule for every policy unless *per_engine_rule*, when each policy
    gets its class's engine's rule.

    Parameters
    ----------
    args : settings object (see the module docstring), checked by :func:`check_pool_args`
    spec : PolicySpec
        The policy (its class's ``engine``, ``size_name`` and size pick the pool's terms).
    per_engine_rule : bool
        Size each engine's pool by its own memory rule (``radixkv compare --per-engine-rule``).

    Returns
    -------
    (PoolSpec, dict)
        The pool, and where it came from (JSON-ready: ``capacity_tokens``,
        ``num_gpu_blocks`` / ``max_total_num_tokens``, or ``engine_rule``, ``model``,
        ``gpu``, ``tp`` for the memory model; ``pool_from_log``, ``log_engine``,
        ``log_line`` for a start-up log).

    Raises
    ------
    radixkv.errors.ConfigError
        From the memory model (unknown model or GPU, a pool that does not fit) or the
        start-up log reader (no pool line).

    Engine rules: vLLM sizes the pool from ``gpu_memory_utilization`` after a profiling
    pass (``vllm/v1/worker/gpu_worker.py``, ``Worker.determine_available_memory``), SGLang
    from ``mem_fraction_static`` (``python/sglang/srt/model_executor/model_runner.py``,
    ``ModelRunner.profile_max_num_token``); :mod:`radixkv.memory.pool` states both and
    their estimated terms.
    """
    own = spec.cls.engine
    if args.capacity_tokens is not None:
        return PoolSpec(capacity_tokens=args.capacity_tokens), {"capacity_tokens": args.capacity_tokens}
    if getattr(args, "pool_from_log", None) is not None:
        return _pool_from_log(args.pool_from_log, spec)
    for knob in ("num_gpu_blocks", "max_total_num_tokens"):
        v = getattr(args, knob)
        if v is None:
            continue
        ps = PoolSpec(**{knob: v})
        if _ENGINE_KNOB.get(own) == knob:
            return ps, {knob: v}
        tokens = ps.usable_tokens()
        return PoolSpec(capacity_tokens=tokens), ({knob: v, "capacity_tokens": tokens} if knob == "num_gpu_blocks"
                                                  else {"capacity_tokens": tokens})
    engine = own if (per_engine_rule and own in _ENGINE_KNOB) else "vllm"
    ps = _memory_pool(args, engine, spec)
    desc = {"engine_rule": engine, "model": args.model, "gpu": args.gpu, "tp": args.tp}
    knob = _ENGINE_KNOB[engine]
    if own == engine:
        n = int(getattr(ps, knob))
        per_model = getattr(spec.cls, "engine_pool_for_model", None)  # several KV cache groups (vllm-hybrid)
        if per_model is not None:
            n = per_model(args.model, ps.budget_bytes, spec.size, spec.option, tp=args.tp,
                          kv_cache_dtype=args.kv_cache_dtype)
        desc[knob] = n
        return PoolSpec(**{knob: n}), desc
    desc["capacity_tokens"] = int(ps.capacity_tokens)
    return PoolSpec(capacity_tokens=int(ps.capacity_tokens)), desc
