"""Arrival times: a renewal process of session starts, then each session's turns.

Model
-----
Sessions (a conversation, an agent run, or a single request) start at the events of a
renewal process whose inter-start gaps are

- ``poisson``: exponential with mean ``1 / session_rate`` (a Poisson process), or
- ``gamma``: Gamma with shape ``k = 1 / cv²`` and scale ``1 / (session_rate · k)``, so the
  mean gap is the same and the coefficient of variation (std / mean) is ``cv``; cv > 1 is
  bursty (clusters of arrivals separated by long idle gaps), cv = 1 is Poisson.

``session_rate = rate / E[turns]``, so the long-run *request* rate is ``rate`` requests/s.
The trace starts at t = 0 and the first session one gap later, as in a
renewal process observed from its start (so superposed Poisson components — the ``mix``
scenario — form one Poisson process). Turn j + 1 of a session arrives a think time after
turn j (arrival to arrival; the generator does not model service time, so a concurrent
replay that wants turn j + 1 to wait for turn j's answer must enforce it). Sessions keep
their turn order.

A trace of n requests is the n earliest requests of this process, ties broken by session
then turn. Sessions are drawn in chunks of :data:`CHUNK` from their own streams until
every request earlier than the last drawn session start is known; so the first k requests
of an n-request schedule are the k-request schedule (prefix-consistent).

Near t = 0 sessions have not reached their later turns, so for multi-turn scenarios the
measured request rate of a short trace is a little below ``rate`` (by about ``rate ×``
the mean delay of a request after its session's start, divided by the trace length).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from radixkv.errors import InputError
from radixkv.synth.distributions import IntDist, TimeDist
from radixkv.synth.rng import stream

#: arrival processes ``--arrival`` accepts
ARRIVALS = ("poisson", "gamma")
#: sessions drawn per step (fixed, so that schedules are prefix-consistent)
CHUNK = 1024


def check_arrival(rate: float, arrival: str, cv: float) -> None:
    """Raise :class:`InputError` for a non-positive rate, unknown process or bad cv."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise InputError(f"rate must be a positive number of requests/s, got {rate!r}", field="rate")
    if arrival not in ARRIVALS:
        raise InputError(f"unknown arrival process {arrival!r}; expected one of {list(ARRIVALS)}", field="arrival")
    if arrival == "gamma" and not (isinstance(cv, (int, float)) and math.isfinite(cv) and cv > 0):
        raise InputError(f"cv must be > 0 for gamma arrivals, got {cv!r}", field="cv")


def interarrival_gaps(rng: np.random.Generator, size: int, rate: float, arrival: str = "poisson", cv: float = 1.0) -> np.ndarray:
    """Gaps between consecutive events of a renewal process, seconds; float64, shape (size,).

    Parameters
    ----------
    rng : numpy Generator
    size : int
    rate : float
        Events per second (the mean gap is ``1 / rate``).
    arrival : {"poisson", "gamma"}
    cv : float
        Coefficient of variation of the gaps (gamma only; shape ``1 / cv²``).
    """
    check_arrival(rate, arrival, cv)
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size)
    k = 1.0 / (cv * cv)
    return rng.gamma(k, 1.0 / (rate * k), size)


@dataclass(frozen=True)
class Schedule:
    """When each request of a synthetic trace arrives, in replay order.

    Attributes
    ----------
    session : np.ndarray, int64, shape (n,)
        Session number (0, 1, … in order of session start).
    turn : np.ndarray, int64, shape (n,)
        Turn within the session, 0-based.
    arrival_s : np.ndarray, float64, shape (n,)
        Arrival time, seconds, non-decreasing.
    """

    session: np.ndarray
    turn: np.ndarray
    arrival_s: np.ndarray

    def turns_per_session(self) -> np.ndarray:
        """Number of requests kept for each session ``0 .. max(session)``; int64."""
        if self.session.size == 0:
            return np.zeros(0, dtype=np.int64)
        return np.bincount(self.session, minlength=int(self.session.max()) + 1).astype(np.int64)


def session_schedule(
    n: int,
    *,
    rate: float,
    arrival: str,
    cv: float,
    seed: int,
    key: tuple,
    turns: IntDist,
    think: TimeDist | None,
) -> Schedule:
    """The first *n* requests of the session arrival model (see module docstring).

    Parameters
    ----------
    n : int ≥ 1
        Requests wanted.
    rate : float
        Long-run request rate, requests/s.
    arrival, cv
        Inter-start process of sessions (:func:`interarrival_gaps`).
    seed : int, key : tuple of int
        Streams ``(seed, *key, 0|1|2)`` give session starts, turn counts and think times.
    turns : IntDist
        Turns per session (``lo ≥ 1``).
    think : TimeDist or None
        Gap between the arrivals of consecutive turns; None only when ``turns.hi == 1``.

    Raises
    ------
    radixkv.errors.InputError
        n < 1, bad rate / arrival / cv, or turns that can be 0.
    """
    if n < 1:
        raise InputError(f"need at least 1 request, got {n}", field="requests")
    check_arrival(rate, arrival, cv)
    if turns.lo < 1:
        raise InputError(f"a session needs at least 1 turn, got {turns}", field="turns")
    if think is None and turns.hi > 1:
        raise InputError("multi-turn sessions need a think-time distribution", field="think_time")
    session_rate = rate / turns.mean()
    r_start, r_turns, r_think = (stream(seed, *key, j) for j in range(3))
    max_t = turns.hi
    sess_parts, turn_parts, arr_parts = [], [], []
    t_last = 0.0
    n_sessions = 0
    n_known = 0
    while True:
        gaps = interarrival_gaps(r_start, CHUNK, session_rate, arrival, cv)
        starts = t_last + np.cumsum(gaps)
        nt = turns.sample(r_turns, CHUNK)
        if max_t > 1:
            th = think.sample(r_think, (CHUNK, max_t - 1))
            offs = np.concatenate([np.zeros((CHUNK, 1)), np.cumsum(th, axis=1)], axis=1)
        else:
            offs = np.zeros((CHUNK, 1))
        mask = np.arange(max_t)[None, :] < nt[:, None]
        rows, cols = np.nonzero(mask)
        sess_parts.append(rows.astype(np.int64) + n_sessions)
        turn_parts.append(cols.astype(np.int64))
        arr_parts.append(starts[rows] + offs[rows, cols])
        n_sessions += CHUNK
        t_last = float(starts[-1])
        # requests arriving no later than the last start are final: later sessions start later
        n_known = sum(int(np.count_nonzero(a <= t_last)) for a in arr_parts)
        if n_known >= n:
            break
    session = np.concatenate(sess_parts)
    turn = np.concatenate(turn_parts)
    arr = np.concatenate(arr_parts)
    order = np.lexsort((turn, session, arr))[:n]
    return Schedule(session=session[order], turn=turn[order], arrival_s=arr[order])
