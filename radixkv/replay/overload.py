"""Overload of a concurrent replay: arrivals outpace the engine and it never catches up.

An engine offered more work per second than it completes builds a queue that grows for
as long as the arrivals go on: every request waits longer than the one before, and the
replay's TTFT percentiles measure the length of the trace, not the engine. Such a run
has no steady-state latency to report; :func:`overload_metrics` says whether a run looks
like one, so that callers (``radixkv plan``, sweep rows) flag it instead of printing its
percentiles as if they were normal latencies.

The test is on the queueing delay ``q_i`` (first admission − arrival, seconds) against
the arrival time ``a_i`` of every request:

* ``queue_growth_s_per_s``: the least-squares slope of ``q`` on ``a`` (seconds of
  queueing gained per second of traffic; its sums exactly rounded, so the same in every
  process whatever its BLAS threads). A stable engine's queue delay is stationary
  (slope ≈ 0); an engine at load ρ > 1 gains ``1 − 1/ρ`` s per s (a request arriving at
  time t waits for the work of ``ρ·t`` seconds, done in t).
* ``queue_tail_mean_s``: the mean queueing delay of the last quarter of the arrivals.

A run is ``overloaded`` when the slope exceeds :data:`GROWTH_S_PER_S` **and** the tail
mean exceeds :data:`TAIL_QUEUE_S` (both *assumed* thresholds, not measured: 0.05 s/s is
a load about 5 % above capacity; a queue of a second in the tail excludes a burst that
drained within a second). A run with fewer than :data:`MIN_REQUESTS` requests is not
judged (None).
"""
from __future__ import annotations

import math

import numpy as np

#: slope of queueing delay on arrival time above which the queue is growing (assumed)
GROWTH_S_PER_S = 0.05
#: mean queueing delay of the last quarter of arrivals above which it has not drained (assumed)
TAIL_QUEUE_S = 1.0
#: fewest requests on which the test is made
MIN_REQUESTS = 8


def overload_metrics(arrival_s, queue_s) -> dict:
    """Whether a concurrent replay was overloaded (module docstring).

    Parameters
    ----------
    arrival_s : array-like of float64, shape (n,)
        Arrival times of the requests, seconds.
    queue_s : array-like of float64, shape (n,)
        Their queueing delays, seconds (NaN for a request never admitted: counted as
        waiting until the last admission seen, a lower bound).

    Returns
    -------
    dict
        ``overloaded`` (bool, or None below :data:`MIN_REQUESTS` requests),
        ``queue_growth_s_per_s`` (float or None), ``queue_tail_mean_s`` (float or None).
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    q = np.asarray(queue_s, dtype=np.float64)
    if a.size < MIN_REQUESTS:
        return {"overloaded": None, "queue_growth_s_per_s": None, "queue_tail_mean_s": None}
    if np.isnan(q).any():
        admitted = ~np.isnan(q)
        last = float(np.max(a[admitted] + q[admitted])) if admitted.any() else float(a.max())
        q = np.where(admitted, q, np.maximum(last - a, 0.0))
    order = np.argsort(a, kind="stable")
    a, q = a[order], q[order]
    da = a - a.mean()
    # exactly rounded sums (math.fsum), not np.dot: OpenBLAS splits a long dot product over its
    # threads, so np.dot's last bits depend on OPENBLAS_NUM_THREADS (a Dask worker runs with 1, this
    # process with the cores), and the same replay gave another slope on another executor
    var = math.fsum((da * da).tolist())
    slope = math.fsum((da * (q - q.mean())).tolist()) / var if var > 0 else 0.0
    tail = float(q[(3 * a.size) // 4:].mean())
    return {"overloaded": bool(slope > GROWTH_S_PER_S and tail > TAIL_QUEUE_S),
            "queue_growth_s_per_s": slope, "queue_tail_mean_s": tail}


def overload_of(result) -> dict:
    """:func:`overload_metrics` of a :class:`~radixkv.replay.concurrent.ConcurrentResult`
    (its ``arrival_s`` and ``queue_s`` columns)."""
    c = result.columns
    return overload_metrics(c["arrival_s"], c["queue_s"])
