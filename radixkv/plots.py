"""Figures with matplotlib (Agg backend: no display needed)."""
from __future__ import annotations

import io
import os
import pickle
import struct
import sys

from radixkv.util import atomic_write_bytes


def _subplots(*args, figsize, dpi, **kwargs):
    """``plt.subplots`` without pyplot: a :class:`matplotlib.figure.Figure` (Agg output on
    ``savefig``) and its axes. pyplot's import costs ~0.1–0.3 s of CPU more and keeps a
    figure manager to close; the PNG bytes are the same."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi)
    return fig, fig.subplots(*args, **kwargs)


def plot_curves(doc: dict, path, *, metric: str = "token_hit_rate", reference: dict | None = None,
                x: str = "capacity_tokens", window: bool = False) -> None:
    """:func:`curves_png` (same parameters) written atomically to the PNG *path*."""
    atomic_write_bytes(path, curves_png(doc, metric=metric, reference=reference, x=x, window=window))


def curves_png(doc: dict, *, metric: str = "token_hit_rate", reference: dict | None = None,
               x: str = "capacity_tokens", window: bool = False) -> bytes:
    """Hit rate against capacity (log x), one line per policy: the PNG's bytes.

    Parameters
    ----------
    doc : dict
        ``{"trace": {...}, "curves": [{"policy": str, "points": [{"capacity_tokens": int,
        metric: float}, ...]}, ...]}`` as ``radixkv curve`` writes it.
    metric : str
        Which point field to plot.
    reference : dict or None
        Optional ``{"label": str, "capacity_tokens": [...], "values": [...]}`` drawn as
        markers (e.g. values read off a published figure).
    x : str
        The point field on the x axis: ``capacity_tokens`` (log scale) or
        ``host_capacity_tokens`` (``radixkv curve --host-capacities``; linear, as it
        starts at 0).
    window : bool
        Plot each point's ``measure_window`` value of *metric* (``radixkv curve
        --measure-last F``: the last share F of the requests) instead of the whole replay's.
    """
    fig, ax = _subplots(figsize=(6.4, 4.0), dpi=120)
    def value(p):
        return p["measure_window"].get(metric) if window else p[metric]

    share = None
    for c in doc["curves"]:
        pts = [p for p in c["points"] if (("measure_window" in p) if window else (metric in p))]
        pts = [p for p in pts if value(p) is not None]
        if not pts:
            continue
        share = pts[0]["measure_window"]["measure_last"] if window else None
        label = c["policy"] + (" (GPU + host as one pool)" if c.get("tiers") == 1 else "")
        ax.plot([p[x] for p in pts], [value(p) for p in pts], marker="o", label=label)
    if reference:
        ax.plot(reference["capacity_tokens"], reference["values"], "k^", linestyle="none", label=reference["label"])
    if x == "capacity_tokens":
        ax.set_xscale("log")
        log_ticks(ax, [p[x] for c in doc["curves"] for p in c["points"]])
        ax.set_xlabel("KV pool capacity (tokens)")
    else:
        gpu = next((c.get("gpu_capacity_tokens") for c in doc["curves"]), None)
        ax.set_xlabel(f"host KV pool (tokens), GPU pool {gpu:,} tokens" if gpu else "host KV pool (tokens)")
    ax.set_ylabel(metric.replace("_", " ") + (f", last {share:.0%} of requests" if share is not None else ""))
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(doc["trace"].get("name") or doc["trace"].get("path", ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _png(fig) -> bytes:
    """*fig*, laid out (``tight_layout``), as PNG bytes (no ``Software`` tag: the bytes do not
    name matplotlib's version).

    ``tight_layout`` leaves a placeholder layout engine on the figure, and ``savefig`` draws
    a figure that has one twice: once with rendering off, for the engine, then into the
    PNG. With the layout done, the engine is dropped first (``set_layout_engine(None)``):
    one draw (~0.015 s of ~0.15 s), the same bytes (``tests/test_png_background.py``)."""
    import matplotlib

    if not (matplotlib.rcParams["figure.autolayout"] or matplotlib.rcParams["figure.constrained_layout.use"]):
        fig.set_layout_engine(None)  # (with either set, None would mean that engine instead)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def short_number(v) -> str:
    """A tick label: ``2k``, ``4.99k`` as ``5k``, ``1.5M``, ``120M``, ``2G`` (one decimal
    below 10, none above); below 1,000 the number as it is."""
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            q = v / div
            return (f"{q:.1f}".rstrip("0").rstrip(".") if abs(q) < 10 else f"{q:.0f}") + suffix
    return f"{v:g}"


def log_ticks(ax, values, *, max_ticks: int = 8) -> None:
    """Label a log x axis at the data's own *values* (short labels, :func:`short_number`)
    that stand apart: going up, a value is labelled when it is at least 1/*max_ticks* of
    the axis span (in decades, at least 0.3 decade in all) above the last one labelled, so
    labels never overlap; minor ticks stay, unlabelled. (Matplotlib's default labels the
    minor ticks of an axis spanning under a decade or two, and those collide.)"""
    import math

    from matplotlib.ticker import FixedLocator, NullFormatter

    vals = sorted({float(v) for v in values if v and v > 0})
    if not vals:
        return
    gap = max(math.log10(vals[-1] / vals[0]), 0.3 * max_ticks) / max_ticks
    keep = [vals[0]]
    for v in vals[1:]:
        if math.log10(v / keep[-1]) >= gap - 1e-9:
            keep.append(v)
    ax.xaxis.set_major_locator(FixedLocator(keep))
    ax.set_xticks(keep, [short_number(v) for v in keep])
    ax.xaxis.set_minor_formatter(NullFormatter())


def sweep_lines(rows: list[dict], *, x: str = "capacity_tokens", metric: str = "token_hit_rate") -> dict:
    """The lines :func:`plot_sweep` draws: ``{trace path: {label: [(x, y), ...]}}``, points
    sorted by x. A line is a policy and a value of every other knob the sweep varies (the
    label names them); a cell without a number for *x* or *metric* is left out.

    Raises
    ------
    radixkv.errors.InputError
        Nothing to draw (``field`` = ``x`` or ``metric``), with the reason: *metric* is in no
        cell (the metrics that are), or the cells have fewer than two numbers for *x* (and
        the knobs the grid sweeps, to pass as ``--x``).
    """
    from radixkv.errors import InputError
    from radixkv.sweep.show import POOL_KEYS, check_metric, setting, swept

    if not rows:
        raise InputError("the sweep has no finished cell: nothing to plot", field="dir")
    check_metric(rows, metric)
    knobs = [k for k in swept(rows) if k != "trace"]

    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    pts = [(r, setting(r, x)) for r in rows]
    xs = {v for _, v in pts if number(v)}
    if len(xs) < 2:
        numeric = [k for k in knobs if k != x and len({setting(r, k) for r in rows
                                                       if number(setting(r, k))}) > 1]
        why = (f"the grid sweeps {', '.join(numeric)}; use --x {numeric[0]}" if numeric else
               f"the grid sweeps no numeric knob ({', '.join(knobs) or 'none'}): nothing to put on an x axis")
        what = (f"no cell has a number for {x!r}" if not xs else
                f"every cell has {x} = {next(iter(xs)):,}")
        raise InputError(f"nothing to draw from {len(rows)} cells: {what}; {why}", field="x")
    skip = {"policy", x} | (set(POOL_KEYS) if x in POOL_KEYS else set())
    varying = [k for k in knobs if k not in skip]
    out: dict = {}
    for r, xv in pts:
        y = r.get("metrics", {}).get(metric)
        if not number(xv) or not number(y):
            continue
        # a knob the cell left out (a default, or one its mode does not read) is not named
        label = " ".join([str(r["settings"]["policy"])] + [f"{k}={r['settings'][k]}" for k in varying
                                                           if k in r["settings"]])
        out.setdefault(r["trace"]["path"], {}).setdefault(label, []).append((xv, y))
    if not out:
        raise InputError(f"0 lines from {len(rows)} cells: no cell has both a number for {x!r} and for "
                         f"{metric!r}", field="metric")
    for lines in out.values():
        for label in lines:
            lines[label].sort()
    return out


def plot_sweep(rows: list[dict], path, *, metric: str = "token_hit_rate", x: str = "capacity_tokens") -> int:
    """*metric* against the knob *x* from a sweep's rows, written atomically as PNG.

    One panel per trace; one line per policy — and per value of any other setting that
    varies in the sweep (the line's label names it): :func:`sweep_lines`. The x axis is
    logarithmic for the pool's capacity (tokens, the default) and for a knob whose values
    span 20x or more.

    Parameters
    ----------
    rows : list of dict
        :func:`radixkv.sweep.read_rows` rows.
    path : str or Path
        The PNG to write (nothing is written when there is nothing to draw).
    metric : str
        A summary metric (``token_hit_rate``, ``hit_tokens``, ``ttft_p99_s``, ...).
    x : str
        A grid knob (``capacity_tokens``: the pool's usable tokens however the grid sized
        it; ``gpu_memory_utilization``, ``max_num_seqs``, ...).

    Returns
    -------
    int
        Lines drawn (at least 1).

    Raises
    ------
    radixkv.errors.InputError
        Nothing to draw (:func:`sweep_lines`).
    """
    from radixkv.report import metric_label

    panels = sweep_lines(rows, x=x, metric=metric)
    traces = sorted(panels)
    fig, axes = _subplots(1, len(traces), figsize=(6.4 * len(traces), 4.0), dpi=120, squeeze=False)
    lines = 0
    for ax, tr in zip(axes[0], traces):
        groups = panels[tr]
        xs = sorted({p[0] for pts in groups.values() for p in pts})
        for label in sorted(groups):
            pts = groups[label]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            lines += 1
        if x == "capacity_tokens" or (xs[0] > 0 and xs[-1] >= 20 * xs[0]):
            ax.set_xscale("log")
            log_ticks(ax, xs)
        ax.set_xlabel("KV pool capacity (tokens)" if x == "capacity_tokens" else x)
        ax.set_ylabel(metric_label(metric))
        if all(p[1] >= 0 for pts in groups.values() for p in pts):
            ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(tr, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write_bytes(path, _png(fig))
    return lines


#: colours of the miss-cause bars, in :data:`radixkv.replay.misses.CAUSES` order then the
#: concurrent-only causes
MISS_COLOURS = {"hit": "#4f81bd", "compulsory": "#7f7f7f", "capacity": "#c0504d", "alignment": "#f79646",
                "last_token_cap": "#9bbb59", "not_cached": "#8064a2", "in_flight": "#4bacc6",
                "preemption": "#e6b9b8", "routing": "#d99694"}


def draw_miss_causes(ax, rows) -> bool:
    """Stacked bars of the prompt split by miss cause, one bar per policy, on *ax*.

    Parameters
    ----------
    ax : matplotlib Axes
    rows : list of (label, miss_causes)
        ``miss_causes`` as a summary holds it (:func:`radixkv.metrics.summarize_causes`):
        ``share`` maps cause → share of prompt tokens, ``None`` when not modelled (no bar
        segment, and the legend says so by leaving it out). ``preemption`` is stacked
        when it is part of the split (``preemption_in_split`` true, concurrent summaries
        since the split holds it) and left out of summaries written before
        (``preemption_in_split`` false: tokens computed again, beside the split).

    Returns False (nothing drawn) when *rows* is empty.
    """
    if not rows:
        return False
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for cause, colour in MISS_COLOURS.items():
        vals = [None if cause == "preemption" and r.get("preemption_in_split") is False else r["share"].get(cause)
                for _, r in rows]
        if all(v is None for v in vals):
            continue
        vals = [v or 0.0 for v in vals]
        ax.bar(x, vals, bottom=bottom, color=colour, label=cause.replace("_", " "), width=0.6)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(x, [lab for lab, _ in rows], rotation=30 if len(rows) > 3 else 0, fontsize=8)
    ax.set_ylabel("share of prompt tokens")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(True, axis="y", alpha=0.3)
    return True


def plot_miss_causes(rows, path, *, title: str = "") -> None:
    """:func:`draw_miss_causes` written atomically to the PNG *path*."""
    fig, ax = _subplots(figsize=(6.4, 4.0), dpi=120)
    draw_miss_causes(ax, rows)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    atomic_write_bytes(path, _png(fig))


#: what a drawing process imports while it waits for its job: the modules a first figure
#: needs (:func:`_subplots`, then ``savefig``'s Agg canvas and PNG writer)
_WARM_MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg", "PIL.PngImagePlugin")

#: the length prefix of a message on a drawing process's pipes (bytes that follow, little-endian)
_FRAME = struct.Struct("<Q")


class PngInProcess:
    """One PNG drawn in this process: :meth:`submit` records the call, :meth:`write` makes
    it and writes its bytes atomically. The fallback of :class:`PngInBackground`, with the
    same methods; errors are raised by :meth:`write`, where the drawing happens.
    *trimmed_import*: :meth:`write` imports matplotlib first as the drawing process does
    (:func:`_import_for_drawing`; only for a process that ends after drawing)."""

    def __init__(self, *, trimmed_import: bool = False):
        self._call = None
        self._trimmed_import = trimmed_import

    def submit(self, fn, /, *args, **kwargs) -> None:
        """Record ``fn(*args, **kwargs)`` (a function returning PNG bytes) for :meth:`write`."""
        self._call = (fn, args, kwargs)

    def write(self, path) -> None:
        """Draw the submitted call and write its bytes to *path* atomically
        (:func:`radixkv.util.atomic_write_bytes`); its errors and the write's are raised."""
        fn, args, kwargs = self._call
        if self._trimmed_import:
            _import_for_drawing()
        atomic_write_bytes(path, fn(*args, **kwargs))

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PngInBackground:
    """One PNG drawn by a forked process while this one computes what it shows.

    A ``radixkv curve --out`` process spends ~0.5 s of CPU in matplotlib (importing it
    ~0.35 s, ~0.22 s in this process's way, :func:`_import_for_drawing`; drawing and
    encoding the figure ~0.15 s) after ~0.25 s of trace load and replay; with a second
    core, the import runs beside the trace load and the replay, and the drawing beside the
    JSON output. :meth:`fork` starts a process that imports
    :data:`_WARM_MODULES` at once; :meth:`submit` sends it a call (a module-level function
    returning PNG bytes, and its arguments, pickled), which it makes on arrival;
    :meth:`write` sends it the path, where it writes the bytes atomically
    (:func:`radixkv.util.atomic_write_bytes`), and waits for it to end. An exception raised
    there (importing, drawing or writing) is raised again by :meth:`write`: the same type
    and arguments (unpickled), with the process's traceback as a note; a process killed
    by a signal raises :class:`RuntimeError` naming it. Before :meth:`write` the process
    writes nothing, and :meth:`close` (also on leaving a ``with`` block, e.g. on an error
    here) kills and reaps it: no file and no process are left behind. After
    :meth:`write`, :meth:`close` reaps it. The bytes are those the same call makes in this
    process (:class:`PngInProcess`): the process is this one's copy (``os.fork``), with the
    same modules and settings.

    Use :func:`png_writer`, which forks only where it can help.
    """

    def __init__(self, pid: int, jobs: int, results: int):
        self._pid, self._jobs, self._results = pid, jobs, results
        self._submitted = self._committed = False

    @classmethod
    def fork(cls) -> "PngInBackground":
        """Fork the drawing process (unconditionally; :func:`png_writer` decides when)."""
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        try:  # room for the call (a curve's document: kilobytes) while the process still imports
            import fcntl

            fcntl.fcntl(job_w, fcntl.F_SETPIPE_SZ, 1 << 20)
        except (ImportError, AttributeError, OSError):  # not Linux, or over pipe-max-size: sends wait
            pass
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; its outcome is what the tests check
            os.close(job_w)
            os.close(res_r)
            _serve(job_r, res_w)
        os.close(job_r)
        os.close(res_w)
        return cls(pid, job_w, res_r)

    def submit(self, fn, /, *args, **kwargs) -> None:
        """Send ``fn(*args, **kwargs)``; the process makes the call at once. *fn* must be
        importable by name (pickled by reference). Once."""
        if self._submitted:
            raise RuntimeError("PngInBackground draws one PNG: submit() was called already")
        self._send(pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL))
        self._submitted = True

    def write(self, path) -> None:
        """Have the process write the bytes of the submitted call to *path* (atomically),
        wait for it, and raise its error, if any (see the class). After :meth:`submit`, once."""
        if not self._submitted or self._committed:
            raise RuntimeError("PngInBackground.write() goes once after submit()")
        self._send(pickle.dumps(os.fspath(path), protocol=pickle.HIGHEST_PROTOCOL))
        self._committed = True
        os.close(self._jobs)
        self._jobs = None
        chunks = []
        while chunk := os.read(self._results, 1 << 16):
            chunks.append(chunk)
        status = self._reap()
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and not chunks:
            return
        if not chunks:
            why = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"ended with status {os.waitstatus_to_exitcode(status)}")
            raise RuntimeError(f"the process drawing {os.fspath(path)} {why} before writing it")
        err, trace = pickle.loads(b"".join(chunks))
        if hasattr(err, "add_note"):
            err.add_note(f"raised in the process drawing {os.fspath(path)}:\n{trace}")
        raise err

    def close(self) -> None:
        """Kill the process unless :meth:`write` was called (then it has ended or is
        writing: wait for it); reap it. Idempotent."""
        if self._jobs is not None:
            os.close(self._jobs)
            self._jobs = None
        if self._pid is not None and not self._committed:
            import signal

            os.kill(self._pid, signal.SIGKILL)
        if self._pid is not None:
            self._reap()
        if self._results is not None:
            os.close(self._results)
            self._results = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, payload: bytes) -> None:
        try:
            os.write(self._jobs, _FRAME.pack(len(payload)))
            view = memoryview(payload)
            while view:
                view = view[os.write(self._jobs, view):]
        except BrokenPipeError:  # the process has ended: write() reports how
            pass

    def _reap(self) -> int:
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        return status


def png_writer(background: bool, *, ends_process: bool = False):
    """A :class:`PngInBackground` when *background* and a second process can help, else a
    :class:`PngInProcess` (same methods, same bytes).

    Forks only where the platform has ``os.fork``, this process runs one thread (forking a
    threaded process is unsafe), matplotlib is not imported yet (else the drawing alone is
    left, ~0.15 s, against the fork's cost) and a CPU is free (:func:`_cpu_free`; where
    every CPU is busy the two processes only take turns, and measured on a shared 2-core
    machine, load average 16-19, the pair cost ~0.05-0.09 s of CPU more than one process).
    *ends_process*: this process ends after the drawing (the ``radixkv`` program, not a
    caller of :func:`radixkv.cli.main` that lives on), so when it draws in this process,
    matplotlib is imported as the drawing process imports it (:func:`_import_for_drawing`)."""
    if background and hasattr(os, "fork") and "matplotlib" not in sys.modules:
        import threading

        if threading.active_count() == 1 and _cpu_free():
            return PngInBackground.fork()
    return PngInProcess(trimmed_import=ends_process and "matplotlib" not in sys.modules)


def _cpu_free() -> bool:
    """Whether a CPU is likely idle for a second process: at least two CPUs available to this
    one (``os.sched_getaffinity``) and the run queue's average over the last minute
    (``os.getloadavg``, this process included) below their number."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not reported here: assume a free CPU
        load = 0.0
    return cpus >= 2 and load < cpus


def _serve(jobs: int, results: int):  # pragma: no cover - runs in the forked process
    """The drawing process: import :data:`_WARM_MODULES`, read the call and make it, read
    the path and write the bytes there; an error is pickled to *results* with its
    traceback. Ends with :func:`os._exit` (never this process's exit handlers or buffers,
    which are its parent's): 0 when done or abandoned (the pipe closed early), 1 on an
    error."""
    import traceback

    code = 1
    try:
        err = None
        try:
            _import_for_drawing()
        except Exception as e:  # reported when the PNG is asked for, as drawing here would
            err = e
        job = _read_frame(jobs)
        if job is not None and err is None:
            try:
                fn, args, kwargs = pickle.loads(job)
                data = fn(*args, **kwargs)
            except Exception as e:
                err = e
        path = _read_frame(jobs) if job is not None else None
        if path is None:  # abandoned: write nothing
            code = 0
            return
        if err is None:
            try:
                atomic_write_bytes(pickle.loads(path), data)
                code = 0
                return
            except Exception as e:
                err = e
        tb = "".join(traceback.format_exception(err))
        try:
            payload = pickle.dumps((err, tb))
        except Exception:
            payload = pickle.dumps((RuntimeError(f"{type(err).__name__}: {err}"), tb))
        view = memoryview(payload)
        while view:
            view = view[os.write(results, view):]
    except BaseException:  # a KeyboardInterrupt, or the pipe gone: status 1, nothing more
        pass
    finally:
        os._exit(code)


def _import_for_drawing() -> None:
    """Import :data:`_WARM_MODULES` in the drawing process (or a process that ends after
    drawing, :func:`png_writer`), without the two parts of matplotlib's import that a
    drawing never uses (~0.1 s of its ~0.33 s of CPU):

    - the property lists of the ``set`` docstrings, which every ``Artist`` subclass builds
      when it is defined (``matplotlib.artist.kwdoc``, given an empty text while the
      modules load: this process shows no docstring);
    - the 3-D toolkit, which ``matplotlib.projections`` registers if it can import it
      (marked absent in ``sys.modules``; matplotlib then warns that 3-D axes are not
      available, which is silenced: these figures are 2-D).

    What is drawn, and its bytes, are the same (``tests/test_png_background.py``)."""
    import importlib
    import warnings

    import matplotlib.artist

    kwdoc = getattr(matplotlib.artist, "kwdoc", None)
    if kwdoc is not None:  # a matplotlib without it (other versions) is imported whole
        matplotlib.artist.kwdoc = lambda artist: ""
    try:
        sys.modules.setdefault("mpl_toolkits.mplot3d", None)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Unable to import Axes3D")
            for m in _WARM_MODULES:
                importlib.import_module(m)
    finally:
        if kwdoc is not None:
            matplotlib.artist.kwdoc = kwdoc


def _read_frame(fd: int) -> bytes | None:
    """One length-prefixed message from *fd*; None at end of file (the sender gave up)."""
    head = _read_exactly(fd, _FRAME.size)
    return None if head is None else _read_exactly(fd, _FRAME.unpack(head)[0])


def _read_exactly(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
