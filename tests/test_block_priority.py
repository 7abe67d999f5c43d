"""The eviction hook on vLLM's block pool (PriorityBlockHashCache).

With the priority "released longest ago" it must be vLLM's free queue exactly: the
built-in BlockHashCache is golden-checked against real vLLM (tests/test_block_hash.py),
so request for request equality (hit, held, evicted, pool stats, free-queue order)
transfers that. LFU over blocks is checked on a hand-worked case.
"""
from __future__ import annotations

import pytest

from _golden_traces import native_trace
from conftest import GOLDEN_LOCAL
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.block_priority import E_HITS, E_TIME, BlockLFU, BlockLRU, PriorityBlockHashCache
from radixkv.policies.radix_priority import EvictionPriority, priority_function
from radixkv.trace.types import Trace


def _run(cache, trace):
    out = []
    for i in range(len(trace)):
        a = cache.run_request(i, trace.kv_seq(i))
        out.append((a, cache.stats()))
    return out


@pytest.mark.parametrize("trace_name,B,nb", [("mixed200.jsonl", 16, 40), ("mixed200.jsonl", 16, 120),
                                             ("mixed200.jsonl", 32, 60), ("edge300.jsonl", 16, 40)])
def test_lru_priority_is_vllm(trace_name, B, nb):
    trace = native_trace(GOLDEN_LOCAL / "traces" / trace_name)
    a = BlockHashCache(nb, B)
    b = PriorityBlockHashCache(nb, B, eviction_policy=BlockLRU())
    assert _run(a, trace) == _run(b, trace)
    assert a.free_queue().tolist() == b.free_queue().tolist()


def test_lru_priority_is_vllm_in_pieces():
    """admit / extend in chunks / finish with three requests running at once."""
    trace = native_trace(GOLDEN_LOCAL / "traces" / "mixed200.jsonl")
    a, b = BlockHashCache(80, 16), PriorityBlockHashCache(80, 16, eviction_policy="lru")
    running = []
    for i in range(len(trace)):
        s = trace.kv_seq(i)
        ra, rb = a.admit(i, s, min(s.prompt_len, 40)), b.admit(i, s, min(s.prompt_len, 40))
        assert ra == rb
        if ra is not None:
            running.append(i)
        if len(running) == 3 or i == len(trace) - 1:
            for r in running:
                left = a._running[r].seq.kv_len - a._running[r].n_tokens
                while left > 0:
                    k = min(left, 23)
                    ok = a.extend(r, k)
                    assert ok == b.extend(r, k)
                    if not ok:
                        break
                    left -= k
                a.finish(r)
                b.finish(r)
            running = []
            assert a.stats() == b.stats()
            assert a.free_queue().tolist() == b.free_queue().tolist()


def test_lfu_hand_worked():
    """B = 4, 5 usable blocks; each request (9 tokens) holds 3 blocks: two full ones,
    cached, and its partial last one. X's two blocks are hit twice (requests 1, 2); Y's
    three blocks come from the keyless free ones; Z needs 3 blocks with 1 keyless free:
    2 evictions among X0, X1 (2 hits, released at request 2) and Y0, Y1 (0 hits, released
    at request 3). LRU evicts X's (released first); LFU evicts Y's. X + 1 token then hits
    8 tokens under LFU only."""
    X, Y, Z = list(range(100, 108)), list(range(200, 208)), list(range(300, 308))
    prompts = [X + [1], X + [2], X + [3], Y + [4], Z + [5], X + [6]]
    n = len(prompts)
    trace = Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n,
                                prompt_len=[len(p) for p in prompts], output_len=[1] * n, prompt_ids=prompts)

    def hits(c):
        return [c.run_request(i, trace.kv_seq(i)).hit_tokens for i in range(n)]

    assert hits(BlockHashCache(6, 4)) == [0, 8, 8, 0, 0, 0]
    assert hits(PriorityBlockHashCache(6, 4, eviction_policy=BlockLFU())) == [0, 8, 8, 0, 0, 8]


def test_unknown_block_policy():
    with pytest.raises(ConfigError, match="unknown block eviction policy"):
        PriorityBlockHashCache(10, 16, eviction_policy="arc")


def test_check_policy_passes():
    from radixkv.policies.check import check_policy

    check_policy(lambda cap: PriorityBlockHashCache.from_capacity_tokens(cap, 4, eviction_policy=BlockLFU()))


@priority_function
def _heap_lru(E, b, params):
    return float(E[b, E_TIME]), 0.0


@priority_function
def _heap_lfu62(E, b, params):
    return float(min(E[b, E_HITS], 62)), float(E[b, E_TIME])


class _HeapLRU(EvictionPriority):
    function = _heap_lru


class _HeapLFU62(EvictionPriority):
    function = _heap_lfu62


@pytest.mark.parametrize("B,nb", [(16, 40), (16, 120)])
def test_heap_and_bucket_modes_agree(B, nb):
    """The general (heap) path and the O(1) bucket path are different structures; with
    the same order — vLLM's LRU, and LFU with hits saturating at 62 — they must give the
    same requests, stats and free-queue order (and the LRU one is vLLM's)."""
    trace = native_trace(GOLDEN_LOCAL / "traces" / "mixed200.jsonl")
    pairs = ((PriorityBlockHashCache(nb, B, eviction_policy=_HeapLRU()), BlockHashCache(nb, B)),
             (PriorityBlockHashCache(nb, B, eviction_policy=_HeapLFU62()),
              PriorityBlockHashCache(nb, B, eviction_policy=BlockLFU())))
    for a, b in pairs:
        assert _run(a, trace) == _run(b, trace)
        assert a.free_queue().tolist() == b.free_queue().tolist()
