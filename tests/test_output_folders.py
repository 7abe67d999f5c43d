"""Output paths whose folder does not exist are refused, never created (a typo in an output
path must not silently grow a tree of folders); the sweep creates its own results folder
and the folders inside it, nothing above it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.errors import InputError
from radixkv.util import atomic_output, atomic_write_text, check_output_paths

DEMO = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")


def test_atomic_write_into_a_missing_folder_raises_and_creates_nothing(tmp_path):
    target = tmp_path / "resluts" / "deep" / "out.json"
    with pytest.raises(FileNotFoundError) as e:
        atomic_write_text(target, "{}\n")
    assert e.value.filename == str(target)
    assert "resluts" in str(e.value) and "does not exist" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_atomic_output_under_a_file_raises_not_a_directory(tmp_path):
    f = tmp_path / "plain"
    f.write_text("x")
    with pytest.raises(NotADirectoryError):
        with atomic_output(f / "out.txt") as fh:
            fh.write("never")
    assert f.read_text() == "x"


def test_atomic_output_in_an_existing_folder_still_writes(tmp_path):
    (tmp_path / "sub").mkdir()
    atomic_write_text(tmp_path / "sub" / "a.txt", "hello\n")
    assert (tmp_path / "sub" / "a.txt").read_text() == "hello\n"
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["a.txt"]  # no temp file left


def test_check_output_paths_names_the_path_and_the_missing_folder(tmp_path):
    target = tmp_path / "typo" / "x.csv"
    with pytest.raises(InputError) as e:
        check_output_paths(target)
    msg = str(e.value)
    assert str(target) in msg and f"folder {tmp_path / 'typo'} does not exist" in msg
    assert e.value.field == "output"
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("verb", [
    ["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "20000", "--quiet", "--json", "{out}"],
    ["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "20000", "--quiet", "--per-request", "{out}"],
    ["trace", "synth", "customer_service", "--requests", "5", "--seed", "1", "--out", "{out}"],
    ["trace", "convert", DEMO, "{out}"],
])
def test_cli_refuses_an_output_in_a_missing_folder_exit_2_and_writes_nothing(tmp_path, capsys, verb):
    out = tmp_path / "no_such_dir" / "out.json"
    argv = [a.replace("{out}", str(out)) for a in verb]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "does not exist" in err
    assert list(tmp_path.iterdir()) == []


def test_sweep_creates_its_results_folder_but_not_missing_folders_above_it(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text(f'traces = ["{DEMO}"]\npolicies = ["vllm:16"]\ncapacity_tokens = [20000]\nlimit = 5\n')
    bad = tmp_path / "typo" / "sweep"
    assert main(["sweep", str(grid), "--out", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "does not exist" in err
    assert not (tmp_path / "typo").exists()
    good = tmp_path / "sweep"
    assert main(["sweep", str(grid), "--out", str(good), "--quiet"]) == 0
    rows = [json.loads(p.read_text()) for p in (good / "cells").glob("*.jsonl")]
    assert len(rows) == 1 and rows[0]["settings"]["limit"] == 5


def test_report_given_a_sweep_folder_says_how_to_get_its_report(tmp_path, capsys):
    (tmp_path / "sw" / "cells").mkdir(parents=True)
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "sw"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'sw'}, field 'results': is a folder" in err and "--report PATH.html" in err
    assert not out.exists()
