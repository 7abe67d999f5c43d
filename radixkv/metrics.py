"""Metrics of a replay: pure functions of :class:`radixkv.records.Records`.

Definitions (docs/DESIGN.md, "Metrics"); every key carries its unit (``_tokens``, ``_bytes``,
``_s``) or is a ratio (``_rate``, ``_share``: dimensionless in [0, 1]).

- ``token_hit_rate`` = Σ hit tokens / Σ prompt tokens — what vLLM's and SGLang's own
  prefix-cache hit-rate metrics report (over first admissions).
- ``request_hit_rate`` = share of requests with a hit > 0.
- ``mean_request_hit_ratio`` = mean over requests of hit / prompt (the other common reading
  of "hit rate", e.g. of cache-study papers that do not say which they use).
- hit-length distribution: percentiles of hit tokens and a histogram with power-of-two bin
  edges in tokens.
- alignment loss = Σ (held − hit): prompt tokens the pool held as a token-level prefix but
  could not reuse because of block/page rounding or the last-token cap
  (``alignment_loss_share`` is over Σ prompt tokens).
- internal fragmentation = allocated slot tokens not holding a valid token
  (``(used + cached) × slot_tokens − valid``), as a share of the pool's tokens: a metric of
  the concurrent replay; ``None`` in a sequential summary (its samples are taken after each
  request finishes, when no request holds KV).
- duplication = valid tokens stored more than once, as a share of the pool's tokens.
- free-space scatter = 1 − largest contiguous free run / free slots (only where the policy
  models slot positions and some slot is free).
- a metric the policy does not model (its capability flags, ``models_duplication``,
  ``models_metadata``, ``models_slot_positions``) is ``None``: ``n/a`` in tables, ``null``
  in JSON, never 0.
- metadata = host bytes of hash-table entries or tree nodes (peak).
- ``kv_cache_groups`` (hybrid models, ``vllm-hybrid``): per KV cache group its hit tokens
  and cached blocks, and the tokens the full-attention group alone held
  (``full_attention_hit_tokens``, what the sliding groups cost in reuse); ``null`` for a
  policy with one group.
- cached-token capacity = distinct hittable tokens the pool holds, averaged over the
  second half of the replay, absolute and per pool slot and per pool token. It, the
  duplication and the scatter are averaged over the rows where the replay sampled them
  (32 evenly spaced requests of the second half; −1 elsewhere; see
  :func:`radixkv.replay.sequential.replay_sequential`).
- evictions = eviction events and tokens evicted.
- measurement window (only when asked, ``measure_last=F``): ``measure_window`` with the
  hit metrics above over the last share F of the replayed requests
  (:func:`window_summary`; the convention of kvcache-simulator, which reports hit rate over
  the last 50 % of requests); every whole-replay metric is unchanged by it.
- miss causes (only when the records carry them, ``miss_causes=True``): ``miss_causes``
  with the tokens and shares of prompt tokens that were hits and misses by cause
  (:func:`radixkv.metrics.summarize_causes`; docs/DESIGN.md, "Miss causes").

"Time-averaged" in a sequential replay means averaged over the samples taken after each
request (time is not modelled there: every request runs alone).
"""
from __future__ import annotations

import math

import numpy as np

from radixkv.records import CAUSES, CONCURRENT_CAUSES, MISS_COLUMNS, Records

_PCTS = (50, 90, 99)


#: summary keys of a host-memory KV tier (docs/hicache.md "Metrics per tier")
HOST_TIER_KEYS = ("host_capacity_tokens", "device_hit_tokens", "host_hit_tokens", "host_loaded_tokens",
                  "host_hit_rate", "gpu_to_host_tokens", "host_to_gpu_tokens", "host_evicted_tokens",
                  "gpu_to_host_bytes", "host_to_gpu_bytes")
#: summary keys of an L3 storage tier behind the host pool (docs/hicache.md "L3"); null
#: when the policy has none
STORAGE_TIER_KEYS = ("storage_backend", "storage_capacity_tokens", "storage_hit_tokens", "storage_hit_rate",
                     "host_to_storage_tokens", "storage_to_host_tokens", "storage_evicted_tokens",
                     "host_to_storage_bytes", "storage_to_host_bytes")


def fill_tier_bytes(summary: dict, bytes_per_token) -> dict:
    """Set a summary's ``gpu_to_host_bytes``, ``host_to_gpu_bytes``,
    ``host_to_storage_bytes`` and ``storage_to_host_bytes`` in place from its ``*_tokens``
    counts: tokens copied × *bytes_per_token* (the model's KV bytes per token per TP rank,
    :meth:`radixkv.memory.specs.ModelSpec.kv_bytes_per_token`; SGLang sizes its host pool
    with the same per-token size, ``pool_host/base.py :: HostKVCache.__init__``). A value is
    None (``n/a``) when its token count is None (no such tier) or *bytes_per_token* is None
    (no model given). The one rule behind :func:`radixkv.summarize` and the CLI. Returns
    *summary*."""
    for way in ("gpu_to_host", "host_to_gpu", "host_to_storage", "storage_to_host"):
        tokens = summary.get(f"{way}_tokens")
        summary[f"{way}_bytes"] = None if tokens is None or bytes_per_token is None else \
            int(tokens) * int(bytes_per_token)
    return summary


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else 0.0


def hit_length_histogram(hit_tokens: np.ndarray, counts: np.ndarray | None = None) -> dict:
    """Histogram of hit lengths with bin edges 0, 1, 16, 32, 64, … (tokens).

    Parameters
    ----------
    hit_tokens : np.ndarray, int64, shape (n,)
    counts : np.ndarray, int64, shape (n,), optional
        How many requests had each ``hit_tokens`` value (the streaming replay's distinct
        values); None: one each.

    Returns
    -------
    dict with ``edges_tokens`` (list of int, bin lower edges; the last bin is open) and
    ``counts`` (list of int, requests per bin).
    """
    top = int(hit_tokens.max()) if hit_tokens.size else 0
    edges = [0, 1, 16]
    while edges[-1] <= top:
        edges.append(edges[-1] * 2)
    idx = np.searchsorted(np.asarray(edges), hit_tokens, side="right") - 1
    counts = np.bincount(idx, weights=counts, minlength=len(edges))[: len(edges)].astype(np.int64)
    # drop the empty open bin at the end
    while len(edges) > 1 and counts[-1] == 0:
        edges.pop()
        counts = counts[:-1]
    return {"edges_tokens": [int(e) for e in edges], "counts": [int(c) for c in counts]}


def window_start(n: int, measure_last: float) -> int:
    """First request (0-based row) of the measurement window over the last share
    *measure_last* of *n* requests: ``⌊n·(1 − F)⌋``, as kvcache-simulator counts its warm-up
    (``warmup_requests = ⌊n·warmup_fraction⌋``, kvcache_sim/simulator.py
    ``warmup_requests_for_trace``; its window is F = 1 − warmup_fraction = 0.5). F is read
    as the decimal it prints as, so 0.3 of 10 requests is the last 3 exactly.

    Raises
    ------
    radixkv.errors.ConfigError
        When *measure_last* is not a number in (0, 1] (``field="measure_last"``).
    """
    from fractions import Fraction

    from radixkv.errors import ConfigError

    try:
        f = float(measure_last)
    except (TypeError, ValueError):
        raise ConfigError(f"measure_last must be a fraction of the requests in (0, 1], got {measure_last!r}",
                          field="measure_last") from None
    if isinstance(measure_last, bool) or not (0.0 < f <= 1.0):
        raise ConfigError(f"measure_last must be a fraction of the requests in (0, 1] (0.5: the last half), "
                          f"got {measure_last!r}", field="measure_last")
    return math.floor(int(n) * (1 - Fraction(repr(f))))


def window_summary(columns: dict, n: int, measure_last: float) -> dict:
    """Hit metrics over the last share *measure_last* of the *n* replayed requests.

    Parameters
    ----------
    columns : dict
        The record columns ``prompt_tokens`` and ``hit_tokens`` (int64 arrays, shape (n,),
        tokens, in replay order).
    n : int
        Rows of the replay.
    measure_last : float
        F in (0, 1]: the window is rows ``⌊n·(1 − F)⌋ … n − 1`` (:func:`window_start`).
        The cache is warmed by every earlier request; only the window's requests are counted.

    Returns
    -------
    dict: ``measure_last`` (F), ``first_request`` (0-based row), ``requests``,
    ``prompt_tokens``, ``hit_tokens`` (tokens), and ``token_hit_rate``,
    ``request_hit_rate``, ``mean_request_hit_ratio`` (the definitions of the whole
    replay's keys, over the window; ``None`` when the window is empty).

    Raises
    ------
    radixkv.errors.ConfigError
        When *measure_last* is not in (0, 1].
    """
    i0 = window_start(n, measure_last)
    prompt = np.asarray(columns["prompt_tokens"][i0:n], dtype=np.int64)
    hit = np.asarray(columns["hit_tokens"][i0:n], dtype=np.int64)
    m = n - i0
    tp, th = int(prompt.sum()), int(hit.sum())
    return {
        "measure_last": float(measure_last),
        "first_request": int(i0),
        "requests": int(m),
        "prompt_tokens": tp,
        "hit_tokens": th,
        "token_hit_rate": th / tp if tp else None,
        "request_hit_rate": float((hit > 0).sum()) / m if m else None,
        "mean_request_hit_ratio": float(np.mean(hit / prompt)) if m else None,
    }


def summarize(rec: Records, *, evictions: int | None = None, measures: dict | None = None,
              measure_last: float | None = None) -> dict:
    """Summary metrics of one sequential replay (see the module docstring for definitions).

    Parameters
    ----------
    rec : Records
    evictions : int or None
        The policy's count of eviction events (blocks, nodes or units), when known.
        Default: ``rec.meta["evictions"]`` (recorded by the replay), else unknown.
    measures : dict or None
        The policy's capability flags, :func:`radixkv.policies.registry.measured_metrics`;
        a metric the policy does not model (False) is ``None`` (``n/a``, JSON ``null``),
        never 0. Default: ``rec.meta["measures"]`` (recorded by
        :func:`radixkv.replay.sequential.replay_sequential`); without either, every metric
        is taken as measured.

    The host-tier keys (``rec.meta["host_tier"]``,
    :func:`radixkv.policies.host_tier.host_tier_summary`) are added when the replay
    recorded them, so the summary is the same from :func:`radixkv.summarize` and the CLI.

    Internal fragmentation is ``None`` here: the sequential replay samples the pool after
    each request finishes, when no request holds KV, so it would measure only an idle pool;
    it is a metric of the concurrent replay (:meth:`ConcurrentResult.summary`).

    Returns
    -------
    dict of plain Python numbers and lists, ready for deterministic JSON.
    """
    c = rec.columns
    if evictions is None:
        evictions = rec.meta.get("evictions")
    if measures is None:
        measures = rec.meta.get("measures")
    agg = column_aggregates(c, len(rec))
    mc = None
    if "miss_compulsory_tokens" in c:  # the replay ran with miss causes (radixkv.replay.misses)
        mc = summarize_causes(c, agg["prompt_tokens"], agg["hit_tokens"])
        mc["unbounded_pool_tokens"] = rec.meta.get("miss_unbounded_pool_tokens")
    out = summary_of(agg, policy=rec.policy, num_slots=rec.num_slots, slot_tokens=rec.slot_tokens,
                     capacity_tokens=rec.capacity_tokens, evictions=evictions, measures=measures,
                     miss_causes=mc, kv_cache_groups=rec.meta.get("kv_cache_groups"),
                     rejected_requests=rec.meta.get("rejected_requests"))
    if rec.meta.get("host_tier") is not None:
        out.update(rec.meta["host_tier"])
    if measure_last is not None:
        out["measure_window"] = window_summary(c, len(rec), measure_last)
    return out


def column_aggregates(c: dict, n: int) -> dict:
    """What :func:`summary_of` needs from the record columns *c* (int64 arrays of *n*
    rows): totals, the mean request hit ratio, hit-length percentiles and histogram, and
    the sampled rows' pool columns. :class:`radixkv.replay.stream.StreamAggregates` builds
    the same dict chunk by chunk."""
    prompt = c["prompt_tokens"]
    hit = c["hit_tokens"]
    run, free = c["largest_free_run"], c["free_slots"]
    ok = (run >= 0) & (free > 0)
    half = c["cached_tokens"][n // 2:]
    return {
        "requests": n,
        "prompt_tokens": int(prompt.sum()),
        "hit_tokens": int(hit.sum()),
        "hit_requests": int((hit > 0).sum()),
        "mean_request_hit_ratio": float(np.mean(hit / prompt)) if n else 0.0,
        "hit_percentiles": {p: float(np.percentile(hit, p)) if n else 0.0 for p in _PCTS},
        "hit_max": int(hit.max()) if n else 0,
        "hit_length_histogram": hit_length_histogram(hit),
        "alignment_loss_tokens": int(c["alignment_loss_tokens"].sum()),
        "held_tokens": int(c["held_tokens"].sum()),
        "evicted_tokens": int(c["evicted_tokens"].sum()),
        "duplicate_sampled": c["duplicate_tokens"][c["duplicate_tokens"] >= 0],
        "scatter_sampled": (run[ok], free[ok]),
        "metadata_bytes_max": int(c["metadata_bytes"].max()) if n else None,
        "cached_sampled_second_half": half[half >= 0],
        "valid_second_half_mean": float(c["valid_tokens"][n // 2:].mean()) if n else 0.0,
    }


def summary_of(agg: dict, *, policy: str, num_slots: int, slot_tokens: int, capacity_tokens: int,
               evictions: int | None = None, measures: dict | None = None, miss_causes: dict | None = None,
               kv_cache_groups=None, rejected_requests: int | None = None) -> dict:
    """The summary :func:`summarize` returns, from :func:`column_aggregates`' dict *agg*,
    the pool's size, and the miss causes and per-group metrics when the replay has them;
    ``rejected_requests`` (requests past the model's context, :mod:`radixkv.replay.context`)
    only when a context length applied (None: the key is absent)."""
    n = agg["requests"]
    pool_tokens = capacity_tokens
    total_prompt = agg["prompt_tokens"]
    total_hit = agg["hit_tokens"]
    out: dict = {
        "policy": policy,
        "requests": n,
        "pool_slots": num_slots,
        "pool_slot_tokens": slot_tokens,
        "pool_capacity_tokens": pool_tokens,
        "prompt_tokens": total_prompt,
        "hit_tokens": total_hit,
        "computed_prompt_tokens": total_prompt - total_hit,
        "token_hit_rate": _ratio(total_hit, total_prompt),
        "request_hit_rate": _ratio(agg["hit_requests"], n),
        "mean_request_hit_ratio": agg["mean_request_hit_ratio"],
    }
    for p in _PCTS:
        out[f"hit_tokens_p{p}"] = agg["hit_percentiles"][p]
    out["hit_tokens_max"] = agg["hit_max"]
    out["hit_length_histogram"] = agg["hit_length_histogram"]
    loss = agg["alignment_loss_tokens"]
    out["alignment_loss_tokens"] = loss
    out["alignment_loss_share"] = _ratio(loss, total_prompt)
    out["held_tokens"] = agg["held_tokens"]
    out["evicted_tokens"] = agg["evicted_tokens"]
    if evictions is not None:
        out["evictions"] = int(evictions)
    has = {"duplication": True, "metadata": True, "slot_positions": True, **(measures or {})}
    # sampled with no request running: an idle pool's slack, not fragmentation (docstring)
    out["internal_fragmentation_share_mean"] = None
    out["internal_fragmentation_share_peak"] = None
    dup = agg["duplicate_sampled"]
    if has["duplication"] and dup.size:
        out["duplicate_share_mean"] = _ratio(float(dup.mean()), pool_tokens)
        out["duplicate_share_peak"] = _ratio(int(dup.max()), pool_tokens)
    else:
        out["duplicate_share_mean"] = out["duplicate_share_peak"] = None
    run, free = agg["scatter_sampled"]
    out["free_space_scatter_mean"] = (float(np.mean(1.0 - run / free))
                                      if has["slot_positions"] and run.size else None)
    out["metadata_bytes_peak"] = agg["metadata_bytes_max"] if has["metadata"] and n else None
    half = agg["cached_sampled_second_half"]
    cap = float(half.mean()) if half.size else 0.0
    out["cached_tokens_second_half_mean"] = cap
    out["cached_tokens_per_slot"] = _ratio(cap, num_slots)
    out["cached_tokens_share_of_pool"] = _ratio(cap, pool_tokens)
    out["valid_tokens_second_half_mean"] = agg["valid_second_half_mean"]
    if miss_causes is not None:
        out["miss_causes"] = miss_causes
    # the host-memory tier's totals (radixkv.policies.host_tier.host_tier_summary): null
    # here; the sequential replay fills them for a policy that models a host tier
    out.update(dict.fromkeys(HOST_TIER_KEYS))
    out.update(dict.fromkeys(STORAGE_TIER_KEYS))
    # hybrid models: hits and memory per KV cache group, and the hit the full-attention
    # group alone held (HybridBlockHashCache.group_metrics); null for one-group policies
    out["kv_cache_groups"] = kv_cache_groups
    if rejected_requests is not None:  # only when a context length applies (radixkv.replay.context)
        out["rejected_requests"] = rejected_requests
    return out


def summarize_causes(columns: dict, prompt_tokens: int, hit_tokens: int) -> dict:
    """Totals and shares of the miss causes (the summary's ``miss_causes``).

    Parameters
    ----------
    columns : dict
        :data:`MISS_COLUMNS` columns (int64 arrays).
    prompt_tokens, hit_tokens : int
        Σ prompt and Σ hit tokens of the replay.

    Returns
    -------
    dict: ``mode`` (``"sequential"``), ``tokens`` and ``share`` (cause → int / float over
    Σ prompt tokens, ``hit`` included; the concurrent-only causes are ``None``), and
    ``nesting_violations`` (requests with a negative term; 0 for built-in policies).
    """
    tokens = {"hit": int(hit_tokens)}
    for c in CAUSES[1:]:
        tokens[c] = int(np.sum(columns[f"miss_{c}_tokens"]))
    share = {c: (v / prompt_tokens if prompt_tokens else None) for c, v in tokens.items()}
    for c in CONCURRENT_CAUSES:
        tokens[c] = None
        share[c] = None
    neg = np.zeros(len(columns["miss_compulsory_tokens"]), dtype=bool)
    for k in MISS_COLUMNS:
        neg |= np.asarray(columns[k]) < 0
    return {"mode": "sequential", "tokens": tokens, "share": share, "nesting_violations": int(neg.sum())}
