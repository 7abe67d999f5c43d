"""A plan's answer as text, JSON and a Pareto plot.

* :func:`plan_doc`: the JSON document (sorted keys, plain numbers; no wall-clock times and
  no count of replays read back from a work dir, so the same inputs give the same bytes).
* :func:`format_plan`: the table of the recommendation and runner-ups, the engine's
  command line, the ``radixkv replay`` command that replays it, the prefix-caching
  verdict, the knob sensitivity and the search's counts.
* :func:`pareto_plot` / :func:`pareto_figure`: cost vs TTFT p99 of every replayed point, the
  Pareto front joined, overloaded points marked apart (drawn from the JSON document, so the
  HTML report's plan section, :mod:`radixkv.plan.html`, draws the same figure).

Overload: a replay that never caught up (:mod:`radixkv.replay.overload`) is shown as
``overload``, never as a latency.
"""
from __future__ import annotations

import math

from radixkv.plan.spec import SLO_TERMS, format_seconds, format_slo

#: the predictions' uncertainty: no interval is drawn, but the clock's end-to-end error is
#: measured (docs/clock-e2e.md; experiments/results/e2e_clock.json, median |error| of TTFT p99
#: and TPOT p99 over 10 published vLLM benchmark_serving runs)
BAND_UNMEASURED = ("no interval: the clock's measured end-to-end error (docs/clock-e2e.md, 10 published vLLM "
                   "runs, median |error|) is TTFT p99 27 % / TPOT p99 52 % for the roofline, 29 % / 40 % for "
                   "fitted, 6 % / 11 % for fitted with the request-intake term; read a prediction near its SLO "
                   "with that margin")


def _num(v):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def outcome_doc(o) -> dict:
    """One outcome as JSON-ready values."""
    m = o.metrics or {}
    d = {"point": o.point.to_dict(), "cost_per_hour": o.cost, "replayed": o.replayed, "pruned": o.pruned,
         "meets_slo": o.meets, "overloaded": bool(o.overloaded) if o.replayed else None,
         "misses": {t: _num(r) for t, r in o.misses().items()} if o.replayed else None}
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "throughput_output_tokens_per_s",
                "throughput_total_tokens_per_s", "token_hit_rate", "preemptions", "queue_growth_s_per_s",
                "rejected_requests"):
        d[key] = _num(m.get(key)) if o.replayed and not (o.overloaded and key.startswith(("ttft", "tpot"))) else None
    return d


def plan_doc(res) -> dict:
    """The JSON document of a :class:`~radixkv.plan.search.PlanResult`."""
    from radixkv import __version__
    from radixkv.plan.candidates import engine_command, replay_argv

    s, w, b = res.spec, res.workload, res.best
    return {
        "radixkv": __version__,
        "trace": {"path": str(s.trace), "requests": w.requests, "prompt_tokens": w.prompt_tokens,
                  "output_tokens": w.output_tokens, "span_s": w.span_s, "rate_scale": s.rate_scale,
                  "offered_tokens_per_s": _num(w.offered_tokens_per_s), "hit_rate_bound": w.hit_rate_bound},
        "model": s.model,
        "slo": {t: s.slo[t] for t in SLO_TERMS if t in s.slo},
        "cost_unit": s.cost_unit,
        "prices": dict(sorted(s.prices.items())),
        "cost_model": s.cost_model,
        "uncertainty": BAND_UNMEASURED,
        "recommendation": {**outcome_doc(b), "engine_command": engine_command(b.point, s.model, (b.settings or {}).get("max_model_len")),
                           "replicas_note": _replicas_note(b.point),
                           "replay_command": "radixkv " + " ".join(replay_argv(s.trace, b.settings)),
                           "replay_argv": replay_argv(s.trace, b.settings)},
        "runner_ups": [outcome_doc(o) for o in res.runner_ups],
        "next_cheaper": None if res.next_cheaper is None else {
            **outcome_doc(res.next_cheaper), "replay_argv": replay_argv(s.trace, res.next_cheaper.settings)},
        "prefix_caching": caching_verdict(res),
        "sensitivity": [{"knob": k, **outcome_doc(o)} for k, o in res.sensitivity],
        "search": {"replayed": res.replayed, "pruned": {k: n for k, n in sorted(res.pruned.items()) if n},
                   "budget": s.budget, "budget_exhausted": res.budget_exhausted,
                   "min_replicas_by_throughput": {f"{e}/{g}/tp{t}": r for (e, g, t), r in sorted(res.min_replicas.items())}},
        "points": [outcome_doc(o) for o in res.outcomes],
    }


def _replicas_note(p) -> str | None:
    if p.replicas == 1:
        return None
    return f"{p.replicas} replicas of this command behind a {p.router} router"


def _fmt(o, term) -> str:
    if not o.replayed:
        return "-"
    if o.overloaded:
        return "overload"
    return _lat(o.value(term))


def _rate(v) -> str:
    """Tokens/s with thousands separators, or ``n/a`` (a trace of zero span offers no rate)."""
    return "n/a" if v is None or not math.isfinite(v) else f"{v:,.0f}"


def _lat(v) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v * 1e3:.1f}ms" if v < 1 else f"{v:.2f}s"


def _row(o, terms) -> list:
    m = o.metrics or {}
    lat = ["overload" if o.overloaded else _lat(o.value(t)) for t in terms] if o.replayed else ["-"] * len(terms)
    thr = m.get("throughput_output_tokens_per_s")
    hit = m.get("token_hit_rate")
    return [o.point.label(), f"{o.cost:g}", *lat,
            "-" if thr is None else f"{thr:,.0f}", "-" if hit is None else f"{hit:.1%}",
            "yes" if o.meets else ("no" if o.replayed else "-")]


def _table(header, rows) -> str:
    w = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r))
             for r in [header, *rows]]
    return "\n".join(lines)


#: the clock's measured end-to-end error (median |error|, BAND_UNMEASURED's source) by cost
#: model and metric: two predictions closer than this (relative) are not told apart
CLOCK_ERROR = {"roofline": {"ttft": 0.27, "tpot": 0.52}, "fitted": {"ttft": 0.29, "tpot": 0.40}}


def _clock_error(cost_model: str, term: str) -> float:
    """The relative error within which two predictions of SLO *term* are equivalent: the
    roofline's for ``roofline``, else the fitted clock's (:data:`CLOCK_ERROR`; a p50 term
    takes its p99's, the only percentile measured)."""
    return CLOCK_ERROR["roofline" if cost_model == "roofline" else "fitted"][term[:4]]


def caching_verdict(res) -> dict:
    """Prefix caching on vs off at the recommendation: ``verdict``, the two outcomes'
    TTFT/TPOT p99 and hit rate, and a one-line ``text`` whose reason follows the comparison.

    ``verdict`` is "on" or "off" when one setting meets the SLO and the other does not
    (neither: the one nearer it), or when both meet it and the one keeps more margin on
    some SLO term by more than the clock's measured error (:data:`CLOCK_ERROR`) and less on
    none; "on" too when both meet the SLO within that error on every term and caching saves
    prefill FLOPs (the same latency for less prefill work); "either" when each is ahead on a
    different term, when the two are equal or within that error and caching saves nothing,
    or when the hit rate is 0 (caching buys nothing). With only one setting replayed it is the recommendation's setting.
    """
    b = res.best
    flip = next((o for k, o in res.sensitivity if k == "prefix_caching"), None)
    on, off = (b, flip) if b.point.prefix_caching else (flip, b)
    rec = "on" if b.point.prefix_caching else "off"
    d = {"verdict": rec, "on": None if on is None else outcome_doc(on),
         "off": None if off is None else outcome_doc(off)}
    if on is None or off is None or not on.replayed or not off.replayed:
        d["text"] = (f"prefix caching {d['verdict']}: the other setting was not replayed "
                     f"({'budget' if res.budget_exhausted else 'pruned'})")
        return d
    hit = (on.metrics or {}).get("token_hit_rate")
    saved = (on.metrics or {}).get("prefill_flops_saved")
    parts = [f"hit rate {hit:.1%}" if hit is not None and math.isfinite(hit) else "hit rate n/a"]
    for t in ("ttft_p99", "tpot_p99"):
        parts.append(f"{t} {_fmt(on, t)} on vs {_fmt(off, t)} off")
    if saved:
        parts.append(f"{saved:.3g} prefill FLOPs saved")
    if on.meets and not off.meets:
        verdict, why = "on", "off misses the SLO at the same point"
    elif off.meets and not on.meets:
        verdict, why = "off", "on misses the SLO at the same point"
    elif not on.meets:
        verdict = "on" if on.worst_ratio() <= off.worst_ratio() else "off"
        why = f"neither meets the SLO; {verdict} comes nearer"
    elif hit is not None and hit == 0:
        verdict, why = "either", "both meet the SLO; 0 % hit rate: caching buys nothing here"
    else:
        cm = res.spec.cost_model
        ahead = {"on": [], "off": []}
        for t in (t for t in SLO_TERMS if t in res.spec.slo):
            a, c = on.value(t), off.value(t)
            if a == c or abs(a - c) <= _clock_error(cm, t) * max(a, c):
                continue
            ahead["on" if a < c else "off"].append(t)
        errs = ", ".join(f"{t} {_clock_error(cm, t):.0%}" for t in SLO_TERMS if t in res.spec.slo)
        if ahead["on"] and not ahead["off"]:
            verdict, why = "on", f"both meet the SLO; on keeps more margin on {', '.join(ahead['on'])}"
        elif ahead["off"] and not ahead["on"]:
            verdict, why = "off", f"both meet the SLO; off keeps more margin on {', '.join(ahead['off'])}"
        elif ahead["on"]:
            verdict, why = "either", (f"both meet the SLO; on is ahead on {', '.join(ahead['on'])}, off on "
                                      f"{', '.join(ahead['off'])}")
        elif saved:
            # the latencies cannot tell the two apart, but caching does less prefill work
            verdict, why = "on", (f"both meet the SLO and their latencies agree within the clock's measured "
                                  f"error of {errs}; on computes fewer prefill FLOPs for the same answer")
        else:
            verdict, why = "either", (f"both meet the SLO; equivalent: the differences are within the clock's "
                                      f"measured error of {errs}")
    d["verdict"] = verdict
    if verdict not in ("either", rec):
        why += f"; the command above has it {rec}"
    head = "prefix caching: either setting — " if verdict == "either" else f"prefix caching: turn it {verdict.upper()} — "
    d["text"] = head + "; ".join(parts) + f" ({why})"
    return d


def format_plan(res) -> str:
    """The plan as text (module docstring)."""
    from radixkv.plan.candidates import engine_command, replay_argv

    s, w, b = res.spec, res.workload, res.best
    terms = [t for t in SLO_TERMS if t in s.slo] or ["ttft_p99", "tpot_p99"]
    out = [f"plan for {s.trace}: {w.requests:,} requests over {w.span_s:,.1f} s at {s.rate_scale:g}x the recorded "
           f"rate ({_rate(w.offered_tokens_per_s)} tokens/s offered); model {s.model}; SLO {format_slo(s.slo)}; "
           f"cost in {s.cost_unit}; cost model {s.cost_model}"]
    refused = (b.metrics or {}).get("rejected_requests") if b.replayed else None
    if refused:
        out.append(f"REFUSED: {refused:,} of {w.requests:,} requests are longer than {s.model}'s context "
                   f"(max_model_len) and are refused by the engine (radixkv.replay.context); every latency "
                   f"and SLO below covers the other {w.requests - refused:,} only")
    header = ["configuration", s.cost_unit, *terms, "out tok/s", "hit", "SLO"]
    rows = [["* " + _row(b, terms)[0], *_row(b, terms)[1:]]] + [["  " + r[0], *r[1:]] for r in
                                                                 (_row(o, terms) for o in res.runner_ups)]
    if res.next_cheaper is not None:
        r = _row(res.next_cheaper, terms)
        rows.append(["  (next cheaper) " + r[0], *r[1:]])
    out.append(_table(header, rows))
    out.append("")
    out.append("recommendation (one replica):")
    out.append("  " + engine_command(b.point, s.model, (b.settings or {}).get("max_model_len")))
    if b.point.replicas > 1:
        out.append(f"  x {_replicas_note(b.point)}")
    out.append("replay it again: radixkv " + " ".join(replay_argv(s.trace, b.settings)))
    m = b.metrics
    out.append(f"predicted: TTFT p50 {_lat(m.get('ttft_p50_s'))} p99 {_lat(m.get('ttft_p99_s'))}; TPOT p50 "
               f"{_lat(m.get('tpot_p50_s'))} p99 {_lat(m.get('tpot_p99_s'))}; "
               f"{_rate(m.get('throughput_output_tokens_per_s'))} output tokens/s; "
               f"uncertainty {BAND_UNMEASURED}")
    out.append(caching_verdict(res)["text"])
    if res.sensitivity:
        out.append("")
        out.append("sensitivity (one knob changed at the recommendation):")
        hdr = ["knob -> value", s.cost_unit, *terms, "out tok/s", "hit", "SLO"]
        srows = []
        for k, o in res.sensitivity:
            v = o.point.to_dict().get(k) if k != "prefix_caching" else ("on" if o.point.prefix_caching else "off")
            if k == "kv_cache_dtype":
                v = v or "auto"
            r = _row(o, terms)
            if o.pruned:
                r[-1] = "pruned: " + o.pruned.split(":")[0]
            srows.append([f"{k} -> {v}", *r[1:]])
        out.append(_table(hdr, srows))
    pr = ", ".join(f"{n} by {k}" for k, n in sorted(res.pruned.items()) if n) or "none"
    out.append("")
    ahead = (f"; {res.prefetched} started ahead on idle workers, {res.prefetch_used} of them used"
             if res.prefetched else "")
    out.append(f"search: {res.replayed} points replayed ({res.resumed} read back from the work dir{ahead}); pruned: {pr}"
               + ("; the budget was spent (raise --budget to search further)" if res.budget_exhausted else ""))
    return "\n".join(out)


def pareto_plot(res, path) -> None:
    """Cost vs TTFT p99 of every replayed point (PNG at *path*, atomically), as
    :func:`pareto_figure` draws it from the plan's document (:func:`plan_doc`)."""
    import matplotlib.pyplot as plt

    from radixkv.util import atomic_output

    fig = pareto_figure(plan_doc(res))
    with atomic_output(path, binary=True) as f:
        fig.savefig(f, format="png", metadata={"Software": None})
    plt.close(fig)


def pareto_figure(doc: dict):
    """The Pareto plot of a plan's JSON document *doc* (:func:`plan_doc`; a matplotlib
    figure, Agg): cost vs TTFT p99 of every replayed point — meeting points, missing points,
    overloaded points (drawn at the top edge: they have no latency), the Pareto front of the
    non-overloaded points, the recommendation circled, the SLO's TTFT p99 bound dashed.

    The same document gives the same figure: ``--plot`` and the HTML report's plan section
    (:mod:`radixkv.plan.html`) both draw it from here. Raises ``KeyError`` for a document
    without ``points``, ``recommendation``, ``slo``, ``cost_unit`` or ``model``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def ttft(p) -> float:
        v = p.get("ttft_p99_s")
        return float("nan") if v is None else float(v)

    pts = [p for p in doc["points"] if p["replayed"]]
    ok = [p for p in pts if not p["overloaded"] and math.isfinite(ttft(p))]
    top = max([ttft(p) for p in ok] + [1e-3]) * 2
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for group, style, lab in (([p for p in ok if p["meets_slo"]], dict(marker="o", color="tab:green"), "meets SLO"),
                              ([p for p in ok if not p["meets_slo"]], dict(marker="x", color="tab:red"),
                               "misses SLO"),
                              ([p for p in pts if p["overloaded"]], dict(marker="^", color="tab:gray"),
                               "overloaded (never catches up)")):
        if group:
            ax.scatter([p["cost_per_hour"] for p in group], [top if p["overloaded"] else ttft(p) for p in group],
                       label=lab, **style)
    front, best_y = [], math.inf
    for p in sorted(ok, key=lambda p: (p["cost_per_hour"], ttft(p))):
        if ttft(p) < best_y:
            front.append(p)
            best_y = ttft(p)
    if len(front) > 1:
        ax.plot([p["cost_per_hour"] for p in front], [ttft(p) for p in front], color="tab:blue", lw=1,
                label="Pareto front")
    b = doc["recommendation"]
    ax.scatter([b["cost_per_hour"]], [ttft(b)], s=160, facecolors="none", edgecolors="black", label="recommended")
    if "ttft_p99" in doc["slo"]:
        ax.axhline(doc["slo"]["ttft_p99"], ls="--", color="black", lw=0.8, label="SLO ttft_p99")
    ax.set_yscale("log")
    ax.set_xlabel(f"cost ({doc['cost_unit']})")
    ax.set_ylabel("TTFT p99 (s)")
    ax.set_title(f"radixkv plan: {doc['model']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
