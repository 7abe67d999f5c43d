"""Table and figure: what the same memory holds under vLLM's blocks and SGLang's tree (claim C6).

Sequential replay over a sweep of pool sizes of:

- ``vllm:16`` — vLLM's block-hash cache, block 16, LRU over single free blocks;
- ``sglang:1 (chunk 8192)`` — SGLang's radix tree, page 1, with SGLang's default
  ``chunked_prefill_size`` on 80-GB-class GPUs (8192; SGLang ``server_args``
  ``handle_gpu_memory_settings``);
- ``sglang:16 (chunk 8192)`` — the same tree at page 16: the ablation. vLLM 16 vs SGLang 16
  differ only in the eviction design (single blocks vs whole leaves of the tree), SGLang 16
  vs SGLang 1 only in granularity.

Metrics (``radixkv.metrics.summarize``): token hit rate; cached-token capacity (distinct
hittable tokens held, second-half mean) as a share of the pool; internal fragmentation
(allocated slot tokens holding no valid KV); duplication (valid tokens stored twice).

Traces: RAGPulse and WEKA (public; WEKA's first requests), and the token-level synthetic
``long_doc_qa`` and ``multi_turn`` (5 seeds, mean ± 95 % CI).

    python experiments/tab_fragmentation.py [--quick]   # writes results/fragmentation.json, fragmentation.png

Full: ~4 min on 2 idle cores; --quick: ~1 min.
"""
from __future__ import annotations

import _common as C  # noqa: I001

import numpy as np

import radixkv
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import warmup_many
from radixkv.synth.registry import generate

CHUNK = 8192
#: label → (policy, options); both SGLang cells run with chunked_prefill_size = CHUNK
POLICIES = {"vllm:16": ("vllm:16", {}), "sglang:1": ("sglang:1", {"chunked_prefill_size": CHUNK}),
            "sglang:16": ("sglang:16", {"chunked_prefill_size": CHUNK})}
KEYS = ("token_hit_rate", "cached_tokens_share_of_pool", "cached_tokens_second_half_mean",
        "internal_fragmentation_share_mean", "duplicate_share_mean", "evicted_tokens")
SEEDS = [0, 1, 2, 3, 4]


def sweep(tr, caps) -> dict:
    out = {}
    for label, (pol, opts) in POLICIES.items():
        rows = []
        for cap in caps:
            _, s = radixkv.run(radixkv.ReplaySpec(tr, parse_policy(pol), PoolSpec(capacity_tokens=cap), options=opts))
            rows.append({"pool_tokens": cap, **{k: s[k] for k in KEYS}})
        out[label] = rows
    return out


def main() -> None:
    q = C.QUICK
    warmup_many([parse_policy(p) for p, _ in POLICIES.values()])
    real_cfg = {"ragpulse": (2000 if q else None, [20_000, 100_000, 300_000] if q else [20_000, 50_000, 100_000, 300_000, 1_000_000]),
                "weka": (300 if q else 1200, [600_000, 2_000_000] if q else [600_000, 1_000_000, 2_000_000, 5_000_000])}
    doc = {"real": {}, "synthetic": {}, "chunked_prefill_size": CHUNK}
    for name, (limit, caps) in real_cfg.items():
        tr = C.load(name, limit)
        doc["real"][name] = {"requests": len(tr), "unit_tokens": int(tr.unit_tokens), "sweep": sweep(tr, caps)}
        print(f"{name} done", flush=True)
    n = 200 if q else 500
    syn_caps = {"long_doc_qa": [100_000, 300_000, 1_000_000], "multi_turn": [20_000, 50_000, 200_000]}
    for scn, caps in syn_caps.items():
        per_seed = [sweep(generate(scn, n, seed), caps) for seed in SEEDS]
        agg = {}
        for label in POLICIES:
            agg[label] = [{"pool_tokens": cap, **{k: C.mean_ci([ps[label][i][k] for ps in per_seed]) for k in KEYS}}
                          for i, cap in enumerate(caps)]
        doc["synthetic"][scn] = {"requests": n, "seeds": SEEDS, "sweep": agg}
        print(f"{scn} done", flush=True)
    C.write_result("fragmentation.json", doc, {"policies": {k: [p, o] for k, (p, o) in POLICIES.items()},
                                                "real": {k: {"limit": v[0], "caps": v[1]} for k, v in real_cfg.items()},
                                                "synthetic_caps": syn_caps, "synthetic_requests": n, "seeds": SEEDS,
                                                "replay": "sequential"})


def plot(doc: dict) -> None:
    plt = C.pyplot()
    panels = [("real", n) for n in doc["real"]] + [("synthetic", n) for n in doc["synthetic"]]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7.2))
    colors = {"vllm:16": ("C0", "o", "-"), "sglang:1": ("C2", "^", "--"), "sglang:16": ("C1", "s", ":")}
    for j, (kind, name) in enumerate(panels):
        sw = doc[kind][name]["sweep"]
        for i, (key, ylab) in enumerate((("cached_tokens_share_of_pool", "cached tokens / pool tokens"),
                                         ("token_hit_rate", "token hit rate"))):
            ax = axes[i][j]
            for label in POLICIES:  # a fixed order: the result file's keys are sorted
                rows = sw[label]
                xs = [r["pool_tokens"] for r in rows]
                if kind == "real":
                    ys, err = [r[key] for r in rows], None
                else:
                    ys, err = [r[key]["mean"] for r in rows], [r[key]["ci95"] for r in rows]
                col, mk, ls = colors[label]
                lab = label if label == "vllm:16" else f"{label} (chunked prefill {doc['chunked_prefill_size']})"
                ax.errorbar(xs, ys, yerr=err, color=col, marker=mk, linestyle=ls, ms=5, capsize=3, label=lab,
                            alpha=0.85)
            C.logx(ax)
            ax.set_xlabel("KV pool (tokens, log scale)")
            ax.set_ylabel(ylab)
            ax.grid(True, which="both", alpha=0.3)
            sub = "public trace" if kind == "real" else f"synthetic, {len(doc[kind][name]['seeds'])} seeds ±95 % CI"
            ax.set_title(f"{name} ({sub})", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("C6: what the same pool holds — vLLM blocks vs SGLang tree (page 1 and page 16)", fontsize=11)
    fig.tight_layout()
    C.save_fig(fig, "fragmentation.png")


if __name__ == "__main__":
    C.main_or_plot(main, plot, "fragmentation.json")
