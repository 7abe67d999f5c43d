"""Mooncake FAST'25 Fig. 9 against the Mooncake team's own simulator, point by point, under
both measurement conventions, and the hypotheses for the remaining gap tested one by one.

The Mooncake team's kvcache-simulator (``pip install kvcache-simulator==0.1.3``, Apache-2.0;
an optional dependency of this script only, never of radixkv) replays the same
conversation trace with an LRU over a prefix *trie* of 512-token blocks (a leaf is evicted,
never an inner block; the current request's path is protected; only the hit prefix is
touched) and reports the hit rate over the **last 50 % of requests** (its warm-up is the
first ⌊n/2⌋; a budget whose cache is not full by then is omitted). radixkv replays the same
trace with ``--measure-last 0.5`` (``measure_window``), so every configuration below gives
both conventions from one replay:

- ``unit-lru`` (the cache-study model: a flat LRU over prefix-keyed 512-token units, every
  prompt unit touched in order, the partial last unit counted by its tokens, outputs not
  cached) and two variants of the trace for the *partial last block* hypothesis: the partial
  last block dropped (prompt cut to whole blocks) or counted as a whole 512-token block;
- the engine policies ``vllm:16`` and ``sglang:1`` (outputs cached, as the engines do), and
  for the *outputs* and *block size* hypotheses ``vllm:16`` on the trace with no outputs and
  ``vllm:512`` (block = the trace's hash unit);
- kvcache-simulator's ``lru`` and ``optimal`` (Belady on the trie) and its ceiling at the
  same 8 capacities (``capacity_tokens // 512`` blocks, given as GiB of llama-3.1-8b bf16:
  2^26 bytes per block, so ``blocks / 16`` GiB is exact), and its ``lru`` once more on the
  trace with the partial last block dropped (the same hypothesis under its eviction rule).

Each configuration is replayed once (one curve); the engine policies only from 1 M tokens
(below that a request does not fit). Without kvcache-simulator installed the script says so
and writes nothing (the committed result stays).

    python experiments/fig_mooncake_kvsim.py [--quick]   # writes results/mooncake_kvsim.{json,png}

Full: ~0.2 min on 2 idle cores; --quick: first 4,000 requests, every configuration (so every
value the paper quotes renders in the quick paper).
"""
from __future__ import annotations

import _common as C  # noqa: I001

import sys

import numpy as np

from fig_mooncake_curve import CAPS, ENGINE_CAPS, PAPER
from radixkv.metrics import window_summary
from radixkv.policies.registry import parse_policy
from radixkv.replay.curve import run_curve
from radixkv.replay.run import warmup_many
from radixkv.trace.stats import infinite_cache_hits
from radixkv.trace.types import Trace

#: the measurement window of kvcache-simulator (and of the Mooncake team's published simulator)
LAST = 0.5
UNIT = 512
KVS_PIN = "0.1.3"
KVS_MODEL = "llama-3.1-8b"  # bf16: 131,072 bytes per token, 2^26 per 512-token block
BLOCKS_PER_GIB = 16
CONVENTIONS = ("whole", "last_50")

#: (name, policy, trace variant, capacities, what it tests)
CONFIGS = [
    ("unit_lru", "unit-lru", None, CAPS,
     "cache-study model: flat LRU over 512-token prefix units, partial last unit counted by its tokens, "
     "outputs not cached"),
    ("unit_lru_drop_partial", "unit-lru", "drop_partial", CAPS,
     "partial last block neither cached nor counted (prompts cut to whole 512-token blocks)"),
    ("unit_lru_partial_as_512", "unit-lru", "round_up", CAPS,
     "partial last block cached and counted as a whole 512-token block"),
    ("vllm_16", "vllm:16", None, ENGINE_CAPS, "vLLM block hash, block 16, outputs cached"),
    ("vllm_16_no_outputs", "vllm:16", "no_outputs", ENGINE_CAPS, "vLLM block 16 with outputs not cached"),
    ("vllm_512", "vllm:512", None, ENGINE_CAPS, "vLLM block hash, block 512 = the trace's hash unit"),
    ("sglang_1", "sglang:1", None, ENGINE_CAPS, "SGLang radix tree, page 1, outputs cached"),
]

#: (id, hypothesis, from config/convention, to config/convention, capacities compared)
HYPOTHESES = [
    ("window", "measurement window: whole trace -> last 50 % of requests", ("unit_lru", "whole"),
     ("unit_lru", "last_50"), CAPS),
    ("eviction", "eviction rule: flat unit LRU -> kvcache-simulator's trie LRU (last 50 %)", ("unit_lru", "last_50"),
     ("kvsim_lru", "last_50"), CAPS),
    ("partial_dropped", "partial last block dropped (unit-lru, last 50 %)", ("unit_lru", "last_50"),
     ("unit_lru_drop_partial", "last_50"), CAPS),
    ("partial_dropped_trie", "partial last block dropped (kvcache-simulator LRU)", ("kvsim_lru", "last_50"),
     ("kvsim_lru_drop_partial", "last_50"), CAPS),
    ("partial_as_512", "partial last block counted as 512 tokens (unit-lru, last 50 %)", ("unit_lru", "last_50"),
     ("unit_lru_partial_as_512", "last_50"), CAPS),
    ("outputs", "outputs cached -> not cached (vllm:16, last 50 %)", ("vllm_16", "last_50"),
     ("vllm_16_no_outputs", "last_50"), ENGINE_CAPS),
    ("block_size", "block size 512 -> 16 (vLLM, last 50 %)", ("vllm_512", "last_50"), ("vllm_16", "last_50"),
     ENGINE_CAPS),
    ("engine", "unit model -> engine (unit-lru -> sglang:1, last 50 %)", ("unit_lru", "last_50"),
     ("sglang_1", "last_50"), ENGINE_CAPS),
]


def variant(tr: Trace, kind: str | None) -> Trace:
    """The trace for one hypothesis (in memory; replay order kept)."""
    if kind is None:
        return tr
    P = np.asarray(tr.prompt_len, dtype=np.int64)
    off = np.asarray(tr.id_offsets, dtype=np.int64)
    ids = [tr.ids[off[i]:off[i + 1]].tolist() for i in range(len(tr))]
    out = np.asarray(tr.output_len, dtype=np.int64)
    if kind == "drop_partial":
        full = P // UNIT
        P = full * UNIT
        ids = [x[:k] for x, k in zip(ids, full.tolist())]
    elif kind == "round_up":
        P = np.asarray([len(x) * UNIT for x in ids], dtype=np.int64)
    elif kind == "no_outputs":
        out = np.zeros_like(out)
    else:
        raise ValueError(kind)
    if (P <= 0).any():
        raise ValueError(f"{kind}: a prompt would be empty")
    return Trace.from_requests(req_id=tr.req_id, arrival_s=tr.arrival_s, prompt_len=P, output_len=out,
                               prompt_ids=ids, unit_tokens=tr.unit_tokens, partial_last_unit=kind != "drop_partial"
                               and tr.partial_last_unit, name=f"{tr.name} ({kind})")


def _rates(d: dict) -> dict:
    return {k: d[k] for k in ("token_hit_rate", "mean_request_hit_ratio", "hit_tokens", "prompt_tokens")}


def _kvs_lines(tr: Trace):
    """*tr* as Mooncake JSON lines (what kvcache-simulator reads; ids as they are)."""
    import json

    off = np.asarray(tr.id_offsets, dtype=np.int64)
    for i in range(len(tr)):
        yield json.dumps({"timestamp": 0, "input_length": int(tr.prompt_len[i]), "output_length": 0,
                          "hash_ids": tr.ids[off[i]:off[i + 1]].tolist()})


def run_kvsim(path, limit, variant_trace=None):
    """kvcache-simulator's lru and optimal at the 8 capacities (its C++ backend), or None
    when it is not installed. *variant_trace*: replay that in-memory trace instead of the
    file (the partial-block hypothesis under its trie LRU)."""
    try:
        from importlib.metadata import version

        from kvcache_sim.simulator import run_sweep
        from kvcache_sim.trace import parse_trace_file, parse_trace_lines
    except ImportError:
        return None
    v = version("kvcache-simulator")
    if variant_trace is None:
        kt = parse_trace_file(path, block_size=UNIT, max_records=limit or 0)
    else:
        kt = parse_trace_lines(_kvs_lines(variant_trace), block_size=UNIT)
    blocks = [c // UNIT for c in CAPS]
    res = run_sweep(kt, model_id=KVS_MODEL, budgets_gib=[b / BLOCKS_PER_GIB for b in blocks],
                    policies=["lru", "optimal"], backend="cpp", warmup_fraction=1 - LAST)
    meta = res["metadata"]
    assert meta["bytesPerBlock"] == 2 ** 26, meta["bytesPerBlock"]
    by_blocks = {p["cacheBlocks"]: p for p in res["points"]}
    pts = []
    for cap, b in zip(CAPS, blocks):
        p = by_blocks.get(b)
        row = {"capacity_tokens": cap, "cache_blocks": b, "omitted_underfilled": p is None}
        for pol in ("lru", "optimal"):
            r = p["results"][pol] if p else None
            row[pol] = None if r is None else {"hit_tokens": r["hitTokens"], "measured_tokens": r["totalTokens"],
                                                "token_hit_rate": r["hitRate"], "mode": r["measurementMode"]}
        pts.append(row)
    return {"version": v, "pinned": KVS_PIN, "backend": "cpp", "model": KVS_MODEL,
            "bytes_per_block": meta["bytesPerBlock"], "block_size": meta["blockSize"],
            "warmup_requests": meta["warmupRequests"], "measurement_window": meta["measurementWindow"],
            "measured_tokens": meta["totalMeasuredTokens"], "requests": meta["requestCount"],
            "unique_blocks": meta["uniqueBlocks"], "ceiling": res["hitRateCeiling"], "points": pts,
            "whole_trace": None,
            "whole_trace_note": "not reported: kvcache-simulator measures after a warm-up and omits a budget whose "
                                "cache is not full by then (with no warm-up every budget is omitted)"}


def main() -> None:
    limit = 4000 if C.QUICK else None
    tr = C.load("mooncake", limit)
    path = C.shared(C.TRACES["mooncake"][0])
    kvs = run_kvsim(path, limit)
    if kvs is None:
        print(f"kvcache-simulator is not installed (pip install kvcache-simulator=={KVS_PIN}): skipped, "
              f"results/mooncake_kvsim.json left as it is", file=sys.stderr)
        sys.exit(0)
    kvs_drop = run_kvsim(path, limit, variant(tr, "drop_partial"))
    configs = CONFIGS
    warmup_many([parse_policy(p) for p in dict.fromkeys(c[1] for c in configs)], concurrent=False)
    hit = infinite_cache_hits(tr)
    cols = {"prompt_tokens": np.asarray(tr.prompt_len, dtype=np.int64), "hit_tokens": hit}
    w = window_summary(cols, len(tr), LAST)
    infinite = {"whole": {"token_hit_rate": float(hit.sum() / cols["prompt_tokens"].sum()),
                          "mean_request_hit_ratio": float(np.mean(hit / cols["prompt_tokens"]))},
                "last_50": {"token_hit_rate": w["token_hit_rate"], "mean_request_hit_ratio": w["mean_request_hit_ratio"]},
                "kvcache_simulator_ceiling_last_50": kvs["ceiling"]}
    curves = {}
    for name, pol, kind, caps, what in configs:
        t = variant(tr, kind)
        pts = []
        for cap, res in zip(caps, run_curve(t, parse_policy(pol), caps, measure_last=LAST)):
            _, s = res
            pts.append({"capacity_tokens": cap, "whole": _rates(s), "last_50": _rates(s["measure_window"])})
            print(f"{name:>32} {cap:>11,}: whole {s['token_hit_rate']:.4f}  last 50 % "
                  f"{s['measure_window']['token_hit_rate']:.4f}", flush=True)
        curves[name] = {"policy": pol, "trace_variant": kind, "what": what, "points": pts}
    for pol, src, kind in (("lru", kvs, None), ("optimal", kvs, None), ("lru", kvs_drop, "drop_partial")):
        curves[f"kvsim_{pol}" + ("_drop_partial" if kind else "")] = {
            "policy": f"kvcache-simulator {kvs['version']} {pol}", "trace_variant": kind,
            "what": "the Mooncake team's simulator: trie of 512-token blocks, leaf eviction, last 50 % of requests"
                    + (" (trace with the partial last block dropped)" if kind else ""),
            "points": [{"capacity_tokens": p["capacity_tokens"], "whole": None,
                        "last_50": None if p[pol] is None else {"token_hit_rate": p[pol]["token_hit_rate"],
                                                                "hit_tokens": p[pol]["hit_tokens"],
                                                                "prompt_tokens": p[pol]["measured_tokens"],
                                                                "mean_request_hit_ratio": None}}
                       for p in src["points"]]}

    def rate(cfg, conv, cap):
        c = curves.get(cfg)
        p = next((p for p in c["points"] if p["capacity_tokens"] == cap), None) if c else None
        return None if p is None or p[conv] is None else p[conv]["token_hit_rate"]

    # point by point: Fig. 9 against every configuration and convention
    table = []
    for cap, ref in zip(PAPER["capacity_tokens"], PAPER["values"]):
        cap = int(cap)
        row = {"capacity_tokens": cap, "paper": ref}
        for cfg in curves:
            for conv in CONVENTIONS:
                v = rate(cfg, conv, cap)
                row.setdefault(cfg, {})[conv] = {"token_hit_rate": v, "gap": None if v is None else v - ref}
        ul, kl = curves.get("unit_lru"), curves["kvsim_lru"]
        u = next(p for p in ul["points"] if p["capacity_tokens"] == cap)["last_50"]
        k = next(p for p in kl["points"] if p["capacity_tokens"] == cap)["last_50"]
        row["kvsim_minus_unit_lru_last_50"] = None if k is None else {
            "hit_tokens": k["hit_tokens"] - u["hit_tokens"], "same_measured_tokens": k["prompt_tokens"] == u["prompt_tokens"],
            "token_hit_rate": k["token_hit_rate"] - u["token_hit_rate"]}
        table.append(row)

    def gaps(cfg, conv, caps):
        vals = [(rate(cfg, conv, c), r) for c, r in zip(PAPER["capacity_tokens"], PAPER["values"]) if int(c) in caps]
        g = [v - r for v, r in vals if v is not None]
        if not g:
            return None
        return {"points": len(g), "mean_abs_gap": float(np.mean(np.abs(g))), "mean_signed_gap": float(np.mean(g)),
                "max_abs_gap": float(np.max(np.abs(g))), "min_signed_gap": float(np.min(g)),
                "max_signed_gap": float(np.max(g)),
                "within_band": int(sum(abs(x) <= PAPER["read_off_error"] for x in g))}

    mid = [c for c in CAPS if 100_000 <= c <= 10_000_000]  # between the two ends of the curve
    # (low: its lower half, 100 k - 2 M)
    low = [c for c in CAPS if 100_000 <= c <= 2_000_000]
    summary = {cfg: {conv: {"all_caps": gaps(cfg, conv, CAPS), "engine_caps": gaps(cfg, conv, ENGINE_CAPS),
                            "mid_caps": gaps(cfg, conv, mid), "low_caps": gaps(cfg, conv, low)}
                     for conv in CONVENTIONS} for cfg in curves}
    hyps = []
    for hid, name, (fa, ca), (fb, cb), caps in HYPOTHESES:
        # compared on the capacities both sides have (kvcache-simulator omits an underfilled budget)
        caps = [c for c in caps if rate(fa, ca, c) is not None and rate(fb, cb, c) is not None]
        a, b = gaps(fa, ca, caps), gaps(fb, cb, caps)
        hyps.append({"id": hid, "hypothesis": name, "from": f"{fa} ({ca})", "to": f"{fb} ({cb})",
                     "capacities_tokens": caps,
                     "before": a, "after": b,
                     "mean_abs_gap_change": None if a is None or b is None else b["mean_abs_gap"] - a["mean_abs_gap"],
                     "mean_signed_gap_change": None if a is None or b is None
                     else b["mean_signed_gap"] - a["mean_signed_gap"]})
    at3 = {cfg: {conv: (None if rate(cfg, conv, 3_000_000) is None else
                        rate(cfg, conv, 3_000_000) / (infinite[conv]["token_hit_rate"]))
                 for conv in CONVENTIONS} for cfg in ("unit_lru", "kvsim_lru")}
    at3["kvsim_lru"]["whole"] = None
    d = [(r["capacity_tokens"], r["kvsim_minus_unit_lru_last_50"]) for r in table
         if r["kvsim_minus_unit_lru_last_50"] is not None]
    agree = {"equal_hit_tokens_at": [c for c, x in d if x["hit_tokens"] == 0],
             "max_abs_hit_tokens_from_100k": max(abs(x["hit_tokens"]) for c, x in d if c >= 100_000),
             "max_abs_token_hit_rate_from_100k": max(abs(x["token_hit_rate"]) for c, x in d if c >= 100_000),
             "same_measured_tokens": all(x["same_measured_tokens"] for _, x in d)}
    doc = {"trace": {"name": "Mooncake conversation_trace.jsonl", "requests": len(tr),
                     "window_first_request": w["first_request"], "window_requests": w["requests"]},
           "measure_last": LAST, "paper_fig9": PAPER, "infinite": infinite, "kvcache_simulator": kvs,
           "curves": curves, "table": table, "summary": summary, "hypotheses": hyps,
           "kvsim_vs_unit_lru_last_50": agree,
           "share_of_max_at_3m": at3}
    C.write_result("mooncake_kvsim.json", doc, {"capacities": CAPS, "engine_capacities": ENGINE_CAPS,
                                                 "configs": [c[0] for c in configs], "limit": limit,
                                                 "measure_last": LAST, "kvcache_simulator": kvs["version"],
                                                 "replay": "sequential"})


def plot(doc: dict) -> None:
    plt = C.pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    P = doc["paper_fig9"]
    x = np.asarray(P["capacity_tokens"])
    y = np.asarray(P["values"])
    ax.fill_between(x, y - P["read_off_error"], y + P["read_off_error"], color="0.85", label="Fig. 9 read-off ±0.02")
    ax.plot(x, y, "k^", label=P["label"])
    style = [("kvsim_lru", "last_50", "C3", "-", "kvcache-simulator LRU, last 50 %"),
             ("unit_lru", "last_50", "C0", "-", "radixkv unit-lru, last 50 %"),
             ("unit_lru", "whole", "C0", ":", "radixkv unit-lru, whole trace"),
             ("vllm_16", "last_50", "C2", "--", "radixkv vllm:16, last 50 %"),
             ("kvsim_lru_drop_partial", "last_50", "C4", "--", "kvcache-simulator LRU, partial block dropped"),
             ("kvsim_optimal", "last_50", "C1", "-.", "kvcache-simulator optimal, last 50 %")]
    for cfg, conv, col, ls, label in style:
        c = doc["curves"].get(cfg)
        if not c:
            continue
        pts = [p for p in c["points"] if p[conv] is not None]
        ax.plot([p["capacity_tokens"] for p in pts], [p[conv]["token_hit_rate"] for p in pts], color=col,
                linestyle=ls, marker="o", ms=3, label=label)
    ax.set_xscale("log")
    ax.set_ylim(0, 0.5)
    ax.set_xlabel("KV cache capacity (tokens, log scale)")
    ax.set_ylabel("token hit rate")
    ax.set_title(f"Mooncake conversation ({doc['trace']['requests']:,} requests): Fig. 9 beside "
                 "kvcache-simulator and radixkv", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    C.save_fig(fig, "mooncake_kvsim.png")


if __name__ == "__main__":
    C.main_or_plot(main, plot, "mooncake_kvsim.json")
