"""Benchmark: SGLang's eviction orders on the compiled loops, against LRU.

The bundled customer_service trace (``traces/customer_service.jsonl``), Llama-3.1-8B on one
A100-80GB (pool from radixkv's memory model), trace timestamps. In this one process, with
the trace loaded and the kernels compiled, each timing the best of ``--repeat``:

- the concurrent replay of ``sglang:1`` (LRU, the compiled loop) and of
  ``sglang:1@<order>`` for each ``--orders`` (:class:`PriorityRadixCache`): as the CLI
  runs it (its scheduler inserts at admission, the Python loop) and with SGLang's batch
  visibility switched on (``batch_visibility``: the compiled loop runs the keyed order of
  the one tree, :mod:`radixkv.policies._radix_kernels`); printed as ratios to
  ``sglang:1`` (the target for the compiled loop is ≤ 1.5);
- the sequential replay of ``sglang:1`` (``run_replay``), in seconds, to compare between
  commits (run the script in each tree on a quiet machine; the load average is printed).

    python experiments/bench_sglang_orders.py [--orders lfu,priority] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os

from _common import REPO
from bench_concurrent import GPU, MODEL, _best

from radixkv.replay.pool_settings import pool_for_policy
from radixkv.cost import CostModel
from radixkv.policies.registry import build_policy, parse_policy
from radixkv.replay import conc_sglang
from radixkv.replay.arrivals import arrival_times
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.run import run_replay, warmup
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace.load import load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", default="lfu,priority")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    trace = load_trace(REPO / "traces" / "customer_service.jsonl")
    cost = CostModel.from_specs(MODEL, GPU)
    arr = arrival_times(trace, arrival="trace")
    args = argparse.Namespace(capacity_tokens=None, num_gpu_blocks=None, max_total_num_tokens=None, model=MODEL,
                              gpu=GPU, tp=1, kv_cache_dtype=None, gpu_memory_utilization=None,
                              mem_fraction_static=None, max_num_batched_tokens=None)
    print(f"customer_service: {len(trace):,} requests; {MODEL} on {GPU}; load average {os.getloadavg()[0]:.2f}")
    base = parse_policy("sglang:1")
    pool, _ = pool_for_policy(args, base)
    warmup(base)

    def conc(spec, visible):
        def run():
            pol = build_policy(spec, pool, unit_tokens=trace.unit_tokens)
            if visible:
                pol.batch_visibility = True  # SGLang's batch visibility (the compiled loop)
            return replay_concurrent(trace, pol, cost, arrivals=arr)
        return run

    conc(base, False)()  # compile (or load) outside the timings
    t_lru, c_lru, res = _best(conc(base, False), a.repeat)
    hit = res.summary()["token_hit_rate"]
    t_seq, c_seq, _ = _best(lambda: run_replay(trace, base, pool), a.repeat)
    print(f"  sglang:1 sequential {t_seq:.4f} s (CPU {c_seq:.4f} s); concurrent {t_lru:.4f} s (CPU {c_lru:.4f} s); "
          f"token hit rate {hit:.4f}")
    for order in a.orders.split(","):
        spec = parse_policy(f"sglang:1@{order}")
        pol = build_policy(spec, pool, unit_tokens=trace.unit_tokens)
        pol.batch_visibility = True
        on_loop = conc_sglang.applicable(pol, cost, SchedulerConfig(), None, "sglang")
        for visible, name in ((False, "as the CLI runs it"), (True, "batch visibility")):
            conc(spec, visible)()  # compile (or load)
            t, c, res = _best(conc(spec, visible), a.repeat)
            path = "compiled loop" if visible and on_loop else "Python loop"
            print(f"  sglang:1@{order:<8} concurrent, {name:<18} ({path:<13}) {t:.4f} s   ratio to sglang:1 "
                  f"{t / t_lru:6.2f} (CPU {c / c_lru:6.2f}); token hit rate {res.summary()['token_hit_rate']:.4f}",
                  flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
