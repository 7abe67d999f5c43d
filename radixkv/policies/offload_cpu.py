"""vLLM 0.33's CPU offloading store: a pool of chunks keyed by block hash, LRU or ARC.

A model of ``vllm/v1/kv_offload/cpu/manager.py :: CPUOffloadingManager`` with its cache
policies ``cpu/policies/lru.py :: LRUCachePolicy`` and ``cpu/policies/arc.py ::
ARCCachePolicy`` — the scheduler-side bookkeeping that decides which offloaded chunks
exist, which are evicted and which stores fail. It holds no KV; a chunk is a key (the
64-bit block key of the chunk's last GPU block, :func:`radixkv.policies._hash_kernels.seq_block_keys`,
standing for vLLM's ``OffloadKey`` = block hash + group id) and a reference count:
−1 while its store is in flight, 0 idle (evictable), > 0 pinned by loads.

Used by :class:`radixkv.policies.vllm_offload.OffloadBlockHashCache`, which calls it the
way ``OffloadingConnectorScheduler`` does. Every method names the vLLM method it models.

:class:`ArrayLRUStore` is the same store for the ``lru`` policy without
``store_threshold`` on arrays, its loops compiled (:mod:`radixkv.policies._offload_kernels`);
the policy uses it whenever it applies. Both answer the range interface the policy calls
(``new_request``, ``run_length``, ``load_range``, ``unload_range``, ``store_range``,
``complete``, ``request_finished``, ``resident``): request state plus chunk-index ranges.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from radixkv.errors import ConfigError

#: cache policies of ``cpu/policies/factory.py :: CachePolicyFactory`` (built-ins)
CPU_EVICTION_POLICIES = ("lru", "arc")
#: ``cpu/spec.py :: CPUOffloadingSpec.get_manager``: ``max_tracker_size`` default
MAX_TRACKER_SIZE = 64_000


class RequestAccess:
    """What one request did to the store (``manager.py :: _RequestCacheAccess`` plus the
    LRU policy's per-request rank, ``lru.py :: _RequestRank``).

    Attributes
    ----------
    pos : dict
        key → token position of the chunk's end (``ReqContext.set_offload_key_position``:
        ``(chunk index + 1) × tokens per chunk``).
    seen : list
        Keys in the order the request first observed them (loads and stores).
    inserted, reused, store_miss : set
        Keys this request inserted, reused (loaded, or offered while ready and not
        inserted by itself), and reported as store misses (``on_store_miss``, once each).
    """

    __slots__ = ("pos", "seen", "seen_set", "inserted", "reused", "store_miss", "rank", "keyl")

    def __init__(self):
        self.pos: dict = {}
        self.seen: list = []
        self.seen_set: set = set()
        self.inserted: set = set()
        self.reused: set = set()
        self.store_miss: set = set()
        self.rank = None


#: ranks are one int: ``(r, −position)`` → ``r · 2**40 − position`` (positions < 2**40 tokens)
_M = 1 << 40


class _LRU:
    """``lru.py :: LRUCachePolicy``: logical recency as ranks, evict the smallest rank.

    A chunk's rank is ``(request rank, −position)`` when a request inserts or first
    observes it (``insert``, ``on_request_access``: one request rank, drawn when the
    request first needs it, so later positions rank before earlier ones), and a fresh
    ``(n, 0)`` for each of the request's resident keys tail first when the request
    finishes (``on_request_finished`` → ``_update_recency``): the prompt's head ends
    most recent. ``evict`` takes the n idle (ref count 0), unprotected chunks of
    smallest rank, or nothing (None).

    vLLM keeps the idle chunks in a lazily invalidated heap. Here, with the same order:
    request rank r and fresh rank n come from one counter, so ``(r, ·)`` lies between
    ``(r − 1, 0)`` and ``(r, 0)``. Keys holding a fresh rank are an insertion-ordered
    dict (a fresh rank is always the largest so far: appended), keys holding a request
    rank sit in that request's segment; eviction walks the fresh keys in order and
    slots in each segment (by descending position) before the first fresh rank above it.
    """

    def __init__(self, ref: dict):
        self.ref = ref  # key -> ref count (the manager's)
        self.rank: dict = {}  # key -> rank (int)
        self.fresh: dict = {}  # keys with a fresh rank, in rank order
        self.seg: dict = {}  # request rank r -> {key: position}
        self.next = 0

    def _req_rank(self, req: RequestAccess) -> int:
        if req.rank is None:
            self.next += 1
            req.rank = self.next
        return req.rank

    def _unlink(self, key) -> None:
        r = self.rank[key]
        if r % _M == 0:
            del self.fresh[key]
        else:
            seg = self.seg[r // _M + 1]
            del seg[key]

    def _to_seg(self, key, r: int, pos: int) -> None:
        self.seg.setdefault(r, {})[key] = pos
        self.rank[key] = r * _M - pos

    def insert(self, key, req: RequestAccess) -> None:
        self._to_seg(key, self._req_rank(req), req.pos[key])

    def on_request_access(self, keys, req: RequestAccess) -> None:
        r = self._req_rank(req)
        for key in keys:
            if key not in self.ref:
                continue
            pos = req.pos[key]
            if self.rank[key] < r * _M - pos:
                self._unlink(key)
                self._to_seg(key, r, pos)

    def on_store_miss(self, keys, req: RequestAccess) -> None:
        return  # the default touch re-ranks resident keys only; a store miss is not resident

    def on_request_finished(self, order, insertion_only, reused) -> None:
        for key in reversed(order):
            if key in self.ref:
                self._unlink(key)
                self.next += 1
                self.rank[key] = self.next * _M
                self.fresh[key] = None
        for r in [r for r, seg in self.seg.items() if not seg]:
            del self.seg[r]

    def mark_evictable(self, key) -> None:
        return  # evict() reads the ref counts

    def mark_non_evictable(self, key) -> None:
        return

    def remove(self, key) -> None:
        self._unlink(key)
        del self.rank[key]

    def _order(self):
        """Every resident key by increasing rank."""
        segs = sorted(r for r, seg in self.seg.items() if seg)
        si = 0
        rank = self.rank
        for key in self.fresh:
            n = rank[key] // _M
            while si < len(segs) and segs[si] < n:
                seg = self.seg[segs[si]]
                yield from sorted(seg, key=seg.__getitem__, reverse=True)
                si += 1
            yield key
        for r in segs[si:]:
            seg = self.seg[r]
            yield from sorted(seg, key=seg.__getitem__, reverse=True)

    def evict(self, n: int, protected: set):
        if n == 0:
            return []
        out = []
        ref = self.ref
        for key in self._order():
            if ref[key] == 0 and key not in protected:
                out.append(key)
                if len(out) == n:
                    break
        if len(out) < n:
            return None
        for key in out:
            self.remove(key)
        return out


class _ARC:
    """``arc.py :: ARCCachePolicy``: T1 (seen once) and T2 (reused) resident lists, B1/B2
    ghost lists of evicted keys, adaptive target size of T1.

    ``insert`` puts a key at T1's MRU end and drops its ghosts; a store miss on a ghost
    moves the target (B1: up by max(1, |B2|/|B1|), B2: down by max(1, |B1|/|B2|), tail
    first, ``on_store_miss``); at request end (``on_request_finished``, tail first) a
    key the request only inserted moves to the MRU end of its list, a reused key moves
    from T1 to T2 or to T2's MRU end. ``evict`` takes, per chunk, the oldest idle
    unprotected key of T1 while T1's (virtual) size ≥ int(target), else of T2, else of
    T1 (each list scanned once), moves them to B1/B2 and trims each ghost list to the
    capacity; None when not enough idle chunks.
    """

    def __init__(self, ref: dict, capacity: int):
        self.ref = ref
        self.cap = capacity
        self.target = 0.0
        self.t1: OrderedDict = OrderedDict()
        self.t2: OrderedDict = OrderedDict()
        self.b1: OrderedDict = OrderedDict()
        self.b2: OrderedDict = OrderedDict()

    def insert(self, key, req) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def on_request_access(self, keys, req) -> None:
        return  # CachePolicy.on_request_access default: nothing

    def _ghost_hit(self, key) -> None:
        if key in self.b1:
            self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.cap)
            self.b1.move_to_end(key)
        elif key in self.b2:
            self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys, req) -> None:
        for key in reversed(keys):
            self._ghost_hit(key)

    def on_request_finished(self, order, insertion_only, reused) -> None:
        for key in reversed(order):
            if key in insertion_only:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
                continue
            if key in reused:
                if key in self.t1:
                    del self.t1[key]
                    self.t2[key] = None
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def mark_evictable(self, key) -> None:
        return

    def mark_non_evictable(self, key) -> None:
        return

    def remove(self, key) -> None:
        if key in self.t1:
            del self.t1[key]
        else:
            self.t2.pop(key, None)

    def evict(self, n: int, protected: set):
        if n == 0:
            return []
        ref = self.ref

        def next_idle(it):
            for key in it:
                if ref[key] == 0 and key not in protected:
                    return key
            return None

        it1, it2 = iter(self.t1), iter(self.t2)  # nothing changes until all are chosen
        v1 = len(self.t1)
        picks = []
        for _ in range(n):
            pick = None
            if v1 >= int(self.target):
                k = next_idle(it1)
                if k is not None:
                    pick, v1 = (k, True), v1 - 1
            if pick is None:
                k = next_idle(it2)
                if k is not None:
                    pick = (k, False)
            if pick is None:
                k = next_idle(it1)
                if k is None:
                    return None
                pick, v1 = (k, True), v1 - 1
            picks.append(pick)
        out = []
        for key, from_t1 in picks:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out.append(key)
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cap):
                ghost.popitem(last=False)
        return out


class CPUOffloadStore:
    """The CPU chunk pool of ``CPUOffloadingManager``.

    Parameters
    ----------
    num_chunks : int
        Chunks in the pool (``CPUOffloadingSpec.num_chunks`` = ``cpu_bytes_to_use //``
        page-aligned chunk bytes), ≥ 1.
    eviction_policy : str
        ``lru`` (default) or ``arc`` (``kv_connector_extra_config["eviction_policy"]``).
    store_threshold : int
        A new chunk is stored only once offered this many times (``store_threshold``;
        < 2: every offer), counted in an ordered tracker of ``max_tracker_size`` keys.
    max_tracker_size : int
        ``max_tracker_size`` (default 64,000).

    Attributes
    ----------
    ref : dict
        Resident key → reference count (−1 store in flight, 0 idle, > 0 pinned).
    stored_total, evicted_total, loaded_total, failed_stores : int
        Chunks stored, evicted and loaded, and ``prepare_store`` calls that failed, since
        construction.

    Raises
    ------
    radixkv.errors.ConfigError
        On an unknown policy or a pool of no chunk.
    """

    def __init__(self, num_chunks: int, eviction_policy: str = "lru", store_threshold: int = 0,
                 max_tracker_size: int = MAX_TRACKER_SIZE):
        if int(num_chunks) < 1:
            raise ConfigError(f"the CPU offload pool needs ≥ 1 chunk, got {num_chunks}", field="host_tokens")
        if eviction_policy not in CPU_EVICTION_POLICIES:
            raise ConfigError(f"unknown CPU offload eviction_policy {eviction_policy!r}; known: "
                              f"{', '.join(CPU_EVICTION_POLICIES)}", field="eviction_policy")
        self.num_chunks = int(num_chunks)
        self.ref: dict = {}
        self.n_idle = 0  # manager._num_evictable_cache_chunks
        self.policy = _LRU(self.ref) if eviction_policy == "lru" else _ARC(self.ref, self.num_chunks)
        self.store_threshold = int(store_threshold)
        self.max_tracker_size = int(max_tracker_size)
        self.counts: OrderedDict | None = OrderedDict() if self.store_threshold >= 2 else None
        self.stored_total = self.evicted_total = self.loaded_total = self.failed_stores = 0

    # ------------------------------------------------------------------ lookups
    def is_ready(self, key) -> bool:
        """``lookup`` answers HIT: resident and its store completed."""
        r = self.ref.get(key)
        return r is not None and r >= 0

    # ------------------------------------------------------------------ request access
    def _record(self, keys, req: RequestAccess, reused=()) -> None:
        """``_record_request_cache_access``: first observations go to the policy's
        ``on_request_access``; *reused* keys not inserted by the request count as reused."""
        new = [k for k in keys if k not in req.seen_set]
        if new:
            req.seen.extend(new)
            req.seen_set.update(new)
            self.policy.on_request_access(new, req)
        req.reused.update(k for k in reused if k not in req.inserted)

    def _track_offers(self, keys) -> None:
        """``_record_accesses``: bump the offered keys already tracked (moving them to the
        young end), then add the others, dropping the oldest unprotected entries when the
        tracker is full."""
        c = self.counts
        hit = 0
        for k in keys:
            if k in c:
                c.move_to_end(k)
                c[k] += 1
                hit += 1
        free_to_drop = len(c) - hit
        for k in keys:
            if k in c:
                continue
            if len(c) >= self.max_tracker_size:
                if free_to_drop == 0:
                    continue
                c.popitem(last=False)
                free_to_drop -= 1
            c[k] = 1

    # ------------------------------------------------------------------ manager calls
    def prepare_load(self, keys, req: RequestAccess) -> None:
        """``prepare_load``: pin every key (idle → not evictable) and record the reuse."""
        for k in keys:
            r = self.ref[k]
            if r < 0:
                raise RuntimeError("prepare_load of a chunk whose store is in flight")
            if r == 0:
                self.policy.mark_non_evictable(k)
                self.n_idle -= 1
            self.ref[k] = r + 1
        self.loaded_total += len(keys)
        self._record(keys, req, reused=keys)

    def complete_load(self, keys) -> None:
        """``complete_load``: unpin; a chunk back at 0 is evictable again."""
        for k in keys:
            self.ref[k] -= 1
            if self.ref[k] == 0:
                self.n_idle += 1
                self.policy.mark_evictable(k)

    def prepare_store(self, keys: list, req: RequestAccess):
        """``prepare_store``: store the offered keys not resident (those offered at least
        ``store_threshold`` times), evicting idle chunks of the policy's choice, never one
        of the offered keys.

        Returns
        -------
        (stored, evicted) : two lists of keys, or None when the pool cannot make room
        (nothing stored or evicted; the offer was still counted and recorded).
        """
        if self.counts is not None:
            self._track_offers(keys)
        to_store, ready = [], []
        for k in keys:
            r = self.ref.get(k)
            if r is None:
                to_store.append(k)
            elif r >= 0:
                ready.append(k)
        if self.counts is not None:
            to_store = [k for k in to_store if self.counts.get(k, 0) >= self.store_threshold]
        misses = [k for k in to_store if k not in req.store_miss]
        if misses:
            self.policy.on_store_miss(misses, req)
            req.store_miss.update(misses)
        rec = set(to_store)
        rec.update(ready)
        self._record([k for k in keys if k in rec], req, reused=ready)
        if not to_store:
            return [], []
        need = len(to_store) - (self.num_chunks - len(self.ref))
        evicted = []
        if need > 0:
            if need > self.n_idle:
                self.failed_stores += 1
                return None
            evicted = self.policy.evict(need, set(keys))
            if evicted is None:
                self.failed_stores += 1
                return None
            self.n_idle -= len(evicted)
            for k in evicted:
                del self.ref[k]
        for k in to_store:
            self.ref[k] = -1
            self.policy.insert(k, req)
        req.inserted.update(to_store)
        self.stored_total += len(to_store)
        self.evicted_total += len(evicted)
        return to_store, evicted

    def complete_store(self, keys) -> None:
        """``complete_store(success=True)``: in-flight chunks become idle (evictable)."""
        for k in keys:
            if self.ref.get(k, 0) < 0:
                self.ref[k] = 0
                self.n_idle += 1
                self.policy.mark_evictable(k)

    def request_finished(self, req: RequestAccess) -> None:
        """``on_request_finished``: the request's observed keys in position order go to the
        policy once (LRU recency, ARC frequency)."""
        order = sorted(req.seen, key=req.pos.__getitem__)
        self.policy.on_request_finished(order, req.inserted - req.reused, req.reused)


# ---------------------------------------------------------------------- the range interface
# OffloadBlockHashCache talks to a store through request states and chunk-index ranges,
# so that the array store below can run each call as one compiled loop.
def _dict_new_request(self, keys, T):
    """A request state over chunk *keys* (``ReqContext``; position of chunk c = (c+1)·T)."""
    req = RequestAccess()
    req.pos = {k: (c + 1) * T for c, k in enumerate(keys)}
    req.keyl = keys
    return req


def _dict_run_length(self, keys, lo, hi, stop_pending):
    """Consecutive resident keys ``keys[lo:hi]`` from the start: (count, a counted one is
    still being stored); *stop_pending*: one being stored ends the run."""
    n = 0
    pending = False
    ref = self.ref
    for key in keys[lo:hi]:
        r = ref.get(key)
        if r is None:
            break
        if r < 0:
            if stop_pending:
                break
            pending = True
        n += 1
    return n, pending


def _dict_store_range(self, req, lo, hi):
    """``prepare_store`` of the request's chunks ``lo … hi−1``: None, or (handle for
    :meth:`complete`, chunks stored, chunks evicted)."""
    got = self.prepare_store(req.keyl[lo:hi], req)
    if got is None:
        return None
    return got[0], len(got[0]), len(got[1])


CPUOffloadStore.new_request = _dict_new_request
CPUOffloadStore.run_length = _dict_run_length
CPUOffloadStore.load_range = lambda self, req, lo, hi: self.prepare_load(req.keyl[lo:hi], req)
CPUOffloadStore.unload_range = lambda self, req, lo, hi: self.complete_load(req.keyl[lo:hi])
CPUOffloadStore.store_range = _dict_store_range
CPUOffloadStore.complete = lambda self, handle: self.complete_store(handle)
CPUOffloadStore.resident = lambda self: len(self.ref)
CPUOffloadStore.keys_array = False


class _ArrayReq:
    """A request state of :class:`ArrayLRUStore`: its chunk keys (int64), per-chunk flags
    (uint8, :mod:`radixkv.policies._offload_kernels`) and its LRU rank (``rs[0]``, 0: none)."""

    __slots__ = ("keys", "flags", "rs")

    def __init__(self, keys):
        self.keys = keys
        self.flags = np.zeros(len(keys), dtype=np.uint8)
        self.rs = np.zeros(1, dtype=np.int64)


class ArrayLRUStore:
    """:class:`CPUOffloadStore` with the ``lru`` policy and no ``store_threshold``, on
    arrays and compiled loops (:mod:`radixkv.policies._offload_kernels`): the same
    decisions, chunk for chunk (tests compare the two on the goldens and on random
    offers), at a fraction of the time and memory.

    Parameters
    ----------
    num_chunks : int
        Chunks in the pool (≥ 1).

    Attributes
    ----------
    stored_total, evicted_total, loaded_total, failed_stores : int
        As :class:`CPUOffloadStore`.

    Raises
    ------
    radixkv.errors.ConfigError
        On a pool of no chunk.
    """

    keys_array = True
    counts = None  # no offer tracker (store_threshold < 2)

    def __init__(self, num_chunks: int):
        import radixkv.policies._offload_kernels as OK

        C = int(num_chunks)
        if C < 1:
            raise ConfigError(f"the CPU offload pool needs ≥ 1 chunk, got {num_chunks}", field="host_tokens")
        self._K = OK
        self.num_chunks = C
        H = 8
        while H < 2 * C + 2:
            H *= 2
        self.ht_key = np.zeros(H, dtype=np.int64)
        self.ht_slot = np.full(H, -1, dtype=np.int32)
        self.s_key = np.zeros(C, dtype=np.int64)
        self.s_ref = np.full(C, -2, dtype=np.int32)
        self.s_maj = np.zeros(C, dtype=np.int64)
        self.s_min = np.zeros(C, dtype=np.int64)
        self.s_gen = np.zeros(C, dtype=np.int32)
        self.s_stamp = np.zeros(C, dtype=np.int64)
        self.free_slots = np.arange(C - 1, -1, -1, dtype=np.int32)  # popped from the end: slot 0 first
        hp = 2 * C + 16
        self.hp_maj = np.zeros(hp, dtype=np.int64)
        self.hp_min = np.zeros(hp, dtype=np.int64)
        self.hp_slot = np.zeros(hp, dtype=np.int32)
        self.hp_gen = np.zeros(hp, dtype=np.int32)
        self.st = np.zeros(OK.NST, dtype=np.int64)
        self.st[OK.S_NFREE] = C
        self.out = np.zeros(2 * C, dtype=np.int32)
        self._T = 1

    def _counter(i):
        def get(self):
            return int(self.st[i])

        def put(self, v):
            self.st[i] = v
        return property(get, put)

    stored_total = _counter(5)
    evicted_total = _counter(6)
    loaded_total = _counter(7)
    failed_stores = _counter(8)
    n_idle = _counter(3)

    def new_request(self, keys, T):
        """A request state over chunk *keys* (int64 array); *T* tokens per chunk."""
        self._T = int(T)
        return _ArrayReq(keys)

    def run_length(self, keys, lo, hi, stop_pending):
        n, p = self._K.lookup_run(self.ht_key, self.ht_slot, self.s_ref, keys, lo, hi, stop_pending)
        return int(n), bool(p)

    def is_ready(self, key) -> bool:
        s = self._K.find(self.ht_key, self.ht_slot, np.int64(key))
        return s >= 0 and self.s_ref[s] >= 0

    def load_range(self, req, lo, hi):
        self._K.prepare_load(self.ht_key, self.ht_slot, self.s_key, self.s_ref, self.s_maj, self.s_min, self.s_gen,
                             self.hp_maj, self.hp_min, self.hp_slot, self.hp_gen, self.st, req.keys, req.flags,
                             req.rs, self._T, lo, hi)

    def unload_range(self, req, lo, hi):
        self._K.complete_load(self.ht_key, self.ht_slot, self.s_ref, self.st, req.keys, lo, hi)

    def store_range(self, req, lo, hi):
        ok, n, ev = self._K.prepare_store(self.ht_key, self.ht_slot, self.s_key, self.s_ref, self.s_maj, self.s_min,
                                          self.s_gen, self.s_stamp, self.free_slots, self.hp_maj, self.hp_min,
                                          self.hp_slot, self.hp_gen, self.st, req.keys, req.flags, req.rs, self._T,
                                          lo, hi, self.out)
        if not ok:
            return None
        return self.out[:n].copy(), int(n), int(ev)

    def complete(self, handle):
        if len(handle):
            self._K.complete_store(self.s_ref, self.st, handle, len(handle))

    def request_finished(self, req):
        self._K.request_finished(self.ht_key, self.ht_slot, self.s_ref, self.s_maj, self.s_min, self.s_gen,
                                 self.hp_maj, self.hp_min, self.hp_slot, self.hp_gen, self.st, req.keys, req.flags)

    def resident(self) -> int:
        return int(self.num_chunks - self.st[self._K.S_NFREE])
