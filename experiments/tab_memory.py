"""Tables: KV bytes per token and per request, pool sizes, prefill cost (claims C4, C11, C12, C15, C16, C17).

Pure arithmetic from radixkv's memory model (``radixkv.memory``: ModelSpec, ``pool_for``)
and cost model (``radixkv.cost.CostModel``); no trace is read. Runs in about a second.

    python experiments/tab_memory.py [--quick]     # writes results/memory.json
"""
from __future__ import annotations

import _common as C  # noqa: I001 (puts the repository on sys.path)

from radixkv.cost import CostModel
from radixkv.memory import get_model, pool_for

MODELS = ["Llama-2-7B", "Llama-3.1-8B", "Mistral-7B", "Qwen2.5-7B", "Llama-3.1-70B", "DeepSeek-V3"]
ATTN = {"Llama-2-7B": "MHA", "Llama-3.1-8B": "GQA", "Mistral-7B": "GQA", "Qwen2.5-7B": "GQA",
        "Llama-3.1-70B": "GQA", "DeepSeek-V3": "MLA"}
GMU = [0.80, 0.85, 0.88, 0.90, 0.92, 0.95]
GIB = 2 ** 30


def main() -> None:
    models = {}
    for name in MODELS:
        m = get_model(name)
        bpt = m.kv_bytes_per_token()
        models[name] = {
            "attention": ATTN[name],
            "num_layers": m.num_layers, "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
            "kv_bytes_per_token": bpt,
            "kv_mib_per_token": bpt / 2 ** 20,
            "kv_bytes_per_token_fp8": m.kv_bytes_per_token(kv_cache_dtype="fp8"),
            "fp8_ratio": m.kv_bytes_per_token(kv_cache_dtype="fp8") / bpt,
            "kv_gib_4k": bpt * 4096 / GIB,
            "kv_gib_32k": bpt * 32768 / GIB,
            # C12: tokens in a 12 GB pool (decimal GB, as the article writes)
            "tokens_in_12gb": int(12e9 // bpt),
        }
    # C15: tensor parallelism — per-GPU bytes per token and pool tokens
    tp_rows = []
    for name, gpu, tps in (("Llama-3.1-8B", "A100-80GB", (1, 2, 4, 8)),
                           ("Llama-3.1-70B", "H100-80GB", (2, 4, 8)),
                           ("DeepSeek-V3", "H200-141GB", (8,))):
        m = get_model(name)
        for tp in tps:
            p = pool_for("vllm", m, gpu, tp=tp, gpu_memory_utilization=0.9)
            tp_rows.append({"model": name, "attention": ATTN[name], "gpu": gpu, "tp": tp,
                            "kv_bytes_per_token_per_gpu": m.kv_bytes_per_token(tp=tp),
                            "pool_gib_per_gpu": p.bytes / GIB, "pool_tokens": p.capacity_tokens,
                            "one_gpu_share_of_token_bytes": m.kv_bytes_per_token(tp=tp) / m.kv_bytes_per_token()})
    # C4 (pool part) and C17 (bytes part): pool tokens by gpu_memory_utilization and KV dtype
    gmu_rows = []
    for g in GMU:
        row = {"gpu_memory_utilization": g}
        for dt in (None, "fp8"):
            p = pool_for("vllm", "Llama-3.1-8B", "A100-80GB", gpu_memory_utilization=g, kv_cache_dtype=dt)
            row["pool_tokens_" + (dt or "bf16")] = p.capacity_tokens
            row["pool_gib_" + (dt or "bf16")] = p.bytes / GIB
        gmu_rows.append(row)
    fp8_pools = []
    for gpu in ("RTX-4090", "A100-40GB", "L40S", "A100-80GB"):
        b = pool_for("vllm", "Llama-3.1-8B", gpu)
        f = pool_for("vllm", "Llama-3.1-8B", gpu, kv_cache_dtype="fp8")
        fp8_pools.append({"gpu": gpu, "pool_tokens_bf16": b.capacity_tokens, "pool_tokens_fp8": f.capacity_tokens,
                          "ratio": f.capacity_tokens / b.capacity_tokens})
    # C11: prefill cost of a 2,000- vs a 200-token prefix (computed from scratch)
    cost_rows = []
    for name in ("Llama-3.1-8B", "Llama-3.1-70B"):
        c = CostModel.from_specs(name, "H100-80GB" if "70B" in name else "A100-80GB")
        f = {n: c.prefill_flops(n) for n in (200, 2000, 32000)}
        att = {n: 4.0 * c.num_layers * c.attn_dim * n * (n + 1) / 2 for n in (200, 2000, 32000)}
        lin = {n: 2.0 * c.params * n for n in (200, 2000, 32000)}
        cost_rows.append({
            "model": name,
            "flops_200": f[200], "flops_2000": f[2000], "flops_32000": f[32000],
            "ratio_whole_forward": f[2000] / f[200],
            "ratio_attention_term": att[2000] / att[200],
            "ratio_linear_term": lin[2000] / lin[200],
            "attention_share_200": att[200] / f[200],
            "attention_share_2000": att[2000] / f[2000],
            "attention_share_32000": att[32000] / f[32000],
            # tokens where the attention term equals the linear term: 4 L d n(n+1)/2 = 2 N n
            "crossover_tokens": 2.0 * c.params / (2.0 * c.num_layers * c.attn_dim),
        })
    doc = {"models": models, "tensor_parallel": tp_rows, "gpu_memory_utilization": gmu_rows,
           "fp8_pools": fp8_pools, "prefill_cost": {r["model"]: r for r in cost_rows}}
    C.write_result("memory.json", doc, {"models": MODELS, "gpu_memory_utilization": GMU,
                                         "engine_rule": "vllm", "cost_model": "CostModel.from_specs defaults"})


if __name__ == "__main__":
    main()
