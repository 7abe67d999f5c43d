"""Reproduce every result of the paper, then render paper/paper.md.

    python -m experiments            # full sizes: results in experiments/results/ (~10 min with --parallel 2)
    python -m experiments --quick    # reduced sizes: experiments/results/quick/, < 10 min
    python -m experiments --only fig_capacity,tab_memory   # a subset
    python -m experiments --parallel 2   # two scripts at a time, longest first (one per core)
    python -m experiments --check-fresh  # is every result as new as its code? (experiments/freshness.py)

Each script runs in its own process (``nice``-d), with ``RADIXKV_SHARED`` pointing at the
folder that holds the public traces (default ``../shared`` beside the repository). In full
mode the paper is rendered from the new results (``experiments/render_paper.py``); in quick
mode it is rendered to ``experiments/results/quick/paper.md`` to check that every
placeholder resolves.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: (script, what it makes, expected minutes full (measured, one core each) / quick on 2 idle cores)
SCRIPTS = [
    ("tab_fidelity", "fidelity.json: every golden run of the real engines replayed, mismatching requests", 0.1, 0.3),
    ("tab_memory", "memory.json: KV bytes/token and per request, TP, fp8 pools, gpu_memory_utilization pools, prefill cost (C4, C11, C12, C15, C16, C17)", 0.1, 0.1),
    ("tab_clock", "clock.{json,md,png}: the step-time models (roofline, fitted, profiled) against Vidur's measured GPU operator timings on held-out models, per GPU and regime (issue 35)", 0.1, 0.3),
    ("tab_memory_calibration", "memory_calibration.json: the memory model against published vLLM/SGLang start-up logs (error table), KV bytes per token and per request for MHA/GQA/MLA (C12, C16)", 0.1, 0.1),
    ("tab_e2e_clock", "e2e_clock.json: the concurrent replay's clock against 10 published vLLM benchmark_serving runs (TTFT, TPOT, throughput error per run and median/p90; roofline and a per-step-overhead what-if)", 0.1, 0.5),
    ("fig_mooncake_curve", "mooncake_curve.{json,png}: Mooncake FAST'25 Fig. 9, both hit-rate definitions, read-off bands, 41 %-of-max check", 0.1, 0.3),
    ("fig_mooncake_kvsim", "mooncake_kvsim.{json,png}: Fig. 9 point by point against the Mooncake team's kvcache-simulator, whole trace vs last 50 % of requests, the gap's hypotheses tested (needs kvcache-simulator==0.1.3; skipped without it)", 0.1, 0.1),
    ("fig_capacity", "capacity.json, capacity_curves.png, hit_lengths.png, alignment.png: hit rate vs capacity per policy on each public trace; fp8 vs bf16 pools (C5, C13, C17)", 0.3, 1),
    ("tab_workloads", "workloads.{json,png}: hit-rate spread, concentration, cross-session share on real traces; 5-seed synthetic ablations (C3, C5, C7, C10, C13, C18)", 1.2, 2),
    ("tab_traces", "traces.json: the public traces' artifacts: WEKA ids per file (no cross-file sharing), requests beyond Llama-3.1-8B's context per engine rule, RAGPulse hit rate under each component order (paper §3)", 0.2, 0.3),
    ("tab_misses", "misses.json: why prompt tokens miss (compulsory / capacity / alignment / last-token cap) per trace, policy and pool (C3, C6, C10, C13)", 0.1, 0.5),
    ("tab_fragmentation", "fragmentation.{json,png}: cached tokens, fragmentation over a pool sweep, whole-leaf vs granularity ablation (C6)", 0.3, 1),
    ("fig_concurrent", "concurrent.json, concurrent_pressure.png, pool_split.png: cache on/off/static × memory pressure × load, MFU/MBU, max_num_batched_tokens (C1, C2, C4, C8, C9, C14)", 0.6, 1),
    ("fig_concurrency_wide", "concurrency_wide.{json,png}: cache on vs off on the fitted clock, offered load 0.25-1.5 x saturation, Mooncake/WEKA/RAGPulse (+ Azure zero-hit control), Llama-3.1-8B and 70B (TP 4) on A100 and H100, both engines, 5 disjoint slices with 95 % t-intervals (issue 29)", 9.4, 0.5),
    ("fig_routing", "routing.{json,png}: replicas behind a router vs a global pool, Mooncake Fig. 10 Conversation bars, hit rate vs replicas on Mooncake and WEKA", 0.5, 0.5),
    ("fig_hicache", "hicache.{json,png}: SGLang HiCache hit rate (GPU + host) vs host pool 0-50 M tokens at a 1 M-token GPU pool, three write policies, beside one GPU pool of the same total (issue 18)", 1.8, 0.5),
    ("fig_routing_concurrent", "routing_concurrent.{json,png}: routers x 2-8 replicas in the concurrent replay, Mooncake at time scale 10: hit rate, TTFT, throughput, load imbalance", 2.4, 1),
    ("hybrid_weka", "hybrid_weka.json: a sliding-window hybrid model (vllm-hybrid) on every WEKA file beside full attention at equal GPU memory (docs/hybrid-models.md)", 0.4, 1),
    ("hybrid_ssm_weka", "hybrid_ssm_weka.json: a Mamba/attention hybrid (vllm-hybrid, mamba cache modes) on WEKA (docs/hybrid-models.md)", 1.2, 0.5),
    ("hybrid_weka_sglang", "hybrid_weka_sglang.json: SGLang's SWA and Mamba hybrids (sglang-hybrid) on WEKA at equal GPU memory under SGLang's memory rule (docs/hybrid-models.md)", 0.3, 0.5),
]


def _command(name: str, quick: bool) -> list:
    cmd = [sys.executable, str(HERE / f"{name}.py")] + (["--quick"] if quick else [])
    return (["nice", "-n", "10"] + cmd) if hasattr(os, "nice") else cmd


def _run_scripts(todo: list, quick: bool, env: dict, parallel: int) -> int:
    """Run each ``(name, what, minutes)`` of *todo*, *parallel* at a time; the first non-zero
    exit status (after the running ones end), else 0."""
    if parallel == 1:
        for name, what, minutes in todo:
            print(f"== {name} (expected ~{minutes:g} min): {what}", flush=True)
            t0 = time.perf_counter()
            rc = subprocess.call(_command(name, quick), env=env, cwd=str(REPO))
            print(f"   {name}: exit {rc}, {time.perf_counter() - t0:.0f} s", flush=True)
            if rc != 0:
                return rc
        return 0
    import tempfile

    # longest first (the expected minutes), so the last to start are the short ones
    queue, running, first_bad = sorted(todo, key=lambda t: -t[2]), [], 0
    with tempfile.TemporaryDirectory(prefix="radixkv-experiments-") as tmp:
        while queue or running:
            while queue and len(running) < parallel and not first_bad:
                name, what, minutes = queue.pop(0)
                print(f"== {name} started (expected ~{minutes:g} min): {what}", flush=True)
                log = open(Path(tmp) / f"{name}.log", "w+")
                proc = subprocess.Popen(_command(name, quick), env=env, cwd=str(REPO), stdout=log,
                                        stderr=subprocess.STDOUT)
                running.append((name, proc, log, time.perf_counter()))
            if not running:
                break
            time.sleep(0.5)
            for item in [r for r in running if r[1].poll() is not None]:
                running.remove(item)
                name, proc, log, t0 = item
                log.seek(0)
                print(f"== {name} output:\n{log.read()}", end="", flush=True)
                log.close()
                print(f"   {name}: exit {proc.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
                first_bad = first_bad or proc.returncode
    return first_bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="reduced sizes, results in experiments/results/quick/")
    ap.add_argument("--only", default="", help="comma-separated script names to run (default: all)")
    ap.add_argument("--no-render", action="store_true", help="do not render the paper afterwards")
    ap.add_argument("--parallel", type=int, default=1, metavar="N",
                    help="run N scripts at a time (each is one process; their output is printed as each ends)")
    ap.add_argument("--check-fresh", action="store_true",
                    help="run nothing: exit 1 if a result file (with --quick: a quick one) was produced before the "
                         "last change to the code it depends on (experiments/freshness.py)")
    args = ap.parse_args(argv)
    if args.check_fresh:
        from experiments.freshness import main as check_fresh

        return check_fresh(HERE / "results" / ("quick" if args.quick else ""), REPO)
    only = {s for s in args.only.split(",") if s}
    unknown = only - {s for s, *_ in SCRIPTS}
    if unknown:
        ap.error(f"unknown script(s): {', '.join(sorted(unknown))}; known: {', '.join(s for s, *_ in SCRIPTS)}")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("RADIXKV_SHARED", str(REPO.parent / "shared"))
    if args.parallel < 1:
        ap.error(f"--parallel: {args.parallel} is not a positive number of scripts")
    t_all = time.perf_counter()
    todo = [(name, what, quick_min if args.quick else full_min) for name, what, full_min, quick_min in SCRIPTS
            if not only or name in only]
    rc = _run_scripts(todo, args.quick, env, args.parallel)
    if rc != 0:
        return rc
    if not args.no_render:
        from experiments.render_paper import QUICK_NOTE, render_to

        res = HERE / "results" / ("quick" if args.quick else "")
        out = (HERE / "results" / "quick" / "paper.md") if args.quick else (REPO / "paper" / "paper.md")
        render_to(res, out, strict=not args.quick, note=QUICK_NOTE if args.quick else "")
        print(f"rendered {out.relative_to(REPO)}")
    print(f"all done in {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
