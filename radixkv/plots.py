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
                x: str = "capacity_tokens") -> None:
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
    """
    fig, ax = _subplots(figsize=(6.4, 4.0), dpi=120)
    for c in doc["curves"]:
        pts = [p for p in c["points"] if metric in p]
        if not pts:
            continue
        label = c["policy"] + (" (GPU + host as one pool)" if c.get("tiers") == 1 else "")
        ax.plot([p[x] for p in pts], [p[metric] for p in pts], marker="o", label=label)
    if reference:
        ax.plot(reference["capacity_tokens"], reference["values"], "k^", linestyle="none", label=reference["label"])
    if x == "capacity_tokens":
        ax.set_xscale("log")
        ax.set_xlabel("KV pool capacity (tokens)")
    else:
        gpu = next((c.get("gpu_capacity_tokens") for c in doc["curves"]), None)
        ax.set_xlabel(f"host KV pool (tokens), GPU pool {gpu:,} tokens" if gpu else "host KV pool (tokens)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(doc["trace"].get("name") or doc["trace"].get("path", ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    atomic_write_bytes(path, buf.getvalue())


def _capacity_tokens(row: dict):
    """The pool's usable tokens of a sweep row (the replay's, else the pool rule's)."""
    m, pool = row.get("metrics", {}), row.get("pool", {})
    for v in (m.get("pool_capacity_tokens"), pool.get("capacity_tokens"), row.get("settings", {}).get("capacity_tokens")):
        if v is not None:
            return v
    if pool.get("max_total_num_tokens") is not None:
        return pool["max_total_num_tokens"]
    return None


def plot_sweep(rows: list[dict], path, *, metric: str = "token_hit_rate") -> int:
    """Hit rate against pool capacity (log x) from a sweep's rows, written atomically as PNG.

    One panel per trace; one line per policy — and per value of any other setting that
    varies in the sweep (the line's label names it). Cells without *metric* (a mode that
    does not model it) are left out.

    Parameters
    ----------
    rows : list of dict
        :func:`radixkv.sweep.read_rows` rows.
    path : str or Path
        The PNG to write.
    metric : str
        A summary metric (``token_hit_rate``, ``mean_request_hit_ratio``, ...).

    Returns
    -------
    int
        Lines drawn.
    """
    rows = [r for r in rows if r.get("metrics", {}).get(metric) is not None and _capacity_tokens(r) is not None]
    traces = sorted({r["trace"]["path"] for r in rows})
    skip = {"policy", "capacity_tokens", "num_gpu_blocks", "max_total_num_tokens", "gpu_memory_utilization",
            "mem_fraction_static"}
    varying = sorted({k for r in rows for k in r["settings"] if k not in skip
                      and len({repr(x["settings"].get(k)) for x in rows}) > 1})
    fig, axes = _subplots(1, max(1, len(traces)), figsize=(6.4 * max(1, len(traces)), 4.0), dpi=120,
                             squeeze=False)
    lines = 0
    for ax, tr in zip(axes[0], traces or [""]):
        groups: dict = {}
        for r in rows:
            if r["trace"]["path"] != tr:
                continue
            label = " ".join([r["settings"]["policy"]] + [f"{k}={r['settings'][k]}" for k in varying
                                                           if k in r["settings"]])
            groups.setdefault(label, []).append((_capacity_tokens(r), r["metrics"][metric]))
        for label in sorted(groups):
            pts = sorted(groups[label])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            lines += 1
        ax.set_xscale("log")
        ax.set_xlabel("KV pool capacity (tokens)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(tr, fontsize=9)
        if groups:
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
        ``miss_causes`` as a summary holds it (:func:`radixkv.replay.misses.summarize_causes`):
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
