"""The search: the cheapest point that meets the SLO, found with few replays.

1. **Structures.** Every engine × GPU × TP at the engine's default knobs. A structure
   whose pool does not exist or cannot hold the longest request is pruned (memory,
   :mod:`radixkv.plan.prune`); so are the replica counts below the throughput bound
   (:func:`radixkv.plan.prune.min_replicas`).
2. **Replicas.** Structures in order of their cheapest unpruned cost; a structure that
   cannot be cheaper than the best plan so far is pruned (cost bound). Otherwise the
   least replica count that meets the SLO is found by doubling from the bound, then
   bisecting: latency is taken to be monotone in the replica count (more replicas behind
   the router never slow a request; an assumption of the search, checked by the tests on
   small traces, not proven for every router). Doubling stops early at a latency floor:
   when doubling the replicas improved the worst SLO ratio by less than 10 %
   (:data:`FLOOR_GAIN`), the miss is a request's own prefill or decode time, which more
   replicas do not shorten (a larger TP or a faster GPU does).
3. **Knobs.** At one replica fewer than each structure's answer, every single-knob
   change (:func:`radixkv.plan.candidates.neighbours`) is replayed: a change that meets
   the SLO there is a cheaper plan.
4. **Sensitivity.** At the recommendation, every single-knob change is replayed: what each
   knob does, and prefix caching on vs off. Steps 2 and 3 leave one replay of the budget
   for this step, so the caching toggle (its first point) is replayed even when the budget
   runs out: the plan always answers "cache on or off".

The answer is the cheapest replayed point that meets the SLO (ties: smaller worst
value/bound, then the point's order). Every point replayed, and why the others were not,
is counted. The budget caps the replays; a plan that ran out says so.
"""
from __future__ import annotations

import math
import tempfile
from collections import Counter
from dataclasses import dataclass, field

from radixkv.errors import InputError

#: doubling the replicas stops when the worst SLO ratio improved by less than this factor
#: (an assumed threshold: the miss is then one request's own latency, not queueing)
FLOOR_GAIN = 0.9
#: replaying the next doubling ahead of the search is skipped when the last doubling improved
#: the worst SLO ratio by less than 25 % (the latency floor is near: that replay would likely
#: be wasted, and hold the idle worker); a speed heuristic only, no output depends on it
AHEAD_FLOOR_GAIN = 0.75
#: the roofline cost model's replay flags at its defaults (radixkv.cost.CostModel: mfu 0.6, mbu 0.8)
ROOFLINE_FLAGS: dict = {}


class NoFeasiblePlan(InputError):
    """No point the search replayed meets the SLO; ``closest`` is the outcome nearest to it."""

    def __init__(self, message, closest=None):
        super().__init__(message, field="slo")
        self.closest = closest


@dataclass
class PlanResult:
    """What :func:`make_plan` found.

    Attributes
    ----------
    spec : PlanSpec
    workload : Workload
    best : Outcome
        The recommendation.
    runner_ups : list of Outcome
        Other replayed points that meet the SLO, cheapest first, other hardware before
        knob changes of the recommendation's (at most 3).
    next_cheaper : Outcome or None
        The most expensive replayed point cheaper than ``best`` (it misses the SLO).
    sensitivity : list of (str, Outcome)
        ``(knob, outcome)`` of every single-knob change at ``best``.
    outcomes : list of Outcome
        Every point considered (replayed or pruned), in the order first seen.
    pruned : Counter
        Points not replayed, by reason kind (memory, throughput, cost bound, budget).
    replayed : int
    resumed : int
        Of the replayed, read back from the work dir.
    budget_exhausted : bool
    min_replicas : dict
        ``(engine, gpu, tp)`` → least replica count the throughput bound allows.
    prefetched, prefetch_used : int
        Replays started ahead of the search on idle workers, and how many of them the
        search then asked for (the rest were wasted work; neither is in the JSON).
    """

    spec: object
    workload: object
    best: object
    runner_ups: list
    next_cheaper: object
    sensitivity: list
    outcomes: list
    pruned: Counter
    replayed: int
    resumed: int
    budget_exhausted: bool
    min_replicas: dict = field(default_factory=dict)
    prefetched: int = 0
    prefetch_used: int = 0


def make_plan(spec, trace=None) -> PlanResult:
    """Search the deployments of *spec* (module docstring).

    Parameters
    ----------
    spec : radixkv.plan.spec.PlanSpec
    trace : radixkv.trace.Trace or None
        The trace, when already loaded (else read from ``spec.trace``).

    Raises
    ------
    radixkv.errors.InputError
        No structure has a pool (the model fits no GPU searched), or the trace is empty.
    NoFeasiblePlan
        No replayed point meets the SLO (the message names the closest and what it misses).
    """
    from radixkv.plan.evaluate import Evaluator
    from radixkv.plan.prune import workload_of

    if trace is None:
        from radixkv.trace.load import load_trace

        trace = load_trace(spec.trace)
    if len(trace) == 0:
        raise InputError("empty trace: nothing to plan for", path=spec.trace)
    workload = workload_of(trace, spec.rate_scale)
    cost_kw = dict(ROOFLINE_FLAGS) if spec.cost_model == "roofline" else {"cost_model": spec.cost_model}
    if spec.work_dir is None:
        with tempfile.TemporaryDirectory(prefix="radixkv-plan-") as d:
            return _search_closing(spec, trace, workload, Evaluator(spec, workload, cost_kw, d, trace=trace))
    return _search_closing(spec, trace, workload, Evaluator(spec, workload, cost_kw, spec.work_dir, trace=trace))


def _search_closing(spec, trace, workload, ev) -> PlanResult:
    try:
        return _search(spec, trace, workload, ev)
    finally:
        ev.close()


def _search(spec, trace, workload, ev) -> PlanResult:
    from radixkv.plan.candidates import base_point, neighbours
    from radixkv.plan.prune import memory_reason, min_replicas

    pruned = Counter()
    state = {"exhausted": False}
    # the seed's question (prefix caching on or off at the recommendation) is answered even
    # when the search spends the budget: steps 2 and 3 leave one replay for step 4, whose
    # first point is the caching toggle (neighbours' order); a budget of 1 keeps it for step 2
    verdict_reserve = 1 if spec.budget > 1 else 0

    def run(points, reserve=0):
        """Evaluate *points* within the budget less *reserve* replays; the rest are pruned
        (budget)."""
        left = spec.budget - reserve - ev.replayed
        new = [p for p in dict.fromkeys(points) if p not in ev.outcomes]
        fits = [p for p in new if memory_reason(p, spec.model, workload)[1] is None]
        pruned["memory"] += len(new) - len(fits)
        over = fits[left:] if left < len(fits) else []
        for p in over:
            ev.prune(p, "budget: the replay budget was spent")
            pruned["budget"] += 1
            state["exhausted"] = True
        outs = ev.evaluate([p for p in points if p not in over])
        return {o.point: o for o in outs} | {p: ev.outcomes[p] for p in over}

    def throughput_ok(p) -> bool:
        r = min_replicas(p, spec.model, workload, ev.cost_kw)
        if p.replicas < r:
            ev.prune(p, f"throughput: the roofline bound needs ≥ {r} replicas for "
                        f"{workload.offered_tokens_per_s:,.0f} tokens/s offered")
            pruned["throughput"] += 1
            return False
        return True

    def ahead(b, replicas, bases, best_cost):
        """Points the search will likely ask for next, started on idle workers (only with a
        pool of workers: :meth:`~radixkv.plan.evaluate.Evaluator.prefetch`): *b* at the next
        replica counts *replicas* of its doubling or bisection, then the structures after
        *b* that the cost bound does not rule out yet, at their least replica count."""
        if not ev.pooled:
            return
        nxt = [b.with_replicas(r) for r in replicas]
        later = bases[bases.index(b) + 1:] if b in bases else []
        nxt += [c for c in later if ev.cost(c) < best_cost and c not in ev.outcomes]
        ev.prefetch(nxt)

    # 1. structures
    bases, rmin = [], {}
    memory_reasons = []
    for engine in spec.engines:
        for gpu in spec.gpus:
            for tp in spec.tps:
                b = base_point(engine, gpu, tp)
                _, reason = memory_reason(b, spec.model, workload)
                if reason:
                    ev.prune(b, reason)
                    pruned["memory"] += 1
                    memory_reasons.append(f"{engine} on {gpu} tp{tp}: {reason}")
                    continue
                r = min_replicas(b, spec.model, workload, ev.cost_kw)
                rmin[b.structure] = r
                pruned["throughput"] += r - 1  # replica counts 1 .. r-1 cannot keep up
                if r > spec.max_replicas:
                    ev.prune(b.with_replicas(r), f"throughput: needs ≥ {r} replicas (more than --max-replicas "
                                                 f"{spec.max_replicas})")
                    continue
                bases.append(b.with_replicas(r))
    if not bases:
        if memory_reasons and len(memory_reasons) == len(spec.engines) * len(spec.gpus) * len(spec.tps):
            raise InputError(f"model {spec.model} fits no GPU searched ({', '.join(spec.gpus)}; TP "
                             f"{', '.join(map(str, spec.tps))}): " + "; ".join(memory_reasons[:4]), field="model")
        raise InputError(f"no configuration keeps up with the trace's offered load at ≤ {spec.max_replicas} "
                         f"replicas (throughput bound)", field="max_replicas")
    bases.sort(key=lambda p: (ev.cost(p), p))

    # 2. replicas, cheapest structures first
    best_cost = math.inf
    answers = []  # (base at its least meeting R)
    for b in bases:
        if ev.cost(b) >= best_cost:
            ev.prune(b, "cost bound: cannot be cheaper than the best plan found")
            pruned["cost bound"] += 1
            continue
        unit = ev.cost(b.with_replicas(1))
        r_hi = spec.max_replicas if math.isinf(best_cost) else min(spec.max_replicas,
                                                                    math.ceil(best_cost / unit) - 1)
        lo, hi, r, prev, gain = None, None, b.replicas, None, None
        while True:  # doubling
            near_floor = gain is not None and gain >= AHEAD_FLOOR_GAIN
            ahead(b, [min(2 * r, r_hi)] if r < r_hi and not near_floor else [], bases, best_cost)
            o = run([b.with_replicas(r)], verdict_reserve)[b.with_replicas(r)]
            if o.meets:
                hi = r
                break
            lo = r
            if r >= r_hi or not o.replayed:
                break
            if prev is not None and not o.overloaded and o.worst_ratio() >= FLOOR_GAIN * prev.worst_ratio():
                pruned["latency floor"] += 1  # doubling again would not help (module docstring)
                break
            gain = o.worst_ratio() / prev.worst_ratio() if prev is not None and not o.overloaded else None
            prev = o
            r = min(2 * r, r_hi)
        if hi is None:
            continue
        while lo is not None and hi - lo > 1:  # bisection
            mid = (lo + hi) // 2
            ahead(b, [m for m in ((mid + hi) // 2, (lo + mid) // 2) if lo < m < hi and m != mid], bases, best_cost)
            o = run([b.with_replicas(mid)], verdict_reserve)[b.with_replicas(mid)]
            if o.meets:
                hi = mid
            else:
                lo = mid
            if not o.replayed:
                break
        a = b.with_replicas(hi)
        answers.append(a)
        best_cost = min(best_cost, ev.cost(a))

    # 3. knobs at one replica fewer (structures that could still beat the best)
    for a in sorted(answers, key=lambda p: (ev.cost(p), p)):
        if a.replicas <= 1:
            continue
        down = a.with_replicas(a.replicas - 1)
        if ev.cost(down) >= best_cost:
            continue
        cand = [p for _, p in neighbours(down) if throughput_ok(p)]
        if ev.pooled:  # the recommendation's sensitivity, should no knob change beat it (started on idle workers)
            met_now = [o for o in ev.outcomes.values() if o.meets]
            if met_now:
                cur = min(met_now, key=lambda o: (o.cost, o.worst_ratio(), o.point)).point
                ev.prefetch([p for _, p in neighbours(cur)])
        outs = run(cand, verdict_reserve)
        ok = [outs[p] for p in cand if outs[p].meets]
        if ok:
            best_cost = min(best_cost, min(o.cost for o in ok))

    met = [o for o in ev.outcomes.values() if o.meets]
    if not met:
        replayed = [o for o in ev.outcomes.values() if o.replayed]
        if not replayed:
            raise InputError("no point could be replayed: " + "; ".join(sorted({o.pruned for o in ev.outcomes.values()
                                                                              if o.pruned})[:3]), field="slo")
        close = min(replayed, key=lambda o: (o.worst_ratio(), o.cost, o.point))
        raise NoFeasiblePlan("no feasible plan: " + describe_miss(close, spec), close)
    order = sorted(met, key=lambda o: (o.cost, o.worst_ratio(), o.point))
    best = order[0]

    # 4. sensitivity at the recommendation (the recommendation is fixed before: a change
    # that also meets the SLO at the same cost is listed as a runner-up)
    sens_pts = neighbours(best.point)
    outs = run([p for _, p in sens_pts])
    sensitivity = [(k, outs[p]) for k, p in sens_pts]
    others = [o for o in ev.outcomes.values() if o.meets and o is not best]
    # runner-ups: other hardware first (what else would do), then knob changes of the same
    order = [best] + sorted(others, key=lambda o: (o.cost, o.point.structure == best.point.structure,
                                                   o.worst_ratio(), o.point))
    cheaper = [o for o in ev.outcomes.values() if o.replayed and o.cost < best.cost]
    next_cheaper = max(cheaper, key=lambda o: (o.cost, o.point.structure == best.point.structure,
                                               -o.worst_ratio()), default=None)
    return PlanResult(spec, workload, best, order[1:4], next_cheaper, sensitivity, list(ev.outcomes.values()),
                      pruned, ev.replayed, ev.resumed, state["exhausted"], rmin, ev.prefetched, ev.prefetch_used)


def describe_miss(o, spec) -> str:
    """``"closest is <point> (cost), which misses ttft_p99 (3.1 s > 2 s)"``."""
    from radixkv.plan.spec import format_seconds

    parts = []
    for t, ratio in o.misses().items():
        v = o.value(t)
        if not math.isfinite(v) and t.startswith("tpot") and not o.overloaded:
            # TPOT is (e2e − TTFT) / (output − 1): no value without a second output token
            parts.append(f"{t} (undefined: no request decodes past its first output token, so there is no "
                         f"TPOT to hold to {format_seconds(spec.slo[t])}; drop the TPOT term)")
            continue
        vs = "undefined" if not math.isfinite(v) else format_seconds(float(f"{v:.3g}"))
        parts.append(f"{t} ({vs} > {format_seconds(spec.slo[t])}{', overloaded' if o.overloaded else ''})")
    return (f"closest is {o.point.label()} ({o.cost:g} {spec.cost_unit}), which misses " + ", ".join(parts))
