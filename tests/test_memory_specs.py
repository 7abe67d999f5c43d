"""KV bytes per token, TP splitting, presets and config.json parsing (radixkv.memory).

Every expected number is worked by hand in a comment from the published config.json
values (no value is copied from running the code).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.errors import ConfigError, InputError
from radixkv.memory import MODEL_PRESETS, ModelSpec, dtype_bytes, get_gpu, get_model

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


# ---------------------------------------------------------------- KV bytes per token
@pytest.mark.parametrize("name, kv_dtype, expected", [
    ("Llama-3.1-8B", None, 131_072),     # 2 × 32 layers × 8 KV heads × 128 × 2 B
    ("Llama-3.1-8B", "fp8", 65_536),     # 2 × 32 × 8 × 128 × 1 B
    ("Llama-2-7B", None, 524_288),       # 2 × 32 × 32 (MHA) × 128 × 2 B
    ("Qwen2.5-7B", None, 57_344),        # 2 × 28 × 4 × 128 × 2 B
    ("Mistral-7B", None, 131_072),       # 2 × 32 × 8 × 128 × 2 B
    ("Llama-3.1-70B", None, 327_680),    # 2 × 80 × 8 × 128 × 2 B
    ("Qwen2.5-72B", None, 327_680),      # 2 × 80 × 8 × 128 × 2 B
    ("DeepSeek-V3", None, 70_272),       # 61 × (512 + 64) × 2 B  (MLA latent, no factor 2)
    ("DeepSeek-V3", "fp8", 35_136),      # 61 × 576 × 1 B
    ("Llama-3.1-8B", "fp32", 262_144),   # 2 × 32 × 8 × 128 × 4 B
    ("Llama-3.1-8B", "int8", 65_536),    # 1 B per element
])
def test_kv_bytes_per_token_hand_worked(name, kv_dtype, expected):
    assert MODEL_PRESETS[name].kv_bytes_per_token(1, kv_dtype) == expected


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_fp8_halves_every_preset(name):
    m = MODEL_PRESETS[name]
    idx = m.indexer_bytes_per_token()  # DeepSeek-V3.2's indexer key is fp8 whatever the KV dtype
    assert 2 * (m.kv_bytes_per_token(1, "fp8") - idx) == m.kv_bytes_per_token(1, "bf16") - idx
    assert m.kv_bytes_per_token(1, "auto") == m.kv_bytes_per_token(1, "bf16")  # all 2-byte models


@pytest.mark.parametrize("tp, per_rank, total", [
    (1, 131_072, 131_072),
    (2, 65_536, 131_072),    # 4 KV heads per rank: 2 × 32 × 4 × 128 × 2
    (4, 32_768, 131_072),    # 2 heads per rank
    (8, 16_384, 131_072),    # 1 head per rank
    (16, 16_384, 262_144),   # 8 KV heads over 16 ranks: each head on 2 ranks (replicated)
    (32, 16_384, 524_288),   # each head on 4 ranks
])
def test_tp_splits_kv_heads_and_replicates_when_fewer_than_tp(tp, per_rank, total):
    m = MODEL_PRESETS["Llama-3.1-8B"]
    assert m.kv_heads_per_rank(tp) == max(1, 8 // tp)
    assert m.kv_bytes_per_token(tp) == per_rank
    assert m.kv_bytes_per_token_total(tp) == total


def test_tp16_on_70b_replicates():
    # Llama-3.1-70B, 8 KV heads, tp 16: 1 head per rank = 2 × 80 × 1 × 128 × 2 = 40,960 B;
    # over 16 ranks 655,360 B = twice the unreplicated 327,680 B.
    m = MODEL_PRESETS["Llama-3.1-70B"]
    assert m.kv_bytes_per_token(16) == 40_960
    assert m.kv_bytes_per_token_total(16) == 655_360


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_mla_latent_not_split_by_tp(tp):
    m = MODEL_PRESETS["DeepSeek-V3"]
    assert m.kv_bytes_per_token(tp) == 70_272          # 61 × 576 × 2 on every rank
    assert m.kv_bytes_per_token_total(tp) == 70_272 * tp


def test_tp_that_cannot_split_heads_is_refused():
    # Qwen2.5-7B has 28 attention heads: tp 8 does not divide them (vLLM refuses too).
    with pytest.raises(ConfigError, match="tp"):
        MODEL_PRESETS["Qwen2.5-7B"].kv_bytes_per_token(8)
    # 12 heads / 6 KV heads at tp 4: 4 divides 12 heads but neither of 6 and 4 divides the other
    m = ModelSpec(name="odd", num_layers=2, num_attention_heads=12, num_kv_heads=6,
                  head_dim=64, v_head_dim=64, hidden_size=768, intermediate_size=3072,
                  vocab_size=1000, num_params=1000)
    with pytest.raises(ConfigError, match="KV heads"):
        m.kv_bytes_per_token(4)
    with pytest.raises(ConfigError):
        m.kv_bytes_per_token(0)


def test_v_head_dim_differs():
    # K 192 wide, V 128 wide, 4 KV heads, 10 layers, bf16: 10 × 4 × (192 + 128) × 2 = 25,600
    m = ModelSpec(name="kv-asym", num_layers=10, num_attention_heads=8, num_kv_heads=4,
                  head_dim=192, v_head_dim=128, hidden_size=1536, intermediate_size=4096,
                  vocab_size=1000, num_params=1000)
    assert m.kv_bytes_per_token() == 25_600


def test_dtype_bytes():
    assert [dtype_bytes(x) for x in ("BF16", "fp16", "fp8_e4m3", "int8", "float32")] == [2, 2, 1, 1, 4]
    with pytest.raises(InputError, match="fp4"):
        dtype_bytes("fp4")
    with pytest.raises(InputError, match="kv_cache_dtype"):
        MODEL_PRESETS["Llama-3.1-8B"].kv_bytes_per_token(1, "nf4")


def test_weights_per_rank():
    # Llama-3.1-8B: 8,030,261,248 params × 2 B = 16,060,522,496 B; tp 2 -> 8,030,261,248 B
    m = MODEL_PRESETS["Llama-3.1-8B"]
    assert m.weight_bytes() == 16_060_522_496
    assert m.weight_bytes_per_rank(2) == 8_030_261_248
    # DeepSeek-V3 fp8 weights: 671,026,419,200 B over 8 ranks = 83,878,302,400 B
    assert MODEL_PRESETS["DeepSeek-V3"].weight_bytes_per_rank(8) == 83_878_302_400


# ---------------------------------------------------------------- presets and lookup
def test_lookup_case_insensitive_and_unknown_lists_presets():
    assert get_model("llama-3.1-8b") is MODEL_PRESETS["Llama-3.1-8B"]
    assert get_gpu("h100-80gb").name == "H100-80GB"
    with pytest.raises(InputError) as e:
        get_model("Llama-4-400B")
    assert "Llama-3.1-8B" in str(e.value) and e.value.field == "model"
    with pytest.raises(InputError) as e:
        get_gpu("GB300")
    assert "H200-141GB" in str(e.value) and e.value.field == "gpu"


def test_gpu_presets_values():
    # nvidia-smi memory.total: H100 SXM 81,559 MiB, H200 143,771 MiB, A100 80GB 81,920 MiB
    assert get_gpu("H100-80GB").total_bytes == 81_559 * 1_048_576
    assert get_gpu("H200-141GB").total_bytes == 143_771 * 1_048_576
    assert get_gpu("A100-80GB").total_bytes == 80 * 2**30
    assert get_gpu("A100-40GB").total_bytes == 40 * 2**30
    # dense bf16: H100 SXM datasheet 1,979 TFLOPS "with sparsity" -> 989.4 dense
    assert get_gpu("H100-80GB").bf16_flops == pytest.approx(989.4e12)
    assert get_gpu("A100-80GB").hbm_bytes_per_s == pytest.approx(2.039e12)
    for name in ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "L40S", "RTX-4090"):
        assert get_gpu(name).source


# ---------------------------------------------------------------- config.json
@pytest.mark.parametrize("fname, preset", [
    ("llama-2-7b.json", "Llama-2-7B"),
    ("llama-3.1-8b.json", "Llama-3.1-8B"),
    ("mistral-7b.json", "Mistral-7B"),
    ("qwen2.5-7b.json", "Qwen2.5-7B"),
    ("llama-3.1-70b.json", "Llama-3.1-70B"),
    ("qwen2.5-72b.json", "Qwen2.5-72B"),
    ("deepseek-v3.json", "DeepSeek-V3"),
])
def test_from_hf_config_equals_preset(fname, preset):
    # The presets' num_params are the published counts (model cards / safetensors
    # metadata); the config parser estimates them from shapes, so equality checks the
    # parameter formula as well as every shape field.
    m = ModelSpec.from_hf_config(CONFIGS / fname, name=preset)
    assert m == MODEL_PRESETS[preset]


def test_param_formula_by_hand_llama31_8b():
    # embeddings 128,256 × 4,096 = 525,336,576, twice (untied LM head) = 1,050,673,152
    # per layer: q 4096² + k,v 2 × 4096 × 1024 + o 4096² + MLP 3 × 4096 × 14336 + 2 norms
    #   = 16,777,216 + 8,388,608 + 16,777,216 + 176,160,768 + 8,192 = 218,112,000
    # 32 layers 6,979,584,000 + 1,050,673,152 + final norm 4,096 = 8,030,261,248
    m = ModelSpec.from_hf_config(CONFIGS / "llama-3.1-8b.json")
    assert m.num_params == 8_030_261_248
    assert m.name == "Llama-3.1-8B-Instruct"


def test_from_hf_config_num_params_override_and_directory(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((CONFIGS / "qwen2.5-7b.json").read_text())
    m = ModelSpec.from_hf_config(d, num_params=7_000_000_000)
    assert m.num_params == 7_000_000_000 and m.kv_bytes_per_token() == 57_344


def _write(tmp_path, obj) -> Path:
    p = tmp_path / "config.json"
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=1))
    return p


@pytest.mark.parametrize("drop", ["num_hidden_layers", "hidden_size", "num_attention_heads",
                                  "intermediate_size", "vocab_size", "max_position_embeddings"])
def test_missing_field_names_file_and_field(tmp_path, drop):
    cfg = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    del cfg[drop]
    p = _write(tmp_path, cfg)
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_config(p)
    assert e.value.field == drop and e.value.path == str(p)
    assert str(p) in str(e.value) and drop in str(e.value)


@pytest.mark.parametrize("field, value", [
    ("num_key_value_heads", "8"), ("num_hidden_layers", 0), ("hidden_size", -1),
    ("head_dim", 12.5), ("kv_lora_rank", "x"), ("torch_dtype", "int4"),
])
def test_malformed_field(tmp_path, field, value):
    cfg = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    cfg[field] = value
    if field == "kv_lora_rank":
        cfg["qk_rope_head_dim"] = 64
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert e.value.field == field


def test_mla_config_missing_rope_dim(tmp_path):
    cfg = json.loads((CONFIGS / "deepseek-v3.json").read_text())
    del cfg["qk_rope_head_dim"]
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert e.value.field == "qk_rope_head_dim"


def test_invalid_json_gives_line(tmp_path):
    p = _write(tmp_path, '{\n  "hidden_size": 4096,\n  "num_hidden_layers": ,\n}')
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_config(p)
    assert e.value.line == 3 and e.value.path == str(p)
    with pytest.raises(InputError, match="JSON object"):
        ModelSpec.from_hf_config(_write(tmp_path, "[1, 2]"))
    with pytest.raises(InputError, match="cannot read"):
        ModelSpec.from_hf_config(tmp_path / "nope.json")


def test_get_model_accepts_config_path():
    m = get_model(str(CONFIGS / "deepseek-v3.json"))
    assert m.is_mla and m.kv_bytes_per_token(8) == 70_272 and m.weight_dtype == "fp8"


def test_gpu_family_alias():
    from radixkv.errors import InputError
    from radixkv.memory.presets import GPU_PRESETS, get_gpu

    assert get_gpu("H100") is GPU_PRESETS["H100-80GB"]
    assert get_gpu("h200") is GPU_PRESETS["H200-141GB"]
    assert get_gpu("L40S") is GPU_PRESETS["L40S"]
    with pytest.raises(InputError, match="A100-40GB, A100-80GB"):
        get_gpu("A100")
    with pytest.raises(InputError, match="unknown GPU"):
        get_gpu("H800")
