"""Format detection, native-format semantics, RAGPulse and Azure representations, and the
WEKA multi-file layout — on small hand-written files whose expected traces are worked out
in the comments."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN_LOCAL, shared_path
from radixkv.trace.binary import read_npz, write_npz
from radixkv.trace.detect import detect_format
from radixkv.trace.load import load_trace
from radixkv.trace.native import read_native, write_native
from radixkv.trace.types import Trace


# ----------------------------------------------------------------- detection
@pytest.mark.parametrize(
    "parts, fmt",
    [
        (("traces", "mooncake-fast25", "conversation_trace.jsonl"), "mooncake"),
        (("traces", "weka-claude-code", "traces"), "weka"),
        (("traces", "weka-claude-code", "traces", "trace_0002.json"), "weka"),
        (("traces", "ragpulse"), "ragpulse"),
        (("traces", "ragpulse", "0_trace.jsonl"), "ragpulse"),
        (("traces", "azure-llm-2023", "AzureLLMInferenceTrace_conv.csv"), "azure"),
    ],
)
def test_detect_public(parts, fmt):
    assert detect_format(shared_path(*parts)) == fmt


def test_detect_native_and_npz(tmp_path):
    g = GOLDEN_LOCAL / "traces" / "edge300.jsonl"
    assert detect_format(g) == "native"
    t = read_native(g)
    write_npz(t, tmp_path / "x.npz")
    write_native(t, tmp_path / "x.jsonl")  # with header
    assert detect_format(tmp_path / "x.npz") == "npz"
    assert detect_format(tmp_path / "x.jsonl") == "native"
    (tmp_path / "h.jsonl").write_text('{"hash_ids": [3], "input_length": 1, "output_length": 0}\n')
    assert detect_format(tmp_path / "h.jsonl") == "native"


# ----------------------------------------------------------------- native semantics
def test_native_defaults_sort_and_columns(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"radixkv_trace": 1, "unit_tokens": 4, "partial_last_unit": true}\n'
        '{"hash_ids": [5, 6], "input_length": 7, "output_length": 1, "arrival_s": 2}\n'
        '\n'
        '{"hash_ids": [5], "input_length": 4, "output_length": 0, "arrival_s": 1, "session_id": "s", "turn": 3}\n'
        '{"id": "z", "hash_ids": [9], "input_length": 1, "output_length": 2, "arrival_s": 1}\n'
    )
    t = read_native(p)
    # default ids are the 0-based request index ("0", "1", "2"); stable sort by arrival:
    # "1" (1 s) and "z" (1 s, later in the file) before "0" (2 s)
    assert list(t.req_id) == ["1", "z", "0"]
    assert t.unit_tokens == 4 and t.partial_last_unit
    assert t.prompt_len.tolist() == [4, 1, 7]
    assert t.ids.tolist() == [5, 9, 5, 6]
    assert list(t.session_id) == ["s", "", ""] and t.turn.tolist() == [3, -1, -1]
    assert t.out_ids is None


def test_native_output_tokens_with_matching_length(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"tokens": [1, 2], "output_tokens": [7, 8, 9], "output_length": 3}\n')
    t = read_native(p)
    assert t.output_len.tolist() == [3] and t.out_ids.tolist() == [7, 8, 9]
    assert t.session_id is None and t.turn is None


def test_npz_round_trip_every_optional_column(tmp_path):
    base = dict(req_id=["x", "y"], arrival_s=[0.25, 0.125], prompt_len=[3, 2], output_len=[2, 0],
                prompt_ids=[[1, 2, 3], [1, 4]])
    variants = [
        Trace.from_requests(**base, name="plain"),
        Trace.from_requests(**base, output_ids=[[5, 6], []], session_id=["a", ""], turn=[0, -1], name="full"),
        Trace.from_requests(req_id=["m"], arrival_s=[0.0], prompt_len=[9], output_len=[1], prompt_ids=[[4, 4, 8]],
                            unit_tokens=4, partial_last_unit=True, name="units"),
        Trace.from_requests(req_id=[], arrival_s=[], prompt_len=[], output_len=[], prompt_ids=[], name="empty"),
    ]
    for t in variants:
        write_npz(t, tmp_path / "t.npz")
        u = read_npz(tmp_path / "t.npz")
        for col in ("req_id", "arrival_s", "prompt_len", "output_len", "ids", "id_offsets"):
            assert np.array_equal(getattr(t, col), getattr(u, col)), (t.name, col)
        for col in ("out_ids", "out_offsets", "session_id", "turn"):
            a, b = getattr(t, col), getattr(u, col)
            assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), (t.name, col)
        assert (u.unit_tokens, u.partial_last_unit, u.name) == (t.unit_tokens, t.partial_last_unit, t.name)


# ----------------------------------------------------------------- RAGPulse representation
def test_ragpulse_units_hand_worked(tmp_path):
    d = tmp_path / "rp"
    d.mkdir()
    (d / "1_sys_prompt.jsonl").write_text('{"sys_prompt_id": 100, "token_length": 8}\n')
    (d / "2_passages.jsonl").write_text('{"passage_id": 0, "token_length": 6}\n{"passage_id": 1, "token_length": 6}\n')
    (d / "3_history.jsonl").write_text("")
    (d / "4_user_input.jsonl").write_text('{"user_input_id": 300, "token_length": 3}\n')
    (d / "5_web_search.jsonl").write_text("")

    def rec(ts, passages, n_in):
        return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": 1, "session_id": "s",
                           "hash_ids": {"sys_prompt": [100], "passages_ids": passages, "history": [],
                                        "web_search": [], "user_input": [300]}}) + "\n"

    # line 0 at t=5: sys(8) p0(6) user(3) + 2 template = 19 tokens → floor(19/4) = 4 units
    #   unit0 [0,4) and unit1 [4,8) end in sys; unit2 [8,12) ends in p0; unit3 [12,16) ends in user
    #   (token 15 is in user [14,17)); tail 3 tokens unique.
    # line 1 at t=1: sys(8) p1(6) user(3) + 1 = 18 tokens → 4 units; units 0-1 = same sys prefix,
    #   unit2 ends in p1 (different chain) → new id.
    # line 2 at t=9: sys p0 user, input 17 (no template) → 4 units, the same 4 as line 0's.
    (d / "0_trace.jsonl").write_text(rec("5", [0], 19) + rec("1", [1], 18) + rec("9", [0], 17))
    t = load_trace(d, unit_tokens=4)
    assert list(t.req_id) == ["r1", "r0", "r2"]  # sorted by timestamp
    assert t.unit_tokens == 4 and not t.partial_last_unit
    p = [t.prompt_ids(i).tolist() for i in range(3)]
    assert p[0][:2] == p[1][:2] and p[0][2] != p[1][2]  # shared system prompt, then divergence
    assert p[2] == p[1]  # identical chunk chain → identical units
    assert len(set(p[0][2:]) | set(p[1][2:])) == 4
    assert t.turn.tolist() == [0, 1, 2]


def test_ragpulse_component_order_hand_worked(tmp_path):
    # two prompts, U = 4: sys S (8) + passage p0 (4) + history h1 / h2 (4) + user u1 / u2 (4)
    # = 20 tokens = 5 units each. Keys' order (S, p0, h, u): the second shares S and p0 =
    # 3 units = 12 tokens with an infinite cache. History before passages (S, h, p0, u): it
    # shares S only = 2 units = 8 tokens.
    from radixkv.errors import TraceFormatError
    from radixkv.trace.ragpulse import read_ragpulse
    from radixkv.trace.stats import infinite_cache_hits

    d = tmp_path / "rp"
    d.mkdir()
    (d / "1_sys_prompt.jsonl").write_text('{"sys_prompt_id": 1, "token_length": 8}\n')
    (d / "2_passages.jsonl").write_text('{"passage_id": 0, "token_length": 4}\n')
    (d / "3_history.jsonl").write_text('{"history_id": 1, "token_length": 4}\n{"history_id": 2, "token_length": 4}\n')
    (d / "4_user_input.jsonl").write_text('{"user_input_id": 1, "token_length": 4}\n'
                                          '{"user_input_id": 2, "token_length": 4}\n')
    (d / "5_web_search.jsonl").write_text("")
    (d / "0_trace.jsonl").write_text("".join(
        json.dumps({"timestamp": str(k), "input_length": 20, "output_length": 1, "session_id": f"s{k}",
                    "hash_ids": {"sys_prompt": [1], "passages_ids": [0], "history": [k], "web_search": [],
                                 "user_input": [k]}}) + "\n" for k in (1, 2)))
    assert infinite_cache_hits(read_ragpulse(d, unit_tokens=4)).tolist() == [0, 12]
    hist_first = ("sys_prompt", "history", "passages_ids", "web_search", "user_input")
    assert infinite_cache_hits(read_ragpulse(d, unit_tokens=4, order=hist_first)).tolist() == [0, 8]
    with pytest.raises(TraceFormatError, match="order"):
        read_ragpulse(d, unit_tokens=4, order=("sys_prompt", "history"))


# ----------------------------------------------------------------- Azure representation
def test_azure_hand_worked(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,4808,10\n"
                 "2023-11-16 18:17:04.0319600,3180,8\n"
                 "2023-11-16 18:17:03.9799600,7,1\n")
    t = load_trace(p)
    # arrivals relative to the earliest row: 0, 0.052 s, 0 → stable order r0, r2, r1
    assert list(t.req_id) == ["r0", "r2", "r1"]
    assert t.arrival_s.tolist() == [0.0, 0.0, pytest.approx(0.052)]
    assert t.ids.size == 0 and t.unit_tokens == 1 << 20 and not t.partial_last_unit
    assert t.kv_seq(0).seg_id.tolist()[0] < 0  # the whole prompt is unique content


# ----------------------------------------------------------------- WEKA layout
def _conv(cid, requests):
    return json.dumps({"id": cid, "block_size": 4, "hash_id_scope": "local", "requests": requests})


def test_weka_directory_namespaces_and_spacing(tmp_path):
    d = tmp_path / "w"
    d.mkdir()
    # both files use ids 1, 2: they must not collide after renumbering
    (d / "b.json").write_text(_conv("B", [{"t": 0.0, "type": "n", "in": 9, "out": 1, "hash_ids": [1, 2]}]))
    (d / "a.json").write_text(_conv("A", [{"t": 0.0, "type": "s", "in": 8, "out": 1, "hash_ids": [1, 2]},
                                          {"t": 5.0, "type": "n", "in": 12, "out": 1, "hash_ids": [1, 2, 7]}]))
    t = load_trace(d)
    # sorted file order a.json, b.json; all conversations start at 0:
    # arrivals A0=0, A1=5, B0=0 → replay A0, B0, A1
    assert list(t.session_id) == ["A", "B", "A"] and list(t.req_id) == ["r0", "r1", "r2"]
    # a.json ids {1,2,7} → 0,1,2; b.json ids {1,2} → 3,4
    assert [t.prompt_ids(i).tolist() for i in range(3)] == [[0, 1], [3, 4], [0, 1, 2]]
    s = load_trace(d, conversation_spacing_s=100.0)
    assert s.arrival_s.tolist() == [0.0, 5.0, 100.0] and list(s.session_id) == ["A", "A", "B"]


def test_weka_subagent_without_duration(tmp_path):
    p = tmp_path / "c.json"
    # no duration_ms: the sub-agent's last request (t=4, api_time 2) ends at the marker's t=20 → start 14
    p.write_text(_conv("C", [{"t": 0.0, "type": "n", "in": 4, "out": 1, "hash_ids": [1]},
                             {"t": 20.0, "type": "subagent", "agent_id": "x",
                              "requests": [{"t": 0.0, "type": "n", "in": 4, "out": 1, "hash_ids": [9]},
                                           {"t": 4.0, "type": "n", "in": 4, "out": 1, "hash_ids": [9], "api_time": 2.0}]}]))
    t = load_trace(p)
    assert t.arrival_s.tolist() == [0.0, 14.0, 18.0]
    assert list(t.session_id) == ["C", "C/x", "C/x"] and t.turn.tolist() == [0, 0, 1]


def test_ragpulse_round_trip_public(tmp_path):
    t = load_trace(shared_path("traces", "ragpulse"))
    write_npz(t, tmp_path / "r.npz")
    u = read_npz(tmp_path / "r.npz")
    assert np.array_equal(t.ids, u.ids) and list(t.session_id) == list(u.session_id) and u.name == t.name
