"""``radixkv trace synth``: bytes, files, errors; and the recorded traces in traces/."""
from __future__ import annotations

import argparse
import json
import shlex
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from radixkv.cli.synth_cmd import main as synth_main
from radixkv.cli.synth_cmd import register_synth, synth_to_file
from radixkv.synth import SCENARIOS, generate

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
SMALL = {"long_doc_qa": ["document_len=uniform:200,400"], "mix": ["long_doc_qa.document_len=uniform:200,400"]}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_arguments_same_bytes(tmp_path, name):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    synth_to_file(name, 40, 5, str(a), rate=3.0, arrival="gamma", cv=1.5, params=SMALL.get(name))
    synth_to_file(name, 40, 5, str(b), rate=3.0, arrival="gamma", cv=1.5, params=SMALL.get(name))
    synth_to_file(name, 40, 6, str(c), rate=3.0, arrival="gamma", cv=1.5, params=SMALL.get(name))
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_native_and_npz_round_trip(tmp_path):
    from radixkv.trace.binary import read_npz
    from radixkv.trace.native import read_native

    t = generate("mix", 120, seed=3, params=SMALL["mix"])
    for path, reader in ((tmp_path / "m.jsonl", read_native), (tmp_path / "m.npz", read_npz)):
        synth_to_file("mix", 120, 3, str(path), params=SMALL["mix"])
        r = reader(str(path))
        for col in ("req_id", "arrival_s", "prompt_len", "output_len", "ids", "id_offsets", "out_ids", "out_offsets", "session_id", "turn"):
            assert np.array_equal(getattr(r, col), getattr(t, col)), (path.suffix, col)
        assert r.unit_tokens == 1


def test_register_synth_under_trace_verb(tmp_path):
    parser = argparse.ArgumentParser(prog="radixkv")
    verbs = parser.add_subparsers(dest="verb")
    trace = verbs.add_parser("trace")
    register_synth(trace.add_subparsers(dest="trace_cmd"))
    out = tmp_path / "e.jsonl"
    args = parser.parse_args(["trace", "synth", "enterprise", "--requests", "7", "--seed", "2", "--out", str(out),
                              "--rate", "4", "--arrival", "gamma", "--param", "prompt_len=101"])
    assert args.func(args) == 0
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["unit_tokens"] == 1  # header, then one line per request
    recs = [json.loads(x) for x in lines[1:]]
    assert len(recs) == 7
    first = recs[0]["tokens"][:101]
    assert all(r["tokens"][:101] == first for r in recs)  # prompt_len=101 shared by all


@pytest.mark.parametrize("argv", [
    ["chatbot", "--requests", "3", "--seed", "1"],
    ["mix", "--requests", "0", "--seed", "1"],
    ["mix", "--requests", "3", "--seed", "-2"],
    ["mix", "--requests", "3", "--seed", "1", "--rate", "-1"],
    ["mix", "--requests", "3", "--seed", "1", "--param", "multi_turn.turns=uniform:0,3"],
    ["enterprise", "--requests", "3", "--seed", "1", "--param", "prompt_len=abc"],
])
def test_bad_input_exit_2_and_nothing_written(tmp_path, capsys, argv):
    out = tmp_path / "x.jsonl"
    assert synth_main(argv + ["--out", str(out)]) == 2
    assert "radixkv: error:" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- recorded traces
RECORDED = ["long_doc_qa", "agent_tools", "enterprise", "customer_service", "multi_turn", "demo"]


def _record_commands() -> dict[str, list[str]]:
    """The synth argument lists in traces/record.sh, by output file name."""
    text = (TRACES / "record.sh").read_text().replace("\\\n", " ")
    cmds = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("synth "):
            argv = shlex.split(line)[1:]
            cmds[Path(argv[argv.index("--out") + 1]).stem] = argv
    return cmds


@pytest.mark.parametrize("stem", RECORDED)
def test_recorded_trace_is_small_and_shows_its_scenario(stem):
    from radixkv.trace.load import load_trace

    path = TRACES / f"{stem}.jsonl"
    if not path.exists():
        path = path.with_suffix(".npz")  # recorded in the binary form where that is smaller
    assert path.stat().st_size <= (1_000_000 if stem == "demo" else 5_000_000)
    t = load_trace(str(path))
    kinds = Counter(s.split(":")[0] for s in t.session_id)
    if stem == "demo":
        assert set(kinds) == {"long_doc_qa", "agent_tools", "enterprise", "customer_service", "multi_turn"}
        assert 250 <= len(t) <= 350
    else:
        assert set(kinds) == {stem}
    if stem in ("agent_tools", "multi_turn", "demo"):
        assert int(t.turn.max()) >= 3  # sessions with several turns/steps are present
    assert t.out_ids is not None


def test_demo_regenerates_byte_identical(tmp_path):
    argv = _record_commands()["demo"]
    i = argv.index("--out")
    argv[i + 1] = str(tmp_path / "demo.jsonl")
    assert synth_main(argv) == 0
    assert (tmp_path / "demo.jsonl").read_bytes() == (TRACES / "demo.jsonl").read_bytes()


def test_demo_hits_under_both_engines_in_an_evicting_pool(tmp_path):
    from radixkv.cli import main as radixkv_main

    out = tmp_path / "c.json"
    rc = radixkv_main(["compare", str(TRACES / "demo.jsonl"), "--policies", "vllm:16,sglang:1",
                       "--capacity-tokens", "20000", "--quiet", "--no-timing", "--json", str(out)])
    assert rc == 0
    res = {r["policy"]: r["summary"] for r in json.loads(out.read_text())["results"]}
    for pol in ("vllm:16", "sglang:1"):
        assert res[pol]["hit_tokens"] > 0.3 * res[pol]["prompt_tokens"]
        assert res[pol]["evicted_tokens"] > 0
