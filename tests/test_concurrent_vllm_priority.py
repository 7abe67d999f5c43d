"""vLLM's priority scheduling in the concurrent replay (``--scheduling-policy priority``).

(1) Against vLLM 0.33's real v1 ``Scheduler`` with ``policy="priority"``: the committed
goldens ``tests/data/concurrent/vllm/*_prio*.jsonl`` (tools/engines/vllm_scheduler_golden.py)
are replayed by tests/test_concurrent_vllm.py with every other golden (0 mismatching
requests and steps, with and without fast-forward); here we check that the set covers
what priority changes.

(2) Hand-worked cases of :mod:`radixkv.replay.sched_vllm_priority`'s rules: the expected
steps are worked out in the docstrings (block 4 tokens, every request's tokens unique,
one second per step, so step k starts at t = k), not taken from a run.
"""
from __future__ import annotations

import numpy as np
import pytest

from _vllm_sched_golden import golden_files, load_golden
from radixkv.cost import UnitStepCost
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.multi_concurrent import replay_multi_concurrent
from radixkv.replay.sched_vllm import VllmScheduler
from radixkv.replay.sched_vllm_priority import VllmPriorityScheduler
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.replay.schedulers import make_scheduler
from radixkv.trace.types import Trace
from radixkv.util import dumps_json

PRIO_GOLDENS = [p for p in golden_files() if load_golden(p).config.get("scheduling_policy") == "priority"]


# ---------------------------------------------------------------------------- (1) goldens
def test_priority_goldens_cover_the_rules():
    """At least five priority goldens from vLLM 0.33, with preemptions, ties of arrival
    (all at step 0) and spread arrivals, chunked prefill off, the threshold and the
    watermark; every request line carries the priority vLLM was given."""
    gs = [load_golden(p) for p in PRIO_GOLDENS]
    assert len(gs) >= 5
    assert all(g.header["engine"] == "vllm 0.33.0" for g in gs)
    assert all("prio" in r for g in gs for r in g.requests)
    assert all(len({r["prio"] for r in g.requests}) >= 2 for g in gs)
    assert sum(sum(r["preempt"] for r in g.requests) for g in gs) > 200
    c = [g.config for g in gs]
    assert {x["arrival_every"] > 0 for x in c} == {True, False}
    assert {x["chunked_prefill"] for x in c} == {True, False}
    assert any(x["long_prefill_token_threshold"] > 0 for x in c)
    assert any(x["watermark"] > 0 for x in c)


_REAL_SCHEDULE = VllmPriorityScheduler.schedule


def _fcfs_victim(self):
    return self.running[-1]


def _tie_last_victim(self):
    return max(reversed(self.running), key=self._vkey.__getitem__)


def _grow_without_refund(self, r, upto, plan):
    while upto > self.kv[r]:
        if self.policy.extend(r, upto - self.kv[r]):
            self.kv[r] = upto
            return True
        v = self._victim()
        if self.running.index(v) < self._k:
            self._k -= 1
        self._preempt(v, plan)
        plan.preempted += 1
        if v == r:
            return False
    return True


def _schedule_break_after_self(self):
    real = self._serve_running

    def serve(r, plan, budget):  # a self-preemption ends the loop, as FCFS's break
        c = real(r, plan, budget)
        if c < 0:
            self._k = len(self.running)
        return c

    self._serve_running = serve
    try:
        return _REAL_SCHEDULE(self)
    finally:
        del self._serve_running


def _rank_by_row(real_init):
    def init(self, trace, policy, config, arrivals=None):
        real_init(self, trace, policy, config, arrivals)
        pr, at = trace.priority.tolist(), np.asarray(arrivals, dtype=np.float64).tolist()
        for k, i in enumerate(sorted(range(len(trace)), key=lambda i: (pr[i], at[i], i))):
            self._rank[i] = k
    return init


@pytest.mark.parametrize("variant", ["fcfs_victim", "tie_last", "no_refund", "break_after_self", "ties_by_row"])
def test_each_rule_is_seen_by_the_goldens(variant, monkeypatch):
    """Each rule of the module docstring, changed alone, makes some priority golden
    mismatch: the goldens exercise it (and the 0-mismatch test means something)."""
    from _vllm_sched_golden import compare

    S = VllmPriorityScheduler
    if variant == "fcfs_victim":
        monkeypatch.setattr(S, "_victim", _fcfs_victim)
    elif variant == "tie_last":
        monkeypatch.setattr(S, "_victim", _tie_last_victim)
    elif variant == "no_refund":
        monkeypatch.setattr(S, "_grow", _grow_without_refund)
    elif variant == "break_after_self":
        monkeypatch.setattr(S, "schedule", _schedule_break_after_self)
    else:
        monkeypatch.setattr(S, "__init__", _rank_by_row(S.__init__))
    bad = sum(len(compare(load_golden(p)).steps) for p in PRIO_GOLDENS)
    assert bad > 0


# ---------------------------------------------------------------------------- (2) by hand
def _trace(specs):
    """specs: (id, arrival s, prompt tokens, outputs, priority); every prompt's ids unique."""
    base = 1000
    prompts = []
    for _, _, p, _, _ in specs:
        prompts.append(list(range(base, base + p)))
        base += 1000
    return Trace.from_requests(req_id=[s[0] for s in specs], arrival_s=[s[1] for s in specs],
                               prompt_len=[s[2] for s in specs], output_len=[s[3] for s in specs],
                               prompt_ids=prompts, priority=[s[4] for s in specs], name="hand")


def _steps(trace, policy, config):
    """Replay on a step clock without fast-forward; returns (result, {step: [(row, tokens)]},
    {step: preempted rows})."""
    sched, pre = {}, {}

    def on_step(start, plan, k):
        assert k == 1
        s = int(round(start))
        sched[s] = list(zip(plan.req, plan.new))
        if plan.preempted_rows:
            pre[s] = list(plan.preempted_rows)

    res = replay_concurrent(trace, policy, UnitStepCost(), config=config, on_step=on_step, fast_forward=False)
    return res, sched, pre


PRIO = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, scheduling_policy="priority")
FCFS = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8)
# A (prio 0) and B (prio 1) arrive at t = 0, C (prio 0) at t = 1; 4-token prompts.
ABC = [("a", 0.0, 4, 4, 0), ("b", 0.0, 4, 4, 1), ("c", 1.0, 4, 3, 0)]


def test_low_priority_is_preempted_before_a_later_arrival():
    """Pool of 5 usable blocks of 4 tokens (num_gpu_blocks 6).

    s0: A, B admitted (1 block each, 3 free), prefill 4 tokens each, output 1.
    s1: C arrives. A and B decode (KV 4 → 5: a block each, 1 free); C admitted (last
        block). Running [A, B, C].
    s2: A, B decode inside their second block; C (KV 4 → 5) needs a block, none free:
        the victim is max (priority, arrival) = B (1, 0), not the last admitted C. B was
        scheduled earlier in the step: it leaves the step, its block goes back. B's
        partial block returns to the head of the free queue and C takes it; B's full
        prompt block stays cached (evictable). Step: A 1, C 1; preempted [B].
    s3: A, C decode (no new block); they finish (A: 4 outputs, C: 3). B waits: its
        re-admission needs P + g = 6 tokens = 2 blocks (the cached prompt block hit,
        touched, + 1 new) and the room is 1 (the evictable block): refused.
    s4: B re-admitted: hit 4 (its prompt block), computes 2 tokens, samples output 3.
    s5: B decodes its 4th output and finishes.
    """
    res, sched, pre = _steps(_trace(ABC), BlockHashCache(6, 4), PRIO)
    assert sched == {0: [(0, 4), (1, 4)], 1: [(0, 1), (1, 1), (2, 4)], 2: [(0, 1), (2, 1)], 3: [(0, 1), (2, 1)],
                     4: [(1, 2)], 5: [(1, 1)]}
    assert pre == {2: [1]}
    assert res["preemptions"].tolist() == [0, 1, 0]
    assert res["finish_step"].tolist() == [4, 6, 4]  # 1-based
    assert res["recomputed_tokens"].tolist() == [0, 2, 0]
    assert res.meta["scheduling_policy"] == "priority"


def test_fcfs_preempts_the_last_admitted_instead():
    """The same trace under FCFS. s2: C cannot grow and is the last admitted: it preempts
    itself and the running loop stops (A 1, B 1; preempted [C]). C's one full block stays
    cached. s3: A, B decode and finish; C (P + g = 5 tokens: hit 4 + 1 new block, room 1)
    is refused. s4: C re-admitted, computes 1 token; s5: its 3rd output, finish."""
    res, sched, pre = _steps(_trace(ABC), BlockHashCache(6, 4), FCFS)
    assert sched == {0: [(0, 4), (1, 4)], 1: [(0, 1), (1, 1), (2, 4)], 2: [(0, 1), (1, 1)], 3: [(0, 1), (1, 1)],
                     4: [(2, 1)], 5: [(2, 1)]}
    assert pre == {2: [2]}
    assert "scheduling_policy" not in res.meta  # the FCFS meta keeps its bytes


def test_tie_of_priority_and_arrival_preempts_the_first_in_running_order():
    """As the first case with A at priority 1 too: at s2 A and B tie at (1, 0) and
    ``max`` keeps the first in running order, A (scheduled earlier in the step: it leaves
    it). s3: B and C decode and finish; A (6 tokens, 2 blocks, room 1) waits. s4: A
    re-admitted with its prompt block hit, 2 tokens; s5: A finishes."""
    specs = [("a", 0.0, 4, 4, 1), ("b", 0.0, 4, 4, 1), ("c", 1.0, 4, 3, 0)]
    res, sched, pre = _steps(_trace(specs), BlockHashCache(6, 4), PRIO)
    assert sched[2] == [(1, 1), (2, 1)] and pre == {2: [0]}
    assert sched[3] == [(1, 1), (2, 1)] and sched[4] == [(0, 2)] and sched[5] == [(0, 1)]


def test_preempted_request_goes_back_by_priority_not_to_the_front():
    """The first case plus D (priority 0, t = 2, 4 tokens, 1 output). s2 as before (B
    preempted; no admission in a step that preempted). s3: the queue holds B (1, 0) and
    D (0, 2): D is its head, not B. A, C decode; D is admitted into the one evictable
    block, evicting B's cached prompt block, and finishes with its prefill; B (6 tokens,
    no room) waits. s4: B re-admitted with no hit left: 6 tokens computed; s5: finish."""
    specs = ABC + [("d", 2.0, 4, 1, 0)]
    res, sched, pre = _steps(_trace(specs), BlockHashCache(6, 4), PRIO)
    assert sched[2] == [(0, 1), (2, 1)] and pre == {2: [1]}
    assert sched[3] == [(0, 1), (2, 1), (3, 4)]
    assert sched[4] == [(1, 6)] and sched[5] == [(1, 1)]
    assert res["evicted_tokens"].tolist() == [0, 0, 0, 4]
    assert res["recomputed_tokens"].tolist() == [0, 6, 0, 0]


def test_waiting_order_priority_then_arrival_then_id_as_a_string():
    """One running request at a time (max_num_seqs 1), one output each (a request
    finishes in its prefill step). All arrive at t = 0: x has priority −1; r2, r10, r1
    priority 0, so vLLM's ``Request.__lt__`` orders them by request id as a string:
    "r1" < "r10" < "r2". Admission steps: x 0, r1 1, r10 2, r2 3 (FCFS: file order)."""
    specs = [("r2", 0.0, 4, 1, 0), ("r10", 0.0, 4, 1, 0), ("r1", 0.0, 4, 1, 0), ("x", 0.0, 4, 1, -1)]
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1, scheduling_policy="priority")
    res, _, _ = _steps(_trace(specs), BlockHashCache(20, 4), cfg)
    assert res["admit_s"].tolist() == [3.0, 2.0, 1.0, 0.0]
    fc = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1)
    res, _, _ = _steps(_trace(specs), BlockHashCache(20, 4), fc)
    assert res["admit_s"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_waiting_high_priority_request_never_preempts_a_running_one():
    """2 usable blocks. L (priority 5, t = 0, 4 tokens, 5 outputs) is admitted at s0 and
    takes its second block at s1; H (priority 0) arrives at t = 1 and needs a block: none
    is free and vLLM's admission does not preempt, so H waits until L finishes (outputs
    at s0 … s4) and is admitted at s5."""
    specs = [("l", 0.0, 4, 5, 5), ("h", 1.0, 4, 1, 0)]
    res, sched, pre = _steps(_trace(specs), BlockHashCache(3, 4), PRIO)
    assert pre == {}
    assert res["admit_s"].tolist() == [0.0, 5.0]
    assert res["finish_step"].tolist() == [5, 6]


def test_fast_forward_stops_at_an_arrival_that_becomes_the_head():
    """Under FCFS a refused head is only unblocked by a finish, so a run of decodes may
    go past arrivals; under priority an arrival may become the head and be admitted.
    3 usable blocks. L (priority 5, t = 0, 5 tokens = 2 blocks, 4 outputs) is admitted at
    s0 and decodes inside its 2 blocks until it finishes at s3. W (priority 3, t = 0.5,
    8 tokens = 2 blocks) is the head at s1 and refused (room 1): s1 is a pure decode
    step with a blocked head. S (priority 0, t = 1.5, 4 tokens, 1 output) is the head at
    s2 and fits the free block: admitted at s2, finished in it. W is admitted at s4,
    after L's finish. The same with and without fast-forward."""
    specs = [("l", 0.0, 5, 4, 5), ("w", 0.5, 8, 1, 3), ("s", 1.5, 4, 1, 0)]
    for ff in (True, False):
        r = replay_concurrent(_trace(specs), BlockHashCache(4, 4), UnitStepCost(), config=PRIO, fast_forward=ff)
        assert r["admit_s"].tolist() == [0.0, 4.0, 2.0], ff
        assert r["finish_step"].tolist() == [4, 5, 3], ff


# ---------------------------------------------------------------------------- knobs, paths
def test_scheduler_class_follows_the_knob():
    t = _trace(ABC)
    assert type(make_scheduler(t, BlockHashCache(6, 4), FCFS)) is VllmScheduler
    assert type(make_scheduler(t, BlockHashCache(6, 4), PRIO)) is VllmPriorityScheduler


def test_refused_combinations():
    with pytest.raises(ConfigError, match="scheduling-policy"):
        SchedulerConfig(scheduling_policy="lifo")
    with pytest.raises(ConfigError, match="drop --schedule-policy lpm"):
        SchedulerConfig(scheduling_policy="priority", schedule_policy="lpm")
    with pytest.raises(ConfigError, match="SGLang"):
        replay_concurrent(_trace(ABC), RadixCache(40, 4), UnitStepCost(), config=PRIO)


def test_one_replica_equals_the_plain_replay():
    t = _trace(ABC + [("d", 2.0, 4, 1, 0)])
    plain = replay_concurrent(t, BlockHashCache(6, 4), UnitStepCost(), config=PRIO)
    multi = replay_multi_concurrent(t, [BlockHashCache(6, 4)], UnitStepCost(), "round-robin", config=PRIO)
    assert plain.summary()["preemptions"] == 1
    assert dumps_json(multi.replicas[0].summary()) == dumps_json(plain.summary())


def test_cli_flag(tmp_path):
    from radixkv.cli.concurrent_args import add_concurrent_args, concurrent_config_from_args
    import argparse

    ap = argparse.ArgumentParser()
    add_concurrent_args(ap)
    assert concurrent_config_from_args(ap.parse_args([])).scheduling_policy == "fcfs"
    a = ap.parse_args(["--mode", "concurrent", "--scheduling-policy", "priority"])
    assert concurrent_config_from_args(a).scheduling_policy == "priority"


# ---------------------------------------------------------------------------- fast-forward
def test_fast_forward_changes_nothing_under_priority():
    """Hypothesis cases (stem-sharing requests, tight pools that preempt, every vLLM knob):
    the fast-forwarded replay equals the step-by-step one on every request column."""
    import dataclasses

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from _conc_cases import draw_vllm_case

    @st.composite
    def cases(draw):
        tr, nb, size, cfg = draw_vllm_case(draw, st, 9)
        tr.priority = np.asarray(draw(st.lists(st.integers(-2, 2), min_size=len(tr), max_size=len(tr))),
                                 dtype=np.int64)
        return tr, nb, size, dataclasses.replace(cfg, scheduling_policy="priority")

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(cases())
    def check(case):
        tr, nb, size, cfg = case
        a = replay_concurrent(tr, BlockHashCache(nb, size), UnitStepCost(), config=cfg, fast_forward=True)
        b = replay_concurrent(tr, BlockHashCache(nb, size), UnitStepCost(), config=cfg, fast_forward=False)
        for col in ("admit_s", "finish_s", "preemptions", "hit_tokens", "recomputed_tokens"):
            np.testing.assert_array_equal(a[col], b[col], err_msg=col)
        assert a.steps == b.steps

    check()
