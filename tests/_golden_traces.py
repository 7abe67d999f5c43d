"""Build the golden runs' traces for the policy tests (shared by the policy test files).

Private test helpers that follow docs/golden.md exactly ("Traces and
conventions"). :func:`golden_trace` reads with ``radixkv.trace.load.load_trace`` (the
project's readers); the builders here are the fallback and an independent check of
those readers (see ``test_block_hash.py::test_readers_agree_with_golden_conventions``).

- native JSONL (``id``, ``tokens``, ``output_tokens``): token ids, U = 1, file order;
- Mooncake: first *limit* lines, U = 512, partial last unit, ids ``r<line index>``,
  arrival ``timestamp`` ms;
- WEKA (kv-cache-tester): U = 64, ``floor(in / 64)`` ids + a unique tail, outputs
  unique, ids ``r0, r1, …`` in replay order.
"""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.trace.types import Trace


def native_trace(path: Path) -> Trace:
    """A radixkv native token JSONL file (golden/traces/*.jsonl) as a U = 1 trace."""
    rid, plen, olen, pids, oids = [], [], [], [], []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            rid.append(r["id"])
            pids.append(r["tokens"])
            out = r.get("output_tokens", [])
            oids.append(out)
            plen.append(len(r["tokens"]))
            olen.append(len(out))
    n = len(rid)
    return Trace.from_requests(
        req_id=rid, arrival_s=[0.0] * n, prompt_len=plen, output_len=olen,
        prompt_ids=pids, output_ids=oids, name=str(path),
    )


def mooncake_trace(path: Path, limit: int | None = None) -> Trace:
    """The first *limit* lines of a Mooncake FAST'25 JSONL trace (U = 512, partial last unit)."""
    rid, arr, plen, olen, pids = [], [], [], [], []
    with open(path) as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            r = json.loads(line)
            rid.append(f"r{i}")
            arr.append(r["timestamp"] / 1000.0)
            plen.append(r["input_length"])
            olen.append(r["output_length"])
            pids.append(r["hash_ids"])
    return Trace.from_requests(
        req_id=rid, arrival_s=arr, prompt_len=plen, output_len=olen, prompt_ids=pids,
        unit_tokens=512, partial_last_unit=True, name=str(path),
    )


def weka_trace(path: Path) -> Trace:
    """A kv-cache-tester (WEKA Claude Code) trace file, U = 64, top-level requests only."""
    d = json.loads(Path(path).read_text())
    reqs = [r for r in d["requests"] if r.get("type") != "subagent"]
    order = sorted(range(len(reqs)), key=lambda i: reqs[i]["t"])  # stable
    reqs = [reqs[i] for i in order]
    return Trace.from_requests(
        req_id=[f"r{i}" for i in range(len(reqs))],
        arrival_s=[r["t"] for r in reqs],
        prompt_len=[r["in"] for r in reqs],
        output_len=[r["out"] for r in reqs],
        prompt_ids=[r["hash_ids"] for r in reqs],
        unit_tokens=int(d.get("block_size", 64)),
        partial_last_unit=False,
        name=str(path),
    )


#: trace name in the golden manifests -> (path parts under RADIXKV_SHARED, builder kwargs)
SHARED_TRACES = {
    "moon_conv_1500.jsonl": (("traces", "mooncake-fast25", "conversation_trace.jsonl"), "mooncake", 1500),
    "weka_0001.jsonl": (("traces", "weka-claude-code", "traces", "trace_0001.json"), "weka", None),
    # the chunked-prefill goldens (tests/data/golden/sglang_chunked)
    "moon_conv_300.jsonl": (("traces", "mooncake-fast25", "conversation_trace.jsonl"), "mooncake", 300),
    "weka_0002.jsonl": (("traces", "weka-claude-code", "traces", "trace_0002.json"), "weka", None),
}


def _load_trace():
    """``radixkv.trace.load.load_trace`` when the readers have landed, else None."""
    try:
        from radixkv.trace.load import load_trace
    except ImportError:
        return None
    return load_trace


def golden_trace(name: str, local_dir: Path, shared_path) -> Trace:
    """The trace a golden manifest names: local token traces or shared hash-id traces.

    Read with ``load_trace`` when it exists (the private builders above otherwise).
    *shared_path* is conftest's helper (skips the test when ``RADIXKV_SHARED`` is unset).
    """
    load_trace = _load_trace()
    if name in SHARED_TRACES:
        parts, fmt, limit = SHARED_TRACES[name]
        p = shared_path(*parts)
        if load_trace is not None:
            return load_trace(p, format=fmt).head(limit)
        return mooncake_trace(p, limit) if fmt == "mooncake" else weka_trace(p)
    p = local_dir / "traces" / name
    return load_trace(p, format="native") if load_trace is not None else native_trace(p)
