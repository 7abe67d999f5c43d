"""Overhead of the miss-cause breakdown (``--miss-causes``): replay time with it over without.

For each policy and pool size it replays the trace twice in this process, once plainly and
once with ``miss_causes=True`` (the shadow memo cleared first, so the shadows are paid in
full), and prints both wall times, their ratio, the ratio of CPU times (process time: less
noisy on a shared machine), the load average, and the breakdown's shares. Kernels are
compiled before timing. The issue's target is a ratio ≤ 2 (docs/DESIGN.md, "Miss causes").

    RADIXKV_SHARED=/work/shared python experiments/bench_misses.py \\
        [--trace PATH] [--policies vllm:16,sglang:1,unit-lru] [--capacities 1e6,1e7] [--repeat 3]
        [--concurrent N [--time-scale X]]   # the concurrent replay of the first N requests (0: all)

The concurrent mode times ``replay_concurrent`` without a recorder against the same replay
with :class:`~radixkv.replay.conc_misses.MissRecorder` plus the concurrent causes
(``attach_concurrent_causes``): vLLM's and SGLang's rules run the compiled loops both ways
(the loops record the recorder's events inside). The issue's target: ≤ 2× CPU for
``vllm:16`` and ``sglang:1`` on Mooncake at ``--time-scale 10`` on one A100-80GB's pool for
Llama-3.1-8B (464,400 tokens):

    python experiments/bench_misses.py --concurrent 0 --time-scale 10 --policies vllm:16,sglang:1 \
        --capacities 464400 --repeat 5
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main(argv=None) -> int:
    from radixkv.policies.registry import PoolSpec, parse_policy
    from radixkv.replay import misses
    from radixkv.replay.run import run_replay, warmup
    from radixkv.trace.load import load_trace

    shared = os.environ.get("RADIXKV_SHARED", "../shared")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(Path(shared) / "traces/mooncake-fast25/conversation_trace.jsonl"))
    ap.add_argument("--policies", default="vllm:16,sglang:1,unit-lru")
    ap.add_argument("--capacities", default="1e6,1e7")
    ap.add_argument("--repeat", type=int, default=3, help="best of N timings of each (default 3)")
    ap.add_argument("--concurrent", type=int, default=None, metavar="N",
                    help="instead: the concurrent replay (Llama-3.1-8B on A100-80GB) of the first N requests "
                         "(0: all), without and with the recorder and the concurrent causes")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="concurrent mode: multiply the trace's arrival times (radixkv replay --time-scale)")
    a = ap.parse_args(argv)
    trace = load_trace(a.trace)
    if a.concurrent is not None:
        return _concurrent(trace.head(a.concurrent) if a.concurrent else trace, a)
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 shared cores)")
    print(f"trace {a.trace}: {len(trace):,} requests, {trace.total_prompt_tokens:,} prompt tokens, "
          f"unit_tokens={trace.unit_tokens}")
    print(f"{'policy':<10} {'pool':>12} {'plain_s':>8} {'misses_s':>9} {'ratio':>6} {'cpu_ratio':>9}  shares "
          f"(hit / compulsory / capacity / alignment / last_token_cap / not_cached)")
    for text in a.policies.split(","):
        spec = parse_policy(text)
        warmup(spec)
        for cap in (int(float(c)) for c in a.capacities.split(",")):
            pool = PoolSpec(capacity_tokens=cap)
            plain = with_m = cpu_plain = cpu_m = float("inf")
            summ = None
            for _ in range(a.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                run_replay(trace, spec, pool)
                plain = min(plain, time.perf_counter() - t0)
                cpu_plain = min(cpu_plain, time.process_time() - c0)
                misses._MEMO.clear()
                t0, c0 = time.perf_counter(), time.process_time()
                _, summ = run_replay(trace, spec, pool, miss_causes=True)
                with_m = min(with_m, time.perf_counter() - t0)
                cpu_m = min(cpu_m, time.process_time() - c0)
            sh = summ["miss_causes"]["share"]
            shares = " / ".join(f"{sh[c]:.4f}" for c in misses.CAUSES)
            print(f"{spec.label:<10} {cap:>12,} {plain:>8.3f} {with_m:>9.3f} {with_m / plain:>6.2f} {cpu_m / cpu_plain:>9.2f}  {shares}",
                  flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


def _concurrent(trace, a) -> int:
    from radixkv.cost import CostModel
    from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
    from radixkv.replay.conc_misses import MissRecorder, attach_concurrent_causes
    from radixkv.replay.concurrent import replay_concurrent
    from radixkv.replay.arrivals import arrival_times
    from radixkv.replay.run import warmup
    from radixkv.replay.scheduler import SchedulerConfig

    cost = CostModel.from_specs("Llama-3.1-8B", "A100-80GB")
    cfg = SchedulerConfig()
    arr = arrival_times(trace, time_scale=a.time_scale)
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 shared cores); concurrent replay, {len(trace):,} requests, "
          f"time scale {a.time_scale:g}; best of {a.repeat}")
    print(f"{'policy':<10} {'pool':>12} {'plain_s':>8} {'misses_s':>9} {'ratio':>6} {'cpu_ratio':>9}  "
          f"shares (hit / compulsory / capacity / in_flight / preemption)")
    for text in a.policies.split(","):
        spec = parse_policy(text)
        warmup(spec)
        for cap in (int(float(c)) for c in a.capacities.split(",")):
            res = {}
            for with_m in (False, True):
                best = (float("inf"), float("inf"))
                for _ in range(a.repeat):
                    pol = build_policy(spec, PoolSpec(capacity_tokens=cap), unit_tokens=trace.unit_tokens)
                    t0, c0 = time.perf_counter(), time.process_time()
                    rec = MissRecorder(trace, pol, cfg) if with_m else None
                    r = replay_concurrent(trace, pol, cost, arrivals=arr, config=cfg, recorder=rec)
                    if with_m:
                        attach_concurrent_causes(trace, spec, r, [rec])
                    best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
                res[with_m] = (best, r)
            (pw, pc), _ = res[False]
            (mw, mc), r = res[True]
            sh = r.summary()["miss_causes"]["share"]
            shares = " / ".join(f"{sh[c]:.4f}" for c in ("hit", "compulsory", "capacity", "in_flight", "preemption"))
            print(f"{spec.label:<10} {cap:>12,} {pw:>8.3f} {mw:>9.3f} {mw / pw:>6.2f} {mc / pc:>9.2f}  {shares}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
