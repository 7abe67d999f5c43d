"""Warm-up replays: tiny replays that run, and so compile (or load from Numba's cache),
the kernels a policy uses.

:func:`_tiny_run` replays a three-request trace through a policy sequentially and, with
*concurrent*, runs the policy's batched kernels and the compiled concurrent loops
(:func:`vllm_loop_for`, :func:`sglang_loop_for`: a tiny
:func:`~radixkv.replay.concurrent.replay_concurrent` through each loop that serves the
policy). :func:`radixkv.replay.run.warmup` calls it ahead of the replays (``radixkv
warmup``), and :func:`radixkv.replay.jit.is_warm` probes Numba's cache with it. This module
sits above the replay drivers it runs (sequential, concurrent and its compiled loops) and
below :mod:`radixkv.replay.jit` and :mod:`radixkv.replay.run`.
"""
from __future__ import annotations

import sys

from radixkv.errors import ConfigError
from radixkv.policies.registry import PolicySpec, PoolSpec, build_policy
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace

#: (spec, scope) pairs warmed in this process (:func:`radixkv.replay.run.warmup`; the
#: probe :func:`radixkv.replay.jit.is_warm` adds scope 0); scope 0: the sequential replay's
#: kernels, 1: also the concurrent loop's on token-id traces (``lean``), 2: all
_WARM: set = set()


def _tiny_trace() -> Trace:
    """Three overlapping token prompts: enough to run every code path of a policy once."""
    base = list(range(40))
    return Trace.from_requests(
        req_id=["w0", "w1", "w2"],
        arrival_s=[0.0, 0.0, 0.0],
        prompt_len=[40, 37, 45],
        output_len=[3, 0, 2],
        prompt_ids=[base, base[:37], base + [7, 7, 7, 7, 7]],
        name="warmup",
    )


def _tiny_run(spec: PolicySpec, concurrent: bool = True, lean: bool = False) -> None:
    """Run every kernel *spec*'s policy uses once, on the tiny trace (compiles them when
    they are compiled and not yet loaded); with *concurrent* False only those of the
    sequential replay; with *lean* only those of the concurrent replay of a token-id trace
    under the default settings (:func:`radixkv.replay.run.warmup`)."""
    # a small pool, so that the tiny trace evicts; a larger one when its requests do not fit
    # it (a policy that reserves most of the pool, static:B@0.9)
    for cap in (max(64, 8 * (spec.size or 1)), max(4096, 64 * (spec.size or 1))):
        tiny = _tiny_trace()
        pol = build_policy(spec, PoolSpec(capacity_tokens=cap), unit_tokens=1, trace=tiny)
        try:
            replay_sequential(tiny, pol, quiet=True)
        except ConfigError:
            if cap >= 4096:
                raise
            continue
        break
    if not concurrent or pol.needs_trace:  # an offline reference runs sequentially only
        return
    if lean and hasattr(pol, "_warm_kernels_lean"):
        pol._warm_kernels_lean()
    else:
        pol.warm_kernels()
    # the compiled concurrent loops
    vllm_loop_for(pol, lean=lean)
    sglang_loop_for(pol, lean=lean)


def vllm_loop(block_size: int = 16, pieces: bool = True) -> None:
    """Compile (or load from Numba's cache) the compiled loop of
    :mod:`radixkv.replay.conc_vllm_fast`: a tiny replay through it (:func:`vllm_loop_for`
    calls it, so ``radixkv warmup`` fills the cache); on the per-block pool, and with
    *pieces* also on the piece pool (hash-id traces only)."""
    from radixkv.cost import UnitStepCost
    import radixkv.policies._hash_kernels as K
    from radixkv.policies.block_hash import BlockHashCache
    import radixkv.replay._conc_vllm_kernels as CK
    from radixkv.replay.concurrent import replay_concurrent

    if not hasattr(CK.run_loop, "py_func") or not hasattr(K.extend, "py_func"):
        return
    B = int(block_size)
    tr = Trace.from_requests(req_id=["w0", "w1"], arrival_s=[0.0, 0.0], prompt_len=[2 * B, B + 1],
                             output_len=[3, 2], prompt_ids=[list(range(2 * B)), list(range(B + 1))], name="warmup")
    replay_concurrent(tr, BlockHashCache(8, B), UnitStepCost())
    if B >= 2 and pieces:  # the piece pool's loop: a hash-id trace of 2-block units
        tu = Trace.from_requests(req_id=["u0", "u1"], arrival_s=[0.0, 0.0], prompt_len=[4 * B - 1, 3 * B],
                                 output_len=[3, 1], prompt_ids=[[1, 2], [1, 3]], unit_tokens=2 * B,
                                 partial_last_unit=True, name="warmup")
        replay_concurrent(tu, BlockHashCache(16, B), UnitStepCost())


def vllm_loop_for(policy, lean: bool = False) -> None:
    """Warm the compiled vLLM loop for *policy* when it runs on it (a
    :class:`~radixkv.policies.block_hash.BlockHashCache` or
    :class:`~radixkv.policies.block_priority.PriorityBlockHashCache` itself, not a
    subclass: :func:`radixkv.replay.conc_vllm_fast._eligible`); called by
    :func:`_tiny_run` after the policy's own
    :meth:`~radixkv.policies.base.PrefixCache.warm_kernels`. *lean*: the per-block pool's
    loop only (token-id traces), not the piece pool's."""
    from radixkv.policies.block_hash import BlockHashCache
    import radixkv.replay._conc_vllm_kernels as CK
    from radixkv.replay.conc_vllm_fast import _prio_class

    if type(policy) is BlockHashCache:
        vllm_loop(policy.block_size, pieces=not lean)
    elif _prio_class(policy) is not None and hasattr(CK.run_loop, "py_func"):
        # one loop for every priority (the function travels as its addresses)
        from radixkv.cost import UnitStepCost
        from radixkv.replay.concurrent import replay_concurrent

        B = int(policy.block_size)
        tr = Trace.from_requests(req_id=["w0", "w1"], arrival_s=[0.0, 0.0], prompt_len=[2 * B, B + 1],
                                 output_len=[3, 2], prompt_ids=[list(range(2 * B)), list(range(B + 1))],
                                 name="warmup")
        replay_concurrent(tr, type(policy)(8, B, eviction_policy=policy.eviction_priority), UnitStepCost())


def sglang_loop(page_size: int = 1, eviction_policy=None) -> None:
    """Compile (or load from Numba's cache) the compiled loop of
    :mod:`radixkv.replay.conc_sglang`: a tiny replay through it (:func:`sglang_loop_for`
    calls it, so ``radixkv warmup`` fills the cache and a first concurrent replay does not
    spend tens of seconds compiling). *eviction_policy*: None,
    :class:`~radixkv.policies.radix.RadixCache`'s loop; a priority,
    ``PriorityRadixCache``'s (keyed order)."""
    from radixkv.cost import CostModel
    import radixkv.policies._radix_kernels as K
    from radixkv.policies.radix import RadixCache
    import radixkv.replay._conc_sglang_kernels as CK
    from radixkv.replay.concurrent import replay_concurrent

    if not hasattr(CK.run_loop, "py_func") or not hasattr(K.run_request, "py_func"):
        return
    P = int(page_size)
    tr = Trace.from_requests(req_id=["w0", "w1"], arrival_s=[0.0, 0.0], prompt_len=[2 * P + 1, P + 1],
                             output_len=[3, 2], prompt_ids=[list(range(2 * P + 1)), list(range(P + 1))],
                             name="warmup")
    if eviction_policy is None:
        pol = RadixCache(16 * P, P)
    else:
        from radixkv.policies.radix_priority import PriorityRadixCache

        pol = PriorityRadixCache(16 * P, P, eviction_policy=eviction_policy)
    replay_concurrent(tr, pol, CostModel.from_specs("Llama-3.1-8B", "A100-80GB"))


def sglang_loop_for(policy, lean: bool = False) -> None:
    """Warm the compiled SGLang loop for *policy* when it runs on it (a
    :class:`~radixkv.policies.radix.RadixCache` or
    :class:`~radixkv.policies.radix_priority.PriorityRadixCache` itself, not a subclass:
    :func:`radixkv.replay.conc_sglang.applicable`); called by :func:`_tiny_run` after the
    policy's own :meth:`~radixkv.policies.base.PrefixCache.warm_kernels`. *lean* (as
    :func:`vllm_loop_for`'s) changes nothing here: the loop is the same on token-id and
    hash-id traces."""
    from radixkv.policies.radix import RadixCache

    if type(policy) is RadixCache:
        sglang_loop(policy.page_size)
        return
    prio = sys.modules.get("radixkv.policies.radix_priority")
    if prio is not None and type(policy) is prio.PriorityRadixCache and policy.batch_visibility:
        # the loop is compiled per eviction-order type (LRU heap / keyed), not per priority
        sglang_loop(policy.page_size, eviction_policy=policy.eviction_priority)
