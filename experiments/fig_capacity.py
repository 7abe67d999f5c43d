"""Figures: hit rate vs KV capacity per policy on each public trace; hit lengths; alignment
loss vs block size; fp8 vs bf16 pools (claims C5, C13, C17).

Sequential replay (every request alone: the cache-study setting) of the three public traces
with prefix identity (Mooncake, WEKA agentic coding, RAGPulse) through vLLM's block-hash
cache at block 16 and 32, SGLang's radix tree at page 1 and the cache-study ``unit-lru``.

    python experiments/fig_capacity.py [--quick]
        # writes results/capacity.json, capacity_curves.png, hit_lengths.png, alignment.png

Full: ~4 min on 2 idle cores; --quick: ~1 min (first requests of each trace, 3 capacities).
"""
from __future__ import annotations

import _common as C  # noqa: I001

import numpy as np

import radixkv
from radixkv.memory import pool_for
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import warmup_many

POLICIES = ["vllm:16", "vllm:32", "sglang:1", "unit-lru"]
FULL = {
    "mooncake": {"limit": None, "caps": [200_000, 500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000, 50_000_000]},
    "weka": {"limit": None, "caps": [500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000, 50_000_000]},
    "ragpulse": {"limit": None, "caps": [10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000, 30_000_000]},
}
QUICK = {
    "mooncake": {"limit": 3000, "caps": [200_000, 1_000_000, 5_000_000]},
    "weka": {"limit": 600, "caps": [500_000, 2_000_000, 10_000_000]},
    "ragpulse": {"limit": 2500, "caps": [10_000, 100_000, 1_000_000]},
}
#: block sizes of the alignment sweep (vLLM's cache), beside SGLang page 1
BLOCKS = [16, 32, 64, 128, 256]
#: pool of the hit-length and alignment panels: every token the trace holds, at most
#: 120 M (more than the distinct content of any of the three traces: nothing is evicted)
NO_EVICT_MAX = 120_000_000
#: deployments whose pool (vLLM rules, gpu_memory_utilization 0.9) sets the fp8 test:
#: (model, GPU, tensor-parallel degree); skipped on a trace whose longest request does not fit
FP8_SETUPS = [("Llama-3.1-8B", "A100-40GB", 1), ("Llama-3.1-8B", "A100-80GB", 1), ("Llama-3.1-70B", "H100-80GB", 8)]
LABEL = {"mooncake": "Mooncake conversation", "weka": "WEKA agentic coding", "ragpulse": "RAGPulse RAG Q&A"}


def _point(s: dict) -> dict:
    return {k: s[k] for k in ("pool_capacity_tokens", "token_hit_rate", "mean_request_hit_ratio", "request_hit_rate",
                              "alignment_loss_share", "evicted_tokens", "cached_tokens_second_half_mean",
                              "hit_tokens_p50", "hit_tokens_p90")}


def main() -> None:
    cfg = QUICK if C.QUICK else FULL
    warmup_many([parse_policy(p) for p in POLICIES + [f"vllm:{b}" for b in BLOCKS]])
    doc = {"traces": {}, "policies": POLICIES}
    for name, c in cfg.items():
        tr = C.load(name, c["limit"])
        t = {"label": LABEL[name], "requests": len(tr), "unit_tokens": int(tr.unit_tokens),
             "prompt_tokens": int(tr.prompt_len.sum()), "curves": {}, "alignment": {}, "fp8": []}
        for pol in POLICIES:
            pts = []
            for cap in c["caps"]:
                _, s = radixkv.run(radixkv.ReplaySpec(tr, parse_policy(pol), PoolSpec(capacity_tokens=cap)))
                pts.append(_point(s))
                print(f"{name:>9} {pol:>9} {cap:>12,}: {s['token_hit_rate']:.4f}", flush=True)
            t["curves"][pol] = pts
        cap = int(min(tr.prompt_len.sum() + tr.output_len.sum(), NO_EVICT_MAX))
        t["no_evict_capacity_tokens"] = cap
        for pol in ["sglang:1"] + [f"vllm:{b}" for b in BLOCKS]:
            _, s = radixkv.run(radixkv.ReplaySpec(tr, parse_policy(pol), PoolSpec(capacity_tokens=cap)))
            t["alignment"][pol] = {**_point(s), "hit_length_histogram": s["hit_length_histogram"]}
        need = int((tr.prompt_len + np.maximum(tr.output_len - 1, 0)).max())
        for model, gpu, tp in FP8_SETUPS:
            row = {"model": model, "gpu": gpu, "tp": tp}
            if pool_for("vllm", model, gpu, tp=tp).capacity_tokens < need + 16:
                continue  # the longest request does not fit the bf16 pool
            for dt in ("bf16", "fp8"):
                p = pool_for("vllm", model, gpu, tp=tp, kv_cache_dtype=None if dt == "bf16" else "fp8")
                row[f"pool_tokens_{dt}"] = p.capacity_tokens
                for pol in ("vllm:16", "sglang:1"):
                    _, s = radixkv.run(radixkv.ReplaySpec(tr, parse_policy(pol),
                                                          PoolSpec(capacity_tokens=p.capacity_tokens)))
                    row[f"{pol}_{dt}"] = s["token_hit_rate"]
            for pol in ("vllm:16", "sglang:1"):
                row[f"{pol}_gain"] = row[f"{pol}_fp8"] - row[f"{pol}_bf16"]
                row[f"{pol}_rel_gain"] = row[f"{pol}_fp8"] / row[f"{pol}_bf16"] - 1 if row[f"{pol}_bf16"] else None
            t["fp8"].append(row)
        doc["traces"][name] = t
    C.write_result("capacity.json", doc, {"policies": POLICIES, "traces": {k: v for k, v in cfg.items()},
                                          "blocks": BLOCKS, "no_evict_capacity_tokens_max": NO_EVICT_MAX,
                                          "fp8_setups": FP8_SETUPS,
                                          "gpu_memory_utilization": 0.9, "replay": "sequential"})


def plot(doc: dict) -> None:
    plt = C.pyplot()
    names = list(doc["traces"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.2))
    style = {"vllm:16": ("C0", "o", "-"), "vllm:32": ("C1", "s", "--"), "sglang:1": ("C2", "^", ":"),
             "unit-lru": ("C3", "x", "-.")}
    for ax, n in zip(np.atleast_1d(axes), names):
        t = doc["traces"][n]
        for pol, pts in t["curves"].items():
            col, mk, ls = style[pol]
            ax.plot([p["pool_capacity_tokens"] for p in pts], [p["token_hit_rate"] for p in pts],
                    color=col, marker=mk, linestyle=ls, label=pol, alpha=0.85)
        C.logx(ax)
        ax.set_ylim(0, 1)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("KV pool capacity (tokens, log scale)")
        ax.set_ylabel("token hit rate (hit / prompt tokens)")
        ax.set_title(f"{t['label']}\n{t['requests']:,} requests, {t['unit_tokens']}-token hash blocks", fontsize=10)
        # the legend goes where the curves are not: below them when they run high
        top = max(p["token_hit_rate"] for pts in t["curves"].values() for p in pts)
        ax.legend(fontsize=8, loc="lower right" if top > 0.6 else "upper left")
    fig.suptitle("Hit rate vs KV capacity per cache policy (sequential replay)", fontsize=12)
    fig.tight_layout()
    C.save_fig(fig, "capacity_curves.png")

    # hit-length distributions (no eviction), SGLang page 1
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, n in enumerate(names):
        h = doc["traces"][n]["alignment"]["sglang:1"]["hit_length_histogram"]
        edges, counts = h["edges_tokens"], np.asarray(h["counts"], dtype=float)
        share = counts / counts.sum()
        x = np.arange(len(edges)) + (i - 1) * 0.27
        ax.bar(x, share, width=0.27, label=doc["traces"][n]["label"])
        if i == 0:
            ax.set_xticks(np.arange(len(edges)))
            ax.set_xticklabels([f"≥{e:,}" if e else "0" for e in edges], rotation=60, fontsize=7)
    # use the longest edge list for the ticks
    longest = max(names, key=lambda n: len(doc["traces"][n]["alignment"]["sglang:1"]["hit_length_histogram"]["edges_tokens"]))
    edges = doc["traces"][longest]["alignment"]["sglang:1"]["hit_length_histogram"]["edges_tokens"]
    ax.set_xticks(np.arange(len(edges)))
    ax.set_xticklabels([f"≥{e:,}" if e else "0" for e in edges], rotation=60, fontsize=7)
    ax.set_xlabel("hit length per request (tokens, power-of-two bins)")
    ax.set_ylabel("share of requests")
    ax.set_title("Hit-length distribution, SGLang page 1, no eviction", fontsize=11)
    ax.legend(fontsize=8)
    fig.tight_layout()
    C.save_fig(fig, "hit_lengths.png")

    # alignment loss vs block size
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for n in names:
        a = doc["traces"][n]["alignment"]
        xs = [1] + BLOCKS
        ys = [a["sglang:1"]["alignment_loss_share"]] + [a[f"vllm:{b}"]["alignment_loss_share"] for b in BLOCKS]
        ax.plot(xs, ys, marker="o", label=f"{doc['traces'][n]['label']} ({doc['traces'][n]['unit_tokens']}-token units)")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1] + BLOCKS)
    ax.set_xticklabels(["1 (SGLang)"] + [str(b) for b in BLOCKS])
    ax.set_xlabel("block / page size (tokens)")
    ax.set_ylabel("alignment loss (share of prompt tokens)")
    ax.set_title("Prefix tokens held but not reusable, vs block size (no eviction)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    C.save_fig(fig, "alignment.png")


if __name__ == "__main__":
    C.main_or_plot(main, plot, "capacity.json")
