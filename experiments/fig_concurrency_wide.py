"""Cache on vs off across load, traces, models and GPUs on the checked clock (issue 29, item 1).

The widened concurrency study. For every configuration — a trace × a model/GPU/TP ×
an engine (vLLM ``vllm:16`` with vLLM's step rules, SGLang ``sglang:1`` with SGLang's) —
cache on (the engine's prefix cache) is replayed against cache off (``NoCache`` on the
same pool under the same engine's rules: vLLM ``--no-enable-prefix-caching``, SGLang
``--disable-radix-cache``; as ``fig_concurrent.py`` does) with
``radixkv.replay.concurrent.replay_concurrent`` priced by the **fitted** step-time model
(``radixkv.clock.cost_model("fitted", ...)``; docs/clock.md: 4–5 % median error on
held-out Vidur operator timings):

- traces: Mooncake conversation, WEKA agentic coding, RAGPulse RAG, and Azure
  conversation (lengths only: every hit is 0, the zero-hit control);
- hardware: Llama-3.1-8B on one A100-80GB and on one H100-80GB, Llama-3.1-70B at TP 4 on
  A100-80GB and on H100-80GB;
- pools from radixkv's memory model with the engines' defaults
  (:func:`engine_knobs`): vLLM's default ``gpu_memory_utilization`` (0.92) and its OpenAI server's
  batch defaults for the GPU, SGLang's default ``mem_fraction_static`` and
  ``chunked_prefill_size``;
- slices: :data:`SLICES` disjoint windows of each trace (:func:`slice_starts`), requests
  longer than the model's context dropped first (an engine rejects them);
- load: the saturation rate of each configuration is estimated first
  (:func:`saturation_rps`: every request of a slice arrives at t = 0, cache off; the
  completion rate between the 10th and 90th percentile finish), averaged over the slices;
  then arrivals are re-timed as a Poisson process (seed = slice index, the trace's order
  kept) at :data:`LOAD_FRACTIONS` of that rate (:func:`load_rates`), the same loads for
  cache on and off;
- statistics: per load, each metric's mean over the slices with a Student-t 95 %
  interval, and the paired on/off ratio per slice with its t-interval
  (:func:`paired_ratio`); cache on *loses* on a metric where that interval lies wholly on
  the worse side of 1 (:func:`on_worse`).

    python experiments/fig_concurrency_wide.py [--quick] [--jobs N]   # N worker processes (default 1)
        # writes results/concurrency_wide.json, concurrency_wide.png

Full: 4 traces × 4 hardware × 2 engines × 5 slices × (2 saturation bursts + 6 loads × 2
modes) = 2,240 replays of 480–1,000 requests: 11 minutes on one core of a shared 2-core
machine (127 s of saturation bursts, 509 s of loads) once the compiled loops are cached
(their first compilation takes a few minutes); --quick: Mooncake and RAGPulse,
Llama-3.1-8B on the A100, 3 slices of 300 (168 replays, 25 s warm).
"""
from __future__ import annotations

import _common as C  # noqa: I001

import math
import sys
import time

import numpy as np

from radixkv.memory.engine_defaults import SGLANG_DEFAULT_MAX_RUNNING_REQUESTS

#: (label, model preset, GPU preset, tensor-parallel degree)
HARDWARE = [("8B-A100", "Llama-3.1-8B", "A100-80GB", 1), ("8B-H100", "Llama-3.1-8B", "H100-80GB", 1),
            ("70B-A100x4", "Llama-3.1-70B", "A100-80GB", 4), ("70B-H100x4", "Llama-3.1-70B", "H100-80GB", 4)]
ENGINES = {"vllm": "vllm:16", "sglang": "sglang:1"}
TRACES = ("mooncake", "weka", "ragpulse", "azure_conv")
#: the zero-hit control (lengths only)
CONTROL = "azure_conv"
#: offered load as fractions of the configuration's saturation rate (cache off)
LOAD_FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.1, 1.5)
SLICES = 5
#: requests per slice (WEKA keeps 2,472 of its 3,238 requests within 128 K tokens: 5 × 480 fit)
SLICE_REQUESTS = {"mooncake": 1000, "weka": 480, "ragpulse": 1000, "azure_conv": 1000}
CLOCK = "fitted"
#: SGLang's max_running_requests when unset (the library's assumed value)
SGLANG_MAX_RUNNING = SGLANG_DEFAULT_MAX_RUNNING_REQUESTS
#: what each cell keeps of a replay's summary
METRICS = ("token_hit_rate", "ttft_p50_s", "ttft_p99_s", "throughput_total_tokens_per_s", "concurrency_mean",
           "e2e_p50_s", "preemptions", "duration_s")
#: the metrics the on/off verdict is taken on, and which direction is worse for cache on
WORSE_IF = {"ttft_p50_s": "higher", "ttft_p99_s": "higher", "throughput_total_tokens_per_s": "lower",
            "concurrency_mean": "lower"}


def engine_knobs(engine: str, gpu: str) -> dict:
    """The engine's default serving knobs on *gpu* (an A100 or H100 preset name):
    :func:`radixkv.memory.engine_batch_defaults` (vLLM ``vllm/engine/arg_utils.py ::
    EngineArgs.get_batch_defaults``, OpenAI server, and ``gpu_memory_utilization`` 0.92;
    SGLang ``arg_groups/memory_hook.py :: handle_gpu_memory_settings``; docs/engines/vllm.md
    §4, docs/engines/sglang.md §2): on an A100 vLLM runs ``max_num_batched_tokens`` 2048 and
    ``max_num_seqs`` 256, on an H100 8192 and 1024; SGLang ``chunked_prefill_size`` 8192 on
    both, ``max_running_requests`` 2,048 (assumed) and ``mem_fraction_static`` None (the
    memory model computes SGLang's default).

    Returns
    -------
    dict
        ``max_num_batched_tokens``, ``max_num_seqs`` (int) and ``memory_fraction``
        (float, vLLM; None for SGLang's computed default).

    Raises
    ------
    ValueError
        An engine other than vllm/sglang or a GPU other than an A100/H100 preset (the
        fitted clock covers those).
    """
    from radixkv.memory import engine_batch_defaults

    if not (gpu.startswith("A100") or gpu.startswith("H100")):
        raise ValueError(f"engine_knobs: GPU {gpu!r} is not an A100 or H100 preset (the fitted clock covers those)")
    return engine_batch_defaults(engine, gpu)


def slice_starts(n_requests: int, n_slices: int, size: int) -> list:
    """First request of each of *n_slices* disjoint windows of *size* requests spread over
    *n_requests*: window k starts at ``k · (n_requests // n_slices)``.

    Raises
    ------
    ValueError
        When *size* exceeds ``n_requests // n_slices`` (the windows would overlap) or a
        count is not positive.
    """
    if n_slices < 1 or size < 1:
        raise ValueError(f"slice_starts: n_slices and size must be ≥ 1, got {n_slices}, {size}")
    step = n_requests // n_slices
    if size > step:
        raise ValueError(f"slice_starts: {n_slices} windows of {size} requests do not fit disjointly in "
                         f"{n_requests} requests (at most {step} each)")
    return [k * step for k in range(n_slices)]


def saturation_rps(finish_s, lo: float = 0.1, hi: float = 0.9) -> float:
    """Completion rate (requests/s) of a replay whose requests all arrived at t = 0, between
    its ``lo`` and ``hi`` quantile finishes: with ``f`` the sorted finish times,
    ``i = ceil(lo·n) − 1``, ``j = ceil(hi·n) − 1`` (products within 1e-9 of an integer taken as it), the rate is ``(j − i) / (f[j] − f[i])``
    (the start-up and the drain of the last long requests left out).

    Parameters
    ----------
    finish_s : array-like of float, shape (n,), seconds
    lo, hi : float
        Quantiles, 0 < lo < hi ≤ 1.

    Raises
    ------
    ValueError
        Fewer than two distinct finishes in the window, or bad quantiles.
    """
    if not 0 < lo < hi <= 1:
        raise ValueError(f"saturation_rps: need 0 < lo < hi <= 1, got {lo}, {hi}")
    f = np.sort(np.asarray(finish_s, dtype=np.float64))
    n = f.size
    i, j = math.ceil(lo * n - 1e-9) - 1, math.ceil(hi * n - 1e-9) - 1  # 0.9 · 30 is 27.000000000000004
    if n < 2 or j <= i or not f[j] > f[i]:
        raise ValueError(f"saturation_rps: {n} finishes give no time between quantiles {lo} and {hi}")
    return float((j - i) / (f[j] - f[i]))


def load_rates(sat_rps: float, fractions=LOAD_FRACTIONS) -> list:
    """Offered request rates (requests/s): each fraction × *sat_rps*."""
    if not sat_rps > 0:
        raise ValueError(f"load_rates: the saturation rate must be > 0, got {sat_rps}")
    return [float(f) * float(sat_rps) for f in fractions]


def paired_ratio(on, off) -> dict:
    """Per-slice ratio ``on[k] / off[k]`` with its mean and Student-t 95 % half-width
    (``_common.mean_ci``); None where some *off* value is 0 or either side is missing."""
    if any(a is None or b is None or b == 0 for a, b in zip(on, off)):
        return {"mean": None, "ci95": None, "n": len(on), "values": None}
    return C.mean_ci([a / b for a, b in zip(on, off)])


def on_worse(ratio: dict, worse_if: str):
    """Whether cache on is worse than off beyond the 95 % interval of the paired ratio:
    ``higher`` → ``mean − ci95 > 1``; ``lower`` → ``mean + ci95 < 1``. None when the ratio
    is missing. (With all ratios equal the half-width is 0 and any difference counts.)"""
    if ratio.get("mean") is None:
        return None
    m, h = ratio["mean"], ratio["ci95"]
    if worse_if == "higher":
        return bool(m - h > 1)
    if worse_if == "lower":
        return bool(m + h < 1)
    raise ValueError(f"on_worse: worse_if must be 'higher' or 'lower', got {worse_if!r}")


def on_better(ratio: dict, worse_if: str):
    """The mirror of :func:`on_worse`: the interval lies wholly on the better side of 1."""
    if ratio.get("mean") is None:
        return None
    flip = {"higher": "lower", "lower": "higher"}[worse_if]
    return on_worse(ratio, flip)


# --------------------------------------------------------------------------- replays
_TR: dict = {}


def _slices(name: str, model: str, n_slices: int, size: int):
    """The trace's disjoint windows (requests over the model's context dropped first) and
    how many were dropped."""
    from radixkv.memory.presets import get_model
    from radixkv.replay.routing import take

    key = (name, model, n_slices, size)
    if key not in _TR:
        tr = C.load(name)
        ctx = get_model(model).max_position_embeddings
        keep = np.flatnonzero(np.asarray(tr.prompt_len, dtype=np.int64) + np.asarray(tr.output_len, dtype=np.int64) <= ctx)
        starts = slice_starts(len(keep), n_slices, size)
        _TR[key] = ([take(tr, keep[s:s + size]) for s in starts], int(len(tr) - len(keep)), starts)
    return _TR[key]


def _pool(engine: str, model: str, gpu: str, tp: int) -> int:
    from radixkv.memory import pool_for

    k = engine_knobs(engine, gpu)
    if engine == "vllm":
        return pool_for("vllm", model, gpu, tp=tp, gpu_memory_utilization=k["memory_fraction"],
                        max_num_batched_tokens=k["max_num_batched_tokens"]).capacity_tokens
    return pool_for("sglang", model, gpu, tp=tp).capacity_tokens


def _replay(tr, engine, mode, model, gpu, tp, arrivals):
    from radixkv.clock import cost_model
    from radixkv.policies.no_cache import NoCache
    from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
    from radixkv.replay.concurrent import replay_concurrent
    from radixkv.replay.scheduler import SchedulerConfig

    cap = _pool(engine, model, gpu, tp)
    pol = build_policy(parse_policy(ENGINES[engine]), PoolSpec(capacity_tokens=cap))
    if mode == "off":
        pol = NoCache(pol.num_slots, pol.slot_tokens)
    k = engine_knobs(engine, gpu)
    cfg = SchedulerConfig(max_num_batched_tokens=k["max_num_batched_tokens"], max_num_seqs=k["max_num_seqs"],
                          admission=engine)
    return replay_concurrent(tr, pol, cost_model(CLOCK, model, gpu, tp=tp), arrivals=arrivals, config=cfg)


def _job(job: tuple) -> dict:
    """One replay: ``(kind, trace, hw label, engine, mode, slice, rate or None)``; a burst
    (rate None) returns the saturation rate, a load its summary metrics."""
    from radixkv.replay.arrivals import arrival_times

    kind, name, hw, engine, mode, k, rate = job
    _, model, gpu, tp = next(h for h in hardware(C.QUICK) if h[0] == hw)
    n_sl, size = n_slices(C.QUICK), slice_size(name, C.QUICK)
    tr = _slices(name, model, n_sl, size)[0][k]
    t0 = time.process_time()
    if kind == "burst":
        res = _replay(tr, engine, mode, model, gpu, tp, np.zeros(len(tr)))
        out = {"saturation_rps": saturation_rps(res["finish_s"])}
    else:
        arr = arrival_times(tr, arrival="poisson", request_rate=rate, seed=k)
        s = _replay(tr, engine, mode, model, gpu, tp, arr).summary()
        out = {m: s.get(m) for m in METRICS}
    print(f"  {kind} {name} {hw} {engine} {mode} slice {k} rate {rate}: {time.process_time() - t0:.2f} s CPU",
          file=sys.stderr, flush=True)
    return out


def hardware(quick: bool) -> list:
    return HARDWARE[:1] if quick else HARDWARE


def traces(quick: bool) -> tuple:
    return ("mooncake", "ragpulse") if quick else TRACES


def n_slices(quick: bool) -> int:
    return 3 if quick else SLICES


def slice_size(name: str, quick: bool) -> int:
    return 300 if quick else SLICE_REQUESTS[name]


def _run(jobs: list, k: int) -> list:
    return C.map_jobs(_job, jobs, k)


def jobs_arg() -> int:
    """``--jobs N`` (default 1): worker processes for the independent replays."""
    argv = sys.argv[1:]
    return int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 1


def main() -> None:
    from radixkv.replay.run import warmup_many
    from radixkv.policies.registry import parse_policy

    q = C.QUICK
    S = n_slices(q)
    for name in traces(q):  # loaded (and sliced) before the workers fork
        for _, model, _, _ in hardware(q):
            _slices(name, model, S, slice_size(name, q))
    warmup_many([parse_policy(p) for p in ENGINES.values()])
    configs = [(name, hw, engine) for name in traces(q) for hw, *_ in hardware(q) for engine in ENGINES]
    t0 = time.perf_counter()
    bursts = [("burst", name, hw, engine, mode, k, None) for name, hw, engine in configs
              for mode in ("off", "on") for k in range(S)]
    sat = dict(zip(bursts, _run(bursts, jobs_arg())))
    print(f"saturation bursts: {len(bursts)} replays, {time.perf_counter() - t0:.0f} s", flush=True)
    conf_rows, loads = [], []
    for name, hw, engine in configs:
        _, model, gpu, tp = next(h for h in hardware(q) if h[0] == hw)
        off = [sat[("burst", name, hw, engine, "off", k, None)]["saturation_rps"] for k in range(S)]
        on = [sat[("burst", name, hw, engine, "on", k, None)]["saturation_rps"] for k in range(S)]
        sl, dropped, starts = _slices(name, model, S, slice_size(name, q))
        kn = engine_knobs(engine, gpu)
        sat_off = C.mean_ci(off)
        conf_rows.append({"trace": name, "hw": hw, "model": model, "gpu": gpu, "tp": tp, "engine": engine,
                          "pool_tokens": int(_pool(engine, model, gpu, tp)), **kn,
                          "slice_requests": len(sl[0]), "slice_starts": starts, "dropped_over_context": dropped,
                          "saturation_rps_off": sat_off, "saturation_rps_on": C.mean_ci(on),
                          "saturation_on_over_off": paired_ratio(on, off)})
        for frac, rate in zip(LOAD_FRACTIONS, load_rates(sat_off["mean"])):
            for mode in ("on", "off"):
                for k in range(S):
                    loads.append(("load", name, hw, engine, mode, k, rate, frac))
    t1 = time.perf_counter()
    res = _run([j[:7] for j in loads], jobs_arg())
    print(f"loads: {len(loads)} replays, {time.perf_counter() - t1:.0f} s", flush=True)
    by = {j: r for j, r in zip(loads, res)}
    cells = []
    for name, hw, engine in configs:
        rates = load_rates(next(c for c in conf_rows if (c["trace"], c["hw"], c["engine"]) == (name, hw, engine))
                           ["saturation_rps_off"]["mean"])
        for frac, rate in zip(LOAD_FRACTIONS, rates):
            per = {mode: [by[("load", name, hw, engine, mode, k, rate, frac)] for k in range(S)] for mode in ("on", "off")}
            cell = {"trace": name, "hw": hw, "engine": engine, "load_fraction": frac, "rate_rps": rate}
            for mode in ("on", "off"):
                cell[mode] = {m: (C.mean_ci([r[m] for r in per[mode]]) if all(r[m] is not None for r in per[mode])
                                  else None) for m in METRICS}
            cell["on_over_off"] = {m: paired_ratio([r[m] for r in per["on"]], [r[m] for r in per["off"]])
                                   for m in WORSE_IF}
            cell["on_worse"] = {m: on_worse(cell["on_over_off"][m], w) for m, w in WORSE_IF.items()}
            cell["on_better"] = {m: on_better(cell["on_over_off"][m], w) for m, w in WORSE_IF.items()}
            cells.append(cell)
            r = cell["on_over_off"]
            print(f"{name:10} {hw:10} {engine:6} x{frac:<4} hit {cell['on']['token_hit_rate']['mean']:.3f} "
                  f"ttft50 on/off {r['ttft_p50_s']['mean']:.3f}±{r['ttft_p50_s']['ci95']:.3f} "
                  f"tput {r['throughput_total_tokens_per_s']['mean']:.3f}±{r['throughput_total_tokens_per_s']['ci95']:.3f} "
                  f"conc {r['concurrency_mean']['mean']:.3f} worse {[m for m, v in cell['on_worse'].items() if v]}",
                  flush=True)
    doc = {"configs": conf_rows, "cells": cells, "load_fractions": list(LOAD_FRACTIONS), "slices": S}
    doc["findings"] = findings(doc)
    C.write_result("concurrency_wide.json", doc, {
        "clock": CLOCK, "engines": ENGINES, "hardware": hardware(q), "traces": list(traces(q)), "control": CONTROL,
        "slices": S, "slice_requests": {t: slice_size(t, q) for t in traces(q)}, "load_fractions": list(LOAD_FRACTIONS),
        "arrival": "poisson, seed = slice index, trace order kept; saturation: all arrivals at t = 0, cache off, "
                   "completion rate between the 10th and 90th percentile finish, mean over slices",
        "ci": "Student t 95 % over the slices; on/off: t-interval of the per-slice paired ratio",
        "sglang_max_running_requests": SGLANG_MAX_RUNNING,
        "scheduler_commit": C._git("log", "-1", "--format=%H", "--", "radixkv/replay"),
        "clock_commit": C._git("log", "-1", "--format=%H", "--", "radixkv/clock")})


def findings(doc: dict) -> dict:
    """Counts the paper's sentences are rendered from.

    For the prefix traces (all but :data:`CONTROL`) and for the control: cells, and per
    verdict metric the cells where cache on is worse / better beyond the interval and the
    worst mean ratio (with its cell); the saturation gain (on/off) range over the
    configurations; the hit-rate range at half load. For the control, the largest
    ``|on/off − 1|`` of any metric (0 when the cache changes nothing).
    """
    out: dict = {}
    for group, sel in (("prefix", lambda c: c["trace"] != CONTROL), ("control", lambda c: c["trace"] == CONTROL)):
        cs = [c for c in doc["cells"] if sel(c)]
        if not cs:
            continue
        g: dict = {"cells": len(cs)}
        for m, w in WORSE_IF.items():
            worse = [c for c in cs if c["on_worse"][m]]
            better = [c for c in cs if c["on_better"][m]]
            have = [c for c in cs if c["on_over_off"][m]["mean"] is not None]
            pick = max if w == "higher" else min
            wc = pick(have, key=lambda c: c["on_over_off"][m]["mean"]) if have else None
            g[m] = {"on_worse": len(worse), "on_better": len(better),
                    "on_worse_below_saturation": sum(c["load_fraction"] < 1 for c in worse),
                    "on_worse_above_saturation": sum(c["load_fraction"] > 1 for c in worse),
                    "cells_below_saturation": sum(c["load_fraction"] < 1 for c in cs),
                    "cells_above_saturation": sum(c["load_fraction"] > 1 for c in cs),
                    "worst_ratio": wc["on_over_off"][m]["mean"] if wc else None,
                    "worst_ratio_ci95": wc["on_over_off"][m]["ci95"] if wc else None,
                    "worst_cell": {k: wc[k] for k in ("trace", "hw", "engine", "load_fraction")} if wc else None,
                    "worse_cells": [{k: c[k] for k in ("trace", "hw", "engine", "load_fraction")} |
                                    {"ratio": c["on_over_off"][m]["mean"], "ci95": c["on_over_off"][m]["ci95"]}
                                    for c in worse]}
        hits = [c["on"]["token_hit_rate"]["mean"] for c in cs if c["load_fraction"] == 0.5]
        g["hit_rate_at_half_load"] = {"min": min(hits), "max": max(hits)} if hits else None
        confs = [c for c in doc["configs"] if sel(c)]
        gains = [c["saturation_on_over_off"]["mean"] for c in confs if c["saturation_on_over_off"]["mean"] is not None]
        g["saturation_on_over_off"] = {"min": min(gains), "max": max(gains)} if gains else None
        if group == "control":
            g["max_abs_rel_diff"] = max(abs(c["on_over_off"][m]["mean"] - 1) for c in cs for m in WORSE_IF
                                        if c["on_over_off"][m]["mean"] is not None)
        out[group] = g
    # per prefix trace: the saturation gain range and how many cells lose on TTFT p50
    for name in dict.fromkeys(c["trace"] for c in doc["configs"]):
        if name == CONTROL:
            continue
        confs = [c for c in doc["configs"] if c["trace"] == name]
        cs = [c for c in doc["cells"] if c["trace"] == name]
        out[name] = {"saturation_on_over_off": {"min": min(c["saturation_on_over_off"]["mean"] for c in confs),
                                                "max": max(c["saturation_on_over_off"]["mean"] for c in confs)},
                     "cells": len(cs), **{f"{m}_on_worse": sum(bool(c["on_worse"][m]) for c in cs) for m in WORSE_IF}}
    return out


def plot(doc: dict) -> None:
    plt = C.pyplot()
    trs = list(dict.fromkeys(c["trace"] for c in doc["cells"]))
    hws = list(dict.fromkeys(c["hw"] for c in doc["cells"]))
    metrics = [("ttft_p50_s", "TTFT p50 on / off"), ("ttft_p99_s", "TTFT p99 on / off"),
               ("throughput_total_tokens_per_s", "throughput on / off"), ("concurrency_mean", "mean running on / off")]
    fig, axes = plt.subplots(len(trs), len(metrics), figsize=(4.2 * len(metrics), 2.9 * len(trs)), squeeze=False)
    colors = {hw: f"C{i}" for i, hw in enumerate(hws)}
    style = {"vllm": "-", "sglang": "--"}
    for i, name in enumerate(trs):
        for j, (m, lab) in enumerate(metrics):
            ax = axes[i][j]
            for hw in hws:
                for engine in ENGINES:
                    cs = sorted((c for c in doc["cells"] if (c["trace"], c["hw"], c["engine"]) == (name, hw, engine)),
                                key=lambda c: c["load_fraction"])
                    x = [c["load_fraction"] for c in cs]
                    y = [np.nan if c["on_over_off"][m]["mean"] is None else c["on_over_off"][m]["mean"] for c in cs]
                    e = [0 if c["on_over_off"][m]["ci95"] is None else c["on_over_off"][m]["ci95"] for c in cs]
                    ax.errorbar(x, y, yerr=e, color=colors[hw], linestyle=style[engine], marker="o", ms=3,
                                capsize=2, lw=1.1, alpha=0.85, label=f"{hw} {engine}")
            ax.axhline(1.0, color="0.3", lw=0.8)
            ax.axvline(1.0, color="0.6", lw=0.8, linestyle=":")
            ax.set_title(f"{name}: {lab}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if i == len(trs) - 1:
                ax.set_xlabel("offered load / saturation rate (cache off)")
    axes[0][0].legend(fontsize=6, ncol=2)
    fig.suptitle(f"Cache on / off vs offered load, fitted clock, mean over {doc['slices']} slices ± 95 % t-interval "
                 "(below 1 = on lower)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    C.save_fig(fig, "concurrency_wide.png")


if __name__ == "__main__":
    C.main_or_plot(main, plot, "concurrency_wide.json")
