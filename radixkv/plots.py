"""Figures with matplotlib (Agg backend: no display needed)."""
from __future__ import annotations

import io

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
    """Hit rate against capacity (log x), one line per policy, written atomically as PNG.

    Parameters
    ----------
    doc : dict
        ``{"trace": {...}, "curves": [{"policy": str, "points": [{"capacity_tokens": int,
        metric: float}, ...]}, ...]}`` as ``radixkv curve`` writes it.
    path : str or Path
        The PNG to write.
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    atomic_write_bytes(path, buf.getvalue())


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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    atomic_write_bytes(path, buf.getvalue())
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    atomic_write_bytes(path, buf.getvalue())
