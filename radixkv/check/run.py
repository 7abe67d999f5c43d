"""Run a ``radixkv check``: replay every (trace, policy) pair, evaluate every assertion.

Data flow: :func:`radixkv.check.config.load_config` → :func:`run_check` (replays with
:func:`radixkv.replay.spec.run`, reads the baseline and golden files) →
:class:`CheckResult` → :mod:`radixkv.check.report` (table, JSON, JUnit XML, Markdown).

Baseline file (JSON, written by :func:`write_baseline`)::

    {"radixkv": "0.1.0", "results": {TRACE: {POLICY: {METRIC: value, ...}, ...}, ...},
     "pools": {TRACE: {POLICY: {"pool_capacity_tokens": int, "pool_slots": int,
                                "pool_slot_tokens": int}, ...}, ...}}

``pools`` (the pool each pair replayed on: usable tokens, and its blocks/pages and their
size) lets a baseline assertion tell a configuration change from a regression: when the
pool differs from the one recorded, it fails with that as its message instead of comparing
the metrics. A baseline file written before the pools were recorded has no ``pools``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from radixkv.check.config import BASELINE_METRICS, Assertion, CheckConfig
from radixkv.errors import ConfigError, InputError
from radixkv.util import atomic_write_text, check_output_paths, dumps_json


@dataclass(frozen=True)
class Outcome:
    """The verdict on one :class:`~radixkv.check.config.Assertion`.

    ``value`` is the measured metric (for ``golden``: the number of requests whose hit
    differs); ``limit`` the bound it was held to (for ``baseline``: the baseline value
    moved by the tolerance); ``passed`` whether it holds; ``detail`` a readable
    explanation for failures (e.g. the first differing requests).
    """

    assertion: Assertion
    value: float | None
    limit: float | None
    passed: bool
    detail: str = ""

    @property
    def relation(self) -> str:
        """``>=``, ``<=`` or ``==``: how value must compare with limit."""
        a = self.assertion
        if a.kind == "golden":
            return "=="
        if a.kind == "min" or (a.kind == "baseline" and a.higher_is_better):
            return ">="
        return "<="

    def line(self) -> str:
        """One line naming trace, policy, metric, value and bound (what a failure prints)."""
        a = self.assertion
        status = "ok  " if self.passed else "FAIL"
        val = "n/a" if self.value is None else _num(self.value)
        lim = "n/a" if self.limit is None else _num(self.limit)
        s = f"{status} trace={a.trace} policy={a.policy} metric={a.metric} value={val} bound: {self.relation} {lim}"
        if a.kind == "baseline":
            s += f" (baseline within {_num(a.bound)})"
        if self.detail:
            s += f" — {self.detail}"
        return s + f" [{a.source}]"


def _num(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) >= 1:
        return f"{int(x)}"
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


@dataclass
class CheckResult:
    """What a check measured and decided.

    Attributes
    ----------
    config : CheckConfig
    summaries : dict[(trace, policy), dict]
        :func:`radixkv.metrics.summarize` of each replayed pair.
    outcomes : list of Outcome
        One per assertion, in config order.
    baseline_written : Path or None
        Set when ``update_baseline`` rewrote the baseline file.
    """

    config: CheckConfig
    summaries: dict
    outcomes: list = field(default_factory=list)
    baseline_written: Path | None = None

    @property
    def failures(self) -> list:
        return [o for o in self.outcomes if not o.passed]

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict:
        """Plain data for ``--json``: the pairs' key metrics and every outcome."""
        keys = ("requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "alignment_loss_share",
                "cached_tokens_second_half_mean", "evicted_tokens", "pool_capacity_tokens")
        return {
            "radixkv": __import__("radixkv").__version__,
            "config": str(self.config.path),
            "ok": self.ok,
            "results": [{"trace": t, "policy": p, **{k: s.get(k) for k in keys}}
                        for (t, p), s in self.summaries.items()],
            "assertions": [{
                "trace": o.assertion.trace, "policy": o.assertion.policy, "metric": o.assertion.metric,
                "kind": o.assertion.kind, "value": o.value, "bound": o.limit, "relation": o.relation,
                "tolerance": o.assertion.bound if o.assertion.kind == "baseline" else None,
                "passed": o.passed, "detail": o.detail or None, "source": o.assertion.source,
            } for o in self.outcomes],
        }


def read_baseline(path: Path) -> dict:
    """The ``results`` table of a baseline file: ``{trace: {policy: {metric: value}}}``.

    Every value is checked (:mod:`radixkv.validate`): ``results`` and each trace and policy
    entry are tables, each metric is one of :data:`~radixkv.check.config.BASELINE_METRICS`
    and its value a finite number, or null (the metric is n/a for that policy). ``NaN``,
    ``Infinity``, strings and booleans are refused: ``-Infinity`` as a hit rate would make
    every later run pass.

    Raises
    ------
    radixkv.errors.InputError
        When the file is missing (run ``radixkv check --update-baseline`` to create it) or
        is not a valid baseline file (naming the line and the key).
    """
    from radixkv import validate

    try:
        doc, text = validate.read_json(path)
    except FileNotFoundError:
        raise InputError("baseline file does not exist: create it with radixkv check CONFIG --update-baseline",
                         path=path, field="baseline") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict):
        raise InputError("not a radixkv baseline file: no 'results' table", path=path, field="results",
                         line=validate.line_of(text, "results") if isinstance(doc, dict) else None)
    for k in doc:
        if k not in ("radixkv", "results", "pools"):
            raise InputError("unknown key; a baseline file has 'radixkv', 'results' and 'pools'", path=path, field=k,
                             line=validate.line_of(text, k))
    res = doc["results"]
    for t, pols in res.items():
        validate.table(pols, path=path, field=f"results.{t}", line=validate.line_of(text, "results", t),
                       what="a table of policy: {metric: value}")
        for p, metrics in pols.items():
            validate.table(metrics, path=path, field=f"results.{t}.{p}",
                           line=validate.line_of(text, "results", t, p), what="a table of metric: value")
            for m, v in metrics.items():
                where = dict(path=path, field=f"results.{t}.{p}.{m}", line=validate.line_of(text, "results", t, p, m))
                if m not in BASELINE_METRICS:
                    raise InputError(f"unknown metric; known: {', '.join(sorted(BASELINE_METRICS))}", **where)
                rate = m.endswith(("_rate", "_share", "_ratio"))
                validate.number(v, null=True, minimum=0, maximum=1 if rate else None, **where)
    return res


def write_baseline(path: Path, summaries: dict) -> None:
    """Write every pair's baseline metrics to *path* atomically (temp file + rename)."""
    res: dict = {}
    pools: dict = {}
    for (t, p), s in summaries.items():
        res.setdefault(t, {})[p] = {m: s.get(m) for m in BASELINE_METRICS}
        pools.setdefault(t, {})[p] = {k: s.get(k) for k in POOL_FIELDS}
    atomic_write_text(path, dumps_json({"radixkv": __import__("radixkv").__version__, "results": res,
                                        "pools": pools}))


#: the pool fields a baseline records per pair (summary keys: usable tokens, blocks/pages, their size)
POOL_FIELDS = ("pool_capacity_tokens", "pool_slots", "pool_slot_tokens")


def read_baseline_pools(path: Path) -> dict:
    """The ``pools`` table of a baseline file (:func:`write_baseline`): ``{trace: {policy:
    {field: value}}}``; empty for a file written before pools were recorded. Call after
    :func:`read_baseline` (which checks the file)."""
    from radixkv import validate

    doc, text = validate.read_json(path)
    pools = doc.get("pools") if isinstance(doc, dict) else None
    if pools is None:
        return {}
    validate.table(pools, path=path, field="pools", line=validate.line_of(text, "pools"),
                   what="a table of trace: {policy: pool}")
    for t, pols in pools.items():
        validate.table(pols, path=path, field=f"pools.{t}", line=validate.line_of(text, "pools", t),
                       what="a table of policy: pool")
        for p, rec in pols.items():
            validate.table(rec, path=path, field=f"pools.{t}.{p}", line=validate.line_of(text, "pools", t, p),
                           what=f"a table of {', '.join(POOL_FIELDS)}")
            for k, v in rec.items():
                where = dict(path=path, field=f"pools.{t}.{p}.{k}", line=validate.line_of(text, "pools", t, p, k))
                if k not in POOL_FIELDS:
                    raise InputError(f"unknown pool field; known: {', '.join(POOL_FIELDS)}", **where)
                validate.number(v, integer=True, minimum=0, null=True, **where)
    return pools


def pool_change(summary: dict, recorded) -> str:
    """A message when this replay's pool differs from the *recorded* one (``""`` when it is
    the same, or nothing was recorded), e.g. ``"pool changed since the baseline: 20,000
    tokens (1,250 slots of 16) -> 10,000 tokens (625 slots of 16): a configuration change,
    not a regression; rerun with --update-baseline"``."""
    if not isinstance(recorded, dict) or not recorded:
        return ""
    now = {k: summary.get(k) for k in POOL_FIELDS}
    if all(recorded.get(k) == now[k] for k in POOL_FIELDS):
        return ""

    def show(p):
        tok, n, size = (p.get(k) for k in POOL_FIELDS)
        text = f"{tok:,} tokens" if isinstance(tok, int) else "tokens not recorded"
        return text + (f" ({n:,} slots of {size})" if isinstance(n, int) and isinstance(size, int) else "")

    return (f"pool changed since the baseline: {show(recorded)} -> {show(now)}: a configuration change, not a "
            f"regression; rerun with --update-baseline")


def read_golden(path: Path) -> list:
    """``(id, hit_tokens)`` per line of a golden file (JSON lines with ``id`` and ``hit_tokens``),
    ``(id, hit_tokens, prompt_len)`` when the line gives ``prompt_len``. Other fields (the
    engines' diagnostics: ``evicted_tokens``, ``kv_tokens``, ...) are not read.

    Raises
    ------
    radixkv.errors.InputError
        Naming the file, line and field of a malformed line: invalid JSON, not UTF-8,
        ``NaN``/``Infinity``, a missing ``id`` or ``hit_tokens``, an ``id`` that is not a
        string or whole number, a count that is not a whole number ≥ 0.
    """
    from radixkv import validate

    rows = []
    for n, r in validate.json_lines(path):
        validate.table(r, path=path, line=n, field=None, what="a JSON object with id and hit_tokens")
        for k in ("id", "hit_tokens"):
            if k not in r:
                raise InputError("missing field", path=path, line=n, field=k)
        rid = r["id"]
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise InputError(f"must be a string or a whole number, got {rid!r}", path=path, line=n, field="id")
        hit = validate.number(r["hit_tokens"], path=path, line=n, field="hit_tokens", integer=True, minimum=0)
        plen = validate.number(r.get("prompt_len"), path=path, line=n, field="prompt_len", integer=True, minimum=0,
                               null=True)
        rows.append((str(rid), hit) if plen is None else (str(rid), hit, plen))
    return rows


def compare_hits(req_id, hit_tokens, golden: list, prompt_tokens=None) -> tuple[int, str]:
    """Requests whose hit differs from *golden*, and a readable note on the first ones.

    Parameters
    ----------
    req_id : sequence of str, shape (n,)
    hit_tokens : sequence of int, shape (n,)
        Replayed hits (tokens), in replay order.
    golden : list of (id, hit_tokens) or (id, hit_tokens, prompt_len)
        From :func:`read_golden`, in the same order.
    prompt_tokens : sequence of int, shape (n,), or None
        Replayed prompt lengths, checked against a golden ``prompt_len`` when both are given.

    Returns
    -------
    (count, note)
        Differing requests (a missing or extra request counts as differing, as does an id
        out of place) and e.g. ``"2 of 200 differ; first: r5 hit 32 want 48, ..."``.
    """
    n, g = len(req_id), len(golden)
    bad = []
    for i in range(max(n, g)):
        if i >= n:
            bad.append(f"{golden[i][0]} missing from the replay")
        elif i >= g:
            bad.append(f"{req_id[i]} not in the golden file")
        elif str(req_id[i]) != golden[i][0]:
            bad.append(f"request {i} is {req_id[i]} but the golden file has {golden[i][0]}")
        elif prompt_tokens is not None and len(golden[i]) > 2 and int(prompt_tokens[i]) != golden[i][2]:
            bad.append(f"{req_id[i]} prompt {int(prompt_tokens[i])} tokens want {golden[i][2]}")
        elif int(hit_tokens[i]) != golden[i][1]:
            bad.append(f"{req_id[i]} hit {int(hit_tokens[i])} want {golden[i][1]}")
    if not bad:
        return 0, ""
    return len(bad), f"{len(bad)} of {max(n, g)} requests differ; first: " + ", ".join(bad[:3])


def evaluate(a: Assertion, summary: dict, hits=None, baseline: dict | None = None, golden: list | None = None,
             pools: dict | None = None) -> Outcome:
    """The :class:`Outcome` of assertion *a* on one pair's *summary*.

    *hits* is ``(req_id, hit_tokens, prompt_tokens)`` of the replay (golden assertions); *baseline* the
    baseline table (baseline assertions), *pools* its recorded pools (:func:`read_baseline_pools`):
    a baseline assertion on a pair whose pool changed fails with :func:`pool_change`'s message,
    not a comparison; *golden* the rows of ``a.golden`` when already read (:func:`read_golden`).
    A metric that is null (not modelled) fails with a note rather than passing silently.
    """
    if a.kind == "golden":
        rows = golden if golden is not None else read_golden(a.golden)
        count, note = compare_hits(hits[0], hits[1], rows, hits[2])
        return Outcome(a, float(count), 0.0, count == 0, note)
    value = summary.get(a.metric)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Outcome(a, None, None, False, f"{a.metric} is n/a for this policy")
    value = float(value)
    if a.kind == "min":
        return Outcome(a, value, a.bound, value >= a.bound)
    if a.kind == "max":
        return Outcome(a, value, a.bound, value <= a.bound)
    base = (baseline or {}).get(a.trace, {}).get(a.policy, {}).get(a.metric)
    changed = pool_change(summary, (pools or {}).get(a.trace, {}).get(a.policy))
    if changed:
        return Outcome(a, value, None, False, changed)
    if base is None:
        return Outcome(a, value, None, False, "no baseline value for this pair: run with --update-baseline")
    limit = float(base) - a.bound if a.higher_is_better else float(base) + a.bound
    ok = value >= limit - 1e-12 if a.higher_is_better else value <= limit + 1e-12
    return Outcome(a, value, limit, ok, "" if ok else f"baseline {_num(float(base))}")


def run_check(config: CheckConfig, *, update_baseline: bool = False, quiet: bool = True, progress=None) -> CheckResult:
    """Replay every pair of *config* and evaluate every assertion.

    Parameters
    ----------
    config : CheckConfig
        From :func:`radixkv.check.config.load_config`.
    update_baseline : bool
        Rewrite ``config.baseline`` (atomically) with this run's metrics before the
        baseline assertions are evaluated (so they hold against the new baseline).
    quiet : bool
        No progress bars.
    progress : callable or None
        Called as ``progress(trace, policy, summary)`` after each replay.

    Returns
    -------
    CheckResult

    Raises
    ------
    radixkv.errors.InputError
        A trace that cannot be read, a pool too small for a request, a missing or
        malformed baseline or golden file.
    """
    from radixkv.replay.run import warmup_many
    from radixkv.replay.spec import ReplaySpec, run
    from radixkv.trace.load import load_trace

    if update_baseline and config.baseline is None:
        raise ConfigError("--update-baseline needs a top-level baseline = \"FILE\" in the configuration",
                          path=config.path, field="baseline")
    if update_baseline:  # the baseline writer is held to the rule every output is
        check_output_paths(config.baseline, inputs=config.input_files())
    baseline = pools = None
    if not update_baseline and any(a.kind == "baseline" for a in config.assertions):
        baseline = read_baseline(config.baseline)
        pools = read_baseline_pools(config.baseline)
    # every golden file is read (and checked) before the replays: a broken one is exit 2 at once
    goldens = {g: read_golden(g) for g in dict.fromkeys(a.golden for a in config.assertions if a.golden is not None)}
    pols = {p.label: p for p in config.policies}
    used = [pols[p] for _, p in config.pairs]
    from radixkv.replay.jit import trace_tokens

    loaded = {}
    work = []
    for t, p in config.pairs:
        tr = next(x for x in config.traces if x.name == t)
        if t not in loaded:
            loaded[t] = load_trace(tr.path, format=tr.format)
        work.append((pols[p].spec, trace_tokens(loaded[t], tr.limit)))
        _refuse_unfittable_pair(config, pols[p], t, loaded[t], tr.limit)  # before any kernel is compiled
    warmup_many(list(dict.fromkeys(p.spec for p in used)), work=work)
    need_hits = {(a.trace, a.policy) for a in config.assertions if a.kind == "golden"}
    summaries, hits = {}, {}
    for tr in config.traces:
        todo = [p for t, p in config.pairs if t == tr.name]
        if not todo:
            continue
        trace = loaded[tr.name]
        for label in todo:
            pe = pols[label]
            rec, summ = run(ReplaySpec(trace, pe.spec, pe.pool, limit=tr.limit, options=pe.options, quiet=quiet))
            summ = dict(summ)
            summ["policy"] = label
            summaries[(tr.name, label)] = summ
            if (tr.name, label) in need_hits:
                hits[(tr.name, label)] = (rec.req_id, rec["hit_tokens"], rec["prompt_tokens"])
            if progress is not None:
                progress(tr.name, label, summ)
    result = CheckResult(config, summaries)
    if update_baseline:
        write_baseline(config.baseline, summaries)
        result.baseline_written = config.baseline
        if any(a.kind == "baseline" for a in config.assertions):
            baseline = read_baseline(config.baseline)
    for a in config.assertions:
        key = (a.trace, a.policy)
        result.outcomes.append(evaluate(a, summaries[key], hits.get(key), baseline, goldens.get(a.golden), pools))
    return result


def _refuse_unfittable_pair(config: CheckConfig, entry, trace_name: str, trace, limit) -> None:
    """Build *entry*'s pool and check every request of *trace* (its first *limit*) fits it,
    before any kernel is compiled (:func:`radixkv.replay.run.refuse_unfittable`).

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the configuration file, the line of the policy's pool key and the field
        (``policy[N].capacity_tokens``, ...), with the trace and the pool's problem: a pool
        the policy cannot be built on (no whole block, more slots than modelled) or a
        request larger than the whole pool.
    """
    from radixkv.check.config import _Ctx
    from radixkv.replay.run import refuse_unfittable

    try:
        refuse_unfittable(trace, entry.spec, entry.pool, limit=limit, **entry.options)
    except ConfigError as e:
        index = config.policies.index(entry)
        key = next(k for k in ("capacity_tokens", "num_gpu_blocks", "max_total_num_tokens")
                   if getattr(entry.pool, k) is not None)
        try:
            ctx = _Ctx(config.path, Path(config.path).read_text(encoding="utf-8-sig"))
        except OSError:  # the configuration went away since it was read: no line to give
            ctx = _Ctx(config.path, "")
        raise ctx.error(f"trace {trace_name!r}: {e.reason}", table="policy", index=index, key=key) from None


def check(config_path, *, update_baseline: bool = False, quiet: bool = True) -> CheckResult:
    """Load the configuration at *config_path* and run it (:func:`run_check`)."""
    from radixkv.check.config import load_config

    return run_check(load_config(config_path), update_baseline=update_baseline, quiet=quiet)
