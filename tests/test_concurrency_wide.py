"""The widened concurrency study's pieces that need no trace (experiments/fig_concurrency_wide.py):
window placement, saturation rate, load placement, paired ratios and their verdicts, engine
defaults, and the findings' counts — each against values worked out by hand."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def W():
    sys.path.insert(0, str(REPO / "experiments"))
    import fig_concurrency_wide

    return fig_concurrency_wide


def test_slice_starts_are_disjoint_windows_spread_over_the_trace(W):
    # 12,031 requests / 5 = 2,406 per stride: windows [0,1000), [2406,3406), ... [9624,10624)
    assert W.slice_starts(12031, 5, 1000) == [0, 2406, 4812, 7218, 9624]
    assert W.slice_starts(2472, 5, 480) == [0, 494, 988, 1482, 1976]
    assert W.slice_starts(10, 5, 2) == [0, 2, 4, 6, 8]  # exactly touching, not overlapping
    with pytest.raises(ValueError, match="disjointly"):
        W.slice_starts(10, 5, 3)
    with pytest.raises(ValueError):
        W.slice_starts(10, 0, 1)


def test_saturation_rate_between_the_10th_and_90th_percentile_finish(W):
    # finishes 1..10 s (any order): i = ceil(1) - 1 = 0 (1 s), j = ceil(9) - 1 = 8 (9 s): 8 requests in 8 s
    assert W.saturation_rps([5, 3, 1, 2, 4, 10, 9, 8, 7, 6]) == pytest.approx(1.0)
    # 20 finishes every 0.5 s: i = 1 (1.0 s), j = 17 (9.0 s): 16 requests in 8 s
    assert W.saturation_rps([0.5 * k for k in range(1, 21)]) == pytest.approx(2.0)
    # 30 finishes 1..30 s: 0.9 · 30 = 27.000000000000004 in floating point must still give j = 26
    # (27 s) and i = 2 (3 s): 24 requests in 24 s
    assert W.saturation_rps(list(range(1, 31))) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        W.saturation_rps([3.0, 3.0, 3.0])  # no time between the quantiles
    with pytest.raises(ValueError):
        W.saturation_rps([1, 2, 3], lo=0.9, hi=0.1)


def test_loads_are_fractions_of_the_saturation_rate(W):
    assert W.LOAD_FRACTIONS == (0.25, 0.5, 0.75, 0.9, 1.1, 1.5)
    assert W.load_rates(2.0) == pytest.approx([0.5, 1.0, 1.5, 1.8, 2.2, 3.0])
    assert sum(f < 1 for f in W.LOAD_FRACTIONS) == 4 and sum(f > 1 for f in W.LOAD_FRACTIONS) == 2
    with pytest.raises(ValueError):
        W.load_rates(0.0)


def test_paired_ratio_t_interval_by_hand(W):
    # ratios 2, 2, 3: mean 7/3; sample sd sqrt(((1/3)^2 + (1/3)^2 + (2/3)^2) / 2) = sqrt(1/3);
    # t(0.975, 2) = 4.303 → half-width 4.303 · sqrt(1/3) / sqrt(3) = 4.303 / 3
    r = W.paired_ratio([2, 4, 6], [1, 2, 2])
    assert r["mean"] == pytest.approx(7 / 3)
    assert r["ci95"] == pytest.approx(4.303 / 3)
    assert r["values"] == [2.0, 2.0, 3.0]
    assert W.paired_ratio([1, 2], [1, 0])["mean"] is None
    assert W.paired_ratio([1, None], [1, 2])["mean"] is None


def test_on_worse_needs_the_whole_interval_on_the_worse_side(W):
    assert W.on_worse({"mean": 1.2, "ci95": 0.1}, "higher") is True     # [1.1, 1.3] above 1
    assert W.on_worse({"mean": 1.2, "ci95": 0.3}, "higher") is False    # [0.9, 1.5] straddles 1
    assert W.on_worse({"mean": 0.9, "ci95": 0.05}, "lower") is True     # [0.85, 0.95] below 1
    assert W.on_worse({"mean": 0.9, "ci95": 0.05}, "higher") is False
    assert W.on_better({"mean": 0.9, "ci95": 0.05}, "higher") is True   # lower TTFT is better
    assert W.on_better({"mean": 1.0, "ci95": 0.0}, "higher") is False   # identical: neither
    assert W.on_worse({"mean": 1.0, "ci95": 0.0}, "lower") is False
    assert W.on_worse({"mean": None, "ci95": None}, "higher") is None
    with pytest.raises(ValueError):
        W.on_worse({"mean": 1.0, "ci95": 0.0}, "sideways")


def test_engine_defaults_by_gpu(W):
    # vLLM OpenAI server (EngineArgs.get_batch_defaults): A100 2048 tokens / 256 seqs, H100 8192 / 1024;
    # gpu_memory_utilization 0.92, vLLM 0.33's CacheConfig default (0.9 before PR #38284)
    assert W.engine_knobs("vllm", "A100-80GB") == {"max_num_batched_tokens": 2048, "max_num_seqs": 256,
                                                   "memory_fraction": 0.92}
    assert W.engine_knobs("vllm", "H100-80GB") == {"max_num_batched_tokens": 8192, "max_num_seqs": 1024,
                                                   "memory_fraction": 0.92}
    # SGLang: chunked_prefill_size 8192 on 60–90 GiB GPUs, mem_fraction_static computed by the memory model
    for gpu in ("A100-80GB", "H100-80GB"):
        k = W.engine_knobs("sglang", gpu)
        assert k["max_num_batched_tokens"] == 8192 and k["memory_fraction"] is None
    with pytest.raises(ValueError, match="A100 or H100"):
        W.engine_knobs("vllm", "L40S")
    with pytest.raises(ValueError, match="unknown engine"):
        W.engine_knobs("trt", "H100-80GB")


def _cell(W, trace, frac, ttft_ratio, ttft_ci):
    r = {"mean": ttft_ratio, "ci95": ttft_ci}
    one = {"mean": 1.0, "ci95": 0.0}
    ratios = {"ttft_p50_s": r, "ttft_p99_s": one, "throughput_total_tokens_per_s": one, "concurrency_mean": one}
    return {"trace": trace, "hw": "8B-A100", "engine": "vllm", "load_fraction": frac,
            "on": {"token_hit_rate": {"mean": 0.0 if trace == "azure_conv" else 0.3}},
            "on_over_off": ratios,
            "on_worse": {m: W.on_worse(v, w) for (m, v), w in zip(ratios.items(), ("higher", "higher", "lower", "lower"))},
            "on_better": {m: W.on_better(v, w) for (m, v), w in zip(ratios.items(), ("higher", "higher", "lower", "lower"))}}


def test_findings_count_the_losing_cells_by_regime(W):
    cells = [_cell(W, "mooncake", 0.5, 1.3, 0.1),   # on worse (TTFT p50 1.2–1.4 × off), below saturation
             _cell(W, "mooncake", 1.5, 0.5, 0.1),   # on better
             _cell(W, "ragpulse", 1.1, 1.1, 0.2),   # straddles 1: neither
             _cell(W, "azure_conv", 0.5, 1.0, 0.0)]
    sat = {"mean": 1.2, "ci95": 0.01}
    configs = [{"trace": t, "saturation_on_over_off": sat} for t in ("mooncake", "ragpulse", "azure_conv")]
    f = W.findings({"cells": cells, "configs": configs})
    p = f["prefix"]["ttft_p50_s"]
    assert f["prefix"]["cells"] == 3 and p["on_worse"] == 1 and p["on_better"] == 1
    assert p["on_worse_below_saturation"] == 1 and p["on_worse_above_saturation"] == 0
    assert p["cells_below_saturation"] == 1 and p["cells_above_saturation"] == 2
    assert p["worst_ratio"] == 1.3 and p["worst_cell"]["load_fraction"] == 0.5
    assert f["prefix"]["hit_rate_at_half_load"] == {"min": 0.3, "max": 0.3}
    assert f["control"]["cells"] == 1 and f["control"]["max_abs_rel_diff"] == 0.0
    assert f["mooncake"]["ttft_p50_s_on_worse"] == 1 and f["ragpulse"]["ttft_p50_s_on_worse"] == 0
