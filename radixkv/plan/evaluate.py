"""Replay the points of a plan as sweep cells, and judge each against the SLO.

Every point is one concurrent replay run by :func:`radixkv.sweep.run_sweep` (the
executors ``local`` / ``processes`` / ``dask``, and its results store: a plan given a
``work_dir`` resumes where a stopped one left off, finished replays being read back
instead of run). A point's cell settings are those of ``radixkv replay``
(:func:`radixkv.plan.candidates.replay_settings`), so the cell is the replay the printed
``radixkv replay`` command runs.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from radixkv.plan.spec import SLO_TERMS


@dataclass
class Outcome:
    """One point's replay, or why it was not replayed.

    Attributes
    ----------
    point : radixkv.plan.candidates.Point
    cost : float
        Per hour of traffic: GPU-hours, or $ with prices.
    settings : dict or None
        The sweep cell's settings (None when pruned before replaying).
    metrics : dict or None
        The replay's summary (:meth:`~radixkv.replay.concurrent.ConcurrentResult.summary`
        plus the overload metrics of :mod:`radixkv.replay.overload`).
    pruned : str or None
        Why it was not replayed, or why the replay failed.
    key : str or None
        The sweep cell key.
    """

    point: object
    cost: float
    settings: dict | None = None
    metrics: dict | None = None
    pruned: str | None = None
    key: str | None = None
    slo: dict = field(default_factory=dict)

    @property
    def replayed(self) -> bool:
        return self.metrics is not None

    @property
    def overloaded(self) -> bool:
        return bool(self.metrics and self.metrics.get("overloaded"))

    def value(self, term: str) -> float:
        """The replay's value of SLO *term*, seconds (NaN when not replayed or undefined)."""
        if not self.metrics:
            return float("nan")
        v = self.metrics.get(SLO_TERMS[term])
        return float("nan") if v is None else float(v)

    def misses(self) -> dict:
        """SLO terms this point misses: term → value / bound (inf for an undefined value).
        An overloaded replay misses every term (its latencies measure the trace's length)."""
        out = {}
        for t, bound in self.slo.items():
            v = self.value(t)
            if self.overloaded or not math.isfinite(v):
                out[t] = math.inf if not math.isfinite(v) else max(v / bound, 1.0 + 1e-9)
            elif v > bound:
                out[t] = v / bound
        return out

    @property
    def meets(self) -> bool:
        """Replayed, not overloaded, every SLO term within its bound."""
        return self.replayed and not self.misses()

    def worst_ratio(self) -> float:
        """Largest value / bound over the SLO terms (how far the point is from the SLO)."""
        if not self.replayed:
            return math.inf
        r = [self.value(t) / b for t, b in self.slo.items()]
        r = [x if math.isfinite(x) else math.inf for x in r]
        return max(r) * (2.0 if self.overloaded else 1.0) if r else 0.0


class Evaluator:
    """Runs points as sweep cells in batches and remembers every outcome.

    Parameters
    ----------
    spec : radixkv.plan.spec.PlanSpec
    workload : radixkv.plan.prune.Workload
    cost_kw : dict
        The cost model's replay flags (``mfu``, ``mbu``, ``step_overhead_s``).
    work_dir : str or Path
        The sweep results store (created if missing).
    """

    def __init__(self, spec, workload, cost_kw: dict, work_dir):
        from radixkv.sweep.grid import TraceEntry, file_sha256

        self.spec, self.workload, self.cost_kw = spec, workload, cost_kw
        self.work_dir = Path(work_dir)
        p = Path(spec.trace)
        self.trace_entry = TraceEntry(str(spec.trace), p, file_sha256(p))
        self.outcomes: dict = {}
        #: points replayed by this plan (run now, or read back from the work dir; failed replays count)
        self.replayed = 0
        #: of those, read back from an earlier run's store
        self.resumed = 0

    def cost(self, point) -> float:
        """GPUs × price per GPU-hour (1 without prices): cost per hour of traffic."""
        return point.gpus * self.spec.price(point.gpu)

    def prune(self, point, reason: str):
        """Record *point* as pruned for *reason* (no replay)."""
        o = self.outcomes.get(point)
        if o is None:
            o = self.outcomes[point] = Outcome(point, self.cost(point), pruned=reason, slo=self.spec.slo)
        return o

    def evaluate(self, points) -> list:
        """The outcomes of *points* (in order), replaying those not seen before in one sweep.

        A point whose pool does not exist or cannot hold the longest request is pruned
        (:func:`radixkv.plan.prune.memory_reason`); a replay that fails records its error
        as the reason.
        """
        from radixkv.plan.candidates import replay_settings
        from radixkv.plan.prune import memory_reason
        from radixkv.sweep.grid import Cell, Grid, cell_key, replay_defaults
        from radixkv.sweep.run import run_sweep

        defaults = replay_defaults()
        todo, cells = [], []
        for p in dict.fromkeys(points):
            if p in self.outcomes:
                continue
            pool, reason = memory_reason(p, self.spec.model, self.workload)
            if reason:
                self.prune(p, reason)
                continue
            s = replay_settings(p, self.spec.model, pool, self.spec.rate_scale, self.cost_kw)
            s = {k: v for k, v in s.items() if k == "policy" or v != defaults.get(k)}
            key = cell_key(self.trace_entry.sha256, s)
            todo.append((p, s, key))
            cells.append(Cell(key, self.trace_entry, s))
        if cells:
            grid = Grid(Path(self.spec.trace), [self.trace_entry], list({c.key: c for c in cells}.values()), {})
            rep = run_sweep(grid, self.work_dir, executor=self.spec.executor, workers=self.spec.workers,
                            scheduler=self.spec.scheduler, progress=False)
            failed = {c.key: err for c, err in rep.failed}
            self.resumed += rep.skipped
            for p, s, key in todo:
                o = Outcome(p, self.cost(p), settings=s, key=key, slo=self.spec.slo)
                f = self.work_dir / "cells" / f"{key}.jsonl"
                if key in failed or not f.exists():
                    err = failed.get(key, {})
                    o.pruned = f"replay failed: {err.get('reason') or err.get('message') or 'no result'}"
                else:
                    o.metrics = json.loads(f.read_text(encoding="utf-8"))["metrics"]
                self.replayed += 1
                self.outcomes[p] = o
        return [self.outcomes[p] for p in points]
