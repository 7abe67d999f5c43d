"""``radixkv replay | compare | curve``: the main job on a trace.

- ``replay``  one policy on one pool: a readable summary, ``--json`` and ``--per-request`` CSV.
- ``compare`` several policies on one pool size, side by side in one table.
- ``curve``   hit rate against pool capacity, one line per policy: JSON and a PNG.

Pool size: ``--capacity-tokens N`` (usable tokens), or the engines' own terms
``--num-gpu-blocks N`` (vLLM; block 0 reserved) / ``--max-total-num-tokens N`` (SGLang), or
the memory model (``--model M --gpu G`` with ``--gpu-memory-utilization``,
``--mem-fraction-static``, ``--kv-cache-dtype``, ``--tp``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from radixkv.cli import routing_args as _routing
from radixkv.cli._output import emit, files, human, inputs
from radixkv.cli.concurrent_args import refuse_scheduler_conflicts, refuse_sequential_only
from radixkv.flags.moot import refuse_moot_flags, refuse_moot_policy_flags
from radixkv.cli.report_cmd import run_tables, write_run_report
from radixkv.cli import traffic_args as _traffic
from radixkv.errors import ConfigError
from radixkv.cli.host_tier_args import host_tier_spec
from radixkv.flags.concurrent import add_concurrent_args, refuse_concurrent_only_flags
from radixkv.flags.executor import add_executor_args
from radixkv.flags.output import add_json_arg, add_report_arg
from radixkv.flags.replay import (TIMING_HELP, add_miss_args, add_policy_size_args, add_pool_args, add_replay_flags,
                                  add_trace_args, add_window_arg, int_tokens)
from radixkv.flags.routing import add_routing_args
from radixkv.flags.traffic import add_traffic_args
from radixkv.policies.registry import PolicySpec, parse_policy
from radixkv.replay.pool_settings import check_pool_args as _check_pool_args
from radixkv.replay.pool_settings import pool_for_policy
from radixkv.report import CONCURRENT_ROWS as _CONCURRENT_ROWS
from radixkv.report import format_table, steps_lines
from radixkv.util import atomic_write_text, check_output_paths, dumps_json


# ---------------------------------------------------------------------- arguments (the flags: radixkv.flags)
def _context(args) -> int | None:
    """The context length the flags give (``--max-model-len``, else ``--model``'s), or None."""
    from radixkv.replay.context import resolve_max_model_len

    return resolve_max_model_len(getattr(args, "model", None), getattr(args, "max_model_len", None))


def _served(trace, spec, args):
    """``--explain``: the first ``--limit`` requests the engine serves under the context
    length (:mod:`radixkv.replay.context`; ``args.limit`` is then cleared), so request
    rows match the replay's; explaining a refused request is an error saying so."""
    from radixkv.replay.context import apply_context_limit, engine_of

    t, ctx = apply_context_limit(trace.head(args.limit), _context(args), engine_of(spec))
    args.limit = None
    if ctx is not None and str(args.explain) in ctx.rejected_ids:
        raise ConfigError(f"request {args.explain!r} is not served: its prompt is longer than {spec.label}'s engine "
                          f"({ctx.engine}) accepts with max_model_len {ctx.max_model_len} (radixkv/replay/context.py)",
                          field="explain")
    return t


def _load(args):
    from radixkv.trace.load import load_trace

    t0 = time.perf_counter()
    trace = _traffic.apply_isolation(load_trace(args.trace, format=args.format), args)
    if len(trace) and trace.ids.size == 0 and trace.out_ids is None:
        if getattr(args, "miss_causes", False) or getattr(args, "miss_fix", False):
            raise ConfigError("--miss-causes needs a trace with prefix/hash ids; this one gives lengths only, so "
                              "no token can be shown to be a reuse", path=args.trace, field="miss_causes")
        print(f"radixkv: warning: {args.trace} gives lengths only (no prefix/hash ids): no two requests can be "
              f"shown to share a prefix, so every hit rate is 0 by construction", file=sys.stderr)
    if getattr(args, "by", None):  # a trace without the attribute is refused before any replay
        from radixkv.breakdown import group_labels

        group_labels(trace, args.by, 0)
    return trace, time.perf_counter() - t0


# ---------------------------------------------------------------------- output

def _doc(trace, args, load_s, results, pools):
    doc = {
        "radixkv": __import__("radixkv").__version__,
        "trace": {
            "path": str(args.trace),
            "name": trace.name,
            "requests": len(trace) if args.limit is None else min(len(trace), args.limit),
            "unit_tokens": trace.unit_tokens,
        },
        "limit": args.limit,
        "results": [],
    }
    for (spec, summ), pool in zip(results, pools):
        s = dict(summ)
        timing = s.pop("timing_s")
        entry = {"policy": spec.label, "pool": pool, "summary": s}
        if getattr(args, "mode", None) == "concurrent":  # the clock, when not the default (outputs unchanged)
            if (getattr(args, "cost_model", None) or "roofline") != "roofline":
                entry["cost_model"] = args.cost_model
            if float(getattr(args, "request_intake_s", 0.0) or 0.0) != 0.0:
                entry["request_intake_s"] = float(args.request_intake_s)
        if not getattr(args, "no_timing", False):
            entry["timing_s"] = timing
        doc["results"].append(entry)
    if not getattr(args, "no_timing", False):
        doc["load_s"] = load_s
    return doc


def _replay_spec(trace, spec, pool, args, *, fix: bool = True):
    """The :class:`~radixkv.replay.spec.ReplaySpec` of the flags: *spec* on *pool* over
    *trace* (``--limit`` applied by the replay), the flags as its knobs; ``--verify``,
    ``--miss-causes``/``--miss-fix`` (*fix* False: the causes without the fix, for a
    replay that is one point of a fix or a rerun) and ``--measure-last``."""
    from radixkv.replay.spec import ReplaySpec

    miss = _miss_options(args).get("miss_causes", False)
    if miss and not fix:
        miss = True
    return ReplaySpec(trace, spec, pool, mode=getattr(args, "mode", "sequential"), limit=args.limit, knobs=args,
                      options=_verify_option(args), miss_causes=miss,
                      measure_last=getattr(args, "measure_last", None), quiet=args.quiet)


def _run(trace, spec, pool, args, *, fix: bool = True):
    """One replay of the flags (:func:`radixkv.replay.spec.run` on :func:`_replay_spec`), with
    the command line's progress bar and warnings; returns (result, summary)."""
    from radixkv.replay.spec import run

    rs = _replay_spec(trace, spec, pool, args, fix=fix)
    if rs.mode != "concurrent" or _routing.routed(args):
        return run(rs)
    _warn_if_nothing_to_prioritise(trace, args)
    bar = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(trace.head(args.limit)), desc=spec.label, unit="req", delay=2.0, leave=False)

    def progress(done, total):
        if bar is not None:
            bar.n = done
            bar.refresh()

    res, summ = run(rs, progress=progress)
    if bar is not None:
        bar.close()
    _warn_if_overloaded(spec.label, res)
    return res, summ


def _warn_if_nothing_to_prioritise(trace, args) -> None:
    """Priority scheduling on a trace whose requests all have one priority (or none: every
    request counts as 0) orders exactly as FCFS does: said on stderr, so that a trace whose
    reader dropped the field (e.g. Mooncake's format has none) is not read as a result."""
    on = (getattr(args, "scheduling_policy", "fcfs") == "priority"
          or getattr(args, "enable_priority_scheduling", False))
    if not on:
        return
    import numpy as np

    pr = trace.priority
    if pr is None or np.unique(np.asarray(pr)).size <= 1:
        what = "gives no priority" if pr is None else "gives every request the same priority"
        print(f"radixkv: warning: {trace.name or args.trace} {what}: priority scheduling orders it as FCFS does",
              file=sys.stderr)


def _warn_if_overloaded(label: str, res) -> None:
    """A replay whose queue never drained (:func:`radixkv.replay.overload.overload_of`, the
    test ``plan`` and sweep cells apply) says so on stderr: its TTFT percentiles measure the
    trace's length, not the engine's latency."""
    from radixkv.replay.overload import overload_of

    ov = overload_of(res)
    if ov.get("overloaded"):
        print(f"radixkv: warning: {label}: overloaded — the queue grows {ov['queue_growth_s_per_s']:.2f} s per s "
              f"of traffic and the last quarter of arrivals waited {ov['queue_tail_mean_s']:,.1f} s on average; "
              "the offered load exceeds this deployment, so TTFT here is queueing time (spread the arrivals with "
              "--time-scale > 1, or add GPUs or replicas)", file=sys.stderr)


# ---------------------------------------------------------------------- verbs
def cmd_replay(args) -> int:
    """Replay a trace through one policy on one pool: print a summary table; write the
    summary as JSON (``--json``), one CSV row per request (``--per-request``) and, in the
    concurrent mode, the engine-step timeline (``--timeline``)."""
    timeline = getattr(args, "timeline", None)
    outs = (args.json, args.per_request, timeline, args.report)
    check_output_paths(*files(*outs), inputs=inputs(args))
    if timeline and args.mode != "concurrent":
        raise ConfigError("--timeline records engine steps: it needs --mode concurrent", field="timeline")
    _check_pool_args(args)
    refuse_concurrent_only_flags(args)
    refuse_moot_flags(args)
    spec = host_tier_spec(parse_policy(args.policy, block_size=args.block_size, page_size=args.page_size), args)
    _refuse_unused_size_flags(args, [spec])
    refuse_moot_policy_flags(args, [spec], per_engine_rule=args.per_engine_rule)
    refuse_scheduler_conflicts(args, [spec], routed=_routing.routed(args))
    pool, desc = pool_for_policy(args, spec, per_engine_rule=args.per_engine_rule)
    trace, load_s = _load(args)

    _check_miss_args(args)
    _check_window_arg(args)
    _traffic.check_traffic_args(args)
    if getattr(args, "explain", None) is not None:
        return _explain(args, spec, pool)
    if _routing.routed(args):
        if timeline:
            raise ConfigError("--timeline records one engine's steps; with --replicas each replica steps on its "
                              "own (use --per-request: its replica column names the replica of each request)",
                              field="timeline")
        if (args.per_request or args.report) and args.mode != "concurrent":
            raise ConfigError("--per-request and --report with --replicas need --mode concurrent (the sequential "
                              "replicas keep no per-request rows)", field="per_request" if args.per_request
                              else "report")
        res, summ = _run(trace, spec, pool, args)
        return _routing.report_replay(trace, spec, res, summ, args, load_s, desc, _doc, format_table)
    if args.mode == "concurrent":
        from radixkv.replay.run import refuse_unfittable

        refuse_unfittable(trace, spec, pool, limit=args.limit, max_model_len=_context(args), **_verify_option(args))
    rec, summ = _run(trace, spec, pool, args)  # host-tier bytes priced by run() on --model
    out = human(*outs)
    print(f"trace {args.trace}: {summ['requests']:,} requests, unit_tokens={trace.unit_tokens}; {args.mode} replay; "
          f"load {load_s:.2f} s, compile {summ['timing_s']['compile']:.2f} s", file=out)
    print(format_table([summ], rows_spec=_CONCURRENT_ROWS if args.mode == "concurrent" else None), file=out)
    for line in steps_lines([summ]):
        print(line, file=out)
    _traffic.traffic_reports(trace, spec.label, rec, summ, args, lambda t: _rerun(t, spec, pool, args), out)
    doc = _doc(trace, args, load_s, [(spec, summ)], [desc])
    emit(args.json, dumps_json(doc), *outs)
    write_run_report(args.report, doc, run_tables(spec.label, rec), stream=out)
    if args.per_request:
        rec.write_csv(args.per_request)
        print(f"wrote {args.per_request}", file=out)
    if timeline:
        rec.write_timeline_csv(timeline)
        print(f"wrote {timeline}", file=out)
    return 0


def _rerun(trace, spec, pool, args):
    """The per-request result of the same replay on *trace* (``--isolation-price``)."""
    return _run(trace, spec, pool, argparse.Namespace(**{**vars(args), "quiet": True, "measure_last": None}),
                fix=False)[0]


def _verify_option(args) -> dict:
    """The policy keyword of ``--verify`` (sequential, concurrent and ``--explain`` alike;
    :func:`radixkv.flags.moot.refuse_moot_policy_flags` refuses it for a policy
    without the check)."""
    return {"verify": True} if getattr(args, "verify", False) else {}


def _explain(args, spec, pool) -> int:
    """``replay --explain REQUEST_ID``: print (and with ``--json`` write) why that request
    missed what it missed (:func:`radixkv.replay.misses.explain`)."""
    from radixkv.replay.misses import explain, format_explain
    from radixkv.replay.run import warmup

    if args.mode == "concurrent":
        return _explain_concurrent(args, spec, pool)
    if _routing.routed(args):
        raise ConfigError("--explain with --replicas needs --mode concurrent (the sequential replicas' causes are "
                          "not modelled)", field="explain")
    trace = _served(_load(args)[0], spec, args)
    warmup(spec, concurrent=False)
    ex = explain(trace, spec, pool, args.explain, limit=args.limit, **_verify_option(args))
    out = human(args.json)
    print(format_explain(ex), file=out)
    emit(args.json, dumps_json({"policy": spec.label, "explain": ex}), args.json)
    return 0


def _explain_concurrent(args, spec, pool) -> int:
    """``replay --mode concurrent --explain REQUEST_ID`` (also with ``--replicas``): one
    concurrent replay with the miss causes and an
    :class:`~radixkv.replay.conc_explain.ExplainRecorder` per engine, then
    :func:`~radixkv.replay.conc_explain.explain_concurrent`."""
    from radixkv.replay.conc_explain import ExplainRecorder, explain_concurrent, find_row, format_explain_concurrent

    import dataclasses

    from radixkv.replay.spec import run

    t = _served(_load(args)[0], spec, args)
    row = find_row(t, args.explain)
    args.miss_causes = True
    made: list = []
    routed = _routing.routed(args)

    def make(tr, p, c, r=None):
        made.append(ExplainRecorder(tr, p, c, **({} if r is None else {"replica": r}), watch=row))
        return made[-1]

    res, _ = run(dataclasses.replace(_replay_spec(t, spec, pool, args, fix=False), miss_causes=True),
                 recorder_factory=make)
    agg, replica = (res.aggregate, res.replica) if routed else (res, None)
    recs = made
    ex = explain_concurrent(t, spec, row, agg, recs, replica=replica)
    out = human(args.json)
    print(format_explain_concurrent(ex), file=out)
    emit(args.json, dumps_json({"policy": spec.label, "explain": ex}), args.json)
    return 0


def _policies(args) -> list[PolicySpec]:
    """The ``--policies`` list, parsed; an empty entry (``a,,b``, a trailing comma) or a policy
    named twice (``vllm,vllm:16``) is a :class:`ConfigError` naming the entry."""
    toks = args.policies.split(",")
    if not args.policies.strip():
        raise ConfigError("--policies is empty", field="policies")
    specs, seen = [], {}
    for k, t in enumerate(toks, 1):
        if not t.strip():
            raise ConfigError(f"--policies entry {k} of {len(toks)} is empty (a stray comma?) in {args.policies!r}",
                              field="policies")
        spec = parse_policy(t, block_size=args.block_size, page_size=args.page_size)
        if getattr(spec.build_class, "models_host_tier", False):
            spec = host_tier_spec(spec, args)
        if spec.label in seen:
            raise ConfigError(f"--policies entry {k} ({t.strip()!r}) is the same policy as entry {seen[spec.label]} "
                              f"({spec.label}); each policy is replayed once", field="policies")
        seen[spec.label] = k
        specs.append(spec)
    _refuse_unused_size_flags(args, specs)
    return specs


def _refuse_unused_size_flags(args, specs) -> None:
    """``--block-size`` / ``--page-size`` set the size of the policies whose knob that is
    (vLLM's ``block_size``, SGLang's ``page_size``); given when no policy has that knob
    (``--page-size 4 --policy vllm:16``) the value would go unused, so it is a
    :class:`ConfigError` naming the flag."""
    for flag, knob in (("--block-size", "block_size"), ("--page-size", "page_size")):
        if getattr(args, knob, None) is None or any(s.build_class.size_name == knob for s in specs):
            continue
        labels = ", ".join(s.label for s in specs)
        raise ConfigError(f"{flag} sets a policy's {knob}, and {labels} {'has' if len(specs) == 1 else 'have'} "
                          f"none: drop {flag}, or give the size in the policy (vllm:32, sglang:16)", field=knob)


def cmd_compare(args) -> int:
    """Replay a trace through several policies on one pool size; print one column per policy
    and write the summaries as JSON (``--json``)."""
    check_output_paths(*files(args.json, args.report, args.miss_plot), inputs=inputs(args))
    if getattr(args, "timeline", None):
        raise ConfigError("--timeline is written by 'radixkv replay' (one policy)", field="timeline")
    if args.miss_plot:
        args.miss_causes = True
    _check_pool_args(args)
    refuse_concurrent_only_flags(args)
    refuse_moot_flags(args)
    specs = _policies(args)
    refuse_moot_policy_flags(args, specs, per_engine_rule=args.per_engine_rule)
    refuse_scheduler_conflicts(args, specs, routed=_routing.routed(args))
    _check_miss_args(args)
    _check_window_arg(args)
    if _routing.routed(args):
        if _executor(args) != "local":
            raise ConfigError(f"--replicas runs on the local executor, not --executor {_executor(args)}",
                              field="replicas")
        if args.report and args.mode != "concurrent":
            raise ConfigError("--report with --replicas needs --mode concurrent (the sequential replicas keep no "
                              "per-request rows)", field="report")
    pools = [pool_for_policy(args, s, per_engine_rule=args.per_engine_rule) for s in specs]
    trace, load_s = _load(args)
    from radixkv.replay.jit import trace_tokens
    from radixkv.replay.run import warmup_many

    concurrent = args.mode == "concurrent"
    if not _routing.routed(args) and not getattr(args, "skip_too_small", False):
        from radixkv.replay.run import refuse_unfittable

        for s, (pool, _) in zip(specs, pools):  # before any compile
            refuse_unfittable(trace, s, pool, limit=args.limit, max_model_len=_context(args))
    warmup_many(specs, work=None if concurrent else [(s, trace_tokens(trace, args.limit)) for s in specs],
                concurrent=concurrent, lean=trace.unit_tokens == 1)
    results = []
    tables: list = []
    remote = _executor(args) != "local"
    _traffic.check_traffic_args(args, remote=remote)
    recs = []
    if remote:
        for spec, summ in zip(specs, _on_executor(args, trace, [{"policy": s.label} for s in specs])):
            if isinstance(summ, Exception):
                raise summ
            results.append((spec, summ))
    from radixkv.replay.settings import args_for_rule

    rules = [args.admission or getattr(s.build_class, "admission_rule", "vllm") for s in specs] if concurrent else []
    for i, (spec, (pool, _)) in enumerate(zip(specs, [] if remote else pools)):
        if _routing.routed(args):  # the replicas' result: --report's tables from the aggregate
            res, summ = _run(trace, spec, pool, args)
            rec = None
            if args.report:
                tables += run_tables(summ["policy"], res.aggregate)
        else:  # each engine's scheduler knobs to its own policies
            rec, summ = _run(trace, spec, pool, args_for_rule(args, rules[i], rules) if concurrent else args)
        results.append((spec, summ))
        recs.append((spec, pool, rec))
        if args.report and rec is not None:
            tables += run_tables(spec.label, rec)
    n = results[0][1]["requests"]
    mode = "concurrent replay" if concurrent else "sequential replay"
    out = human(args.json, args.report)
    print(f"trace {args.trace}: {n:,} requests, unit_tokens={trace.unit_tokens}, {mode}, load {load_s:.2f} s", file=out)
    print(format_table([s for _, s in results], rows_spec=_CONCURRENT_ROWS if concurrent else None), file=out)
    for line in steps_lines([s for _, s in results]):
        print(line, file=out)
    for (spec, pool, rec), (_, summ) in zip(recs, results):
        _traffic.traffic_reports(trace, spec.label, rec, summ, args,
                                 lambda t, spec=spec, pool=pool: _rerun(t, spec, pool, args), out)
    for _, s in results:
        if "routing" in s:
            print(_routing.describe(s), file=out)
    doc = _doc(trace, args, load_s, results, [d for _, d in pools])
    emit(args.json, dumps_json(doc), args.json, args.report)
    write_run_report(args.report, doc, tables, stream=out)
    if args.miss_plot:
        from radixkv.plots import plot_miss_causes

        plot_miss_causes([(s["policy"], s["miss_causes"]) for _, s in results], args.miss_plot,
                         title=f"{trace.name or args.trace}: prompt tokens by miss cause")
        print(f"wrote {args.miss_plot}", file=out)
    return 0


def _check_out_prefix(out) -> None:
    """Refuse a ``curve --out`` that names a file rather than a prefix (``x.png``, ``x.json``).

    Raises
    ------
    radixkv.errors.ConfigError
        *out* ending in ``.json`` or ``.png`` (any case): it would write ``x.png.json`` and
        ``x.png.png``; the message names ``--out`` and the prefix to give."""
    if out is None:
        return
    stem, ext = os.path.splitext(out)
    if ext.lower() in (".json", ".png"):
        raise ConfigError(f"--out is a PREFIX: it writes PREFIX.json and PREFIX.png, so --out {out} would write "
                          f"{out}.json and {out}.png; give --out {stem}", field="out")


def cmd_curve(args) -> int:
    """Hit rate against pool capacity, one line per policy: print one line per (policy,
    capacity); ``--out PREFIX`` writes PREFIX.json and PREFIX.png, ``--json`` the JSON
    alone. Nothing is written unless asked."""
    _check_out_prefix(args.out)
    outs = (args.json, args.report) + ((args.out + ".json", args.out + ".png") if args.out else ())
    check_output_paths(*files(*outs), inputs=inputs(args))
    refuse_moot_flags(args)
    specs = _policies(args)
    refuse_moot_policy_flags(args, specs)
    refuse_sequential_only(args, specs)
    if args.miss_causes and _executor(args) != "local":
        raise ConfigError("--miss-causes runs on the local executor", field="miss_causes")
    _check_window_arg(args)
    try:
        caps = [int_tokens(c) for c in args.capacities.split(",") if c.strip()]
    except argparse.ArgumentTypeError as e:
        raise ConfigError(str(e), field="capacities") from None
    if getattr(args, "pool_from_log", None) is not None:
        from radixkv.memory.startup_log import read_startup_log

        logged = read_startup_log(args.pool_from_log).capacity_tokens
        caps = sorted(set(caps) | {logged})
        print(f"pool from {args.pool_from_log}: {logged:,} tokens (added to --capacities)", file=sys.stderr)
    if not caps:
        raise ConfigError("--capacities is empty", field="capacities")
    if args.host_capacities is not None:
        if args.measure_last is not None:
            raise ConfigError("--measure-last is not reported by the host-capacity curve (--host-capacities): drop one",
                              field="measure_last")
        return _host_curve(args, specs, caps, outs)
    if args.single_tier is not None:
        raise ConfigError("--single-tier goes with --host-capacities", field="single_tier")
    from radixkv import cli
    from radixkv.plots import png_writer

    # the PNG's drawing process (where forking helps) imports matplotlib during the replay
    with png_writer(background=bool(args.out), ends_process=cli.PROGRAM) as png:
        return _curve(args, specs, caps, outs, png)


def _curve(args, specs, caps, outs, png) -> int:
    """``curve`` without ``--host-capacities``, its flags checked; *png* a
    :func:`radixkv.plots.png_writer` (used with ``--out``)."""
    trace, load_s = _load(args)
    from radixkv.replay.curve import run_curve
    from radixkv.replay.jit import trace_tokens
    from radixkv.replay.run import warmup_many

    warmup_many(specs, work=[(s, trace_tokens(trace, args.limit) * len(caps)) for s in specs], concurrent=False)
    done = {}
    if _executor(args) != "local":
        cells = [(spec, cap) for spec in specs for cap in caps]
        settings = [{"policy": spec.label, "capacity_tokens": cap} for spec, cap in cells]
        done = {c: r if isinstance(r, Exception) else (None, r)
                for c, r in zip(cells, _on_executor(args, trace, settings))}
    curves = []
    for spec in specs:
        pts = []
        results = ([done[spec, cap] for cap in caps] if done
                   else run_curve(trace, spec, caps, limit=args.limit, quiet=args.quiet,
                                  measure_last=args.measure_last))
        for cap, res in zip(caps, results):
            if isinstance(res, Exception) and not isinstance(res, ConfigError):
                raise res
            if isinstance(res, ConfigError):
                if not args.skip_too_small:
                    raise res
                pts.append({"capacity_tokens": cap, "skipped": res.reason})
                print(f"{spec.label} @ {cap:,}: skipped ({res.reason})", file=sys.stderr)
                continue
            _, s = res
            pts.append({
                "capacity_tokens": cap,
                "token_hit_rate": s["token_hit_rate"],
                "mean_request_hit_ratio": s["mean_request_hit_ratio"],
                "request_hit_rate": s["request_hit_rate"],
                "hit_tokens": s["hit_tokens"],
                "evicted_tokens": s["evicted_tokens"],
                **({} if args.no_timing else {"replay_s": s["timing_s"]["replay"]}),
            })
            if args.measure_last is not None:
                pts[-1]["measure_window"] = s["measure_window"]
            if args.miss_causes:
                from radixkv.replay.misses import causes_at_capacity

                pts[-1]["miss_causes"] = causes_at_capacity(trace, spec, s["hit_tokens"], limit=args.limit)
            win = s.get("measure_window") if args.measure_last is not None else None
            last = (f"; last {args.measure_last:.0%} of requests: token hit rate "
                    f"{win['token_hit_rate']:.4f}" if win and win.get("token_hit_rate") is not None else "")
            print(f"{spec.label:>10} @ {cap:>12,} tokens: token hit rate {s['token_hit_rate']:.4f}, "
                  f"mean per-request {s['mean_request_hit_ratio']:.4f}{last} ({s['timing_s']['replay']:.2f} s)",
                  file=human(*outs))
        curves.append({"policy": spec.label, "points": pts})
    doc = {
        "radixkv": __import__("radixkv").__version__,
        "trace": {"path": str(args.trace), "name": trace.name, "unit_tokens": trace.unit_tokens},
        "limit": args.limit,
        "curves": curves,
    }
    if args.out:
        from radixkv.plots import curves_png

        png.submit(curves_png, doc, metric=args.metric, window=args.measure_last is not None)
    emit(args.json, dumps_json(doc), *outs)
    write_run_report(args.report, doc, stream=human(*outs))
    if args.out:
        out_json = args.out + ".json"
        out_png = args.out + ".png"
        atomic_write_text(out_json, dumps_json(doc))
        png.write(out_png)
        print(f"wrote {out_json} and {out_png}", file=human(*outs))
    return 0


_HOST_POINT_KEYS = ("token_hit_rate", "hit_tokens", "device_hit_tokens", "host_hit_tokens", "host_loaded_tokens",
                    "host_hit_rate", "gpu_to_host_tokens", "host_to_gpu_tokens", "host_evicted_tokens",
                    "storage_hit_tokens", "storage_to_host_tokens", "host_to_storage_tokens")


def _host_curve(args, specs, caps, outs) -> int:
    """``curve --host-capacities``: each host-tier policy at one GPU pool (the single
    ``--capacities`` value) and every host pool; ``--single-tier SPEC`` adds SPEC at one
    pool of GPU + host tokens per point. Points are keyed by ``host_capacity_tokens``."""
    if len(caps) != 1:
        raise ConfigError(f"--host-capacities sweeps the host pool at one GPU pool: give one --capacities value "
                          f"(got {len(caps)})", field="capacities")
    if _executor(args) != "local" or args.miss_causes:
        raise ConfigError("--host-capacities runs on the local executor, without --miss-causes",
                          field="host_capacities")
    try:
        hosts = [int_tokens(c) for c in args.host_capacities.split(",") if c.strip()]
    except argparse.ArgumentTypeError as e:
        raise ConfigError(str(e), field="host_capacities") from None
    if not hosts:
        raise ConfigError("--host-capacities is empty", field="host_capacities")
    if 0 in hosts:
        l3 = next((s for s in specs if dict(_spec_options(s)).get("hicache_storage_backend")), None)
        if l3 is not None:
            raise ConfigError(f"--host-capacities 0 turns the host tier off at that point, and the L3 store of "
                              f"{l3.label} (--hicache-storage-backend) sits behind the host tier: it cannot run "
                              f"without one. Drop 0 from --host-capacities (compare --single-tier for no host "
                              f"tier) or drop --hicache-storage-backend", field="host_capacities")
    gpu = caps[0]
    singles = []
    if args.single_tier:
        singles = [parse_policy(t, block_size=args.block_size, page_size=args.page_size)
                   for t in args.single_tier.split(",") if t.strip()]
    from radixkv import cli
    from radixkv.plots import png_writer

    with png_writer(background=bool(args.out), ends_process=cli.PROGRAM) as png:  # as in cmd_curve
        return _host_curve_points(args, specs, singles, gpu, hosts, outs, png)


def _host_curve_points(args, specs, singles, gpu, hosts, outs, png) -> int:
    """:func:`_host_curve` after its flags are checked: *singles* the ``--single-tier``
    specs, *gpu* the GPU pool, *hosts* the host pools; *png* a
    :func:`radixkv.plots.png_writer` (used with ``--out``)."""
    from radixkv.replay.curve import run_curve, run_host_curve

    trace, load_s = _load(args)
    curves = []
    out = human(*outs)

    def point(h, total, res, label, single=False):
        if isinstance(res, ConfigError):
            if not args.skip_too_small:
                raise res
            print(f"{label} @ host {h:,}: skipped ({res.reason})", file=sys.stderr)
            return {"host_capacity_tokens": h, "capacity_tokens": total, "skipped": res.reason}
        s = res[1]
        pt = {"host_capacity_tokens": h, "capacity_tokens": total, **{k: s.get(k) for k in _HOST_POINT_KEYS}}
        if not args.no_timing:
            pt["replay_s"] = s["timing_s"]["replay"]
        where = f"one pool of {total:,}" if single else f"GPU {gpu:,} + host {h:,}"
        print(f"{label:>10} @ {where} tokens: token hit rate {s['token_hit_rate']:.4f} "
              f"({s['timing_s']['replay']:.2f} s)", file=out)
        return pt

    for spec in specs:
        res = run_host_curve(trace, spec, gpu, hosts, limit=args.limit, quiet=args.quiet)
        curves.append({"policy": spec.label, "gpu_capacity_tokens": gpu, "tiers": 2,
                       "points": [point(h, gpu, r, spec.label) for h, r in zip(hosts, res)]})
    for spec in singles:
        res = run_curve(trace, spec, [gpu + h for h in hosts], limit=args.limit, quiet=args.quiet)
        curves.append({"policy": spec.label, "gpu_capacity_tokens": gpu, "tiers": 1,
                       "points": [point(h, gpu + h, r, spec.label, True) for h, r in zip(hosts, res)]})
        for p in curves[-1]["points"]:  # the single tier has no host pool: its hit is all on the GPU
            for k in _HOST_POINT_KEYS[2:]:
                p.pop(k, None)
    doc = {
        "radixkv": __import__("radixkv").__version__,
        "trace": {"path": str(args.trace), "name": trace.name, "unit_tokens": trace.unit_tokens},
        "limit": args.limit,
        "x": "host_capacity_tokens",
        "curves": curves,
    }
    if args.out:
        from radixkv.plots import curves_png

        png.submit(curves_png, doc, metric=args.metric, x="host_capacity_tokens")
    emit(args.json, dumps_json(doc), *outs)
    write_run_report(args.report, doc, stream=out)
    if args.out:
        atomic_write_text(args.out + ".json", dumps_json(doc))
        png.write(args.out + ".png")
        print(f"wrote {args.out}.json and {args.out}.png", file=out)
    return 0


def _spec_options(spec) -> tuple:
    """A spec's ``@key=value`` options as (key, value) pairs (none for a plain ``@VALUE``)."""
    o = spec.option
    return o if isinstance(o, tuple) and all(isinstance(x, tuple) and len(x) == 2 for x in o) else ()


def _executor(args) -> str:
    """``--executor`` of ``compare``/``curve`` (``local`` unless asked)."""
    from radixkv.cli.sweep_cmd import resolve_executor

    return resolve_executor(args)


def _on_executor(args, trace, settings_list):
    """Summaries of replays of *trace* (``args``'s flags, each overridden by a settings
    dict) on ``--executor``, in order; a failed replay is returned as its exception."""
    from radixkv.sweep.grid import replay_defaults
    from radixkv.sweep.run import run_settings

    base = {k: getattr(args, k) for k in replay_defaults() if hasattr(args, k)}
    settings_list = [{**base, **s} for s in settings_list]
    res = run_settings(trace, settings_list, executor=_executor(args), workers=args.workers,
                       scheduler=args.scheduler, trace_path=args.trace, trace_format=args.format)
    out = []
    for s, r in zip(settings_list, res):
        if r["ok"]:
            out.append({"policy": s["policy"], **r["metrics"], "timing_s": r["timing_s"]})
        else:
            e = r["error"]
            out.append(ConfigError(e.get("reason", e["message"]), field=e.get("field")) if e["type"] == "ConfigError"
                       else RuntimeError(f"{s['policy']}: {e['type']}: {e['message']}"))
    return out


def _check_miss_args(args):
    """``--miss-causes`` and ``--miss-fix`` (which implies it) run with the sequential
    single-pool replay and the concurrent one (one engine or ``--replicas``)."""
    if not (getattr(args, "miss_causes", False) or getattr(args, "miss_fix", False)):
        return
    if getattr(args, "miss_fix", False) and args.mode != "concurrent" and _routing.routed(args):
        raise ConfigError("--miss-fix with --replicas needs --mode concurrent (the sequential replicas' causes "
                          "are not modelled)", field="miss_fix")
    if getattr(args, "miss_fix", False):
        args.miss_causes = True
    if args.mode != "concurrent" and _routing.routed(args):
        raise ConfigError("--miss-causes with --replicas needs --mode concurrent (the sequential replicas' causes "
                          "are not modelled)", field="miss_causes")
    if (getattr(args, "executor", None) is not None or getattr(args, "scheduler", None)) and _executor(args) != "local":
        raise ConfigError("--miss-causes runs on the local executor", field="miss_causes")


def _miss_options(args) -> dict:
    """The miss-cause flags as keywords: ``{"miss_causes": True or "fix"}``, or ``{}`` when
    both are off (:attr:`radixkv.replay.spec.ReplaySpec.miss_causes`)."""
    fix = bool(getattr(args, "miss_fix", False))
    if not (fix or getattr(args, "miss_causes", False)):
        return {}
    return {"miss_causes": "fix" if fix else True}


def _check_window_arg(args) -> None:
    """``--measure-last``: a share in (0, 1], on the sequential single-pool local replay
    (the windowed metrics are of :func:`radixkv.metrics.window_summary`)."""
    f = getattr(args, "measure_last", None)
    if f is None:
        return
    from radixkv.metrics import window_start

    window_start(0, f)
    if getattr(args, "mode", "sequential") == "concurrent":
        raise ConfigError("--measure-last is a metric of the sequential replay (each request alone, in trace order): "
                          "drop it, or drop --mode concurrent", field="measure_last")
    if getattr(args, "replicas", None) is not None and _routing.routed(args):
        raise ConfigError("--measure-last is a metric of the one-pool sequential replay: drop it or --replicas",
                          field="measure_last")
    if getattr(args, "explain", None) is not None:
        raise ConfigError("--measure-last is a metric of the replay; --explain replaces the replay by one request's "
                          "explanation: drop one", field="measure_last")
    if (getattr(args, "executor", None) is not None or getattr(args, "scheduler", None)) and _executor(args) != "local":
        raise ConfigError("--measure-last runs on the local executor", field="measure_last")


def register(sub) -> None:
    p = sub.add_parser("replay", help="replay a trace through one policy", description=cmd_replay.__doc__)
    add_replay_flags(p)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("compare", help="several policies on one pool, side by side", description=cmd_compare.__doc__)
    add_trace_args(p)
    p.add_argument("--policies", required=True, help="comma-separated policy specs, e.g. vllm:16,vllm:32,sglang:1,none")
    add_policy_size_args(p)
    add_pool_args(p)
    p.add_argument("--per-engine-rule", action="store_true",
                   help="with --model/--gpu: size each engine's pool by its own rule (default: vLLM's rule for all)")
    add_json_arg(p, "every policy's summary")
    add_report_arg(p)
    p.add_argument("--no-timing", action="store_true", help=TIMING_HELP)
    add_window_arg(p)
    add_miss_args(p)
    p.add_argument("--miss-plot", metavar="OUT.png", default=None,
                   help="write a stacked bar per policy of the miss causes to OUT.png (implies --miss-causes)")
    add_traffic_args(p)
    add_concurrent_args(p)
    add_executor_args(p)
    add_routing_args(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("curve", help="hit rate against pool capacity (JSON + PNG)", description=cmd_curve.__doc__)
    add_trace_args(p)
    p.add_argument("--policies", required=True, help="comma-separated policy specs, e.g. vllm:16,sglang:1,unit-lru")
    add_policy_size_args(p)
    p.add_argument("--capacities", default="1e4,1e5,1e6,2e6,3e6,5e6,1e7,5e7",
                   help="comma-separated pool sizes in tokens")
    p.add_argument("--pool-from-log", metavar="LOG", default=None,
                   help="add the pool a vLLM/SGLang start-up log shows to the capacities")
    p.add_argument("--host-capacities", default=None, metavar="LIST",
                   help="comma-separated host-memory KV pools in tokens (e.g. 0,1e6,4e6): a curve over host capacity "
                        "at the one GPU pool --capacities gives, for host-tier policies (sglang-hicache, vllm-offload)")
    p.add_argument("--single-tier", default=None, metavar="SPECS",
                   help="with --host-capacities: also replay these policies (e.g. sglang:1) at one pool of GPU + host "
                        "tokens per point")
    p.add_argument("--metric", default="token_hit_rate", choices=["token_hit_rate", "mean_request_hit_ratio"],
                   help="the y axis of the PNG (a ratio in [0, 1])")
    p.add_argument("--skip-too-small", action="store_true",
                   help="skip (policy, capacity) cells where a request does not fit instead of failing (default: fail)")
    p.add_argument("--out", default=None, metavar="PREFIX",
                   help="write PREFIX.json and PREFIX.png (a prefix: x, not x.png; default: nothing written)")
    add_json_arg(p, "the curves")
    add_report_arg(p)
    p.add_argument("--no-timing", action="store_true", help=TIMING_HELP)
    add_window_arg(p)
    p.add_argument("--miss-causes", action="store_true",
                   help="add the totals and shares of the miss causes to every point (one pair of shadow replays "
                        "per policy serves all capacities; docs/DESIGN.md)")
    add_executor_args(p)
    p.set_defaults(func=cmd_curve)
