"""Run a sweep: expand the grid, skip finished cells, run the rest, store each at once."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from radixkv.errors import ConfigError, InputError
import radixkv.sweep.store as store
from radixkv.sweep.cell import CellTask, TraceRef, remember_trace, write_trace_cache
from radixkv.sweep.executors import run_tasks
from radixkv.sweep.grid import cell_expected, load_grid


@dataclass
class SweepReport:
    """What a sweep did (filled in while it runs, so it is valid after an interrupt).

    Attributes
    ----------
    total : int
        Cells in the grid (duplicates merged).
    skipped : int
        Cells already finished in the results store before this run.
    done : int
        Cells this run finished.
    failed : list of (Cell, dict)
        Cells that failed in this run, with their error (``type``, ``message``, ``traceback``).
    wall_s : float
        Seconds from the first task submitted to the last result stored.
    """

    total: int = 0
    skipped: int = 0
    done: int = 0
    failed: list = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def remaining(self) -> int:
        """Cells still unfinished."""
        return self.total - self.skipped - self.done


def run_sweep(grid, out_dir, *, executor: str = "local", workers: int | None = None,
              scheduler: str | None = None, progress: bool = True, report: SweepReport | None = None) -> SweepReport:
    """Run every unfinished cell of *grid* and store each one in *out_dir* as it finishes.

    Parameters
    ----------
    grid : str, Path or Grid
        ``GRID.toml`` (see :mod:`radixkv.sweep.grid`) or a grid already loaded.
    out_dir : str or Path
        The results store (created if missing; see :mod:`radixkv.sweep.store`).
    executor : ``"local"``, ``"processes"`` or ``"dask"``
    workers : int or None
        Worker processes (default: this machine's CPUs).
    scheduler : str or None
        An existing Dask scheduler's address (with ``executor="dask"``).
    progress : bool
        A tqdm bar on stderr counting cells.
    report : SweepReport or None
        Filled in as the sweep runs (pass one to read it after a ``KeyboardInterrupt``).

    Returns
    -------
    SweepReport

    Raises
    ------
    radixkv.errors.ConfigError
        A bad grid (naming the key), a bad executor option, Dask missing.
    radixkv.errors.InputError
        A trace that cannot be read, an output path that is not a directory.
    KeyboardInterrupt
        Ctrl-C: finished cells are stored; a rerun does the rest.
    """
    from radixkv.trace.load import load_trace

    rep = report if report is not None else SweepReport()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", path=out, field="out")
    if not out.exists() and not out.resolve().parent.is_dir():
        raise InputError(f"folder {out.parent} does not exist: the sweep creates its results directory, not the "
                         f"folders above it (check the path, or create {out.parent} first)", path=out, field="out")
    g = grid if not isinstance(grid, (str, Path)) else load_grid(grid)
    done = store.done_keys(out, {c.key: cell_expected(c.settings) for c in g.cells})
    todo = [c for c in g.cells if c.key not in done]
    rep.total, rep.skipped = len(g.cells), len(g.cells) - len(todo)
    created = not out.exists()
    out.mkdir(exist_ok=True)  # the results directory (its parent exists: checked above)
    (out / store.CELLS).mkdir(exist_ok=True)  # a sweep stopped before its first cell is still a results dir

    # each trace: read once here, cached as memory-mappable columns for the workers
    traces, meta, refs = {}, {}, {}
    fmt = {c.trace.sha256: c.settings.get("format") for c in todo}
    try:
        for c in todo:
            sha = c.trace.sha256
            if sha in traces:
                continue
            tr = load_trace(c.trace.path, format=fmt[sha])
            cache = out / store.TRACES / sha[:32]
            write_trace_cache(tr, cache)
            traces[sha] = tr
            meta[sha] = {"name": tr.name, "unit_tokens": int(tr.unit_tokens)}
            refs[sha] = TraceRef(sha, str(cache.resolve()), str(c.trace.path), fmt[sha])
            remember_trace(sha, tr)
    except BaseException:
        if created:  # a trace that cannot be read: leave no results directory that holds nothing
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        raise
    # biggest traces first: a better balance across workers
    size = {sha: int(tr.prompt_len.sum()) for sha, tr in traces.items()}
    order = sorted(range(len(todo)), key=lambda i: -size[todo[i].trace.sha256])
    tasks = [CellTask(todo[i].key, refs[todo[i].trace.sha256], todo[i].settings) for i in order]
    cells = {c.key: c for c in todo}

    if tasks and not (executor == "dask" and scheduler):
        from radixkv.policies.registry import parse_policy
        from radixkv.replay.run import warmup_many

        warmup_many(sorted({parse_policy(t.settings["policy"]) for t in tasks}, key=lambda s: s.label))

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=rep.total, initial=rep.skipped, unit="cell", desc="sweep", file=sys.stderr,
                   dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        for task, res in run_tasks(tasks, executor, workers=workers, scheduler=scheduler, traces=traces):
            cell = cells[task.key]
            if res["ok"]:
                store.write_row(out, store.make_row(cell, res, meta[cell.trace.sha256]))
                rep.done += 1
            else:
                store.write_error(out, cell, res)
                rep.failed.append((cell, res["error"]))
            if bar is not None:
                bar.update(1)
                if rep.failed:
                    bar.set_postfix(failed=len(rep.failed), refresh=False)
    finally:
        rep.wall_s = time.perf_counter() - t0
        if bar is not None:
            bar.close()
    return rep


def check_executor_args(executor: str, workers, scheduler) -> None:
    """Refuse contradictory executor options before any work is done."""
    if scheduler and executor != "dask":
        raise ConfigError("--scheduler is the address of a Dask scheduler: use it with --executor dask",
                          field="scheduler")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be ≥ 1, got {workers}", field="workers")
    if executor == "dask":
        from radixkv.sweep.executors import require_dask

        require_dask()


def run_settings(trace, settings_list: list[dict], *, executor: str = "local", workers: int | None = None,
                 scheduler: str | None = None, trace_path=None, trace_format=None) -> list[dict]:
    """Replay one loaded *trace* under several settings on an executor, without a store.

    This is how ``radixkv compare`` and ``curve`` spread their cells over processes
    (``--executor processes``) or Dask. Each settings dict is a ``radixkv replay``
    configuration (``policy`` plus flag destinations; see
    :func:`radixkv.sweep.cell.replay_cell`).

    Returns
    -------
    list of dict
        :func:`radixkv.sweep.cell.run_cell` results, in the order of *settings_list*.
    """
    import hashlib

    check_executor_args(executor, workers, scheduler)
    sha = "mem-" + hashlib.sha256(f"{id(trace)}:{trace_path}:{len(trace)}".encode()).hexdigest()[:16]
    remember_trace(sha, trace)
    ref = TraceRef(sha, None, str(trace_path) if trace_path is not None else "", trace_format)
    tasks = [CellTask(str(i), ref, s) for i, s in enumerate(settings_list)]
    results: dict = {}
    for task, res in run_tasks(tasks, executor, workers=workers, scheduler=scheduler, traces={sha: trace}):
        results[int(task.key)] = res
    return [results[i] for i in range(len(tasks))]
