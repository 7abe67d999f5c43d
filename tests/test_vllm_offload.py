"""vLLM CPU KV offloading (``vllm-offload``) against real vLLM 0.33.0, and by hand.

The goldens in tests/data/golden/vllm_offload were written by vLLM's own v1 ``Scheduler``
with the ``OffloadingConnector`` (scheduler role) and ``CPUOffloadingManager`` (``lru`` /
``arc``), switched on by ``kv_offloading_size`` and driven on CPU one request at a time
by tools/engines/vllm_offload_golden.py: block 16 and 32, offload chunks of 1, 2 and 4
blocks, tight GPU pools, CPU pools from 12 to 400 chunks, ``store_threshold`` 2,
``offload_prompt_only`` true and false. Per request the GPU hit, the CPU hit, the tokens
computed from, and the chunks stored, evicted and failed to store must agree. Two more
runs replay the first 300 requests of the Mooncake conversation trace (GPU 128,000 tokens,
CPU 1.6 M tokens LRU / 1.28 M tokens ARC in chunks of 4 blocks; need RADIXKV_SHARED and
RADIXKV_SLOW=1).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest

from _golden_traces import mooncake_trace, native_trace
from conftest import GOLDEN_LOCAL, shared_path
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.offload_cpu import CPUOffloadStore, RequestAccess
from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.policies.vllm_offload import OffloadBlockHashCache, _Off, num_cpu_chunks
from radixkv.trace.types import Trace

_DIR = GOLDEN_LOCAL / "vllm_offload"
_RUNS = [json.loads(line) for line in open(_DIR / "manifest.jsonl")]
if (_DIR / "shared" / "manifest.jsonl").exists():  # Mooncake runs: the trace is under RADIXKV_SHARED
    _RUNS += [json.loads(line) for line in open(_DIR / "shared" / "manifest.jsonl")]
_TRACES: dict = {}
_FIELDS = ("gpu", "cpu", "computed", "stored", "evicted", "store_fail")


def _trace(name):
    if name not in _TRACES:
        if name.startswith("mooncake:"):
            # the first K lines of the Mooncake conversation trace (docs/golden.md conventions)
            _TRACES[name] = mooncake_trace(shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl"),
                                           int(name.split(":")[1]))
        else:
            _TRACES[name] = native_trace(GOLDEN_LOCAL / "traces" / name)
    return _TRACES[name]


@pytest.mark.parametrize("run", [pytest.param(m, marks=pytest.mark.slow) if m.get("shared") else m for m in _RUNS],
                         ids=[m["name"] for m in _RUNS])
def test_vllm_offload_golden(run):
    if run.get("shared") and os.environ.get("RADIXKV_SLOW") != "1":
        pytest.skip("the Mooncake goldens (300 requests, 4.3 M prompt tokens) run only with RADIXKV_SLOW=1")
    tr = _trace(run["trace"])
    gold = [json.loads(line) for line in open(_DIR / ("shared" if run.get("shared") else "") / f"{run['name']}.jsonl")][1:]
    B = run["block_size"]
    bpc = (run["chunk_tokens"] or B) // B
    c = build_policy(parse_policy(f"vllm-offload:{B}@host_tokens={run['num_cpu_chunks'] * B * bpc},"
                                  f"blocks_per_chunk={bpc},{run['eviction_policy']},"
                                  f"store_threshold={run['store_threshold']},"
                                  f"offload_prompt_only={str(run['offload_prompt_only']).lower()}"),
                     PoolSpec(num_gpu_blocks=run["num_gpu_blocks"]))
    assert isinstance(c, OffloadBlockHashCache) and c.cpu.num_chunks == run["num_cpu_chunks"]
    bad = []
    for i, g in enumerate(gold):
        s0, e0, f0 = c.cpu.stored_total, c.cpu.evicted_total, c.cpu.failed_stores
        adm = c.run_request(i, tr.kv_seq(i))
        got = (c.last_gpu_hit, c.last_cpu_hit, adm.hit_tokens, c.cpu.stored_total - s0, c.cpu.evicted_total - e0,
               c.cpu.failed_stores - f0)
        want = tuple(g[k] for k in _FIELDS)
        if got != want:
            bad.append((g["id"], got, want))
    assert not bad, f"{len(bad)} mismatching requests, first {bad[:3]}"
    assert sum(g["cpu"] for g in gold) > 0  # the run exercises CPU hits


@pytest.mark.parametrize("offload,plain", [("mixed200_b16_n120_c64_lru.jsonl", "vllm_mixed200_b16_n120.jsonl"),
                                           ("edge300_b16_n40_c24_lru.jsonl", "vllm_edge300_b16_n40.jsonl")])
def test_engine_gpu_hits_unchanged_by_offloading(offload, plain):
    """In the real engine the GPU prefix hits with offloading equal those of plain vLLM
    (the goldens of tests/data/golden/vllm, made by another harness): the premise of
    layering the tier over the unchanged block-hash model."""
    a = [json.loads(x)["hit_tokens"] for x in open(GOLDEN_LOCAL / "vllm" / plain)]
    b = [json.loads(x)["gpu"] for x in list(open(_DIR / offload))[1:]]
    assert a == b


@pytest.mark.parametrize("trace,blocks", [("mixed200.jsonl", 120), ("edge300.jsonl", 40), ("mixed200.jsonl", 400)])
def test_zero_cpu_tier_equals_vllm(trace, blocks):
    """host_tokens=0: every admission and the pool equal ``vllm`` exactly."""
    tr = _trace(trace)
    a = build_policy(parse_policy("vllm-offload:16@host_tokens=0"), PoolSpec(num_gpu_blocks=blocks))
    b = BlockHashCache(blocks, 16)
    assert a.cpu is None and a.host_capacity == 0
    for i in range(len(tr)):
        x, y = a.run_request(i, tr.kv_seq(i)), b.run_request(i, tr.kv_seq(i))
        assert (x.hit_tokens, x.held_tokens, x.evicted_tokens) == (y.hit_tokens, y.held_tokens, y.evicted_tokens), i
    assert a.stats() == b.stats() and a.evictions == b.evictions
    assert a.written_tokens_total == a.loaded_tokens_total == 0


def test_zero_cpu_tier_replay_summary_equals_vllm():
    from radixkv.replay.run import run_replay as replay

    tr = _trace("edge300.jsonl")
    pool = PoolSpec(num_gpu_blocks=40)
    _, sa = replay(tr, parse_policy("vllm-offload:16@host_tokens=0"), pool)
    _, sb = replay(tr, parse_policy("vllm:16"), pool)
    for k in ("hit_tokens", "token_hit_rate", "evicted_tokens", "evictions", "prompt_tokens"):
        assert sa[k] == sb[k], k


# ---------------------------------------------------------------------- the CPU store by hand
def _req(keys, chunk=16):
    r = RequestAccess()
    r.pos = {k: (j + 1) * chunk for j, k in enumerate(keys)}
    return r


def _store(cpu, keys, req):
    got = cpu.prepare_store(keys, req)
    if got is not None:
        cpu.complete_store(got[0])
    return got


def test_lru_evicts_the_prompt_tail_first():
    """lru.py: at request end the keys get fresh ranks tail first, so the head of the
    prompt is most recent and a later store evicts the tail."""
    cpu = CPUOffloadStore(3, "lru")
    r1 = _req(["a", "b", "c"])
    assert _store(cpu, ["a", "b", "c"], r1) == (["a", "b", "c"], [])
    cpu.request_finished(r1)
    r2 = _req(["d"])
    assert _store(cpu, ["d"], r2) == (["d"], ["c"])
    assert _store(cpu, ["e"], _req(["e"])) == (["e"], ["b"])


def test_offered_keys_are_never_evicted_and_a_short_store_fails():
    """manager.py prepare_store: the offer's keys are protected; not enough idle chunks
    outside them → None, nothing changes."""
    cpu = CPUOffloadStore(2, "lru")
    r1 = _req(["a", "b"])
    _store(cpu, ["a", "b"], r1)
    cpu.request_finished(r1)
    r2 = _req(["a", "b", "x"])
    assert cpu.prepare_store(["a", "b", "x"], r2) is None
    assert cpu.failed_stores == 1 and set(cpu.ref) == {"a", "b"}
    r3 = _req(["a", "y"])
    assert _store(cpu, ["a", "y"], r3) == (["y"], ["b"])  # a is offered (protected): b goes


def test_pinned_and_in_flight_chunks_are_not_idle():
    cpu = CPUOffloadStore(2, "lru")
    r1 = _req(["a", "b"])
    got = cpu.prepare_store(["a", "b"], r1)  # in flight (ref −1)
    assert got == (["a", "b"], []) and not cpu.is_ready("a")
    assert cpu.prepare_store(["x"], _req(["x"])) is None
    cpu.complete_store(["a", "b"])
    r2 = _req(["a"])
    cpu.prepare_load(["a"], r2)  # pinned
    assert cpu.prepare_store(["x", "y"], _req(["x", "y"])) is None  # only b is idle
    cpu.complete_load(["a"])
    assert cpu.n_idle == 2


def test_arc_promotes_reuse_and_adapts_on_a_ghost_hit():
    """arc.py: insert → T1; a reused key → T2 at request end; eviction from T1 while
    |T1| ≥ int(target) puts the key in B1; a store miss on B1 raises the target by
    max(1, |B2|/|B1|) = 1, after which T1 (size 1 ≥ 1) still gives the victim."""
    cpu = CPUOffloadStore(2, "arc")
    r1 = _req(["a", "b"])
    _store(cpu, ["a", "b"], r1)
    cpu.request_finished(r1)
    arc = cpu.policy
    assert list(arc.t1) == ["b", "a"]  # tail first to the MRU end: the head ends youngest
    r2 = _req(["a"])
    cpu.prepare_load(["a"], r2)
    cpu.complete_load(["a"])
    cpu.request_finished(r2)
    assert list(arc.t1) == ["b"] and list(arc.t2) == ["a"]
    assert _store(cpu, ["x"], _req(["x"])) == (["x"], ["b"])
    assert list(arc.b1) == ["b"]
    assert _store(cpu, ["b"], _req(["b"])) == (["b"], ["x"])
    assert arc.target == 1.0 and list(arc.b1) == ["x"] and list(arc.t2) == ["a"]


def test_store_threshold_counts_offers():
    """store_threshold = 2: a new key is stored at its second offer."""
    cpu = CPUOffloadStore(4, "lru", store_threshold=2)
    assert cpu.prepare_store(["a", "b"], _req(["a", "b"])) == ([], [])
    assert cpu.prepare_store(["b", "c"], _req(["b", "c"])) == (["b"], [])
    assert dict(cpu.counts) == {"a": 1, "b": 2, "c": 1}


def test_store_threshold_tracker_is_bounded():
    cpu = CPUOffloadStore(4, "lru", store_threshold=2, max_tracker_size=2)
    cpu.prepare_store(["a", "b"], _req(["a", "b"]))
    cpu.prepare_store(["b", "c"], _req(["b", "c"]))  # b protected; a (oldest) makes room for c
    assert list(cpu.counts) == ["b", "c"]


# ---------------------------------------------------------------------- the connector by hand
def _lookup(policy, ready_chunks, P, gpu):
    """CPU hit of a prompt of P tokens whose chunks *ready_chunks* are stored, after a GPU hit."""
    keys = list(range(100, 100 + P // policy.chunk_tokens))
    o = _Off(_req(keys, policy.chunk_tokens), keys, P)
    o.req.keyl = keys
    for j in ready_chunks:
        policy.cpu.ref[keys[j]] = 0
        policy.cpu.n_idle += 1
        policy.cpu.policy.insert(keys[j], _req([keys[j]]))
        policy.cpu.policy.mark_evictable(keys[j])
    return policy._lookup_load(o, gpu), o


@pytest.mark.parametrize("ready,gpu,hit,loaded,next_", [
    ((0, 1, 2), 0, 24, 3, 3),   # all three chunks (8 tokens each)
    ((0, 1), 4, 12, 2, 2),      # GPU hit ends mid-chunk: the lookup starts at chunk 0, loads it whole
    ((0,), 4, 0, 0, 0),         # 8 − 4 = 4 tokens < one chunk: no CPU hit
    ((1,), 4, 0, 0, 0),         # chunk 0 missing: the walk stops at once
    ((1, 2), 8, 16, 2, 3),      # chunk-aligned GPU hit: from chunk 1
    ((0, 2), 0, 8, 1, 1),       # the first miss ends the hit
])
def test_lookup_rule(ready, gpu, hit, loaded, next_):
    """_lookup_complete_chunks with block 4, 2 blocks per chunk (8 tokens), P = 26: three
    whole chunks; the hit ends at min(3, G // 8 + consecutive) chunks, less G, ≥ 8."""
    p = OffloadBlockHashCache(64, 4, host_tokens=80, blocks_per_chunk=2, cpu_store="dict")
    got, o = _lookup(p, ready, 26, gpu)
    assert (got, p.cpu.loaded_total, o.next) == (hit, loaded, next_)


def _seq_trace(prompts):
    n = len(prompts)
    return Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n,
                               prompt_len=[len(p) for p in prompts], output_len=[1] * n,
                               prompt_ids=prompts, output_ids=[[90000 + i] for i in range(n)])


def test_whole_prompt_from_cpu_recomputes_the_last_token():
    """A CPU hit may cover the whole prompt; the scheduler then computes from P − 1
    (_update_waiting_for_remote_kv). GPU of 8 blocks of 4: request 1 evicts request 0."""
    a = list(range(16))
    tr = _seq_trace([a, list(range(1000, 1032)), a])
    p = OffloadBlockHashCache(9, 4, host_tokens=400)
    p.run_request(0, tr.kv_seq(0))
    p.run_request(1, tr.kv_seq(1))
    adm = p.run_request(2, tr.kv_seq(2))
    assert (p.last_gpu_hit, p.last_cpu_hit, adm.hit_tokens) == (0, 16, 15)
    assert p.loaded_tokens_total == 16 and p.written_tokens_total == 16 + 32


def test_gpu_hit_chunks_are_offered_again():
    """Without a CPU hit every prompt chunk is offered (GPU hits included): chunks
    dropped from CPU come back from the GPU copy."""
    tr = _seq_trace([list(range(16)), list(range(1000, 1008)), list(range(16)) + [7, 7, 7, 7]])
    p = OffloadBlockHashCache(64, 4, host_tokens=20)  # 5 chunks of 4 tokens
    p.run_request(0, tr.kv_seq(0))  # stores a0..a3
    p.run_request(1, tr.kv_seq(1))  # b0, b1: one more chunk than is free; the LRU drops a3 (the tail)
    adm = p.run_request(2, tr.kv_seq(2))  # offers a0..a3 + the new chunk: a3 and it are stored, b0 b1 go
    assert (p.last_gpu_hit, p.last_cpu_hit, adm.hit_tokens) == (16, 0, 16)
    assert (p.cpu.stored_total, p.cpu.evicted_total) == (4 + 2 + 2, 1 + 2)


# ---------------------------------------------------------------------- sizes and flags
def test_num_cpu_chunks_by_hand():
    # Llama-3.1-8B: 2 x 8 KV heads x 128 x 2 bytes x 32 layers = 131,072 B/token; block 16 → 2 MiB
    assert num_cpu_chunks(1 << 30, 131072, 16, 1) == 512
    assert num_cpu_chunks(1 << 30, 131072, 16, 4) == 128
    # 1,000 B/token x 16 = 16,000 B, padded to 16,384 (4 KiB pages)
    assert num_cpu_chunks(1 << 30, 1000, 16, 1) == (1 << 30) // 16384


def _ns(**kw):
    base = dict(hicache_ratio=None, hicache_size=None, host_cache_tokens=None, hicache_write_policy=None,
                kv_offloading_size=None, model=None, tp=1, kv_cache_dtype=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_kv_offloading_size_flag():
    from radixkv.cli.host_tier_args import host_tier_spec

    spec = host_tier_spec(parse_policy("vllm-offload:16"), _ns(kv_offloading_size=1.0, model="Llama-3.1-8B"))
    c = build_policy(spec, PoolSpec(num_gpu_blocks=100))
    assert c.cpu.num_chunks == 512 and c.host_capacity == 512 * 16
    spec = host_tier_spec(parse_policy("vllm-offload:16@arc"), _ns(host_cache_tokens=320))
    assert dict(spec.option) == {"eviction_policy": "arc", "host_tokens": 320}
    with pytest.raises(ConfigError, match="--model"):
        host_tier_spec(parse_policy("vllm-offload:16"), _ns(kv_offloading_size=1.0))
    with pytest.raises(ConfigError, match="does not apply"):
        host_tier_spec(parse_policy("vllm-offload:16"), _ns(hicache_ratio=2.0))
    with pytest.raises(ConfigError, match="does not apply"):
        host_tier_spec(parse_policy("sglang-hicache:16"), _ns(kv_offloading_size=1.0, model="Llama-3.1-8B"))
    with pytest.raises(ConfigError, match="does not model"):
        host_tier_spec(parse_policy("vllm:16"), _ns(kv_offloading_size=1.0, model="Llama-3.1-8B"))


def test_bad_options():
    for text in ("vllm-offload:16@lfu", "vllm-offload:16@host_tokens=x", "vllm-offload:16@bogus=1",
                 "vllm-offload:16@offload_prompt_only=maybe"):
        with pytest.raises(ConfigError):
            parse_policy(text)
    with pytest.raises(ConfigError):
        OffloadBlockHashCache(10, 16, blocks_per_chunk=0)
    assert parse_policy("vllm-offload:16@arc,host_tokens=64").label == "vllm-offload:16@eviction_policy=arc,host_tokens=64"


def test_summary_has_host_tier_fields():
    from radixkv.replay.run import run_replay as replay

    tr = _trace("edge300.jsonl")
    _, s = replay(tr, parse_policy("vllm-offload:16@host_tokens=1280"), PoolSpec(num_gpu_blocks=40))
    assert s["host_capacity_tokens"] == 1280
    assert s["host_hit_tokens"] == s["host_loaded_tokens"] == s["host_to_gpu_tokens"] > 0
    assert s["hit_tokens"] <= s["device_hit_tokens"] + s["host_hit_tokens"]
    assert np.isclose(s["host_hit_rate"], s["host_loaded_tokens"] / s["prompt_tokens"])


@pytest.mark.parametrize("bpc,ev", [(1, "lru"), (2, "arc")])
def test_conformance_kit(bpc, ev):
    """Every check of radixkv.check_policy (several running requests, chunked admission,
    preemption, peek_hit purity) passes with a CPU tier of half the GPU pool."""
    from radixkv import check_policy

    assert check_policy(lambda cap: OffloadBlockHashCache.from_capacity_tokens(
        max(cap, 16), 4, host_tokens=max(cap, 16) // 2, blocks_per_chunk=bpc, eviction_policy=ev, verify=True)) == []


# ---------------------------------------------------------------------- array store = dict store
@pytest.mark.parametrize("trace,blocks,chunks,bpc,prompt_only", [
    ("mixed200.jsonl", 120, 10, 1, True),     # a tiny pool: stores fail, protected keys block evictions
    ("mixed200.jsonl", 120, 64, 2, False),
    ("edge300.jsonl", 40, 7, 1, False),
    ("edge300.jsonl", 40, 30, 4, True),
])
def test_array_store_equals_dict_store(trace, blocks, chunks, bpc, prompt_only):
    """The compiled LRU store (ArrayLRUStore) makes the dict model's decisions request for
    request: GPU and CPU hits, chunks stored, evicted, failed, resident."""
    tr = _trace(trace)
    kw = dict(host_tokens=chunks * 16 * bpc, blocks_per_chunk=bpc, offload_prompt_only=prompt_only)
    a = OffloadBlockHashCache(blocks, 16, cpu_store="array", **kw)
    b = OffloadBlockHashCache(blocks, 16, cpu_store="dict", **kw)
    for i in range(len(tr)):
        x, y = a.run_request(i, tr.kv_seq(i)), b.run_request(i, tr.kv_seq(i))
        got = (x.hit_tokens, a.last_cpu_hit, a.cpu.stored_total, a.cpu.evicted_total, a.cpu.failed_stores,
               a.host_cached_tokens())
        want = (y.hit_tokens, b.last_cpu_hit, b.cpu.stored_total, b.cpu.evicted_total, b.cpu.failed_stores,
                b.host_cached_tokens())
        assert got == want, i
    assert b.cpu.evicted_total > 0


def test_array_store_refuses_what_it_does_not_model():
    with pytest.raises(ConfigError, match="array"):
        OffloadBlockHashCache(64, 16, host_tokens=640, eviction_policy="arc", cpu_store="array")
    assert isinstance(OffloadBlockHashCache(64, 16, host_tokens=640, store_threshold=2).cpu, CPUOffloadStore)


def test_array_store_heap_rebuild_keeps_the_order():
    """A heap that fills up is rebuilt from the resident chunks; decisions are unchanged
    (a pool of 3 chunks has a heap of 22 entries: many re-ranks force rebuilds)."""
    tr = _trace("edge300.jsonl")
    a = OffloadBlockHashCache(40, 16, host_tokens=48, cpu_store="array")
    b = OffloadBlockHashCache(40, 16, host_tokens=48, cpu_store="dict")
    for i in range(len(tr)):
        a.run_request(i, tr.kv_seq(i))
        b.run_request(i, tr.kv_seq(i))
        assert (a.last_cpu_hit, a.cpu.stored_total, a.cpu.evicted_total) == \
            (b.last_cpu_hit, b.cpu.stored_total, b.cpu.evicted_total), i
    assert a.cpu.hp_maj.shape[0] == 22
