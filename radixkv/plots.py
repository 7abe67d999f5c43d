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
