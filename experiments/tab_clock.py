"""Table and figure: the step-time models' measured error against Vidur's GPU timings (issue 35).

For each model × GPU × TP that Vidur profiled (``$RADIXKV_SHARED/measurements/vidur``, MIT),
the measured token-parallel time of a forward pass at n tokens (``radixkv.clock.error``:
layers × the per-layer operator medians + two measured all-reduces per layer at TP > 1)
against three predictions of the same work:

- ``roofline``: radixkv.cost.CostModel's formula with its assumed MFU 0.6 / MBU 0.8;
- ``fitted``: the packaged fitted model's token table (radixkv.clock.calibrated.fitted_token_table),
  its MFU/MBU/per-layer time fitted here on the training models only
  (radixkv.clock.error.TRAIN_MODELS) — the same fit that radixkv/clock/data/fitted.json holds;
- ``profiled``: linear interpolation between the measured breakpoints PROFILE_TOKENS.

Scored on HELD-OUT points: the models not in TRAIN_MODELS (all three models), and for
``profiled`` only the token counts that are not breakpoints. At TP > 1 points whose
all-reduce message is larger than the largest measured one are left out (no measured
truth there). The attention kernels are not in Vidur's copy: their term is not scored here.
Pure arithmetic on CSV files, ~15 s.

    python experiments/tab_clock.py     # writes results/clock.{json,md,png}

Keys (``$clock/...`` in the paper template):

* ``split``: ``train_models``, ``held_out_models``, ``profile_tokens``, ``regimes``;
* ``fits/<gpu>``: ``mfu``, ``mbu``, ``layer_overhead_s``, ``points``;
* ``errors/<gpu>/<regime or all>/<roofline|fitted|profiled>``: ``n``, ``median``, ``p90``,
  ``worst``, ``signed_median``, ``signed_p10``, ``signed_p90`` (fractions: pred/meas − 1);
* ``pct/<gpu>/<regime or all>/<model>/{median,p90,worst,signed_median}``: the same in percent,
  rounded to 0.1 (for the paper);
* ``targets``: per GPU, whether fitted or profiled is ≤ 10 % median and ≤ 25 % p90 on all
  held-out points (``met``, ``by``);
* ``cases``: per model × GPU × TP, the median signed error of each model;
* ``skipped``: profiles that could not be composed (A40 at TP > 1: no all-reduce table);
* ``plot``: per GPU and model, ``bins`` of ``[Σn, median, p10, p90, points]`` of the
  held-out errors in quarter-octave bins of Σn (the figure).
"""
from __future__ import annotations

import numpy as np

import _common as C  # noqa: I001 (puts the repository on sys.path)

from radixkv.clock import error as E
from radixkv.clock.build import sample_all_reduce
from radixkv.clock.calibrated import fitted_token_table
from radixkv.clock.vidur import GPUS, read_vidur

NAME = "clock.json"
KINDS = ("roofline", "fitted", "profiled")


def _fit_entries(cases, ar):
    fits, entries = {}, {}
    for gpu, (_preset, peak, bw, topo) in GPUS.items():
        train = [c for c in cases if c.prof.gpu == gpu and c.prof.model in E.TRAIN_MODELS]
        f = E.fit_roofline(train, peak, bw)
        fits[gpu] = f
        entries[gpu] = {"peak_flops": peak, "hbm_bytes_per_s": bw, "mfu": f["mfu"], "mbu": f["mbu"],
                        "layer_overhead_s": f["layer_overhead_s"],
                        "all_reduce": {str(w): sample_all_reduce(t) for w, t in ar.get(topo, {}).items()} if topo else {}}
    return fits, entries


def _valid(case, ar):
    """Points with measured truth: at TP > 1, all-reduce messages within the measured sizes."""
    if case.prof.tp == 1:
        return np.ones(case.tokens.shape, dtype=bool)
    t = ar[GPUS[case.prof.gpu][3]][case.prof.tp]
    return case.tokens.astype(np.float64) * case.prof.shape.hidden * E.ACT_BYTES <= t.size_bytes[-1]


def main():
    profs, ar = read_vidur(C.shared("measurements", "vidur"))
    cases, skipped = E.build_cases(profs, ar)
    fits, entries = _fit_entries(cases, ar)
    pts = {}  # (gpu, regime, kind) -> (pred list, meas list)
    case_rows = []
    plot_rows = []
    for c in cases:
        held_model = c.prof.model not in E.TRAIN_MODELS
        ok = _valid(c, ar)
        xs, ys = fitted_token_table(c.prof.shape.linear_params(), c.prof.num_layers, c.prof.shape.hidden,
                                    c.prof.tp, entries[c.prof.gpu])
        preds = {"roofline": E.predict_roofline(c, E.ASSUMED_MFU, E.ASSUMED_MBU),
                 "fitted": E.interp_table(xs, ys, c.tokens)}
        held_tok, preds["profiled"] = E.predict_profiled(c)
        masks = {"roofline": ok & held_model, "fitted": ok & held_model, "profiled": ok & held_tok & held_model}
        reg = E.regime_of(c.tokens)
        row = {"case": c.key, "gpu": c.prof.gpu, "model": c.prof.model, "tp": c.prof.tp, "held_out": held_model,
               "points": int(ok.sum())}
        for k in KINDS:
            e = preds[k] / c.meas_s - 1
            row[f"{k}_signed_median"] = float(np.median(e[ok])) if ok.any() else None
            if not held_model:
                continue
            for r in ("all",) + tuple(n for n, *_ in E.REGIMES):
                m = masks[k] & ((reg == r) if r != "all" else True)
                p, q = pts.setdefault((c.prof.gpu, r, k), ([], []))
                p.append(preds[k][m])
                q.append(c.meas_s[m])
            plot_rows.append((c.prof.gpu, k, c.tokens[masks[k]].tolist(), e[masks[k]].tolist()))
        case_rows.append(row)
    errors, pct = {}, {}
    for (gpu, r, k), (p, q) in sorted(pts.items()):
        st = E.error_stats(np.concatenate(p), np.concatenate(q))
        errors.setdefault(gpu, {}).setdefault(r, {})[k] = st
        pct.setdefault(gpu, {}).setdefault(r, {})[k] = {
            f: (None if st[f] is None else round(100 * st[f], 1)) for f in ("median", "p90", "worst", "signed_median")}
    targets = {}
    for gpu in errors:
        by = [k for k in ("fitted", "profiled") if errors[gpu]["all"][k]["n"]
              and errors[gpu]["all"][k]["median"] <= 0.10 and errors[gpu]["all"][k]["p90"] <= 0.25]
        targets[gpu] = {"met": bool(by), "by": by}
    doc = {
        "split": {"train_models": list(E.TRAIN_MODELS),
                  "held_out_models": sorted({c.prof.model for c in cases} - set(E.TRAIN_MODELS)),
                  "profile_tokens": list(E.PROFILE_TOKENS), "regimes": [list(r[:2]) + [r[2]] for r in E.REGIMES]},
        "fits": {g: {k: f[k] for k in ("mfu", "mbu", "layer_overhead_s", "points")} for g, f in fits.items()},
        "fits_pct": {g: {"mfu": round(100 * f["mfu"], 1), "mbu": round(100 * f["mbu"], 1),
                         "layer_overhead_us": round(1e6 * f["layer_overhead_s"], 1)} for g, f in fits.items()},
        "errors": errors, "pct": pct, "targets": targets, "cases": case_rows, "skipped": skipped,
        "plot": _bands(plot_rows),
        "all_targets_met": all(t["met"] for t in targets.values()),
    }
    C.write_result(NAME, doc, {"vidur": "measurements/vidur", "train_models": list(E.TRAIN_MODELS)})
    _markdown(doc)


def _bands(plot_rows):
    """Per GPU and model: the held-out errors in bins of a quarter octave of Σn (median,
    p10, p90 of pred/meas − 1, rounded to 1e-4) — the figure's data, small enough to keep."""
    out = []
    for gpu in sorted({r[0] for r in plot_rows}):
        for k in KINDS:
            t = np.array([x for r in plot_rows if r[0] == gpu and r[1] == k for x in r[2]], dtype=np.float64)
            e = np.array([x for r in plot_rows if r[0] == gpu and r[1] == k for x in r[3]], dtype=np.float64)
            b = np.floor(4 * np.log2(t)).astype(np.int64)
            rows = []
            for v in np.unique(b):
                w = e[b == v]
                rows.append([round(float(2 ** ((v + 0.5) / 4)), 1), round(float(np.median(w)), 4),
                             round(float(np.percentile(w, 10)), 4), round(float(np.percentile(w, 90)), 4), int(w.size)])
            out.append({"gpu": gpu, "kind": k, "bins": rows})
    return out


def _markdown(doc):
    from radixkv.util import atomic_write_text

    lines = ["| GPU | regime | points | roofline (assumed) median / p90 / signed median | fitted median / p90 / "
             "signed median | profiled median / p90 / signed median |", "|---|---|---|---|---|---|"]
    for gpu, regs in doc["pct"].items():
        for r in ("decode", "mixed", "prefill", "all"):
            if r not in regs:
                continue
            cells = []
            for k in KINDS:
                v = regs[r][k]
                cells.append("n/a" if v["median"] is None else f"{v['median']} % / {v['p90']} % / {v['signed_median']:+} %")
            n = doc["errors"][gpu][r]["roofline"]["n"]
            lines.append(f"| {gpu} | {r} | {n} | " + " | ".join(cells) + " |")
    atomic_write_text(C.result("clock.md"), "\n".join(lines) + "\n")
    print(f"wrote {C.result('clock.md').relative_to(C.REPO)}")


def plot(doc):
    plt = C.pyplot()
    gpus = sorted(doc["errors"])
    fig, axes = plt.subplots(1, len(gpus), figsize=(4.2 * len(gpus), 3.6), sharey=True)
    colors = {"roofline": "tab:red", "fitted": "tab:blue", "profiled": "tab:green"}
    for ax, gpu in zip(np.atleast_1d(axes), gpus):
        for r in doc["plot"]:
            if r["gpu"] != gpu:
                continue
            b = np.array(r["bins"], dtype=np.float64)
            ax.plot(b[:, 0], 100 * b[:, 1], color=colors[r["kind"]], lw=1.2, label=r["kind"])
            ax.fill_between(b[:, 0], 100 * b[:, 2], 100 * b[:, 3], color=colors[r["kind"]], alpha=0.2, lw=0)
        C.logx(ax)
        ax.axhline(0, color="k", lw=0.6)
        for y in (-25, 25):
            ax.axhline(y, color="grey", lw=0.5, ls="--")
        ax.set_ylim(-100, 100)
        ax.set_title(f"{gpu}: held-out models")
        ax.set_xlabel("tokens in the batch (Σn)")
    np.atleast_1d(axes)[0].set_ylabel("pred / measured − 1 (%)\nmedian and p10–p90")
    np.atleast_1d(axes)[0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    C.save_fig(fig, "clock.png")


if __name__ == "__main__":
    C.main_or_plot(main, plot, NAME)
