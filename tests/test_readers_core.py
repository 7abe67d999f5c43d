"""Native, Mooncake, WEKA and npz readers on real files; expected values come from the
SOURCE.md statistics (computed independently when the files were copied) and from the
golden replays' ``id`` / ``prompt_len`` columns (produced by the real engines' harness)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN_LOCAL, shared_path
from radixkv.trace.binary import read_npz, write_npz
from radixkv.trace.load import load_trace, save_trace
from radixkv.trace.native import read_native, write_native


def assert_same_trace(a, b, *, name=True):
    """Every column equal, including which optional columns are None."""
    for col in ("req_id", "arrival_s", "prompt_len", "output_len", "ids", "id_offsets"):
        x, y = getattr(a, col), getattr(b, col)
        assert x.dtype.kind == y.dtype.kind, col
        assert np.array_equal(x, y), col
    for col in ("out_ids", "out_offsets", "session_id", "turn"):
        x, y = getattr(a, col), getattr(b, col)
        assert (x is None) == (y is None), col
        if x is not None:
            assert np.array_equal(x, y), col
    assert a.unit_tokens == b.unit_tokens
    assert a.partial_last_unit == b.partial_last_unit
    if name:
        assert a.name == b.name


# ----------------------------------------------------------------- golden token traces
@pytest.mark.parametrize("trace_name", ["mixed200.jsonl", "edge300.jsonl"])
def test_golden_native_matches_golden_runs(trace_name):
    t = read_native(GOLDEN_LOCAL / "traces" / trace_name)
    run = "vllm_mixed200_b16_n100000.jsonl" if trace_name.startswith("mixed") else "vllm_edge300_b16_n40.jsonl"
    rows = [json.loads(s) for s in open(GOLDEN_LOCAL / "vllm" / run)]
    assert t.unit_tokens == 1 and t.out_ids is not None
    assert list(t.req_id) == [r["id"] for r in rows]
    assert t.prompt_len.tolist() == [r["prompt_len"] for r in rows]
    # the raw file lines, independently: tokens and output_tokens as given
    raw = [json.loads(s) for s in open(GOLDEN_LOCAL / "traces" / trace_name)]
    for i in (0, len(raw) // 2, len(raw) - 1):
        assert t.prompt_ids(i).tolist() == raw[i]["tokens"]
        assert t.output_ids(i).tolist() == raw[i]["output_tokens"]


@pytest.mark.parametrize("trace_name", ["mixed200.jsonl", "edge300.jsonl"])
def test_golden_round_trips_native_and_npz(tmp_path, trace_name):
    t = read_native(GOLDEN_LOCAL / "traces" / trace_name)
    write_native(t, tmp_path / "a.jsonl")
    t2 = read_native(tmp_path / "a.jsonl")
    assert_same_trace(t, t2, name=False)
    write_npz(t2, tmp_path / "a.npz")
    t3 = read_npz(tmp_path / "a.npz")
    assert_same_trace(t2, t3)
    # same trace, same bytes
    write_npz(t2, tmp_path / "b.npz")
    write_native(t3, tmp_path / "b.jsonl")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


# ----------------------------------------------------------------- Mooncake
def test_mooncake_conversation_statistics():
    p = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    t = load_trace(p)
    # SOURCE.md "Verified statistics"
    assert len(t) == 12031
    assert t.unit_tokens == 512 and t.partial_last_unit
    assert t.prompt_len.min() == 891 and t.prompt_len.max() == 126195
    assert np.median(t.prompt_len) == 6909
    assert round(t.prompt_len.mean(), 1) == 12035.1
    assert round(t.output_len.mean(), 1) == 342.6 and t.output_len.max() == 2000
    assert t.ids.size == 288500
    assert len(np.unique(t.ids)) == 182790 and t.ids.max() == 182789
    assert t.arrival_s[0] == 0.0 and t.arrival_s[-1] == 3536.999
    # ids r<line index>; the file is already in time order, so replay order = file order
    assert t.req_id[0] == "r0" and t.req_id[-1] == "r12030"
    # first line of the file: 6758 tokens, 14 ids 0..13, output 500
    assert t.prompt_len[0] == 6758 and t.output_len[0] == 500
    assert t.prompt_ids(0).tolist() == list(range(14))


def test_mooncake_golden_prefix_ids():
    p = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    g = shared_path("golden", "vllm")
    runs = sorted(g.glob("vllm_moon*.jsonl"))
    if not runs:
        pytest.skip("no Mooncake golden run")
    rows = [json.loads(s) for s in open(runs[0])]
    t = load_trace(p).head(len(rows))
    assert list(t.req_id) == [r["id"] for r in rows]
    assert t.prompt_len.tolist() == [r["prompt_len"] for r in rows]


# ----------------------------------------------------------------- WEKA
def test_weka_directory_statistics():
    p = shared_path("traces", "weka-claude-code", "traces")
    t = load_trace(p)
    # SOURCE.md: 3,238 requests incl. sub-agent inner requests; 255,045 distinct ids
    # (sum over files, each its own namespace); 5,324,279 block references
    assert len(t) == 3238
    assert t.unit_tokens == 64 and not t.partial_last_unit
    assert t.ids.size == 5324279
    assert len(np.unique(t.ids)) == 255045
    assert t.prompt_len.min() == 8868 and t.prompt_len.max() == 489885
    assert np.median(t.prompt_len) == pytest.approx(100786, abs=1)
    assert round(t.prompt_len.mean()) == 105268
    assert t.output_len.min() == 38 and t.output_len.max() == 15390 and round(t.output_len.mean()) == 389
    # replay-order ids
    assert list(t.req_id[:3]) == ["r0", "r1", "r2"] and t.req_id[-1] == "r3237"
    assert len(set(t.session_id)) == 36 + 11  # 36 conversations + 11 sub-agents


@pytest.mark.parametrize("engine_dir", ["vllm", "sglang"])
def test_weka_0001_matches_golden_ids_and_lengths(engine_dir):
    p = shared_path("traces", "weka-claude-code", "traces", "trace_0001.json")
    runs = sorted(shared_path("golden", engine_dir).glob("*weka0001*.jsonl"))
    assert runs
    t = load_trace(p)
    for run in runs:
        rows = [json.loads(s) for s in open(run)]
        assert list(t.req_id) == [r["id"] for r in rows]
        assert t.prompt_len.tolist() == [r["prompt_len"] for r in rows]


def test_weka_subagent_timing_trace_0003():
    p = shared_path("traces", "weka-claude-code", "traces", "trace_0003.json")
    t = load_trace(p)
    sub = t.session_id == "trace_0003/agent_001"
    # marker t = 134.227 s is the end; duration 126.015 s → start 8.212 s; inner t = 0, 6, 14, ..., 88
    assert sub.sum() == 10
    assert t.arrival_s[sub][0] == pytest.approx(8.212)
    assert t.arrival_s[sub][-1] == pytest.approx(96.212)
    # the sub-agent runs between the parent's request at 0 and the next at 153
    parent = t.session_id == "trace_0003"
    pa = t.arrival_s[parent]
    assert pa[0] == 0.0 and pa[1] == 153.0
    first_sub = int(np.flatnonzero(sub)[0])
    assert t.req_id[first_sub] == "r1"  # replay order: parent r0, then the sub-agent's first request
    assert t.turn[first_sub] == 0


def test_weka_public_round_trip_npz_and_native(tmp_path):
    p = shared_path("traces", "weka-claude-code", "traces", "trace_0003.json")
    t = load_trace(p)
    save_trace(t, tmp_path / "w.npz")
    assert_same_trace(t, load_trace(tmp_path / "w.npz"))
    save_trace(t, tmp_path / "w.jsonl")
    assert_same_trace(t, load_trace(tmp_path / "w.jsonl"), name=False)
