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
    """Runs points as sweep cells and remembers every outcome.

    Parameters
    ----------
    spec : radixkv.plan.spec.PlanSpec
    workload : radixkv.plan.prune.Workload
    cost_kw : dict
        The cost model's replay flags (``mfu``, ``mbu``, ``step_overhead_s``).
    work_dir : str or Path
        The sweep results store (created if missing).
    trace : radixkv.trace.Trace or None
        The trace, already loaded (else each batch reads it from ``spec.trace``).

    Executors
        ``local`` runs each batch through :func:`radixkv.sweep.run_sweep` in this process.
        ``processes`` and ``dask`` keep ONE pool of workers for the whole plan
        (:class:`_Workers`: worker processes forked once after the kernels are warm, or one
        Dask cluster that receives the trace once), and run the cells there, writing each
        to the store as :func:`~radixkv.sweep.run_sweep` does. With a pool, the search may
        :meth:`prefetch` points it is likely to ask for next: they run on workers the
        search leaves idle (never more than ``workers − 1`` at once, so a point the search
        asks for always finds a worker) and are not counted, nor recorded, until the
        search asks for them; what is never asked for is cancelled at :meth:`close`. A
        replay is deterministic, so the outcomes, their order and the counts are those
        of the sequential search, byte for byte, on every executor.
    """

    def __init__(self, spec, workload, cost_kw: dict, work_dir, trace=None):
        from radixkv.sweep.grid import TraceEntry, file_sha256

        self.spec, self.workload, self.cost_kw = spec, workload, cost_kw
        self.work_dir = Path(work_dir)
        p = Path(spec.trace)
        self.trace_entry = TraceEntry(str(spec.trace), p, file_sha256(p))
        self.trace = trace
        self.outcomes: dict = {}
        #: points replayed by this plan (run now, or read back from the work dir; failed replays count)
        self.replayed = 0
        #: of those, read back from an earlier run's store
        self.resumed = 0
        #: cells started ahead of the search (:meth:`prefetch`) and how many the search then asked for
        self.prefetched = 0
        self.prefetch_used = 0
        self._workers = None
        self._closed = False

    def cost(self, point) -> float:
        """GPUs × price per GPU-hour (1 without prices): cost per hour of traffic."""
        return point.gpus * self.spec.price(point.gpu)

    def prune(self, point, reason: str):
        """Record *point* as pruned for *reason* (no replay)."""
        o = self.outcomes.get(point)
        if o is None:
            o = self.outcomes[point] = Outcome(point, self.cost(point), pruned=reason, slo=self.spec.slo)
        return o

    def _cell(self, point, pool):
        """``(settings, key)`` of *point*'s sweep cell on *pool*."""
        from radixkv.plan.candidates import replay_settings
        from radixkv.sweep.grid import cell_key, drops_setting

        s = replay_settings(point, self.spec.model, pool, self.spec.rate_scale, self.cost_kw)
        s = {k: v for k, v in s.items() if k == "policy" or not drops_setting(s, k)}
        return s, cell_key(self.trace_entry.sha256, s)

    @property
    def pooled(self) -> bool:
        """Whether the cells run on a pool of workers kept for the whole plan."""
        return self.spec.executor in ("processes", "dask")

    def evaluate(self, points) -> list:
        """The outcomes of *points* (in order), replaying those not seen before in one batch.

        A point whose pool does not exist or cannot hold the longest request is pruned
        (:func:`radixkv.plan.prune.memory_reason`); a replay that fails records its error
        as the reason.
        """
        from radixkv.plan.prune import memory_reason

        todo, cells = [], {}
        for p in dict.fromkeys(points):
            if p in self.outcomes:
                continue
            pool, reason = memory_reason(p, self.spec.model, self.workload)
            if reason:
                self.prune(p, reason)
                continue
            s, key = self._cell(p, pool)
            todo.append((p, s, key))
            cells.setdefault(key, s)
        if cells:
            failed = self._run_pooled(cells) if self.pooled else self._run_sweep(cells)
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

    def _run_sweep(self, cells: dict) -> dict:
        """Run *cells* (key → settings) as one :func:`~radixkv.sweep.run_sweep`; the failed ones' errors by key."""
        from radixkv.sweep.grid import Cell, Grid
        from radixkv.sweep.run import run_sweep

        grid = Grid(Path(self.spec.trace), [self.trace_entry], [Cell(k, self.trace_entry, s) for k, s in cells.items()],
                    {})
        rep = run_sweep(grid, self.work_dir, executor=self.spec.executor, workers=self.spec.workers,
                        scheduler=self.spec.scheduler, progress=False)
        self.resumed += rep.skipped
        return {c.key: err for c, err in rep.failed}

    def _pool(self) -> "_Workers":
        if self._workers is None:
            self._workers = _Workers(self)
        return self._workers

    def _run_pooled(self, cells: dict) -> dict:
        w = self._pool()
        return w.run(cells)

    def prefetch(self, points) -> None:
        """Start replaying *points* (in order) on idle workers ahead of the search; a no-op
        without a pool of workers, for points already seen or pruned by memory, and past
        the budget."""
        if not self.pooled or self._closed:
            return
        from radixkv.plan.prune import memory_reason

        left = self.spec.budget - self.replayed
        queue = []
        for p in dict.fromkeys(points):
            if len(queue) >= left:
                break
            if p in self.outcomes:
                continue
            pool, reason = memory_reason(p, self.spec.model, self.workload)
            if reason:
                continue
            s, key = self._cell(p, pool)
            queue.append((key, s))
        w = self._pool()
        w.queue = queue
        w.fill()

    def close(self) -> None:
        """Stop the pool of workers (cells started ahead and never asked for are cancelled)."""
        self._closed = True
        if self._workers is not None:
            self._workers.close()
            self._workers = None


class _Workers:
    """The plan's pool of workers (``processes``: a ``ProcessPoolExecutor`` forked once;
    ``dask``: one ``LocalCluster``, or the cluster at ``--scheduler``, the trace scattered
    to every worker once). Each cell is a :class:`radixkv.sweep.cell.CellTask` run by
    :func:`radixkv.sweep.cell.run_cell`; each result is stored in the work dir
    (:func:`radixkv.sweep.store.write_row` / ``write_error``) when collected."""

    def __init__(self, ev: Evaluator):
        from radixkv.sweep import store
        from radixkv.sweep.cell import TraceRef, remember_trace, write_trace_cache
        from radixkv.sweep.executors import default_workers, require_dask
        from radixkv.trace.load import load_trace

        self.ev = ev
        spec = ev.spec
        self.n = spec.workers or default_workers()
        if self.n < 1:
            from radixkv.errors import ConfigError

            raise ConfigError(f"--workers must be ≥ 1, got {self.n}", field="workers")
        out = ev.work_dir
        out.mkdir(parents=True, exist_ok=True)
        (out / store.CELLS).mkdir(exist_ok=True)
        sha = ev.trace_entry.sha256
        tr = ev.trace if ev.trace is not None else load_trace(spec.trace)
        cache = out / store.TRACES / sha[:32]
        write_trace_cache(tr, cache)
        remember_trace(sha, tr)
        self.trace = tr
        self.meta = {"name": tr.name, "unit_tokens": int(tr.unit_tokens)}
        self.ref = TraceRef(sha, str(cache.resolve()), str(spec.trace), None)
        #: key -> future of a cell in flight; key -> True when started ahead of the search
        self.futs: dict = {}
        self.ahead: dict = {}
        #: key -> error of a failed cell collected; keys stored by this plan
        self.failed: dict = {}
        self.produced: set = set()
        #: key -> settings of every cell submitted
        self.settings: dict = {}
        #: (key, settings) to start ahead of the search when a worker is idle, first first
        self.queue: list = []
        self.client = self.cluster = self.pool = self.shipped = None
        if spec.executor == "dask":
            require_dask()
            if not spec.scheduler:
                self._warm()  # the local cluster's workers load the kernels from Numba's disk cache
            from radixkv.sweep.executors import _dask_client

            self.client, self.cluster = _dask_client(self.n, spec.scheduler)
            self.shipped = self.client.scatter(tr, broadcast=True, hash=False)
        else:
            self._warm()
            self.pool = self._new_pool()

    def _new_pool(self):
        """A ``ProcessPoolExecutor`` of :attr:`n` workers (forked on Linux: they start with
        this process's trace and warm kernels; they die with it, :func:`radixkv.sweep.executors._worker_init`)."""
        import multiprocessing as mp
        import os
        import sys
        from concurrent.futures import ProcessPoolExecutor

        from radixkv.sweep.executors import _worker_init

        ctx = mp.get_context("fork") if sys.platform.startswith("linux") else mp.get_context("spawn")
        return ProcessPoolExecutor(max_workers=self.n, mp_context=ctx, initializer=_worker_init,
                                   initargs=(os.getpid(),))

    def _warm(self) -> None:
        """Compile or load, in this process, the kernels of every policy the search can ask
        for (each engine searched at each block/page size the knobs try): forked workers
        start warm, and a local Dask cluster's workers find them in Numba's disk cache."""
        from radixkv.plan.candidates import NEIGHBOURS
        from radixkv.policies.registry import parse_policy
        from radixkv.replay.run import warmup_many

        labels = {f"{e}:{u}" for e in self.ev.spec.engines
                  for u in NEIGHBOURS["block_size" if e == "vllm" else "page_size"]}
        warmup_many(sorted({parse_policy(x) for x in labels}, key=lambda s: s.label))

    def idle(self) -> bool:
        """A worker is free for a cell started ahead: fewer than ``workers − 1`` started
        ahead and still running, and fewer than ``workers`` cells in flight."""
        running = [k for k, f in self.futs.items() if not f.done()]
        return len(running) < self.n and sum(1 for k in running if self.ahead.get(k)) < self.n - 1

    def _submit(self, key: str, settings: dict) -> None:
        from radixkv.sweep.cell import CellTask, run_cell

        t = CellTask(key, self.ref, settings)
        if self.client is not None:
            import uuid

            f = self.client.submit(run_cell, t, self.shipped, key=f"radixkv-plan-{key}-{uuid.uuid4().hex[:8]}",
                                   pure=False)
        else:
            from concurrent.futures.process import BrokenProcessPool

            try:
                f = self.pool.submit(run_cell, t)
            except BrokenProcessPool:  # a worker died earlier (its cells failed): a fresh pool for the rest
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.pool = self._new_pool()
                f = self.pool.submit(run_cell, t)
        self.futs[key] = f
        self.settings[key] = settings

    def _stored(self, key: str) -> bool:
        from radixkv.sweep import store

        return (self.ev.work_dir / store.CELLS / f"{key}.jsonl").exists() and key in store.done_keys(self.ev.work_dir)

    def fill(self) -> None:
        """Start cells of :attr:`queue` ahead of the search while a worker is idle (a cell
        running, collected or stored already is passed over)."""
        while self.queue and self.idle():
            key, settings = self.queue.pop(0)
            if key in self.futs or key in self.failed or key in self.produced or self._stored(key):
                continue
            self._submit(key, settings)
            self.ahead[key] = True
            self.ev.prefetched += 1

    def _collect(self, key: str) -> None:
        from radixkv.sweep import store
        from radixkv.sweep.grid import Cell

        f = self.futs.pop(key)
        try:
            res = f.result()
        except Exception as e:  # noqa: BLE001 — a worker died or the Dask task was lost: the cell is not done
            from concurrent.futures.process import BrokenProcessPool

            if isinstance(e, BrokenProcessPool):  # as radixkv.sweep.executors words it
                err = {"type": "WorkerDied", "message": f"a worker process died ({e})", "traceback": ""}
            else:
                where = "the Dask task" if self.client is not None else "the worker"
                err = {"type": type(e).__name__, "message": f"{where} failed ({e})", "traceback": ""}
            res = {"key": key, "ok": False, "worker": None, "error": err}
        cell = Cell(key, self.ev.trace_entry, self.settings[key])
        if res["ok"]:
            store.write_row(self.ev.work_dir, store.make_row(cell, res, self.meta))
            self.produced.add(key)
        else:
            store.write_error(self.ev.work_dir, cell, res)
            self.failed[key] = res["error"]

    def run(self, cells: dict) -> dict:
        """Run *cells* (key → settings) to the end; the failed ones' errors by key (the
        others are in the store)."""
        want = []
        for key, s in cells.items():
            if key in self.futs:
                if self.ahead.pop(key, False):
                    self.ev.prefetch_used += 1
                want.append(key)
            elif key in self.produced or key in self.failed:
                if self.ahead.pop(key, False):
                    self.ev.prefetch_used += 1
            elif self._stored(key):
                self.ev.resumed += 1
            else:
                self._submit(key, s)
                want.append(key)
        while want:
            self.fill()
            fs = [self.futs[k] for k in want]
            if self.client is not None:
                from distributed import wait

                wait(fs, return_when="FIRST_COMPLETED")
            else:
                from concurrent.futures import FIRST_COMPLETED, wait

                wait(fs, return_when=FIRST_COMPLETED)
            for k in list(want):
                if self.futs[k].done():
                    self._collect(k)
                    want.remove(k)
            # cells started ahead that finished meanwhile: stored now (a stopped plan keeps them)
            for k in [k for k, f in self.futs.items() if k not in want and f.done()]:
                self._collect(k)
        return {k: self.failed[k] for k in cells if k in self.failed}

    def close(self) -> None:
        """Store the cells started ahead that finished, cancel what is still running (never
        asked for) and stop the workers."""
        for k in [k for k, f in self.futs.items() if f.done()]:
            try:
                self._collect(k)
            except OSError:  # the store went away (a temporary work dir being removed): nothing to keep
                break
        if self.client is not None:
            try:
                self.client.cancel(list(self.futs.values()))
            finally:
                self.client.close()
                if self.cluster is not None:
                    self.cluster.close()
        elif self.pool is not None:
            busy = any(not f.done() for f in self.futs.values())
            if busy:
                for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
                    proc.terminate()
            self.pool.shutdown(wait=not busy, cancel_futures=True)
        self.futs.clear()
