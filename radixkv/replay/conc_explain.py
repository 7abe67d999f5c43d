"""``--explain REQUEST_ID`` in the concurrent and multi-replica replays (docs/miss-causes.md).

The sequential explanation (:func:`radixkv.replay.misses.explain`) replays the requests
before one request one at a time. In the concurrent modes "before" is the first-admission
order, requests overlap, and what a request could hit depends on what was *inserted* by
the moment of its admission. Here the whole concurrent replay runs once with an
:class:`ExplainRecorder` per engine (a :class:`~radixkv.replay.conc_misses.MissRecorder`
that also asks its policy, after every step until the explained request's first
admission, what that request would hit now: ``peek_hit``, side-effect free), then:

- **spans**: which earlier-admitted request first computed each reusable span of the
  prompt (the infinite token-level cache over the requests in first-admission order), and
  what each span was at the admission: ``inserted`` into the request's replica's cache
  (a hit, or a capacity miss if evicted since), ``other_replica`` (inserted only into
  another replica's cache: routing), or ``in_flight`` (computed, or to be computed, by a
  request that had not inserted it yet);
- **history**: every engine step on the request's replica that changed its hittable
  prefix, with the step's batch — a step allocates for its whole batch at once, so an
  eviction is attributed to that step's prefills and decodes, not to one request.
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
from radixkv.replay.conc_misses import MissRecorder


class ExplainRecorder(MissRecorder):
    """A :class:`~radixkv.replay.conc_misses.MissRecorder` that also follows one
    request's hittable prefix on its engine's policy, step by step, until that request's
    first admission.

    Parameters
    ----------
    trace, policy, config, replica :
        As for :class:`~radixkv.replay.conc_misses.MissRecorder`.
    watch : int
        The trace row of the explained request.
    """

    def __init__(self, trace, policy, config, replica: int = 0, *, watch: int):
        super().__init__(trace, policy, config, replica=replica)
        self.policy = policy
        self.trace = trace
        self.watch = int(watch)
        self.seq = trace.kv_seq(self.watch)
        self.can_peek = type(policy).can_peek_hit()
        self.before = int(policy.peek_hit(self.seq)) if self.can_peek else 0
        self.history: list = []
        self.steps = 0
        self.admission = None  # {"step", "time_s", "hittable_before_step"} on this engine

    def step(self, t_start, t_end, plan, k, admitted, finished) -> None:
        super().step(t_start, t_end, plan, k, admitted, finished)
        self.steps += k
        if self.admission is not None:
            return
        if self.watch in admitted:
            self.admission = {"step": self.steps if k else self.steps + 1, "time_s": float(t_start),
                              "hittable_before_step": int(self.before) if self.can_peek else None}
            return
        if not self.can_peek:
            return
        now = int(self.policy.peek_hit(self.seq))
        if now != self.before:
            ids = self.trace.req_id
            self.history.append({
                "step": int(self.steps), "time_s": float(t_end), "hittable_before": int(self.before),
                "hittable_after": now, "event": "inserted" if now > self.before else "evicted",
                "prefills": [str(ids[r]) for r, pre in zip(plan.req, plan.prefill) if pre],
                "decodes": int(sum(1 for pre in plan.prefill if not pre)),
                "finished": [str(ids[r]) for r in finished]})
            self.before = now


def find_row(trace, request_id: str) -> int:
    """The trace row of *request_id*; :class:`ConfigError` naming the trace when absent."""
    where = np.flatnonzero(np.asarray(trace.req_id) == str(request_id))
    if where.size == 0:
        raise ConfigError(f"--explain: no request {request_id!r} among the {len(trace):,} replayed requests",
                          path=trace.name or None, field="explain")
    return int(where[0])


def explain_concurrent(trace, spec, row: int, result, recorders, replica=None, **options) -> dict:
    """Why request *row* missed what it missed in a finished concurrent replay.

    Parameters
    ----------
    trace : radixkv.trace.Trace
        The trace replayed (its rows are the replay's).
    spec : radixkv.policies.registry.PolicySpec
        The policy replayed.
    row : int
        The explained request's row.
    result : radixkv.replay.concurrent.ConcurrentResult
        The replay's result (the aggregate with replicas), with the miss-cause columns.
    recorders : list of ExplainRecorder
        One per replica, watching *row*, as the replay filled them.
    replica : np.ndarray of int64, shape (n,), or None
        Each request's replica (None: one engine).
    **options
        The policy constructor options.

    Returns
    -------
    dict: ``request``, ``mode``, ``replica`` (None with one engine), ``admission_rank``
    (0-based position in first-admission order), ``arrival_s``, ``admit_s``,
    ``admit_step`` (on its engine), ``prompt_tokens``, ``hit_tokens``, ``causes`` (cause →
    tokens, the breakdown's columns for this request), ``spans`` (list of ``{start, end,
    status, produced_by, produced_by_rank, produced_admit_s, produced_by_replica}``; status
    ``inserted`` / ``other_replica`` / ``in_flight``), ``history`` (list of the steps that
    changed its hittable prefix on its replica — ``step``, ``time_s``,
    ``hittable_before``, ``hittable_after``, ``event``, ``prefills``, ``decodes``,
    ``finished`` — or None when the policy has no ``peek_hit``), ``admission`` (``step``,
    ``time_s``, ``hittable_before_step``: what the request could hit when its admission
    step began; its own step may evict or insert before its lookup).
    """
    from radixkv.replay.conc_misses import _permuted, concurrent_causes
    from radixkv.replay.misses import producer_spans

    cols = concurrent_causes(trace, spec, recorders, result.columns["hit_tokens"], replica=replica, **options)
    meta = cols.pop("_meta")
    order = np.asarray(meta["admission_order"], dtype=np.int64)
    rank = int(np.flatnonzero(order == row)[0])
    sub = _permuted(trace, order[:rank + 1])
    raw, _ = producer_spans(sub)
    held_g = int(meta["held_inserted"][row])
    held_l = int(meta["held_own"][row])
    multi = replica is not None and len(recorders) > 1
    admit_s = result.columns["admit_s"]
    spans = []
    for sp in raw:
        k = int(order[sp["produced_by_index"]])
        for lo, hi, status in ((sp["start"], min(sp["end"], held_l), "inserted"),
                               (max(sp["start"], held_l), min(sp["end"], held_g), "other_replica"),
                               (max(sp["start"], held_g), sp["end"], "in_flight")):
            if hi > lo:
                spans.append({"start": int(lo), "end": int(hi), "status": status, "produced_by": str(trace.req_id[k]),
                              "produced_by_rank": int(sp["produced_by_index"]),
                              "produced_admit_s": float(admit_s[k]),
                              "produced_by_replica": int(replica[k]) if multi else None})
    rep = int(replica[row]) if multi else 0
    rec = recorders[rep] if multi else recorders[0]
    causes = {k[5:-7]: int(v[row]) for k, v in cols.items()}
    return {"request": str(trace.req_id[row]), "mode": "multi-replica" if multi else "concurrent",
            "replica": rep if multi else None, "admission_rank": rank, "arrival_s": float(result.columns["arrival_s"][row]),
            "admit_s": float(admit_s[row]), "admit_step": int(result.columns["admit_step"][row]),
            "prompt_tokens": int(trace.prompt_len[row]), "hit_tokens": int(result.columns["hit_tokens"][row]),
            "causes": causes, "spans": spans, "history": rec.history if rec.can_peek else None,
            "admission": rec.admission}


_STATUS = {"inserted": "inserted in its replica's cache", "other_replica": "inserted only in another replica's cache",
           "in_flight": "in flight (computed or to be computed, not inserted yet)"}


def format_explain_concurrent(ex: dict) -> str:
    """The human-readable text of :func:`explain_concurrent`'s answer."""
    where = f" on replica {ex['replica']}" if ex["replica"] is not None else ""
    lines = [f"request {ex['request']} (#{ex['admission_rank']} in first-admission order, arrival "
             f"{ex['arrival_s']:.3f} s, admitted {ex['admit_s']:.3f} s at step {ex['admit_step']:,}{where}): "
             f"{ex['prompt_tokens']:,} prompt tokens, {ex['hit_tokens']:,} hit",
             "  causes: " + ", ".join(f"{k} {v:,}" for k, v in ex["causes"].items())]
    if not ex["spans"]:
        lines.append("  no earlier-admitted request computed any prefix of this prompt (all compulsory)")
    for sp in ex["spans"]:
        rep = f", replica {sp['produced_by_replica']}" if sp["produced_by_replica"] is not None else ""
        lines.append(f"  tokens [{sp['start']:,}, {sp['end']:,}) first computed by {sp['produced_by']} "
                     f"(#{sp['produced_by_rank']}, admitted {sp['produced_admit_s']:.3f} s{rep}): "
                     f"{_STATUS[sp['status']]} at this admission")
    if ex["history"] is None:
        lines.append("  eviction history: n/a (the policy has no side-effect-free lookup, peek_hit)")
    else:
        for h in ex["history"]:
            verb = "inserted" if h["event"] == "inserted" else "evicted"
            batch = ", ".join(h["prefills"]) or "none"
            fin = f"; finished {', '.join(h['finished'])}" if h["finished"] else ""
            lines.append(f"  hittable prefix {h['hittable_before']:,} -> {h['hittable_after']:,} tokens: {verb} in "
                         f"step {h['step']:,} (ends {h['time_s']:.3f} s; prefills {batch}; {h['decodes']} "
                         f"decodes{fin})")
        a = ex["admission"]
        if a is not None and a["hittable_before_step"] is not None:
            lines.append(f"  at its admission step {a['step']:,}: {a['hittable_before_step']:,} tokens hittable "
                         f"before the step, {ex['hit_tokens']:,} hit")
    return "\n".join(lines)
