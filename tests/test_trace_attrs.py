"""Trace fields of real traffic (issue 33): tenant, cache_salt, lora, priority, type,
parent_id and multimodal items — read, validated with located errors, kept through the
native writer and ``.npz``; traces without them unchanged."""
from __future__ import annotations

import json

import numpy as np
import pytest

from radixkv.errors import TraceFormatError
from radixkv.trace.load import load_trace, save_trace

LINES = [
    {"id": "a", "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "output_length": 2, "tenant": "t1", "cache_salt": "s1",
     "lora": "L", "priority": -1, "type": "text", "parent_id": "", "mm": [{"hash": "img1", "offset": 2, "length": 3}]},
    {"id": "b", "tokens": [1, 2, 3, 9, 9, 9, 7, 8], "output_length": 2, "tenant": "t2",
     "mm": [{"hash": "img2", "offset": 3, "length": 3}]},
    {"id": "c", "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "output_length": 2, "parent_id": "a", "type": "image"},
]


def _write(tmp_path, lines, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return p


def test_fields_read_and_filled(tmp_path):
    t = load_trace(_write(tmp_path, LINES))
    assert t.tenant.tolist() == ["t1", "t2", ""]
    assert t.cache_salt.tolist() == ["s1", "", ""]
    assert t.lora.tolist() == ["L", "", ""]
    assert t.priority.tolist() == [-1, 0, 0]
    assert t.req_type.tolist() == ["text", "", "image"]
    assert t.parent_id.tolist() == ["", "", "a"]
    assert t.mm_offsets.tolist() == [0, 1, 2, 2]
    assert t.mm_hash.tolist() == ["img1", "img2"]
    assert t.mm_start.tolist() == [2, 3] and t.mm_length.tolist() == [3, 3]
    # the file's ids are kept; the keys differ (salt + LoRA on a, images on a and b)
    assert t.raw_ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 9, 9, 9, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8]
    assert t.ids[16:].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # c: no salt, no image


@pytest.mark.parametrize("ext", ["jsonl", "npz"])
def test_round_trip(tmp_path, ext):
    t = load_trace(_write(tmp_path, LINES))
    out = tmp_path / f"o.{ext}"
    save_trace(t, out)
    u = load_trace(out)
    for col in ("ids", "raw_ids", "tenant", "cache_salt", "lora", "priority", "req_type", "parent_id",
                "mm_offsets", "mm_hash", "mm_start", "mm_length", "prompt_len", "output_len"):
        assert np.array_equal(getattr(u, col), getattr(t, col)), col
    again = tmp_path / f"o2.{ext}"
    save_trace(u, again)
    assert again.read_bytes() == out.read_bytes()


def test_trace_without_fields_is_unchanged(tmp_path):
    lines = [{"id": "x", "tokens": [5, 6, 7], "output_length": 1}, {"id": "y", "tokens": [5, 6], "output_length": 0}]
    t = load_trace(_write(tmp_path, lines))
    assert t.raw_ids is None and t.ids.tolist() == [5, 6, 7, 5, 6]
    assert all(getattr(t, c) is None for c in ("tenant", "cache_salt", "lora", "priority", "req_type", "parent_id",
                                                "mm_offsets"))
    out = tmp_path / "o.jsonl"
    save_trace(t, out)
    assert out.read_text().splitlines()[1] == '{"id":"x","tokens":[5,6,7],"output_length":1,"arrival_s":0.0}'


def test_head_keeps_columns(tmp_path):
    t = load_trace(_write(tmp_path, LINES)).head(2)
    assert t.tenant.tolist() == ["t1", "t2"] and t.mm_offsets.tolist() == [0, 1, 2]
    assert t.raw_ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 9, 9, 9, 7, 8]


@pytest.mark.parametrize("field,value,where,msg", [
    ("tenant", 3, "tenant", "expected a string"),
    ("cache_salt", None, "cache_salt", "expected a string"),
    ("priority", True, "priority", "expected an integer"),
    ("priority", 1.5, "priority", "expected an integer"),
    ("mm", {"hash": "h"}, "mm", "expected a list"),
    ("mm", [{"hash": "h", "offset": 0}], "mm[0].length", "missing field"),
    ("mm", [{"hash": "h", "offset": 0, "length": 0}], "mm[0].length", "must be ≥ 1"),
    ("mm", [{"hash": "", "offset": 0, "length": 1}], "mm[0].hash", "empty content hash"),
    ("mm", [{"hash": "h", "offset": 6, "length": 3}], "mm[0].length", "past the 8-token prompt"),
    ("mm", [{"hash": "h", "offset": 0, "length": 2}, {"hash": "g", "offset": 1, "length": 2}], "mm[1].offset",
     "must not overlap"),
    ("mm", [{"hash": "h", "offset": 0, "length": 2, "kind": "image"}], "mm[0].kind", "unknown field"),
])
def test_located_errors(tmp_path, field, value, where, msg):
    bad = dict(LINES[2], **{field: value})
    p = _write(tmp_path, [LINES[0], bad])
    with pytest.raises(TraceFormatError) as e:
        load_trace(p)
    assert e.value.line == 2 and e.value.field == where and msg in e.value.reason, str(e.value)


def test_one_hash_one_item(tmp_path):
    """A content hash that names two lengths (or two runs of placeholder tokens) is refused,
    naming both lines."""
    other_len = dict(LINES[1], mm=[{"hash": "img1", "offset": 3, "length": 2}])
    with pytest.raises(TraceFormatError) as e:
        load_trace(_write(tmp_path, [LINES[0], other_len]))
    assert e.value.line == 2 and e.value.field == "mm[0].hash" and "line 1" in e.value.reason
    assert "covers 2 tokens here but 3" in e.value.reason
    other_tokens = dict(LINES[1], mm=[{"hash": "img1", "offset": 3, "length": 3}])  # 9 9 9, not 3 4 5
    with pytest.raises(TraceFormatError) as e:
        load_trace(_write(tmp_path, [LINES[0], other_tokens]))
    assert e.value.line == 2 and "placeholder token ids" in e.value.reason
