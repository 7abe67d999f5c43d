"""Arrival times of a concurrent replay.

Three processes, all deterministic for a given seed:

``trace``   the trace's own timestamps (``Trace.arrival_s``), shifted to start at 0 and
            multiplied by ``time_scale`` (< 1 compresses the trace: more load; > 1 stretches).
``poisson`` re-timed at ``request_rate`` req/s with exponential gaps (a Poisson process).
``gamma``   re-timed at ``request_rate`` req/s with Gamma gaps of shape ``burstiness`` and
            scale ``1 / (request_rate · burstiness)``: mean gap ``1 / request_rate``,
            coefficient of variation ``1 / sqrt(burstiness)``. This is vLLM's
            ``benchmarks/benchmark_serving.py --burstiness`` (1 = Poisson, < 1 burstier,
            > 1 more regular).

Re-timing keeps the trace's replay order: request i gets the i-th arrival. The first
request arrives at t = 0 and each gap follows it (vLLM's benchmark draws a gap after each
request it sends).
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError

ARRIVALS = ("trace", "poisson", "gamma")


def arrival_times(
    trace,
    *,
    arrival: str = "trace",
    time_scale: float = 1.0,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
) -> np.ndarray:
    """Arrival time of every request of *trace*, in replay order.

    Parameters
    ----------
    trace : radixkv.trace.Trace
        Requests in replay order (only ``len(trace)`` and ``arrival_s`` are read).
    arrival : {'trace', 'poisson', 'gamma'}
        The process (module docstring).
    time_scale : float
        Multiplier of the trace's times (``arrival='trace'`` only), > 0.
    request_rate : float or None
        Requests per second for ``poisson`` / ``gamma``; required there, > 0.
    burstiness : float
        Gamma shape (``gamma`` only), > 0.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    np.ndarray, float64, shape (n,)
        Seconds from the start, non-decreasing.

    Raises
    ------
    radixkv.errors.ConfigError
        On an unknown process or a non-positive rate, scale or shape.
    """
    n = len(trace)
    if arrival not in ARRIVALS:
        raise ConfigError(f"unknown arrival process {arrival!r}; choose one of {', '.join(ARRIVALS)}", field="arrival")
    if arrival == "trace":
        if request_rate is not None:
            raise ConfigError("--request-rate re-times the trace: use it with --arrival poisson or gamma", field="request_rate")
        if not time_scale > 0:
            raise ConfigError(f"--time-scale must be > 0, got {time_scale}", field="time_scale")
        t = np.asarray(trace.arrival_s, dtype=np.float64)
        if n == 0:
            return t.copy()
        return (t - t[0]) * float(time_scale)
    if request_rate is None or not request_rate > 0:
        raise ConfigError(f"--arrival {arrival} needs --request-rate > 0 (requests per second), got {request_rate}",
                          field="request_rate")
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / request_rate, size=max(n - 1, 0))
    else:
        if not burstiness > 0:
            raise ConfigError(f"burstiness must be > 0, got {burstiness}", field="burstiness")
        gaps = rng.gamma(burstiness, 1.0 / (request_rate * burstiness), size=max(n - 1, 0))
    out = np.zeros(n, dtype=np.float64)
    if n > 1:
        np.cumsum(gaps, out=out[1:])
    return out
