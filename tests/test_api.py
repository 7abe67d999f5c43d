"""The public API exported from ``radixkv``: load_trace, replay (both modes), summarize,
format_table, check_policy."""
from __future__ import annotations

import json
import math

import pytest

import radixkv
from conftest import DATA
from radixkv.errors import ConfigError

MIXED = DATA / "golden" / "traces" / "mixed200.jsonl"


def _golden(engine, name):
    return [json.loads(x)["hit_tokens"] for x in (DATA / "golden" / engine / f"{name}.jsonl").read_text().splitlines() if x]


def test_public_names():
    for name in ("load_trace", "replay", "summarize", "format_table", "check_policy", "PrefixCache",
                 "parse_policy", "Trace"):
        assert name in radixkv.__all__ and getattr(radixkv, name) is not None
    from importlib import import_module

    import_module("radixkv.replay.sequential")  # the subpackage stays importable, and callable
    assert callable(radixkv.replay) and radixkv.replay.sequential.replay_sequential


def test_sequential_replay_matches_real_engines():
    trace = radixkv.load_trace(str(MIXED))
    rec = radixkv.replay(trace, "vllm:16", num_gpu_blocks=120)
    assert rec["hit_tokens"].tolist() == _golden("vllm", "vllm_mixed200_b16_n120")
    rec = radixkv.replay(MIXED, "sglang:1", max_total_num_tokens=1904)  # a path is read too
    assert rec["hit_tokens"].tolist() == _golden("sglang", "sglang_mixed200_p1_c1904")
    s = radixkv.summarize(rec)
    assert s["policy"] == "sglang:1" and s["hit_tokens"] == sum(_golden("sglang", "sglang_mixed200_p1_c1904"))
    assert s["evictions"] >= 1


def test_instance_and_class_policies():
    from radixkv.policies.radix import RadixCache

    trace = radixkv.load_trace(str(MIXED))
    a = radixkv.replay(trace, RadixCache(1904, 1))
    b = radixkv.replay(trace, RadixCache, max_total_num_tokens=1904)
    assert a["hit_tokens"].tolist() == b["hit_tokens"].tolist() == _golden("sglang", "sglang_mixed200_p1_c1904")


def test_concurrent_replay_is_the_cli_replay(tmp_path, capsys):
    from radixkv.cli import main

    trace = radixkv.load_trace(str(MIXED))
    res = radixkv.replay(trace, "sglang:1", capacity_tokens=8000, mode="concurrent",
                         model="Llama-3.1-8B", gpu="A100-80GB")
    s = radixkv.summarize(res)
    out = tmp_path / "c.json"
    assert main(["replay", str(MIXED), "--policy", "sglang:1", "--capacity-tokens", "8000", "--mode", "concurrent",
                 "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--quiet", "--json", str(out), "--no-timing"]) == 0
    cli = json.loads(out.read_text())["results"][0]["summary"]
    assert s["policy"] == "sglang:1" and res.meta["admission"] == "sglang"  # from RadixCache.admission_rule
    for k in ("hit_tokens", "preemptions", "concurrency_peak", "steps"):
        assert s[k] == cli[k], k
    assert math.isclose(s["ttft_p50_s"], cli["ttft_p50_s"])


@pytest.mark.parametrize("kwargs, msg", [
    ({"policy": "vllm:16"}, "exactly one pool size"),
    ({"policy": "vllm:16", "capacity_tokens": 100, "num_gpu_blocks": 9}, "exactly one pool size"),
    ({"policy": "vllm:16", "capacity_tokens": 9999, "mode": "concurrent"}, "prices each step"),
    ({"policy": "vllm:16", "capacity_tokens": 9999, "mode": "batch"}, "mode must be"),
    ({"policy": "nosuch:16", "capacity_tokens": 9999}, "unknown policy"),
])
def test_bad_calls_are_config_errors(kwargs, msg):
    trace = radixkv.load_trace(str(MIXED))
    with pytest.raises(ConfigError, match=msg):
        radixkv.replay(trace, **kwargs)


def test_built_policy_with_a_pool_size_is_refused():
    from radixkv.policies.no_cache import NoCache

    with pytest.raises(ConfigError, match="already built"):
        radixkv.replay(radixkv.load_trace(str(MIXED)), NoCache(100, 1), capacity_tokens=100)


def test_format_table_prints_na_for_unmodelled_metrics():
    rows = [("hit_tokens", "hit tokens", "{:,}"), ("token_hit_rate", "rate", "{:.2f}")]
    t = radixkv.format_table([{"policy": "a", "hit_tokens": 1234, "token_hit_rate": 0.5},
                              {"policy": "bb", "hit_tokens": None, "token_hit_rate": float("nan")}],
                             timing=False, rows_spec=rows)
    # widths by hand: 10 ("hit tokens"), 5 ("1,234"), 3 ("n/a"); labels left, values right
    assert t.splitlines() == [
        "metric          a   bb",
        "----------  -----  ---",
        "hit tokens  1,234  n/a",
        "rate         0.50  n/a",
    ]


_ALL_KINDS = ["vllm:16", "vllm:16@lfu", "sglang:1", "sglang:16@lfu", "unit-lru", "none:16", "static:16",
              "sglang-hicache:1@host_tokens=20000", "vllm-offload:16@host_tokens=20000", "vllm-hybrid:16",
              "sglang-swa:1", "sglang-mamba:1"]


@pytest.mark.parametrize("policy", _ALL_KINDS)
def test_api_summary_is_the_cli_summary_for_every_kind_of_policy(policy, tmp_path):
    # issue 28: radixkv.summarize(radixkv.replay(...)) gave duplicate_share_mean 0.0 for
    # unit-lru / none where the CLI gives null (not modelled), and no host-tier keys for the
    # host-tier policies; the two are one summary now. Every key must agree, not a chosen few.
    from radixkv.cli import main

    api = radixkv.summarize(radixkv.replay(MIXED, policy, capacity_tokens=20_000, limit=80))
    out = tmp_path / "r.json"
    assert main(["replay", str(MIXED), "--policy", policy, "--capacity-tokens", "20000", "--limit", "80",
                 "--quiet", "--no-timing", "--json", str(out)]) == 0
    cli = json.loads(out.read_text())["results"][0]["summary"]
    api = json.loads(json.dumps(api))  # tuples and numpy scalars as JSON has them
    api.pop("timing_s", None)
    assert sorted(api) == sorted(cli)
    assert {k: api[k] for k in api if api[k] != cli[k]} == {}
    if policy in ("unit-lru", "none:16"):
        assert api["duplicate_share_mean"] is None  # not modelled: null, never 0
    if "host_tokens" in policy:
        assert api["host_capacity_tokens"] is not None and api["device_hit_tokens"] is not None


@pytest.mark.parametrize("policy", ["vllm:16", "sglang:1", "vllm:16@lfu", "sglang:1@lfu", "none:16"])
def test_api_concurrent_summary_is_the_cli_summary(policy, tmp_path):
    # the trial: the concurrent API summary lacked the four host-tier byte keys the CLI
    # writes (null without a host tier); every key must agree
    from radixkv.cli import main

    api = radixkv.summarize(radixkv.replay(MIXED, policy, capacity_tokens=20_000, limit=60, mode="concurrent",
                                           model="Llama-3.1-8B", gpu="A100-80GB"))
    out = tmp_path / "r.json"
    assert main(["replay", str(MIXED), "--policy", policy, "--capacity-tokens", "20000", "--limit", "60",
                 "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
                 "--quiet", "--no-timing", "--json", str(out)]) == 0
    cli = json.loads(out.read_text())["results"][0]["summary"]
    api = json.loads(json.dumps(api))
    api.pop("timing_s", None)
    assert sorted(api) == sorted(cli)
    assert {k: (api[k], cli[k]) for k in api if api[k] != cli[k]} == {}
    assert api["gpu_to_host_bytes"] is None  # no host tier: null, never 0


def test_api_host_tier_bytes_are_priced_at_the_model_as_the_cli_does(tmp_path):
    # Llama-3.1-8B bf16: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B per token
    from radixkv.cli import main

    pol = "sglang-hicache:1@host_tokens=20000"
    api = radixkv.summarize(radixkv.replay(MIXED, pol, capacity_tokens=2_000, limit=80, model="Llama-3.1-8B"))
    out = tmp_path / "r.json"
    assert main(["replay", str(MIXED), "--policy", pol, "--capacity-tokens", "2000", "--limit", "80",
                 "--model", "Llama-3.1-8B", "--quiet", "--no-timing", "--json", str(out)]) == 0
    cli = json.loads(out.read_text())["results"][0]["summary"]
    assert api["gpu_to_host_tokens"] > 0
    assert api["gpu_to_host_bytes"] == cli["gpu_to_host_bytes"] == api["gpu_to_host_tokens"] * 131_072
