"""Several replicas in the CONCURRENT replay: what the router does to TTFT, throughput and hits.

The Mooncake conversation trace, arrival times stretched ×10 (``--time-scale 10``: the
real rate overloads one GPU), replayed on N = 2, 4, 8 replicas behind each router of
radixkv.replay.routing (``session`` needs session ids, which Mooncake lacks), each replica
a continuous-batching engine on its own A100-80GB (KV pool of vLLM's memory model at
``gpu_memory_utilization`` 0.90, Llama-3.1-8B, priced by the roofline cost model), on one
clock (radixkv.replay.multi_concurrent). Both engines: SGLang page 1 with SGLang's rules,
vLLM block 16 with vLLM's. N = 1 is the single-engine replay.

Part 2 (SGLang only, the first 3,000 requests): the trace's real rate (time scale 1), which
saturates one replica and two, so that throughput, not only latency, depends on the router.

Per cell: token hit rate, TTFT mean / p50 / p90 / p99, TPOT p50, queueing delay, throughput
(prompt + output tokens per second of the run), mean and peak concurrency over all
replicas, preemptions, load imbalance (max / mean requests, prompt tokens and busy time
per replica) and each replica's hit rate and TTFT p50.

    nice python experiments/fig_routing_concurrent.py [--quick]
        # writes results/routing_concurrent.{json,png}

Full: 12,031 requests, 26 replays, plus 13 replays of part 2, about 15 minutes on one idle
core; --quick: the first 2,000 requests, SGLang only, time scale 10 only.
"""
from __future__ import annotations

import time

from _common import QUICK, load, main_or_plot, pyplot, save_fig, write_result

from radixkv.cost import CostModel
from radixkv.memory import pool_for
from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.replay import routing as R
from radixkv.replay.arrivals import arrival_times
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.multi_concurrent import replay_multi_concurrent
from radixkv.replay.scheduler import SchedulerConfig

MODEL, GPU, GMU = "Llama-3.1-8B", "A100-80GB", 0.90
TIME_SCALE = 10.0
REPLICAS = [2, 4, 8]
ROUTERS = ["round-robin", "random", "least-load", "prefix-aware"]  # no session ids in Mooncake
ENGINES = {"sglang": "sglang:1"} if QUICK else {"sglang": "sglang:1", "vllm": "vllm:16"}
LIMIT = 2000 if QUICK else None
#: (label, time scale, first requests or None, engines) of each part
PARTS = [("x10", TIME_SCALE, LIMIT, list(ENGINES))] + ([] if QUICK else [("x1", 1.0, 3000, ["sglang"])])
KEEP = ("token_hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "queue_mean_s",
        "e2e_p50_s", "throughput_total_tokens_per_s", "throughput_output_tokens_per_s", "concurrency_mean",
        "concurrency_peak", "preemptions", "duration_s")


def cell(tr, engine, cap, cost, arr, n, router):
    spec = parse_policy(ENGINES[engine])
    cfg = SchedulerConfig(admission=engine)
    t0 = time.perf_counter()
    if n == 1:
        s = replay_concurrent(tr, build_policy(spec, PoolSpec(capacity_tokens=cap)), cost, arrivals=arr,
                              config=cfg).summary()
        row = {"replicas": 1, "router": "(one engine)", **{k: s[k] for k in KEEP}}
    else:
        pols = [build_policy(spec, PoolSpec(capacity_tokens=cap)) for _ in range(n)]
        s = replay_multi_concurrent(tr, pols, cost, router, arrivals=arr, config=cfg).summary()
        rt = s["routing"]
        row = {"replicas": n, "router": router, **{k: s[k] for k in KEEP},
               "load_imbalance": rt["load_imbalance"], "prompt_token_imbalance": rt["prompt_token_imbalance"],
               "busy_imbalance": rt["busy_imbalance"], "requests_per_replica": rt["requests_per_replica"],
               "tree_bytes_peak": rt["tree_bytes_peak"],
               "per_replica": [{"token_hit_rate": r["token_hit_rate"], "ttft_p50_s": r["ttft_p50_s"],
                                "requests": r["requests"]} for r in s["replicas"] if r is not None]}
    row["engine"] = engine
    row["wall_s"] = time.perf_counter() - t0
    return row


def main() -> None:
    cap = pool_for("vllm", MODEL, GPU, gpu_memory_utilization=GMU).capacity_tokens
    cost = CostModel.from_specs(MODEL, GPU)
    doc = {"trace": None, "pool_tokens_per_replica": int(cap), "parts": {}}
    for label, scale, limit, engines in PARTS:
        tr = load("mooncake", limit)
        doc["trace"] = tr.name
        arr = arrival_times(tr, arrival="trace", time_scale=scale)
        rows = []
        for engine in engines:
            rows.append(cell(tr, engine, cap, cost, arr, 1, None))
            for n in REPLICAS:
                for r in ROUTERS:
                    c = cell(tr, engine, cap, cost, arr, n, r)
                    rows.append(c)
                    print(f"{label} {engine} N={n} {r:>13}: hit {c['token_hit_rate']:.4f}  TTFT p50 "
                          f"{c['ttft_p50_s']:.3f} p99 {c['ttft_p99_s']:.2f} s  thr "
                          f"{c['throughput_total_tokens_per_s']:,.0f} tok/s  imbalance {c['load_imbalance']:.3f}/"
                          f"{c['busy_imbalance']:.3f}  ({c['wall_s']:.1f} s)", flush=True)
        doc["parts"][label] = {"time_scale": scale, "requests": len(tr), "cells": rows}
    settings = {"model": MODEL, "gpu": GPU, "gpu_memory_utilization": GMU, "parts": PARTS,
                "replicas": REPLICAS, "routers": ROUTERS, "engines": ENGINES, "router_seed": 0,
                "cache_threshold": R.CACHE_THRESHOLD, "balance_abs_threshold": R.BALANCE_ABS_THRESHOLD,
                "balance_rel_threshold": R.BALANCE_REL_THRESHOLD, "max_tree_tokens": "pool of one replica",
                "scheduler": "SchedulerConfig defaults (max_num_seqs 256, max_num_batched_tokens 8192)",
                "cost": "CostModel.from_specs defaults (mfu 0.6, mbu 0.8)"}
    write_result("routing_concurrent.json", doc, settings)


def plot(doc) -> None:
    plt = pyplot()
    rows = [(label, part, eng) for label, part in doc["parts"].items()
            for eng in dict.fromkeys(c["engine"] for c in part["cells"])]
    panels = [("token_hit_rate", "token hit rate"), ("ttft_p50_s", "TTFT p50 (s)"), ("ttft_p99_s", "TTFT p99 (s)"),
              ("throughput_total_tokens_per_s", "prompt+output tok/s")]
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(4.2 * len(panels), 3.4 * len(rows)), squeeze=False)
    for i, (label, part, eng) in enumerate(rows):
        cells = [c for c in part["cells"] if c["engine"] == eng]
        one = next(c for c in cells if c["replicas"] == 1)
        for j, (key, plabel) in enumerate(panels):
            ax = axes[i][j]
            for r in ROUTERS:
                pts = [(c["replicas"], c[key]) for c in cells if c["router"] == r]
                ax.plot([1] + [p[0] for p in pts], [one[key]] + [p[1] for p in pts], marker="o", label=r)
            ax.set_xscale("log", base=2)
            ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
            ax.set_xlabel("replicas")
            ax.set_ylabel(plabel)
            if key.startswith("ttft"):
                ax.set_yscale("log")
            ax.set_title(f"{eng}, time scale {part['time_scale']:g}, {part['requests']:,} req.: {plabel}", fontsize=8)
            if j == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"Mooncake conversation, concurrent replay on N replicas, {doc['pool_tokens_per_replica']:,} KV "
                 f"tokens per replica", fontsize=10)
    fig.tight_layout()
    save_fig(fig, "routing_concurrent.png")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main_or_plot(main, plot, "routing_concurrent.json")
    print(f"{time.perf_counter() - t0:.1f} s")
