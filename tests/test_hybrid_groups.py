"""vLLM's KV cache groups of hybrid models and the block ids a budget buys (worked by hand
from kv_cache_planning.py :: _get_kv_cache_groups_uniform_page_size's rule)."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main
from radixkv.errors import ConfigError
from radixkv.memory import get_model
from conftest import GOLDEN_LOCAL
from radixkv.memory.hybrid import (mamba_page_bytes, vllm_hybrid_block_size, vllm_hybrid_num_gpu_blocks,
                                   vllm_hybrid_policy_option, vllm_kv_cache_groups)
from radixkv.memory.specs import ModelSpec


def _spec(full, sliding):
    n = full + sliding
    lt = ("full_attention",) * full + ("sliding_attention",) * sliding
    return ModelSpec("x", n, 8, 8, 64, 64, 512, 1024, 1000, 10**6, layer_types=lt, sliding_window=128)


def test_gemma3_groups():
    groups, size = vllm_kv_cache_groups(get_model("Gemma-3-27B"))
    # 10 full, 52 sliding: 52 ≥ 1.5 × 10, so the group size is the smaller count, 10;
    # sliding: ceil(52 / 10) = 6 groups, layers dealt out round-robin: 9, 9, 9, 9, 8, 8
    # (60 − 52 = 8 padding layers); layer 0 slides, so the sliding groups come first
    assert size == 10
    assert [(g.kind, g.window, g.layers, g.padding) for g in groups] == (
        [("sliding_attention", 1024, 10, 1)] * 4 + [("sliding_attention", 1024, 10, 2)] * 2
        + [("full_attention", None, 10, 0)])


def test_close_counts_use_the_larger_group():
    # 13 full + 12 sliding: 13 < 1.5 × 12 -> group size 13, sliding padded by 1
    groups, size = vllm_kv_cache_groups(_spec(13, 12))
    assert size == 13 and [(g.kind, g.padding) for g in groups] == [("full_attention", 0), ("sliding_attention", 1)]
    assert vllm_hybrid_policy_option(groups) == "window=128"  # full first: left out
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


SIZING = json.loads((GOLDEN_LOCAL / "vllm_hybrid" / "sizing.json").read_text())


@pytest.mark.parametrize("case", SIZING["cases"], ids=[f"{c['model']}-tp{c['tp']}-b{c['requested_block_size']}"
                                                       for c in SIZING["cases"]])
def test_sizing_matches_vllm(case):
    # vLLM 0.33's own Platform._align_hybrid_block_size, get_kv_cache_groups and
    # get_kv_cache_config_from_groups on the same layers (tools/engines/vllm_hybrid_sizing.py)
    m = get_model(case["model"])
    kw = dict(block_size=case["requested_block_size"], tp=case["tp"])
    assert vllm_hybrid_block_size(m, **kw) == case["block_size"]
    assert vllm_hybrid_num_gpu_blocks(m, case["budget_bytes"], **kw) == case["num_gpu_blocks"]
    groups, size = vllm_kv_cache_groups(m)
    kinds = {"FullAttentionSpec": "full_attention", "SlidingWindowSpec": "sliding_attention",
             "MambaSpec": "linear_attention"}
    # the same groups in the same order (vLLM numbers them by first layer)
    assert [(g.kind, g.layers - g.padding) for g in groups] == [(kinds[g["spec"]], g["layers"])
                                                                for g in case["groups"]]
    if case["mamba_page_size_padded"] is not None:  # the state page padded to the attention page
        assert case["block_size"] * 2 * max(2 // case["tp"], 1) * 256 * 2 == case["mamba_page_size_padded"]
        assert mamba_page_bytes(m, case["tp"]) <= case["mamba_page_size_padded"]


def test_qwen3_next_block_size_by_hand():
    # tp 1: state page = (16·128·2 + 32·128)·3 + 32·128·128 = 24,576 + 524,288 elements × 2 B
    # = 1,097,728 B; attention token page = 2 heads × 256 × 2 (K, V) × 2 B = 2,048 B;
    # 16 × ceil(1,097,728 / (16 × 2,048)) = 16 × 34 = 544
    m = get_model("Qwen3-Next-80B-A3B")
    assert mamba_page_bytes(m) == 1_097_728
    assert vllm_hybrid_block_size(m) == 544
    assert vllm_hybrid_block_size(m, block_size=1024) == 1024  # a larger request stands
    groups, size = vllm_kv_cache_groups(m)
    assert size == 12 and vllm_hybrid_policy_option(groups) == "mambax3+full"
    assert vllm_hybrid_block_size(get_model("Gemma-3-27B")) == 16


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


def test_replay_sizes_vllm_hybrid_from_model_and_gpu(capsys):
    # --model/--gpu with vllm-hybrid: the block ids vLLM's own sizing gives the model's KV
    # cache groups on the memory model's budget (not the full-attention block count)
    from radixkv.memory import get_gpu, vllm_pool_size

    trace = str(GOLDEN_LOCAL / "traces" / "edge300.jsonl")
    m = get_model("Qwen3-Next-80B-A3B")
    budget = vllm_pool_size(m, get_gpu("H100-80GB"), tp=4).budget_bytes
    assert main(["replay", trace, "--policy", "vllm-hybrid:272@mambax3+full", "--model", "Qwen3-Next-80B-A3B",
                 "--gpu", "H100-80GB", "--tp", "4", "--json", "--no-timing"]) == 0
    r = json.loads(capsys.readouterr().out)
    nb = budget // (272 * 12 * 1024)  # 12 layers × 272 tokens × (1 KV head × 256 × 2 × 2 B)
    assert r["results"][0]["pool"]["num_gpu_blocks"] == nb == vllm_hybrid_num_gpu_blocks(m, budget, tp=4)
    # the wrong block size or groups: an error naming the spec vLLM would run
    for bad in ("vllm-hybrid:16@mambax3+full", "vllm-hybrid:272@mambax3", "vllm-hybrid:272@window=64"):
        assert main(["replay", trace, "--policy", bad, "--model", "Qwen3-Next-80B-A3B", "--gpu", "H100-80GB",
                     "--tp", "4"]) != 0
        assert "vllm-hybrid:272@mambax3+full" in capsys.readouterr().err


def test_memory_cli_prints_mamba_groups(capsys):
    assert main(["memory", "--model", "Qwen3-Next-80B-A3B", "--gpu", "H100-80GB", "--tp", "4", "--engine", "vllm",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    h = r["pools"]["vllm"]["hybrid"]
    # tp 4 (sizing.json's vLLM case): block 272, 1 full + 3 Mamba groups of 12 layers
    assert h["block_size"] == 272 and h["group_size"] == 12
    assert [g["kind"] for g in h["groups"]] == ["linear_attention"] * 3 + ["full_attention"]
    assert h["block_bytes"] == 272 * 12 * 1024
    assert h["num_gpu_blocks"] == r["pools"]["vllm"]["budget_bytes"] // h["block_bytes"]
    assert h["policy"] == "vllm-hybrid:272@mambax3+full"
