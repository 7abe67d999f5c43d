"""SGLang HiCache: hit rate (GPU + host) vs host capacity at a fixed GPU pool, beside the
single-tier pool of the same total size (issue 18).

Mooncake FAST'25 conversation trace, replayed sequentially. The GPU pool is SGLang's
``max_total_num_tokens`` = 1,000,000 tokens, page 1 (SGLang's default ``--page-size``); the
host pool (``--hicache-size`` at the model's KV bytes per token, here given in tokens)
runs 0–50 M tokens, for each ``--hicache-write-policy`` (``write_through``,
``write_through_selective``, ``write_back``), replayed by ``sglang-hicache`` (exact to
SGLang 0.5.23 on 30 goldens, docs/hicache.md). The single-tier curve is plain ``sglang``
(RadixAttention, no host tier) with a GPU pool of 1 M + host tokens; ``sglang`` at
``max(1 M, host)`` tokens and at a pool holding the whole trace are reported beside it.

Reported per point: token hit rate (device + loaded-back tokens / prompt tokens), its
device and host (loaded-back) parts, tokens copied GPU→host and host→GPU, and the bytes
those are for Llama-3.1-8B (bf16, tp 1: radixkv's memory model gives the KV bytes per
token); per write policy, where the two-tier curve meets the single-tier one (the first
host size from which on it stays within 0.005 of the single-tier hit rate at the same
total; None when it does not).

A second part runs the concurrent replay (``--mode concurrent``; SGLang's scheduler rules,
Llama-3.1-8B on one H100-80GB priced by radixkv's roofline cost model) on the first 1,000
requests at 10 × the trace's inter-arrival times, GPU pool 200,000 tokens: no host tier,
then a 4 M-token host pool behind PCIe 4.0 x16, PCIe 5.0 x16 and NVLink-C2C links
(``radixkv.cost.HOST_LINKS``): hit rate, TTFT p50/p90/p99 and the seconds of host→GPU
copies, which overlap the prefill layer by layer.

    python experiments/fig_hicache.py [--quick]   # results/hicache.{json,png}
    python experiments/fig_hicache.py --plot-only

Full: ~3 min on 2 idle cores (each point replays 12,031 requests, 145 M prompt tokens);
--quick: the first 3,000 requests and fewer host sizes.
"""
from __future__ import annotations

import _common as C  # noqa: I001

import radixkv
from radixkv.cost import CostModel, HostLink
from radixkv.memory.presets import get_model
from radixkv.policies.hicache import HiCacheRadixCache
from radixkv.policies.registry import PoolSpec, parse_policy

GPU_TOKENS = 1_000_000
PAGE = 1
HOST_M = (0, 0.5, 1, 2, 3, 4, 6, 8, 10, 15, 20, 25, 30, 40, 50)
HOST_M_QUICK = (0, 1, 4, 10, 25, 50)
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
MODEL = "Llama-3.1-8B"
#: hit-rate distance at which the two-tier curve counts as meeting the single-tier one
MEET_TOL = 0.005
#: the concurrent part: requests, arrival stretch, GPU pool, host pool, links
CONC_REQUESTS, CONC_REQUESTS_QUICK, CONC_TIME_SCALE = 1000, 300, 10.0
CONC_GPU_TOKENS, CONC_HOST_TOKENS = 200_000, 4_000_000
LINKS = ("pcie4-x16", "pcie5-x16", "nvlink-c2c")
GPU = "H100-80GB"


def _concurrent(trace) -> list:
    from radixkv.replay.arrivals import arrival_times
    from radixkv.replay.concurrent import replay_concurrent

    cost = CostModel.from_specs(MODEL, GPU)
    arr = arrival_times(trace, arrival="trace", time_scale=CONC_TIME_SCALE)
    rows = []
    for host, link in [(0, None)] + [(CONC_HOST_TOKENS, x) for x in LINKS]:
        pol = HiCacheRadixCache(CONC_GPU_TOKENS, PAGE, host_tokens=host)
        s = replay_concurrent(trace, pol, cost, arrivals=arr,
                              host_link=None if link is None else HostLink.parse(link)).summary()
        row = {"host_tokens": host, "host_link": link, **{k: s[k] for k in (
            "token_hit_rate", "host_hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "queue_p50_s",
            "host_to_gpu_tokens", "host_load_s", "concurrency_mean", "duration_s")}}
        rows.append(row)
        print(f"concurrent host {host:,} {link}: hit {s['token_hit_rate']:.4f}, TTFT p50 {s['ttft_p50_s']:.3f} s "
              f"p99 {s['ttft_p99_s']:.3f} s, copies {s['host_load_s']:.3f} s", flush=True)
    return rows


def _sglang(trace, tokens):
    _, s = radixkv.run(radixkv.ReplaySpec(trace, parse_policy(f"sglang:{PAGE}"), PoolSpec(max_total_num_tokens=tokens)))
    return s


def main() -> None:
    limit = 3000 if C.QUICK else None
    trace = C.load("mooncake", limit)
    hosts = [int(h * 1_000_000) for h in (HOST_M_QUICK if C.QUICK else HOST_M)]
    bpt = get_model(MODEL).kv_bytes_per_token(1, None)
    single, single_max, curves = [], [], {}
    for h in hosts:
        s = _sglang(trace, GPU_TOKENS + h)
        single.append(s["token_hit_rate"])
        single_max.append(_sglang(trace, max(GPU_TOKENS, h))["token_hit_rate"])
        print(f"sglang {GPU_TOKENS + h:,} tokens: {s['token_hit_rate']:.4f}", flush=True)
    unbounded = _sglang(trace, int(trace.prompt_len.sum() + trace.output_len.sum()) + GPU_TOKENS)
    for wp in WRITE_POLICIES:
        pts = []
        for h in hosts:
            spec = parse_policy(f"sglang-hicache:{PAGE}@host_tokens={h},write_policy={wp}")
            _, s = radixkv.run(radixkv.ReplaySpec(trace, spec, PoolSpec(max_total_num_tokens=GPU_TOKENS)))
            p = s["prompt_tokens"]
            pts.append({"host_tokens": h, "host_capacity_tokens": s["host_capacity_tokens"],
                        "hit_rate": s["token_hit_rate"], "device_hit_rate": s["device_hit_tokens"] / p,
                        "host_hit_rate": s["host_hit_rate"], "host_found_rate": s["host_hit_tokens"] / p,
                        "gpu_to_host_tokens": s["gpu_to_host_tokens"], "host_to_gpu_tokens": s["host_to_gpu_tokens"],
                        "gpu_to_host_bytes": s["gpu_to_host_tokens"] * bpt,
                        "host_to_gpu_bytes": s["host_to_gpu_tokens"] * bpt,
                        "host_evicted_tokens": s["host_evicted_tokens"], "replay_s": round(s["timing_s"]["replay"], 2)})
            print(f"{wp} host {h:,}: hit {s['token_hit_rate']:.4f} (device {pts[-1]['device_hit_rate']:.4f}, "
                  f"host {s['host_hit_rate']:.4f}), {pts[-1]['replay_s']} s", flush=True)
        gaps = [st - pt["hit_rate"] for pt, st in zip(pts, single)]
        # the first host size from which on the two-tier curve stays within MEET_TOL of
        # the single-tier one (None: it does not, up to the largest host size)
        meet = None
        for j in range(len(hosts) - 1, -1, -1):
            if hosts[j] == 0 or abs(gaps[j]) > MEET_TOL:
                break
            meet = hosts[j]
        curves[wp] = {"points": pts, "meets_single_tier_at_host_tokens": meet,
                      "gap_to_single_tier": [round(g, 6) for g in gaps]}
    doc = {"trace": "mooncake", "requests": len(trace), "prompt_tokens": int(trace.prompt_len.sum()),
           "gpu_tokens": GPU_TOKENS, "page_size": PAGE, "host_tokens": hosts,
           "single_tier_hit_rate": single, "single_tier_max_hit_rate": single_max,
           "unbounded_hit_rate": unbounded["token_hit_rate"], "meet_tolerance": MEET_TOL,
           "model_for_bytes": MODEL, "kv_bytes_per_token": bpt, "curves": curves}
    ctr = C.load("mooncake", CONC_REQUESTS_QUICK if C.QUICK else CONC_REQUESTS)
    doc["concurrent"] = {"requests": len(ctr), "time_scale": CONC_TIME_SCALE, "gpu_tokens": CONC_GPU_TOKENS,
                         "model": MODEL, "gpu": GPU, "rows": _concurrent(ctr)}
    C.write_result("hicache.json", doc, {"gpu_tokens": GPU_TOKENS, "page_size": PAGE, "host_tokens": hosts,
                                         "write_policies": list(WRITE_POLICIES), "limit": limit,
                                         "model_for_bytes": MODEL, "meet_tolerance": MEET_TOL,
                                         "concurrent": {"requests": len(ctr), "time_scale": CONC_TIME_SCALE,
                                                        "gpu_tokens": CONC_GPU_TOKENS,
                                                        "host_tokens": CONC_HOST_TOKENS, "links": list(LINKS),
                                                        "model": MODEL, "gpu": GPU}})


def plot(doc: dict) -> None:
    plt = C.pyplot()
    x = [h / 1e6 for h in doc["host_tokens"]]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(x, doc["single_tier_hit_rate"], "k-", lw=2, label="sglang, one GPU pool of 1 M + host tokens")
    ax.plot(x, doc["single_tier_max_hit_rate"], "k:", label="sglang, one GPU pool of max(1 M, host) tokens")
    styles = {"write_through": "C0", "write_through_selective": "C2", "write_back": "C3"}
    for wp in WRITE_POLICIES:  # the script's order, not the file's sorted keys
        if wp not in doc["curves"]:
            continue
        cv = doc["curves"][wp]
        pts = cv["points"]
        ax.plot(x, [p["hit_rate"] for p in pts], "o-", color=styles.get(wp), ms=3,
                label=f"sglang-hicache {wp}: GPU + host")
        if wp == "write_through":
            ax.plot(x, [p["device_hit_rate"] for p in pts], "--", color=styles.get(wp), lw=1,
                    label="  of which GPU-resident hits")
        if cv["meets_single_tier_at_host_tokens"] is not None:
            m = cv["meets_single_tier_at_host_tokens"] / 1e6
            y = next(p["hit_rate"] for p in pts if p["host_tokens"] / 1e6 == m)
            ax.plot([m], [y], "s", color=styles.get(wp), mfc="none", ms=9)
    ax.axhline(doc["unbounded_hit_rate"], color="grey", lw=0.8)
    ax.text(x[-1], doc["unbounded_hit_rate"], " unbounded", va="bottom", ha="right", fontsize=7, color="grey")
    ax.set_xlabel("host KV pool (M tokens); GPU pool fixed at 1 M tokens")
    ax.set_ylabel("token hit rate")
    ax.set_title(f"Mooncake conversation, SGLang 0.5.23 HiCache ({doc['requests']:,} requests)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    C.save_fig(fig, "hicache.png")


if __name__ == "__main__":
    C.main_or_plot(main, plot, "hicache.json")
