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
