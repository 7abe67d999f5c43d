"""Where a concurrent replay's step knobs came from (``scheduler`` in its summary/JSON, the
``steps:`` line), vLLM's refusal of ``max_num_batched_tokens < max_num_seqs``, vLLM's
profiling-pass tokens in ``radixkv memory --json``, and the grid's routing checks.

Expected values by hand: vLLM ``EngineArgs.get_batch_defaults`` (OpenAI server) gives
2048 / 256 on an A100 and 8192 / 1024 on an H100 (≥ 70 GiB, not an A100); SGLang's
``chunked_prefill_size`` on an H100 (< 160 GiB) is 8192, its ``max_running_requests``
assumed 2048; an explicit pool runs 8192 / 256. vLLM refuses ``max_num_batched_tokens <
max_num_seqs`` (``vllm/config/scheduler.py :: SchedulerConfig.verify_max_model_len``);
SGLang has no such check.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.errors import ConfigError
from radixkv.flags.replay import add_replay_flags
from radixkv.replay.settings import concurrent_config_from_args, step_knobs

DEMO = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
M8 = ["--model", "Llama-3.1-8B"]


def _args(*argv):
    p = argparse.ArgumentParser()
    add_replay_flags(p)
    return p.parse_args([DEMO, "--policy", "vllm:16", "--mode", "concurrent", *M8, *argv])


@pytest.mark.parametrize("argv, rule, want", [
    (["--gpu", "H100-80GB"], "vllm", (8192, 1024, "engine default for H100-80GB")),
    (["--gpu", "H100"], "sglang", (8192, 2048, "engine default for H100-80GB; max_num_seqs assumed")),
    (["--gpu", "A100-80GB", "--capacity-tokens", "20000"], "vllm", (8192, 256, "radixkv default")),
    (["--gpu", "A100-80GB", "--max-num-batched-tokens", "4096", "--max-num-seqs", "64"], "vllm",
     (4096, 64, "given")),
    (["--gpu", "A100-80GB", "--max-num-seqs", "64"], "vllm",
     (2048, 64, "max_num_seqs given, max_num_batched_tokens engine default for A100-80GB")),
    (["--gpu", "H100-80GB", "--max-num-batched-tokens", "4096"], "sglang",
     (4096, 2048, "max_num_batched_tokens given, max_num_seqs engine default for H100-80GB, assumed")),
])
def test_step_knobs_say_where_they_came_from(argv, rule, want):
    assert step_knobs(_args(*argv), rule) == want


@pytest.mark.parametrize("argv, field, words", [
    # A100: 2048 tokens by default, below 4096 requests
    (["--gpu", "A100-80GB", "--max-num-seqs", "4096"], "max_num_seqs",
     ["--max-num-seqs 4096", "max_num_batched_tokens 2048 (engine default for A100-80GB)"]),
    # H100: 1024 requests by default, above a 512-token step
    (["--gpu", "H100-80GB", "--max-num-batched-tokens", "512"], "max_num_batched_tokens",
     ["--max-num-batched-tokens 512", "max_num_seqs 1024 (engine default for H100-80GB)"]),
    (["--gpu", "H100-80GB", "--max-num-batched-tokens", "100", "--max-num-seqs", "101"], "max_num_batched_tokens",
     ["--max-num-batched-tokens 100", "--max-num-seqs 101"]),
])
def test_vllm_refuses_a_step_budget_below_the_running_cap(argv, field, words):
    with pytest.raises(ConfigError) as e:
        concurrent_config_from_args(_args(*argv))
    assert e.value.field == field
    for w in words:
        assert w in str(e.value)


def test_equal_budget_and_sglang_rules_pass():
    c = concurrent_config_from_args(_args("--gpu", "H100-80GB", "--max-num-batched-tokens", "256",
                                          "--max-num-seqs", "256"))
    assert (c.max_num_batched_tokens, c.max_num_seqs) == (256, 256)
    # SGLang has no such check: a 100-token step under its 2048 requests runs
    c = concurrent_config_from_args(_args("--gpu", "H100-80GB", "--max-num-batched-tokens", "100"), rule="sglang")
    assert (c.max_num_batched_tokens, c.max_num_seqs) == (100, 2048)


def test_the_cli_refuses_it_before_reading_the_trace(capsys):
    assert main(["replay", "no-such-trace.jsonl", "--policy", "vllm:16", "--mode", "concurrent", *M8,
                 "--gpu", "A100-80GB", "--max-num-seqs", "4096"]) == 2
    err = capsys.readouterr().err
    # refused on the flags alone: the missing trace is never looked at
    assert "--max-num-seqs 4096" in err and "no such file" not in err


def test_replay_json_and_text_carry_the_scheduler(capsys):
    assert main(["replay", DEMO, "--policy", "vllm:16", "--mode", "concurrent", *M8, "--gpu", "A100-80GB",
                 "--capacity-tokens", "20000", "--limit", "20", "--no-timing", "--json", "-"]) == 0
    cap = capsys.readouterr()
    sc = json.loads(cap.out)["results"][0]["summary"]["scheduler"]
    assert sc == {"rule": "vllm", "max_num_batched_tokens": 8192, "max_num_seqs": 256, "source": "radixkv default"}
    assert "steps: vllm rules, max_num_batched_tokens 8,192, max_num_seqs 256 (radixkv default)" in cap.err


def test_report_has_a_steps_provenance_row(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["replay", DEMO, "--policy", "sglang:1", "--mode", "concurrent", *M8, "--gpu", "H100-80GB",
                 "--max-total-num-tokens", "20000", "--max-num-seqs", "64", "--limit", "20", "--quiet",
                 "--report", str(out)]) == 0
    page = out.read_text()
    assert ("<th>  steps of sglang:1</th><td>sglang rules, max_num_batched_tokens 8192, max_num_seqs 64 "
            "(max_num_seqs given, max_num_batched_tokens radixkv default)</td>") in page


def test_library_config_reads_given_and_none_reads_the_default():
    import radixkv
    from radixkv.replay.scheduler import SchedulerConfig

    kw = dict(capacity_tokens=20000, mode="concurrent", model="Llama-3.1-8B", gpu="A100-80GB", limit=10)
    r = radixkv.replay(DEMO, "vllm:16", **kw)
    assert r.summary()["scheduler"] == {"rule": "vllm", "max_num_batched_tokens": 8192, "max_num_seqs": 256,
                                        "source": "radixkv default"}
    r = radixkv.replay(DEMO, "vllm:16", config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), **kw)
    assert r.summary()["scheduler"] == {"rule": "vllm", "max_num_batched_tokens": 64, "max_num_seqs": 4,
                                        "source": "given"}


@pytest.mark.parametrize("gpu, extra, want", [
    ("A100-80GB", [], (2048, "engine default for A100-80GB")),
    ("H100-80GB", [], (8192, "engine default for H100-80GB")),
    ("A100-80GB", ["--max-num-batched-tokens", "4096"], (4096, "given (--max-num-batched-tokens)")),
])
def test_memory_json_gives_the_profiling_pass(capsys, gpu, extra, want):
    assert main(["memory", *M8, "--gpu", gpu, "--engine", "vllm", *extra, "--json", "-"]) == 0
    v = json.loads(capsys.readouterr().out)["pools"]["vllm"]
    assert (v["profile_tokens"], v["profile_tokens_source"]) == want


def _grid(tmp_path, body):
    from radixkv.sweep.grid import load_grid

    g = tmp_path / "g.toml"
    g.write_text(f'traces = "{DEMO}"\npolicies = "vllm:16"\ncapacity_tokens = 20000\n{body}\n')
    return g, load_grid


@pytest.mark.parametrize("body, field, line", [
    ('router = "round-robin"', "router", 4),
    ('kv_pool = "global"', "kv_pool", 4),
    ('mode = "concurrent"\nmodel = "Llama-3.1-8B"\ngpu = "H100"\nreplicas = 2\nkv_pool = "global"', "kv_pool", 8),
    ('mode = "concurrent"\nmodel = "Llama-3.1-8B"\ngpu = "H100"\nreplicas = 1\nkv_pool = "global"', "kv_pool", 8),
])
def test_grid_refuses_routing_the_replay_would_refuse(tmp_path, body, field, line):
    g, load = _grid(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load(g)
    assert (e.value.path, e.value.line, e.value.field) == (str(g), line, field)


def test_grid_exit_2_names_file_line_and_key(tmp_path, capsys):
    g, _ = _grid(tmp_path, 'router = "round-robin"')
    assert main(["sweep", str(g), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(g) in err and "line 4" in err and "router" in err and "replicas" in err


def test_sweep_show_reads_a_sequential_cells_max_num_seqs_as_na():
    from radixkv.sweep.show import _fmt_knob, setting

    seq = {"settings": {"policy": "vllm:16", "capacity_tokens": 20000}}
    conc = {"settings": {"policy": "vllm:16", "mode": "concurrent", "model": "Llama-3.1-8B", "gpu": "H100-80GB"}}
    assert setting(seq, "max_num_seqs") is None and _fmt_knob(setting(seq, "max_num_seqs")) == "n/a"
    assert setting(conc, "max_num_seqs") == 1024
