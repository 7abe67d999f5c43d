"""radixkv against the real engines on a multi-tenant trace with cache salts, LoRA adapters
and images (issue 33): per-request hit tokens, 0 mismatching requests.

Goldens: tests/data/golden/traffic/, written by tools/engines/gen_traffic_goldens.py
(vLLM 0.33's KVCacheManager and block hasher; SGLang 0.5.23's UnifiedRadixCache with the
prompt padded by pad_mm_tokens), each run as written (salted) and with every cache_salt
dropped (``nosalt``), which radixkv replays as ``--isolation none``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import run_replay
from radixkv.trace.load import load_trace

DIR = Path(__file__).parent / "data" / "golden" / "traffic"


def _runs():
    out = []
    for eng in ("vllm", "sglang"):
        m = DIR / f"manifest_{eng}.jsonl"
        if m.exists():
            out += [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
    return out


RUNS = _runs()


def test_goldens_present():
    engines = {r["engine"].split()[0] for r in RUNS}
    assert engines == {"vllm", "sglang"}, engines
    assert all(r["not_ok"] == 0 for r in RUNS)


@pytest.mark.parametrize("run", RUNS, ids=[r["name"] for r in RUNS])
def test_golden(run):
    trace = load_trace(DIR / run["trace"])
    if not run["salts"]:
        trace = trace.with_isolation("none")
    if run["engine"].startswith("vllm"):
        spec, pool = parse_policy(f"vllm:{run['block_size']}"), PoolSpec(num_gpu_blocks=run["num_gpu_blocks"])
    else:
        spec, pool = parse_policy(f"sglang:{run['page_size']}"), PoolSpec(max_total_num_tokens=run["capacity_tokens"])
    rec, _ = run_replay(trace, spec, pool, quiet=True)
    got = dict(zip(rec.req_id.tolist(), rec["hit_tokens"].tolist()))
    rows = [json.loads(x) for x in (DIR / f"{run['name']}.jsonl").read_text().splitlines() if x.strip()]
    bad = [(r["id"], r["hit_tokens"], got[r["id"]]) for r in rows if got[r["id"]] != r["hit_tokens"]]
    assert not bad, f"{len(bad)} of {len(rows)} requests differ (id, engine, radixkv): {bad[:5]}"
    assert sum(got.values()) == run["hit_tokens"]


def test_salts_cost_hits():
    """The goldens themselves: removing the salts never loses hits and here gains some."""
    by = {(r["engine"].split()[0], r.get("block_size") or r.get("page_size"), r.get("num_gpu_blocks")
           or r.get("capacity_tokens"), r["salts"]): r["hit_tokens"] for r in RUNS}
    unbounded = [k for k in by if k[3] and k[2] >= 100000]
    assert unbounded
    for k in unbounded:
        assert by[k[:3] + (False,)] > by[k]
