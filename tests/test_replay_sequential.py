"""Sequential replay, records and metrics on hand-worked cases."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.errors import ConfigError
from radixkv.metrics import hit_length_histogram, summarize
from radixkv.policies.no_cache import NoCache
from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.policies.unit_lru import UnitLRUCache
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace


def _trace():
    # three token prompts; the second repeats the first's 4 tokens then adds 2
    return Trace.from_requests(
        req_id=["a", "b", "c"], arrival_s=[0, 1, 2], prompt_len=[4, 6, 3], output_len=[2, 1, 0],
        prompt_ids=[[1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [9, 9, 9]],
    )


def test_no_cache_records():
    rec = replay_sequential(_trace(), NoCache(10, 1))
    assert list(rec["hit_tokens"]) == [0, 0, 0]
    assert list(rec["prompt_tokens"]) == [4, 6, 3]
    # everything is freed after each request
    assert list(rec["free_slots"]) == [10, 10, 10]
    s = summarize(rec)
    assert s["token_hit_rate"] == 0.0 and s["request_hit_rate"] == 0.0


def test_unit_lru_metrics_by_hand():
    # unit-lru at U=1, capacity 100 tokens: a misses, b hits 4 of 6, c misses.
    rec = replay_sequential(_trace(), UnitLRUCache(100, 1))
    assert list(rec["hit_tokens"]) == [0, 4, 0]
    s = summarize(rec)
    assert s["hit_tokens"] == 4
    assert s["token_hit_rate"] == pytest.approx(4 / 13)
    assert s["request_hit_rate"] == pytest.approx(1 / 3)
    assert s["mean_request_hit_ratio"] == pytest.approx((0 + 4 / 6 + 0) / 3)
    # cached tokens after each request: 4, 6, 9; second half = rows 1..2 -> (6 + 9) / 2
    assert list(rec["cached_tokens"]) == [4, 6, 9]
    assert s["cached_tokens_second_half_mean"] == pytest.approx(7.5)
    assert s["alignment_loss_tokens"] == 0


def test_request_larger_than_pool_is_an_input_error():
    # request b needs 6 + 0 tokens of KV; a 5-token NoCache pool cannot hold it
    with pytest.raises(ConfigError) as e:
        replay_sequential(_trace(), NoCache(5, 1))
    assert "'b'" in str(e.value) and "1 tokens more" in str(e.value)


def test_limit_replays_a_prefix():
    rec = replay_sequential(_trace(), NoCache(10, 1), limit=2)
    assert list(rec.req_id) == ["a", "b"]


def test_histogram_edges():
    h = hit_length_histogram(np.array([0, 0, 5, 16, 17, 40]))
    # bins [0,1) [1,16) [16,32) [32,64)
    assert h == {"edges_tokens": [0, 1, 16, 32], "counts": [2, 1, 2, 1]}


def test_parse_and_build():
    assert parse_policy("vllm").size == 16
    assert parse_policy("vllm:32").size == 32
    assert parse_policy("sglang").size == 1
    assert parse_policy("sglang", page_size=16).size == 16
    with pytest.raises(ConfigError):
        parse_policy("lfu")
    with pytest.raises(ConfigError):
        parse_policy("vllm:0")
    pol = build_policy(parse_policy("unit-lru"), PoolSpec(capacity_tokens=5000), unit_tokens=512)
    assert pol.num_slots == 9  # 5000 // 512
    pol = build_policy(parse_policy("none:16"), PoolSpec(capacity_tokens=100))
    assert (pol.num_slots, pol.slot_tokens) == (6, 16)


def test_csv_is_written(tmp_path):
    rec = replay_sequential(_trace(), UnitLRUCache(100, 1))
    out = tmp_path / "r.csv"
    rec.write_csv(out)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("id,prompt_tokens,hit_tokens,")
    assert lines[2].startswith("b,6,4,")
