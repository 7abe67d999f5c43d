"""Streaming sequential replay (radixkv.replay.stream): the same summary as the in-memory
replay, whatever the chunk size; its aggregates equal numpy's on the whole columns."""
import json
from pathlib import Path

import numpy as np
import pytest

from radixkv.errors import TraceFormatError
from radixkv.metrics import column_aggregates
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import run_replay
from radixkv.replay.sequential import COLUMNS
from radixkv.replay.stream import StreamAggregates, _PairwiseMean, replay_stream
from radixkv.trace.load import load_trace
from radixkv.util import dumps_json

TRACES = Path(__file__).resolve().parent.parent / "traces"


@pytest.mark.parametrize("n", [1, 7, 8, 9, 128, 129, 1000, 8193, 40001])
def test_pairwise_mean_is_numpys(n):
    x = np.random.default_rng(n).random(n) / 3
    for chunk in sorted({1, 5, 127, 999, n}):
        if chunk == 1 and n > 9000:
            continue
        m = _PairwiseMean(n)
        for a in range(0, n, chunk):
            m.add(x[a:a + chunk])
        assert m.mean() == np.mean(x), (n, chunk)


def _cols(n, rng):
    c = {k: rng.integers(0, 5000, n) for k in COLUMNS}
    c["prompt_tokens"] = rng.integers(1, 5000, n)
    c["hit_tokens"] = np.minimum(c["prompt_tokens"], rng.integers(0, 6000, n) * (rng.random(n) < 0.7))
    for k in ("cached_tokens", "duplicate_tokens", "largest_free_run"):  # sampled rows only
        c[k] = np.where(rng.random(n) < 0.05, c[k], -1)
    c["free_slots"][rng.random(n) < 0.3] = 0
    return c


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, tuple):
            assert all(np.array_equal(u, v) for u, v in zip(x, y)), k
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y), k
        else:
            assert json.dumps(x) == json.dumps(y), k


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 5000])
def test_aggregates_are_the_in_memory_ones(n):
    rng = np.random.default_rng(n)
    c = _cols(n, rng)
    for chunk in sorted({1, 3, 64, n}):
        agg = StreamAggregates(n)
        for a in range(0, n, chunk):
            agg.add(c, a, min(n, a + chunk))
        _same(agg.result(), column_aggregates(c, n))


def _without_timing(s):
    return dumps_json({k: v for k, v in s.items() if k not in ("timing_s", "stream")})


@pytest.mark.parametrize("policy,capacity", [("sglang:1", 6000), ("vllm:16", 6000), ("unit-lru", 3000),
                                             ("sglang:1", 10**6)])
def test_stream_equals_in_memory(policy, capacity):
    path = TRACES / "multi_turn.jsonl"  # 400 requests in sessions: chunk edges fall inside them
    spec = parse_policy(policy)
    pool = PoolSpec(capacity_tokens=capacity)
    _, ref = run_replay(load_trace(path), spec, pool)
    want = _without_timing(ref)
    for chunk in (1, 7, 64, 400):
        got = replay_stream(path, spec, pool, chunk_requests=chunk)
        assert _without_timing(got) == want, chunk
        assert got["stream"]["chunks"] == -(-400 // chunk)


@pytest.mark.parametrize("policy", ["sglang:1", "vllm:16"])
def test_stream_mooncake_limit(tmp_path, policy):
    # a Mooncake-style trace: 512-token hash ids, partial last units, outputs without ids
    rng = np.random.default_rng(3)
    rows = []
    for k in range(300):
        p = int(rng.integers(1, 3000))
        nid = -(-p // 512)
        ids = [int(rng.integers(0, 4))] + [1000 + k * 8 + j for j in range(nid - 1)]
        rows.append(json.dumps({"timestamp": k, "input_length": p, "output_length": int(rng.integers(0, 50)),
                                "hash_ids": ids[:nid]}))
    # id 0..3 lead every prompt and cover 512 tokens, except when they are the last unit
    rows = [r for r in rows if json.loads(r)["input_length"] > 512]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(rows) + "\n")
    spec, pool = parse_policy(policy), PoolSpec(capacity_tokens=20000)
    _, ref = run_replay(load_trace(path), spec, pool, limit=150)
    for chunk in (1, 33, 1000):
        assert _without_timing(replay_stream(path, spec, pool, chunk_requests=chunk, limit=150)) == _without_timing(ref)


def test_stream_errors_name_the_file_line(tmp_path):
    lines = (TRACES / "multi_turn.jsonl").read_text().splitlines()
    bad = lines[:60] + ['{"id": "x", "tokens": [1, -2], "output_length": 1}'] + lines[60:]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(bad) + "\n")
    with pytest.raises(TraceFormatError) as e:
        replay_stream(path, parse_policy("sglang:1"), PoolSpec(capacity_tokens=10**6), chunk_requests=16)
    assert e.value.path == str(path) and e.value.line == 61
    late = lines[:1] + lines[200:] + lines[1:200]  # the second half first: time goes back
    path.write_text("\n".join(late) + "\n")
    with pytest.raises(TraceFormatError, match="time order"):
        replay_stream(path, parse_policy("sglang:1"), PoolSpec(capacity_tokens=10**6), chunk_requests=16)
