"""Tables and figure: what workloads hit (claims C3, C5, C7, C10, C13, C18).

Part 1 — the public traces with prefix identity (Mooncake conversation, WEKA agentic
coding, RAGPulse RAG Q&A), under an infinite prompt-only prefix cache (the exact trie of
``radixkv.trace.stats.infinite_cache_hits``: the ceiling any cache reaches):

- token hit rate, and its distribution across sessions (WEKA, RAGPulse) and across
  fixed time windows (all three);
- how concentrated the hit is: hit tokens grouped by *distinct hit prefix* (the exact
  run of blocks a hit reuses) and by *first block* (the prompt's opening block, e.g. a
  system prompt); share of hit tokens from the top 10 and the top 1 % of groups;
- cross-session share: hit tokens that another session's earlier prompt also supplies
  (shared openings: system prompts, tool definitions) vs. only the same session's history;
- prefill FLOPs saved (Llama-3.1-8B cost model): Σ saved / Σ prefill FLOPs.

Part 2 — controlled ablations on the synthetic generators (``radixkv.synth``), 5 seeds,
mean ± 95 % CI (Student t), on a pool under pressure (100,000 tokens) and a pool that never
evicts: token hit rate of vLLM block 16 / block 32 and SGLang page 1, alignment loss,
cached-token capacity, prefill FLOPs saved.

    python experiments/tab_workloads.py [--quick]    # writes results/workloads.{json}, workloads.png

Full: ~4 min on 2 idle cores; --quick: ~1.5 min (300 requests per synthetic trace).
"""
from __future__ import annotations

import _common as C  # noqa: I001

import numpy as np

import radixkv
from radixkv.cost import CostModel
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import warmup_many
from radixkv.synth.registry import generate
from radixkv.trace.stats import infinite_cache_hits

SCENARIOS = ["long_doc_qa", "agent_tools", "enterprise", "customer_service", "multi_turn"]
POLICIES = ["vllm:16", "vllm:32", "sglang:1"]
SEEDS = [0, 1, 2, 3, 4]
POOLS = {"pressure": 100_000, "ample": 50_000_000}
WINDOW_S = {"mooncake": 300.0, "weka": 3600.0, "ragpulse": 3600.0}
COST = CostModel.from_specs("Llama-3.1-8B", "A100-80GB")


def _saved_share(prompt: np.ndarray, hit: np.ndarray) -> float:
    """Σ prefill FLOPs a hit avoids / Σ prefill FLOPs from scratch (cost model)."""
    full = COST.prefill_flops(prompt.astype(np.float64))
    rest = COST.prefill_flops((prompt - hit).astype(np.float64), hit.astype(np.float64))
    return float((full - rest).sum() / full.sum())


def _dist(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return {"n": 0}
    return {"n": int(x.size), "p10": float(np.percentile(x, 10)), "p25": float(np.percentile(x, 25)),
            "p50": float(np.percentile(x, 50)), "p75": float(np.percentile(x, 75)),
            "p90": float(np.percentile(x, 90)), "share_30_60": float(np.mean((x >= 0.3) & (x <= 0.6))),
            "share_below_20": float(np.mean(x < 0.2))}


def _top_share(weights: dict) -> dict:
    w = np.sort(np.asarray(list(weights.values()), dtype=np.float64))[::-1]
    tot = w.sum()
    k1 = max(1, int(np.ceil(0.01 * w.size)))
    return {"groups": int(w.size), "top1_share": float(w[:1].sum() / tot), "top10_share": float(w[:10].sum() / tot),
            "top1pct_share": float(w[:k1].sum() / tot), "top1pct_groups": k1}


def _cross_session_hits(ids, off, sess, U, P) -> np.ndarray:
    """Per request: hit tokens that some OTHER session's earlier prompt also supplies.

    A trie over block ids; each node remembers the first session that inserted it and
    whether a second session has. Walking request i of session s, a matched node counts
    as cross-session when it was inserted by a session other than s.
    """
    child: dict = {}
    first: list = []
    multi: list = []
    out = np.zeros(len(off) - 1, dtype=np.int64)
    for i in range(len(off) - 1):
        s = sess[i]
        node = -1
        cross = 0
        still = True
        for k in range(off[i], off[i + 1]):
            key = (node, int(ids[k]))
            c = child.get(key)
            if c is None:
                c = len(first)
                child[key] = c
                first.append(s)
                multi.append(False)
                still = False
            else:
                if still and (multi[c] or first[c] != s):
                    cross += 1
                else:
                    still = False
                if first[c] != s:
                    multi[c] = True
            node = c
        out[i] = cross
    return np.minimum(out * U, P)


def real_traces(limit: dict) -> dict:
    res = {}
    for name in C.PREFIX_TRACES:
        tr = C.load(name, limit.get(name))
        P = np.asarray(tr.prompt_len, dtype=np.int64)
        hit = infinite_cache_hits(tr)
        ids = np.asarray(tr.ids, dtype=np.int64)
        off = np.asarray(tr.id_offsets, dtype=np.int64)
        U = int(tr.unit_tokens)
        r = {"requests": int(len(tr)), "unit_tokens": U, "prompt_tokens": int(P.sum()),
             "token_hit_rate": float(hit.sum() / P.sum()), "mean_request_hit_ratio": float(np.mean(hit / P)),
             "prefill_flops_saved_share": _saved_share(P, hit),
             "mean_prompt_tokens": float(P.mean()), "per_request": _dist(hit / P)}
        # time windows
        t = np.asarray(tr.arrival_s, dtype=np.float64)
        w = ((t - t[0]) // WINDOW_S[name]).astype(np.int64)
        rates = [hit[w == k].sum() / P[w == k].sum() for k in np.unique(w) if P[w == k].sum() > 0]
        r["window_s"] = WINDOW_S[name]
        r["per_window"] = _dist(rates)
        # concentration: group hit tokens by distinct hit prefix and by first block
        deep: dict = {}
        first_blk: dict = {}
        for i in np.nonzero(hit)[0]:
            h_units = int(-(-hit[i] // U))
            a = off[i]
            deep[ids[a:a + h_units].tobytes()] = deep.get(ids[a:a + h_units].tobytes(), 0) + int(hit[i])
            first_blk[int(ids[a])] = first_blk.get(int(ids[a]), 0) + int(hit[i])
        r["by_hit_prefix"] = _top_share(deep)
        r["by_first_block"] = _top_share(first_blk)
        if tr.session_id is not None:
            sess = np.asarray(tr.session_id)
            _, sidx = np.unique(sess, return_inverse=True)
            per_s = [hit[sidx == k].sum() / P[sidx == k].sum() for k in range(sidx.max() + 1)]
            r["sessions"] = int(sidx.max() + 1)
            r["per_session"] = _dist(per_s)
            cross = _cross_session_hits(ids, off, sidx.tolist(), U, P)
            r["cross_session_hit_share"] = float(cross.sum() / hit.sum()) if hit.sum() else None
            r["cross_session_token_hit_rate"] = float(cross.sum() / P.sum())
        else:
            r["sessions"] = None  # the trace has no session ids: n/a
            r["per_session"] = None
            r["cross_session_hit_share"] = None
            r["cross_session_token_hit_rate"] = None
        res[name] = r
        print(f"{name}: hit {r['token_hit_rate']:.4f}, top-10 prefixes {r['by_hit_prefix']['top10_share']:.3f}, "
              f"cross-session {r['cross_session_hit_share']}", flush=True)
    return res


def synthetic(n: int) -> dict:
    warmup_many([parse_policy(p) for p in POLICIES])
    out = {}
    for scn in SCENARIOS:
        cells: dict = {}
        for seed in SEEDS:
            tr = generate(scn, n, seed)
            P = np.asarray(tr.prompt_len, dtype=np.int64)
            for pool_name, cap in POOLS.items():
                for pol in POLICIES:
                    rec, s = radixkv.run(radixkv.ReplaySpec(tr, parse_policy(pol), PoolSpec(capacity_tokens=cap)))
                    hit = np.asarray(rec["hit_tokens"], dtype=np.int64)
                    for key, val in (("token_hit_rate", s["token_hit_rate"]),
                                     ("alignment_loss_share", s["alignment_loss_share"]),
                                     ("cached_tokens_second_half_mean", s["cached_tokens_second_half_mean"]),
                                     ("prefill_flops_saved_share", _saved_share(P, hit))):
                        cells.setdefault(pool_name, {}).setdefault(pol, {}).setdefault(key, []).append(val)
                # paired differences SGLang page 1 − vLLM block 16 (same seed)
            for pool_name in POOLS:
                d = cells[pool_name]
                d.setdefault("diff", []).append(d["sglang:1"]["token_hit_rate"][-1] - d["vllm:16"]["token_hit_rate"][-1])
            cells.setdefault("mean_prompt_tokens", []).append(float(P.mean()))
        res = {"mean_prompt_tokens": C.mean_ci(cells["mean_prompt_tokens"])}
        for pool_name in POOLS:
            res[pool_name] = {pol: {k: C.mean_ci(v) for k, v in cells[pool_name][pol].items()} for pol in POLICIES}
            res[pool_name]["sglang1_minus_vllm16"] = C.mean_ci(cells[pool_name]["diff"])
        out[scn] = res
        print(f"{scn}: pressure sglang-vllm {res['pressure']['sglang1_minus_vllm16']['mean']:+.4f}", flush=True)
    return out


def plot(doc: dict) -> None:
    plt = C.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.3))
    real = doc["real"]
    lab = {"mooncake": "Mooncake\nconversation", "weka": "WEKA\nagentic coding", "ragpulse": "RAGPulse\nRAG Q&A"}
    names = [n for n in lab if n in real]  # a fixed order: the result file's keys are sorted
    data, pos, ticks = [], [], []
    for i, n in enumerate(names):
        r = real[n]
        for j, (kind, key) in enumerate((("per session", "per_session"), ("per time window", "per_window"))):
            if r.get(key) is None:
                continue
            d = r[key]
            pos.append(i * 3.2 + j * 1.4)
            data.append(d)
            ticks.append(f"{lab[n]}\n{kind}")
    for p, d in zip(pos, data):
        a1.plot([p, p], [d["p10"], d["p90"]], color="C0", lw=2)
        a1.plot([p, p], [d["p25"], d["p75"]], color="C0", lw=7, alpha=0.6)
        a1.plot(p, d["p50"], "ko", ms=5)
    a1.axhspan(0.3, 0.6, color="C2", alpha=0.12, label="claimed healthy band 30–60 %")
    a1.set_xticks(pos)
    a1.set_xticklabels(ticks, fontsize=7, rotation=25, ha="right")
    a1.set_ylim(0, 1.02)
    a1.set_ylabel("token hit rate (infinite cache)")
    a1.set_title("C3: hit-rate spread (bar p10–p90, box p25–p75, dot median)", fontsize=9)
    a1.legend(fontsize=8, loc="lower right")
    # synthetic: pressure pool hit rate per scenario and policy, mean ± CI
    syn = doc["synthetic"]
    scns = [s for s in SCENARIOS if s in syn]
    for k, pol in enumerate(POLICIES):
        m = [syn[s]["pressure"][pol]["token_hit_rate"]["mean"] for s in scns]
        e = [syn[s]["pressure"][pol]["token_hit_rate"]["ci95"] for s in scns]
        a2.bar(np.arange(len(scns)) + (k - 1) * 0.27, m, width=0.27, yerr=e, capsize=3, label=pol)
    a2.set_xticks(np.arange(len(scns)))
    a2.set_xticklabels([s.replace("_", "\n") for s in scns], fontsize=8)
    a2.set_ylim(0, 1)
    a2.set_ylabel("token hit rate")
    a2.set_title(f"Synthetic ablation, {POOLS['pressure']:,}-token pool, {len(SEEDS)} seeds (mean ± 95 % CI)", fontsize=9)
    a2.legend(fontsize=8)
    fig.tight_layout()
    C.save_fig(fig, "workloads.png")


def main() -> None:
    n = 300 if C.QUICK else 1000
    limit = {"mooncake": 4000, "weka": 1000, "ragpulse": 3000} if C.QUICK else {}
    doc = {"real": real_traces(limit), "synthetic": synthetic(n)}
    C.write_result("workloads.json", doc, {"synthetic_requests": n, "seeds": SEEDS, "scenarios": SCENARIOS,
                                            "policies": POLICIES, "pools_tokens": POOLS, "window_s": WINDOW_S,
                                            "real_limit": limit, "cost_model": "Llama-3.1-8B on A100-80GB, defaults"})


if __name__ == "__main__":
    C.main_or_plot(main, plot, "workloads.json")
