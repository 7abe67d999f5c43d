"""Moot flags of ``radixkv memory`` and ``radixkv trace synth`` are refused (exit 2, naming
the flag), as ``replay``'s are (radixkv.flags.moot); the same flags where they are read
still work."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cli import main

LOGS = Path(__file__).parent / "data" / "logs"
M = ["memory", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB"]


@pytest.mark.parametrize("argv, flag", [
    (M + ["--engine", "sglang", "--block-size", "32"], "block_size"),
    (M + ["--mem-fraction-static", "0.8", "--block-size", "32"], "block_size"),
    (M + ["--engine", "vllm", "--page-size", "16"], "page_size"),
    (M + ["--gpu-memory-utilization", "0.9", "--page-size", "16"], "page_size"),
    (M + ["--engine", "sglang", "--max-num-batched-tokens", "4096"], "max_num_batched_tokens"),
    (["memory", "--pool-from-log", str(LOGS / "sglang_synthetic.log"), "--block-size", "32"], "block_size"),
    (["memory", "--pool-from-log", str(LOGS / "vllm_v1_synthetic.log"), "--tp", "2"], "tp"),
    (["memory", "--pool-from-log", str(LOGS / "vllm_v1_synthetic.log"), "--page-size", "16"], "page_size"),
    (["memory", "--pool-from-log", str(LOGS / "vllm_v1_synthetic.log"), "--engine", "sglang"], "engine"),
])
def test_memory_refuses_a_flag_the_shown_pool_does_not_read(argv, flag, capsys):
    assert main(argv + ["--json", "-"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert f"field '{flag}'" not in cap.err and f"--{flag.replace('_', '-')}" in cap.err


def test_memory_size_flags_still_reach_the_pool_that_reads_them(capsys):
    # both pools shown: --block-size reaches vLLM's, --page-size SGLang's (units of each pool)
    assert main(M + ["--block-size", "32", "--page-size", "16", "--max-num-batched-tokens", "4096",
                     "--json", "-"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["pools"]["vllm"]["unit_tokens"] == 32 and r["pools"]["sglang"]["unit_tokens"] == 16
    # a vLLM log read beside SGLang's pool: --block-size converts the log's blocks, so it is read
    assert main(M + ["--engine", "sglang", "--pool-from-log", str(LOGS / "vllm_v1_synthetic.log"),
                     "--block-size", "16", "--json", "-"]) == 0


@pytest.mark.parametrize("arrival", [[], ["--arrival", "poisson"]])
def test_synth_refuses_cv_without_gamma_arrivals(tmp_path, capsys, arrival):
    out = tmp_path / "t.jsonl"
    assert main(["trace", "synth", "customer_service", "--requests", "4", "--seed", "1", "--cv", "3",
                 *arrival, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--cv" in err and "field 'cv'" not in err and "--arrival gamma" in err
    assert list(tmp_path.iterdir()) == []


def test_synth_cv_changes_gamma_arrivals(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out, cv in ((a, "0.5"), (b, "3")):
        assert main(["trace", "synth", "customer_service", "--requests", "30", "--seed", "1", "--arrival", "gamma",
                     "--cv", cv, "--out", str(out)]) == 0
    assert a.read_bytes() != b.read_bytes()
