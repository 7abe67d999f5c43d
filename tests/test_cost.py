"""Cost model: values worked out by hand from the formulas in radixkv/cost.py."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cost import CostModel
from radixkv.errors import ConfigError

# Llama-3.1-8B (config.json: 32 layers, 32 heads × 128 = 4096, 8 KV heads) on A100-80GB
PARAMS = 8_030_261_248
KV_BYTES = 2 * 32 * 8 * 128 * 2  # K and V × layers × KV heads × head dim × bf16 = 131,072
PEAK = 312e12
BW = 2.039e12


@pytest.fixture
def llama():
    return CostModel.from_specs("Llama-3.1-8B", "A100-80GB")


def test_from_specs_reads_the_presets(llama):
    assert llama.params == PARAMS
    assert llama.num_layers == 32
    assert llama.attn_dim == 4096
    assert llama.kv_bytes_per_token == KV_BYTES
    assert llama.peak_flops == PEAK
    assert llama.hbm_bytes_per_s == BW
    assert llama.weight_dtype_bytes == 2


def test_prefill_flops_1000_tokens_8b(llama):
    # linear: 2 × 8,030,261,248 × 1,000            = 16,060,522,496,000
    # attention: 4 × 32 × 4,096 × (1,000 × 1,001 / 2) = 524,288 × 500,500 = 262,406,144,000
    # total                                          = 16,322,928,640,000
    assert llama.prefill_flops(1000) == pytest.approx(16_322_928_640_000, rel=1e-12)
    # the same 1,000 tokens after a 1,000-token cached prefix: the attention term becomes
    # 524,288 × (1,000 × 1,000 + 500,500) = 524,288 × 1,500,500 = 786,694,144,000
    assert llama.prefill_flops(1000, 1000) == pytest.approx(16_060_522_496_000 + 786_694_144_000, rel=1e-12)


def test_attention_term_is_quadratic_in_prompt(llama):
    # doubling a prompt from scratch: linear part ×2, attention part ≈ ×4
    lin = 2 * PARAMS
    a1 = llama.prefill_flops(2000) - lin * 2000
    a0 = llama.prefill_flops(1000) - lin * 1000
    # 524,288 × 2,001,000 / (524,288 × 500,500) = 3.998...
    assert a1 / a0 == pytest.approx(2_001_000 / 500_500, rel=1e-12)


def test_prefill_step_is_compute_bound(llama):
    # compute: 16,322,928,640,000 / (312e12 × 0.6) = 0.0871951316... s
    # memory : (16,060,522,496 + 131,072 × 1,000) / (2.039e12 × 0.8) = 0.00992618... s
    t = llama.step_time([1000], [0])
    assert t == pytest.approx(16_322_928_640_000 / (312e12 * 0.6), rel=1e-12)
    assert t == pytest.approx(0.0871951316, rel=1e-9)


def test_decode_step_is_memory_bound(llama):
    # one decode at 999 tokens of context: reads weights (2 B × params) and 1,000 tokens
    # of KV: 16,060,522,496 + 131,072,000 = 16,191,594,496 B over 1.6312e12 B/s
    t = llama.step_time([1], [999])
    assert t == pytest.approx(16_191_594_496 / (2.039e12 * 0.8), rel=1e-12)
    # FLOPs would take 16,584,810,496 / 1.872e14 = 8.9e-5 s: far below
    assert t > 16_584_810_496 / (312e12 * 0.6) * 100


def test_decode_steps_time_matches_step_by_step(llama):
    ctx = np.array([10, 500, 7000])
    k = 5
    fast = llama.decode_steps_time(3, int(ctx.sum()), k)
    slow = [llama.step_time([1, 1, 1], ctx + j) for j in range(k)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_tensor_parallel_halves_time():
    one = CostModel(params=1e9, num_layers=10, attn_dim=1000, kv_bytes_per_token=1000.0,
                    peak_flops=1e14, hbm_bytes_per_s=1e12, mfu=1.0, mbu=1.0)
    two = CostModel(params=1e9, num_layers=10, attn_dim=1000, kv_bytes_per_token=1000.0,
                    peak_flops=1e14, hbm_bytes_per_s=1e12, mfu=1.0, mbu=1.0, tp=2)
    # prefill of 100 tokens: 2e9 × 100 + 4 × 10 × 1000 × 5050 = 2.00202e11 FLOPs → 2.00202 ms
    assert one.step_time([100], [0]) == pytest.approx(2.00202e11 / 1e14)
    assert two.step_time([100], [0]) == pytest.approx(2.00202e11 / 2e14)


def test_step_overhead_and_empty_batch():
    c = CostModel(params=1e9, num_layers=1, attn_dim=1, kv_bytes_per_token=1.0, peak_flops=1e15,
                  hbm_bytes_per_s=1e12, mfu=1.0, mbu=1.0, step_overhead_s=0.01)
    # one decode: bytes 2e9 + 1 → 2.000000001e-3 s, plus 0.01 s overhead
    assert c.step_time([1], [0]) == pytest.approx(0.012000000001)
    assert c.step_time([], []) == 0.0


@pytest.mark.parametrize("kw", [{"mfu": 0.0}, {"mbu": 1.5}, {"params": 0}, {"tp": 0}, {"step_overhead_s": -1},
                                # NaN passed `< 0` and hung the concurrent replay (--step-overhead-s nan)
                                {"step_overhead_s": float("nan")}, {"step_overhead_s": float("inf")}])
def test_bad_parameters_are_config_errors(kw):
    base = dict(params=1e9, num_layers=1, attn_dim=1, kv_bytes_per_token=1.0, peak_flops=1e15, hbm_bytes_per_s=1e12)
    base.update(kw)
    with pytest.raises(ConfigError):
        CostModel(**base)


def test_intake_arrivals_by_hand():
    from radixkv.cost import intake_arrivals

    # a burst of three at 0, 2 ms each: taken in by 2, 4, 6 ms, one busy period -> all at 6 ms
    assert intake_arrivals([0.0, 0.0, 0.0], 0.002) == pytest.approx([0.006] * 3)
    # sends 0, 1, 10 ms, 3 ms each: taken in by 3, 6 (sent at 1 ≤ 3: same period), 13 ms
    # (sent at 10 > 6: a new period) -> 6, 6, 13 ms
    assert intake_arrivals([0.0, 0.001, 0.010], 0.003) == pytest.approx([0.006, 0.006, 0.013])
    assert list(intake_arrivals([0.0, 1.0], 0.0)) == [0.0, 1.0]
    for bad in (-0.001, float("nan"), float("inf")):
        with pytest.raises(ConfigError):
            intake_arrivals([0.0], bad)
