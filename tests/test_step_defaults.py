"""The concurrent scheduler's step knobs when ``--max-num-batched-tokens`` / ``--max-num-seqs``
are not given: on a pool sized by the memory model on ``--gpu``, what the engine's server
runs with on that GPU; on an explicit pool, 8192 tokens / 256 requests as before.

Expected values by hand from the engines' rules (not from radixkv's tables):

- vLLM ``EngineArgs.get_batch_defaults`` (OpenAI server): ≥ 160 GiB → 16384 / 1024;
  ≥ 70 GiB and not an A100 → 8192 / 1024; otherwise 2048 / 256. A100-80GB (81,920 MiB,
  an A100) → 2048 / 256; H100-80GB (81,559 MiB = 79.6 GiB) → 8192 / 1024; H200-141GB
  (143,771 MiB = 140.4 GiB, under 160) → 8192 / 1024; B200 (183,359 MiB = 179.1 GiB) →
  16384 / 1024; T4 (15 GiB) → 2048 / 256.
- SGLang ``handle_gpu_memory_settings``: ``chunked_prefill_size`` < 20 GiB 2048, < 60 GiB
  4096, < 160 GiB 8192, else 16384 — T4 2048, L40S (45 GiB) 4096, A100-80GB 8192, B200
  16384; SGLang's ``max_running_requests`` is derived from its pool (2048 to 4096,
  ``_resolve_max_num_reqs``), so ``max_num_seqs`` under SGLang's rules is the value
  ``radixkv plan`` assumes for it, 2048 (its floor).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.flags.replay import add_replay_flags
from radixkv.replay.settings import concurrent_config_from_args

M8 = ["--model", "Llama-3.1-8B"]


def _config(*argv, rule=None):
    p = argparse.ArgumentParser()
    add_replay_flags(p)
    args = p.parse_args(["traces/demo.jsonl", "--policy", "vllm:16", "--mode", "concurrent", *M8, *argv])
    if rule is not None:
        args.admission = rule
    c = concurrent_config_from_args(args)
    return c.max_num_batched_tokens, c.max_num_seqs


@pytest.mark.parametrize("gpu, want", [("A100-80GB", (2048, 256)), ("H100-80GB", (8192, 1024)),
                                       ("H200-141GB", (8192, 1024)), ("B200", (16384, 1024)),
                                       ("T4", (2048, 256))])
def test_vllm_rules_follow_vllm_serve_on_the_gpu(gpu, want):
    assert _config("--gpu", gpu) == want


@pytest.mark.parametrize("gpu, tokens", [("T4", 2048), ("L40S", 4096), ("A100-80GB", 8192), ("B200", 16384)])
def test_sglang_rules_take_chunked_prefill_size_and_2048_requests(gpu, tokens):
    assert _config("--gpu", gpu, rule="sglang") == (tokens, 2048)


def test_explicit_flags_win_one_by_one():
    assert _config("--gpu", "H100-80GB", "--max-num-batched-tokens", "4096") == (4096, 1024)
    assert _config("--gpu", "H100-80GB", "--max-num-seqs", "64") == (8192, 64)
    assert _config("--gpu", "A100-80GB", "--max-num-batched-tokens", "8192", "--max-num-seqs", "512") == (8192, 512)


@pytest.mark.parametrize("pool", [["--capacity-tokens", "20000"], ["--num-gpu-blocks", "2000"],
                                  ["--max-total-num-tokens", "20000"]])
@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-80GB", "B200"])
def test_an_explicit_pool_keeps_8192_and_256(pool, gpu):
    # --gpu only prices the steps here: the pool is not the GPU's
    assert _config("--gpu", gpu, *pool) == (8192, 256)
    assert _config("--gpu", gpu, *pool, rule="sglang") == (8192, 256)


def test_no_gpu_keeps_8192_and_256():
    assert concurrent_config_from_args(argparse.Namespace()).max_num_batched_tokens == 8192
    assert concurrent_config_from_args(argparse.Namespace()).max_num_seqs == 256


def _json(capsys, verb, *argv):
    # agent_tools: prompts of up to 11,288 tokens, so a 2048-token step differs from 8192
    pol = ["--policy", "vllm:16"] if verb == "replay" else ["--policies", "vllm:16,vllm:32"]
    assert main([verb, "traces/agent_tools.jsonl", *pol, "--mode", "concurrent", *M8, "--limit", "20",
                 "--no-timing", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def _sourceless(doc):
    """*doc* with each result's ``scheduler.source`` taken out (returned in a list)."""
    sources = []
    for r in doc["results"]:
        sources.append(r["summary"]["scheduler"].pop("source"))
    return doc, sources


@pytest.mark.parametrize("verb", ["replay", "compare"])
def test_replay_json_equals_the_explicit_knobs(capsys, verb):
    a, src_a = _sourceless(_json(capsys, verb, "--gpu", "A100-80GB"))
    g, src_g = _sourceless(_json(capsys, verb, "--gpu", "A100-80GB", "--max-num-batched-tokens", "2048",
                                 "--max-num-seqs", "256"))
    assert a == g  # the same replay; only where the knobs came from differs
    assert set(src_a) == {"engine default for A100-80GB"} and set(src_g) == {"given"}
    # the same pool with 8192-token steps (the old default) schedules otherwise
    blocks = str(a["results"][0]["pool"]["num_gpu_blocks"])
    b, _ = _sourceless(_json(capsys, verb, "--gpu", "A100-80GB", "--num-gpu-blocks", blocks,
                             "--max-num-batched-tokens", "2048"))
    c, _ = _sourceless(_json(capsys, verb, "--gpu", "A100-80GB", "--num-gpu-blocks", blocks,
                             "--max-num-batched-tokens", "8192"))
    assert b["results"][0]["summary"] == a["results"][0]["summary"] != c["results"][0]["summary"]


def test_sweep_cell_runs_the_gpu_defaults():
    from radixkv.sweep.cell import replay_cell
    from radixkv.trace.load import load_trace

    tr = load_trace("traces/agent_tools.jsonl").head(20)
    cell = {"policy": "vllm:16", "mode": "concurrent", "model": "Llama-3.1-8B", "gpu": "A100-80GB"}
    a = replay_cell(tr, cell)["metrics"]
    g = replay_cell(tr, {**cell, "max_num_batched_tokens": 2048, "max_num_seqs": 256})["metrics"]
    assert (a["scheduler"].pop("source"), g["scheduler"].pop("source")) == ("engine default for A100-80GB", "given")
    assert a == g


def test_grid_keeps_max_num_seqs_unless_256_is_the_cells_default():
    from radixkv.sweep.grid import drops_setting, omitted_value

    base = {"policy": "vllm:16", "mode": "concurrent", "model": "Llama-3.1-8B"}
    a100, h100 = {**base, "gpu": "A100-80GB"}, {**base, "gpu": "H100-80GB"}
    assert omitted_value(a100, "max_num_seqs") == 256
    assert omitted_value(h100, "max_num_seqs") == 1024
    assert omitted_value({**h100, "capacity_tokens": 20000}, "max_num_seqs") == 256
    assert omitted_value({**h100, "admission": "sglang"}, "max_num_seqs") == 2048  # SGLang's, assumed
    assert omitted_value({"policy": "vllm:16"}, "max_num_seqs") == 256
    # 256 is left out where the cell runs 256 without it; on an H100's pool it is not
    assert drops_setting({**a100, "max_num_seqs": 256}, "max_num_seqs")
    assert not drops_setting({**h100, "max_num_seqs": 256}, "max_num_seqs")
    assert drops_setting({**h100, "capacity_tokens": 20000, "max_num_seqs": 256}, "max_num_seqs")
    assert not drops_setting({**a100, "max_num_seqs": 64}, "max_num_seqs")


def test_grid_cells_on_an_h100_keep_256(tmp_path):
    from radixkv.sweep.grid import load_grid

    g = tmp_path / "g.toml"
    g.write_text('traces = ["%s"]\npolicies = "vllm:16"\nmode = "concurrent"\nmodel = "Llama-3.1-8B"\n'
                 'gpu = ["A100-80GB", "H100-80GB"]\nmax_num_seqs = [256, 1024]\n'
                 % (Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl"))
    got = sorted((c.settings["gpu"], c.settings.get("max_num_seqs", 0)) for c in load_grid(g).cells)
    assert got == [("A100-80GB", 0), ("A100-80GB", 1024), ("H100-80GB", 256), ("H100-80GB", 1024)]


def test_sequential_refuses_an_explicit_max_num_seqs(capsys):
    # the flag's default is "not given" now: 256 given in a sequential replay is refused too
    assert main(["replay", "traces/demo.jsonl", "--policy", "vllm:16", "--capacity-tokens", "20000",
                 "--max-num-seqs", "256"]) == 2
    assert "--max-num-seqs applies to the concurrent replay only" in capsys.readouterr().err
