"""Build the packaged step-time data (``radixkv/clock/data``) from Vidur's measurements.

``python -m radixkv.clock.build VIDUR_DIR OUT_DIR`` (the packaged copy:
``python -m radixkv.clock.build $RADIXKV_SHARED/measurements/vidur radixkv/clock/data``;
tests/test_clock.py checks it is up to date when the measurements are at hand) writes:

- ``fitted.json``: per GPU preset, the roofline's MFU, MBU and per-layer fixed time fitted
  on the training models (:data:`radixkv.clock.error.TRAIN_MODELS`, all their TP degrees
  and token counts; :func:`radixkv.clock.error.fit_roofline`), the GPU's peak FLOP/s and
  bandwidth they refer to, and the measured all-reduce table per GPU count (medians in
  windows of a factor √2 around sizes 2 KiB · 2^k, so a few dozen rows);
- ``profiles.json``: per GPU preset, layer shape (:meth:`~radixkv.clock.vidur.LayerShape.key`)
  and TP degree, one layer's measured token-parallel seconds ``layer_s``, its two
  all-reduces ``comm_s`` and the embedding lookup ``emb_s`` (once per pass) at the breakpoints :data:`radixkv.clock.error.PROFILE_TOKENS`
  (where measured); two models of the same shape (Llama-2-70B and Llama-3-70B) are averaged.

Only GPUs with a radixkv preset are written (A100-80GB, H100-80GB; Vidur's A40 has none).
Every number is derived from Vidur's MIT-licensed data (``data/SOURCE.md``, ``data/LICENSE-vidur``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import radixkv.clock.error as E
from radixkv.clock.vidur import GPUS, read_vidur

#: CPU time per step the packaged models add by default: assumed 0 (radixkv.clock.calibrated)
STEP_OVERHEAD_S = 0.0


def sample_all_reduce(table) -> dict:
    """{size_bytes, seconds} of *table* at sizes 2048 · 2^k (k ≥ 0) up to its largest size
    and the largest itself: the median of the measured medians within a factor √2."""
    xs = table.size_bytes.astype(np.float64)
    out_x, out_y = [], []
    s = 2048.0
    while s < xs[-1]:
        w = (xs >= s / np.sqrt(2)) & (xs < s * np.sqrt(2))
        if w.any():
            out_x.append(int(s))
            out_y.append(float(np.median(table.seconds[w])))
        s *= 2
    out_x.append(int(xs[-1]))
    out_y.append(float(np.median(table.seconds[xs >= xs[-1] / np.sqrt(2)])))
    return {"size_bytes": out_x, "seconds": out_y}


def build(vidur_dir) -> tuple[dict, dict]:
    """(fitted.json, profiles.json) documents from the Vidur folder."""
    profs, ar = read_vidur(vidur_dir)
    cases, _ = E.build_cases(profs, ar)
    src = ("Vidur (github.com/microsoft/vidur, MIT), data/profiling/ at commit "
           "7d47513363ec447a741ac5e47241580b47724fbf; see SOURCE.md")
    fitted = {"source": src, "train_models": list(E.TRAIN_MODELS), "step_overhead_s": STEP_OVERHEAD_S,
              "step_overhead_note": "assumed 0: vLLM V1 overlaps scheduling with the GPU; set step_overhead_s",
              "labels": {"mfu": "fitted", "mbu": "fitted", "layer_overhead_s": "fitted",
                         "peak_flops": "datasheet (radixkv.memory.presets)",
                         "hbm_bytes_per_s": "datasheet (radixkv.memory.presets)",
                         "all_reduce": "measured (Vidur, medians per size window)", "step_overhead_s": "assumed"},
              "gpus": {}}
    prof_doc = {"source": src, "step_overhead_s": STEP_OVERHEAD_S, "tokens_note": "token counts of a batch (Σn)",
                "labels": {"layer_s": "measured: one layer's operator medians, one TP worker, seconds",
                           "comm_s": "measured: two all-reduces of tokens x hidden x 2 bytes, seconds",
                           "emb_s": "measured: the embedding lookup, once per pass, seconds",
                           "step_overhead_s": "assumed"},
                "gpus": {}}
    for gpu, (preset, peak, bw, topo) in GPUS.items():
        if preset is None:
            continue
        train = [c for c in cases if c.prof.gpu == gpu and c.prof.model in E.TRAIN_MODELS]
        fit = E.fit_roofline(train, peak, bw)
        fitted["gpus"][preset] = {
            "vidur_gpu": gpu, "peak_flops": peak, "hbm_bytes_per_s": bw,
            "mfu": round(fit["mfu"], 4), "mbu": round(fit["mbu"], 4),
            "layer_overhead_s": round(fit["layer_overhead_s"], 9),
            "fitted_on_points": fit["points"], "all_reduce_topology": topo,
            "all_reduce": {str(w): sample_all_reduce(t) for w, t in sorted(ar.get(topo, {}).items())},
        }
        by_shape: dict = {}
        for c in cases:
            if c.prof.gpu != gpu:
                continue
            bp = E.profile_breakpoints(c)
            d = by_shape.setdefault(c.prof.shape.key(), {}).setdefault(str(c.prof.tp), [])
            d.append((c.prof.model, c.tokens[bp], c.prof.layer_s[bp], c.comm_s[bp], c.prof.emb_s[bp]))
        gp = prof_doc["gpus"][preset] = {}
        for key in sorted(by_shape):
            gp[key] = {}
            for tp in sorted(by_shape[key], key=int):
                rows = by_shape[key][tp]
                common = rows[0][1]
                for r in rows[1:]:
                    common = np.intersect1d(common, r[1])
                ls = np.mean([r[2][np.isin(r[1], common)] for r in rows], axis=0)
                cs = np.mean([r[3][np.isin(r[1], common)] for r in rows], axis=0)
                es = np.mean([r[4][np.isin(r[1], common)] for r in rows], axis=0)
                gp[key][tp] = {"from": " + ".join(r[0] for r in rows), "tokens": [int(v) for v in common],
                               "layer_s": [round(float(v), 9) for v in ls], "comm_s": [round(float(v), 9) for v in cs],
                               "emb_s": [round(float(v), 9) for v in es]}
    return fitted, prof_doc


def main(argv=None) -> int:
    from radixkv.util import atomic_write_text, dumps_json

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m radixkv.clock.build VIDUR_DIR OUT_DIR", file=sys.stderr)
        return 2
    fitted, prof = build(argv[0])
    out = Path(argv[1])
    atomic_write_text(out / "fitted.json", dumps_json(fitted))
    atomic_write_text(out / "profiles.json", dumps_json(prof))
    print(f"wrote {out / 'fitted.json'}, {out / 'profiles.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
