"""Model and GPU descriptions, and the KV-cache size of one token.

A :class:`ModelSpec` holds the shapes that decide how many bytes of KV cache one token
takes (layers, KV heads, head dims, or the MLA latent) plus what the memory model needs
around it (parameter count and weight dtype for the weights term, hidden and intermediate
sizes for the activation estimate). A :class:`GPUSpec` holds a device's memory, peak dense
bf16 FLOP/s and HBM bandwidth.

KV bytes per token (both engines size their pool with the same per-token figure):

* MHA / GQA, vLLM ``v1/kv_cache_interface.py :: AttentionSpec.page_size_bytes`` divided by
  ``block_size``, SGLang ``model_executor/pool_configurator.py :: _compute_cell_size``::

      layers × kv_heads_per_rank × (head_dim + v_head_dim) × dtype_bytes

  with ``kv_heads_per_rank = max(1, kv_heads // tp)``: KV heads are split over the tensor
  parallel ranks, and replicated (one per rank) when there are fewer KV heads than ranks
  (vLLM ``model_executor/layers/linear.py :: QKVParallelLinear``, SGLang the same rule).
* MLA (DeepSeek-V2/V3): one latent of ``kv_lora_rank + qk_rope_head_dim`` elements per
  layer and token, the same on every rank (never split by TP): vLLM
  ``MLAAttentionSpec`` (one "head" of 576, no V), SGLang
  ``kv_cache_configurator.py :: calculate_mla_kv_cache_dim``.
* Hybrid models (``layer_types``): only full- and sliding-window-attention layers hold
  per-token KV, so the sums above run over those layers (:attr:`ModelSpec.num_kv_layers`);
  linear-attention (SSM) layers hold one fixed-size state per sequence instead
  (:class:`SSMSpec`, :meth:`ModelSpec.state_bytes_per_sequence`). vLLM gives each layer
  kind its own KV cache group (``v1/core/kv_cache_utils.py :: get_kv_cache_groups``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from radixkv.errors import ConfigError, InputError
from radixkv.memory.hf_config import LAYER_KINDS, read_hf_config

#: bytes per element of the dtype names vLLM (``--kv-cache-dtype``, ``--dtype``),
#: SGLang and Hugging Face ``torch_dtype`` use. fp8 variants store one byte per element
#: (vLLM ``fp8``/``fp8_e4m3``/``fp8_e5m2``; SGLang ``fp8_e4m3``/``fp8_e5m2``); int8 one byte.
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4, "float32": 4, "float": 4,
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int8": 1,
    # DeepSeek's FlashMLA fp8 layout for MLA latents (vLLM ``--kv-cache-dtype fp8_ds_mla``;
    # SGLang's default for DeepSeek-V3.2 sparse attention): see :data:`FP8_DS_MLA`.
    "fp8_ds_mla": 1,
}

#: The fp8 MLA cache layout DeepSeek's FlashMLA reads (vLLM ``fp8_ds_mla``,
#: ``v1/attention/backends/mla/flashmla_sparse.py``; SGLang
#: ``mem_cache/memory_pool.py :: NSATokenToKVPool``): per layer and token, the
#: ``kv_lora_rank`` latent in fp8, one fp32 scale per 128 latent elements, and the
#: ``qk_rope_head_dim`` RoPE key left in bf16 — 512 + 4 × 4 + 64 × 2 = 656 bytes for
#: DeepSeek-V3.
FP8_DS_MLA = "fp8_ds_mla"


def dtype_bytes(name: str, *, field: str = "dtype") -> int:
    """Bytes per element of a dtype name (case-insensitive).

    Parameters
    ----------
    name : str
        A key of :data:`DTYPE_BYTES` (e.g. ``"bf16"``, ``"bfloat16"``, ``"fp8"``, ``"int8"``).
    field : str
        Field name to put in the error.

    Returns
    -------
    int
        Bytes per element: 4, 2 or 1.

    Raises
    ------
    InputError
        The name is not a known dtype.
    """
    key = str(name).lower()
    if key not in DTYPE_BYTES:
        raise InputError(
            f"unknown dtype {name!r}; known: {', '.join(sorted(DTYPE_BYTES))}", field=field
        )
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class SSMSpec:
    """The per-sequence state of one linear-attention (gated delta net) layer.

    Qwen3-Next's ``linear_attention`` layers (Hugging Face ``Qwen3NextConfig``: the
    ``linear_*`` fields). Shapes per TP rank, vLLM
    ``model_executor/layers/mamba/mamba_utils.py ::
    MambaStateShapeCalculator.gated_delta_net_state_shape``::

        conv state      (num_k_heads·head_k_dim·2 + num_v_heads·head_v_dim) / tp × (conv_kernel − 1)
        temporal state  num_v_heads / tp × head_v_dim × head_k_dim

    both in the model dtype unless ``state_dtype`` says otherwise (vLLM
    ``MambaStateDtypeCalculator.gated_delta_net_state_dtype``: ``mamba_cache_dtype`` and
    ``mamba_ssm_cache_dtype`` default to ``"auto"`` = the model dtype).

    Attributes
    ----------
    conv_kernel : int
        ``linear_conv_kernel_dim`` (tokens).
    num_k_heads, num_v_heads : int
        ``linear_num_key_heads``, ``linear_num_value_heads``.
    head_k_dim, head_v_dim : int
        ``linear_key_head_dim``, ``linear_value_head_dim`` (elements).
    state_dtype : str or None
        dtype of both states; None = the model dtype.
    """

    conv_kernel: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    state_dtype: str | None = None

    def __post_init__(self):
        for f in ("conv_kernel", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"):
            _positive_int(getattr(self, f), f)
        if self.state_dtype is not None:
            dtype_bytes(self.state_dtype, field="state_dtype")

    def state_elements(self, tp: int = 1) -> int:
        """Elements of one layer's state on one TP rank (conv + temporal).

        Raises
        ------
        ConfigError
            When ``tp`` does not divide the conv width or ``num_v_heads`` (vLLM's
            ``divide`` asserts the same).
        """
        _positive_int(tp, "tp")
        conv_dim = self.head_k_dim * self.num_k_heads * 2 + self.head_v_dim * self.num_v_heads
        if conv_dim % tp or self.num_v_heads % tp:
            raise ConfigError(f"linear-attention heads cannot be split over tp={tp}", field="tp")
        return conv_dim // tp * (self.conv_kernel - 1) + self.num_v_heads // tp * self.head_v_dim * self.head_k_dim


def _positive_int(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"must be a positive integer, got {value!r}", field=field)
    return value


@dataclass(frozen=True)
class ModelSpec:
    """The shapes of a decoder-only transformer that decide its memory.

    Attributes
    ----------
    name : str
        Display name (a preset's name or the config file's stem).
    num_layers : int
        Attention layers (HF ``num_hidden_layers``).
    num_attention_heads : int
        Query heads (HF ``num_attention_heads``).
    num_kv_heads : int
        KV heads before TP splitting (HF ``num_key_value_heads``; equals
        ``num_attention_heads`` for MHA). For MLA models it is informational only.
    head_dim : int
        Per-head K width in elements (HF ``head_dim``, else ``hidden_size //
        num_attention_heads``).
    v_head_dim : int
        Per-head V width in elements; equal to ``head_dim`` unless the model says otherwise.
    hidden_size : int
        Residual width (elements); used by the weights and activation estimates.
    intermediate_size : int
        Dense MLP width (elements); used by the activation estimate.
    vocab_size : int
        Vocabulary size.
    num_params : int
        Parameter count (published, or estimated from shapes by
        :func:`radixkv.memory.hf_config.estimate_num_params`).
    dtype : str
        The model dtype (HF ``torch_dtype``): activations, and the KV cache when
        ``kv_cache_dtype`` is ``"auto"`` (vLLM ``CacheConfig.cache_dtype="auto"``).
    weight_dtype : str
        The dtype the weights are stored in (``"fp8"`` for DeepSeek-V3's block-quantised
        checkpoint, else ``dtype``).
    kv_lora_rank : int or None
        MLA latent rank (DeepSeek ``kv_lora_rank``); None for MHA/GQA models.
    qk_rope_head_dim : int or None
        MLA decoupled RoPE key width (DeepSeek ``qk_rope_head_dim``).
    max_position_embeddings : int
        Longest context the model supports (tokens); vLLM's default ``max_model_len``.
    layer_types : tuple of str or None
        Per layer (``num_layers`` entries) one of :data:`LAYER_KINDS`, Hugging Face's
        ``layer_types``; None = every layer full attention (all models before hybrids).
    sliding_window : int or None
        Tokens a ``sliding_attention`` layer attends to (HF ``sliding_window``; vLLM
        ``SlidingWindowSpec.sliding_window``); required when a layer slides.
    ssm : SSMSpec or None
        State shapes of the ``linear_attention`` layers; required when there are any.
    index_head_dim : int or None
        Width of the DeepSeek sparse-attention indexer key (DeepSeek-V3.2
        ``index_head_dim``); None for models without an indexer. Its cache adds
        :meth:`indexer_bytes_per_token` to every token.
    q_lora_rank : int or None
        MLA query low-rank width (DeepSeek ``q_lora_rank``; None when the query projection
        is full rank, e.g. DeepSeek-V2-Lite). Only the attention-weight count of
        :meth:`attention_params_per_layer` reads it.
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_params: int
    dtype: str = "bf16"
    weight_dtype: str = "bf16"
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    max_position_embeddings: int = 4096
    layer_types: tuple | None = None
    sliding_window: int | None = None
    ssm: SSMSpec | None = None
    index_head_dim: int | None = None
    q_lora_rank: int | None = None

    def __post_init__(self):
        for f in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
                  "v_head_dim", "hidden_size", "intermediate_size", "vocab_size",
                  "num_params", "max_position_embeddings"):
            _positive_int(getattr(self, f), f)
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ConfigError("an MLA model needs both kv_lora_rank and qk_rope_head_dim",
                              field="kv_lora_rank")
        if self.is_mla:
            _positive_int(self.kv_lora_rank, "kv_lora_rank")
            _positive_int(self.qk_rope_head_dim, "qk_rope_head_dim")
        dtype_bytes(self.dtype, field="dtype")
        dtype_bytes(self.weight_dtype, field="weight_dtype")
        if self.index_head_dim is not None:
            _positive_int(self.index_head_dim, "index_head_dim")
        if self.q_lora_rank is not None:
            _positive_int(self.q_lora_rank, "q_lora_rank")
        if self.layer_types is not None:
            lt = tuple(self.layer_types)
            if len(lt) != self.num_layers:
                raise ConfigError(f"{len(lt)} layer_types for {self.num_layers} layers", field="layer_types")
            for i, k in enumerate(lt):
                if k not in LAYER_KINDS:
                    raise ConfigError(f"layer {i}: unknown layer type {k!r}; known: {', '.join(LAYER_KINDS)}",
                                      field="layer_types")
            object.__setattr__(self, "layer_types", lt)
            if "sliding_attention" in lt:
                _positive_int(self.sliding_window, "sliding_window")
            if "linear_attention" in lt and self.ssm is None:
                raise ConfigError("linear_attention layers need their state shapes (ssm)", field="ssm")
            if not any(k != "linear_attention" for k in lt):
                raise ConfigError("a model needs at least one attention layer", field="layer_types")

    # -- layer kinds -----------------------------------------------------------------
    def layer_counts(self) -> dict:
        """Layers of each kind: ``{kind: count}`` over :data:`LAYER_KINDS` (zeros included)."""
        lt = self.layer_types or ("full_attention",) * self.num_layers
        return {k: lt.count(k) for k in LAYER_KINDS}

    @property
    def is_hybrid(self) -> bool:
        """True when not every layer is full attention."""
        return self.layer_types is not None and any(k != "full_attention" for k in self.layer_types)

    @property
    def num_kv_layers(self) -> int:
        """Layers that hold per-token KV: full plus sliding-window attention."""
        c = self.layer_counts()
        return c["full_attention"] + c["sliding_attention"]

    def kv_bytes_per_token_by_kind(self, tp: int = 1, kv_cache_dtype: str | None = None) -> dict:
        """KV bytes one token takes on one rank in each kind's layers:
        ``{"full_attention": B_f, "sliding_attention": B_s}`` (their sum is
        :meth:`kv_bytes_per_token`). A sliding layer keeps only the last
        ``sliding_window − 1`` tokens of a running request (vLLM
        ``SlidingWindowManager.get_num_skipped_tokens``), plus what the prefix cache keeps."""
        per_layer = self.kv_elements_per_token_layer(tp) * self.kv_dtype_bytes(kv_cache_dtype)
        c = self.layer_counts()
        return {"full_attention": c["full_attention"] * per_layer,
                "sliding_attention": c["sliding_attention"] * per_layer}

    def state_bytes_per_sequence(self, tp: int = 1) -> int:
        """Bytes of linear-attention (SSM) state one sequence holds on one rank, summed
        over the ``linear_attention`` layers (0 for a model without them); see
        :class:`SSMSpec`. vLLM keeps one such state per running request, plus one per
        cached checkpoint (``MambaManager``)."""
        n = self.layer_counts()["linear_attention"]
        if n == 0:
            return 0
        dt = self.ssm.state_dtype or self.dtype
        return n * self.ssm.state_elements(tp) * dtype_bytes(dt, field="state_dtype")

    # -- KV cache --------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one shared latent per token and layer)."""
        return self.kv_lora_rank is not None

    def kv_dtype_bytes(self, kv_cache_dtype: str | None = None) -> int:
        """Bytes per KV element: ``kv_cache_dtype``, or the model dtype for None / ``"auto"``."""
        if kv_cache_dtype is None or str(kv_cache_dtype).lower() == "auto":
            return dtype_bytes(self.dtype, field="dtype")
        return dtype_bytes(kv_cache_dtype, field="kv_cache_dtype")

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads one TP rank stores: ``max(1, num_kv_heads // tp)`` (1 for MLA).

        Raises
        ------
        ConfigError
            ``tp`` is not a positive integer, ``num_attention_heads`` is not divisible by
            ``tp``, or neither of ``num_kv_heads`` and ``tp`` divides the other (vLLM
            ``QKVParallelLinear`` and SGLang refuse these).
        """
        _positive_int(tp, "tp")
        if self.num_attention_heads % tp:
            raise ConfigError(
                f"{self.name}: {self.num_attention_heads} attention heads are not divisible "
                f"by tp={tp}", field="tp")
        if self.is_mla:
            return 1
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise ConfigError(
                f"{self.name}: {self.num_kv_heads} KV heads cannot be split over or "
                f"replicated across tp={tp} ranks", field="tp")
        return max(1, self.num_kv_heads // tp)

    def kv_elements_per_token_layer(self, tp: int = 1) -> int:
        """KV elements one rank stores per token and layer.

        MHA/GQA: ``kv_heads_per_rank × (head_dim + v_head_dim)``; MLA:
        ``kv_lora_rank + qk_rope_head_dim`` (not split by TP).
        """
        if self.is_mla:
            self.kv_heads_per_rank(tp)  # validates tp
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.kv_heads_per_rank(tp) * (self.head_dim + self.v_head_dim)

    def kv_bytes_per_token(self, tp: int = 1, kv_cache_dtype: str | None = None) -> int:
        """KV-cache bytes one token takes on one TP rank (SGLang's ``cell_size``).

        Parameters
        ----------
        tp : int
            Tensor-parallel size.
        kv_cache_dtype : str or None
            ``"auto"``/None (model dtype), ``"bf16"``, ``"fp16"``, ``"fp8"``, ``"int8"``, ...

        Returns
        -------
        int
            Bytes per token per rank. E.g. Llama-3.1-8B bf16: 2 × 32 × 8 × 128 × 2 =
            131,072; DeepSeek-V3 bf16: 61 × 576 × 2 = 70,272 at every tp; DeepSeek-V3
            ``fp8_ds_mla``: 61 × 656 = 40,016. A hybrid model counts its full and sliding
            layers only (:attr:`num_kv_layers`); a model with a sparse-attention indexer adds
            :meth:`indexer_bytes_per_token`.
        """
        if kv_cache_dtype is not None and str(kv_cache_dtype).lower() == FP8_DS_MLA:
            if not self.is_mla:
                raise ConfigError(f"{self.name}: kv_cache_dtype fp8_ds_mla is for MLA models",
                                  field="kv_cache_dtype")
            self.kv_heads_per_rank(tp)  # validates tp
            per_layer = (self.kv_lora_rank + -(-self.kv_lora_rank // 128) * 4
                         + self.qk_rope_head_dim * 2)
            return self.num_kv_layers * per_layer + self.indexer_bytes_per_token()
        return (self.num_kv_layers * self.kv_elements_per_token_layer(tp)
                * self.kv_dtype_bytes(kv_cache_dtype) + self.indexer_bytes_per_token())

    def indexer_bytes_per_token(self) -> int:
        """Bytes of the sparse-attention indexer cache per token (0 without an indexer).

        DeepSeek-V3.2 keeps one fp8 indexer key of ``index_head_dim`` elements plus one
        fp32 scale per 128 elements, per layer and token, on every rank (SGLang
        ``mem_cache/memory_pool.py :: NSATokenToKVPool``, ``index_k_with_scale_buffer``;
        vLLM ``DeepseekV32IndexerCache``): 61 × (128 + 4) = 8,052 bytes. Included in
        :meth:`kv_bytes_per_token`.
        """
        if self.index_head_dim is None:
            return 0
        return self.num_layers * (self.index_head_dim + -(-self.index_head_dim // 128) * 4)

    def kv_bytes_per_token_total(self, tp: int = 1, kv_cache_dtype: str | None = None) -> int:
        """KV-cache bytes one token takes summed over all ``tp`` ranks.

        Equals :meth:`kv_bytes_per_token` × ``tp``: replicated KV heads (fewer KV heads
        than ranks) and the MLA latent (held whole by every rank) are counted on each rank
        that stores them.
        """
        return self.kv_bytes_per_token(tp, kv_cache_dtype) * tp

    # -- weights ---------------------------------------------------------------------
    def weight_bytes(self) -> int:
        """Bytes of all weights: ``num_params × bytes(weight_dtype)``.

        An estimate: it ignores the few tensors a quantised checkpoint keeps in higher
        precision (DeepSeek-V3's embeddings, norms and router; its fp8 block scales add
        1/16,384 per weight).
        """
        return self.num_params * dtype_bytes(self.weight_dtype, field="weight_dtype")

    def weight_bytes_per_rank(self, tp: int = 1) -> int:
        """Weights one TP rank loads: ``ceil(weight_bytes / tp)``.

        An estimate: all weights are taken as split evenly (norms, which are replicated,
        are < 0.01% of the parameters of every preset).
        """
        _positive_int(tp, "tp")
        return -(-self.weight_bytes() // tp)

    def attention_params_per_layer(self) -> tuple[int, int]:
        """Parameters of one layer's attention projections: ``(split, replicated)``.

        ``split`` are the parameters SGLang shards over the attention tensor-parallel
        group; ``replicated`` the ones every rank holds whole. GQA/MHA: q, k, v and o
        projections, all split (``hidden × heads × head_dim + hidden × kv_heads ×
        (head_dim + v_head_dim) + heads × v_head_dim × hidden``; biases and norms, < 0.1 %,
        left out). MLA (SGLang ``models/deepseek_v2.py :: DeepseekV2AttentionMLA``):
        ``q_a_proj`` (hidden × q_lora_rank) and ``kv_a_proj_with_mqa`` (hidden ×
        (kv_lora_rank + qk_rope_head_dim)) are ``ReplicatedLinear``; ``q_b_proj``
        (q_lora_rank × heads × head_dim, or ``q_proj`` hidden × heads × head_dim without a
        q LoRA), ``kv_b_proj`` (kv_lora_rank × heads × (qk_nope_head_dim + v_head_dim)) and
        ``o_proj`` (heads × v_head_dim × hidden) are split. The DeepSeek-V3.2 indexer's
        projections are not counted (< 0.5 % of the layer).
        """
        h, H = self.hidden_size, self.num_attention_heads
        o = H * self.v_head_dim * h
        if self.is_mla:
            q_in = self.q_lora_rank if self.q_lora_rank is not None else h
            nope = self.head_dim - self.qk_rope_head_dim
            split = (q_in * H * self.head_dim
                     + self.kv_lora_rank * H * (nope + self.v_head_dim) + o)
            repl = ((h * self.q_lora_rank if self.q_lora_rank is not None else 0)
                    + h * (self.kv_lora_rank + self.qk_rope_head_dim))
            return split, repl
        split = (h * H * self.head_dim
                 + h * self.num_kv_heads * (self.head_dim + self.v_head_dim) + o)
        return split, 0

    def with_name(self, name: str) -> "ModelSpec":
        """A copy with another display name."""
        return replace(self, name=name)

    @classmethod
    def from_hf_config(cls, path, *, name: str | None = None,
                       num_params: int | None = None) -> "ModelSpec":
        """Read a Hugging Face ``config.json`` into a :class:`ModelSpec`: the spec built from
        the fields :func:`radixkv.memory.hf_config.read_hf_config` reads, which takes the same
        parameters (*path*: the file or a directory holding one; *name*: display name;
        *num_params*: parameter count, estimated when None) and raises the same
        :class:`~radixkv.errors.InputError` (naming the file and field)."""
        fields = read_hf_config(path, name=name, num_params=num_params)
        ssm = fields.pop("ssm")
        return cls(**fields, ssm=None if ssm is None else SSMSpec(**ssm))


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model.

    Attributes
    ----------
    name : str
        Preset name, e.g. ``"H100-80GB"``.
    total_bytes : int
        Device memory as the driver reports it (``nvidia-smi --query-gpu=memory.total``,
        MiB × 2**20). This is the figure SGLang's default ``mem_fraction_static``
        heuristic reads (``get_device_memory_capacity``). vLLM reads
        ``torch.cuda.mem_get_info()`` instead, which is a few hundred MiB lower (e.g.
        79.22 GiB on an H100 in vLLM PR #10511's log vs 79.65 GiB = 81,559 MiB here);
        :func:`radixkv.memory.pool.vllm_pool_size` takes a ``total_bytes`` override.
    bf16_flops : float
        Peak dense (no sparsity) bf16 tensor-core FLOP/s.
    hbm_bytes_per_s : float
        Peak memory bandwidth, bytes/s.
    source : str
        Where the numbers come from.
    """

    name: str
    total_bytes: int
    bf16_flops: float
    hbm_bytes_per_s: float
    source: str = ""

    def __post_init__(self):
        _positive_int(self.total_bytes, "total_bytes")
        if not (self.bf16_flops > 0 and self.hbm_bytes_per_s > 0):
            raise ConfigError("FLOP/s and bandwidth must be positive", field="bf16_flops")

    @property
    def total_mib(self) -> float:
        """``total_bytes`` in MiB (the unit nvidia-smi and SGLang use)."""
        return self.total_bytes / 2**20


def load_hf_config(path, *, name: str | None = None, num_params: int | None = None) -> ModelSpec:
    """:meth:`ModelSpec.from_hf_config` as a function (``radixkv.memory.load_hf_config``)."""
    return ModelSpec.from_hf_config(path, name=name, num_params=num_params)
