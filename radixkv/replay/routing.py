"""Several replicas behind a request router: per-replica caches, or one global pool.

A deployment of N replicas (data parallelism) puts each request on one replica; with
prefix caching per replica, what a request hits depends on where earlier requests with
the same prefix were sent. The routing decision is :class:`Router` (the caller supplies
each replica's load); the concurrent mode drives it from live in-flight counts
(:mod:`radixkv.replay.multi_concurrent`). This module models the sequential replay:

1. :func:`plan_routes` decides, request by request in replay order, which replica serves
   it (:data:`ROUTERS`). No router here reads the replicas' real caches — exactly as
   SGLang's router, which keeps its own approximate tree — so the whole plan can be made
   before any cache is replayed.
2. :func:`replay_replicas` replays each replica's requests (in replay order) through its
   own fresh policy instance, built from the one registry
   (:func:`radixkv.policies.registry.build_policy`) on the per-replica pool, and merges
   per-replica and aggregate metrics. With ``global_pool=True`` all requests go through
   ONE policy instance on a pool of N × the per-replica capacity instead: the cache a
   distributed KV store shared by all replicas gives (Mooncake FAST'25, §4 and Fig. 10);
   the router then only places compute, so its load imbalance is still reported.

Load (for ``least-load`` and ``prefix-aware``): a replica's load at request *i* is the
number of requests routed to it whose arrival time lies in ``(t_i − load_window_s, t_i]``
— a stand-in for in-flight requests (what SGLang's router counts) in a replay where
requests run one at a time. Ties go to the replica that has received the fewest requests
so far, then to the lowest index.

Routers
-------
``round-robin``  request *i* → replica ``i mod N``.
``random``       uniform, ``numpy.random.default_rng(seed)``.
``least-load``   the replica with the smallest load.
``session``      sticky: the first request of a session goes to the least-loaded replica,
                 later ones follow it. Needs the trace's ``session_id`` (WEKA: one
                 session per conversation file and sub-agent); a trace without one is a
                 :class:`~radixkv.errors.ConfigError`.
``prefix-aware`` SGLang's cache-aware router (sgl-model-gateway ``policies/cache_aware.rs``;
                 defaults from ``sglang_router/router_args.py`` ``RouterArgs``:
                 ``cache_threshold`` 0.3, ``balance_abs_threshold`` 64,
                 ``balance_rel_threshold`` 1.5): when ``max_load − min_load >
                 balance_abs_threshold`` and ``max_load > balance_rel_threshold × min_load``
                 the request goes to the least-loaded replica; otherwise to the replica
                 whose approximate tree matches the longest prefix of the prompt if the
                 matched share exceeds ``cache_threshold``, else to the replica with the
                 smallest tree. The prompt is then inserted into the chosen replica's tree.

The approximate tree (:class:`ApproxTree`) — what is approximate
-----------------------------------------------------------------
* It records what the router SENT to a replica, not what the replica cached: it never
  sees the engine's evictions, its partial-unit tails, or outputs. It forgets by its own
  LRU bound ``max_tree_tokens`` (default: the replica's pool capacity).
* It is keyed by trace units (``Trace.unit_tokens`` tokens each: 512 on Mooncake, 64 on
  WEKA, 1 on token traces) chained into prefix keys; SGLang's router keys characters.
* It evicts at once when over its bound; SGLang's router evicts every
  ``eviction_interval_secs`` (60 s) down to ``max_tree_size`` nodes.
Its memory is reported as the peak number of nodes (units) per replica and
``16`` bytes per node (an 8-byte prefix key and an 8-byte LRU stamp, what a compact
implementation stores; this Python model uses more).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from radixkv.errors import ConfigError
from radixkv.trace.types import Trace

ROUTERS = ("round-robin", "random", "least-load", "session", "prefix-aware")

#: bytes per approximate-tree node reported as the router's memory (see module docstring)
TREE_NODE_BYTES = 16

#: SGLang router defaults (sgl-model-gateway bindings/python/src/sglang_router/router_args.py)
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
#: seconds a request counts toward its replica's load (module docstring, "Load")
LOAD_WINDOW_S = 60.0

_MASK = (1 << 64) - 1


def prefix_keys(ids: np.ndarray) -> list:
    """Prefix-chained keys of one prompt's units: key j stands for units 0..j.

    *ids* : int64 array, shape (k,). Returns a list of k Python ints (64-bit). Equal keys
    ⇔ (up to 64-bit hash collisions) equal unit prefixes.
    """
    out = []
    h = 0x9E3779B97F4A7C15
    for x in ids.tolist():
        h = hash((h, x)) & _MASK
        out.append(h)
    return out


class ApproxTree:
    """A router's approximate radix tree of one replica, keyed by unit prefixes.

    Stored as prefix keys in LRU order. A request touches its keys deepest-first, so a
    parent is always at least as recent as any child and eviction (oldest first) removes
    leaves before their parents: the stored set stays prefix-closed, which lets
    :meth:`match` binary-search the matched length.

    Parameters
    ----------
    max_nodes : int
        The LRU bound in nodes (units); ≥ 1.
    """

    def __init__(self, max_nodes: int):
        if max_nodes < 1:
            raise ConfigError(f"approximate tree bound must be ≥ 1 node, got {max_nodes}", field="max_tree_tokens")
        self.max_nodes = int(max_nodes)
        self._lru: OrderedDict = OrderedDict()
        self.peak_nodes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, keys: list) -> int:
        """Number of leading units of *keys* stored (binary search; the set is prefix-closed)."""
        lo, hi = 0, len(keys)
        d = self._lru
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if keys[mid - 1] in d:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def insert(self, keys: list) -> None:
        """Record a prompt's units (touch deepest-first), then evict LRU nodes over the bound."""
        d = self._lru
        for k in reversed(keys):
            if k in d:
                d.move_to_end(k)
            else:
                d[k] = None
        while len(d) > self.max_nodes:
            d.popitem(last=False)
        self.peak_nodes = max(self.peak_nodes, len(d))


@dataclass
class RoutePlan:
    """Where each request goes.

    Attributes
    ----------
    replica : np.ndarray, int64, shape (n,)
        Replica index of each request in replay order.
    n_replicas : int
    router : str
    stats : dict
        ``requests_per_replica`` (list of ints), ``load_imbalance`` (max / mean requests
        per replica), and for ``prefix-aware``: ``balanced_routes`` (requests sent by the
        load rule), ``cache_routes`` (by the match rule), ``smallest_tree_routes``,
        ``tree_nodes_peak`` (per replica), ``tree_bytes_peak`` (sum, at
        :data:`TREE_NODE_BYTES` per node); otherwise these are None.
    """

    replica: np.ndarray
    n_replicas: int
    router: str
    stats: dict = field(default_factory=dict)


def _check(trace: Trace, n_replicas: int, router: str):
    if int(n_replicas) < 1:
        raise ConfigError(f"--replicas must be ≥ 1, got {n_replicas}", field="replicas")
    if router not in ROUTERS:
        raise ConfigError(f"unknown router {router!r}; known: {', '.join(ROUTERS)}", field="router")
    if router == "session" and trace.session_id is None:
        raise ConfigError(f"router 'session' needs session ids and trace {trace.name!r} has none "
                          f"(WEKA traces have them; Mooncake's do not)", path=trace.name or None, field="router")


def _check_knobs(seed, cache_threshold, balance_abs_threshold, balance_rel_threshold):
    """The router's numeric knobs, checked where every caller (CLI, API, sequential plan,
    concurrent replay) passes: a negative seed made numpy raise a bare ValueError, and a
    share outside [0, 1] or a negative/NaN threshold silently disabled a rule."""
    if int(seed) != seed or seed < 0:
        raise ConfigError(f"--router-seed must be an integer ≥ 0, got {seed}", field="router_seed")
    if not 0.0 <= float(cache_threshold) <= 1.0:  # NaN fails too
        raise ConfigError(f"--cache-threshold is a share of the prompt in [0, 1], got {cache_threshold}",
                          field="cache_threshold")
    if not 0.0 <= float(balance_abs_threshold) < float("inf"):
        raise ConfigError(f"--balance-abs-threshold must be a finite number of requests ≥ 0, got "
                          f"{balance_abs_threshold}", field="balance_abs_threshold")
    if not 0.0 < float(balance_rel_threshold) < float("inf"):
        raise ConfigError(f"--balance-rel-threshold must be a finite load ratio > 0, got {balance_rel_threshold}",
                          field="balance_rel_threshold")


class Router:
    """The routing decision of one run, request by request (module docstring, "Routers").

    Shared by the sequential plan (:func:`plan_routes`, load = the window count) and the
    concurrent multi-replica replay (:mod:`radixkv.replay.multi_concurrent`, load = the
    requests in flight on each replica at the arrival time): each caller supplies the
    load; the router keeps what it needs itself (requests sent per replica, sticky
    sessions, approximate trees).

    Parameters
    ----------
    trace : Trace
        The requests, in replay order (row *i* of :meth:`choose` is a row of it).
    n_replicas : int
    router : str
        One of :data:`ROUTERS`.
    seed, cache_threshold, balance_abs_threshold, balance_rel_threshold, max_tree_tokens, capacity_tokens
        As in :func:`plan_routes`.

    Attributes
    ----------
    needs_load : bool
        Whether :meth:`choose` reads its *load* argument (least-load, session, prefix-aware
        with N > 1).
    total : np.ndarray, int64, shape (N,)
        Requests sent to each replica so far (the first tie-break after load).

    Raises
    ------
    ConfigError
        As :func:`plan_routes`.
    """

    def __init__(self, trace: Trace, n_replicas: int, router: str, *, seed: int = 0,
                 cache_threshold: float = CACHE_THRESHOLD, balance_abs_threshold: float = BALANCE_ABS_THRESHOLD,
                 balance_rel_threshold: float = BALANCE_REL_THRESHOLD, max_tree_tokens: int | None = None,
                 capacity_tokens: int | None = None):
        _check(trace, n_replicas, router)
        _check_knobs(seed, cache_threshold, balance_abs_threshold, balance_rel_threshold)
        self.trace = trace
        self.n = N = int(n_replicas)
        self.router = router
        self.total = np.zeros(N, dtype=np.int64)
        self.needs_load = N > 1 and router in ("least-load", "session", "prefix-aware")
        self._draws = np.random.default_rng(seed).integers(0, N, size=len(trace)) if router == "random" and N > 1 else None
        self._sticky: dict = {}
        self._trees = None
        self._counts = None
        self._thr = (float(cache_threshold), float(balance_abs_threshold), float(balance_rel_threshold))
        if router == "prefix-aware" and N > 1:
            bound = max_tree_tokens if max_tree_tokens is not None else capacity_tokens
            nodes = (1 << 62) if bound is None else int(bound) // trace.unit_tokens
            self._trees = [ApproxTree(nodes) for _ in range(N)]
            self._counts = {"balanced_routes": 0, "cache_routes": 0, "smallest_tree_routes": 0}

    def _least(self, load) -> int:
        total = self.total
        return min(range(self.n), key=lambda r: (load[r], total[r], r))

    def choose(self, i: int, load=None) -> int:
        """The replica of request row *i*; records the decision.

        *load* : int64 array, shape (N,), each replica's load now (read only when
        :attr:`needs_load`). Returns an int in [0, N).
        """
        N = self.n
        rt = self.router
        if N == 1:
            r = 0
        elif rt == "round-robin":
            r = i % N
        elif rt == "random":
            r = int(self._draws[i])
        elif rt == "least-load":
            r = self._least(load)
        elif rt == "session":
            s = self.trace.session_id[i]
            r = self._sticky.get(s)
            if r is None:
                r = self._sticky[s] = self._least(load)
        else:
            cache_thr, abs_thr, rel_thr = self._thr
            trees, counts, total = self._trees, self._counts, self.total
            keys = prefix_keys(self.trace.prompt_ids(i))
            mx, mn = int(load.max()), int(load.min())
            if mx - mn > abs_thr and mx > rel_thr * mn:
                r = self._least(load)
                counts["balanced_routes"] += 1
            else:
                m = [tr.match(keys) for tr in trees]
                best = max(range(N), key=lambda q: (m[q], -load[q], -total[q], -q))
                if keys and m[best] / len(keys) > cache_thr:
                    r = best
                    counts["cache_routes"] += 1
                else:
                    r = min(range(N), key=lambda q: (len(trees[q]), load[q], total[q], q))
                    counts["smallest_tree_routes"] += 1
            trees[r].insert(keys)
        self.total[r] += 1
        return int(r)

    def stats(self) -> dict:
        """``balanced_routes``, ``cache_routes``, ``smallest_tree_routes``,
        ``tree_nodes_peak`` (per replica), ``tree_bytes_peak`` for ``prefix-aware`` with
        N > 1; None otherwise (:class:`RoutePlan`)."""
        st: dict = {"balanced_routes": None, "cache_routes": None, "smallest_tree_routes": None,
                    "tree_nodes_peak": None, "tree_bytes_peak": None}
        if self._trees is not None:
            st.update(self._counts)
            st["tree_nodes_peak"] = [tr.peak_nodes for tr in self._trees]
            st["tree_bytes_peak"] = TREE_NODE_BYTES * sum(tr.peak_nodes for tr in self._trees)
        return st


def plan_routes(
    trace: Trace,
    n_replicas: int,
    router: str,
    *,
    seed: int = 0,
    limit: int | None = None,
    load_window_s: float = LOAD_WINDOW_S,
    cache_threshold: float = CACHE_THRESHOLD,
    balance_abs_threshold: float = BALANCE_ABS_THRESHOLD,
    balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
    max_tree_tokens: int | None = None,
    capacity_tokens: int | None = None,
) -> RoutePlan:
    """Route every request of *trace* (first *limit*) to one of *n_replicas* replicas.

    Parameters
    ----------
    router : str
        One of :data:`ROUTERS` (module docstring).
    seed : int
        ``random``'s seed.
    load_window_s : float
        Seconds a request counts toward its replica's load.
    cache_threshold, balance_abs_threshold, balance_rel_threshold : float
        ``prefix-aware``'s thresholds (SGLang router names and defaults).
    max_tree_tokens : int or None
        ``prefix-aware``'s approximate-tree bound per replica, tokens (rounded down to
        units); default *capacity_tokens*, or unbounded when that is None too.

    Raises
    ------
    ConfigError
        For ``n_replicas < 1``, an unknown router, ``session`` on a trace without session
        ids, a non-positive tree bound, a negative seed, ``cache_threshold`` outside [0, 1],
        a negative ``balance_abs_threshold``, a non-positive ``balance_rel_threshold`` or
        ``load_window_s``, or a NaN/infinite threshold.
    """
    if not 0.0 < float(load_window_s) < float("inf"):  # NaN fails too
        raise ConfigError(f"--router-load-window must be a finite number of seconds > 0, got {load_window_s}",
                          field="router_load_window")
    t = trace.head(limit)
    ro = Router(t, n_replicas, router, seed=seed, cache_threshold=cache_threshold,
                balance_abs_threshold=balance_abs_threshold, balance_rel_threshold=balance_rel_threshold,
                max_tree_tokens=max_tree_tokens, capacity_tokens=capacity_tokens)
    n, N = len(t), ro.n
    rep = np.zeros(n, dtype=np.int64)
    if not ro.needs_load:
        for i in range(n):
            rep[i] = ro.choose(i)
    else:
        arr = np.asarray(t.arrival_s, dtype=np.float64)
        window: list = []  # (arrival, replica) of requests still counted, oldest first
        head = 0
        load = np.zeros(N, dtype=np.int64)
        for i in range(n):
            ti = arr[i]
            while head < len(window) and window[head][0] <= ti - load_window_s:
                load[window[head][1]] -= 1
                head += 1
            r = ro.choose(i, load)
            rep[i] = r
            load[r] += 1
            window.append((ti, r))
    stats = ro.stats()
    per = np.bincount(rep, minlength=N)
    stats["requests_per_replica"] = per.tolist()
    stats["load_imbalance"] = float(per.max() / per.mean()) if n else None
    return RoutePlan(replica=rep, n_replicas=N, router=router, stats=stats)


def take(trace: Trace, idx: np.ndarray) -> Trace:
    """The requests *idx* (int64 array, shape (k,), increasing) of *trace* as a new trace,
    in that order (request ids, sessions and outputs kept)."""
    idx = np.asarray(idx, dtype=np.int64)
    o = trace.id_offsets
    lens = o[idx + 1] - o[idx]
    parts = [trace.ids[o[i]:o[i + 1]] for i in idx.tolist()]
    ids = np.concatenate(parts) if parts else trace.ids[:0]
    offs = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    out_ids = out_offs = None
    if trace.out_ids is not None:
        oo = trace.out_offsets
        oparts = [trace.out_ids[oo[i]:oo[i + 1]] for i in idx.tolist()]
        out_ids = np.concatenate(oparts) if oparts else trace.out_ids[:0]
        out_offs = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(oo[idx + 1] - oo[idx], out=out_offs[1:])
    return Trace(
        req_id=trace.req_id[idx], arrival_s=trace.arrival_s[idx], prompt_len=trace.prompt_len[idx],
        output_len=trace.output_len[idx], ids=ids, id_offsets=offs, unit_tokens=trace.unit_tokens,
        partial_last_unit=trace.partial_last_unit, out_ids=out_ids, out_offsets=out_offs,
        session_id=None if trace.session_id is None else trace.session_id[idx],
        turn=None if trace.turn is None else trace.turn[idx], name=trace.name,
    )


def global_pool_spec(pool, n_replicas: int):
    """The pool of *n_replicas* × *pool*, in the same terms: N × ``capacity_tokens``,
    N × ``max_total_num_tokens``, or vLLM's ``N × (num_gpu_blocks − 1) + 1`` (one null block)."""
    from radixkv.policies.registry import PoolSpec

    N = int(n_replicas)
    if pool.capacity_tokens is not None:
        return PoolSpec(capacity_tokens=N * int(pool.capacity_tokens))
    if pool.max_total_num_tokens is not None:
        return PoolSpec(max_total_num_tokens=N * int(pool.max_total_num_tokens))
    if pool.num_gpu_blocks is not None:
        return PoolSpec(num_gpu_blocks=N * (int(pool.num_gpu_blocks) - 1) + 1)
    raise ConfigError("no pool size given", field="capacity")


#: summary keys added up over replicas (token and request counts)
_SUM_KEYS = ("requests", "pool_capacity_tokens", "prompt_tokens", "hit_tokens", "computed_prompt_tokens",
             "held_tokens", "evicted_tokens", "alignment_loss_tokens")


#: per-tier token counts that add up over replicas (radixkv.policies.host_tier)
_TIER_SUM_KEYS = ("host_capacity_tokens", "device_hit_tokens", "host_hit_tokens", "host_loaded_tokens",
                  "gpu_to_host_tokens", "host_to_gpu_tokens", "host_evicted_tokens", "storage_hit_tokens",
                  "host_to_storage_tokens", "storage_to_host_tokens", "storage_evicted_tokens")


def tier_totals(replicas: list, prompt_tokens: int) -> dict:
    """The host (and L3 storage) tier keys over *replicas* (their summaries): token
    counts and capacities summed, ``host_hit_rate`` / ``storage_hit_rate`` over all
    *prompt_tokens*; a key the replicas report as None (no such tier) stays None, and
    ``storage_capacity_tokens`` is None (unbounded) when any replica's is. Bytes are
    filled later from the model (:func:`radixkv.replay.spec.run`)."""
    from radixkv.metrics import HOST_TIER_KEYS, STORAGE_TIER_KEYS

    out = dict.fromkeys(HOST_TIER_KEYS + STORAGE_TIER_KEYS)
    if not replicas:
        return out
    for k in _TIER_SUM_KEYS:
        vals = [r.get(k) for r in replicas]
        if all(v is not None for v in vals):
            out[k] = int(sum(vals))
    if out["host_loaded_tokens"] is not None:
        out["host_hit_rate"] = out["host_loaded_tokens"] / prompt_tokens if prompt_tokens else None
    if replicas[0].get("storage_backend") is not None:
        out["storage_backend"] = replicas[0]["storage_backend"]
        caps = [r.get("storage_capacity_tokens") for r in replicas]
        out["storage_capacity_tokens"] = None if any(c is None for c in caps) else int(sum(caps))
        out["storage_hit_rate"] = out["storage_hit_tokens"] / prompt_tokens if prompt_tokens else None
    return out


def replay_replicas(
    trace: Trace,
    spec,
    pool,
    n_replicas: int,
    router: str,
    *,
    global_pool: bool = False,
    limit: int | None = None,
    quiet: bool = True,
    plan: RoutePlan | None = None,
    **router_options,
) -> dict:
    """Replay *trace* over *n_replicas* replicas of policy *spec*, each on *pool*.

    Parameters
    ----------
    spec : radixkv.policies.registry.PolicySpec
    pool : radixkv.policies.registry.PoolSpec
        ONE replica's pool (``capacity_tokens`` for the global mode).
    global_pool : bool
        One shared pool of ``n_replicas × capacity_tokens`` for all requests (the
        router still places compute; hits do not depend on it).
    plan : RoutePlan or None
        A plan already made by :func:`plan_routes` (default: made here).
    **router_options
        Passed to :func:`plan_routes`.

    Returns
    -------
    dict
        ``aggregate`` (local: token and request counts and cached tokens summed over
        replicas, ``token_hit_rate``, ``request_hit_rate``, ``mean_request_hit_ratio`` and
        ``alignment_loss_share`` over all requests; pool-shape metrics that do not add up
        across pools are not in it; global: the one pool's whole summary), ``replicas`` (one
        :func:`radixkv.metrics.summarize` dict per replica; None for a replica that got no
        request; empty in the global mode), ``routing`` (:attr:`RoutePlan.stats`),
        ``hit_tokens`` (np.ndarray int64, shape (n,): per request, replay order),
        ``n_replicas``, ``router``, ``kv_pool`` ("local" or "global").
        ``aggregate["pool_capacity_tokens"]`` is the sum of the replicas' pools (local) or
        the global pool's.

    Raises
    ------
    ConfigError
        From :func:`plan_routes`, the registry (pool) or the replay (a request larger than
        a replica's pool).
    """
    from radixkv.replay.run import run_replay

    t = trace.head(limit)
    if plan is None:
        plan = plan_routes(t, n_replicas, router, capacity_tokens=pool.capacity_tokens, **router_options)
    N = plan.n_replicas
    n = len(t)
    hit = np.zeros(n, dtype=np.int64)
    prompt = np.asarray(t.prompt_len, dtype=np.int64)
    per: list = []
    if global_pool:
        rec, s = run_replay(t, spec, global_pool_spec(pool, N), quiet=quiet)
        hit[:] = rec["hit_tokens"]
        sums = {k: v for k, v in s.items() if k != "timing_s"}  # one pool: every metric holds
    else:
        sums = dict.fromkeys(_SUM_KEYS, 0)
        for r in range(N):
            idx = np.flatnonzero(plan.replica == r)
            if idx.size == 0:
                per.append(None)
                continue
            rec, s = run_replay(take(t, idx), spec, pool, quiet=quiet)
            hit[idx] = rec["hit_tokens"]
            s["replica"] = r
            per.append(s)
            for k in _SUM_KEYS:
                sums[k] += s[k]
    agg = dict(sums)
    if not global_pool:
        agg["alignment_loss_share"] = agg["alignment_loss_tokens"] / agg["prompt_tokens"] if agg["prompt_tokens"] else 0.0
        cap = [r["cached_tokens_second_half_mean"] for r in per if r is not None]
        agg["cached_tokens_second_half_mean"] = float(sum(cap))
        agg["cached_tokens_share_of_pool"] = float(sum(cap)) / agg["pool_capacity_tokens"]
    if not global_pool:
        agg.update(tier_totals([r for r in per if r is not None], int(agg["prompt_tokens"])))
    agg["policy"] = spec.label
    agg["token_hit_rate"] = float(hit.sum() / prompt.sum()) if prompt.sum() else 0.0
    agg["request_hit_rate"] = float((hit > 0).mean()) if n else 0.0
    agg["mean_request_hit_ratio"] = float(np.mean(hit / prompt)) if n else 0.0
    return {"n_replicas": N, "router": plan.router, "kv_pool": "global" if global_pool else "local",
            "aggregate": agg, "replicas": per, "routing": plan.stats, "hit_tokens": hit}
