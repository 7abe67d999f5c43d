"""How big a KV pool vLLM and SGLang build on one GPU, with the accounting table.

Both engines size the pool at start-up from measured memory. This module applies the same
rules to a :class:`~radixkv.memory.specs.ModelSpec` and a
:class:`~radixkv.memory.specs.GPUSpec`; the terms an engine *measures* (vLLM's non-torch
memory, peak activations and CUDA-graph pool; SGLang's memory in use before the model
loads) are parameters whose defaults are documented ESTIMATES, not measurements. Every
quantity is per tensor-parallel rank (each rank builds the same pool; vLLM takes the
minimum over ranks, SGLang the minimum free memory over ranks, which are equal here).
Pipeline parallelism is not modelled.

vLLM (``v1/worker/utils.py :: request_memory``, ``v1/worker/gpu_worker.py ::
Worker.determine_available_memory``, ``v1/core/kv_cache_planning.py ::
get_kv_cache_config_from_groups``)::

    requested       = ceil(total × gpu_memory_utilization)
    kv_budget       = requested − weights − non_torch − peak_activations − cuda_graphs
    num_gpu_blocks  = kv_budget // bytes_per_block,  bytes_per_block = block_size × kv_bytes_per_token
    usable          = num_gpu_blocks − 1   (block 0 is the permanent null block)

SGLang (``mem_cache/kv_cache_configurator.py :: _profile_available_bytes``,
``model_executor/pool_configurator.py :: calculate_pool_sizes``)::

    pre_load_free        = free memory before the weights load
    rest                 = (pre_load_free − weights) − pre_load_free × (1 − mem_fraction_static)
    max_total_num_tokens = (rest // cell_size) rounded down to page_size

Both rule sets are version-aware (``--engine-version``; :func:`vllm_version_rules`,
:func:`sglang_version_rules`): vLLM subtracts the CUDA-graph pool since 0.21; SGLang
derives the default ``mem_fraction_static`` from the GPU's memory since 0.5.3 (a fixed
fraction by TP size before) and counts DeepSeek-V3.2's indexer cache in ``cell_size``
since 0.5.4. SGLang's DP attention (``--enable-dp-attention --dp-size D``) sizes the cell
on the attention-TP size ``tp // D`` and holds more attention weights per rank
(:func:`sglang_dp_attention_extra_weight_bytes`). docs/memory-calibration.md checks both
engines against published start-up logs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from radixkv.errors import ConfigError, InputError
from radixkv.memory.presets import get_gpu, get_model
from radixkv.memory.specs import GPUSpec, ModelSpec, dtype_bytes

GiB = 2**30
MiB = 2**20

#: vLLM's default ``gpu_memory_utilization`` (``config/cache.py :: CacheConfig``): 0.92
#: since v0.21, which made CUDA-graph memory profiling the default (PR #38284); 0.9 before.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: the pre-v0.21 default, for comparing with older deployments and logs.
VLLM_LEGACY_GPU_MEMORY_UTILIZATION = 0.9
#: The engine versions whose rules are the default (``--engine-version``): the versions the
#: golden runs use.
VLLM_CURRENT_VERSION = "0.33.0"
SGLANG_CURRENT_VERSION = "0.5.23"
#: First vLLM version that profiles CUDA-graph memory before sizing the KV cache (and
#: raised the default ``gpu_memory_utilization`` to 0.92), vLLM PR #38284. Before it the
#: graphs were captured after the KV cache was allocated and came out of the
#: ``1 − gpu_memory_utilization`` headroom, so the budget did not subtract them.
VLLM_CUDA_GRAPH_PROFILING_SINCE = (0, 21)
#: vLLM ``CacheConfig.DEFAULT_BLOCK_SIZE``.
VLLM_DEFAULT_BLOCK_SIZE = 16
#: ``max_num_batched_tokens`` vLLM v1 uses for ``vllm serve`` on datacenter GPUs
#: (``EngineArgs`` usage-context defaults); it sets the profiling forward pass's size.
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192

#: ESTIMATE of vLLM's "non-torch memory" (cuBLAS/NCCL workspaces and other allocations
#: outside PyTorch's allocator made while loading and profiling): 0.2 GiB. vLLM's own
#: start-up logs show 0.16 GiB (Llama-3.2-11B, H100, PR #12126) and 0.20 GiB per worker
#: (tensor-parallel run, PR #14447 thread).
VLLM_DEFAULT_NON_TORCH_BYTES = int(0.2 * GiB)
#: ESTIMATE of vLLM's CUDA-graph pool (subtracted by default since v0.21): 0.5 GiB. vLLM
#: logs "Estimated CUDA graph memory" of 0.17–0.36 GiB per rank at TP 2–4 for mid-size
#: models on 24 GB cards; large-batch capture sizes on big models take more.
VLLM_DEFAULT_CUDA_GRAPH_BYTES = int(0.5 * GiB)
#: factor of the activation ESTIMATE (see :func:`vllm_activation_bytes`), calibrated on
#: vLLM PR #10511's log: Meta-Llama-3-8B, 8192-token profiling pass, "PyTorch activation
#: peak memory 1.26GiB" at TP 1 and TP 2 alike; 2.5 × 8192 × (4096 + 2 × 14336) × 2 B =
#: 1.25 GiB.
VLLM_ACTIVATION_FACTOR = 2.5

#: First SGLang version whose default ``mem_fraction_static`` is derived from the GPU's
#: memory (``(M − reserved) / M``, reserving room for activations and CUDA-graph buffers;
#: SGLang PR #10975, merged 2025-09-27). Before it SGLang took a fixed fraction by
#: tensor-parallel size (:data:`SGLANG_LEGACY_MEM_FRACTION_BY_TP`).
SGLANG_GPU_MEMORY_MFS_SINCE = (0, 5, 3)
#: SGLang ≤ 0.5.2 ``server_args.py :: ServerArgs.__post_init__``: default
#: ``mem_fraction_static`` by tensor-parallel size, as ``(min_tp, fraction)`` from the
#: largest: tp ≥ 16: 0.79, ≥ 8: 0.81, ≥ 4: 0.85, ≥ 2: 0.87, else 0.88. (Late 0.4.x
#: builds also raised it on cards above 96 GiB and lowered it on B200; not modelled.)
SGLANG_LEGACY_MEM_FRACTION_BY_TP = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
#: First SGLang version that counts DeepSeek-V3.2's indexer key cache in the per-token
#: cell it sizes the pool with (SGLang PR #11309, October 2025, after the 0.5.3
#: release); before it the pool was sized on the MLA latent alone and the indexer cache
#: was allocated on top of the budget.
SGLANG_INDEXER_IN_CELL_SINCE = (0, 5, 4)

#: ESTIMATE of the memory in use on a GPU before SGLang loads the model, relative to
#: ``nvidia-smi``'s total: ≈ 0.45 GiB the driver keeps out of ``cudaMemGetInfo``'s total
#: (79.22 GiB reported vs 81,559 MiB on an H100) plus ≈ 0.5 GiB of CUDA context and
#: PyTorch start-up, i.e. 1 GiB; plus 0.5 GiB for NCCL communicators when tp > 1.
SGLANG_DEFAULT_PRELOAD_USED_BYTES = 1 * GiB
SGLANG_PRELOAD_TP_EXTRA_BYTES = int(0.5 * GiB)


@dataclass(frozen=True)
class AccountingRow:
    """One line of the accounting table.

    Attributes
    ----------
    term : str
        What the bytes are.
    bytes : int
        Bytes per TP rank (negative for terms subtracted from the line above them).
    basis : str
        ``"device"`` (the GPU), ``"knob"`` (an engine setting applied), ``"model"``
        (computed from the model's shapes), ``"estimate"`` (a measured-at-start-up term
        replaced by a documented estimate), ``"rule"`` (the engine's arithmetic) or
        ``"result"``.
    """

    term: str
    bytes: int
    basis: str


@dataclass(frozen=True)
class PoolSize:
    """The KV pool an engine builds on one GPU (per TP rank).

    Attributes
    ----------
    engine : str
        ``"vllm"`` or ``"sglang"``.
    model, gpu : str
        Names of the model and GPU.
    tp : int
        Tensor-parallel size.
    kv_cache_dtype : str
        The KV dtype used (``"auto"`` resolved to the model dtype).
    memory_fraction : float
        ``gpu_memory_utilization`` (vLLM) or ``mem_fraction_static`` (SGLang) applied.
    unit_tokens : int
        Tokens per allocation unit: ``block_size`` (vLLM) or ``page_size`` (SGLang).
    kv_bytes_per_token : int
        KV bytes of one token on one rank (SGLang's ``cell_size``).
    kv_bytes_per_token_total : int
        The same summed over the ``tp`` ranks.
    bytes_per_unit : int
        Bytes of one block/page on one rank.
    budget_bytes : int
        Memory the rule leaves for the KV cache on one rank (vLLM
        ``available_kv_cache_memory``; SGLang ``rest``).
    bytes : int
        Bytes of the pool actually allocated on one rank (``blocks × bytes_per_unit``).
    blocks : int
        Allocation units in the pool: vLLM ``num_gpu_blocks`` (null block included),
        SGLang ``max_total_num_tokens // page_size`` pages.
    num_gpu_blocks : int or None
        vLLM's ``num_gpu_blocks`` (None for SGLang).
    max_total_num_tokens : int or None
        SGLang's ``max_total_num_tokens`` (None for vLLM).
    capacity_tokens : int
        Tokens the pool can hold: vLLM ``(num_gpu_blocks − 1) × block_size``; SGLang
        ``max_total_num_tokens``.
    accounting : tuple of AccountingRow
        The accounting table, top (device memory) to bottom (the pool).
    """

    engine: str
    model: str
    gpu: str
    tp: int
    kv_cache_dtype: str
    memory_fraction: float
    unit_tokens: int
    kv_bytes_per_token: int
    kv_bytes_per_token_total: int
    bytes_per_unit: int
    budget_bytes: int
    bytes: int
    blocks: int
    num_gpu_blocks: int | None
    max_total_num_tokens: int | None
    capacity_tokens: int
    accounting: tuple[AccountingRow, ...]

    @property
    def tokens(self) -> int:
        """Alias of :attr:`capacity_tokens`."""
        return self.capacity_tokens

    @property
    def usable_blocks(self) -> int:
        """Allocation units a policy may use (vLLM: without the null block)."""
        return self.capacity_tokens // self.unit_tokens

    def request_units(self, length_tokens: int) -> int:
        """Blocks/pages one request of ``length_tokens`` tokens occupies: ``ceil(L / unit)``."""
        return -(-int(length_tokens) // self.unit_tokens)

    def max_concurrent_requests(self, length_tokens: int) -> int:
        """How many requests of ``length_tokens`` tokens fit at once with no sharing."""
        if length_tokens <= 0:
            raise ConfigError("must be positive", field="max_model_len")
        return self.usable_blocks // self.request_units(length_tokens)

    def to_dict(self) -> dict:
        """A JSON-ready dict (the accounting table as a list of ``{term, bytes, basis}``)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "accounting"}
        d["accounting"] = [
            {"term": r.term, "bytes": r.bytes, "basis": r.basis} for r in self.accounting
        ]
        return d


# --------------------------------------------------------------------------- helpers
def parse_version(text) -> tuple[int, ...]:
    """``"0.9.2"`` / ``"v0.10.1rc1"`` → ``(0, 9, 2)`` / ``(0, 10, 1)`` (leading integers).

    Raises
    ------
    InputError
        No leading ``MAJOR.MINOR``.
    """
    import re

    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not m:
        raise InputError(f"not a version (MAJOR.MINOR[.PATCH]): {text!r}", field="engine_version")
    return tuple(int(x) for x in m.groups() if x is not None)


def vllm_version_rules(engine_version=None) -> dict:
    """The vLLM start-up rules that depend on the version.

    Parameters
    ----------
    engine_version : str or None
        vLLM version; None = :data:`VLLM_CURRENT_VERSION`.

    Returns
    -------
    dict
        ``gpu_memory_utilization`` (the default: 0.92 since 0.21, 0.9 before),
        ``cuda_graphs_in_budget`` (bool: the CUDA-graph pool is subtracted from the KV
        budget, since 0.21, vLLM PR #38284) and ``version`` (the tuple).
    """
    v = parse_version(VLLM_CURRENT_VERSION if engine_version is None else engine_version)
    new = v[:2] >= VLLM_CUDA_GRAPH_PROFILING_SINCE
    return {"version": v, "cuda_graphs_in_budget": new,
            "gpu_memory_utilization": (VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if new
                                       else VLLM_LEGACY_GPU_MEMORY_UTILIZATION)}


def sglang_version_rules(engine_version=None) -> dict:
    """The SGLang start-up rules that depend on the version.

    Parameters
    ----------
    engine_version : str or None
        SGLang version; None = :data:`SGLANG_CURRENT_VERSION`.

    Returns
    -------
    dict
        ``version`` (the tuple); ``gpu_memory_mfs`` (bool: the default
        ``mem_fraction_static`` comes from :func:`sglang_default_mem_fraction_static`,
        since :data:`SGLANG_GPU_MEMORY_MFS_SINCE`; else from
        :func:`sglang_legacy_mem_fraction_static`); ``indexer_in_cell`` (bool: a sparse-
        attention indexer's cache is part of the per-token cell, since
        :data:`SGLANG_INDEXER_IN_CELL_SINCE`).

    Raises
    ------
    InputError
        Not a version.
    """
    v = parse_version(SGLANG_CURRENT_VERSION if engine_version is None else engine_version)
    v3 = (v + (0, 0))[:3]
    return {"version": v, "gpu_memory_mfs": v3 >= SGLANG_GPU_MEMORY_MFS_SINCE,
            "indexer_in_cell": v3 >= SGLANG_INDEXER_IN_CELL_SINCE}


def sglang_legacy_mem_fraction_static(tp: int = 1) -> float:
    """SGLang's default ``mem_fraction_static`` before 0.5.3: a fixed fraction by TP size.

    SGLang ≤ 0.5.2 ``server_args.py :: ServerArgs.__post_init__`` (see
    :data:`SGLANG_LEGACY_MEM_FRACTION_BY_TP`): 0.88 at tp 1, 0.87 at 2–3, 0.85 at 4–7,
    0.81 at 8–15, 0.79 from 16.

    Raises
    ------
    InputError
        ``tp`` is not a positive integer.
    """
    _pos_int(tp, "tp")
    for min_tp, frac in SGLANG_LEGACY_MEM_FRACTION_BY_TP:
        if tp >= min_tp:
            return frac
    raise AssertionError("unreachable: the table ends at tp 1")


def _fraction(value, field: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"must be a number in (0, 1], got {value!r}", field=field) from None
    if not (0.0 < v <= 1.0):
        raise InputError(f"must be in (0, 1], got {value!r}", field=field)
    return v


def _nonneg_bytes(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
            or not math.isfinite(value):
        raise InputError(f"must be a non-negative number of bytes, got {value!r}", field=field)
    return int(value)


def _pos_int(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"must be a positive integer, got {value!r}", field=field)
    return value


def _kv_dtype_name(model: ModelSpec, kv_cache_dtype) -> str:
    if kv_cache_dtype is None or str(kv_cache_dtype).lower() == "auto":
        return model.dtype
    model.kv_dtype_bytes(kv_cache_dtype)  # validates
    return str(kv_cache_dtype).lower()


def vllm_activation_bytes(model: ModelSpec, max_num_batched_tokens: int) -> int:
    """ESTIMATE of the peak activation memory of vLLM's profiling forward pass.

    ``VLLM_ACTIVATION_FACTOR × max_num_batched_tokens × (hidden_size + 2 ×
    intermediate_size) × bytes(model dtype)``: the largest live tensors of a pass are
    the SwiGLU gate/up output (2 × intermediate wide) next to the residual stream; the
    factor 2.5 is calibrated on one vLLM log (see :data:`VLLM_ACTIVATION_FACTOR`). vLLM
    measures this term (``memory_profiling`` ``torch_peak_increase``); the log shows it
    does not shrink with TP, so neither does the estimate.

    Returns
    -------
    int
        Bytes per rank.
    """
    _pos_int(max_num_batched_tokens, "max_num_batched_tokens")
    b = model.kv_dtype_bytes(None)
    return int(VLLM_ACTIVATION_FACTOR * max_num_batched_tokens
               * (model.hidden_size + 2 * model.intermediate_size) * b)


def _prefill_graph_sizes(max_bs: int) -> int:
    """Number of SGLang prefill CUDA-graph capture sizes ≤ ``max_bs`` (token counts).

    SGLang ``arg_groups/cuda_graph_hook.py :: generate_prefill_cuda_graph_batch_sizes``
    captures 4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64,
    1280..4096 step 256, then 4608.. step 512.
    """
    ladder = [(4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64),
              (1280, 4096, 256), (4608, max(max_bs, 4608), 512)]
    n = 0
    for lo, hi, step in ladder:
        top = min(hi, max_bs)
        if top >= lo:
            n += (top - lo) // step + 1
    return n


def _sglang_memory_tier(m_mib: float, tp: int) -> tuple[int, int]:
    """SGLang's ``(chunked_prefill_size, decode CUDA-graph max_bs)`` for a GPU of *m_mib*
    MiB at *tp* (``arg_groups/memory_hook.py :: handle_gpu_memory_settings``)."""
    if m_mib < 20 * 1024:
        return 2048, 8
    if m_mib < 35 * 1024:
        return 4096, (48 if tp < 4 else 160)
    if m_mib < 60 * 1024:
        return 4096, (32 if tp < 4 else 160)
    if m_mib < 160 * 1024:
        return 8192, (256 if tp < 4 else 512)
    return 16384, 512


def sglang_default_chunked_prefill_size(gpu: GPUSpec) -> int:
    """SGLang's default ``chunked_prefill_size`` (tokens per prefill chunk) on *gpu*.

    SGLang ``arg_groups/memory_hook.py :: handle_gpu_memory_settings`` picks it by the
    GPU's memory ``M`` (MiB, as nvidia-smi reports it): < 20 GiB 2048; < 60 GiB 4096;
    < 160 GiB 8192; larger 16384. The tensor-parallel degree does not change it.

    Returns
    -------
    int
        Tokens.
    """
    return _sglang_memory_tier(gpu.total_mib, 1)[0]


def sglang_default_mem_fraction_static(gpu: GPUSpec, tp: int = 1, *, is_mla: bool = False,
                                       model_name: str = "",
                                       chunked_prefill_size: int | None = None) -> float:
    """SGLang's default ``mem_fraction_static`` for a GPU (current SGLang, 0.5.x).

    Follows SGLang ``arg_groups/memory_hook.py :: handle_gpu_memory_settings`` and
    ``reserve_for_graph_mb`` (GPU memory ``M`` in MiB as nvidia-smi reports it):

    * ``chunked_prefill_size`` and the decode CUDA-graph ``max_bs`` by ``M``:
      < 20 GiB: 2048, 8; < 35 GiB: 4096, 48 (160 at tp ≥ 4); < 60 GiB: 4096, 32 (160);
      < 90 GiB: 8192, 256 (512); < 160 GiB: 8192, 256 (512); larger: 16384, 512.
    * ``reserved = 512 + 1.5 × max(chunked_prefill_size, 2048) + tp / 8 × 1024
      + 2 × max_bs + prefill-graph term`` (MiB), the prefill-graph term being 8 MiB per
      capture size up to ``chunked_prefill_size`` (4096 for Llama-2 models), or a flat
      1.5 GiB with an MLA attention backend; at least 10 GiB when ``M`` > 60 GiB.
    * ``mem_fraction_static = round((M − reserved) / M, 3)``.

    E.g. H100 (81,559 MiB), tp 1, non-MLA: 512 + 12,288 + 128 + 512 + 58 × 8 = 13,904 MiB
    → 0.830. Not modelled: pipeline parallelism, DP attention, speculative decoding,
    DeepEP buffers, the VLM cut and the "post-capture KV sizing" mode.

    Returns
    -------
    float
        The fraction, rounded to 3 decimals as SGLang does.
    """
    _pos_int(tp, "tp")
    m = gpu.total_mib
    chunk, max_bs = _sglang_memory_tier(m, tp)
    if chunked_prefill_size is not None:
        chunk = _pos_int(chunked_prefill_size, "chunked_prefill_size")
    reserved = 512 + 1.5 * max(chunk, 2048) + tp / 8 * 1024 + 2 * max_bs
    if is_mla:
        reserved += 1.5 * 1024
    else:
        prefill_max = min(chunk, 4096) if "llama-2" in model_name.lower() else chunk
        reserved += 8 * _prefill_graph_sizes(prefill_max)
    if m > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((m - reserved) / m, 3)


def _unfit_advice(knob: str, decimals: int, room: int, room_what: str, weights: int, spare_at_one: int,
                  fits) -> str:
    """What would make a pool that does not fit fit, as the arithmetic says.

    *room*: the bytes the engine's fraction applies to (vLLM: device total; SGLang: free
    before loading), *room_what* their name; *weights*: the weights one rank holds; *spare_at_one*: bytes left
    beyond the smallest pool with the fraction *knob* at its maximum 1.0; *fits(f)*: does
    the fraction *f* give a pool. When the weights alone do not fit in *room*, or the
    fraction at 1.0 still leaves too little, only more ranks (``tp``, splitting the
    weights and the KV heads) or a GPU with more memory help; else the smallest fraction
    at *decimals* digits (the engines' own rounding of the default) that fits is named.
    """
    more = "raise tp (more GPUs share the weights and KV heads) or use a GPU with more memory"
    if weights >= room:
        return (f"the weights alone ({weights / GiB:.2f} GiB per rank) exceed the {room / GiB:.2f} GiB "
                f"{room_what}, at any {knob}: {more}")
    if spare_at_one < 0 or not fits(1.0):
        return f"even {knob} = 1.0 would leave too little: {more}"
    step = 10 ** decimals
    k = min(step, math.ceil((1.0 - spare_at_one / room) * step))  # the fraction in 1/step units
    while k > 1 and fits((k - 1) / step):  # the float guess checked both ways against the rule itself
        k -= 1
    while not fits(k / step):
        k += 1
    least = k / step
    return f"raise {knob} to at least {least} (or raise tp)"


# --------------------------------------------------------------------------- vLLM
def vllm_pool_size(model: ModelSpec, gpu: GPUSpec, *, tp: int = 1, kv_cache_dtype=None,
                   gpu_memory_utilization: float | None = None,
                   block_size: int = VLLM_DEFAULT_BLOCK_SIZE,
                   max_num_batched_tokens: int = VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS,
                   non_torch_bytes: int | None = None,
                   activation_bytes: int | None = None,
                   cuda_graph_bytes: int | None = None,
                   total_bytes: int | None = None,
                   engine_version: str | None = None,
                   weight_bytes: int | None = None) -> PoolSize:
    """vLLM v1's KV pool on one GPU: ``num_gpu_blocks`` and the accounting table.

    Parameters
    ----------
    model, gpu : ModelSpec, GPUSpec
    tp : int
        Tensor-parallel size (``--tensor-parallel-size``).
    kv_cache_dtype : str or None
        ``--kv-cache-dtype``; None/``"auto"`` = model dtype.
    gpu_memory_utilization : float or None
        In (0, 1]; default :data:`VLLM_DEFAULT_GPU_MEMORY_UTILIZATION` (0.92).
    block_size : int
        Tokens per block (``--block-size``, default 16).
    max_num_batched_tokens : int
        Size of the profiling forward pass (tokens); drives the activation estimate.
    non_torch_bytes, activation_bytes, cuda_graph_bytes : int or None
        Terms vLLM measures at start-up; defaults are the ESTIMATES
        :data:`VLLM_DEFAULT_NON_TORCH_BYTES`, :func:`vllm_activation_bytes` and
        :data:`VLLM_DEFAULT_CUDA_GRAPH_BYTES`. Pass a value read from a vLLM log to
        reproduce a real server.
    total_bytes : int or None
        Device memory as ``torch.cuda.mem_get_info`` reports it; default
        ``gpu.total_bytes`` (nvidia-smi's figure, a few hundred MiB higher).
    engine_version : str or None
        vLLM version whose rules apply (:func:`vllm_version_rules`): before 0.21 the
        default ``gpu_memory_utilization`` is 0.9 and the CUDA-graph pool is not in the
        budget (``cuda_graph_bytes`` defaults to 0). None = the current version.
    weight_bytes : int or None
        Weights one rank holds, as vLLM logs them ("Model loading took X GiB"); default
        ``model.weight_bytes_per_rank(tp)``.

    Returns
    -------
    PoolSize

    Raises
    ------
    InputError
        A knob out of range (utilization outside (0, 1], non-positive sizes).
    ConfigError
        The memory left for the KV cache is not enough for two blocks (vLLM refuses to
        start: "No available memory for the cache blocks").
    """
    rules = vllm_version_rules(engine_version)
    util = _fraction(rules["gpu_memory_utilization"] if gpu_memory_utilization is None
                     else gpu_memory_utilization, "gpu_memory_utilization")
    _pos_int(tp, "tp")
    B = _pos_int(block_size, "block_size")
    _pos_int(max_num_batched_tokens, "max_num_batched_tokens")
    total = gpu.total_bytes if total_bytes is None else _nonneg_bytes(total_bytes, "total_bytes")
    non_torch = VLLM_DEFAULT_NON_TORCH_BYTES if non_torch_bytes is None else \
        _nonneg_bytes(non_torch_bytes, "non_torch_bytes")
    act = vllm_activation_bytes(model, max_num_batched_tokens) if activation_bytes is None \
        else _nonneg_bytes(activation_bytes, "activation_bytes")
    if cuda_graph_bytes is None:
        graphs = VLLM_DEFAULT_CUDA_GRAPH_BYTES if rules["cuda_graphs_in_budget"] else 0
    else:
        graphs = _nonneg_bytes(cuda_graph_bytes, "cuda_graph_bytes")

    kv_dtype = _kv_dtype_name(model, kv_cache_dtype)
    per_tok = model.kv_bytes_per_token(tp, kv_dtype)
    per_block = per_tok * B
    weights = model.weight_bytes_per_rank(tp) if weight_bytes is None else \
        _nonneg_bytes(weight_bytes, "weight_bytes")
    requested = math.ceil(total * util)
    budget = requested - weights - non_torch - act - graphs
    if budget < 2 * per_block:
        fixed = weights + non_torch + act + graphs  # what the budget holds besides the KV cache
        raise ConfigError(
            f"vLLM would leave {budget / GiB:.2f} GiB for the KV cache of {model.name} on "
            f"{gpu.name} (tp={tp}, gpu_memory_utilization={util}): not enough for the null "
            f"block and one block of {per_block:,} B; "
            + _unfit_advice("gpu_memory_utilization", 2, total, "of the GPU", weights,
                            total - fixed - 2 * per_block, lambda u: math.ceil(total * u) - fixed >= 2 * per_block),
            field="gpu_memory_utilization")
    n_blocks = budget // per_block
    pool_bytes = n_blocks * per_block
    rows = (
        AccountingRow("GPU memory (device total)", total, "device"),
        AccountingRow(f"outside vLLM's budget (1 − gpu_memory_utilization {util})",
                      -(total - requested), "knob"),
        AccountingRow("requested = total × gpu_memory_utilization", requested, "rule"),
        AccountingRow(f"model weights ({model.weight_dtype}, per rank)", -weights, "model"),
        AccountingRow("non-torch memory (NCCL/cuBLAS workspaces)", -non_torch, "estimate"),
        AccountingRow(f"peak activations ({max_num_batched_tokens}-token profiling pass)",
                      -act, "estimate"),
        AccountingRow("CUDA-graph pool" + ("" if rules["cuda_graphs_in_budget"] else
                                           " (not in the budget before vLLM 0.21)"),
                      -graphs, "estimate"),
        AccountingRow("available KV cache memory", budget, "rule"),
        AccountingRow(f"KV pool: {n_blocks:,} blocks × {per_block:,} B", pool_bytes, "result"),
        AccountingRow("  of which the null block (block 0)", per_block, "rule"),
        AccountingRow("left unused (less than one block)", budget - pool_bytes, "rule"),
    )
    return PoolSize(
        engine="vllm", model=model.name, gpu=gpu.name, tp=tp, kv_cache_dtype=kv_dtype,
        memory_fraction=util, unit_tokens=B, kv_bytes_per_token=per_tok,
        kv_bytes_per_token_total=per_tok * tp, bytes_per_unit=per_block,
        budget_bytes=budget, bytes=pool_bytes, blocks=n_blocks, num_gpu_blocks=n_blocks,
        max_total_num_tokens=None, capacity_tokens=(n_blocks - 1) * B, accounting=rows)


def vllm_start_max_model_len(pool, context_len: int, *, hybrid: bool = False) -> int | None:
    """The ``--max-model-len`` vLLM needs to start on *pool*, or None when it starts with
    the model's own context *context_len* (tokens).

    vLLM refuses to start when the KV cache cannot hold one request of ``max_model_len``
    tokens (``check_enough_kv_cache_memory``, vllm/v1/core/kv_cache_utils.py: the bytes
    ``cdiv(max_model_len, block_size) × page bytes`` summed over the layers must not exceed
    the KV cache memory), and its message suggests the largest length that fits
    (``estimate_max_model_len``, same file). With every layer full attention that is
    ``cdiv(L, block_size) ≤ num_gpu_blocks`` (the null block counted, as the engine's
    check counts it), so the check fails for ``L > num_gpu_blocks × block_size`` and the
    estimate is ``num_gpu_blocks × block_size`` tokens.

    Parameters
    ----------
    pool : radixkv.memory.PoolSize
        A vLLM pool (``num_gpu_blocks`` and ``unit_tokens`` = block_size).
    context_len : int
        The model's ``max_position_embeddings`` (vLLM's default ``max_model_len``), tokens.
    hybrid : bool
        The model has sliding-window or linear-attention layers: their usage is bounded by
        the window / state, which this rule does not model; None is returned.

    Returns
    -------
    int or None
        ``num_gpu_blocks × block_size`` when it is below *context_len*, else None. None for
        an SGLang pool (SGLang starts and bounds ``max_req_len`` by the pool instead).
    """
    if hybrid or pool.num_gpu_blocks is None:
        return None
    most = int(pool.num_gpu_blocks) * int(pool.unit_tokens)
    return most if most < int(context_len) else None


# --------------------------------------------------------------------------- SGLang
def sglang_dp_attention_extra_weight_bytes(model: ModelSpec, tp: int, dp_size: int) -> int:
    """Weights SGLang's DP attention adds to each rank, over ``model.weight_bytes_per_rank``.

    With ``--enable-dp-attention --dp-size D`` at ``--tp-size T`` the attention layers
    are tensor-parallel over ``T // D`` ranks instead of ``T`` (SGLang
    ``layers/dp_attention.py :: compute_dp_attention_world_info``; the projections take
    ``attn_tp_size``), and the models built for DP attention create their input
    embedding with ``VocabParallelEmbedding(..., enable_tp=not is_dp_attention_enabled())``
    (``models/deepseek_v2.py :: DeepseekV2Model.__init__``; also the Qwen-MoE and Llama-4
    models), i.e. whole on every rank, in the model dtype. So per rank::

        extra = layers × split × w × (1 / (T // D) − 1 / T)
              + vocab × hidden × (bytes(dtype) − w / T)

    with ``split`` from :meth:`~radixkv.memory.specs.ModelSpec.attention_params_per_layer`
    and ``w`` the weight dtype's bytes per parameter (the uniform split that
    ``weight_bytes_per_rank`` assumes already counts ``split / T`` and the embedding at
    ``w / T``). Not counted: block-quantisation scales (< 0.1 %), the LM head (split over
    the full TP group unless ``--enable-dp-lm-head``), MoE routers.

    Returns
    -------
    int
        Bytes per rank; 0 when ``dp_size`` is 1.

    Raises
    ------
    InputError
        ``tp``/``dp_size`` not positive integers, or ``dp_size`` not dividing ``tp``.
    """
    _pos_int(tp, "tp")
    _pos_int(dp_size, "dp_size")
    if tp % dp_size:
        raise InputError(f"dp_size {dp_size} must divide tp {tp}", field="dp_size")
    if dp_size == 1:
        return 0
    w = dtype_bytes(model.weight_dtype, field="weight_dtype")
    split, _ = model.attention_params_per_layer()
    attn = model.num_layers * split * w * (1 / (tp // dp_size) - 1 / tp)
    emb = model.vocab_size * model.hidden_size * (model.kv_dtype_bytes(None) - w / tp)
    return int(round(attn + emb))


def sglang_pool_size(model: ModelSpec, gpu: GPUSpec, *, tp: int = 1, kv_cache_dtype=None,
                     mem_fraction_static: float | None = None, page_size: int = 1,
                     chunked_prefill_size: int | None = None,
                     preload_used_bytes: int | None = None,
                     engine_version: str | None = None,
                     weight_bytes: int | None = None,
                     dp_size: int = 1,
                     extra_reserved_bytes: int = 0) -> PoolSize:
    """SGLang's KV pool on one GPU: ``max_total_num_tokens`` and the accounting table.

    Parameters
    ----------
    model, gpu : ModelSpec, GPUSpec
    tp : int
        Tensor-parallel size (``--tp-size``).
    kv_cache_dtype : str or None
        ``--kv-cache-dtype``; None/``"auto"`` = model dtype.
    mem_fraction_static : float or None
        In (0, 1]; default :func:`sglang_default_mem_fraction_static` for this GPU.
    page_size : int
        Tokens per page (``--page-size``, default 1).
    chunked_prefill_size : int or None
        Only used by the default ``mem_fraction_static``.
    preload_used_bytes : int or None
        Memory in use before the model loads, measured from nvidia-smi's total (SGLang
        measures free memory itself); default the ESTIMATE
        :data:`SGLANG_DEFAULT_PRELOAD_USED_BYTES` (+
        :data:`SGLANG_PRELOAD_TP_EXTRA_BYTES` when tp > 1).
    engine_version : str or None
        SGLang version whose rules apply (:func:`sglang_version_rules`): before 0.5.3 the
        default ``mem_fraction_static`` is :func:`sglang_legacy_mem_fraction_static`;
        before 0.5.4 a sparse-attention indexer's cache is left out of the cell. None =
        :data:`SGLANG_CURRENT_VERSION`.
    weight_bytes : int or None
        Weights one rank holds, as SGLang logs them ("Load weight end ... mem usage=X
        GB"); default ``model.weight_bytes_per_rank(tp)`` plus, with DP attention,
        :func:`sglang_dp_attention_extra_weight_bytes`.
    dp_size : int
        ``--dp-size`` when ``--enable-dp-attention`` is set (1 = no DP attention). The
        attention layers then run tensor-parallel over ``tp // dp_size`` ranks (SGLang
        ``layers/dp_attention.py :: compute_dp_attention_world_info``): the cell holds
        the KV heads of that attention-TP size (``model_runner.py ::
        profile_max_num_token``, ``get_num_kv_heads(get_attention_tp_size())``) and each
        rank holds more attention weights. Must divide ``tp``.
    extra_reserved_bytes : int
        Memory the engine version takes out of ``rest`` besides the reserve (a measured
        term: e.g. the AITER attention workspace SGLang PR #18263 subtracts in
        ``KVCacheConfigurator``; current SGLang's multimodal reservation). Default 0.

    Returns
    -------
    PoolSize

    Raises
    ------
    InputError
        A knob out of range, or ``dp_size`` not dividing ``tp``.
    ConfigError
        ``rest`` is not enough for one page (SGLang: "Not enough memory. Please try to
        increase --mem-fraction-static").

    Notes
    -----
    Not modelled: SGLang's request-to-token table and other buffers allocated outside
    ``rest`` (they come out of the ``1 − mem_fraction_static`` reserve), the hybrid
    SWA/Mamba pools, and ``--max-total-tokens`` (use it directly when set).
    """
    _pos_int(tp, "tp")
    p = _pos_int(page_size, "page_size")
    rules = sglang_version_rules(engine_version)
    if mem_fraction_static is None and not rules["gpu_memory_mfs"]:
        mfs = sglang_legacy_mem_fraction_static(tp)
    elif mem_fraction_static is None:
        mfs = sglang_default_mem_fraction_static(
            gpu, tp, is_mla=model.is_mla, model_name=model.name,
            chunked_prefill_size=chunked_prefill_size)
    else:
        mfs = _fraction(mem_fraction_static, "mem_fraction_static")
    if preload_used_bytes is None:
        used0 = SGLANG_DEFAULT_PRELOAD_USED_BYTES + (SGLANG_PRELOAD_TP_EXTRA_BYTES if tp > 1 else 0)
    else:
        used0 = _nonneg_bytes(preload_used_bytes, "preload_used_bytes")
    dp = _pos_int(dp_size, "dp_size")
    if tp % dp:
        raise InputError(f"dp_size {dp} must divide tp {tp} (DP attention splits the TP "
                         "group into dp_size attention groups)", field="dp_size")
    extra = _nonneg_bytes(extra_reserved_bytes, "extra_reserved_bytes")
    kv_dtype = _kv_dtype_name(model, kv_cache_dtype)
    cell = model.kv_bytes_per_token(tp // dp, kv_dtype)
    if not rules["indexer_in_cell"]:
        cell -= model.indexer_bytes_per_token()
    dp_weights = 0
    if weight_bytes is None:
        weights = model.weight_bytes_per_rank(tp)
        dp_weights = sglang_dp_attention_extra_weight_bytes(model, tp, dp)
    else:
        weights = _nonneg_bytes(weight_bytes, "weight_bytes")
    total = gpu.total_bytes
    pre_free = total - used0
    after_load = pre_free - weights - dp_weights
    reserve = int(pre_free * (1 - mfs))
    rest = after_load - reserve - extra
    tokens = (max(rest, 0) // cell) // p * p
    if tokens < p:
        raise ConfigError(
            f"SGLang would leave {rest / GiB:.2f} GiB for the KV cache of {model.name} on "
            f"{gpu.name} (tp={tp}, mem_fraction_static={mfs}): not enough for one page; "
            + _unfit_advice("mem_fraction_static", 3, pre_free, "free before the model loads", weights + dp_weights,
                            after_load - extra - p * cell,
                            lambda f: after_load - int(pre_free * (1 - f)) - extra >= p * cell),
            field="mem_fraction_static")
    pool_bytes = tokens * cell
    rows = (
        AccountingRow("GPU memory (device total)", total, "device"),
        AccountingRow("in use before the model loads (CUDA context, ...)", -used0, "estimate"),
        AccountingRow("free before loading (pre_model_load_memory)", pre_free, "rule"),
        AccountingRow(f"model weights ({model.weight_dtype}, per rank)", -weights, "model"),
        *((AccountingRow(f"DP attention (dp_size {dp}): attention projections over "
                         f"{tp // dp} rank(s), embedding replicated", -dp_weights, "model"),)
          if dp_weights else ()),
        AccountingRow(f"reserve = pre-load × (1 − mem_fraction_static {mfs}): activations, "
                      "CUDA graphs, buffers", -reserve, "knob"),
        *((AccountingRow("other memory the engine version reserves (measured)", -extra,
                         "knob"),) if extra else ()),
        AccountingRow("rest for the KV cache", rest, "rule"),
        AccountingRow(f"KV pool: {tokens:,} tokens × {cell:,} B", pool_bytes, "result"),
        AccountingRow("left unused (rounding to cell and page)", rest - pool_bytes, "rule"),
    )
    return PoolSize(
        engine="sglang", model=model.name, gpu=gpu.name, tp=tp, kv_cache_dtype=kv_dtype,
        memory_fraction=mfs, unit_tokens=p, kv_bytes_per_token=cell,
        kv_bytes_per_token_total=cell * tp, bytes_per_unit=cell * p, budget_bytes=rest,
        bytes=pool_bytes, blocks=tokens // p, num_gpu_blocks=None,
        max_total_num_tokens=tokens, capacity_tokens=tokens, accounting=rows)


# --------------------------------------------------------------------------- entry
def pool_for(engine: str, model, gpu, *, tp: int = 1, kv_cache_dtype=None,
             gpu_memory_utilization: float | None = None,
             mem_fraction_static: float | None = None, block_size: int = 16,
             page_size: int = 1, max_num_batched_tokens: int = 8192,
             **estimates) -> PoolSize:
    """Size a replay pool the way ``engine`` would: the helper replay and experiments call.

    Parameters
    ----------
    engine : {"vllm", "sglang"}
    model : ModelSpec or str
        A spec, a preset name (case-insensitive) or a path to a ``config.json``.
    gpu : GPUSpec or str
        A spec or a preset name (case-insensitive).
    tp, kv_cache_dtype : see :func:`vllm_pool_size` / :func:`sglang_pool_size`.
    gpu_memory_utilization : float or None
        vLLM only (an error for SGLang).
    mem_fraction_static : float or None
        SGLang only (an error for vLLM).
    block_size : int
        vLLM block size (ignored for SGLang).
    page_size : int
        SGLang page size (ignored for vLLM).
    max_num_batched_tokens : int
        vLLM profiling pass size (ignored for SGLang).
    **estimates
        Overrides of the estimated terms: vLLM ``non_torch_bytes``, ``activation_bytes``,
        ``cuda_graph_bytes``, ``total_bytes``; SGLang ``preload_used_bytes``,
        ``chunked_prefill_size``, ``dp_size``, ``extra_reserved_bytes``.

    Returns
    -------
    PoolSize
        With ``num_gpu_blocks`` (vLLM), ``max_total_num_tokens`` (SGLang) and
        ``capacity_tokens`` (usable tokens, both).

    Raises
    ------
    InputError
        Unknown engine/model/GPU, a knob of the other engine, or a knob out of range.
    ConfigError
        The pool would be empty.
    """
    m = model if isinstance(model, ModelSpec) else get_model(model)
    g = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
    eng = str(engine).lower()
    if eng == "vllm":
        if mem_fraction_static is not None:
            raise InputError("mem_fraction_static is an SGLang knob; vLLM uses "
                             "gpu_memory_utilization", field="mem_fraction_static")
        return vllm_pool_size(m, g, tp=tp, kv_cache_dtype=kv_cache_dtype,
                              gpu_memory_utilization=gpu_memory_utilization,
                              block_size=block_size,
                              max_num_batched_tokens=max_num_batched_tokens, **estimates)
    if eng == "sglang":
        if gpu_memory_utilization is not None:
            raise InputError("gpu_memory_utilization is a vLLM knob; SGLang uses "
                             "mem_fraction_static", field="gpu_memory_utilization")
        return sglang_pool_size(m, g, tp=tp, kv_cache_dtype=kv_cache_dtype,
                                mem_fraction_static=mem_fraction_static,
                                page_size=page_size, **estimates)
    raise InputError(f"unknown engine {engine!r}; one of: vllm, sglang", field="engine")
