"""What the plan rules out without replaying: pools that do not exist or cannot hold the
longest request (memory), and replica counts that cannot keep up with the offered load
(throughput).

Memory
    A point's pool is the memory model's (:func:`radixkv.plan.candidates.pool_of`, vLLM's
    and SGLang's start-up rules, :mod:`radixkv.memory.pool`). A point is pruned when the
    weights and overheads leave no pool (the memory model's error is the reason), or when
    the pool holds fewer tokens than the trace's longest request (prompt + output): the
    concurrent replay would refuse it, as the engine would never finish it.

Throughput
    The roofline (:mod:`radixkv.cost`) bounds what one replica can do. Over the whole trace,
    its busy time is at least

    * prefill: ``2 · N_params · (1 − h) · P / (tp · peak_flops · mfu)`` — the linear FLOPs
      of the prompt tokens no cache can serve (``P`` prompt tokens, ``h`` the hit rate of
      an unbounded radix tree at the trace's own granularity, an upper bound on any pool's
      hit rate; 0 with caching off), attention FLOPs left out (they only add);
    * decode: ``⌈O / max_num_seqs⌉ · W / (tp · hbm_bytes_per_s · mbu)`` — every decode step
      reads the weights (``W`` bytes) and holds at most ``max_num_seqs`` tokens (``O``
      output tokens).

    A step's time is the larger of its compute and memory terms, so the busy time is at
    least the larger of the two sums (not their sum). R replicas share the work at best
    evenly; with ``T_lb / R`` above the trace's span (first to last arrival at the
    requested rate) no routing keeps up, the queue grows for the whole trace, and the
    point is overloaded. :func:`min_replicas` is the least R that passes. With a calibrated
    cost model (``--cost-model fitted|profiled``) the bound takes mfu = mbu = 1 (the peaks),
    which no measured step beats.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    """What the bounds need of the trace.

    Attributes
    ----------
    prompt_tokens, output_tokens : int
        Sums over the requests.
    longest_tokens : int
        Largest prompt + output of one request.
    span_s : float
        Last arrival − first arrival, seconds, at the plan's rate (recorded / rate_scale).
    requests : int
    hit_rate_bound : float
        Hit rate of an unbounded radix tree on the trace (sequential replay), in [0, 1].
    """

    prompt_tokens: int
    output_tokens: int
    longest_tokens: int
    span_s: float
    requests: int
    hit_rate_bound: float

    @property
    def offered_tokens_per_s(self) -> float:
        """(prompt + output) tokens per second of the trace's span (NaN for a zero span)."""
        return (self.prompt_tokens + self.output_tokens) / self.span_s if self.span_s > 0 else float("nan")


def workload_of(trace, rate_scale: float = 1.0) -> Workload:
    """The :class:`Workload` of *trace* at *rate_scale* × its recorded rate.

    The hit-rate bound is a sequential replay of ``sglang:1`` on a pool larger than the
    trace's prompts (:func:`radixkv.replay.spec.run`): no request is evicted, so
    every reusable prefix hits, at the finest granularity the trace allows.
    """
    from radixkv.policies.registry import parse_policy
    from radixkv.policies.registry import PoolSpec
    from radixkv.replay.spec import ReplaySpec, run

    p = np.asarray(trace.prompt_len, dtype=np.int64)
    o = np.asarray(trace.output_len, dtype=np.int64)
    a = np.asarray(trace.arrival_s, dtype=np.float64)
    prompt = int(p.sum())
    span = float(a.max() - a.min()) / rate_scale if a.size else 0.0
    h = 0.0
    if prompt > 0 and (trace.ids.size or trace.out_ids is not None):
        cap = int(prompt + o.sum()) + int(trace.unit_tokens)
        _, summ = run(ReplaySpec(trace, parse_policy("sglang:1"), PoolSpec(capacity_tokens=cap)))
        h = float(summ["token_hit_rate"])
    return Workload(prompt, int(o.sum()), int((p + o).max()) if p.size else 0, span, int(p.size), h)


def busy_lower_bound_s(point, model: str, workload: Workload, cost_kw: dict) -> float:
    """Least busy seconds of the whole trace on one replica of *point* (module docstring)."""
    from radixkv.memory import dtype_bytes, get_gpu, get_model

    m, g = get_model(model), get_gpu(point.gpu)
    mfu, mbu = float(cost_kw.get("mfu", 0.6)), float(cost_kw.get("mbu", 0.8))
    if cost_kw.get("cost_model", "roofline") != "roofline":
        mfu = mbu = 1.0  # a calibrated clock may beat the assumed efficiencies; the peaks bound any

    h = workload.hit_rate_bound if point.prefix_caching else 0.0
    prefill = 2.0 * m.num_params * (1.0 - h) * workload.prompt_tokens / (point.tp * g.bf16_flops * mfu)
    w = m.num_params * dtype_bytes(m.weight_dtype, field="weight_dtype")
    steps = math.ceil(workload.output_tokens / point.max_num_seqs)
    decode = steps * w / (point.tp * g.hbm_bytes_per_s * mbu)
    return max(prefill, decode)


def min_replicas(point, model: str, workload: Workload, cost_kw: dict) -> int:
    """Least replica count the throughput bound allows (≥ 1; 1 when the span is 0)."""
    if workload.span_s <= 0:
        return 1
    return max(1, math.ceil(busy_lower_bound_s(point, model, workload, cost_kw) / workload.span_s - 1e-12))


def memory_reason(point, model: str, workload: Workload):
    """``(pool, None)`` when one replica of *point* has a pool that holds the longest
    request, else ``(None, reason)``."""
    from radixkv.errors import InputError
    from radixkv.plan.candidates import pool_of

    try:
        pool = pool_of(point, model)
    except InputError as e:  # ConfigError is an InputError
        return None, f"memory: {e.reason}"
    if pool.capacity_tokens < workload.longest_tokens:
        return None, (f"memory: the pool holds {pool.capacity_tokens:,} tokens, fewer than the longest request "
                      f"({workload.longest_tokens:,} tokens)")
    return pool, None
