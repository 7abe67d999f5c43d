"""Step-time models calibrated on measured GPU timings: ``fitted`` and ``profiled``.

:class:`CalibratedCostModel` prices a step as three terms (the split Vidur's simulator
makes: token-parallel operators, attention, fixed time)::

    T = table(Σn) + max(4·L·d_attn·Σa / (peak·attn_mfu·tp), kvb·Σb / (bw·attn_mbu·tp)) + step_overhead_s

- ``table(Σn)``: seconds of the token-parallel work of a forward pass (the linear
  layers, norms, rotary, residual adds, at TP > 1 two all-reduces per layer, and for
  ``profiled`` the embedding lookup) at Σn
  new tokens, a piecewise-linear table (:mod:`radixkv.clock._kernels`). *Measured* through
  Vidur's operator profiles (MIT; ``radixkv/clock/data/SOURCE.md``): for ``profiled`` the
  table is the measured time itself, for ``fitted`` a roofline whose MFU, MBU and per-layer
  fixed time were fitted on them (:mod:`radixkv.clock.error` states the error of both on
  held-out models and token counts; docs/clock.md).
- the attention term: the :class:`radixkv.cost.CostModel` roofline of the attention FLOPs
  (Σa = Σ n·c + n(n+1)/2) and KV bytes (Σb = Σ c + n), with **assumed** efficiencies
  ``attn_mfu`` 0.6 and ``attn_mbu`` 0.8: Vidur's attention profiles are not in the data
  used here, so this term is checked only end to end (published serving runs).
- ``step_overhead_s``: fixed CPU time per step, **assumed** 0 by default: vLLM V1 runs the
  scheduler in a busy loop beside the GPU work ("vLLM V1: A Major Upgrade to vLLM's Core
  Architecture", vLLM blog, 2025-01-24), while vLLM V0 measured 4–13 ms of GPU idle per
  decode step (vllm-project/vllm issue #6854); give ``step_overhead_s`` to model it.

The LM head is not priced (Vidur did not measure it), the embedding only by ``profiled``;
:meth:`prefill_flops` counts FLOPs as
:meth:`radixkv.cost.CostModel.prefill_flops` does (the replay reports them, the clock does
not use them).

The roofline :class:`radixkv.cost.CostModel` stays the default everywhere; these models are
chosen with ``--cost-model fitted|profiled|PATH`` or :func:`cost_model`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from radixkv.errors import ConfigError, InputError

DATA = Path(__file__).resolve().parent / "data"

#: the kinds :func:`cost_model` builds by name
KINDS = ("roofline", "fitted", "profiled")

#: token counts a fitted model's table is sampled at (plus the roofline's knee): Vidur's
#: profiled range is 1..4096 tokens (32768 for two models); beyond the last the table's
#: last segment extends linearly, as the roofline's compute-bound branch does
FIT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
              6144, 8192, 12288, 16384, 24576, 32768)


@dataclass(frozen=True)
class CalibratedCostModel:
    """A step-time model with a measured token-parallel table (module docstring).

    Parameters
    ----------
    kind : str
        ``"fitted"``, ``"profiled"`` or ``"file"`` (a profile read from a path); a label.
    params, num_layers, attn_dim, kv_bytes_per_token, peak_flops, hbm_bytes_per_s, tp
        As :class:`radixkv.cost.CostModel` (``params`` only counts prefill FLOPs).
    table_tokens : tuple of float
        Σn of the breakpoints, strictly ascending, ≥ 1.
    table_seconds : tuple of float
        Seconds of the token-parallel work of one forward pass at those Σn (one TP
        worker's time, all layers, communication included), finite, ≥ 0.
    attn_mfu, attn_mbu : float
        Assumed efficiencies of the attention term, in (0, 1].
    step_overhead_s : float
        Fixed seconds per step (≥ 0).
    source : str
        Where the table comes from (printed in the replay's metadata).

    Raises
    ------
    radixkv.errors.ConfigError
        On a bad value (named field).
    """

    kind: str
    params: float
    num_layers: int
    attn_dim: int
    kv_bytes_per_token: float
    peak_flops: float
    hbm_bytes_per_s: float
    tp: int
    table_tokens: tuple
    table_seconds: tuple
    attn_mfu: float = 0.6
    attn_mbu: float = 0.8
    step_overhead_s: float = 0.0
    source: str = ""

    def __post_init__(self):
        from radixkv.cost import check_fields

        check_fields(self, ("params", "num_layers", "attn_dim", "kv_bytes_per_token", "peak_flops",
                            "hbm_bytes_per_s", "tp"), ("attn_mfu", "attn_mbu"))
        x = tuple(float(v) for v in self.table_tokens)
        y = tuple(float(v) for v in self.table_seconds)
        if not x or len(x) != len(y):
            raise ConfigError(f"the token table needs ≥ 1 breakpoint and as many times as token counts "
                              f"({len(x)} vs {len(y)})", field="table_tokens")
        if x[0] < 1 or any(b <= a for a, b in zip(x, x[1:])) or not all(map(math.isfinite, x)):
            raise ConfigError("table_tokens must be finite, ≥ 1 and strictly ascending", field="table_tokens")
        if not all(math.isfinite(v) and v >= 0 for v in y):
            raise ConfigError("table_seconds must be finite and ≥ 0", field="table_seconds")
        object.__setattr__(self, "table_tokens", x)
        object.__setattr__(self, "table_seconds", y)

    # ---------------------------------------------------------------- the packed form
    def packed(self) -> np.ndarray:
        """The float64 array the compiled step-time functions read (:mod:`radixkv.clock._kernels`)."""
        import radixkv.clock._kernels as TK

        return TK.pack(4.0 * self.num_layers * self.attn_dim, self.peak_flops * self.attn_mfu * self.tp,
                       self.kv_bytes_per_token, self.hbm_bytes_per_s * self.attn_mbu * self.tp,
                       self.step_overhead_s, self.table_tokens, self.table_seconds)

    def _cp(self) -> np.ndarray:
        cp = self.__dict__.get("_cp_cache")
        if cp is None:
            cp = self.packed()
            object.__setattr__(self, "_cp_cache", cp)  # not a field: not in __eq__, repr or the metadata
        return cp

    # ---------------------------------------------------------------- the cost-model interface
    def prefill_flops(self, new_tokens, context_tokens=0):
        """FLOPs of :meth:`radixkv.cost.CostModel.prefill_flops` (the same formula)."""
        from radixkv.cost import CostModel

        return CostModel.prefill_flops(self, new_tokens, context_tokens)

    def token_time(self, tokens) -> float:
        """Seconds of the token-parallel work at *tokens* = Σn (the table alone)."""
        import radixkv.clock._kernels as TK

        return float(TK.table_time_call(self._cp(), float(tokens)))

    def step_time(self, new_tokens, context_tokens) -> float:
        """Seconds of one step running items with *new_tokens* n_i and *context_tokens* c_i
        (array-like of int, shape (k,)); 0 for an empty batch. The sums are formed in
        integers (exact), as the compiled loops form them."""
        import radixkv.clock._kernels as TK

        n = [int(v) for v in np.asarray(new_tokens).ravel()]
        c = [int(v) for v in np.asarray(context_tokens).ravel()]
        if not n:
            return 0.0
        if len(n) != len(c):
            raise ValueError(f"{len(n)} new-token counts for {len(c)} contexts")
        sn = sum(n)
        sa = sum(a * b + a * (a + 1) // 2 for a, b in zip(n, c))
        sb = sum(a + b for a, b in zip(n, c))
        return float(TK.step_time_call(self._cp(), float(sn), float(sa), float(sb)))

    def decode_steps_time(self, batch: int, context_sum: int, k: int) -> np.ndarray:
        """Times of k consecutive pure-decode steps (float64 (k,)), step j with
        ``context_sum + j · batch`` tokens of KV before it."""
        import radixkv.clock._kernels as TK

        out = np.empty(int(k), dtype=np.float64)
        TK.decode_steps_time_into(self._cp(), int(batch), int(context_sum), int(k), out)
        return out


# ------------------------------------------------------------------------------ data files
@lru_cache(maxsize=None)
def _load(name: str) -> dict:
    path = DATA / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read the packaged data file: {e}", path=path) from None


def fitted_parameters() -> dict:
    """The fitted roofline's parameters per GPU preset (``radixkv/clock/data/fitted.json``)."""
    return _load("fitted.json")


def profiles() -> dict:
    """The shipped per-layer profiles (``radixkv/clock/data/profiles.json``)."""
    return _load("profiles.json")


# ------------------------------------------------------------------------------ layer shapes
def layer_shape_key(m) -> str:
    """The layer-shape key of a dense model spec (:meth:`radixkv.clock.vidur.LayerShape.key`).

    Raises
    ------
    radixkv.errors.ConfigError
        For a model the measured profiles cannot stand for: MLA, hybrid or sliding-window
        layers, a head dim other than hidden / heads, or a parameter count outside the dense
        shape formula's range (layers + tied or untied embeddings, ±3 %: a mixture of experts).
    """
    from radixkv.clock.vidur import LayerShape

    if m.is_mla or m.layer_types is not None or m.ssm is not None:
        raise ConfigError(f"model {m.name}: the calibrated clocks cover dense attention models only "
                          f"(MLA, hybrid and linear-attention layers are not profiled); use --cost-model roofline",
                          field="cost_model")
    if m.head_dim * m.num_attention_heads != m.hidden_size:
        raise ConfigError(f"model {m.name}: head_dim × heads ({m.head_dim} × {m.num_attention_heads}) ≠ hidden "
                          f"({m.hidden_size}); Vidur's shapes assume equality; use --cost-model roofline",
                          field="cost_model")
    s = LayerShape(m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.intermediate_size, True)
    tied = m.num_layers * s.linear_params() + m.vocab_size * m.hidden_size
    untied = tied + m.vocab_size * m.hidden_size
    if not (0.97 * tied <= m.num_params <= 1.03 * untied):
        raise ConfigError(f"model {m.name}: {m.num_params:,} parameters, the dense shape formula gives "
                          f"{tied:,} to {untied:,} (a mixture of experts?); the calibrated clocks cover dense models only; "
                          f"use --cost-model roofline", field="cost_model")
    return s.key()


def _shape_linear_params(m) -> int:
    from radixkv.clock.vidur import LayerShape

    return LayerShape(m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.intermediate_size, True).linear_params()


def _common(model, gpu, tp, kv_cache_dtype):
    from radixkv.memory import GPUSpec, ModelSpec, get_gpu, get_model

    m = model if isinstance(model, ModelSpec) else get_model(model)
    g = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
    if int(tp) < 1:
        raise ConfigError(f"tp must be ≥ 1, got {tp}", field="tp")
    base = dict(params=float(m.num_params), num_layers=int(m.num_layers),
                attn_dim=int(m.num_attention_heads * m.head_dim),
                kv_bytes_per_token=float(m.kv_bytes_per_token_total(int(tp), kv_cache_dtype)),
                peak_flops=float(g.bf16_flops), hbm_bytes_per_s=float(g.hbm_bytes_per_s), tp=int(tp))
    return m, g, base


def all_reduce_seconds(gpu_entry: dict, tp: int, size_bytes) -> np.ndarray:
    """Seconds of one all-reduce of *size_bytes* on *tp* GPUs from a fitted.json GPU entry
    (its measured table: linear between sizes, the last chord's slope beyond)."""
    t = gpu_entry["all_reduce"][str(tp)]
    from radixkv.clock.error import interp_table

    return interp_table(t["size_bytes"], t["seconds"], size_bytes)


def fitted_token_table(linear_params: int, num_layers: int, hidden: int, tp: int, entry: dict):
    """(tokens, seconds) of a fitted model's token-parallel table: at each Σn of
    :data:`FIT_TOKENS` and the roofline's knee, ``L · (max(2·P·n / (peak·mfu),
    2·P / (bw·mbu)) + layer_overhead_s + 2·AllReduce(n·hidden·2))`` with P =
    ``linear_params / tp`` and the all-reduce term only at TP > 1."""
    from radixkv.clock.error import ACT_BYTES, roofline_layer_time
    from radixkv.clock.vidur import ALL_REDUCES_PER_LAYER

    P = linear_params / tp
    knee = (P * 2.0 / (entry["hbm_bytes_per_s"] * entry["mbu"])) / (2.0 * P / (entry["peak_flops"] * entry["mfu"]))
    xs = np.unique(np.concatenate([np.asarray(FIT_TOKENS, dtype=np.float64), [max(1.0, knee)]]))
    t = roofline_layer_time(P, xs, entry["peak_flops"], entry["hbm_bytes_per_s"], entry["mfu"], entry["mbu"],
                            overhead_s=entry["layer_overhead_s"])
    if tp > 1:
        t = t + ALL_REDUCES_PER_LAYER * all_reduce_seconds(entry, tp, xs * hidden * ACT_BYTES)
    return xs, num_layers * t


def fitted(model, gpu, *, tp: int = 1, kv_cache_dtype=None, attn_mfu: float = 0.6, attn_mbu: float = 0.8,
           step_overhead_s: float | None = None) -> CalibratedCostModel:
    """The fitted roofline of *model* on *gpu* (presets or specs).

    Raises
    ------
    radixkv.errors.ConfigError
        When the GPU has no fitted parameters, or TP > 1 has no measured all-reduce for
        that GPU count (both named, with what there is), or the model is not dense.
    """
    m, g, base = _common(model, gpu, tp, kv_cache_dtype)
    layer_shape_key(m)
    fit = fitted_parameters()
    entry = fit["gpus"].get(g.name)
    if entry is None:
        raise ConfigError(f"no fitted step-time parameters for GPU {g.name!r} (fitted: {', '.join(fit['gpus'])}); "
                          f"use --cost-model roofline", field="cost_model")
    if tp > 1 and str(tp) not in entry["all_reduce"]:
        raise ConfigError(f"no measured all-reduce for TP {tp} on {g.name} (measured: TP "
                          f"{', '.join(entry['all_reduce'])}); use --cost-model roofline", field="tp")
    xs, ys = fitted_token_table(_shape_linear_params(m), m.num_layers, m.hidden_size, int(tp), entry)
    over = fit["step_overhead_s"] if step_overhead_s is None else float(step_overhead_s)
    return CalibratedCostModel("fitted", table_tokens=tuple(xs), table_seconds=tuple(ys), attn_mfu=attn_mfu,
                               attn_mbu=attn_mbu, step_overhead_s=over, source=f"fitted.json:{g.name}", **base)


def profiled(model, gpu, *, tp: int = 1, kv_cache_dtype=None, attn_mfu: float = 0.6, attn_mbu: float = 0.8,
             step_overhead_s: float | None = None) -> CalibratedCostModel:
    """The profiled model: the shipped measured per-layer table of *model*'s layer shape on
    *gpu* at *tp*, times the model's layers. No fallback: a missing profile is an error.

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the GPU, layer shape and TP that have no profile, and the profiles there are.
    """
    m, g, base = _common(model, gpu, tp, kv_cache_dtype)
    key = layer_shape_key(m)
    pr = profiles()
    gp = pr["gpus"].get(g.name)
    if gp is None:
        raise ConfigError(f"no measured profile for GPU {g.name!r} (profiled GPUs: {', '.join(pr['gpus'])}); "
                          f"use --cost-model fitted or roofline", field="cost_model")
    sh = gp.get(key)
    if sh is None or str(tp) not in sh:
        have = ", ".join(f"{k} (TP {'/'.join(v)})" for k, v in gp.items())
        raise ConfigError(f"no measured profile for layer shape {key} at TP {tp} on {g.name} (model {m.name}); "
                          f"profiled there: {have}; use --cost-model fitted or roofline", field="cost_model")
    p = sh[str(tp)]
    xs = np.asarray(p["tokens"], dtype=np.float64)
    ys = m.num_layers * (np.asarray(p["layer_s"]) + np.asarray(p["comm_s"])) + np.asarray(p["emb_s"])
    over = pr["step_overhead_s"] if step_overhead_s is None else float(step_overhead_s)
    return CalibratedCostModel("profiled", table_tokens=tuple(xs), table_seconds=tuple(ys), attn_mfu=attn_mfu,
                               attn_mbu=attn_mbu, step_overhead_s=over,
                               source=f"profiles.json:{g.name}/{key}/tp{tp} ({p['from']})", **base)


def from_file(path, model, gpu, *, tp: int = 1, kv_cache_dtype=None, attn_mfu: float = 0.6, attn_mbu: float = 0.8,
              step_overhead_s: float | None = None) -> CalibratedCostModel:
    """A profile measured by the user: a JSON object ``{"tokens": [...], "layer_s": [...],
    "comm_s": [...] (optional), "emb_s": [...] (optional), "source": "..."}`` — seconds of
    one layer's token-parallel work (communication included in ``layer_s`` or given as
    ``comm_s``) and of the embedding lookup (once per pass) at each token count, on one TP
    worker of *model* at *tp* on *gpu*: ``table = L · (layer_s + comm_s) + emb_s``.

    Raises
    ------
    radixkv.errors.InputError
        Unreadable file, not JSON, a missing or malformed field (file and field named).
    """
    m, g, base = _common(model, gpu, tp, kv_cache_dtype)
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise InputError(f"cannot read the cost-model profile: {e}", path=path, field="cost_model") from None
    except ValueError as e:
        raise InputError(f"not JSON: {e}", path=path, field="cost_model") from None
    if not isinstance(doc, dict):
        raise InputError("a profile is a JSON object with tokens and layer_s", path=path, field="cost_model")
    arrs = {}
    for f in ("tokens", "layer_s", "comm_s", "emb_s"):
        v = doc.get(f, [0.0] * len(doc.get("tokens", [])) if f in ("comm_s", "emb_s") else None)
        if not isinstance(v, list) or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in v):
            raise InputError(f"field {f!r} must be a list of numbers", path=path, field=f)
        arrs[f] = np.asarray(v, dtype=np.float64)
    if not (arrs["tokens"].size == arrs["layer_s"].size == arrs["comm_s"].size == arrs["emb_s"].size):
        raise InputError("tokens, layer_s, comm_s and emb_s must have the same length", path=path, field="layer_s")
    ys = m.num_layers * (arrs["layer_s"] + arrs["comm_s"]) + arrs["emb_s"]
    try:
        return CalibratedCostModel("file", table_tokens=tuple(arrs["tokens"]), table_seconds=tuple(ys),
                                   attn_mfu=attn_mfu, attn_mbu=attn_mbu,
                                   step_overhead_s=0.0 if step_overhead_s is None else float(step_overhead_s),
                                   source=f"{path}: {doc.get('source', '')}", **base)
    except ConfigError as e:
        raise InputError(str(e), path=path, field=getattr(e, "field", None)) from None


def cost_model(kind: str, model, gpu, *, tp: int = 1, kv_cache_dtype=None, mfu: float = 0.6, mbu: float = 0.8,
               step_overhead_s: float | None = None):
    """A step-time model by kind: ``"roofline"`` (:class:`radixkv.cost.CostModel`, the
    default; *mfu*/*mbu* its efficiencies, *step_overhead_s* default 0), ``"fitted"``,
    ``"profiled"`` (:class:`CalibratedCostModel`; *mfu*/*mbu* the attention term's
    efficiencies, *step_overhead_s* default the data file's), or a path to a profile JSON
    (:func:`from_file`).

    Raises
    ------
    radixkv.errors.ConfigError / InputError
        As the builders.
    """
    if kind == "roofline":
        from radixkv.cost import CostModel

        return CostModel.from_specs(model, gpu, tp=tp, kv_cache_dtype=kv_cache_dtype, mfu=mfu, mbu=mbu,
                                    step_overhead_s=0.0 if step_overhead_s is None else float(step_overhead_s))
    kw = dict(tp=tp, kv_cache_dtype=kv_cache_dtype, attn_mfu=mfu, attn_mbu=mbu, step_overhead_s=step_overhead_s)
    if kind == "fitted":
        return fitted(model, gpu, **kw)
    if kind == "profiled":
        return profiled(model, gpu, **kw)
    if not Path(kind).is_file():
        raise ConfigError(f"--cost-model {kind!r}: not one of {', '.join(KINDS)} and not a file", field="cost_model")
    return from_file(kind, model, gpu, **kw)
