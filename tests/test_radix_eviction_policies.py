"""SGLang's eviction policies through the priority hook, against real SGLang 0.5.23.

The goldens in tests/data/golden/sglang_evict were written by the real
``UnifiedRadixCache`` with ``--radix-eviction-policy`` set to each strategy
(tools/engines/gen_sglang_evict_goldens.py: tight pools, pages 1 and 16, the mixed200 and
edge300 token traces; requests carry no priority, so SGLang uses 0; tlru runs with the
manifest's ``eviction_policy_config``). Every request's hit, tokens evicted while it ran
and tokens cached afterwards must agree: 0 mismatching requests per policy × run.
"""
from __future__ import annotations

import json

import pytest

from _golden_traces import native_trace
from conftest import GOLDEN_LOCAL
from radixkv.policies.radix import RadixCache
from radixkv.policies.radix_priority import LRU, PriorityRadixCache, eviction_policy

_DIR = GOLDEN_LOCAL / "sglang_evict"
_RUNS = [json.loads(line) for line in open(_DIR / "manifest.jsonl")]
_TRACES: dict = {}


def _trace(name):
    if name not in _TRACES:
        _TRACES[name] = native_trace(GOLDEN_LOCAL / "traces" / name)
    return _TRACES[name]


def _replay(cache, trace):
    out = []
    for i in range(len(trace)):
        before = cache.evicted_tokens_total
        adm = cache.run_request(i, trace.kv_seq(i))
        hit = None if adm is None else adm.hit_tokens
        out.append((hit, cache.evicted_tokens_total - before, cache.stats(detail=False).cached_tokens))
    return out


def test_eight_policies_four_runs():
    """The goldens cover every SGLang strategy on every run (and the runs evict)."""
    pols = {r["eviction_policy"] for r in _RUNS}
    assert pols == {"lru", "lfu", "slru", "priority", "tlru", "fifo", "mru", "filo"}
    assert len(_RUNS) == 32 and {r["page_size"] for r in _RUNS} == {1, 16}


@pytest.mark.parametrize("run", _RUNS, ids=[r["name"] for r in _RUNS])
def test_policy_golden(run):
    trace = _trace(run["trace"])
    gold = [json.loads(line) for line in open(_DIR / f"{run['name']}.jsonl")]
    assert [g["id"] for g in gold] == list(trace.req_id)
    ev = eviction_policy(run["eviction_policy"], **(run["eviction_policy_config"] or {}))
    cache = PriorityRadixCache(run["capacity_tokens"], run["page_size"], eviction_policy=ev)
    got = _replay(cache, trace)
    want = [(g["hit_tokens"], g["evicted_tokens"], g["cached_after"]) for g in gold]
    assert sum(w[1] for w in want) > 0  # the pool is tight: the order matters
    bad = [(gold[i]["id"], got[i], want[i]) for i in range(len(want)) if got[i] != want[i]]
    cache.check_invariants()
    assert not bad, f"{len(bad)} of {len(want)} requests differ, first: {bad[:3]}"


def test_policies_differ_from_lru():
    """Each non-LRU golden differs from the LRU golden of its run somewhere (so the
    policy tests above could fail for an implementation that ignored the hook) — except
    where SGLang's own results coincide, which the manifest's totals show."""
    lru = {(r["trace"], r["page_size"]): r["hit_tokens"] for r in _RUNS if r["eviction_policy"] == "lru"}
    differ = {r["eviction_policy"] for r in _RUNS
              if r["eviction_policy"] != "lru" and r["hit_tokens"] != lru[(r["trace"], r["page_size"])]}
    assert differ == {"lfu", "slru", "priority", "tlru", "fifo", "mru", "filo"}


def test_generic_lru_equals_builtin():
    """The hook with the LRU priority gives the built-in kernels' results exactly, with
    chunked prefill too (more checkpoints, more splits)."""
    trace = _trace("mixed200.jsonl")
    for p, chunk in ((1, None), (4, 64)):
        a = _replay(RadixCache(1904, p, chunked_prefill_size=chunk), trace)
        b = _replay(PriorityRadixCache(1904, p, chunked_prefill_size=chunk, eviction_policy=LRU()), trace)
        assert a == b and None not in [x[0] for x in a]


def test_concurrent_calls_match_run_request():
    """admit/extend/finish in pieces (and a preempt) keep the invariants; admit +
    extend + finish of one request at a time equals run_request."""
    trace = _trace("edge300.jsonl")
    ev = eviction_policy("lfu")
    a = PriorityRadixCache(640, 16, eviction_policy=ev)
    b = PriorityRadixCache(640, 16, eviction_policy=ev)
    for i in range(len(trace)):
        s = trace.kv_seq(i)
        ra = a.run_request(i, s)
        rb = b.admit(i, s)
        assert (ra.hit_tokens, ra.held_tokens) == (rb.hit_tokens, rb.held_tokens)
        kv = s.kv_len
        while b._reqs[i].computed < kv:
            assert b.extend(i, min(7, kv - b._reqs[i].computed))
        b.finish(i)
        assert a.stats() == b.stats()
    b.admit(10**6, trace.kv_seq(3))
    b.preempt(10**6)
    b.check_invariants()
    assert b.stats().used_slots == 0


def test_unknown_policy_is_a_config_error():
    from radixkv.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown eviction policy"):
        eviction_policy("arc")
    with pytest.raises(ConfigError, match="eviction_policy"):
        eviction_policy("slru", threshold=3)


@pytest.mark.parametrize("name", ["lfu", "mru", "slru", "tlru"])
def test_check_policy_passes(name):
    """The hook's policies keep the PrefixCache contract (radixkv.policies.check)."""
    from radixkv.policies.check import check_policy

    check_policy(lambda cap: PriorityRadixCache.from_capacity_tokens(cap, 4, eviction_policy=name))
