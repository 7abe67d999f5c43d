"""The engines' serving defaults by GPU (:func:`radixkv.memory.engine_batch_defaults`)
against values worked out by hand from the engines' rules, and the plan's base point and
printed commands carrying them.

vLLM 0.33 ``EngineArgs.get_batch_defaults`` (OpenAI server): ≥ 160 GiB → 16384 tokens /
1024 sequences; ≥ 70 GiB and "a100" not in the name → 8192 / 1024; otherwise 2048 / 256.
SGLang ``handle_gpu_memory_settings``: chunked_prefill_size < 20 GiB 2048, < 60 GiB 4096,
< 160 GiB 8192, else 16384.
"""
from __future__ import annotations

import dataclasses

import pytest

from radixkv.errors import InputError
from radixkv.memory import engine_batch_defaults, get_gpu

GiB = 2**30


@pytest.mark.parametrize("gpu, mnbt, seqs", [
    ("A100-80GB", 2048, 256),    # 80 GiB, but an A100: vLLM keeps it out of the large class
    ("A100-40GB", 2048, 256),    # 40 GiB < 70
    ("H100-80GB", 8192, 1024),   # 79.6 GiB ≥ 70, not an A100
    ("H200-141GB", 8192, 1024),  # 140.4 GiB: ≥ 70, < 160
    ("B200", 16384, 1024),       # 179.1 GiB ≥ 160
    ("L40S", 2048, 256),         # a 48 GB card: 45.0 GiB < 70
    ("T4", 2048, 256),
    ("RTX-4090", 2048, 256),
    ("h100-80gb", 8192, 1024),   # names are case-insensitive, as the presets are
])
def test_vllm_server_defaults_by_gpu(gpu, mnbt, seqs):
    assert engine_batch_defaults("vllm", gpu) == {"max_num_batched_tokens": mnbt, "max_num_seqs": seqs,
                                                  "memory_fraction": 0.92}


def test_vllm_rule_reads_memory_and_name_at_the_thresholds():
    h100 = get_gpu("H100-80GB")
    at = lambda name, b: engine_batch_defaults("vllm", dataclasses.replace(h100, name=name, total_bytes=b))  # noqa: E731
    assert at("X", 70 * GiB)["max_num_seqs"] == 1024            # ≥ 70 GiB: the comparison includes 70
    assert at("X", 70 * GiB - 1)["max_num_seqs"] == 256
    assert at("NVIDIA A100-SXM4-96GB", 96 * GiB)["max_num_batched_tokens"] == 2048   # the name rule
    assert at("X", 160 * GiB)["max_num_batched_tokens"] == 16384
    assert at("X", 160 * GiB - 1)["max_num_batched_tokens"] == 8192


@pytest.mark.parametrize("gpu, chunk", [("T4", 2048), ("RTX-4090", 4096), ("L40S", 4096), ("A100-80GB", 8192),
                                        ("H100-80GB", 8192), ("H200-141GB", 8192), ("B200", 16384)])
def test_sglang_defaults_by_gpu(gpu, chunk):
    assert engine_batch_defaults("sglang", gpu) == {"max_num_batched_tokens": chunk, "max_num_seqs": 2048,
                                                    "memory_fraction": None}


def test_unknown_gpu_or_engine_is_a_clear_error():
    with pytest.raises(InputError, match="unknown GPU 'Z100'") as e:
        engine_batch_defaults("vllm", "Z100")
    assert e.value.field == "gpu"
    with pytest.raises(InputError, match="unknown engine 'trt'"):
        engine_batch_defaults("trt", "H100-80GB")


def test_plan_base_point_and_printed_command_carry_the_defaults():
    from radixkv.plan.candidates import base_point, engine_command

    a = engine_command(base_point("vllm", "A100-80GB", 1), "M")
    assert "--gpu-memory-utilization 0.92 --max-num-batched-tokens 2048 --max-num-seqs 256 " in a
    h = engine_command(base_point("vllm", "H100-80GB", 2), "M")
    assert "--tensor-parallel-size 2 --gpu-memory-utilization 0.92 --max-num-batched-tokens 8192 --max-num-seqs 1024 " in h
    s = engine_command(base_point("sglang", "L40S", 1), "M")
    assert "--chunked-prefill-size 4096 --max-running-requests 2048 " in s
    # the knob search tries vLLM's defaults of the other GPU classes around every point
    from radixkv.plan.candidates import neighbours

    tried = {(k, getattr(p, "max_num_seqs" if k == "max_num_seqs" else "max_num_batched_tokens"))
             for k, p in neighbours(base_point("vllm", "A100-80GB", 1)) if k in ("max_num_seqs", "max_num_batched_tokens")}
    assert ("max_num_seqs", 1024) in tried and ("max_num_batched_tokens", 8192) in tried
    tried = {p.max_num_seqs for k, p in neighbours(base_point("vllm", "H100-80GB", 1)) if k == "max_num_seqs"}
    assert 256 in tried and 1024 not in tried  # 1024 is the point itself
