"""Command-line flags of the concurrent replay, shared by ``radixkv replay`` and ``compare``
(and read as grid keys by :mod:`radixkv.sweep.grid`).

``add_concurrent_args(parser)`` adds the flags (engine names where the engines have one);
``run_concurrent_from_args(trace, policy, args)`` (:mod:`radixkv.replay.settings`) runs the
replay they describe; ``refuse_concurrent_only_flags(args)`` refuses one of them set in the
sequential mode. A flag
the verb already defines (``--max-num-batched-tokens``, which also sizes vLLM's profiling
pass; ``--model``, ``--gpu``, ``--tp``, ``--kv-cache-dtype`` of the pool) is not added
again: the concurrent replay reads the verb's value, so one knob means one thing.

=============================================== =========================================
flag                                            meaning (default)
=============================================== =========================================
``--mode {sequential,concurrent}``              replay mode (sequential)
``--max-num-seqs N``                            most running requests (the engine's on
                                                the --gpu the pool is sized on, else 256)
``--max-num-batched-tokens N``                  tokens per step, chunked prefill (likewise;
                                                else 8192; radixkv.replay.settings.step_defaults)
``--enable-prefix-caching`` /                   off: replace the policy by ``NoCache`` on
``--no-enable-prefix-caching``                  the same pool (on)
``--static-reserved-fraction F``                replace the policy by ``StaticReservedCache``
                                                reserving F of the same pool (unset)
``--arrival {trace,poisson,gamma}``             arrival process (trace)
``--time-scale X``                              multiply the trace's times (1.0)
``--request-rate R``                            req/s for poisson/gamma
``--burstiness K``                              gamma shape, vLLM's benchmark flag (1.0)
``--seed S``                                    arrival seed (0)
``--schedule-policy {fcfs,lpm}``                waiting-queue order (fcfs)
``--admission {vllm,sglang}``                   admission/preemption rules (the policy
                                                class's ``admission_rule``)
``--enable-chunked-prefill`` /                   vLLM rules: off admits a request only when
``--no-enable-chunked-prefill``                 its un-hit tokens fit the step (on)
``--long-prefill-token-threshold N``            vLLM rules: cap on one prefill chunk when
                                                more than one request is eligible (0 = off)
``--timeline PATH``                              write one CSV row per engine step (``replay``)
``--watermark F``                               vLLM rules: share of the pool's blocks an
                                                admission leaves free (0.0)
``--scheduling-policy {fcfs,priority}``         vLLM rules: waiting order and preemption
                                                victim by the trace's ``priority`` column
                                                (vLLM's flag; fcfs)
``--enable-priority-scheduling``                SGLang rules: waiting queue by the trace's
                                                ``priority`` (higher first), then queue
                                                entry (off); needs
                                                ``--disable-priority-preemption``
``--schedule-low-priority-values-first``        SGLang rules: lower values first (off)
``--disable-priority-preemption``               SGLang rules: no priority preemption (off)
``--retraction-policy {length,priority}``       SGLang rules: decode retraction order (length)
``--cost-model {roofline,fitted,profiled,PATH}`` step-time model (roofline): the assumed
                                                roofline, the roofline fitted on measured
                                                GPU timings, the measured profiles, or a
                                                profile JSON (radixkv.clock, docs/clock.md)
``--mfu F``, ``--mbu F``                        cost-model efficiencies (0.6, 0.8); with a
                                                calibrated model, of its attention term
``--step-overhead-s T``                         fixed seconds per step (0)
``--request-intake-s T``                        seconds a single-threaded server front end
                                                spends per request before the engine sees
                                                it (0; radixkv.cost.intake_arrivals, a
                                                fitted value in docs/clock-e2e.md)
=============================================== =========================================
"""
from __future__ import annotations

import argparse

from radixkv.errors import ConfigError


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, got {v}")
    return v


def _has(parser: argparse.ArgumentParser, flag: str) -> bool:
    return flag in parser._option_string_actions  # argparse keeps every option string here


#: the one help phrase of the step knobs whose default follows the GPU
#: (``--max-num-batched-tokens``, ``--max-num-seqs``; ``replay``/``compare``/``curve``/``memory``):
#: :func:`radixkv.replay.settings.step_defaults`, :func:`radixkv.memory.engine_batch_defaults`
GPU_DEFAULTS_HELP = ("the engine's own on the --gpu the pool is sized on (vLLM: 2048 tokens / 256 requests on an "
                     "A100 or a GPU under 70 GiB, 8192 / 1024 on an H100/H200, 16384 / 1024 at ≥ 160 GiB; SGLang: "
                     "its chunked_prefill_size / 2048 requests, assumed); an explicit pool: 8192 / 256")


def add_concurrent_args(parser: argparse.ArgumentParser) -> None:
    """Add the concurrent-replay flags to *parser* (skipping flags it already has)."""
    g = parser.add_argument_group("concurrent replay (--mode concurrent)")

    def add(flag, *more, **kw):
        if not _has(parser, flag):
            g.add_argument(flag, *more, **kw)

    add("--mode", choices=["sequential", "concurrent"], default="sequential",
        help="sequential: one request at a time (cache study); concurrent: arrivals, batching, preemption")
    add("--max-num-seqs", type=int, default=None,
        help=f"most running requests (vLLM --max-num-seqs, SGLang --max-running-requests; default: "
             f"{GPU_DEFAULTS_HELP})")
    add("--max-num-batched-tokens", type=int, default=None,
        help=f"tokens per engine step, chunked prefill (vLLM --max-num-batched-tokens, SGLang "
             f"--chunked-prefill-size; default: {GPU_DEFAULTS_HELP})")
    if not _has(parser, "--enable-prefix-caching"):
        g.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_true", default=True,
                       help="replay the given policy (default)")
        g.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                       help="replay with caching off (NoCache) on the same pool")
    add("--static-reserved-fraction", type=float, default=None, metavar="F",
        help="replay a statically partitioned pool reserving F of it for cached prefixes")
    add("--arrival", choices=["trace", "poisson", "gamma"], default="trace",
        help="trace timestamps, or re-timing at --request-rate")
    add("--time-scale", type=float, default=1.0, help="multiply the trace's arrival times (<1 compresses)")
    add("--request-rate", type=float, default=None, help="requests per second for --arrival poisson/gamma")
    add("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson; <1 burstier)")
    add("--seed", type=_nonneg_int, default=0, help="seed of the arrival process (≥ 0)")
    add("--schedule-policy", choices=["fcfs", "lpm"], default="fcfs",
        help="waiting-queue order (SGLang --schedule-policy; lpm needs a policy with peek_hit)")
    add("--admission", choices=["vllm", "sglang"], default=None,
        help="admission and preemption rules (default: the policy class's admission_rule)")
    if not _has(parser, "--enable-chunked-prefill"):
        g.add_argument("--enable-chunked-prefill", dest="enable_chunked_prefill", action="store_true", default=True,
                       help="split long prefills over steps (vLLM's default)")
        g.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                       help="vLLM rules: admit a request only when its un-hit tokens fit the step's budget")
    add("--long-prefill-token-threshold", type=_nonneg_int, default=0, metavar="N",
        help="vLLM rules: most tokens of one prefill chunk when more than one request is eligible (0 = off)")
    add("--timeline", metavar="OUT.csv", default=None,
        help="write one CSV row per engine step: running, waiting, batch tokens, pool running/cached/free slots")
    add("--watermark", type=float, default=0.0, metavar="F",
        help="vLLM rules: share of the pool's blocks an admission must leave free while others run (0.0)")
    add("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
        help="vLLM rules: fcfs, or priority (waiting queue by the trace's priority then arrival, lower first; "
             "preempt the running request with the largest (priority, arrival)); vLLM's --scheduling-policy")
    add("--enable-priority-scheduling", action="store_true", default=False,
        help="SGLang rules: sort the waiting queue by the trace's priority (higher values first), then queue entry; "
             "needs --disable-priority-preemption (SGLang's priority preemption is not modelled)")
    add("--schedule-low-priority-values-first", action="store_true", default=False,
        help="SGLang rules, with --enable-priority-scheduling: lower priority values first")
    add("--disable-priority-preemption", action="store_true", default=False,
        help="SGLang rules, with --enable-priority-scheduling: no preemption of running requests by priority")
    add("--retraction-policy", choices=["length", "priority"], default="length",
        help="SGLang rules: decode retraction order (priority: least preferred priority first; "
             "needs --enable-priority-scheduling)")
    add("--cost-model", default="roofline", metavar="{roofline,fitted,profiled,PATH}",
        help="step-time model: roofline (assumed MFU/MBU, the default), fitted (MFU/MBU/per-layer time fitted "
             "on Vidur's measured GPU timings), profiled (the measured per-layer tables), or a profile JSON "
             "(docs/clock.md)")
    add("--mfu", type=float, default=0.6, help="achieved fraction of peak FLOP/s (cost model)")
    add("--mbu", type=float, default=0.8, help="achieved fraction of HBM bandwidth (cost model)")
    add("--step-overhead-s", type=float, default=0.0, help="fixed seconds added to every step")
    add("--request-intake-s", type=float, default=0.0, metavar="T",
        help="seconds a single-threaded server front end (HTTP, tokenisation) spends per request before the "
             "engine sees it; TTFT counts it (0 = none; ~0.003 fitted on vLLM 0.6 runs, docs/clock-e2e.md)")
    for a in g._group_actions:  # argparse keeps a group's actions here
        if a.dest not in _READ_BY_SEQUENTIAL:
            _CONCURRENT_ONLY.setdefault(a.dest, (a.default, []))[1].append(a)


#: flags of the group that the sequential replay reads too (--timeline has its own message)
_READ_BY_SEQUENTIAL = {"mode", "max_num_batched_tokens", "timeline"}
#: dest -> (default, actions) of the flags only the concurrent replay reads
_CONCURRENT_ONLY: dict = {}


def refuse_concurrent_only_flags(args) -> None:
    """Refuse a concurrent-replay flag set away from its default when ``--mode`` is not
    ``concurrent`` (the sequential replay would ignore it silently).

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the first such flag (field = its dest).
    """
    if getattr(args, "mode", "sequential") == "concurrent":
        return
    for dest, (default, actions) in _CONCURRENT_ONLY.items():
        value = getattr(args, dest, default)
        if value != default:
            # the flag that sets this value: --no-X of a store_false pair, else the first
            flag = next((a.option_strings[0] for a in actions if a.nargs == 0 and a.const == value),
                        actions[0].option_strings[0])
            raise ConfigError(f"{flag} applies to the concurrent replay only: add --mode concurrent or drop it",
                              field=dest)

