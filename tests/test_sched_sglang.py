"""SGLang 0.5.23 scheduling rules of the concurrent replay, one hand-worked case per rule.

Each test names the SGLang function it checks (``python/sglang/srt/managers/``). The
expected values are worked out in the docstrings from those functions, not read from a run.
"""
from __future__ import annotations

import pytest

from radixkv.policies.no_cache import NoCache
from radixkv.policies.radix import RadixCache
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.sched_sglang import (
    SGLANG_INIT_NEW_TOKEN_RATIO,
    SglangScheduler,
    available_chunk_tokens,
    ratio_after_retract,
)
from radixkv.replay.sched_vllm import VllmScheduler
from radixkv.replay.scheduler import SchedulerConfig, StepPlan
from radixkv.replay.schedulers import make_scheduler
from radixkv.trace.types import Trace

from _conc_cases import COST, request_trace


def _trace(prompts, outputs, arrivals):
    return request_trace(prompts, outputs, arrivals)


def test_members_of_one_prefill_batch_cannot_hit_each_other():
    """``Scheduler._get_new_batch_prefill_raw`` matches each request when the batch forms;
    ``process_batch_result_prefill`` → ``cache_unfinished_req`` inserts after the forward.

    A and B (the same 40 tokens) arrive at 0 and form one prefill batch: the tree is empty
    when both are matched → hits 0 and 0. C (the same prompt) arrives at t = 100, after A
    and B were inserted: its lookup key is capped at P − 1 = 39 tokens → hit 39.
    """
    x = list(range(40))
    tr = _trace([x, x, x], [4, 4, 4], [0.0, 0.0, 100.0])
    r = replay_concurrent(tr, RadixCache(10_000, 1), COST)  # sglang rules from the class
    assert r.meta["admission"] == "sglang"
    assert r["hit_tokens"].tolist() == [0, 0, 39]
    assert r["admit_s"][1] == 0.0  # B was in the first batch, not delayed


def test_chunked_prefill_inserts_per_chunk():
    """``PrefillAdder.add_chunked_req`` / ``_select_prefill_admission`` with a 64-token budget.

    A and B: the same 200 tokens, both at t = 0. Step 1: A's chunk [0, 64) takes the whole
    budget (B waits: ``rem_chunk_tokens`` spent). Steps 2, 3: chunks [64, 128), [128, 192),
    each inserted after its step. Step 4: A's last 8 tokens, then B is admitted in the same
    batch: it matches the 192 tokens inserted so far (A's last chunk enters the tree only
    after step 4's forward) and computes its 8 remaining tokens in the 56 left.
    """
    y = list(range(200))
    tr = _trace([y, y], [4, 4], [0.0, 0.0])
    r = replay_concurrent(tr, RadixCache(10_000, 1), COST, config=SchedulerConfig(max_num_batched_tokens=64))
    assert r["hit_tokens"].tolist() == [0, 192]
    t4 = sum(COST.step_time(n, c) for n, c in (([64], [0]), ([64], [64]), ([64], [128])))
    assert r["admit_s"][1] == pytest.approx(t4, rel=1e-12)


def test_request_arriving_mid_prefill_hits_the_chunks_already_inserted():
    """A (100 tokens) alone in step 1 computes [0, 64) (budget 64); B (the same 100 tokens)
    arrives during step 1. Step 2: A's chunk [64, 100) (36 tokens), then B in the 28 left:
    B matches [0, 64) only → hit 64, and its first chunk is 28 of its 36 remaining tokens."""
    z = list(range(100))
    t1 = COST.step_time([64], [0])
    tr = _trace([z, z], [2, 2], [0.0, t1 / 2])
    r = replay_concurrent(tr, RadixCache(10_000, 1), COST, config=SchedulerConfig(max_num_batched_tokens=64))
    assert r["hit_tokens"].tolist() == [0, 64]


@pytest.mark.parametrize("order,hits", [("fcfs", [0, 0, 0]), ("lpm", [0, 39, 0])])
def test_lpm_in_batch_prefix_deprioritisation(order, hits):
    """``SchedulePolicy._compute_prefix_matches`` (thresholds 32 / 32) + ``_sort_by_longest_prefix``.

    Queue [A (X, 40 tokens), C (X again), B (Y, 40 other tokens)], max_num_seqs 2, N = 2.
    Nothing is cached, so every cached prefix is 0 ≤ 32 and each is checked against the
    waiting-queue tree: A's X goes in; C shares ≥ 32 tokens with it → deprioritised; B's Y
    goes in. lpm order: A, B, C. Batch 1 = A, B; C is admitted after they finish and hits
    A's inserted prompt (capped at 39). FCFS: batch 1 = A, C (C hits 0: same batch), then B.
    """
    x, y = list(range(40)), list(range(1000, 1040))
    tr = _trace([x, x, y], [2, 2, 2], [0.0, 0.0, 0.0])
    cfg = SchedulerConfig(max_num_seqs=2, schedule_policy=order)
    r = replay_concurrent(tr, RadixCache(10_000, 1), COST, config=cfg)
    assert r["hit_tokens"].tolist() == hits


def _drive(sch, n):
    """Run a scheduler to completion (all requests at t = 0); returns the steps' plans."""
    for i in range(n):
        sch.enqueue(i)
    plans, done = [], 0
    while done < n:
        plan = sch.schedule()
        plans.append((plan, sch.ratio if isinstance(sch, SglangScheduler) else None))
        sch.complete(plan)
        done += len(sch.finished_now)
    return plans


def test_retraction_order_ratio_and_rematch():
    """``ScheduleBatch.retract_decode``, ``NewTokenRatioTracker.estimate_new_token_ratio_after_retract``,
    ``Req.init_next_round_input``.

    RadixCache of 20 tokens (page 1); A = [1..4], B = [5..8], N = 8 each; the ratio starts
    at 0.1 (as after a long decay). Step 1: A passes ``add_one_req`` (4 + 8 + 1 = 13 < 20)
    and reserves 4 + 1 + 8 = 13; B: 13 < 20 − 13 fails. Step 2: offset = 0.1 · (8 − 1) =
    0.7, room = 20 − 4 = 16: B passes (13 < 15.3); B's prefill (prefill first: A waits).
    Steps 3–8: both decode (A, B at 4 + d tokens, d = 1 … 6: 20 used). Step 9: the decode
    needs 2 slots, none left → retract. Both have 7 outputs and 4-token prompts, so the
    later in the batch, B, goes; it frees its 6 decode tokens (its prompt stays cached,
    unlocked) and is appended to the queue. The ratio becomes min(1, (7 + 20·1)/(8 + 1))
    = 1.0 (not the initial 0.7), and no decay in that step. A samples output 8 and
    finishes. Step 10: B re-admitted with fill = P + g = 4 + 7 = 11 tokens, matched up to
    10: its 4 cached prompt tokens hit → it recomputes 11 − 4 = 7 (the prompt-only lookup
    capped at P − 1 = 3 would recompute 8).
    """
    tr = _trace([[1, 2, 3, 4], [5, 6, 7, 8]], [8, 8], [0.0, 0.0])
    sch = make_scheduler(tr, RadixCache(20, 1), SchedulerConfig())
    assert isinstance(sch, SglangScheduler)
    sch.ratio = 0.1
    plans = _drive(sch, 2)
    first = [p.req for p, _ in plans[:2]]
    assert first == [[0], [1]]
    retract = [k for k, (p, _) in enumerate(plans) if p.preempted]
    assert retract == [8]  # step 9
    plan9, ratio9 = plans[8]
    assert plan9.req == [0] and ratio9 == 1.0
    assert sch.preemptions == [0, 1]
    assert sch.recomputed == [0, 7]
    assert ratio_after_retract([7], [8]) == 1.0
    assert ratio_after_retract([3, 5], [100, 200]) == pytest.approx((8 + 40) / 301)


def test_new_token_ratio_decays_per_decode_step_and_resets_when_idle():
    """``NewTokenRatioTracker.decay_step``: −(0.7 − 0.7·0.14)/600 per decode step, none on a
    prefill step; ``reset`` when idle. One request, P = 4, N = 11: one prefill step then
    10 decode steps → 0.7 − 10 · 0.602/600."""
    tr = _trace([[1, 2, 3, 4]], [11], [0.0])
    sch = make_scheduler(tr, RadixCache(100, 1), SchedulerConfig())
    plans = _drive(sch, 1)
    assert len(plans) == 11
    assert plans[0][1] == SGLANG_INIT_NEW_TOKEN_RATIO
    assert sch.ratio == pytest.approx(0.7 - 10 * (0.7 - 0.098) / 600, rel=1e-12)
    sch.idle()
    assert sch.ratio == 0.7


def test_retracted_request_goes_to_the_back_vllm_preempted_to_the_front():
    """``Scheduler._add_request_to_queue(req, is_retracted=True)`` appends; vLLM's
    ``_preempt_request`` prepends (``waiting.prepend_request``)."""
    tr = _trace([[1, 2], [3, 4], [5, 6]], [4, 4, 4], [0.0, 0.0, 0.0])
    for rule, want in (("sglang", [2, 1]), ("vllm", [1, 2])):
        sch = make_scheduler(tr, NoCache(100, 1), SchedulerConfig(admission=rule))
        assert isinstance(sch, SglangScheduler if rule == "sglang" else VllmScheduler)
        for i in range(3):
            sch.enqueue(i)
        sch.schedule()  # admits all three
        sch.running.remove(2)  # make the queue [2]
        sch.policy.finish(2)
        sch.waiting.append(2)
        sch._preempt(1, StepPlan([], [], [], []))
        assert list(sch.waiting) == want


def test_radix_readmission_looks_up_prompt_and_outputs():
    """``Req.init_next_round_input``: ``fill_ids`` = prompt + outputs, matched up to
    ``len(fill_ids) − 1``. A finished request inserted prompt [1..4] + outputs; a second
    request with the same 4-token prompt and the same (unique-per-request) outputs cannot
    exist, so use the prompt: a retracted request with g = 2 looks up 5 tokens and hits
    the 4 cached prompt tokens (a first admission is capped at P − 1 = 3)."""
    c = RadixCache(100, 1)
    seq = _trace([[1, 2, 3, 4]], [5], [0.0]).kv_seq(0)
    c.admit(0, seq)
    c.extend(0, 2)
    c.preempt(0)  # retract after 2 decode tokens: nothing new inserted
    assert c.peek_hit(seq) == 3
    assert c.peek_hit(seq, 6) == 4
    adm = c.admit(0, seq, 6)
    assert adm.hit_tokens == 4


def _native(path, prompts, outputs):
    import json

    with open(path, "w") as f:
        f.write(json.dumps({"radixkv_trace": 1, "unit_tokens": 1, "partial_last_unit": False}) + "\n")
        for i, (p, n) in enumerate(zip(prompts, outputs)):
            f.write(json.dumps({"id": f"r{i}", "tokens": p, "output_length": n, "arrival_s": 0.0}) + "\n")


@pytest.mark.parametrize("prompt,extra,hit", [(40, [], 0), (200, ["--max-num-batched-tokens", "64"], 192)])
def test_cli_same_prompt_twice_at_t0(tmp_path, capsys, prompt, extra, hit):
    """The two cases of the first test pair through ``radixkv replay --mode concurrent
    --policy sglang:1 --admission sglang`` (FCFS): second request's hit 0, and 192 with
    64-token chunks; ``--timeline`` needs ``--mode concurrent``."""
    from radixkv.cli import main

    tr, csv, tl = tmp_path / "t.jsonl", tmp_path / "r.csv", tmp_path / "tl.csv"
    _native(tr, [list(range(prompt))] * 2, [4, 4])
    args = ["replay", str(tr), "--policy", "sglang:1", "--admission", "sglang", "--capacity-tokens", "10000",
            "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--quiet", *extra]
    assert main([*args, "--mode", "concurrent", "--per-request", str(csv), "--timeline", str(tl)]) == 0
    rows = [line.split(",") for line in csv.read_text().splitlines()]
    col = rows[0].index("hit_tokens")
    assert [int(r[col]) for r in rows[1:]] == [0, hit]
    assert tl.read_text().startswith("step,time_s,running,waiting,batch_tokens,")
    capsys.readouterr()
    assert main([*args, "--timeline", str(tmp_path / "x.csv")]) != 0
    assert "--timeline" in capsys.readouterr().err and not (tmp_path / "x.csv").exists()


# ------------------------------------------------------------ against SGLang's own code
def _rules_golden():
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "data" / "concurrent" / "sglang" / "rules.json").read_text())


def test_lpm_order_matches_sglang_schedule_policy():
    """tests/data/concurrent/sglang/rules.json, written by tools/engines/sglang_sched_rules.py
    from SGLang 0.5.23's ``SchedulePolicy("lpm").calc_priority`` over its real radix tree:
    the same history and waiting queue through radixkv's lpm order."""
    g = _rules_golden()["lpm"]
    hist, wait = g["history"], g["waiting"]
    prompts = hist + [p for _, p in wait]
    tr = Trace.from_requests(req_id=[f"h{i}" for i in range(len(hist))] + [rid for rid, _ in wait],
                             arrival_s=[0.0] * len(prompts), prompt_len=[len(p) for p in prompts],
                             output_len=[2] * len(hist) + [4] * len(wait), prompt_ids=prompts)
    pol = RadixCache(4096, 1)
    for i in range(len(hist)):
        pol.run_request(i, tr.kv_seq(i))
    sch = make_scheduler(tr, pol, SchedulerConfig(schedule_policy="lpm"))
    for i in range(len(hist), len(prompts)):
        sch.enqueue(i)
    assert {str(tr.req_id[i]): pol.peek_hit(tr.kv_seq(i)) for i in sch.waiting} == g["prefix_len"]
    sch._order_waiting()
    assert [str(tr.req_id[i]) for i in sch.waiting] == g["order"]


def test_retraction_order_and_ratio_match_sglang():
    """The golden's ``ScheduleBatch._get_decode_retraction_order`` and
    ``estimate_new_token_ratio_after_retract`` on five running requests, and
    ``NewTokenRatioTracker.from_config`` (init, min, decay)."""
    g = _rules_golden()
    run = g["retraction"]["running"]
    tr = _trace([list(range(p)) for _, p, _, _ in run], [m for *_, m in run], [0.0] * len(run))
    sch = make_scheduler(tr, NoCache(1000, 1), SchedulerConfig(admission="sglang"))
    sch.running = list(range(len(run)))
    sch.gen = [g_ for _, _, g_, _ in run]
    order, ratios = [], []
    while len(sch.running) > 1:
        v = sch._victim()
        sch.running.remove(v)
        order.append(run[v][0])
        ratios.append(ratio_after_retract([sch.gen[r] for r in sch.running], [sch.N[r] for r in sch.running]))
    assert order == g["retraction"]["retraction_order"]
    assert ratios == pytest.approx(g["retraction"]["ratio_after"], rel=1e-15)
    assert (sch.ratio, sch.ratio_min) == pytest.approx((g["ratio"]["init"], g["ratio"]["min"]), rel=1e-15)
    assert sch.ratio_decay == pytest.approx(g["ratio"]["decay"], rel=1e-12)


def test_continuing_chunk_truncates_the_remaining_total_before_falling_back_to_the_budget():
    """``PrefillBudget.available_chunk_tokens``: ``min(chunk_limit, int(remaining_total))``,
    and the whole ``chunk_limit`` when that is <= 0. A remaining total of 0.5 tokens
    truncates to 0, so the chunk gets the whole budget (a 0-token chunk would be planned
    forever while the decodes that could retract never run)."""
    assert available_chunk_tokens(8192, 100.7) == 100
    assert available_chunk_tokens(50, 100.0) == 50
    assert available_chunk_tokens(8192, 0.5) == 8192
    assert available_chunk_tokens(8192, 0.0) == 8192
    assert available_chunk_tokens(8192, -300.2) == 8192
    assert available_chunk_tokens(8192, 1.0) == 1
