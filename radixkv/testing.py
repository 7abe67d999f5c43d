"""Helpers for checking replays in your own pytest suite.

Use the functions directly, or load the fixtures with ``pytest_plugins = ["radixkv.testing"]``
in your ``conftest.py``::

    from radixkv.testing import assert_metric, replay

    def test_vllm_hit_rate_on_our_traffic():
        r = replay("traces/ours.jsonl", "vllm:16", capacity_tokens=200_000)
        assert_metric(r, "token_hit_rate", min=0.55)
        assert_metric(r, "evicted_tokens", max=5_000_000)

    def test_ci_config(radixkv_check):          # the fixture: run a radixkv check config
        radixkv_check("ci/radixkv.toml")         # fails with one line per broken assertion

Failures are ``AssertionError`` with messages that name the trace, the policy, the
metric, the measured value and the bound, e.g. ``ours.jsonl vllm:16: token_hit_rate =
0.5123, expected >= 0.55``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class ReplayResult:
    """One replay: ``trace`` (name), ``policy`` (spec label), ``records``
    (:class:`radixkv.records.Records`, one row per request) and ``summary``
    (:func:`radixkv.metrics.summarize`)."""

    trace: str
    policy: str
    records: object
    summary: dict

    @property
    def hit_tokens(self) -> np.ndarray:
        """int64, shape (n,): hit tokens per request, in replay order."""
        return self.records["hit_tokens"]

    @property
    def req_id(self) -> np.ndarray:
        """str, shape (n,): request ids in replay order."""
        return self.records.req_id


def replay(trace, policy: str, *, capacity_tokens: int | None = None, num_gpu_blocks: int | None = None,
           max_total_num_tokens: int | None = None, limit: int | None = None, format: str | None = None,  # noqa: A002
           **options) -> ReplayResult:
    """Replay *trace* (a path, or a :class:`radixkv.trace.types.Trace`) sequentially through
    *policy* (``NAME[:SIZE]``) on a pool given by exactly one of *capacity_tokens*
    (tokens), *num_gpu_blocks* (vLLM) or *max_total_num_tokens* (SGLang); *options* are
    keywords for the policy's constructor (``verify=True``). The replay is
    :func:`radixkv.replay.spec.run`'s, as ``radixkv replay`` runs it.

    Raises
    ------
    radixkv.errors.InputError
        For an unreadable trace, a bad spec, no or several pool sizes, or a request larger
        than the pool.
    """
    from radixkv.errors import ConfigError
    from radixkv.policies.registry import PoolSpec, parse_policy
    from radixkv.replay.spec import ReplaySpec, run
    from radixkv.trace.load import load_trace
    from radixkv.trace.types import Trace

    sizes = {"capacity_tokens": capacity_tokens, "num_gpu_blocks": num_gpu_blocks,
             "max_total_num_tokens": max_total_num_tokens}
    given = {k: v for k, v in sizes.items() if v is not None}
    if len(given) != 1:
        raise ConfigError("give exactly one of capacity_tokens, num_gpu_blocks, max_total_num_tokens",
                          field="capacity_tokens")
    spec = parse_policy(policy)
    if isinstance(trace, Trace):
        t, name = trace, trace.name or "trace"
    else:
        t, name = load_trace(trace, format=format), Path(trace).name
    rec, summ = run(ReplaySpec(t, spec, PoolSpec(**given), limit=limit, options=options))
    return ReplayResult(name, spec.label, rec, summ)


def assert_metric(result: ReplayResult, metric: str, *, min: float | None = None,  # noqa: A002
                  max: float | None = None) -> None:  # noqa: A002
    """Assert ``min <= result.summary[metric] <= max`` (either bound may be omitted).

    Raises
    ------
    AssertionError
        ``"<trace> <policy>: <metric> = <value>, expected >= <min>"`` (or ``<= max``), or
        that the metric is n/a for this policy.
    KeyError
        For a metric the summary does not have (the message lists the known ones).
    """
    if metric not in result.summary:
        raise KeyError(f"no metric {metric!r}; known: {', '.join(sorted(result.summary))}")
    v = result.summary[metric]
    where = f"{result.trace} {result.policy}"
    if v is None:
        raise AssertionError(f"{where}: {metric} is n/a for this policy")
    if min is not None and not v >= min:
        raise AssertionError(f"{where}: {metric} = {v:.6g}, expected >= {min:g}")
    if max is not None and not v <= max:
        raise AssertionError(f"{where}: {metric} = {v:.6g}, expected <= {max:g}")


def assert_hits_equal(result: ReplayResult, golden) -> None:
    """Assert that every request's hit tokens equal *golden*'s, request by request.

    Parameters
    ----------
    result : ReplayResult
    golden : str or Path or list of (id, hit_tokens)
        A golden file (JSON lines with ``id`` and ``hit_tokens``, e.g. the real engines'
        per-request hits) or the pairs themselves, in replay order.

    Raises
    ------
    AssertionError
        ``"<trace> <policy>: 3 of 200 requests differ; first: r5 hit 32 want 48, ..."``.
    """
    from radixkv.check.run import compare_hits, read_golden

    rows = read_golden(Path(golden)) if isinstance(golden, (str, Path)) else [(str(g[0]), int(g[1])) for g in golden]
    count, note = compare_hits(result.req_id, result.hit_tokens, rows, result.records["prompt_tokens"])
    if count:
        raise AssertionError(f"{result.trace} {result.policy}: {note}")


def run_check(config, *, update_baseline: bool = False):
    """Run a ``radixkv check`` configuration and assert that every assertion holds.

    Returns the :class:`radixkv.check.run.CheckResult` when all hold.

    Raises
    ------
    AssertionError
        With one line per failing assertion (trace, policy, metric, value, bound).
    radixkv.errors.InputError
        For a malformed configuration (naming file, line and key).
    """
    from radixkv.check.run import check

    res = check(config, update_baseline=update_baseline)
    if not res.ok:
        raise AssertionError(f"{len(res.failures)} of {len(res.outcomes)} assertions fail:\n"
                             + "\n".join(o.line() for o in res.failures))
    return res


try:  # fixtures, when pytest is installed (pytest_plugins = ["radixkv.testing"])
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

if pytest is not None:

    @pytest.fixture
    def radixkv_replay():
        """:func:`replay`, memoised for the test (same arguments, one replay)."""
        memo = {}

        def run(trace, policy, **kw):
            key = (str(trace), policy, tuple(sorted(kw.items())))
            if key not in memo:
                memo[key] = replay(trace, policy, **kw)
            return memo[key]

        return run

    @pytest.fixture
    def radixkv_check():
        """:func:`run_check`: run a configuration, fail the test on any broken assertion."""
        return run_check
