"""Broken CI inputs (check configurations, baselines, golden files, sweep grids and cells,
result JSON given to ``report``) are exit 2 naming file, line and key: never a traceback,
never the exit 1 that CI reads as a regression, never a gate that silently passes
(issue 31). Inputs are hand-written; the fuzz tests (hypothesis) allow only 0, 1 and 2.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixkv.cli import main

# request b shares its first block (16 tokens) with a: vllm:16 hits 16 of 32 + 20 prompt tokens
TRACE = ('{"id":"a","tokens":[' + ",".join(map(str, range(1, 33))) + '],"output_length":2}\n'
         '{"id":"b","tokens":[' + ",".join(map(str, list(range(1, 17)) + [90, 91, 92, 93])) + '],"output_length":2}\n')
GOLDEN = '{"id":"a","hit_tokens":0,"prompt_len":32}\n{"id":"b","hit_tokens":16,"prompt_len":20}\n'


def _setup(tmp: Path, *, baseline_text=None, golden_text=GOLDEN, extra="") -> str:
    (tmp / "t.jsonl").write_text(TRACE)
    if isinstance(golden_text, bytes):
        (tmp / "g.jsonl").write_bytes(golden_text)
    else:
        (tmp / "g.jsonl").write_text(golden_text)
    if baseline_text is not None:
        (tmp / "b.json").write_text(baseline_text)
    (tmp / "c.toml").write_text('baseline = "b.json"\n[[trace]]\npath = "t.jsonl"\n[[policy]]\npolicy = "vllm:16"\n'
                                'capacity_tokens = 160\n[[assert]]\ngolden = "g.jsonl"\n'
                                + ("[assert.baseline]\ntoken_hit_rate = 0.01\nevicted_tokens = 0\n"
                                   if baseline_text is not None else "") + extra)
    return str(tmp / "c.toml")


def _baseline(**metrics) -> str:
    m = {"token_hit_rate": 16 / 52, "evicted_tokens": 0, **metrics}
    # a str is written as it is (raw JSON text: -Infinity, "0.5", [0.5]); numbers as JSON
    body = ",\n".join(f'        "{k}": {v if isinstance(v, str) else json.dumps(v)}' for k, v in m.items())
    return '{\n  "radixkv": "0.1.0",\n  "results": {\n    "t": {\n      "vllm:16": {\n' + body + "\n      }\n    }\n  }\n}\n"


def _run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.err


def test_the_hand_worked_check_holds(tmp_path, capsys):
    # the control: this trace, golden and baseline are right (hits 0 and 16 by hand)
    rc, err = _run(capsys, ["check", _setup(tmp_path, baseline_text=_baseline())])
    assert rc == 0, err


@pytest.mark.parametrize("value,line", [
    ("-Infinity", 6),    # a hit rate of -inf made every later run pass (exit 0)
    ("Infinity", 6),
    ("NaN", 6),          # gave an assertion failure (exit 1)
    ('"0.5"', 6),        # strings and booleans were taken as numbers
    ("true", 6),
    ("[0.5]", 6),
    ("1.5", 6),          # a rate above 1
])
def test_a_baseline_hit_rate_that_is_not_a_finite_rate_is_exit_2(tmp_path, capsys, value, line):
    conf = _setup(tmp_path, baseline_text=_baseline(token_hit_rate=value))
    rc, err = _run(capsys, ["check", conf])
    assert rc == 2, err
    assert f"b.json, line {line}, field 'results.t.vllm:16.token_hit_rate'" in err


def test_infinite_evicted_tokens_in_the_baseline_is_exit_2(tmp_path, capsys):
    rc, err = _run(capsys, ["check", _setup(tmp_path, baseline_text=_baseline(evicted_tokens="Infinity"))])
    assert rc == 2 and "b.json, line 7, field 'results.t.vllm:16.evicted_tokens'" in err, err


@pytest.mark.parametrize("results,field", [
    ('{"t": [1, 2]}', "results.t"),
    ('{"t": "vllm"}', "results.t"),
    ('{"t": {"vllm:16": [0.3]}}', "results.t.vllm:16"),
    ('{"t": {"vllm:16": {"token_hit_rte": 0.3}}}', "results.t.vllm:16.token_hit_rte"),
    ('[]', "results"),
])
def test_a_baseline_of_the_wrong_shape_is_exit_2_naming_the_key(tmp_path, capsys, results, field):
    conf = _setup(tmp_path, baseline_text='{"radixkv": "0.1.0",\n"results": ' + results + "}\n")
    rc, err = _run(capsys, ["check", conf])
    assert rc == 2 and f"field '{field}'" in err and "line 2" in err, err


@pytest.mark.parametrize("golden,line,field", [
    ('{"id":"a","hit_tokens":0,"prompt_len":"abc"}\n', 1, "prompt_len"),
    ('{"id":"a","hit_tokens":0}\n{"id":"b","hit_tokens":NaN}\n', 2, None),
    ('{"id":"a","hit_tokens":-1}\n', 1, "hit_tokens"),
    ('{"id":"a","hit_tokens":1.5}\n', 1, "hit_tokens"),
    ('{"id":["a"],"hit_tokens":1}\n', 1, "id"),
    ('[1, 2]\n', 1, None),
    ('{"id":"a","hit_tokens":0}\n\n{"id":"b",\n', 3, None),
])
def test_a_broken_golden_line_is_exit_2_naming_line_and_field(tmp_path, capsys, golden, line, field):
    rc, err = _run(capsys, ["check", _setup(tmp_path, golden_text=golden)])
    assert rc == 2, err
    assert f"g.jsonl, line {line}" in err
    if field:
        assert f"field '{field}'" in err


def test_a_latin1_golden_file_is_exit_2_naming_the_line(tmp_path, capsys):
    golden = b'{"id":"a","hit_tokens":0}\n{"id":"caf\xe9","hit_tokens":16}\n'
    rc, err = _run(capsys, ["check", _setup(tmp_path, golden_text=golden)])
    assert rc == 2 and "g.jsonl, line 2: not UTF-8" in err and "0xe9" in err, err


@pytest.mark.parametrize("extra,key", [
    ("[[assert]]\nmax_evicted_tokens = inf\n", "assert[2].max_evicted_tokens"),
    ("[[assert]]\nmin_token_hit_rate = nan\n", "assert[2].min_token_hit_rate"),
    ("[[assert]]\n[assert.baseline]\ntoken_hit_rate = inf\n", "assert[2].baseline.token_hit_rate"),
])
def test_a_non_finite_bound_in_the_config_is_exit_2(tmp_path, capsys, extra, key):
    rc, err = _run(capsys, ["check", _setup(tmp_path, baseline_text=_baseline(), extra=extra)])
    assert rc == 2 and f"field '{key}'" in err and "finite" in err, err


def test_a_latin1_config_is_exit_2_naming_the_line(tmp_path, capsys):
    conf = Path(_setup(tmp_path))
    conf.write_bytes(conf.read_bytes() + b"# caf\xe9\n")
    rc, err = _run(capsys, ["check", str(conf)])
    assert rc == 2 and "c.toml, line 9: not UTF-8" in err, err


@pytest.mark.parametrize("doc,field", [
    ('{"results": [1, 2]}', "results[0]"),
    ('{"results": [{"summary": {"token_hit_rate": 0.5}}]}', "results[0].policy"),
    ('{"results": {"policy": "vllm:16"}}', "results"),
    ('{"curves": [{"policy": "vllm:16", "points": [{"token_hit_rate": 0.5}]}]}', "curves[0].points[0].capacity_tokens"),
    ('{"curves": [{"points": [{"capacity_tokens": 100, "token_hit_rate": 0.5}]}]}', "curves[0].policy"),
    ('{"results": [{"policy": "vllm:16", "token_hit_rate": NaN}]}', None),
    ('{"results": [{"policy": "vllm:16", "summary": {"hit_length_histogram": {"edges_tokens": [1], "counts": "x"}}}]}',
     "results[0].hit_length_histogram.counts"),
])
def test_report_on_a_broken_result_is_exit_2_naming_the_key(tmp_path, capsys, doc, field):
    (tmp_path / "r.json").write_text(doc + "\n")
    rc, err = _run(capsys, ["report", str(tmp_path / "r.json"), "--out", str(tmp_path / "r.html")])
    assert rc == 2, err
    assert "r.json, line 1" in err
    if field:
        assert f"field '{field}'" in err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("line", ["mfu = nan", "cache_threshold = inf", "request_rate = -inf"])
def test_a_non_finite_grid_value_is_exit_2(tmp_path, capsys, line):
    (tmp_path / "t.jsonl").write_text(TRACE)
    (tmp_path / "g.toml").write_text(f'traces = ["t.jsonl"]\npolicies = ["vllm:16"]\ncapacity_tokens = 160\n{line}\n')
    rc, err = _run(capsys, ["sweep", str(tmp_path / "g.toml"), "--out", str(tmp_path / "out")])
    assert rc == 2 and f"field '{line.split()[0]}'" in err and "finite" in err, err


def _sweep(tmp_path, capsys):
    return _run(capsys, ["sweep", str(tmp_path / "g.toml"), "--out", str(tmp_path / "out"), "--quiet"])


def test_a_truncated_cell_file_is_run_again_on_resume(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text(TRACE)
    (tmp_path / "g.toml").write_text('traces = ["t.jsonl"]\npolicies = ["vllm:16"]\ncapacity_tokens = [160, 320]\n')
    rc, err = _sweep(tmp_path, capsys)
    assert rc == 0, err
    cells = sorted((tmp_path / "out" / "cells").glob("*.jsonl"))
    assert len(cells) == 2
    whole = cells[0].read_bytes()
    cells[0].write_bytes(whole[: len(whole) // 2])  # cut in the middle, as a copy that ran out of disk
    rc = main(["sweep", str(tmp_path / "g.toml"), "--out", str(tmp_path / "out"), "--quiet"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "1 already done, 1 run now" in out.out
    assert f"{cells[0]}, line 1: truncated" in out.err and "run again" in out.err
    row = json.loads(cells[0].read_text())
    assert row["metrics"]["hit_tokens"] == 16  # by hand: b's first block
    # sweep-plot / read_rows on a truncated cell: exit 2 naming the file
    cells[1].write_bytes(cells[1].read_bytes()[:-1])
    rc, err = _run(capsys, ["sweep-plot", str(tmp_path / "out"), "--out", str(tmp_path / "p.png")])
    assert rc == 2 and f"{cells[1]}, line 1: truncated" in err, err


# ------------------------------------------------------------------ fuzz: exit 0, 1 or 2 only
_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 10 ** 6), st.text(max_size=4),
                         st.floats(allow_nan=True, allow_infinity=True))
_json_value = st.recursive(_json_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                                           max_size=3), max_leaves=6)
_metric_keys = st.sampled_from(["token_hit_rate", "evicted_tokens", "cached_tokens", "request_hit_rate", "x"])
_FUZZ = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _dump(v) -> str:
    return json.dumps(v, allow_nan=True)  # writes NaN / Infinity, which the readers must refuse


def _fuzz_check(tmp: Path, capsys, **kw) -> None:
    conf = _setup(tmp, **kw)
    try:
        rc = main(["check", conf, "--quiet"])
    except SystemExit as e:  # argparse
        rc = e.code
    out = capsys.readouterr()
    assert rc in (0, 1, 2), out.err
    assert "Traceback" not in out.err


@_FUZZ
@given(metrics=st.dictionaries(_metric_keys, _json_value, max_size=3), shape=st.integers(0, 3))
def test_fuzz_baselines_exit_0_1_or_2(tmp_path_factory, capsys, metrics, shape):
    tmp = tmp_path_factory.mktemp("b")
    results = [{"t": {"vllm:16": metrics}}, {"t": metrics}, metrics, {"t": {"vllm:16": list(metrics.values())}}][shape]
    _fuzz_check(tmp, capsys, baseline_text=_dump({"radixkv": "0.1.0", "results": results}))


@_FUZZ
@given(rows=st.lists(st.one_of(st.dictionaries(st.sampled_from(["id", "hit_tokens", "prompt_len", "x"]), _json_value,
                                               max_size=4),
                               st.fixed_dictionaries({"id": st.sampled_from(["a", "b"]),
                                                      "hit_tokens": st.integers(0, 32)}),
                               _json_value), max_size=3),
       raw=st.binary(max_size=12))
def test_fuzz_golden_files_exit_0_1_or_2(tmp_path_factory, capsys, rows, raw):
    tmp = tmp_path_factory.mktemp("g")
    text = "".join(_dump(r) + "\n" for r in rows)
    _fuzz_check(tmp, capsys, golden_text=text.encode() + raw)


_toml_value = st.one_of(st.integers(-5, 10 ** 7), st.floats(allow_nan=True, allow_infinity=True).map(
    lambda f: "nan" if math.isnan(f) else ("inf" if f == math.inf else ("-inf" if f == -math.inf else repr(f)))),
    st.booleans().map(lambda b: "true" if b else "false"), st.text(max_size=5).map(json.dumps),
    st.just("[1, 2]"), st.just("{ a = 1 }"))
_config_keys = st.sampled_from(["min_token_hit_rate", "max_evicted_tokens", "min_cached_tokens", "golden", "trace",
                                "policy", "max_alignment_loss_share", "capcity_tokens", "limit"])


@_FUZZ
@given(pairs=st.lists(st.tuples(_config_keys, _toml_value), max_size=3), table=st.sampled_from(["assert", "trace",
                                                                                                  "policy"]))
def test_fuzz_check_configs_exit_0_1_or_2(tmp_path_factory, capsys, pairs, table):
    tmp = tmp_path_factory.mktemp("c")
    lines = "".join(f"{k} = {v}\n" for k, v in dict(pairs).items())
    extra = f"[[{table}]]\n" + lines + ("path = \"t.jsonl\"\nname = \"t2\"\n" if table == "trace" and "path" not in lines
                                        else "")
    if table == "policy":
        extra += 'policy = "sglang:1"\nmax_total_num_tokens = 200\nname = "s"\n'
    _fuzz_check(tmp, capsys, extra=extra)


def test_a_latin1_grid_is_exit_2_naming_the_line(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text(TRACE)
    (tmp_path / "g.toml").write_bytes(b'traces = ["t.jsonl"]\n# caf\xe9\npolicies = ["vllm:16"]\ncapacity_tokens = 160\n')
    rc, err = _run(capsys, ["sweep", str(tmp_path / "g.toml"), "--out", str(tmp_path / "out")])
    assert rc == 2 and "g.toml, line 2: not UTF-8" in err, err
