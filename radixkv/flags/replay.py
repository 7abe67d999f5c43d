"""The flags of ``radixkv replay``: the knobs a replay reads (trace, policy, pool, window,
miss causes) beside its outputs, and :func:`add_replay_flags`, the verb's whole parser.

``compare`` and ``curve`` add the same groups (:mod:`radixkv.cli.replay_cmd`); a sweep
grid's keys are ``replay``'s flags, so :mod:`radixkv.sweep.grid` builds the parser
:func:`add_replay_flags` fills to read every key's type, choices and default.
"""
from __future__ import annotations

import argparse
import math

from radixkv.flags.concurrent import GPU_DEFAULTS_HELP, add_concurrent_args
from radixkv.flags.host_tier import add_host_tier_args
from radixkv.flags.output import add_json_arg, add_report_arg
from radixkv.flags.routing import add_routing_args
from radixkv.flags.traffic import add_traffic_args

#: ``--no-timing``'s help (``replay``, ``compare``, ``curve``)
TIMING_HELP = ("leave wall-clock times (load, compile and replay seconds, tokens per second) out of the JSON "
               "and the --report page, so two runs write byte-identical files; the table printed still shows "
               "them (default: kept)")


def int_tokens(text: str) -> int:
    """Parse a token count such as ``32768``, ``1e6`` or ``2_000_000``."""
    try:
        v = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v != int(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole non-negative number")
    return int(v)


def add_trace_args(p):
    """``TRACE``, ``--format``, ``--limit K`` and ``--quiet``."""
    p.add_argument("trace", metavar="TRACE", help="trace file or directory")
    p.add_argument("--format", default=None, help="trace format (default: detected from content)")
    p.add_argument("--limit", type=int, default=None, metavar="K", help="replay only the first K requests")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_policy_size_args(p):
    """``--block-size`` and ``--page-size`` (the sizes of specs given without one), and the
    host-tier flags (:func:`radixkv.flags.host_tier.add_host_tier_args`)."""
    p.add_argument("--block-size", type=int, default=None, metavar="TOKENS",
                   help="vLLM block_size in tokens for vllm/none/static specs without :SIZE (default 16)")
    p.add_argument("--page-size", type=int, default=None, metavar="TOKENS",
                   help="SGLang page_size in tokens for sglang specs without :SIZE (default 1)")
    add_host_tier_args(p)


def add_pool_args(p):
    """The pool-size flags (one of ``--capacity-tokens``, ``--num-gpu-blocks``,
    ``--max-total-num-tokens``, ``--pool-from-log``) and the memory model's (``--model``,
    ``--gpu``, the engines' fractions, ``--tp``, ``--max-model-len``); checked by
    :func:`radixkv.replay.pool_settings.check_pool_args`."""
    g = p.add_argument_group("pool size (one of)")
    g.add_argument("--capacity-tokens", type=int_tokens, metavar="N", help="usable KV pool size in tokens")
    g.add_argument("--num-gpu-blocks", type=int_tokens, metavar="N", help="vLLM num_gpu_blocks (block 0 reserved)")
    g.add_argument("--max-total-num-tokens", type=int_tokens, metavar="N", help="SGLang max_total_num_tokens")
    g.add_argument("--pool-from-log", metavar="LOG", default=None,
                   help="the pool a vLLM or SGLang server logged at start-up (its log file)")
    m = p.add_argument_group("pool from the memory model")
    m.add_argument("--model", help="model preset or path to a Hugging Face config.json")
    m.add_argument("--gpu", help="GPU preset (`radixkv memory --help` lists them; H100 = H100-80GB)")
    m.add_argument("--gpu-memory-utilization", type=float, default=None, help="vLLM's knob")
    m.add_argument("--mem-fraction-static", type=float, default=None, help="SGLang's knob")
    m.add_argument("--kv-cache-dtype", default=None, help="e.g. fp8")
    m.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    m.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help=f"tokens of vLLM's profiling pass, and per engine step in --mode concurrent (default: "
                        f"{GPU_DEFAULTS_HELP})")
    m.add_argument("--max-model-len", type=int_tokens, default=None, metavar="TOKENS",
                   help="context length: a prompt the engine refuses (vLLM: ≥ L tokens; SGLang: ≥ L − 6) is not "
                        "served and is counted in rejected_requests, outputs are capped to the context "
                        "(radixkv/replay/context.py; default: the --model's context, no limit without --model)")


def add_window_arg(p):
    """``--measure-last FRACTION`` (the windowed metrics: :func:`radixkv.metrics.window_summary`)."""
    p.add_argument("--measure-last", type=float, default=None, metavar="FRACTION",
                   help="also report the hit metrics over the last FRACTION (0 < F <= 1) of the replayed requests, "
                        "the earlier ones only warming the cache (0.5: kvcache-simulator's 'last 50 %% of requests'; "
                        "the window starts at request floor(n*(1-F))); sequential replay only; the whole-replay "
                        "metrics are unchanged (default: no window)")


def add_miss_args(p):
    """``--miss-causes`` and ``--miss-fix`` (:mod:`radixkv.replay.misses`)."""
    p.add_argument("--miss-causes", action="store_true",
                   help="split every request's missed prompt tokens by cause (compulsory, capacity, alignment, "
                        "last-token cap; with --mode concurrent also in-flight, routing with --replicas, and "
                        "preemption: prompt tokens recomputed after a preemption/retraction; docs/miss-causes.md) against "
                        "shadow replays (default off)")
    p.add_argument("--miss-fix", action="store_true",
                   help="with the miss causes (implied), what would fix them: the pool at which capacity misses "
                        "halve (a few more replays; with --mode concurrent each a whole concurrent replay, per "
                        "replica with --replicas) and the hit gained at the next smaller block/page size")


def policy_names() -> str:
    """The policy names ``--policy`` accepts, from the one registry (for help texts)."""
    from radixkv.policies.registry import available_policies

    return " | ".join(available_policies())


def add_replay_flags(p: argparse.ArgumentParser) -> None:
    """Add every flag of ``radixkv replay`` to *p*, in the verb's order (groups and help as
    ``radixkv replay --help`` lists them): the verb's parser is this and nothing else."""
    add_trace_args(p)
    p.add_argument("--policy", required=True,
                   help="policy spec NAME[:SIZE][@OPTION], NAME one of " + policy_names() + ", a plug-in NAME "
                        "(entry point radixkv.policies) or package.module:Class[:SIZE]; e.g. vllm:16, sglang:1, "
                        "static:16@0.3")
    add_policy_size_args(p)
    add_pool_args(p)
    add_json_arg(p, "the summary")
    add_report_arg(p)
    p.add_argument("--per-request", metavar="OUT.csv", help="write one CSV row per request to OUT.csv (default: not written)")
    p.add_argument("--verify", action="store_true",
                   help="vllm: compare the stored ids on every block-hash hit (slower; default off)")
    p.add_argument("--no-timing", action="store_true", help=TIMING_HELP)
    add_window_arg(p)
    add_miss_args(p)
    add_traffic_args(p)
    p.add_argument("--explain", metavar="REQUEST_ID", default=None,
                   help="instead of the summary, explain one request: which earlier request first computed each "
                        "reusable span of its prompt, and which requests (with --mode concurrent: which engine steps "
                        "and their batches; in-flight and other-replica spans marked) inserted and evicted what it "
                        "could hit")
    p.add_argument("--per-engine-rule", action="store_true",
                   help="with --model/--gpu: size the pool by the policy's own engine's rule (SGLang's "
                        "mem_fraction_static for sglang:p; default: vLLM's rule for every policy)")
    add_concurrent_args(p)
    add_routing_args(p)
