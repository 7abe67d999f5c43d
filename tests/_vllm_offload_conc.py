"""Compare radixkv's concurrent replay of ``vllm-offload`` with the goldens of vLLM's real
scheduler + OffloadingConnector + CPUOffloadingManager driven concurrently on CPU.

The goldens (tests/data/golden/vllm_offload/concurrent/*.jsonl) come from
``tools/engines/vllm_offload_golden.py --concurrent`` (format in its ``run_concurrent``
docstring). Here the same trace is replayed by
:func:`radixkv.replay.concurrent.replay_concurrent` on a step clock
(:class:`radixkv.cost.UnitStepCost`: arrival step a = a seconds, no host link, so a load
lands at the end of the step that issued it and a store one step later — the stand-in
worker's convention) and compared per request (GPU hit, CPU hit, hit, first-admission
step, first scheduled step, finish step, preemptions) and per step (scheduled requests
with their tokens, preempted requests, loads issued with their tokens).

Run as a script to print the mismatches of every golden::

    PYTHONPATH=. python tests/_vllm_offload_conc.py [FILE.jsonl ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
GOLDEN_DIR = HERE / "data" / "golden" / "vllm_offload" / "concurrent"
TRACE_DIRS = (HERE / "data" / "golden" / "traces", HERE / "data" / "concurrent" / "traces")


def load(path):
    """(header, request lines, {step: record}) of one golden file."""
    lines = [json.loads(x) for x in open(path) if x.strip()]
    h = lines[0]
    n = int(h["requests"])
    return h, lines[1:1 + n], {int(r["s"]): r for r in lines[1 + n:]}


def golden_files() -> list:
    return sorted(p for p in GOLDEN_DIR.glob("*.jsonl") if p.name != "manifest.jsonl")


def replay(h, reqs):
    """Replay a golden's configuration; returns (result, per-row (gpu, cpu, first step),
    {step: record})."""
    from radixkv.cost import UnitStepCost
    from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
    from radixkv.replay.concurrent import replay_concurrent
    from radixkv.replay.scheduler import SchedulerConfig
    from radixkv.trace.load import load_trace

    c = h["config"]
    path = next(d / c["trace"] for d in TRACE_DIRS if (d / c["trace"]).exists())
    tr = load_trace(path, format="native")
    if c.get("limit"):
        tr = tr.head(int(c["limit"]))
    B = int(c["block_size"])
    bpc = (c["chunk_tokens"] or B) // B
    pol = build_policy(parse_policy(f"vllm-offload:{B}@host_tokens={h['num_cpu_chunks'] * B * bpc},"
                                    f"blocks_per_chunk={bpc},{c['eviction_policy']},"
                                    f"store_threshold={c['store_threshold']},"
                                    f"offload_prompt_only={str(c['offload_prompt_only']).lower()}"),
                       PoolSpec(num_gpu_blocks=int(c["num_gpu_blocks"])))
    cfg = SchedulerConfig(max_num_seqs=int(c["max_num_seqs"]), max_num_batched_tokens=int(c["max_num_batched_tokens"]),
                          long_prefill_token_threshold=int(c.get("long_prefill_token_threshold", 0)),
                          admission="vllm")
    n = len(reqs)
    split = [None] * n  # first admission's (gpu, cpu)
    first = [None] * n
    loads_now = []
    real_load, real_admit = pol.admit_load, pol._conc_admit

    def admit_load(rid, seq, n_tok, ext):
        adm = real_load(rid, seq, n_tok, ext)
        if split[rid] is None:
            split[rid] = (pol.last_gpu_hit, pol.last_cpu_hit)
        loads_now.append((rid, int(ext)))
        return adm

    def conc_admit(rid, seq, n_tokens):
        adm = real_admit(rid, seq, n_tokens)
        if adm is not None and split[rid] is None:
            split[rid] = (pol.last_gpu_hit, 0)
        return adm

    pol.admit_load, pol._conc_admit = admit_load, conc_admit
    steps = {}

    def on_step(start, plan, k):
        s0 = int(round(start))
        r = []
        for q, m in zip(plan.req, plan.new):
            r += [int(q), int(m)]
            if first[q] is None:
                first[q] = s0
        for j in range(k):
            rec = {"s": s0 + j}
            if r:
                rec["r"] = r
            if j == 0:
                if plan.preempted_rows:
                    rec["p"] = [int(v) for v in plan.preempted_rows]
                if loads_now:
                    rec["l"] = [x for pair in loads_now for x in pair]
            if len(rec) > 1:
                steps[s0 + j] = rec
        loads_now.clear()

    arrivals = np.asarray([r["arrive"] for r in reqs], dtype=np.float64)
    res = replay_concurrent(tr, pol, UnitStepCost(), arrivals=arrivals, config=cfg, on_step=on_step)
    return res, split, first, steps


def _pairs(flat):
    """Loads of a step as sorted (row, tokens) pairs (the golden lists them in row order)."""
    return sorted(zip(flat[::2], flat[1::2]))


def compare(path):
    """(request mismatches, step mismatches, n requests, n steps) of one golden."""
    h, reqs, gsteps = load(path)
    res, split, first, steps = replay(h, reqs)
    bad_r, bad_s = [], []
    for i, g in enumerate(reqs):
        mine = (*split[i], int(res["hit_tokens"][i]), int(res["admit_s"][i]), first[i],
                int(res["finish_s"][i]) - 1, int(res["preemptions"][i]))
        gold = (g["gpu"], g["cpu"], g["hit"], g["admit"], g["first"], g["finish"], g["preempt"])
        if mine != gold:
            bad_r.append((i, mine, gold))
    for s in sorted(set(gsteps) | set(steps)):
        a, b = steps.get(s, {}), gsteps.get(s, {})
        if any(a.get(k, []) != b.get(k, []) for k in ("r", "p")) or _pairs(a.get("l", [])) != _pairs(b.get("l", [])):
            bad_s.append((s, a, b))
    return bad_r, bad_s, len(reqs), len(gsteps)


def main(argv) -> int:
    files = [Path(a) for a in argv] or golden_files()
    bad = 0
    for p in files:
        br, bs, n, m = compare(p)
        bad += bool(br or bs)
        print(f"{p.name}: {len(br)} of {n} requests and {len(bs)} of {m} steps mismatch", flush=True)
        for row, mine, gold in br[:3]:
            print(f"  request {row}: radixkv (gpu, cpu, hit, admit, first, finish, preempt) {mine}, vLLM {gold}")
        for s, mine, gold in bs[:3]:
            print(f"  step {s}: radixkv {mine}\n          vLLM    {gold}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
