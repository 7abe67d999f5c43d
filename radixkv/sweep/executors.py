"""Where cells run: ``local`` (this process, in order), ``processes`` (a pool of worker
processes on this machine) or ``dask`` (a ``dask.distributed`` cluster: a local one, or an
existing one at ``--scheduler ADDRESS``).

Every executor is used the same way: :func:`run_tasks` yields ``(task, result)`` pairs as
cells finish (in completion order), where ``result`` is what
:func:`radixkv.sweep.cell.run_cell` returned. The caller writes each result at once.

- ``processes``: :class:`concurrent.futures.ProcessPoolExecutor`. On Linux the workers are
  forked from this process after it has loaded the traces and compiled the kernels, so
  they start warm and share the trace's memory pages; elsewhere they are spawned and
  memory-map the sweep's trace cache.
- ``dask``: each trace is shipped to every worker once (``Client.scatter(...,
  broadcast=True)``) and the cells are submitted as tasks keyed by the cell key. The
  workers need radixkv importable at the same version. Dask is an optional dependency:
  ``pip install 'radixkv[dask]'``.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator

from radixkv.errors import ConfigError
from radixkv.sweep.cell import CellTask, run_cell

EXECUTORS = ("local", "processes", "dask")


def default_workers() -> int:
    """Worker count when none is given: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_tasks(tasks: list[CellTask], executor: str = "local", *, workers: int | None = None,
              scheduler: str | None = None, traces: dict | None = None) -> Iterator[tuple[CellTask, dict]]:
    """Run *tasks* on *executor*; yield ``(task, result)`` as each finishes.

    Parameters
    ----------
    tasks : list of CellTask
    executor : ``"local"``, ``"processes"`` or ``"dask"``
    workers : int or None
        Worker processes (``processes``, and the local Dask cluster); default: the CPUs.
    scheduler : str or None
        Address of an existing Dask scheduler (``tcp://host:8786``); ``dask`` only.
    traces : dict or None
        ``{sha256: Trace}`` already loaded here (the ``local`` and forked workers use them;
        ``dask`` ships them).

    Raises
    ------
    radixkv.errors.ConfigError
        An unknown executor, a bad worker count, or Dask missing / unreachable.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; known: {', '.join(EXECUTORS)}", field="executor")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be ≥ 1, got {workers}", field="workers")
    if scheduler and executor != "dask":
        raise ConfigError("--scheduler is the address of a Dask scheduler: use it with --executor dask",
                          field="scheduler")
    if executor == "dask":
        require_dask()
    if not tasks:
        return iter(())
    if executor == "local":
        return _run_local(tasks)
    if executor == "processes":
        return _run_processes(tasks, workers or default_workers())
    return _run_dask(tasks, workers or default_workers(), scheduler, traces or {})


def _run_local(tasks: Iterable[CellTask]):
    for t in tasks:
        yield t, run_cell(t)


def _run_processes(tasks: list[CellTask], workers: int):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("fork") if sys.platform.startswith("linux") else mp.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx, initializer=_worker_init,
                               initargs=(os.getpid(),))
    finished = False
    try:
        futs = {pool.submit(run_cell, t): t for t in tasks}
        for f in as_completed(futs):
            t = futs[f]
            try:
                res = f.result()
            except BrokenProcessPool as e:  # a worker died (killed, out of memory): the cell is not done
                res = {"key": t.key, "ok": False, "worker": None,
                       "error": {"type": "WorkerDied", "message": f"a worker process died ({e})", "traceback": ""}}
            yield t, res
        finished = True
    finally:
        if not finished:
            # Ctrl-C or an error here: the cells in flight would not be stored, so stop them now
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=finished, cancel_futures=True)


def _worker_init(parent_pid: int | None = None) -> None:
    """Set up a worker process: it leaves Ctrl-C to the sweep, which stops it (no
    traceback per worker), and it dies with the sweep.

    A sweep killed by SIGKILL or SIGTERM runs no cleanup, and its workers would live on
    (adopted by init, ~130 MB each). On Linux the worker asks the kernel for SIGKILL when
    its parent dies (``prctl(PR_SET_PDEATHSIG)``, through ctypes; the signal follows the
    thread that forked the worker, which is the sweep's main thread: ``ProcessPoolExecutor``
    starts its workers from ``submit``). Elsewhere, or when prctl is unavailable, a daemon
    thread checks once a second whether the parent is still *parent_pid* and exits when
    it is not. A parent already gone before the worker got here is caught by that check.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is None:
        return
    watched = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
            watched = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            watched = False
    if os.getppid() != parent_pid:  # the parent died before the watch was set
        os._exit(1)
    if not watched:
        import threading
        import time

        def watch():
            while os.getppid() == parent_pid:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="radixkv-parent-watch", daemon=True).start()


def require_dask() -> None:
    """Raise a :class:`ConfigError` saying how to install Dask when it is missing."""
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        raise ConfigError("--executor dask needs dask.distributed, which is not installed: "
                          "pip install 'radixkv[dask]'", field="executor") from None


def _dask_client(workers: int, scheduler: str | None):
    from dask.distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout="20s"), None
        except (OSError, TimeoutError) as e:
            raise ConfigError(f"cannot reach the Dask scheduler at {scheduler} ({e})", field="scheduler") from None
    import logging

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                           silence_logs=logging.ERROR)
    return Client(cluster), cluster


def _run_dask(tasks: list[CellTask], workers: int, scheduler: str | None, traces: dict):
    client, cluster = _dask_client(workers, scheduler)
    try:
        yield from dask_map(client, tasks, traces)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def dask_map(client, tasks: list[CellTask], traces: dict):
    """Run *tasks* on an existing ``distributed.Client``; yield ``(task, result)`` as they
    finish. Traces in *traces* (``{sha256: Trace}``) are scattered to every worker once;
    others are read by the workers from the task's :class:`~radixkv.sweep.cell.TraceRef`."""
    from dask.distributed import as_completed

    shipped = {}
    for sha in {t.trace.sha256 for t in tasks}:
        if sha in traces:
            shipped[sha] = client.scatter(traces[sha], broadcast=True, hash=False)
    import uuid

    run = uuid.uuid4().hex[:8]  # task keys unique to this run, so a long-lived cluster never reuses an old result
    futs = {}
    for t in tasks:
        f = client.submit(run_cell, t, shipped.get(t.trace.sha256), key=f"radixkv-cell-{t.key}-{run}", pure=False)
        futs[f] = t
    try:
        for f in as_completed(list(futs)):
            t = futs[f]
            try:
                res = f.result()
            except Exception as e:  # noqa: BLE001 — the worker was lost; the cell is not done
                res = {"key": t.key, "ok": False, "worker": None,
                       "error": {"type": type(e).__name__, "message": f"the Dask task failed ({e})", "traceback": ""}}
            yield t, res
    finally:
        client.cancel(list(futs))
