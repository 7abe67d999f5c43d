"""BlockHashCache (vLLM v1 APC): hand-worked rules, golden replays, kernels.

Every expected number below is worked out by hand in the comment beside it from the
rules in docs/SEMANTICS.md ("vLLM v1") or taken from the real engine's golden files.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from radixkv.errors import ConfigError
from radixkv.policies import BlockHashCache
from radixkv.policies import _hash_kernels as K
from radixkv.policies.block_hash import HashCollisionError
from radixkv.trace.types import Trace

from conftest import GOLDEN_LOCAL, shared_path

ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


def tok_trace(reqs):
    """Token trace (U = 1) from [(prompt ids, output ids), ...] in this order."""
    n = len(reqs)
    return Trace.from_requests(
        req_id=[f"q{i}" for i in range(n)], arrival_s=list(range(n)),
        prompt_len=[len(p) for p, _ in reqs], output_len=[len(o) for _, o in reqs],
        prompt_ids=[p for p, _ in reqs], output_ids=[o for _, o in reqs],
    )


def seq(prompt, output=()):
    return tok_trace([(list(prompt), list(output))]).kv_seq(0)


# ---------------------------------------------------------------------- rules
def test_last_token_cap_rounds_down_to_a_block():
    # docs/engines/vllm.md §2, B = 16: P = 32 fully cached -> hit 16; P = 33 -> 32; P = 16 -> 0
    c = BlockHashCache(100, 16)
    base = list(range(32))
    assert c.run_request(0, seq(base)).hit_tokens == 0
    a = c.run_request(1, seq(base))
    assert (a.hit_tokens, a.held_tokens) == (16, 32)  # (32−1)//16 = 1 block; all 32 held
    a = c.run_request(2, seq(base + [7]))
    assert (a.hit_tokens, a.held_tokens) == (32, 32)  # (33−1)//16 = 2 blocks; token 7 new
    a = c.run_request(3, seq(base[:16]))
    assert (a.hit_tokens, a.held_tokens) == (0, 16)  # (16−1)//16 = 0 blocks


def test_initial_queue_allocation_and_tail_first_release():
    # 10 blocks, 9 usable (ids 1..9). P = 40, N = 3 -> KV 42 tokens = blocks 1, 2, 3 from
    # the head; blocks 1, 2 full (hashed), 3 partial. Release tail first: 3 (unhashed) to the
    # head, then 2 and 1 appended: [3, 4, 5, 6, 7, 8, 9, 2, 1].
    c = BlockHashCache(10, 16)
    s = seq(range(40), [1, 2, 3])
    assert c.admit(0, s).hit_tokens == 0
    assert c.free_queue().tolist() == [4, 5, 6, 7, 8, 9]
    assert c.extend(0, 2)
    assert c.block_table(0).tolist() == [1, 2, 3]
    c.finish(0)
    assert c.free_queue().tolist() == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    st = c.stats()
    # 2 cached blocks, 7 free; blocks 3..9 are contiguous ids (largest free run 7)
    assert (st.used_slots, st.cached_slots, st.free_slots) == (0, 2, 7)
    assert (st.valid_tokens, st.cached_tokens, st.largest_free_run) == (32, 32, 7)


def test_eviction_takes_the_head_and_children_go_first():
    # 3 usable blocks, B = 4. A = a0..a7 -> blocks 1 (A1), 2 (A2); queue [3, 2, 1].
    a = [100 + i for i in range(8)]
    b = [200 + i for i in range(8)]
    c = BlockHashCache(4, 4)
    c.run_request(0, seq(a))
    assert c.free_queue().tolist() == [3, 2, 1]
    # B needs 2 blocks: pops 3 (free) and 2 (A2's key dropped: 4 tokens evicted)
    adm = c.run_request(1, seq(b))
    assert (adm.hit_tokens, adm.evicted_tokens) == (0, 4)
    # B's blocks [3, 2] released tail first: queue [1, 2, 3]
    assert c.free_queue().tolist() == [1, 2, 3]
    # A again: A1 hits (block 1), A2 gone -> chain 1 = cap 7//4 = 1 -> hit 4, held 4.
    # Needs 1 new + 1 touched = 2 <= 3: touch 1, pop 2 (B's second block: 4 evicted).
    adm = c.run_request(2, seq(a))
    assert (adm.hit_tokens, adm.held_tokens, adm.evicted_tokens) == (4, 4, 4)
    assert c.free_queue().tolist() == [3, 2, 1]
    assert (c.evictions, c.evicted_tokens_total) == (2, 8)
    # cached: 1 = A1, 2 = A2, 3 = B1 (its child B2 was evicted): all 3 reachable
    st = c.stats()
    assert (st.cached_slots, st.cached_tokens, st.free_slots) == (3, 12, 0)


def test_admission_counts_touched_hit_blocks_and_refusal_changes_nothing():
    # 3 usable blocks, B = 4. A = a0..a7 cached in 1, 2; queue [3, 2, 1].
    a = [100 + i for i in range(8)]
    c = BlockHashCache(4, 4)
    c.run_request(0, seq(a))
    before = (c.free_queue().tolist(), c.stats())
    # P = 13 = A + 5 new: hit 2 blocks (cap 12//4 = 3); needs ceil(13/4) − 2 = 2 new + 2
    # touched = 4 > 3 free -> refused (2 new alone would fit)
    assert c.admit(1, seq(a + [1, 2, 3, 4, 5])) is None
    assert c.run_request(1, seq(a + [1, 2, 3, 4, 5])) is None
    assert (c.free_queue().tolist(), c.stats()) == before
    assert c.evictions == 0
    # the whole prompt must fit before a first chunk: 4 tokens would fit, 13 do not
    assert c.admit(2, seq(a + [1, 2, 3, 4, 5]), n_tokens=4) is None
    # P = 12: hit cap 11//4 = 2 blocks; 1 new + 2 touched = 3 <= 3 -> admitted, hit 8
    adm = c.admit(3, seq(a + [1, 2, 3, 4]))
    assert adm.hit_tokens == 8
    assert c.block_table(3).tolist() == [1, 2, 3]
    # a prompt longer than the pool: ceil(13/4) = 4 blocks > 3 usable
    c2 = BlockHashCache(4, 4)
    assert c2.admit(0, seq(range(13))) is None
    assert c2.free_queue().tolist() == [1, 2, 3]


def test_peek_hit_is_the_admission_hit_without_side_effects():
    # B = 4, 20 blocks. A = 0..11 (3 full blocks) cached by a finished request.
    c = BlockHashCache(20, 4)
    c.run_request(0, seq(range(12)))
    q, st = c.free_queue().tolist(), c.stats()
    s = seq(list(range(12)) + [50], [51, 52])  # P = 13: (13−1)//4 = 3 blocks hit -> 12
    assert c.peek_hit(s) == 12
    assert c.peek_hit(seq(range(12))) == 8  # P = 12: cap (12−1)//4 = 2 blocks
    assert c.peek_hit(s, n_tokens=5) == 12  # a first chunk looks up the whole prompt
    assert c.peek_hit(seq([7, 7, 7, 7, 7])) == 0  # first block differs
    assert (c.free_queue().tolist(), c.stats()) == (q, st)  # nothing touched
    a = c.admit(1, s)
    assert a.hit_tokens == 12
    # while running, request 1's hit blocks and its own blocks are still hittable: s's
    # resumed lookup of 14 tokens (P + 1 output): (14−1)//4 = 3 blocks -> 12
    assert c.peek_hit(s, n_tokens=14) == 12
    with pytest.raises(ValueError):
        c.peek_hit(s, n_tokens=0)


@pytest.mark.parametrize("order,first", [("fcfs", 1), ("lpm", 2)])
def test_lpm_scheduler_orders_by_peek_hit(order, first):
    # r0 caches 12 tokens X (B = 4: 3 blocks); r1 (new content) and r2 (X + 4 tokens)
    # arrive together with one seat. peek_hit: r1 0, r2 (16−1)//4 = 3 blocks = 12, so
    # lpm admits r2 first, FCFS r1.
    from radixkv.cost import CostModel
    from radixkv.replay.concurrent import replay_concurrent
    from radixkv.replay.scheduler import SchedulerConfig

    cost = CostModel(params=1e9, num_layers=8, attn_dim=1024, kv_bytes_per_token=1e5, peak_flops=1e14,
                     hbm_bytes_per_s=1e12)
    x = list(range(12))
    prompts = [x, list(range(500, 516)), x + [90, 91, 92, 93]]
    tr = Trace.from_requests(req_id=["q0", "q1", "q2"], arrival_s=[0.0, 100.0, 100.0],
                             prompt_len=[len(p) for p in prompts], output_len=[1, 2, 2], prompt_ids=prompts)
    r = replay_concurrent(tr, BlockHashCache(41, 4), cost,
                          config=SchedulerConfig(max_num_seqs=1, schedule_policy=order))
    other = 3 - first
    assert r["admit_s"][first] == 100.0 and r["admit_s"][other] > 100.0
    assert r["hit_tokens"][2] == 12


def test_duplicates_first_inserted_served_and_evicting_one_keeps_the_other():
    t = [10 + i for i in range(8)]  # K1 = t0..t3, K2 = t4..t7
    c = BlockHashCache(13, 4)  # 12 usable
    c.run_request(0, seq(t))  # blocks 1 (K1), 2 (K2); queue [3..12, 2, 1]
    # same P = 8: cap 7//4 = 1 -> hit K1 (block 1); block 2 of the prompt recomputed into
    # block 3, which also gets K2: a duplicate
    assert c.admit(1, seq(t)).hit_tokens == 4
    assert c.block_table(1).tolist() == [1, 3]
    st = c.stats()
    assert (st.duplicate_tokens, st.cached_tokens, st.valid_tokens) == (4, 8, 12)
    c.finish(1)  # release 3 then 1: queue [4..12, 2, 3, 1]
    assert c.free_queue().tolist() == list(range(4, 13)) + [2, 3, 1]
    # an unrelated 40-token prompt takes 10 blocks: 4..12 and then 2, the FIRST K2 block
    adm = c.run_request(2, seq(range(500, 540)))
    assert adm.evicted_tokens == 4
    assert c.stats().duplicate_tokens == 0
    # K2 now served by block 3, the remaining duplicate: t + [z] hits K1 (1) and K2 (3)
    adm = c.admit(3, seq(t + [99]))
    assert adm.hit_tokens == 8
    assert c.block_table(3).tolist()[:2] == [1, 3]


def test_partial_block_of_a_running_request_is_not_cached():
    # B = 4. A: prompt p0..p5, outputs o0..o5 -> KV 11 tokens
    p = [1, 2, 3, 4, 5, 6]
    o = [7, 8, 9, 10, 11, 12]
    c = BlockHashCache(20, 4)
    c.admit(0, seq(p, o))  # block 1 = p0..p3 full (hashed), block 2 = p4, p5 partial
    # probe p0..p5 o0 o1 x (P = 9): only K1 matches (A's block 2 is unhashed):
    # hit = min(1, 8//4) × 4 = 4; held = 4 + 0 (no hashed child of K1)
    adm = c.admit(1, seq(p + [7, 8, 0]))
    assert (adm.hit_tokens, adm.held_tokens) == (4, 4)


def test_decode_block_hit_while_running():
    p = [1, 2, 3, 4, 5, 6]
    o = [7, 8, 9, 10, 11, 12]
    c = BlockHashCache(20, 4)
    c.admit(0, seq(p, o))
    # A computes o0, o1: block 2 = p4 p5 o0 o1 is full and hashed at the end of the step
    assert c.extend(0, 2)
    adm = c.admit(1, seq(p + [7, 8, 0]))  # P = 9: chain 2, cap 8//4 = 2 -> hit 8
    assert (adm.hit_tokens, adm.held_tokens) == (8, 8)
    assert c.block_table(1).tolist()[:2] == c.block_table(0).tolist()[:2]
    st = c.stats()
    # A holds 2 blocks (8 tokens), B shares them and adds 1 block with 1 token:
    # used 3; valid = 2 hashed × 4 + A's 8 % 4 + B's 9 % 4 = 9
    assert (st.used_slots, st.valid_tokens, st.cached_slots) == (3, 9, 0)


def test_held_tokens_token_granularity():
    # B = 4
    c = BlockHashCache(20, 4)
    c.run_request(0, seq([1, 2, 3, 4, 5, 6, 7, 8]))  # K1 = 1..4, K2 = 5..8
    a = c.run_request(1, seq([1, 2, 3, 4, 5, 6, 9]))  # chain 1, then [5,6,9] vs [5,6,7,8]
    assert (a.hit_tokens, a.held_tokens) == (4, 6)  # cap 6//4 = 1; held 4 + 2
    a = c.run_request(2, seq([1, 2, 3, 4, 5, 9, 9, 9, 9]))  # [5,9,9,9] vs [5,6,7,8]: 1
    assert (a.hit_tokens, a.held_tokens) == (4, 5)
    a = c.run_request(3, seq([9]))  # [9] vs K1's [1,2,3,4]: 0
    assert (a.hit_tokens, a.held_tokens) == (0, 0)
    a = c.run_request(4, seq([1, 2]))  # [1,2] vs [1,2,3,4]: 2; P = 2 < B: no hit possible
    assert (a.hit_tokens, a.held_tokens) == (0, 2)


def test_resumed_request_looks_up_prompt_and_generated_tokens():
    p = [1, 2, 3, 4, 5, 6]
    o = [7, 8, 9, 10, 11, 12]
    c = BlockHashCache(20, 4)
    s = seq(p, o)
    c.run_request(0, s)  # KV 11: blocks p0..p3, p4 p5 o0 o1 hashed; o2..o4 partial
    # as a new request (P = 6): cap 5//4 = 1 block
    assert c.admit(1, s).hit_tokens == 4
    c.preempt(1)
    # resumed with 3 generated tokens: 9 known tokens, cap 8//4 = 2 blocks
    adm = c.admit(2, s, n_tokens=9)
    assert adm.hit_tokens == 8
    assert c.extend(2, 2)  # to the KV extent 11
    with pytest.raises(ValueError):
        c.extend(2, 1)


def test_unit_segments_partial_units_and_unique_tails():
    # U = 4, partial last unit; B = 2. A = ids [10, 11] (8 tokens): 4 blocks cached.
    t = Trace.from_requests(
        req_id=["a", "b", "c"], arrival_s=[0, 1, 2], prompt_len=[8, 6, 3], output_len=[0, 0, 0],
        prompt_ids=[[10, 11], [10, 12], [10]], unit_tokens=4, partial_last_unit=True,
    )
    c = BlockHashCache(40, 2)
    c.run_request(0, t.kv_seq(0))
    # B = [10 (4 tokens), 12 (2 tokens)]: blocks (10:0-1), (10:2-3) hit, (12:0-1) misses;
    # cap (6−1)//2 = 2 -> hit 4; held 4 + common prefix of (12,0) vs (11,0) = 0
    a = c.run_request(1, t.kv_seq(1))
    assert (a.hit_tokens, a.held_tokens) == (4, 4)
    # C = first 3 tokens of unit 10: block 0 hits; cap 2//2 = 1 -> hit 2; the partial block
    # (10,2) is the first token of A's block (10,2),(10,3): held 3
    a = c.run_request(2, t.kv_seq(2))
    assert (a.hit_tokens, a.held_tokens) == (2, 3)
    # WEKA-style unique tails never match: P = 9 = ids [10, 11] + 1 unique token, N = 3
    w = Trace.from_requests(
        req_id=["d", "e"], arrival_s=[0, 1], prompt_len=[9, 9], output_len=[3, 3],
        prompt_ids=[[10, 11], [10, 11]], unit_tokens=4, partial_last_unit=False,
    )
    c = BlockHashCache(40, 2)
    c.run_request(0, w.kv_seq(0))  # KV 11: block 4 = (unique tail, first output) hashed
    a = c.run_request(1, w.kv_seq(1))
    # chain 4 blocks = cap (9−1)//2 = 4 -> hit 8; the tail token is unique: held 8, not 9
    assert (a.hit_tokens, a.held_tokens) == (8, 8)


def test_verify_detects_hash_collisions():
    # with 0 key bits every block has key 0: every lookup "hits"
    a, b = seq([1, 2, 3, 4, 5, 6, 7, 8]), seq([9, 9, 9, 9, 9])
    c = BlockHashCache(20, 4, verify=True, _key_bits=0)
    c.run_request(0, a)
    before = (c.free_queue().tolist(), c.stats())
    with pytest.raises(HashCollisionError):
        c.run_request(1, b)
    assert (c.free_queue().tolist(), c.stats()) == before
    # without verify the collision silently serves A's block: hit 4 (wrong content)
    c = BlockHashCache(20, 4, _key_bits=0)
    c.run_request(0, a)
    assert c.run_request(1, b).hit_tokens == 4
    # with 64-bit keys the same requests do not hit
    c = BlockHashCache(20, 4, verify=True)
    c.run_request(0, a)
    assert c.run_request(1, b).hit_tokens == 0


def test_config_and_misuse_errors():
    with pytest.raises(ConfigError):
        BlockHashCache(1, 16)  # only the null block
    with pytest.raises(ConfigError):
        BlockHashCache(10, 0)
    with pytest.raises(ConfigError):
        BlockHashCache(2**31, 16)  # block ids are 32-bit (refused before any allocation)
    with pytest.raises(ConfigError):
        BlockHashCache.from_capacity_tokens(15, 16)
    c = BlockHashCache.from_capacity_tokens(100, 16)  # 100 // 16 = 6 usable + null
    assert (c.num_gpu_blocks, c.num_slots, c.slot_tokens, c.capacity_tokens) == (7, 6, 16, 96)
    s = seq(range(20), [1, 2])
    c.admit(0, s)
    with pytest.raises(ValueError):
        c.admit(0, s)
    with pytest.raises(ValueError):
        c.extend(0, 2)  # KV extent 21 = 20 + 1
    with pytest.raises(ValueError):
        c.admit(1, s, n_tokens=22)
    with pytest.raises(KeyError):
        c.finish(5)


# ---------------------------------------------------------------------- kernels
def test_keys_are_chained_on_the_parent():
    a = seq([1, 2, 3, 4, 5, 6, 7, 8])
    b = seq([9, 9, 9, 9, 5, 6, 7, 8])  # same second block content, different parent
    c = seq([1, 2, 3, 4, 5, 6, 7, 8, 1])
    ka, pa = K.seq_block_keys(a.seg_id, a.seg_end, 4, 2, ALL)
    kb, _ = K.seq_block_keys(b.seg_id, b.seg_end, 4, 2, ALL)
    kc, _ = K.seq_block_keys(c.seg_id, c.seg_end, 4, 2, ALL)
    assert pa == 4  # token trace: 4 one-token pieces per block
    assert ka.tolist() == kc.tolist()
    assert ka[0] != kb[0] and ka[1] != kb[1]


def _py_mix(h, w):
    """splitmix64 finaliser of (h xor w), in Python integers (the module docstring's formula)."""
    m = (1 << 64) - 1
    z = ((h ^ w) + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def _splitmix_out(x):
    """splitmix64's output function of the state *x* (Python integers)."""
    m = (1 << 64) - 1
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_key_formulas_match_the_documented_hash():
    seed = int(K.SEED)
    # B = 4, token block: the ids folded in one chain
    toks = [7, 8, 9, 10]
    h = seed
    for t in toks:
        h = _py_mix(h, t)
    keys, _ = K.seq_block_keys(seq(toks).seg_id, seq(toks).seg_end, 4, 1, ALL)
    assert int(keys[0]) & ((1 << 64) - 1) == h
    # B = 8 and B = 16, token blocks: the sum of the pairs' 128-bit multiply-folds with the
    # position constants (splitmix64 outputs from seed 0, top and bottom bits set), folded
    # into the parent key
    m = (1 << 64) - 1
    consts, x = [], 0
    for _ in range(16):
        x = (x + 0x9E3779B97F4A7C15) & m
        consts.append(_splitmix_out(x) | (1 << 63) | 1)
    for toks in ([3, 1, 4, 1, 5, 9, 2, 6], list(range(100, 116)), [2**40 + 7] * 16):
        acc = 0
        for k in range(0, len(toks), 2):
            prod = (toks[k] ^ consts[k]) * (toks[k + 1] ^ consts[k + 1])
            acc = (acc + ((prod ^ (prod >> 64)) & m)) & m
        h = _py_mix(seed, acc)
        sq = seq(toks)
        keys, _ = K.seq_block_keys(sq.seg_id, sq.seg_end, len(toks), 1, ALL)
        assert int(keys[0]) & m == h
        # the next block is chained on this one
        sq2 = seq(toks + toks)
        keys2, _ = K.seq_block_keys(sq2.seg_id, sq2.seg_end, len(toks), 2, ALL)
        assert int(keys2[1]) & m == _py_mix(h, acc)
    # a unit piece (hash-id trace, U = 8, B = 4): id, then offset << 32 | length
    t = Trace.from_requests(req_id=["u"], arrival_s=[0], prompt_len=[8], output_len=[0], prompt_ids=[[42]],
                            unit_tokens=8)
    u = t.kv_seq(0)
    keys, _ = K.seq_block_keys(u.seg_id, u.seg_end, 4, 2, ALL)
    h0 = _py_mix(_py_mix(seed, 42), (0 << 32) | 4)
    h1 = _py_mix(_py_mix(h0, 42), (4 << 32) | 4)
    assert [int(k) & ((1 << 64) - 1) for k in keys] == [h0, h1]


def test_token_block_fast_path_gives_the_documented_keys():
    # run_seq's n_tok: the leading blocks the caller knows to be token blocks are hashed
    # without the segment checks (_block_keys_tok_into); the keys must be the documented
    # pair-product hash (worked out here in Python), chained block to block, and a tail
    # after the known blocks (here a 3-token segment, then tokens) is hashed as before
    m = (1 << 64) - 1
    consts, x = [], 0
    for _ in range(64):
        x = (x + 0x9E3779B97F4A7C15) & m
        consts.append(_splitmix_out(x) | (1 << 63) | 1)

    def token_key(parent, toks):
        acc = 0
        for k in range(0, len(toks), 2):
            prod = (toks[k] ^ consts[k % 64]) * (toks[k + 1] ^ consts[(k + 1) % 64])
            acc = (acc + ((prod ^ (prod >> 64)) & m)) & m
        return _py_mix(parent, acc)

    rng = np.random.default_rng(11)
    for B in (8, 16, 32):
        n = 5
        toks = [int(v) for v in rng.integers(0, 2**40, n * B)]
        ids = np.array(toks, dtype=np.int64)
        ends = np.arange(1, n * B + 1, dtype=np.int64)
        want, h = [], int(K.SEED)
        for j in range(n):
            h = token_key(h, toks[j * B:(j + 1) * B])
            want.append(h)
        for n_tok in (0, 1, n - 1, n, n + 3):
            keys = np.zeros(n, dtype=np.int64)
            mp = K._block_keys_tok_into(ids, ends, B, n, ALL, keys, n_tok)
            assert [int(k) & m for k in keys] == want and mp == B, (B, n_tok)
        # two known token blocks, then a block whose first 3 tokens are one segment
        # (a piece folds in id, then offset << 32 | length), then B − 3 tokens
        seg_id = np.array(toks[:2 * B] + [99] + toks[2 * B + 3:3 * B], dtype=np.int64)
        seg_end = np.concatenate([np.arange(1, 2 * B + 1), [2 * B + 3], np.arange(2 * B + 4, 3 * B + 1)])
        h2 = _py_mix(_py_mix(want[1], 99), (0 << 32) | 3)
        for t in toks[2 * B + 3:3 * B]:
            h2 = _py_mix(h2, t)
        for n_tok in (0, 2):
            keys = np.zeros(3, dtype=np.int64)
            mp = K._block_keys_tok_into(seg_id, seg_end, B, 3, ALL, keys, n_tok)
            assert [int(k) & m for k in keys] == want[:2] + [h2] and mp == B, (B, n_tok)


def test_token_block_keys_separate_near_identical_blocks():
    # the token-block hash (pair products) must tell apart blocks that differ in one
    # token, in the order of two tokens, or only in a pair's split, and spread the low
    # bits the key table indexes by: every key distinct, and the low 12 bits of 20 k keys
    # take about as many values as 20 k uniform draws would (4,096 (1 − e^(−20000/4096))
    # ≈ 4,065)
    rng = np.random.default_rng(5)
    ends = np.arange(1, 17, dtype=np.int64)
    blocks = [rng.integers(0, 32000, 16) for _ in range(300)]
    blocks += [np.zeros(16, dtype=np.int64), np.arange(16), np.full(16, 2**62), np.arange(16) * -1]
    variants = []
    for b in blocks[:150]:
        for t in range(16):
            v = b.copy()
            v[t] += 1
            variants.append(v)
            if t < 15 and b[t] != b[t + 1]:
                w = b.copy()
                w[t], w[t + 1] = b[t + 1], b[t]
                variants.append(w)
    for _ in range(1000):  # the two tokens of a pair swapped: (a, b) vs (b, a)
        a, b = rng.integers(0, 2**40, 2)
        v = np.zeros(16, dtype=np.int64)
        v[2], v[3] = a, b
        w = v.copy()
        w[2], w[3] = b, a
        variants += [v, w]
    uniq = {tuple(int(x) for x in b) for b in blocks + variants}
    keys = {int(K.seq_block_keys(np.array(b, dtype=np.int64), ends, 16, 1, ALL)[0][0]) for b in uniq}
    assert len(keys) == len(uniq)
    rand = [rng.integers(0, 32000, 16) for _ in range(20000)]
    low = {int(K.seq_block_keys(b, ends, 16, 1, ALL)[0][0]) & 4095 for b in rand}
    assert len(low) > 4000


def test_hash_table_delete_keeps_every_probe_chain():
    # cap 8; keys with equal home slot (low 3 bits) form one probe cluster that wraps;
    # after every insert/delete each live key is found with its value, no other key is
    rng = np.random.default_rng(7)
    for _ in range(200):
        t = np.zeros((8, K.NT), dtype=np.int64)
        t32 = t.view(np.int32)
        live = {}
        for step in range(40):
            if live and (len(live) == 7 or rng.random() < 0.45):
                key = list(live)[rng.integers(len(live))]
                i = K._find(t, key)
                assert i >= 0
                K._delete_slot(t, i)
                del live[key]
            else:
                key = int(rng.integers(0, 6)) * 8 + int(rng.choice([6, 7, 0]))
                if key in live:
                    continue
                i = K._slot_for_insert(t, key)
                t[i, K.T_KEY] = key
                t32[i, K.T_HEAD] = step
                t32[i, K.T_CNT] = 1  # occupied
                live[key] = step
            for k in range(48):
                i = K._find(t, k)
                assert (i >= 0) == (k in live)
                if i >= 0:
                    assert t32[i, K.T_HEAD] == live[k]


def test_reachable_count_cascades_when_a_parent_key_comes_and_goes():
    # The replay never caches a child before its parent, but the incremental count must
    # still follow the definition (a key is reachable iff a block holding it has the seed
    # or a reachable key as parent). Chain seed -> k1 -> k2 -> k3 on blocks 1, 2, 3, plus
    # block 4 = a second block with key k2 (a duplicate). Keys are arbitrary values.
    c = BlockHashCache(10, 4)
    blk, b32, kt, k32, st, stk = c._blk, c._b32, c._kt, c._k32, c._st, c._stk
    k1, k2, k3 = 101, 202, 303

    def reach():
        bfs = K.reachable_keys(blk, b32, kt, k32)
        assert st[K.ST_NREACH] == bfs
        return bfs

    K._add_key(blk, b32, kt, k32, st, stk, 3, k3, k2)  # k3 under absent k2: unreachable
    K._add_key(blk, b32, kt, k32, st, stk, 2, k2, k1)  # k2 under absent k1: unreachable
    assert reach() == 0
    K._add_key(blk, b32, kt, k32, st, stk, 1, k1, K.SEED)  # k1 reachable -> k2, k3 too
    assert reach() == 3
    K._add_key(blk, b32, kt, k32, st, stk, 4, k2, k1)  # duplicate of k2: still 3 keys
    assert reach() == 3
    K._drop_key(blk, b32, kt, k32, st, stk, 1)  # k1 gone: k2 (both blocks) and k3 with it
    assert reach() == 0
    K._add_key(blk, b32, kt, k32, st, stk, 1, k1, K.SEED)  # back: all three again
    assert reach() == 3
    K._drop_key(blk, b32, kt, k32, st, stk, 2)  # one k2 block goes, the duplicate holds k3
    assert reach() == 3
    K._drop_key(blk, b32, kt, k32, st, stk, 4)  # the last k2 block: k3 unreachable
    assert reach() == 1
    assert (st[K.ST_NHASHED], st[K.ST_NKEYS]) == (2, 2)


# ---------------------------------------------------------------------- golden
# Every vLLM golden run (local and shared) is a `radixkv check` assertion of per-request
# hit equality: tests/data/golden/check.toml and check_shared.toml, run by
# tests/test_check_golden.py (which also checks that every manifest run is covered).


def test_kernels_without_jit_match_golden():
    # the kernels are pure functions: run them as plain Python (NUMBA_DISABLE_JIT=1) on the
    # edge300 golden run and compare with the real engine's hits
    code = (
        "import json, sys, numpy as np; np.seterr(over='ignore');"
        "sys.path[:0] = [%r];"
        "from _golden_traces import native_trace;"
        "from radixkv.policies.block_hash import BlockHashCache;"
        "t = native_trace(%r);"
        "rows = [json.loads(l) for l in open(%r)];"
        "c = BlockHashCache(40, 16, verify=True);"
        "bad = sum(c.run_request(i, t.kv_seq(i)).hit_tokens != rows[i]['hit_tokens'] for i in range(len(t)));"
        "print('BAD', bad)"
    ) % (str(Path(__file__).parent), str(GOLDEN_LOCAL / "traces" / "edge300.jsonl"),
         str(GOLDEN_LOCAL / "vllm" / "vllm_edge300_b16_n40.jsonl"))
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BAD 0" in out.stdout


@pytest.mark.parametrize("name", ["mixed200.jsonl", "edge300.jsonl", "moon_conv_1500.jsonl", "weka_0001.jsonl"])
def test_readers_agree_with_golden_conventions(name):
    # the project's load_trace and this file's builders (golden/README.md conventions) must
    # give the same KV content for every request
    import _golden_traces as G

    if G._load_trace() is None:
        pytest.skip("radixkv.trace.load has not landed")
    a = G.golden_trace(name, GOLDEN_LOCAL, shared_path)
    if name in G.SHARED_TRACES:
        parts, fmt, limit = G.SHARED_TRACES[name]
        p = shared_path(*parts)
        b = G.mooncake_trace(p, limit) if fmt == "mooncake" else G.weka_trace(p)
    else:
        b = G.native_trace(GOLDEN_LOCAL / "traces" / name)
    assert len(a) == len(b)
    fwd, back = {}, {}  # ids may be renumbered, but one-to-one across the whole trace
    for i in range(len(a)):
        sa, sb = a.kv_seq(i), b.kv_seq(i)
        assert a.req_id[i] == b.req_id[i]
        assert (sa.prompt_len, sa.kv_len) == (sb.prompt_len, sb.kv_len)
        assert np.array_equal(sa.seg_end, sb.seg_end)
        assert np.array_equal(sa.seg_id < 0, sb.seg_id < 0)  # unique content stays unique
        for x, y in zip(sa.seg_id[sa.seg_id >= 0].tolist(), sb.seg_id[sb.seg_id >= 0].tolist()):
            assert fwd.setdefault(x, y) == y and back.setdefault(y, x) == x


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_conformance_checker(block_size):
    from radixkv.policies.check import check_policy

    check_policy(lambda cap: BlockHashCache.from_capacity_tokens(max(cap, block_size), block_size, verify=True))


def _check_sibling_groups(c):
    """Every branching parent key's sibling chain is grouped by first token, each group a
    table row (−size, head); a lone child has no row; no other group rows exist."""
    kt, k32, blk, b32 = c._kt, c._k32, c._blk, c._b32
    occ = np.flatnonzero(kt[:, K.W_OCC] != 0)
    rows = {int(kt[r, K.T_KEY]): int(r) for r in occ}
    n_groups = 0
    for r in occ[k32[occ, K.T_CCNT] > 0]:
        pkey = kt[r, K.T_KEY]
        chain, b = [], int(k32[r, K.T_CHEAD])
        while b >= 0:
            chain.append(b)
            b = int(b32[b, K.R_CNEXT])
        assert len(chain) == k32[r, K.T_CCNT]
        first = [(int(blk[x, K.W_ID0]), int(blk[x, K.W_OFF0])) for x in chain]

        def gkey(f, pkey=pkey):
            return int(K._group_key(pkey, np.int64(f[0]), np.int64(f[1])))

        if len(chain) == 1:
            assert gkey(first[0]) not in rows
            continue
        starts = [i for i in range(len(chain)) if i == 0 or first[i] != first[i - 1]]
        assert len({first[i] for i in starts}) == len(starts), "a group is not contiguous"
        for i in starts:
            g = rows[gkey(first[i])]
            assert (k32[g, K.T_CCNT], k32[g, K.T_HEAD]) == (-first.count(first[i]), chain[i])
        n_groups += len(starts)
    assert int((k32[occ, K.T_CCNT] < 0).sum()) == n_groups


def test_held_tokens_under_a_branching_parent_key():
    """B = 4, one pool of 63 blocks (no eviction). Request 0 caches the block [1 2 3 4];
    every later prompt is [1 2 3 4] + a second block + [9], so the hit is that one block
    (4 tokens) and held = 4 + the longest prefix of the prompt's second block that a
    cached child of [1 2 3 4] shares (worked out by hand beside each case)."""
    c = BlockHashCache(64, 4)
    base = [1, 2, 3, 4]
    a = c.run_request(0, seq(base + [0]))
    assert (a.hit_tokens, a.held_tokens) == (0, 0)
    cases = [
        ([5, 7, 7, 7, 9], 4),  # no child yet; [5 7 7 7] is cached
        ([5, 7, 8, 8, 9], 4 + 2),  # shares 5 7 with [5 7 7 7]; the parent now branches
        ([6, 7, 7, 7, 9], 4),  # no child starts with 6
        ([6, 7, 7, 0, 9], 4 + 3),  # shares 6 7 7 with [6 7 7 7]
        ([5, 7, 8, 0, 9], 4 + 3),  # [5 7 8 8] (3) beats [5 7 7 7] (2)
        ([7, 7, 7, 7], 4),  # P = 8: the hit is capped at 1 block; no child starts with 7
    ]
    for i, (tail, held) in enumerate(cases, start=1):
        a = c.run_request(i, seq(base + tail))
        assert (a.hit_tokens, a.held_tokens) == (4, held), i
        _check_sibling_groups(c)
    # the children of [1 2 3 4] by first token: 5 (three blocks), 6 (two), 7 (one)
    assert int((c._k32[:, K.T_CCNT] < 0).sum()) == 3


def test_sibling_groups_follow_evictions():
    """A small pool and prompts that branch under shared parents: held tokens equal the
    brute-force model's (tests/reference_vllm.py), and the groups stay consistent while
    children are evicted and the parents stop and start branching."""
    from reference_vllm import ReferenceVLLM

    rng = np.random.default_rng(7)
    c, r = BlockHashCache(24, 4), ReferenceVLLM(24, 4)
    for i in range(300):
        p = [1, 2, 3, 4][: int(rng.integers(0, 5))] + rng.integers(0, 3, int(rng.integers(1, 12))).tolist()
        s = seq(p, rng.integers(0, 3, int(rng.integers(0, 4))).tolist())
        a, e = c.run_request(i, s), r.run_request(i, s)
        assert (a is None) == (e is None)
        if a is not None:
            assert (a.hit_tokens, a.held_tokens, a.evicted_tokens) == (e.hit_tokens, e.held_tokens, e.evicted_tokens)
        _check_sibling_groups(c)
    assert c.evicted_tokens_total > 0
