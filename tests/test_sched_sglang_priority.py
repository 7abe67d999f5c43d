"""SGLang's priority scheduling (``--enable-priority-scheduling``), rule by rule.

SGLang's scheduler loop needs a model worker and is not driven for goldens
(tools/engines/README.md). SGLang's own ordering and retraction functions are
(tools/engines/sglang_priority_rules.py → tests/data/concurrent/sglang/priority_rules.json,
replayed at the end of this file); every rule of
:mod:`radixkv.replay.sched_sglang_priority` also has a hand-worked case; expected values are worked out in the docstrings from SGLang
0.5.23's code (``schedule_policy.py :: SchedulePolicy.calc_priority`` /
``_sort_by_priority_and_fcfs``, ``scheduler.py :: _add_request_to_queue``,
``schedule_batch.py :: _get_decode_retraction_order``), not taken from a run.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cost import UnitStepCost
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.replay import conc_sglang
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.sched_sglang import SglangScheduler
from radixkv.replay.sched_sglang_priority import SglangPriorityScheduler
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.replay.schedulers import make_scheduler
from radixkv.trace.types import Trace


def _trace(specs):
    """specs: (id, arrival s, prompt tokens, outputs, priority); every prompt's ids unique."""
    prompts = [list(range(1000 * (k + 1), 1000 * (k + 1) + s[2])) for k, s in enumerate(specs)]
    return Trace.from_requests(req_id=[s[0] for s in specs], arrival_s=[s[1] for s in specs],
                               prompt_len=[s[2] for s in specs], output_len=[s[3] for s in specs],
                               prompt_ids=prompts, priority=[s[4] for s in specs], name="hand")


def _cfg(**kw):
    base = dict(max_num_batched_tokens=64, max_num_seqs=1, enable_priority_scheduling=True,
                disable_priority_preemption=True)
    return SchedulerConfig(**{**base, **kw})


# a: 1, b: 3, c: 2, d: 3, all at t = 0, 8-token prompts, one output each
ABCD = [("a", 0.0, 8, 1, 1), ("b", 0.0, 8, 1, 3), ("c", 0.0, 8, 1, 2), ("d", 0.0, 8, 1, 3)]


def test_higher_values_first_by_default_then_queue_entry():
    """One running request at a time (max_running_requests 1) and one output each, so a
    request is admitted, prefilled and finished in one step and the next is admitted in
    the next step. Default direction (priority_sign = −1): b (3, entered 2nd), d (3, 4th),
    c (2), a (1): admission steps a 3, b 0, c 2, d 1."""
    res = replay_concurrent(_trace(ABCD), RadixCache(400, 1), UnitStepCost(), config=_cfg())
    assert res["admit_s"].tolist() == [3.0, 0.0, 2.0, 1.0]
    assert res.meta["enable_priority_scheduling"] is True


def test_low_values_first():
    """``--schedule-low-priority-values-first``: a (1), c (2), b (3, 2nd), d (3, 4th)."""
    res = replay_concurrent(_trace(ABCD), RadixCache(400, 1), UnitStepCost(),
                            config=_cfg(schedule_low_priority_values_first=True))
    assert res["admit_s"].tolist() == [0.0, 2.0, 1.0, 3.0]


def test_without_the_flag_the_queue_is_fcfs():
    res = replay_concurrent(_trace(ABCD), RadixCache(400, 1), UnitStepCost(),
                            config=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1))
    assert res["admit_s"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_later_arrival_of_higher_priority_goes_first():
    """x (priority 0) runs from t = 0 for 3 outputs (steps 0–2); y (0) arrives at 0.5 and
    z (5) at 1.5, both waiting for the one seat. At step 3 the queue is sorted: z first
    (higher value), then y: z admitted at 3, y at 4."""
    specs = [("x", 0.0, 8, 3, 0), ("y", 0.5, 8, 1, 0), ("z", 1.5, 8, 1, 5)]
    for ff in (True, False):
        res = replay_concurrent(_trace(specs), RadixCache(400, 1), UnitStepCost(), config=_cfg(), fast_forward=ff)
        assert res["admit_s"].tolist() == [0.0, 4.0, 3.0], ff


def test_a_retracted_request_queues_behind_its_priority():
    """``_add_request_to_queue`` stamps the entry time again on re-queue: rows 0, 1, 2 of
    equal priority arrive in that order, 0 is taken out and put back (retracted): the
    sorted queue is 1, 2, 0; a row of higher priority put back still goes first."""
    t = _trace([("p", 0.0, 8, 4, 1), ("q", 0.0, 8, 4, 1), ("r", 0.0, 8, 4, 1), ("s", 0.0, 8, 4, 2)])
    sch = make_scheduler(t, RadixCache(400, 1), _cfg())
    for i in range(3):
        sch.enqueue(i)
    sch.waiting.popleft()
    sch._requeue(0)
    sch._order_waiting()
    assert list(sch.waiting) == [1, 2, 0]
    sch._requeue(3)
    sch._order_waiting()
    assert list(sch.waiting) == [3, 1, 2, 0]


def test_lpm_ignores_priorities():
    """``calc_priority`` sorts by priority only under FCFS: with lpm the base order."""
    t = _trace(ABCD)
    sch = make_scheduler(t, RadixCache(400, 1), _cfg(schedule_policy="lpm"))
    for i in range(4):
        sch.enqueue(i)
    sch._order_waiting()
    assert list(sch.waiting) == [0, 1, 2, 3]  # no hits, no shared fills: lpm keeps the order


def test_retraction_order_by_priority():
    """``_get_decode_retraction_order`` with ``retraction_policy='priority'``, default
    direction: key (priority × 1, outputs, −prompt), the smallest retracted first. Running
    [a (1), b (3), c (2), d (3)] with outputs 5, 0, 9, 2: a (priority 1) goes first though
    b has fewer outputs, then c (2); b and d tie at priority 3 and b (0 outputs) goes
    before d (2). With ``length`` (the default): fewest outputs first, b."""
    t = _trace([("a", 0.0, 8, 20, 1), ("b", 0.0, 8, 20, 3), ("c", 0.0, 8, 20, 2), ("d", 0.0, 8, 20, 3)])
    sch = make_scheduler(t, RadixCache(400, 1), _cfg(retraction_policy="priority", max_num_seqs=8))
    sch.running = [0, 1, 2, 3]
    sch.gen = [5, 0, 9, 2]
    order = []
    while sch.running:
        v = sch._victim()
        order.append(v)
        sch.running.remove(v)
    assert order == [0, 2, 1, 3]
    sch = make_scheduler(t, RadixCache(400, 1), _cfg(max_num_seqs=8))
    sch.running = [0, 1, 2, 3]
    sch.gen = [5, 0, 9, 2]
    assert sch._victim() == 1
    low = make_scheduler(t, RadixCache(400, 1), _cfg(retraction_policy="priority", max_num_seqs=8,
                                                      schedule_low_priority_values_first=True))
    low.running = [0, 1, 2, 3]
    low.gen = [5, 0, 9, 2]
    assert low._victim() == 1  # low values first: 3 is the least preferred; b (0 outputs) before d


def test_retraction_tie_takes_the_latest_in_the_batch():
    """Equal keys: the reverse sort keeps batch order and the loop pops from the end."""
    t = _trace([("a", 0.0, 8, 20, 1), ("b", 0.0, 8, 20, 1)])
    sch = make_scheduler(t, RadixCache(400, 1), _cfg(retraction_policy="priority", max_num_seqs=8))
    sch.running = [0, 1]
    sch.gen = [3, 3]
    assert sch._victim() == 1


def test_knobs_refused_where_they_do_nothing_or_are_not_modelled():
    with pytest.raises(ConfigError, match="disable-priority-preemption"):
        replay_concurrent(_trace(ABCD), RadixCache(400, 1), UnitStepCost(),
                          config=SchedulerConfig(enable_priority_scheduling=True))
    with pytest.raises(ConfigError, match="needs --enable-priority-scheduling"):
        SchedulerConfig(retraction_policy="priority")
    with pytest.raises(ConfigError, match="needs --enable-priority-scheduling"):
        SchedulerConfig(schedule_low_priority_values_first=True)
    with pytest.raises(ConfigError, match="scheduling-policy priority"):
        replay_concurrent(_trace(ABCD), BlockHashCache(40, 4), UnitStepCost(), config=_cfg())


def test_scheduler_class_and_compiled_path_follow_the_knob():
    t = _trace(ABCD)
    assert type(make_scheduler(t, RadixCache(400, 1), SchedulerConfig())) is SglangScheduler
    assert type(make_scheduler(t, RadixCache(400, 1), _cfg())) is SglangPriorityScheduler
    from _conc_cases import COST

    pol = RadixCache(400, 1)
    assert conc_sglang.applicable(pol, COST, _cfg(), None, "sglang") is False
    # the same run without priorities may take the compiled loop (when its kernels are compiled)
    assert conc_sglang.applicable(pol, COST, SchedulerConfig(max_num_seqs=1), None, "sglang") in (True, False)


# ---------------------------------------------------------------------------- SGLang's functions
RULES = Path(__file__).parent / "data" / "concurrent" / "sglang" / "priority_rules.json"


def _rules():
    return json.loads(RULES.read_text())


@pytest.mark.parametrize("k", range(5))
def test_waiting_order_equals_sglangs_calc_priority(k):
    """tools/engines/sglang_priority_rules.py ran SGLang 0.5.23's ``calc_priority`` (with
    ``_set_or_validate_priority`` and the entry stamps) on these requests: request "a"
    entered the queue first and again last (retracted and put back)."""
    doc = _rules()
    case = doc["order"][k]
    assert doc["sglang"] == "0.5.23"
    w = doc["waiting"]
    specs = [(rid, 0.0, len(p), 4, prio) for rid, prio, p in w]
    t = _trace(specs)
    if not case["with_priorities"]:
        t.priority = None  # no request carries one: SGLang gives all the same default
    cfg = _cfg(schedule_low_priority_values_first=case["low_first"], schedule_policy=case["policy"],
               max_num_seqs=8)
    sch = make_scheduler(t, RadixCache(4096, 1), cfg)
    row = {rid: i for i, (rid, _, _) in enumerate(w)}
    seen = set()
    for rid in doc["entries"]:
        if rid in seen:
            if case["policy"] == "lpm":  # lpm keeps the queue's order, in which "a" stayed first
                continue
            sch.waiting.remove(row[rid])
            sch._requeue(row[rid])
        else:
            sch.enqueue(row[rid])
            seen.add(rid)
    sch._order_waiting()
    assert [w[i][0] for i in sch.waiting] == case["order"]


@pytest.mark.parametrize("k", range(2))
def test_retraction_order_equals_sglangs(k):
    """SGLang's ``_get_decode_retraction_order`` with ``--retraction-policy priority``,
    popped from the end as ``retract_decode`` does."""
    doc = _rules()
    case = doc["retraction"][k]
    run = doc["running"]
    t = _trace([(rid, 0.0, plen, max_new, prio) for rid, prio, plen, gen, max_new in run])
    sch = make_scheduler(t, RadixCache(4096, 1), _cfg(retraction_policy="priority", max_num_seqs=8,
                                                       schedule_low_priority_values_first=case["low_first"]))
    sch.running = list(range(len(run)))
    sch.gen = [gen for _, _, _, gen, _ in run]
    order = []
    while sch.running:
        v = sch._victim()
        order.append(run[v][0])
        sch.running.remove(v)
    assert order == case["retraction_order"]
