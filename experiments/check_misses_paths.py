"""The concurrent miss causes through the compiled loops equal the Python loop's, file for file.

For each configuration (policy, pool, arrival time scale, scheduler knobs, fast-forward on
or off) on the Mooncake conversation trace it replays with ``--miss-causes``' recorder
twice — through the compiled loop (``radixkv.replay.conc_vllm_fast`` /
``radixkv.replay.conc_sglang``) and, with both disabled, through the Python loop — writes
each run's per-request CSV and summary JSON (wall-clock-free) and compares the files byte
for byte (``cmp``). Prints one line per configuration and the count of identical files.

    RADIXKV_SHARED=/work/shared python experiments/check_misses_paths.py [--out DIR]
"""
from __future__ import annotations

import argparse
import filecmp
import os
import tempfile
from pathlib import Path

#: (policy, pool tokens, requests (None: all), time scale, scheduler knobs, fast-forward)
CONFIGS = [
    ("vllm:16", 464400, None, 10.0, {}, True),
    ("vllm:16", 464400, None, 10.0, {}, False),
    ("vllm:16", 150000, 3000, 1.0, {}, True),
    ("vllm:16", 150000, 3000, 1.0, {}, False),
    ("vllm:16", 150000, 3000, 1.0, {"enable_chunked_prefill": False, "max_num_batched_tokens": 150000}, True),
    ("vllm:16", 150000, 3000, 1.0, {"enable_chunked_prefill": False, "max_num_batched_tokens": 150000}, False),
    ("vllm:16", 200000, 3000, 1.0, {"max_num_batched_tokens": 2048, "long_prefill_token_threshold": 1024}, True),
    ("vllm:32", 200000, 3000, 1.0, {"watermark": 0.01, "max_num_seqs": 64}, True),
    ("sglang:1", 464400, None, 10.0, {}, True),
    ("sglang:1", 464400, None, 10.0, {}, False),
    ("sglang:1", 150000, 3000, 1.0, {}, True),
    ("sglang:1", 150000, 3000, 1.0, {}, False),
    ("sglang:1", 200000, 3000, 1.0, {"max_num_batched_tokens": 2048}, True),
    ("sglang:16", 150000, 3000, 1.0, {"schedule_policy": "lpm"}, True),
    ("sglang:1", 464400, 3000, 1.0, {"schedule_policy": "lpm"}, False),
    ("sglang:4", 200000, 3000, 1.0, {"max_num_seqs": 64}, False),
]


def _run(trace, text, cap, scale, knobs, ff, compiled, out: Path):
    from radixkv.cost import CostModel
    from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
    from radixkv.replay import conc_sglang
    from radixkv.replay import conc_vllm_fast as F
    from radixkv.replay.arrivals import arrival_times
    from radixkv.replay.conc_misses import MissRecorder, attach_concurrent_causes
    from radixkv.replay.concurrent import replay_concurrent
    from radixkv.replay.scheduler import SchedulerConfig

    spec = parse_policy(text)
    cfg = SchedulerConfig(**knobs)
    pol = build_policy(spec, PoolSpec(capacity_tokens=cap), unit_tokens=trace.unit_tokens)
    rec = MissRecorder(trace, pol, cfg)
    eligible, enabled = F._eligible, conc_sglang.ENABLED
    if not compiled:
        F._eligible = lambda *a: False
        conc_sglang.ENABLED = False
    try:
        res = replay_concurrent(trace, pol, CostModel.from_specs("Llama-3.1-8B", "A100-80GB"),
                                arrivals=arrival_times(trace, time_scale=scale), config=cfg, fast_forward=ff,
                                recorder=rec)
    finally:
        F._eligible, conc_sglang.ENABLED = eligible, enabled
    assert (rec._compiled is not None) == compiled, "the replay did not take the expected loop"
    attach_concurrent_causes(trace, spec, res, [rec])
    res.write_csv(out.with_suffix(".csv"))
    res.write_json(out.with_suffix(".json"))
    return res.summary()


def main(argv=None) -> int:
    from radixkv.trace.load import load_trace

    shared = os.environ.get("RADIXKV_SHARED", "../shared")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(Path(shared) / "traces/mooncake-fast25/conversation_trace.jsonl"))
    ap.add_argument("--out", default=None, help="folder for the CSV/JSON pairs (default: a temporary one)")
    a = ap.parse_args(argv)
    full = load_trace(a.trace)
    out = Path(a.out or tempfile.mkdtemp(prefix="misses-paths-"))
    out.mkdir(parents=True, exist_ok=True)
    same = total = 0
    for k, (text, cap, limit, scale, knobs, ff) in enumerate(CONFIGS):
        tr = full.head(limit) if limit else full
        s = _run(tr, text, cap, scale, knobs, ff, True, out / f"c{k:02d}-compiled")
        _run(tr, text, cap, scale, knobs, ff, False, out / f"c{k:02d}-python")
        ok = []
        for ext in (".csv", ".json"):
            eq = filecmp.cmp(out / f"c{k:02d}-compiled{ext}", out / f"c{k:02d}-python{ext}", shallow=False)
            ok.append(eq)
            same += eq
            total += 1
        mc = s["miss_causes"]["tokens"]
        print(f"c{k:02d} {text:<9} pool {cap:>7,} n {len(tr):>6,} x{scale:<4} {knobs} ff={ff}: csv {'same' if ok[0] else 'DIFF'}, "
              f"json {'same' if ok[1] else 'DIFF'}; preemptions {s['preemptions']}, in_flight {mc['in_flight']}, "
              f"preemption {mc['preemption']}", flush=True)
    print(f"{same} of {total} files identical ({out})")
    return 0 if same == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
