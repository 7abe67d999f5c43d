"""Analytic roofline cost of one engine step (a batch of prefill chunks and decodes).

A step runs a batch of *items*; item i computes ``n_i`` new tokens of a request whose KV
already holds ``c_i`` tokens (``c_i`` = hit tokens + earlier chunks for a prefill chunk;
the current KV length for a decode, where ``n_i = 1``). The model is a roofline:

FLOPs (dense transformer, forward pass)
    ``F = 2 · N_params · Σ n_i  +  4 · L · d_attn · Σ_i Σ_{t=c_i+1}^{c_i+n_i} t``

    The first term is two FLOPs (one multiply-add) per parameter per token (Kaplan et al.
    2020, "Scaling Laws for Neural Language Models", Table 1: ``C_forward ≈ 2N``). The
    second term is causal attention: a token at position t (1-based) scores ``QKᵀ`` against
    t keys and reads t values, ``2 · d_attn · t`` FLOPs each, in each of L layers
    (Kaplan et al. Table 1 count the ``QKᵀ`` half as ``2 · n_layer · n_ctx · d_attn``; the
    ``AV`` half is the same again, as in Chowdhery et al. 2022, "PaLM", Appendix B). The
    inner sum is ``n_i · c_i + n_i (n_i + 1) / 2``: quadratic in the prompt for a prefill
    from scratch, linear in the context for a decode.

Bytes moved over HBM
    ``M = W + kv_bytes_per_token · Σ_i (c_i + n_i)``: the weights once per step (W =
    ``N_params × weight_dtype_bytes``) plus every KV byte the batch reads or writes
    (Pope et al. 2022, "Efficiently Scaling Transformer Inference", §2; the same arithmetic
    as kipply's "Transformer inference arithmetic", 2022). Activations are ignored.

Step time
    ``T = max(F / (peak_flops · mfu), M / (hbm_bytes_per_s · mbu)) + step_overhead_s``
    with tensor parallelism dividing both terms by ``tp`` (communication ignored). ``mfu``
    (model FLOP/s utilisation, default 0.6) and ``mbu`` (model bandwidth utilisation,
    default 0.8) are *assumptions*, not measurements: large bf16 GEMMs reach about 60–70 %
    of an A100's dense peak and decode kernels about 80 % of HBM bandwidth (the MBU term
    and typical values: Databricks, "LLM Inference Performance Engineering: Best
    Practices", 2023). Change them to fit a measured engine.

Everything is in SI units: FLOPs, bytes, seconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixkv.errors import ConfigError

#: integers below this are exact in float64 (2**53)
_EXACT = 2**53


def check_fields(obj, positive, fractions) -> None:
    """Check a cost model's fields: each of *positive* > 0, each of *fractions* in (0, 1],
    ``step_overhead_s`` finite and ≥ 0.

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the first bad field.
    """
    for name in positive:
        if not getattr(obj, name) > 0:
            raise ConfigError(f"{name} must be > 0, got {getattr(obj, name)}", field=name)
    for name in fractions:
        v = getattr(obj, name)
        if not 0 < v <= 1:
            raise ConfigError(f"{name} must be in (0, 1], got {v}", field=name)
    if not 0 <= obj.step_overhead_s < float("inf"):  # NaN fails too (it used to hang the replay)
        raise ConfigError(f"step_overhead_s must be a finite number of seconds ≥ 0, got {obj.step_overhead_s}",
                          field="step_overhead_s")


@dataclass(frozen=True)
class CostModel:
    """Roofline step-time model of one model replica.

    Parameters
    ----------
    params : float
        Parameter count N_params (all weights, embeddings included: a slight
        over-count of the linear FLOPs, about 2 × vocab × hidden per token).
    num_layers : int
        L, transformer layers.
    attn_dim : int
        d_attn = query heads × head dim (= hidden size for Llama models), per layer.
    kv_bytes_per_token : float
        KV-cache bytes of one token over all layers (vLLM ``bytes_per_block / block_size``).
    peak_flops : float
        Dense peak FLOP/s of one GPU at the weight dtype (A100 bf16: 312e12).
    hbm_bytes_per_s : float
        HBM bandwidth of one GPU in bytes/s (A100-80GB SXM: 2.039e12).
    weight_dtype_bytes : float
        Bytes per weight (bf16: 2).
    tp : int
        Tensor-parallel degree: FLOPs and bytes split evenly over ``tp`` GPUs.
    mfu, mbu : float
        Achieved fractions of peak FLOP/s and of HBM bandwidth, in (0, 1].
    step_overhead_s : float
        Fixed time added to every step (scheduling, kernel launches), seconds; default 0.

    Raises
    ------
    radixkv.errors.ConfigError
        When a parameter is not positive, an efficiency is outside (0, 1], or
        ``step_overhead_s`` is negative, NaN or infinite.
    """

    params: float
    num_layers: int
    attn_dim: int
    kv_bytes_per_token: float
    peak_flops: float
    hbm_bytes_per_s: float
    weight_dtype_bytes: float = 2.0
    tp: int = 1
    mfu: float = 0.6
    mbu: float = 0.8
    step_overhead_s: float = 0.0

    def __post_init__(self):
        check_fields(self, ("params", "num_layers", "attn_dim", "kv_bytes_per_token", "peak_flops",
                            "hbm_bytes_per_s", "weight_dtype_bytes", "tp"), ("mfu", "mbu"))

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_specs(cls, model, gpu, *, tp: int = 1, kv_cache_dtype: str | None = None, **kw) -> "CostModel":
        """Build from the memory model's specs (:mod:`radixkv.memory`).

        Parameters
        ----------
        model : radixkv.memory.ModelSpec or str
            A spec or a preset name: ``num_params``, ``num_layers``,
            ``num_attention_heads × head_dim`` (d_attn), ``weight_dtype`` and the KV bytes
            per token summed over the TP ranks (``kv_bytes_per_token_total``).
        gpu : radixkv.memory.GPUSpec or str
            A spec or a preset name: ``bf16_flops`` and ``hbm_bytes_per_s``.
        tp : int
            Tensor-parallel degree.
        kv_cache_dtype : str or None
            KV dtype (``None``/``"auto"`` = the model dtype).
        **kw
            ``mfu``, ``mbu``, ``step_overhead_s``.

        Raises
        ------
        radixkv.errors.InputError
            Unknown preset names or bad values.
        """
        from radixkv.memory import GPUSpec, ModelSpec, dtype_bytes, get_gpu, get_model

        m = model if isinstance(model, ModelSpec) else get_model(model)
        g = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
        return cls(
            params=float(m.num_params),
            num_layers=int(m.num_layers),
            attn_dim=int(m.num_attention_heads * m.head_dim),
            kv_bytes_per_token=float(m.kv_bytes_per_token_total(tp, kv_cache_dtype)),
            peak_flops=float(g.bf16_flops),
            hbm_bytes_per_s=float(g.hbm_bytes_per_s),
            weight_dtype_bytes=float(dtype_bytes(m.weight_dtype, field="weight_dtype")),
            tp=int(tp),
            **kw,
        )

    # ---------------------------------------------------------------- FLOPs and bytes
    def prefill_flops(self, new_tokens, context_tokens=0):
        """FLOPs to compute *new_tokens* tokens after *context_tokens* tokens of KV.

        Parameters
        ----------
        new_tokens, context_tokens : int or np.ndarray of int
            n and c of the module formula (broadcast together).

        Returns
        -------
        float or np.ndarray of float64
            ``2 · N_params · n + 4 · L · d_attn · (n · c + n (n + 1) / 2)``.
        """
        if type(new_tokens) is int and type(context_tokens) is int:  # the same float operations
            n, c = float(new_tokens), float(context_tokens)
            return 2.0 * self.params * n + 4.0 * self.num_layers * self.attn_dim * (n * c + n * (n + 1) / 2)
        n = np.asarray(new_tokens, dtype=np.float64)
        c = np.asarray(context_tokens, dtype=np.float64)
        f = 2.0 * self.params * n + 4.0 * self.num_layers * self.attn_dim * (n * c + n * (n + 1) / 2)
        return float(f) if f.ndim == 0 else f

    def step_time(self, new_tokens, context_tokens) -> float:
        """Seconds of one step running a batch of items.

        Parameters
        ----------
        new_tokens, context_tokens : array-like of int, shape (k,)
            n_i and c_i of each item (see module docstring).

        Returns
        -------
        float
            ``max(F / (peak · mfu · tp), M / (bw · mbu · tp)) + step_overhead_s``; 0 for an
            empty batch.
        """
        if type(new_tokens) is list and type(context_tokens) is list:
            t = self._step_time_ints(new_tokens, context_tokens)
            if t is not None:
                return t
        n = np.asarray(new_tokens, dtype=np.float64)
        c = np.asarray(context_tokens, dtype=np.float64)
        if n.size == 0:
            return 0.0
        flops = 2.0 * self.params * n.sum() + 4.0 * self.num_layers * self.attn_dim * float(
            (n * c + n * (n + 1) / 2).sum()
        )
        bytes_ = self.params * self.weight_dtype_bytes + self.kv_bytes_per_token * float((c + n).sum())
        return self._time(flops, bytes_)

    def _step_time_ints(self, new_tokens: list, context_tokens: list):
        """:meth:`step_time` of lists of Python ints, bit for bit, without numpy: every
        term of the numpy sums is an integer and every partial sum stays below 2**53, so
        the float sums are exact whatever their order, and equal these integer sums.
        None when that does not hold (non-int items, or sums too large)."""
        if not new_tokens:
            return 0.0
        sn = sa = sb = 0
        for n, c in zip(new_tokens, context_tokens):
            if type(n) is not int or type(c) is not int:
                return None
            sn += n
            sa += n * c + n * (n + 1) // 2
            sb += c + n
        if len(new_tokens) != len(context_tokens) or min(new_tokens) < 0 or min(context_tokens) < 0 \
                or sa >= _EXACT or sb >= _EXACT:
            return None
        flops = 2.0 * self.params * float(sn) + 4.0 * self.num_layers * self.attn_dim * float(sa)
        bytes_ = self.params * self.weight_dtype_bytes + self.kv_bytes_per_token * float(sb)
        t_c = flops / (self.peak_flops * self.mfu * self.tp)
        t_m = bytes_ / (self.hbm_bytes_per_s * self.mbu * self.tp)
        return (t_c if t_c >= t_m else t_m) + self.step_overhead_s

    def _time(self, flops, bytes_):
        t_c = flops / (self.peak_flops * self.mfu * self.tp)
        t_m = bytes_ / (self.hbm_bytes_per_s * self.mbu * self.tp)
        return np.maximum(t_c, t_m) + self.step_overhead_s

    def decode_steps_time(self, batch: int, context_sum: int, k: int) -> np.ndarray:
        """Times of k consecutive pure-decode steps of the same *batch* requests.

        Step j (0-based) feeds one token per request with ``context_sum + j · batch`` tokens
        of KV in total before it; equal to ``step_time([1]*batch, contexts + j)``.

        Returns
        -------
        np.ndarray, float64, shape (k,)
            Seconds of each step.
        """
        j = np.arange(k, dtype=np.float64)
        ctx = float(context_sum) + j * batch  # Σ c_i at step j
        flops = 2.0 * self.params * batch + 4.0 * self.num_layers * self.attn_dim * (ctx + batch)
        bytes_ = self.params * self.weight_dtype_bytes + self.kv_bytes_per_token * (ctx + batch)
        return np.asarray(self._time(flops, bytes_), dtype=np.float64)


@dataclass(frozen=True)
class UnitStepCost:
    """A step clock: every engine step takes ``step_s`` seconds (default 1), whatever it runs.

    With it a concurrent replay counts time in scheduler steps — the clock of the
    engines' schedulers, and of the step-level goldens driven from vLLM's real
    ``Scheduler`` (tests/data/concurrent/vllm): with ``step_s = 1`` and integer arrival
    times a, a request arriving at a joins the waiting queue just before step a, step k
    runs from time k to k + 1, a request's first admission time is the index of the step
    that admitted it and its finish time is one past the step that finished it.

    It prices no FLOPs: :meth:`prefill_flops` is NaN (prefill FLOPs are not modelled, so
    the replay reports them as n/a, not 0).

    Parameters
    ----------
    step_s : float
        Seconds per step (> 0).

    Raises
    ------
    radixkv.errors.ConfigError
        When ``step_s`` is not a positive finite number.
    """

    step_s: float = 1.0

    def __post_init__(self):
        if not (np.isfinite(self.step_s) and self.step_s > 0):
            raise ConfigError(f"step_s must be a positive number of seconds, got {self.step_s}", field="step_s")

    def step_time(self, new_tokens, context_tokens) -> float:
        """``step_s`` for a non-empty batch, 0 for an empty one (no step runs)."""
        return float(self.step_s) if len(new_tokens) else 0.0

    def decode_steps_time(self, batch: int, context_sum: int, k: int) -> np.ndarray:
        """k steps of ``step_s`` each (float64, shape (k,))."""
        return np.full(int(k), float(self.step_s), dtype=np.float64)

    def prefill_flops(self, new_tokens, context_tokens=0):
        """NaN (float or float64 array shaped like *new_tokens*): no FLOPs are modelled."""
        n = np.asarray(new_tokens, dtype=np.float64)
        f = np.full(np.broadcast(n, np.asarray(context_tokens)).shape, np.nan)
        return float(f) if f.ndim == 0 else f


#: host↔GPU link presets: peak bytes/s in one direction per GPU (a load back is one-way)
#:
#: - ``pcie4-x16``: PCI Express 4.0, 16 GT/s per lane, 128b/130b encoding, 16 lanes:
#:   16e9 × 16 × 128/130 / 8 = 31.5 GB/s (PCI-SIG, PCI Express Base Specification 4.0).
#: - ``pcie5-x16``: PCI Express 5.0, 32 GT/s per lane, 128b/130b, 16 lanes: 63.0 GB/s
#:   (PCI-SIG, PCI Express Base Specification 5.0).
#: - ``nvlink-c2c``: NVIDIA GH200 Grace Hopper Superchip, NVLink-C2C between the Grace CPU
#:   memory and the Hopper GPU: 900 GB/s total, 450 GB/s each way (NVIDIA GH200 Grace
#:   Hopper Superchip datasheet).
HOST_LINKS = {
    "pcie4-x16": 16e9 * 16 * 128 / 130 / 8,
    "pcie5-x16": 32e9 * 16 * 128 / 130 / 8,
    "nvlink-c2c": 450e9,
}


@dataclass(frozen=True)
class HostLink:
    """The host↔GPU link a KV load back crosses, and how a load overlaps the step.

    SGLang 0.5.23 HiCache loads host KV back while the batch runs: the scheduler starts
    the copies when the prefill batch is formed (``managers/scheduler.py`` →
    ``mem_cache/unified_radix_cache.py :: UnifiedRadixCache.ready_to_load_host_cache`` →
    ``managers/cache_controller.py :: HiCacheController.start_loading``), on the transfer
    engine's host-to-device stream, one layer after another (``on_layer_done`` marks each
    layer in a ``LayerDoneCounter``); the forward pass waits, per layer, only for that
    layer's copy (``mem_cache/memory_pool.py :: MHATokenToKVPool.get_key_buffer`` →
    ``layer_transfer_counter.wait_until(layer_id)``). A step is then a two-stage pipeline
    over the L layers, copy then compute, with per-layer times ``l = T_load / L`` and
    ``c = T_compute / L``; its length is ``l + c + (L − 1) · max(l, c)`` (:meth:`step_time`).

    Parameters
    ----------
    bytes_per_s : float
        Achievable bytes/s in one direction per GPU (each tensor-parallel rank copies its
        own KV shard over its own link). :data:`HOST_LINKS` gives spec peaks; a measured
        figure (e.g. 80–90 % of the peak for pinned-memory copies) fits a real machine better.
    name : str
        Label for reports (a preset name, or ``"custom"``).

    Raises
    ------
    radixkv.errors.ConfigError
        When ``bytes_per_s`` is not a positive finite number.
    """

    bytes_per_s: float
    name: str = "custom"

    def __post_init__(self):
        if not (np.isfinite(self.bytes_per_s) and self.bytes_per_s > 0):
            raise ConfigError(f"host link bandwidth must be a positive number of bytes/s, got {self.bytes_per_s}",
                              field="host_link")

    @classmethod
    def parse(cls, text: str) -> "HostLink":
        """A preset of :data:`HOST_LINKS` by name, or a bandwidth in bytes/s (``"25e9"``).

        Raises
        ------
        radixkv.errors.ConfigError
            On an unknown name that is not a number.
        """
        t = str(text).strip()
        if t in HOST_LINKS:
            return cls(HOST_LINKS[t], t)
        try:
            return cls(float(t))
        except ValueError:
            raise ConfigError(f"unknown host link {t!r}: give {', '.join(HOST_LINKS)} or bytes/s",
                              field="host_link") from None

    def load_time(self, cost: CostModel, tokens: int) -> float:
        """Seconds to copy *tokens* tokens of KV host→GPU on every rank at once:
        ``tokens · kv_bytes_per_token / tp / bytes_per_s`` (``cost.kv_bytes_per_token``
        sums the TP ranks' shards)."""
        return float(tokens) * cost.kv_bytes_per_token / cost.tp / self.bytes_per_s

    def step_time(self, cost: CostModel, new_tokens, context_tokens, load_tokens: int) -> float:
        """Seconds of a step whose batch loads *load_tokens* tokens back from host.

        ``T_compute`` is ``cost.step_time(new_tokens, context_tokens)`` less its fixed
        ``step_overhead_s``; with ``l = load_time / L`` and ``c = T_compute / L`` the step
        takes ``l + c + (L − 1) · max(l, c) + step_overhead_s`` — ``T_compute`` exactly
        when nothing is loaded, about ``max(T_load, T_compute)`` for many layers.
        """
        t = float(cost.step_time(new_tokens, context_tokens))
        if load_tokens <= 0:
            return t
        L = cost.num_layers
        over = cost.step_overhead_s
        c = (t - over) / L
        lo = self.load_time(cost, load_tokens) / L
        return lo + c + (L - 1) * max(lo, c) + over


def intake_arrivals(send_s, request_intake_s: float) -> np.ndarray:
    """When requests sent at *send_s* reach the engine through a single-threaded server
    front end that spends *request_intake_s* on each (HTTP, chat template, tokenisation)
    and lets the engine step only when its queue is empty.

    The front end is a FIFO single server: request i is taken in by
    ``c_i = max(s_i, c_{i−1}) + d``. Requests taken in during one busy period (each sent
    before the previous one was taken in) reach the engine together, at the period's end:
    ``arrival_i = c_j`` with j the last request of i's period. A request sent while the
    front end is idle reaches the engine ``d`` after it was sent; a burst of k requests sent
    at once reaches it ``k · d`` after. This is the shape of vLLM 0.6's V0 OpenAI server,
    which runs the HTTP handlers, tokenisation and the engine's step loop in one process
    and one asyncio event loop (vllm/engine/async_llm_engine.py ``AsyncLLMEngine`` /
    ``run_engine_loop``; vllm/entrypoints/openai/api_server.py); the busy-period rule is a
    **model**, not a reading of that code. *request_intake_s* is a **fitted** parameter:
    experiments/tab_e2e_clock.py fits it on published benchmark_serving runs,
    leave-one-run-out (docs/clock-e2e.md gives the values and the held-out error; about
    3 ms per request on Lambda's A100/H100 hosts with vLLM 0.6). Default 0: no front end.

    Parameters
    ----------
    send_s : array-like of float64, shape (n,)
        Send times, seconds, non-decreasing.
    request_intake_s : float
        Seconds of front-end work per request, finite and ≥ 0.

    Returns
    -------
    np.ndarray of float64, shape (n,)
        Engine arrival times, seconds (*send_s* itself, copied, when the intake is 0).

    Raises
    ------
    radixkv.errors.ConfigError
        An intake time that is negative, NaN or infinite.
    """
    d = float(request_intake_s)
    if not 0 <= d < float("inf"):
        raise ConfigError(f"request_intake_s must be a finite number of seconds ≥ 0, got {request_intake_s}",
                          field="request_intake_s")
    s = np.asarray(send_s, dtype=np.float64)
    if d == 0.0 or s.size == 0:
        return s.copy()
    c = np.empty_like(s)
    last = -np.inf
    for i, t in enumerate(s.tolist()):
        last = max(t, last) + d
        c[i] = last
    out = c.copy()
    for i in range(s.size - 2, -1, -1):  # a request sent before its predecessor was taken in: same period
        if s[i + 1] <= c[i]:
            out[i] = out[i + 1]
    return out
