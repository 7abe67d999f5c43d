"""The concurrent replay under vLLM's rules, step by step.

(1) Against vLLM 0.33's real v1 ``Scheduler``: every committed golden of
tests/data/concurrent/vllm (made by tools/engines/vllm_scheduler_golden.py; no vLLM
needed here) must match on every request (first-admission hit, admission step, finish
step, preemptions) and every step (scheduled requests with their token counts, preempted
requests), with and without fast-forward.

(2) One hand-worked case per rule of :mod:`radixkv.replay.sched_vllm`; the expected values
are worked out in the docstrings, not taken from a run.
"""
from __future__ import annotations

import numpy as np
import pytest

from _vllm_sched_golden import compare, golden_files, load_golden
from _conc_cases import request_trace
from radixkv.cost import UnitStepCost
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.no_cache import NoCache
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.sched_vllm import VllmScheduler, shared_prefix_tokens
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.replay.schedulers import make_scheduler
from radixkv.trace.types import Trace

GOLDENS = golden_files()


# ---------------------------------------------------------------------------- (1) goldens
@pytest.mark.parametrize("fast_forward", [True, False], ids=["ff", "no-ff"])
@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_matches_vllm_scheduler_golden(path, fast_forward):
    g = load_golden(path)
    c = compare(g, fast_forward=fast_forward)
    assert c.n_requests == g.header["requests"] and c.n_steps > 0
    assert c.requests == [], f"{path.name}: {c.summary()}; first: {c.requests[:2]}"
    assert c.steps == [], f"{path.name}: {c.summary()}; first: {c.steps[:2]}"


def test_goldens_cover_the_knobs():
    """The committed set spans what the issue asks: block 16 and 32, chunked prefill on and
    off, prefix caching on and off, budgets 64–2,048, max_num_seqs 2–256, arrivals at
    step 0 and spread, preemptions, the long-prefill threshold and the watermark."""
    cfgs = [load_golden(p) for p in GOLDENS]
    assert len(cfgs) >= 8
    c = [g.config for g in cfgs]
    assert {x["block_size"] for x in c} == {16, 32}
    assert {x["chunked_prefill"] for x in c} == {True, False}
    assert {x["prefix_caching"] for x in c} == {True, False}
    assert min(x["max_num_batched_tokens"] for x in c) == 64 and max(x["max_num_batched_tokens"] for x in c) >= 2048
    assert min(x["max_num_seqs"] for x in c) == 2 and max(x["max_num_seqs"] for x in c) == 256
    assert {x["arrival_every"] > 0 for x in c} == {True, False}
    assert any(x["long_prefill_token_threshold"] > 0 for x in c)
    assert any(x["watermark"] > 0 for x in c)
    preempting = [g for g in cfgs if sum(r["preempt"] for r in g.requests) > 0]
    assert len(preempting) >= len(cfgs) - 1
    assert all(g.header["engine"] == "vllm 0.33.0" for g in cfgs)


# ---------------------------------------------------------------------------- (2) rules
def _trace(prompts, outputs, output_ids=None, arrivals=None):
    return request_trace(prompts, outputs, arrivals or None, output_ids=bool(output_ids))


def _steps(trace, policy, config, arrivals=None):
    """Replay on a step clock; returns (result, {step: [(row, tokens), ...]}, {step: preempted})."""
    sched, pre = {}, {}

    def on_step(start, plan, k):
        for j in range(k):
            s = int(start) + j
            sched[s] = [(r, (n if k == 1 else 1)) for r, n in zip(plan.req, plan.new)]
            if k == 1 and plan.preempted_rows:
                pre[s] = list(plan.preempted_rows)

    res = replay_concurrent(trace, policy, UnitStepCost(), config=config, on_step=on_step,
                            arrivals=None if arrivals is None else np.asarray(arrivals, dtype=np.float64))
    return res, sched, pre


def test_readmission_allocates_only_hit_plus_first_chunk():
    """A preempted request (P = 12, g = 5 generated) is re-admitted into an empty cache with
    a 4-token budget, block size 4, 20 usable blocks. vLLM (``allocate_slots``) checks that
    all P + g = 17 tokens fit (ceil(17/4) = 5 blocks ≤ 20) but allocates only the hit (0)
    plus the first chunk, min(17, 4) = 4 tokens: 1 block — not the 5 blocks of P + g."""
    tr = _trace([list(range(12))], [10])
    pol = BlockHashCache(21, 4)
    sch = make_scheduler(tr, pol, SchedulerConfig(max_num_batched_tokens=4))
    assert isinstance(sch, VllmScheduler)
    sch.gen[0], sch.admissions[0], sch.preemptions[0] = 5, 1, 1
    sch.enqueue(0)
    plan = sch.schedule()
    assert list(zip(plan.req, plan.new, plan.ctx)) == [(0, 4, 0)]
    assert pol.stats(detail=False).used_slots == 1
    assert sch.target[0] == 17 and sch.recomputed[0] == 17
    # the whole 17 tokens (5 blocks) must fit: with 6 usable blocks of which another
    # request holds 2, the 4 free refuse it although its first chunk needs only 1
    tr2 = _trace([list(range(12)), list(range(50, 58))], [6, 1])
    pol6 = BlockHashCache(7, 4)
    assert pol6.admit(1, tr2.kv_seq(1)) is not None and pol6.stats(detail=False).free_slots == 4
    sch6 = make_scheduler(tr2, pol6, SchedulerConfig(max_num_batched_tokens=4))
    sch6.gen[0], sch6.admissions[0] = 5, 1
    sch6.enqueue(0)
    plan6 = sch6.schedule()
    assert plan6.empty and plan6.blocked and pol6.stats(detail=False).used_slots == 2


def test_readmission_looks_up_prompt_and_generated_tokens():
    """The re-admission's lookup covers prompt + generated tokens. Request 0: prompt 0..11,
    outputs 100..109 (B = 4). Request 1's prompt is request 0's 12 prompt tokens + its
    first 5 outputs (17 tokens); run alone first, it caches 4 full blocks (16 tokens).
    Request 0 re-admitted with g = 5 has the same 17 known tokens: hit = min(4,
    (17 − 1) // 4) blocks = 16 tokens, and 1 token to compute."""
    p0 = list(range(12))
    out0 = list(range(100, 110))
    tr = _trace([p0, p0 + out0[:5]], [out0, [7]], output_ids=True)
    pol = BlockHashCache(40, 4)
    assert pol.run_request(1, tr.kv_seq(1)).hit_tokens == 0
    sch = make_scheduler(tr, pol, SchedulerConfig(max_num_batched_tokens=64))
    sch.gen[0], sch.admissions[0] = 5, 1
    sch.enqueue(0)
    plan = sch.schedule()
    assert list(zip(plan.req, plan.new, plan.ctx)) == [(0, 1, 16)]


def test_chunked_prefill_off_admits_only_whole_prompts():
    """Budget 16, block 4, chunked prefill off. q0: 10 tokens, q1: 10 other tokens, both
    N = 2. Step 0: q0's 10 tokens fit (16), q1's 10 > 6 left: not admitted (with chunked
    prefill on it would get a 6-token chunk). Step 1: q0 decodes (1) and samples its second
    and last token, q1's 10 ≤ 15 are admitted. Step 2: q1 decodes and finishes."""
    tr = _trace([list(range(10)), list(range(50, 60))], [2, 2])
    for chunked, step0 in ((False, [(0, 10)]), (True, [(0, 10), (1, 6)])):
        cfg = SchedulerConfig(max_num_batched_tokens=16, enable_chunked_prefill=chunked)
        res, sched, _ = _steps(tr, BlockHashCache(40, 4), cfg)
        assert sched[0] == step0
    assert sched[1] == [(0, 1), (1, 4)]  # chunked: q1's last 4 tokens
    res, sched, _ = _steps(tr, BlockHashCache(40, 4), SchedulerConfig(max_num_batched_tokens=16,
                                                                      enable_chunked_prefill=False))
    assert sched[1] == [(0, 1), (1, 10)] and sched[2] == [(1, 1)]
    assert res["admit_s"].tolist() == [0.0, 1.0] and res["finish_s"].tolist() == [2.0, 3.0]


def test_chunked_prefill_off_counts_the_hit():
    """Chunked prefill off, budget 16, block 4. q0 = tokens 0..9 (N = 2); q1 = q0's first 8
    tokens + 6 new (14 tokens). In step 0 q0's 10 tokens are scheduled first and its 2
    full blocks cached at once, so q1's lookup hits 8 tokens and needs 14 − 8 = 6 ≤ 16 − 10:
    admitted in step 0 with a 6-token chunk."""
    tr = _trace([list(range(10)), list(range(8)) + list(range(70, 76))], [2, 2])
    cfg = SchedulerConfig(max_num_batched_tokens=16, enable_chunked_prefill=False)
    res, sched, _ = _steps(tr, BlockHashCache(40, 4), cfg)
    assert sched[0] == [(0, 10), (1, 6)]
    assert res["hit_tokens"].tolist() == [0, 8]


def test_chunked_prefill_off_refuses_requests_longer_than_a_step():
    tr = _trace([list(range(10))], [8])  # 10 + 7 = 17 tokens of KV > 16
    with pytest.raises(ConfigError, match="max-num-batched-tokens"):
        make_scheduler(tr, BlockHashCache(40, 4), SchedulerConfig(max_num_batched_tokens=16,
                                                                  enable_chunked_prefill=False))


def test_long_prefill_token_threshold():
    """Threshold 8, budget 64. Two 20-token prompts (N = 1): 2 eligible requests, so each
    chunk is capped at 8: step 0 [(q0, 8), (q1, 8)], step 1 the same, step 2 the last 4 of
    each. One request alone is not capped (vLLM: ``num_eligible_reqs > 1``): 20 in step 0."""
    tr = _trace([list(range(20)), list(range(100, 120))], [1, 1])
    cfg = SchedulerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=8)
    res, sched, _ = _steps(tr, BlockHashCache(40, 4), cfg)
    assert [sched[s] for s in range(3)] == [[(0, 8), (1, 8)]] * 2 + [[(0, 4), (1, 4)]]
    res1, sched1, _ = _steps(_trace([list(range(20))], [1]), BlockHashCache(40, 4), cfg)
    assert sched1 == {0: [(0, 20)]}
    with pytest.raises(ConfigError):
        SchedulerConfig(long_prefill_token_threshold=-1)


def test_fast_forward_stops_where_a_decode_makes_the_head_hit():
    """Block 4, 4 usable blocks. q0: prompt [0, 1, 2, 3, 9], outputs 10..17 (N = 8, KV
    extent 12 = 3 blocks); q1: [0, 1, 2, 3 | 9, 10, 11, 12 | 80..87] (16 tokens), N = 1.

    step 0: q0's prefill takes 2 blocks (block 0 full and cached, block 1 holds [9]). q1
            hits block 0 (held by q0: nothing to touch) and needs 4 − 1 = 3 new blocks
            > 2 free: refused.
    steps 1–2: q0 decodes (KV 6, 7), no new block; q1 still needs 3 > 2.
    step 3: q0's decode feeds 12: block 1 = [9, 10, 11, 12] is full and cached when the
            decode is scheduled, and q1's lookup in the same step (running first, then
            waiting) hits 8 tokens: 4 − 2 = 2 new blocks ≤ 2 free → admitted in step 3
            with its last 8 tokens; it samples its one token and finishes (time 4).
    q0 samples outputs in steps 0..7 and finishes at time 8; no preemption (q1 freed its
    blocks before q0 needs a third one in step 4).
    A fast-forward from step 1 that ignored the growing hit would run q0 alone to its
    finish and admit q1 only in step 8.
    """
    q0 = [0, 1, 2, 3, 9]
    out0 = list(range(10, 18))
    q1 = [0, 1, 2, 3, 9, 10, 11, 12] + list(range(80, 88))
    tr = _trace([q0, q1], [out0, [5]], output_ids=True)
    res, sched, pre = _steps(tr, BlockHashCache(5, 4), SchedulerConfig(max_num_batched_tokens=64))
    assert res["admit_s"].tolist() == [0.0, 3.0]
    assert res["hit_tokens"].tolist() == [0, 8]
    assert sched[0] == [(0, 5)] and sched[3] == [(0, 1), (1, 8)]
    assert res["finish_s"].tolist() == [8.0, 4.0]
    assert pre == {}


def test_shared_prefix_tokens():
    a = _trace([list(range(10))], [1]).kv_seq(0)
    b = _trace([list(range(6)) + [99, 7]], [1]).kv_seq(0)
    assert shared_prefix_tokens(a, a) == 10
    assert shared_prefix_tokens(a, b) == 6
    assert shared_prefix_tokens(b, a) == 6
    c = _trace([[5] + list(range(1, 10))], [1]).kv_seq(0)
    assert shared_prefix_tokens(a, c) == 0
    # units of 4 tokens: the same unit ids, one prompt cut 2 tokens short in its last unit
    u = Trace.from_requests(req_id=["x", "y"], arrival_s=[0.0, 0.0], prompt_len=[12, 10], output_len=[1, 1],
                            prompt_ids=[[1, 2, 3], [1, 2, 3]], unit_tokens=4, partial_last_unit=True)
    assert shared_prefix_tokens(u.kv_seq(0), u.kv_seq(1)) == 10


def test_unit_step_cost():
    c = UnitStepCost()
    assert c.step_time([5, 1], [0, 9]) == 1.0 and c.step_time([], []) == 0.0
    assert c.decode_steps_time(7, 100, 3).tolist() == [1.0, 1.0, 1.0]
    assert np.isnan(c.prefill_flops(10, 0)) and np.isnan(c.prefill_flops(np.array([1, 2]))).all()
    assert UnitStepCost(0.5).step_time([1], [0]) == 0.5
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError):
            UnitStepCost(bad)


def test_step_clock_times_are_step_indices():
    """On the step clock a lone request (P = 5, N = 3, budget 8) is admitted at 0, samples
    its first token at the end of step 0 (time 1), decodes in steps 1 and 2, finishes at
    time 3; a request arriving at 10 (idle in between) is admitted at step 10."""
    tr = _trace([list(range(5)), list(range(20, 25))], [3, 1])
    res, sched, _ = _steps(tr, NoCache(40, 4), SchedulerConfig(max_num_batched_tokens=8), arrivals=[0.0, 10.0])
    assert res["admit_s"].tolist() == [0.0, 10.0]
    assert res["first_token_s"].tolist()[0] == 1.0
    assert res["finish_s"].tolist() == [3.0, 11.0]
    assert sorted(sched) == [0, 1, 2, 10]
    assert np.isnan(res.summary()["prefill_flops"])


def test_cli_flags_for_vllm_knobs():
    import argparse

    from radixkv.cli.concurrent_args import add_concurrent_args, concurrent_config_from_args

    p = argparse.ArgumentParser()
    add_concurrent_args(p)
    cfg = concurrent_config_from_args(p.parse_args([]))
    assert cfg.enable_chunked_prefill is True and cfg.long_prefill_token_threshold == 0
    cfg = concurrent_config_from_args(p.parse_args(["--no-enable-chunked-prefill",
                                                    "--long-prefill-token-threshold", "48"]))
    assert cfg.enable_chunked_prefill is False and cfg.long_prefill_token_threshold == 48
    with pytest.raises(SystemExit):
        p.parse_args(["--long-prefill-token-threshold", "-1"])
    # SGLang's rules do not take them
    tr = _trace([list(range(10))], [2])
    with pytest.raises(ConfigError, match="vLLM knobs"):
        make_scheduler(tr, BlockHashCache(40, 4), SchedulerConfig(admission="sglang", long_prefill_token_threshold=8))


def test_watermark_keeps_blocks_free_while_others_run():
    """10 usable blocks of 4 tokens (num_gpu_blocks 11), watermark 0.2 → int(0.2 × 11) = 2
    blocks. q0: 8 tokens (2 blocks), N = 10; q1: 28 other tokens (7 blocks), N = 1.
    Step 0: q0 is admitted into an idle engine (no watermark then) and takes 2 blocks;
    q1 would take 7 of the 8 free, but 7 + 2 > 8: refused while q0 runs. q0 samples in
    steps 0..9 and finishes at time 10; in step 10 nothing runs and q1's 7 ≤ 10 fit.
    Without the watermark q1 is admitted in step 0."""
    tr = _trace([list(range(8)), list(range(100, 128))], [10, 1])
    res, sched, _ = _steps(tr, BlockHashCache(11, 4), SchedulerConfig(watermark=0.2))
    assert res["admit_s"].tolist() == [0.0, 10.0]
    assert sched[0] == [(0, 8)]
    res0, sched0, _ = _steps(tr, BlockHashCache(11, 4), SchedulerConfig(watermark=0.0))
    assert res0["admit_s"].tolist() == [0.0, 0.0]
    # alone, a request may take every block: 10 + 2 > 10 but nothing runs
    lone = _trace([list(range(40))], [1])
    res1, _, _ = _steps(lone, BlockHashCache(11, 4), SchedulerConfig(watermark=0.2))
    assert res1["admit_s"].tolist() == [0.0]
    for bad in (-0.1, 1.0):
        with pytest.raises(ConfigError):
            SchedulerConfig(watermark=bad)


def test_admission_slots_counts_new_and_touched_blocks():
    """Block 4. q0 = tokens 0..7 (2 full blocks) ran and finished: both cached, evictable.
    q = q0's 8 tokens + 8 new (16 tokens, 4 blocks): hit 2 blocks (cap (16 − 1) // 4 = 3),
    so 4 − 2 = 2 new blocks + 2 touched (they leave the free queue) = 4. With q0 admitted
    again: its own lookup is capped at (8 − 1) // 4 = 1 block, so it holds block 0 and
    recomputes block 1 into a new block (a second block with the same key); q's lookup
    finds block 0 (held: no touch) and the first-cached copy of block 1 (still evictable:
    touched), 2 new + 1 touched = 3. NoCache: ceil(16 / 4) = 4."""
    tr = _trace([list(range(8)), list(range(8)) + list(range(50, 58))], [1, 1])
    pol = BlockHashCache(20, 4)
    pol.run_request(0, tr.kv_seq(0))
    assert pol.admission_slots(tr.kv_seq(1)) == 4
    assert pol.peek_hit(tr.kv_seq(1)) == 8
    assert pol.admit(0, tr.kv_seq(0)) is not None
    assert pol.admission_slots(tr.kv_seq(1)) == 3
    assert NoCache(20, 4).admission_slots(tr.kv_seq(1)) == 4
    with pytest.raises(ConfigError, match="admission_slots"):
        from radixkv.policies.static_reserved import StaticReservedCache
        make_scheduler(tr, StaticReservedCache(20, 4, reserved_fraction=0.3), SchedulerConfig(watermark=0.1))
