"""Trace readers: requests out of time order are sorted with a warning (file, count, first
line), and bad input found while *detecting* the format still names file, line and field.

Every expected count, line and field is read off the hand-written file by eye."""
from __future__ import annotations

import json
import warnings

import pytest

from radixkv.cli import main
from radixkv.errors import InputWarning, TraceFormatError
from radixkv.trace.load import load_trace


def _mc(ts, hash_ids=(0, 1), input_length=600):
    return json.dumps({"timestamp": ts, "input_length": input_length, "output_length": 3,
                       "hash_ids": list(hash_ids)}) + "\n"


def _quiet_load(path):
    """Load *path* and return (trace, the InputWarnings raised)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        t = load_trace(path)
    return t, [w for w in got if issubclass(w.category, InputWarning)]


# ---------------------------------------------------------------- out of time order

def test_mooncake_out_of_order_warns_with_file_count_and_first_line(tmp_path):
    # lines 3 and 4 (1000, 2000 ms) come after line 2 (3000 ms): 2 of 5 out of order
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(_mc(t) for t in (0, 3000, 1000, 2000, 4000)))
    t, ws = _quiet_load(p)
    assert len(ws) == 1
    w = ws[0].message
    assert (w.path, w.line, w.field) == (str(p), 3, "timestamp")
    assert "2 of 5 requests" in str(w) and "line 3 (1000) comes after line 2 (3000)" in str(w)
    assert list(t.req_id) == ["r0", "r2", "r3", "r1", "r4"]  # stable sort by time
    assert list(t.arrival_s) == [0.0, 1.0, 2.0, 3.0, 4.0]
    t2, ws2 = _quiet_load(p)
    assert str(ws2[0].message) == str(w)  # same file, same message


def test_in_order_files_and_ties_do_not_warn(tmp_path):
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(_mc(t) for t in (0, 0, 5, 5, 9)))
    _, ws = _quiet_load(p)
    assert ws == []


def test_cli_prints_the_warning_once_and_goes_on(tmp_path, capsys):
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(_mc(t) for t in (10, 0, 20)))
    assert main(["trace", "inspect", str(p), "--json", "-"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["requests"] == 3
    lines = [ln for ln in cap.err.splitlines() if ln.startswith("radixkv: warning:")]
    assert lines == [f"radixkv: warning: {p}, line 2, field 'timestamp': 1 of 3 requests are out of time order "
                     f"(earlier than a request on a line before them); they are sorted into time order (stable: "
                     f"ties keep file order). First: line 2 (0) comes after line 1 (10)"]


def test_azure_out_of_order_by_100_ns_is_seen_and_named_by_its_timestamp_text(tmp_path):
    # the second row is 1 tick (100 ns) earlier than the first: float64 seconds since year 1
    # could not tell them apart, int64 ticks can
    p = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805901,374,44\n2023-11-16 18:15:46.6805900,10,1\n")
    t, ws = _quiet_load(p)
    assert len(ws) == 1 and ws[0].message.line == 3 and ws[0].message.field == "TIMESTAMP"
    assert "line 3 (2023-11-16 18:15:46.6805900) comes after line 2 (2023-11-16 18:15:46.6805901)" in str(ws[0].message)
    assert list(t.prompt_len) == [10, 374]


def test_native_out_of_order_arrivals_warn(tmp_path):
    p = tmp_path / "n.jsonl"
    p.write_text('{"radixkv_trace": 1, "unit_tokens": 1}\n'
                 '{"id": "a", "tokens": [1], "output_length": 1, "arrival_s": 2.5}\n'
                 '{"id": "b", "tokens": [2], "output_length": 1, "arrival_s": 0.5}\n')
    t, ws = _quiet_load(p)
    assert len(ws) == 1 and ws[0].message.line == 3 and ws[0].message.field == "arrival_s"
    assert "line 3 (0.5) comes after line 2 (2.5)" in str(ws[0].message)
    assert list(t.req_id) == ["b", "a"]


# ---------------------------------------------------------------- bad input at detection

@pytest.mark.parametrize("name, text, line, field", [
    # a native line without tokens: the native reader's error, not "unknown trace format"
    ("no_tokens.jsonl", '{"id": "a", "output_length": 3}\n', 1, "tokens"),
    ("prompt_typo.jsonl", '{"id": "a", "prompt": [1, 2], "output_length": 3}\n', 1, "prompt"),
    # a Mooncake line missing one field: 2 ids for 600 tokens are 512-token blocks, not tokens
    ("mc_no_ts.jsonl", '{"input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n', 1, "timestamp"),
    ("mc_no_hash.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 3}\n', 1, "hash_ids"),
    ("mc_str_len.jsonl", '{"timestamp": 0, "input_length": "600", "output_length": 3, "hash_ids": [1, 2]}\n',
     1, "input_length"),
    ("tokens_not_list.jsonl", '\n\n{"tokens": "1 2 3", "output_length": 3}\n', 3, "tokens"),
    ("neg_output.jsonl", '{"tokens": [1, 2], "output_length": -3}\n', 1, "output_length"),
    ("int_id.jsonl", '{"id": 7, "tokens": [1, 2], "output_length": 3}\n', 1, "id"),
    ("truncated_first.jsonl", '{"tokens": [1, 2], "outp', 1, None),
    ("truncated_second.jsonl", '{"tokens": [1, 2], "output_length": 3}\n{"tokens": [1', 2, None),
    ("list_line.jsonl", "[1, 2, 3]\n", 1, None),
    ("no_known_key.jsonl", '{"foo": 1}\n', 1, None),
    ("az_short_row.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374\n",
     2, "GeneratedTokens"),
    ("az_one_field.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900\n",
     2, "ContextTokens"),
])
def test_bad_first_records_name_file_line_and_field(tmp_path, name, text, line, field):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(p), line, field), str(e)
    assert "unknown trace format" not in str(e) or field is None


def test_truncated_pretty_printed_document_names_the_line_of_the_break(tmp_path):
    p = tmp_path / "conv.json"
    p.write_text('{\n  "id": "c1",\n  "block_size": 64,\n  "requests": [\n'
                 '    {"type": "n", "t": 0, "in": 64, "out": 1, "hash_ids": [1]},\n'
                 '    {"type": "n", "t": 1, "in": 64, "out"\n')
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p)
    assert ei.value.line == 7 and "invalid JSON" in str(ei.value)  # the document ends after line 6


@pytest.mark.parametrize("name", ["t.jsonl", "conv.json"])
def test_not_utf8_names_the_line(tmp_path, name):
    p = tmp_path / name
    body = (b'{"tokens": [1], "output_length": 1}\n{"id": "\xe9", "tokens": [2], "output_length": 1}\n'
            if name.endswith("l") else b'{"id": "c", "block_size": 4,\n "requests": [], "x": "\xe9"}')
    p.write_bytes(body)
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p)
    assert ei.value.line == 2 and "not UTF-8" in str(ei.value)


def test_bom_and_crlf_read_as_the_plain_file(tmp_path):
    plain = "".join(_mc(t) for t in (0, 1000))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(plain)
    b.write_bytes(b"\xef\xbb\xbf" + plain.replace("\n", "\r\n").encode())
    ta, tb = load_trace(a), load_trace(b)
    assert list(ta.arrival_s) == list(tb.arrival_s) == [0.0, 1.0]
    assert ta.ids.tolist() == tb.ids.tolist() == [0, 1, 0, 1]


def test_a_forced_format_that_does_not_fit_says_what_the_file_is_not(tmp_path):
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(_mc(t, hash_ids=range(2)) for t in (0, 1000)))
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p, format="npz")  # numpy alone calls any text file "pickled (object) data"
    assert "no zip header" in str(ei.value) and "pickle" not in str(ei.value)
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p, format="weka")
    assert ei.value.line == 2 and "JSON Lines" in str(ei.value)
    long = tmp_path / "long.jsonl"
    long.write_text(_mc(0, hash_ids=range(200), input_length=200 * 512))
    with pytest.raises(TraceFormatError) as ei:
        load_trace(long, format="azure")
    assert len(long.read_text()) > 900
    assert ei.value.field == "header" and len(str(ei.value)) < len(str(long)) + 300  # the line is cut short


def test_convert_refuses_an_unknown_output_extension_before_reading(tmp_path, capsys, monkeypatch):
    import radixkv.trace.load as L

    read = []
    real = L.load_trace
    monkeypatch.setattr(L, "load_trace", lambda *a, **k: read.append(a) or real(*a, **k))
    src = tmp_path / "in.jsonl"
    src.write_text(_mc(0))
    assert main(["trace", "convert", str(src), str(tmp_path / "out.csv")]) == 2
    assert "use .npz or .jsonl" in capsys.readouterr().err
    assert read == [] and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_a_forced_format_error_says_what_the_content_looks_like(tmp_path):
    p = tmp_path / "mc.jsonl"
    p.write_text(_mc(0))
    with pytest.raises(TraceFormatError) as ei:
        load_trace(p, format="native")
    e = ei.value
    assert (e.line, e.field) == (1, "timestamp") and "its content looks like mooncake" in str(e)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_mc(0) + _mc(-1))  # a Mooncake file with a bad line 2: no format hint
    with pytest.raises(TraceFormatError) as ei:
        load_trace(bad, format="mooncake")
    assert ei.value.line == 2 and "looks like" not in str(ei.value)
