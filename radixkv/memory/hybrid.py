"""vLLM's KV cache groups for a hybrid model, its block size, and the block ids a budget buys.

vLLM 0.33 gives a model whose layers are of several kinds (full attention, sliding window,
linear attention / Mamba) one KV cache group per kind, then splits the kinds into groups of
equal layer count so that one block id addresses one page in each of ``group_size`` shared
tensors (``vllm/v1/core/kv_cache_planning.py :: _get_kv_cache_groups_uniform_page_size``):

- ``group_size`` = the smallest number of layers of one kind, or the largest when that is
  below 1.5 × the smallest (fewer padding layers; gpt-oss-20b's 12 sliding + 12 full → 12);
- each kind is split into ``k = ceil(layers / group_size)`` groups, its layers dealt out
  round-robin (``layers[i::k]``); a group with fewer than ``group_size`` layers is padded
  (the padding takes memory);
- a block id takes ``group_size`` pages (``_get_kv_cache_bytes_per_block``: the largest
  group's pages), so a budget of M bytes per rank buys ``M // that`` block ids
  (``get_kv_cache_config_from_groups``; block 0 is the null block).

Gemma-3-27B (10 full, 52 sliding): group size 10, 1 full + 6 sliding groups of 9, 9, 9, 9,
8, 8 layers (8 padding layers), a block id = 16 × 10 × 8,192 B = 1.25 MiB at block 16 and tp 1.

Linear-attention (Mamba / gated delta net) layers keep one state per sequence, a page of
its own size. With prefix caching (``mamba_cache_mode="align"``) vLLM raises the attention
block size until an attention page covers a Mamba state page and pads the state page to
it (``vllm/platforms/interface.py :: Platform._align_hybrid_block_size``), so all pages are
equal and the grouping above applies, every group with the raised block size
(:func:`vllm_hybrid_block_size`). Qwen3-Next-80B-A3B (12 full, 36 linear; 2 KV heads of
256, bf16): a state page of 1,097,728 B, an attention token page of 2,048 B per layer →
block size 544, 1 full + 3 Mamba groups of 12 layers, a block id = 12 × 544 × 2,048 B.
"""
from __future__ import annotations

from dataclasses import dataclass

from radixkv.errors import ConfigError
from radixkv.memory.specs import ModelSpec, dtype_bytes

#: FlashAttention's kernel block sizes: multiples of 16 tokens
#: (``vllm/v1/attention/backends/flash_attn.py :: get_supported_kernel_block_sizes``)
FLASH_ATTN_KERNEL_BLOCK = 16


@dataclass(frozen=True)
class KVCacheGroup:
    """One vLLM KV cache group: its kind (``full_attention``, ``sliding_attention``,
    ``linear_attention``), sliding window (None otherwise) and the layers it holds
    (``padding`` of them are vLLM's padding layers)."""

    kind: str
    window: int | None
    layers: int
    padding: int


def vllm_kv_cache_groups(model: ModelSpec) -> tuple[list[KVCacheGroup], int]:
    """vLLM's KV cache groups of *model* and the group size (layers per group).

    Returns
    -------
    (groups, group_size)
        In vLLM's group order: the kinds in the order of their first layer (the layer specs
        are bucketed in layer order; Gemma 3 and Qwen3-Next start with a sliding / linear
        layer, so their full-attention group comes last). A full-attention model gives one
        group of all its layers.
    """
    c = model.layer_counts()
    order = list(dict.fromkeys(model.layer_types or ())) or ["full_attention"]
    kinds = [(k, c[k]) for k in order if c[k]]
    lo = min(n for _, n in kinds)
    hi = max(n for _, n in kinds)
    size = hi if hi < lo * 1.5 else lo
    groups = []
    for kind, n in kinds:
        k = -(-n // size)
        w = model.sliding_window if kind == "sliding_attention" else None
        for i in range(k):  # vLLM deals the layers out round-robin (layers[i::k])
            real = -(-(n - i) // k)
            groups.append(KVCacheGroup(kind, w, size, size - real))
    return groups, size


def mamba_page_bytes(model: ModelSpec, tp: int = 1) -> int:
    """Bytes of one linear-attention layer's state on one rank (vLLM ``MambaSpec.page_size_bytes``
    before padding: conv + temporal state, ``MambaStateShapeCalculator.gated_delta_net_state_shape``
    and ``MambaStateDtypeCalculator.gated_delta_net_state_dtype``, both in the model dtype
    unless the spec's ``state_dtype`` says otherwise); 0 for a model without such layers."""
    if not model.layer_counts()["linear_attention"]:
        return 0
    return model.ssm.state_elements(tp) * dtype_bytes(model.ssm.state_dtype or model.dtype, field="state_dtype")


def vllm_hybrid_block_size(model: ModelSpec, *, block_size: int = 16, tp: int = 1,
                           kv_cache_dtype: str | None = None,
                           kernel_block_size: int = FLASH_ATTN_KERNEL_BLOCK) -> int:
    """The block size (tokens) vLLM runs *model* with in Mamba align mode.

    ``Platform._align_hybrid_block_size`` (vLLM 0.33, ``vllm/platforms/interface.py``):
    with ``k = max(kernel_block_size, block_size)``, the attention block is
    ``k × ceil(state page / (k × attention bytes per token and layer))``, rounded up to a
    multiple of ``kernel_block_size``; the block size is the larger of that and
    *block_size*. The GDN prefill backend is taken to export no checkpoint inside a chunk
    (triton; FlashInfer on Hopper would also align to its 64-token checkpoint grid). A
    model without linear-attention layers keeps *block_size*.

    Raises
    ------
    ConfigError
        ``block_size`` or ``kernel_block_size`` < 1.
    """
    bs, kb = int(block_size), int(kernel_block_size)
    if bs < 1 or kb < 1:
        raise ConfigError(f"block_size and kernel_block_size must be ≥ 1, got {bs}, {kb}", field="block_size")
    m = mamba_page_bytes(model, tp)
    if not m:
        return bs
    a = model.kv_elements_per_token_layer(tp) * model.kv_dtype_bytes(kv_cache_dtype)
    k = max(kb, bs)
    attn = k * -(-m // (k * a))
    attn = kb * -(-attn // kb)
    return max(bs, attn)


def vllm_hybrid_num_gpu_blocks(model: ModelSpec, budget_bytes: int, *, block_size: int = 16, tp: int = 1,
                               kv_cache_dtype: str | None = None) -> int:
    """Block ids (vLLM ``num_gpu_blocks``, null block included) a KV budget per rank buys
    for *model*'s KV cache groups: ``budget // (B × group_size × per-layer bytes per
    token)`` with B from :func:`vllm_hybrid_block_size` (the requested *block_size* unless
    the model has linear-attention layers).

    Parameters
    ----------
    budget_bytes : int
        vLLM's ``available_kv_cache_memory`` per rank (:func:`radixkv.memory.vllm_pool_size`'s
        ``budget_bytes``).

    Raises
    ------
    ConfigError
        When the budget buys fewer than 2 block ids.
    """
    _, size = vllm_kv_cache_groups(model)
    B = vllm_hybrid_block_size(model, block_size=block_size, tp=tp, kv_cache_dtype=kv_cache_dtype)
    per_layer = model.kv_elements_per_token_layer(tp) * model.kv_dtype_bytes(kv_cache_dtype)
    n = int(budget_bytes) // (B * size * per_layer)
    if n < 2:
        raise ConfigError(f"{model.name}: a KV budget of {budget_bytes} B buys {n} block ids (need ≥ 2)",
                          field="budget_bytes")
    return n


def vllm_hybrid_policy_option(groups) -> str:
    """The ``vllm-hybrid`` option text for these groups in their order (``window=1024x6+full``,
    ``mambax3+full``; the full-attention group is left out when it is the first)."""
    parts = [g.window if g.kind == "sliding_attention" else "mamba" if g.kind == "linear_attention" else "full"
             for g in groups]
    if parts and parts[0] == "full":
        parts = parts[1:]
    out, i = [], 0
    while i < len(parts):
        j = i
        while j < len(parts) and parts[j] == parts[i]:
            j += 1
        out.append(f"{parts[i]}" + (f"x{j - i}" if j - i > 1 else ""))
        i = j
    return ("" if parts and parts[0] in ("mamba", "full") else "window=") + "+".join(out)
