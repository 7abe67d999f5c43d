"""Benchmark: concurrent replay against the sequential replay of the same trace and policy.

The Mooncake conversation trace ($RADIXKV_SHARED/traces/mooncake-fast25, 12,031
requests, 512-token units), Llama-3.1-8B on one A100-80GB (pool from radixkv's memory
model), trace timestamps × ``--time-scale`` (default 10, as the paper's concurrent runs).
For each policy the script times, in this one process, with the trace already loaded and
the kernels compiled: the sequential replay (``run_replay``), the concurrent replay with
fast-forward (the default) and, with ``--no-ff``, without it; and prints the ratio
concurrent / sequential (the target is ≤ 3), on wall and on CPU time (``time.process_time``, less
sensitive to other processes). Each timing is the best of ``--repeat``; the
load average is printed before and after (a loaded machine inflates both timings).
``--per-block`` also times the concurrent replay of ``vllm:B`` policies on the per-block
pool (``BlockHashCache.unit_granular = False``; by default a hash-id trace runs on the
piece pool of ``radixkv.replay._conc_vllm_piece_kernels``, same results).

    python experiments/bench_concurrent.py [--policies vllm:16,sglang:1] [--time-scale 10] [--repeat 1] [--no-ff]
        [--per-block]
"""
from __future__ import annotations

import argparse
import os
import time

from _common import shared

from radixkv.replay.pool_settings import pool_for_policy
from radixkv.cost import CostModel
from radixkv.policies.registry import build_policy, parse_policy
from radixkv.replay.arrivals import arrival_times
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.run import run_replay, warmup
from radixkv.trace.load import load_trace

MODEL, GPU = "Llama-3.1-8B", "A100-80GB"


def _best(fn, repeat):
    """(best wall seconds, best CPU seconds of this process, last result) over *repeat* runs."""
    best, best_cpu, out = None, None, None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        best = dt if best is None else min(best, dt)
        best_cpu = dc if best_cpu is None else min(best_cpu, dc)
    return best, best_cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="vllm:16,sglang:1")
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-ff", action="store_true", help="also time the concurrent replay without fast-forward")
    ap.add_argument("--per-block", action="store_true",
                    help="also time vllm:B's concurrent replay on the per-block pool (unit_granular = False)")
    a = ap.parse_args()
    path = shared("traces", "mooncake-fast25", "conversation_trace.jsonl")
    trace = load_trace(path)
    cost = CostModel.from_specs(MODEL, GPU)
    arr = arrival_times(trace, arrival="trace", time_scale=a.time_scale)
    args = argparse.Namespace(capacity_tokens=None, num_gpu_blocks=None, max_total_num_tokens=None, model=MODEL,
                              gpu=GPU, tp=1, kv_cache_dtype=None, gpu_memory_utilization=None,
                              mem_fraction_static=None, max_num_batched_tokens=None)
    print(f"{path.name}: {len(trace):,} requests; {MODEL} on {GPU}; time scale {a.time_scale:g}; "
          f"load average {os.getloadavg()[0]:.2f}")
    for label in a.policies.split(","):
        spec = parse_policy(label)
        pool, _ = pool_for_policy(args, spec)
        warmup(spec)
        # compile (or load) the concurrent loop's kernels outside the timings
        replay_concurrent(trace.head(200), build_policy(spec, pool, unit_tokens=trace.unit_tokens), cost,
                          arrivals=arr[:200])
        t_seq, c_seq, _ = _best(lambda: run_replay(trace, spec, pool), a.repeat)
        runs = [("concurrent", True, True)] + ([("concurrent, no fast-forward", False, True)] if a.no_ff else [])
        if a.per_block and hasattr(build_policy(spec, pool), "unit_granular"):
            runs.append(("concurrent, per-block pool", True, False))
        for name, ff, unit in runs:
            def conc():
                pol = build_policy(spec, pool, unit_tokens=trace.unit_tokens)
                if not unit:
                    pol.unit_granular = False
                return replay_concurrent(trace, pol, cost, arrivals=arr, fast_forward=ff)
            t_conc, c_conc, res = _best(conc, a.repeat)
            sm = res.summary()
            print(f"{label:>10}  sequential {t_seq:7.2f} s   {name} {t_conc:7.2f} s "
                  f"({res.steps:,} steps; hit rate {sm['token_hit_rate']:.4f}, {sm['preemptions']} preemptions, "
                  f"pool running/cached {sm['pool_used_share_mean']:.3f}/{sm['pool_cached_share_mean']:.3f})   "
                  f"ratio {t_conc / t_seq:5.2f} (CPU {c_seq:.3f} / {c_conc:.3f} s: {c_conc / c_seq:5.2f})", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
