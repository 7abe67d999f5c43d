"""``radixkv memory``: KV bytes per token, the engines' KV pool and its accounting table.

Examples::

    radixkv memory --model Llama-3.1-8B --gpu A100-80GB --gpu-memory-utilization 0.9
    radixkv memory --model DeepSeek-V3 --gpu H200-141GB --tp 8 --json
    radixkv memory --model path/to/config.json --gpu H100-80GB --mem-fraction-static 0.85
    radixkv memory --pool-from-log server.log          # the pool the server logged
    radixkv memory --model Llama-3.1-8B --gpu H100-80GB --pool-from-log server.log

With ``--gpu-memory-utilization`` only vLLM's pool is shown, with ``--mem-fraction-static``
only SGLang's, with neither both (each with its default); ``--engine`` overrides.

With both engines shown, an engine whose pool does not fit on the GPU is reported with the
reason (``[sglang] does not fit: ...``; in ``--json``, ``does_not_fit`` maps the engine to
it) and the other is still shown. Exit status: 0 when at least one pool shown fits, 2 when
none does (or the one engine asked for does not), with every reason.

vLLM's pool is sized after a profiling pass of ``max_num_batched_tokens`` tokens; the
report gives the count it assumed (``profile_tokens`` under ``pools.vllm`` in ``--json``,
with ``profile_tokens_source``: ``--max-num-batched-tokens`` when given, else vLLM's default
on the GPU, :func:`radixkv.memory.vllm_profile_tokens`).
"""
from __future__ import annotations

import json
import math

from radixkv.errors import ConfigError, InputError
from radixkv.memory.engine_defaults import vllm_profile_tokens
from radixkv.memory.pool import (
    GiB,
    PoolSize,
    SGLANG_CURRENT_VERSION,
    VLLM_CURRENT_VERSION,
    sglang_pool_size,
    vllm_pool_size,
    vllm_start_max_model_len,
)
from radixkv.memory.presets import GPU_PRESETS, MODEL_PRESETS, get_gpu, get_model


def _fraction_arg(field: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise InputError(f"must be a number in (0, 1], got {text!r}", field=field) from None
        if not (0.0 < v <= 1.0) or math.isnan(v):
            raise InputError(f"must be in (0, 1], got {text!r}", field=field)
        return v
    return parse


def register(subparsers) -> None:
    """Add the ``memory`` verb."""
    p = subparsers.add_parser(
        "memory", help="KV bytes per token and the KV pool vLLM/SGLang build on a GPU",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help=f"preset ({', '.join(MODEL_PRESETS)}; case-insensitive) or a "
                        "path to a Hugging Face config.json")
    p.add_argument("--gpu", default=None, help=f"preset: {', '.join(GPU_PRESETS)} (or a family with one preset, e.g. H100)")
    p.add_argument("--pool-from-log", metavar="LOG", default=None,
                   help="a vLLM or SGLang start-up log: print the pool it shows (and, with "
                        "--model/--gpu, the memory model's error against it)")
    p.add_argument("--engine-version", default=None,
                   help=f"version of the engine shown whose start-up rules apply (vLLM default "
                        f"{VLLM_CURRENT_VERSION}: before 0.21 utilization 0.9 and no CUDA-graph "
                        f"term; SGLang default {SGLANG_CURRENT_VERSION}: before 0.5.3 "
                        "mem_fraction_static by TP size, before 0.5.4 no indexer in the cell); "
                        "with both engines shown it needs --engine")
    frac = p.add_mutually_exclusive_group()
    frac.add_argument("--gpu-memory-utilization", type=str, default=None,
                      help="vLLM knob in (0, 1] (default 0.92)")
    frac.add_argument("--mem-fraction-static", type=str, default=None,
                      help="SGLang knob in (0, 1] (default: by GPU memory, as SGLang)")
    p.add_argument("--engine", choices=["vllm", "sglang", "both"], default=None,
                   help="which pool(s) to show (default: from the knob given, else both)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="auto (model dtype), bf16, fp16, fp8, fp8_e4m3, fp8_e5m2, int8, fp32")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length in tokens (default: the model's maximum)")
    p.add_argument("--block-size", type=int, default=16, help="vLLM block_size (default 16)")
    p.add_argument("--page-size", type=int, default=1, help="SGLang page_size (default 1)")
    from radixkv.flags.concurrent import GPU_DEFAULTS_HELP

    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help=f"tokens of vLLM's profiling pass (its max_num_batched_tokens; default: {GPU_DEFAULTS_HELP})")
    from radixkv.cli._output import add_json_arg

    add_json_arg(p, "the report")
    p.set_defaults(func=run)


def _pool_dict(pool: PoolSize, max_len: int) -> dict:
    d = pool.to_dict()
    d["max_concurrent_requests_at_max_model_len"] = pool.max_concurrent_requests(max_len)
    return d


def memory_report(args) -> dict:
    """Compute everything ``radixkv memory`` prints, as a JSON-ready dict.

    Raises
    ------
    InputError
        Unknown model/GPU (listing the presets), a fraction outside (0, 1], or a
        non-positive size.
    """
    util = None if args.gpu_memory_utilization is None else \
        _fraction_arg("gpu_memory_utilization")(args.gpu_memory_utilization)
    mfs = None if args.mem_fraction_static is None else \
        _fraction_arg("mem_fraction_static")(args.mem_fraction_static)
    logged = None
    if getattr(args, "pool_from_log", None) is not None:
        from radixkv.memory.startup_log import read_startup_log

        logged = read_startup_log(args.pool_from_log, block_size=args.block_size)
        if args.model is None and args.gpu is None:
            _refuse_moot_flags(args, None, logged)
            return {"logged": _logged_dict(logged)}
    if args.model is None or args.gpu is None:
        raise InputError("give --model and --gpu (or only --pool-from-log LOG)",
                         field="model" if args.model is None else "gpu")
    for field in ("tp", "block_size", "page_size", "max_num_batched_tokens"):
        v = getattr(args, field)
        if v is not None and v <= 0:
            raise InputError(f"must be a positive integer, got {v}", field=field)
    model = get_model(args.model)
    gpu = get_gpu(args.gpu)
    max_len = model.max_position_embeddings if args.max_model_len is None else args.max_model_len
    if max_len <= 0:
        raise InputError(f"must be a positive integer, got {max_len}", field="max_model_len")
    engine = args.engine or (logged.engine if logged is not None else
                             "vllm" if util is not None else
                             "sglang" if mfs is not None else "both")
    if engine == "vllm" and mfs is not None:
        raise InputError("--mem-fraction-static is an SGLang knob", field="mem_fraction_static")
    if engine == "sglang" and util is not None:
        raise InputError("--gpu-memory-utilization is a vLLM knob",
                         field="gpu_memory_utilization")
    _refuse_moot_flags(args, engine, logged)
    version = getattr(args, "engine_version", None)
    if version is not None and engine == "both":
        raise InputError("--engine-version is one engine's version: add --engine vllm or "
                         "--engine sglang", field="engine_version")

    kv_dtype = args.kv_cache_dtype
    per_rank = model.kv_bytes_per_token(args.tp, kv_dtype)
    out = {
        "model": model.name,
        "gpu": gpu.name,
        "gpu_total_bytes": gpu.total_bytes,
        "tp": args.tp,
        "kv_cache_dtype": kv_dtype if kv_dtype.lower() != "auto" else model.dtype,
        "attention": "MLA" if model.is_mla else (
            "MHA" if model.num_kv_heads == model.num_attention_heads else "GQA"),
        "kv_heads_per_rank": model.kv_heads_per_rank(args.tp),
        "kv_bytes_per_token_per_rank": per_rank,
        "kv_bytes_per_token_total": model.kv_bytes_per_token_total(args.tp, kv_dtype),
        "max_model_len": max_len,
        "request_kv_bytes_per_rank": per_rank * max_len,
        "request_kv_bytes_total": per_rank * args.tp * max_len,
        "pools": {},
    }
    if model.is_hybrid:
        # per-layer kinds (radixkv.memory.specs): KV per token of each kind, the window,
        # and the linear-attention state one sequence holds (null when there is none)
        by_kind = model.kv_bytes_per_token_by_kind(args.tp, kv_dtype)
        counts = model.layer_counts()
        out["layers"] = counts
        out["kv_bytes_per_token_by_kind_per_rank"] = {k: v for k, v in by_kind.items() if counts[k]}
        out["sliding_window"] = model.sliding_window
        out["state_bytes_per_sequence_per_rank"] = (model.state_bytes_per_sequence(args.tp)
                                                    if counts["linear_attention"] else None)
    # --engine both: an engine whose pool does not fit is reported with its reason, the
    # other still shown; it is an error only when no engine fits (or the one asked for)
    engines = ("vllm", "sglang") if engine == "both" else (engine,)
    unfit = {}
    if "vllm" in engines:
        try:
            _vllm_pool(out, model, gpu, args, util, kv_dtype, version, max_len)
        except ConfigError as e:
            if engine != "both":
                raise
            unfit["vllm"] = e
    if "sglang" in engines:
        try:
            pool = sglang_pool_size(model, gpu, tp=args.tp, kv_cache_dtype=kv_dtype,
                                    mem_fraction_static=mfs, page_size=args.page_size,
                                    engine_version=version)
        except ConfigError as e:
            if engine != "both":
                raise
            unfit["sglang"] = e
        else:
            out["pools"]["sglang"] = _pool_dict(pool, max_len)
    if unfit and not out["pools"]:
        raise ConfigError("no engine's KV pool fits: " + "; ".join(str(e) for e in unfit.values()))
    if unfit:
        out["does_not_fit"] = {eng: str(e) for eng, e in unfit.items()}
    if logged is not None:
        out["logged"] = _logged_dict(logged)
        mod = out["pools"].get(logged.engine)
        if mod is not None:
            out["logged"]["model_error_tokens"] = mod["capacity_tokens"] - logged.capacity_tokens
            out["logged"]["model_error_pct"] = round(
                100.0 * (mod["capacity_tokens"] - logged.capacity_tokens) / logged.capacity_tokens, 3)
    return out


def _vllm_pool(out, model, gpu, args, util, kv_dtype, version, max_len) -> None:
    """vLLM's pool (and, for a hybrid model, its KV cache groups) into ``out["pools"]``.

    Raises
    ------
    radixkv.errors.ConfigError
        The pool does not fit (:func:`radixkv.memory.pool.vllm_pool_size`).
    """
    pool = vllm_pool_size(model, gpu, tp=args.tp, kv_cache_dtype=kv_dtype,
                          gpu_memory_utilization=util, block_size=args.block_size,
                          max_num_batched_tokens=vllm_profile_tokens(args.max_num_batched_tokens, gpu),
                          engine_version=version)
    out["pools"]["vllm"] = _pool_dict(pool, max_len)
    # the tokens of vLLM's profiling pass (its peak activations), and where they came from
    out["pools"]["vllm"]["profile_tokens"] = vllm_profile_tokens(args.max_num_batched_tokens, gpu)
    out["pools"]["vllm"]["profile_tokens_source"] = (
        "given (--max-num-batched-tokens)" if args.max_num_batched_tokens is not None
        else f"engine default for {gpu.name}")
    start = vllm_start_max_model_len(pool, max_len, hybrid=model.is_hybrid)
    if start is not None:
        # vLLM refuses to start: the KV cache cannot hold one max_model_len request
        # (check_enough_kv_cache_memory, vllm/v1/core/kv_cache_utils.py); the key is only
        # present then, so the report of a pool that starts is unchanged
        out["pools"]["vllm"]["max_model_len_to_start"] = start
    if model.is_hybrid:
        # vLLM's KV cache groups: the same budget in block ids of one group's layers (with
        # linear-attention layers, at the block size raised to cover a state page)
        from radixkv.memory.hybrid import (vllm_hybrid_block_size, vllm_hybrid_num_gpu_blocks,
                                           vllm_hybrid_policy_option, vllm_kv_cache_groups)

        groups, size = vllm_kv_cache_groups(model)
        hb = vllm_hybrid_block_size(model, block_size=args.block_size, tp=args.tp, kv_cache_dtype=kv_dtype)
        nb = vllm_hybrid_num_gpu_blocks(model, pool.budget_bytes, block_size=args.block_size, tp=args.tp,
                                        kv_cache_dtype=kv_dtype)
        out["pools"]["vllm"]["hybrid"] = {
            "group_size": size,
            "groups": [{"kind": g.kind, "window": g.window, "layers": g.layers, "padding": g.padding}
                       for g in groups],
            "block_size": hb,
            "block_bytes": (hb * size * model.kv_elements_per_token_layer(args.tp)
                            * model.kv_dtype_bytes(kv_dtype)),
            "num_gpu_blocks": nb,
            "policy": "vllm-hybrid:%d@%s" % (hb, vllm_hybrid_policy_option(groups)),
        }


#: the flags that shape a memory-model pool, with their defaults (none is read with
#: ``--pool-from-log`` alone, which only prints the logged pool)
_MODEL_FLAGS = (("engine", None), ("engine_version", None), ("gpu_memory_utilization", None),
                ("mem_fraction_static", None), ("kv_cache_dtype", "auto"), ("tp", 1), ("max_model_len", None),
                ("page_size", 1), ("max_num_batched_tokens", None))


def _refuse_moot_flags(args, engine, logged) -> None:
    """Refuse a flag set away from its default that the pool(s) shown would not read, as
    :mod:`radixkv.flags.moot` does for ``replay``: ``--block-size`` (vLLM's block_size)
    unless vLLM's pool is shown or a vLLM log is read; ``--page-size`` (SGLang's page_size)
    unless SGLang's pool is shown; ``--max-num-batched-tokens`` (vLLM's profiling pass)
    unless vLLM's pool is shown; with ``--pool-from-log`` alone (*engine* None) every flag
    of the memory model.

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the flag and what makes it moot (``field`` = the flag's dest).
    """
    from radixkv.errors import ConfigError

    def given(dest, default):
        return getattr(args, dest, default) != default

    if engine is None:  # --pool-from-log alone: the logged pool is printed as it is
        for dest, default in _MODEL_FLAGS:
            if given(dest, default):
                raise ConfigError(f"--{dest.replace('_', '-')} sets the memory model, and --pool-from-log alone "
                                  f"only prints the pool the log shows: add --model and --gpu, or drop it",
                                  field=dest)
        if given("block_size", 16) and logged.engine != "vllm":
            raise ConfigError(f"--block-size is vLLM's block_size and {args.pool_from_log} is an SGLang log "
                              f"(its unit is page_size): drop --block-size", field="block_size")
        return
    vllm_read = engine in ("vllm", "both") or (logged is not None and logged.engine == "vllm")
    if given("block_size", 16) and not vllm_read:
        raise ConfigError("--block-size is vLLM's block_size, and only SGLang's pool is shown (--engine sglang, "
                          "or --mem-fraction-static), whose unit is --page-size: drop --block-size or show vLLM's "
                          "pool", field="block_size")
    if given("page_size", 1) and engine not in ("sglang", "both"):
        raise ConfigError("--page-size is SGLang's page_size, and only vLLM's pool is shown (--engine vllm, or "
                          "--gpu-memory-utilization), whose unit is --block-size: drop --page-size or show "
                          "SGLang's pool", field="page_size")
    if given("max_num_batched_tokens", None) and engine not in ("vllm", "both"):
        raise ConfigError("--max-num-batched-tokens sizes vLLM's profiling pass, and only SGLang's pool is shown: "
                          "drop --max-num-batched-tokens or show vLLM's pool", field="max_num_batched_tokens")


def _logged_dict(lp) -> dict:
    return {"engine": lp.engine, "path": lp.path, "line": lp.line,
            "num_gpu_blocks": lp.num_gpu_blocks, "max_total_num_tokens": lp.max_total_num_tokens,
            "logged_tokens": lp.logged_tokens, "unit_tokens": lp.unit_tokens,
            "capacity_tokens": lp.capacity_tokens, "kv_cache_gib": lp.kv_cache_gib,
            "max_model_len": lp.max_model_len, "engine_version": lp.engine_version}


def _gib(b: int) -> str:
    return f"{b / GiB:,.2f} GiB"


def format_report(r: dict) -> str:
    """The human-readable form of :func:`memory_report`'s dict."""
    tail = []
    if "logged" in r:
        lg = r["logged"]
        unit = "num_gpu_blocks" if lg["engine"] == "vllm" else "max_total_num_tokens"
        tail = ["", f"[logged, {lg['engine']}] {lg['path']} line {lg['line']}: {unit} "
                    f"{lg[unit]:,}, {lg['capacity_tokens']:,} usable tokens"
                    + ("" if lg["kv_cache_gib"] is None else f", KV {lg['kv_cache_gib']} GiB")]
        if "model_error_tokens" in lg:
            tail.append(f"  memory model minus logged: {lg['model_error_tokens']:+,} tokens "
                        f"({lg['model_error_pct']:+.2f} %)")
        if "model" not in r:
            return "\n".join(tail[1:])
    lines = [
        f"model {r['model']} ({r['attention']}), GPU {r['gpu']} "
        f"({r['gpu_total_bytes']:,} B = {_gib(r['gpu_total_bytes'])}), tp {r['tp']}, "
        f"KV dtype {r['kv_cache_dtype']}",
        f"KV bytes per token: {r['kv_bytes_per_token_per_rank']:,} B per rank "
        f"({r['kv_heads_per_rank']} KV head(s) per rank), "
        f"{r['kv_bytes_per_token_total']:,} B over {r['tp']} rank(s)",
        f"KV of one {r['max_model_len']:,}-token request: "
        f"{_gib(r['request_kv_bytes_per_rank'])} per rank, "
        f"{_gib(r['request_kv_bytes_total'])} total",
    ]
    if "layers" in r:
        kinds = ", ".join(f"{n} {k.replace('_attention', '')}" for k, n in r["layers"].items() if n)
        per = ", ".join(f"{k.replace('_attention', '')} {b:,} B" for k, b in
                        r["kv_bytes_per_token_by_kind_per_rank"].items())
        lines.append(f"layers: {kinds}; KV bytes per token per rank by kind: {per}"
                     + ("" if r["sliding_window"] is None else f"; sliding window {r['sliding_window']:,} tokens"))
        st = r["state_bytes_per_sequence_per_rank"]
        lines.append("linear-attention state per sequence: "
                     + ("n/a (no linear-attention layers)" if st is None else
                        f"{st:,} B per rank ({st / 2**20:,.1f} MiB)"))
    unfit = r.get("does_not_fit", {})
    for eng in [e for e in ("vllm", "sglang") if e in r["pools"] or e in unfit]:
        if eng in unfit:
            lines += ["", f"[{eng}] does not fit: {unfit[eng]}"]
            continue
        p = r["pools"][eng]
        knob = "gpu_memory_utilization" if eng == "vllm" else "mem_fraction_static"
        unit = "block_size" if eng == "vllm" else "page_size"
        lines.append("")
        lines.append(f"[{eng}] {knob} {p['memory_fraction']}, {unit} {p['unit_tokens']}")
        if eng == "vllm":
            lines.append(f"  pool: {_gib(p['bytes'])} per rank, num_gpu_blocks "
                         f"{p['num_gpu_blocks']:,} ({p['num_gpu_blocks'] - 1:,} usable), "
                         f"{p['capacity_tokens']:,} tokens")
        else:
            lines.append(f"  pool: {_gib(p['bytes'])} per rank, max_total_num_tokens "
                         f"{p['max_total_num_tokens']:,} ({p['blocks']:,} pages)")
        if "profile_tokens" in p:
            lines.append(f"  profiling pass: {p['profile_tokens']:,} tokens (max_num_batched_tokens, "
                         f"{p['profile_tokens_source']})")
        if "hybrid" in p:
            h = p["hybrid"]
            kinds = [g["kind"] for g in h["groups"]]
            parts = [f"{kinds.count(k)} {w}" for k, w in (("full_attention", "full"), ("sliding_attention", "sliding"),
                                                          ("linear_attention", "Mamba")) if k in kinds]
            pad = sum(g["padding"] for g in h["groups"])
            lines.append(f"  hybrid KV cache groups: {' + '.join(parts)} of {h['group_size']} layers ({pad} padding); "
                         f"block_size {h['block_size']}; block id {h['block_bytes']:,} B; the same budget gives "
                         f"num_gpu_blocks {h['num_gpu_blocks']:,} -> {h['policy']}")
        lines.append(f"  max-length ({r['max_model_len']:,}-token) requests at once: "
                     f"{p['max_concurrent_requests_at_max_model_len']:,}")
        start = p.get("max_model_len_to_start")
        if start is not None:
            lines.append(f"  vLLM refuses to start with max_model_len {r['max_model_len']:,}: its KV cache holds "
                         f"{p['num_gpu_blocks']:,} blocks x {p['unit_tokens']} = {start:,} tokens by its start-up "
                         f"check (check_enough_kv_cache_memory, vllm/v1/core/kv_cache_utils.py); "
                         f"--max-model-len {start} starts (or raise gpu_memory_utilization / tp)")
        lines.append("  accounting (per rank):")
        w = max(len(a["term"]) for a in p["accounting"])
        for a in p["accounting"]:
            lines.append(f"    {a['term']:<{w}}  {a['bytes']:>18,} B  {a['bytes'] / GiB:>9.2f} GiB"
                         f"  [{a['basis']}]")
    lines.append("")
    lines.append("terms marked [estimate] are measured by the engine at start-up; "
                 "radixkv uses documented estimates (radixkv.memory.pool)")
    return "\n".join(lines + tail)


def run(args) -> int:
    """Entry of ``radixkv memory``; returns the exit status."""
    from radixkv.cli._output import emit, files, inputs
    from radixkv.util import check_output_paths

    check_output_paths(*files(args.json), inputs=inputs(args))
    report = memory_report(args)
    if args.json != "-":
        print(format_report(report))
    emit(args.json, json.dumps(report, sort_keys=True, indent=2) + "\n", args.json)
    return 0
