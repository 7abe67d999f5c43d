"""Replay results broken down by a request attribute (``--by tenant|type|turn|lora|...``),
and the price of cache isolation.

Pure functions of a trace's attribute columns and a replay's per-request columns
(:class:`radixkv.records.Records` or
:class:`radixkv.replay.concurrent.ConcurrentResult`, rows in the trace's replay order).
Per group: requests, prompt tokens, hit tokens, token hit rate (Σ hit / Σ prompt, as the
run's own), the miss causes when the replay computed them (docs/miss-causes.md) and TTFT
(mean, p50, p99: numpy's linear interpolation, as the run's summary) in the concurrent mode.
A quantity the replay did not compute is None (n/a), never 0.
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError

#: ``--by`` name → Trace column
BY_ATTRIBUTES = {"tenant": "tenant", "type": "req_type", "turn": "turn", "lora": "lora",
                 "cache_salt": "cache_salt", "session": "session_id", "priority": "priority"}
_NUMERIC = ("turn", "priority")


def group_labels(trace, by: str, n: int | None = None) -> np.ndarray:
    """The group of each of the first *n* requests of *trace* (replay order) under
    attribute *by* (a key of :data:`BY_ATTRIBUTES`): a str array of shape (n,).

    Raises
    ------
    radixkv.errors.ConfigError
        An unknown attribute, or a trace without that column (naming the trace).
    """
    if by not in BY_ATTRIBUTES:
        raise ConfigError(f"--by takes one of {', '.join(BY_ATTRIBUTES)}, got {by!r}", field="by")
    col = getattr(trace, BY_ATTRIBUTES[by])
    if col is None:
        raise ConfigError(f"the trace gives no {by} (field {'type' if by == 'type' else BY_ATTRIBUTES[by]!r}) "
                          f"to break the results down by", path=trace.name or None, field="by")
    n = len(trace) if n is None else n
    return np.asarray(col[:n]).astype(str)


def breakdown(trace, columns: dict, by: str) -> dict:
    """Per-group totals of a replay (module docstring).

    Parameters
    ----------
    trace : radixkv.trace.types.Trace
        The replayed trace (its first ``len(columns["prompt_tokens"])`` requests were replayed).
    columns : dict of np.ndarray, shape (n,) each
        ``prompt_tokens``, ``hit_tokens`` (int64, tokens); optionally ``miss_*_tokens``
        (int64) and ``ttft_s`` (float64, s; NaN where undefined).
    by : str
        A key of :data:`BY_ATTRIBUTES`.

    Returns
    -------
    dict
        ``{"attribute": by, "groups": [row, ...]}``, rows in group order (numeric for
        ``turn`` / ``priority``, else lexicographic; '' is shown as ``(none)``); each row has
        ``group``, ``requests``, ``prompt_tokens``, ``hit_tokens``, ``token_hit_rate``,
        ``miss_causes`` (cause → tokens, or None without ``--miss-causes``), ``ttft_mean_s``,
        ``ttft_p50_s``, ``ttft_p99_s`` (None outside the concurrent mode).
    """
    prompt = np.asarray(columns["prompt_tokens"], dtype=np.int64)
    n = len(prompt)
    labels = group_labels(trace, by, n)
    hit = np.asarray(columns["hit_tokens"], dtype=np.int64)
    causes = [c for c in columns if c.startswith("miss_") and c.endswith("_tokens")]
    ttft = columns.get("ttft_s")
    keys = np.unique(labels)
    if by in _NUMERIC:
        keys = sorted(keys.tolist(), key=int)
    rows = []
    for g in keys:
        m = labels == g
        p, h = int(prompt[m].sum()), int(hit[m].sum())
        row = {"group": str(g) if g != "" else "(none)", "requests": int(m.sum()), "prompt_tokens": p,
               "hit_tokens": h, "token_hit_rate": h / p if p else None,
               "miss_causes": {c[5:-7]: int(np.asarray(columns[c])[m].sum()) for c in causes} if causes else None}
        t = None if ttft is None else np.asarray(ttft, dtype=np.float64)[m]
        t = None if t is None else t[~np.isnan(t)]
        row["ttft_mean_s"] = float(t.mean()) if t is not None and t.size else None
        row["ttft_p50_s"] = float(np.percentile(t, 50)) if t is not None and t.size else None
        row["ttft_p99_s"] = float(np.percentile(t, 99)) if t is not None and t.size else None
        rows.append(row)
    return {"attribute": by, "groups": rows}


def isolation_price(isolated: dict, shared: dict, trace=None, by: str | None = None) -> dict:
    """Hits lost to cache isolation: the same trace replayed with its salts (*isolated*)
    and without (*shared*), both per-request column dicts as :func:`breakdown` takes.

    Returns
    -------
    dict
        ``hit_tokens_isolated``, ``hit_tokens_shared``, ``hit_tokens_lost`` (shared −
        isolated), ``token_hit_rate_isolated`` / ``_shared``, and with *by* a ``groups``
        list of the same per group.
    """
    def one(iso_cols, sh_cols, mask=None):
        m = slice(None) if mask is None else mask
        p = int(np.asarray(iso_cols["prompt_tokens"])[m].sum())
        hi = int(np.asarray(iso_cols["hit_tokens"])[m].sum())
        hs = int(np.asarray(sh_cols["hit_tokens"])[m].sum())
        return {"prompt_tokens": p, "hit_tokens_isolated": hi, "hit_tokens_shared": hs, "hit_tokens_lost": hs - hi,
                "token_hit_rate_isolated": hi / p if p else None, "token_hit_rate_shared": hs / p if p else None}

    out = one(isolated, shared)
    if by is not None:
        labels = group_labels(trace, by, len(isolated["prompt_tokens"]))
        keys = np.unique(labels)
        if by in _NUMERIC:
            keys = sorted(keys.tolist(), key=int)
        out["groups"] = [{"group": str(g) if g != "" else "(none)", **one(isolated, shared, labels == g)}
                         for g in keys]
    return out


def format_breakdown(label: str, bd: dict) -> str:
    """A plain-text table of :func:`breakdown`'s answer for one policy (*label*); n/a for
    a quantity the replay did not compute."""
    rows = bd["groups"]
    causes = list(rows[0]["miss_causes"]) if rows and rows[0]["miss_causes"] else []
    head = [bd["attribute"], "requests", "prompt tokens", "hit tokens", "hit rate"] + [f"miss {c}" for c in causes]
    head += ["TTFT mean s", "TTFT p50 s", "TTFT p99 s"]

    def f(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    body = []
    for r in rows:
        line = [r["group"], f(r["requests"], ","), f(r["prompt_tokens"], ","), f(r["hit_tokens"], ","),
                f(r["token_hit_rate"], ".4f")] + [f(r["miss_causes"][c], ",") for c in causes]
        line += [f(r["ttft_mean_s"], ".4f"), f(r["ttft_p50_s"], ".4f"), f(r["ttft_p99_s"], ".4f")]
        body.append(line)
    return _table(f"{label}: by {bd['attribute']}", head, body)


def format_isolation_price(label: str, price: dict, mode: str) -> str:
    """A plain-text table of :func:`isolation_price`'s answer for one policy."""
    head = ["group", "prompt tokens", "hits isolated", "hits shared", "hits lost", "rate isolated", "rate shared"]

    def line(g, r):
        rate = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
        return [g, f"{r['prompt_tokens']:,}", f"{r['hit_tokens_isolated']:,}", f"{r['hit_tokens_shared']:,}",
                f"{r['hit_tokens_lost']:,}", rate(r["token_hit_rate_isolated"]), rate(r["token_hit_rate_shared"])]

    body = [line("all", price)] + [line(r["group"], r) for r in price.get("groups", [])]
    return _table(f"{label}: price of isolation (salt = {mode}) against no salt", head, body)


def _table(title, head, body) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = lambda row: "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w)  # noqa: E731
                                for i, (x, w) in enumerate(zip(row, widths)))
    return "\n".join([title, fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in body])
