"""The multi-replica concurrent replay on the compiled engines (radixkv.replay.multi_concurrent,
"Compiled replicas") against the same replay on the Python schedulers, the reference: the
same summary JSON, per-request columns and routes, byte for byte, for both engines' rules,
every router, 1–3 replicas, on a trace with queueing, chunking, preemption, fast-forwarded
decodes cut at other replicas' arrivals and idle replicas; the same refusal."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cost import UnitStepCost
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.replay import multi_concurrent as MC
from radixkv.replay.routing import ROUTERS
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace import Trace
from radixkv.util import dumps_json

from _conc_cases import COST
from test_multi_concurrent import _busy_trace

POLICIES = {
    "vllm": lambda: BlockHashCache(40, 4),   # 39 usable blocks of 4 tokens: preemption under bursts
    "sglang": lambda: RadixCache(150, 1),
}


def _run(t, make, n, cost, router, compiled, monkeypatch, cfg):
    monkeypatch.setattr(MC, "COMPILED", compiled)
    taken = []
    real = MC._replay_compiled
    monkeypatch.setattr(MC, "_replay_compiled", lambda *a, **k: taken.append(1) or real(*a, **k))
    res = MC.replay_multi_concurrent(t, [make() for _ in range(n)], cost, router, config=cfg)
    cols = {c: v.tobytes() for c, v in res.aggregate.columns.items()}
    reps = [None if r is None else {c: v.tobytes() for c, v in r.columns.items()} for r in res.replicas]
    return (dumps_json(res.summary()), cols, reps, res.replica.tobytes()), bool(taken)


@pytest.mark.parametrize("engine", sorted(POLICIES))
@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("n", [1, 3])
def test_compiled_replicas_give_the_python_replicas_bytes(engine, router, n, monkeypatch):
    t = _busy_trace()
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8)
    py, took = _run(t, POLICIES[engine], n, COST, router, False, monkeypatch, cfg)
    assert not took
    co, took = _run(t, POLICIES[engine], n, COST, router, True, monkeypatch, cfg)
    assert took  # the compiled engines ran
    assert co[0] == py[0]
    assert co[1:] == py[1:]
    if n == 3:  # every replica served requests
        assert all(r is not None for r in py[2])


def test_compiled_vllm_replicas_with_the_unit_step_cost(monkeypatch):
    t = _busy_trace(seed=7)
    cfg = SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=6)
    for router in ("round-robin", "least-load", "prefix-aware"):
        py, _ = _run(t, lambda: BlockHashCache(36, 4), 2, UnitStepCost(0.001), router, False, monkeypatch, cfg)
        co, took = _run(t, lambda: BlockHashCache(36, 4), 2, UnitStepCost(0.001), router, True, monkeypatch, cfg)
        assert took and co == py


def _hash_trace(seed=3, n=80):
    """A hash-id trace (unit 8 tokens, block 4: the vLLM piece pool) with shared roots."""
    rng = np.random.default_rng(seed)
    roots = [list(rng.integers(1, 10**6, size=int(rng.integers(2, 6)))) for _ in range(4)]
    ids, plen, outs, arr = [], [], [], []
    t = 0.0
    for i in range(n):
        u = roots[int(rng.integers(0, 4))] + list(rng.integers(1, 10**6, size=int(rng.integers(1, 4))))
        ids.append(u)
        plen.append(8 * len(u) - int(rng.integers(0, 8)))
        outs.append(int(rng.integers(1, 30)))
        t += float(rng.exponential(0.003)) + (0.4 if i % 30 == 29 else 0.0)
        arr.append(t)
    return Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=arr, prompt_len=plen,
                               output_len=outs, prompt_ids=ids, unit_tokens=8, partial_last_unit=True, name="h")


@pytest.mark.parametrize("router", ["round-robin", "least-load", "prefix-aware"])
def test_compiled_replicas_on_a_hash_id_trace(router, monkeypatch):
    t = _hash_trace()
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8)
    for make in (lambda: BlockHashCache(60, 4), lambda: RadixCache(240, 1)):
        py, _ = _run(t, make, 3, COST, router, False, monkeypatch, cfg)
        co, took = _run(t, make, 3, COST, router, True, monkeypatch, cfg)
        assert took and co == py


@pytest.mark.parametrize("router", ["round-robin", "least-load"])
@pytest.mark.parametrize("engine", sorted(POLICIES))
def test_compiled_replicas_refuse_as_the_python_replicas(engine, router, monkeypatch):
    # request q2 (40 prompt + 1 output tokens) exceeds a whole pool (7 usable blocks of 4 =
    # 28 tokens; 20 tokens): both paths refuse it when the replicas are built, same message
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(1, 10**6, size=12)) for _ in range(4)]
    prompts[2] = list(rng.integers(1, 10**6, size=40))
    cap = {"vllm": lambda: BlockHashCache(8, 4), "sglang": lambda: RadixCache(20, 1)}[engine]
    t = Trace.from_requests(req_id=[f"q{i}" for i in range(4)], arrival_s=[0.0, 0.1, 0.2, 0.3],
                            prompt_len=[len(p) for p in prompts], output_len=[2, 2, 2, 2], prompt_ids=prompts,
                            name="t")
    msgs = []
    for compiled in (False, True):
        monkeypatch.setattr(MC, "COMPILED", compiled)
        with pytest.raises(ConfigError) as e:
            MC.replay_multi_concurrent(t, [cap() for _ in range(2)], COST, router)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    assert "'q2'" in msgs[0]
