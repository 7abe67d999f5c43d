"""The policy author's kit (docs/policy-contract.md): the skeletons in ``examples/`` pass
the conformance kit as they are, every rule of the kit has a policy that breaks that rule
alone and is reported under that rule's name, and a policy that raises inside a hook is a
failed check with its traceback, not a crash."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

import radixkv
from radixkv import Admission, check_policy
from radixkv.policies.check import CHECKS
from radixkv.policies.no_cache import NoCache
from radixkv.policies.toolkit import held_tokens



def _example(name: str):
    """Module examples/NAME.py, loaded by path (sys.path is left as it is: other tests
    check what a module outside it does)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "examples" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


SkeletonBlockHash = _example("block_hash_skeleton").SkeletonBlockHash
SkeletonRadix = _example("radix_skeleton").SkeletonRadix

#: pool sizes of the rule tests: one that evicts and refuses, one that never evicts
CAPS = (64, 4096)


def _blocks(cls, B=4):
    return lambda cap: cls.from_capacity_tokens(max(cap, B), B)


@pytest.mark.parametrize("factory", [_blocks(SkeletonBlockHash), SkeletonRadix], ids=["block-hash", "radix"])
def test_skeletons_pass_the_kit_as_they_are(factory):
    assert check_policy(factory) == []  # every check applies, none fails


def test_error_types_are_exported():
    assert radixkv.PolicyContractError is radixkv.policies.check.PolicyContractError
    assert issubclass(radixkv.TraceFormatError, radixkv.InputError)
    assert issubclass(radixkv.ConfigError, radixkv.InputError)
    with pytest.raises(radixkv.PolicyContractError):
        check_policy(lambda cap: _Leaky(cap, 1), capacities=CAPS, checks=["finish_releases_all"])


# ------------------------------------------------------------ one policy per broken rule
class _BadSum(SkeletonBlockHash):
    """slot_accounting: stats() counts one slot more than the pool has."""

    def stats(self, detail=True):
        return dataclasses.replace(super().stats(detail), num_slots=self.num_slots + 1)


class _DetailDisagrees(SkeletonBlockHash):
    """stats_detail_agrees: the quick stats() misreports valid tokens."""

    def stats(self, detail=True):
        st = super().stats(detail)
        return st if detail else dataclasses.replace(st, valid_tokens=st.valid_tokens + 1)


class _ThinAir(SkeletonRadix):
    """no_hit_out_of_thin_air: claims one token more than any KV computed before shares
    with the prompt, when the pool holds that many tokens (so the pool bound holds)."""

    def __init__(self, num_slots, page_size=1):
        super().__init__(num_slots, page_size)
        self.computed = []  # (KVSeq, tokens with KV) of every request admitted so far

    def _claim(self, seq, lookup, hit):
        shared = held_tokens(seq, self.computed + [(r["seq"], r["tokens"]) for r in self.running.values()])
        return shared + 1 if shared + 1 <= min(lookup - 1, self.tree_tokens) else hit

    def admit(self, rid, seq, n_tokens=None):
        claim = self.peek_hit(seq, n_tokens)
        adm = super().admit(rid, seq, n_tokens)
        if adm is None:
            return None
        r = self.running[rid]
        r["seq"] = seq
        if claim > adm.hit_tokens:  # it allocates as if it had hit (the KV it says it has)
            if not self._room(max(r["tokens"], claim) - r["tokens"]):
                self.finish(rid)
                return None
            r["tokens"] = max(r["tokens"], claim)
        return Admission(claim, max(adm.held_tokens, min(claim, seq.prompt_len)), adm.evicted_tokens)

    def peek_hit(self, seq, n_tokens=None):
        return self._claim(seq, max(seq.prompt_len, n_tokens or 0), super().peek_hit(seq, n_tokens))

    def finish(self, rid):
        r = self.running[rid]
        self.computed.append((r["seq"], r["tokens"]))
        super().finish(rid)


class _HitsFromAnEmptyPool(NoCache):
    """hits_held_by_pool: caches nothing, yet hits the longest prefix shared with KV
    computed earlier (an infinite cache's hits; issue 11)."""

    def __init__(self, num_slots, block_size=1):
        super().__init__(num_slots, block_size)
        self.computed, self.seqs = [], {}

    def peek_hit(self, seq, n_tokens=None):
        return min(held_tokens(seq, self.computed), max(seq.prompt_len, n_tokens or 0) - 1)

    def admit(self, rid, seq, n_tokens=None):
        hit = self.peek_hit(seq, n_tokens)
        adm = super().admit(rid, seq, max(n_tokens or seq.prompt_len, hit))  # KV for what it says it hit
        if adm is None:
            return None
        self.seqs[rid] = seq
        return Admission(hit, hit, 0)

    def finish(self, rid):
        self.computed.append((self.seqs.pop(rid), self._tokens[rid]))
        super().finish(rid)


class _Leaky(NoCache):
    """finish_releases_all: finish keeps one slot of every request (preempt is right)."""

    def finish(self, rid):
        super().finish(rid)
        self._used += 1 if self._used < self.num_slots else 0

    def preempt(self, rid):
        NoCache.finish(self, rid)


class _RefusalEvicts(SkeletonBlockHash):
    """refusal_changes_nothing: a refused admission has already evicted a cached block."""

    def admit(self, rid, seq, n_tokens=None):
        adm = super().admit(rid, seq, n_tokens)
        if adm is None:
            for b in self.queue:
                if self.key[b] is not None:
                    del self.queue[b]
                    self.queue[b] = None
                    self.queue.move_to_end(b, last=False)
                    self._release(self._take())
                    break
        return adm


class _CoinFlip(SkeletonBlockHash):
    """deterministic: with two or more requests running, every other instance evicts the
    most recently freed block instead of the least (both keep every other rule)."""

    made = 0

    def __init__(self, num_slots, block_size=16):
        super().__init__(num_slots, block_size)
        _CoinFlip.made += 1
        self.flip = _CoinFlip.made % 2 == 1

    def _take(self):
        if self.flip and len(self.running) >= 2:
            self.queue.move_to_end(next(reversed(self.queue)), last=False)
        return super()._take()


class _CountsWrongWhileSharing(SkeletonBlockHash):
    """several_running: slot accounting off by one while two or more requests run (one at
    a time it is right); reported as the rule it breaks, found by ``several_running``."""

    def stats(self, detail=True):
        st = super().stats(detail)
        return dataclasses.replace(st, free_slots=st.free_slots + 1) if len(self.running) >= 2 else st


class _ReleasesSharedBlocks(SkeletonBlockHash):
    """running_kv_resident: finish frees every block of the request, dropping the
    references other running requests hold on shared prefix blocks (issue 11)."""

    def finish(self, rid):
        for b in reversed(self.running.pop(rid)["blocks"]):
            if self.ref[b] > 0:
                self.ref[b] = 0  # the bug: should be -= 1
                self._release(b)


class _ChunkMisses(SkeletonBlockHash):
    """chunked_admit: a chunked prefill's first admission (n_tokens < prompt) looks up
    nothing."""

    def _lookup(self, keys, lookup_tokens):
        return [] if self._chunk else super()._lookup(keys, lookup_tokens)

    def admit(self, rid, seq, n_tokens=None):
        self._chunk = n_tokens is not None and n_tokens < seq.prompt_len
        try:
            return super().admit(rid, seq, n_tokens)
        finally:
            self._chunk = False

    _chunk = False


class _PreemptLeaks(NoCache):
    """preempt: a preempted request keeps one slot (finish is right)."""

    def preempt(self, rid):
        super().finish(rid)
        self._used += 1 if self._used < self.num_slots else 0


class _RunRequestSkipsDecode(SkeletonBlockHash):
    """run_request_equivalent: a fused run_request that forgets the decoded tokens."""

    def run_request(self, rid, seq):
        adm = self.admit(rid, seq)
        if adm is not None:
            self.finish(rid)
        return adm


class _PeekTouches(SkeletonRadix):
    """peek_hit_pure: peek_hit by a real admission of one token (refreshes LRU times)."""

    def peek_hit(self, seq, n_tokens=None):
        adm = self.admit(-1, seq, 1)
        if adm is None:
            return 0
        self.finish(-1)
        return adm.hit_tokens


BROKEN = {
    "slot_accounting": _blocks(_BadSum),
    "stats_detail_agrees": _blocks(_DetailDisagrees),
    "no_hit_out_of_thin_air": _ThinAir,
    "hits_held_by_pool": lambda cap: _HitsFromAnEmptyPool(cap, 1),  # caches nothing: expect_hits=False
    "finish_releases_all": lambda cap: _Leaky(cap, 1),  # caches nothing
    "refusal_changes_nothing": _blocks(_RefusalEvicts),
    "deterministic": _blocks(_CoinFlip),
    "repeats_hit": lambda cap: NoCache(cap, 1),
    "several_running": _blocks(_CountsWrongWhileSharing),
    "running_kv_resident": _blocks(_ReleasesSharedBlocks),
    "chunked_admit": _blocks(_ChunkMisses),
    "preempt": lambda cap: _PreemptLeaks(cap, 1),  # caches nothing
    "run_request_equivalent": _blocks(_RunRequestSkipsDecode),
    "peek_hit_pure": _PeekTouches,
}


#: breakers built on NoCache, which caches nothing (repeats_hit does not apply to them)
NO_CACHE = ("hits_held_by_pool", "finish_releases_all", "preempt")


def test_every_rule_has_a_breaker():
    assert set(BROKEN) == {c.name for c in CHECKS}


@pytest.mark.parametrize("rule", list(BROKEN))
def test_a_policy_breaking_one_rule_is_reported_under_that_rule_alone(rule):
    with pytest.raises(radixkv.PolicyContractError) as e:
        check_policy(BROKEN[rule], capacities=CAPS, expect_hits=rule not in NO_CACHE)
    # several_running re-checks the other rules with several requests at once: what it
    # finds is reported under the rule broken, saying which check found it
    want = "slot_accounting" if rule == "several_running" else rule
    assert set(e.value.failures) == {want}, e.value.failures
    assert str(e.value).startswith(f"rule {want!r} broken")
    if rule == "several_running":
        assert "found by the 'several_running' check" in e.value.failures[want]


class _RaisesInExtend(SkeletonBlockHash):
    def extend(self, rid, n_tokens):
        if len(self.running) >= 2:
            raise KeyError(f"no block table for request {rid}")
        return super().extend(rid, n_tokens)


def test_a_policy_raising_in_a_hook_fails_the_checks_with_its_traceback():
    with pytest.raises(radixkv.PolicyContractError) as e:
        check_policy(_blocks(_RaisesInExtend), capacities=CAPS)
    err = e.value
    # only the checks that run several requests at once reach the raising call
    assert "several_running" in err.failures and "chunked_admit" not in err.failures
    assert set(err.tracebacks) == set(err.failures)
    msg = err.failures["several_running"]
    assert "the policy raised KeyError: 'no block table for request" in msg
    assert "in extend, " in msg and "test_policy_kit.py" in msg
    assert "raise KeyError" in err.tracebacks["several_running"]  # the policy's own line
    assert isinstance(err.__cause__, KeyError)
    assert str(err).count("Traceback (most recent call last)") == 1  # the first one in full
