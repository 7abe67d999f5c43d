"""The serving knobs an engine picks for itself on a given GPU when the operator sets none:
``max_num_batched_tokens`` / ``chunked_prefill_size``, ``max_num_seqs`` /
``max_running_requests`` and the memory fraction.

Both engines choose their step budget by the GPU they find at start-up, so "the engine's
defaults" differ between an A100 and an H100. :func:`engine_batch_defaults` gives them for
a GPU preset (``radixkv.memory.presets``), for ``vllm serve`` and
``python -m sglang.launch_server`` (the server entry points, not vLLM's offline ``LLM``
class).
"""
from __future__ import annotations

from radixkv.errors import InputError
from radixkv.memory.pool import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, sglang_default_chunked_prefill_size
from radixkv.memory.specs import GPUSpec

_GiB = 2**30

#: SGLang's ``max_running_requests`` when unset (``--max-running-requests`` not given).
#: SGLang derives it from the pool: ``min(clamp(int(T / context_len * 512), 2048, 4096),
#: T // 2)`` for a pool of T tokens (``model_executor/model_runner_kv_cache_mixin.py ::
#: _resolve_max_num_reqs``, the size of its request-to-token table), then the scheduler
#: takes the least of that and its attention backend's limit (``managers/scheduler.py``,
#: "Max running requests constraints"). **Assumed** 2,048, the table's floor: SGLang's
#: value on a pool of 4,096 tokens up to 4 context lengths, and a bound the concurrent
#: replays rarely reach. ``radixkv plan`` starts its SGLang points from it and the concurrent replay's
#: step defaults use it (:func:`radixkv.replay.settings.step_defaults`), so both agree.
SGLANG_DEFAULT_MAX_RUNNING_REQUESTS = 2048

#: vLLM's OpenAI-server batch defaults by GPU class, ``(max_num_batched_tokens,
#: max_num_seqs)`` (``vllm/engine/arg_utils.py :: EngineArgs.get_batch_defaults``, vLLM
#: 0.33.0; docs/engines/vllm.md §4).
VLLM_SERVER_BATCH_DEFAULTS = {
    "≥160GiB": (16384, 1024),         # B200/B300 class
    "≥70GiB, not A100": (8192, 1024),  # H100, H200, MI300x class
    "other": (2048, 256),              # A100 (any memory), and every GPU under 70 GiB
}


def _gpu(gpu) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    from radixkv.memory.presets import get_gpu

    return get_gpu(gpu)


def vllm_gpu_class(gpu) -> str:
    """The key of :data:`VLLM_SERVER_BATCH_DEFAULTS` vLLM's rule puts *gpu* in.

    vLLM ``vllm/engine/arg_utils.py :: EngineArgs.get_batch_defaults`` reads the device's
    total memory and its name: ≥ 160 GiB is the largest class; ≥ 70 GiB with a name that
    does not contain "a100" (case-insensitive) the middle one (an A100 is kept out of it:
    vLLM PR #17885 found the larger budget lowers its throughput); everything else the
    smallest. vLLM reads the memory from the device (``torch``'s total, a few hundred MiB
    under nvidia-smi's); the preset's nvidia-smi total is used here. No preset lies within
    a GiB of either threshold, so the two readings put every preset in the same class.

    Parameters
    ----------
    gpu : str or GPUSpec
        A GPU preset name (``radixkv.memory.get_gpu``) or a spec.

    Raises
    ------
    radixkv.errors.InputError
        An unknown GPU name (field ``gpu``; lists the presets).
    """
    g = _gpu(gpu)
    if g.total_bytes >= 160 * _GiB:
        return "≥160GiB"
    if g.total_bytes >= 70 * _GiB and "a100" not in g.name.lower():
        return "≥70GiB, not A100"
    return "other"


def engine_batch_defaults(engine: str, gpu) -> dict:
    """The engine's own serving defaults on *gpu*: what ``vllm serve`` or
    ``python -m sglang.launch_server`` runs with when no knob is given.

    - vLLM (0.33.0): ``max_num_batched_tokens`` and ``max_num_seqs`` by the GPU's class
      (:func:`vllm_gpu_class`, ``vllm/engine/arg_utils.py :: EngineArgs.get_batch_defaults``,
      ``UsageContext.OPENAI_API_SERVER``): 16384 / 1024 at ≥ 160 GiB; 8192 / 1024 at
      ≥ 70 GiB unless the GPU is an A100; 2048 / 256 otherwise.
      ``gpu_memory_utilization`` 0.92
      (:data:`radixkv.memory.pool.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION`, ``CacheConfig``;
      raised from 0.9 by vLLM PR #38284).
    - SGLang: ``chunked_prefill_size`` by the GPU's memory
      (:func:`radixkv.memory.pool.sglang_default_chunked_prefill_size`,
      ``arg_groups/memory_hook.py :: handle_gpu_memory_settings``);
      ``max_running_requests`` :data:`SGLANG_DEFAULT_MAX_RUNNING_REQUESTS` (assumed);
      ``mem_fraction_static`` depends on the model and TP as well
      (:func:`radixkv.memory.sglang_default_mem_fraction_static`), so it is None here.

    Parameters
    ----------
    engine : {"vllm", "sglang"}
    gpu : str or GPUSpec
        A GPU preset name (case-insensitive) or a spec.

    Returns
    -------
    dict
        ``max_num_batched_tokens`` (int, tokens per engine step; SGLang
        ``chunked_prefill_size``), ``max_num_seqs`` (int, running requests; SGLang
        ``max_running_requests``) and ``memory_fraction`` (float, vLLM
        ``gpu_memory_utilization``; None for SGLang).

    Raises
    ------
    radixkv.errors.InputError
        An engine other than vllm/sglang (field ``engine``) or an unknown GPU name (field
        ``gpu``, listing the presets).
    """
    if engine == "vllm":
        mnbt, seqs = VLLM_SERVER_BATCH_DEFAULTS[vllm_gpu_class(gpu)]
        return {"max_num_batched_tokens": mnbt, "max_num_seqs": seqs,
                "memory_fraction": VLLM_DEFAULT_GPU_MEMORY_UTILIZATION}
    if engine == "sglang":
        return {"max_num_batched_tokens": sglang_default_chunked_prefill_size(_gpu(gpu)),
                "max_num_seqs": SGLANG_DEFAULT_MAX_RUNNING_REQUESTS, "memory_fraction": None}
    raise InputError(f"unknown engine {engine!r}; one of vllm, sglang", field="engine")


def vllm_profile_tokens(max_num_batched_tokens, gpu) -> int:
    """The tokens of vLLM's profiling pass: *max_num_batched_tokens* when given, else the
    value ``vllm serve`` picks on *gpu* (:func:`radixkv.memory.engine_batch_defaults`:
    2048 on an A100 or a GPU under 70 GiB, 8192 on an H100/H200 class, 16384 at ≥ 160 GiB;
    vLLM ``vllm/engine/arg_utils.py :: EngineArgs.get_batch_defaults``). vLLM profiles one
    step of ``max_num_batched_tokens`` tokens before it sizes the KV cache
    (``Worker.determine_available_memory``), so its default pool depends on the GPU.

    Parameters
    ----------
    max_num_batched_tokens : int or None
        The user's ``--max-num-batched-tokens`` (tokens), or None.
    gpu : str or GPUSpec
        The GPU preset name or spec.

    Raises
    ------
    radixkv.errors.InputError
        An unknown GPU name (field ``gpu``), when no value is given.
    """
    if max_num_batched_tokens is not None:
        return max_num_batched_tokens
    return engine_batch_defaults("vllm", gpu)["max_num_batched_tokens"]
