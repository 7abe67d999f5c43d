"""Step time of :class:`radixkv.clock.calibrated.CalibratedCostModel` from a step's sums.

One compiled function serves every path that prices a step — the Python replay loops
(through :class:`~radixkv.clock.calibrated.CalibratedCostModel`), the compiled vLLM loop
(:mod:`radixkv.replay._conc_vllm_kernels`, cost kind ``COST_TABLE``) and the compiled
SGLang loop (:mod:`radixkv.replay._conc_sglang_kernels`) — so all of them compute the same
float operations in the same order, whatever the caller.

The model's parameters travel as one float64 array ``cp`` (:func:`pack`'s layout):

====== =========================================================================
index  value
====== =========================================================================
0      ``4 · L · d_attn`` (attention FLOPs per unit of Σa)
1      ``peak_flops · attn_mfu · tp``
2      ``kv_bytes_per_token`` (all TP ranks)
3      ``hbm_bytes_per_s · attn_mbu · tp``
4      ``step_overhead_s``
5      m, the number of table breakpoints (≥ 1)
6 …    ``x[0..m)``: token counts Σn of the breakpoints, ascending
6 + m  ``y[0..m)``: seconds of the token-parallel work at those counts
====== =========================================================================

Step time of a batch with sums Σn (new tokens), Σa (``Σ n·c + n(n+1)/2``) and Σb
(``Σ c + n``)::

    T = table(Σn) + max(cp[0]·Σa / cp[1], cp[2]·Σb / cp[3]) + cp[4]

``table`` interpolates linearly between breakpoints, extends the last segment beyond the
last breakpoint, and holds the first value below the first.
"""
from __future__ import annotations

import numba as nb
import numpy as np

#: index of m in the packed array; the breakpoints follow it
T_M = 5
T_X0 = 6


def pack(attn_flops_per_unit, attn_c_div, kvb, attn_m_div, overhead, x, y) -> np.ndarray:
    """The float64 array of the module table (x, y: sequences of the same length ≥ 1)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    head = np.array([attn_flops_per_unit, attn_c_div, kvb, attn_m_div, overhead, float(x.size)], dtype=np.float64)
    return np.concatenate([head, x, y])


@nb.njit(cache=True, inline="always")
def table_time(cp, x):
    """Seconds of the token-parallel work at *x* = Σn tokens (float)."""
    m = int(cp[T_M])
    if m == 1 or x <= cp[T_X0]:
        return cp[T_X0 + m]
    i = 1
    while i < m - 1 and x > cp[T_X0 + i]:
        i += 1
    x0 = cp[T_X0 + i - 1]
    x1 = cp[T_X0 + i]
    y0 = cp[T_X0 + m + i - 1]
    y1 = cp[T_X0 + m + i]
    return y0 + (y1 - y0) * ((x - x0) / (x1 - x0))


@nb.njit(cache=True, inline="always")
def step_time(cp, sn, sa, sb):
    """Seconds of a step with sums *sn*, *sa*, *sb* (floats; the module formula)."""
    t_c = cp[0] * sa / cp[1]
    t_m = cp[2] * sb / cp[3]
    return table_time(cp, sn) + (t_c if t_c >= t_m else t_m) + cp[4]


@nb.njit(cache=True, inline="always")
def decode_step_time(cp, batch, context_sum, j):
    """Step j (0-based) of a run of pure-decode steps of *batch* requests holding
    *context_sum* tokens of KV before the run: Σn = batch, Σa = Σb = ctx + batch with
    ``ctx = context_sum + j · batch`` (the roofline's decode sums)."""
    fb = float(batch)
    x = (float(context_sum) + float(j) * fb) + fb
    return step_time(cp, fb, x, x)


@nb.njit(cache=True)
def decode_steps_time_into(cp, batch, context_sum, k, out):
    """:func:`decode_step_time` of steps 0..k−1 into ``out[:k]``."""
    for j in range(k):
        out[j] = decode_step_time(cp, batch, context_sum, j)


@nb.njit(cache=True)
def step_time_call(cp, sn, sa, sb):
    """:func:`step_time` as a function of its own (the Python paths call this)."""
    return step_time(cp, sn, sa, sb)


@nb.njit(cache=True)
def table_time_call(cp, x):
    """:func:`table_time` as a function of its own."""
    return table_time(cp, x)
