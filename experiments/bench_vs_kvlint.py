"""Benchmark: radixkv's sequential replay beside kvlint's core simulators, in one process.

The trace is the shared yardstick ($RADIXKV_SHARED/bench, made by its gen_peers_trace.py: 2,000 requests,
4.45 M prompt tokens); the pool is 2,048 usable blocks of 16 (32,768 tokens), as in
the bench folder's README: kvlint ``VLLMBlockSimulator(16, 2048)`` and
``SGLangRadixSimulator(32768, 1)``. Both tools are timed the same way — trace already in
memory, Numba already compiled (load and compile times are reported apart) — best of
``--repeat`` runs, and the script prints radixkv's speed-up as a ratio.

kvlint is not a radixkv dependency: ``pip install kvlint`` to run its side (skipped
otherwise). kvlint caches prompts only; radixkv is run twice: with the trace's outputs
(unique content that occupies the pool, as the engines do) and with outputs dropped
(``output_length`` 0), which is kvlint's model.

    python experiments/bench_vs_kvlint.py [--trace trace_tokens.jsonl] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import result, shared

from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import run_replay, warmup
from radixkv.trace.types import Trace
from radixkv.util import atomic_write_text, dumps_json


def load_peers(path: Path, with_outputs: bool) -> Trace:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return Trace.from_requests(
        req_id=[r["request_id"] for r in rows],
        arrival_s=[r["timestamp"] for r in rows],
        prompt_len=[len(r["token_ids"]) for r in rows],
        output_len=[r["output_length"] if with_outputs else 0 for r in rows],
        prompt_ids=[r["token_ids"] for r in rows],
        name=str(path),
    )


def best_of(repeat, fn):
    """(best wall seconds, best CPU seconds, last result): CPU time (``time.process_time``)
    does not count the waits for a core on a loaded machine, so its ratio is the stable one."""
    times, cpus, out = [], [], None
    for _ in range(repeat):
        c0 = time.process_time()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(times), min(cpus), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, default=None, help="trace_tokens.jsonl (default: generate it)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = args.trace
    if path is None:
        tmp = Path(tempfile.mkdtemp())
        subprocess.run([sys.executable, str(shared("bench", "gen_peers_trace.py"))], cwd=tmp, check=True,
                       stderr=subprocess.DEVNULL)
        path = tmp / "trace_tokens.jsonl"
    t0 = time.perf_counter()
    traces = {True: load_peers(path, True), False: load_peers(path, False)}
    load_s = time.perf_counter() - t0
    tokens = traces[True].total_prompt_tokens
    rows = []
    for label, pool in (("vllm:16", PoolSpec(num_gpu_blocks=2049)), ("sglang:1", PoolSpec(max_total_num_tokens=32768))):
        spec = parse_policy(label)
        compile_s = warmup(spec)
        for outs in (True, False):
            t, cpu, (_, s) = best_of(args.repeat, lambda: run_replay(traces[outs], spec, pool))
            rows.append({"tool": "radixkv", "policy": label, "outputs_cached": outs, "seconds": t, "cpu_s": cpu,
                         "compile_s": compile_s, "token_hit_rate": s["token_hit_rate"],
                         "prompt_tokens_per_s": tokens / t})
    try:
        from kvlint.sim.sglang_radix import SGLangRadixSimulator
        from kvlint.sim.vllm_blocks import VLLMBlockSimulator
    except ImportError:
        print("kvlint is not installed (pip install kvlint): its side is skipped", file=sys.stderr)
    else:
        reqs = [(str(r), traces[True].prompt_ids(i).tolist()) for i, r in enumerate(traces[True].req_id)]
        for label, make in (("vllm:16", lambda: VLLMBlockSimulator(16, 2048)),
                            ("sglang:1", lambda: SGLangRadixSimulator(32768, 1))):
            def run(make=make):
                sim = make()
                hit = sum(sim.feed_tokens(rid, toks).cached_tokens for rid, toks in reqs)
                return hit / tokens
            t, cpu, rate = best_of(args.repeat, run)
            rows.append({"tool": "kvlint", "policy": label, "outputs_cached": False, "seconds": t, "cpu_s": cpu,
                         "token_hit_rate": rate, "prompt_tokens_per_s": tokens / t})
    print(f"trace {path}: {len(traces[True]):,} requests, {tokens:,} prompt tokens; load {load_s:.2f} s")
    print(f"{'tool':8} {'policy':9} {'outputs':8} {'seconds':>8} {'CPU s':>7} {'hit rate':>9} {'M tok/s':>8} "
          f"{'/ kvlint':>9} {'CPU / kvlint':>13}")
    for r in rows:
        ref = [k for k in rows if k["tool"] == "kvlint" and k["policy"] == r["policy"]]
        if ref and r["tool"] == "radixkv":
            r["ratio"] = r["seconds"] / ref[0]["seconds"]
            r["cpu_ratio"] = r["cpu_s"] / ref[0]["cpu_s"]
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else ""
        cpu_ratio = f"{r['cpu_ratio']:.3f}" if "cpu_ratio" in r else ""
        print(f"{r['tool']:8} {r['policy']:9} {str(r['outputs_cached']):8} {r['seconds']:8.3f} {r['cpu_s']:7.3f} "
              f"{r['token_hit_rate']:9.4f} {r['prompt_tokens_per_s'] / 1e6:8.1f} {ratio:>9} {cpu_ratio:>13}")
    print("like for like with kvlint's model (prompts only, outputs not cached): the radixkv rows with outputs False; "
          "the rows with outputs True also cache each request's output blocks, as the engines do")
    atomic_write_text(result("bench_vs_kvlint.json"), dumps_json({"load_s": load_s, "rows": rows,
                                                                  "load_average": list(os.getloadavg())}))


if __name__ == "__main__":
    main()
