"""``radixkv trace inspect | convert`` end to end through the CLI entry point."""
from __future__ import annotations

import json

import numpy as np

from conftest import GOLDEN_LOCAL, shared_path
from radixkv.cli import main
from radixkv.trace.load import load_trace

TOKENS = (
    '{"id": "a", "tokens": [1, 2, 3, 4], "output_length": 2, "arrival_s": 1.5}\n'
    '{"id": "b", "tokens": [1, 2, 3, 9, 9, 9], "output_length": 0, "arrival_s": 0.5}\n'
)


def test_inspect_json_hand_worked(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    p.write_text(TOKENS)
    assert main(["trace", "inspect", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # replay order: b (0.5 s) then a (1.5 s); a hits [1,2,3] of b → 3 of 4 tokens
    assert d["requests"] == 2 and d["unit_tokens"] == 1
    assert d["prompt_tokens"]["total"] == 10 and d["output_tokens"]["total"] == 2
    assert d["prompt_tokens"]["p50"] == 5.0  # median of 4 and 6
    assert d["distinct_ids"] == 5  # 1, 2, 3, 4, 9
    assert d["time_span_s"] == 1.0
    assert d["infinite_cache_hit_ratio"]["hit_tokens"] == 3
    assert d["infinite_cache_hit_ratio"]["token_weighted"] == 0.3
    assert d["infinite_cache_hit_ratio"]["mean_per_request"] == (0 + 3 / 4) / 2


def test_inspect_limit_and_table(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    p.write_text(TOKENS)
    assert main(["trace", "inspect", str(p), "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "requests           1" in out and "hit ratio: 0.0000" in out


def test_convert_round_trip_and_format_option(tmp_path, capsys):
    src = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    out = tmp_path / "m.npz"
    assert main(["trace", "convert", str(src), str(out), "--format", "mooncake", "--limit", "500"]) == 0
    a = load_trace(src).head(500)
    b = load_trace(out)
    assert b.unit_tokens == 512 and b.partial_last_unit and len(b) == 500
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.id_offsets, b.id_offsets)
    assert list(a.req_id) == list(b.req_id)
    jl = tmp_path / "m.jsonl"
    assert main(["trace", "convert", str(out), str(jl)]) == 0
    c = load_trace(jl)
    assert np.array_equal(c.ids, b.ids) and np.array_equal(c.arrival_s, b.arrival_s)


def test_cli_errors_exit_2(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    p.write_text(TOKENS + '{"tokens": [1], "output_length": -1}\n')
    assert main(["trace", "inspect", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}, line 3, field 'output_length'" in err
    q = tmp_path / "ok.jsonl"
    q.write_text(TOKENS)
    assert main(["trace", "convert", str(q), str(tmp_path / "out.parquet")]) == 2
    assert not (tmp_path / "out.parquet").exists()
    assert main(["trace", "inspect", str(q), "--format", "nope"]) == 2
    assert main(["trace", "inspect", str(q), "--limit", "-3"]) == 2


def test_convert_golden_native_to_npz_is_deterministic(tmp_path):
    src = GOLDEN_LOCAL / "traces" / "mixed200.jsonl"
    assert main(["trace", "convert", str(src), str(tmp_path / "a.npz")]) == 0
    assert main(["trace", "convert", str(src), str(tmp_path / "b.npz")]) == 0
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_inspect_of_a_converted_trace_names_the_file_read_and_its_source(tmp_path, capsys):
    src = tmp_path / "t.jsonl"
    src.write_text(TOKENS)
    npz = tmp_path / "t.npz"
    assert main(["trace", "convert", str(src), str(npz)]) == 0
    capsys.readouterr()
    assert main(["trace", "inspect", str(npz)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["trace", str(npz)]
    assert lines[1].split() == ["converted", "from", str(src)]
    assert main(["trace", "inspect", str(src)]) == 0
    assert "converted from" not in capsys.readouterr().out


def test_a_key_given_twice_in_a_record_exits_2_naming_file_line_and_key(tmp_path, capsys, monkeypatch):
    # json.loads keeps the last of two values; the record must be refused, not read with it
    monkeypatch.setenv("RADIXKV_TRACE_CACHE", "off")
    for fmt, text, field in [
        ("native", TOKENS + '{"id": "c", "tokens": [5], "output_length": 1, "output_length": 9}\n', "output_length"),
        ("mooncake", '{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n'
                     '{"timestamp": 5, "timestamp": 9, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n',
         "timestamp"),
    ]:
        p = tmp_path / f"{fmt}.jsonl"
        p.write_text(text)
        line = len(text.splitlines())
        assert main(["trace", "inspect", str(p), "--format", fmt]) == 2
        err = capsys.readouterr().err
        assert f"{p}, line {line}, field '{field}': the key is given twice" in err and "Traceback" not in err


def test_a_header_only_trace_exits_2_saying_no_requests_in_the_file(tmp_path, capsys, monkeypatch):
    # before the fix: loaded as an empty trace, then refused by `replay` naming field 'limit'
    monkeypatch.setenv("RADIXKV_TRACE_CACHE", "off")
    p = tmp_path / "header_only.jsonl"
    p.write_text('\n{"radixkv_trace": 1, "unit_tokens": 1, "partial_last_unit": false}\n\n')
    for argv in (["trace", "inspect", str(p)], ["replay", str(p), "--policy", "vllm:16", "--capacity-tokens", "1000"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{p}: no requests in the file: it holds only the header (line 2)" in err
        assert "limit" not in err and "Traceback" not in err
