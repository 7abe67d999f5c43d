"""Pool sizes under vLLM's and SGLang's rules (radixkv.memory.pool), worked by hand."""
from __future__ import annotations

import json

import pytest

from radixkv.errors import ConfigError, InputError
from radixkv.memory import (
    MODEL_PRESETS,
    get_gpu,
    pool_for,
    sglang_default_mem_fraction_static,
    sglang_dp_attention_extra_weight_bytes,
    sglang_pool_size,
    vllm_pool_size,
)

GiB = 2**30
L8 = MODEL_PRESETS["Llama-3.1-8B"]


def test_vllm_pool_hand_worked():
    # Llama-3.1-8B, A100-80GB (81,920 MiB = 85,899,345,920 B), gpu_memory_utilization 0.9
    # requested = 85,899,345,920 × 0.9 = 77,309,411,328
    # weights   = 8,030,261,248 × 2 B  = 16,060,522,496
    # non-torch 0.25 GiB = 268,435,456; activations 1 GiB = 1,073,741,824;
    # CUDA graphs 0.5 GiB = 536,870,912 (given, not the defaults)
    # budget = 77,309,411,328 − 16,060,522,496 − 268,435,456 − 1,073,741,824 − 536,870,912
    #        = 59,369,840,640
    # bytes per block = 16 × 131,072 = 2,097,152
    # num_gpu_blocks = 59,369,840,640 // 2,097,152 = 28,309 (28,309 × 2,097,152 =
    #   59,368,275,968, remainder 1,564,672); usable 28,308 blocks = 452,928 tokens
    p = vllm_pool_size(L8, get_gpu("A100-80GB"), gpu_memory_utilization=0.9,
                       non_torch_bytes=GiB // 4, activation_bytes=GiB,
                       cuda_graph_bytes=GiB // 2)
    assert p.budget_bytes == 59_369_840_640
    assert p.num_gpu_blocks == 28_309 == p.blocks
    assert p.capacity_tokens == 452_928 == p.tokens
    assert p.bytes == 59_368_275_968
    assert p.max_total_num_tokens is None and p.engine == "vllm"
    # 8,192-token requests take 512 blocks: 28,308 // 512 = 55 at once
    assert p.max_concurrent_requests(8192) == 55
    # the accounting table adds up: total + every signed term down to the budget
    rows = {r.term: r.bytes for r in p.accounting}
    assert rows["GPU memory (device total)"] == 85_899_345_920
    assert rows["available KV cache memory"] == 59_369_840_640
    signed = [r.bytes for r in p.accounting]
    assert signed[0] + signed[1] == signed[2]                   # total − outside = requested
    assert sum(signed[2:7]) == signed[7]                        # requested − terms = budget
    assert signed[8] + signed[10] == signed[7]                  # pool + unused = budget


def test_vllm_default_activation_estimate():
    # 2.5 × 8,192 × (4,096 + 2 × 14,336) × 2 B = 1,342,177,280 B (1.25 GiB), the
    # calibration point (vLLM PR #10511 logged 1.26 GiB for Meta-Llama-3-8B)
    p = vllm_pool_size(L8, get_gpu("A100-80GB"), gpu_memory_utilization=0.9)
    rows = {r.term: r.bytes for r in p.accounting}
    assert rows["peak activations (8192-token profiling pass)"] == -1_342_177_280
    assert p.memory_fraction == 0.9
    assert vllm_pool_size(L8, get_gpu("A100-80GB")).memory_fraction == 0.92  # vLLM default


def test_vllm_fp8_doubles_blocks_at_same_budget():
    g = get_gpu("H100-80GB")
    a = vllm_pool_size(L8, g)
    b = vllm_pool_size(L8, g, kv_cache_dtype="fp8")
    assert a.budget_bytes == b.budget_bytes
    assert b.bytes_per_unit == 1_048_576                        # 16 × 65,536
    assert b.num_gpu_blocks == a.budget_bytes // 1_048_576
    assert b.num_gpu_blocks in (2 * a.num_gpu_blocks, 2 * a.num_gpu_blocks + 1)


def test_vllm_mla_block_not_split_by_tp():
    # DeepSeek-V3 at tp 8: a 64-token block (FlashMLA) is 64 × 70,272 = 4,497,408 B per rank
    p = vllm_pool_size(MODEL_PRESETS["DeepSeek-V3"], get_gpu("H200-141GB"), tp=8, block_size=64)
    assert p.kv_bytes_per_token == 70_272 and p.bytes_per_unit == 4_497_408
    assert p.kv_bytes_per_token_total == 8 * 70_272


def test_sglang_pool_hand_worked():
    # Llama-3.1-8B, H100-80GB (81,559 MiB = 85,520,809,984 B), mem_fraction_static 0.75,
    # 1 GiB in use before load (given)
    # pre-load free = 85,520,809,984 − 1,073,741,824 = 84,447,068,160
    # after weights = 84,447,068,160 − 16,060,522,496 = 68,386,545,664
    # reserve = 84,447,068,160 × 0.25 = 21,111,767,040
    # rest = 68,386,545,664 − 21,111,767,040 = 47,274,778,624
    # max_total_num_tokens = 47,274,778,624 // 131,072 = 360,677
    #   (131,072 × 360,677 = 47,274,688,512; remainder 90,112)
    # page_size 16: 360,677 // 16 × 16 = 22,542 × 16 = 360,672
    g = get_gpu("H100-80GB")
    p = sglang_pool_size(L8, g, mem_fraction_static=0.75, preload_used_bytes=GiB)
    assert p.budget_bytes == 47_274_778_624
    assert p.max_total_num_tokens == 360_677 == p.capacity_tokens
    assert p.num_gpu_blocks is None and p.engine == "sglang"
    q = sglang_pool_size(L8, g, mem_fraction_static=0.75, preload_used_bytes=GiB, page_size=16)
    assert q.max_total_num_tokens == 360_672 and q.blocks == 22_542
    # 131,072-token requests need 8,192 pages of 16: 22,542 // 8,192 = 2 at once
    assert q.max_concurrent_requests(131_072) == 2
    signed = [r.bytes for r in p.accounting]
    assert signed[0] + signed[1] == signed[2]
    assert signed[2] + signed[3] + signed[4] == signed[5]
    assert signed[6] + signed[7] == signed[5]


def test_sglang_dp_attention_hand_worked():
    # Llama-3.1-8B (bf16: hidden 4096, 32 heads, 8 KV heads, head_dim 128, vocab 128,256,
    # 32 layers) at tp 8 with --enable-dp-attention --dp-size 4: attention TP 2.
    # attention projections split per layer: q 4096×4096 + k,v 2×4096×1024 + o 4096×4096
    #   = 16,777,216 + 8,388,608 + 16,777,216 = 41,943,040 params = 83,886,080 B
    # attention extra: 32 × 83,886,080 × (1/2 − 1/8) = 1,006,632,960 B
    # embedding 128,256 × 4096 = 525,336,576 params, whole on every rank instead of 1/8:
    #   525,336,576 × 2 × (1 − 1/8) = 919,339,008 B
    # total 1,925,971,968 B
    assert L8.attention_params_per_layer() == (41_943_040, 0)
    assert sglang_dp_attention_extra_weight_bytes(L8, 8, 4) == 1_925_971_968
    assert sglang_dp_attention_extra_weight_bytes(L8, 8, 1) == 0
    g = get_gpu("H100-80GB")
    base = sglang_pool_size(L8, g, tp=8, mem_fraction_static=0.75, preload_used_bytes=GiB)
    dp = sglang_pool_size(L8, g, tp=8, mem_fraction_static=0.75, preload_used_bytes=GiB,
                          dp_size=4)
    # the cell holds the KV heads of attention TP 2: 4 heads × 256 × 32 × 2 B = 65,536 B
    # (8 KV heads over tp 8 would be 1 head: 16,384 B)
    assert base.kv_bytes_per_token == 16_384 and dp.kv_bytes_per_token == 65_536
    assert base.budget_bytes - dp.budget_bytes == 1_925_971_968
    assert dp.max_total_num_tokens == dp.budget_bytes // 65_536
    assert any(r.bytes == -1_925_971_968 for r in dp.accounting)
    assert len(dp.accounting) == len(base.accounting) + 1
    with pytest.raises(InputError):
        sglang_pool_size(L8, g, tp=8, dp_size=3)


def test_sglang_mla_attention_params_and_dp_extra():
    # DeepSeek-V3 (q_lora_rank 1536, kv_lora_rank 512, rope 64, 128 heads, qk head 192,
    # v head 128, hidden 7168): q_a 7168×1536 = 11,010,048 and kv_a 7168×576 = 4,128,768
    # replicated; q_b 1536×128×192 = 37,748,736, kv_b 512×128×256 = 16,777,216 and
    # o 128×128×7168 = 117,440,512 split (sum 171,966,464).
    v3 = MODEL_PRESETS["DeepSeek-V3"]
    assert v3.attention_params_per_layer() == (171_966_464, 15_138_816)
    # tp 8, dp 8 (attention TP 1), fp8 weights (1 B), bf16 embedding 129,280 × 7168:
    #   61 × 171,966,464 × (1 − 1/8) = 9,178,710,016; 926,679,040 × (2 − 1/8) = 1,737,523,200
    assert sglang_dp_attention_extra_weight_bytes(v3, 8, 8) == 9_178_710_016 + 1_737_523_200


def test_sglang_extra_reserved_bytes_come_out_of_rest():
    g = get_gpu("H100-80GB")
    a = sglang_pool_size(L8, g, mem_fraction_static=0.75, preload_used_bytes=GiB)
    b = sglang_pool_size(L8, g, mem_fraction_static=0.75, preload_used_bytes=GiB,
                         extra_reserved_bytes=10 * GiB)
    # 47,274,778,624 − 10,737,418,240 = 36,537,360,384; // 131,072 = 278,757 (remainder 122,880)
    assert b.budget_bytes == 36_537_360_384 and b.max_total_num_tokens == 278_757
    assert a.max_total_num_tokens == 360_677
    with pytest.raises(InputError):
        sglang_pool_size(L8, g, extra_reserved_bytes=-1)


@pytest.mark.parametrize("gpu, model, tp, kw, expected", [
    # H100 81,559 MiB: chunk 8192, decode max_bs 256, 58 prefill graph sizes up to 8192
    #   reserved = 512 + 1.5 × 8192 + 1/8 × 1024 + 2 × 256 + 8 × 58 = 13,904 MiB
    #   (81,559 − 13,904) / 81,559 = 0.82952 -> 0.830
    ("H100-80GB", "Llama-3.1-8B", 1, {}, 0.830),
    # H200 143,771 MiB, DeepSeek-V3 (MLA), tp 8: max_bs 512, flat 1.5 GiB MLA graph term
    #   reserved = 512 + 12,288 + 8/8 × 1024 + 1024 + 1536 = 16,384
    #   (143,771 − 16,384) / 143,771 = 0.886040 -> 0.886
    ("H200-141GB", "DeepSeek-V3", 8, {}, 0.886),
    # A100 40 GB (40,960 MiB): chunk 4096, max_bs 32, 50 prefill sizes up to 4096
    #   reserved = 512 + 6,144 + 128 + 64 + 400 = 7,248; 33,712 / 40,960 = 0.82305 -> 0.823
    ("A100-40GB", "Llama-3.1-8B", 1, {}, 0.823),
    # RTX 4090 (24,564 MiB): chunk 4096, max_bs 48: 512 + 6,144 + 128 + 96 + 400 = 7,280
    #   17,284 / 24,564 = 0.70363 -> 0.704
    ("RTX-4090", "Llama-3.1-8B", 1, {}, 0.704),
    # H100 with chunked_prefill_size 2048: 512 + 3,072 + 128 + 512 + 8 × 42 = 4,560, below
    #   the 10 GiB floor on > 60 GiB GPUs -> 10,240; 71,319 / 81,559 = 0.87445 -> 0.874
    ("H100-80GB", "Llama-3.1-8B", 1, {"chunked_prefill_size": 2048}, 0.874),
])
def test_sglang_default_mem_fraction_static(gpu, model, tp, kw, expected):
    m = MODEL_PRESETS[model]
    assert sglang_default_mem_fraction_static(
        get_gpu(gpu), tp, is_mla=m.is_mla, model_name=m.name, **kw) == expected


def test_sglang_uses_default_fraction_when_not_given():
    p = sglang_pool_size(L8, get_gpu("H100-80GB"))
    assert p.memory_fraction == 0.830


def test_pool_for_dispatch_and_knob_checks():
    v = pool_for("vllm", "llama-3.1-8b", "a100-80gb", gpu_memory_utilization=0.9,
                 non_torch_bytes=GiB // 4, activation_bytes=GiB, cuda_graph_bytes=GiB // 2)
    assert v.num_gpu_blocks == 28_309 and v.capacity_tokens == 452_928
    s = pool_for("SGLang", L8, "H100-80GB", mem_fraction_static=0.75, page_size=16,
                 preload_used_bytes=GiB)
    assert s.max_total_num_tokens == 360_672 and s.capacity_tokens == 360_672
    with pytest.raises(InputError, match="engine"):
        pool_for("trtllm", L8, "H100-80GB")
    with pytest.raises(InputError, match="SGLang knob"):
        pool_for("vllm", L8, "H100-80GB", mem_fraction_static=0.8)
    with pytest.raises(InputError, match="vLLM knob"):
        pool_for("sglang", L8, "H100-80GB", gpu_memory_utilization=0.8)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.01, 2, float("nan"), "x"])
def test_fraction_outside_0_1_is_refused(bad):
    with pytest.raises(InputError) as e:
        pool_for("vllm", L8, "H100-80GB", gpu_memory_utilization=bad)
    assert e.value.field == "gpu_memory_utilization"
    with pytest.raises(InputError) as e:
        pool_for("sglang", L8, "H100-80GB", mem_fraction_static=bad)
    assert e.value.field == "mem_fraction_static"


def test_model_that_does_not_fit_is_a_config_error():
    # Llama-3.1-70B bf16 weights are 141 GB: no pool on one 24 GB card
    with pytest.raises(ConfigError):
        pool_for("vllm", "Llama-3.1-70B", "RTX-4090")
    with pytest.raises(ConfigError):
        pool_for("sglang", "Llama-3.1-70B", "RTX-4090")


def test_bad_sizes_refused():
    with pytest.raises(InputError, match="block_size"):
        pool_for("vllm", L8, "H100-80GB", block_size=0)
    with pytest.raises(InputError, match="page_size"):
        pool_for("sglang", L8, "H100-80GB", page_size=-1)


def test_to_dict_is_json_and_deterministic():
    a = json.dumps(pool_for("vllm", L8, "H100-80GB").to_dict(), sort_keys=True)
    b = json.dumps(pool_for("vllm", L8, "H100-80GB").to_dict(), sort_keys=True)
    assert a == b and json.loads(a)["num_gpu_blocks"] > 0
