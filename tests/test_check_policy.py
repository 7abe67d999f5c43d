"""The conformance checker accepts the shipped policies and rejects broken ones."""
from __future__ import annotations

import pytest

from radixkv.policies.base import Admission
from radixkv.policies.check import PolicyContractError, check_policy
from radixkv.policies.no_cache import NoCache
from radixkv.policies.unit_lru import UnitLRUCache


def test_no_cache_passes():
    check_policy(lambda cap: NoCache(cap, 1), expect_hits=False)


def test_unit_lru_passes():
    check_policy(lambda cap: UnitLRUCache(cap, 1))


class _Liar(NoCache):
    """Claims a hit of the whole prompt every time."""

    def admit(self, rid, seq, n_tokens=None):
        adm = super().admit(rid, seq, n_tokens)
        return None if adm is None else Admission(seq.prompt_len, seq.prompt_len, 0)


class _Leaky(NoCache):
    """Forgets to release slots on finish."""

    def finish(self, rid):
        self._tokens.pop(rid)


def test_hit_out_of_thin_air_is_caught():
    with pytest.raises(PolicyContractError, match="rule 2"):
        check_policy(lambda cap: _Liar(cap, 1), expect_hits=False)


def test_leak_is_caught():
    with pytest.raises(PolicyContractError, match="rule 3"):
        check_policy(lambda cap: _Leaky(cap, 1), expect_hits=False)
