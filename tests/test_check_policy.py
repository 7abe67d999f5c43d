"""The conformance kit: every built-in passes every check; broken policies fail it with
the rule named — among them the two of issue 11 (blocks still shared by running requests
released on ``finish``; infinite-cache hits from a pool that caches nothing)."""
from __future__ import annotations

import pytest

from radixkv import check_policy
from radixkv.policies.base import Admission
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.check import CHECKS, CheckNotApplicable, PolicyContractError, parametrize_with_checks
from radixkv.policies.no_cache import NoCache
from radixkv.policies.radix import RadixCache
from radixkv.policies.static_reserved import StaticReservedCache
from radixkv.policies.toolkit import common_prefix_len
from radixkv.policies.unit_lru import UnitLRUCache
from reference_vllm import ReferenceVLLM

BUILTINS = {
    "vllm-1": lambda cap: BlockHashCache.from_capacity_tokens(max(cap, 1), 1, verify=True),
    "vllm-16": lambda cap: BlockHashCache.from_capacity_tokens(max(cap, 16), 16, verify=True),
    "sglang-1": lambda cap: RadixCache.from_capacity_tokens(cap, 1),
    "sglang-4": lambda cap: RadixCache.from_capacity_tokens(cap, 4),
    "static-4": lambda cap: StaticReservedCache.from_capacity_tokens(cap, 4, reserved_fraction=0.3),
    "unit-lru": lambda cap: UnitLRUCache(cap, 1),
    "sglang-4-slru": "sglang:4@slru",  # the eviction hooks, as the command line names them
    "vllm-4-lfu": "vllm:4@lfu",
}


@parametrize_with_checks(BUILTINS)
def test_builtin_policies_pass(factory, check):
    check(factory)


@parametrize_with_checks({"none": lambda cap: NoCache(cap, 1)}, expect_hits=False)
def test_no_cache_passes(factory, check):
    check(factory)


def test_spec_text_and_class_are_accepted():
    assert check_policy("sglang:2") == []  # every check applies to RadixCache
    assert check_policy(StaticReservedCache) == []
    assert set(check_policy("unit-lru")) == {"running_kv_resident", "peek_hit_pure"}


def test_reference_vllm_policy_passes():
    check_policy(lambda cap: ReferenceVLLM.from_capacity_tokens(cap, 8), capacities=(64, 256, 4096))


# ---------------------------------------------------------------------- broken policies
class SharedReleasingVLLM(ReferenceVLLM):
    """Issue 11's first broken policy: ``finish`` frees every block of the request,
    dropping the references other running requests hold on shared prefix blocks."""

    def finish(self, rid):
        r = self.running.pop(rid)
        for b in reversed(r["blocks"]):
            if self.ref[b] > 0:
                self.ref[b] = 0  # the bug: should be -= 1
                if self.key[b] is None:
                    self._prepend(b)
                else:
                    self._append(b)


class InfiniteCacheLiar(NoCache):
    """Issue 11's second broken policy: caches nothing (NoCache's pool) yet reports the
    hits of an infinite cache — the longest prefix shared with any finished request."""

    def __init__(self, num_slots, block_size=1):
        super().__init__(num_slots, block_size)
        self._seen, self._seqs = [], {}

    def admit(self, rid, seq, n_tokens=None):
        adm = super().admit(rid, seq, n_tokens)
        if adm is None:
            return None
        self._seqs[rid] = seq
        hit = max((common_prefix_len(seq, s, 0, min(n, seq.prompt_len - 1)) for s, n in self._seen), default=0)
        return Admission(hit, hit, 0)

    def finish(self, rid):
        self._seen.append((self._seqs.pop(rid), self._tokens[rid]))
        super().finish(rid)


def test_releasing_shared_blocks_on_finish_fails_naming_the_rule():
    ok = lambda cap: ReferenceVLLM.from_capacity_tokens(cap, 4)  # noqa: E731
    bad = lambda cap: SharedReleasingVLLM.from_capacity_tokens(cap, 4)  # noqa: E731
    check_policy(ok, capacities=(256, 4096), checks=["running_kv_resident", "several_running"])
    with pytest.raises(PolicyContractError, match="running_kv_resident") as e:
        check_policy(bad, capacities=(256, 4096), checks=["running_kv_resident", "several_running"])
    assert "KV a running request holds was freed" in e.value.failures["running_kv_resident"]


def test_infinite_cache_hits_from_an_empty_pool_fail_naming_the_rule():
    with pytest.raises(PolicyContractError, match="hits_held_by_pool") as e:
        check_policy(lambda cap: InfiniteCacheLiar(cap, 1), expect_hits=False)
    # its hits are prefixes of earlier requests' KV: the rule of the old kit (a hit is a
    # prefix of KV computed earlier) passes it; the pool rule does not
    assert "no_hit_out_of_thin_air" not in e.value.failures
    assert "the pool held 0 used + 0 cached slots" in e.value.failures["hits_held_by_pool"]


class _Liar(NoCache):
    """Claims a hit of the whole prompt every time."""

    def admit(self, rid, seq, n_tokens=None):
        adm = super().admit(rid, seq, n_tokens)
        return None if adm is None else Admission(seq.prompt_len, seq.prompt_len, 0)


class _Leaky(NoCache):
    """Forgets to release slots on finish."""

    def finish(self, rid):
        self._tokens.pop(rid)


class _PeekTouches(RadixCache):
    """peek_hit by a real admission: it splits nodes and refreshes LRU times."""

    def peek_hit(self, seq, n_tokens=None):
        adm = self.admit(-1, seq, 1)
        if adm is None:
            return 0
        self.preempt(-1)
        return adm.hit_tokens


class _RunRequestSkipsDecode(BlockHashCache):
    """A fused run_request that forgets to cache the decoded tokens."""

    def run_request(self, rid, seq):
        adm = self.admit(rid, seq)
        if adm is not None:
            self.finish(rid)
        return adm


@pytest.mark.parametrize("factory, rule", [
    (lambda cap: _Liar(cap, 1), "no_hit_out_of_thin_air"),
    (lambda cap: _Leaky(cap, 1), "finish_releases_all"),
    (lambda cap: _PeekTouches.from_capacity_tokens(cap, 1), "peek_hit_pure"),
    (lambda cap: _RunRequestSkipsDecode.from_capacity_tokens(max(cap, 4), 4), "run_request_equivalent"),
], ids=["thin-air", "leak", "peek-side-effect", "run-request"])
def test_broken_policy_fails_the_named_check(factory, rule):
    with pytest.raises(PolicyContractError, match=rule) as e:
        check_policy(factory, expect_hits=False)
    assert rule in e.value.failures


def test_checks_are_named_and_listed():
    names = [c.name for c in CHECKS]
    assert len(names) == len(set(names)) == 14
    with pytest.raises(CheckNotApplicable):
        next(c for c in CHECKS if c.name == "peek_hit_pure")(lambda cap: UnitLRUCache(cap, 1))
    with pytest.raises(ValueError, match="unknown checks"):
        check_policy("vllm:16", checks=["no_such_rule"])
