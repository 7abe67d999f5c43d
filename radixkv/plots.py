"""Figures with matplotlib (Agg backend: no display needed)."""
from __future__ import annotations

import io

from radixkv.util import atomic_write_bytes


def plot_curves(doc: dict, path, *, metric: str = "token_hit_rate", reference: dict | None = None) -> None:
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
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for c in doc["curves"]:
        pts = [p for p in c["points"] if metric in p]
        if not pts:
            continue
        ax.plot([p["capacity_tokens"] for p in pts], [p[metric] for p in pts], marker="o", label=c["policy"])
    if reference:
        ax.plot(reference["capacity_tokens"], reference["values"], "k^", linestyle="none", label=reference["label"])
    ax.set_xscale("log")
    ax.set_xlabel("KV pool capacity (tokens)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(doc["trace"].get("name") or doc["trace"].get("path", ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("metrics", {}).get(metric) is not None and _capacity_tokens(r) is not None]
    traces = sorted({r["trace"]["path"] for r in rows})
    skip = {"policy", "capacity_tokens", "num_gpu_blocks", "max_total_num_tokens", "gpu_memory_utilization",
            "mem_fraction_static"}
    varying = sorted({k for r in rows for k in r["settings"] if k not in skip
                      and len({repr(x["settings"].get(k)) for x in rows}) > 1})
    fig, axes = plt.subplots(1, max(1, len(traces)), figsize=(6.4 * max(1, len(traces)), 4.0), dpi=120,
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
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return lines
