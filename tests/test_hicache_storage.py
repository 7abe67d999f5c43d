"""sglang-hicache's L3 storage tier (--hicache-storage-backend file): hand-worked cases
and the zero-size tier against the replay without one (docs/hicache.md "L3")."""
from __future__ import annotations

import json

import pytest

from conftest import GOLDEN_LOCAL
from radixkv.errors import ConfigError
from radixkv.policies.hicache import HiCacheRadixCache
from radixkv.trace.types import Trace

A = list(range(1000, 1012))          # 12 tokens
B = list(range(2000, 2020))          # 20 tokens
D = list(range(3000, 3020))          # 20 tokens


def _run(cache, prompts):
    n = len(prompts)
    tr = Trace.from_requests(req_id=[f"q{i}" for i in range(n)], arrival_s=[0.0] * n,
                             prompt_len=[len(p) for p in prompts], output_len=[0] * n,
                             prompt_ids=prompts, output_ids=[[] for _ in range(n)])
    out = []
    for i in range(n):
        adm = cache.run_request(i, tr.kv_seq(i))
        out.append((adm.hit_tokens, cache.last_host_hit, cache.last_loaded, getattr(cache, "last_storage_hit", 0)))
        cache.check_invariants()
    return out


def _cache(**kw):
    # device 24 tokens, host (40 // 1 + 1) = 41 tokens, write_through, page 1
    return HiCacheRadixCache(24, 1, write_policy="write_through", host_tokens=40, prefetch_threshold=10, **kw)


def test_prefetch_from_storage_by_hand():
    """A (12) is written through to host and storage. B (20) demotes A on the device
    and is written through (host 41 − 12 − 20 = 9 free). D (20) demotes B; its backup
    needs 11 more host tokens: the oldest host leaf A (12) goes. Host: B, D; storage:
    A, B, D (52 pages). A + 1: no device or host match (anchor: the root), 12 new
    tokens ≥ 10, the store holds A's 12 leading pages → the host has 1 free < 12 →
    evict_host(12) takes B (20) → A's 12 tokens become a host-only node, the match
    finds them (host hit 12 ≥ load_back_threshold) and loads them (D is demoted for
    room): hit 12. The new 1-token leaf is written through to host and storage."""
    c = _cache(hicache_storage_backend="file")
    got = _run(c, [A, B, D, A + [7]])
    assert got == [(0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0), (12, 12, 12, 12)]
    assert c.storage_hit_tokens_total == 12
    assert c.storage_written_tokens_total == 12 + 20 + 20 + 1
    assert c.host_evicted_tokens_total == 12 + 20
    # without the L3 tier the same requests miss A + 1 entirely
    assert _run(_cache(), [A, B, D, A + [7]])[-1] == (0, 0, 0, 0)


def test_prefetch_threshold():
    """12 tokens after the match are fewer than a threshold of 13: no storage lookup."""
    c = HiCacheRadixCache(24, 1, write_policy="write_through", host_tokens=40, prefetch_threshold=13,
                          hicache_storage_backend="file")
    assert _run(c, [A, B, D, A + [7]])[-1] == (0, 0, 0, 0)
    assert c.storage_hit_tokens_total == 0


def test_host_too_small_for_the_hit():
    """Host (20 // 1 + 1) = 21: after B's backup evicted A, 1 host token is free and the
    only host copy (B) is still on the device, so evict_host frees nothing; the partial
    allocation (1 token) is under the threshold: the prefetch is dropped (host_capacity)."""
    c = HiCacheRadixCache(24, 1, write_policy="write_through", host_tokens=20, prefetch_threshold=10,
                          hicache_storage_backend="file")
    assert _run(c, [A, B, A + [7]]) == [(0, 0, 0, 0)] * 3
    assert c.storage_written_tokens_total == 12 + 20 + 1


def test_capped_store_evicts_leading_pages():
    """A 40-token store (page LRU, evicting down to int(40 · 0.9) − 1 = 35 tokens when a
    new page does not fit): A (12) + B (20) = 32; D's 9th page evicts A's first 5 pages,
    its 14th A's next 5, its 19th A's last 2 and B's first 3 (15 evicted). A's first page
    is gone, so A + 1 finds no leading stored page: no prefetch. Its 13-token leaf is
    then written (13 new pages from 37 used: 3 fit, the 4th and the 9th evict 5 each)."""
    c = _cache(hicache_storage_backend="file", storage_tokens=40)
    _run(c, [A, B, D])
    assert c.storage_evicted_tokens_total == 15 and c.storage_used == 37
    assert _run(c, [A + [7]]) == [(0, 0, 0, 0)]
    assert c.storage_evicted_tokens_total == 25 and c.storage_used == 40
    assert c.storage_written_tokens_total == 52 + 13


def test_write_back_stores_on_demotion():
    """write_back: A reaches host (and storage) only when B's allocation evicts it."""
    c = HiCacheRadixCache(24, 1, write_policy="write_back", host_tokens=40, prefetch_threshold=10,
                          hicache_storage_backend="file")
    _run(c, [A])
    assert c.storage_written_tokens_total == 0
    _run(c, [B])
    assert c.storage_written_tokens_total == 12


def _trace(name):
    from radixkv.trace.load import load_trace

    return load_trace(str(GOLDEN_LOCAL / "traces" / name))


@pytest.mark.parametrize("page,policy", [(1, "write_through"), (16, "write_back"), (64, "write_through")])
def test_zero_size_storage_equals_no_storage(page, policy):
    """storage_tokens=0 is no L3 tier: every request equals the replay without a backend."""
    tr = _trace("mixed200.jsonl")
    cap = 1920
    a = HiCacheRadixCache(cap, page, write_policy=policy, hicache_ratio=1.0,
                          hicache_storage_backend="file", storage_tokens=0)
    b = HiCacheRadixCache(cap, page, write_policy=policy, hicache_ratio=1.0)
    assert a.hicache_storage_backend is None and not a.sequential_only
    for i in range(len(tr)):
        x, y = a.run_request(i, tr.kv_seq(i)), b.run_request(i, tr.kv_seq(i))
        assert (x.hit_tokens, x.held_tokens, x.evicted_tokens, x.host_loaded_tokens) == \
               (y.hit_tokens, y.held_tokens, y.evicted_tokens, y.host_loaded_tokens), i
    assert (a.written_tokens_total, a.host_evicted_tokens_total) == (b.written_tokens_total,
                                                                      b.host_evicted_tokens_total)


def test_config_errors():
    with pytest.raises(ConfigError, match="host pool"):
        HiCacheRadixCache(24, 1, host_tokens=0, hicache_storage_backend="file")
    with pytest.raises(ConfigError, match="backend"):
        HiCacheRadixCache(24, 1, hicache_storage_backend="mooncake")
    with pytest.raises(ConfigError, match="prefetch_policy"):
        HiCacheRadixCache(24, 1, hicache_storage_backend="file", prefetch_policy="eager")


def _cli(tmp_path, *args):
    from radixkv.cli import main

    out = tmp_path / "o.json"
    main(["replay", str(GOLDEN_LOCAL / "traces" / "mixed200.jsonl"), "--json", str(out), "--quiet", *args])
    return json.loads(out.read_text())["results"][0]["summary"]


def test_cli_storage_keys(tmp_path, capsys):
    """Storage keys are null without the tier, numbers with it; the zero-size tier
    gives the same summary numbers as no tier."""
    base = ["--policy", "sglang-hicache:16@hicache_ratio=0.5", "--capacity-tokens", "1904"]
    off = _cli(tmp_path, *base)
    zero = _cli(tmp_path, *base, "--hicache-storage-backend", "file", "--storage-cache-tokens", "0")
    on = _cli(tmp_path, *base, "--hicache-storage-backend", "file")
    assert off["storage_hit_tokens"] is None and off["storage_backend"] is None
    keys = ("hit_tokens", "host_hit_tokens", "host_loaded_tokens", "gpu_to_host_tokens", "host_evicted_tokens")
    assert {k: zero[k] for k in keys} == {k: off[k] for k in keys}
    assert on["storage_backend"] == "file" and on["storage_capacity_tokens"] is None
    assert on["storage_hit_tokens"] > 0 and on["host_to_storage_tokens"] >= on["gpu_to_host_tokens"] // 2
    # what storage prefetches is found on host and loaded: host hits grow by at most that
    assert on["host_hit_tokens"] > off["host_hit_tokens"]
    from radixkv.cli import main

    assert main(["replay", str(GOLDEN_LOCAL / "traces" / "mixed200.jsonl"), "--policy",
                 "vllm-offload:16@host_tokens=6400", "--capacity-tokens", "1904",
                 "--hicache-storage-backend", "file"]) != 0
    assert "does not apply" in capsys.readouterr().err


_SDIR = GOLDEN_LOCAL / "sglang_hicache_storage"
_SRUNS = [json.loads(line) for line in open(_SDIR / "manifest.jsonl")] if (_SDIR / "manifest.jsonl").exists() else []


@pytest.mark.parametrize("run", _SRUNS, ids=[m["name"] for m in _SRUNS])
def test_storage_golden(run):
    """SGLang 0.5.23's own UnifiedRadixCache + HybridCacheController + HiCacheFile, driven
    on CPU (tools/engines/gen_sglang_hicache_goldens.py --storage): 0 mismatching
    requests on device hit, host hit, loaded tokens and tokens prefetched from storage,
    and on the diagnostics (tokens written GPU→host, evicted from the device, host
    tokens held after the request)."""
    from _golden_traces import native_trace

    tr = native_trace(GOLDEN_LOCAL / "traces" / run["trace"])
    c = HiCacheRadixCache(run["capacity_tokens"], run["page_size"], write_policy=run["hicache_write_policy"],
                          hicache_ratio=run["hicache_ratio"], hicache_storage_backend="file",
                          prefetch_policy=run["hicache_storage_prefetch_policy"],
                          prefetch_threshold=run["prefetch_threshold"])
    assert c.host_capacity == run["host_capacity_tokens"]
    if "failed_at_request" in run:
        # SGLang ran out of device memory for a lone request (write_back: victims whose
        # host-only children are host-locked by in-flight storage writes are not
        # dropped, drop_subtree_no_host): the model cannot place the same request
        first = next(i for i in range(len(tr)) if tr.kv_seq(i).prompt_len < run["capacity_tokens"] - 6
                     and c.run_request(i, tr.kv_seq(i)) is None)
        assert first == run["failed_at_request"]
        return
    gold = [json.loads(line) for line in open(_SDIR / f"{run['name']}.jsonl")]
    bad = []
    for i, g in enumerate(gold):
        if g["status"] == "rejected":
            assert g["prompt_len"] >= run["capacity_tokens"] - 6
            continue
        w0, e0 = c.written_tokens_total, c.evicted_tokens_total
        adm = c.run_request(i, tr.kv_seq(i))
        got = (adm.hit_tokens - c.last_loaded, c.last_host_hit, c.last_loaded, c.last_storage_hit,
               c.written_tokens_total - w0, c.evicted_tokens_total - e0, c.tree_host)
        want = (g["hit_tokens"], g["host_hit_tokens"], g["loaded_tokens"], g["storage_hit_tokens"],
                g["written_tokens"], g["evicted_tokens"], g["host_cached_after"])
        if got != want:
            bad.append((g["id"], got, want))
    c.check_invariants()
    assert not bad, f"{len(bad)} mismatching requests, first {bad[:3]}"
    assert c.storage_hit_tokens_total == run["storage_hit_tokens"]
