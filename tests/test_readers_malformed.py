"""Malformed input: every reader names the file, the line (or record) and the field.

Each case is a small hand-written file; the expected line and field are read off the
file by eye (lines are 1-based; for WEKA JSON documents the "line" is the 1-based index
of the top-level request record, and the field is a JSON path)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from radixkv.errors import InputError, TraceFormatError
from radixkv.trace.binary import read_npz, write_npz
from radixkv.trace.load import load_trace
from radixkv.trace.native import read_native, write_native
from radixkv.trace.types import Trace

HDR4 = '{"radixkv_trace": 1, "unit_tokens": 4, "partial_last_unit": false}\n'
OK = '{"id": "a", "tokens": [1, 2, 3], "output_length": 2}\n'
MC = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'


def weka_doc(requests, block_size=4):
    return json.dumps({"id": "conv", "block_size": block_size, "hash_id_scope": "local", "requests": requests})


W_OK = {"t": 0.0, "type": "n", "in": 9, "out": 3, "hash_ids": [1, 2]}

# (case id, file name, content, format, expected line, expected field)
CASES = [
    # ---- native
    ("native-invalid-json", "t.jsonl", OK + '{"id": "b", "tokens": [1, 2\n', "native", 2, None),
    ("native-missing-output", "t.jsonl", OK + '{"tokens": [5]}\n', "native", 2, "output_length"),
    ("native-negative-token", "t.jsonl", '{"tokens": [1, -2], "output_length": 0}\n', "native", 1, "tokens"),
    ("native-bool-token", "t.jsonl", '{"tokens": [1, true], "output_length": 0}\n', "native", 1, "tokens"),
    ("native-bool-length", "t.jsonl", OK + '{"tokens": [1], "output_length": false}\n', "native", 2, "output_length"),
    ("native-float-input-length", "t.jsonl", HDR4 + '{"hash_ids": [7], "input_length": 5.0, "output_length": 1}\n',
     "native", 2, "input_length"),
    ("native-hash-count", "t.jsonl", HDR4 + '{"hash_ids": [7, 8], "input_length": 7, "output_length": 1}\n',
     "native", 2, "hash_ids"),  # floor(7/4) = 1 id expected
    ("native-empty-prompt", "t.jsonl", OK + OK + '{"tokens": [], "output_length": 1}\n', "native", 3, "tokens"),
    ("native-output-disagree", "t.jsonl", '{"tokens": [1], "output_tokens": [4, 5], "output_length": 3}\n',
     "native", 1, "output_length"),
    ("native-output-tokens-some-lines", "t.jsonl",
     '{"tokens": [1], "output_tokens": [4]}\n{"tokens": [1], "output_tokens": [4]}\n{"tokens": [2], "output_length": 1}\n',
     "native", 3, "output_tokens"),
    # arrival_s on lines 1-2, absent on line 3: line 3 would silently arrive at 0
    ("native-arrival-some-lines", "t.jsonl",
     '{"tokens": [1], "output_length": 1, "arrival_s": 5}\n{"tokens": [2], "output_length": 1, "arrival_s": 6}\n'
     '{"tokens": [3], "output_length": 1}\n', "native", 3, "arrival_s"),
    # absent on line 1, given on line 2 (after a header on line 1: lines 2 and 3)
    ("native-arrival-first-missing", "t.jsonl",
     '{"radixkv_trace": 1, "unit_tokens": 1}\n{"tokens": [1], "output_length": 1}\n'
     '{"tokens": [2], "output_length": 1, "arrival_s": 0.5}\n', "native", 3, "arrival_s"),
    ("native-header-version", "t.jsonl", '{"radixkv_trace": 2, "unit_tokens": 1}\n' + OK, "native", 1, "radixkv_trace"),
    ("native-header-unit-zero", "t.jsonl", '{"radixkv_trace": 1, "unit_tokens": 0}\n' + OK, "native", 1, "unit_tokens"),
    ("native-header-partial-not-bool", "t.jsonl", '{"radixkv_trace": 1, "unit_tokens": 4, "partial_last_unit": 1}\n' + OK,
     "native", 1, "partial_last_unit"),
    ("native-unknown-field", "t.jsonl", OK + '{"tokens": [1], "output_length": 1, "arrival": 3.0}\n', "native", 2, "arrival"),
    ("native-tokens-with-units", "t.jsonl", HDR4 + OK, "native", 2, "tokens"),
    ("native-string-arrival", "t.jsonl", '{"tokens": [1], "output_length": 1, "arrival_s": "3"}\n', "native", 1, "arrival_s"),
    ("native-id-not-string", "t.jsonl", '{"id": 5, "tokens": [1], "output_length": 1}\n', "native", 1, "id"),
    # integers beyond int64 (every integer column is int64): an error, not an OverflowError
    ("native-huge-priority", "t.jsonl", OK + '{"tokens": [1], "output_length": 1, "priority": 9223372036854775808}\n',
     "native", 2, "priority"),  # 2**63
    ("native-huge-negative-priority", "t.jsonl",
     '{"tokens": [1], "output_length": 1, "priority": -9223372036854775809}\n', "native", 1, "priority"),  # -2**63 - 1
    ("native-huge-output-length", "t.jsonl", '{"tokens": [1], "output_length": 99999999999999999999999}\n',
     "native", 1, "output_length"),
    ("native-huge-turn", "t.jsonl", '{"tokens": [1], "output_length": 1, "turn": 99999999999999999999999}\n',
     "native", 1, "turn"),
    ("native-arrival-beyond-float", "t.jsonl", '{"tokens": [1], "output_length": 1, "arrival_s": 1' + "0" * 400 + '}\n',
     "native", 1, "arrival_s"),
    ("mooncake-huge-output", "m.jsonl",
     '{"timestamp": 0, "input_length": 6, "output_length": 99999999999999999999999, "hash_ids": [0]}\n',
     "mooncake", 1, "output_length"),
    # ---- Mooncake
    ("mooncake-hash-count", "m.jsonl", MC + '{"timestamp": 5, "input_length": 1025, "output_length": 5, "hash_ids": [0, 1]}\n',
     "mooncake", 2, "hash_ids"),  # ceil(1025/512) = 3
    ("mooncake-missing-timestamp", "m.jsonl", MC + '{"input_length": 6, "output_length": 5, "hash_ids": [0]}\n',
     "mooncake", 2, "timestamp"),
    ("mooncake-negative-output", "m.jsonl", '{"timestamp": 0, "input_length": 6, "output_length": -1, "hash_ids": [0]}\n',
     "mooncake", 1, "output_length"),
    ("mooncake-string-length", "m.jsonl", '{"timestamp": 0, "input_length": "6", "output_length": 1, "hash_ids": [0]}\n',
     "mooncake", 1, "input_length"),
    ("mooncake-zero-input", "m.jsonl", MC + MC + '{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}\n',
     "mooncake", 3, "input_length"),
    ("mooncake-float-id", "m.jsonl", '{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1.5]}\n',
     "mooncake", 1, "hash_ids"),
    # ---- WEKA (line = top-level request record, 1-based)
    ("weka-subagent-hash-count", "c.json",
     weka_doc([W_OK, {"t": 9.0, "type": "subagent", "agent_id": "a1", "duration_ms": 5000,
                      "requests": [{"t": 0.0, "type": "n", "in": 12, "out": 1, "hash_ids": [1, 2]}]}]),
     "weka", 2, "requests[1].requests[0].hash_ids"),  # floor(12/4) = 3
    ("weka-missing-in", "c.json", weka_doc([W_OK, W_OK, {"t": 1.0, "type": "n", "out": 1, "hash_ids": []}]),
     "weka", 3, "requests[2].in"),
    ("weka-unknown-type", "c.json", weka_doc([dict(W_OK, type="x")]), "weka", 1, "requests[0].type"),
    ("weka-bool-out", "c.json", weka_doc([dict(W_OK, out=True)]), "weka", 1, "requests[0].out"),
    ("weka-invalid-json", "c.json", '{"id": "conv",\n "block_size": 4,\n "requests": [}\n', "weka", 3, None),
    ("weka-missing-block-size", "c.json", json.dumps({"id": "c", "requests": [W_OK]}), "weka", None, "block_size"),
    # ---- Azure CSV (header is line 1)
    ("azure-bad-header", "a.csv", "TIME,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,5,1\n",
     "azure", 1, "header"),
    ("azure-negative-context", "a.csv",
     "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,5,1\n2023-11-16 18:17:04.0000000,-5,1\n",
     "azure", 3, "ContextTokens"),
    ("azure-bad-time", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n16/11/2023 18:17,5,1\n", "azure", 2, "TIMESTAMP"),
    ("azure-zero-context", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,0,1\n",
     "azure", 2, "ContextTokens"),
    ("azure-float-generated", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,5,1.5\n",
     "azure", 2, "GeneratedTokens"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_file_names_path_line_field(tmp_path, case):
    _, fname, content, fmt, line, field = case
    p = tmp_path / fname
    p.write_text(content, encoding="utf-8")
    before = p.read_bytes()
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p, format=fmt)
    e = ei.value
    assert e.path == str(p)
    assert e.line == line
    assert e.field == field
    assert str(p) in str(e)  # the message itself names the file
    assert p.read_bytes() == before  # input never modified


def _ragpulse_dir(tmp_path, trace_lines, passages='{"passage_id": 0, "token_length": 20}\n'):
    d = tmp_path / "rp"
    d.mkdir()
    (d / "1_sys_prompt.jsonl").write_text('{"sys_prompt_id": 100, "token_length": 32}\n')
    (d / "2_passages.jsonl").write_text(passages)
    (d / "3_history.jsonl").write_text('{"history_id": 200, "token_length": 5}\n')
    (d / "4_user_input.jsonl").write_text('{"user_input_id": 300, "token_length": 7}\n')
    (d / "5_web_search.jsonl").write_text('{"web_search_id": 400, "token_length": 9}\n')
    (d / "0_trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in trace_lines))
    return d


def _rp(ts="0", passages=(0,), input_length=80, **kw):
    rec = {"timestamp": ts, "input_length": input_length, "output_length": 3,
           "hash_ids": {"sys_prompt": [100], "passages_ids": list(passages), "history": [200],
                        "web_search": [], "user_input": [300]}, "session_id": "s"}
    rec.update(kw)
    return rec


@pytest.mark.parametrize(
    "lines, line, field",
    [
        ([_rp(), _rp(passages=(0, 7))], 2, "hash_ids.passages_ids"),  # passage 7 is not in 2_passages.jsonl
        ([_rp(ts="12.5")], 1, "timestamp"),
        ([_rp(), _rp(), _rp(input_length=60)], 3, "input_length"),  # chunks hold 32+20+5+7 = 64 > 60
        ([_rp(passages=(0, True))], 1, "hash_ids.passages_ids"),
    ],
)
def test_ragpulse_malformed(tmp_path, lines, line, field):
    d = _ragpulse_dir(tmp_path, lines)
    with pytest.raises(TraceFormatError) as ei:
        load_trace(d)
    assert ei.value.path == str(d / "0_trace.jsonl")
    assert (ei.value.line, ei.value.field) == (line, field)


def test_ragpulse_bad_component_file(tmp_path):
    d = _ragpulse_dir(tmp_path, [_rp()], passages='{"passage_id": 0, "token_length": 20}\n{"passage_id": 1}\n')
    with pytest.raises(TraceFormatError) as ei:
        load_trace(d, format="ragpulse")
    assert (ei.value.path, ei.value.line, ei.value.field) == (str(d / "2_passages.jsonl"), 2, "token_length")


def test_npz_missing_column(tmp_path):
    t = Trace.from_requests(req_id=["a"], arrival_s=[0.0], prompt_len=[2], output_len=[1], prompt_ids=[[1, 2]])
    write_npz(t, tmp_path / "t.npz")
    z = dict(np.load(tmp_path / "t.npz"))
    del z["prompt_len"]
    np.savez(tmp_path / "bad.npz", **z)
    with pytest.raises(TraceFormatError) as ei:
        read_npz(tmp_path / "bad.npz")
    assert (ei.value.path, ei.value.line, ei.value.field) == (str(tmp_path / "bad.npz"), None, "prompt_len")


def test_npz_inconsistent_columns(tmp_path):
    t = Trace.from_requests(req_id=["a"], arrival_s=[0.0], prompt_len=[2], output_len=[1], prompt_ids=[[1, 2]])
    write_npz(t, tmp_path / "t.npz")
    z = dict(np.load(tmp_path / "t.npz"))
    z["prompt_len"] = np.array([3], dtype=np.int64)  # 2 ids for a 3-token prompt at U = 1
    np.savez(tmp_path / "bad.npz", **z)
    with pytest.raises(TraceFormatError) as ei:
        read_npz(tmp_path / "bad.npz")
    assert ei.value.path == str(tmp_path / "bad.npz") and ei.value.field == "ids"


def test_unknown_format_name_and_content(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("hello\n")
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p)
    assert ei.value.path == str(p)
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p, format="parquet")
    assert ei.value.field == "format"
    q = tmp_path / "y.jsonl"
    q.write_text('{"prompt": "hi"}\n')
    with pytest.raises(TraceFormatError) as ei:
        load_trace(q)
    assert ei.value.path == str(q)


def test_failed_write_leaves_existing_file(tmp_path):
    good = Trace.from_requests(req_id=["a"], arrival_s=[0.0], prompt_len=[2], output_len=[1], prompt_ids=[[1, 2]])
    out = tmp_path / "t.jsonl"
    write_native(good, out)
    before = out.read_bytes()
    bad = good.head(1)
    bad.prompt_len = np.array([0], dtype=np.int64)  # empty prompt: validate() must refuse it
    with pytest.raises(InputError):
        write_native(bad, out)
    assert out.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.jsonl"]  # no temp file left behind
    assert read_native(out).prompt_len.tolist() == [2]


def test_bad_element_position_is_reported(tmp_path):
    # element 2 (0-based) is the float 1.0, although it compares equal to element 0
    p = tmp_path / "t.jsonl"
    p.write_text('{"tokens": [1, 2, 1.0], "output_length": 0}\n')
    with pytest.raises(TraceFormatError) as ei:
        read_native(p)
    assert (ei.value.line, ei.value.field) == (1, "tokens")
    assert "element 2 is float 1.0" in ei.value.reason
