"""``radixkv plan TRACE --model M --slo ttft_p99=2s,tpot_p99=50ms``: the cheapest deployment
that meets the SLO on the trace (:mod:`radixkv.plan`).

Prints the recommendation and runner-ups, the engine's command line, the prefix-caching
verdict, each knob's sensitivity and the search's counts; ``--json`` writes the plan's
document, ``--plot`` the Pareto plot (cost vs TTFT p99), ``--report`` an HTML page of it
(:mod:`radixkv.plan.html`). Exit 2 for bad input, and when no
configuration meets the SLO (the message names the closest and the SLO terms it misses).
"""
from __future__ import annotations

import sys


def cmd_plan(args) -> int:
    """Find the cheapest deployment (GPU type, TP, replicas and router, prefix caching,
    gpu_memory_utilization / mem_fraction_static, max_num_batched_tokens, max_num_seqs,
    block/page size, KV dtype) whose concurrent replay of TRACE meets the SLO. Points are
    pruned by the memory model and the roofline's throughput bound, replica counts
    bisected, knobs refined one at a time; every point evaluated is a concurrent replay
    run as a sweep cell (resumable with --work-dir; --executor processes|dask)."""
    from radixkv.cli._output import emit, files, human
    from radixkv.plan import make_plan
    from radixkv.plan.report import format_plan, pareto_plot, plan_doc
    from radixkv.plan.spec import PlanSpec, load_spec, parse_engines, parse_prices, parse_slo
    from radixkv.util import check_output_paths, dumps_json

    check_output_paths(*files(args.json, args.plot, args.report), inputs=[p for p in (args.trace, args.spec) if p])
    over = dict(model=args.model, rate_scale=args.rate_scale, budget=args.budget, executor=args.executor,
                workers=args.workers, work_dir=args.work_dir, max_replicas=args.max_replicas,
                cost_model=args.cost_model)
    if args.spec:
        if args.trace:
            over["trace"] = args.trace
        if args.slo:
            over["slo"] = args.slo
        if args.gpus:
            over["gpus"] = args.gpus.split(",")
        if args.price:
            over["price"] = args.price
        if args.engine:
            over["engine"] = args.engine
        spec = load_spec(args.spec, **over)
    else:
        from radixkv.errors import ConfigError

        for k in ("trace", "model", "slo"):
            if not getattr(args, k):
                raise ConfigError(f"give {'TRACE' if k == 'trace' else '--' + k} (or --spec PLAN.toml)", field=k)
        kw = {k: v for k, v in over.items() if v is not None}
        if args.gpus:
            kw["gpus"] = tuple(g.strip() for g in args.gpus.split(",") if g.strip())
        if args.tp:
            try:
                kw["tps"] = tuple(int(t) for t in args.tp.split(","))
            except ValueError:
                raise ConfigError(f"--tp must be whole numbers ≥ 1, got {args.tp!r}", field="tp") from None
        spec = PlanSpec(trace=args.trace, slo=parse_slo(args.slo), prices=parse_prices(args.price),
                        engines=parse_engines(args.engine or "vllm"), scheduler=args.scheduler, **kw)
    res = make_plan(spec)
    out = human(args.json)
    print(format_plan(res), file=out)
    if args.plot:
        pareto_plot(res, args.plot)
        print(f"wrote {args.plot}", file=out)
    doc = plan_doc(res)
    if args.report:
        from radixkv.cli.report_cmd import _command
        from radixkv.html_report import write_report

        write_report([{"kind": "plan", "doc": doc, "label": "this plan"}], args.report, command=_command())
        print(f"wrote {args.report}", file=out)
    emit(args.json, dumps_json(doc), args.json, args.plot, args.report)
    return 0


def register(sub) -> None:
    from radixkv.cli._output import add_json_arg
    from radixkv.sweep.executors import EXECUTORS

    p = sub.add_parser("plan", help="the cheapest deployment that meets a latency SLO on a trace",
                       description=cmd_plan.__doc__)
    p.add_argument("trace", metavar="TRACE", nargs="?", default=None, help="trace file (any format radixkv reads)")
    p.add_argument("--spec", metavar="PLAN.toml", default=None,
                   help="read the question from a TOML file (radixkv.plan.spec); flags given override its keys")
    p.add_argument("--model", default=None, help="model preset or path to a Hugging Face config.json")
    p.add_argument("--slo", default=None, metavar="TERMS",
                   help="SLO terms with units: ttft_p50, ttft_p99, tpot_p50, tpot_p99, e.g. ttft_p99=2s,tpot_p99=50ms")
    p.add_argument("--gpus", default=None, metavar="GPU,...", help="GPU presets to search (H100-80GB,A100-80GB)")
    p.add_argument("--price", default=None, metavar="GPU=$/h,...",
                   help="$ per GPU-hour of each GPU searched (default: cost in GPU-hours per hour of traffic)")
    p.add_argument("--engine", choices=["vllm", "sglang", "both"], default=None, help="engine(s) to plan for (vllm)")
    p.add_argument("--tp", default=None, metavar="T,...", help="tensor-parallel degrees to search (1,2,4,8)")
    p.add_argument("--rate-scale", type=float, default=None, metavar="X",
                   help="plan for X times the trace's recorded rate (1.0)")
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help="most concurrent replays (40; at least 2: the recommendation and its prefix-caching "
                        "toggle, which the verdict needs)")
    p.add_argument("--max-replicas", type=int, default=None, metavar="N", help="most replicas of one engine (64)")
    p.add_argument("--cost-model", default=None, metavar="KIND",
                   help="step-time model of every replay: roofline (default); fitted, profiled or a profile "
                        "file where radixkv.clock is present")
    p.add_argument("--executor", choices=EXECUTORS, default=None, help="where the replays run (local)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="worker processes (processes, dask)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS", help="an existing Dask scheduler (dask)")
    p.add_argument("--work-dir", default=None, metavar="DIR",
                   help="keep the replays in DIR as a sweep results store; a rerun reads them back "
                        "(default: a temporary folder)")
    p.add_argument("--plot", default=None, metavar="PATH.png", help="write the Pareto plot (cost vs TTFT p99)")
    p.add_argument("--report", default=None, metavar="PATH.html",
                   help="also write a self-contained HTML report of the plan (recommendation, runner-ups, caching "
                        "verdict, sensitivity, Pareto plot; overload flagged)")
    add_json_arg(p, "the plan")
    p.set_defaults(func=cmd_plan)
