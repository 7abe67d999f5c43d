"""Measured error of the step-time model's token-parallel term, against Vidur's timings.

What is compared
----------------
For one model × GPU × TP degree and a batch of ``n`` new tokens, the *measured*
token-parallel time of a forward pass is built the way Vidur's simulator composes it
(``vidur/entities/execution_time.py``)::

    T_meas(n) = L · ( Σ_ops median_op(n)  +  2 · AllReduce(n · hidden · 2 bytes) )  +  emb(n)

with the operators of :data:`radixkv.clock.vidur.LAYER_OPS` (norms, QKV/output
projections, rotary, MLP up/act/down, two residual adds) measured on one TP worker, and the
all-reduce term only at TP > 1 (measured NCCL times, :class:`~radixkv.clock.vidur.AllReduceTable`)
and the measured embedding lookup once. The LM head is not measured (nor counted: Vidur's
simulator does not count it either). **The attention kernels are not in
the copy of Vidur's data**: their time is not compared here; the attention term of the
cost models is checked only end to end (replays of published benchmark runs).

Each cost model predicts the same work:

- ``roofline``: :class:`radixkv.cost.CostModel`'s formula restricted to these operators
  (Σa = 0, no KV bytes): ``L · max(2·P·n / (peak·mfu), 2·P / (bw·mbu))`` with P the
  layer's linear weights per worker (:meth:`~radixkv.clock.vidur.LayerShape.linear_params`
  / tp), no communication, no overhead, no embedding; MFU 0.6 and MBU 0.8 are the
  CostModel's assumptions.
- ``fitted``: the same roofline with MFU, MBU and a fixed per-layer time fitted per GPU
  on the training models (:func:`fit_roofline`), plus ``2 · L`` measured all-reduces,
  sampled into the token table the package uses
  (:func:`radixkv.clock.calibrated.fitted_token_table`).
- ``profiled``: linear interpolation in n of the measured ``T_meas`` at the breakpoints
  :data:`PROFILE_TOKENS` (the tables the package ships); evaluated at the other
  measured token counts only.

Regimes are token-count ranges of the batch: ``decode`` n ≤ 256 (a decode batch of n
requests), ``mixed`` 256 < n < 2048 (a chunk plus decodes), ``prefill`` n ≥ 2048.
Errors are ``pred / meas − 1``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixkv.clock.vidur import ALL_REDUCES_PER_LAYER, GPUS, AllReduceTable, LayerProfile

#: models the fitted roofline is trained on; every other model is held out
TRAIN_MODELS = ("meta-llama/Llama-2-7b-hf", "codellama/CodeLlama-34b-Instruct-hf", "Qwen/Qwen-72B")

#: breakpoints of the profiled tables (token counts; those a profile measured are kept)
PROFILE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                  6144, 8192, 12288, 16384, 24576, 32768)

#: regime of a batch of n tokens: (name, lowest n, highest n), inclusive
REGIMES = (("decode", 1, 256), ("mixed", 257, 2047), ("prefill", 2048, 1 << 62))

#: the CostModel's assumed efficiencies (radixkv.cost.CostModel defaults)
ASSUMED_MFU, ASSUMED_MBU = 0.6, 0.8

#: bytes of one activation element (fp16/bf16) in a TP all-reduce (Vidur's sizing)
ACT_BYTES = 2


def regime_of(n) -> np.ndarray:
    """Regime name of each token count (array of str, shape of *n*)."""
    n = np.asarray(n)
    out = np.empty(n.shape, dtype=object)
    for name, lo, hi in REGIMES:
        out[(n >= lo) & (n <= hi)] = name
    return out


def roofline_layer_time(linear_params: float, n, peak_flops: float, hbm_bytes_per_s: float,
                        mfu: float, mbu: float, weight_bytes: float = 2.0, overhead_s: float = 0.0):
    """Seconds of one layer's linear operators on one worker holding *linear_params*
    weights: ``max(2·P·n / (peak·mfu), P·weight_bytes / (bw·mbu)) + overhead_s``
    (float64, shape of *n*)."""
    n = np.asarray(n, dtype=np.float64)
    t_c = 2.0 * linear_params * n / (peak_flops * mfu)
    t_m = linear_params * weight_bytes / (hbm_bytes_per_s * mbu)
    return np.maximum(t_c, t_m) + overhead_s


@dataclass
class Case:
    """One model × GPU × TP with its measured token-parallel time (seconds, float64)."""

    prof: LayerProfile
    tokens: np.ndarray
    comm_s: np.ndarray  # per layer: ALL_REDUCES_PER_LAYER all-reduces, 0 at TP 1
    meas_s: np.ndarray  # L · (layer_s + comm_s) + emb_s

    @property
    def key(self) -> str:
        return f"{self.prof.gpu}/{self.prof.model}/tp{self.prof.tp}"

    @property
    def params_per_worker(self) -> float:
        return self.prof.shape.linear_params() / self.prof.tp


def comm_per_layer(prof: LayerProfile, ar: AllReduceTable | None, tokens) -> np.ndarray:
    """Seconds of one layer's all-reduces at each token count: ``2 · ar.time(n·h·2)``;
    zeros at TP 1."""
    tokens = np.asarray(tokens)
    if prof.tp == 1:
        return np.zeros(tokens.shape, dtype=np.float64)
    return ALL_REDUCES_PER_LAYER * ar.time(tokens.astype(np.float64) * prof.shape.hidden * ACT_BYTES)


def build_cases(profiles, all_reduce) -> tuple[list[Case], list[str]]:
    """Cases for every profile that can be composed, and a note for each one skipped
    (TP > 1 on a GPU without an all-reduce table for that GPU count)."""
    cases, skipped = [], []
    for p in profiles:
        ar = None
        if p.tp > 1:
            topo = GPUS[p.gpu][3]
            ar = all_reduce.get(topo, {}).get(p.tp) if topo else None
            if ar is None:
                skipped.append(f"{p.gpu}/{p.model}/tp{p.tp}: no measured all-reduce for {p.tp} GPUs")
                continue
        comm = comm_per_layer(p, ar, p.tokens)
        cases.append(Case(p, p.tokens, comm, p.num_layers * (p.layer_s + comm) + p.emb_s))
    return cases, skipped


def error_stats(pred, meas) -> dict:
    """Error distribution of *pred* against *meas* (same shapes, seconds).

    Returns
    -------
    dict
        ``n`` points; ``median``, ``p90`` of the absolute relative error ``|pred/meas − 1|``;
        ``worst`` (the signed error of largest magnitude); ``signed_median``, ``signed_p10``
        and ``signed_p90`` of ``pred/meas − 1`` (percentiles: numpy's linear method).
        Empty input: ``n`` 0 and None elsewhere (no error is not a zero error).
    """
    pred = np.asarray(pred, dtype=np.float64)
    meas = np.asarray(meas, dtype=np.float64)
    if pred.size == 0:
        return {"n": 0, "median": None, "p90": None, "worst": None, "signed_median": None,
                "signed_p10": None, "signed_p90": None}
    e = pred / meas - 1.0
    a = np.abs(e)
    return {"n": int(e.size), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "worst": float(e[np.argmax(a)]), "signed_median": float(np.median(e)),
            "signed_p10": float(np.percentile(e, 10)), "signed_p90": float(np.percentile(e, 90))}


# ------------------------------------------------------------------------------ fitting
def _nelder_mead(f, x0, steps, iters=400):
    """Minimise f over R^k from x0 (a small Nelder–Mead; deterministic)."""
    k = len(x0)
    pts = [np.asarray(x0, dtype=np.float64)]
    for i in range(k):
        p = pts[0].copy()
        p[i] += steps[i]
        pts.append(p)
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        c = np.mean(pts[:-1], axis=0)
        r = c + (c - pts[-1])
        fr = f(r)
        if fr < vals[0]:
            e = c + 2 * (c - pts[-1])
            fe = f(e)
            pts[-1], vals[-1] = (e, fe) if fe < fr else (r, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = r, fr
        else:
            ct = c + 0.5 * (pts[-1] - c)
            fc = f(ct)
            if fc < vals[-1]:
                pts[-1], vals[-1] = ct, fc
            else:
                for i in range(1, k + 1):
                    pts[i] = pts[0] + 0.5 * (pts[i] - pts[0])
                    vals[i] = f(pts[i])
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def fit_roofline(cases: list[Case], peak_flops: float, hbm_bytes_per_s: float) -> dict:
    """Fit ``mfu``, ``mbu`` and a per-layer fixed time ``layer_overhead_s`` of
    :func:`roofline_layer_time` to the cases' measured per-layer compute (communication
    excluded: it has its own fit), minimising the mean absolute log ratio over all their
    points. Returns ``{"mfu", "mbu", "layer_overhead_s", "points", "mean_abs_log_err"}``."""
    P = np.concatenate([np.full(c.tokens.shape, c.params_per_worker) for c in cases])
    n = np.concatenate([c.tokens for c in cases]).astype(np.float64)
    y = np.concatenate([c.prof.layer_s for c in cases])
    xc = 2.0 * P * n / peak_flops
    xm = 2.0 * P / hbm_bytes_per_s

    def unpack(z):  # mfu, mbu in (0, 1) by a logistic; overhead ≥ 0 in µs by a square
        return 1 / (1 + np.exp(-z[0])), 1 / (1 + np.exp(-z[1])), (z[2] ** 2) * 1e-6

    def f(z):
        mfu, mbu, o = unpack(z)
        pred = np.maximum(xc / mfu, xm / mbu) + o
        return float(np.mean(np.abs(np.log(pred / y))))

    best = None
    for z0 in ([0.4, 1.4, 2.0], [1.4, 0.4, 3.0], [0.0, 0.0, 1.0]):
        z, v = _nelder_mead(f, z0, [0.5, 0.5, 1.0])
        if best is None or v < best[1]:
            best = (z, v)
    mfu, mbu, o = unpack(best[0])
    return {"mfu": float(mfu), "mbu": float(mbu), "layer_overhead_s": float(o), "points": int(n.size),
            "mean_abs_log_err": float(best[1])}


# ------------------------------------------------------------------------------ predictions
def predict_roofline(case: Case, mfu: float, mbu: float) -> np.ndarray:
    """The CostModel roofline's time for the case's work: no communication, no overhead."""
    peak, bw = GPUS[case.prof.gpu][1], GPUS[case.prof.gpu][2]
    return case.prof.num_layers * roofline_layer_time(case.params_per_worker, case.tokens, peak, bw, mfu, mbu)


def profile_breakpoints(case: Case) -> np.ndarray:
    """Indices into ``case.tokens`` of the measured token counts in :data:`PROFILE_TOKENS`."""
    return np.flatnonzero(np.isin(case.tokens, np.asarray(PROFILE_TOKENS)))


def interp_table(x_tab, y_tab, x) -> np.ndarray:
    """Piecewise-linear table lookup (float64, shape of *x*): linear between breakpoints,
    the last segment's slope beyond the last, the first value below the first — the rule
    of :func:`radixkv.clock._kernels.table_time`."""
    xt = np.asarray(x_tab, dtype=np.float64)
    yt = np.asarray(y_tab, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    out = np.interp(x, xt, yt)
    if xt.size >= 2:
        hi = x > xt[-1]
        slope = (yt[-1] - yt[-2]) / (xt[-1] - xt[-2])
        out = np.where(hi, yt[-1] + slope * (x - xt[-1]), out)
    return out


def predict_profiled(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(held-out mask, prediction at every token count) of the profiled table built from
    the case's breakpoints; the mask is False at the breakpoints themselves."""
    bp = profile_breakpoints(case)
    pred = interp_table(case.tokens[bp], case.meas_s[bp], case.tokens)
    held = np.ones(case.tokens.shape, dtype=bool)
    held[bp] = False
    return held, pred
