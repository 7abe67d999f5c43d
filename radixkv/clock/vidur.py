"""Read Vidur's measured GPU operator timings (its ``data/profiling/`` layout).

Vidur (Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference",
MLSys 2024; github.com/microsoft/vidur, MIT) profiles every token-parallel operator of one
transformer layer on real GPUs, per model shape, token count and tensor-parallel degree
(``compute/<gpu>/<org>/<model>/mlp.csv``), and the NCCL all-reduce per message size and
GPU count (``network/<topology>/all_reduce.csv``). Times are per operator in
milliseconds; each row holds ``time_stats.<op>.median`` (and min/max/mean/std).

This module only reads those files (the standard ``csv`` module; no pandas at run time)
into :class:`LayerProfile` and :class:`AllReduceTable`. How the operators compose into a
forward pass is :mod:`radixkv.clock.error`'s job. The files are never copied into the
repository: experiments read them from ``$RADIXKV_SHARED/measurements/vidur``; the package
ships only small derived tables (``radixkv/clock/data``, with Vidur's license).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from radixkv.errors import InputError

#: token-parallel operators of one layer, with how many times each runs per layer. Vidur's
#: ``ExecutionTime`` (vidur/entities/execution_time.py) sums, per layer: attention half =
#: input norm + QKV projection + rotary + output projection + residual add (+ attention
#: kernels, not in this copy, + TP all-reduce); MLP half = post-attention norm + up + act +
#: down projections + residual add (+ TP all-reduce). Vidur's simulator counts neither the
#: embedding nor the LM head ("we are not counting the execution time for the embedding
#: layer and last softmax layer"); the embedding lookup is measured in the same files
#: (``time_stats.emb``) and :class:`LayerProfile` keeps it apart (``emb_s``, once per
#: forward pass); the LM head is not measured. An operator whose column a file lacks is
#: one the model does not run (phi-2's parallel attention and MLP share one layer norm).
LAYER_OPS = (("input_layernorm", 1), ("attn_pre_proj", 1), ("attn_rope", 1), ("attn_post_proj", 1),
             ("post_attention_layernorm", 1), ("mlp_up_proj", 1), ("mlp_act", 1), ("mlp_down_proj", 1),
             ("add", 2))

#: all-reduces per layer at TP > 1 (after the attention output projection and after the
#: MLP down projection; Megatron-style tensor parallelism, as vLLM and SGLang run it)
ALL_REDUCES_PER_LAYER = 2

#: layers of each profiled model (the Hugging Face ``config.json`` ``num_hidden_layers``
#: of the named repository; not in Vidur's CSV)
NUM_LAYERS = {
    "meta-llama/Llama-2-7b-hf": 32, "meta-llama/Llama-2-70b-hf": 80, "meta-llama/Meta-Llama-3-8B": 32,
    "meta-llama/Meta-Llama-3-70B": 80, "codellama/CodeLlama-34b-Instruct-hf": 48, "Qwen/Qwen-72B": 80,
    "internlm/internlm-20b": 60, "microsoft/phi-2": 32,
}

#: Vidur's GPU folders → (radixkv GPU preset or None, dense fp16/bf16 FLOP/s, HBM bytes/s,
#: all-reduce topology folder or None). A100/H100: the presets' datasheet figures
#: (radixkv.memory.presets; Vidur profiled the 80 GB SXM parts in DGX nodes). A40: NVIDIA
#: A40 datasheet, 149.7 TFLOPS BF16 dense (299.4 with sparsity), 696 GB/s GDDR6; no
#: all-reduce table in the copy (its pairwise-NVLink folder holds send/recv only).
GPUS = {
    "a100": ("A100-80GB", 312e12, 2.039e12, "a100_dgx"),
    "h100": ("H100-80GB", 989.4e12, 3.35e12, "h100_dgx"),
    "a40": (None, 149.7e12, 696e9, None),
}


@dataclass(frozen=True)
class LayerShape:
    """One layer's shape as Vidur's rows give it (the whole model, before TP sharding).

    ``hidden`` = ``n_embd``, ``ffn`` = ``n_expanded_embd``, ``gated`` = ``use_gated_mlp``.
    """

    hidden: int
    num_heads: int
    num_kv_heads: int
    ffn: int
    gated: bool

    def key(self) -> str:
        """Stable text key, e.g. ``h4096-q32-kv8-f14336-gated``."""
        return (f"h{self.hidden}-q{self.num_heads}-kv{self.num_kv_heads}-f{self.ffn}-"
                f"{'gated' if self.gated else 'plain'}")

    def linear_params(self) -> int:
        """Weights of the layer's linear operators (QKV, output, MLP projections; no
        biases, no norms): ``h·(h + 2·kv·d) + h·h + (3 if gated else 2)·h·f`` with head
        dim ``d = h / heads``."""
        h = self.hidden
        d = h // self.num_heads
        return h * (h + 2 * self.num_kv_heads * d) + h * h + (3 if self.gated else 2) * h * self.ffn


@dataclass
class LayerProfile:
    """Measured token-parallel time of one layer of one model on one GPU at one TP degree.

    Attributes
    ----------
    gpu, model : str
        Vidur's GPU folder (``a100``) and model id (``meta-llama/Llama-2-7b-hf``).
    tp : int
        Tensor-parallel workers (each runs a 1/tp shard; the time is one worker's).
    shape : LayerShape
    num_layers : int
        From :data:`NUM_LAYERS`.
    tokens : np.ndarray, int64, shape (k,)
        Token counts, ascending, unique.
    layer_s : np.ndarray, float64, shape (k,)
        Seconds of one layer's operators (:data:`LAYER_OPS`, medians; the median of
        repeated rows at the same token count), no communication.
    emb_s : np.ndarray, float64, shape (k,)
        Seconds of the embedding lookup (``time_stats.emb.median``; 0 where a file has no
        such column), once per forward pass.
    """

    gpu: str
    model: str
    tp: int
    shape: LayerShape
    num_layers: int
    tokens: np.ndarray
    layer_s: np.ndarray
    emb_s: np.ndarray
    source: str = field(default="", repr=False)


@dataclass
class AllReduceTable:
    """Measured NCCL all-reduce time by message size for one GPU count.

    ``size_bytes`` (int64, ascending) and ``seconds`` (float64), medians over repeated rows.
    """

    topology: str
    num_workers: int
    size_bytes: np.ndarray
    seconds: np.ndarray

    def time(self, size_bytes) -> np.ndarray:
        """Seconds for messages of *size_bytes* (array-like): linear interpolation, and
        beyond the largest measured size the last segment's slope (the bandwidth-bound
        regime); below the smallest, the smallest's time. The slope beyond is that of the
        chord from the measured size nearest half the largest to the largest (two
        neighbouring medians are too noisy: their slope can be negative)."""
        x = np.asarray(size_bytes, dtype=np.float64)
        xs = self.size_bytes.astype(np.float64)
        ys = self.seconds
        out = np.interp(x, xs, ys)
        hi = x > xs[-1]
        if hi.any():
            j = int(np.argmin(np.abs(xs - xs[-1] / 2)))
            slope = (ys[-1] - ys[j]) / (xs[-1] - xs[j])
            out = np.where(hi, ys[-1] + slope * (x - xs[-1]), out)
        return out


def _rows(path: Path):
    try:
        with open(path, newline="") as f:
            yield from enumerate(csv.DictReader(f), start=2)
    except OSError as e:
        raise InputError(f"cannot read: {e}", path=path) from None


def _num(row, col, path, line, kind=float):
    try:
        return kind(float(row[col])) if kind is int else kind(row[col])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"column {col!r} missing or not a number ({row.get(col)!r})",
                         path=path, line=line, field=col) from None


def _median_by(keys, vals):
    """(sorted unique keys, median of vals per key)."""
    keys = np.asarray(keys)
    vals = np.asarray(vals, dtype=np.float64)
    u = np.unique(keys)
    return u, np.array([np.median(vals[keys == k]) for k in u])


def read_mlp_csv(path, gpu: str, model: str) -> list[LayerProfile]:
    """One ``mlp.csv`` → one :class:`LayerProfile` per TP degree in it.

    Raises
    ------
    radixkv.errors.InputError
        A missing column or non-number (file, line, column), several shapes in one file,
        or a model not in :data:`NUM_LAYERS`.
    """
    path = Path(path)
    if model not in NUM_LAYERS:
        raise InputError(f"no layer count for model {model!r} (radixkv.clock.vidur.NUM_LAYERS)", path=path)
    by_tp: dict[int, tuple[list, list, list]] = {}
    shape = None
    for line, row in _rows(path):
        s = LayerShape(_num(row, "n_embd", path, line, int), _num(row, "n_head", path, line, int),
                       _num(row, "n_kv_head", path, line, int), _num(row, "n_expanded_embd", path, line, int),
                       str(row.get("use_gated_mlp", "")).strip().lower() == "true")
        if shape is None:
            shape = s
        elif s != shape:
            raise InputError(f"a second model shape {s} in one file (first {shape})", path=path, line=line)
        t = sum(k * _num(row, f"time_stats.{op}.median", path, line) for op, k in LAYER_OPS
                if f"time_stats.{op}.median" in row)  # phi-2 (parallel attention + MLP) has one norm
        tp = _num(row, "num_tensor_parallel_workers", path, line, int)
        n = _num(row, "num_tokens", path, line, int)
        e = _num(row, "time_stats.emb.median", path, line) if "time_stats.emb.median" in row else 0.0
        ks, vs, es = by_tp.setdefault(tp, ([], [], []))
        ks.append(n)
        vs.append(t * 1e-3)
        es.append(e * 1e-3)
    if shape is None:
        raise InputError("no rows", path=path)
    out = []
    for tp in sorted(by_tp):
        ks, vs, es = by_tp[tp]
        n, t = _median_by(ks, vs)
        _, e = _median_by(ks, es)
        out.append(LayerProfile(gpu, model, tp, shape, NUM_LAYERS[model], n.astype(np.int64), t, e, str(path)))
    return out


def read_all_reduce_csv(path, topology: str) -> dict[int, AllReduceTable]:
    """``all_reduce.csv`` → {GPU count: :class:`AllReduceTable`} (``size`` in bytes:
    Vidur sizes a TP all-reduce as ``num_tokens × embedding_dim × 2``)."""
    path = Path(path)
    by_w: dict[int, tuple[list, list]] = {}
    for line, row in _rows(path):
        w = _num(row, "num_workers", path, line, int)
        ks, vs = by_w.setdefault(w, ([], []))
        ks.append(_num(row, "size", path, line, int))
        vs.append(_num(row, "time_stats.all_reduce.median", path, line) * 1e-3)
    return {w: AllReduceTable(topology, w, *(lambda k, v: (k.astype(np.int64), v))(*_median_by(*by_w[w])))
            for w in sorted(by_w)}


def read_vidur(root) -> tuple[list[LayerProfile], dict[str, dict[int, AllReduceTable]]]:
    """All layer profiles under ``root/compute`` and all-reduce tables under ``root/network``.

    Returns
    -------
    (profiles, all_reduce)
        profiles sorted by (gpu, model, tp); all_reduce: {topology: {GPU count: table}}.

    Raises
    ------
    radixkv.errors.InputError
        When *root* has no ``compute`` folder, or a file is malformed.
    """
    root = Path(root)
    if not (root / "compute").is_dir():
        raise InputError("not a Vidur profiling folder (no compute/ inside)", path=root)
    profs = []
    for p in sorted((root / "compute").glob("*/*/*/mlp.csv")):
        gpu, org, name = p.parts[-4], p.parts[-3], p.parts[-2]
        profs.extend(read_mlp_csv(p, gpu, f"{org}/{name}"))
    ar = {}
    for p in sorted((root / "network").glob("*/all_reduce.csv")):
        ar[p.parent.name] = read_all_reduce_csv(p, p.parent.name)
    profs.sort(key=lambda q: (q.gpu, q.model, q.tp))
    return profs, ar
