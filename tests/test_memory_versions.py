"""Version-aware memory rules and the shapes the calibration set added: SGLang's default
``mem_fraction_static`` before/after 0.5.3, DeepSeek-V3.2's indexer cell before/after 0.5.4,
the fp8 MLA layout, measured weights, vLLM 0.6.6's "# CUDA blocks" line and the
``--engine-version`` option. Every expected value is worked out by hand in the comments."""
from __future__ import annotations

import json
import math

import pytest

from radixkv.cli import main
from radixkv.errors import ConfigError, InputError
from radixkv.memory import (
    get_gpu,
    get_model,
    sglang_legacy_mem_fraction_static,
    sglang_pool_size,
    sglang_version_rules,
    vllm_pool_size,
)
from radixkv.memory.startup_log import parse_startup_log

GiB = 2**30


def test_fp8_ds_mla_bytes_per_token():
    # per layer: 512 fp8 latent + 512/128 = 4 fp32 scales (16 B) + 64 bf16 RoPE (128 B) = 656
    assert get_model("DeepSeek-V3").kv_bytes_per_token(8, "fp8_ds_mla") == 61 * 656 == 40_016
    # DeepSeek-V3.2 adds the indexer key: 128 fp8 + one fp32 scale = 132 B per layer
    v32 = get_model("DeepSeek-V3.2-Exp")
    assert v32.indexer_bytes_per_token() == 61 * 132 == 8_052
    assert v32.kv_bytes_per_token(8, "fp8_ds_mla") == 61 * (656 + 132) == 48_068
    # bf16 latent: 61 x 576 x 2, plus the indexer
    assert v32.kv_bytes_per_token(8) == 61 * 576 * 2 + 8_052
    with pytest.raises(ConfigError):
        get_model("Llama-3.1-8B").kv_bytes_per_token(1, "fp8_ds_mla")


@pytest.mark.parametrize("tp,frac", [(1, 0.88), (2, 0.87), (3, 0.87), (4, 0.85), (7, 0.85),
                                     (8, 0.81), (15, 0.81), (16, 0.79), (32, 0.79)])
def test_sglang_legacy_mem_fraction_by_tp(tp, frac):
    assert sglang_legacy_mem_fraction_static(tp) == frac


def test_sglang_version_rules_cutoffs():
    assert not sglang_version_rules("0.5.2")["gpu_memory_mfs"]
    assert sglang_version_rules("0.5.3")["gpu_memory_mfs"]
    assert not sglang_version_rules("0.4.9.post2")["gpu_memory_mfs"]
    assert not sglang_version_rules("0.5.3")["indexer_in_cell"]
    assert sglang_version_rules("0.5.4")["indexer_in_cell"]
    assert sglang_version_rules(None)["gpu_memory_mfs"]  # current version
    with pytest.raises(InputError):
        sglang_version_rules("latest")


def test_sglang_legacy_default_fraction_sizes_the_pool():
    m, g = get_model("Llama-3.1-8B"), get_gpu("A100-80GB")
    p = sglang_pool_size(m, g, tp=1, engine_version="0.4.9", preload_used_bytes=GiB)
    assert p.memory_fraction == 0.88
    # by hand: pre-load free 79 GiB; reserve int(79 GiB x 0.12); rest = free - weights - reserve
    free = 80 * GiB - GiB
    rest = free - 8_030_261_248 * 2 - int(free * (1 - 0.88))
    assert p.max_total_num_tokens == rest // 131_072


def test_sglang_indexer_left_out_of_the_cell_before_0_5_4():
    m, g = get_model("DeepSeek-V3.2-Exp"), get_gpu("B200")
    old = sglang_pool_size(m, g, tp=8, kv_cache_dtype="fp8_ds_mla", page_size=64,
                           mem_fraction_static=0.8, engine_version="0.5.3")
    new = sglang_pool_size(m, g, tp=8, kv_cache_dtype="fp8_ds_mla", page_size=64,
                           mem_fraction_static=0.8, engine_version="0.5.4")
    assert (old.kv_bytes_per_token, new.kv_bytes_per_token) == (40_016, 48_068)
    assert old.budget_bytes == new.budget_bytes
    assert old.max_total_num_tokens == old.budget_bytes // 40_016 // 64 * 64
    assert new.max_total_num_tokens == new.budget_bytes // 48_068 // 64 * 64


def test_measured_weights_replace_the_parameter_count():
    m, g = get_model("Llama-3.2-11B-Vision"), get_gpu("H100-80GB")
    # vLLM PR #12126's log: 79.22 GiB x 0.90 - 19.86 - 0.16 - 36.63 = 14.648 GiB; one block is
    # 16 x 40 layers x 8 heads x 256 x 2 B = 2,621,440 B -> 5,999 blocks (the log: 6,001; its
    # four figures are rounded to 0.01 GiB, up to 0.02 GiB = 8 blocks together)
    total = round(79.22 * GiB)
    p = vllm_pool_size(m, g, gpu_memory_utilization=0.9, total_bytes=total,
                       weight_bytes=round(19.86 * GiB), non_torch_bytes=round(0.16 * GiB),
                       activation_bytes=round(36.63 * GiB), engine_version="0.6.6")
    budget = math.ceil(total * 0.9) - round(19.86 * GiB) - round(0.16 * GiB) - round(36.63 * GiB)
    assert p.budget_bytes == budget
    assert p.num_gpu_blocks == budget // (16 * 40 * 8 * 256 * 2) == 5999
    default = vllm_pool_size(m, g, gpu_memory_utilization=0.9, total_bytes=total,
                             non_torch_bytes=round(0.16 * GiB),
                             activation_bytes=round(36.63 * GiB), engine_version="0.6.6")
    # the preset's parameter count gives 10,670,220,835 x 2 B of weights instead
    assert default.budget_bytes - p.budget_bytes == round(19.86 * GiB) - 10_670_220_835 * 2


def test_cuda_blocks_line_of_vllm_0_6_6():
    lp = parse_startup_log("INFO executor_base.py:95] # CUDA blocks: 6001, # CPU blocks: 1638\n")
    assert (lp.engine, lp.num_gpu_blocks, lp.capacity_tokens) == ("vllm", 6001, 6000 * 16)


def test_cli_engine_version_selects_sglang_rules(capsys):
    args = ["memory", "--model", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "8",
            "--engine", "sglang", "--json"]
    assert main(args + ["--engine-version", "0.5.2"]) == 0
    assert json.loads(capsys.readouterr().out)["pools"]["sglang"]["memory_fraction"] == 0.81
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["pools"]["sglang"]["memory_fraction"] != 0.81


def test_cli_engine_version_needs_one_engine(capsys):
    rc = main(["memory", "--model", "Llama-3.1-8B", "--gpu", "H100-80GB",
               "--engine-version", "0.5.2"])
    assert rc != 0
    assert "--engine-version" in capsys.readouterr().err
