"""vLLM's profiling pass, when no ``--max-num-batched-tokens`` is given, is the one
``vllm serve`` runs on that GPU (vLLM ``EngineArgs.get_batch_defaults``: 2048 tokens on an
A100, 8192 on an H100), in ``radixkv memory`` and in the replays alike; an explicit flag
still wins.

Expected values by hand from vLLM's rule and the memory model's activation term
(:func:`radixkv.memory.pool.vllm_activation_bytes`): Llama-3.1-8B (hidden 4096,
intermediate 14,336, bf16) profiles ``2.5 × N × (4096 + 2 × 14,336) × 2 B = 163,840 × N`` B
of activations; one vLLM block of 16 tokens holds ``16 × 32 layers × 8 KV heads × 128 ×
2 (K, V) × 2 B = 2,097,152 B``. A pass of 2048 tokens instead of 8192 frees
``6144 × 163,840 = 1,006,632,960 B`` = exactly 480 blocks; one of 4096 frees 320.
"""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main

M8 = ["--model", "Llama-3.1-8B"]
PER_BLOCK = 16 * 32 * 8 * 128 * 2 * 2
ACT_PER_TOKEN = int(2.5 * (4096 + 2 * 14336) * 2)


def test_hand_numbers():
    assert PER_BLOCK == 2_097_152 and ACT_PER_TOKEN == 163_840
    assert (8192 - 2048) * ACT_PER_TOKEN == 480 * PER_BLOCK
    assert (8192 - 4096) * ACT_PER_TOKEN == 320 * PER_BLOCK


def _memory_blocks(capsys, gpu, *extra):
    assert main(["memory", *M8, "--gpu", gpu, "--engine", "vllm", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["pools"]["vllm"]["num_gpu_blocks"]


def test_memory_default_profiling_pass_by_gpu(capsys):
    a8192 = _memory_blocks(capsys, "A100-80GB", "--max-num-batched-tokens", "8192")
    # A100: vLLM's default is 2048 tokens, 480 blocks more than an 8192-token pass
    assert _memory_blocks(capsys, "A100-80GB") == a8192 + 480
    assert _memory_blocks(capsys, "A100-80GB", "--max-num-batched-tokens", "2048") == a8192 + 480
    # the flag still wins
    assert _memory_blocks(capsys, "A100-80GB", "--max-num-batched-tokens", "4096") == a8192 + 320
    # H100: vLLM's default is 8192 tokens, unchanged
    h8192 = _memory_blocks(capsys, "H100-80GB", "--max-num-batched-tokens", "8192")
    assert _memory_blocks(capsys, "H100-80GB") == h8192


def test_memory_refuses_an_explicit_pass_with_only_sglang_shown(capsys):
    # the flag given at any value (8192 included) is read only by vLLM's pool
    assert main(["memory", *M8, "--gpu", "H100-80GB", "--engine", "sglang", "--max-num-batched-tokens", "8192"]) == 2
    assert "--max-num-batched-tokens sizes vLLM's profiling pass" in capsys.readouterr().err


def _replay_blocks(capsys, verb, gpu, *extra):
    argv = [verb, "traces/demo.jsonl", "--policy" if verb == "replay" else "--policies", "vllm:16",
            *M8, "--gpu", gpu, "--limit", "20", "--json", *extra]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    return out["results"][0]["pool"]["num_gpu_blocks"]


@pytest.mark.parametrize("verb", ["replay", "compare"])
def test_replay_and_compare_size_the_pool_alike(capsys, verb):
    mem_a = _memory_blocks(capsys, "A100-80GB")
    mem_h = _memory_blocks(capsys, "H100-80GB")
    a = _replay_blocks(capsys, verb, "A100-80GB")
    assert a == mem_a
    assert _replay_blocks(capsys, verb, "A100-80GB", "--max-num-batched-tokens", "8192") == a - 480
    assert _replay_blocks(capsys, verb, "H100-80GB") == mem_h


def test_sweep_cell_sizes_the_pool_alike(capsys):
    from radixkv.memory import pool_for, vllm_profile_tokens
    from radixkv.sweep.cell import replay_cell
    from radixkv.trace.load import load_trace

    tr = load_trace("traces/demo.jsonl").head(20)
    cell = {"policy": "vllm:16", "model": "Llama-3.1-8B", "gpu": "A100-80GB"}
    p8192 = pool_for("vllm", "Llama-3.1-8B", "A100-80GB", max_num_batched_tokens=8192)
    assert replay_cell(tr, cell)["pool"]["num_gpu_blocks"] == p8192.num_gpu_blocks + 480
    assert replay_cell(tr, {**cell, "max_num_batched_tokens": 8192})["pool"]["num_gpu_blocks"] == \
        p8192.num_gpu_blocks
    assert vllm_profile_tokens(None, "A100-80GB") == 2048
    assert vllm_profile_tokens(None, "H100-80GB") == 8192
    assert vllm_profile_tokens(4096, "A100-80GB") == 4096
