"""Concurrent replay: does the cache take memory from running requests? (claims C1, C2, C4, C8, C9, C14).

Mooncake conversation (first requests; real arrival times, ×1 = the real rate, which
overloads one GPU, and stretched ×10) replayed with continuous batching, chunked prefill
and preemption (``radixkv.replay.concurrent.replay_concurrent``), Llama-3.1-8B priced by
the roofline cost model on A100 GPUs, through both engines' caches:

- vLLM block 16 with vLLM's admission rules, SGLang page 1 with SGLang's;
- cache on / off (``NoCache`` on the same pool) / statically reserved (30 % of the pool
  held for cached prefixes, ``StaticReservedCache`` in 16-token blocks under either
  engine's scheduler: the design claims C2 and C8 picture);
- memory pressure: the KV pool vLLM's memory model gives for ``gpu_memory_utilization``
  0.80 / 0.85 / 0.90 / 0.95 on an A100-80GB and 0.90 on an A100-40GB (both engines get the
  same pool in tokens) × load (time scale 1 and 10);
- cost-model sensitivity: MFU 0.4 / 0.6 / 0.8 × MBU 0.6 / 0.8, cache on vs off;
- ``max_num_batched_tokens`` 2048 … 16384 (C14);
- Azure conversation (lengths only, so every hit is 0): caching on vs off at zero hit rate;
- the pool's split over time (running / evictable cache / free) with the cache on vs off,
  sampled after every step that finishes a request.

    python experiments/fig_concurrent.py [--quick] [--jobs N]   # N worker processes (default 2)
        # writes results/concurrent.json, concurrent_pressure.png, pool_split.png

Full: 74 replays of 1,500 requests, 83 CPU-seconds in all (~1.5 min on 2 idle cores; 6 min
with --jobs 2 on a shared machine at load 13); --quick: 300 requests, the same cells (every cell the paper quotes renders in the quick paper).
"""
from __future__ import annotations

import _common as C  # noqa: I001

import sys
import time

import numpy as np

from radixkv.cost import CostModel
from radixkv.errors import ConfigError
from radixkv.memory import pool_for
from radixkv.policies.no_cache import NoCache
from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.policies.static_reserved import StaticReservedCache
from radixkv.replay.arrivals import arrival_times
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.run import warmup_many
from radixkv.replay.scheduler import SchedulerConfig

MODEL = "Llama-3.1-8B"
ENGINES = {"vllm": "vllm:16", "sglang": "sglang:1"}
MODES = ["on", "off", "static"]
STATIC_FRACTION = 0.3
#: block size of the static-reserved design under both engines' schedulers. It is no engine's
#: design, so it need not copy SGLang's page 1; on Mooncake (512-token hash blocks) page 1 and
#: block 16 give the same hits (150 requests, A100-80GB@0.90, ×1, SGLang's scheduler: hit rate
#: 0.03566 both, mean running 17.40 vs 17.41, throughput equal to 4 digits), while page 1 makes
#: its pure-Python LRU 17x slower (30 s vs 1.8 s; > 20 CPU-minutes per 1,500-request cell).
STATIC_BLOCK = 16
KEEP = ("token_hit_rate", "concurrency_mean", "concurrency_busy_mean", "concurrency_peak", "ttft_p50_s",
        "ttft_p99_s", "ttft_mean_s", "tpot_p50_s", "e2e_p50_s", "throughput_total_tokens_per_s",
        "throughput_output_tokens_per_s", "preemptions", "recomputed_tokens", "duration_s",
        "pool_used_share_mean", "pool_cached_share_mean", "internal_fragmentation_share_mean",
        "prefill_flops", "prefill_flops_saved", "steps")


def pressures(quick: bool) -> list:
    """(label, GPU, gpu_memory_utilization) of each memory-pressure level."""
    full = [("A100-40GB@0.90", "A100-40GB", 0.90), ("A100-80GB@0.80", "A100-80GB", 0.80),
            ("A100-80GB@0.90", "A100-80GB", 0.90), ("A100-80GB@0.95", "A100-80GB", 0.95)]
    return full  # the quick run keeps every cell the paper quotes (fewer requests instead)


def _policy(engine: str, mode: str, cap: int):
    pol = build_policy(parse_policy(ENGINES[engine]), PoolSpec(capacity_tokens=cap))
    if mode == "off":
        return NoCache(pol.num_slots, pol.slot_tokens)
    if mode == "static":  # the same 16-token blocks under either engine's scheduler (see STATIC_BLOCK)
        return StaticReservedCache(int(cap) // STATIC_BLOCK, STATIC_BLOCK, STATIC_FRACTION)
    return pol


def run(tr, engine, mode, cap, gpu, *, scale=1.0, mfu=0.6, mbu=0.8, mnbt=8192, timeline=False) -> dict:
    pol = _policy(engine, mode, cap)
    cost = CostModel.from_specs(MODEL, gpu, mfu=mfu, mbu=mbu)
    cfg = SchedulerConfig(max_num_batched_tokens=mnbt, admission=engine)
    arr = arrival_times(tr, arrival="trace", time_scale=scale)

    meta = {"engine": engine, "mode": mode, "pool_tokens": int(cap), "gpu": gpu, "time_scale": scale,
            "mfu": mfu, "mbu": mbu, "max_num_batched_tokens": mnbt}
    try:
        res = replay_concurrent(tr, pol, cost, arrivals=arr, config=cfg, timeline=timeline)
    except ConfigError as e:  # e.g. the static reservation leaves too little for the longest request
        return {**{k: None for k in KEEP}, **meta, "not_run": str(e).split(": ", 1)[-1]}
    s = res.summary()
    out = {k: s.get(k) for k in KEEP}
    out.update(meta)
    if timeline:
        # the engine's own per-step pool split (ConcurrentResult.timeline), thinned to at most
        # TIMELINE_POINTS evenly spaced steps (the last one kept); sampling it from progress
        # calls gave a few rows only where the compiled loop reports progress in batches
        tl = res.timeline
        k = np.unique(np.linspace(0, len(tl["step"]) - 1, min(TIMELINE_POINTS, len(tl["step"]))).astype(np.int64))
        slots = pol.num_slots
        out["timeline"] = {"time_s": [float(t) for t in tl["time_s"][k]],
                           "running_share": [int(u) / slots for u in tl["pool_running_slots"][k]],
                           "cached_share": [int(c) / slots for c in tl["pool_cached_slots"][k]],
                           "free_share": [int(f) / slots for f in tl["pool_free_slots"][k]]}
    return out


#: rows of the pool-split timeline kept in the results (Fig. 6)
TIMELINE_POINTS = 1500


_TRACES: dict = {}


def _cell(job: tuple) -> dict:
    """One concurrent replay: ``(group, extra fields, trace name, n, run() args, run() kwargs)``.

    Runs in a worker process (``--jobs``); the trace is loaded once per worker."""
    group, extra, name, n, args, kw = job
    if (name, n) not in _TRACES:
        _TRACES[(name, n)] = C.load(name, n)
    t0, c0 = time.perf_counter(), time.process_time()
    r = run(_TRACES[(name, n)], *args, **kw)
    r.update(extra)
    # timing goes to stderr only: the result file stays byte-identical across runs
    print(f"  cell {group} {name} {args[0]} {args[1]} pool {args[2]} {kw}: {time.perf_counter() - t0:.1f} s wall, "
          f"{time.process_time() - c0:.1f} s CPU", file=sys.stderr, flush=True)
    return r


def jobs_arg() -> int:
    """``--jobs N`` (default 2): worker processes for the independent replays."""
    argv = sys.argv[1:]
    return int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 2


def main() -> None:
    q = C.QUICK
    n = 300 if q else 1500
    C.load("mooncake", n)  # recorded for provenance; workers load their own copy
    C.load("azure_conv", n)
    warmup_many([parse_policy(p) for p in ENGINES.values()] + [parse_policy("static:16")])
    scales = [1.0, 10.0]
    base_gpu, base_gmu = "A100-80GB", 0.90
    base_cap = pool_for("vllm", MODEL, base_gpu, gpu_memory_utilization=base_gmu).capacity_tokens
    jobs = []
    for label, gpu, gmu in pressures(q):
        cap = pool_for("vllm", MODEL, gpu, gpu_memory_utilization=gmu).capacity_tokens
        for scale in scales:
            for engine in ENGINES:
                for mode in MODES:
                    jobs.append(("grid", {"pressure": label, "gpu_memory_utilization": gmu}, "mooncake", n,
                                 (engine, mode, cap, gpu), {"scale": scale}))
    for mfu, mbu in [(0.4, 0.8), (0.6, 0.8), (0.8, 0.8), (0.6, 0.6)]:
        for mode in ("on", "off"):
            jobs.append(("sensitivity", {}, "mooncake", n, ("vllm", mode, base_cap, base_gpu),
                         {"scale": 10.0, "mfu": mfu, "mbu": mbu}))
    for mnbt in [2048, 4096, 8192, 16384]:
        for engine in ENGINES:
            jobs.append(("max_num_batched_tokens", {}, "mooncake", n, (engine, "on", base_cap, base_gpu),
                         {"scale": 10.0, "mnbt": mnbt}))
    for mode in ("on", "off"):
        jobs.append(("timeline", {}, "mooncake", n, ("vllm", mode, base_cap, base_gpu), {"scale": 1.0, "timeline": True}))
    for label, gpu, gmu in pressures(q)[:1] + [("A100-80GB@0.90", "A100-80GB", 0.90)]:
        cap = pool_for("vllm", MODEL, gpu, gpu_memory_utilization=gmu).capacity_tokens
        for engine in ENGINES:
            for mode in ("on", "off"):
                jobs.append(("azure", {"pressure": label}, "azure_conv", n, (engine, mode, cap, gpu), {"scale": 1.0}))
    rows = C.map_jobs(_cell, jobs, jobs_arg())
    out: dict = {"grid": [], "sensitivity": [], "max_num_batched_tokens": [], "timeline": [], "azure": []}
    for job, r in zip(jobs, rows):
        out[job[0]].append(r)
        if job[0] == "grid":
            print(f"{r['pressure']} x{r['time_scale']:g} {r['engine']:6} {r['mode']:6}: " + (r.get("not_run") or
                  f"hit {r['token_hit_rate']:.3f} conc {r['concurrency_mean']:.1f} peak {r['concurrency_peak']} "
                  f"ttft50 {r['ttft_p50_s']:.1f}s tput {r['throughput_total_tokens_per_s']:.0f} "
                  f"pre {r['preemptions']}"), flush=True)
    doc = {"trace_requests": n, **out, "base": {"gpu": base_gpu, "gpu_memory_utilization": base_gmu,
                                                "pool_tokens": base_cap}}
    doc["findings"] = findings(doc)
    C.write_result("concurrent.json", doc, {
        "model": MODEL, "engines": ENGINES, "modes": MODES, "static_fraction": STATIC_FRACTION,
        "static_block_size": STATIC_BLOCK,
        "pressures": pressures(q), "time_scales": scales, "requests": n, "arrival": "trace",
        "scheduler_commit": C._git("log", "-1", "--format=%H", "--", "radixkv/replay"),
        "cost_model": "roofline, mfu 0.6, mbu 0.8 unless stated", "max_num_seqs": 256})


def _cells(rows: list, **match) -> list:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def _ratios(pairs: list, key: str) -> list:
    return [a[key] / b[key] for a, b in pairs if a[key] is not None and b[key] is not None and b[key]]


def findings(doc: dict) -> dict:
    """The statements the paper makes about the grid, counted over its cells.

    For each arrival scale (``x1``, ``x10``): over the (pressure, engine) cells, how many
    have cache-on concurrency ≥ cache-off, throughput ≥ off, TTFT p50/p99 ≤ off, more
    preemptions on than off, the extreme on/off ratios; how many static-reserved cells have
    lower concurrency / throughput than cache on, their concurrency ratios, and how many
    could not run; the grid's highest hit rate; the MFU/MBU pairs where on beats off; the Azure
    on/off differences; the ``max_num_batched_tokens`` spread of hit rate. The paper's
    quantifiers ("in every cell", "in N of M cells") are rendered from these counts.
    """
    grid = doc["grid"]
    out: dict = {}
    for scale in sorted({r["time_scale"] for r in grid}):
        pairs, spairs = [], []
        for r in _cells(grid, time_scale=scale, mode="on"):
            key = dict(time_scale=scale, pressure=r["pressure"], engine=r["engine"])
            off = _cells(grid, mode="off", **key)[0]
            pairs.append((r, off))
            st = _cells(grid, mode="static", **key)
            if st:
                spairs.append((st[0], r))
        ran = [(a, b) for a, b in pairs if a["concurrency_mean"] is not None and b["concurrency_mean"] is not None]
        sran = [(a, b) for a, b in spairs if a["concurrency_mean"] is not None]
        f = {
            "cells": len(ran),
            "conc_on_ge_off": sum(a["concurrency_mean"] >= b["concurrency_mean"] for a, b in ran),
            "tput_on_ge_off": sum(a["throughput_total_tokens_per_s"] >= b["throughput_total_tokens_per_s"] for a, b in ran),
            "ttft_p50_on_le_off": sum(a["ttft_p50_s"] <= b["ttft_p50_s"] for a, b in ran),
            "ttft_p99_on_le_off": sum(a["ttft_p99_s"] <= b["ttft_p99_s"] for a, b in ran),
            "preempt_on_gt_off": sum(a["preemptions"] > b["preemptions"] for a, b in ran),
            "conc_on_over_off": {"min": min(_ratios(ran, "concurrency_mean")), "max": max(_ratios(ran, "concurrency_mean"))},
            "tput_on_over_off": {"min": min(_ratios(ran, "throughput_total_tokens_per_s")),
                                 "max": max(_ratios(ran, "throughput_total_tokens_per_s"))},
            "ttft_p50_on_over_off": {"min": min(_ratios(ran, "ttft_p50_s")), "max": max(_ratios(ran, "ttft_p50_s"))},
            "static_cells": len(spairs),
            "static_not_run": len(spairs) - len(sran),
            "static_conc_lt_on": sum(a["concurrency_mean"] < b["concurrency_mean"] for a, b in sran),
            "static_tput_lt_on": sum(a["throughput_total_tokens_per_s"] < b["throughput_total_tokens_per_s"] for a, b in sran),
            "static_over_on_conc": ({"min": min(_ratios(sran, "concurrency_mean")), "max": max(_ratios(sran, "concurrency_mean"))}
                                    if sran else {"min": None, "max": None}),
            "hit_max": max(r["token_hit_rate"] for r in grid if r["time_scale"] == scale and r["token_hit_rate"] is not None),
        }
        out[f"x{scale:g}"] = f
    sens = doc["sensitivity"]
    sp = [(a, b) for a in sens if a["mode"] == "on" for b in sens
          if b["mode"] == "off" and (b["mfu"], b["mbu"]) == (a["mfu"], a["mbu"])]
    out["sensitivity"] = {"pairs": len(sp), "mfu_min": min(r["mfu"] for r in sens), "mfu_max": max(r["mfu"] for r in sens),
                          "mbu_min": min(r["mbu"] for r in sens), "mbu_max": max(r["mbu"] for r in sens),
                          "tput_on_ge_off": sum(a["throughput_total_tokens_per_s"] >= b["throughput_total_tokens_per_s"] for a, b in sp),
                          "ttft_p50_on_le_off": sum(a["ttft_p50_s"] <= b["ttft_p50_s"] for a, b in sp)}
    az = doc["azure"]
    ap = [(a, b) for a in az if a["mode"] == "on" for b in az
          if b["mode"] == "off" and (b["engine"], b["pressure"]) == (a["engine"], a["pressure"])]
    out["azure"] = {"pairs": len(ap), "hit_max": max(r["token_hit_rate"] for r in az),
                    "conc_max_abs_rel_diff": max(abs(a["concurrency_mean"] / b["concurrency_mean"] - 1) for a, b in ap),
                    "tput_max_abs_rel_diff": max(abs(a["throughput_total_tokens_per_s"] / b["throughput_total_tokens_per_s"] - 1)
                                                 for a, b in ap)}
    mn = doc["max_num_batched_tokens"]
    out["max_num_batched_tokens"] = {e: {"hit_min": min(r["token_hit_rate"] for r in mn if r["engine"] == e),
                                         "hit_max": max(r["token_hit_rate"] for r in mn if r["engine"] == e),
                                         "ttft_p50_min": min(r["ttft_p50_s"] for r in mn if r["engine"] == e),
                                         "ttft_p50_max": max(r["ttft_p50_s"] for r in mn if r["engine"] == e)}
                                     for e in ENGINES}
    return out


def plot(doc: dict) -> None:
    plt = C.pyplot()
    grid = doc["grid"]
    labels = list(dict.fromkeys(r["pressure"] for r in grid))
    pools = [next(r["pool_tokens"] for r in grid if r["pressure"] == lab) for lab in labels]
    order = np.argsort(pools)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    style = {"on": "-", "off": "--", "static": ":"}
    marker = {"on": "o", "off": "s", "static": "^"}
    colors = {"vllm": "C0", "sglang": "C2"}
    for col, scale in enumerate(sorted({r["time_scale"] for r in grid})[:2]):
        for row, (key, ylab) in enumerate((("concurrency_mean", "mean running requests"),
                                           ("ttft_p50_s", "TTFT p50 (s)"))):
            ax = axes[row][col]
            for engine in ("vllm", "sglang"):
                for mode in MODES:
                    ys = []
                    for i in order:
                        r = next(r for r in grid if r["pressure"] == labels[i] and r["time_scale"] == scale
                                 and r["engine"] == engine and r["mode"] == mode)
                        ys.append(np.nan if r[key] is None else r[key])
                    ax.plot([pools[i] / 1000 for i in order], ys, color=colors[engine], linestyle=style[mode],
                            marker=marker[mode], ms=5, alpha=0.85, label=f"{engine} cache {mode}" if mode != "static" else f"{engine} static 30 %")
            if key == "ttft_p50_s":
                ax.set_ylim(bottom=0)
            ax.set_xlabel("KV pool (thousand tokens; smaller = more memory pressure)")
            ax.set_ylabel(ylab)
            ax.set_title(f"Mooncake, arrivals ×{scale:g} ({'real rate, overload' if scale == 1 else 'stretched'})",
                         fontsize=10)
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2, handlelength=3.5)
    fig.suptitle("Concurrency and TTFT vs memory pressure: cache on / off / static reservation "
                 "(Llama-3.1-8B, A100)", fontsize=11)
    fig.tight_layout()
    C.save_fig(fig, "concurrent_pressure.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, r in zip(axes, doc["timeline"]):
        tl = r["timeline"]
        t = np.asarray(tl["time_s"]) / 60
        ax.stackplot(t, tl["running_share"], tl["cached_share"], tl["free_share"],
                     labels=["held by running requests", "evictable cache", "free"],
                     colors=["C3", "C0", "0.85"], step="post")
        ax.set_xlabel("time (minutes)")
        ax.set_title(f"vLLM, cache {r['mode']}: hit rate {r['token_hit_rate']:.3f}, "
                     f"mean running {r['concurrency_mean']:.1f}", fontsize=10)
        ax.set_ylim(0, 1)
        ax.set_xlim(t[0], t[-1])
    axes[0].set_ylabel("share of the KV pool")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3)
    fig.suptitle(f"Pool split over time, Mooncake at the real rate, pool {doc['base']['pool_tokens']:,} tokens "
                 f"(A100-80GB, gpu_memory_utilization {doc['base']['gpu_memory_utilization']})", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    C.save_fig(fig, "pool_split.png")


if __name__ == "__main__":
    C.main_or_plot(main, plot, "concurrent.json")
