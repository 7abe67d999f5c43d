"""``HiCacheRadixCache``: SGLang's RadixAttention with HiCache, a host-memory (L2) tier.

SGLang 0.5.23 runs HiCache (``--enable-hierarchical-cache``) as a mode of
``srt/mem_cache/unified_radix_cache.py :: UnifiedRadixCache`` (``init_hicache``) with its
tree core ``unified_cache/unified_tree_core.py :: UnifiedTreeCore`` (the Rust core gives
the same decisions) and the full-attention component ``unified_cache/components/full.py``.
A tree node holds a device (GPU) value, a host value, or both. This model reproduces the
tree's decisions request for request: device hit, host hit, what is loaded back, what
is written to host, what is evicted from either tier. Goldens: SGLang's own code driven
on CPU (``tools/engines/gen_sglang_hicache_goldens.py``, docs/hicache.md).

The device pool, lookup, insert, LRU clock and the device-eviction amounts are those of
:class:`~radixkv.policies.radix.RadixCache` (its docstring gives their sources). What
HiCache adds (SGLang source in brackets):

- **Host pool** (``pool_host/base.py :: HostKVCache.__init__``): ``--hicache-size`` GB
  at the model's KV bytes per token, else ``int(max_total_num_tokens × --hicache-ratio)``
  tokens; then rounded to pages with one extra page: ``(size // p + 1) · p`` tokens,
  all allocatable.
- **Write policies** (``init_hicache``; ``UnifiedTreeCore._inc_hit_count_and_check``):
  an insert walk increments ``hit_count`` of every device-resident node it passes that
  ends past what the request itself inserted before (``InsertParams.inserted_len``),
  and of the new leaf; a node whose count reaches the threshold and has no host copy is
  backed up — ``write_through``: threshold 1, ``write_through_selective``: threshold 2.
  A backup also backs up the node's unbacked ancestors first
  (``_build_backup_kv_action``). ``write_back`` never backs up on insert: a device leaf
  without a host copy is backed up when it is evicted, then demoted; if the host cannot
  make room its subtree is dropped (``UnifiedRadixCache._evict_components``,
  ``drop_subtree_no_host``). A split copies ``hit_count`` to the new upper node.
- **Host allocation** (``UnifiedRadixCache._execute_kv_backup``): when the host pool has
  fewer free tokens than the node, host leaves are evicted for the shortfall; if that
  is not enough the backup (and the rest of its chain) fails and the node stays
  device-only.
- **Device eviction** (``UnifiedTreeCore.evict_device_leaf``): device leaves (a device
  value, no child with a device value, unlocked) by least recent access; a node with a
  host copy is **demoted** (its device value is freed, the node stays as host-only); one
  without is deleted, with childless ancestors that hold nothing.
- **Host eviction** (``components/full.py :: drive_host_eviction``): host leaves (host
  copy, no device value, no children, unlocked) by least recent access; the node is
  deleted. Under ``write_back`` host copies of nodes that are also on the device are
  reclaimed first (``_reclaim_full_host_duplicates``: in the order they became
  duplicates, sparing evictable device leaves in a first pass).
- **Match** (``_match_prefix_helper``; ``full.py :: finalize_match_result_in_tree_core``):
  the walk continues through host-only nodes; the device hit is the depth of the
  deepest device-resident matched node, ``host_hit_length`` the host tokens below it.
- **Load back** (``init_load_back`` → ``load_back`` → ``_load_back_transfers``): the
  host-only nodes of the match are copied to freshly allocated device slots (evicting
  device leaves for the shortfall, the path locked) unless fewer than
  ``load_back_threshold = 10`` tokens; then they are device-resident again (and keep
  their host copy). A declined load is recomputed; the insert then re-attaches the
  recomputed KV to the host-only nodes (``_unevict_node_on_insert``).

- **L3 storage** (``--hicache-storage-backend file``; :meth:`HiCacheRadixCache._prefetch`,
  :meth:`HiCacheRadixCache._storage_write`): host backups are written to a store of
  chained page keys (``write_backup_storage``); at arrival a request's tokens after the
  device + host match are looked up there and the leading stored pages are prefetched
  into host (``Scheduler._prefetch_kvcache`` → ``prefetch_from_storage``), then matched
  and loaded back as host hits. Goldens from SGLang's own storage path
  (``tests/data/golden/sglang_hicache_storage``, docs/hicache.md "L3 storage tier").

Choices: every HiCache transfer (write, load) finishes before the next scheduler step
(the harness reaps all acks at every step); the scheduler's load-back budget check
(``PrefillAdder.add_one_req`` → ``prepare_load_back``) always passes for a lone request.

The goldens check the sequential replay (one request at a time). The concurrent replay
runs the class under SGLang's scheduler rules (:mod:`radixkv.replay.sched_sglang`, its
``admit``-at-formation path): :meth:`device_hit` gives the device prefix the admission
check and ``lpm`` use (:meth:`peek_hit` the whole hit, device + loaded); :meth:`admit` takes a first chunk and :meth:`extend` the later
ones (``alloc_for_extend``: evict for the shortfall, then the chunk's pages); the tokens
an admission loads back (``Admission.host_loaded_tokens``) are priced by
:class:`radixkv.cost.HostLink`, overlapping the step layer by layer as
``HiCacheController.start_loading`` does. Not modelled there: the insertion of each
finished chunk before the request ends (``cache_unfinished_req``; a chunked request's
KV enters the tree at its first decode), and the asynchrony of write-through copies
(they finish within the step).
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from radixkv.errors import ConfigError
from radixkv.policies._hicache_kernels import chain_page_hashes, lcp_at, seq_tokens_kernel
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.policies.hicache_store import FILE_EVICTION_RATIO, PageStore  # noqa: F401 (re-exported)
from radixkv.policies.host_tier import HostTierOptions, zero_host_totals
from radixkv.policies._radix_kernels import STAMP_SHIFT
from radixkv.policies.radix import SGLangPoolTerms
from radixkv.trace.types import KVSeq

#: SGLang ``UnifiedRadixCache.init_hicache``: ``self.load_back_threshold = 10``
LOAD_BACK_THRESHOLD = 10
#: write policy → hit-count threshold of a write-through (None: write-back)
WRITE_POLICIES = {"write_through": 1, "write_through_selective": 2, "write_back": None}
#: offset of the unique-content tokens (negative segment ids) in the token encoding
_SEG_SHIFT = 24
#: L3 storage backends modelled (``--hicache-storage-backend``)
STORAGE_BACKENDS = ("file",)
#: ``--hicache-storage-prefetch-policy`` values (``server_args.py``; default best_effort)
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
#: SGLang ``UnifiedRadixCache.init_hicache``: ``storage_prefetch_threshold = 256`` tokens
#: (``prefetch_threshold`` of ``--hicache-storage-backend-extra-config``), then
#: ``max(threshold, page_size)`` (``HybridCacheController.__init__``)
PREFETCH_THRESHOLD = 256
#: chain state before a sequence's first page (any fixed value)
_HASH_SEED = 0x243F6A8885A308D3


def seq_tokens(seq: KVSeq) -> np.ndarray:
    """The request's KV content as one int64 per token, shape ``(kv_len,)``.

    Token ``t`` of segment ``s`` (start ``a``) is ``seg_id[s] · 2**24 + (t − a)`` for
    trace content (``seg_id ≥ 0``), so two sequences hold the same token at a position
    exactly when radixkv's segment comparison says so (same id, same start); unique
    content (``seg_id < 0``) gets values no other request has.
    """
    return seq_tokens_kernel(np.ascontiguousarray(seq.seg_id, np.int64), np.ascontiguousarray(seq.seg_end, np.int64),
                             np.int64(seq.index), np.int64(_SEG_SHIFT))


class _Node:
    __slots__ = ("key", "parent", "children", "dev", "host", "lock", "hits", "time", "id", "hend")

    def __init__(self, key, parent, time, nid):
        self.key = key
        self.parent = parent
        self.children = {}
        self.dev = False
        self.host = False
        self.lock = 0
        self.hits = 0
        self.time = time
        self.id = nid
        self.hend = None  # L3 chain key of the node's last page (lazily)


class HiCacheRadixCache(SGLangPoolTerms, HostTierOptions, PrefixCache):
    """SGLang RadixAttention + HiCache: a device pool of ``max_total_num_tokens`` and a
    host pool behind it.

    Parameters
    ----------
    max_total_num_tokens : int
        Device pool in tokens (SGLang ``max_total_num_tokens``), a multiple of
        *page_size*.
    page_size : int
        SGLang ``--page-size``.
    write_policy : str
        SGLang ``--hicache-write-policy``: ``write_through`` (default),
        ``write_through_selective`` or ``write_back``.
    hicache_ratio : float
        SGLang ``--hicache-ratio`` (default 2.0): host pool = ratio × device pool.
    host_tokens : int or None
        Host pool in tokens before SGLang's page rounding, instead of the ratio (what
        ``--hicache-size`` GB gives at the model's KV bytes per token). 0: no host tier —
        the replay equals :class:`~radixkv.policies.radix.RadixCache` exactly.
    hicache_storage_backend : str or None
        SGLang ``--hicache-storage-backend``: ``"file"`` puts an L3 store behind the host
        pool (:meth:`_prefetch`, :meth:`_storage_write`; docs/hicache.md "L3"); None (the
        default): no L3 tier. Needs a host tier.
    storage_tokens : int or None
        L3 capacity in tokens. None (default): unbounded, as SGLang's ``file`` backend is
        unless ``max_size`` / ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE`` is set; a number
        caps it with the file backend's page LRU (``LRUFileEvictor``) — a research knob;
        0: no L3 tier (the replay equals the one without a backend exactly).
    prefetch_policy : str
        SGLang ``--hicache-storage-prefetch-policy``: ``best_effort`` (default),
        ``wait_complete`` or ``timeout``. The sequential replay finishes every prefetch
        before the request is admitted, so the three give the same hits (they differ
        only in how long a real admission waits for storage I/O).
    prefetch_threshold : int
        Minimum prefetch length and storage hit in tokens (SGLang default 256; raised
        to *page_size* when smaller).

    Attributes
    ----------
    host_capacity : int
        Host pool in tokens (0 without a host tier).
    device_hit_tokens_total, host_hit_tokens_total, loaded_tokens_total,
    written_tokens_total, host_evicted_tokens_total : int
        Tokens hit on the device, found on host by lookups, loaded host→GPU, written
        GPU→host and evicted from host since construction.
    last_host_hit, last_loaded : int
        Host hit and loaded-back tokens of the last admission.
    storage_capacity : int or None
        L3 capacity in tokens (None: unbounded; 0 without an L3 tier).
    storage_hit_tokens_total, storage_written_tokens_total, storage_evicted_tokens_total : int
        Tokens fetched L3→host by prefetches, written host→L3 (new pages only: the file
        backend skips a key it holds) and evicted from a capped L3 since construction.
    last_storage_hit : int
        Tokens the last admission's prefetch brought from L3 to host.

    Raises
    ------
    radixkv.errors.ConfigError
        On a bad size, page, ratio, write policy, storage backend or prefetch policy, or
        an L3 backend without a host tier.
    """

    name = "sglang-hicache"
    aliases = ("hicache",)
    kernel_family = None
    option_name = "hicache"
    bare_option = "write_policy"
    models_metadata = False
    #: host-tier metrics (``host_hit_tokens`` …) are measured by this class
    models_host_tier = True
    #: the concurrent replay runs it under SGLang's scheduler rules (docs/hicache.md
    #: "Concurrent replay" lists what is and is not modelled)
    sequential_only = False

    def __init__(self, max_total_num_tokens: int, page_size: int = 1, *, write_policy: str = "write_through",
                 hicache_ratio: float = 2.0, host_tokens: int | None = None,
                 hicache_storage_backend: str | None = None, storage_tokens: int | None = None,
                 prefetch_policy: str = "best_effort", prefetch_threshold: int = PREFETCH_THRESHOLD):
        total, p = self.pool_terms(max_total_num_tokens, page_size)
        if write_policy not in WRITE_POLICIES:
            raise ConfigError(f"unknown write_policy {write_policy!r}; known: {', '.join(WRITE_POLICIES)}",
                              field="write_policy")
        if not (math.isfinite(float(hicache_ratio)) and float(hicache_ratio) >= 0):
            raise ConfigError(f"hicache_ratio must be a finite number ≥ 0, got {hicache_ratio}", field="hicache_ratio")
        super().__init__(total // p, p)
        self.page_size = p
        self.max_total_num_tokens = total
        self.write_policy = write_policy
        self.hicache_ratio = float(hicache_ratio)
        self._threshold = WRITE_POLICIES[write_policy]
        self._write_back = self._threshold is None
        if host_tokens is not None:
            if int(host_tokens) < 0:
                raise ConfigError(f"host_tokens must be ≥ 0, got {host_tokens}", field="host_tokens")
            size = int(host_tokens)
        else:
            size = int(total * self.hicache_ratio)
        # pool_host/base.py: page_num = size // page_size + 1 (a host tier of 0 is off)
        self.host_capacity = 0 if size == 0 else (size // p + 1) * p
        self._hicache = self.host_capacity > 0
        self._clock = 0
        self._nid = 0
        self.root = _Node(np.zeros(0, np.int64), None, 0, 0)
        self.root.dev = True
        self.root.lock = 1
        self.free = total
        self.host_free = self.host_capacity
        self.tree_dev = 0
        self.tree_host = 0
        self.n_nodes = 0
        self._dups: dict = {}  # write_back: nodes on both tiers, in the order they became so
        self._host_locked: set = set()  # node ids host-locked during a load-back
        self._loaded_pending: list = []  # loaded nodes whose load ack is not reaped yet
        self._reqs: dict = {}
        # eviction candidates, lazily: (time, id, node) pushed whenever a node's time
        # changes or it may have become a device / host leaf; stale entries are skipped
        # at pop (the same order as a heap of the current leaves built per eviction)
        self._dev_heap: list = []
        self._host_heap: list = []
        zero_host_totals(self)
        self.last_host_hit = 0
        self.last_loaded = 0
        self._init_storage(hicache_storage_backend, storage_tokens, prefetch_policy, prefetch_threshold)

    def _init_storage(self, backend, storage_tokens, prefetch_policy, prefetch_threshold):
        """The L3 tier's state (``HybridCacheController.__init__`` storage part)."""
        if backend is not None and backend not in STORAGE_BACKENDS:
            raise ConfigError(f"unknown hicache_storage_backend {backend!r}; modelled: {', '.join(STORAGE_BACKENDS)}",
                              field="hicache_storage_backend")
        if prefetch_policy not in PREFETCH_POLICIES:
            raise ConfigError(f"unknown prefetch_policy {prefetch_policy!r}; known: {', '.join(PREFETCH_POLICIES)}",
                              field="prefetch_policy")
        if storage_tokens is not None and int(storage_tokens) < 0:
            raise ConfigError(f"storage_tokens must be ≥ 0, got {storage_tokens}", field="storage_tokens")
        if int(prefetch_threshold) < 0:
            raise ConfigError(f"prefetch_threshold must be ≥ 0, got {prefetch_threshold}",
                              field="prefetch_threshold")
        on = backend is not None and storage_tokens != 0
        if on and not self._hicache:
            raise ConfigError("an L3 storage backend (--hicache-storage-backend / @hicache_storage_backend) sits "
                              "behind the host pool, and this policy has none: give a host tier (--hicache-ratio / "
                              "@hicache_ratio > 0 or --host-cache-tokens / @host_tokens > 0)",
                              field="hicache_storage_backend")
        self.hicache_storage_backend = backend if on else None
        self.prefetch_policy = prefetch_policy
        self._storage = on
        # the concurrent replay does not model prefetch timing (the prefetch policy): an
        # L3 tier is refused there (radixkv.replay.settings.policy_from_args)
        self.sequential_only = on
        self.storage_capacity = (None if storage_tokens is None else int(storage_tokens)) if on else 0
        self.prefetch_threshold = max(int(prefetch_threshold), self.page_size)
        # the page keys held (radixkv.policies.hicache_store: arrays, LRU order when capped)
        self._store = PageStore(self.storage_capacity, self.page_size) if on else None
        # write_back: nodes demoted in the current scheduler step whose storage write is
        # in flight (host-locked until the next step's check_hicache_events reaps it)
        self._storage_locked: dict = {}  # node id -> node
        self.storage_used = 0
        self.storage_hit_tokens_total = 0
        self.storage_written_tokens_total = 0
        self.storage_evicted_tokens_total = 0
        self.last_storage_hit = 0

    # ------------------------------------------------------------------ options
    @classmethod
    def parse_option(cls, text: str) -> tuple:
        """``KEY=VALUE[,KEY=VALUE…]`` with keys ``write_policy`` (or a bare policy name),
        ``hicache_ratio``, ``host_tokens``, and for an L3 tier ``hicache_storage_backend``
        (``file``), ``storage_tokens``, ``prefetch_policy``, ``prefetch_threshold``
        (grammar: :class:`~radixkv.policies.host_tier.HostTierOptions`). E.g.
        ``sglang-hicache:1@write_back,hicache_ratio=4``. Returns sorted
        ``(keyword, value)`` pairs."""
        out: dict = {}
        for k, v in cls.option_pairs(text):
            if k == "write_policy":
                out[k] = cls.option_choice(v, WRITE_POLICIES, "write policy")
            elif k == "hicache_ratio":
                out[k] = cls.option_number(k, v, float)
            elif k in ("hicache_storage_backend", "storage_backend"):
                out["hicache_storage_backend"] = cls.option_choice(v, STORAGE_BACKENDS, "storage backend", "modelled")
            elif k == "prefetch_policy":
                out[k] = cls.option_choice(v, PREFETCH_POLICIES, "prefetch_policy")
            elif k in ("host_tokens", "storage_tokens", "prefetch_threshold"):
                out[k] = cls.option_number(k, v, lambda x: int(float(x)))
            else:
                raise ConfigError(f"policy {cls.name!r}: unknown option {k!r} (write_policy, hicache_ratio, "
                                  f"host_tokens, hicache_storage_backend, storage_tokens, prefetch_policy, "
                                  f"prefetch_threshold)", field="policy")
        return tuple(sorted(out.items()))

    # ------------------------------------------------------------------ tree helpers
    def _draw(self):
        """A fresh LRU time: the next counter draw, as RadixCache keeps it (``draw ·
        2**STAMP_SHIFT``; a match stamps the path's k-th ancestor ``− k``)."""
        self._clock += 1
        return self._clock << STAMP_SHIFT

    def _new_node(self, key, parent):
        self._nid += 1
        self.n_nodes += 1
        return _Node(key, parent, self._draw(), self._nid)

    def _touch(self, x):
        """Offer *x* to both eviction heaps at its current time (validated at pop)."""
        if x is not self.root:
            e = (x.time, x.id, x)
            heapq.heappush(self._dev_heap, e)
            if self._hicache:
                heapq.heappush(self._host_heap, e)

    def _ckey(self, arr, off):
        p = self.page_size
        return int(arr[off]) if p == 1 else arr[off:off + p].tobytes()

    def _match_len(self, key, toks, off, limit):
        """Page-aligned common prefix of *key* and ``toks[off:limit]``."""
        return lcp_at(key, toks, off, limit) // self.page_size * self.page_size

    def _split(self, child, k):
        """``_split_node``: a new upper node with ``child.key[:k]``; the lock, hit
        count and residency carry over; fresh draws for the new node, then the child."""
        up = self._new_node(child.key[:k], child.parent)
        up.lock = child.lock
        up.hits = child.hits
        up.dev, up.host = child.dev, child.host
        parent = child.parent
        parent.children[self._ckey(child.key, 0)] = up
        child.key = child.key[k:]
        child.parent = up
        up.children[self._ckey(child.key, 0)] = child
        child.time = self._draw()
        self._track(up)
        self._touch(up)
        self._touch(child)
        return up

    def _track(self, x):
        """``_update_duplicate_tracking``: register a node on both tiers (first
        registration fixes its place), drop one that is not; entries go stale lazily."""
        if x is not self.root and x.dev and x.host:
            self._dups.setdefault(x.id, x)
        else:
            self._dups.pop(x.id, None)

    def _is_dev_leaf(self, x):
        return x is not self.root and x.dev and x.lock == 0 and not any(c.dev for c in x.children.values())

    def _is_host_leaf(self, x):
        return (x is not self.root and not x.dev and x.host and x.lock == 0 and not x.children
                and x.id not in self._host_locked and x.id not in self._storage_locked)

    def _free(self, y):
        """Free node *y*'s values on both tiers (it then holds nothing)."""
        n = len(y.key)
        if y.dev:
            self.tree_dev -= n
            self.free += n
        if y.host:
            self.tree_host -= n
            self.host_free += n
        y.dev = y.host = False

    def _remove(self, x):
        """Delete leaf *x*, freeing what it holds on either tier, then each ancestor left
        with no value, no child and no lock (the tombstones)."""
        while True:
            self._free(x)  # out of the tree: its heap entries go stale
            par = x.parent
            del par.children[self._ckey(x.key, 0)]
            self.n_nodes -= 1
            self._touch(par)  # it may have become a leaf
            if par is self.root or par.children or par.dev or par.host or par.lock:
                return
            x = par

    def _lock(self, x, d):
        while x is not None:
            x.lock += d
            if x.lock == 0:
                self._touch(x)
            x = x.parent

    # ------------------------------------------------------------------ eviction
    def _leaves(self, pred):
        out, stack = [], [self.root]
        while stack:
            x = stack.pop()
            stack.extend(x.children.values())
            if pred(x):
                out.append(x)
        return out

    def _heap(self, name, pred):
        """The lazy heap *name*, rebuilt from the current leaves when stale entries
        outnumber the nodes (the pops give the same order either way)."""
        heap = getattr(self, name)
        if len(heap) > 4 * self.n_nodes + 4096:
            heap = [(x.time, x.id, x) for x in self._leaves(pred)]
            heapq.heapify(heap)
            setattr(self, name, heap)
        return heap

    def _evict_device(self, need):
        """Evict device leaves by LRU until *need* tokens are freed; returns freed."""
        if need <= 0:
            return 0
        heap = self._heap("_dev_heap", self._is_dev_leaf)
        freed = 0
        declined = []
        while freed < need and heap:
            t, _, x = heapq.heappop(heap)
            if t != x.time or not self._is_dev_leaf(x):
                continue
            n = len(x.key)
            par = x.parent
            if not x.host and self._write_back and self._hicache:
                if self._backup(x):
                    self._track(x)  # the backup's ack (finish_write_through) registers it
                    self._demote(x)
                    if self._storage:
                        # the ack starts its storage write, which host-locks the node
                        # until a later scheduler step reaps it (ongoing_backup)
                        self._storage_locked[x.id] = x
                elif self._storage and self._subtree_host_locked(x):
                    # UnifiedTreeCore.drop_subtree_no_host declines a subtree with a
                    # host-locked node: x stays on the device
                    declined.append(x)
                    continue
                else:
                    self._drop_subtree(x)
            elif x.host:
                self._demote(x)
            else:
                self._remove(x)
            freed += n
            self.evictions += 1
            if self._is_dev_leaf(par):
                heapq.heappush(heap, (par.time, par.id, par))
        for x in declined:  # still device leaves: candidates of later evictions
            heapq.heappush(heap, (x.time, x.id, x))
        self.evicted_tokens_total += freed
        return freed

    def _reap_storage_writes(self):
        """A scheduler step's ``check_hicache_events`` reaps the storage writes started
        before it (``_drain_backup`` → ``dec_host_lock_ref``): the nodes are unlocked
        and offered to the host heap again (a locked leaf popped meanwhile was skipped)."""
        if self._storage_locked:
            nodes = self._storage_locked
            self._storage_locked = {}
            for y in nodes.values():
                if y.dev or y.host:  # still in the tree
                    self._touch(y)

    def _subtree_host_locked(self, x):
        """A node below *x* whose storage write is in flight (host-locked)."""
        stack = list(x.children.values())
        while stack:
            y = stack.pop()
            if y.id in self._storage_locked:
                return True
            stack.extend(y.children.values())
        return False

    def _demote(self, x):
        n = len(x.key)
        x.dev = False
        self.tree_dev -= n
        self.free += n
        self._touch(x)  # now host-only: a host leaf candidate

    def _drop_subtree(self, x):
        """``drop_subtree_no_host``: delete *x* and everything below it."""
        stack = list(x.children.values())
        while stack:
            y = stack.pop()
            stack.extend(y.children.values())
            self._free(y)
            self.n_nodes -= 1
        self._remove(x)

    def _evict_host(self, need):
        """``evict_host``: free at least *need* host tokens; returns what was freed."""
        freed = 0
        if self._write_back:
            # _reclaim_full_host_duplicates: host copies of device nodes, in registration
            # order; pass 1 spares evictable device leaves; stale entries are swept
            swept = []
            for spare in (True, False):
                if freed >= need:
                    break
                for nid, x in list(self._dups.items()):
                    if freed >= need:
                        break
                    if not (x.dev and x.host):
                        swept.append(nid)
                        continue
                    if ((spare and self._is_dev_leaf(x)) or nid in self._host_locked or x in self._loaded_pending
                            or nid in self._storage_locked):
                        continue  # _can_reclaim_full_host_duplicate: host lock, load in flight
                    x.host = False
                    self.tree_host -= len(x.key)
                    self.host_free += len(x.key)
                    freed += len(x.key)
                    swept.append(nid)
            for nid in swept:
                self._dups.pop(nid, None)
        if freed < need:
            heap = self._heap("_host_heap", self._is_host_leaf)
            while freed < need and heap:
                t, _, x = heapq.heappop(heap)
                if t != x.time or not self._is_host_leaf(x):
                    continue
                n = len(x.key)
                par = x.parent
                self._remove(x)
                freed += n
                if self._is_host_leaf(par):
                    heapq.heappush(heap, (par.time, par.id, par))
        self.host_evicted_tokens_total += freed
        return freed

    def _backup(self, x):
        """Write node *x* to host; False when the host cannot make room."""
        n = len(x.key)
        if self.host_free < n:
            need = n - self.host_free
            if self._evict_host(need) < need:
                return False
        self.host_free -= n
        self.tree_host += n
        x.host = True
        self.written_tokens_total += n
        if self._storage:
            # _finish_write_through_ack → write_backup_storage (the write-back eviction's
            # backup is acked the same way); the sequential replay reaps acks every step
            self._storage_write(x)
        return True

    # ------------------------------------------------------------------ L3 storage
    def _hend(self, x):
        """The chain key of node *x*'s last page (the root: the seed), computed down
        from the deepest ancestor that has one (a split leaves the lower part's key)."""
        path = []
        y = x
        while y is not self.root and y.hend is None:
            path.append(y)
            y = y.parent
        h = _HASH_SEED if y is self.root else y.hend
        for z in reversed(path):
            h = int(self._page_keys(h, z.key, 0, len(z.key))[-1])
            z.hend = h
        return h

    def _page_keys(self, start, toks, off, n_tokens):
        p = self.page_size
        return chain_page_hashes(np.int64(start), toks, np.int64(off), np.int64(n_tokens // p), np.int64(p))

    def _storage_write(self, x):
        """``write_backup_storage`` → ``HiCacheFile.set`` per page of node *x*: a key the
        store holds is skipped (and made most recent when capped,
        ``LRUFileEvictor.touch``); a new one is reserved (``LRUFileEvictor.reserve``:
        over the cap, least recently used pages are unlinked until the store holds at
        most ``int(cap × 0.9) − page`` tokens; a page that still does not fit is not
        stored)."""
        keys = self._page_keys(self._hend(x.parent), x.key, 0, len(x.key))
        x.hend = int(keys[-1])
        written, evicted = self._store.write(keys)
        self.storage_used = self._store.used
        self.storage_written_tokens_total += written
        self.storage_evicted_tokens_total += evicted

    def _prefetch(self, toks, klen):
        """L3 → host prefetch of a request, synchronously (returns tokens fetched).

        SGLang 0.5.23: ``scheduler.py :: Scheduler._prefetch_kvcache`` matches the
        request (``init_next_round_input``: a stamping match) and, when the deepest
        matched node (``last_host_node``) is the root or has a host copy, calls
        ``UnifiedRadixCache.prefetch_from_storage`` with the tokens after the device +
        host match, up to ``P − 1``, page-aligned; fewer than ``prefetch_threshold``
        tokens: no prefetch. ``HiCacheController._storage_hit_query`` counts the leading
        pages the store holds (``batch_exists``); a hit under the threshold is revoked
        (``_drain_and_alloc_storage_hit``). Host room (``allocate_storage_hit``): when
        the host pool has fewer free tokens than the hit, ``evict_host(hit)`` (the
        anchor host-locked), then the whole hit or, failing that, the free tokens
        (page-aligned) if they reach the threshold, else nothing. The fetched pages are
        read (``get``: most recent in a capped store) and inserted as a host-only node
        below the anchor (``UnifiedTreeCore.insert_host``), which the admission's match
        then finds as a host hit and loads back.

        Stand-in: the real prefetch runs in controller threads and
        ``check_prefetch_progress`` decides by ``--hicache-storage-prefetch-policy``
        how long admission waits; here the query and the transfer complete before the
        request is admitted (what ``wait_complete`` gives, and ``best_effort`` /
        ``timeout`` when the I/O is done by the next scheduler step). The scheduler's
        prefetch rate limit (``prefetch_tokens_occupied`` against half the host pool)
        never binds with one request in flight.
        """
        self.last_storage_hit = 0
        dev, host, best, _ = self._match(toks, klen)
        if not (best is self.root or best.host):
            return 0  # an unbacked anchor: Scheduler._prefetch_kvcache issues nothing
        m = dev + host
        thr = self.prefetch_threshold
        if klen - m < max(thr, 1):
            return 0
        keys = self._page_keys(self._hend(best), toks, m, klen - m)
        store = self._store
        p = self.page_size
        hit = store.leading(keys) * p
        if hit < thr or hit == 0:
            return 0
        self._host_locked.add(best.id)  # prefetch_from_storage: inc_host_lock_ref(anchor)
        if self.host_free < hit:
            self._evict_host(hit)
        self._host_locked.discard(best.id)
        self._touch(best)
        n = hit if self.host_free >= hit else self.host_free - self.host_free % p
        if n < hit and n < thr:
            return 0
        if n <= 0:
            return 0
        store.touch(keys[:n // p])  # HiCacheFile.get → LRUFileEvictor.touch (capped)
        # insert_host: touch the anchor, a new host-only leaf below it
        best.time = self._draw()
        self._touch(best)
        leaf = self._new_node(toks[m:m + n].copy(), best)
        leaf.host = True
        leaf.hend = int(keys[n // p - 1])
        best.children[self._ckey(toks, m)] = leaf
        self.host_free -= n
        self.tree_host += n
        self._touch(leaf)
        self.storage_hit_tokens_total += n
        self.last_storage_hit = n
        return n

    def _backup_chain(self, x):
        chain = [x]
        a = x.parent
        while a is not None and a is not self.root and not a.host:
            chain.append(a)
            a = a.parent
        for y in reversed(chain):
            if y.host or not y.dev:
                continue
            if not self._backup(y):
                return

    def _hit_check(self, x):
        """``_inc_hit_count_and_check``: count an insert through *x*; back it up when due."""
        if not x.dev or self._write_back or not self._hicache:
            return
        x.hits += 1
        if not x.host and x.hits >= self._threshold:
            self._backup_chain(x)

    # ------------------------------------------------------------------ lookup / insert
    def _walk(self, toks, klen):
        """The read-only walk of a match of ``toks[:klen]`` through device and host nodes:
        ``(x, c, m, off, dev_len, best_dev)`` — the deepest wholly matched node *x* at
        depth *off*, the child *c* that matches only its first *m* tokens (None when the
        walk ends at a node boundary), the depth *dev_len* of the deepest wholly matched
        device node *best_dev* (a device node never sits below a host-only one)."""
        x = best_dev = self.root
        off = dev_len = 0
        while off < klen:
            c = x.children.get(self._ckey(toks, off))
            if c is None or (not c.dev and not c.host):
                break
            m = self._match_len(c.key, toks, off, klen)
            if m < len(c.key):
                return x, c, m, off, dev_len, best_dev
            off += m
            x = c
            if c.dev:
                best_dev, dev_len = c, off
        return x, None, 0, off, dev_len, best_dev

    def _match(self, toks, klen):
        """``_match_prefix_helper``: (device prefix, host tokens, best node, best device
        node); splits and stamps the path."""
        best, c, m, off, dev_len, best_dev = self._walk(toks, klen)
        if c is not None:
            best = c = self._split(c, m)
            if c.dev:
                best_dev, dev_len = c, off + m
        t = self._draw()
        k = 0
        y = best
        while y is not None:
            y.time = t - k
            self._touch(y)
            k += 1
            y = y.parent
        host = 0
        y = best
        while y is not best_dev and y is not self.root:
            if y.host:
                host += len(y.key)
            y = y.parent
        return dev_len, host, best, best_dev

    def _insert(self, r, L, prev, inserted):
        """Insert the request's first *L* tokens (page-aligned); returns the last node.

        *prev* = the request's protected prefix (its duplicates below it are its own
        tree slots), *inserted* = what it inserted before (``InsertParams.inserted_len``).
        """
        toks = r["toks"]
        x = self.root
        off = 0
        self.root.time = self._draw()
        while off < L:
            c = x.children.get(self._ckey(toks, off))
            if c is None:
                break
            c.time = self._draw()
            self._touch(c)
            m = self._match_len(c.key, toks, off, L)
            if m < len(c.key):
                c = self._split(c, m)
            if not c.dev:
                # _unevict_node_on_insert: the request's fresh KV becomes the node's value
                c.dev = True
                self.tree_dev += m
                self._track(c)
            else:
                dup = off + m - max(prev, off)
                if dup > 0:
                    self.free += dup
            if off + m > inserted:
                self._hit_check(c)
            off += m
            x = c
        if off < L:
            leaf = self._new_node(toks[off:L].copy(), x)
            leaf.dev = True
            self._touch(leaf)
            x.children[self._ckey(toks, off)] = leaf
            self.tree_dev += L - off
            if L > inserted:
                self._hit_check(leaf)
            x = leaf
        return x

    # ------------------------------------------------------------------ life cycle
    def _alloc(self, n_tokens):
        """Evict for *n_tokens* (the SGLang shortfall rule) and check they fit."""
        if self.free < n_tokens:
            self._evict_device(n_tokens - self.free)
        return self.free >= n_tokens

    def admit(self, rid, seq, n_tokens=None):
        """Lookup (device + host), load back, allocate the first *n_tokens* tokens.

        *n_tokens* (default the prompt) is the end of the first prefill chunk; more than
        the prompt is a ValueError (a re-admitted request is matched on its prompt and
        recomputes its generated tokens). The key is the prompt capped at ``P − 1``
        tokens, page-aligned (``Req.init_next_round_input``). Allocation: when fewer than
        ``end − hit (+ a page, page > 1)`` tokens are free, device leaves are evicted for
        the shortfall; then the pages up to ``end = max(n_tokens, hit)`` are taken.
        Returns None when the pool cannot make room: the load back already made stays in
        the tree (as SGLang's copy would) but no hit or load is counted.
        """
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already running")
        p = self.page_size
        P = seq.prompt_len
        n = P if n_tokens is None else int(n_tokens)
        if n > P or n < 0:
            raise ValueError(f"request {rid}: sglang-hicache admits up to the prompt ({P} tokens), asked {n}")
        toks = seq_tokens(seq)
        klen = (P - 1) // p * p
        if self._storage:
            self._reap_storage_writes()
            self._prefetch(toks, klen)  # what it brings to host is held from here on
        held = self._held(toks, min(P, seq.kv_len))
        dev, host, best, best_dev = self._match(toks, klen)
        # SGLang's admission budget refuses a request the pool cannot hold before any load
        # starts (PrefillAdder.add_one_req → prepare_load_back → init_load_back): the
        # device must give max(chunk − device hit, loaded) (+ a page, page > 1) tokens
        # from free + unlocked device tokens; a refusal changes nothing
        loadable = host if host >= max(1, LOAD_BACK_THRESHOLD) else 0
        if not self._has_room(max(n - dev, loadable) + (p if p > 1 else 0), best_dev):
            return None
        self.last_host_hit = host
        self.host_hit_tokens_total += host
        ev0 = self.evicted_tokens_total
        loaded = 0
        last = best_dev
        if host > 0:
            loaded, last = self._load_back(best, best_dev)
        self.last_loaded = loaded
        hit = dev + loaded
        end = max(n, hit)
        self._lock(last, +1)
        need = end - hit + (p if p > 1 else 0)
        if not self._alloc(need):
            self._lock(last, -1)
            self._loaded_pending = []
            self.host_hit_tokens_total -= host
            self.loaded_tokens_total -= loaded
            self.last_host_hit = self.last_loaded = 0
            return None
        self.device_hit_tokens_total += dev
        pages = -(-end // p) * p - hit
        self.free -= pages
        if self._loaded_pending:
            for y in self._loaded_pending:
                self._track(y)
            self._loaded_pending = []
        r = {"seq": seq, "toks": toks, "node": last, "owned": hit, "comp": end, "alloc": hit + pages,
             "inserted": 0, "prot": hit, "ev": self.evicted_tokens_total - ev0}
        self._reqs[rid] = r
        return Admission(hit_tokens=hit, held_tokens=held, evicted_tokens=self.evicted_tokens_total - ev0,
                         host_loaded_tokens=loaded)

    def _peek(self, seq):
        """Read-only :meth:`_match`: (device prefix, host tokens below it), tokens."""
        klen = (seq.prompt_len - 1) // self.page_size * self.page_size
        x, c, m, off, dev, _ = self._walk(seq_tokens(seq), klen)
        if c is not None:
            off += m
            if c.dev:
                dev = off
        return dev, off - dev

    def peek_hit(self, seq, n_tokens=None):
        """Hit tokens :meth:`admit` would give now, read-only: the device prefix plus the
        host tokens below it when they reach ``load_back_threshold`` (their load is
        assumed to find device room, which :meth:`admit` evicts for). The key is the
        prompt capped at ``P − 1`` tokens, page-aligned, whatever *n_tokens*."""
        dev, host = self._peek(seq)
        return dev + (host if host >= max(1, LOAD_BACK_THRESHOLD) else 0)

    def device_hit(self, seq, n_tokens=None):
        """The device-resident prefix :meth:`admit` would match now (tokens), read-only.

        SGLang's admission check and ``lpm`` order see only this prefix
        (``len(req.prefix_indices)``; ``schedule_policy.py :: PrefillAdder.add_one_req``,
        ``SchedulePolicy._compute_prefix_matches``): host-resident tokens count as tokens
        to place on the device (the load back's ``full_load_tokens``). The SGLang
        scheduler of the concurrent replay uses it instead of :meth:`peek_hit`."""
        return self._peek(seq)[0]

    def _held(self, toks, n):
        """Longest prefix of ``toks[:n]`` the tree holds on device or host, at token
        granularity (no page rounding), read-only: the whole nodes :meth:`_walk` matches,
        then the tokens the next node shares; with no node keyed by the next full page,
        the longest run any child shares (siblings differ in their first page)."""
        x, c, _, off, _, _ = self._walk(toks, n)
        if c is not None:
            return off + lcp_at(c.key, toks, off, n)
        if self.page_size > 1 and off < n:
            off += max((lcp_at(y.key, toks, off, n) for y in x.children.values()), default=0)
        return off

    def _load_back(self, best, best_dev):
        """``_load_back_transfers``: returns (tokens loaded, new last node)."""
        nodes = []
        y = best
        while not y.dev:
            nodes.append(y)
            y = y.parent
        kv = sum(len(y.key) for y in nodes)
        if kv < max(1, LOAD_BACK_THRESHOLD):
            return 0, best_dev
        self._lock(best, +1)
        # the scheduler host-locks the best match node only (PrefillAdder._lock_node →
        # full.py :: acquire_component_lock: "only the last host node needs to be protected")
        self._host_locked.add(best.id)
        ok = self._alloc(kv)
        self._host_locked.clear()
        self._lock(best, -1)
        if not ok:
            return 0, best_dev
        self.free -= kv
        for y in nodes:
            y.dev = True
            self.tree_dev += len(y.key)
        # finish_load_back registers the loaded nodes as duplicates from the anchor up,
        # at the ack — the next scheduler step, after this request's prefill allocation
        self._loaded_pending = nodes
        self.loaded_tokens_total += kv
        return kv, best

    def extend(self, rid, n_tokens):
        """Decode *n_tokens* more tokens (one step at a time: ``alloc_for_decode``)."""
        r = self._reqs[rid]
        p = self.page_size
        end = r["comp"] + int(n_tokens)
        if end > r["seq"].kv_len:
            raise ValueError(f"request {rid}: {end} tokens exceed its KV extent {r['seq'].kv_len}")
        P = r["seq"].prompt_len
        # a refusal changes nothing: check first that free + unlocked device tokens cover
        # the chunk (+ a page, page > 1) and the decode pages (the checkpoint insert that
        # may come between only adds room: its duplicate slots are freed)
        c0 = r["comp"]
        e = min(end, P)
        need = (e - c0 + (p if p > 1 else 0)) if c0 < e else 0
        d0 = max(c0, P)
        need += (-(-end // p) - (-(-d0 // p))) * p if end > d0 else 0
        if need > self.free and not self._has_room(need):  # (the common case without a call)
            return False
        if c0 < P and not self._extend_prefill(r, e):
            return False
        if end <= r["comp"]:
            return True
        if r["comp"] == P and r["inserted"] == 0:
            self._checkpoint(r)
        # SGLang's per-step rule (a decode step evicts when fewer than a page is free and
        # allocates a page at a page boundary), taken a run of steps at a time: between
        # two evictions nothing changes but the free count; a step that evicts nothing
        # finds nothing to evict at the next steps either
        pos = r["comp"]
        while pos < end:
            if self.free < p:
                self._reap_storage_writes()  # a new scheduler step
                self._evict_device(p - self.free)
            if pos % p == 0:
                if self.free < p:
                    r["comp"] = pos
                    return False
                # pages at the boundaries pos, pos + p, … allocated while each boundary
                # (and, p > 1, each step after the previous page) sees ≥ p free
                k = min(-(-(end - pos) // p), (self.free - p) // p + 1)
                self.free -= k * p
                r["alloc"] += k * p
                pos += (k - 1) * p + 1
            else:
                pos = min(end, (pos // p + 1) * p)
        r["comp"] = end
        return True

    def _extend_prefill(self, r, e):
        """A later prefill chunk up to token *e* (``alloc_for_extend``): when fewer than
        the chunk's tokens (+ a page, page > 1) are free, evict for the shortfall; then
        take its pages. False (nothing allocated) when the pool cannot make room."""
        p = self.page_size
        if not self._alloc(e - r["comp"] + (p if p > 1 else 0)):
            return False
        delta = -(-e // p) * p - r["alloc"]
        self.free -= delta
        r["alloc"] += delta
        r["comp"] = e
        return True

    def _checkpoint(self, r, L=None):
        """Insert the request's first *L* tokens (default: ``checkpoint_kv_cache`` after
        the prefill, the page-aligned prompt) and move its lock to the last node."""
        if L is None:
            L = r["seq"].prompt_len // self.page_size * self.page_size
        node = self._insert(r, L, r["prot"], r["inserted"])
        self._lock(r["node"], -1)
        self._lock(node, +1)
        r["node"] = node
        r["owned"] = max(r["owned"], L)
        r["prot"] = max(r["prot"], L)
        r["inserted"] = max(r["inserted"], L)

    def finish(self, rid):
        """``release_kv_cache``: insert the KV computed, then the prompt; free the rest."""
        r = self._reqs.pop(rid)
        p = self.page_size
        L = r["comp"] // p * p
        self._checkpoint(r, L)
        PL = r["seq"].prompt_len // p * p
        if 0 < PL < L:
            self._insert(r, PL, PL, PL)
        self.free += r["alloc"] - r["owned"]
        self._lock(r["node"], -1)

    def preempt(self, rid):
        """Free the request's private slots and unlock; insert nothing."""
        r = self._reqs.pop(rid)
        self.free += r["alloc"] - r["owned"]
        self._lock(r["node"], -1)

    def run_request(self, rid, seq):
        """Admit, decode to the KV extent, finish (SGLang's lone-request lifecycle)."""
        adm = self.admit(rid, seq)
        if adm is None:
            return None
        if seq.kv_len > seq.prompt_len:
            if not self.extend(rid, seq.kv_len - seq.prompt_len):
                self.preempt(rid)
                return None
        self.finish(rid)
        return adm

    def stats(self, detail=True):
        """The device pool now (``used``: locked tree + private; ``cached``: the rest of
        the tree's device tokens). Host tokens: :attr:`host_cached_tokens`."""
        p = self.page_size
        prot = self._locked_dev_tokens() if self._reqs else 0
        priv = sum(r["alloc"] - r["owned"] for r in self._reqs.values())
        used = (prot + priv) // p
        cached = (self.tree_dev - prot) // p
        return PoolStats(num_slots=self.num_slots, slot_tokens=p, used_slots=used, cached_slots=cached,
                         free_slots=self.num_slots - used - cached,
                         valid_tokens=self.tree_dev + sum(r["comp"] - r["owned"] for r in self._reqs.values()),
                         cached_tokens=self.tree_dev, duplicate_tokens=-1, metadata_bytes=0, largest_free_run=-1)

    def _has_room(self, need, extra=None):
        """Whether free + unlocked device tokens (locked: the running requests' paths and
        node *extra*'s) cover *need* tokens (SGLang's admission budget check)."""
        return need <= self.free or need <= self.free + self.tree_dev - self._locked_dev_tokens(extra)

    def _locked_dev_tokens(self, extra=None):
        """Device tokens on the paths locked by running requests (and by node *extra*)."""
        seen, n = set(), 0
        for x in [r["node"] for r in self._reqs.values()] + ([extra] if extra is not None else []):
            while x is not None and x is not self.root and x.id not in seen:
                seen.add(x.id)
                if x.dev:
                    n += len(x.key)
                x = x.parent
        return n

    @property
    def host_cached_tokens(self) -> int:
        """Tokens held in the host pool."""
        return self.tree_host

    def check_invariants(self):
        """Recount the tree and both pools; AssertionError on a disagreement (tests)."""
        dev = host = 0
        stack = [self.root]
        while stack:
            x = stack.pop()
            for c in x.children.values():
                assert c.parent is x and len(c.key) > 0 and len(c.key) % self.page_size == 0
                assert c.dev or c.host
                if c.dev:
                    assert x.dev, "a device node below a host-only node"
                stack.append(c)
            if x is not self.root:
                dev += len(x.key) if x.dev else 0
                host += len(x.key) if x.host else 0
        assert dev == self.tree_dev and host == self.tree_host
        assert 0 <= self.host_free and self.host_free + host == self.host_capacity
        priv = sum(r["alloc"] - r["owned"] for r in self._reqs.values())
        assert self.free >= 0 and self.free + dev + priv == self.max_total_num_tokens
