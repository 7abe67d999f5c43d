"""Every file a verb writes is refused (exit 2, before any work) when it would replace a
file the verb reads, and every file is left byte-for-byte as it was (issue 31).

The inputs are hand-written stand-ins: the refusal happens before they are parsed, except
the check configuration and the sweep grid, which are read first to learn which traces,
golden files and baseline they name.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from radixkv.cli import main

TRACE = ('{"id":"a","tokens":[1,2,3,4,5,6,7,8],"output_length":2}\n'
         '{"id":"b","tokens":[1,2,3,4,9,9],"output_length":2}\n')


def _files(tmp: Path) -> dict:
    (tmp / "t.jsonl").write_text(TRACE)
    (tmp / "golden.jsonl").write_text('{"id":"a","hit_tokens":0}\n{"id":"b","hit_tokens":0}\n')
    (tmp / "base.json").write_text('{"radixkv": "0", "results": {}}\n')
    (tmp / "server.log").write_text("INFO # GPU blocks: 100\n")
    (tmp / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (tmp / "result.json").write_text('{"policy": "vllm:16", "token_hit_rate": 0.5}\n')
    (tmp / "grid.toml").write_text('traces = ["t.jsonl"]\npolicies = ["vllm:16"]\ncapacity_tokens = 64\n')
    (tmp / "sw" / "cells").mkdir(parents=True)
    (tmp / "sw" / "cells" / "k.jsonl").write_text('{"key": "k"}\n')
    return {p: p.read_bytes() for p in tmp.rglob("*") if p.is_file()}


def _check_config(tmp: Path, baseline: str = "base.json") -> str:
    (tmp / "c.toml").write_text(f'baseline = "{baseline}"\n[[trace]]\npath = "t.jsonl"\n[[policy]]\n'
                                f'policy = "vllm:16"\ncapacity_tokens = 64\n[[assert]]\n'
                                f'golden = "golden.jsonl"\n[assert.baseline]\ntoken_hit_rate = 0.01\n')
    return str(tmp / "c.toml")


# (argv before the output flag, the output flag, the inputs it is pointed at); "{x}" is tmp
_REPLAY_IN = ["t.jsonl", "server.log"]
WRITERS = [
    (["trace", "inspect", "{x}/t.jsonl"], "--json", ["t.jsonl"]),
    (["trace", "convert", "{x}/t.jsonl"], "", ["t.jsonl"]),  # positional OUT
    (["memory", "--pool-from-log", "{x}/server.log", "--model", "{x}/config.json"], "--json",
     ["server.log", "config.json"]),
    *[(["replay", "{x}/t.jsonl", "--policy", "vllm:16", "--pool-from-log", "{x}/server.log"], f, _REPLAY_IN)
      for f in ("--json", "--per-request", "--report")],
    (["replay", "{x}/t.jsonl", "--policy", "vllm:16", "--mode", "concurrent", "--model", "{x}/config.json", "--gpu", "H100",
      "--capacity-tokens", "64"], "--timeline", ["t.jsonl", "config.json"]),
    *[(["compare", "{x}/t.jsonl", "--policies", "vllm:16", "--pool-from-log", "{x}/server.log"], f, _REPLAY_IN)
      for f in ("--json", "--report", "--miss-plot")],
    *[(["curve", "{x}/t.jsonl", "--policies", "vllm:16", "--pool-from-log", "{x}/server.log", "--capacities", "64"], f, _REPLAY_IN)
      for f in ("--json", "--report")],
    (["curve", "{x}/result.json", "--policies", "vllm:16", "--capacities", "64"], "--out", ["result"]),  # PREFIX.json
    (["sweep", "{x}/grid.toml", "--out", "{x}/sw2"], "--report", ["grid.toml", "t.jsonl"]),
    (["sweep-plot", "{x}/sw"], "--out", ["sw/cells/k.jsonl"]),
    (["report", "{x}/result.json"], "--out", ["result.json"]),
    *[(["check", "{c}"], f, ["c.toml", "t.jsonl", "golden.jsonl", "base.json"])
      for f in ("--json", "--junit-xml", "--markdown", "--report")],
]
CASES = [(argv, flag, target) for argv, flag, targets in WRITERS for target in targets]


@pytest.mark.parametrize("argv,flag,target", CASES, ids=[f"{a[0]}{'-' + a[1] if a[0] == 'trace' else ''}"
                                                          f"{flag or ' OUT'}={t}" for a, flag, t in CASES])
def test_an_output_pointed_at_an_input_exits_2_and_changes_nothing(tmp_path, capsys, argv, flag, target):
    before = _files(tmp_path)
    conf = _check_config(tmp_path)
    before[tmp_path / "c.toml"] = Path(conf).read_bytes()
    args = [a.replace("{x}", str(tmp_path)).replace("{c}", conf) for a in argv]
    args += ([flag] if flag else []) + [str(tmp_path / target)]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "overwrite an input file" in err, err
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.parametrize("target", ["t.jsonl", "c.toml", "golden.jsonl"])
def test_update_baseline_naming_an_input_exits_2_and_changes_nothing(tmp_path, capsys, target):
    # the baseline writer used to skip the guard: the trace or the config itself was replaced by JSON
    before = _files(tmp_path)
    conf = _check_config(tmp_path, baseline=target)
    before[tmp_path / "c.toml"] = Path(conf).read_bytes()
    rc = main(["check", conf, "--update-baseline"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"{target}, field 'output': the output would overwrite an input file" in err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_update_baseline_and_another_output_on_one_file_is_refused(tmp_path, capsys):
    before = _files(tmp_path)
    conf = _check_config(tmp_path)
    before[tmp_path / "c.toml"] = Path(conf).read_bytes()
    rc = main(["check", conf, "--update-baseline", "--json", str(tmp_path / "base.json")])
    assert rc == 2
    assert "the same file is given for two outputs" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_the_library_baseline_writer_refuses_an_input_too(tmp_path):
    from radixkv.check import load_config, run_check
    from radixkv.errors import InputError

    _files(tmp_path)
    conf = _check_config(tmp_path, baseline="t.jsonl")
    with pytest.raises(InputError, match="overwrite an input file"):
        run_check(load_config(conf), update_baseline=True)
    assert (tmp_path / "t.jsonl").read_text() == TRACE


def test_an_existing_file_inside_an_input_folder_is_an_input(tmp_path, capsys):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.jsonl").write_text(TRACE)
    rc = main(["trace", "inspect", str(tmp_path / "traces"), "--json", str(tmp_path / "traces" / "t.jsonl")])
    assert rc == 2
    assert "overwrite an input file" in capsys.readouterr().err
    assert (tmp_path / "traces" / "t.jsonl").read_text() == TRACE
