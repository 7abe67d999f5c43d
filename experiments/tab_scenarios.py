"""Table: block 16 vs block 32 vs token-level radix on each recorded workload scenario.

One pool size for all scenarios (default 100,000 tokens, so that eviction matters); for
each bundled token-level trace in traces/, the token hit rate, the alignment loss (prefix
tokens held but lost to block rounding or the last-token cap) and the cached-token
capacity (second-half mean) per policy.

    python experiments/tab_scenarios.py [--capacity-tokens N]   # writes results/scenarios.{json,md}
"""
from __future__ import annotations

import argparse

from _common import REPO, result

import radixkv
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.trace.load import load_trace
from radixkv.util import atomic_write_text, dumps_json

SCENARIOS = ["long_doc_qa", "agent_tools", "enterprise", "customer_service", "multi_turn", "demo"]
POLICIES = ["vllm:16", "vllm:32", "sglang:1"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacity-tokens", type=int, default=100_000)
    args = ap.parse_args()
    pool = PoolSpec(capacity_tokens=args.capacity_tokens)
    rows = []
    for name in SCENARIOS:
        path = REPO / "traces" / f"{name}.jsonl"
        trace = load_trace(path if path.exists() else path.with_suffix(".npz"))
        for label in POLICIES:
            _, s = radixkv.run(radixkv.ReplaySpec(trace, parse_policy(label), pool))
            rows.append({"scenario": name, "policy": label, "requests": s["requests"],
                         "token_hit_rate": s["token_hit_rate"], "alignment_loss_tokens": s["alignment_loss_tokens"],
                         "alignment_loss_share": s["alignment_loss_share"],
                         "cached_tokens_second_half_mean": s["cached_tokens_second_half_mean"],
                         "evicted_tokens": s["evicted_tokens"]})
    md = [f"Pool: {args.capacity_tokens:,} tokens; sequential replay.", "",
          "| scenario | policy | token hit rate | alignment loss (tokens) | alignment loss / prompt | cached tokens (2nd-half mean) | evicted tokens |",
          "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['scenario']} | {r['policy']} | {r['token_hit_rate']:.4f} | {r['alignment_loss_tokens']:,} | "
                  f"{r['alignment_loss_share']:.4f} | {r['cached_tokens_second_half_mean']:,.0f} | {r['evicted_tokens']:,} |")
    text = "\n".join(md) + "\n"
    print(text)
    atomic_write_text(result("scenarios.md"), text)
    atomic_write_text(result("scenarios.json"), dumps_json({"capacity_tokens": args.capacity_tokens, "rows": rows}))


if __name__ == "__main__":
    main()
