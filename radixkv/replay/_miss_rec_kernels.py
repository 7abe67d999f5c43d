"""The miss-cause recorder's intake inside the compiled concurrent loops.

:class:`radixkv.replay.conc_misses.MissRecorder` is told each engine step of the Python
loop (``MissRecorder.step``) and turns it into the event stream the concurrent miss
causes replay (query at a first admission, insertion of a request's KV extent). The
compiled loops (:mod:`radixkv.replay._conc_vllm_kernels`,
:mod:`radixkv.replay._conc_sglang_kernels`) have no per-step hook, so, when asked to
record, they call :func:`rec_step` once per loop iteration with the same facts —
preempted rows, first admissions in admission order, the plan's items, the steps it
stands for, the finished rows, the step's start and end times — and :func:`rec_step` does
what ``MissRecorder.step`` does, on arrays: the same events in the same order
(``tests/test_misses_fast.py`` compares the two byte for byte).

Preemption bookkeeping is not done here: :func:`rec_step` only logs two kinds of *facts*
(int64 rows ``code, request, a, b``), which ``MissRecorder.take_compiled`` replays through
the recorder's own Python arithmetic afterwards (preemptions are rare):

- :data:`FACT_PREEMPT` ``(v, comp, start)``: request v was preempted (vLLM) or retracted
  (SGLang) holding ``comp`` KV tokens computed by its current admission, whose first
  prefill chunk started at context ``start`` (−1: it had none);
- :data:`FACT_CHUNK` ``(r, c, 0)``: the first prefill chunk of a re-admission after a
  preemption, from context ``c`` (the re-admission's hit).

Arrays (the caller owns them; a loop iteration is skipped and the loop hands back when
the logs could overflow, :func:`rec_room`):

``RS``  int64 (NRS,): scalars ``RS_*``.
``RR``  int64 (NRR, n): per request ``R_*``.
``DL``  int64 (n,): the dirty requests (vLLM rules: decode growth not yet in the stream).
``EVT`` float64 (cap,), ``EVI`` int64 (3, cap): events (time; kind, request, extent).
``FI``  int64 (fcap, 4): facts.
``PB``, ``AB`` int64 (n,): this iteration's preempted rows and first admissions.
"""
from __future__ import annotations

import numba as nb
import numpy as np

# scalars (RS)
RS_ON, RS_DEFERRED, RS_NEV, RS_NFACT, RS_NDIRTY, RS_NPRE, RS_NADM = range(7)
NRS = 7
# per request (RR rows)
R_COMP, R_SENT, R_DIRTY, R_KVLEN, R_PEND, R_START, R_ADM = range(7)
NRR = 7

#: event kinds (those of conc_misses: _QUERY, _INSERT)
EV_QUERY = 0
EV_INSERT = 1
#: fact codes
FACT_PREEMPT = 0
FACT_CHUNK = 1


def new_state(kv_len, deferred: bool, on: bool = True, preempt_rows: int = 0, events: int = 1 << 12,
              facts: int = 256):
    """Fresh recorder arrays ``(RS, RR, DL, EVT, EVI, FI, PB, AB)`` for requests of KV
    extents *kv_len* (int64 (n,), tokens), ``PB`` holding *preempt_rows* more than n
    preemptions per iteration; with ``on`` False, one-element arrays the loops ignore."""
    n = len(kv_len) if on else 1
    RS = np.zeros(NRS, dtype=np.int64)
    RS[RS_ON] = 1 if on else 0
    RS[RS_DEFERRED] = 1 if deferred else 0
    RR = np.zeros((NRR, n), dtype=np.int64)
    if on:
        RR[R_KVLEN] = kv_len
    RR[R_PEND] = 0
    RR[R_START] = -1
    cap = events if on else 1
    return (RS, RR, np.zeros(n, dtype=np.int64), np.zeros(cap, dtype=np.float64),
            np.zeros((3, cap), dtype=np.int64), np.zeros((facts if on else 1, 4), dtype=np.int64),
            np.zeros(n + (int(preempt_rows) if on else 0), dtype=np.int64), np.zeros(n, dtype=np.int64))


def grow(rec):
    """*rec* with its event and fact logs doubled (what was logged kept)."""
    RS, RR, DL, EVT, EVI, FI, PB, AB = rec
    cap = 2 * EVT.shape[0]
    EVT2 = np.zeros(cap, dtype=np.float64)
    EVI2 = np.zeros((3, cap), dtype=np.int64)
    EVT2[:EVT.shape[0]] = EVT
    EVI2[:, :EVT.shape[0]] = EVI
    FI2 = np.zeros((2 * FI.shape[0], 4), dtype=np.int64)
    FI2[:FI.shape[0]] = FI
    return RS, RR, DL, EVT2, EVI2, FI2, PB, AB


@nb.njit(cache=True)
def rec_room(rec, most):
    """Whether the logs hold one more loop iteration in which at most *most* requests run
    or are admitted (an iteration logs at most 4 events per such request: a query,
    inserts at its preemption, at a flush and at its finish, plus one per item; at most
    two facts each)."""
    RS, RR, DL, EVT, EVI, FI, PB, AB = rec
    need = 6 * most + 16
    return EVT.shape[0] - RS[RS_NEV] >= need and FI.shape[0] - RS[RS_NFACT] >= 2 * most + 8


@nb.njit(cache=True)
def _emit(RS, EVT, EVI, t, kind, r, e):
    j = RS[RS_NEV]
    EVT[j] = t
    EVI[0, j] = kind
    EVI[1, j] = r
    EVI[2, j] = e
    RS[RS_NEV] = j + 1


@nb.njit(cache=True)
def _insert(RS, RR, EVT, EVI, t, r, e):
    if e > RR[R_SENT, r]:
        RR[R_SENT, r] = e
        _emit(RS, EVT, EVI, t, EV_INSERT, r, e)


@nb.njit(cache=True)
def _fact(RS, FI, code, r, a, b):
    j = RS[RS_NFACT]
    FI[j, 0] = code
    FI[j, 1] = r
    FI[j, 2] = a
    FI[j, 3] = b
    RS[RS_NFACT] = j + 1


@nb.njit(cache=True)
def _undirty(RS, RR, DL, r):
    """``dirty.discard(r)``."""
    if RR[R_DIRTY, r] == 0:
        return
    RR[R_DIRTY, r] = 0
    nd = RS[RS_NDIRTY]
    for j in range(nd):
        if DL[j] == r:
            DL[j] = DL[nd - 1]
            break
    RS[RS_NDIRTY] = nd - 1


@nb.njit(cache=True)
def _flush(RS, RR, DL, EVT, EVI, t):
    """``MissRecorder._flush``: the dirty requests' extents, in request order."""
    nd = RS[RS_NDIRTY]
    if nd == 0:
        return
    d = np.sort(DL[:nd])
    for j in range(nd):
        r = d[j]
        RR[R_DIRTY, r] = 0
        _insert(RS, RR, EVT, EVI, t, r, RR[R_COMP, r])
    RS[RS_NDIRTY] = 0


@nb.njit(cache=True)
def rec_step(rec, t0, t1, ireq, inew, ictx, ipre, m, k, fin, nfin):
    """``MissRecorder.step`` of one loop iteration: ``PB[:RS[RS_NPRE]]`` preempted rows and
    ``AB[:RS[RS_NADM]]`` first admissions (both reset here), plan items ``i*[:m]``
    (request, new tokens, context, prefill flag ≠ 0), *k* steps (0 for an empty plan),
    finished rows ``fin[:nfin]``, start and end times *t0*, *t1* (s)."""
    RS, RR, DL, EVT, EVI, FI, PB, AB = rec
    deferred = RS[RS_DEFERRED] != 0
    npre = RS[RS_NPRE]
    nadm = RS[RS_NADM]
    RS[RS_NPRE] = 0
    RS[RS_NADM] = 0
    for j in range(npre):
        v = PB[j]
        if not deferred and RR[R_DIRTY, v] != 0:  # vLLM: its hashed blocks stay cached
            _undirty(RS, RR, DL, v)
            _insert(RS, RR, EVT, EVI, t0, v, RR[R_COMP, v])
        _fact(RS, FI, FACT_PREEMPT, v, RR[R_COMP, v], RR[R_START, v])
        RR[R_PEND, v] = 1
        RR[R_START, v] = -1
        RR[R_COMP, v] = 0
    if deferred:
        for j in range(nadm):
            _emit(RS, EVT, EVI, t0, EV_QUERY, AB[j], 0)
        for q in range(m):
            r = ireq[q]
            n = inew[q]
            c = ictx[q]
            if ipre[q] != 0:
                if RR[R_PEND, r] != 0:
                    RR[R_PEND, r] = 0
                    _fact(RS, FI, FACT_CHUNK, r, c, 0)
                if RR[R_START, r] < 0:
                    RR[R_START, r] = c
                RR[R_COMP, r] = c + n
                _insert(RS, RR, EVT, EVI, t1, r, c + n)
            else:
                RR[R_COMP, r] = c + n * k
        for j in range(nfin):
            r = fin[j]
            _insert(RS, RR, EVT, EVI, t1, r, RR[R_KVLEN, r])
        return
    for j in range(nadm):
        RR[R_ADM, AB[j]] = 1
    for q in range(m):
        r = ireq[q]
        n = inew[q]
        c = ictx[q]
        pre = ipre[q] != 0
        if RR[R_ADM, r] != 0:
            RR[R_ADM, r] = 0
            _flush(RS, RR, DL, EVT, EVI, t0)
            _emit(RS, EVT, EVI, t0, EV_QUERY, r, 0)
        elif pre and RR[R_PEND, r] != 0:
            RR[R_PEND, r] = 0
            _fact(RS, FI, FACT_CHUNK, r, c, 0)
        if pre and RR[R_START, r] < 0:
            RR[R_START, r] = c
        RR[R_COMP, r] = c + (n if pre else n * k)
        if RR[R_DIRTY, r] == 0:
            RR[R_DIRTY, r] = 1
            DL[RS[RS_NDIRTY]] = r
            RS[RS_NDIRTY] += 1
    for j in range(nadm):  # admitted, then preempted in the same step (no item left)
        r = AB[j]
        if RR[R_ADM, r] != 0:
            RR[R_ADM, r] = 0
            _flush(RS, RR, DL, EVT, EVI, t0)
            _emit(RS, EVT, EVI, t0, EV_QUERY, r, 0)
    for j in range(nfin):
        r = fin[j]
        _undirty(RS, RR, DL, r)
        _insert(RS, RR, EVT, EVI, t1, r, RR[R_COMP, r])


@nb.njit(cache=True)
def rec_preempted(rec, v):
    """Log request *v* as preempted in this iteration (in preemption order)."""
    RS = rec[0]
    PB = rec[6]
    PB[RS[RS_NPRE]] = v
    RS[RS_NPRE] += 1


@nb.njit(cache=True)
def rec_admitted(rec, i):
    """Log request *i*'s first admission in this iteration (in admission order)."""
    RS = rec[0]
    AB = rec[7]
    AB[RS[RS_NADM]] = i
    RS[RS_NADM] += 1
