"""Benchmark: the streaming sequential replay (:mod:`radixkv.replay.stream`) on a trace
larger than one wants in memory, and its equality with the in-memory replay.

    python experiments/bench_stream.py gen OUT.jsonl --requests 10000000      # write the trace
    python experiments/bench_stream.py stream OUT.jsonl --policy sglang:1 [--limit N] [--chunk K]
    python experiments/bench_stream.py memory OUT.jsonl --policy sglang:1 [--limit N]

``gen`` writes a Mooncake-format trace (512-token hash ids) of chat-like requests: each
request continues one of 20,000 conversations (a shared system prompt of one of 64, then
the conversation's earlier units) and adds 1–3 fresh units; prompts of 1–12 units, outputs
of 1–400 tokens; one request per millisecond. Seeded: the same file every time. Never
commit it (1 GB at 10 M requests): write it under /tmp.

``stream`` replays it with :func:`radixkv.replay.stream.replay_stream` and ``memory`` with
:func:`radixkv.trace.load.load_trace` + :func:`radixkv.replay.run.run_replay` (pool
``--capacity`` tokens, default 10 M); both print the summary without its timings as one
JSON line (compare them with ``cmp``) and the timings on stderr. Peak memory: run them
under ``/usr/bin/time -v`` ("Maximum resident set size").
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

UNIT = 512


def gen(path: str, n: int, seed: int = 7, block: int = 100_000) -> None:
    """Write *n* requests (module docstring) to *path*."""
    import numpy as np

    rng = np.random.default_rng(seed)
    conv_units: dict[int, list[int]] = {}
    fresh = 1_000_000
    with open(path, "w") as f:
        for a in range(0, n, block):
            m = min(block, n - a)
            conv = rng.zipf(1.3, m) % 20_000
            new = rng.integers(1, 4, m)
            last = rng.integers(1, UNIT + 1, m)
            out = rng.integers(1, 401, m)
            lines = []
            for j in range(m):
                c = int(conv[j])
                units = conv_units.get(c)
                if units is None or len(units) + int(new[j]) > 12:
                    units = [c % 64]  # a system prompt shared by many conversations
                ids = units + list(range(fresh, fresh + int(new[j])))
                fresh += int(new[j])
                conv_units[c] = ids[:-1]  # the last, partial unit is not continued
                p = UNIT * (len(ids) - 1) + int(last[j])
                lines.append(f'{{"timestamp": {a + j}, "input_length": {p}, "output_length": {int(out[j])}, '
                             f'"hash_ids": {json.dumps(ids)}}}\n')
            f.writelines(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["gen", "stream", "memory"])
    ap.add_argument("path")
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--policy", default="sglang:1")
    ap.add_argument("--capacity", type=float, default=1e7)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--chunk", type=int, default=None)
    args = ap.parse_args()
    if args.what == "gen":
        t0 = time.perf_counter()
        gen(args.path, args.requests)
        print(f"wrote {args.requests:,} requests to {args.path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return
    from radixkv.policies.registry import PoolSpec, parse_policy
    from radixkv.util import dumps_json

    spec, pool = parse_policy(args.policy), PoolSpec(capacity_tokens=int(args.capacity))
    t0, c0 = time.perf_counter(), time.process_time()
    if args.what == "stream":
        from radixkv.replay.stream import CHUNK_REQUESTS, replay_stream

        s = replay_stream(args.path, spec, pool, chunk_requests=args.chunk or CHUNK_REQUESTS, limit=args.limit)
    else:
        from radixkv.replay.run import run_replay
        from radixkv.trace.load import load_trace

        _, s = run_replay(load_trace(args.path), spec, pool, limit=args.limit)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    timing = s.pop("timing_s")
    s.pop("stream", None)
    print(dumps_json(s).replace("\n", " "))
    print(f"{args.what} {args.policy}: {s['requests']:,} requests, {wall:.1f} s wall, {cpu:.1f} s CPU; "
          f"timing_s {json.dumps(timing)}", file=sys.stderr)


if __name__ == "__main__":
    main()
