"""vLLM's KV cache groups of hybrid models and the block ids a budget buys (worked by hand
from kv_cache_planning.py :: _get_kv_cache_groups_uniform_page_size's rule)."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main
from radixkv.errors import ConfigError
from radixkv.memory import get_model
from radixkv.memory.hybrid import vllm_hybrid_num_gpu_blocks, vllm_kv_cache_groups
from radixkv.memory.specs import ModelSpec


def _spec(full, sliding):
    n = full + sliding
    lt = ("full_attention",) * full + ("sliding_attention",) * sliding
    return ModelSpec("x", n, 8, 8, 64, 64, 512, 1024, 1000, 10**6, layer_types=lt, sliding_window=128)


def test_gemma3_groups():
    groups, size = vllm_kv_cache_groups(get_model("Gemma-3-27B"))
    # 10 full, 52 sliding: 52 ≥ 1.5 × 10, so the group size is the smaller count, 10;
    # sliding: ceil(52 / 10) = 6 groups, the last with 60 − 52 = 8 padding layers
    assert size == 10
    assert [(g.kind, g.window, g.layers, g.padding) for g in groups] == (
        [("full_attention", None, 10, 0)] + [("sliding_attention", 1024, 10, 0)] * 5
        + [("sliding_attention", 1024, 10, 8)])


def test_close_counts_use_the_larger_group():
    # 13 full + 12 sliding: 13 < 1.5 × 12 -> group size 13, sliding padded by 1
    groups, size = vllm_kv_cache_groups(_spec(13, 12))
    assert size == 13 and [(g.kind, g.padding) for g in groups] == [("full_attention", 0), ("sliding_attention", 1)]
    # 12 + 12 (gpt-oss-20b): two groups of 12, no padding
    groups, size = vllm_kv_cache_groups(_spec(12, 12))
    assert size == 12 and [g.padding for g in groups] == [0, 0]


def test_block_ids_for_a_budget():
    m = get_model("Gemma-3-27B")
    # tp 2: 8 KV heads per rank × 256 × 2 B = 4,096 B per layer and token;
    # a block id = 16 × 10 × 4,096 = 655,360 B; 48,936,370,966 // 655,360 = 74,670
    assert vllm_hybrid_num_gpu_blocks(m, 48_936_370_966, block_size=16, tp=2) == 74_670
    with pytest.raises(ConfigError):
        vllm_hybrid_num_gpu_blocks(m, 1_000_000, tp=2)
    with pytest.raises(ConfigError, match="not modelled"):
        vllm_kv_cache_groups(get_model("Qwen3-Next-80B-A3B"))


def test_memory_cli_prints_vllm_groups(capsys):
    assert main(["memory", "--model", "Gemma-3-27B", "--gpu", "H100-80GB", "--tp", "2", "--engine", "vllm",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    h = r["pools"]["vllm"]["hybrid"]
    assert h["group_size"] == 10 and len(h["groups"]) == 7
    assert h["block_bytes"] == 16 * 10 * 4096
    assert h["num_gpu_blocks"] == r["pools"]["vllm"]["budget_bytes"] // h["block_bytes"]
    # a full-attention model's pool has no hybrid entry
    assert main(["memory", "--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--engine", "vllm", "--json"]) == 0
    assert "hybrid" not in json.loads(capsys.readouterr().out)["pools"]["vllm"]
