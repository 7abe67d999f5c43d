"""Compare radixkv's concurrent replay with the step-level goldens of vLLM's real scheduler.

The goldens (tests/data/concurrent/vllm/*.jsonl) come from
``tools/engines/vllm_scheduler_golden.py``, which drives vLLM 0.33's v1 ``Scheduler`` on
CPU; their format is in that file's docstring. Here the same trace is replayed by
:func:`radixkv.replay.concurrent.replay_concurrent` on a step clock
(:class:`radixkv.cost.UnitStepCost`, one second per step, arrival step a = arrival time a
s; a ``scheduling_policy="priority"`` golden with the priorities of its request lines),
with ``BlockHashCache`` (prefix caching on) or ``NoCache`` (off) on the same pool, and
every request (first-admission hit, admission step, finish step, preemptions) and every
step (scheduled requests with their token counts, preempted requests) is compared.

Run as a script to print the mismatches of every golden::

    PYTHONPATH=. python tests/_vllm_sched_golden.py [FILE.jsonl ...]
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
GOLDEN_DIR = HERE / "data" / "concurrent" / "vllm"
TRACE_DIRS = (HERE / "data" / "golden" / "traces", HERE / "data" / "concurrent" / "traces")


@dataclass
class Golden:
    """One golden file: its header, per-request lines and per-step lines (by step)."""

    path: Path
    header: dict
    requests: list
    steps: dict

    @property
    def config(self) -> dict:
        return self.header["config"]


def load_golden(path) -> Golden:
    """Read one golden file (header, then n request lines, then step lines)."""
    path = Path(path)
    with open(path) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    h = lines[0]
    n = int(h["requests"])
    reqs = lines[1: 1 + n]
    steps = {}
    for rec in lines[1 + n:]:  # a record with "n" stands for n consecutive identical steps
        s0 = int(rec["s"])
        for j in range(int(rec.get("n", 1))):
            steps[s0 + j] = {**rec, "s": s0 + j}
    return Golden(path, h, reqs, steps)


def golden_files() -> list[Path]:
    """Every committed golden file, sorted by name."""
    return sorted(GOLDEN_DIR.glob("*.jsonl"))


def trace_path(name: str) -> Path:
    for d in TRACE_DIRS:
        p = d / name
        if p.exists():
            return p
    raise FileNotFoundError(name)


@dataclass
class Comparison:
    """Mismatches of one replay against one golden (empty lists: exact)."""

    requests: list = field(default_factory=list)  # (row, radixkv tuple, golden tuple)
    steps: list = field(default_factory=list)  # (step, radixkv record, golden record)
    n_requests: int = 0
    n_steps: int = 0

    def summary(self) -> str:
        return (f"{len(self.requests)} of {self.n_requests} requests and {len(self.steps)} of "
                f"{self.n_steps} steps mismatch")


def replay_golden(g: Golden, fast_forward: bool = True):
    """Replay the golden's trace and configuration; returns (result, {step: record})."""
    from radixkv.cost import UnitStepCost
    from radixkv.policies.block_hash import BlockHashCache
    from radixkv.policies.no_cache import NoCache
    from radixkv.replay.concurrent import replay_concurrent
    from radixkv.replay.scheduler import SchedulerConfig
    from radixkv.trace.load import load_trace

    c = g.config
    tr = load_trace(trace_path(c["trace"]), format="native")
    if c.get("limit"):
        tr = tr.head(int(c["limit"]))
    policy = c.get("scheduling_policy", "fcfs")
    if policy == "priority":  # the priorities vLLM's requests were given (request lines' "prio")
        tr.priority = np.asarray([r["prio"] for r in g.requests], dtype=np.int64)
    B, nb = int(c["block_size"]), int(c["num_gpu_blocks"])
    pol = BlockHashCache(nb, B) if c["prefix_caching"] else NoCache(nb - 1, B)
    cfg = SchedulerConfig(max_num_seqs=int(c["max_num_seqs"]),
                          max_num_batched_tokens=int(c["max_num_batched_tokens"]),
                          enable_chunked_prefill=bool(c["chunked_prefill"]),
                          long_prefill_token_threshold=int(c.get("long_prefill_token_threshold", 0)),
                          watermark=float(c.get("watermark", 0.0)),
                          scheduling_policy=policy, admission="vllm")
    arrivals = np.asarray([r["arrive"] for r in g.requests], dtype=np.float64)
    steps: dict = {}

    def on_step(start, plan, k):
        s0 = int(round(start))
        if k == 1:
            rec = {"s": s0}
            r = []
            for q, n in zip(plan.req, plan.new):
                r += [int(q), int(n)]
            if r:
                rec["r"] = r
            if plan.preempted_rows:
                rec["p"] = [int(v) for v in plan.preempted_rows]
            steps[s0] = rec
            return
        r = []
        for q in plan.req:
            r += [int(q), 1]
        for j in range(k):
            steps[s0 + j] = {"s": s0 + j, "r": r}

    if not fast_forward:
        from radixkv.replay import sched_vllm

        orig = sched_vllm.VllmScheduler.can_fast_forward
        sched_vllm.VllmScheduler.can_fast_forward = lambda self, plan: False
        try:
            res = replay_concurrent(tr, pol, UnitStepCost(), arrivals=arrivals, config=cfg, on_step=on_step)
        finally:
            sched_vllm.VllmScheduler.can_fast_forward = orig
    else:
        res = replay_concurrent(tr, pol, UnitStepCost(), arrivals=arrivals, config=cfg, on_step=on_step)
    return res, steps


def compare(g: Golden, fast_forward: bool = True) -> Comparison:
    """Replay *g* with radixkv and list every mismatching request and step."""
    res, steps = replay_golden(g, fast_forward)
    out = Comparison(n_requests=len(g.requests), n_steps=len(g.steps))
    for i, r in enumerate(g.requests):
        mine = (int(res["hit_tokens"][i]), int(res["admit_s"][i]), int(res["finish_s"][i]) - 1,
                int(res["preemptions"][i]))
        gold = (r["hit"], r["admit"], r["finish"], r["preempt"])
        if mine != gold:
            out.requests.append((i, mine, gold))
    for s in sorted(set(g.steps) | set(steps)):
        a, b = steps.get(s, {}), g.steps.get(s, {})
        if a.get("r", []) != b.get("r", []) or a.get("p", []) != b.get("p", []):
            out.steps.append((s, a, b))
    return out


def main(argv) -> int:
    files = [Path(a) for a in argv] or golden_files()
    bad = 0
    for p in files:
        g = load_golden(p)
        c = compare(g)
        bad += bool(c.requests or c.steps)
        print(f"{p.name}: {c.summary()}", flush=True)
        for row, mine, gold in c.requests[:3]:
            print(f"  request {row} {g.requests[row]['id']}: radixkv (hit, admit, finish, preempt) {mine}, "
                  f"vLLM {gold}")
        for s, mine, gold in c.steps[:3]:
            print(f"  step {s}: radixkv {mine}\n          vLLM    {gold}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
