"""vLLM's KV cache groups for a hybrid attention model, and the block ids a budget buys.

vLLM 0.33 gives a model whose attention layers are of several kinds (full and sliding
window, all with the same page size per layer) one KV cache group per kind, then splits
the kinds into groups of equal layer count so that one block id addresses one page in each
of ``group_size`` shared tensors (``vllm/v1/core/kv_cache_planning.py ::
_get_kv_cache_groups_uniform_page_size``):

- ``group_size`` = the smallest number of layers of one kind, or the largest when that is
  below 1.5 × the smallest (fewer padding layers; gpt-oss-20b's 12 sliding + 12 full → 12);
- each kind is split into ``ceil(layers / group_size)`` groups; the last one is padded to
  ``group_size`` layers (the padding takes memory);
- a block id takes ``block_size × group_size × (KV bytes of one layer and token)`` bytes,
  so a budget of M bytes per rank buys ``M // that`` block ids (block 0 the null block).

Gemma-3-27B (10 full, 52 sliding): group size 10, 1 full + 6 sliding groups (8 padding
layers), a block id = 16 × 10 × 8,192 B = 1.25 MiB at block 16 and tp 1.

Models with linear-attention (Mamba) layers are not covered: vLLM then raises the
attention block size until an attention page matches a Mamba state page
(``kv_cache_planning.py :: unify_kv_cache_spec_page_size``), which is not modelled here.
"""
from __future__ import annotations

from dataclasses import dataclass

from radixkv.errors import ConfigError
from radixkv.memory.specs import ModelSpec


@dataclass(frozen=True)
class KVCacheGroup:
    """One vLLM KV cache group: its kind, sliding window (None for full attention) and the
    layers it holds (``padding`` of them are vLLM's padding layers)."""

    kind: str
    window: int | None
    layers: int
    padding: int


def vllm_kv_cache_groups(model: ModelSpec) -> tuple[list[KVCacheGroup], int]:
    """vLLM's KV cache groups of *model* and the group size (layers per group).

    Returns
    -------
    (groups, group_size)
        Full-attention groups first, then sliding ones (vLLM orders buckets by first
        layer; the lookup puts full attention first). A full-attention model gives one
        group of all its layers.

    Raises
    ------
    ConfigError
        When the model has linear-attention layers (page-size unification with Mamba
        states is not modelled).
    """
    c = model.layer_counts()
    if c["linear_attention"]:
        raise ConfigError(f"{model.name}: vLLM's grouping with linear-attention (Mamba) layers is not modelled",
                          field="model")
    kinds = [(k, n) for k, n in (("full_attention", c["full_attention"]), ("sliding_attention",
                                                                         c["sliding_attention"])) if n]
    lo = min(n for _, n in kinds)
    hi = max(n for _, n in kinds)
    size = hi if hi < lo * 1.5 else lo
    groups = []
    for kind, n in kinds:
        k = -(-n // size)
        pad = k * size - n
        w = model.sliding_window if kind == "sliding_attention" else None
        for i in range(k):
            groups.append(KVCacheGroup(kind, w, size, pad if i == k - 1 else 0))
    return groups, size


def vllm_hybrid_num_gpu_blocks(model: ModelSpec, budget_bytes: int, *, block_size: int = 16, tp: int = 1,
                               kv_cache_dtype: str | None = None) -> int:
    """Block ids (vLLM ``num_gpu_blocks``, null block included) a KV budget per rank buys
    for *model*'s KV cache groups: ``budget // (block_size × group_size × per-layer bytes)``.

    Parameters
    ----------
    budget_bytes : int
        vLLM's ``available_kv_cache_memory`` per rank (:func:`radixkv.memory.vllm_pool_size`'s
        ``budget_bytes``).

    Raises
    ------
    ConfigError
        As :func:`vllm_kv_cache_groups`, or when the budget buys fewer than 2 block ids.
    """
    _, size = vllm_kv_cache_groups(model)
    per_layer = model.kv_elements_per_token_layer(tp) * model.kv_dtype_bytes(kv_cache_dtype)
    n = int(budget_bytes) // (int(block_size) * size * per_layer)
    if n < 2:
        raise ConfigError(f"{model.name}: a KV budget of {budget_bytes} B buys {n} block ids (need ≥ 2)",
                          field="budget_bytes")
    return n
