"""A self-contained static HTML report of replay results (``radixkv report``, ``--report``).

One page, no network, no script: a short headline table first (token hit rate, hit tokens,
evictions, and TTFT p50/p99 when a result is concurrent; one column per result), then the
summary tables (every scalar of every summary, so the page holds the JSON's numbers; rows
labelled in words as the text tables label them, the key on hover; ``n/a`` where a metric
is ``null``, and the rows that are n/a in every column folded into a ``<details>``
element), the figures as inline PNG from matplotlib (Agg) and the run's provenance. A
timeline or per-request CSV is named in the figures by the policy of the JSON result whose
rows it holds (:func:`name_tables`), else by its file name. Figures, each drawn when its inputs are
present and otherwise named with what would draw it:

=============================  ==========================================================
hit rate vs capacity           ``radixkv curve`` JSON (``curves``)
hit-length histogram           a sequential summary's ``hit_length_histogram``
alignment loss by block/page   every sequential summary's ``alignment_loss_share``
pool split over time           a concurrent replay's timeline (``--timeline`` CSV or
                               ``replay --mode concurrent --report``): running / cached /
                               free slots after each engine step
evictions over time            per-request ``evicted_tokens`` (``--per-request`` CSV or
                               ``replay --report``), cumulative, against request order
                               (sequential) or admission time (concurrent)
hit vs prompt length           per-request ``prompt_tokens`` and ``hit_tokens``
=============================  ==========================================================

A plan's JSON (``radixkv plan --json``, or ``radixkv plan --report`` directly) gets a
section of its own first (:mod:`radixkv.plan.html`): the recommendation, the runner-ups
and the next cheaper point, the engine's command line, the prefix-caching verdict, the
sensitivity, the search's counts and the Pareto plot (cost vs TTFT p99), with overloaded
points flagged and never shown as a latency. A page of plans alone has no replay figures.

Inputs are plain data: JSON documents as ``replay``/``compare``/``curve``/``plan`` write them, and
named column tables (``{"label": str, "columns": {name: 1-D array}}``) for timelines and
per-request rows. Same inputs, same bytes out (PNG metadata without software or date).
"""
from __future__ import annotations

import hashlib
import html
import io
from pathlib import Path

import numpy as np

from radixkv.html_parts import cell as _cell
from radixkv.html_parts import format_value  # noqa: F401  (importable from here, as before)
from radixkv.html_parts import png as _png

#: the figures in page order: (id, title)
FIGURES = (
    ("hit-rate-vs-capacity", "Hit rate vs KV pool capacity"),
    ("hit-length-histogram", "Hit-length histogram"),
    ("alignment-loss", "Alignment loss by block / page size"),
    ("pool-split", "Pool split over time (running / cached / free)"),
    ("evictions", "Evictions over time"),
    ("hit-vs-prompt", "Per-request hit vs prompt length"),
    ("miss-causes", "Prompt tokens by miss cause"),
)

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:1.5em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.2em .5em}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.na{color:#888;text-align:right}th{background:#f3f3f3}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
p.missing{color:#777;font-style:italic}code{background:#f5f5f5;padding:0 .2em}
table.headline{font-size:1em}table.headline td{min-width:6em}
th.metric{text-align:left;font-weight:normal}details{margin:.5em 0 1em}summary{cursor:pointer;color:#555}
p.overload,td.overload{color:#a00}td.overload{text-align:right}p.verdict{font-size:1.05em}
pre{background:#f5f5f5;padding:.4em;white-space:pre-wrap}
"""


# ---------------------------------------------------------------------- reading inputs
_RESULT_FILES = ("a radixkv result: the JSON of replay/compare/curve/plan --json, a --timeline or a --per-request "
                 "CSV")


def _refuse_json_lines(text: str, path: Path) -> None:
    """Raise a clear :class:`~radixkv.errors.InputError` when *text*, which is not one JSON
    document, is JSON Lines (its first two non-blank lines each a JSON object): a trace
    (naming its format, :func:`radixkv.trace.detect.detect_format`) or another JSONL
    file, not a result. Return otherwise (the caller raises the JSON error)."""
    import json

    from radixkv.errors import InputError

    lines = [ln for ln in text.splitlines() if ln.strip()][:2]
    try:
        if len(lines) < 2 or not all(isinstance(json.loads(ln), dict) for ln in lines):
            return
    except ValueError:
        return
    try:
        from radixkv.trace.detect import detect_format

        what = (f"a {detect_format(path)} trace (JSON Lines, one request per line)",
                "; replay it with `radixkv replay TRACE --policy ... --json OUT.json` and report OUT.json")
    except InputError:
        what = ("JSON Lines (one JSON object per line)", "")
    raise InputError(f"is {what[0]}, not {_RESULT_FILES}{what[1]}", path=path, field="results")


def read_input(path) -> dict:
    """One report input from *path*: a JSON document (``{"kind": "json", "doc": ...}``) or
    a CSV table (``{"kind": "timeline" | "per_request", "label", "columns"}``; kind by the
    header: a timeline starts ``step,time_s``, a per-request CSV has ``id`` first and a
    ``prompt_tokens`` column).

    Raises
    ------
    radixkv.errors.InputError
        Unreadable file, invalid JSON (naming line and column), or a CSV of another shape.
    """

    from radixkv.errors import InputError

    from radixkv import validate

    p = Path(path)
    try:
        text = validate.read_text(p)  # not UTF-8: an InputError naming the line
    except OSError as e:
        raise InputError(f"cannot read: {getattr(e, 'strerror', None) or e}", path=p) from None
    if p.suffix.lower() == ".csv" or not text.lstrip().startswith("{"):
        import csv

        rows = [r for r in csv.reader(io.StringIO(text)) if r]
        if not rows:
            raise InputError("empty file", path=p)
        head = rows[0]
        if head[:2] == ["step", "time_s"]:
            kind = "timeline"
        elif head[0] == "id" and "prompt_tokens" in head:
            kind = "per_request"
        else:
            raise InputError("not a radixkv result: expected JSON, a --timeline CSV (step,time_s,...) or a "
                             "--per-request CSV (id,...,prompt_tokens,...)", path=p, line=1)
        cols = {h: [] for h in head}
        for ln, cells in enumerate(rows[1:], 2):
            if len(cells) != len(head):
                raise InputError(f"{len(cells)} cells, expected {len(head)}", path=p, line=ln)
            for h, c in zip(head, cells):
                cols[h].append(c)
        out = {}
        for h, v in cols.items():
            if h == "id":
                continue
            try:
                # an empty cell is n/a (not sampled / not modelled): NaN, never 0
                out[h] = np.asarray([float(x) if x != "" else np.nan for x in v], dtype=np.float64)
            except ValueError:
                raise InputError("a cell is not a number", path=p, field=h) from None
        return {"kind": kind, "label": p.stem, "columns": out}
    from radixkv import validate

    try:
        doc = validate.loads(text, path=p)
    except InputError:
        _refuse_json_lines(text, p)
        raise
    from radixkv.plan.html import is_plan_doc

    if is_plan_doc(doc):
        _check_plan_doc(doc, text, p)
        return {"kind": "plan", "doc": doc, "label": p.name}
    if not isinstance(doc, dict) or not ("results" in doc or "curves" in doc):
        raise InputError("not a radixkv result: a JSON object with 'results' (replay/compare), "
                         "'curves' (curve) or 'recommendation' (plan)", path=p)
    _check_doc(doc, text, p)
    return {"kind": "json", "doc": doc, "label": p.name}


def _check_doc(doc: dict, text: str, p) -> None:
    """The fields of a result document the report reads, checked (:mod:`radixkv.validate`):
    ``trace`` a table; ``results`` a list of tables, each with a ``policy`` string, a
    ``summary`` and ``pool`` table when given, a ``hit_length_histogram`` of equal-length
    number lists; ``curves`` a list of tables with ``policy`` and ``points`` (tables with a
    whole-number ``capacity_tokens`` and a ``token_hit_rate`` number or null)."""
    from radixkv import validate
    from radixkv.errors import InputError

    def where(*keys, field):
        return dict(path=p, line=validate.line_of(text, *keys), field=field)

    def listed(v, *keys, field):
        if not isinstance(v, list):
            raise InputError(f"must be a list, got {type(v).__name__}", **where(*keys, field=field))
        return v

    if "trace" in doc:
        validate.table(doc["trace"], **where("trace", field="trace"))
    for i, r in enumerate(listed(doc.get("results", []), "results", field="results")):
        f = f"results[{i}]"
        validate.table(r, what="a result (a JSON object with policy)", **where("results", field=f))
        if not isinstance(r.get("policy"), str):
            raise InputError("missing or not a string: every result names its policy", **where("results", field=f"{f}.policy"))
        if r.get("trace") is not None and not isinstance(r["trace"], str):
            raise InputError("must be a trace name (a string)", **where("results", field=f"{f}.trace"))
        for k in ("summary", "pool"):
            if k in r:
                validate.table(r[k], **where("results", k, field=f"{f}.{k}"))
        summ = r.get("summary", r)
        h = summ.get("hit_length_histogram")
        if h:
            hf = f"{f}.hit_length_histogram"
            validate.table(h, **where("results", "hit_length_histogram", field=hf))
            for k in ("edges_tokens", "counts"):
                for v in listed(h.get(k), "hit_length_histogram", field=f"{hf}.{k}"):
                    validate.number(v, **where("hit_length_histogram", k, field=f"{hf}.{k}"))
            if len(h["edges_tokens"]) != len(h["counts"]):
                raise InputError("edges_tokens and counts differ in length", **where("hit_length_histogram", field=hf))
        for k in ("alignment_loss_share", "token_hit_rate"):
            if k in summ:
                validate.number(summ[k], null=True, **where("results", k, field=f"{f}.{k}"))
        if "miss_causes" in summ and summ["miss_causes"] is not None:
            validate.table(summ["miss_causes"], **where("results", "miss_causes", field=f"{f}.miss_causes"))
    for i, c in enumerate(listed(doc.get("curves", []), "curves", field="curves")):
        f = f"curves[{i}]"
        validate.table(c, what="a curve (a JSON object with policy and points)", **where("curves", field=f))
        if not isinstance(c.get("policy"), str):
            raise InputError("missing or not a string: every curve names its policy", **where("curves", field=f"{f}.policy"))
        for j, pt in enumerate(listed(c.get("points"), "curves", "points", field=f"{f}.points")):
            pf = f"{f}.points[{j}]"
            validate.table(pt, **where("curves", "points", field=pf))
            validate.number(pt.get("capacity_tokens"), integer=True, minimum=0,
                            **where("curves", "points", "capacity_tokens", field=f"{pf}.capacity_tokens"))
            if "token_hit_rate" in pt:
                validate.number(pt["token_hit_rate"], null=True,
                                **where("curves", "points", "token_hit_rate", field=f"{pf}.token_hit_rate"))


def _check_plan_doc(doc: dict, text: str, p) -> None:
    """The fields of a plan's document (``radixkv plan --json``) the report reads, checked:
    ``recommendation`` a table with a ``point`` table, ``cost_per_hour`` and the command
    strings; ``runner_ups``, ``sensitivity`` and ``points`` lists of such tables;
    ``slo``, ``search`` and ``prefix_caching`` tables."""
    from radixkv import validate
    from radixkv.errors import InputError

    def where(*keys, field):
        return dict(path=p, line=validate.line_of(text, *keys), field=field)

    def outcome(o, key, field):
        validate.table(o, what="a plan point (a JSON object with point and cost_per_hour)", **where(key, field=field))
        validate.table(o.get("point"), **where(key, "point", field=f"{field}.point"))
        validate.number(o.get("cost_per_hour"), **where(key, "cost_per_hour", field=f"{field}.cost_per_hour"))
        for k in ("replayed", "meets_slo"):
            if not isinstance(o.get(k), bool):
                raise InputError("missing or not true/false", **where(key, k, field=f"{field}.{k}"))

    for k in ("slo", "search", "prefix_caching"):
        validate.table(doc[k], **where(k, field=k))
    outcome(doc["recommendation"], "recommendation", "recommendation")
    for k in ("engine_command", "replay_command"):
        if not isinstance(doc["recommendation"].get(k), str):
            raise InputError("missing or not a string", **where("recommendation", k, field=f"recommendation.{k}"))
    for key in ("runner_ups", "sensitivity", "points"):
        v = doc.get(key) or []
        if not isinstance(v, list):
            raise InputError(f"must be a list, got {type(v).__name__}", **where(key, field=key))
        for i, o in enumerate(v):
            outcome(o, key, f"{key}[{i}]")
    if doc.get("next_cheaper") is not None:
        outcome(doc["next_cheaper"], "next_cheaper", "next_cheaper")


# ---------------------------------------------------------------------- figures
def _fig(w=6.4, h=3.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(w, h), dpi=110)


def _label(r) -> str:
    """A result's column label: its policy, after its trace when it names one (check)."""
    return f"{r['trace']}: {r['policy']}" if r.get("trace") else str(r["policy"])


def _summary(r) -> dict:
    """A result's metrics: ``summary`` (replay/compare) or its own fields (check, sweep)."""
    if "summary" in r:
        return r["summary"]
    return {k: v for k, v in r.items() if k not in ("trace", "policy")}


def _results(docs):
    """(label, summary) of every replay/compare/check result, in input order."""
    for d in docs:
        for r in d.get("results", []):
            yield _label(r), _summary(r)


def _concurrent(summary) -> bool:
    """A concurrent replay's summary (it has TTFT)."""
    return "ttft_p50_s" in summary


def _run_label(r) -> str:
    """A result's label across documents: its policy, with ``(concurrent)`` for a concurrent
    replay (so that a sequential and a concurrent replay of one policy read apart)."""
    return _label(r) + (" (concurrent)" if _concurrent(_summary(r)) else "")


def _same_run(table, summary) -> bool:
    """Whether a CSV table holds the rows of the replay *summary* describes: a per-request
    table has its request count and sums to its prompt and hit tokens; a timeline has one
    row per engine step and ends at its duration."""
    c = table["columns"]
    if table["kind"] == "per_request":
        if not {"prompt_tokens", "hit_tokens"} <= set(c) or summary.get("requests") != len(c["prompt_tokens"]):
            return False
        return (summary.get("prompt_tokens") == int(np.nansum(c["prompt_tokens"]))
                and summary.get("hit_tokens") == int(np.nansum(c["hit_tokens"])))
    if "time_s" not in c or not len(c["time_s"]) or summary.get("steps") != len(c["time_s"]):
        return False
    return summary.get("duration_s") is not None and abs(float(c["time_s"][-1]) - summary["duration_s"]) <= 1e-9 * max(
        1.0, abs(summary["duration_s"]))


def name_tables(docs, tables) -> list[dict]:
    """*tables* with each CSV table labelled by the policy of the one JSON result it is the
    rows of (:func:`_same_run`; ``vllm:16 (concurrent)``), so that figure legends name the
    policy, not the file; a table that matches no result, or several of different labels,
    keeps its label (the file's name)."""
    res = [r for d in docs for r in d.get("results", [])]
    out = []
    for t in tables:
        labels = {_run_label(r) for r in res if _same_run(t, _summary(r))}
        out.append(dict(t, label=labels.pop()) if len(labels) == 1 else t)
    return out


def _fig_curve(docs, tables):
    curves = [c for d in docs for c in d.get("curves", [])]
    if not curves:
        return None
    fig, ax = _fig()
    for c in curves:
        pts = [p for p in c["points"] if "token_hit_rate" in p]
        ax.plot([p["capacity_tokens"] for p in pts], [p["token_hit_rate"] for p in pts], marker="o",
                label=c["policy"])
    ax.set_xscale("log")
    from radixkv.plots import log_ticks

    log_ticks(ax, [p["capacity_tokens"] for c in curves for p in c["points"]])
    ax.set_xlabel("KV pool capacity (tokens)")
    ax.set_ylabel("token hit rate")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _fig_histogram(docs, tables):
    hs = [(lab, s["hit_length_histogram"]) for lab, s in _results(docs) if s.get("hit_length_histogram")]
    if not hs:
        return None
    edges = sorted({e for _, h in hs for e in h["edges_tokens"]})
    fig, ax = _fig()
    w = 0.8 / len(hs)
    x = np.arange(len(edges))
    for k, (lab, h) in enumerate(hs):
        counts = dict(zip(h["edges_tokens"], h["counts"]))
        ax.bar(x + k * w - 0.4 + w / 2, [counts.get(e, 0) for e in edges], width=w, label=lab)
    ax.set_xticks(x, [f"≥{e:,}" for e in edges], rotation=45, fontsize=7)
    ax.set_xlabel("hit length (tokens, bin lower edge)")
    ax.set_ylabel("requests")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _fig_alignment(docs, tables):
    rows = [(lab, s["alignment_loss_share"]) for lab, s in _results(docs) if s.get("alignment_loss_share") is not None]
    if not rows:
        return None
    fig, ax = _fig()
    ax.bar(range(len(rows)), [v for _, v in rows], color="#c0504d")
    ax.set_xticks(range(len(rows)), [lab for lab, _ in rows], rotation=30, fontsize=8)
    ax.set_ylabel("alignment loss / prompt tokens")
    ax.set_xlabel("policy (block / page size after ':')")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _fig_miss_causes(docs, tables):
    from radixkv.plots import draw_miss_causes

    rows = [(lab, s["miss_causes"]) for lab, s in _results(docs) if isinstance(s.get("miss_causes"), dict)]
    if not rows:
        return None
    fig, ax = _fig(7.2, 3.6)
    draw_miss_causes(ax, rows)
    fig.tight_layout()
    return _png(fig)


def _fig_pool(docs, tables):
    tls = [t for t in tables if t["kind"] == "timeline"]
    if not tls:
        return None
    fig, axes = _fig(6.4, 2.6 * len(tls))
    axes = np.atleast_1d(axes)
    for ax, t in zip(axes, tls):
        c = t["columns"]
        total = c["pool_running_slots"] + c["pool_cached_slots"] + c["pool_free_slots"]
        total = np.where(total > 0, total, 1)
        ax.stackplot(c["time_s"], c["pool_running_slots"] / total, c["pool_cached_slots"] / total,
                     c["pool_free_slots"] / total, labels=["running", "cached (evictable)", "free"],
                     colors=["#4f81bd", "#9bbb59", "#dddddd"], step="post")
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of pool slots")
        ax.set_title(t["label"], fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("time (s)")
    fig.tight_layout()
    return _png(fig)


def _per_request(tables):
    return [t for t in tables if t["kind"] == "per_request"]


def _fig_evictions(docs, tables):
    # a column of n/a (SGLang's concurrent replay does not charge evictions to requests) draws nothing
    prs = [t for t in _per_request(tables)
           if "evicted_tokens" in t["columns"] and not np.isnan(t["columns"]["evicted_tokens"]).all()]
    if not prs:
        return None
    fig, ax = _fig()
    timed = all("admit_s" in t["columns"] for t in prs)
    for t in prs:
        c = t["columns"]
        if timed:
            order = np.argsort(c["admit_s"], kind="stable")
            ax.step(c["admit_s"][order], np.cumsum(c["evicted_tokens"][order]), where="post", label=t["label"])
        else:
            ax.step(np.arange(1, len(c["evicted_tokens"]) + 1), np.cumsum(c["evicted_tokens"]), where="post",
                    label=t["label"])
    ax.set_xlabel("admission time (s)" if timed else "request (replay order)")
    ax.set_ylabel("evicted tokens (cumulative)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _fig_hit_vs_prompt(docs, tables):
    prs = [t for t in _per_request(tables) if {"prompt_tokens", "hit_tokens"} <= set(t["columns"])]
    if not prs:
        return None
    fig, ax = _fig()
    top = 1.0
    for t in prs:
        c = t["columns"]
        ax.scatter(c["prompt_tokens"], c["hit_tokens"], s=6, alpha=0.5, label=t["label"])
        top = max(top, float(c["prompt_tokens"].max()) if c["prompt_tokens"].size else 1.0)
    ax.plot([0, top], [0, top], color="#888", lw=0.8, linestyle="--", label="hit = prompt")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("hit (tokens)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


_DRAW = {
    "hit-rate-vs-capacity": (_fig_curve, "a <code>radixkv curve --json</code> result"),
    "hit-length-histogram": (_fig_histogram, "a sequential <code>replay</code>/<code>compare</code> result"),
    "alignment-loss": (_fig_alignment, "a sequential <code>replay</code>/<code>compare</code> result"),
    "pool-split": (_fig_pool, "a concurrent timeline (<code>replay --mode concurrent --timeline CSV</code>)"),
    "evictions": (_fig_evictions, "per-request rows (<code>replay --per-request CSV</code>)"),
    "hit-vs-prompt": (_fig_hit_vs_prompt, "per-request rows (<code>replay --per-request CSV</code>)"),
    "miss-causes": (_fig_miss_causes, "a sequential <code>replay</code>/<code>compare</code> result with "
                                      "<code>--miss-causes</code>"),
}


# ---------------------------------------------------------------------- tables
#: the headline table's rows (metric key), in order; TTFT only when a result is concurrent
HEADLINE = ("token_hit_rate", "hit_tokens", "evictions", "ttft_p50_s", "ttft_p99_s")


def _na(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def _row_head(key, *, concurrent=False) -> str:
    from radixkv.report import metric_label

    return (f'<th class="metric" title="{html.escape(key)}">'
            f'{html.escape(metric_label(key, concurrent=concurrent))}</th>')


def _headline_table(docs) -> str:
    """The short table first on the page: :data:`HEADLINE` rows, one column per result of
    every document (its policy; ``(concurrent)`` for a concurrent replay)."""
    res = [r for d in docs for r in d.get("results", [])]
    if not res:
        return ""
    conc = any(_concurrent(_summary(r)) for r in res)
    keys = [k for k in HEADLINE if conc or not k.startswith("ttft_")]
    out = ['<table class="headline" id="headline"><thead><tr><th></th>']
    out += [f"<th>{html.escape(_run_label(r))}</th>" for r in res]
    out.append("</tr></thead><tbody>")
    for k in keys:
        out.append("<tr>" + _row_head(k))
        out += [_cell(k, _summary(r).get(k)) for r in res]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _metric_order(keys, concurrent: bool) -> list:
    """*keys* in the order of the text tables' rows (:mod:`radixkv.report`), the rest after
    them in their own order."""
    from radixkv.report import (CONCURRENT_ROWS, HOST_CONCURRENT_ROWS, MISS_ROWS, SEQUENTIAL_ROWS,
                                STORAGE_ROWS)

    specs = (CONCURRENT_ROWS, SEQUENTIAL_ROWS) if concurrent else (SEQUENTIAL_ROWS, CONCURRENT_ROWS)
    known = [k for spec in specs + (MISS_ROWS, HOST_CONCURRENT_ROWS, STORAGE_ROWS) for k, _, _ in spec]
    rank = {k: n for n, k in enumerate(dict.fromkeys(known))}
    return sorted(keys, key=lambda k: (rank.get(k, len(rank)), keys.index(k)))


def _summary_table(doc, idx) -> str:
    """Every scalar metric of *doc*'s results (one column per result), human labels (the
    key on hover), in the text tables' order; the rows that are n/a for every result (not
    modelled by these policies or this mode) folded below in a ``<details>`` element."""
    res = doc.get("results", [])
    if not res:
        return ""
    keys = []
    for r in res:
        for k, v in _summary(r).items():
            if k not in keys and (v is None or isinstance(v, (int, float, str))) and k != "policy":
                keys.append(k)
    conc = all(_concurrent(_summary(r)) for r in res)
    keys = _metric_order(keys, conc)
    shown = [k for k in keys if not all(_na(_summary(r).get(k)) for r in res)]
    folded = [k for k in keys if k not in shown]

    def table(ks, tid):
        out = [f'<table class="summary" id="{tid}"><thead><tr><th>metric</th>']
        out += [f'<th>{html.escape(_label(r))}</th>' for r in res]
        out.append("</tr></thead><tbody>")
        for k in ks:
            out.append("<tr>" + _row_head(k, concurrent=conc))
            out += [_cell(k, _summary(r).get(k)) for r in res]
            out.append("</tr>")
        out.append("</tbody></table>")
        return "".join(out)

    html_ = table(shown, f"summary-{idx}")
    if folded:
        html_ += (f"<details><summary>{len(folded)} more metric(s), n/a for every column (not modelled by "
                  f"these policies or this mode)</summary>{table(folded, f'summary-{idx}-na')}</details>")
    return html_


def _curve_table(doc, idx) -> str:
    curves = doc.get("curves", [])
    if not curves:
        return ""
    caps = sorted({p["capacity_tokens"] for c in curves for p in c["points"]})
    out = [f'<table class="curve" id="curve-{idx}"><thead><tr><th>capacity (tokens)</th>']
    out += [f'<th>{html.escape(c["policy"])}</th>' for c in curves]
    out.append("</tr></thead><tbody>")
    for cap in caps:
        out.append(f"<tr><th>{cap:,}</th>")
        for c in curves:
            p = next((p for p in c["points"] if p["capacity_tokens"] == cap), {})
            out.append(_cell("token_hit_rate", p.get("token_hit_rate")))
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _provenance(inputs, command) -> str:
    import sys

    import matplotlib

    import radixkv

    rows = [("radixkv", radixkv.__version__), ("python", sys.version.split()[0]), ("numpy", np.__version__),
            ("matplotlib", matplotlib.__version__)]
    if command:
        rows.append(("command", command))
    for i, item in enumerate(inputs):
        if item["kind"] == "plan":
            d = item["doc"]
            t = d.get("trace", {})
            rows.append((f"input {i + 1}", f"{item['label']} (radixkv plan)"))
            rows.append(("  written by", f"radixkv {d['radixkv']}" if d.get("radixkv") else "not recorded"))
            rows.append(("  trace", str(t.get("path") or "not recorded")
                         + (f" ({t['requests']:,} requests)" if isinstance(t.get("requests"), int) else "")))
        elif item["kind"] == "json":
            d = item["doc"]
            t = d.get("trace", {})
            rows.append((f"input {i + 1}", item["label"]))
            rows.append(("  written by", f"radixkv {d['radixkv']}" if d.get("radixkv") else "not recorded"))
            facts = [f"{t['requests']:,} requests" if isinstance(t.get("requests"), int) else None,
                     f"unit_tokens {t['unit_tokens']}" if t.get("unit_tokens") is not None else None]
            facts = ", ".join(f for f in facts if f)
            rows.append(("  trace", str(t.get("path") or t.get("name") or "not recorded")
                         + (f" ({facts})" if facts else "")))
            if d.get("limit") is not None:
                rows.append(("  limit", str(d["limit"])))
            if d.get("config"):
                rows.append(("  check config", str(d["config"])))
            for r in d.get("results", []):
                if "pool" in r:
                    pool = ", ".join(f"{k}={v}" for k, v in sorted(r["pool"].items()))
                    rows.append((f"  pool of {_label(r)}", pool or "not recorded"))
                sc = _summary(r).get("scheduler")
                if isinstance(sc, dict):  # a concurrent replay's step knobs and where they came from
                    from radixkv.report import steps_text

                    rows.append((f"  steps of {_label(r)}", steps_text(sc, grouped=False)))
        else:
            rows.append((f"input {i + 1}", f"{item['label']} ({item['kind'].replace('_', '-')} CSV, "
                                           f"{len(next(iter(item['columns'].values()), []))} rows)"))
        if item.get("sha256"):
            rows.append(("  sha256", item["sha256"]))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f'<table class="provenance">{body}</table>'


def sweep_doc(rows: list[dict]) -> dict:
    """A report document from a sweep's rows (:func:`radixkv.sweep.store.read_rows`): every
    cell as a result column (``policy @ capacity``, its metrics) and, per trace and
    policy, ``token_hit_rate`` against the pool's capacity in tokens as a curve."""
    from radixkv.sweep.show import capacity_tokens as _capacity_tokens

    results, curves = [], {}
    for r in rows:
        m = r.get("metrics") or {}
        cap = _capacity_tokens(r)
        pol = r.get("settings", {}).get("policy", "?")
        trace = (r.get("trace") or {}).get("name") or (r.get("trace") or {}).get("path") or ""
        results.append({"trace": Path(str(trace)).name, "policy": f"{pol} @ {cap:,}" if cap is not None else pol,
                        **{k: v for k, v in m.items()
                           if v is None or isinstance(v, (int, float, str)) or k == "hit_length_histogram"}})
        if cap is not None and m.get("token_hit_rate") is not None:
            curves.setdefault(f"{Path(str(trace)).name}: {pol}", []).append(
                {"capacity_tokens": cap, "token_hit_rate": m["token_hit_rate"]})
    return {"radixkv": __import__("radixkv").__version__, "trace": {"name": "sweep"}, "results": results,
            "curves": [{"policy": k, "points": sorted(v, key=lambda p: p["capacity_tokens"])}
                       for k, v in curves.items()]}


def render_report(inputs: list[dict], *, title: str = "radixkv report", command: str | None = None) -> str:
    """The HTML page (a str) for *inputs* (each as :func:`read_input` returns, or built in
    memory: ``{"kind": "json", "doc": dict, "label": str}`` /
    ``{"kind": "timeline" | "per_request", "label": str, "columns": {name: array}}``).

    Raises
    ------
    radixkv.errors.InputError
        When *inputs* is empty.
    """
    from radixkv.errors import InputError

    if not inputs:
        raise InputError("nothing to report: give at least one result", field="inputs")
    docs = [i["doc"] for i in inputs if i["kind"] == "json"]
    plans = [i["doc"] for i in inputs if i["kind"] == "plan"]
    tables = name_tables(docs, [i for i in inputs if i["kind"] not in ("json", "plan")])
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             "<p>Metrics as defined in radixkv's docs/DESIGN.md (Metrics). <code>n/a</code>: the policy or "
             "mode does not model the metric (JSON <code>null</code>).</p>"]
    if plans:
        from radixkv.plan.html import plan_section

        for i, d in enumerate(plans):
            parts.append("<h2>Deployment plan" + (f" {i + 1}" if len(plans) > 1 else "") + "</h2>")
            parts.append(plan_section(d, i))
        if not docs and not tables:  # a plan alone: no replay results to tabulate or draw
            parts.append("<h2>Provenance</h2>")
            parts.append(_provenance(inputs, command))
            parts.append("</body></html>\n")
            return "\n".join(parts)
    if docs:
        parts += ["<h2>At a glance</h2>", _headline_table(docs)]
    parts.append("<h2>All metrics</h2>")
    for i, d in enumerate(docs):
        t = d.get("trace", {})
        res = [_summary(r) for r in d.get("results", [])]
        what = ("concurrent replay" if res and all(_concurrent(x) for x in res) else "replay" if res else
                "token hit rate by pool capacity" if d.get("curves") else "")
        name = Path(str(t.get("name") or t.get("path") or "result")).name
        parts.append(f"<h3>{html.escape(name + (': ' + what if what else ''))}</h3>")
        parts.append(_summary_table(d, i) + _curve_table(d, i))
    if not docs:
        parts.append('<p class="missing">No JSON result given (only CSV tables).</p>')
    parts.append("<h2>Figures</h2>")
    for fid, ftitle in FIGURES:
        draw, need = _DRAW[fid]
        png = draw(docs, tables)
        if png is None:
            parts.append(f'<section id="fig-{fid}"><h3>{html.escape(ftitle)}</h3>'
                         f'<p class="missing">Not in these inputs: add {need}.</p></section>')
        else:
            parts.append(f'<section id="fig-{fid}"><h3>{html.escape(ftitle)}</h3><figure>'
                         f'<img alt="{html.escape(ftitle)}" src="data:image/png;base64,{png}"></figure></section>')
    parts.append("<h2>Provenance</h2>")
    parts.append(_provenance(inputs, command))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(inputs: list[dict], path, **kw) -> None:
    """Render *inputs* (:func:`render_report`) and write the page to *path* atomically."""
    from radixkv.util import atomic_write_text

    atomic_write_text(path, render_report(inputs, **kw))


def report_from_files(paths, out, *, command: str | None = None) -> list[dict]:
    """Read every result file of *paths* (:func:`read_input`, with each file's sha256) and
    write the report to *out*; returns the inputs."""
    inputs = []
    for p in paths:
        item = read_input(p)
        item["sha256"] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
        inputs.append(item)
    write_report(inputs, out, command=command)
    return inputs
