"""Run one cell of a sweep, in whatever process the executor chose (the worker side).

A cell is one ``radixkv replay``: the same flags, the same pool rules, the same summary.
Each worker keeps the traces it has seen (:func:`get_trace`), so a trace is loaded once
per worker: from the memory-mapped column cache the sweep writes beside its results
(:func:`write_trace_cache`), or handed over by the executor (Dask ships it to every
worker once). Numba kernels are compiled or loaded from Numba's disk cache once per
worker (:func:`radixkv.replay.run.warmup` remembers what is warm).

A cell never raises :class:`Exception` out of :func:`run_cell`: a failure is returned as
a record (type, message, traceback), so one bad cell does not stop the others.
:class:`KeyboardInterrupt` and :class:`SystemExit` do propagate.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: trace columns stored as ``.npy`` files in the cache (absent files encode None)
_ARRAYS = ("req_id", "arrival_s", "prompt_len", "output_len", "ids", "id_offsets",
           "out_ids", "out_offsets", "session_id", "turn")

#: this worker's traces, by SHA-256 of the trace file
_TRACES: dict = {}


@dataclass(frozen=True)
class TraceRef:
    """Where a worker finds a trace: its SHA-256 (the memo key), the column cache
    directory (memory-mapped), and the original file and format (read when there is no
    cache)."""

    sha256: str
    cache_dir: str | None
    path: str
    format: str | None = None


@dataclass(frozen=True)
class CellTask:
    """What a worker needs to run one cell: its key, trace and normalised settings."""

    key: str
    trace: TraceRef
    settings: dict


def write_trace_cache(trace, directory) -> None:
    """Write *trace*'s columns as uncompressed ``.npy`` files in *directory*, atomically
    (a temporary directory renamed into place), for :func:`read_trace_cache`.

    Scalars (``unit_tokens``, ``partial_last_unit``, ``name``) go in ``meta.json``.
    Nothing is written when *directory* already exists.
    """
    import shutil
    import tempfile

    directory = Path(directory)
    if directory.exists():
        return
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for name in _ARRAYS:
            a = getattr(trace, name)
            if a is not None:
                np.save(tmp / f"{name}.npy", np.ascontiguousarray(a), allow_pickle=False)
        meta = {"unit_tokens": int(trace.unit_tokens), "partial_last_unit": bool(trace.partial_last_unit),
                "name": str(trace.name)}
        (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True), encoding="utf-8")
        try:
            os.rename(tmp, directory)
        except OSError:
            if not directory.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another sweep wrote it first
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:  # a full disk: name the folder
            raise OSError(e.errno, f"{e.strerror or e}; the trace cache was not written", str(directory)) from None
        raise


def read_trace_cache(directory):
    """The :class:`~radixkv.trace.types.Trace` of a cache written by
    :func:`write_trace_cache`, its columns memory-mapped copy-on-write (pages are shared
    by every process on the machine that maps the same file)."""
    from radixkv.trace.types import Trace

    directory = Path(directory)
    meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    cols = {}
    for name in _ARRAYS:
        f = directory / f"{name}.npy"
        if f.exists():
            cols[name] = np.load(f, mmap_mode="c", allow_pickle=False)
    return Trace(**cols, **meta)


def remember_trace(sha256: str, trace) -> None:
    """Put *trace* in this process's memo (the parent does so before forking workers)."""
    _TRACES[sha256] = trace


def get_trace(ref: TraceRef):
    """This worker's copy of a trace: from the memo, else memory-mapped from the cache,
    else read from the original file (any format). Returns ``(trace, load_seconds)``."""
    tr = _TRACES.get(ref.sha256)
    if tr is not None:
        return tr, 0.0
    t0 = time.perf_counter()
    if ref.cache_dir and Path(ref.cache_dir, "meta.json").exists():
        tr = read_trace_cache(ref.cache_dir)
    else:
        from radixkv.trace.load import load_trace

        tr = load_trace(ref.path, format=ref.format)
    _TRACES[ref.sha256] = tr
    return tr, time.perf_counter() - t0


def replay_cell(trace, settings: dict) -> dict:
    """Replay *trace* as ``radixkv replay`` would with *settings* (flag destinations →
    values; ``policy`` required; missing flags take the command line's defaults).

    The replay is :func:`radixkv.replay.spec.run`'s (the cell's settings its knobs); a cell
    with ``replicas`` runs them behind ``router`` (on one clock when concurrent); a concurrent cell's
    metrics add ``overloaded``, ``queue_growth_s_per_s`` and ``queue_tail_mean_s``
    (:func:`radixkv.replay.overload.overload_metrics`).

    Returns
    -------
    dict
        ``{"metrics": summary without policy/timing, "pool": where the pool size came
        from, "timing_s": {"compile", "replay", "prompt_tokens_per_s"}}``.

    Raises
    ------
    radixkv.errors.ConfigError
        Whatever ``radixkv replay`` would refuse (pool too small, a request that never fits).
    """
    from radixkv.policies.registry import parse_policy
    from radixkv.replay.pool_settings import pool_for_policy
    from radixkv.replay.spec import ReplaySpec, run
    from radixkv.sweep.grid import replay_defaults

    ns = argparse.Namespace(**{**replay_defaults(), **settings})
    spec = parse_policy(ns.policy)
    pool, desc = pool_for_policy(ns, spec, per_engine_rule=bool(ns.per_engine_rule))
    res, summ = run(ReplaySpec(trace, spec, pool, mode=ns.mode, limit=ns.limit, knobs=ns,
                               options={"verify": True} if ns.verify else {}))
    if ns.mode == "concurrent":  # several replicas: their aggregate
        from radixkv.replay.overload import overload_of

        summ.update(overload_of(getattr(res, "aggregate", res)))
    timing = summ.pop("timing_s")
    summ.pop("policy", None)
    return {"metrics": summ, "pool": desc, "timing_s": timing}


def run_cell(task: CellTask, trace=None) -> dict:
    """Run one cell; never raises an :class:`Exception` (see the module docstring).

    Parameters
    ----------
    task : CellTask
    trace : Trace or None
        The cell's trace when the executor ships it; else :func:`get_trace` finds it.

    Returns
    -------
    dict
        ``{"key", "ok": True, "metrics", "pool", "timing_s", "worker"}`` or
        ``{"key", "ok": False, "error": {"type", "message", "traceback"}, "worker"}``;
        ``timing_s`` has ``trace_load`` (0 when the worker had the trace), ``compile``,
        ``replay`` and ``cell`` (wall seconds of the whole cell).
    """
    t0 = time.perf_counter()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    try:
        load_s = 0.0
        if trace is None:
            trace, load_s = get_trace(task.trace)
        out = replay_cell(trace, task.settings)
    except Exception as e:  # noqa: BLE001 — a failed cell is data; the sweep goes on
        return {"key": task.key, "ok": False, "worker": worker,
                "error": {"type": type(e).__name__, "message": str(e), "reason": getattr(e, "reason", str(e)),
                          "field": getattr(e, "field", None), "traceback": traceback.format_exc()}}
    out["timing_s"] = {"trace_load": load_s, **out["timing_s"], "cell": time.perf_counter() - t0}
    return {"key": task.key, "ok": True, "worker": worker, **out}
