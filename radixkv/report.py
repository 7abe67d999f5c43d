"""Report tables: the plain-text metric table ``radixkv replay`` / ``compare`` print.

:func:`format_table` turns summaries (:func:`radixkv.summarize`) into one column per
policy and one row per metric; :data:`SEQUENTIAL_ROWS` and :data:`CONCURRENT_ROWS` are the
rows (metric key, label, format) of the two replay modes.
"""
from __future__ import annotations

__all__ = ["format_table", "metric_label", "SEQUENTIAL_ROWS", "CONCURRENT_ROWS", "MISS_ROWS", "WINDOW_ROWS"]

SEQUENTIAL_ROWS = [
    ("requests", "requests", "{:,}"),
    ("pool_capacity_tokens", "pool (tokens)", "{:,}"),
    ("pool_slots", "pool (slots)", "{:,}"),
    ("prompt_tokens", "prompt tokens", "{:,}"),
    ("hit_tokens", "hit tokens", "{:,}"),
    ("token_hit_rate", "token hit rate", "{:.4f}"),
    ("request_hit_rate", "request hit rate", "{:.4f}"),
    ("mean_request_hit_ratio", "mean per-request hit ratio", "{:.4f}"),
    ("hit_tokens_p50", "hit tokens p50", "{:,.0f}"),
    ("hit_tokens_p99", "hit tokens p99", "{:,.0f}"),
    ("alignment_loss_tokens", "alignment loss (tokens)", "{:,}"),
    ("alignment_loss_share", "alignment loss / prompt", "{:.4f}"),
    ("evicted_tokens", "evicted tokens", "{:,}"),
    ("evictions", "evictions", "{:,}"),
    ("cached_tokens_second_half_mean", "cached tokens (2nd half mean)", "{:,.0f}"),
    ("cached_tokens_share_of_pool", "cached tokens / pool tokens", "{:.4f}"),
    ("internal_fragmentation_share_mean", "internal fragmentation (mean; concurrent only)", "{:.4f}"),
    ("duplicate_share_mean", "duplication (mean)", "{:.4f}"),
    ("free_space_scatter_mean", "free-space scatter (mean)", "{:.4f}"),
    ("metadata_bytes_peak", "metadata bytes (peak)", "{:,}"),
    ("host_hit_rate", "host-tier hit rate (loaded back)", "{:.4f}"),
    ("gpu_to_host_tokens", "GPU→host tokens", "{:,}"),
    ("host_to_gpu_tokens", "host→GPU tokens", "{:,}"),
    ("gpu_to_host_bytes", "GPU→host bytes", "{:,}"),
    ("host_to_gpu_bytes", "host→GPU bytes", "{:,}"),
]


#: rows added when a summary has ``miss_causes`` (``--miss-causes``; radixkv/replay/misses.py);
#: a dotted key reads a nested value
MISS_ROWS = [
    ("miss_causes.share.hit", "prompt share: hit", "{:.4f}"),
    ("miss_causes.share.compulsory", "prompt share: compulsory miss", "{:.4f}"),
    ("miss_causes.share.capacity", "prompt share: capacity miss", "{:.4f}"),
    ("miss_causes.share.alignment", "prompt share: alignment miss", "{:.4f}"),
    ("miss_causes.share.last_token_cap", "prompt share: last-token cap", "{:.4f}"),
    ("miss_causes.share.not_cached", "prompt share: not cached by policy", "{:.4f}"),
    ("miss_causes.share.in_flight", "prompt share: in-flight (concurrent)", "{:.4f}"),
    ("miss_causes.share.preemption", "prompt share: preemption (concurrent)", "{:.4f}"),
    ("miss_causes.share.routing", "prompt share: routing (replicas)", "{:.4f}"),
    ("miss_causes.fix.capacity_tokens_to_halve", "pool halving capacity misses (tokens)", "{:,}"),
    ("miss_causes.fix.smaller_size", "next smaller block/page size", "{:,}"),
    ("miss_causes.fix.hit_tokens_gained_at_smaller_size", "hit tokens gained at that size (< 0: lost)", "{:+,}"),
]


#: rows added when a summary has a measurement window (``--measure-last``,
#: :func:`radixkv.metrics.window_summary`)
WINDOW_ROWS = [
    ("measure_window.measure_last", "window: last share of requests", "{:.4g}"),
    ("measure_window.requests", "window: requests", "{:,}"),
    ("measure_window.token_hit_rate", "window: token hit rate", "{:.4f}"),
    ("measure_window.request_hit_rate", "window: request hit rate", "{:.4f}"),
    ("measure_window.mean_request_hit_ratio", "window: mean per-request hit ratio", "{:.4f}"),
]


def _get(summary: dict, key: str):
    """``summary[key]``, reading ``a.b.c`` as nested keys; None when missing."""
    v = summary
    for part in key.split("."):
        if not isinstance(v, dict):
            return None
        v = v.get(part)
    return v


CONCURRENT_ROWS = [
    ("requests", "requests", "{:,}"),
    ("token_hit_rate", "token hit rate (first admissions)", "{:.4f}"),
    ("concurrency_mean", "effective concurrency (mean)", "{:.2f}"),
    ("concurrency_peak", "effective concurrency (peak)", "{:,}"),
    ("ttft_p50_s", "TTFT p50 (s)", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.3f}"),
    ("tpot_p50_s", "TPOT p50 (s)", "{:.4f}"),
    ("e2e_p50_s", "end-to-end p50 (s)", "{:.3f}"),
    ("queue_p50_s", "queueing delay p50 (s)", "{:.3f}"),
    ("throughput_total_tokens_per_s", "throughput, prompt+output (tok/s)", "{:,.0f}"),
    ("throughput_output_tokens_per_s", "throughput, output (tok/s)", "{:,.0f}"),
    ("preemptions", "preemptions", "{:,}"),
    ("recomputed_tokens", "recomputed tokens", "{:,}"),
    ("prefill_flops_saved", "prefill FLOPs saved", "{:.3e}"),
    ("pool_used_share_mean", "pool held by running requests (mean)", "{:.4f}"),
    ("pool_cached_share_mean", "pool held by evictable cache (mean)", "{:.4f}"),
    ("internal_fragmentation_share_mean", "internal fragmentation (mean)", "{:.5f}"),
    ("duration_s", "simulated duration (s)", "{:,.1f}"),
]


#: rows added when a summary has an L3 storage tier (``storage_backend``; docs/hicache.md)
STORAGE_ROWS = [
    ("storage_hit_rate", "storage-tier hit rate (prefetched)", "{:.4f}"),
    ("storage_to_host_tokens", "storage→host tokens", "{:,}"),
    ("host_to_storage_tokens", "host→storage tokens", "{:,}"),
    ("storage_to_host_bytes", "storage→host bytes", "{:,}"),
    ("host_to_storage_bytes", "host→storage bytes", "{:,}"),
    ("storage_evicted_tokens", "storage evicted tokens", "{:,}"),
]


#: rows added to a concurrent table when a summary has a host-memory tier (``host_load_s``)
HOST_CONCURRENT_ROWS = [
    ("host_hit_rate", "host-tier hit rate (loaded back)", "{:.4f}"),
    ("host_to_gpu_tokens", "host→GPU tokens", "{:,}"),
    ("gpu_to_host_tokens", "GPU→host tokens", "{:,}"),
    ("host_load_s", "host→GPU copy time (s, summed)", "{:.3f}"),
]


def metric_label(key: str, *, concurrent: bool = False) -> str:
    """The human label of a summary metric: the label of its row in the tables above (the
    concurrent table's first when *concurrent*), else the key in words (``_`` as spaces, a
    ``_s`` suffix as ``(s)``, ``_tokens`` as ``(tokens)``)."""
    specs = ((CONCURRENT_ROWS, HOST_CONCURRENT_ROWS) if concurrent else ()) + (
        SEQUENTIAL_ROWS, WINDOW_ROWS, MISS_ROWS, CONCURRENT_ROWS, HOST_CONCURRENT_ROWS, STORAGE_ROWS)
    for spec in specs:
        for k, label, _ in spec:
            if k == key:
                return label
    words = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "end-to-end", "flops": "FLOPs", "kv": "KV", "gpu": "GPU"}
    unit = ""
    for suffix, u in (("_s", "s"), ("_tokens", "tokens"), ("_bytes", "bytes")):
        if key.endswith(suffix) and len(key) > len(suffix):
            key, unit = key[: -len(suffix)], f" ({u})"
            break
    return " ".join(words.get(w, w) for w in key.split("_")) + unit


def _fmt(fmt, v):
    if v is None or (isinstance(v, float) and v != v):
        return "n/a"
    return fmt.format(v)


def steps_text(sc: dict, *, grouped: bool = True) -> str:
    """One concurrent replay's ``scheduler`` object
    (:func:`radixkv.replay.conc_result.scheduler_record`) as text: the rule,
    ``max_num_batched_tokens`` (tokens per step), ``max_num_seqs`` (running requests) and
    where they came from; *grouped*: thousands separated by commas (the text output; the
    HTML report's provenance row prints plain integers)."""
    f = "{:,}" if grouped else "{}"
    return (f"{sc.get('rule')} rules, max_num_batched_tokens {f.format(sc.get('max_num_batched_tokens'))}, "
            f"max_num_seqs {f.format(sc.get('max_num_seqs'))} ({sc.get('source')})")


def steps_lines(summaries) -> list[str]:
    """The ``steps:`` lines of a concurrent replay's text output (:func:`steps_text` of each
    summary with a ``scheduler`` object, as the JSON gives it). One line when every summary
    has the same, else one per policy; none for sequential summaries."""
    rows = [(s.get("policy"), steps_text(s["scheduler"])) for s in summaries if isinstance(s.get("scheduler"), dict)]
    if not rows:
        return []
    if len({t for _, t in rows}) == 1:
        return [f"steps: {rows[0][1]}"]
    return [f"steps, {p}: {t}" for p, t in rows]


def format_table(summaries: list[dict], timing: bool = True, rows_spec=None) -> str:
    """A plain-text table: one row per metric, one column per policy.

    Parameters
    ----------
    summaries : list of dict
        Summaries with a ``"policy"`` label (:func:`radixkv.summarize`, or a CLI result),
        and, for the timing rows, ``"timing_s"`` (``replay`` seconds,
        ``prompt_tokens_per_s``; the CLI's results have it, :func:`radixkv.summarize`'s
        do not: a summary is deterministic, a timing is not).
    timing : bool
        Add the replay-time rows when a summary has ``timing_s`` (``n/a`` for one without).
    rows_spec : list of (key, label, format) or None
        The metric rows; default :data:`SEQUENTIAL_ROWS` (:data:`CONCURRENT_ROWS` for a
        concurrent replay's summary). A metric that is missing, None or NaN prints "n/a".
        :data:`WINDOW_ROWS` follow when a summary has ``measure_window``, then
        :data:`MISS_ROWS` when one has ``miss_causes``.

    Returns
    -------
    str
        Lines joined by newlines; labels left-aligned, values right-aligned.
    """
    head = ["metric"] + [s["policy"] for s in summaries]
    rows = [head]
    spec = list(rows_spec or SEQUENTIAL_ROWS)
    if any("measure_window" in s for s in summaries):
        spec += WINDOW_ROWS
    if any("miss_causes" in s for s in summaries):
        spec += [r for r in MISS_ROWS if not r[0].startswith("miss_causes.fix.")
                 or any(_get(s, "miss_causes.fix") for s in summaries)]
    if any("host_load_s" in s for s in summaries):
        spec += HOST_CONCURRENT_ROWS
    if any(s.get("storage_backend") is not None for s in summaries):
        spec += STORAGE_ROWS
    for key, label, fmt in spec:
        rows.append([label] + [_fmt(fmt, _get(s, key)) for s in summaries])
    if timing and any("timing_s" in s for s in summaries):
        rows.append(["replay time (s)"] + [_fmt("{:.3f}", _get(s, "timing_s.replay")) for s in summaries])
        rows.append(["prompt tokens/s"] + [_fmt("{:,.0f}", _get(s, "timing_s.prompt_tokens_per_s")) for s in summaries])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
