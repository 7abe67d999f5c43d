"""``radixkv check``: exit status, failure lines, malformed configs, baseline, reports.

Expected values come from the real engine, not from radixkv: SGLang 0.5.23's golden run
``sglang_mixed200_p1_c1904`` (tests/data/golden) gives every request's hit tokens and the
tokens evicted while it ran, so its token hit rate (Σ hit / Σ prompt) and its evicted
tokens are known independently of the code under test.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import GOLDEN_LOCAL
from radixkv.cli import main

GOLD = GOLDEN_LOCAL / "sglang" / "sglang_mixed200_p1_c1904.jsonl"
TRACE = GOLDEN_LOCAL / "traces" / "mixed200.jsonl"


def _engine_numbers():
    rows = [json.loads(line) for line in GOLD.read_text().splitlines() if line]
    hit = sum(r["hit_tokens"] for r in rows)
    prompt = sum(r["prompt_len"] for r in rows)
    return hit / prompt, sum(r["evicted_tokens"] for r in rows), len(rows)


RATE, EVICTED, N = _engine_numbers()


def _config(tmp_path, *, min_rate=RATE, max_evicted=EVICTED, extra="", golden=GOLD):
    text = f"""
baseline = "base.json"

[[trace]]
name = "mixed200"
path = "{TRACE}"

[[policy]]
policy = "sglang:1"
max_total_num_tokens = 1904

[[assert]]
policy = "sglang:1"
min_token_hit_rate = {min_rate!r}
max_evicted_tokens = {max_evicted}

[[assert]]
golden = "{golden}"
{extra}
"""
    p = tmp_path / "check.toml"
    p.write_text(text)
    return p


def test_thresholds_at_the_engines_values_hold(tmp_path, capsys):
    # bounds equal to what real SGLang measured: they hold (exit 0), and the golden matches
    rc = main(["check", str(_config(tmp_path))])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "3 of 3 assertions hold" in out.out
    # nothing on stderr but, on a cold Numba cache, the compile notice (radixkv.numba_cache.compile_notice)
    assert [ln for ln in out.err.splitlines() if not ln.startswith("radixkv: compil")] == []


def test_a_config_with_a_utf8_bom_is_read_like_trace_files(tmp_path, capsys):
    p = _config(tmp_path)
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    rc = main(["check", str(p)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "3 of 3 assertions hold" in out.out


def test_raising_a_threshold_past_the_measured_value_fails_and_names_it(tmp_path, capsys):
    rc = main(["check", str(_config(tmp_path, min_rate=RATE + 0.001))])
    out = capsys.readouterr()
    assert rc == 1
    lines = out.err.strip().splitlines()
    assert len(lines) == 1  # one failure, one line
    line = lines[0]
    for part in ("trace=mixed200", "policy=sglang:1", "metric=token_hit_rate", f"value={RATE:.6g}",
                 f">= {RATE + 0.001:.6g}"):
        assert part in line, line


def test_lowering_max_evicted_below_the_engine_fails(tmp_path, capsys):
    rc = main(["check", str(_config(tmp_path, max_evicted=EVICTED - 1))])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"metric=evicted_tokens value={EVICTED} bound: <= {EVICTED - 1}" in err


def test_golden_mismatch_is_counted_per_request(tmp_path, capsys):
    rows = [json.loads(line) for line in GOLD.read_text().splitlines() if line]
    rows[5]["hit_tokens"] += 1
    bad = tmp_path / "gold.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["check", str(_config(tmp_path, golden=bad))])
    err = capsys.readouterr().err
    assert rc == 1
    assert "metric=golden_mismatches value=1" in err
    assert f"1 of {N} requests differ; first: {rows[5]['id']} hit {rows[5]['hit_tokens'] - 1} want {rows[5]['hit_tokens']}" in err


def test_junit_xml_has_one_testcase_per_assertion(tmp_path, capsys):
    xml = tmp_path / "check.xml"
    rc = main(["check", str(_config(tmp_path, min_rate=RATE + 0.001)), "--junit-xml", str(xml)])
    assert rc == 1
    root = ET.parse(xml).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 3  # min rate, max evicted, golden
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 1 and "token_hit_rate" in failed[0].get("name")
    assert root.find("testsuite").get("tests") == "3" and root.find("testsuite").get("failures") == "1"
    assert {c.get("classname") for c in cases} == {"mixed200.sglang:1"}


def test_json_and_markdown_reports(tmp_path, capsys):
    js, md = tmp_path / "r.json", tmp_path / "r.md"
    assert main(["check", str(_config(tmp_path)), "--json", str(js), "--markdown", str(md)]) == 0
    doc = json.loads(js.read_text())
    assert doc["ok"] is True and len(doc["assertions"]) == 3
    (res,) = doc["results"]
    assert res["token_hit_rate"] == pytest.approx(RATE, abs=0) and res["evicted_tokens"] == EVICTED
    text = md.read_text()
    assert "all 3 assertions hold" in text and text.count("| mixed200 |") == 3


def test_update_baseline_then_a_worse_run_fails(tmp_path, capsys):
    extra = "[[assert]]\n[assert.baseline]\ntoken_hit_rate = 0.005\nevicted_tokens = 10\n"
    cfg = _config(tmp_path, extra=extra)
    assert main(["check", str(cfg)]) == 2  # no baseline file yet: bad input
    assert "base.json" in capsys.readouterr().err
    assert main(["check", str(cfg), "--update-baseline"]) == 0
    base = json.loads((tmp_path / "base.json").read_text())
    entry = base["results"]["mixed200"]["sglang:1"]
    assert entry["token_hit_rate"] == RATE and entry["evicted_tokens"] == EVICTED
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".base.json")] == []  # no temp left
    assert main(["check", str(cfg)]) == 0
    # a baseline 0.01 better than this run: the run is worse by more than the 0.005 allowed
    entry["token_hit_rate"] = RATE + 0.01
    entry["evicted_tokens"] = EVICTED - 11
    (tmp_path / "base.json").write_text(json.dumps(base))
    capsys.readouterr()
    assert main(["check", str(cfg)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert "metric=token_hit_rate" in err[0] and f">= {RATE + 0.005:.6g}" in err[0]
    assert "metric=evicted_tokens" in err[1] and f"<= {EVICTED - 1}" in err[1]


@pytest.mark.parametrize("body, key, line", [
    ("[[trace]]\npath = 'x.jsonl'\n[[policy]]\npolicy = 'vllm:16'\ncapcity_tokens = 100\n", "policy[1].capcity_tokens", 5),
    ("[[trace]]\npath = 'x.jsonl'\nlimit = = 3\n", "limit", 3),
    ("[[trace]]\npath = 'x.jsonl'\n[[policy]]\npolicy = 'vllm:16'\ncapacity_tokens = 100\n"
     "[[assert]]\nmin_token_hit_rate = 'high'\n", "assert[1].min_token_hit_rate", 7),
    ("[[trace]]\npath = 'x.jsonl'\n[[policy]]\npolicy = 'vllm:16'\ncapacity_tokens = 100\n"
     "[[assert]]\nmax_alignment_loss_share = 1.5\n", "assert[1].max_alignment_loss_share", 7),
    ("[[trace]]\npath = 'x.jsonl'\n[[policy]]\npolicy = 'lru:16'\ncapacity_tokens = 100\n", "policy[1].policy", 4),
    ("[[trace]]\npath = 'x.jsonl'\n[[policy]]\npolicy = 'vllm:16'\ncapacity_tokens = 100\n"
     "[[assert]]\npolicy = 'sglang*'\nmin_token_hit_rate = 0.1\n", "assert[1].policy", 7),
    ("[[trace]]\npath = 'missing/*.jsonl'\n", "trace[1].path", 2),
    ("[[trace]]\npath = '${RADIXKV_TEST_UNSET_VAR}/x.jsonl'\n", "trace[1].path", 2),
    ("[[trace]]\npath = 'x.jsonl'\n[[policy]]\npolicy = 'sglang:1'\nnum_gpu_blocks = 100\n", "policy[1].num_gpu_blocks", 5),
    ("[[trace]]\npath = 'x.jsonl'\n[[policy]]\npolicy = 'vllm:16'\ncapacity_tokens = 100\n"
     "[[assert]]\n[assert.baseline]\ntoken_hit_rate = 0.01\n", "baseline", None),
])
def test_malformed_config_exits_2_naming_the_key(tmp_path, capsys, monkeypatch, body, key, line):
    monkeypatch.delenv("RADIXKV_TEST_UNSET_VAR", raising=False)
    (tmp_path / "x.jsonl").write_text('{"id": "a", "tokens": [1, 2, 3], "output_tokens": [4]}\n')
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"field '{key}'" in err, err
    assert str(cfg) in err
    if line is not None:
        assert f"line {line}" in err, err


def test_outputs_are_not_written_when_the_config_is_bad(tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[[trace]]\npath = 'nothing.jsonl'\n")
    xml = tmp_path / "c.xml"
    assert main(["check", str(cfg), "--junit-xml", str(xml)]) == 2
    assert not xml.exists()


def test_example_config_parses():
    from radixkv.check.config import load_config

    cfg = load_config(Path(__file__).parents[1] / "examples" / "check" / "demo.toml")
    assert [p.label for p in cfg.policies] == ["vllm:16", "sglang:1"]
    assert len(cfg.assertions) == 2 * 4 + 2


def test_a_relative_variable_starting_a_path_is_relative_to_the_current_folder(tmp_path, monkeypatch):
    # `RADIXKV_SHARED=../shared radixkv check tests/data/golden/check_shared.toml` (the README's
    # test command, and the file's own comment): ../shared is where the shell was, not
    # tests/data/golden/../shared
    from radixkv.check.config import load_config

    (tmp_path / "cwd").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.jsonl").write_text('{"id": "a", "tokens": [1, 2, 3], "output_tokens": [4]}\n')
    (tmp_path / "cfgdir").mkdir()
    cfg = tmp_path / "cfgdir" / "c.toml"
    cfg.write_text('[[trace]]\npath = "${RADIXKV_TEST_REL}/x.jsonl"\n[[policy]]\npolicy = "vllm:16"\n'
                   'capacity_tokens = 100\n[[assert]]\nmin_token_hit_rate = 0.0\n')
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("RADIXKV_TEST_REL", "../data")
    assert [Path(t.path) for t in load_config(cfg).traces] == [tmp_path / "data" / "x.jsonl"]
