"""``radixkv.memory.startup_log`` and ``--pool-from-log``: the pool read from an engine's
start-up log (small synthetic logs in tests/data/logs/, values worked out by hand)."""
from __future__ import annotations

import json

import pytest

from conftest import DATA
from radixkv.cli import main
from radixkv.errors import InputError
from radixkv.memory.pool import parse_version, vllm_version_rules
from radixkv.memory.startup_log import parse_startup_log, read_startup_log

LOGS = DATA / "logs"
MIXED = str(DATA / "golden" / "traces" / "mixed200.jsonl")


def test_vllm_v1_tokens_line():
    lp = read_startup_log(LOGS / "vllm_v1_synthetic.log")
    # 81,920 tokens / block_size 16 = 5,120 blocks (8,192 is a multiple of 16); block 0 null
    assert (lp.engine, lp.line, lp.num_gpu_blocks) == ("vllm", 3, 5120)
    assert lp.capacity_tokens == 5119 * 16
    assert lp.kv_cache_gib == 10.0
    assert lp.max_model_len == 8192
    assert lp.engine_version == "0.11.0"


def test_vllm_v0_gpu_blocks_line():
    lp = read_startup_log(LOGS / "vllm_v0_synthetic.log")
    assert (lp.engine, lp.line, lp.num_gpu_blocks, lp.capacity_tokens) == ("vllm", 2, 507, 506 * 16)


def test_vllm_concurrency_derived_tokens_recover_blocks():
    # max_model_len 1,000 → ceil(1000/16) = 63 blocks per request; 63 blocks give
    # concurrency 1.00 and int(1.0 × 1000) = 1,000 tokens logged, not 63 × 16 = 1,008
    lp = read_startup_log(LOGS / "vllm_new_concurrency.log")
    assert lp.num_gpu_blocks == 63
    assert lp.capacity_tokens == 62 * 16


def test_vllm_block_size_from_log_and_error_when_not_whole_blocks():
    lp = parse_startup_log("x block_size=32 y\nGPU KV cache size: 3,200 tokens\n")
    assert (lp.unit_tokens, lp.num_gpu_blocks) == (32, 100)
    with pytest.raises(InputError) as e:
        parse_startup_log("GPU KV cache size: 1,001 tokens\n", path="a.log")
    assert "a.log" in str(e.value) and "line 1" in str(e.value)


def test_sglang_prefers_scheduler_line_and_reads_page_size():
    lp = read_startup_log(LOGS / "sglang_synthetic.log")
    assert (lp.engine, lp.line, lp.max_total_num_tokens, lp.unit_tokens) == ("sglang", 3, 100000, 16)
    assert lp.capacity_tokens == 100000
    assert lp.kv_cache_gib == pytest.approx(12.2)


def test_sglang_mla_kv_size_line_and_ansi():
    lp = parse_startup_log("\x1b[32m[x] KV Cache is allocated. dtype: torch.bfloat16, "
                           "#tokens: 1234, KV size: 0.08 GB\x1b[0m\n")
    assert (lp.engine, lp.max_total_num_tokens, lp.kv_cache_gib) == ("sglang", 1234, 0.08)


def test_no_pool_line_is_a_located_error(tmp_path):
    with pytest.raises(InputError) as e:
        read_startup_log(LOGS / "no_pool.log")
    msg = str(e.value)
    assert "no_pool.log" in msg and "no such line" in msg
    with pytest.raises(InputError) as e:
        read_startup_log(tmp_path / "missing.log")
    assert "missing.log" in str(e.value)
    with pytest.raises(InputError):
        parse_startup_log((LOGS / "vllm_v0_synthetic.log").read_text(), engine="sglang")


def test_version_rules():
    assert parse_version("v0.10.1rc1") == (0, 10, 1)
    assert vllm_version_rules("0.9.2")["gpu_memory_utilization"] == 0.9
    assert vllm_version_rules("0.9.2")["cuda_graphs_in_budget"] is False
    assert vllm_version_rules("0.21.0")["cuda_graphs_in_budget"] is True
    assert vllm_version_rules()["gpu_memory_utilization"] == 0.92
    with pytest.raises(InputError):
        parse_version("latest")


def test_replay_pool_from_log_matches_real_vllm(tmp_path, capsys):
    log = tmp_path / "vllm.log"
    log.write_text("INFO x] # GPU blocks: 120, # CPU blocks: 0\n")
    out = tmp_path / "r.json"
    assert main(["replay", MIXED, "--policy", "vllm:16", "--pool-from-log", str(log),
                 "--json", str(out), "--no-timing", "--quiet"]) == 0
    doc = json.loads(out.read_text())
    golden = [json.loads(x) for x in (DATA / "golden" / "vllm" / "vllm_mixed200_b16_n120.jsonl")
              .read_text().splitlines()]
    assert doc["results"][0]["summary"]["hit_tokens"] == sum(r["hit_tokens"] for r in golden)


def test_replay_pool_from_log_matches_real_sglang(tmp_path, capsys):
    log = tmp_path / "sglang.log"
    log.write_text("[t] max_total_num_tokens=1904, chunked_prefill_size=8192\n")
    out = tmp_path / "r.csv"
    assert main(["replay", MIXED, "--policy", "sglang:1", "--pool-from-log", str(log),
                 "--per-request", str(out), "--quiet"]) == 0
    rows = [line.split(",") for line in out.read_text().splitlines()][1:]
    golden = [json.loads(x) for x in (DATA / "golden" / "sglang" / "sglang_mixed200_p1_c1904.jsonl")
              .read_text().splitlines()]
    assert [int(r[2]) for r in rows] == [g["hit_tokens"] for g in golden]


def test_replay_pool_from_log_conflicts_and_missing_line(capsys):
    assert main(["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "1000",
                 "--pool-from-log", str(LOGS / "vllm_v0_synthetic.log")]) == 2
    assert "only one of" in capsys.readouterr().err
    assert main(["replay", MIXED, "--policy", "vllm", "--pool-from-log",
                 str(LOGS / "no_pool.log"), "--quiet"]) == 2
    assert "no_pool.log" in capsys.readouterr().err


def test_memory_pool_from_log_alone_and_against_model(capsys):
    assert main(["memory", "--pool-from-log", str(LOGS / "vllm_v0_synthetic.log"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["logged"]["num_gpu_blocks"] == 507 and "pools" not in r
    assert main(["memory", "--pool-from-log", str(LOGS / "sglang_synthetic.log"),
                 "--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--page-size", "16",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert list(r["pools"]) == ["sglang"]
    mod = r["pools"]["sglang"]["max_total_num_tokens"]
    assert r["logged"]["model_error_tokens"] == mod - 100000
    assert main(["memory", "--pool-from-log", str(LOGS / "vllm_v0_synthetic.log")]) == 0
    assert "507" in capsys.readouterr().out
