"""The Qwen-Bailian reader (issue 33) on a file written by hand: sessions, a partial last
block, every request type; malformed lines give located errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.errors import TraceFormatError
from radixkv.trace.detect import detect_format
from radixkv.trace.load import load_trace

HAND = Path(__file__).parent / "data" / "bailian" / "hand.jsonl"


def test_detected_and_read():
    assert detect_format(HAND) == "bailian"
    t = load_trace(HAND)
    assert t.unit_tokens == 16 and t.partial_last_unit
    assert t.req_id.tolist() == ["10", "11", "12", "13", "14"]
    assert t.req_type.tolist() == ["text", "search", "image", "file", "text"]
    assert t.turn.tolist() == [1, 2, 1, 3, 1]
    assert t.parent_id.tolist() == ["", "10", "", "11", ""]
    # 13 → 11 → 10: one session rooted at 10; 12 and 14 are roots of their own
    assert t.session_id.tolist() == ["10", "10", "12", "10", "14"]
    assert t.arrival_s.tolist() == [0.0, 1.5, 2.0, 3.0, 3.5]
    assert t.prompt_len.tolist() == [40, 70, 32, 90, 16]
    # request 10: 40 tokens = two 16-token blocks and a partial one of 8 tokens
    seq = t.kv_seq(0)
    assert seq.seg_id[:3].tolist() == [1, 2, 3] and seq.seg_end[:3].tolist() == [16, 32, 40]


def test_hits_hand_worked():
    """Infinite pool, one request at a time. vLLM (block 16): 11 hits blocks 1, 2 (32);
    12 (32 tokens = 2 blocks) is capped at (32−1)//16 = 1 block (16); 13 hits 1, 2, 4, 5 of
    request 11 (64; cap 89//16 = 5 blocks); 10 and 14 are first / single-block: 0. Total 112.
    SGLang (page 1): the same but 12 is capped at 31 tokens: 127."""
    from radixkv.policies.registry import PoolSpec
    from radixkv.replay.run import run_replay
    from radixkv.policies.registry import parse_policy

    t = load_trace(HAND)
    for spec, hits in (("vllm:16", [0, 32, 16, 64, 0]), ("sglang:1", [0, 32, 31, 64, 0])):
        rec, summ = run_replay(t, parse_policy(spec), PoolSpec(capacity_tokens=100_000), quiet=True)
        assert rec["hit_tokens"].tolist() == hits, spec


def _line(**kw):
    base = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 20, "output_length": 3,
            "type": "text", "turn": 1, "hash_ids": [7, 8]}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


@pytest.mark.parametrize("kw,field,msg", [
    ({"chat_id": _DROP}, "chat_id", "missing field"),
    ({"timestamp": _DROP}, "timestamp", "missing field"),
    ({"hash_ids": [7]}, "hash_ids", "expected ceil(20/16) = 2"),
    ({"hash_ids": [7, 8, 9]}, "hash_ids", "expected ceil(20/16) = 2"),
    ({"input_length": 0, "hash_ids": []}, "input_length", "empty prompt"),
    ({"turn": True}, "turn", "expected an integer"),
    ({"type": 3}, "type", "expected a string"),
    ({"parent_chat_id": -2}, "parent_chat_id", "must be ≥ -1"),
    ({"parent_chat_id": 5, "chat_id": 5}, "parent_chat_id", "its own parent"),
    ({"chat_id": 0}, "chat_id", "repeats the chat_id of line 1"),
    ({"hash_ids": [7, -8]}, "hash_ids", "negative"),
])
def test_malformed_line(tmp_path, kw, field, msg):
    p = tmp_path / "b.jsonl"
    first = _line(chat_id=0, hash_ids=[7, 9], input_length=32)
    p.write_text(json.dumps(first) + "\n" + json.dumps(_line(**kw)) + "\n")
    with pytest.raises(TraceFormatError) as e:
        load_trace(p, format="bailian")
    assert e.value.line == 2 and e.value.field == field and msg in e.value.reason, str(e.value)


def test_partial_block_covers_one_length(tmp_path):
    """Id 9 covers 4 tokens on line 1 (a partial last block) and 16 on line 2: refused."""
    p = tmp_path / "b.jsonl"
    p.write_text(json.dumps(_line(chat_id=0, hash_ids=[7, 9], input_length=20)) + "\n"
                 + json.dumps(_line(chat_id=1, hash_ids=[7, 9], input_length=32)) + "\n")
    with pytest.raises(TraceFormatError) as e:
        load_trace(p)
    assert e.value.line == 2 and e.value.field == "hash_ids" and "covers 16 tokens here but 4" in e.value.reason


def test_missing_parent_and_defaults(tmp_path):
    """A parent not in the file heads its session; parent_chat_id and turn default to −1 and 1."""
    p = tmp_path / "b.jsonl"
    p.write_text(json.dumps(_line(chat_id=3, parent_chat_id=99)) + "\n"
                 + json.dumps(_line(chat_id=4, parent_chat_id=_DROP, turn=_DROP, type=_DROP)) + "\n")
    t = load_trace(p)
    assert t.session_id.tolist() == ["99", "4"] and t.parent_id.tolist() == ["99", ""]
    assert t.turn.tolist() == [1, 1] and t.req_type.tolist() == ["text", ""]


def test_round_trip_native(tmp_path):
    t = load_trace(HAND)
    out = tmp_path / "b.jsonl"
    from radixkv.trace.load import save_trace

    save_trace(t, out)
    u = load_trace(out)
    assert detect_format(out) == "native"
    for col in ("req_type", "parent_id", "session_id", "turn", "ids", "prompt_len"):
        assert getattr(u, col).tolist() == getattr(t, col).tolist()
