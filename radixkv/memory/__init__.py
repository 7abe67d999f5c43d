"""GPU-memory model: how many bytes of KV cache a token takes and how large a KV pool
vLLM and SGLang build on a given model, GPU and tensor-parallel size.

* :mod:`radixkv.memory.hf_config` a Hugging Face ``config.json`` read into ``ModelSpec``'s fields
* :mod:`radixkv.memory.specs`     ``ModelSpec`` (``from_hf_config``), ``GPUSpec``, KV bytes per token
* :mod:`radixkv.memory.presets`   the preset models and GPUs, lookup by name
* :mod:`radixkv.memory.pool`      the engines' pool-size rules, ``PoolSize``, ``pool_for``,
  vLLM's start-up check that the pool holds one ``max_model_len`` request
* :mod:`radixkv.memory.engine_defaults` the engines' serving knobs by GPU when none is given
  (and the tokens of vLLM's profiling pass, ``vllm_profile_tokens``)
* :mod:`radixkv.memory.hybrid`    vLLM's KV cache groups of a hybrid model, block ids per budget
* :mod:`radixkv.memory.startup_log` the pool an engine logged at start-up (``--pool-from-log``)
* :mod:`radixkv.memory.calibration` radixkv's model against published start-up logs
"""
from radixkv.memory.engine_defaults import engine_batch_defaults, vllm_profile_tokens
from radixkv.memory.hf_config import estimate_num_params
from radixkv.memory.pool import (
    AccountingRow,
    PoolSize,
    pool_for,
    sglang_default_mem_fraction_static,
    sglang_dp_attention_extra_weight_bytes,
    sglang_legacy_mem_fraction_static,
    sglang_pool_size,
    sglang_version_rules,
    vllm_pool_size,
    vllm_start_max_model_len,
    vllm_version_rules,
)
from radixkv.memory.presets import GPU_PRESETS, MODEL_PRESETS, get_gpu, get_model
from radixkv.memory.startup_log import LoggedPool, parse_startup_log, read_startup_log
from radixkv.memory.specs import DTYPE_BYTES, GPUSpec, ModelSpec, dtype_bytes, load_hf_config

__all__ = [
    "AccountingRow", "DTYPE_BYTES", "LoggedPool", "parse_startup_log", "read_startup_log", "GPUSpec", "GPU_PRESETS", "MODEL_PRESETS", "ModelSpec",
    "PoolSize", "dtype_bytes", "engine_batch_defaults", "estimate_num_params", "get_gpu", "get_model",
    "load_hf_config", "pool_for", "sglang_default_mem_fraction_static", "sglang_pool_size",
    "sglang_dp_attention_extra_weight_bytes",
    "vllm_pool_size", "sglang_legacy_mem_fraction_static", "sglang_version_rules",
    "vllm_profile_tokens", "vllm_start_max_model_len", "vllm_version_rules",
]
