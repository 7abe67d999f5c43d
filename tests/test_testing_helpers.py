"""radixkv.testing: helpers for users' own pytest suites; messages name what failed.

Expected numbers are the real vLLM's (golden file vllm_mixed200_b16_n400).
"""
from __future__ import annotations

import json

import pytest

from conftest import GOLDEN_LOCAL
from radixkv.testing import assert_hits_equal, assert_metric, replay, run_check

TRACE = GOLDEN_LOCAL / "traces" / "mixed200.jsonl"
GOLD = GOLDEN_LOCAL / "vllm" / "vllm_mixed200_b16_n400.jsonl"
ROWS = [json.loads(line) for line in GOLD.read_text().splitlines() if line]
RATE = sum(r["hit_tokens"] for r in ROWS) / sum(r["prompt_len"] for r in ROWS)


@pytest.fixture(scope="module")
def result():
    return replay(TRACE, "vllm:16", num_gpu_blocks=400)


def test_replay_matches_the_engine(result):
    assert_hits_equal(result, GOLD)
    assert result.summary["token_hit_rate"] == RATE


def test_assert_metric_messages(result):
    assert_metric(result, "token_hit_rate", min=RATE, max=RATE)
    with pytest.raises(AssertionError) as e:
        assert_metric(result, "token_hit_rate", min=RATE + 0.01)
    assert str(e.value) == f"mixed200.jsonl vllm:16: token_hit_rate = {RATE:.6g}, expected >= {RATE + 0.01:g}"
    with pytest.raises(KeyError, match="token_hit_rate"):
        assert_metric(result, "hit_rate", min=0)


def test_assert_hits_equal_names_the_first_differences(result):
    bad = [(r["id"], r["hit_tokens"] + (16 if i in (3, 7) else 0)) for i, r in enumerate(ROWS)]
    with pytest.raises(AssertionError) as e:
        assert_hits_equal(result, bad)
    msg = str(e.value)
    assert msg.startswith(f"mixed200.jsonl vllm:16: 2 of {len(ROWS)} requests differ; first: ")
    assert f"{ROWS[3]['id']} hit {ROWS[3]['hit_tokens']} want {ROWS[3]['hit_tokens'] + 16}" in msg


def test_replay_needs_exactly_one_pool_size():
    from radixkv.errors import ConfigError

    with pytest.raises(ConfigError):
        replay(TRACE, "vllm:16")
    with pytest.raises(ConfigError):
        replay(TRACE, "vllm:16", capacity_tokens=1000, num_gpu_blocks=10)


def test_run_check_raises_with_one_line_per_failure(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[trace]]\npath = "{TRACE}"\n[[policy]]\npolicy = "vllm:16"\nnum_gpu_blocks = 400\n'
                   f'[[assert]]\nmin_token_hit_rate = {RATE!r}\n')
    assert run_check(cfg).ok
    cfg.write_text(cfg.read_text().replace(repr(RATE), repr(RATE + 0.02)))
    with pytest.raises(AssertionError) as e:
        run_check(cfg)
    lines = str(e.value).splitlines()
    assert lines[0] == "1 of 1 assertions fail:" and "metric=token_hit_rate" in lines[1]
