"""Flags that would have no effect are refused, naming both flags (radixkv/flags/moot.py).

Each case is a combination where the flag changed nothing before (read off the code paths
by hand: e.g. ``--per-request`` was never written on the ``--explain`` path); the test
asks for exit status 2, the flag's field, and a message naming the flag and the flag that
makes it moot."""
from __future__ import annotations

from pathlib import Path

import pytest

from radixkv.cli import main

DEMO = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
POOL = ["--capacity-tokens", "20000", "--quiet", "--limit", "30"]
CONC = ["--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB"]
MODEL = ["--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--quiet", "--limit", "30"]


def _replay(*extra, policy="vllm:16", pool=POOL):
    return ["replay", DEMO, "--policy", policy, *pool, *extra]


# (argv, field, the two flags the message must name)
CASES = [
    (_replay("--explain", "enterprise:1:0", "--per-request", "OUT.csv"), "per_request", ("--per-request", "--explain")),
    (_replay("--explain", "enterprise:1:0", "--report", "OUT.html"), "report", ("--report", "--explain")),
    (_replay("--explain", "enterprise:1:0", "--miss-fix"), "miss_fix", ("--miss-fix", "--explain")),
    (_replay("--explain", "enterprise:1:0", "--miss-fix", *CONC), "miss_fix", ("--miss-fix", "--explain")),
    (_replay("--explain", "enterprise:1:0", "--timeline", "T.csv", *CONC), "timeline", ("--timeline", "--explain")),
    (_replay("--verify", policy="sglang:1"), "verify", ("--verify", "--policy sglang:1")),
    (_replay("--verify", "--replicas", "2"), "verify", ("--verify", "--replicas")),
    (_replay("--max-tree-tokens", "100"), "max_tree_tokens", ("--max-tree-tokens", "--replicas")),
    (_replay("--max-tree-tokens", "100", "--replicas", "2", "--router", "least-load"), "max_tree_tokens",
     ("--max-tree-tokens", "--router prefix-aware")),
    (_replay("--cache-threshold", "0.5", "--replicas", "2"), "cache_threshold",
     ("--cache-threshold", "--router prefix-aware")),
    (_replay("--balance-abs-threshold", "3", "--replicas", "2", "--router", "random"), "balance_abs_threshold",
     ("--balance-abs-threshold", "--router prefix-aware")),
    (_replay("--balance-rel-threshold", "3"), "balance_rel_threshold", ("--balance-rel-threshold", "--replicas")),
    (_replay("--router-seed", "4", "--replicas", "2"), "router_seed", ("--router-seed", "--router random")),
    (_replay("--router-load-window", "5", "--replicas", "2", "--router", "round-robin"), "router_load_window",
     ("--router-load-window", "--router")),
    (_replay("--router", "session", "--replicas", "1"), "router", ("--router", "--replicas 1")),
    (_replay("--kv-pool", "global", "--replicas", "1"), "kv_pool", ("--kv-pool", "--replicas 1")),
    (_replay("--seed", "2", "--replicas", "2", "--router", "random", *CONC), "seed", ("--seed", "--router-seed")),
    (["compare", DEMO, "--policies", "vllm:16,sglang:1", *POOL, "--replicas", "2", "--executor", "processes"],
     "replicas", ("--replicas", "--executor processes")),
    (["compare", DEMO, "--policies", "vllm:16,sglang:1", *POOL, "--replicas", "2", "--report", "R.html"],
     "report", ("--report", "--replicas", "--mode concurrent")),
    (["curve", DEMO, "--policies", "unit-lru", "--capacities", "1e3,1e4", "--quiet", "--out", "x.png"],
     "out", ("--out", "x.png.png", "--out x")),
    (["curve", DEMO, "--policies", "unit-lru", "--capacities", "1e3,1e4", "--quiet", "--out", "sub/y.json"],
     "out", ("--out", "sub/y.json.json", "--out sub/y")),
    (_replay("--tp", "2"), "tp", ("--tp", "--model")),
    (_replay("--max-num-batched-tokens", "512"), "max_num_batched_tokens",
     ("--max-num-batched-tokens", "--mode concurrent")),
    (_replay("--mem-fraction-static", "0.5", policy="sglang:1", pool=MODEL), "mem_fraction_static",
     ("--mem-fraction-static", "gpu_memory_utilization")),
    (_replay("--burstiness", "2", *CONC), "burstiness", ("--burstiness", "--arrival gamma")),
    (_replay("--seed", "2", *CONC), "seed", ("--seed", "--arrival trace")),
    (_replay("--time-scale", "2", "--arrival", "poisson", "--request-rate", "5", *CONC), "time_scale",
     ("--time-scale", "--arrival poisson")),
    (_replay("--storage-cache-tokens", "1000", policy="sglang-hicache:1"), "storage_cache_tokens",
     ("--storage-cache-tokens", "--hicache-storage-backend")),
    (_replay("--hicache-storage-prefetch-policy", "wait_complete", policy="sglang-hicache:1"),
     "hicache_storage_prefetch_policy", ("--hicache-storage-prefetch-policy", "--hicache-storage-backend")),
    (["compare", DEMO, "--policies", "vllm:16,sglang:1", *POOL, "--per-engine-rule"], "per_engine_rule",
     ("--per-engine-rule", "--model")),
    (["compare", DEMO, "--policies", "vllm:16,sglang:1", *MODEL, "--mem-fraction-static", "0.5"],
     "mem_fraction_static", ("--mem-fraction-static", "--per-engine-rule")),
    (["compare", DEMO, "--policies", "vllm:16", *MODEL, "--per-engine-rule", "--mem-fraction-static", "0.5"],
     "mem_fraction_static", ("--mem-fraction-static", "vllm:16")),
    (["compare", DEMO, "--policies", "sglang:1", *MODEL, "--per-engine-rule", "--gpu-memory-utilization", "0.5"],
     "gpu_memory_utilization", ("--gpu-memory-utilization", "--per-engine-rule")),
    (["curve", DEMO, "--policies", "vllm:16", "--capacities", "20000", "--quiet", "--metric", "mean_request_hit_ratio"],
     "metric", ("--metric", "--out")),
    (["curve", DEMO, "--policies", "vllm:16", "--capacities", "20000", "--quiet", "--workers", "2"],
     "workers", ("--workers", "--executor")),
]


@pytest.mark.parametrize("argv,field,flags", CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_moot_flag_is_refused_naming_both_flags(argv, field, flags, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # any output path a case names would land here (none may be written)
    assert main(argv) == 2
    err = capsys.readouterr().err
    # the command line names the flag, not its destination (field)
    assert f"--{field.replace('_', '-')}" in err and f"field '{field}'" not in err
    for f in flags:
        assert f in err, (f, err)
    assert list(tmp_path.iterdir()) == []


def test_the_flags_still_work_where_they_take_effect(capsys, tmp_path):
    # the same flags in the combinations where they are read: exit 0
    ok = [
        _replay("--replicas", "2", "--router", "prefix-aware", "--max-tree-tokens", "100", "--cache-threshold", "0.5"),
        _replay("--replicas", "2", "--router", "random", "--router-seed", "4"),
        _replay("--burstiness", "2", "--seed", "3", "--arrival", "gamma", "--request-rate", "5", *CONC),
        _replay("--tp", "2", "--max-num-batched-tokens", "4096", pool=MODEL),
        ["compare", DEMO, "--policies", "vllm:16,sglang:1", *MODEL, "--per-engine-rule", "--mem-fraction-static",
         "0.5"],
        ["curve", DEMO, "--policies", "vllm:16", "--capacities", "20000", "--quiet", "--limit", "30",
         "--metric", "mean_request_hit_ratio", "--out", str(tmp_path / "c")],
    ]
    for argv in ok:
        assert main(argv) == 0, (argv, capsys.readouterr().err)


def test_verify_reaches_the_policy_in_the_concurrent_replay(monkeypatch, capsys):
    # --verify was dropped by --mode concurrent (the policy was built without it)
    from radixkv.policies import registry
    import radixkv.replay.run as run_mod
    import radixkv.replay.spec as spec_mod

    seen = []
    real = registry.build_policy

    def spy(spec, pool, **kw):
        pol = real(spec, pool, **kw)
        seen.append(getattr(pol, "verify", None))
        return pol

    monkeypatch.setattr(registry, "build_policy", spy)
    monkeypatch.setattr(run_mod, "build_policy", spy)  # the library's own imports
    monkeypatch.setattr(spec_mod, "build_policy", spy)
    assert main(_replay("--verify", *CONC)) == 0
    assert seen and all(v is True for v in seen)


def test_host_curve_refuses_host_zero_with_an_l3_store(capsys, tmp_path):
    # host 0 turns the host tier off; the file store sits behind it: refused before any replay
    rc = main(["curve", DEMO, "--policies", "sglang-hicache:1", "--capacities", "20000", "--host-capacities",
               "0,20000", "--hicache-storage-backend", "file", "--quiet", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "field 'host_capacities'" not in err and "--host-capacities 0" in err and "--hicache-storage-backend" in err
    assert list(tmp_path.iterdir()) == []


def test_model_alone_beside_an_explicit_pool_gives_host_tier_bytes(capsys, tmp_path):
    # docs/hicache.md: bytes = tokens x KV bytes per token per TP rank. Llama-3.1-8B bf16:
    # 32 layers x 8 KV heads x 128 head dim x 2 (K and V) x 2 bytes = 131,072 B per token.
    import json

    out = tmp_path / "r.json"
    assert main(["replay", DEMO, "--policy", "sglang-hicache:1@host_tokens=20000", "--capacity-tokens", "20000",
                 "--limit", "60", "--model", "Llama-3.1-8B", "--quiet", "--json", str(out)]) == 0
    s = json.loads(out.read_text())["results"][0]["summary"]
    assert s["gpu_to_host_tokens"] > 0
    assert s["gpu_to_host_bytes"] == s["gpu_to_host_tokens"] * 32 * 8 * 128 * 2 * 2
    # --gpu there would only size a pool: refused, naming it
    assert main(["replay", DEMO, "--policy", "sglang-hicache:1@host_tokens=20000", "--capacity-tokens", "20000",
                 "--limit", "60", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--gpu" in err and "field 'gpu'" not in err
    # a policy without a host tier reads nothing of --model in the sequential replay
    assert main(["replay", DEMO, "--policy", "sglang:1", "--capacity-tokens", "20000", "--limit", "60",
                 "--model", "Llama-3.1-8B", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and "field 'model'" not in err


def test_compare_replicas_report_names_only_the_flag_given(capsys, tmp_path):
    # compare --replicas --executor processes without --report: the refusal names the executor, not --report
    assert main(["compare", DEMO, "--policies", "vllm:16", *POOL, "--replicas", "2", "--executor", "processes"]) == 2
    assert "--report" not in capsys.readouterr().err


def test_compare_concurrent_replicas_writes_the_report(capsys, tmp_path):
    # README: with --mode concurrent, --replicas N takes --report (replay and compare alike)
    page = tmp_path / "r.html"
    assert main(["compare", DEMO, "--policies", "vllm:16,sglang:16", *POOL, *CONC, "--replicas", "2",
                 "--report", str(page)]) == 0, capsys.readouterr().err
    html = page.read_text()
    # one per-request table per policy, each labelled with its replicas (30 requests each)
    assert "vllm:16 x2 round-robin" in html and "sglang:16 x2 round-robin" in html
