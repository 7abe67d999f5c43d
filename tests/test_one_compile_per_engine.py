"""Every eviction order of an engine runs on one compile of that engine's kernels.

The order is a run-time value (SGLang: the tuple ``o`` of
``radixkv.policies._radix_kernels``, "Eviction orders"; vLLM: the free order ``fo``, a
``PrioOrder`` of ``radixkv.policies._hash_kernels``, ``FREE_QUEUE`` for vLLM's own queue),
of one Numba type for every order. So after a replay under the default LRU order, replays
under every other order add no signature to the compiled concurrent loop or to the
sequential kernels: nothing is compiled for them (on a cold Numba cache ``sglang:1@lfu``
and ``vllm:16@lfu`` once took 79 s and 81 s of CPU of their own to compile).

Expected values: the dispatchers' signature sets before the ordered replays, read from
Numba (no value of radixkv's), and each replay's path checked to be the compiled one.
"""
from __future__ import annotations

import numpy as np

from radixkv.policies import _hash_kernels as HK
from radixkv.policies import _radix_kernels as RK
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.block_priority import BLOCK_EVICTION_POLICIES, PriorityBlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.policies.radix_priority import EVICTION_POLICIES, PriorityRadixCache
from radixkv.replay import _conc_sglang_kernels as CS
from radixkv.replay import _conc_vllm_kernels as CV
from radixkv.replay import conc_sglang, conc_vllm_fast
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace

from _conc_cases import COST


def _trace() -> Trace:
    """Twelve prompts over three shared stems: a pool of a few blocks evicts."""
    prompts = [[s * 1000 + t for t in range(48)] + [7000 + 10 * i + j for j in range(5 + i % 7)]
               for i, s in enumerate([1, 2, 3] * 4)]
    return Trace.from_requests(req_id=[f"r{i}" for i in range(12)], arrival_s=[0.5 * i for i in range(12)],
                               prompt_len=[len(p) for p in prompts], output_len=[3 + i % 4 for i in range(12)],
                               prompt_ids=prompts)


def _signatures(*dispatchers) -> list:
    return [frozenset(d.signatures) for d in dispatchers]


def _compiled(monkeypatch, module, name):
    """Count the replays *module*'s compiled path served (``name`` returns None when it declines)."""
    seen = []
    orig = getattr(module, name)

    def spy(*a, **k):
        res = orig(*a, **k)
        seen.append(res is not None)
        return res

    monkeypatch.setattr(module, name, spy)
    return seen


def test_sglang_orders_share_the_lru_compile(monkeypatch):
    tr = _trace()
    seen = _compiled(monkeypatch, conc_sglang, "replay_compiled")
    replay_concurrent(tr, RadixCache(120, 1), COST)
    replay_sequential(tr, RadixCache(120, 1), quiet=True)
    kernels = (CS._loop, CS.run_loop, RK.run_request, RK.admit, RK.py_release, RK.heap_rebuild)
    before = _signatures(*kernels)
    for order in sorted(EVICTION_POLICIES):
        res = replay_concurrent(tr, PriorityRadixCache(120, 1, eviction_policy=order), COST)
        assert res.summary()["requests"] == 12
        replay_sequential(tr, PriorityRadixCache(120, 1, eviction_policy=order), quiet=True)
    assert seen == [True] * (1 + len(EVICTION_POLICIES))
    assert _signatures(*kernels) == before


def test_vllm_orders_share_the_free_queue_compile(monkeypatch):
    tr = _trace()
    seen = _compiled(monkeypatch, conc_vllm_fast, "replay_compiled")
    replay_concurrent(tr, BlockHashCache(10, 16), COST)
    pol = BlockHashCache(10, 16)
    for i in range(len(tr)):  # request by request: the kernels a priority order calls
        pol.run_request(i, tr.kv_seq(i))
    kernels = (CV._loop, CV.run_loop, HK.run_seq, HK.admit, HK.free)
    before = _signatures(*kernels)
    for order in sorted(BLOCK_EVICTION_POLICIES):
        res = replay_concurrent(tr, PriorityBlockHashCache(10, 16, eviction_policy=order), COST)
        assert np.isfinite(res.summary()["ttft_p50_s"])
        replay_sequential(tr, PriorityBlockHashCache(10, 16, eviction_policy=order), quiet=True)
    assert seen == [True] * (1 + len(BLOCK_EVICTION_POLICIES))
    assert _signatures(*kernels) == before
