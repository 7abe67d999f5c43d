"""``radixkv check CONFIG.toml`` and ``radixkv warmup [POLICY...]``: argument parsing only.

``check`` exit status: 0 every assertion holds, 1 one or more fail (each printed on one
line: trace, policy, metric, value, bound), 2 bad input (the message names the file, line
and key). The work is :func:`radixkv.check.run.run_check`.
"""
from __future__ import annotations

import sys


def cmd_check(args) -> int:
    from radixkv.check.config import load_config
    from radixkv.check.report import format_table, junit_xml, markdown
    from radixkv.check.run import run_check
    from radixkv.util import check_output_paths, dumps_json

    config = load_config(args.config)
    from radixkv.cli._output import emit, files, human, inputs

    outs = (args.json, args.junit_xml, args.markdown, args.report)
    # the baseline is an output with --update-baseline, else an input no output may replace
    base = [str(config.baseline)] if config.baseline is not None else []
    check_output_paths(*files(*outs), *(base if args.update_baseline else []),
                       inputs=inputs(args, *config.input_files(), *([] if args.update_baseline else base)))
    result = run_check(config, update_baseline=args.update_baseline, quiet=args.quiet)
    out = human(*outs)
    print(f"radixkv check {args.config}: {len(config.pairs)} replays, {len(result.outcomes)} assertions", file=out)
    print(format_table(result), file=out)
    if result.baseline_written is not None:
        print(f"wrote baseline {result.baseline_written}", file=out)
    for path, text in ((args.json, lambda: dumps_json(result.to_json())), (args.junit_xml, lambda: junit_xml(result)),
                       (args.markdown, lambda: markdown(result))):
        if path:
            emit(path, text(), *outs)
    from radixkv.cli.report_cmd import write_run_report

    write_run_report(args.report, result.to_json(), stream=out)
    for o in result.failures:
        print(o.line(), file=sys.stderr)
    return 0 if result.ok else 1


def cmd_warmup(args) -> int:
    from radixkv.policies.registry import builtin_policies, parse_policy
    from radixkv.replay.run import warmup_many

    # default: every built-in with compiled kernels (the others have nothing to compile)
    names = args.policies or [n for n, cls in builtin_policies().items() if cls.kernel_family]
    specs = [parse_policy(t) for n in names for t in n.split(",") if t.strip()]
    import time

    from radixkv.trace import _jsonl_fast

    t0 = time.perf_counter()
    _jsonl_fast.warmup()  # the JSONL trace readers' kernel
    warmup_many(specs, lean=not args.full)
    seconds = time.perf_counter() - t0  # wall, from before the JSONL kernel (warmup_many's own time is inside it)
    print(f"compiled or loaded the kernels of {', '.join(s.label for s in specs)} in {seconds:.1f} s")
    return 0


def register(sub) -> None:
    p = sub.add_parser("check", help="replay traces and assert on hit rate, eviction, baseline (exit 1 on failure)",
                       description="Replay the traces of a TOML configuration through its policies and check its "
                                   "assertions. Exit 0 all hold, 1 one fails, 2 bad input.")
    p.add_argument("config", metavar="CONFIG.toml", help="the check configuration (see docs/ci.md)")
    p.add_argument("--update-baseline", action="store_true", help="rewrite the baseline file with this run's metrics")
    from radixkv.cli._output import add_json_arg

    add_json_arg(p, "the results and every assertion")
    p.add_argument("--junit-xml", metavar="OUT.xml", help="write JUnit XML, one testcase per assertion ('-': stdout; default: not written)")
    p.add_argument("--markdown", metavar="OUT.md",
                   help="write a Markdown report, e.g. to $GITHUB_STEP_SUMMARY ('-': stdout; default: not written)")
    from radixkv.cli.report_cmd import add_report_arg

    add_report_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("warmup", help="compile the Numba kernels of policies into the cache (for CI images)",
                       description="Compile (or load from NUMBA_CACHE_DIR) the kernels the given policies use; "
                                   "default: every built-in policy at its default option (an eviction order such as "
                                   "vllm:16@lfu has kernels of its own: name it to warm them).")
    p.add_argument("policies", nargs="*", metavar="POLICY", help="policy specs, e.g. vllm:16 sglang:1")
    p.add_argument("--full", action="store_true",
                   help="also the kernels only hash-id traces (Mooncake-style units: vLLM's unit and piece pools) "
                        "and the Python concurrent loop (batched decode: priority scheduling, subclasses) use; "
                        "default: the sequential and compiled concurrent replays of token-id traces (a kernel left "
                        "out compiles when first used)")
    p.set_defaults(func=cmd_warmup)
