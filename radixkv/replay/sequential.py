"""Sequential replay: one request at a time, in replay order.

This is the mode cache studies use and the one the golden files were produced in
(docs/golden.md, "How each request was run"): each request runs alone —
nothing else holds memory while it runs — through the policy's life cycle
(admit the prompt, decode to the KV extent ``P + max(N − 1, 0)``, finish).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from radixkv.errors import ConfigError
from radixkv.policies.base import PrefixCache
from radixkv.records import COLUMNS, Records
from radixkv.trace.types import Trace


#: requests of the replay's second half at which it asks the policy for detailed
#: (possibly O(pool)) stats; the metrics that use them are second-half averages
DETAIL_SAMPLES = 32

#: most requests a policy's in-kernel loop (``policy.replay_span``) runs per call
SPAN_REQUESTS = 1 << 16


def _progress(total: int, quiet: bool, desc: str):
    """A tqdm bar on stderr that appears only after 2 s and only on a terminal."""
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", delay=2.0, file=sys.stderr, leave=False)


def span_method(policy: PrefixCache):
    """The policy's in-kernel request loop ``replay_span``, or None.

    None also when a subclass overrides any hook the span replaces (``run_request``,
    ``stats``, ``fits_alone``, ``admit``, ``extend``, ``finish``) below the class that
    defines ``replay_span``: the span runs the defining class's kernels, not the
    subclass's (e.g. a priority-eviction subclass of ``BlockHashCache``).
    """
    f = getattr(policy, "replay_span", None)
    if f is None:
        return None
    mro = type(policy).__mro__
    owner = next((c for c in mro if "replay_span" in c.__dict__), None)
    if owner is None:
        return f  # set on the instance
    for name in ("run_request", "stats", "fits_alone", "admit", "extend", "finish"):
        d = next((c for c in mro if name in c.__dict__), None)
        if d is not None and not issubclass(owner, d):
            return None
    return f


def _span_refused(t: Trace, j: int, policy: PrefixCache, label, name: str) -> ConfigError:
    """The error for request *j* refused inside a span (as the Python path words it)."""
    return ConfigError(
        f"request {str(t.req_id[j])!r} (#{j} in replay order) was refused by {label or policy.name} "
        f"although it fits the empty pool ({t.kv_len(j)} tokens of KV, pool {policy.capacity_tokens})",
        path=name or None,
        field="capacity",
    )



_STAT_COLUMNS = ("used_slots", "cached_slots", "free_slots", "valid_tokens", "cached_tokens", "duplicate_tokens",
                 "metadata_bytes", "largest_free_run")


def _put_stats(cols: dict, i: int, st) -> None:
    """Row *i* of the pool columns from a :class:`~radixkv.policies.base.PoolStats`."""
    for name in _STAT_COLUMNS:
        cols[name][i] = getattr(st, name)

def replay_sequential(
    trace: Trace,
    policy: PrefixCache,
    *,
    limit: int | None = None,
    quiet: bool = True,
    label: str | None = None,
    detail: bool = True,
) -> Records:
    """Replay *trace* through *policy*, one request at a time.

    Parameters
    ----------
    trace : Trace
        Requests in replay order.
    policy : PrefixCache
        A fresh policy (its pool is what the replay measures).
    limit : int or None
        Replay only the first *limit* requests (``--limit K``).
    quiet : bool
        No progress bar when True (the default for library calls).
    label : str or None
        The policy's spec for reports; default ``policy.name``.
    detail : bool
        Sample detailed stats in the second half (default). False: only at the last
        request (a shadow replay on a huge pool, :mod:`radixkv.replay.misses`).

    Notes
    -----
    A policy with a ``replay_span(trace, i0, i1, cols)`` method (the built-ins) runs the
    rows that need no detailed stats inside its kernels, up to :data:`SPAN_REQUESTS` per
    call, with the same records; a row with detailed stats runs as a span of one request
    followed by ``stats(detail=True)``, or inside the span when the policy's
    ``span_detail_rows`` says its span fills it the same way. Any other policy goes
    through ``run_request`` and ``stats`` request by request.

    Returns
    -------
    Records
        One row per request; ``meta["replay_s"]`` is the wall time of the loop (seconds).
        ``cached_tokens``, ``duplicate_tokens`` and ``largest_free_run`` are sampled at
        about :data:`DETAIL_SAMPLES` evenly spaced requests of the second half (and the
        last request) and are −1 in the other rows.

    Raises
    ------
    ConfigError
        When there is no request to replay, when a request cannot fit in the whole pool (names the request and by how many
        tokens it overflows), or when the policy refuses a request that should fit.
    """
    t = trace.head(limit)
    n = len(t)
    if n == 0:
        raise ConfigError("no requests to replay (empty trace or --limit 0)", path=trace.name or None, field="limit")
    cols = {c: np.zeros(n, dtype=np.int64) for c in COLUMNS}
    bar = _progress(n, quiet, label or policy.name)
    t0 = time.perf_counter()
    # detailed stats (O(pool) for some policies) at about DETAIL_SAMPLES evenly spaced
    # requests of the second half, and at the last request
    half = n // 2
    every = max(1, (n - half) // DETAIL_SAMPLES)
    if not detail:
        half, every = n - 1, 1
    replay_rows(t, policy, cols, 0, n, n, half, every, bar=bar, label=label, name=trace.name)
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    cols["alignment_loss_tokens"] = cols["held_tokens"] - cols["hit_tokens"]
    return Records(
        req_id=t.req_id,
        columns=cols,
        num_slots=policy.num_slots,
        slot_tokens=policy.slot_tokens,
        policy=label or policy.name,
        meta={"replay_s": elapsed, "trace": trace.name, "requests": n,
              # per KV cache group (hybrid models); None: the policy has one group
              "kv_cache_groups": policy.group_metrics() if hasattr(policy, "group_metrics") else None,
              # what radixkv.metrics.summarize reads of the policy, so that a summary of these
              # records is the same whoever made it (radixkv.replay, the CLI, a sweep cell)
              **policy_facts(policy, int(np.sum(cols["prompt_tokens"])))},
    )


def policy_facts(policy: PrefixCache, prompt_tokens: int) -> dict:
    """What a summary of a finished sequential replay needs from *policy* beyond the
    per-request columns: ``evictions`` (int, the policy's eviction events), ``measures``
    (:func:`radixkv.policies.registry.measured_metrics`: metrics the policy does not model
    are reported null, never 0) and ``host_tier``
    (:func:`radixkv.policies.host_tier.host_tier_summary` over *prompt_tokens*; every key
    None without a host tier). Stored in ``Records.meta`` by :func:`replay_sequential`."""
    from radixkv.policies.host_tier import host_tier_summary
    from radixkv.policies.registry import measured_metrics

    return {"evictions": int(policy.evictions), "measures": measured_metrics(policy),
            "host_tier": host_tier_summary(policy, prompt_tokens)}


def replay_rows(t: Trace, policy: PrefixCache, cols: dict, i: int, end: int, n: int, half: int, every: int, *,
                bar=None, label: str | None = None, name: str = "") -> None:
    """Run requests ``i … end−1`` of a replay of *n* requests through *policy*, writing
    their rows of *cols* (the loop of :func:`replay_sequential`, which calls it once for
    the whole trace; the streaming replay, :mod:`radixkv.replay.stream`, once per chunk).

    Rows ``r ≥ half`` with ``(r − half) % every == 0`` take detailed stats, and so does row
    ``n − 1``. A policy whose ``span_detail_rows`` is True runs them inside its span too
    (``replay_span(t, i0, i1, cols, detail=(half, every, n))`` fills those rows as
    ``stats(detail=True)`` would); any other span stops before each of them. *t*'s
    columns and *cols* are indexed by the row in the whole replay; *name* (the trace's)
    is the path in errors, which are :func:`replay_sequential`'s.
    """
    prev_evicted = policy.evicted_tokens_total
    # a policy may run spans of requests without detail rows inside one kernel call
    span = span_method(policy)
    # ... or with them, when its span fills a detail row as ``stats(detail=True)`` would
    whole = span is not None and getattr(policy, "span_detail_rows", False)
    while i < end:
        if span is not None:
            more = {}
            if whole:
                nxt = min(end, i + SPAN_REQUESTS)
                more["detail"] = (half, every, n)
            # otherwise up to (not including) the next row that asks for detailed stats
            elif i < half:
                nxt = min(half, n - 1)
            else:
                k = (i - half) % every
                nxt = i if k == 0 else min(n - 1, i + every - k)
            nxt = min(nxt, i + SPAN_REQUESTS, end)
            if nxt > i:
                j, status = span(t, i, nxt, cols, **more)
                if bar is not None:
                    bar.update(j - i)
                if j > i:
                    prev_evicted = policy.evicted_tokens_total
                if status != 1:
                    raise _span_refused(t, j, policy, label, name)
                if j > i:
                    i = j
                    continue
            else:
                # a detail row: the span runs the request, the stats come from the policy
                j, status = span(t, i, i + 1, cols)
                if status != 1:
                    raise _span_refused(t, j, policy, label, name)
                if j == i + 1:
                    _put_stats(cols, i, policy.stats(detail=True))
                    prev_evicted = policy.evicted_tokens_total
                    if bar is not None:
                        bar.update(1)
                    i = j
                    continue
                # not run (arrays to grow, or it does not fit the pool: nothing changed):
                # the Python path below runs it (and raises the same errors)
        seq = t.kv_seq(i)
        over = policy.fits_alone(seq)
        if over > 0:
            raise cannot_fit_error(policy, seq, over, t.req_id[i], i, label or policy.name, name)
        adm = policy.run_request(i, seq)
        if adm is None:
            raise ConfigError(
                f"request {str(t.req_id[i])!r} (#{i} in replay order) was refused by {label or policy.name} "
                f"although it fits the empty pool ({seq.kv_len} tokens of KV, pool {policy.capacity_tokens})",
                path=name or None,
                field="capacity",
            )
        st = policy.stats(detail=(i >= half and (i - half) % every == 0) or i == n - 1)
        cols["prompt_tokens"][i] = seq.prompt_len
        cols["hit_tokens"][i] = adm.hit_tokens
        cols["held_tokens"][i] = adm.held_tokens
        cols["evicted_tokens"][i] = policy.evicted_tokens_total - prev_evicted
        prev_evicted = policy.evicted_tokens_total
        _put_stats(cols, i, st)
        if bar is not None:
            bar.update(1)
        i += 1


def cannot_fit_error(policy, seq, over: int, req_id, i: int, label: str, path) -> ConfigError:
    """The error for request *req_id* (#*i* in replay order, KV *seq*) that overflows
    *policy*'s empty pool by *over* tokens (its ``fits_alone``), named *label*, in trace *path*."""
    detail = policy.overflow_detail(seq) if hasattr(policy, "overflow_detail") else \
        f"{over} tokens more than the whole pool of {policy.capacity_tokens} tokens"
    return ConfigError(
        f"request {str(req_id)!r} (#{i} in replay order) needs {seq.kv_len} tokens of KV "
        f"(prompt {seq.prompt_len} + output {seq.kv_len - seq.prompt_len}) and cannot fit the empty "
        f"pool under {label}: {detail}; give a larger capacity or --limit",
        path=path or None, field="capacity")
