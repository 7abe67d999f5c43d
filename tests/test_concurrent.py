"""Concurrent replay: scheduler, arrivals, metrics. Expected values by hand or from the
real engines' golden files; none copied from a run of the code under test."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from _golden_traces import golden_trace
from conftest import GOLDEN_LOCAL
from radixkv.cli.concurrent_args import add_concurrent_args, policy_from_args, run_concurrent_from_args
from radixkv.cost import CostModel
from radixkv.errors import ConfigError
from radixkv.policies.base import PrefixCache
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.no_cache import NoCache
from radixkv.policies.radix import RadixCache
from radixkv.policies.static_reserved import StaticReservedCache
from radixkv.policies.unit_lru import UnitLRUCache
from radixkv.replay.arrivals import arrival_times
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace.types import Trace

from _conc_cases import COST, request_trace


def _trace(prompts, outputs, arrivals):
    return request_trace(prompts, outputs, arrivals)


# ---------------------------------------------------------------------------- (a)
def _concurrency_trace():
    """r0 warms the cache alone; r1–r3 arrive together 100 s later with distinct content.

    Block size 4, 12 usable blocks. r0: 36 tokens, N = 1 → 9 full blocks, cached when it
    ends. r1–r3: 13-token prompts, N = 4 → KV extent 13 + 3 = 16 tokens = 4 blocks each
    (admission takes ceil(13/4) = 4 blocks; decode stays inside the 4th block).
    """
    prompts = [list(range(1000, 1036)), list(range(0, 13)), list(range(100, 113)), list(range(200, 213))]
    return _trace(prompts, [1, 4, 4, 4], [0.0, 100.0, 100.0, 100.0])


@pytest.mark.parametrize("make", [
    lambda: BlockHashCache(13, 4),  # 12 usable blocks + vLLM's null block
    lambda: NoCache(12, 4),
])
def test_evictable_cache_keeps_full_concurrency(make):
    # vLLM: r0's 9 cached blocks sit in the free queue (with 3 never-used blocks); r1, r2,
    # r3 each take 4 blocks (evicting the cached ones): 12 ≤ 12, all three run at once.
    r = replay_concurrent(_concurrency_trace(), make(), COST)
    assert r.peak_running == 3
    assert list(r["hit_tokens"]) == [0, 0, 0, 0]
    assert list(r["preemptions"]) == [0, 0, 0, 0]
    # r3 admitted the moment it arrived
    assert r["queue_s"][3] == 0.0


def test_static_reservation_lowers_peak_concurrency():
    # reserved = floor(0.3 × 12) = 3 blocks, working = 9: r1 and r2 take 8, r3 needs 4 > 1
    # and waits until r1 and r2 finish (same step: prefill + 3 decodes each) → peak 2.
    pol = StaticReservedCache(12, 4, reserved_fraction=0.3)
    r = replay_concurrent(_concurrency_trace(), pol, COST)
    assert r.peak_running == 2
    assert r["queue_s"][1] == 0.0 and r["queue_s"][2] == 0.0
    # r3 is admitted at the first step boundary after r1 and r2 finish
    assert r["admit_s"][3] == r["finish_s"][1] == r["finish_s"][2]
    assert r["queue_s"][3] > 0
    # the time-weighted mean over the busy time is below 2 requests (r0 alone, r3 alone)
    assert r.summary()["concurrency_busy_mean"] < 2.0


# ---------------------------------------------------------------------------- (b)
def _golden_runs(engine):
    rows = []
    with open(GOLDEN_LOCAL / engine / "manifest.jsonl") as f:
        for line in f:
            m = json.loads(line)
            if (GOLDEN_LOCAL / "traces" / m["trace"]).exists():
                rows.append(m)
    return rows


def _golden_hits(engine, name):
    with open(GOLDEN_LOCAL / engine / f"{name}.jsonl") as f:
        return [json.loads(line)["hit_tokens"] for line in f]


def _apart(trace):
    """Arrivals 10^4 s apart: every request runs alone (each finishes in far less)."""
    return np.arange(len(trace), dtype=np.float64) * 1e4


@pytest.mark.parametrize("m", _golden_runs("vllm"), ids=lambda m: m["name"])
def test_one_at_a_time_reproduces_vllm_golden(m):
    tr = golden_trace(m["trace"], GOLDEN_LOCAL, None)
    r = replay_concurrent(tr, BlockHashCache(m["num_gpu_blocks"], m["block_size"]), COST, arrivals=_apart(tr))
    assert r["hit_tokens"].tolist() == _golden_hits("vllm", m["name"])
    assert r.peak_running == 1


@pytest.mark.parametrize("m", _golden_runs("sglang"), ids=lambda m: m["name"])
def test_one_at_a_time_reproduces_sglang_golden(m):
    # the golden SGLang runs have no chunked prefill: a step budget above every prompt
    tr = golden_trace(m["trace"], GOLDEN_LOCAL, None)
    pol = RadixCache.from_capacity_tokens(m["capacity_tokens"], m["page_size"])
    cfg = SchedulerConfig(max_num_batched_tokens=1 << 30, admission="sglang")
    r = replay_concurrent(tr, pol, COST, arrivals=_apart(tr), config=cfg)
    assert r["hit_tokens"].tolist() == _golden_hits("sglang", m["name"])


@pytest.mark.parametrize("make", [
    lambda: NoCache(4000, 16),
    lambda: StaticReservedCache(300, 16, reserved_fraction=0.3),
    lambda: StaticReservedCache(5000, 1, reserved_fraction=0.5),
])
def test_one_at_a_time_equals_run_request(make):
    tr = golden_trace("mixed200.jsonl", GOLDEN_LOCAL, None)
    seq_pol = make()
    expect = [seq_pol.run_request(i, tr.kv_seq(i)).hit_tokens for i in range(len(tr))]
    r = replay_concurrent(tr, make(), COST, arrivals=_apart(tr))
    assert r["hit_tokens"].tolist() == expect


# ---------------------------------------------------------------------------- (d)
def test_preemption_by_recompute_in_a_tiny_pool():
    """Two requests, P = 4, N = 5 (KV extent 8), in a 10-token pool (block size 1).

    step 1: admit A (4) and B (4) → 8 used; both prefill; each samples output 1.
    step 2: A +1, B +1 → 10 used; outputs 2.
    step 3: A +1 fails (11 > 10) → preempt running[-1] = B (frees 5 → 5 used), B to the
            front of the waiting queue; A +1 → 6. No admission in a step that preempted.
    steps 4–5: A decodes (7, 8 used); B's re-admission needs P + g = 4 + 2 = 6 tokens:
            13 > 10 and 14 > 10, refused. A samples output 5 in step 5 and finishes (0 used).
    step 6: B re-admitted with 6 tokens, recomputes all 6 (NoCache), samples output 3.
    steps 7–8: B decodes to outputs 4 and 5 and finishes. 8 steps, 1 preemption.
    """
    tr = _trace([[1, 2, 3, 4], [5, 6, 7, 8]], [5, 5], [0.0, 0.0])
    r = replay_concurrent(tr, NoCache(10, 1), COST)
    s = r.summary()
    assert s["preemptions"] == 1
    assert r["preemptions"].tolist() == [0, 1]
    assert r["recomputed_tokens"].tolist() == [0, 6]
    assert s["steps"] == 8
    assert r.peak_running == 2
    # both sampled their first token at the end of step 1
    assert r["first_token_s"][0] == r["first_token_s"][1] > 0
    assert r["finish_s"][1] > r["finish_s"][0]


def test_preemption_hits_are_not_counted():
    """The same two requests on vLLM's pool: 11 blocks of 1 token (10 usable).

    Steps 1–3 as with NoCache; preempting B frees its 5 blocks tail first: the free queue
    is [b5, b4, b3, b2, b1] (all hashed). A's extensions take b5 (step 3), b4 (step 4),
    b3 (step 5), evicting their keys. B's re-admission is refused in steps 4 and 5
    (2 new + 4 touched hit blocks > 3 free), then in step 6 looks up 4 + 2 = 6 tokens,
    capped at 5 blocks: b1, b2 still cached → hit 2, recompute 6 − 2 = 4. The hit rate
    counts first admissions only: 0 for both.
    """
    tr = _trace([[1, 2, 3, 4], [5, 6, 7, 8]], [5, 5], [0.0, 0.0])
    r = replay_concurrent(tr, BlockHashCache(11, 1), COST)
    assert r.summary()["preemptions"] == 1
    assert r["hit_tokens"].tolist() == [0, 0]
    assert r["recomputed_tokens"].tolist() == [0, 4]


def test_chunked_prefill_spreads_a_prompt_over_steps():
    # P = 10, budget 4 → chunks 4, 4, 2 after 0, 4, 8 tokens; the third step samples
    # output 1: TTFT = the three step times (the request arrives at 0 and runs alone)
    tr = _trace([list(range(10))], [1], [0.0])
    r = replay_concurrent(tr, NoCache(100, 1), COST, config=SchedulerConfig(max_num_batched_tokens=4))
    expect = COST.step_time([4], [0]) + COST.step_time([4], [4]) + COST.step_time([2], [8])
    assert r["ttft_s"][0] == pytest.approx(expect, rel=1e-12)
    assert r.steps == 3


@pytest.mark.parametrize("order,first", [("fcfs", 1), ("lpm", 2)])
def test_lpm_admits_the_longest_cached_prefix_first(order, first):
    # r0 caches 12 tokens X alone; r1 (new content) and r2 (X + 4 tokens) arrive together
    # with one seat: FCFS takes r1 first, lpm r2 (hit 12 > 0)
    x = list(range(12))
    tr = _trace([x, list(range(500, 516)), x + [90, 91, 92, 93]], [1, 2, 2], [0.0, 100.0, 100.0])
    pol = StaticReservedCache(40, 4, reserved_fraction=0.5)
    r = replay_concurrent(tr, pol, COST, config=SchedulerConfig(max_num_seqs=1, schedule_policy=order))
    other = 3 - first
    assert r["admit_s"][first] == 100.0 and r["admit_s"][other] > 100.0
    assert r["hit_tokens"][2] == 12


def test_lpm_needs_a_lookup_without_side_effects():
    class NoPeek(NoCache):
        peek_hit = PrefixCache.peek_hit  # the base class's "not available"

    tr = _trace([[1, 2]], [1], [0.0])
    with pytest.raises(ConfigError, match="peek_hit"):
        replay_concurrent(tr, NoPeek(10, 1), COST, config=SchedulerConfig(schedule_policy="lpm"))


def test_a_policy_without_running_requests_has_no_concurrent_replay():
    """unit-lru models no running requests: occupancy, concurrency and preemptions would be
    numbers it does not model, so the concurrent replay refuses it (not zeros)."""
    tr = _trace([[1, 2]], [1], [0.0])
    with pytest.raises(ConfigError, match="no running requests"):
        replay_concurrent(tr, UnitLRUCache(10, 1), COST)


def test_victim_choice_vllm_vs_sglang():
    # running A, B, C (admitted in that order) with 3, 1, 1 outputs; prompts 2, 5, 4.
    # vLLM preempts running[-1] = C; SGLang's retract_decode takes the fewest outputs
    # (B, C), then the longest prompt: B.
    from radixkv.replay.schedulers import make_scheduler

    tr = _trace([[1, 2], [3, 4, 5, 6, 7], [8, 9, 10, 11]], [8, 3, 8], [0.0, 0.0, 0.0])
    for admission, victim in (("vllm", 2), ("sglang", 1)):
        sch = make_scheduler(tr, NoCache(100, 1), SchedulerConfig(admission=admission))
        sch.running = [0, 1, 2]
        sch.gen = [3, 1, 1]
        assert sch._victim() == victim


def test_request_that_cannot_fit_is_a_config_error():
    tr = _trace([list(range(20))], [1], [0.0])
    with pytest.raises(ConfigError, match="q0"):
        replay_concurrent(tr, NoCache(10, 1), COST)


# ---------------------------------------------------------------------------- (e)
def _run_tight(seed):
    tr = golden_trace("mixed200.jsonl", GOLDEN_LOCAL, None)
    arr = arrival_times(tr, arrival="poisson", request_rate=50.0, seed=seed)
    return replay_concurrent(tr, BlockHashCache(150, 16), COST, arrivals=arr,
                             config=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8))


def test_deterministic_and_exercises_preemption():
    a, b = _run_tight(7), _run_tight(7)
    assert json.dumps(a.summary()) == json.dumps(b.summary())
    for k in a.columns:
        assert a[k].tobytes() == b[k].tobytes(), k
    assert a.summary()["preemptions"] > 0
    c = _run_tight(8)
    assert c["arrival_s"].tobytes() != a["arrival_s"].tobytes()


def test_summary_is_consistent_with_columns():
    r = _run_tight(3)
    s = r.summary()
    # every request ran to completion after it arrived and was admitted after arriving
    assert np.all(r["finish_s"] >= r["admit_s"]) and np.all(r["admit_s"] >= r["arrival_s"])
    assert np.all(r["ttft_s"] >= r["queue_s"])
    assert s["requests"] == 200
    assert 1 <= s["concurrency_peak"] <= 8
    assert 0 < s["concurrency_mean"] <= s["concurrency_peak"]
    assert s["token_hit_rate"] == s["hit_tokens"] / s["prompt_tokens"]
    assert s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"]


# ---------------------------------------------------------------------------- arrivals
def test_trace_arrivals_scaled():
    tr = _trace([[1], [2], [3]], [1, 1, 1], [5.0, 7.0, 11.0])
    assert arrival_times(tr, time_scale=0.5).tolist() == [0.0, 1.0, 3.0]


def test_poisson_mean_gap():
    tr = _trace([[1]] * 20001, [1] * 20001, [0.0] * 20001)
    t = arrival_times(tr, arrival="poisson", request_rate=4.0, seed=1)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    # mean gap 1/4 s; the standard error over 20,000 gaps is 0.25/√20000 = 0.0018 s
    assert abs(np.diff(t).mean() - 0.25) < 0.01


def test_gamma_burstiness_sets_cv():
    tr = _trace([[1]] * 20001, [1] * 20001, [0.0] * 20001)
    g = np.diff(arrival_times(tr, arrival="gamma", request_rate=2.0, burstiness=0.25, seed=2))
    # mean 1/2 s; CV = 1/√0.25 = 2
    assert abs(g.mean() - 0.5) < 0.05
    assert abs(g.std() / g.mean() - 2.0) < 0.15


def test_arrival_errors():
    tr = _trace([[1]], [1], [0.0])
    with pytest.raises(ConfigError):
        arrival_times(tr, arrival="poisson")
    with pytest.raises(ConfigError):
        arrival_times(tr, arrival="trace", request_rate=3.0)
    with pytest.raises(ConfigError):
        arrival_times(tr, arrival="uniform")


# ---------------------------------------------------------------------------- CLI flags
def test_cli_flags_build_the_run():
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--gpu")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)  # the verb's own
    add_concurrent_args(p)  # must not clash with it
    args = p.parse_args(["--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
                         "--max-num-seqs", "4", "--no-enable-prefix-caching"])
    assert isinstance(policy_from_args(BlockHashCache(101, 16), args), NoCache)
    tr = _concurrency_trace()
    r = run_concurrent_from_args(tr, BlockHashCache(13, 4), args)
    assert r.meta["policy"] == "none" and r.meta["max_num_seqs"] == 4
    args2 = p.parse_args(["--static-reserved-fraction", "0.3"])
    pol = policy_from_args(BlockHashCache(13, 4), args2)
    assert isinstance(pol, StaticReservedCache) and pol.reserved_slots == 3
    with pytest.raises(ConfigError):
        run_concurrent_from_args(tr, BlockHashCache(13, 4), args2)  # no --model/--gpu


def test_cli_admission_follows_the_policy_engine():
    from radixkv.cli.concurrent_args import concurrent_config_from_args

    p = argparse.ArgumentParser()
    add_concurrent_args(p)
    from radixkv.replay.sched_sglang import SglangScheduler
    from radixkv.replay.sched_vllm import VllmScheduler
    from radixkv.replay.schedulers import make_scheduler

    args = p.parse_args([])
    tr = _trace([[1, 2]], [1], [0.0])

    def sched(a, pol):
        return type(make_scheduler(tr, pol, concurrent_config_from_args(a, pol)))

    # without --admission the policy class decides; --admission overrides it
    assert sched(args, RadixCache(1000, 1)) is SglangScheduler
    assert sched(args, BlockHashCache(100, 16)) is VllmScheduler
    assert sched(args, NoCache(100, 1)) is VllmScheduler
    assert sched(p.parse_args(["--admission", "vllm"]), RadixCache(1000, 1)) is VllmScheduler
    assert sched(p.parse_args(["--admission", "sglang"]), BlockHashCache(100, 16)) is SglangScheduler
    assert concurrent_config_from_args(args).max_num_batched_tokens == 8192


def test_radix_readmission_falls_back_to_the_prompt():
    """RadixCache refuses ``n_tokens > P``: the re-admission looks up the prompt only.

    The tiny-pool trace of the NoCache test on RadixCache (page 1, 10 slots), vLLM rules:
    steps 1–3 as there (B preempted in step 3; its 4 prompt tokens stay in the tree,
    unlocked). Step 4: A's decode evicts B's prompt leaf (free 0); B's re-admission
    (prompt only, hit 0) needs 4 slots, 3 free: refused; step 5 likewise (2 free), and A
    finishes. Step 6: B is admitted on its prompt, evicting A's unlocked KV, and computes
    4 + 2 generated tokens again: recomputed 6, hits 0.
    """
    tr = _trace([[1, 2, 3, 4], [5, 6, 7, 8]], [5, 5], [0.0, 0.0])
    r = replay_concurrent(tr, RadixCache.from_capacity_tokens(10, 1), COST, config=SchedulerConfig(admission="vllm"))
    assert r.summary()["preemptions"] == 1
    assert r["hit_tokens"].tolist() == [0, 0]
    assert r["recomputed_tokens"].tolist() == [0, 6]
    assert r.steps == 8


def test_outputs_are_byte_identical_across_runs(tmp_path):
    a, b = _run_tight(5), _run_tight(5)
    a.write_csv(tmp_path / "a.csv")
    b.write_csv(tmp_path / "b.csv")
    a.write_json(tmp_path / "a.json")
    b.write_json(tmp_path / "b.json")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    lines = (tmp_path / "a.csv").read_text().splitlines()
    assert len(lines) == 201 and lines[0].startswith("id,arrival_s,")
    assert json.loads((tmp_path / "a.json").read_text())["summary"]["requests"] == 200


def test_internal_fragmentation_peak_by_hand():
    """One request, P = 10, N = 3, NoCache with 4-token blocks and a 40-token pool.

    After the prefill step it holds KV for 10 tokens in ceil(10/4) = 3 blocks = 12 slot
    tokens: 2 allocated tokens hold nothing, the peak. After it finishes nothing is held.
    Peak share = 2 / 40 = 0.05.
    """
    from radixkv.cost import CostModel
    from radixkv.policies.no_cache import NoCache
    from radixkv.replay.concurrent import replay_concurrent
    from radixkv.trace.types import Trace

    t = Trace.from_requests(req_id=["a"], arrival_s=[0.0], prompt_len=[10], output_len=[3],
                            prompt_ids=[list(range(10))])
    res = replay_concurrent(t, NoCache(10, 4), CostModel.from_specs("Llama-3.1-8B", "A100-80GB"))
    s = res.summary()
    assert s["internal_fragmentation_share_peak"] == pytest.approx(2 / 40)
    assert 0 < s["internal_fragmentation_share_mean"] <= 2 / 40
