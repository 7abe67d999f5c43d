"""StaticReservedCache: the statically partitioned pool, values worked out by hand."""
from __future__ import annotations

import pytest

from radixkv.errors import ConfigError
from radixkv.policies.check import check_policy
from radixkv.policies.static_reserved import StaticReservedCache
from radixkv.trace.types import Trace


def _seqs(prompts, outputs=None):
    """KVSeqs of token prompts (U = 1); outputs are output-token counts (unique content)."""
    n = len(prompts)
    outputs = outputs or [1] * n
    tr = Trace.from_requests(req_id=list(range(n)), arrival_s=[0.0] * n, prompt_len=[len(p) for p in prompts],
                             output_len=outputs, prompt_ids=prompts)
    return [tr.kv_seq(i) for i in range(n)]


def test_split_of_the_pool():
    c = StaticReservedCache(10, 4, reserved_fraction=0.3)
    # floor(0.3 × 10) = 3 reserved blocks, 7 working blocks
    assert (c.reserved_slots, c.working_slots) == (3, 7)
    assert c.room_slots() == 7


def test_running_requests_never_use_the_reserved_part():
    c = StaticReservedCache(10, 4, reserved_fraction=0.3)
    (big, fits) = _seqs([list(range(29)), list(range(100, 128))])
    # 29 tokens need ceil(29 / 4) = 8 blocks > 7 working blocks, although 10 are free
    assert c.fits_alone(big) == (8 - 7) * 4
    assert c.admit(0, big) is None
    assert c.stats().used_slots == 0
    # 28 tokens = 7 blocks fit exactly
    assert c.admit(1, fits) is not None
    assert c.room_slots() == 0
    assert c.stats().used_slots == 7


def test_hits_save_compute_not_memory_and_follow_vllm_cap():
    c = StaticReservedCache(20, 4, reserved_fraction=0.5)  # 10 reserved, 10 working
    x = list(range(12))
    a, same, longer = _seqs([x, x, x + [50, 51, 52, 53]])
    assert c.run_request(0, a).hit_tokens == 0  # caches 3 full blocks (12 tokens, N = 1)
    assert c.stats().cached_slots == 3
    # exact repeat: hit capped at (12 − 1) // 4 = 2 blocks = 8 tokens (last token recomputed)
    assert c.run_request(1, same).hit_tokens == 8
    # 16-token prompt extending it: min(3, 15 // 4 = 3) blocks = 12 tokens
    adm = c.admit(2, longer)
    assert adm.hit_tokens == 12
    assert adm.held_tokens == 12
    # the hit is copied into the request's own blocks: ceil(16 / 4) = 4 working blocks
    assert c.stats().used_slots == 4
    c.finish(2)
    assert c.stats().used_slots == 0


def test_cache_is_lru_within_the_reservation():
    c = StaticReservedCache(10, 4, reserved_fraction=0.3)  # 3 reserved blocks
    a, b, a2, b2 = _seqs([list(range(12)), list(range(100, 112)), list(range(12)) + [7], list(range(100, 112)) + [7]])
    c.run_request(0, a)  # cache: a's 3 blocks
    c.run_request(1, b)  # b's 3 blocks evict all of a's
    assert c.stats().cached_slots == 3
    assert c.evictions == 3
    assert c.run_request(2, a2).hit_tokens == 0
    # a2 (13 tokens) cached a's 3 blocks again, evicting b's
    assert c.run_request(3, b2).hit_tokens == 0


def test_parent_blocks_outlive_their_children():
    # 2 reserved blocks; a 3-block prompt keeps its first 2 blocks (inserted deepest first,
    # so the deepest is the least recent and goes first), and a later lookup hits them
    c = StaticReservedCache(12, 4, reserved_fraction=0.2)  # floor(2.4) = 2 reserved
    a, a_again = _seqs([list(range(12)), list(range(12)) + [99]])
    c.run_request(0, a)
    assert c.stats().cached_slots == 2
    assert c.run_request(1, a_again).hit_tokens == 8


def test_decode_blocks_are_cached_when_full():
    c = StaticReservedCache(20, 4, reserved_fraction=0.5)
    # prompt 6 tokens, 7 outputs: KV extent 6 + 6 = 12 tokens = 3 full blocks
    (s,) = _seqs([list(range(6))], outputs=[7])
    c.admit(0, s)
    assert c.stats().cached_slots == 1  # only the first block is full after the prompt
    assert c.extend(0, 6)
    assert c.stats().cached_slots == 3
    c.finish(0)


def test_zero_reservation_never_hits():
    c = StaticReservedCache(10, 4, reserved_fraction=0.0)
    a, b = _seqs([list(range(12)), list(range(12))])
    c.run_request(0, a)
    assert c.run_request(1, b).hit_tokens == 0
    assert c.working_slots == 10


@pytest.mark.parametrize("f", [-0.1, 1.0, 2.0])
def test_bad_fraction(f):
    with pytest.raises(ConfigError):
        StaticReservedCache(10, 4, reserved_fraction=f)


def test_contract_checker():
    check_policy(lambda cap: StaticReservedCache.from_capacity_tokens(cap, 4, reserved_fraction=0.3),
                 capacities=(64, 256, 10_000))


class _OrderedDictStatic:
    """Brute-force reference of the static pool's cache part (an ``OrderedDict`` of block
    keys, least recent first), written from the module docstring's rules."""

    def __init__(self, num_slots, B, f):
        from collections import OrderedDict

        self.B = B
        self.reserved = int(f * num_slots)
        self.lru = OrderedDict()
        self.evicted = 0

    def run(self, seq):
        from radixkv.policies._hash_kernels import seq_block_keys

        B, P = self.B, seq.prompt_len
        keys, _ = seq_block_keys(seq.seg_id, seq.seg_end, B, seq.kv_len // B, 0xFFFFFFFFFFFFFFFF)
        keys = [int(k) for k in keys]
        found = 0
        while found < min((P - 1) // B, len(keys)) and keys[found] in self.lru:
            found += 1
        held = found
        while held < min(P // B, len(keys)) and keys[held] in self.lru:
            held += 1
        for j in range(found - 1, -1, -1):
            self.lru.move_to_end(keys[j])
        # prompt blocks at admission, then the decode's blocks
        mid = min(max(P, found * B) // B, len(keys))
        for lo, hi in ((found, mid), (mid, len(keys))):
            if self.reserved == 0:
                break
            for j in range(hi - 1, lo - 1, -1):
                if keys[j] in self.lru:
                    self.lru.move_to_end(keys[j])
                else:
                    self.lru[keys[j]] = None
            while len(self.lru) > self.reserved:
                self.lru.popitem(last=False)
                self.evicted += B
        return found * B, min(held * B, P), len(self.lru)


@pytest.mark.parametrize("seed", range(6))
def test_lru_list_matches_an_ordered_dict(seed):
    """Hits, held tokens, evictions and cached blocks equal a plain OrderedDict model on
    random prompts that share prefixes, with a reservation small enough to evict often."""
    import numpy as np

    rng = np.random.default_rng(seed)
    B = int(rng.choice([1, 2, 4]))
    bases = [list(rng.integers(0, 50, int(rng.integers(4, 40)))) for _ in range(5)]
    prompts, outs = [], []
    for _ in range(60):
        b = bases[int(rng.integers(0, 5))]
        head = [int(t) for t in b[: int(rng.integers(1, len(b) + 1))]]
        prompts.append(head + [int(t) for t in rng.integers(0, 1000, int(rng.integers(0, 12)))])
        outs.append(int(rng.integers(0, 5)))
    f = float(rng.choice([0.05, 0.1, 0.2]))
    c = StaticReservedCache(200, B, reserved_fraction=f)
    ref = _OrderedDictStatic(200, B, f)
    for i, s in enumerate(_seqs(prompts, outs)):
        adm = c.run_request(i, s)
        hit, held, cached = ref.run(s)
        assert (adm.hit_tokens, adm.held_tokens) == (hit, held)
        assert c.stats().cached_slots == cached
        assert c.evicted_tokens_total == ref.evicted
    assert ref.evicted > 0  # the test exercised eviction
