"""Hybrid model specs: per-layer kinds, KV bytes per kind, linear-attention state bytes.

Every expected number is worked out by hand in the comments from the config values."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main
from radixkv.errors import ConfigError, InputError
from radixkv.memory import get_model, load_hf_config
from radixkv.memory.specs import ModelSpec, SSMSpec


def test_gemma3_preset_kv_by_kind():
    m = get_model("gemma-3-27b")
    # every 6th layer full: layers 5, 11, …, 59 -> 10 full, 62 − 10 = 52 sliding
    assert m.layer_counts() == {"full_attention": 10, "sliding_attention": 52, "linear_attention": 0}
    assert m.is_hybrid and m.sliding_window == 1024
    # one layer: 16 KV heads × (128 + 128) × 2 B = 8,192 B
    assert m.kv_bytes_per_token_by_kind() == {"full_attention": 10 * 8192, "sliding_attention": 52 * 8192}
    assert m.kv_bytes_per_token() == 62 * 8192 == 507_904
    # tp 2: 8 heads per rank -> half
    assert m.kv_bytes_per_token(2) == 253_952


def test_qwen3_next_preset_state_bytes():
    m = get_model("Qwen3-Next-80B-A3B")
    assert m.layer_counts() == {"full_attention": 12, "sliding_attention": 0, "linear_attention": 36}
    # only the 12 full layers hold KV: 2 heads × (256 + 256) × 2 B = 2,048 B per layer
    assert m.kv_bytes_per_token() == 12 * 2048
    assert m.num_kv_layers == 12
    # conv: (128·16·2 + 128·32) = 8,192 channels × (4 − 1) = 24,576; temporal: 32·128·128 =
    # 524,288; (24,576 + 524,288) × 2 B = 1,097,728 B per layer, × 36 layers
    assert m.state_bytes_per_sequence() == 36 * 1_097_728 == 39_518_208
    # tp 4: conv 8,192/4 × 3 = 6,144, temporal 8·128·128 = 131,072 -> 274,432 B per layer
    assert m.state_bytes_per_sequence(4) == 36 * 274_432
    with pytest.raises(ConfigError):
        m.ssm.state_elements(3)


def test_full_attention_model_unchanged():
    m = get_model("Llama-3.1-8B")
    assert not m.is_hybrid and m.layer_types is None
    assert m.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert m.state_bytes_per_sequence() == 0


def _write(tmp_path, cfg):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


_BASE = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096}


def test_hf_layer_types_read(tmp_path):
    cfg = dict(_BASE, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=128)
    m = load_hf_config(_write(tmp_path, cfg))
    assert m.layer_types == ("sliding_attention", "full_attention") * 2
    assert m.sliding_window == 128
    # head_dim 256/4 = 64: 2 heads × 128 × 2 B = 512 B per layer, 4 layers
    assert m.kv_bytes_per_token() == 2048


def test_hf_default_patterns(tmp_path):
    # gpt_oss with no layer_types: even layers slide (HF GptOssConfig)
    m = load_hf_config(_write(tmp_path, dict(_BASE, model_type="gpt_oss", sliding_window=128)))
    assert m.layer_types == ("sliding_attention", "full_attention") * 2
    # Gemma 3 multimodal wrapper: text_config, sliding_window_pattern 2
    outer = {"model_type": "gemma3", "torch_dtype": "bfloat16",
             "text_config": dict(_BASE, model_type="gemma3_text", sliding_window=64,
                                 sliding_window_pattern=2)}
    m = load_hf_config(_write(tmp_path, outer))
    assert m.layer_types == ("sliding_attention", "full_attention") * 2 and m.sliding_window == 64
    # qwen3_next: full_attention_interval 2 -> linear, full, linear, full
    q = dict(_BASE, model_type="qwen3_next", full_attention_interval=2, linear_conv_kernel_dim=4,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
    m = load_hf_config(_write(tmp_path, q))
    assert m.layer_counts()["linear_attention"] == 2
    # conv (8·2·2 + 8·4) = 64 × 3 = 192; temporal 4·8·8 = 256; 448 el × 2 B × 2 layers
    assert m.state_bytes_per_sequence() == 1792
    # a bare sliding_window (Mistral-7B-v0.1 style) is not a hybrid
    m = load_hf_config(_write(tmp_path, dict(_BASE, sliding_window=4096)))
    assert m.layer_types is None


def test_hf_bad_layer_types(tmp_path):
    p = _write(tmp_path, dict(_BASE, layer_types=["full_attention", "chunked", "full_attention",
                                                  "full_attention"]))
    with pytest.raises(InputError) as e:
        load_hf_config(p)
    assert "layer_types" in str(e.value) and "chunked" in str(e.value) and str(p) in str(e.value)
    p = _write(tmp_path, dict(_BASE, layer_types=["full_attention"]))
    with pytest.raises(InputError, match="layer_types"):
        load_hf_config(p)
    p = _write(tmp_path, dict(_BASE, layer_types=["sliding_attention"] * 4))  # no sliding_window
    with pytest.raises(InputError, match="sliding_window"):
        load_hf_config(p)


def test_spec_validation():
    with pytest.raises(ConfigError, match="ssm"):
        ModelSpec("x", 2, 4, 2, 64, 64, 256, 512, 1000, 10**6, layer_types=("linear_attention", "full_attention"))
    with pytest.raises(ConfigError, match="layer_types"):
        ModelSpec("x", 2, 4, 2, 64, 64, 256, 512, 1000, 10**6, layer_types=("full_attention",))
    with pytest.raises(ConfigError):
        SSMSpec(conv_kernel=0, num_k_heads=1, num_v_heads=1, head_k_dim=1, head_v_dim=1)


def test_memory_cli_reports_kinds(capsys):
    rc = main(["memory", "--model", "Qwen3-Next-80B-A3B", "--gpu", "H100-80GB", "--tp", "4",
               "--engine", "vllm", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert r["layers"]["linear_attention"] == 36
    # 2 KV heads over 4 ranks: one head per rank (replicated): 1 × 512 × 2 B per layer
    assert r["kv_bytes_per_token_by_kind_per_rank"] == {"full_attention": 12 * 1024}
    assert r["state_bytes_per_sequence_per_rank"] == 36 * 274_432
    rc = main(["memory", "--model", "Gemma-3-27B", "--gpu", "H100-80GB", "--engine", "vllm"])
    out = capsys.readouterr().out
    assert "52 sliding" in out and "n/a (no linear-attention layers)" in out
    rc = main(["memory", "--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--engine", "vllm", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert "layers" not in r  # a full-attention model's report is unchanged
