"""Miss causes of the concurrent and multi-replica replays (docs/miss-causes.md).

The sequential breakdown (:mod:`radixkv.replay.misses`) explains each prompt token against
shadows replayed in trace order. In the concurrent modes a request's hit is taken at its
*first admission*, when requests admitted before it may still be running (their KV not in
the cache yet) and, with replicas, may have run on another replica. Here the same causes
are computed against shadows replayed in **first-admission order**, and three more split
the gap between what those shadows would hit and what the request hit:

``L, A, C, H∞``  as in the sequential breakdown, over the requests admitted before it
                 (every one of them complete, prompt and outputs, and inserted);
``G``            what it would hit, under the engine's rule, from the content actually
                 *inserted* into any replica's cache by the moment of its admission, on
                 memory that never evicts (``min(H∞, rule(L_ins))``);
``Lo``           the same from the content inserted into its own replica's cache only
                 (``min(G, rule(L_local))``; ``= G`` with one replica);
``H``            its actual hit.

Then ``hit + compulsory + alignment + last_token_cap + not_cached + in_flight + routing +
capacity + preemption = P`` per request, exactly (before preemption is carved out, as
below)::

    in_flight = H∞ − G   computed (or to be computed) by an earlier-admitted request that
                         had not inserted it yet: same prefill batch, a chunk not yet
                         inserted, outputs not yet generated
    routing   = G − Lo   inserted, but in another replica's cache (None with one replica)
    capacity  = Lo − H   inserted into this replica's cache and evicted since

**Preemption** is part of the split. A request's hit is its *first admission's* (the hit
rate counts first admissions, docs/SEMANTICS.md; vLLM's per-request cached tokens are
those of the first scheduled prefill, SGLang's stop counting at the first retraction). The
causes above are position ranges of the prompt (capacity ``[H, Lo)``, routing ``[Lo, G)``,
in-flight ``[G, H∞)``, not cached ``[H∞, C)``, last-token cap ``[C, A)``, alignment
``[A, L)``, compulsory ``[L, P)``). A request preempted (vLLM) or retracted (SGLang) and
re-admitted computes positions ``[h_j, e_j)`` at its j-th admission (``h_j`` its hit then,
``e_j`` its computed KV when preempted; the final admission to ``P``). ``preemption`` =
the positions ``≥ H`` computed by two or more admissions — prompt tokens it had computed
itself and computed again — and each is moved out of the cause whose range holds it
(:func:`carve_preemption`), so the causes still sum to ``P``. Generated tokens computed
again are not prompt tokens: the replay's ``recomputed_tokens`` counts all of them.

When content becomes *inserted* (visible to a lookup) follows the policy's calls in the
replay (:mod:`radixkv.replay.scheduler`): with SGLang's rules and a policy that defers
insertion (``batch_visibility``: :class:`~radixkv.policies.radix.RadixCache`), a prefill
chunk is inserted after its step (``cache_unfinished_req``), decoded tokens at the finish
(``cache_finished_req``), a retraction inserts nothing; otherwise (vLLM's rules,
``BlockHashCache``) the KV of a chunk or decode is hittable from the moment the step
schedules it (``kv_cache_manager.allocate_slots`` → ``cache_blocks``), so a request
admitted later in the same step can hit an earlier admission's first chunk.

The events are recorded by a :class:`MissRecorder` the replay loops call once per engine
step (``replay_concurrent(..., recorder=...)``; the replicas' loop likewise) — the
compiled loops record the same events inside the loop
(:mod:`radixkv.replay._miss_rec_kernels`) and hand them over at the end
(:meth:`MissRecorder.take_compiled`) — and replayed afterwards in time order over a trie
of the trace's KV extents built once (:func:`trie_nodes`; per-node covers, one set per
replica), in Numba. Decode growth of vLLM-rule requests is flushed into the event stream
lazily — at every admission on the same replica and at the finish — so a replica's own
view is exact and another replica's running decode tokens count from that replica's last
admission on (a lower bound of the global view, which can only move tokens from routing to
in_flight).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from radixkv.errors import ConfigError
from radixkv.replay._miss_kernels import trace_segments, trie_nodes
from radixkv.replay.misses import MISS_COLUMNS

#: per-request columns the concurrent breakdown adds beside :data:`radixkv.replay.misses.MISS_COLUMNS`
#: (int64, tokens); ``miss_routing_tokens`` is written only with replicas
CONCURRENT_COLUMNS = {
    "miss_in_flight_tokens": "prompt tokens an earlier-admitted request had computed or would compute but not "
                             "inserted at this request's first admission",
    "miss_routing_tokens": "prompt tokens inserted in another replica's cache, not this one's",
    "miss_preemption_tokens": "prompt tokens the request had computed itself and computed again after a "
                              "preemption/retraction (moved out of the cause of their position)",
}

_QUERY = 0
_INSERT = 1


class MissRecorder:
    """Records what one engine's steps insert into its cache, for the concurrent miss
    causes. Called by the replay loop once per scheduled step (:meth:`step`); holds
    nothing the replay reads.

    Parameters
    ----------
    trace : radixkv.trace.Trace
        The whole trace (rows are global request rows).
    policy : radixkv.policies.base.PrefixCache
        The engine's policy (read: ``batch_visibility``).
    config : radixkv.replay.scheduler.SchedulerConfig
        The scheduler knobs (read: the admission rule).
    replica : int
        The engine's replica index (0 for the single-engine replay).
    """

    def __init__(self, trace, policy, config, replica: int = 0):
        from radixkv.replay.scheduler import admission_rule_of

        rule = config.admission if config.admission is not None else admission_rule_of(policy)
        self.deferred = rule == "sglang" and bool(getattr(policy, "batch_visibility", False))
        self.replica = int(replica)
        n = len(trace)
        self.kv_len = (np.asarray(trace.prompt_len, dtype=np.int64)
                       + np.maximum(np.asarray(trace.output_len, dtype=np.int64) - 1, 0)).tolist()
        self.comp = [0] * n  # KV tokens computed by the current admission
        self.sent = [0] * n  # extent already in the event stream
        self.pend: dict = {}  # preempted request -> tokens it had computed
        #: hit (= context of the first prefill chunk) of each request's current admission; −1
        #: before its first prefill chunk and after a preemption
        self.start = [-1] * n
        #: request -> [(hit, computed)] of each of its admissions that ended in a preemption
        #: or retraction (tokens: the admission computed KV positions [hit, computed))
        self.runs: dict = {}
        self.dirty: set = set()
        self.t: list = []
        self.kind: list = []
        self.req: list = []
        self.ext: list = []
        self._compiled = None  # events handed over by a compiled loop (take_compiled)

    def _emit(self, t, kind, r, e):
        self.t.append(t)
        self.kind.append(kind)
        self.req.append(r)
        self.ext.append(e)

    def _insert(self, t, r, e):
        if e > self.sent[r]:
            self.sent[r] = e
            self._emit(t, _INSERT, r, e)

    def _flush(self, t):
        comp = self.comp
        for r in sorted(self.dirty):
            self._insert(t, r, comp[r])
        self.dirty.clear()

    def _prefill(self, r: int, c: int) -> None:
        """A prefill chunk of request *r* from context *c*: the first of an admission sets
        its hit."""
        if self.start[r] < 0:
            self.start[r] = c

    def _preempted(self, v: int) -> None:
        """Request *v* is preempted (vLLM) or retracted (SGLang): close its admission's run."""
        if self.start[v] >= 0:
            self.runs.setdefault(v, []).append((self.start[v], self.comp[v]))
        self.start[v] = -1

    def admission_runs(self) -> dict:
        """Request -> [(hit, computed)] per admission, for the requests admitted more than
        once: the runs of :attr:`runs` (admissions ended by a preemption), then the final
        admission's ``(hit, −1)`` (it computes its whole prompt; −1 when it never reached a
        prefill chunk). Tokens, KV positions from 0."""
        return {r: list(v) + [(self.start[r], -1)] for r, v in self.runs.items()}

    def step(self, t_start: float, t_end: float, plan, k: int, admitted, finished) -> None:
        """One iteration of the replay loop.

        Parameters
        ----------
        t_start, t_end : float
            Seconds: when the step (or fast-forwarded run) started and ended.
        plan : radixkv.replay.scheduler.StepPlan
            The step as applied (``req``, ``new``, ``ctx``, ``prefill``, ``preempted_rows``).
        k : int
            Steps it stands for (a fast-forwarded run of *k* identical decode steps; 0 for
            an empty plan).
        admitted : list of int
            Requests first admitted by this schedule call, in admission order.
        finished : list of int
            Requests that finished in it.
        """
        comp, pend = self.comp, self.pend
        for v in plan.preempted_rows:
            if not self.deferred and v in self.dirty:  # vLLM: its hashed blocks stay cached
                self.dirty.discard(v)
                self._insert(t_start, v, comp[v])
            pend[v] = max(pend.get(v, 0), comp[v])
            self._preempted(v)
            comp[v] = 0
        adm = set(admitted) if admitted else ()
        if self.deferred:
            for r in admitted:
                self._emit(t_start, _QUERY, r, 0)
            for r, n, c, pre in zip(plan.req, plan.new, plan.ctx, plan.prefill):
                if pre:
                    if pend and r in pend:
                        pend.pop(r)
                    self._prefill(r, c)
                    comp[r] = c + n
                    self._insert(t_end, r, c + n)
                else:
                    comp[r] = c + n * k
            for r in finished:
                self._insert(t_end, r, self.kv_len[r])
            return
        dirty = self.dirty
        for r, n, c, pre in zip(plan.req, plan.new, plan.ctx, plan.prefill):
            if r in adm:
                adm.discard(r)
                self._flush(t_start)
                self._emit(t_start, _QUERY, r, 0)
            elif pre and pend and r in pend:
                pend.pop(r)
            if pre:
                self._prefill(r, c)
            comp[r] = c + (n if pre else n * k)
            dirty.add(r)
        for r in admitted:  # admitted, then preempted in the same step (no item left)
            if r in adm:
                self._flush(t_start)
                self._emit(t_start, _QUERY, r, 0)
        for r in finished:
            dirty.discard(r)
            self._insert(t_end, r, comp[r])

    def take_compiled(self, rec) -> None:
        """Take what a compiled loop recorded (:mod:`radixkv.replay._miss_rec_kernels`:
        the arrays of ``new_state``, filled by ``rec_step``): its events become
        :meth:`events`, and its preemption facts are replayed through the same
        bookkeeping as :meth:`step` (``_fact_preempt``, ``_fact_chunk``). The recorder
        must not have been told any step."""
        import radixkv.replay._miss_rec_kernels as MR

        if self.t or self._compiled is not None:
            raise RuntimeError("MissRecorder.take_compiled: this recorder already holds events")
        RS, _, _, EVT, EVI, FI = rec[:6]
        m = int(RS[MR.RS_NEV])
        self._compiled = (EVT[:m].copy(), EVI[0, :m].copy(), EVI[1, :m].copy(), EVI[2, :m].copy())
        for code, r, a, b in FI[:int(RS[MR.RS_NFACT])].tolist():
            if code == MR.FACT_PREEMPT:
                self._fact_preempt(r, a, b)
            else:
                self._fact_chunk(r, a)

    def _fact_preempt(self, v: int, comp: int, start: int) -> None:
        """Request *v* was preempted holding *comp* KV tokens of its current admission, whose
        first prefill chunk started at context *start* (−1: none) — what :meth:`step` does
        with a row of ``plan.preempted_rows``."""
        self.pend[v] = max(self.pend.get(v, 0), comp)
        self.start[v] = start
        self.comp[v] = comp
        self._preempted(v)
        self.comp[v] = 0

    def _fact_chunk(self, r: int, c: int) -> None:
        """The first prefill chunk of *r*'s re-admission after a preemption, from context
        *c* — what :meth:`step` does with it."""
        self.pend.pop(r, None)
        self._prefill(r, c)

    @property
    def records_in_compiled_loop(self) -> bool:
        """Whether a compiled loop may record for it (:meth:`take_compiled`): only when
        :meth:`step` is this class's (a subclass that follows the replay step by step, as
        ``conc_explain.ExplainRecorder`` does, keeps the Python loop)."""
        return type(self).step is MissRecorder.step

    def events(self):
        """(t, kind, req, ext) arrays of the recorded events, in recording order."""
        if self._compiled is not None:
            return self._compiled
        return (np.asarray(self.t, dtype=np.float64), np.asarray(self.kind, dtype=np.int64),
                np.asarray(self.req, dtype=np.int64), np.asarray(self.ext, dtype=np.int64))


@nb.njit(cache=True)
def _walk(node_of, seg_end, cover, base, s0, s1):
    """Longest token run from position 0 of the segments ``s0:s1`` that *cover* holds
    (nodes offset by *base*)."""
    start = 0
    for s in range(s0, s1):
        end = seg_end[s]
        m = cover[base + node_of[s]]
        if m < end - start:
            return start + m
        start = end
    return start


@nb.njit(cache=True)
def _cover_to(node_of, seg_end, cover, base, s0, s1, x):
    """Make *cover* hold the first *x* tokens of the segments ``s0:s1`` (nodes offset by *base*)."""
    start = 0
    for s in range(s0, s1):
        if start >= x:
            break
        end = seg_end[s]
        run = (end if end < x else x) - start
        nd = base + node_of[s]
        if cover[nd] < run:
            cover[nd] = run
        start = end


@nb.njit(cache=True)
def _events_kernel(node_of, seg_end, seg_off, prompt_len, kv_len, kind, req, ext, root, nnodes, full, cover,
                   coverF, held, held_adm):
    """Replay the events through the trie's covers: an insert makes ``cover`` hold request
    ``req[e]``'s first ``ext[e]`` KV tokens below root ``root[e]`` (node ids offset by
    ``root[e] · nnodes``); a query writes ``held[r]``, the prompt prefix ``cover`` holds
    below ``root[e]``, and when *full*, ``held_adm[r]`` (the prefix the complete extents of
    the requests queried before hold: ``coverF``, one root), then makes ``coverF`` hold
    r's whole extent."""
    for e in range(kind.shape[0]):
        r = req[e]
        s0 = seg_off[r]
        s1 = seg_off[r + 1]
        base = root[e] * nnodes
        if kind[e] == 1:
            _cover_to(node_of, seg_end, cover, base, s0, s1, ext[e])
            continue
        P = prompt_len[r]
        h = _walk(node_of, seg_end, cover, base, s0, s1)
        held[r] = h if h < P else P
        if full:
            h = _walk(node_of, seg_end, coverF, 0, s0, s1)
            held_adm[r] = h if h < P else P
            _cover_to(node_of, seg_end, coverF, 0, s0, s1, kv_len[r])


def replay_events(trace, segs, kind, req, ext, root, n_roots: int, full: bool, nodes=None):
    """Run :func:`_events_kernel` over sorted events.

    *nodes*: :func:`trie_nodes` of *segs* when already built (else built here).

    Returns
    -------
    (held, held_adm) : int64 arrays of shape (n,), tokens (``held_adm`` all zero unless
    *full*); −1 for a request never queried.
    """
    seg_id, seg_end, seg_off = segs
    node_of, nn = trie_nodes(segs) if nodes is None else nodes
    n = len(trace)
    cover = np.zeros(int(n_roots) * nn, dtype=np.int64)
    coverF = np.zeros(nn if full else 1, dtype=np.int64)
    held = np.full(n, -1, dtype=np.int64)
    held_adm = np.full(n, -1, dtype=np.int64)
    plen = np.asarray(trace.prompt_len, dtype=np.int64)
    kvl = plen + np.maximum(np.asarray(trace.output_len, dtype=np.int64) - 1, 0)
    _events_kernel(node_of, seg_end, seg_off, plen, kvl, kind, req, ext, np.asarray(root, dtype=np.int64), nn,
                   full, cover, coverF, held, held_adm)
    return held, held_adm


def _permuted(trace, order):
    """*trace* with its requests in *order* (int64 array of rows)."""
    from radixkv.trace.types import Trace

    order = np.asarray(order, dtype=np.int64)
    off = np.asarray(trace.id_offsets, dtype=np.int64)
    cnt = off[1:] - off[:-1]
    new_off = np.concatenate([[0], np.cumsum(cnt[order])]).astype(np.int64)
    idx = np.concatenate([np.arange(off[r], off[r + 1]) for r in order]) if len(order) else np.zeros(0, np.int64)
    out_ids = out_off = None
    if trace.out_ids is not None:
        oo = np.asarray(trace.out_offsets, dtype=np.int64)
        oc = oo[1:] - oo[:-1]
        out_off = np.concatenate([[0], np.cumsum(oc[order])]).astype(np.int64)
        oidx = np.concatenate([np.arange(oo[r], oo[r + 1]) for r in order]) if len(order) else np.zeros(0, np.int64)
        out_ids = np.asarray(trace.out_ids)[oidx.astype(np.int64)]
    return Trace(req_id=np.asarray(trace.req_id)[order], arrival_s=np.asarray(trace.arrival_s)[order],
                 prompt_len=np.asarray(trace.prompt_len)[order], output_len=np.asarray(trace.output_len)[order],
                 ids=np.asarray(trace.ids)[idx.astype(np.int64)], id_offsets=new_off, unit_tokens=trace.unit_tokens,
                 partial_last_unit=trace.partial_last_unit, out_ids=out_ids, out_offsets=out_off,
                 name=trace.name)


def concurrent_causes(trace, spec, recorders, hit, replica=None, **options) -> dict:
    """The per-request miss causes of a finished concurrent replay (module docstring).

    Parameters
    ----------
    trace : radixkv.trace.Trace
        The trace replayed (the rows of the replay).
    spec : radixkv.policies.registry.PolicySpec
        The policy replayed (its capacity shadow is replayed in first-admission order).
    recorders : list of MissRecorder
        One per replica (index = replica), as the replay filled them.
    hit : np.ndarray, int64, shape (n,)
        The replay's first-admission hits (``hit_tokens``).
    replica : np.ndarray of int64, shape (n,), or None
        Each request's replica (None: one engine).
    **options
        The policy constructor options (the shadow uses the same).

    Returns
    -------
    dict: every key of :data:`radixkv.replay.misses.MISS_COLUMNS` and of
    :data:`CONCURRENT_COLUMNS` (``miss_routing_tokens`` only with replicas), int64 arrays
    of shape (n,), and ``"_meta"`` (``unbounded_pool_tokens``, ``admission_order``, and the
    token-level prefixes ``held_admitted`` ``L``, ``held_inserted`` ``L_ins``, ``held_own``
    ``L_own``: int64 arrays of shape (n,)).

    Raises
    ------
    radixkv.errors.ConfigError
        When a request was never admitted (the replay did not finish).
    """
    from radixkv.replay.misses import (_slot_size, capacity_shadow, token_prefix_lengths, unbounded_pool_tokens,
                                       unbounded_rule)

    n = len(trace)
    ts, ks, rs, es, rts = [], [], [], [], []
    for rec in recorders:
        t, k, r, e = rec.events()
        ts.append(t)
        ks.append(k)
        rs.append(r)
        es.append(e)
        rts.append(np.full(len(t), rec.replica, dtype=np.int64))
    t, kind, req, ext, rep = (np.concatenate(x) if x else np.zeros(0) for x in (ts, ks, rs, es, rts))
    seq = np.arange(len(t), dtype=np.int64)  # recording order within a replica
    o = np.lexsort((seq, rep, t))
    kind, req, ext, rep = kind[o].astype(np.int64), req[o].astype(np.int64), ext[o].astype(np.int64), \
        rep[o].astype(np.int64)
    order = req[kind == _QUERY]
    if len(order) != n or len(np.unique(order)) != n:
        raise ConfigError(f"the miss-cause recorder saw {len(np.unique(order))} first admissions of {n} requests",
                          field="miss_causes")
    segs = trace_segments(trace)
    nodes = trie_nodes(segs)
    held_g, held_adm = replay_events(trace, segs, kind, req, ext, np.zeros(len(kind), dtype=np.int64), 1, True,
                                     nodes=nodes)
    multi = replica is not None and len(recorders) > 1
    if multi:
        held_l, _ = replay_events(trace, segs, kind, req, ext, rep, len(recorders), False, nodes=nodes)
    else:
        held_l = held_g
    P = np.asarray(trace.prompt_len, dtype=np.int64)
    probe, how = unbounded_rule(trace, spec, **options)
    if how == "rule":  # H∞ = C without a replay (radixkv.replay.misses._unbounded_rules)
        spol = probe
        A, C = (np.asarray(x, dtype=np.int64) for x in spol.reusable_prefix(held_adm, P))
        hinf = C.copy()
        kvl = P + np.maximum(np.asarray(trace.output_len, dtype=np.int64) - 1, 0)
        pool = unbounded_pool_tokens(trace, kvl - held_adm, _slot_size(trace, spec, options))
    else:
        pt = _permuted(trace, order)
        srec, spol = capacity_shadow(pt, spec, new_tokens=token_prefix_lengths(pt)[1], **options)
        hinf = np.empty(n, dtype=np.int64)
        hinf[order] = np.asarray(srec["hit_tokens"], dtype=np.int64)
        A, C = (np.asarray(x, dtype=np.int64) for x in spol.reusable_prefix(held_adm, P))
        pool = int(spol.capacity_tokens)
    G = np.minimum(hinf, np.asarray(spol.reusable_prefix(held_g, P)[1], dtype=np.int64))
    Lo = np.minimum(G, np.asarray(spol.reusable_prefix(held_l, P)[1], dtype=np.int64)) if multi else G
    H = np.asarray(hit, dtype=np.int64)
    runs: dict = {}
    for rec in recorders:
        runs.update(rec.admission_runs())
    # the cause boundaries, as prompt positions: capacity [H, Lo), routing [Lo, G), in-flight
    # [G, H∞), not cached [H∞, C), last-token cap [C, A), alignment [A, L), compulsory [L, P)
    bounds = [H, Lo, G, hinf, C, A, held_adm, P]
    names = ["miss_capacity_tokens", "miss_routing_tokens", "miss_in_flight_tokens", "miss_not_cached_tokens",
             "miss_last_token_cap_tokens", "miss_alignment_tokens", "miss_compulsory_tokens"]
    cols = {k: bounds[i + 1] - bounds[i] for i, k in enumerate(names)}
    cols["miss_preemption_tokens"] = carve_preemption(cols, names, bounds, runs)
    if not multi:
        del cols["miss_routing_tokens"]
    cols["_meta"] = {"unbounded_pool_tokens": int(pool), "admission_order": order, "held_admitted": held_adm,
                     "held_inserted": held_g, "held_own": held_l}
    return cols


def recomputed_positions(runs, hit: int, prompt: int) -> list:
    """Prompt positions a request computed at one admission and computed again at a later
    one (its ``preemption`` miss; docs/miss-causes.md).

    Parameters
    ----------
    runs : list of (int, int)
        Per admission in order, ``(hit, computed)``: it computed KV positions
        ``[hit, computed)``; ``computed`` −1 for the final admission (it computes the whole
        prompt). Tokens.
    hit, prompt : int
        The first admission's hit ``H`` and the prompt length ``P`` (tokens).

    Returns
    -------
    list of (a, b): disjoint, ascending token ranges within ``[hit, prompt)`` covered by
    the computed ranges of at least two admissions.
    """
    ev = []
    for a, b in runs:
        if a < 0:
            continue
        b = prompt if b < 0 else min(int(b), prompt)
        a = min(int(a), prompt)
        if b > a:
            ev.append((a, 1))
            ev.append((b, -1))
    ev.sort()
    out, depth, prev = [], 0, None
    for x, d in ev:
        if depth >= 2 and prev is not None and x > prev:
            lo, hi = max(prev, hit), min(x, prompt)
            if hi > lo:
                if out and out[-1][1] == lo:
                    out[-1] = (out[-1][0], hi)
                else:
                    out.append((lo, hi))
        depth += d
        prev = x
    return out


def carve_preemption(cols: dict, names: list, bounds: list, runs: dict) -> np.ndarray:
    """Move every request's :func:`recomputed_positions` out of the cause whose position
    range holds them into ``preemption`` (in place on *cols*).

    ``bounds`` are the cause boundaries as int64 arrays of shape (n,), ``bounds[0]`` the
    first-admission hit ``H`` and ``bounds[-1]`` the prompt ``P``; cause ``names[i]`` is
    the position range ``[bounds[i], bounds[i+1])``. With ``F(x)`` = recomputed positions
    below x, cause i keeps ``(b[i+1] − F(b[i+1])) − (b[i] − F(b[i]))``; the terms telescope
    to ``P − H − preemption``, so the split still sums to ``P``, and each is ≥ 0 whenever
    the bounds are nested. Returns ``miss_preemption_tokens`` (int64, shape (n,)).
    """
    n = len(bounds[0])
    pre = np.zeros(n, dtype=np.int64)
    for r, rr in runs.items():
        h, p = int(bounds[0][r]), int(bounds[-1][r])
        spans = recomputed_positions(rr, h, p)
        if not spans:
            continue

        def F(x):
            return sum(max(0, min(b, x) - a) for a, b in spans if a < x)

        for i, k in enumerate(names):
            lo, hi = int(bounds[i][r]), int(bounds[i + 1][r])
            cols[k][r] -= F(hi) - F(lo)
        pre[r] = sum(b - a for a, b in spans)
    return pre


#: the split columns (they sum to P with ``hit_tokens``), in CSV order
SPLIT_COLUMNS = tuple(MISS_COLUMNS) + ("miss_in_flight_tokens", "miss_routing_tokens", "miss_preemption_tokens")


def summarize_concurrent_causes(columns: dict, prompt_tokens: int, hit_tokens: int, multi: bool) -> dict:
    """Totals and shares of the concurrent miss causes (a concurrent summary's
    ``miss_causes``): ``mode`` (``"concurrent"`` or ``"multi-replica"``), ``tokens`` and
    ``share`` (cause → int / float over Σ prompt tokens; ``routing`` None with one
    replica; ``preemption`` is recomputed tokens beside the split, its share over Σ
    prompt tokens too), ``nesting_violations`` (requests with a negative term)."""
    from radixkv.records import CAUSES

    tokens = {"hit": int(hit_tokens)}
    for c in CAUSES[1:] + ("in_flight", "routing", "preemption"):
        col = columns.get(f"miss_{c}_tokens")
        tokens[c] = None if col is None else int(np.sum(col))
    share = {c: (None if v is None or not prompt_tokens else v / prompt_tokens) for c, v in tokens.items()}
    neg = np.zeros(len(columns["miss_compulsory_tokens"]), dtype=bool)
    for k in SPLIT_COLUMNS:
        if k in columns:
            neg |= np.asarray(columns[k]) < 0
    return {"mode": "multi-replica" if multi else "concurrent", "tokens": tokens, "share": share,
            "nesting_violations": int(neg.sum()), "preemption_in_split": True}


def attach_concurrent_causes(trace, spec, result, recorders, replica=None, **options) -> float:
    """Add the concurrent miss-cause columns to *result* (a
    :class:`~radixkv.replay.concurrent.ConcurrentResult`, the aggregate of a multi-replica
    run) in place, and ``result.meta["miss_causes"]`` (``multi``, ``unbounded_pool_tokens``)
    that its ``summary()`` reads. Returns the seconds spent."""
    import time

    t0 = time.perf_counter()
    cols = concurrent_causes(trace, spec, recorders, result.columns["hit_tokens"], replica=replica, **options)
    meta = cols.pop("_meta")
    result.columns.update(cols)
    result.meta["miss_causes"] = {"multi": replica is not None and len(recorders) > 1,
                                  "unbounded_pool_tokens": meta["unbounded_pool_tokens"]}
    return time.perf_counter() - t0


def check_policy(actual, built) -> None:
    """Refuse the breakdown when the caching flags replaced the spec's policy (``--no-enable-prefix-caching``,
    ``--static-reserved-fraction``): its capacity shadow is built from the spec.

    Raises
    ------
    radixkv.errors.ConfigError
        When *actual* is not of *built*'s class, or has a host-memory tier (not modelled).
    """
    if type(actual) is not type(built):
        raise ConfigError(f"--miss-causes replays a shadow of the --policy spec; the caching flags replaced it "
                          f"by {type(actual).__name__} (not modelled): drop one of them", field="miss_causes")
    if getattr(actual, "models_host_tier", False):
        raise ConfigError("--miss-causes in the concurrent mode does not model a host-memory tier (its load backs "
                          "are hits from a second pool)", field="miss_causes")


def csv_columns(columns: dict) -> list:
    """The miss-cause columns *columns* holds, in CSV order (none without the breakdown)."""
    return [c for c in SPLIT_COLUMNS if c in columns]
