"""Hand-worked checks of each SGLang rule RadixCache implements (arithmetic in comments)."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.errors import ConfigError
from radixkv.policies.radix import BYTES_PER_TOKEN, NODE_OVERHEAD_BYTES, RadixCache
from radixkv.trace.types import Trace


def _seqs(prompts, outputs=None):
    n = len(prompts)
    outputs = outputs if outputs is not None else [[] for _ in range(n)]
    t = Trace.from_requests(
        req_id=[f"q{i}" for i in range(n)], arrival_s=[0.0] * n,
        prompt_len=[len(p) for p in prompts], output_len=[len(o) for o in outputs],
        prompt_ids=prompts, output_ids=outputs,
    )
    return [t.kv_seq(i) for i in range(n)]


def _run(cache, seqs):
    return [cache.run_request(i, s) for i, s in enumerate(seqs)]


def test_last_token_cap_page1():
    # P = 4, repeated: key capped at P - 1 = 3 tokens -> hit 3; the pool held all 4
    a, b = _run(RadixCache(100), _seqs([[1, 2, 3, 4], [1, 2, 3, 4]]))
    assert (a.hit_tokens, a.held_tokens) == (0, 0)
    assert (b.hit_tokens, b.held_tokens) == (3, 4)


def test_page_rounding_and_short_prompts():
    c = RadixCache(100, 4)
    # 10 tokens at p = 4: cached floor(10/4)*4 = 8; repeat: key min(9, ...) -> floor(9/4)*4 = 8
    # a 4-token prompt (P <= p): key floor(3/4)*4 = 0 -> never hits
    r = _run(c, _seqs([list(range(10)), list(range(10)), [50, 51, 52, 53], [50, 51, 52, 53]]))
    assert [x.hit_tokens for x in r] == [0, 8, 0, 0]
    assert [x.held_tokens for x in r] == [0, 8, 0, 4]
    assert c.stats().cached_tokens == 8 + 4


def test_outputs_up_to_kv_extent_are_cached():
    # P = 3, N = 3: KV extent 3 + 2 = 5 tokens [1,2,3,7,8]; the next turn sends
    # [1,2,3,7,8,9,5] (P = 7, cap 6): tokens 1,2,3,7,8 hit, 9 (never fed back) does not -> 5
    c = RadixCache(100)
    a, b = _run(c, _seqs([[1, 2, 3], [1, 2, 3, 7, 8, 9, 5]], [[7, 8, 9], []]))
    assert b.hit_tokens == 5 and b.held_tokens == 5


def test_lookup_splits_a_node():
    c = RadixCache(100)
    # A = [1..6] -> one node. B = [1,2,3,9,9]: key [1,2,3,9] matches 3 tokens inside A's
    # node -> split [1,2,3] | [4,5,6]; B inserts [9,9] under [1,2,3]: 3 nodes, 3+3+2 = 8 tokens
    _run(c, _seqs([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9]]))
    assert c.num_nodes == 3 and c.stats().cached_tokens == 8
    c.check_invariants()


def test_eviction_whole_lru_leaves():
    c = RadixCache(8)
    # A = [1,1,1,1] and B = [2,2,2,2] fill the pool (8 of 8). C = [3,3] needs 2, 0 free ->
    # shortfall 2 -> evict the oldest leaf, A, whole: 4 tokens (more than asked).
    # D = [1,1,1,1] misses (A is gone), needs 4 with 8 - (4 + 2) = 2 free -> shortfall 2 ->
    # evicts B (finished before C) -> 4 tokens.
    seqs = _seqs([[1] * 4, [2] * 4, [3, 3], [1] * 4])
    got = []
    for i, s in enumerate(seqs):
        before = c.evicted_tokens_total
        adm = c.run_request(i, s)
        got.append((adm.hit_tokens, c.evicted_tokens_total - before, c.stats().cached_tokens))
    assert got == [(0, 0, 4), (0, 0, 8), (0, 4, 6), (0, 4, 6)]
    assert c.evictions == 2


def test_split_suffix_is_refreshed():
    # A = [1,2,3,4] (node a), B = [5,5] (node b), C = [1,2,9,9]: C's lookup splits a into
    # [1,2] | [3,4] and stamps the suffix [3,4] "now" -- newer than b. C adds [9,9].
    # Pool 8 = 4 + 2 + 2, full. D = [7,7] needs 2 -> evicts the oldest leaf: b, not [3,4].
    # So E = [1,2,3,4,6] (key [1,2,3,4]) hits 4, and F = [5,5,5] hits 0.
    c = RadixCache(8)
    r = _run(c, _seqs([[1, 2, 3, 4], [5, 5], [1, 2, 9, 9], [7, 7], [1, 2, 3, 4, 6], [5, 5, 5]]))
    assert [x.hit_tokens for x in r] == [0, 0, 2, 0, 4, 0]


def test_paged_decode_evicts_when_no_page_is_free():
    # p = 2, pool 4 pages. A = [1,1] -> 1 page cached, 3 free.
    # B = [2,2,2], N = 4 (KV extent 3 + 3 = 6): prefill needs 3 + 2 = 5 tokens <= 6 free
    # tokens -> no eviction; takes ceil(3/2) = 2 pages -> 1 free. Decode position 3: same
    # page. Position 4: new page -> 0 free. Position 5: same page, but with no free page
    # SGLang still evicts for a page (alloc_paged_token_slots_decode) -> A goes (2 tokens).
    # C = [1,1,5] (key [1,1]) therefore misses.
    c = RadixCache(8, 2)
    seqs = _seqs([[1, 1], [2, 2, 2], [1, 1, 5]], [[], [7, 7, 7, 7], []])
    c.run_request(0, seqs[0])
    before = c.evicted_tokens_total
    c.run_request(1, seqs[1])
    assert c.evicted_tokens_total - before == 2
    assert c.run_request(2, seqs[2]).hit_tokens == 0


def test_paged_prefill_asks_one_extra_page():
    # p = 2, pool 3 pages. A = [1,1] cached (1 page), 2 pages free = 4 tokens.
    # B = [2,2,2] (N = 0) needs 3 un-hit tokens + 2 (one page) = 5 > 4 -> shortfall 1 ->
    # evicts A though 2 pages would have been enough.
    c = RadixCache(6, 2)
    seqs = _seqs([[1, 1], [2, 2, 2]])
    c.run_request(0, seqs[0])
    c.run_request(1, seqs[1])
    assert c.evicted_tokens_total == 2


def test_refused_admission_changes_nothing():
    c = RadixCache(6)
    a, x, y = _seqs([[1, 2, 3], [5, 5, 5], [1, 2, 7, 7, 7]])
    c.run_request(0, a)  # cached [1,2,3], 3 free
    assert c.admit(1, x) is not None  # running, holds 3 -> 0 free
    before = (c.stats(), c.num_nodes, c.evicted_tokens_total)
    # Y would hit [1,2] (splitting A's node and locking [1,2]); it needs 5 - 2 = 3 new slots,
    # but only [3] (1 token) would stay evictable and nothing is free -> refused
    assert c.admit(2, y) is None
    assert (c.stats(), c.num_nodes, c.evicted_tokens_total) == before
    c.check_invariants()
    c.finish(1)
    assert c.stats().used_slots == 0


def test_held_uses_token_granularity_across_page_boundaries():
    c = RadixCache(100, 4)
    # A = [1..8] one node; C = [1,2,3,4,20..24]: key 8 tokens, 1st page matches, 2nd differs
    # -> split at 4. B = [1..6, 99, 98, 97]: pages [1-4] hit (4); at position 4 no child has
    # page [5,6,99,98], but the child [5..8] shares 2 more tokens -> held 6.
    r = _run(c, _seqs([list(range(1, 9)), [1, 2, 3, 4, 20, 21, 22, 23, 24], [1, 2, 3, 4, 5, 6, 99, 98, 97]]))
    assert (r[2].hit_tokens, r[2].held_tokens) == (4, 6)


def test_chunked_prefill_leaves_a_node_per_chunk():
    # P = 10, chunk 4: checkpoints at 4 and 8 (middle chunks), finish inserts [8, 10):
    # nodes [0,4) [4,8) [8,10). Without chunking: one node.
    s = _seqs([list(range(10))])[0]
    c = RadixCache(100, chunked_prefill_size=4)
    c.run_request(0, s)
    assert c.num_nodes == 3 and c.stats().cached_tokens == 10
    c2 = RadixCache(100)
    c2.run_request(0, s)
    assert c2.num_nodes == 1


def test_preempt_frees_without_inserting_outputs():
    # P = 4, N = 5 (extent 8): after prefill the prompt is inserted (decode follows); two
    # decode steps; preempt -> the prompt stays cached, the 2 decoded tokens are freed.
    c = RadixCache(20)
    s = _seqs([[1, 2, 3, 4]], [[9, 9, 9, 9, 9]])[0]
    c.admit(0, s)
    assert c.extend(0, 2)
    st = c.stats()
    assert (st.used_slots, st.cached_tokens, st.valid_tokens) == (6, 4, 6)
    c.preempt(0)
    st = c.stats()
    assert (st.used_slots, st.cached_slots, st.free_slots, st.cached_tokens) == (0, 4, 16, 4)


def test_extend_past_the_extent_is_an_error_and_no_room_is_false():
    c = RadixCache(5)
    x, y = _seqs([[1, 2, 3], [4, 4]], [[8, 8, 8], []])
    c.admit(0, x)  # extent 3 + 2 = 5
    with pytest.raises(ValueError):
        c.extend(0, 3)
    c.admit(1, y)  # 2 slots: 0 free
    assert c.extend(0, 1) is False  # the prompt [1,2,3] is locked by x: nothing evictable
    c.check_invariants()


def test_cache_last_token_on_stop():
    # P = 3, N = 3: extent 5 normally, 6 with the overlap scheduler's extra decode step
    s = _seqs([[1, 2, 3]], [[7, 8, 9]])[0]
    c = RadixCache(100, cache_last_token_on_stop=True)
    c.run_request(0, s)
    assert c.stats().cached_tokens == 6


def test_stats_metadata_and_accounting():
    c = RadixCache(100)
    _run(c, _seqs([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9]]))  # 3 nodes, 8 tokens
    st = c.stats()
    assert st.metadata_bytes == 3 * NODE_OVERHEAD_BYTES + 8 * BYTES_PER_TOKEN
    assert (st.used_slots, st.cached_slots, st.free_slots) == (0, 8, 92)
    assert st.largest_free_run == -1


def test_config_errors_and_capacity_rounding():
    with pytest.raises(ConfigError):
        RadixCache(100, 0)
    with pytest.raises(ConfigError):
        RadixCache(100, 16)  # not a whole number of pages
    with pytest.raises(ConfigError):
        RadixCache(64, 16, chunked_prefill_size=8)
    c = RadixCache.from_capacity_tokens(100, 16)  # 100 // 16 = 6 pages
    assert (c.num_slots, c.slot_tokens, c.capacity_tokens) == (6, 16, 96)
    assert RadixCache(7).num_slots == 7


def test_deterministic_and_order_sensitive():
    seqs = _seqs([[1, 2, 3, 4], [1, 2, 5, 5], [3, 3, 3], [1, 2, 3, 4, 4]], [[6, 6], [], [1], [2, 2]])
    runs = []
    for _ in range(2):
        c = RadixCache(10)
        runs.append([(a.hit_tokens, a.held_tokens, a.evicted_tokens) for a in _run(c, seqs)])
    assert runs[0] == runs[1]


def test_conformance_checker_passes():
    from radixkv.policies.check import check_policy

    check_policy(lambda capacity_tokens: RadixCache.from_capacity_tokens(capacity_tokens, 1))
    check_policy(lambda capacity_tokens: RadixCache.from_capacity_tokens(capacity_tokens, 4))


def test_interleaved_requests_keep_invariants():
    # several requests in flight (the concurrent replay's use): accounting holds at each step
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 3, size=int(rng.integers(1, 12))).tolist() for _ in range(40)]
    outs = [rng.integers(0, 3, size=int(rng.integers(0, 6))).tolist() for _ in range(40)]
    seqs = _seqs(prompts, outs)
    for p in (1, 2):
        c = RadixCache(40, p, chunked_prefill_size=4)
        running = {}
        for i, s in enumerate(seqs):
            if c.admit(i, s) is not None:
                running[i] = s
            c.check_invariants()
            for rid in list(running):
                r = c._reqs[rid]
                if r.computed < r.kv_max and rng.random() < 0.6:
                    c.extend(rid, 1)
                elif rng.random() < 0.3:
                    (c.preempt if rng.random() < 0.3 else c.finish)(rid)
                    del running[rid]
                c.check_invariants()
        for rid in list(running):
            c.finish(rid)
        c.check_invariants()
        assert c.stats().used_slots == 0


def test_duplicate_tokens_of_running_requests():
    c = RadixCache(100)
    a, b, x, y = _seqs([[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7], [5, 6, 7, 8]])
    c.run_request(0, a)
    # B repeats A: hit 3 (cap P - 1), it recomputes token 4, which the tree holds -> 1 duplicate
    c.admit(1, b)
    assert c.stats().duplicate_tokens == 1
    c.finish(1)  # the duplicate is freed at insert
    assert c.stats().duplicate_tokens == 0
    # X and Y run together (N = 0: nothing inserted before finish); X finishes and inserts
    # [5,6,7]; Y's private [5,6,7] now duplicates it -> 3
    c.admit(2, x)
    c.admit(3, y)
    assert c.stats().duplicate_tokens == 0
    c.finish(2)
    assert c.stats().duplicate_tokens == 3
    c.finish(3)
    assert c.stats().duplicate_tokens == 0 and c.stats().cached_tokens == 4 + 4


def test_fits_alone():
    # extent 3 + 2 = 5 tokens; at p = 2: 3 pages. A 2-page pool is short by 1 page = 2 tokens.
    s = _seqs([[1, 2, 3]], [[7, 8, 9]])[0]
    assert RadixCache(6, 2).fits_alone(s) == 0
    assert RadixCache(4, 2).fits_alone(s) == 2
    # with the overlap scheduler's extra token: 6 tokens in a 5-token pool -> 1 short
    assert RadixCache(5, cache_last_token_on_stop=True).fits_alone(s) == 1
    assert RadixCache(5).fits_alone(s) == 0


def test_fits_alone_all_is_one_array_operation_with_the_same_rule():
    # prompts of 3, 5 and 8 tokens with outputs of 3, 0 and 1: KV extents 3 + 2 = 5, 5 and
    # 8 (the last output token gets no KV); the extra token of cache_last_token_on_stop only
    # where the request decodes into KV (the first): 6, 5, 8
    t = Trace.from_requests(req_id=["a", "b", "c"], arrival_s=[0.0, 1.0, 2.0], prompt_len=[3, 5, 8],
                            output_len=[3, 0, 1], prompt_ids=[[1, 2, 3], [1, 2, 3, 4, 5], list(range(8))])
    # 2 pages of 2 tokens: 3, 3 and 4 pages needed -> 1, 1, 2 pages short = 2, 2, 4 tokens
    assert RadixCache(4, 2).fits_alone_all(t).tolist() == [2, 2, 4]
    # a 5-token pool of 1-token pages: 0, 0, 3 short; with the extra token 1, 0, 3
    assert RadixCache(5).fits_alone_all(t).tolist() == [0, 0, 3]
    assert RadixCache(5, cache_last_token_on_stop=True).fits_alone_all(t).tolist() == [1, 0, 3]
    assert RadixCache(5).fits_alone_all(t).dtype == np.int64

    class Roomier(RadixCache):  # a subclass with its own rule is asked request by request
        def fits_alone(self, seq):
            return 0

    assert Roomier(4, 2).fits_alone_all(t).tolist() == [0, 0, 0]


def test_heap_rebuild_keeps_eviction_order():
    # dropping stale heap entries must not change any result: a cache that rebuilds its
    # heap after every request agrees with one that never does
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 3, size=int(rng.integers(1, 14))).tolist() for _ in range(300)]
    outs = [rng.integers(0, 3, size=int(rng.integers(0, 5))).tolist() for _ in range(300)]
    seqs = _seqs(prompts, outs)
    for p in (1, 2):
        a, b = RadixCache(40, p), RadixCache(40, p)
        for i, s in enumerate(seqs):
            ra, rb = a.run_request(i, s), b.run_request(i, s)
            b._rebuild_heap()
            assert (ra, a.evicted_tokens_total) == (rb, b.evicted_tokens_total)
        assert a.evictions == b.evictions > 0



def test_peek_hit_equals_admit_hit_and_changes_nothing():
    # A = [1..6] (one node of 6); B = [1,2,3,9,9]: key [1,2,3,9] matches 3 tokens inside
    # A's node -> admit splits it and hits 3; peek_hit must say 3 without the split.
    # Page 2: key floor(4/2)*2 = 4 tokens [1,2,3,9]; match 3 -> rounded down to 2.
    for p, want in ((1, 3), (2, 2)):
        c = RadixCache(100, p)
        a, b = _seqs([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9]])
        c.run_request(0, a)
        st, evicted = c.stats(), c.evicted_tokens_total
        assert c.peek_hit(b) == want and c.peek_hit(b, 2) == want
        assert c.num_nodes == 1 and c.stats() == st and c.evicted_tokens_total == evicted
        c.check_invariants()
        assert c.admit(1, b).hit_tokens == want
        assert c.num_nodes == 2  # the admission did split


def test_peek_hit_has_no_lru_side_effect():
    # pool of 8 tokens: X = [1,2,3,4] then Y = [5,6,7,8] fill it (X older). Had peeking X
    # touched the LRU, Z = [9,9,9,9] would evict Y; it must evict X (the oldest leaf), so
    # afterwards X hits 0 and Y hits 3 (cap P - 1 = 3).
    c = RadixCache(8)
    x, y, z = _seqs([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    c.run_request(0, x)
    c.run_request(1, y)
    assert c.peek_hit(x) == 3 and c.peek_hit(y) == 3
    assert c.peek_hit(x) == 3
    c.run_request(2, z)
    assert c.evicted_tokens_total == 4
    assert c.peek_hit(x) == 0 and c.peek_hit(y) == 3
    # random traces: a cache peeked at old and new prompts before every request agrees
    # with one never peeked, and each peek equals the admission's hit
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 3, size=int(rng.integers(1, 12))).tolist() for _ in range(200)]
    outs = [rng.integers(0, 3, size=int(rng.integers(0, 4))).tolist() for _ in range(200)]
    seqs = _seqs(prompts, outs)
    for p in (1, 2):
        a, b = RadixCache(30, p), RadixCache(30, p)
        for i, s in enumerate(seqs):
            for j in range(max(0, i - 5), i):
                b.peek_hit(seqs[j])
            h = b.peek_hit(s)
            ra, rb = a.run_request(i, s), b.run_request(i, s)
            assert ra == rb and rb.hit_tokens == h
            assert (a.evicted_tokens_total, a.num_nodes) == (b.evicted_tokens_total, b.num_nodes)
        assert a.evictions == b.evictions > 0


def test_growing_arrays_and_store_compaction_match_the_reference():
    # enough requests and nodes that the node arrays grow past their initial 256 rows
    # (child tables rehashed) and the segment store of 4,096 entries is compacted or
    # grown many times; every request must still agree with the brute-force reference
    # (tests/reference_sglang.py) on hit, held and evicted tokens and the tree size
    from reference_sglang import RefRadixCache, expand

    rng = np.random.default_rng(11)
    systems = [rng.integers(0, 10_000, size=int(rng.integers(20, 80))).tolist() for _ in range(30)]
    prompts, outs = [], []
    for _ in range(700):
        base = systems[int(rng.integers(0, len(systems)))]
        prompts.append(base + rng.integers(0, 6, size=int(rng.integers(1, 40))).tolist())
        outs.append(rng.integers(0, 6, size=int(rng.integers(0, 12))).tolist())
    seqs = _seqs(prompts, outs)
    for p, cap in ((1, 12_000), (4, 12_000), (1, 1_500)):
        cache, ref = RadixCache(cap, p), RefRadixCache(cap, p)
        peak_nodes = 0
        for i, s in enumerate(seqs):
            kv = expand(s)
            before = cache.evicted_tokens_total
            adm = cache.run_request(i, s)
            got = (adm.hit_tokens, adm.held_tokens, cache.evicted_tokens_total - before, cache.stats().cached_tokens)
            assert got == ref.run(kv[: s.prompt_len], kv) + (ref.tree_tokens(),), (p, cap, i)
            peak_nodes = max(peak_nodes, cache.num_nodes)
        cache.check_invariants()
        from radixkv.policies._radix_kernels import S_NCOMPACT

        assert cache._S[S_NCOMPACT] > 0
        if cap > 10_000:
            assert peak_nodes > 256 and cache._N.shape[0] > 256
