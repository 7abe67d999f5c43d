"""Benchmark suite: replay, load and curve for every built-in policy on the public traces.

Run with ``--benchmark-enable`` to time (``RADIXKV_SHARED`` must name the folder holding the
traces); under the default ``--benchmark-disable`` each case runs once, on the first
``RADIXKV_BENCH_LIMIT`` requests (default 200; 0 = whole traces), as a smoke test.
Traces: the Mooncake conversation trace, WEKA's trace_0001 and the peers' bench trace
(``../shared/bench/gen_peers_trace.py``, generated and converted to native JSONL once per
session; only with ``RADIXKV_SLOW=1``, as generating it takes a while). Wall times are
noisy on shared machines: compare runs as ratios (``experiments/bench_perf.py``), and use
``experiments/bench_callgrind.py`` (instruction counts) for regression checks.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared_path
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.curve import run_curve
from radixkv.replay.run import run_replay, warmup
from radixkv.trace.load import load_trace

LIMIT = int(os.environ.get("RADIXKV_BENCH_LIMIT", 200)) or None
POLICIES = ["vllm:16", "sglang:1", "unit-lru", "none:16", "static:16"]
#: pool per trace (tokens), and the curve's capacities
POOL = {"mooncake": 10_000_000, "weka": 2_000_000, "bench": 32_768}
CURVE = {"mooncake": [10**5, 10**6, 10**7, 5 * 10**7], "weka": [10**4, 10**5, 10**6, 10**7],
         "bench": [4096, 32_768, 262_144, 2_097_152]}


def _trace_path(name: str, tmp_factory) -> Path:
    if name == "mooncake":
        return shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    if name == "weka":
        return shared_path("traces", "weka-claude-code", "traces", "trace_0001.json")
    if os.environ.get("RADIXKV_SLOW") != "1":
        pytest.skip("the bench trace is generated only with RADIXKV_SLOW=1")
    gen = shared_path("bench", "gen_peers_trace.py")
    out = tmp_factory.mktemp("bench")
    subprocess.run([sys.executable, str(gen)], cwd=out, check=True, stderr=subprocess.DEVNULL)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
    from bench_vs_kvlint import load_peers

    from radixkv.trace.native import write_native

    native = out / "trace_native.jsonl"
    write_native(load_peers(out / "trace_tokens.jsonl", True), native)
    return native


_PATHS: dict = {}


@pytest.fixture(scope="module", params=["mooncake", "weka", "bench"])
def trace_case(request, tmp_path_factory):
    name = request.param
    if name not in _PATHS:
        _PATHS[name] = _trace_path(name, tmp_path_factory)
    path = _PATHS[name]
    return name, path, load_trace(path).head(LIMIT)


def test_bench_load(benchmark, trace_case):
    name, path, trace = trace_case
    t = benchmark.pedantic(load_trace, args=(path,), rounds=3, iterations=1, warmup_rounds=1)
    assert len(t) >= len(trace)
    if benchmark.stats is not None:
        benchmark.extra_info["ids_per_s"] = len(t.ids) / benchmark.stats.stats.min


@pytest.mark.parametrize("policy", POLICIES)
def test_bench_replay(benchmark, trace_case, policy):
    name, _, trace = trace_case
    spec = parse_policy(policy)
    warmup(spec, concurrent=False)  # the sequential kernels: what run_replay and run_curve use
    _, s = benchmark.pedantic(run_replay, args=(trace, spec, PoolSpec(capacity_tokens=POOL[name])),
                              rounds=3, iterations=1, warmup_rounds=1)
    assert 0 <= s["hit_tokens"] <= s["prompt_tokens"]
    if benchmark.stats is not None:
        benchmark.extra_info["prompt_tokens_per_s"] = s["prompt_tokens"] / benchmark.stats.stats.min


@pytest.mark.parametrize("policy", ["unit-lru", "sglang:1"])
def test_bench_curve(benchmark, trace_case, policy):
    name, _, trace = trace_case
    spec = parse_policy(policy)
    warmup(spec, concurrent=False)  # the sequential kernels: what run_replay and run_curve use
    pts = benchmark.pedantic(run_curve, args=(trace, spec, CURVE[name]), rounds=3, iterations=1, warmup_rounds=1)
    rates = [p[1]["token_hit_rate"] for p in pts if isinstance(p, tuple)]  # a pool too small is skipped
    assert rates
    if policy == "unit-lru":  # LRU is a stack algorithm: the curve never decreases
        assert rates == sorted(rates)
