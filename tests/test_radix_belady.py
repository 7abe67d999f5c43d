"""The offline reference BeladyRadixCache: a hand-worked eviction, and a hit-rate curve
lying between LRU's and the infinite-capacity hit rate."""
from __future__ import annotations

import pytest

from _golden_traces import native_trace
from conftest import GOLDEN_LOCAL
from radixkv.errors import ConfigError
from radixkv.policies.radix import RadixCache
from radixkv.policies.radix_belady import BeladyRadixCache
from radixkv.trace.types import Trace


def _hits(cache, trace):
    out = []
    for i in range(len(trace)):
        a = cache.run_request(i, trace.kv_seq(i))
        out.append(None if a is None else a.hit_tokens)
    return out


def test_hand_worked_next_use():
    """Pool of 30 tokens holding X, Y, Z (10 tokens each); W needs 10 → one leaf goes.
    Next uses: X by request 4, Y by request 5, Z never: Belady evicts Z (LRU: X). Request
    4 then needs one slot: Belady evicts W (never used again; LRU: Y, the oldest)."""
    X, Y, Z, W = (list(range(b, b + 10)) for b in (100, 200, 300, 400))
    prompts = [X, Y, Z, W, X + [500], Y + [600]]
    n = len(prompts)
    trace = Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n,
                                prompt_len=[len(p) for p in prompts], output_len=[1] * n,
                                prompt_ids=prompts)
    assert _hits(BeladyRadixCache(30, 1, trace=trace), trace) == [0, 0, 0, 0, 10, 10]
    assert _hits(RadixCache(30, 1), trace) == [0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("page_size", [1, 16])
def test_curve_between_lru_and_infinite(page_size):
    """At every capacity of a curve on mixed200: LRU ≤ Belady ≤ infinite capacity (the
    infinite-capacity rate from the built-in LRU with a pool that never evicts), and
    Belady is strictly better than LRU where LRU evicts."""
    trace = native_trace(GOLDEN_LOCAL / "traces" / "mixed200.jsonl")
    total = int(trace.prompt_len.sum())

    def rate(cache):
        return sum(h or 0 for h in _hits(cache, trace)) / total

    inf = rate(RadixCache(10**6, page_size))
    for cap in (640, 1024, 1904, 3200, 6400):
        lru = rate(RadixCache(cap, page_size))
        bel = rate(BeladyRadixCache(cap, page_size, trace=trace))
        assert lru <= bel <= inf, (cap, lru, bel, inf)
        if lru < inf:
            assert bel > lru


def test_needs_trace_and_trace_indices():
    trace = native_trace(GOLDEN_LOCAL / "traces" / "edge300.jsonl")
    with pytest.raises(ConfigError, match="trace"):
        BeladyRadixCache(640, 1)
    c = BeladyRadixCache(640, 1, trace=trace)
    with pytest.raises(ValueError, match="trace index"):
        c.run_request(len(trace), trace.kv_seq(0))


def _hand_worked_jsonl(tmp_path):
    """The trace of test_hand_worked_next_use as a native JSONL file (in arrival order)."""
    import json

    X, Y, Z, W = (list(range(b, b + 10)) for b in (100, 200, 300, 400))
    p = tmp_path / "belady.jsonl"
    p.write_text("".join(json.dumps({"id": f"r{i}", "tokens": t, "output_length": 1, "arrival_s": float(i)}) + "\n"
                         for i, t in enumerate([X, Y, Z, W, X + [500], Y + [600]])))
    return p


def test_sglang_at_belady_on_the_command_line_is_the_hand_worked_eviction(tmp_path, capsys):
    # before the fix `--policy sglang:1@belady` was refused as an unknown eviction policy
    import csv

    from radixkv.cli import main

    p = _hand_worked_jsonl(tmp_path)
    hits = {}
    for policy in ("sglang:1@belady", "sglang:1"):
        out = tmp_path / f"{policy.replace(':', '_').replace('@', '_')}.csv"
        assert main(["replay", str(p), "--policy", policy, "--capacity-tokens", "30", "--per-request", str(out),
                     "--quiet"]) == 0
        hits[policy] = [int(r["hit_tokens"]) for r in csv.DictReader(out.open())]
    capsys.readouterr()
    assert hits == {"sglang:1@belady": [0, 0, 0, 0, 10, 10], "sglang:1": [0, 0, 0, 0, 0, 0]}


@pytest.mark.parametrize("extra", [["--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB"],
                                   ["--replicas", "2"]])
def test_sglang_at_belady_outside_the_sequential_replay_exits_2_naming_the_policy(tmp_path, capsys, extra):
    from radixkv.cli import main

    p = _hand_worked_jsonl(tmp_path)
    assert main(["replay", str(p), "--policy", "sglang:1@belady", "--capacity-tokens", "30", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("radixkv: error: --policy sglang:1@belady reads the whole trace ahead")
    assert "sequential replay only" in err and "Traceback" not in err


def test_belady_is_sglangs_tree_only():
    from radixkv.policies.registry import parse_policy

    assert parse_policy("sglang:16@belady").build_class is BeladyRadixCache
    with pytest.raises(ConfigError, match="unknown eviction policy 'belady'; known: lru, lfu"):
        parse_policy("vllm:16@belady")


def test_api_builds_belady_on_the_requests_left_after_the_context_cut(tmp_path):
    # the hand-worked trace with a 40-token request inserted after W: max_model_len 20 drops
    # it, so the replayed trace is the hand-worked one again and its hits are the hand-worked
    # [0, 0, 0, 0, 10, 10] (the next-use tables must be those of the replayed rows, not of
    # the file's: built on the file, row 4 would be read as the dropped request)
    import json

    import radixkv

    X, Y, Z, W = (list(range(b, b + 10)) for b in (100, 200, 300, 400))
    long = list(range(700, 740))
    p = tmp_path / "cut.jsonl"
    p.write_text("".join(json.dumps({"id": f"r{i}", "tokens": t, "output_length": 1, "arrival_s": float(i)}) + "\n"
                         for i, t in enumerate([X, Y, Z, W, long, X + [500], Y + [600]])))
    rec = radixkv.replay(str(p), "sglang:1@belady", capacity_tokens=30, max_model_len=20, quiet=True)
    assert list(rec.req_id) == ["r0", "r1", "r2", "r3", "r5", "r6"]
    assert [int(h) for h in rec["hit_tokens"]] == [0, 0, 0, 0, 10, 10]
