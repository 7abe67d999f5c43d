"""Table: why prompt tokens miss — the miss-cause breakdown on the public traces (claims C3, C6, C10, C13).

Each prompt token of a sequential replay is a hit or a miss with one cause
(``radixkv.replay.misses``, ``radixkv.run`` with ``miss_causes=True``): *compulsory* (no earlier
request computed it: an infinite token-level cache misses it too), *capacity* (the same
policy on an unbounded pool hits it: evicted), *alignment* (held at token level but not in
a whole block/page), *last-token cap* (whole blocks lost only to the engines' rule that the
last prompt token is recomputed), *not cached* (0 for the engines' policies). The shares
sum to 1 per replay.

Traces with prefix identity: Mooncake conversation, WEKA agentic coding (first requests),
RAGPulse RAG Q&A; policies vLLM block 16, vLLM block 256 (coarse blocks: alignment; not on
Mooncake, whose 512-token hash blocks it divides) and SGLang page 1; a tight and an ample
pool per trace.

    python experiments/tab_misses.py [--quick]     # writes results/misses.json

Full: ~4 min on 2 idle cores; --quick: ~0.5 min (fewer requests).
"""
from __future__ import annotations

import _common as C  # noqa: I001

import radixkv
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import warmup_many

POLICIES = ("vllm:16", "vllm:256", "sglang:1")
CAUSES = ("hit", "compulsory", "capacity", "alignment", "last_token_cap", "not_cached")


def config(quick: bool) -> dict:
    """trace → (first requests or None for all, [tight pool, ample pool] in tokens)."""
    return {"mooncake": (1000 if quick else None, [300_000, 3_000_000]),
            "weka": (300 if quick else 1200, [600_000, 5_000_000]),
            "ragpulse": (2000 if quick else None, [20_000, 300_000])}


def main() -> None:
    cfg = config(C.QUICK)
    warmup_many([parse_policy(p) for p in POLICIES])
    doc: dict = {"traces": {}, "causes": list(CAUSES)}
    for name, (limit, caps) in cfg.items():
        tr = C.load(name, limit)
        rows = []
        for pol in POLICIES:
            if pol == "vllm:256" and tr.unit_tokens % 256 == 0:
                continue  # 256 divides the trace's hash block: alignment is 0 by construction
            for cap in caps:
                _, s = radixkv.run(radixkv.ReplaySpec(tr, parse_policy(pol), PoolSpec(capacity_tokens=cap),
                                                      miss_causes=True))
                mc = s["miss_causes"]
                rows.append({"policy": pol, "pool_tokens": cap, "token_hit_rate": s["token_hit_rate"],
                             "share": {c: mc["share"][c] for c in CAUSES},
                             "tokens": {c: mc["tokens"][c] for c in CAUSES},
                             "nesting_violations": mc["nesting_violations"]})
                print(f"{name} {pol} pool {cap:,}: " + " ".join(f"{c} {mc['share'][c]:.3f}" for c in CAUSES), flush=True)
        doc["traces"][name] = {"requests": len(tr), "unit_tokens": int(tr.unit_tokens), "pools": caps, "rows": rows,
                               "max_share": {c: max(r["share"][c] for r in rows) for c in CAUSES[1:]}}
    doc["max_share"] = {c: max(t["max_share"][c] for t in doc["traces"].values()) for c in CAUSES[1:]}
    C.write_result("misses.json", doc, {"policies": list(POLICIES),
                                         "traces": {k: {"limit": v[0], "pools": v[1]} for k, v in cfg.items()},
                                         "replay": "sequential, miss causes against an infinite token-level cache "
                                                   "and the same policy on an unbounded pool"})


if __name__ == "__main__":
    main()
