"""vLLM 0.33's own sizing of a hybrid model's KV cache pool, for radixkv's memory model.

For each case (a model's layer kinds and shapes, tp, a KV budget in bytes, the requested
block size) this calls, on CPU, the functions vLLM's engine start-up calls:

1. ``Platform._align_hybrid_block_size`` (``vllm/platforms/interface.py``) for models with
   linear-attention (gated delta net) layers, in ``mamba_cache_mode="align"``: the
   attention block size raised until an attention page covers a Mamba state page, the
   state page padded to it. The state shapes and dtypes come from vLLM's
   ``MambaStateShapeCalculator.gated_delta_net_state_shape`` /
   ``MambaStateDtypeCalculator.gated_delta_net_state_dtype`` (what Qwen3-Next's
   ``get_mamba_state_shape_from_config`` returns); the model class lookup and the
   attention-backend discovery, which need the model weights' code and a GPU, are stood in
   for: the model class by one that returns those shapes, the backends by
   ``FlashAttentionBackend`` (whose kernel block sizes are vLLM's own).
2. ``get_kv_cache_groups`` and ``get_kv_cache_config_from_groups``
   (``vllm/v1/core/kv_cache_planning.py``) on the per-layer specs (``FullAttentionSpec``,
   ``SlidingWindowSpec``, ``MambaSpec``) with that block size: the groups and
   ``num_blocks`` (vLLM's ``num_gpu_blocks``).

Output: one JSON file (``--out``), a list of cases with the inputs and vLLM's answers.
``tests/test_hybrid_groups.py`` compares radixkv's :mod:`radixkv.memory.hybrid` with it.

Usage::

    VLLM_TARGET_DEVICE=cpu /work/venvs/vllm/bin/python tools/engines/vllm_hybrid_sizing.py \\
        --out tests/data/golden/vllm_hybrid/sizing.json

This file is a tool of the repository; the radixkv package never imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

#: (name, layer_types pattern, attention shapes, SSM shapes or None, sliding window, tp, budget bytes, block size)
QWEN3_NEXT = dict(num_layers=48, full_every=4, num_kv_heads=2, head_dim=256,
                  ssm=dict(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel=4))
GEMMA3_27B = dict(num_layers=62, full_every=6, num_kv_heads=16, head_dim=128, sliding_window=1024)
CASES = [
    ("Qwen3-Next-80B-A3B", QWEN3_NEXT, 1, 40 * 2**30, 16),
    ("Qwen3-Next-80B-A3B", QWEN3_NEXT, 2, 25_000_000_000, 16),
    ("Qwen3-Next-80B-A3B", QWEN3_NEXT, 4, 60_123_456_789, 16),
    ("Qwen3-Next-80B-A3B", QWEN3_NEXT, 1, 40 * 2**30, 32),
    ("Gemma-3-27B", GEMMA3_27B, 1, 20 * 2**30, 16),
    ("Gemma-3-27B", GEMMA3_27B, 2, 48_936_370_966, 16),
]


def _vllm():
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    warnings.filterwarnings("ignore")
    import torch

    import vllm
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.mamba.mamba_utils import (MambaStateDtypeCalculator,
                                                              MambaStateShapeCalculator)
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    return dict(version=vllm.__version__, torch=torch, VllmConfig=VllmConfig, Shape=MambaStateShapeCalculator,
                Dtype=MambaStateDtypeCalculator, ModelRegistry=ModelRegistry, Platform=Platform,
                FA=FlashAttentionBackend, planning=planning, FullAttentionSpec=FullAttentionSpec,
                MambaSpec=MambaSpec, SlidingWindowSpec=SlidingWindowSpec)


def run_case(v, name, m, tp, budget, block_size) -> dict:
    from types import SimpleNamespace

    torch = v["torch"]
    bf16 = torch.bfloat16
    vc = v["VllmConfig"]()
    cc = vc.cache_config
    cc.block_size = block_size
    cc.kv_cache_layout = "NHD"
    kv_heads = max(m["num_kv_heads"] // tp, 1)
    ssm = m.get("ssm")
    shapes = dtypes = None
    if ssm is not None:
        cc.mamba_cache_mode = "align"
        shapes = v["Shape"].gated_delta_net_state_shape(tp, ssm["num_k_heads"], ssm["num_v_heads"], ssm["head_k_dim"],
                                                        ssm["head_v_dim"], ssm["conv_kernel"])
        dtypes = v["Dtype"].gated_delta_net_state_dtype(bf16, "auto", "auto")

        class _Model:  # stands in for Qwen3NextForCausalLM's two class methods
            @classmethod
            def get_mamba_state_shape_from_config(cls, _vc):
                return shapes

            @classmethod
            def get_mamba_state_dtype_from_config(cls, _vc):
                return dtypes

        vc.model_config = SimpleNamespace(use_mla=False, dtype=bf16, architecture="Qwen3NextForCausalLM",
                                          is_hybrid=True, get_num_kv_heads=lambda _pc: kv_heads,
                                          get_head_size=lambda: m["head_dim"])
        v["ModelRegistry"].resolve_model_cls = lambda *a, **k: (_Model, "Qwen3NextForCausalLM")
        P = v["Platform"]
        P._find_non_ssm_backends = classmethod(lambda cls, _vc: [v["FA"]])
        P._align_hybrid_block_size(vc, v["FA"])
    B = cc.block_size
    specs = {}
    for i in range(m["num_layers"]):
        full = (i + 1) % m["full_every"] == 0
        if full or ssm is None:
            kw = dict(block_size=B, num_kv_heads=kv_heads, head_size=m["head_dim"], dtype=bf16)
            spec = (v["FullAttentionSpec"](**kw) if full
                    else v["SlidingWindowSpec"](sliding_window=m["sliding_window"], **kw))
            specs[f"model.layers.{i}.self_attn.attn"] = spec
        else:
            specs[f"model.layers.{i}.linear_attn"] = v["MambaSpec"](
                block_size=B, shapes=shapes, dtypes=dtypes, page_size_padded=cc.mamba_page_size_padded,
                mamba_cache_mode="align")
    groups = v["planning"].get_kv_cache_groups(vc, specs)
    cfg = v["planning"].get_kv_cache_config_from_groups(vc, groups, budget)
    kinds = []
    for g in cfg.kv_cache_groups:
        s = g.kv_cache_spec
        kinds.append({"spec": type(s).__name__, "layers": len(g.layer_names), "block_size": s.block_size,
                      "page_size_bytes": s.page_size_bytes})
    return {"model": name, "tp": tp, "budget_bytes": budget, "requested_block_size": block_size,
            "block_size": B, "mamba_page_size_padded": cc.mamba_page_size_padded,
            "num_gpu_blocks": cfg.num_blocks, "groups": kinds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    v = _vllm()
    out = {"engine": f"vllm {v['version']}", "kv_cache_layout": "NHD", "attention_backend": "FLASH_ATTN",
           "cases": [run_case(v, *c) for c in CASES]}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, args.out)
    for c in out["cases"]:
        print(c["model"], c["tp"], c["block_size"], c["num_gpu_blocks"], [(g["spec"], g["layers"]) for g in c["groups"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
