"""Recompute published start-up logs with radixkv's memory model (the calibration set).

Each entry of the calibration file (``tests/data/memory_calibration.json``) records one
published vLLM or SGLang start-up: model, GPU, TP, engine version, the knobs and measured
terms the log shows, the pool it logged and the log lines themselves. :func:`recompute`
runs :func:`~radixkv.memory.pool.vllm_pool_size` / :func:`~radixkv.memory.pool.sglang_pool_size`
with the logged knobs (measured terms replace radixkv's estimates where the log shows
them; ``rules_version`` selects the version-aware rules) and returns the errors:

* ``kv_gib_err_pct``: vLLM: the KV budget against "Available KV cache memory" /
  ``kv_cache_size``; SGLang: the pool's bytes against the logged K + V size. Percent.
* ``pool_err_pct``: usable tokens against the logged pool's usable tokens. Percent.
* ``bpt_exact``: whether radixkv's KV bytes per token reproduces the logged pool and
  logged GiB together (within the log's 0.01 GiB rounding); None when the log lacks
  one of them or they come from different ranks.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from radixkv.errors import InputError
from radixkv.memory.pool import sglang_pool_size, vllm_pool_size, vllm_version_rules
from radixkv.memory.presets import get_gpu, get_model
from radixkv.memory.specs import GPUSpec, ModelSpec
from radixkv.memory.startup_log import parse_startup_log

GiB = 2**30


def load_calibration(path) -> list[dict]:
    """The entries of a calibration JSON file.

    Raises
    ------
    InputError
        Unreadable file or no ``entries`` list.
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read calibration file: {e}", path=str(p)) from None
    if not isinstance(doc.get("entries"), list):
        raise InputError("no 'entries' list", path=str(p), field="entries")
    return doc["entries"]


def _gib(x) -> int:
    return int(round(float(x) * GiB))


def entry_model(entry: dict) -> ModelSpec:
    """The model of a calibration entry: a preset by ``model``, or ``model_spec`` inline.

    ``model_spec`` holds :class:`~radixkv.memory.specs.ModelSpec` fields copied from the
    model's Hugging Face ``config.json`` (for models that are not presets); ``dtype``
    overrides the model dtype (and the weight dtype when they were equal).

    Raises
    ------
    InputError
        Unknown preset, or a ``model_spec`` that is not a valid ModelSpec.
    """
    spec = entry.get("model_spec")
    if spec is not None:
        try:
            model = ModelSpec(name=entry["model"], **spec)
        except TypeError as e:
            raise InputError(f"{entry['id']}: bad model_spec: {e}", field="model_spec") from None
    else:
        model = get_model(entry["model"])
    if entry.get("dtype"):
        model = replace(model, dtype=entry["dtype"], weight_dtype=(
            entry["dtype"] if model.weight_dtype == model.dtype else model.weight_dtype))
    return model


def source_url(entry: dict) -> str:
    """The public address of an entry's log: a GitHub issue, pull request or file.

    ``source.kind`` is ``"issue"`` / ``"pull request"`` (with ``number``) or ``"file"``
    (with ``path`` and ``commit``: a file in a repository at a fixed commit).
    """
    s = entry["source"]
    if s["kind"] == "file":
        return f"https://github.com/{s['repo']}/blob/{s['commit']}/{s['path']}"
    return (f"https://github.com/{s['repo']}/"
            f"{'pull' if s['kind'] == 'pull request' else 'issues'}/{s['number']}")


def _bpt_consistent(engine: str, bpt: int, unit: int, logged: dict, lp) -> bool | None:
    """Do the logged pool and the logged GiB agree with ``bpt`` bytes per token?"""
    if engine == "vllm":
        g = logged.get("kv_cache_gib")
        if g is None:
            return None
        lo, hi = (g - 0.005) * GiB, (g + 0.005) * GiB
        per_block = bpt * unit
        return math.floor(lo / per_block) <= lp.num_gpu_blocks <= math.floor(hi / per_block)
    if "k_size_gb" in logged:
        # SGLang allocates size + page_size rows (mem_cache/memory_pool.py); K and V
        # each take half of a token's cell and are logged rounded to 0.01 GiB
        rows = lp.max_total_num_tokens + unit
        half = rows * bpt / 2 / GiB
        return abs(half - logged["k_size_gb"]) <= 0.005 + 1e-9 and \
            abs(half - logged["v_size_gb"]) <= 0.005 + 1e-9
    if "kv_size_gb" in logged:
        # MLA pools log one "KV size" (latent, plus the indexer cache when counted)
        rows = lp.max_total_num_tokens + unit
        return abs(rows * bpt / GiB - logged["kv_size_gb"]) <= 0.005 + 1e-9
    return None


def inputs_logged(entry: dict) -> bool:
    """Does the log show every term the entry's engine version sizes the pool with?

    vLLM: device total, weights, non-torch memory and the activation peak, plus the
    CUDA-graph pool from 0.21 on (:func:`~radixkv.memory.pool.vllm_version_rules`).
    SGLang: ``mem_fraction_static``, the free memory before loading and the weights.
    Where this is True nothing in the recomputation is estimated, so the pool must come
    out within the 5 % the calibration test allows.
    """
    meas, knobs = entry.get("measured", {}), entry.get("knobs", {})
    if entry["engine"] == "vllm":
        need = {"total_gib", "weights_gib", "non_torch_gib"}
        if vllm_version_rules(entry.get("rules_version"))["cuda_graphs_in_budget"]:
            need.add("cuda_graph_gib")
        return need <= meas.keys() and ("activation_gib" in meas or "peak_torch_gib" in meas)
    return ("mem_fraction_static" in knobs and "preload_free_gib" in meas
            and "weights_gib" in meas)


def recompute(entry: dict) -> dict:
    """radixkv's pool for one calibration entry, and its errors against the log.

    Returns
    -------
    dict
        ``id``, ``engine``, ``kv_bytes_per_token`` (per rank, the cell the entry's engine
        version sizes the pool with), ``bpt_exact``, ``inputs_logged``
        (:func:`inputs_logged`),
        ``logged_tokens``, ``model_tokens``, ``pool_err_pct``, ``logged_kv_gib``,
        ``model_kv_gib``, ``kv_gib_err_pct`` (None when the log has no GiB figure),
        ``from_log`` (the pool :func:`parse_startup_log` reads from ``log_lines``).

    Raises
    ------
    InputError
        Unknown model/GPU, or log lines without a pool.
    """
    eng = entry["engine"]
    model = entry_model(entry)
    tp = int(entry["tp"])
    kv = entry.get("kv_cache_dtype", "auto")
    # knobs the log shows, then engine defaults the log does not show (``assumed``)
    knobs = {**entry.get("assumed", {}), **entry.get("knobs", {})}
    meas, logged = entry.get("measured", {}), entry["logged"]
    lp = parse_startup_log("\n".join(entry["log_lines"]), path=entry["id"], engine=eng,
                           block_size=knobs.get("block_size"))
    weights = _gib(meas["weights_gib"]) if "weights_gib" in meas else None
    if eng == "vllm":
        gpu = get_gpu(entry["gpu"])
        kw = {}
        if "total_gib" in meas:
            kw["total_bytes"] = _gib(meas["total_gib"])
        if "non_torch_gib" in meas:
            kw["non_torch_bytes"] = _gib(meas["non_torch_gib"])
        if "activation_gib" in meas:
            kw["activation_bytes"] = _gib(meas["activation_gib"])
        elif "peak_torch_gib" in meas:
            kw["activation_bytes"] = _gib(meas["peak_torch_gib"] - meas["weights_gib"])
        if "cuda_graph_gib" in meas:
            kw["cuda_graph_bytes"] = _gib(meas["cuda_graph_gib"])
        pool = vllm_pool_size(
            model, gpu, tp=tp, kv_cache_dtype=kv,
            gpu_memory_utilization=knobs.get("gpu_memory_utilization"),
            block_size=knobs.get("block_size", 16),
            max_num_batched_tokens=knobs.get("max_num_batched_tokens", 8192),
            engine_version=entry.get("rules_version"), weight_bytes=weights, **kw)
        model_gib = pool.budget_bytes / GiB
        logged_gib = logged.get("kv_cache_gib")
        logged_tokens = lp.capacity_tokens
    else:
        if entry.get("gpu"):
            gpu = get_gpu(entry["gpu"])
            # "Load weight begin. avail mem=X GB": SGLang's pre_model_load_memory (min
            # over ranks); without it radixkv's estimate of the memory in use applies
            used0 = (max(gpu.total_bytes - _gib(meas["preload_free_gib"]), 0)
                     if "preload_free_gib" in meas else None)
        else:
            free = _gib(meas["preload_free_gib"])
            gpu = GPUSpec(name="from-log", total_bytes=free, bf16_flops=1.0, hbm_bytes_per_s=1.0)
            used0 = 0
        # DP attention (--enable-dp-attention --dp-size D); a measured reservation the
        # engine version takes out of the budget (e.g. PR #18263's AITER workspace)
        dp = int(knobs.get("dp_size", 1)) if knobs.get("enable_dp_attention") else 1
        pool = sglang_pool_size(model, gpu, tp=tp, kv_cache_dtype=kv,
                                mem_fraction_static=knobs.get("mem_fraction_static"),
                                page_size=knobs.get("page_size", 1), preload_used_bytes=used0,
                                engine_version=entry.get("rules_version"),
                                weight_bytes=weights, dp_size=dp,
                                extra_reserved_bytes=int(meas.get("extra_reserved_bytes", 0)))
        model_gib = (pool.max_total_num_tokens + pool.unit_tokens) * pool.kv_bytes_per_token / GiB
        logged_gib = (logged["k_size_gb"] + logged["v_size_gb"]) if "k_size_gb" in logged \
            else logged.get("kv_size_gb")
        logged_tokens = lp.capacity_tokens
    # the cell the engine version sized the pool with (e.g. SGLang before 0.5.4 leaves
    # DeepSeek-V3.2's indexer cache out of it)
    bpt = pool.kv_bytes_per_token
    same_rank = entry.get("same_rank", True)
    exact = _bpt_consistent(eng, bpt, pool.unit_tokens, logged, lp) if same_rank else None
    return {
        "id": entry["id"], "engine": eng, "kv_bytes_per_token": bpt, "bpt_exact": exact,
        "inputs_logged": inputs_logged(entry),
        "logged_tokens": logged_tokens, "model_tokens": pool.capacity_tokens,
        "pool_err_pct": 100.0 * (pool.capacity_tokens - logged_tokens) / logged_tokens,
        "logged_kv_gib": logged_gib, "model_kv_gib": model_gib,
        "kv_gib_err_pct": None if logged_gib is None else 100.0 * (model_gib - logged_gib) / logged_gib,
        "from_log": lp,
    }


__all__ = ["entry_model", "inputs_logged", "load_calibration", "recompute", "source_url"]
