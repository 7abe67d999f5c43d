"""Hybrid SSM model (full attention + gated delta net) vs the same model with full attention
everywhere, at equal GPU memory, on the WEKA agentic-coding sessions (issue 19; do claims
C5/C7 survive hybrids?). The sliding-window counterpart is ``hybrid_weka.py``.

Model: Qwen3-Next-80B-A3B (12 full-attention + 36 gated-delta-net layers; preset
``Qwen3-Next-80B-A3B``) on H100-80GB, tp 4, vLLM 0.33 rules with prefix caching (Mamba
``mamba_cache_mode="align"``). The KV budget per rank is radixkv's vLLM memory rule
(``vllm_pool_size`` of the all-full-attention variant: ``available_kv_cache_memory``; the
weights are the same); the two configurations spend it differently:

- **full attention** (all 48 layers full attention, same shapes): ``num_gpu_blocks`` of
  48-layer 16-token blocks (``vllm_pool_size``), replayed by ``vllm:16``;
- **hybrid**: vLLM raises the block size so an attention page covers a state page
  (``Platform._align_hybrid_block_size``: 272 tokens at tp 4), groups the layers in groups
  of 12 (1 full + 3 Mamba groups, ``_get_kv_cache_groups_uniform_page_size``), and a block
  id holds one 12-layer page, so the budget buys ``budget // (272 × 12 × per-layer bytes)``
  block ids (:func:`radixkv.memory.hybrid.vllm_hybrid_num_gpu_blocks`, exact against vLLM's
  own functions in ``tests/test_hybrid_groups.py``); replayed by
  ``vllm-hybrid:272@mambax3+full/max_num_batched_tokens=8192`` (vLLM's group order: the
  Mamba groups first, as layer 0 is linear attention). A Mamba group keeps a state
  only where a step ended on a block boundary, so a hit lands on 272-token boundaries where
  an earlier request's prefill or decode stopped.

Traces: the WEKA session files whose longest prompt fits Qwen3-Next's 262,144-token
context (34 of 36), replayed sequentially: each file on its own (one user's agent), then
all of them as one trace with every session starting at time 0 (``read_weka_files``: many
users sharing one pool). Reported: token hit rate of each configuration; for the hybrid, the
tokens its full-attention group alone held (``full_attention_hit_tokens``: the reuse the
Mamba states cost on the same pool state) and the cached blocks per group.

    python experiments/hybrid_ssm_weka.py [--quick]   # writes results/hybrid_ssm_weka.json

--quick: the 5 smallest files.
"""
from __future__ import annotations

import _common as C  # noqa: I001

import dataclasses
import json
import time

import radixkv
from radixkv.memory import get_gpu, get_model, vllm_pool_size
from radixkv.memory.hybrid import (mamba_page_bytes, vllm_hybrid_block_size, vllm_hybrid_num_gpu_blocks,
                                   vllm_hybrid_policy_option, vllm_kv_cache_groups)
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.trace.load import load_trace
from radixkv.trace.weka import read_weka_files

MODEL, GPU, TP, B = "Qwen3-Next-80B-A3B", "H100-80GB", 4, 16
MNBT = 8192


def _pools():
    hyb = get_model(MODEL)
    full = dataclasses.replace(hyb, name=MODEL + " (all full)", layer_types=None, ssm=None)
    pf = vllm_pool_size(full, get_gpu(GPU), tp=TP, block_size=B)
    hb = vllm_hybrid_block_size(hyb, block_size=B, tp=TP)
    h_blocks = vllm_hybrid_num_gpu_blocks(hyb, pf.budget_bytes, block_size=B, tp=TP)
    groups, size = vllm_kv_cache_groups(hyb)
    return hyb, pf, hb, h_blocks, groups, size


def _run(t, spec, pool):
    t0 = time.process_time()
    _, s = radixkv.run(radixkv.ReplaySpec(t, spec, pool))
    return s, time.process_time() - t0


def main() -> None:
    hyb, pf, hb, h_blocks, groups, size = _pools()
    files = C.weka_session_files(hyb.max_position_embeddings)
    full_spec = parse_policy(f"vllm:{B}")
    hyb_spec = parse_policy(f"vllm-hybrid:{hb}@{vllm_hybrid_policy_option(groups)}/max_num_batched_tokens={MNBT}")
    rows = []
    tot = {"prompt": 0, "full_hit": 0, "hyb_hit": 0, "hyb_full_group_hit": 0, "cpu_full": 0.0, "cpu_hyb": 0.0}
    for f in files:
        t = load_trace(f)
        sf, cf = _run(t, full_spec, PoolSpec(num_gpu_blocks=pf.num_gpu_blocks))
        sh, ch = _run(t, hyb_spec, PoolSpec(num_gpu_blocks=h_blocks))
        g = sh["kv_cache_groups"]
        rows.append({"trace": f.name, "requests": sf["requests"], "prompt_tokens": sf["prompt_tokens"],
                     "full_attention_hit_rate": sf["token_hit_rate"], "hybrid_hit_rate": sh["token_hit_rate"],
                     "hybrid_full_group_hit_tokens": g["full_attention_hit_tokens"],
                     "hybrid_loss_tokens": g["hybrid_loss_tokens"],
                     "hybrid_keyed_blocks_mean": [x["keyed_blocks_mean"] for x in g["groups"]]})
        tot["prompt"] += sf["prompt_tokens"]
        tot["full_hit"] += sf["hit_tokens"]
        tot["hyb_hit"] += sh["hit_tokens"]
        tot["hyb_full_group_hit"] += g["full_attention_hit_tokens"]
        tot["cpu_full"] += cf
        tot["cpu_hyb"] += ch
        print(f"{f.name}: {sf['requests']} requests, full attention {sf['token_hit_rate']:.4f}, "
              f"hybrid {sh['token_hit_rate']:.4f} (its full group alone held "
              f"{g['full_attention_hit_tokens'] / max(sf['prompt_tokens'], 1):.4f}); CPU {cf:.1f} s / {ch:.1f} s",
              flush=True)
    # the same sessions as one trace, all users starting together (radixkv.trace.weka:
    # conversation_spacing_s = 0, stable sort by arrival): they compete for one pool
    t = read_weka_files(files, name="weka-selected")
    sf, cf = _run(t, full_spec, PoolSpec(num_gpu_blocks=pf.num_gpu_blocks))
    sh, ch = _run(t, hyb_spec, PoolSpec(num_gpu_blocks=h_blocks))
    g = sh["kv_cache_groups"]
    together = {"requests": sf["requests"], "prompt_tokens": sf["prompt_tokens"],
                "full_attention_hit_rate": sf["token_hit_rate"], "hybrid_hit_rate": sh["token_hit_rate"],
                "hybrid_full_group_hit_rate": g["full_attention_hit_tokens"] / sf["prompt_tokens"],
                "full_attention_evicted_tokens": sf.get("evicted_tokens"),
                "hybrid_evicted_tokens": sh.get("evicted_tokens"),
                "hybrid_keyed_blocks_mean": [x["keyed_blocks_mean"] for x in g["groups"]],
                "cpu_s": {"full_attention": round(cf, 1), "hybrid": round(ch, 1)}}
    print("sessions together:", json.dumps(together), flush=True)
    per_layer = hyb.kv_elements_per_token_layer(TP) * hyb.kv_dtype_bytes(None)
    doc = {
        "model": MODEL, "gpu": GPU, "tp": TP,
        "kv_budget_bytes_per_rank": pf.budget_bytes,
        "full_attention": {"policy": full_spec.label, "block_size": B, "num_gpu_blocks": pf.num_gpu_blocks,
                           "block_bytes_per_rank": pf.bytes_per_unit, "capacity_tokens": pf.capacity_tokens},
        "hybrid": {"policy": hyb_spec.label, "block_size": hb, "num_gpu_blocks": h_blocks,
                   "block_bytes_per_rank": hb * size * per_layer,
                   "state_page_bytes_per_rank": mamba_page_bytes(hyb, TP),
                   "groups": [g.kind for g in groups], "group_layers": size,
                   "full_group_capacity_tokens": (h_blocks - 1) * hb},
        "traces": rows,
        "sessions_together": together,
        "pooled": {"prompt_tokens": tot["prompt"],
                   "full_attention_hit_rate": tot["full_hit"] / tot["prompt"],
                   "hybrid_hit_rate": tot["hyb_hit"] / tot["prompt"],
                   "hybrid_full_group_hit_rate": tot["hyb_full_group_hit"] / tot["prompt"],
                   "cpu_s": {"full_attention": round(tot["cpu_full"], 1), "hybrid": round(tot["cpu_hyb"], 1)}},
    }
    print(json.dumps(doc["pooled"], indent=1))
    C.write_result("hybrid_ssm_weka.json", doc, {"model": MODEL, "gpu": GPU, "tp": TP, "block_size": B,
                                                 "max_num_batched_tokens": MNBT,
                                                 "files": [f.name for f in files]})


if __name__ == "__main__":
    main()
