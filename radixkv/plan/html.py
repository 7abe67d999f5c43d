"""The plan's section of the HTML report (:mod:`radixkv.html_report`): ``radixkv plan
--report PATH.html``, or ``radixkv report plan.json``.

Drawn from the plan's JSON document (:func:`radixkv.plan.report.plan_doc`) alone, so a
report of a saved plan is the report of the run that wrote it:

* what was asked (trace, rate, model, SLO, cost unit, cost model);
* an overload flag: how many replayed points never caught up (``overloaded``), which the
  tables show as ``overload``, never as a latency; and the requests refused for their
  length (``rejected_requests``), when the recommendation has any;
* the table of the recommendation, the runner-ups and the next cheaper point the search
  considered (``id="plan-N"``), every cell with the JSON key and value it shows
  (``data-key`` / ``data-value``, as the report's other tables);
* the engine's command line, the replica note and the ``radixkv replay`` command that
  replays the recommendation again; the predicted latencies and the clock's measured error;
* the prefix-caching verdict line (on vs off at the recommendation);
* the sensitivity table (``id="plan-N-sensitivity"``) and the search's counts;
* the Pareto plot, cost vs TTFT p99 (:func:`radixkv.plan.report.pareto_figure`, the figure
  ``--plot`` writes), as an inline PNG.
"""
from __future__ import annotations

import html

#: the keys of a plan's JSON document the section reads (a document with all of them is a plan)
PLAN_KEYS = ("recommendation", "runner_ups", "search", "points", "slo", "prefix_caching")


def is_plan_doc(doc) -> bool:
    """Whether *doc* (a parsed JSON value) is a plan's document (:data:`PLAN_KEYS`)."""
    return isinstance(doc, dict) and all(k in doc for k in PLAN_KEYS)


def _terms(doc) -> list:
    from radixkv.plan.spec import SLO_TERMS

    return [t for t in SLO_TERMS if t in doc["slo"]] or ["ttft_p99", "tpot_p99"]


def _label(p) -> str:
    from radixkv.plan.candidates import Point

    return Point.from_dict(p["point"]).label()


def _latency_cell(key, p) -> str:
    """A latency cell: ``overload`` for an overloaded point (never its number), ``-`` for a
    point not replayed, else the JSON value."""
    from radixkv.html_parts import cell as _cell

    if not p.get("replayed"):
        return f'<td class="na" data-key="{key}" data-value="not replayed">-</td>'
    if p.get("overloaded"):
        return f'<td class="overload" data-key="{key}" data-value="overload">overload</td>'
    return _cell(key, p.get(key))


def _row(role, p, terms) -> str:
    from radixkv.html_parts import cell as _cell

    slo = "yes" if p["meets_slo"] else ("no" if p["replayed"] else "-")
    if p.get("pruned") and not p["replayed"]:
        slo = "pruned: " + p["pruned"].split(":")[0]
    cells = [f"<th>{html.escape(role)}</th>", f'<td class="txt">{html.escape(_label(p))}</td>',
             _cell("cost_per_hour", p["cost_per_hour"])]
    cells += [_latency_cell(f"{t}_s", p) for t in terms]
    cells += [_cell("throughput_output_tokens_per_s", p.get("throughput_output_tokens_per_s")),
              _cell("token_hit_rate", p.get("token_hit_rate")),
              f'<td class="txt" data-key="meets_slo" data-value="{html.escape(slo)}">{html.escape(slo)}</td>']
    return "<tr>" + "".join(cells) + "</tr>"


def _table(tid, head, rows) -> str:
    return (f'<table class="plan" id="{tid}"><thead><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def plan_section(doc: dict, idx: int = 0) -> str:
    """The HTML of one plan's section (module docstring); *idx* numbers its tables' ids.

    Raises
    ------
    KeyError
        *doc* is not a plan's document (:func:`is_plan_doc` says which are).
    """
    from radixkv.html_parts import png as _png
    from radixkv.plan.report import pareto_figure
    from radixkv.plan.spec import format_slo

    terms = _terms(doc)
    unit = doc.get("cost_unit", "cost")
    t = doc.get("trace", {})
    rec = doc["recommendation"]
    out = [f'<section class="plan" id="plan-section-{idx}">']
    rate = t.get("rate_scale")
    offered = t.get("offered_tokens_per_s")
    asked = [f"{t['requests']:,} requests" if isinstance(t.get("requests"), int) else None,
             f"over {t['span_s']:,.1f} s" if isinstance(t.get("span_s"), (int, float)) else None,
             f"at {rate:g}x the recorded rate" if isinstance(rate, (int, float)) else None,
             f"({offered:,.0f} tokens/s offered)" if isinstance(offered, (int, float)) else None]
    out.append(f"<p>Trace <code>{html.escape(str(t.get('path', 'not recorded')))}</code>: "
               + html.escape(" ".join(a for a in asked if a)) + f"; model <code>{html.escape(str(doc.get('model')))}"
               f"</code>; SLO <code>{html.escape(format_slo(doc['slo']))}</code>; cost in "
               f"{html.escape(unit)}; cost model {html.escape(str(doc.get('cost_model')))}.</p>")
    replayed = [p for p in doc["points"] if p["replayed"]]
    over = [p for p in replayed if p["overloaded"]]
    if over:
        out.append(f'<p class="overload" id="plan-{idx}-overload"><strong>Overload:</strong> {len(over)} of '
                   f"{len(replayed)} replayed points never catch up (their queue grows for the whole trace); they "
                   f"are shown as <code>overload</code>, never as a latency, and miss every SLO term.</p>")
    refused = rec.get("rejected_requests")
    if refused:
        of = f" of {t['requests']:,}" if isinstance(t.get("requests"), int) else ""
        out.append(f'<p class="overload"><strong>Refused:</strong> {refused:,}{of} requests are longer than the '
                   f"model's context and are refused by the engine; every latency below covers the others "
                   f"only.</p>")
    head = ["", "configuration", unit, *terms, "out tok/s", "hit rate", "SLO"]
    rows = [_row("recommended", rec, terms)] + [_row(f"runner-up {i + 1}", p, terms)
                                               for i, p in enumerate(doc["runner_ups"])]
    if doc.get("next_cheaper"):
        rows.append(_row("next cheaper", doc["next_cheaper"], terms))
    out.append(_table(f"plan-{idx}", head, rows))
    out.append("<p>Recommendation, one replica (the engine's own command line):</p>")
    out.append(f"<pre><code>{html.escape(rec['engine_command'])}</code></pre>")
    if rec.get("replicas_note"):
        out.append(f"<p>× {html.escape(rec['replicas_note'])}</p>")
    out.append(f"<p>Replay it again: <code>{html.escape(rec['replay_command'])}</code></p>")
    if doc.get("uncertainty"):
        out.append(f'<p class="missing">Uncertainty: {html.escape(doc["uncertainty"])}</p>')
    out.append(f'<p class="verdict" id="plan-{idx}-verdict"><strong>{html.escape(doc["prefix_caching"]["text"])}'
               f"</strong></p>")
    sens = doc.get("sensitivity") or []
    if sens:
        out.append("<h3>Sensitivity: one knob changed at the recommendation</h3>")
        srows = []
        for r in sens:
            k = r["knob"]
            v = r["point"].get(k) if k != "prefix_caching" else ("on" if r["point"]["prefix_caching"] else "off")
            if k == "kv_cache_dtype":
                v = v or "auto"
            srows.append(_row(f"{k} -> {v}", r, terms))
        out.append(_table(f"plan-{idx}-sensitivity", head, srows))
    s = doc["search"]
    pr = ", ".join(f"{n} by {k}" for k, n in sorted(s.get("pruned", {}).items()) if n) or "none"
    out.append(f"<p>Search: {s['replayed']} points replayed (budget {s.get('budget')}); pruned: {html.escape(pr)}"
               + ("; <strong>the budget was spent</strong> (raise --budget to search further)"
                  if s.get("budget_exhausted") else "") + ".</p>")
    title = "Cost vs TTFT p99 (Pareto front)"
    out.append(f'<section id="fig-plan-pareto-{idx}"><h3>{title}</h3><figure><img alt="{title}" '
               f'src="data:image/png;base64,{_png(pareto_figure(doc))}"></figure></section>')
    out.append("</section>")
    return "\n".join(out)
