"""radixkv curve --host-capacities: hit rate over the host pool at one GPU pool."""
from __future__ import annotations

import json

from conftest import GOLDEN_LOCAL
from radixkv.cli import main
from radixkv.policies.hicache import HiCacheRadixCache
from radixkv.policies.radix import RadixCache
from radixkv.trace.load import load_trace

TRACE = GOLDEN_LOCAL / "traces" / "mixed200.jsonl"


def _hits(cache, tr, n):
    return sum(cache.run_request(i, tr.kv_seq(i)).hit_tokens for i in range(n))


def test_host_curve_points(tmp_path):
    """Host 0 is the single-tier engine at the GPU pool (RadixCache, an independent
    class); host H is HiCacheRadixCache(host_tokens=H) (the spec's hicache_ratio is
    replaced); the single tier is RadixCache at GPU + H tokens."""
    out = tmp_path / "c"
    rc = main(["curve", str(TRACE), "--policies", "sglang-hicache:1@hicache_ratio=3,sglang-hicache:1@write_back",
               "--capacities", "1904", "--host-capacities", "0,2000", "--single-tier", "sglang:1", "--limit", "120",
               "--out", str(out), "--no-timing", "--quiet"])
    assert rc == 0 and (tmp_path / "c.png").stat().st_size > 0
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["x"] == "host_capacity_tokens"
    tr = load_trace(str(TRACE))
    two, wb, one = doc["curves"]
    assert [c["tiers"] for c in doc["curves"]] == [2, 2, 1]
    assert [p["host_capacity_tokens"] for p in two["points"]] == [0, 2000]
    base = _hits(RadixCache(1904, 1), tr, 120)
    assert two["points"][0]["hit_tokens"] == wb["points"][0]["hit_tokens"] == one["points"][0]["hit_tokens"] == base
    assert two["points"][1]["hit_tokens"] == _hits(HiCacheRadixCache(1904, 1, host_tokens=2000), tr, 120)
    assert wb["points"][1]["hit_tokens"] == _hits(HiCacheRadixCache(1904, 1, host_tokens=2000,
                                                                     write_policy="write_back"), tr, 120)
    assert one["points"][1]["hit_tokens"] == _hits(RadixCache(3904, 1), tr, 120)
    assert one["points"][1]["capacity_tokens"] == 3904 and "host_loaded_tokens" not in one["points"][1]
    assert two["points"][0]["host_loaded_tokens"] == 0 and two["points"][1]["host_loaded_tokens"] > 0


def test_host_curve_errors(capsys):
    args = ["curve", str(TRACE), "--host-capacities", "0,100", "--limit", "5", "--quiet"]
    assert main([*args, "--policies", "sglang-hicache:1", "--capacities", "1904,4000"]) != 0
    assert "one --capacities value" in capsys.readouterr().err
    assert main([*args, "--policies", "sglang:1", "--capacities", "1904"]) != 0
    assert "no host-memory KV tier" in capsys.readouterr().err
    assert main(["curve", str(TRACE), "--policies", "sglang:1", "--capacities", "1904", "--single-tier", "vllm:16",
                 "--limit", "5", "--quiet"]) != 0
    assert "--single-tier goes with --host-capacities" in capsys.readouterr().err


def test_host_curve_vllm_offload(tmp_path):
    """vllm-offload through its public host_tokens option: host 0 hits what vllm:16 hits
    at the GPU pool (its documented zero-tier equality, from the BlockHashCache
    replay); a CPU pool adds CPU hits (host_loaded_tokens), and at this tight GPU pool
    more hits overall."""
    out = tmp_path / "v.json"
    rc = main(["curve", str(TRACE), "--policies", "vllm-offload:16", "--capacities", "1904",
               "--host-capacities", "0,4000", "--single-tier", "vllm:16", "--limit", "80", "--json", str(out),
               "--no-timing", "--quiet"])
    assert rc == 0
    two, one = json.loads(out.read_text())["curves"]
    assert two["points"][0]["hit_tokens"] == one["points"][0]["hit_tokens"]
    assert two["points"][0]["host_loaded_tokens"] == 0 and two["points"][1]["host_loaded_tokens"] > 0
    assert two["points"][1]["hit_tokens"] > two["points"][0]["hit_tokens"]


def test_sequential_replicas_report_host_tier(tmp_path):
    """--replicas 2 (round-robin: request i on replica i mod 2) with sglang-hicache: each
    replica's host-tier totals equal a direct replay of its requests, the aggregate is
    their sum, the storage keys stay null (no L3 tier)."""
    out = tmp_path / "r.json"
    rc = main(["replay", str(TRACE), "--policy", "sglang-hicache:1@hicache_ratio=1,write_back", "--capacity-tokens",
               "1904", "--replicas", "2", "--limit", "120", "--json", str(out), "--quiet"])
    assert rc == 0
    s = json.loads(out.read_text())["results"][0]["summary"]
    tr = load_trace(str(TRACE))
    want = []
    for r in range(2):
        c = HiCacheRadixCache(1904, 1, hicache_ratio=1.0, write_policy="write_back")
        for i in range(r, 120, 2):
            c.run_request(i, tr.kv_seq(i))
        want.append((c.written_tokens_total, c.loaded_tokens_total, c.host_hit_tokens_total))
    got = [(r["gpu_to_host_tokens"], r["host_to_gpu_tokens"], r["host_hit_tokens"]) for r in s["replicas"]]
    assert got == want and want[0][1] > 0
    assert s["gpu_to_host_tokens"] == want[0][0] + want[1][0]
    assert s["host_loaded_tokens"] == want[0][1] + want[1][1]
    assert s["host_capacity_tokens"] == 2 * 1905 and s["storage_hit_tokens"] is None
