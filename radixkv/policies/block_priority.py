"""Eviction as a hook on vLLM's block pool: ``PriorityBlockHashCache`` and its priorities.

:class:`PriorityBlockHashCache` is :class:`~radixkv.policies.block_hash.BlockHashCache`
(every rule of that module: chained block keys, first-miss lookup, the ``(P − 1) // B``
cap, ref counts, caching at the end of each step, tail-first release) with one change:
when a new block is needed and no keyless block is free, the hashed free block evicted is
the one of smallest **priority**, a jitted function of the block's statistics (vLLM's
``FreeKVCacheBlockQueue`` evicts the block released longest ago: the priority
:class:`BlockLRU`, same results as the built-in, on a slower path). Keyless free blocks
are still taken first, in vLLM's order (``BlockPool.get_new_blocks``).

The function has the radix hook's signature, ``priority(E, b, params) -> (k1, k2)``
(:func:`~radixkv.policies.radix_priority.priority_function`), over block *b*'s row of
the int64 statistics array *E* (columns exported here):

============ ===========================================================================
``E_TIME``   release time: a counter draw when its ref_cnt last reached 0 (larger = later)
``E_HITS``   lookup hits it served since it got its key
``E_CACHED`` the counter draw when it got its key
``E_DEPTH``  its index in its chain: block j covers tokens ``[jB, (j+1)B)``
``E_TAG``    the request that cached it (its handle when an int)
============ ===========================================================================

Smaller ``(k1, k2)`` is evicted first; ties fall to the earlier release. A priority
class with ``buckets = True`` promises ``k2`` = release time and an integer ``k1`` (clamped
to 0 … 62): the blocks then sit in one release-ordered list per ``k1`` and a block costs
O(1), as in vLLM's queue (LFU by saturating hit count, segments, priority classes);
otherwise a heap orders them (any priority, O(log n) per block). An LFU over blocks::

    @priority_function
    def block_lfu(E, b, params):
        return float(E[b, E_HITS]), float(E[b, E_TIME])

    class BlockLFU(EvictionPriority):
        name = "lfu"
        function = block_lfu

    cache = PriorityBlockHashCache.from_capacity_tokens(100_000, 16, eviction_policy=BlockLFU())
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
import radixkv.policies._hash_kernels as K
from radixkv.policies._hash_kernels import E_CACHED, E_DEPTH, E_HITS, E_TAG, E_TIME
from radixkv.policies._priority_fn import function_addresses
from radixkv.policies.block_hash import BlockHashCache, _aligned
from radixkv.policies.radix_priority import EvictionPriority, _priority_of, priority_function

__all__ = ["PriorityBlockHashCache", "BlockLRU", "BlockLFU", "BLOCK_EVICTION_POLICIES",
           "E_TIME", "E_HITS", "E_CACHED", "E_DEPTH", "E_TAG"]


@priority_function
def _block_lru(E, b, params):
    return float(E[b, E_TIME]), 0.0


@priority_function
def _block_lfu(E, b, params):
    return float(E[b, E_HITS]), float(E[b, E_TIME])


class BlockLRU(EvictionPriority):
    """vLLM's free-queue order: released longest ago first (one bucket)."""

    name = "lru"
    function = _block_lru
    buckets = True


class BlockLFU(EvictionPriority):
    """(hits served, release time): fewest hits first, then released longest ago; hit
    counts above 62 count as 62 (bucket mode)."""

    name = "lfu"
    function = _block_lfu
    buckets = True


#: built-in block priorities by name
BLOCK_EVICTION_POLICIES = {c.name: c for c in (BlockLRU, BlockLFU)}


class PriorityBlockHashCache(BlockHashCache):
    """:class:`BlockHashCache` evicting the hashed free block of smallest priority.

    Parameters
    ----------
    num_gpu_blocks, block_size, verify
        As :class:`BlockHashCache`.
    eviction_policy : EvictionPriority, its class, or a name of
        :data:`BLOCK_EVICTION_POLICIES`. Default: the class attribute ``eviction``,
        else :class:`BlockLRU`.

    Raises
    ------
    radixkv.errors.ConfigError
        As :class:`BlockHashCache`, and for an unknown policy or one without a function.
    """

    name = "vllm-priority"
    kernel_family = "block_priority"  # its own compiled kernels (warm-up)
    eviction = None

    def __init__(self, num_gpu_blocks: int, block_size: int = 16, *, eviction_policy=None, **kwargs):
        super().__init__(num_gpu_blocks, block_size, **kwargs)
        ev = eviction_policy if eviction_policy is not None else self.eviction
        if ev is None:
            ev = BlockLRU()
        elif isinstance(ev, str):
            cls = BLOCK_EVICTION_POLICIES.get(ev.strip().lower())
            if cls is None:
                raise ConfigError(f"unknown block eviction policy {ev!r}; known: {', '.join(BLOCK_EVICTION_POLICIES)}",
                                  field="eviction_policy")
            ev = cls()
        elif isinstance(ev, type):
            ev = ev()
        fn = _priority_of(ev)
        if not isinstance(ev, EvictionPriority) or fn is None:
            raise ConfigError(f"eviction policy {ev!r} is not an EvictionPriority with a function",
                              field="eviction_policy")
        self.eviction_priority = ev
        self._pfn = fn
        self._pf = function_addresses(fn)
        self._pp = np.ascontiguousarray(ev.params(), dtype=np.float64)
        nb = self.num_gpu_blocks
        self._E = _aligned(nb, K.NE, 64)
        cap = max(16, 2 * nb)
        self._H = np.zeros((cap, 5), dtype=np.float64)
        self._BK = np.full((K.NBUCKETS, 2), -1, dtype=np.int64)
        self._pst = np.zeros(K.NP, dtype=np.int64)
        self._pst[K.P_MODE] = 1 if getattr(ev, "buckets", False) else 0
        self._fo = (K.PrioOrder(self._E, self._H, self._BK, self._pst, self._pf, self._pp),)
        self._tags = 0

    @property
    def label(self) -> str:
        return f"vllm:{self.block_size}@{self.eviction_priority.name}"

    #: the sequential span runs vLLM's free queue (``_hash_span``): this class replays request by request
    replay_span = None

    def _tag(self, rid) -> int:
        if isinstance(rid, (int, np.integer)):
            return int(rid)
        self._tags += 1
        return self._tags

    def _order(self, tag: int) -> tuple:
        """The pool kernels' free order: this policy's priority (``K.PrioOrder``), serving *tag*."""
        self._pst[K.P_TAG] = tag
        return self._fo

    def _heap(self):
        return self._E, self._H, self._BK, self._pst

    def free_queue(self) -> np.ndarray:
        """Free block ids in the order they would be taken now: keyless blocks (vLLM's
        queue head), then hashed blocks by priority; int64, O(n log n)."""
        # the linked list holds the keyless free blocks only (its length: free − hashed free)
        keyless = K.free_queue(self._b32, self._st)[: int(self._st[K.ST_FQLEN] - self._st[K.ST_NCACHED])]
        if self._pst[K.P_MODE] == 1:
            out = []
            for k in range(K.NBUCKETS):
                b = int(self._BK[k, 0])
                while b >= 0:
                    out.append(b)
                    b = int(self._E[b, K.E_BNEXT])
            return np.concatenate([keyless, np.asarray(out, dtype=np.int64)])
        K.rebuild(self._b32, self._E, self._H, self._pst, self._pf, self._pp)
        n = int(self._pst[K.P_HLEN])
        H = self._H[:n]
        order = np.lexsort((H[:, 3], H[:, 2], H[:, 1], H[:, 0]))
        return np.concatenate([keyless, H[order, 4].astype(np.int64)])
