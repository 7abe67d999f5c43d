"""One replay end to end, as a library call: build the policy, compile, replay, summarise.

``run_replay`` is what ``radixkv replay``, ``compare`` and ``curve`` call for every
(policy, pool) cell; experiments call it too.
"""
from __future__ import annotations

import time

import numpy as np

from radixkv.metrics import summarize
from radixkv.policies.registry import PolicySpec, PoolSpec, build_policy
from radixkv.replay.records import Records
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace

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


def warmup(spec: PolicySpec) -> float:
    """Compile (or load from Numba's cache) the kernels *spec*'s policy uses.

    Returns the seconds it took (0 when already warm in this process).
    """
    if spec in _WARM:
        return 0.0
    t0 = time.perf_counter()
    tiny = _tiny_trace()
    pol = build_policy(spec, PoolSpec(capacity_tokens=max(64, 8 * (spec.size or 1))), unit_tokens=1)
    replay_sequential(tiny, pol, quiet=True)
    _WARM.add(spec)
    return time.perf_counter() - t0


def run_replay(
    trace: Trace,
    spec: PolicySpec,
    pool: PoolSpec,
    *,
    limit: int | None = None,
    quiet: bool = True,
    **options,
) -> tuple[Records, dict]:
    """Replay *trace* sequentially through a fresh *spec* policy on *pool*.

    Returns
    -------
    (records, summary)
        ``summary`` is :func:`radixkv.metrics.summarize` plus ``compile_s`` and
        ``replay_s`` (seconds) under ``summary["timing_s"]``.

    Raises
    ------
    radixkv.errors.ConfigError
        From the policy (pool too small) or the replay (a request larger than the pool).
    """
    compile_s = warmup(spec)
    policy = build_policy(spec, pool, unit_tokens=trace.unit_tokens, **options)
    rec = replay_sequential(trace, policy, limit=limit, quiet=quiet, label=spec.label)
    summary = summarize(rec, evictions=policy.evictions)
    summary["timing_s"] = {"compile": compile_s, "replay": rec.meta["replay_s"]}
    tokens = int(np.sum(rec["prompt_tokens"]))
    summary["timing_s"]["prompt_tokens_per_s"] = tokens / rec.meta["replay_s"] if rec.meta["replay_s"] > 0 else None
    return rec, summary
