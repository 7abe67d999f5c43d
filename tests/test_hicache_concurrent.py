"""HiCache in the concurrent replay: the host link prices load backs (hand-worked)."""
from __future__ import annotations

import pytest

from _conc_cases import request_trace
from radixkv.cost import HOST_LINKS, CostModel, HostLink
from radixkv.errors import ConfigError
from radixkv.policies.hicache import HiCacheRadixCache
from radixkv.policies.radix import RadixCache
from radixkv.replay.concurrent import replay_concurrent

A = list(range(1000, 1012))          # 12 tokens
B = list(range(2000, 2020))          # 20 tokens


def test_link_presets_from_the_specs():
    # PCIe: GT/s per lane × 16 lanes × 128/130 encoding / 8 bits; GH200 C2C: 900 GB/s both ways
    assert HOST_LINKS["pcie4-x16"] == pytest.approx(31.5077e9, rel=1e-5)
    assert HOST_LINKS["pcie5-x16"] == pytest.approx(63.0154e9, rel=1e-5)
    assert HOST_LINKS["nvlink-c2c"] == 450e9
    assert HostLink.parse("pcie5-x16").name == "pcie5-x16"
    assert HostLink.parse("25e9").bytes_per_s == 25e9
    with pytest.raises(ConfigError, match="unknown host link"):
        HostLink.parse("pcie9")
    with pytest.raises(ConfigError):
        HostLink(0.0)


def _toy_cost():
    # 4 layers; a 1-token step after 0 tokens: 2·1e9 FLOPs + 4·4·1·1 = 2e9 + 16 FLOPs at
    # 1e9 FLOP/s = 2.000000016 s (bytes: 2e9 + 1e9 = 3e9 at 1e12 B/s = 3 ms, under it)
    return CostModel(params=1e9, num_layers=4, attn_dim=1, kv_bytes_per_token=1e9, peak_flops=1e9,
                     hbm_bytes_per_s=1e12, mfu=1.0, mbu=1.0)


def test_load_overlaps_the_step_layer_by_layer():
    cost = _toy_cost()
    link = HostLink(1e9)
    t = 2.000000016
    assert link.load_time(cost, 8) == pytest.approx(8.0)       # 8 tokens × 1e9 B / 1e9 B/s
    # per layer: load 8/4 = 2 s, compute t/4; 2 + t/4 + 3 · max(2, t/4)
    assert link.step_time(cost, [1], [0], 8) == pytest.approx(2 + t / 4 + 3 * 2)
    # load 1 s → 0.25 s per layer, under the compute: 0.25 + t/4 + 3 · t/4
    assert link.step_time(cost, [1], [0], 1) == pytest.approx(0.25 + t)
    assert link.step_time(cost, [1], [0], 0) == pytest.approx(t)
    # tp 2: each rank copies half the bytes over its own link
    cost2 = CostModel(params=1e9, num_layers=4, attn_dim=1, kv_bytes_per_token=1e9, peak_flops=1e9,
                      hbm_bytes_per_s=1e12, mfu=1.0, mbu=1.0, tp=2)
    assert link.load_time(cost2, 8) == pytest.approx(4.0)


def _trace(prompts, arrivals):
    return request_trace(prompts, [[9]] * len(prompts), arrivals, output_ids=True)


def test_concurrent_load_back_prices_the_ttft():
    """Requests far apart run alone. Pool 24, host 49 (ratio 2): A (12) is written through;
    B (20) demotes A to host; A + 1 token finds 12 tokens on host (≥ 10) and loads them back
    (as the sequential hand test): its prefill computes 1 token after 12, and its TTFT is
    that step with a 12-token load over the link."""
    tr = _trace([A, B, A + [7]], [0.0, 10.0, 20.0])
    cost = CostModel.from_specs("Llama-3.1-8B", "H100-80GB")
    slow = HostLink(1e8)  # 12 × 131,072 B / 1e8 B/s = 15.7 ms: longer than the step
    res = replay_concurrent(tr, HiCacheRadixCache(24, 1, hicache_ratio=2.0), cost, host_link=slow)
    s = res.summary()
    assert (s["host_hit_tokens"], s["host_loaded_tokens"], s["host_to_gpu_tokens"]) == (12, 12, 12)
    assert s["hit_tokens"] == 12
    load = 12 * 131072 / 1e8
    assert s["host_load_s"] == pytest.approx(load)
    L = 32  # Llama-3.1-8B layers
    comp = cost.step_time([1], [12])
    want = load / L + comp / L + (L - 1) * max(load / L, comp / L)
    assert res.columns["ttft_s"][2] == pytest.approx(want, rel=1e-9)
    assert res.columns["ttft_s"][2] > load  # the copy, not the 1-token prefill, sets it
    fast = replay_concurrent(tr, HiCacheRadixCache(24, 1, hicache_ratio=2.0), cost,
                             host_link=HostLink.parse("nvlink-c2c"))
    assert fast.columns["ttft_s"][2] < res.columns["ttft_s"][2]
    assert fast.columns["ttft_s"][2] >= comp


def test_concurrent_needs_a_link_and_refuses_one_without_a_tier():
    tr = _trace([A, B], [0.0, 1.0])
    cost = CostModel.from_specs("Llama-3.1-8B", "H100-80GB")
    with pytest.raises(ConfigError, match="host link"):
        replay_concurrent(tr, HiCacheRadixCache(24, 1), cost)
    with pytest.raises(ConfigError, match="no host-memory tier"):
        replay_concurrent(tr, RadixCache(24, 1), cost, host_link=HostLink(1e9))
    # no host tier: no link needed, nothing loaded
    s = replay_concurrent(tr, HiCacheRadixCache(24, 1, host_tokens=0), cost).summary()
    assert s["host_to_gpu_tokens"] == 0 and s["host_load_s"] == 0.0


def test_cli_host_link(tmp_path):
    import json

    from radixkv.cli import main
    from conftest import GOLDEN_LOCAL

    trace = str(GOLDEN_LOCAL / "traces" / "mixed200.jsonl")
    base = ["replay", trace, "--policy", "sglang-hicache:16", "--model", "Llama-3.1-8B", "--gpu", "H100-80GB",
            "--max-total-num-tokens", "1904", "--mode", "concurrent", "--quiet"]
    assert main(base + ["--host-link", "pcie4-x16", "--json", str(tmp_path / "a.json")]) == 0
    s = json.loads((tmp_path / "a.json").read_text())["results"][0]["summary"]
    assert s["host_link_bytes_per_s"] == HOST_LINKS["pcie4-x16"]
    assert s["host_load_s"] == pytest.approx(s["host_to_gpu_tokens"] * 131072 / HOST_LINKS["pcie4-x16"])
    assert s["host_to_gpu_bytes"] == s["host_to_gpu_tokens"] * 131072
    assert main(base) == 2  # no --host-link: refused
    assert main(["replay", trace, "--policy", "sglang-hicache:16", "--capacity-tokens", "1904",
                 "--host-link", "pcie4-x16", "--quiet"]) == 2  # sequential: refused


def test_chunked_prefill_allocates_per_chunk():
    """Pool 64, page 16: a 40-token prompt admitted with a first chunk of 16 takes one
    page (48 free); the next chunk to 40 takes ceil(40/16)·16 − 16 = 32 more (16 free);
    finishing caches the page-aligned 32 tokens and frees the rest (64 − 32 = 32 free) —
    the same end state as a whole-prompt admission."""
    p = list(range(3000, 3040))
    tr = _trace([p, p], [0.0, 0.0])
    c = HiCacheRadixCache(64, 16, host_tokens=0)
    adm = c.admit(0, tr.kv_seq(0), 16)
    assert (adm.hit_tokens, c.free) == (0, 48)
    assert c.extend(0, 24) and c.free == 16
    c.finish(0)
    c.check_invariants()
    assert (c.free, c.tree_dev) == (32, 32)
    d = HiCacheRadixCache(64, 16, host_tokens=0)
    d.run_request(0, tr.kv_seq(0))
    assert (d.free, d.tree_dev) == (32, 32)
    # the second request hits the 32 cached tokens (key capped at 39, page-aligned)
    assert c.peek_hit(tr.kv_seq(1)) == 32 and c.admit(1, tr.kv_seq(1), 40).hit_tokens == 32
    with pytest.raises(ValueError):
        c.admit(2, tr.kv_seq(0), 41)  # beyond the prompt: the scheduler falls back to it


def test_replicas_with_a_host_tier_are_refused():
    from radixkv.replay.multi_concurrent import replay_multi_concurrent

    tr = _trace([A, B], [0.0, 1.0])
    cost = CostModel.from_specs("Llama-3.1-8B", "H100-80GB")
    with pytest.raises(ConfigError, match="host tier"):
        replay_multi_concurrent(tr, [HiCacheRadixCache(24, 1), HiCacheRadixCache(24, 1)], cost, "round-robin")


def test_peek_hit_counts_a_load_device_hit_does_not():
    """After A is demoted to host (pool 24: A written through, B demotes it), A + 1 token
    would hit 12 loaded tokens: peek_hit says 12 (12 ≥ load_back_threshold), device_hit
    0 (SGLang's budget counts them as tokens to place); neither changes the state."""
    tr = _trace([A, B, A + [7], A[:8] + [5, 6]], [0.0, 0.0, 0.0, 0.0])
    c = HiCacheRadixCache(24, 1, hicache_ratio=2.0)
    c.run_request(0, tr.kv_seq(0))
    c.run_request(1, tr.kv_seq(1))
    before = c.stats()
    assert (c.peek_hit(tr.kv_seq(2)), c.device_hit(tr.kv_seq(2))) == (12, 0)
    # 8 host tokens (key capped at 9 tokens, A's first 8 match): under the threshold
    assert (c.peek_hit(tr.kv_seq(3)), c.device_hit(tr.kv_seq(3))) == (0, 0)
    assert c.stats() == before
    assert c.run_request(2, tr.kv_seq(2)).hit_tokens == 12


@pytest.mark.parametrize("spec", ["sglang-hicache:1", "sglang-hicache:16@write_back"])
def test_policy_contract_checks(spec):
    """The 14 contract checks of radixkv.policies.check (several running, chunked admission,
    refusals change nothing, peek_hit equals the next hit, …) hold with a host tier."""
    from radixkv.policies.check import check_policy

    assert check_policy(spec) == []
