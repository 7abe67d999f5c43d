"""The fast JSONL id-array path gives exactly what json.loads gives, or the same error."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.errors import TraceFormatError
from radixkv.trace._jsonl_fast import read_records

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000)) // 4
KEYS = ("tokens", "output_tokens")


class Repeated(ValueError):
    """The oracle's refusal of a key given twice in one object."""


def _once(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) < len(keys):
        raise Repeated(keys)
    return dict(pairs)


def plain(path):
    """json.loads on each non-blank line (the oracle), refusing a key given twice in one
    object (json.loads alone would keep the last value), or the error."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f.read().split("\n")):
            if line.strip():
                out.append((i + 1, json.loads(line, object_pairs_hook=_once)))
    return out


def as_lists(records):
    return [(ln, {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in obj.items()})
            for ln, obj in records]


ELEMENT = st.one_of(
    st.integers(0, 10**6).map(str),
    st.integers(0, 2**63 - 1).map(str),
    st.sampled_from(["0", "00", "007", "-1", "1.5", "1e3", "true", "null", '"7"', "[1]", "", " 3 ", "\t4",
                     "99999999999999999999", "123456789012345678", "1234567890123456789"]),
)


@st.composite
def lines(draw):
    els = draw(st.lists(ELEMENT, max_size=8))
    sep = draw(st.sampled_from([",", ", ", " ,", ",,"]))
    arr = "[" + draw(st.sampled_from(["", " "])) + sep.join(els) + "]"
    key = draw(st.sampled_from(['"tokens"', '"tokens" ', '"output_tokens"', '"\\"tokens"', '"tok"']))
    colon = draw(st.sampled_from([":", " : ", ":\t"]))
    extra = draw(st.sampled_from(["", ',"id":"a\\"tokens\\":[1]"', ',"tokens":[5]', ',"x":{"tokens":[2]}',
                                  ',"output_length":3', ',"id":"]"']))
    front = draw(st.sampled_from(["", '"id":"r",']))
    return "{" + front + key + colon + arr + extra + "}"


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.one_of(lines(), st.sampled_from(["", "   ", "{}", "[1]", "{", "not json"])), min_size=1, max_size=4))
def test_same_as_json_loads(tmp_path_factory, text_lines):
    path = tmp_path_factory.mktemp("j") / "t.jsonl"
    path.write_text("\n".join(text_lines))
    try:
        want = plain(path)
    except (json.JSONDecodeError, RecursionError, Repeated):
        with pytest.raises(TraceFormatError) as fast:
            read_records(path, KEYS)
        with pytest.raises(TraceFormatError) as slow:
            read_records(path, ())  # every line through the plain path: the same message
        assert str(fast.value) == str(slow.value)
        return
    if any(not isinstance(o, dict) for _, o in want):
        with pytest.raises(TraceFormatError):
            read_records(path, KEYS)
        return
    got = read_records(path, KEYS)
    assert as_lists(got) == want
    for _, obj in got:
        for k, v in obj.items():
            if isinstance(v, np.ndarray):
                assert k in KEYS and v.dtype == np.int64 and (v >= 0).all()


def test_error_names_line_and_column_as_the_plain_reader(tmp_path):
    from radixkv.trace._fields import parse_json_line

    bad = '{"tokens":[1,2,3],"output_length":3,}'
    path = tmp_path / "t.jsonl"
    path.write_text('{"tokens":[1],"output_length":1}\n\n' + bad + "\n")
    with pytest.raises(TraceFormatError) as fast:
        read_records(path, KEYS)
    with pytest.raises(TraceFormatError) as slow:
        parse_json_line(bad, path, 3)
    assert str(fast.value) == str(slow.value)
    assert "line 3" in str(fast.value)


def test_non_ascii_and_crlf_files_take_the_plain_path(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id":"é","tokens":[1,2]}\r\n{"tokens":[3]}\r\n', newline="")
    got = as_lists(read_records(path, KEYS))
    assert got == [(1, {"id": "é", "tokens": [1, 2]}), (2, {"tokens": [3]})]


def test_simple_lines_come_back_as_int64_arrays(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id":"a","tokens":[0, 17,9],"output_tokens":[]}\n')
    ((ln, obj),) = read_records(path, KEYS)
    assert ln == 1 and obj["id"] == "a"
    assert type(obj["tokens"]) is np.ndarray and obj["tokens"].tolist() == [0, 17, 9]
    assert type(obj["output_tokens"]) is np.ndarray and obj["output_tokens"].size == 0


@pytest.mark.parametrize("line, field", [
    ('{"id":"a","tokens":[1,2],"output_length":3,"output_length":4}', "output_length"),  # beside an id array
    ('{"id":"a","tokens":[1,2],"output_length":3,"tokens":[1,2,5]}', "tokens"),  # the id array itself
    ('{"id":"a","tokens":[1,2],"meta":{"k":1,"k":2}}', "k"),  # in a nested object
])
def test_a_key_given_twice_is_refused_on_both_paths_naming_line_and_key(tmp_path, line, field):
    # json.loads keeps the last value; before the fix the record was read with it
    path = tmp_path / "t.jsonl"
    path.write_text('{"id":"z","tokens":[7],"output_length":1}\n' + line + "\n")
    with pytest.raises(TraceFormatError) as fast:
        read_records(path, KEYS)
    with pytest.raises(TraceFormatError) as slow:
        read_records(path, ())
    assert str(fast.value) == str(slow.value)
    assert str(fast.value).startswith(f"{path}, line 2, field '{field}': ")
    assert (fast.value.line, fast.value.field) == (2, field)
