"""SGLang's hybrid radix caches vs the same models with full attention everywhere, at equal
GPU memory, on the WEKA agentic-coding sessions (issue 19, SGLang side; the vLLM side is
experiments/hybrid_weka.py).

Two models on H100-80GB, SGLang 0.5.23 rules, page 1, ``--chunked-prefill-size 8192``
(SGLang's default on an 80 GB GPU). The KV budget per rank is radixkv's SGLang memory rule
(``sglang_pool_size(...).budget_bytes``: what is left for KV after weights and the
``mem_fraction_static`` reserve) of the all-full-attention model; both configurations
spend that budget:

- **Gemma-3-27B** (10 full + 52 sliding-window layers, window 1,024), tp 2. Full
  attention: ``budget // (62 × per-layer bytes)`` tokens, ``sglang:1``. Hybrid:
  SGLang's SWA pool split (``model_executor/pool_configurator.py``: a token costs its full
  layers plus ``swa_full_tokens_ratio`` (0.8) × its SWA layers; ``_solve_pool_sizes``):
  ``full = budget // (per-layer × (10 + 0.8 × 52))`` tokens and ``swa = int(0.8 × full)``,
  ``sglang-swa:1@window=1024/swa_full_tokens_ratio=0.8``.
- **Qwen3-Next-80B-A3B** (12 full-attention + 36 gated-delta-net layers), tp 4. Full
  attention: 48 full layers. Hybrid: SGLang's Mamba split
  (``mem_cache/kv_cache_configurator.py``: ``mamba_budget = budget × r / (1 + r)``,
  ``mamba_full_memory_ratio`` r = 0.9; ``max_mamba_cache_size = (mamba_budget − slot) //
  slot`` plus the pool's padding slot; the rest is full-attention KV of the 12 layers).
  A state slot is the 36 layers' conv state (bf16, ``SGLANG_MAMBA_CONV_DTYPE``) and
  temporal state (float32, SGLang's default SSM dtype, ``configs/mamba_utils.py ::
  mamba2_state_dtype``). ``sglang-mamba:1@max_mamba_cache_size=K`` (the ``no_buffer``
  strategy; the server's default with the overlap scheduler is ``extra_buffer``, which is
  not modelled).

Traces: the WEKA session files whose longest prompt fits the model's context, each
replayed on its own (one user's agent; pooled over files), then all of them as one trace
with every session starting at time 0 (many users sharing one pool). Reported: token hit rate of each
configuration and, for the hybrid, ``full_attention_hit_tokens`` (the Full KV the same
walk matched: what the full-attention part of the hybrid's own tree held, the reuse the
SWA / Mamba rule costs on that state).

    python experiments/hybrid_weka_sglang.py [--quick]   # writes results/hybrid_weka_sglang.json

Full: a few minutes on 2 idle cores (pure-Python policies); --quick: the 5 smallest files.
"""
from __future__ import annotations

import _common as C  # noqa: I001

import dataclasses
import json

import radixkv
from radixkv.memory import get_gpu, get_model, sglang_pool_size
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.trace.load import load_trace
from radixkv.trace.weka import read_weka_files

GPU, CHUNK = "H100-80GB", 8192
SWA_RATIO = 0.8          # --swa-full-tokens-ratio fallback
MAMBA_RATIO = 0.9        # --mamba-full-memory-ratio fallback


def _all_full(model):
    return dataclasses.replace(model, name=model.name + " (all full)", layer_types=None, sliding_window=None,
                               ssm=None)


def gemma_pools(tp=2):
    hyb = get_model("Gemma-3-27B")
    full = _all_full(hyb)
    pf = sglang_pool_size(full, get_gpu(GPU), tp=tp, chunked_prefill_size=CHUNK)
    per_layer = hyb.kv_elements_per_token_layer(tp) * hyb.kv_dtype_bytes(None)
    c = hyb.layer_counts()
    n_full, n_swa = c["full_attention"], c["sliding_attention"]
    full_tokens = int(pf.budget_bytes // (per_layer * (n_full + SWA_RATIO * n_swa)))
    swa_tokens = int(full_tokens * SWA_RATIO)
    return {"model": hyb, "tp": tp, "all_full_tokens": pf.max_total_num_tokens, "budget_bytes": pf.budget_bytes,
            "hybrid_full_tokens": full_tokens, "hybrid_swa_tokens": swa_tokens,
            "full_spec": "sglang:1",
            "hybrid_spec": f"sglang-swa:1@window={hyb.sliding_window}/swa_full_tokens_ratio={SWA_RATIO}",
            "layers": {"full_attention": n_full, "sliding_attention": n_swa}, "per_layer_bytes": per_layer}


def qwen_next_pools(tp=4):
    hyb = get_model("Qwen3-Next-80B-A3B")
    full = _all_full(hyb)
    pf = sglang_pool_size(full, get_gpu(GPU), tp=tp, chunked_prefill_size=CHUNK)
    per_layer = hyb.kv_elements_per_token_layer(tp) * hyb.kv_dtype_bytes(None)
    c = hyb.layer_counts()
    n_full, n_lin = c["full_attention"], c["linear_attention"]
    s = hyb.ssm
    conv = (s.head_k_dim * s.num_k_heads * 2 + s.head_v_dim * s.num_v_heads) // tp * (s.conv_kernel - 1)
    temporal = s.num_v_heads // tp * s.head_v_dim * s.head_k_dim
    slot = n_lin * (conv * 2 + temporal * 4)
    mamba_budget = pf.budget_bytes * MAMBA_RATIO / (1 + MAMBA_RATIO)
    k = int((mamba_budget - slot) // slot)
    full_tokens = int((pf.budget_bytes - (k + 1) * slot) // (per_layer * n_full))
    return {"model": hyb, "tp": tp, "all_full_tokens": pf.max_total_num_tokens, "budget_bytes": pf.budget_bytes,
            "hybrid_full_tokens": full_tokens, "max_mamba_cache_size": k, "mamba_slot_bytes": slot,
            "full_spec": "sglang:1", "hybrid_spec": f"sglang-mamba:1@max_mamba_cache_size={k}",
            "layers": {"full_attention": n_full, "linear_attention": n_lin}, "per_layer_bytes": per_layer}


def compare(pools):
    model = pools["model"]
    full_spec, hyb_spec = parse_policy(pools["full_spec"]), parse_policy(pools["hybrid_spec"])
    rows, tot = [], {"prompt": 0, "full_hit": 0, "hyb_hit": 0, "hyb_full_part": 0, "replay_s": 0.0}
    files = C.weka_session_files(model.max_position_embeddings)
    for f in files:
        t = load_trace(f)
        _, sf = radixkv.run(radixkv.ReplaySpec(t, full_spec, PoolSpec(max_total_num_tokens=pools["all_full_tokens"]),
                                                options={"chunked_prefill_size": CHUNK}))
        _, sh = radixkv.run(radixkv.ReplaySpec(t, hyb_spec, PoolSpec(max_total_num_tokens=pools["hybrid_full_tokens"]),
                                                options={"chunked_prefill_size": CHUNK}))
        g = sh["kv_cache_groups"]
        rows.append({"trace": f.name, "requests": sf["requests"], "prompt_tokens": sf["prompt_tokens"],
                     "full_attention_hit_rate": sf["token_hit_rate"], "hybrid_hit_rate": sh["token_hit_rate"],
                     "hybrid_full_attention_hit_tokens": g["full_attention_hit_tokens"],
                     "hybrid_loss_tokens": g["hybrid_loss_tokens"], "hybrid_replay_s": sh["timing_s"]["replay"]})
        tot["prompt"] += sf["prompt_tokens"]
        tot["full_hit"] += sf["hit_tokens"]
        tot["hyb_hit"] += sh["hit_tokens"]
        tot["hyb_full_part"] += g["full_attention_hit_tokens"]
        tot["replay_s"] += sh["timing_s"]["replay"]
        print(f"{model.name} {f.name}: {sf['requests']} requests, full attention {sf['token_hit_rate']:.4f}, "
              f"hybrid {sh['token_hit_rate']:.4f} (its full-attention part held "
              f"{g['full_attention_hit_tokens'] / max(sf['prompt_tokens'], 1):.4f})", flush=True)
    pooled = {"prompt_tokens": tot["prompt"], "full_attention_hit_rate": tot["full_hit"] / tot["prompt"],
              "hybrid_hit_rate": tot["hyb_hit"] / tot["prompt"],
              "hybrid_full_attention_part_hit_rate": tot["hyb_full_part"] / tot["prompt"],
              "hybrid_replay_s": round(tot["replay_s"], 2)}
    # the same sessions as one trace, every user starting at time 0 (read_weka_files):
    # they compete for one pool, which is where the pools' sizes matter
    t = read_weka_files(files, name="weka-selected")
    _, sf = radixkv.run(radixkv.ReplaySpec(t, full_spec, PoolSpec(max_total_num_tokens=pools["all_full_tokens"]),
                                            options={"chunked_prefill_size": CHUNK}))
    _, sh = radixkv.run(radixkv.ReplaySpec(t, hyb_spec, PoolSpec(max_total_num_tokens=pools["hybrid_full_tokens"]),
                                            options={"chunked_prefill_size": CHUNK}))
    g = sh["kv_cache_groups"]
    together = {"requests": sf["requests"], "prompt_tokens": sf["prompt_tokens"],
                "full_attention_hit_rate": sf["token_hit_rate"], "hybrid_hit_rate": sh["token_hit_rate"],
                "hybrid_full_attention_part_hit_rate": g["full_attention_hit_tokens"] / sf["prompt_tokens"],
                "full_attention_evicted_tokens": sf.get("evicted_tokens"),
                "hybrid_groups": g["groups"], "hybrid_replay_s": sh["timing_s"]["replay"]}
    print(f"{model.name} sessions together:", json.dumps({k: v for k, v in together.items() if k != "hybrid_groups"}),
          flush=True)
    doc = {k: v for k, v in pools.items() if k != "model"}
    doc.update(model=model.name, gpu=GPU, chunked_prefill_size=CHUNK, traces=rows, pooled=pooled,
               sessions_together=together)
    return doc


def main() -> None:
    docs = [compare(gemma_pools()), compare(qwen_next_pools())]
    for d in docs:
        print(d["model"], json.dumps(d["pooled"]))
    C.write_result("hybrid_weka_sglang.json", {"models": docs},
                   {"gpu": GPU, "chunked_prefill_size": CHUNK, "swa_full_tokens_ratio": SWA_RATIO,
                    "mamba_full_memory_ratio": MAMBA_RATIO})


if __name__ == "__main__":
    main()
