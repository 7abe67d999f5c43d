"""Benchmark: the engines' eviction orders in the concurrent replay, against each engine's default.

Changing only the eviction order must not drop a policy off the compiled concurrent loops
(issue 28: concurrent ``sglang:1@lfu`` ≤ 1.5× ``sglang:1`` and ``vllm:16@lfu`` ≤ 1.5×
``vllm:16``). The bundled customer_service trace (``traces/customer_service.jsonl``,
trace timestamps), Llama-3.1-8B on one A100-80GB: with the pool of radixkv's memory model
(``--pool model``: nothing is evicted on this trace) and with a tight pool
(``--capacity-tokens``, default 8,000 tokens: the eviction order decides). In this one
process, with the trace loaded and the kernels compiled (or loaded) before the timings,
each timing the best of ``--repeat`` (wall, and CPU time of this process; the two policies of
a pair take turns, run by run), it prints the
concurrent replay of each policy of ``--pairs`` (``BASE/ORDERED`` pairs), which loop ran
it (compiled or Python), and the ratio of the ordered policy to its base. The load average
is printed before and after: wall times on a shared machine are noisy, the CPU ratio less so.

    python experiments/bench_eviction_orders.py [--pairs sglang:1/sglang:1@lfu,vllm:16/vllm:16@lfu]
        [--capacity-tokens 8000] [--repeat 7]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from _common import REPO
from bench_concurrent import GPU, MODEL, _best

from radixkv.cost import CostModel
from radixkv.policies.registry import build_policy, parse_policy
from radixkv.replay import conc_sglang, conc_vllm_fast
from radixkv.replay.arrivals import arrival_times
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.pool_settings import pool_for_policy
from radixkv.replay.run import warmup
from radixkv.trace.load import load_trace


class _Which:
    """Records whether the last replay took a compiled loop (wraps both engines' entry points)."""

    def __init__(self):
        self.compiled = False
        for mod in (conc_sglang, conc_vllm_fast):
            orig = mod.replay_compiled

            def wrapped(*a, _orig=orig, **k):
                res = _orig(*a, **k)
                self.compiled = self.compiled or res is not None
                return res

            mod.replay_compiled = wrapped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="sglang:1/sglang:1@lfu,vllm:16/vllm:16@lfu")
    ap.add_argument("--capacity-tokens", type=int, default=8000)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    trace = load_trace(REPO / "traces" / "customer_service.jsonl")
    cost = CostModel.from_specs(MODEL, GPU)
    arr = arrival_times(trace, arrival="trace")
    which = _Which()
    print(f"customer_service: {len(trace):,} requests; {MODEL} on {GPU}; best of {a.repeat}; "
          f"load average {os.getloadavg()[0]:.2f}")
    for pool_kind in ("model", "tight"):
        args = argparse.Namespace(capacity_tokens=a.capacity_tokens if pool_kind == "tight" else None,
                                  num_gpu_blocks=None, max_total_num_tokens=None, model=MODEL, gpu=GPU, tp=1,
                                  kv_cache_dtype=None, gpu_memory_utilization=None, mem_fraction_static=None,
                                  max_num_batched_tokens=None)
        for pair in a.pairs.split(","):
            runs = []
            for label in pair.split("/"):
                spec = parse_policy(label)
                pool, _ = pool_for_policy(args, spec)
                warmup(spec)

                def run(spec=spec, pool=pool):
                    which.compiled = False
                    res = replay_concurrent(trace, build_policy(spec, pool, unit_tokens=trace.unit_tokens), cost,
                                            arrivals=arr)
                    return res, which.compiled

                run()  # compile (or load) outside the timings
                runs.append((label, run))
            # the policies of a pair take turns, repeat by repeat (ABAB...): a slow stretch of
            # the machine, or this process's first runs, then weigh on both alike
            best = {label: (None, None, None) for label, _ in runs}
            for _ in range(a.repeat):
                for label, run in runs:
                    t, c, out = _best(run, 1)
                    bt, bc, _ = best[label]
                    best[label] = (t if bt is None else min(bt, t), c if bc is None else min(bc, c), out)
            rows = []
            for label, _ in runs:
                t, c, (res, comp) = best[label]
                ev = res.columns["evicted_tokens"]  # NaN under SGLang's rule: not charged to requests
                rows.append((label, t, c, comp, res.summary()["token_hit_rate"],
                             None if ev.dtype.kind == "f" and np.isnan(ev).any() else int(ev.sum())))
            b_label, bt, bc = rows[0][:3]
            for label, t, c, comp, hit, ev in rows:
                print(f"  pool {pool_kind:<5} {label:<14} {'compiled loop' if comp else 'Python loop':<13} "
                      f"wall {t:.4f} s  CPU {c:.4f} s  ratio to {b_label}: wall {t / bt:5.2f}, CPU {c / bc:5.2f}; "
                      f"token hit rate {hit:.4f}, evicted tokens {'n/a' if ev is None else f'{ev:,}'}",
                      flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
