"""Hit rate against pool capacity: one policy at several pool sizes.

``run_curve`` is what ``radixkv curve`` calls for each policy. A policy class that can
replay every capacity in one pass (a ``replay_curve`` class method, e.g. ``unit-lru``
through LRU stack distances) is used that way; any other policy is replayed once per
capacity with :func:`radixkv.replay.run.run_replay`. Both give the same records.
"""
from __future__ import annotations

import time

import numpy as np

from radixkv.errors import ConfigError
from radixkv.metrics import summarize
from radixkv.policies.registry import PolicySpec, PoolSpec, build_policy, measured_metrics
from radixkv.replay.run import run_replay, warmup
from radixkv.replay.warm import _tiny_trace
from radixkv.trace.types import Trace


def run_curve(
    trace: Trace,
    spec: PolicySpec,
    capacities_tokens,
    *,
    limit: int | None = None,
    quiet: bool = True,
    one_pass: bool = True,
    measure_last: float | None = None,
) -> list:
    """Sequential replays of *trace* through *spec* at every capacity (tokens).

    Parameters
    ----------
    trace : Trace
    spec : PolicySpec
    capacities_tokens : sequence of int
        Pool sizes in tokens (``PoolSpec(capacity_tokens=...)``).
    limit : int or None
        Replay only the first *limit* requests.
    quiet : bool
        No progress bar (per-capacity replays only).
    one_pass : bool
        Use the policy's one-pass ``replay_curve`` when it has one (default); False forces
        one replay per capacity.
    measure_last : float or None
        Add each summary's ``measure_window``: the hit metrics over the last share F in
        (0, 1] of the requests (:func:`radixkv.metrics.window_summary`); None: off.

    Returns
    -------
    list, one entry per capacity in the given order: ``(records, summary)`` as
    :func:`radixkv.replay.run.run_replay` returns, or the :class:`ConfigError` that the
    capacity raised (pool too small for the policy or for a request). A one-pass
    summary's ``timing_s["replay"]`` is the pass's time divided by the number of
    capacities it served, and ``timing_s["one_pass"]`` is True.
    """
    if measure_last is not None:
        from radixkv.metrics import window_start

        window_start(0, measure_last)  # a bad fraction fails before any work
    caps = [int(c) for c in capacities_tokens]
    out: list = [None] * len(caps)
    pols = {}
    if one_pass:
        for i, cap in enumerate(caps):
            try:
                pols[i] = build_policy(spec, PoolSpec(capacity_tokens=cap), unit_tokens=trace.unit_tokens,
                                       trace=trace.head(limit))
            except ConfigError as e:
                out[i] = e
    cls = type(next(iter(pols.values()))) if pols else None
    if cls is not None and getattr(cls, "replay_curve", None) is not None:
        compile_s = warmup(spec, concurrent=False)  # a sequential pass: not the concurrent loops' kernels
        t0 = time.perf_counter()
        tiny = _tiny_trace()
        cls.replay_curve(tiny, [build_policy(spec, PoolSpec(capacity_tokens=64), unit_tokens=tiny.unit_tokens)])
        compile_s += time.perf_counter() - t0
        idx = sorted(pols)
        t0 = time.perf_counter()
        recs = cls.replay_curve(trace, [pols[i] for i in idx], limit=limit, label=spec.label)
        total = time.perf_counter() - t0
        for i, rec in zip(idx, recs):
            s = summarize(rec, evictions=rec.meta.get("evictions"), measures=measured_metrics(cls),
                          measure_last=measure_last)
            rs = total / len(idx)
            tokens = int(np.sum(rec["prompt_tokens"]))
            s["timing_s"] = {"compile": compile_s if i == idx[0] else 0.0, "replay": rs,
                             "prompt_tokens_per_s": tokens / rs if rs > 0 else None, "one_pass": True}
            out[i] = (rec, s)
        return out
    pols.clear()
    for i, cap in enumerate(caps):
        if out[i] is not None:
            continue
        try:
            out[i] = run_replay(trace, spec, PoolSpec(capacity_tokens=cap), limit=limit, quiet=quiet,
                                measure_last=measure_last)
        except ConfigError as e:
            out[i] = e
    return out


#: options a host-capacity point replaces: the host pool is ``host_tokens`` at each point
_HOST_SIZE_OPTIONS = ("host_tokens", "hicache_ratio", "cpu_bytes", "kv_bytes_per_token")


def with_host_tokens(spec: PolicySpec, host_tokens: int) -> PolicySpec:
    """*spec* with its host pool set to *host_tokens* tokens (``@host_tokens=N``), any
    other host size it gave (``hicache_ratio``, ``cpu_bytes``) dropped.

    Raises
    ------
    ConfigError
        *spec*'s class models no host tier (``models_host_tier``).
    """
    from dataclasses import replace

    if not getattr(spec.build_class, "models_host_tier", False):
        raise ConfigError(f"policy {spec.label!r} has no host-memory KV tier: a curve over host capacity needs "
                          f"one (sglang-hicache, vllm-offload)", field="policies")
    opts = {k: v for k, v in dict(spec.option or ()).items() if k not in _HOST_SIZE_OPTIONS}
    opts["host_tokens"] = int(host_tokens)
    return replace(spec, option=tuple(sorted(opts.items())))


def run_host_curve(trace: Trace, spec: PolicySpec, capacity_tokens: int, host_tokens, *,
                   limit: int | None = None, quiet: bool = True) -> list:
    """Sequential replays of *trace* through host-tier policy *spec* at one GPU pool of
    *capacity_tokens* tokens and every host pool in *host_tokens* (tokens).

    The host pool is the policy's ``host_tokens`` option (SGLang HiCache: rounded to
    pages plus one page as ``HostKVCache.__init__`` does; vLLM offloading:
    ``host_tokens // chunk tokens`` chunks). Host 0 is the policy without a host tier,
    which equals its single-tier engine exactly (tests/test_hicache.py,
    tests/test_vllm_offload.py).

    Returns
    -------
    list, one entry per host size in the given order: ``(records, summary)`` as
    :func:`radixkv.replay.run.run_replay` returns, or the :class:`ConfigError` it raised.
    """
    out = []
    for h in host_tokens:
        try:
            out.append(run_replay(trace, with_host_tokens(spec, h), PoolSpec(capacity_tokens=int(capacity_tokens)),
                                  limit=limit, quiet=quiet))
        except ConfigError as e:
            out.append(e)
    return out
