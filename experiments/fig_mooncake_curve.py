"""Figure: hit rate against KV capacity on the Mooncake conversation trace.

Three models of the cache on the same trace: the cache-study ``unit-lru`` (what the
Mooncake FAST'25 paper's Figure 9 plots), vLLM's block-hash cache at block 16 and
SGLang's radix tree at page 1 — beside the values read off Figure 9 (±0.02).

    python experiments/fig_mooncake_curve.py      # writes results/mooncake_curve.{json,png}
"""
from __future__ import annotations

import time

from _common import result, shared

from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.plots import plot_curves
from radixkv.replay.run import run_replay
from radixkv.trace.load import load_trace
from radixkv.util import atomic_write_text, dumps_json

#: Mooncake FAST'25, Figure 9 (Conversation), read off the plot
PAPER = {"label": "Mooncake FAST'25 Fig. 9 (read off)",
         "capacity_tokens": [1e4, 1e5, 1e6, 2e6, 3e6, 5e6, 1e7, 5e7],
         "values": [0.045, 0.073, 0.087, 0.12, 0.165, 0.25, 0.325, 0.40]}
CAPS = [10_000, 100_000, 1_000_000, 2_000_000, 3_000_000, 5_000_000, 10_000_000, 50_000_000]
# every request fits alone in the pool from 1e6 tokens on (longest KV extent 128,194 tokens)
ENGINE_CAPS = [1_000_000, 2_000_000, 3_000_000, 5_000_000, 10_000_000, 50_000_000]


def main() -> None:
    t0 = time.perf_counter()
    trace = load_trace(shared("traces", "mooncake-fast25", "conversation_trace.jsonl"))
    load_s = time.perf_counter() - t0
    curves = []
    for label, caps in (("unit-lru", CAPS), ("vllm:16", ENGINE_CAPS), ("sglang:1", ENGINE_CAPS)):
        pts = []
        for cap in caps:
            _, s = run_replay(trace, parse_policy(label), PoolSpec(capacity_tokens=cap))
            pts.append({"capacity_tokens": cap, "token_hit_rate": s["token_hit_rate"],
                        "mean_request_hit_ratio": s["mean_request_hit_ratio"],
                        "evicted_tokens": s["evicted_tokens"], "replay_s": round(s["timing_s"]["replay"], 3)})
            print(f"{label:>9} {cap:>11,}: token {s['token_hit_rate']:.4f}  per-request "
                  f"{s['mean_request_hit_ratio']:.4f}  ({s['timing_s']['replay']:.2f} s)", flush=True)
        curves.append({"policy": label, "points": pts})
    doc = {"trace": {"name": "Mooncake conversation_trace.jsonl", "requests": len(trace)},
           "paper_fig9": PAPER, "curves": curves, "load_s": round(load_s, 3)}
    atomic_write_text(result("mooncake_curve.json"), dumps_json(doc))
    plot_curves(doc, result("mooncake_curve.png"), reference=PAPER)
    print(f"wrote {result('mooncake_curve.json')} and .png")


if __name__ == "__main__":
    main()
