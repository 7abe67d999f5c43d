"""Hybrid (sliding-window) model vs the same model with full attention everywhere, at equal
GPU memory, on the WEKA agentic-coding sessions (issue 19; do claims C5/C7 survive hybrids?).

Model: Gemma-3-27B (10 full-attention + 52 sliding-window layers, window 1,024; preset
``Gemma-3-27B``) on H100-80GB, tp 2, vLLM 0.33 rules, block 16. The KV budget per rank is
radixkv's vLLM memory rule (``vllm_pool_size``: ``available_kv_cache_memory``); the two
configurations spend it differently:

- **full attention** (every layer full, same shapes): ``num_gpu_blocks`` of 62-layer blocks
  (``vllm_pool_size``), replayed by ``vllm:16``;
- **hybrid**: vLLM groups the layers in groups of 10 (the smallest layer count of a kind,
  ``v1/core/kv_cache_planning.py :: _get_kv_cache_groups_uniform_page_size``): 1 full group
  and ceil(52 / 10) = 6 sliding groups, and a block id holds one 10-layer page, so the
  same budget gives ``budget // (16 × 10 × per-layer bytes)`` block ids, replayed by
  ``vllm-hybrid:16@window=1024x6+full/max_num_batched_tokens=8192`` (vLLM's group order,
  sliding groups first; chunked prefill, which
  lets a sliding group hold only its window while a long prompt is prefilled).

Traces: the WEKA session files whose longest prompt fits Gemma-3's 131,072-token context
(14 of 36), replayed sequentially.
Each file is replayed on its own (one user's agent), then all of them as one trace with
every session starting at time 0 (``read_weka_files``: many users sharing one pool).
Reported per trace, pooled and together: token hit rate of each configuration; for the hybrid, the
tokens its full-attention group alone held (``full_attention_hit_tokens``: the reuse the
sliding groups cost on the same pool state) and the cached blocks per group.

    python experiments/hybrid_weka.py [--quick]   # writes results/hybrid_weka.json

Full: ~10 min on 2 idle cores (the hybrid policy is pure Python); --quick: the 5 smallest files.
"""
from __future__ import annotations

import _common as C  # noqa: I001

import dataclasses
import json

import radixkv
from radixkv.memory import get_gpu, get_model, vllm_pool_size
from radixkv.memory.hybrid import vllm_hybrid_policy_option, vllm_kv_cache_groups
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.trace.load import load_trace
from radixkv.trace.weka import read_weka_files

MODEL, GPU, TP, B = "Gemma-3-27B", "H100-80GB", 2, 16
GROUP_LAYERS = 10      # vLLM group size: min layers of one kind (10 full layers)
SLIDING_GROUPS = 6     # ceil(52 / 10)
MNBT = 8192


def _pools():
    hyb = get_model(MODEL)
    full = dataclasses.replace(hyb, name=MODEL + " (all full)", layer_types=None, sliding_window=None)
    gpu = get_gpu(GPU)
    pf = vllm_pool_size(full, gpu, tp=TP, block_size=B)
    per_layer = hyb.kv_elements_per_token_layer(TP) * hyb.kv_dtype_bytes(None)
    h_blocks = pf.budget_bytes // (B * GROUP_LAYERS * per_layer)
    return hyb, pf, int(h_blocks), per_layer


def main() -> None:
    hyb, pf, h_blocks, per_layer = _pools()
    files = C.weka_session_files(hyb.max_position_embeddings)
    full_spec = parse_policy(f"vllm:{B}")
    # vLLM's group order: groups numbered by first layer (layer 0 slides: sliding groups
    # first, the full-attention group last), radixkv.memory.hybrid.vllm_kv_cache_groups
    hyb_spec = parse_policy(f"vllm-hybrid:{B}@{vllm_hybrid_policy_option(vllm_kv_cache_groups(hyb)[0])}"
                            f"/max_num_batched_tokens={MNBT}")
    rows = []
    tot = {"prompt": 0, "full_hit": 0, "hyb_hit": 0, "hyb_full_group_hit": 0}
    for f in files:
        t = load_trace(f)
        _, sf = radixkv.run(radixkv.ReplaySpec(t, full_spec, PoolSpec(num_gpu_blocks=pf.num_gpu_blocks)))
        _, sh = radixkv.run(radixkv.ReplaySpec(t, hyb_spec, PoolSpec(num_gpu_blocks=h_blocks)))
        g = sh["kv_cache_groups"]
        row = {"trace": f.name, "requests": sf["requests"], "prompt_tokens": sf["prompt_tokens"],
               "full_attention_hit_rate": sf["token_hit_rate"], "hybrid_hit_rate": sh["token_hit_rate"],
               "hybrid_full_group_hit_tokens": g["full_attention_hit_tokens"],
               "hybrid_loss_tokens": g["hybrid_loss_tokens"],
               "hybrid_keyed_blocks_mean": [x["keyed_blocks_mean"] for x in g["groups"]]}
        rows.append(row)
        tot["prompt"] += sf["prompt_tokens"]
        tot["full_hit"] += sf["hit_tokens"]
        tot["hyb_hit"] += sh["hit_tokens"]
        tot["hyb_full_group_hit"] += g["full_attention_hit_tokens"]
        print(f"{f.name}: {sf['requests']} requests, full attention {sf['token_hit_rate']:.4f}, "
              f"hybrid {sh['token_hit_rate']:.4f} (its full group alone held "
              f"{g['full_attention_hit_tokens'] / max(sf['prompt_tokens'], 1):.4f})", flush=True)
    # the same sessions as one trace, all users starting together (radixkv.trace.weka:
    # conversation_spacing_s = 0, stable sort by arrival): they compete for one pool
    t = read_weka_files(files, name="weka-selected")
    _, sf = radixkv.run(radixkv.ReplaySpec(t, full_spec, PoolSpec(num_gpu_blocks=pf.num_gpu_blocks)))
    _, sh = radixkv.run(radixkv.ReplaySpec(t, hyb_spec, PoolSpec(num_gpu_blocks=h_blocks)))
    g = sh["kv_cache_groups"]
    together = {"requests": sf["requests"], "prompt_tokens": sf["prompt_tokens"],
                "full_attention_hit_rate": sf["token_hit_rate"], "hybrid_hit_rate": sh["token_hit_rate"],
                "hybrid_full_group_hit_rate": g["full_attention_hit_tokens"] / sf["prompt_tokens"],
                "full_attention_evicted_tokens": sf.get("evicted_tokens"),
                "hybrid_keyed_blocks_mean": [x["keyed_blocks_mean"] for x in g["groups"]]}
    print("sessions together:", json.dumps(together), flush=True)
    doc = {
        "model": MODEL, "gpu": GPU, "tp": TP, "block_size": B,
        "kv_budget_bytes_per_rank": pf.budget_bytes,
        "full_attention": {"policy": full_spec.label, "num_gpu_blocks": pf.num_gpu_blocks,
                           "block_bytes_per_rank": pf.bytes_per_unit, "capacity_tokens": pf.capacity_tokens},
        "hybrid": {"policy": hyb_spec.label, "num_gpu_blocks": h_blocks,
                   "block_bytes_per_rank": B * GROUP_LAYERS * per_layer,
                   "groups": 1 + SLIDING_GROUPS, "group_layers": GROUP_LAYERS,
                   "full_group_capacity_tokens": (h_blocks - 1) * B},
        "traces": rows,
        "sessions_together": together,
        "pooled": {"prompt_tokens": tot["prompt"],
                   "full_attention_hit_rate": tot["full_hit"] / tot["prompt"],
                   "hybrid_hit_rate": tot["hyb_hit"] / tot["prompt"],
                   "hybrid_full_group_hit_rate": tot["hyb_full_group_hit"] / tot["prompt"]},
    }
    print(json.dumps(doc["pooled"], indent=1))
    C.write_result("hybrid_weka.json", doc, {"model": MODEL, "gpu": GPU, "tp": TP, "block_size": B,
                                             "max_num_batched_tokens": MNBT, "files": [f.name for f in files]})


if __name__ == "__main__":
    main()
