"""Bad flag combinations and bad check configurations are refused before any work: no trace
loaded, no kernel compiled (the fresh-user trial waited 48 s for sglang:1's kernels to
compile before ``--enable-priority-scheduling`` without ``--disable-priority-preemption`` was
refused), and the message names the flags."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import radixkv.cli.replay_cmd as replay_cmd
import radixkv.replay.run as run_mod
from radixkv.cli import main

DEMO = str(Path(__file__).parent.parent / "traces" / "demo.jsonl")
CONC = ["--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--capacity-tokens", "6000",
        "--quiet"]


class Reached(Exception):
    """Raised by the stubs: the command got past its flag checks."""


@pytest.fixture
def no_work(monkeypatch):
    """Loading the trace or compiling a kernel is a failure of the early refusal."""
    def stop(*a, **k):
        raise Reached

    monkeypatch.setattr(replay_cmd, "_load", stop)
    monkeypatch.setattr(run_mod, "warmup_many", stop)
    monkeypatch.setattr(run_mod, "warmup", stop)


@pytest.mark.parametrize("argv, flags", [
    # SGLang's priority scheduler without the flag radixkv needs (SGLang's priority preemption
    # is not modelled): refused naming the missing flag
    (["replay", DEMO, "--policy", "sglang:1", "--enable-priority-scheduling"],
     ["--disable-priority-preemption"]),
    (["compare", DEMO, "--policies", "vllm:16,sglang:1", "--scheduling-policy", "priority",
      "--enable-priority-scheduling"], ["--disable-priority-preemption"]),
    # an engine's knob where only the other engine's rules run
    (["replay", DEMO, "--policy", "vllm:16", "--enable-priority-scheduling", "--disable-priority-preemption"],
     ["--enable-priority-scheduling", "--scheduling-policy priority"]),
    (["compare", DEMO, "--policies", "sglang:1,sglang:16", "--scheduling-policy", "priority"],
     ["--scheduling-policy priority", "--enable-priority-scheduling"]),
    (["compare", DEMO, "--policies", "vllm:16,sglang:1", "--scheduling-policy", "priority", "--admission", "sglang"],
     ["--scheduling-policy priority", "--admission sglang"]),
    (["replay", DEMO, "--policy", "sglang:1", "--watermark", "0.1"], ["--watermark", "--admission sglang"]),
    # --no-enable-prefix-caching runs NoCache, under vLLM's rules: SGLang's flag is then moot
    (["replay", DEMO, "--policy", "sglang:1", "--no-enable-prefix-caching", "--enable-priority-scheduling",
      "--disable-priority-preemption"], ["--enable-priority-scheduling", "--scheduling-policy priority"]),
])
def test_scheduler_flag_conflicts_are_refused_before_any_work(argv, flags, no_work, capsys):
    assert main([*argv, *CONC]) == 2
    err = capsys.readouterr().err
    for f in flags:
        assert f in err, err


@pytest.mark.parametrize("argv", [
    ["compare", DEMO, "--policies", "vllm:16,sglang:1", "--scheduling-policy", "priority",
     "--enable-priority-scheduling", "--disable-priority-preemption"],
    ["replay", DEMO, "--policy", "sglang:1", "--enable-priority-scheduling", "--disable-priority-preemption",
     "--retraction-policy", "priority"],
    ["replay", DEMO, "--policy", "vllm:16", "--scheduling-policy", "priority", "--watermark", "0.1"],
    ["replay", DEMO, "--policy", "sglang:1", "--no-enable-prefix-caching", "--scheduling-policy", "priority"],
])
def test_valid_scheduler_flags_pass_the_early_check(argv, no_work):
    with pytest.raises(Reached):  # the command went on to load the trace
        main([*argv, *CONC])


def _tiny_trace(tmp_path) -> Path:
    lines = ['{"radixkv_trace": 1, "unit_tokens": 1, "partial_last_unit": false}',
             json.dumps({"id": "a", "tokens": list(range(1, 11)), "output_tokens": [1, 2], "arrival_s": 0}),
             json.dumps({"id": "big", "tokens": list(range(1, 41)), "output_tokens": [1, 2], "arrival_s": 1})]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("pool_line, why", [
    # request 'big': 40 prompt + 2 output tokens = 41 tokens of KV (the last sampled token has
    # none); a pool of 32 tokens is two 16-token blocks
    ("capacity_tokens = 32", "request 'big'"),
    ("capacity_tokens = 9", "holds no 16-token block"),  # less than one block
    ("capacity_tokens = 100_000_000_000", "slots radixkv models"),
])
def test_check_refuses_a_bad_pool_before_compiling_naming_its_line(tmp_path, monkeypatch, capsys, pool_line, why):
    _tiny_trace(tmp_path)
    cfg = tmp_path / "ci.toml"
    cfg.write_text('[[trace]]\npath = "t.jsonl"\n\n[[policy]]\npolicy = "vllm:16"\n'
                   f'{pool_line}\n\n[[assert]]\nmin_token_hit_rate = 0.1\n')  # the pool is on line 6

    def stop(*a, **k):
        raise Reached

    monkeypatch.setattr(run_mod, "warmup_many", stop)
    junit = tmp_path / "out.xml"
    assert main(["check", str(cfg), "--junit-xml", str(junit)]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}, line 6, field 'policy[1].capacity_tokens': trace 't': " in err, err
    assert why in err, err
    assert not junit.exists()


@pytest.mark.parametrize("body, line, field", [
    ('traces = ["t.jsonl"]\npolicies = ["vllm:16"]\ncapacity_tokens = [5000, "x"]\n', 3, "capacity_tokens"),
    ('traces = ["t.jsonl"]\npolicies = ["vllm:16"]\n\ncapacty_tokens = [5000]\n', 4, "capacty_tokens"),
    ('traces = ["t.jsonl"]\npolicies = ["vllm:16"]\ncapacity_tokens = []\n', 3, "capacity_tokens"),
    ('# a grid\ntraces = ["nosuch.jsonl"]\npolicies = ["vllm:16"]\ncapacity_tokens = [5000]\n', 2, "traces"),
    ('traces = ["t.jsonl"]\npolicies = ["nosuch:16"]\ncapacity_tokens = [5000]\n', 2, "policies"),
    ('[grid]\ntraces = ["t.jsonl"]\npolicies = ["vllm:16"]\ncapacity_tokens = [5000]\nreport = ["x.html"]\n', 5,
     "report"),
])
def test_sweep_grid_errors_name_the_line_of_the_key(tmp_path, capsys, body, line, field):
    _tiny_trace(tmp_path)
    grid = tmp_path / "g.toml"
    grid.write_text(body)
    assert main(["sweep", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{grid}, line {line}, field '{field}': " in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, flag", [
    (["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "20000", "--per-request", "-"], "--per-request"),
    (["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "20000", "--report", "-"], "--report"),
    (["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "20000", "--mode", "concurrent", "--model",
      "Llama-3.1-8B", "--gpu", "A100-80GB", "--timeline", "-"], "--timeline"),
    (["compare", DEMO, "--policies", "vllm:16", "--capacity-tokens", "20000", "--miss-plot", "-"], "--miss-plot"),
    (["curve", DEMO, "--policies", "vllm:16", "--capacities", "20000", "--out", "-"], "--out"),
    (["trace", "convert", DEMO, "-"], "OUT"),
    (["trace", "synth", "mix", "--requests", "5", "--seed", "1", "--out", "-"], "--out"),
    # two outputs on stdout at once
    (["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "20000", "--json", "-", "--per-request", "-"],
     "--per-request"),
])
def test_dash_is_stdout_or_refused_never_a_file_named_dash(tmp_path, monkeypatch, capsys, argv, flag):
    """``--json -`` prints on stdout; ``-`` for a CSV, HTML or PNG output wrote a file named
    ``-`` into the current folder (the trial's ``--per-request -``). Refused before any work."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} - would write a file named '-'" in err, err
    assert list(tmp_path.iterdir()) == []


def test_two_stdout_outputs_are_refused_naming_both(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = Path(__file__).parent.parent / "examples" / "check" / "demo.toml"
    assert main(["check", str(cfg), "--junit-xml", "-", "--markdown", "-"]) == 2
    err = capsys.readouterr().err
    assert "--markdown - and --junit-xml - would both print on stdout" in err, err
    assert list(tmp_path.iterdir()) == []
