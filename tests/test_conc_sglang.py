"""The compiled SGLang concurrent loop (radixkv.replay.conc_sglang) gives the Python loop's results bit for bit.

The Python loop (:class:`radixkv.replay.sched_sglang.SglangScheduler` driven by
``replay_concurrent``) is the reference, checked rule by rule in test_sched_sglang.py;
here hypothesis generates small traces (shared prefixes, tight pools that retract,
chunked prefill, ``lpm``, pages of 1/4/16 tokens, fast-forward on and off) and each is
replayed both ways: every per-request column, every summary value and every timeline row
must be identical (floats compared bit for bit, NaN with NaN).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixkv.cost import CostModel, UnitStepCost
from radixkv.policies.radix import RadixCache
from radixkv.policies.radix_priority import EVICTION_POLICIES, PriorityRadixCache
from radixkv.replay import conc_sglang
from radixkv.replay._conc_sglang_kernels import _np_pairwise_sum
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace.types import Trace
from radixkv.util import dumps_json

from _conc_cases import COST_OVERHEAD as COST
from _conc_cases import draw_sglang_case


def _both(monkeypatch, trace, make_policy, cost=COST, **kw):
    out = []
    for enabled in (False, True):
        monkeypatch.setattr(conc_sglang, "ENABLED", enabled)
        out.append(replay_concurrent(trace, make_policy(), cost, timeline=True, **kw))
    return out


def _assert_identical(py, kern):
    assert dumps_json(kern.summary()) == dumps_json(py.summary())
    assert kern.steps == py.steps
    for c, v in py.columns.items():
        assert kern.columns[c].dtype == v.dtype, c
        assert np.array_equal(kern.columns[c], v, equal_nan=True), c
    for c, v in py.timeline.items():
        assert kern.timeline[c].dtype == v.dtype, c
        assert np.array_equal(kern.timeline[c], v), c
    assert dumps_json(kern.meta) == dumps_json(py.meta)


@st.composite
def cases(draw):
    return (*draw_sglang_case(draw, st), draw(st.booleans()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(cases())
def test_compiled_loop_equals_python_loop(monkeypatch, case):
    tr, cap, size, cfg, ff = case
    py, kern = _both(monkeypatch, tr, lambda: RadixCache(cap, size), config=cfg, fast_forward=ff)
    _assert_identical(py, kern)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(cases(), st.sampled_from(sorted(EVICTION_POLICIES)))
def test_compiled_loop_equals_python_loop_for_every_eviction_order(monkeypatch, case, order):
    # every eviction order of the one tree (PriorityRadixCache, sglang:P@ORDER) runs on the
    # compiled loop, the Python scheduler over the same policy being the reference
    tr, cap, size, cfg, ff = case
    assert conc_sglang.applicable(PriorityRadixCache(cap, size, eviction_policy=order), COST, cfg, None, "sglang")
    py, kern = _both(monkeypatch, tr, lambda: PriorityRadixCache(cap, size, eviction_policy=order), config=cfg,
                     fast_forward=ff)
    _assert_identical(py, kern)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(cases())
def test_lru_priority_is_radix_cache(monkeypatch, case):
    """SGLang's ``LRUStrategy`` is ``RadixCache``'s default order, and the scheduler forms
    batches the same way whatever ``--radix-eviction-policy`` is: ``PriorityRadixCache``
    with the LRU priority replays concurrently exactly as ``RadixCache`` (whose Python loop
    is checked rule by rule in test_sched_sglang.py)."""
    tr, cap, size, cfg, ff = case
    monkeypatch.setattr(conc_sglang, "ENABLED", True)
    a = replay_concurrent(tr, PriorityRadixCache(cap, size, eviction_policy="lru"), COST, timeline=True, config=cfg,
                          fast_forward=ff)
    b = replay_concurrent(tr, RadixCache(cap, size), COST, timeline=True, config=cfg, fast_forward=ff)
    for c, v in b.columns.items():
        assert np.array_equal(a.columns[c], v, equal_nan=True), c
    for c, v in b.timeline.items():
        assert np.array_equal(a.timeline[c], v), c


@pytest.mark.parametrize("order", sorted(EVICTION_POLICIES))
def test_members_of_one_prefill_batch_never_hit_each_other(monkeypatch, order):
    """SGLang's batch visibility for every eviction order (``schedule_batch.py``: the batch
    is matched when it forms, inserted after the forward): two 40-token prompts sharing 32
    tokens arrive together and are admitted in one prefill batch, so the second hits
    nothing; a third with the same 32 tokens, arriving after both finished, hits all 32.
    A roomy pool (nothing evicted) makes the values independent of the order."""
    stem = list(range(32))
    prompts = [stem + [base + j for j in range(8)] for base in (100, 200, 300)]
    tr = Trace.from_requests(req_id=["a", "b", "c"], arrival_s=[0.0, 0.0, 50.0], prompt_len=[40, 40, 40],
                             output_len=[3, 3, 3], prompt_ids=prompts)
    for enabled in (True, False):
        monkeypatch.setattr(conc_sglang, "ENABLED", enabled)
        res = replay_concurrent(tr, PriorityRadixCache(10_000, 1, eviction_policy=order), COST,
                                config=SchedulerConfig(schedule_policy="fcfs"))
        assert res.columns["hit_tokens"].tolist() == [0, 0, 32]
        assert res.columns["admit_step"].tolist()[:2] == [1, 1]


def test_compiled_loop_is_used_and_retracts(monkeypatch):
    """A tight pool: requests are retracted (SGLang ``retract_decode``) and re-admitted,
    and the compiled loop is the one that ran (the Python scheduler is never built)."""
    # r0 decodes alone long enough for new_token_ratio to decay (0.7 → ~0.1), so r1 … r4,
    # sharing its 8-token prefix, are admitted on a small reserve and their decodes
    # outgrow the 300-token pool
    prompts = [list(range(8))] + [list(range(8)) + [1000 + 10 * i + j for j in range(4)] for i in range(1, 5)]
    tr = Trace.from_requests(req_id=[f"r{i}" for i in range(5)], arrival_s=[0.0] + [0.5 + 0.01 * i for i in range(4)],
                             prompt_len=[len(p) for p in prompts], output_len=[280] + [200] * 4, prompt_ids=prompts)
    py, kern = _both(monkeypatch, tr, lambda: RadixCache(300, 1))
    assert py.summary()["preemptions"] > 0
    _assert_identical(py, kern)
    import radixkv.replay.concurrent as conc

    def boom(*a, **k):
        raise AssertionError("the Python scheduler was built")

    monkeypatch.setattr(conc_sglang, "ENABLED", True)
    monkeypatch.setattr(conc, "make_scheduler", boom)
    again = replay_concurrent(tr, RadixCache(300, 1), COST, timeline=True)
    _assert_identical(py, again)


def test_python_loop_for_what_the_kernel_does_not_model(monkeypatch):
    """A subclass, ``cache_last_token_on_stop``, another cost model or an ``on_step`` hook
    take the Python loop (results unchanged whichever way ``ENABLED`` is set)."""
    prompts = [list(range(30)), list(range(30)) + [7, 8]]
    tr = Trace.from_requests(req_id=["a", "b"], arrival_s=[0.0, 0.01], prompt_len=[30, 32], output_len=[5, 4],
                             prompt_ids=prompts)
    steps = []
    class _Sub(PriorityRadixCache):  # a subclass may change a rule
        pass

    for make, kw in ((lambda: _Sub(1000, 1, eviction_policy="lfu"), {}),
                     (lambda: RadixCache(1000, 1, cache_last_token_on_stop=True), {}),
                     (lambda: RadixCache(1000, 1), {"cost": UnitStepCost()}),
                     (lambda: RadixCache(1000, 1), {"on_step": lambda *a: steps.append(a)})):
        assert not conc_sglang.applicable(make(), kw.get("cost", COST), SchedulerConfig(), kw.get("on_step"),
                                          "sglang")
        py, kern = _both(monkeypatch, tr, make, **kw)
        _assert_identical(py, kern)
    assert steps
    assert conc_sglang.applicable(RadixCache(1000, 1), COST, SchedulerConfig(), None, "sglang")


def test_errors_as_the_python_loop(monkeypatch):
    """A request larger than the pool: the same ConfigError from both loops."""
    from radixkv.errors import ConfigError

    tr = Trace.from_requests(req_id=["big"], arrival_s=[0.0], prompt_len=[50], output_len=[3],
                             prompt_ids=[list(range(50))])
    msgs = []
    for enabled in (False, True):
        monkeypatch.setattr(conc_sglang, "ENABLED", enabled)
        with pytest.raises(ConfigError) as e:
            replay_concurrent(tr, RadixCache(40, 1), COST)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1] and "'big'" in msgs[0]


def test_pairwise_sum_is_numpys():
    """The prefill FLOPs of a step with several prefill items are summed as ``np.sum``
    sums them (pairwise, blocks of 8 below 128 items, halves above)."""
    rng = np.random.default_rng(7)
    for n in [1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 255, 256, 257, 1000, 4099]:
        a = rng.random(n) * 10.0 ** rng.integers(-3, 18, n)
        assert _np_pairwise_sum(a, 0, n) == np.sum(a), n
        # left-to-right addition differs for some of these (so the test can fail)
    a = np.array([1e16, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1e16] * 20)
    assert _np_pairwise_sum(a, 0, a.size) == np.sum(a)


def test_mooncake_head_identical(monkeypatch):
    """The first 300 requests of the Mooncake conversation trace, Llama-3.1-8B on an
    A100-80GB at ×10 arrival times, a pool tight enough to retract, fcfs and lpm."""
    from conftest import shared_path

    from radixkv.replay.arrivals import arrival_times
    from radixkv.trace.load import load_trace

    tr = load_trace(shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")).head(300)
    cost = CostModel.from_specs("Llama-3.1-8B", "A100-80GB")
    arr = arrival_times(tr, arrival="trace", time_scale=10.0)
    for sp in ("fcfs", "lpm"):
        py, kern = _both(monkeypatch, tr, lambda: RadixCache(150_000, 1), cost=cost, arrivals=arr,
                         config=SchedulerConfig(schedule_policy=sp))
        assert py.summary()["preemptions"] > 0
        _assert_identical(py, kern)
