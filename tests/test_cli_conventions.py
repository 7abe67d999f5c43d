"""One output convention and complete help across verbs (issue 16)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from radixkv.cli import build_parser, main, walk_parsers

DEMO = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")


def _actions(p):
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
            continue
        yield a


def test_every_verb_has_a_description_and_every_flag_a_help_line_with_its_default():
    parsers = list(walk_parsers(build_parser()))
    assert len(parsers) >= 12  # radixkv, trace (+3), memory, replay, compare, curve, sweep, sweep-plot, check, ...
    for p in parsers:
        assert p.description and p.description.strip(), p.prog
        p.format_help()  # every help string expands
        fmt = p._get_formatter()
        for a in _actions(p):
            assert a.help and a.help.strip(), (p.prog, a.option_strings or a.dest)
            d = a.default
            if a.option_strings and d is not None and not isinstance(d, bool) and d != []:
                # the help line states the default (written, or added by the formatter)
                assert "default" in fmt._get_help_string(a).lower(), (p.prog, a.option_strings)


@pytest.mark.parametrize("argv", [
    ["trace", "inspect", DEMO, "--limit", "20"],
    ["memory", "--model", "llama-3.1-8b", "--gpu", "A100-80GB"],
    ["replay", DEMO, "--policy", "none", "--capacity-tokens", "20000", "--limit", "20", "--quiet", "--no-timing"],
    ["compare", DEMO, "--policies", "none", "--capacity-tokens", "20000", "--limit", "20", "--quiet", "--no-timing"],
    ["curve", DEMO, "--policies", "none", "--capacities", "20000", "--limit", "20", "--quiet", "--no-timing"],
])
def test_json_dash_prints_only_json_and_json_path_writes_it(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv + ["--json", "-"]) == 0
    printed = json.loads(capsys.readouterr().out)  # stdout is exactly one JSON document
    assert os.listdir(tmp_path) == []  # nothing written into the current folder
    out = tmp_path / "sub" / "o.json"
    out.parent.mkdir()  # an output's folder must exist (tests/test_output_folders.py)
    assert main(argv + ["--json", str(out)]) == 0
    assert json.loads(out.read_text()) == printed
    assert os.listdir(tmp_path) == ["sub"]


def test_curve_writes_nothing_unless_asked(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["curve", DEMO, "--policies", "none", "--capacities", "20000", "--limit", "20", "--quiet"]
    assert main(argv) == 0
    assert os.listdir(tmp_path) == []
    (tmp_path / "x").mkdir()  # an output's folder must exist (tests/test_output_folders.py)
    assert main(argv + ["--out", "x/c"]) == 0
    assert sorted(os.listdir(tmp_path / "x")) == ["c.json", "c.png"]


@pytest.mark.parametrize("argv, verb, needle", [
    (["replay", DEMO, "--policy", "vllm:16", "--bogus-flag"], "radixkv", "unrecognized arguments: --bogus-flag"),
    (["trace", "convert"], "radixkv trace convert", "IN, OUT"),
    (["memory", "--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--block-size", "x"], "radixkv memory", "'x'"),
])
def test_a_usage_error_is_two_lines_naming_the_verb_the_problem_and_where_help_is(argv, verb, needle, capsys):
    # argparse's default prints the whole usage (tens of lines for replay) before the error
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"{verb}: error: ") and needle in err[0]
    assert err[1] == f"(`{verb} --help` lists the options)"


def test_warmup_without_policies_warms_every_built_in_with_compiled_kernels(monkeypatch, capsys):
    # `radixkv warmup` with no POLICY (docs/ci.md: "default: all") once failed on an import
    import radixkv.replay.run as run

    got = []
    monkeypatch.setattr(run, "warmup_many", lambda specs, **kw: got.extend(specs) or 0.0)
    assert main(["warmup"]) == 0
    names = {s.name for s in got}
    # the engines' models and the other compiled families; pure-Python policies have nothing to compile
    assert {"vllm", "sglang", "static", "unit-lru"} <= names
    assert not names & {"none", "vllm-hybrid", "sglang-hicache"}
    assert "compiled or loaded the kernels of" in capsys.readouterr().out


@pytest.mark.parametrize("extra, first, second", [
    (["--no-enable-prefix-caching", "--enable-prefix-caching"], "--no-enable-prefix-caching", "--enable-prefix-caching"),
    (["--capacity-tokens", "5000", "--capacity-tokens", "6000"], "--capacity-tokens 5000", "--capacity-tokens 6000"),
])
def test_contradictory_flags_are_a_usage_error_naming_both(extra, first, second, capsys):
    # the trial's finding: the last of two contradictory flags silently won
    argv = ["replay", DEMO, "--policy", "vllm:16"] + extra + ([] if "--capacity-tokens" in extra
                                                             else ["--capacity-tokens", "5000"])
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[0]
    assert err.startswith("radixkv replay: error: ") and f"{second} contradicts {first} given before it" in err


def test_the_same_flag_twice_with_the_same_value_is_accepted(capsys):
    argv = ["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "5000", "--capacity-tokens", "5000",
            "--json", "-", "--no-timing"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["policy"] == "vllm:16"


def test_an_error_about_a_flag_names_the_flag_not_its_destination(capsys):
    # --disable-priority-preemption outside the concurrent mode: a ConfigError whose field is
    # the destination; the command line shows the flag (the trial saw field 'disable_priority_preemption')
    assert main(["replay", DEMO, "--policy", "sglang:1", "--capacity-tokens", "5000",
                 "--disable-priority-preemption"]) == 2
    err = capsys.readouterr().err
    assert "--disable-priority-preemption" in err and "disable_priority_preemption" not in err
