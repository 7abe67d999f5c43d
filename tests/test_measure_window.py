"""The measurement window (``measure_last``, ``--measure-last``): hit metrics over the last
share of the requests, against hand-worked cases.

The window is kvcache-simulator's convention (hit rate over the last 50 % of requests; its
warm-up is ``⌊n · warmup_fraction⌋`` requests, kvcache_sim/simulator.py). Every expected
value below is worked out by hand from the unit-LRU rules (radixkv/policies/unit_lru.py
docstring), not read from the code under test.
"""
from __future__ import annotations

import json

import pytest

import radixkv
from radixkv.cli import main
from radixkv.errors import ConfigError
from radixkv.metrics import window_start
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.curve import run_curve
from radixkv.replay.run import run_replay
from radixkv.trace.types import Trace

# U = 512, capacity 3 units (1,536 tokens), unit-lru. LRU order written LRU -> MRU.
# r0 ids [1,2]   P=1024: miss.                      cache [1] [1,2]
# r1 ids [1,2,3] P=1536: hits 2 units = 1024.        cache [1] [1,2] [1,2,3]
# r2 ids [4]     P=512:  miss; [1] evicted.          cache [1,2] [1,2,3] [4]
# r3 ids [1,2]   P=1024: [1] gone, hit 0; inserting [1] evicts [1,2], then [1,2] evicts [1,2,3]
# r4 ids [4]     P=512:  hit 512.
PROMPTS = [1024, 1536, 512, 1024, 512]
IDS = [[1, 2], [1, 2, 3], [4], [1, 2], [4]]
HITS = [0, 1024, 0, 0, 512]


def _trace():
    return Trace.from_requests(req_id=list("abcde"), arrival_s=[0] * 5, prompt_len=PROMPTS, output_len=[5] * 5,
                               prompt_ids=IDS, unit_tokens=512, partial_last_unit=True)


def _jsonl(tmp_path):
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 5, "hash_ids": ids}) + "\n"
                         for i, (n, ids) in enumerate(zip(PROMPTS, IDS))))
    return p


def test_window_start_is_floor_n_times_one_minus_f():
    assert window_start(12031, 0.5) == 6015  # kvcache-simulator: warmupRequests 6015 on Mooncake's 12,031
    assert window_start(5, 0.5) == 2  # last 3 of 5
    assert window_start(5, 0.4) == 3  # last 2 of 5
    assert window_start(5, 1.0) == 0
    # 0.9 read as the decimal: the last 9 of 10 (in floats 10·(1 − 0.9) = 0.99999… would floor to 0)
    assert window_start(10, 0.9) == 1
    assert window_start(0, 0.5) == 0


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, float("nan"), "half", True])
def test_a_fraction_outside_0_1_is_refused(bad):
    with pytest.raises(ConfigError) as e:
        window_start(5, bad)
    assert e.value.field == "measure_last"


def test_window_by_hand_and_whole_replay_unchanged():
    t = _trace()
    spec, pool = parse_policy("unit-lru"), PoolSpec(capacity_tokens=3 * 512)
    rec, plain = run_replay(t, spec, pool)
    assert list(rec["hit_tokens"]) == HITS
    _, s = run_replay(t, spec, pool, measure_last=0.5)
    w = s.pop("measure_window")
    for d in (s, plain):
        d.pop("timing_s")
    assert s == plain  # the whole-replay metrics do not move
    assert plain["token_hit_rate"] == 1536 / 4608
    # last 3 of 5: rows 2, 3, 4
    assert w == {"measure_last": 0.5, "first_request": 2, "requests": 3, "prompt_tokens": 512 + 1024 + 512,
                 "hit_tokens": 512, "token_hit_rate": 512 / 2048, "request_hit_rate": 1 / 3,
                 "mean_request_hit_ratio": pytest.approx((0 + 0 + 1) / 3, rel=1e-15)}
    _, s = run_replay(t, spec, pool, measure_last=0.4)  # rows 3, 4
    w = s["measure_window"]
    assert (w["first_request"], w["requests"], w["prompt_tokens"], w["hit_tokens"]) == (3, 2, 1536, 512)
    assert w["mean_request_hit_ratio"] == 0.5 and w["request_hit_rate"] == 0.5
    _, s = run_replay(t, spec, pool, measure_last=1)  # the whole replay
    assert s["measure_window"]["token_hit_rate"] == s["token_hit_rate"] == 1536 / 4608


def test_public_api_and_curve_paths_agree():
    t = _trace()
    rec = radixkv.replay(t, "unit-lru", capacity_tokens=1536)
    w = radixkv.summarize(rec, measure_last=0.5)["measure_window"]
    assert (w["hit_tokens"], w["prompt_tokens"], w["first_request"]) == (512, 2048, 2)
    assert "measure_window" not in radixkv.summarize(rec)
    for one_pass in (True, False):  # unit-lru's one-pass LRU-stack curve and one replay per capacity
        (_, s), = run_curve(t, parse_policy("unit-lru"), [1536], one_pass=one_pass, measure_last=0.5)
        assert s["measure_window"]["hit_tokens"] == 512
    with pytest.raises(ConfigError):
        run_curve(t, parse_policy("unit-lru"), [1536], measure_last=2.0)


def test_cli_replay_compare_and_curve(tmp_path, capsys):
    p = _jsonl(tmp_path)
    base = [str(p), "--quiet", "--no-timing", "--json", "-", "--measure-last", "0.5"]
    assert main(["curve", *base, "--policies", "unit-lru", "--capacities", "1536"]) == 0
    pt = json.loads(capsys.readouterr().out)["curves"][0]["points"][0]
    assert pt["hit_tokens"] == 1536 and pt["measure_window"]["hit_tokens"] == 512
    assert pt["measure_window"]["token_hit_rate"] == 0.25
    assert main(["replay", *base, "--policy", "unit-lru", "--capacity-tokens", "1536"]) == 0
    s = json.loads(capsys.readouterr().out)["results"][0]["summary"]
    assert s["measure_window"]["requests"] == 3 and s["measure_window"]["hit_tokens"] == 512
    assert main(["compare", str(p), "--quiet", "--measure-last", "0.5", "--policies", "unit-lru",
                 "--capacity-tokens", "1536"]) == 0
    assert "window: token hit rate" in capsys.readouterr().out
    # without the flag: no window key
    assert main(["replay", *base[:-2], "--policy", "unit-lru", "--capacity-tokens", "1536"]) == 0
    assert "measure_window" not in json.loads(capsys.readouterr().out)["results"][0]["summary"]


@pytest.mark.parametrize("extra,needle", [
    (["--measure-last", "0"], "(0, 1]"),
    (["--measure-last", "0.5", "--mode", "concurrent", "--model", "llama-3.1-8b", "--gpu", "A100-80GB"],
     "sequential"),
    (["--measure-last", "0.5", "--replicas", "2"], "one-pool"),
])
def test_cli_refuses_where_the_window_is_not_measured(tmp_path, capsys, extra, needle):
    p = _jsonl(tmp_path)
    rc = main(["replay", str(p), "--quiet", "--policy", "unit-lru", "--capacity-tokens", "1536", *extra])
    assert rc != 0
    err = capsys.readouterr().err
    assert "--measure-last" in err or "measure_last" in err
    assert needle in err


def test_curve_log_line_and_png_show_the_window(tmp_path, capsys, monkeypatch):
    # the window of the hand-worked case at 1,536 tokens is 512 / 2,048 = 0.25 (whole replay
    # 1,536 / 4,608): the per-point line says both, the PNG plots the window's value
    import radixkv.plots as plots

    drawn = []
    real = plots._subplots

    def spy(*a, **k):
        fig, ax = real(*a, **k)
        drawn.append(ax)
        return fig, ax

    monkeypatch.setattr(plots, "_subplots", spy)
    p = _jsonl(tmp_path)
    assert main(["curve", str(p), "--policies", "unit-lru", "--capacities", "1536", "--measure-last", "0.5",
                 "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr()
    assert "token hit rate 0.3333" in out.out + out.err
    assert "last 50% of requests: token hit rate 0.2500" in out.out + out.err
    ax, = drawn
    assert list(ax.lines[0].get_ydata()) == [0.25]
    assert "last 50% of requests" in ax.get_ylabel()
