"""Prefix-cache policies: one base class (:mod:`.base`), one file per policy."""
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.policies.no_cache import NoCache
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.policies.vllm_hybrid import HybridBlockHashCache

__all__ = ["Admission", "PoolStats", "PrefixCache", "NoCache", "BlockHashCache", "RadixCache", "HybridBlockHashCache"]
