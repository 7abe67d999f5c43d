"""Why each prompt token missed: a per-request miss-cause breakdown (sequential replay).

Every prompt token of every request is either a **hit** or a miss with exactly one cause,
found against two shadow models replayed over the same trace (docs/DESIGN.md, "Miss
causes"):

``L``   the *infinite token-level cache* (:func:`token_prefix_lengths`): the longest
        prefix of the prompt that any earlier request's *cacheable extent* holds, compared
        token by token with no rounding and no cap. The cacheable extent of a request is
        everything the engines can ever cache of it: its prompt and its outputs up to the
        KV extent ``P + max(N − 1, 0)`` (vLLM hashes every full block computed in a step,
        decode included — ``vllm/v1/core/single_type_kv_cache_manager.py ::
        cache_blocks``; SGLang inserts prompt + outputs at finish —
        ``python/sglang/srt/mem_cache/radix_cache.py :: cache_finished_req``).
``H∞``  the *capacity shadow*: the same policy class, size and options on a pool large
        enough that it never evicts (:func:`unbounded_pool_tokens`), replayed by the same
        kernels; its hit per request.
``A, C`` the engine's reuse rule applied to ``L``
        (:meth:`radixkv.policies.base.PrefixCache.reusable_prefix`): ``A`` = ``L`` rounded
        down to whole blocks/pages, ``C`` = ``A`` after the last-token cap (vLLM
        ``vllm/v1/core/kv_cache_manager.py :: get_computed_blocks``: the lookup covers at
        most ``max_cache_hit_length = num_tokens − 1`` tokens; SGLang
        ``python/sglang/srt/managers/schedule_batch.py :: Req.init_next_round_input``
        matches at most the first ``len(fill_ids) − 1`` tokens, then ``match_prefix``
        rounds down to a page).

With ``H`` the request's actual hit and ``P`` its prompt length the causes are the
telescoping differences of these nested counterfactuals::

    compulsory     = P − L      an infinite token-level cache would miss them too
    alignment      = L − A      held at token level, not a whole block/page
    last_token_cap = A − C      whole blocks/pages lost only to the last-token rule
    not_cached     = C − H∞     reusable under the rules, but this policy never caches it
                                 even with unbounded memory (0 for vllm, sglang, static;
                                 outputs for unit-lru; everything for none)
    capacity       = H∞ − H     the same policy with unbounded memory hits them: evicted
    hit            = H

so ``hit + compulsory + alignment + last_token_cap + not_cached + capacity = P`` for every
request, exactly, by construction. Each term is ≥ 0 when the policy's hit never exceeds
what its rule allows on content some earlier request computed (``H∞ ≤ C``) and its cache
content at any pool size is a subset of the unbounded one's (``H ≤ H∞``); both hold for
every built-in policy (tests/test_misses.py checks them on hypothesis traces and the
goldens). A policy breaking them gets negative terms, counted in the summary's
``nesting_violations``.

Causes of the concurrent and multi-replica modes (in-flight, preemption, routing) are
``None`` (JSON ``null``) in a sequential summary; :mod:`radixkv.replay.conc_misses`
computes them for those modes (docs/miss-causes.md).

Cost: ``L`` is one pass over the requests with a hash set of prefixes seen
(:mod:`radixkv.replay._miss_kernels`: a binary search per lookup, inserts only for new
segments; no eviction structure). ``H∞`` needs no replay for the policies whose unbounded
hit is the engine rule on ``L`` (:func:`unbounded_rule`: vLLM and SGLang, ``H∞ = C``) or,
for ``unit-lru``, the same pass over the trace
(:func:`radixkv.replay._miss_kernels.prefix_lengths_and_unit_lru_hits`); any other policy replays its own kernels on the unbounded
pool (:func:`capacity_shadow`). ``--explain`` walks the trie of the KV extents
(:func:`radixkv.replay._miss_kernels.trie_nodes`; it names the request that produced each span).
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
from radixkv.records import CONCURRENT_CAUSES, MISS_COLUMNS
import radixkv.replay._miss_kernels as _MK
from radixkv.replay._miss_kernels import trace_segments, trie_nodes
from radixkv.trace.types import Trace

def token_prefix_lengths(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The infinite token-level cache: for each request, the longest prefix of its prompt
    that the cacheable extent (prompt + outputs to the KV extent) of any earlier request
    holds, token by token.

    Parameters
    ----------
    trace : Trace
        Requests in replay order.

    Returns
    -------
    (held, new) : int64 arrays of shape (n,), tokens. ``held[r]`` ≤ ``prompt_len[r]`` is
    ``L`` of the module docstring; ``new[r] = kv_len(r) − held[r]`` bounds the tokens r adds
    to a cache that never evicts (used to size the capacity shadow's pool).
    """
    out = _MK.prefix_lengths(trace)
    return out[:, 0].copy(), out[:, 1].copy()


def unbounded_pool_tokens(trace: Trace, new_tokens: np.ndarray, slot_tokens: int) -> int:
    """A pool (tokens) on which a sequential replay of *trace* never needs to evict.

    Each request takes at most ``ceil(new/g) + 3`` slots of ``g = slot_tokens`` tokens that
    it did not hit (one for rounding of its hit, one for the last-token cap, one for its
    partial last slot), so the sum over requests plus the largest request is enough for a
    policy that keeps at most what it allocated. The caller checks that the shadow evicted
    nothing.
    """
    g = max(1, int(slot_tokens))
    n = len(trace)
    if n == 0:
        return g
    slots = int(np.sum(-(-new_tokens // g))) + 3 * n
    biggest = int((np.asarray(trace.prompt_len, dtype=np.int64)
                   + np.maximum(np.asarray(trace.output_len, dtype=np.int64) - 1, 0)).max())  # Trace.kv_len
    slots += -(-biggest // g) + 2
    return slots * g


def decompose(prompt: np.ndarray, hit: np.ndarray, held_inf: np.ndarray, hit_unbounded: np.ndarray,
              aligned: np.ndarray, capped: np.ndarray) -> dict:
    """The miss causes of each request (module docstring), as int64 arrays of shape (n,).

    Parameters (int64 arrays of shape (n,), tokens): ``P``, ``H``, ``L``, ``H∞``, ``A``, ``C``.

    Returns
    -------
    dict mapping every key of :data:`MISS_COLUMNS` to its column; with *hit* they sum to
    *prompt* exactly.
    """
    return {
        "miss_compulsory_tokens": prompt - held_inf,
        "miss_alignment_tokens": held_inf - aligned,
        "miss_last_token_cap_tokens": aligned - capped,
        "miss_not_cached_tokens": capped - hit_unbounded,
        "miss_capacity_tokens": hit_unbounded - hit,
    }


def capacity_shadow(trace: Trace, spec, *, limit=None, unit_tokens: int | None = None, new_tokens=None,
                    **options):
    """Replay *trace* through *spec*'s policy on a pool that never evicts.

    Returns
    -------
    (records, policy) : the shadow's :class:`~radixkv.records.Records` and the
    policy instance (its ``capacity_tokens`` is the pool used).

    Raises
    ------
    radixkv.errors.ConfigError
        When even the unbounded pool is larger than radixkv models
        (:data:`radixkv.policies.registry.MAX_POOL_SLOTS`), or the shadow evicted (a policy
        that keeps more than it allocates; the breakdown would be wrong).
    """
    from radixkv.policies.registry import PoolSpec, build_policy
    from radixkv.replay.sequential import replay_sequential

    t = trace.head(limit)
    if new_tokens is None:
        _, new_tokens = token_prefix_lengths(t)
    pool = unbounded_pool_tokens(t, new_tokens, _slot_size(t, spec, {"unit_tokens": unit_tokens}))
    policy = build_policy(spec, PoolSpec(capacity_tokens=pool), unit_tokens=t.unit_tokens, trace=t, **options)
    rec = replay_sequential(t, policy, quiet=True, label=spec.label, detail=False)
    if policy.evicted_tokens_total or int(rec["evicted_tokens"].sum()):
        raise ConfigError(f"{spec.label}: the capacity shadow on {pool:,} tokens evicted "
                          f"{policy.evicted_tokens_total:,} tokens; the miss-cause breakdown needs a pool that "
                          f"never evicts", field="capacity")
    return rec, policy


def _slot_size(t: Trace, spec, options) -> int:
    """Tokens per slot of *spec*'s policy on *t* (block/page size, or the trace unit)."""
    if spec.cls.size_name == "unit_tokens":
        return int(options.get("unit_tokens") or t.unit_tokens)
    return int(spec.size or 1)


def _unbounded_rules() -> dict:
    """Policy classes (exact class, not subclasses) whose hit on memory that never evicts
    is known without replaying them: ``"rule"`` — the engine rule on ``L`` (``H∞ = C``):
    vLLM's ``BlockHashCache`` caches every full block of every KV extent, chained by block
    hash (``kv_cache_manager.get_computed_blocks`` finds the longest run of them, capped
    at ``num_tokens − 1``), SGLang's ``RadixCache`` every whole page of prompt + outputs
    (``cache_finished_req``; ``match_prefix`` on the capped key) — so with nothing evicted
    the hit is ``A`` capped, i.e. ``C``; ``"unit-lru"`` — its leading prompt units seen
    in any earlier prompt (:func:`radixkv.replay._miss_kernels.prefix_lengths_and_unit_lru_hits`).
    Their priority-eviction variants (``@lfu`` …) differ only in what they evict, which
    memory that never evicts never asks. Whatever else (other subclasses, other policies,
    host tiers) replays the capacity shadow. ``tests/test_misses.py`` checks each entry
    against that replay."""
    from radixkv.policies.block_hash import BlockHashCache
    from radixkv.policies.block_priority import PriorityBlockHashCache
    from radixkv.policies.radix import RadixCache
    from radixkv.policies.radix_priority import PriorityRadixCache
    from radixkv.policies.unit_lru import UnitLRUCache

    return {BlockHashCache: "rule", RadixCache: "rule", PriorityBlockHashCache: "rule", PriorityRadixCache: "rule",
            UnitLRUCache: "unit-lru"}


def unbounded_rule(t: Trace, spec, **options):
    """``(probe, how)``: a small instance of *spec*'s policy (for its ``reusable_prefix``)
    and how its unbounded hit is known (:func:`_unbounded_rules`), or ``(None, None)`` when
    the capacity shadow must be replayed."""
    from radixkv.policies.registry import PoolSpec, build_policy

    if not any(issubclass(c, spec.cls) for c in _unbounded_rules()):
        return None, None
    probe = build_policy(spec, PoolSpec(capacity_tokens=64 * _slot_size(t, spec, options)), unit_tokens=t.unit_tokens,
                         trace=t, **options)
    how = _unbounded_rules().get(type(probe))
    return (probe, how) if how is not None else (None, None)


#: shadows of recent (trace, policy, limit, options): they do not depend on the pool size, so
#: a ``compare`` or ``curve`` pays for them once per policy (at most _MEMO_SIZE kept)
_MEMO: dict = {}
_MEMO_SIZE = 4


def _shadows(t: Trace, trace: Trace, spec, limit, options):
    """(held_inf, shadow hit, aligned, capped, unbounded pool tokens, seconds) for *t*,
    memoised by the identity of *trace* (held by a weak reference)."""
    import time
    import weakref

    try:
        key = (id(trace), spec, limit, tuple(sorted(options.items())))
        hash(key)
    except TypeError:
        key = None
    hitm = _MEMO.get(key) if key is not None else None
    if hitm is not None and hitm[0]() is trace:
        return hitm[1]
    t0 = time.perf_counter()
    probe, how = unbounded_rule(t, spec, **options)
    if how == "unit-lru":  # both shadows in one pass over the trace
        out, hit_ulru = _MK.prefix_lengths_and_unit_lru_hits(t)
        held_inf, new = out[:, 0].copy(), out[:, 1].copy()
    else:
        held_inf, new = token_prefix_lengths(t)
    plen = np.asarray(t.prompt_len, dtype=np.int64)
    if how is None:
        srec, spol = capacity_shadow(t, spec, new_tokens=new, **options)
        aligned, capped = spol.reusable_prefix(held_inf, plen)
        hit_unb, pool = np.asarray(srec["hit_tokens"], dtype=np.int64), int(spol.capacity_tokens)
    else:
        aligned, capped = probe.reusable_prefix(held_inf, plen)
        hit_unb = np.asarray(capped, dtype=np.int64).copy() if how == "rule" else hit_ulru
        pool = unbounded_pool_tokens(t, new, _slot_size(t, spec, options))
    val = (held_inf, hit_unb, np.asarray(aligned, dtype=np.int64),
           np.asarray(capped, dtype=np.int64), int(pool), time.perf_counter() - t0)
    if key is not None:
        try:
            ref = weakref.ref(trace)
        except TypeError:
            return val
        while len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = (ref, val)
    return val


def attach_miss_causes(trace: Trace, spec, records, *, limit=None, **options) -> float:
    """Add the miss-cause columns (:data:`MISS_COLUMNS`) to *records* in place, and
    ``records.meta["miss_unbounded_pool_tokens"]`` (the capacity shadow's pool, tokens).

    The sequential replay's hook (:func:`radixkv.replay.run.run_replay` and
    :func:`radixkv.api.replay` with ``miss_causes=True``); :func:`radixkv.metrics.summarize`
    then adds ``miss_causes`` (:func:`radixkv.metrics.summarize_causes`) to the summary. Returns the
    seconds spent.
    """
    import time

    t0 = time.perf_counter()
    cols = miss_causes(trace, spec, records, limit=limit, **options)
    meta = cols.pop("_meta")
    records.columns.update({k: cols[k] for k in MISS_COLUMNS})
    records.meta["miss_unbounded_pool_tokens"] = meta["unbounded_pool_tokens"]
    return time.perf_counter() - t0


def miss_causes(trace: Trace, spec, records, *, limit=None, **options) -> dict:
    """The per-request miss causes of a finished sequential replay of *spec* on *trace*.

    Parameters
    ----------
    trace : Trace
        The trace replayed (the whole trace; *limit* as given to the replay).
    spec : radixkv.policies.registry.PolicySpec
        The policy replayed.
    records : Records
        The replay's records (``prompt_tokens``, ``hit_tokens``).
    limit : int or None
        ``--limit``.
    **options
        The policy constructor options of the replay (the shadow uses the same).

    Returns
    -------
    dict with the columns of :data:`MISS_COLUMNS` (int64, shape (n,)) and
    ``"_meta"``: ``{"unbounded_pool_tokens": int, "shadow_hit_tokens": ndarray,
    "held_inf_tokens": ndarray}``.
    """
    t = trace.head(limit)
    held_inf, hit_unb, aligned, capped, pool, secs = _shadows(t, trace, spec, limit, options)
    prompt = np.asarray(records["prompt_tokens"], dtype=np.int64)
    if len(prompt) != len(t):
        raise ValueError(f"records have {len(prompt)} rows, the trace {len(t)} requests (limit {limit})")
    cols = decompose(prompt, np.asarray(records["hit_tokens"], dtype=np.int64), held_inf, hit_unb, aligned, capped)
    cols["_meta"] = {"unbounded_pool_tokens": pool, "shadow_hit_tokens": hit_unb, "held_inf_tokens": held_inf,
                     "aligned_tokens": aligned, "capped_tokens": capped, "shadow_s": secs}
    return cols


#: bisection steps (in log capacity) after the doubling search brackets the halving point:
#: the reported pool is within a factor 2^(1/2^FIX_BISECT) above the true crossing
FIX_BISECT = 3


def halving_pool(c0: int, m0: int, top: int, misses_at) -> tuple:
    """The smallest pool on a curve at which capacity misses are at most half of *m0*.

    Doubles the pool from *c0* (tokens, where the capacity misses are *m0* tokens) until
    ``misses_at(c)`` (capacity miss tokens of a replay at pool *c*) is ≤ m0 / 2 or *top*
    (the unbounded pool, where nothing is evicted, so no capacity miss: 0 by definition,
    not replayed) is reached, then bisects the last doubling :data:`FIX_BISECT` times in
    log capacity. Returns ``(pool or None when m0 == 0, {pool: capacity misses})``.
    """
    import math

    curve = {int(c0): int(m0)}

    def at(c: int) -> int:
        if c not in curve:
            curve[c] = int(misses_at(c))
        return curve[c]

    if m0 <= 0:
        return None, curve
    target = m0 / 2
    lo, hi = int(c0), None
    c = int(c0)
    while hi is None:
        c = min(2 * c, int(top))
        if c >= top:
            curve.setdefault(int(top), 0)
            hi = int(top)
        elif at(c) <= target:
            hi = c
        else:
            lo = c
    for _ in range(FIX_BISECT):
        mid = int(round(math.sqrt(lo * hi)))
        if mid <= lo or mid >= hi:
            break
        if at(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi, curve


def what_would_fix_concurrent(spec, capacity_tokens: int, summary: dict, run_at) -> dict:
    """``--miss-fix`` in the concurrent modes (one engine or ``--replicas``): what
    :func:`what_would_fix` reports, from whole concurrent replays with the miss causes.

    In a concurrent replay the pool changes the schedule too (who runs together, what is in
    flight), so the capacity misses at another pool are not ``Σ H∞ − Σ H`` of the shadow:
    each point of the curve is a full concurrent replay with the breakdown, and its
    ``capacity`` total is read. The search is :func:`halving_pool` (the same doubling and
    bisection; capacity misses need not fall monotonically here — the curve is reported
    to check). The smaller block/page size is replayed on the same pool in tokens.

    Parameters
    ----------
    spec : radixkv.policies.registry.PolicySpec
        The policy replayed.
    capacity_tokens : int
        The replay's pool, usable tokens (per replica with ``--replicas``).
    summary : dict
        The replay's summary, with ``miss_causes`` (concurrent).
    run_at : callable
        ``run_at(spec, capacity_tokens) -> summary``: the same concurrent replay (same
        trace, flags, routing) of *spec* on a pool of that many tokens, with the miss causes.

    Returns
    -------
    dict, the keys of :func:`what_would_fix`: ``capacity_tokens_to_halve``,
    ``capacity_curve``, ``smaller_size``, ``hit_tokens_gained_at_smaller_size``.
    """
    import dataclasses

    mc = summary["miss_causes"]
    m0 = int(mc["tokens"]["capacity"])
    top = int(mc["unbounded_pool_tokens"])
    halve, curve = halving_pool(int(capacity_tokens), m0, max(top, int(capacity_tokens)),
                                lambda c: run_at(spec, int(c))["miss_causes"]["tokens"]["capacity"])
    size = gained = None
    if spec.cls.size_name in ("block_size", "page_size") and spec.size and int(spec.size) > 1:
        size = int(spec.size) // 2
        s = run_at(dataclasses.replace(spec, size=size), int(capacity_tokens))
        gained = int(s["hit_tokens"]) - int(summary["hit_tokens"])
    return {"capacity_tokens_to_halve": halve, "capacity_curve": [[int(k), int(v)] for k, v in sorted(curve.items())],
            "smaller_size": size, "hit_tokens_gained_at_smaller_size": gained}


def what_would_fix(trace: Trace, spec, pool, records, summary: dict, *, replay, limit=None, **options) -> dict:
    """What would remove the misses of a replay with miss causes (``--miss-fix``).

    - ``capacity_tokens_to_halve``: the smallest pool (usable tokens) on a curve at which
      the capacity misses (Σ ``H∞ − H``) are at most half of this replay's. The curve
      doubles the pool from this replay's until the target is met (or the shadow's
      unbounded pool, where capacity misses are 0 by definition, is reached), then bisects
      the last doubling :data:`FIX_BISECT` times in log capacity. Assumes capacity misses
      fall as the pool grows (true of LRU caches; the curve is reported to check).
      ``None`` when this replay has no capacity miss.
    - ``smaller_size`` / ``hit_tokens_gained_at_smaller_size``: the same policy at half its
      block/page size on the same pool in usable tokens (however the pool was given: in
      blocks, the same bytes hold twice the blocks at half the size), and Σ hit tokens
      gained. It can be negative: a smaller unit recovers alignment misses (at most
      ``size − 1`` tokens a request) but also changes what is evicted (finer units, another
      LRU order), and in a concurrent replay the schedule; the difference is reported as
      measured. ``None`` when the policy has no block/page size or it is already 1.

    Parameters
    ----------
    trace, spec, limit, **options : as for :func:`radixkv.replay.run.run_replay`.
    pool : radixkv.policies.registry.PoolSpec
        The replay's pool.
    records, summary :
        The replay's records (with the miss-cause columns) and summary (with
        ``miss_causes``).
    replay : callable
        ``replay(trace, spec, pool, limit=limit, **options) -> (records, summary)``: the
        sequential replay of one cell, :func:`radixkv.replay.run.run_replay` (its caller
        passes it: that module sits above this one).

    Returns
    -------
    dict: ``capacity_tokens_to_halve`` (int or None), ``capacity_curve`` (list of
    ``[pool tokens, capacity miss tokens]``, ascending), ``smaller_size`` (int or None),
    ``hit_tokens_gained_at_smaller_size`` (int or None).
    """
    import dataclasses

    from radixkv.policies.registry import PoolSpec

    m0 = int(np.sum(records["miss_capacity_tokens"]))
    hit_unb = m0 + int(summary["hit_tokens"])  # Σ H∞
    c0 = int(records.capacity_tokens)
    top = int(summary["miss_causes"]["unbounded_pool_tokens"])

    def misses_at(c: int) -> int:
        _, s = replay(trace, spec, PoolSpec(capacity_tokens=int(c)), limit=limit, **options)
        return hit_unb - int(s["hit_tokens"])

    halve, curve = halving_pool(c0, m0, top, misses_at)
    size = None
    gained = None
    if spec.cls.size_name in ("block_size", "page_size") and spec.size and int(spec.size) > 1:
        size = int(spec.size) // 2
        small = dataclasses.replace(spec, size=size)
        # the same pool in usable tokens, not in the engine's units: a pool given as
        # num_gpu_blocks kept at half the block size would hold half the tokens (at block 8
        # -> 4 on the demo's 2,501 blocks: -9,724 hit tokens, where the same 20,000 tokens
        # gain 756)
        _, s = replay(trace, small, PoolSpec(capacity_tokens=c0), limit=limit, **options)
        gained = int(s["hit_tokens"]) - int(summary["hit_tokens"])
    return {"capacity_tokens_to_halve": halve, "capacity_curve": [[int(k), int(v)] for k, v in sorted(curve.items())],
            "smaller_size": size, "hit_tokens_gained_at_smaller_size": gained}


def producer_spans(sub: Trace) -> tuple:
    """Which earlier request first computed each span of the last request's prompt.

    Builds the trie of every request's KV extent in *sub*'s order
    (:func:`radixkv.replay._miss_kernels.trie_nodes`: a node is one segment at one position
    below one parent) and walks the last request's prompt through the nodes created by the
    requests before it, up to its held prefix ``L`` (:func:`token_prefix_lengths`). A
    node's producer is the first request whose extent holds it; its cover is the longest
    run of its segment any request of *sub* computed.

    Returns
    -------
    (spans, held) : spans is a list of ``{start, end, produced_by_index}`` (token ranges of
    ``[0, L)``, ascending and contiguous; the index is a row of *sub*); held is int64 shape
    (n,), tokens: ``L`` of every request of *sub*.
    """
    i = len(sub) - 1
    seg_id, seg_end, seg_off = trace_segments(sub)
    node_of, nn = trie_nodes((seg_id, seg_end, seg_off))
    owner = np.repeat(np.arange(len(sub), dtype=np.int64), np.diff(seg_off))
    creator = np.full(nn, len(sub), dtype=np.int64)
    np.minimum.at(creator, node_of, owner)
    starts = np.concatenate([[0], seg_end[:-1]]) if len(seg_end) else seg_end
    starts[seg_off[:-1][seg_off[:-1] < seg_off[1:]]] = 0  # every request's first segment starts at 0
    cover = np.zeros(nn, dtype=np.int64)
    np.maximum.at(cover, node_of, seg_end - starts)
    held, _ = token_prefix_lengths(sub)
    L = int(held[i])
    spans = []
    start = 0
    for s in range(int(seg_off[i]), int(seg_off[i + 1])):
        if start >= L:
            break
        end = int(seg_end[s])
        node = int(node_of[s])
        if int(creator[node]) >= i:
            break
        stop = min(end, L, start + int(cover[node]))  # L bounds it (a cover i itself extended)
        k = int(creator[node])
        if spans and spans[-1]["produced_by_index"] == k and spans[-1]["end"] == start:
            spans[-1]["end"] = stop
        else:
            spans.append({"start": start, "end": stop, "produced_by_index": k})
        if stop < end:
            break
        start = end
    return spans, held


def explain(trace: Trace, spec, pool, request_id: str, *, limit=None, **options) -> dict:
    """Why one request missed what it missed (``--explain REQUEST_ID``; sequential mode).

    Replays the requests before it through a fresh *spec* policy on *pool* one at a time
    (``run_request``, the same life cycle as the sequential replay) and, after each, asks
    the policy what the explained request would hit now (``peek_hit``, side-effect free).
    Each rise of that length is an insertion by the request just run, each fall an
    eviction by it. The infinite token-level cache names the earlier request that first
    computed each reusable span of the prompt.

    Parameters
    ----------
    trace, spec, pool, limit, **options : as for :func:`radixkv.replay.run.run_replay`.
    request_id : str
        The request's id as the trace names it.

    Returns
    -------
    dict: ``request``, ``index`` (replay order), ``arrival_s``, ``prompt_tokens``,
    ``hit_tokens``, ``causes`` (cause → tokens for this request, as the breakdown's
    columns), ``spans`` (list of ``{start, end, produced_by, produced_by_index,
    produced_at_s}``: token ranges of the reusable prefix ``[0, L)`` and the request that
    first computed each), ``history`` (list of ``{after_request, index, arrival_s,
    hittable_before, hittable_after, event}`` with event ``"inserted"`` or ``"evicted"``;
    None when the policy has no ``peek_hit``).

    Raises
    ------
    radixkv.errors.ConfigError
        When no request of the (limited) trace has that id.
    """
    from radixkv.policies.registry import build_policy

    t = trace.head(limit)
    where = np.flatnonzero(t.req_id == str(request_id))
    if where.size == 0:
        raise ConfigError(f"--explain: no request {request_id!r} among the {len(t):,} replayed requests",
                          path=trace.name or None, field="explain")
    i = int(where[0])
    sub = t.head(i + 1)
    raw, held = producer_spans(sub)
    spans = [{"start": sp["start"], "end": sp["end"], "produced_by": str(sub.req_id[sp["produced_by_index"]]),
              "produced_by_index": sp["produced_by_index"],
              "produced_at_s": float(sub.arrival_s[sp["produced_by_index"]])} for sp in raw]
    P = int(sub.prompt_len[i])
    policy = build_policy(spec, pool, unit_tokens=t.unit_tokens, trace=sub, **options)
    seq = sub.kv_seq(i)
    peek = type(policy).can_peek_hit()
    history = [] if peek else None
    before = policy.peek_hit(seq) if peek else 0
    for j in range(i):
        if policy.run_request(j, sub.kv_seq(j)) is None:
            raise ConfigError(f"request {str(sub.req_id[j])!r} was refused by {spec.label}", field="capacity")
        if peek:
            now = policy.peek_hit(seq)
            if now != before:
                history.append({"after_request": str(sub.req_id[j]), "index": j, "arrival_s": float(sub.arrival_s[j]),
                                "hittable_before": int(before), "hittable_after": int(now),
                                "event": "inserted" if now > before else "evicted"})
                before = now
    adm = policy.run_request(i, seq)
    hit = int(adm.hit_tokens) if adm is not None else 0
    held_inf = int(held[i])
    _, hit_unb, aligned, capped, _, _ = _shadows(sub, sub, spec, None, options)
    cols = decompose(np.array([P]), np.array([hit]), np.array([held_inf]), hit_unb[i:i + 1], aligned[i:i + 1],
                     capped[i:i + 1])
    return {"request": str(sub.req_id[i]), "index": i, "arrival_s": float(sub.arrival_s[i]), "prompt_tokens": P,
            "hit_tokens": hit, "causes": {k[5:-7]: int(v[0]) for k, v in cols.items()}, "spans": spans,
            "history": history}


def format_explain(ex: dict) -> str:
    """The human-readable text of :func:`explain`'s answer."""
    lines = [f"request {ex['request']} (#{ex['index']} in replay order, arrival {ex['arrival_s']:.3f} s): "
             f"{ex['prompt_tokens']:,} prompt tokens, {ex['hit_tokens']:,} hit",
             "  causes: " + ", ".join(f"{k} {v:,}" for k, v in ex["causes"].items())]
    if not ex["spans"]:
        lines.append("  no earlier request computed any prefix of this prompt (all compulsory)")
    for sp in ex["spans"]:
        lines.append(f"  tokens [{sp['start']:,}, {sp['end']:,}) first computed by {sp['produced_by']} "
                     f"(#{sp['produced_by_index']}, arrival {sp['produced_at_s']:.3f} s)")
    if ex["history"] is None:
        lines.append("  eviction history: n/a (the policy has no side-effect-free lookup, peek_hit)")
    else:
        for h in ex["history"]:
            verb = "inserted by" if h["event"] == "inserted" else "evicted by"
            lines.append(f"  hittable prefix {h['hittable_before']:,} -> {h['hittable_after']:,} tokens: {verb} "
                         f"{h['after_request']} (#{h['index']}, arrival {h['arrival_s']:.3f} s)")
    return "\n".join(lines)


def causes_at_capacity(trace: Trace, spec, hit_tokens: int, *, limit=None, **options) -> dict:
    """Totals and shares of the miss causes of a replay of *spec* whose Σ hit is *hit_tokens*
    (a point of ``radixkv curve --miss-causes``), without per-request records.

    Every cause but ``capacity`` depends on the shadows only (not on the pool), and
    ``capacity`` = Σ ``H∞`` − Σ ``H``, so one pair of shadows (memoised) serves every
    capacity of a curve. Returns what :func:`radixkv.metrics.summarize_causes` returns (``tokens``,
    ``share``, ``mode``; ``nesting_violations`` is None: it needs per-request rows) plus
    ``unbounded_pool_tokens``.
    """
    t = trace.head(limit)
    held_inf, hit_unb, aligned, capped, pool, _ = _shadows(t, trace, spec, limit, options)
    prompt = int(np.sum(t.prompt_len))
    L, A, C, Hu = (int(np.sum(x)) for x in (held_inf, aligned, capped, hit_unb))
    tokens = {"hit": int(hit_tokens), "compulsory": prompt - L, "capacity": Hu - int(hit_tokens),
              "alignment": L - A, "last_token_cap": A - C, "not_cached": C - Hu}
    share = {c: (v / prompt if prompt else None) for c, v in tokens.items()}
    for c in CONCURRENT_CAUSES:
        tokens[c] = share[c] = None
    return {"mode": "sequential", "tokens": tokens, "share": share, "nesting_violations": None,
            "unbounded_pool_tokens": pool}
