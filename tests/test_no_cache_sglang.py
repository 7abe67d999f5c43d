"""Cache off (``NoCache``) under SGLang 0.5.23's concurrent rules: ``--disable-radix-cache``.

SGLang 0.5.23 runs ``--disable-radix-cache`` with the same tree class, matching and
inserting switched off (``mem_cache/registry.py :: default_radix_cache_factory`` →
``UnifiedRadixCache(disable=True)``), through the same scheduler: the ``PrefillAdder``
forms the batch against ``available_size() + evictable_size()`` minus its reserved offset
(``mem_cache/prefill_budget.py :: PrefillBudget``) and ``prepare_for_extend`` allocates
the batch's KV after it forms. The expected values below are worked out by hand from
those functions (docstrings), or are the cache-on replay of a trace with no reuse.
"""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.policies.no_cache import NoCache
from radixkv.policies.radix import RadixCache
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.sched_sglang import SglangScheduler
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.replay.schedulers import make_scheduler

from _conc_cases import COST, request_trace


def test_budget_counts_a_batch_members_kv_once():
    """``PrefillAdder.add_one_req`` → ``PrefillBudget.check_prefill`` with the KV allocated
    only after the batch forms (``ScheduleBatch.prepare_for_extend``).

    Pool 70 tokens (page 1), budget 64; A and B: 20-token prompts, N = 5, both at t = 0.
    Step 1: A passes (20 + 5 + 1 = 26 < 70 − 0) and reserves 20 + 1 + 5 = 26. B: the pool
    is still all free (nothing is allocated while the batch forms): 26 < 70 − 26 = 44 →
    B joins the batch. Both prefill in step 1 and decode in steps 2–5 (outputs 2 … 5;
    at most 2 · 24 = 48 tokens of KV, no retraction): **5 steps**, both admitted at 0.

    (The rule radixkv applied before: A's 20 tokens allocated at admission *and* reserved
    in the offset, so B saw 26 < (70 − 20) − 26 = 24 → refused; B prefilled alone in
    step 2 and the replay took 6 steps.)
    """
    tr = request_trace([list(range(20)), list(range(100, 120))], [5, 5], [0.0, 0.0])
    cfg = SchedulerConfig(max_num_batched_tokens=64, admission="sglang")
    r = replay_concurrent(tr, NoCache(70, 1), COST, config=cfg, fast_forward=False)
    assert r.meta["admission"] == "sglang"
    assert r.steps == 5
    assert r["admit_s"].tolist() == [0.0, 0.0]
    assert r["hit_tokens"].tolist() == [0, 0]
    assert r["preemptions"].tolist() == [0, 0]
    # the step plans: one prefill batch of both, then four decodes of both
    sch = make_scheduler(tr, NoCache(70, 1), cfg)
    assert isinstance(sch, SglangScheduler) and sch.deferred
    sch.enqueue(0)
    sch.enqueue(1)
    plan = sch.schedule()
    assert (plan.req, plan.new, plan.prefill) == ([0, 1], [20, 20], [True, True])
    assert sch.policy.stats().used_slots == 40


def test_vllm_rules_keep_the_whole_prompt_check():
    """vLLM's rules still call ``NoCache.admit`` (``--no-enable-prefix-caching``: a first
    chunk is admitted only if the whole prompt fits). Pool 30 tokens, budget 16, A and B:
    20-token prompts, N = 4. Step 1: A's first chunk (16). Step 2: A's last 4 tokens; B's
    12-token first chunk would fit in the 10 + … no: the whole 20-token prompt needs 20
    slots and 30 − 20 = 10 are free → refused; B is admitted only once A has finished."""
    tr = request_trace([list(range(20)), list(range(100, 120))], [4, 4], [0.0, 0.0])
    r = replay_concurrent(tr, NoCache(30, 1), COST, config=SchedulerConfig(max_num_batched_tokens=16, admission="vllm"),
                          fast_forward=False)
    assert r.meta["admission"] == "vllm"
    assert r["admit_s"][1] >= r["finish_s"][0]


def test_lpm_is_fcfs_with_the_cache_off():
    """``SchedulePolicy._validate_and_adjust_policy``: with the tree disabled SGLang turns
    ``lpm`` into FCFS, so the in-batch prefix deprioritisation
    (``_compute_prefix_matches``) does not run.

    Queue [A (X, 40 tokens), C (X again), B (Y, 40 other tokens)], max_num_seqs 2, N = 2:
    with the radix cache, lpm sends C (sharing ≥ 32 tokens with A) to the back, so step 1
    admits A and B; with the cache off (FCFS) step 1 admits A and C, and B waits.
    """
    x, y = list(range(40)), list(range(100, 140))
    tr = request_trace([x, x, y], [2, 2, 2], [0.0, 0.0, 0.0])
    cfg = SchedulerConfig(max_num_seqs=2, schedule_policy="lpm", admission="sglang")
    on = replay_concurrent(tr, RadixCache(10_000, 1), COST, config=cfg)
    off = replay_concurrent(tr, NoCache(10_000, 1), COST, config=cfg)
    assert on["admit_s"][2] == 0.0 and on["admit_s"][1] > 0.0
    assert off["admit_s"][1] == 0.0 and off["admit_s"][2] > 0.0
    fcfs = replay_concurrent(tr, NoCache(10_000, 1), COST, config=SchedulerConfig(max_num_seqs=2, admission="sglang"))
    for col in ("admit_s", "first_token_s", "finish_s"):
        assert off[col].tolist() == fcfs[col].tolist()


def _unique_trace(n, seed):
    rng = np.random.default_rng(seed)
    P = rng.integers(50, 900, n)
    N = rng.integers(1, 300, n)
    arr = np.cumsum(rng.exponential(0.02, n))
    arr -= arr[0]
    base = np.concatenate(([0], np.cumsum(P)[:-1]))
    prompts = [list(range(int(b), int(b) + int(p))) for b, p in zip(base, P)]  # no token shared
    return request_trace(prompts, N.tolist(), arr.tolist())


@pytest.mark.parametrize("seed,page", [(0, 1), (1, 1), (0, 16)])
def test_zero_hit_trace_cache_on_equals_cache_off(seed, page):
    """Every prompt unique: SGLang with the radix cache and with ``--disable-radix-cache``
    run the same scheduler over the same pool; with no hit the tree only keeps finished
    requests' KV as evictable, which the budget counts as room (``available_size() +
    evictable_size()``) as the disabled cache counts it free, and both allocate a
    request's pages one chunk at a time after the batch forms. So cache on
    ``sglang:PAGE`` and cache off on the same pool give the same steps and the same
    admission, first-token and finish times — here with no retraction (a retracted
    request's prompt stays in the tree, unlocked, with the cache on
    (``release_kv_cache(is_insert=False)``) and is re-hit if nothing evicts it before its
    re-admission, so a retraction may break the equality)."""
    tr = _unique_trace(150, seed)
    cfg = SchedulerConfig(max_num_batched_tokens=512, admission="sglang")
    on = replay_concurrent(tr, RadixCache(30_000, page), COST, config=cfg)
    off = replay_concurrent(tr, NoCache(30_000 // page, page), COST, config=cfg)
    assert int(on["hit_tokens"].sum()) == 0
    assert int(on["preemptions"].sum()) == 0 and int(off["preemptions"].sum()) == 0
    assert float(on["queue_s"].max()) > 0.5  # the budget binds: requests wait
    assert on.steps == off.steps
    for col in ("admit_s", "first_token_s", "finish_s"):
        assert on[col].tolist() == off[col].tolist()


def test_admission_matches_sglang_prefill_adder_with_the_tree_disabled():
    """tests/data/concurrent/sglang/rules.json ``disabled``, written by
    tools/engines/sglang_sched_rules.py: SGLang 0.5.23's own ``PrefillAdder.add_one_req``
    over a disabled ``UnifiedRadixCache`` (70-token pool, chunk 64, ratio 0.7) admits A
    and B and refuses C (NO_TOKEN); with A's KV allocated before B is checked (radixkv's
    old rule) it refuses B. And ``SchedulePolicy("lpm", disabled tree)`` is FCFS.
    radixkv's first step over the same queue admits what SGLang's adder admits."""
    import json
    from pathlib import Path

    g = json.loads((Path(__file__).parent / "data" / "concurrent" / "sglang" / "rules.json").read_text())["disabled"]
    assert g["evictable"] == 0 and g["formed"]["available"] == g["pool"]  # nothing allocated while forming
    assert g["allocated_while_forming"]["admitted"] == [g["queue"][0][0]]  # the old rule's refusal, in SGLang
    q = g["queue"]
    tr = request_trace([list(range(1000 * k, 1000 * k + p)) for k, (_, p, _) in enumerate(q)], [n for *_, n in q],
                       [0.0] * len(q))
    cfg = SchedulerConfig(max_num_batched_tokens=g["chunk"], admission="sglang", schedule_policy="lpm")
    sch = make_scheduler(tr, NoCache(g["pool"], 1), cfg)
    assert sch.ratio == g["ratio"]
    for i in range(len(q)):
        sch.enqueue(i)
    plan = sch.schedule()
    assert [q[i][0] for i in plan.req] == g["formed"]["admitted"]
    assert plan.blocked == ("NO_TOKEN" in g["formed"]["results"])
    assert (not sch.shares_prefixes) == (g["lpm_policy"] == "FCFS")
