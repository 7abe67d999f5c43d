"""What a driver reads from a compiled concurrent engine, written once for both engines.

:class:`~radixkv.replay.conc_sglang.CompiledSglangEngine` and
:class:`~radixkv.replay.conc_vllm_fast.CompiledVllmEngine` keep their loop state in numpy
arrays the compiled loop writes: an int64 state vector, a float64 state vector and (a
replica's) step intervals. The two loops number their slots differently; each engine names
its slots once in a :class:`StateSlots` and hands its arrays over in ``_state()``, and
:class:`EngineReadout` reads them (the multi-replica driver,
:mod:`radixkv.replay.multi_concurrent`, calls these on every engine alike).
"""
from __future__ import annotations

from typing import NamedTuple


class StateSlots(NamedTuple):
    """Slots of an engine's state vectors (indices into its int64 ``ints`` and float64
    ``floats`` arrays, as its compiled loop defines them)."""
    now: int       #: floats: the clock, seconds (the start of the next step; −inf before any request)
    peak: int      #: ints: the most requests running in one step
    steps: int     #: ints: engine steps run
    ivn: int       #: ints: step intervals recorded (a replica's)
    nsrc: int      #: ints: request rows given to the engine
    done: int      #: ints: requests finished
    finnow: int    #: ints: requests finishing in the step that runs up to the clock
    refused: int   #: ints: the request row the engine stopped on (it cannot be admitted)
    nxt: int       #: ints: the next given row to join the waiting queue
    nrun: int      #: ints: requests running
    wlen: int      #: ints: requests waiting


def _int_slot(slot: str, doc: str) -> property:
    """A read-only property: the int64 state's slot *slot* (a :class:`StateSlots` field)."""
    return property(lambda self: int(self._state()[0][getattr(self._slots, slot)]), doc=doc)


class EngineReadout:
    """The readouts of a compiled concurrent engine. A subclass sets ``self._slots`` (a
    :class:`StateSlots`) and ``self.src`` (int64, the rows given, in order) and defines
    ``_state()`` → ``(ints, floats, iv_t, iv_n)``: its int64 and float64 state vectors, the
    (2, n) float64 start/end seconds of its recorded step intervals and their (n,) int64
    running-request counts (read afresh each call: the engine enlarges them)."""

    def _state(self):
        raise NotImplementedError

    def give(self, i: int) -> None:
        """Request row *i* is routed here (it joins the waiting queue at the first step
        boundary at or after its arrival)."""
        ints, s = self._state()[0], self._slots
        k = int(ints[s.nsrc])
        self.src[k] = i
        ints[s.nsrc] = k + 1

    def in_flight_at(self, t: float) -> int:
        """Requests given and not finished by time *t* (≥ the start of the last step run):
        those finishing in a step that ends after *t* still count
        (``ReplicaEngine.load_at``)."""
        ints, floats = self._state()[:2]
        s = self._slots
        left = int(ints[s.nsrc]) - int(ints[s.done])
        return left + int(ints[s.finnow]) if float(floats[s.now]) > t else left

    def _nothing_to_run(self, limit: float) -> bool:
        """No step starts before *limit*: the clock is at or past it, or nothing given is
        waiting, running or yet to join."""
        ints, floats = self._state()[:2]
        s = self._slots
        return float(floats[s.now]) >= limit or (ints[s.nxt] == ints[s.nsrc] and ints[s.nrun] == 0
                                                 and ints[s.wlen] == 0)

    refused_row = _int_slot("refused", "The request :meth:`advance_to` stopped on.")
    peak = _int_slot("peak", "The most requests running in one step.")
    steps = _int_slot("steps", "Engine steps run.")

    @property
    def now(self) -> float:
        """The clock: the start of the next step, seconds (−inf before any request)."""
        return float(self._state()[1][self._slots.now])

    @property
    def intervals(self) -> list:
        """(start, end, running requests) of every step or fast-forwarded run (replica only)."""
        ints, _, iv_t, iv_n = self._state()
        m = int(ints[self._slots.ivn])
        return list(zip(iv_t[0, :m].tolist(), iv_t[1, :m].tolist(), iv_n[:m].tolist()))
