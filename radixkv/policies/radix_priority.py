"""Eviction as a hook on SGLang's radix tree: ``PriorityRadixCache`` and its priorities.

:class:`PriorityRadixCache` is :class:`~radixkv.policies.radix.RadixCache` (every rule of
that module: lookup, splits, inserts, locks, how much is evicted) with one change: the
evictable leaf evicted next is the one with the smallest **priority**, a key the policy
defines — SGLang's ``EvictionStrategy.get_priority`` (``srt/mem_cache/evict_policy.py``),
read by ``components/full.py :: _evict_device_start`` which heap-orders the evictable
leaves by ``(get_priority(node), node)``.

A priority is an :class:`EvictionPriority`: a jitted function
``priority(N, x, params) -> (k1, k2)`` of node *x*'s row of the int64 node array *N*,
plus a float64 parameter vector. Smaller ``(k1, k2)`` is evicted first; ties fall to
the older last access. The row's fields (column constants exported here):

=============== ========================================================================
``F_TIME``      last access (SGLang ``last_access_time``: a counter draw shifted left by
                ``STAMP_SHIFT`` bits, larger is more recent)
``F_CREATED``   creation time (``creation_time``; a split's upper half keeps the child's)
``F_HITS``      hit count (``hit_count``: +1 for each insert walk through the node past
                what that request had already inserted, +1 when created;
                ``unified_tree_core.py :: _inc_hit_count_and_check``)
``F_PRIO``      request priority (``priority``: max over inserting requests; the prompt's
                second insert at finish uses priority + 1, ``checkpoint_into_tree``)
``F_HIST``      T-LRU high-water depth of the branch (``_tlru_history_len``, tokens)
``F_START``     first token position (tokens; the node's depth)
``F_END``       end position (tokens); the node holds ``F_END − F_START`` tokens
``F_TAG``       tag of the request that created the node (its trace index in a replay)
=============== ========================================================================

The function must depend on the row and *params* only (not on other nodes or a clock
inside the call); the heap is then exactly SGLang's (see "Eviction orders" in
:mod:`radixkv.policies._radix_kernels`). It is compiled with
:func:`priority_function` and called through a function pointer, so the tree kernels are
compiled once for all priorities (and cached on disk).

Writing a policy (the whole LFU of SGLang)::

    from radixkv.policies.radix_priority import (
        EvictionPriority, F_HITS, F_TIME, PriorityRadixCache, priority_function)

    @priority_function
    def lfu(N, x, params):
        return float(N[x, F_HITS]), float(N[x, F_TIME])

    class LFU(EvictionPriority):
        name = "lfu"
        function = lfu

    cache = PriorityRadixCache(100_000, page_size=1, eviction_policy=LFU())

Request priority: :class:`~radixkv.trace.types.KVSeq` carries none, so every request
has priority 0 (SGLang's ``req.priority or 0`` for a request sent without one).
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys

import numpy as np
from numba import njit

from radixkv.errors import ConfigError
import radixkv.policies._radix_kernels as K
from radixkv.policies._priority_fn import PRIORITY_SIG, function_addresses
from radixkv.policies._radix_kernels import (
    F_CREATED, F_END, F_HIST, F_HITS, F_PRIO, F_START, F_TAG, F_TIME, STAMP_SHIFT,
)
from radixkv.policies.base import Admission
from radixkv.policies.radix import RadixCache
from radixkv.trace.types import KVSeq

__all__ = [
    "EvictionPriority", "PriorityRadixCache", "priority_function", "EVICTION_POLICIES",
    "eviction_policy", "F_TIME", "F_CREATED", "F_HITS", "F_PRIO", "F_HIST", "F_START",
    "F_END", "F_TAG", "STAMP_SHIFT",
    "LRU", "LFU", "FIFO", "MRU", "FILO", "Priority", "SLRU", "TLRU",
]


def priority_function(fn):
    """Compile *fn* ``(N, x, params) -> (k1, k2)`` as a priority (numba ``njit`` with
    :data:`~radixkv.policies._priority_fn.PRIORITY_SIG`: N int64[:, ::1], x
    int64, params float64[::1], returns two float64).

    The compiled code is cached on disk only when *fn*'s module can be imported again by
    name (Numba's cache reloads it from there); a function defined in a file loaded by
    path, a notebook or ``__main__`` is compiled afresh in each process instead."""
    return njit(PRIORITY_SIG, cache=_importable(fn))(fn)


def _importable(fn) -> bool:
    """True when ``fn.__module__`` is found on ``sys.path`` at the file it came from."""
    name = getattr(fn, "__module__", None)
    mod = sys.modules.get(name or "")
    if not name or name == "__main__" or mod is None or not getattr(mod, "__file__", None):
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return bool(spec and spec.origin
                and os.path.realpath(spec.origin) == os.path.realpath(mod.__file__))


class EvictionPriority:
    """An eviction order for :class:`PriorityRadixCache` (SGLang's ``EvictionStrategy``).

    Subclasses set ``name`` and ``function`` (a :func:`priority_function`) and may
    override :meth:`params` (a float64 vector passed to every call)."""

    name = "custom"
    function = None
    #: block pool only: ``k1`` is a small integer class and ``k2`` the release time
    #: (see :mod:`radixkv.policies.block_priority`); the radix tree ignores it
    buckets = False

    def params(self) -> np.ndarray:
        """float64 parameter vector, shape (k,) (k ≥ 1)."""
        return np.zeros(1)

    @property
    def label(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# ------------------------------------------------------------ SGLang's strategies
# Source of each: sglang 0.5.23 ``srt/mem_cache/evict_policy.py`` (the class named).

@priority_function
def _lru(N, x, params):
    return float(N[x, F_TIME]), 0.0


@priority_function
def _lfu(N, x, params):
    return float(N[x, F_HITS]), float(N[x, F_TIME])


@priority_function
def _fifo(N, x, params):
    return float(N[x, F_CREATED]), 0.0


@priority_function
def _mru(N, x, params):
    return -float(N[x, F_TIME]), 0.0


@priority_function
def _filo(N, x, params):
    return -float(N[x, F_CREATED]), 0.0


@priority_function
def _priority(N, x, params):
    return float(N[x, F_PRIO]), float(N[x, F_TIME])


@priority_function
def _slru(N, x, params):
    return (1.0 if N[x, F_HITS] >= params[0] else 0.0), float(N[x, F_TIME])


@priority_function
def _tlru(N, x, params):
    budget = max(N[x, F_HIST] + params[1] - params[0], 0.0)
    return (-1.0 if N[x, F_START] >= budget else 0.0), float(N[x, F_TIME])


class LRU(EvictionPriority):
    """``LRUStrategy``: last access (same order as :class:`RadixCache`, slower path)."""

    name = "lru"
    function = _lru


class LFU(EvictionPriority):
    """``LFUStrategy``: (hit count, last access)."""

    name = "lfu"
    function = _lfu


class FIFO(EvictionPriority):
    """``FIFOStrategy``: creation time."""

    name = "fifo"
    function = _fifo


class MRU(EvictionPriority):
    """``MRUStrategy``: −last access (most recently used first)."""

    name = "mru"
    function = _mru


class FILO(EvictionPriority):
    """``FILOStrategy``: −creation time."""

    name = "filo"
    function = _filo


class Priority(EvictionPriority):
    """``PriorityStrategy``: (node priority, last access)."""

    name = "priority"
    function = _priority


class SLRU(EvictionPriority):
    """``SLRUStrategy``: (1 if hit count ≥ ``protected_threshold`` else 0, last access).

    Parameters
    ----------
    protected_threshold : int
        Hits that move a node to the protected segment (SGLang default 2).
    """

    name = "slru"
    function = _slru

    def __init__(self, protected_threshold: int = 2):
        self.protected_threshold = int(protected_threshold)

    def params(self):
        return np.array([float(self.protected_threshold)])

    def __repr__(self):
        return f"SLRU(protected_threshold={self.protected_threshold})"


class TLRU(EvictionPriority):
    """``TLRUStrategy`` (Tail-Optimized LRU, Zhang et al., arXiv:2510.15152):
    (−1 if the node's start ≥ max(branch high-water depth + ``next_prompt_estimate`` −
    ``threshold``, 0) else 0, last access).

    Parameters
    ----------
    threshold, next_prompt_estimate : int
        Tokens (SGLang's ``eviction_policy_config``; defaults 0, 0 make it LRU).
    """

    name = "tlru"
    function = _tlru

    def __init__(self, threshold: int = 0, next_prompt_estimate: int = 0):
        self.threshold = int(threshold)
        self.next_prompt_estimate = int(next_prompt_estimate)

    def params(self):
        return np.array([float(self.threshold), float(self.next_prompt_estimate)])

    def __repr__(self):
        return f"TLRU(threshold={self.threshold}, next_prompt_estimate={self.next_prompt_estimate})"


#: SGLang's ``--radix-eviction-policy`` names → priority classes
EVICTION_POLICIES = {c.name: c for c in (LRU, LFU, FIFO, MRU, FILO, Priority, SLRU, TLRU)}


def eviction_policy(name: str, **config) -> EvictionPriority:
    """The built-in priority *name* (``lru``, ``lfu``, ``fifo``, ``mru``, ``filo``,
    ``priority``, ``slru``, ``tlru``) with SGLang's ``eviction_policy_config`` keywords.

    Raises
    ------
    ConfigError
        For an unknown name or keyword.
    """
    cls = EVICTION_POLICIES.get(str(name).strip().lower())
    if cls is None:
        raise ConfigError(f"unknown eviction policy {name!r}; known: {', '.join(EVICTION_POLICIES)}",
                          field="eviction_policy")
    try:
        return cls(**config)
    except TypeError as e:
        raise ConfigError(f"eviction policy {name!r}: {e}", field="eviction_policy_config") from None


_named = eviction_policy


def _priority_of(ev):
    """The jitted priority of *ev* (its ``function`` attribute, without binding it)."""
    fn = inspect.getattr_static(ev, "function", None)
    return fn.__func__ if isinstance(fn, staticmethod) else fn


class PriorityRadixCache(RadixCache):
    """:class:`RadixCache` evicting the evictable leaf of smallest priority.

    The same tree kernels as :class:`RadixCache` with a keyed eviction order
    (:func:`radixkv.policies._radix_kernels.keyed_order`: the priority function by
    address, its parameters, a heap of (k1, k2, last access)).

    Parameters
    ----------
    max_total_num_tokens, page_size, chunked_prefill_size, cache_last_token_on_stop
        As :class:`RadixCache`.
    eviction_policy : EvictionPriority or str
        The priority (an instance, a subclass, or a built-in name). Default: the
        class attribute ``eviction`` (subclasses set it), else LRU.

    Raises
    ------
    radixkv.errors.ConfigError
        As :class:`RadixCache`, and for an unknown eviction policy or one without a
        compiled ``function``.
    """

    name = "radix-priority"
    #: SGLang's batch visibility, as :class:`RadixCache` (``match_and_lock`` / ``commit`` /
    #: ``defer_insert``, inherited): SGLang's scheduler matches when the batch forms and
    #: inserts after the forward pass whatever ``--radix-eviction-policy`` is (the policy
    #: only picks ``RadixCache.eviction_strategy``, ``mem_cache/radix_cache.py ::
    #: RadixCache.__init__``), so the concurrent replay of every eviction order runs
    #: :mod:`radixkv.replay.sched_sglang`'s rules, compiled (:mod:`radixkv.replay.conc_sglang`)
    batch_visibility = True
    kernel_family = "radix_priority"  # the radix tree's kernels (radixkv.replay.jit.BASE_FAMILY)
    #: default priority of the class (a subclass of :class:`EvictionPriority`, or None)
    eviction = None

    def __init__(self, max_total_num_tokens: int, page_size: int = 1, *, eviction_policy=None, **kwargs):
        super().__init__(max_total_num_tokens, page_size, **kwargs)
        ev = eviction_policy if eviction_policy is not None else self.eviction
        if ev is None:
            ev = LRU()
        elif isinstance(ev, str):
            ev = _named(ev)
        elif isinstance(ev, type):
            ev = ev()
        fn = _priority_of(ev)
        if not isinstance(ev, EvictionPriority) or fn is None:
            raise ConfigError(f"eviction policy {ev!r} is not an EvictionPriority with a function",
                              field="eviction_policy")
        self.eviction_priority = ev
        self._pfn = fn  # keeps the compiled function alive
        self._pf = function_addresses(fn)
        self._pp = np.ascontiguousarray(ev.params(), dtype=np.float64)
        if self._pp.ndim != 1 or self._pp.size == 0:
            raise ConfigError(f"{ev!r}.params() must be a non-empty 1-d vector", field="eviction_policy")
        self._HK = np.zeros((1024, 3), dtype=np.float64)
        self._HI = np.zeros((1024, 2), dtype=np.int64)
        self._HP = np.zeros((1, 3), dtype=np.int64)  # the LRU heap is unused

    @property
    def label(self) -> str:
        return f"sglang:{self.page_size}@{self.eviction_priority.label}"

    def _order(self):
        return K.keyed_order(self._HK, self._HI, self._pf, self._pp)

    def _grow_heap(self, size: int) -> None:
        if size > self._HK.shape[0]:
            HK2 = np.zeros((size, 3), dtype=np.float64)
            HI2 = np.zeros((size, 2), dtype=np.int64)
            HK2[: self._HK.shape[0]] = self._HK
            HI2[: self._HI.shape[0]] = self._HI
            self._HK, self._HI = HK2, HI2

    def warm_kernels(self) -> None:
        K.compact_store(self._S, self._G, self._Q)
        self._rebuild_heap()

    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission | None:
        """As :meth:`RadixCache.admit`, for at most the prompt: *n_tokens* above P raises
        ValueError (a retracted request is re-admitted on its prompt, recomputing its
        generated tokens as more chunks)."""
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already running")
        P = seq.prompt_len
        if n_tokens is not None and int(n_tokens) > P:
            raise ValueError(f"n_tokens={int(n_tokens)} exceeds the prompt ({P} tokens)")
        return self._admit(rid, seq, n_tokens, None)
