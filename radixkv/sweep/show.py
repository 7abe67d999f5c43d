"""A sweep's results without pandas: which settings the grid swept, each cell's value of
a knob or metric, and the results as a plain-text table (``radixkv sweep-show DIR``).

Rows are :func:`radixkv.sweep.store.read_rows` rows. A setting the store omitted (left at
``radixkv replay``'s default) reads as that default, so every cell has every swept knob.
"""
from __future__ import annotations

from pathlib import Path

from radixkv.errors import InputError

#: the knob ``capacity_tokens`` stands for the pool's usable tokens, however the grid sized
#: the pool (``capacity_tokens``, ``num_gpu_blocks``, ``max_total_num_tokens`` or a memory
#: fraction with a model and a GPU)
POOL_KEYS = ("capacity_tokens", "num_gpu_blocks", "max_total_num_tokens", "gpu_memory_utilization",
             "mem_fraction_static")

#: the metrics ``sweep-show`` prints by default (the concurrent ones when a cell has them)
DEFAULT_METRICS = ("token_hit_rate", "hit_tokens", "evictions")
CONCURRENT_METRICS = ("ttft_p50_s", "ttft_p99_s")


def capacity_tokens(row: dict):
    """The pool's usable tokens of a sweep row (the replay's, else the pool rule's); None
    when the row does not say (the grid knob ``capacity_tokens`` of :func:`setting`, the
    x axis of :func:`radixkv.plots.plot_sweep`, the capacity of
    :func:`radixkv.html_report.sweep_doc`)."""
    m, pool = row.get("metrics", {}), row.get("pool", {})
    for v in (m.get("pool_capacity_tokens"), pool.get("capacity_tokens"), row.get("settings", {}).get("capacity_tokens")):
        if v is not None:
            return v
    if pool.get("max_total_num_tokens") is not None:
        return pool["max_total_num_tokens"]
    if pool.get("num_gpu_blocks") is not None:
        # a vLLM-engine policy sized in its own terms (a concurrent summary has no
        # pool_capacity_tokens): block 0 is the null block, each other block holds block_size
        # tokens (vllm/v1/core/block_pool.py, BlockPool.__init__)
        from radixkv.policies.registry import parse_policy

        size = parse_policy(row["settings"]["policy"]).size
        if size:
            return (int(pool["num_gpu_blocks"]) - 1) * int(size)
    return None


def setting(row: dict, key: str):
    """*row*'s value of the grid knob *key* (``radixkv replay``'s default when the store
    omitted it); ``capacity_tokens`` is the pool's usable tokens as the replay sized it.
    None (shown ``n/a``) for a knob only the concurrent replay reads (``max_num_seqs``,
    ``request_rate``, ...) in a sequential cell, which does not model it."""
    if key == "capacity_tokens":
        return capacity_tokens(row)
    s = row.get("settings", {})
    if key in s:
        return s[key]
    from radixkv.sweep.grid import concurrent_only_keys, omitted_value

    if s.get("mode", "sequential") != "concurrent" and key in concurrent_only_keys():
        return None

    return omitted_value(s, key)


def swept(rows: list[dict]) -> list[str]:
    """The grid knobs whose value differs between cells, sorted (``policy`` included;
    ``trace`` when the sweep has more than one trace)."""
    keys = sorted({k for r in rows for k in r.get("settings", {})})
    out = [k for k in keys if len({repr(setting(r, k)) for r in rows}) > 1]
    if len({r["trace"]["path"] for r in rows}) > 1:
        out.insert(0, "trace")
    return out


def metric_names(rows: list[dict]) -> list[str]:
    """Every numeric metric some cell holds (a value that is a number), sorted."""
    return sorted({k for r in rows for k, v in r.get("metrics", {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)})


def check_metric(rows: list[dict], metric: str) -> None:
    """Refuse a metric no cell has.

    Raises
    ------
    radixkv.errors.InputError
        Naming the metric and the ones the cells hold (``field`` = ``metric``).
    """
    names = metric_names(rows)
    if metric not in names:
        known = ", ".join(names) or "none"
        raise InputError(f"no cell of the sweep has the metric {metric!r} (a number); the cells have: {known}",
                         field="metric")


def table_rows(rows: list[dict], metrics=None) -> tuple[list[str], list[dict]]:
    """The columns and the records of ``sweep-show``: the trace (when several), the policy,
    every other swept knob, the pool's usable tokens, then *metrics* (default
    :data:`DEFAULT_METRICS`, and :data:`CONCURRENT_METRICS` when a cell has them).
    Records are sorted by those knobs (numbers as numbers), then by cell key.

    Raises
    ------
    radixkv.errors.InputError
        A metric of *metrics* that no cell has (:func:`check_metric`).
    """
    if metrics is None:
        metrics = [m for m in DEFAULT_METRICS + CONCURRENT_METRICS
                   if m in DEFAULT_METRICS or any(r["metrics"].get(m) is not None for r in rows)]
    else:
        for m in metrics:
            check_metric(rows, m)
    knobs = ["trace"] if "trace" in swept(rows) else []
    knobs += ["policy"] + [k for k in swept(rows) if k not in ("trace", "policy", "capacity_tokens")]
    cols = knobs + ["capacity_tokens"] + list(metrics) + ["key"]
    recs = []
    for r in rows:
        rec = {"key": r["key"]}
        for k in knobs:
            rec[k] = Path(r["trace"]["path"]).name if k == "trace" else setting(r, k)
        rec["capacity_tokens"] = setting(r, "capacity_tokens")
        for m in metrics:
            rec[m] = r["metrics"].get(m)
        recs.append(rec)

    def order(rec):
        return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in
                     (rec[k] for k in knobs + ["capacity_tokens"])) + (rec["key"],)

    return cols, sorted(recs, key=order)


def _fmt(v) -> str:
    """A metric's cell: floats to 4 decimals (no decimals from 1,000 up), else as
    :func:`radixkv.html_parts.format_value` shows it (``n/a``, thousands separators)."""
    from radixkv.html_parts import format_value

    if isinstance(v, float) and v == v:
        return f"{v:.4f}" if abs(v) < 1000 else f"{v:,.0f}"
    return format_value(v)


def _fmt_knob(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return _fmt(v)


def format_results(cols: list[str], recs: list[dict]) -> str:
    """The plain-text table of :func:`table_rows`: one line per cell, numbers right-aligned,
    ``n/a`` where a cell's mode does not model a metric; the metrics (the columns between
    ``capacity_tokens`` and ``key``) to 4 decimals, the knobs as set."""
    metrics = set(cols[cols.index("capacity_tokens") + 1: cols.index("key")])
    head = [("pool (tokens)" if c == "capacity_tokens" else c) for c in cols]
    body = [[_fmt(rec[c]) if c in metrics else _fmt_knob(rec[c]) for c in cols] for rec in recs]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    num = [all(isinstance(rec[c], (int, float)) or rec[c] is None for rec in recs) for c in cols]
    lines = ["  ".join(h.rjust(w) if n else h.ljust(w) for h, w, n in zip(head, widths, num)),
             "  ".join("-" * w for w in widths)]
    for cells in body:
        lines.append("  ".join(x.rjust(w) if n else x.ljust(w) for x, w, n in zip(cells, widths, num)))
    return "\n".join(ln.rstrip() for ln in lines)
