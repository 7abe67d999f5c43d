"""``RadixCache``: SGLang's RadixAttention prefix cache, exact to the engine.

A radix tree of token runs over one pool of KV slots, as SGLang 0.5.23 runs it for a
full-attention model (``srt/mem_cache/unified_radix_cache.py :: UnifiedRadixCache`` with
its tree core ``unified_cache/unified_tree_core.py :: UnifiedTreeCore``; the classic
``srt/mem_cache/radix_cache.py :: RadixCache`` and the Rust tree core give the same hits,
../shared/reference/sglang.md §0). Every rule below names its source; the golden files in
../shared/golden/sglang (real SGLang, request for request) are reproduced exactly.

Tree
----
Each node holds a run of tokens ``[start, end)`` (its depth in the tree is its first token
position) and the same number of KV slots. Runs are stored as references into the
:class:`~radixkv.trace.types.KVSeq` of the request that inserted them, so no token array is
ever built; comparisons run segment by segment in the numba kernel
:func:`~radixkv.policies._radix_kernels.common_prefix_end`. Children are keyed by their
first token (``page_size`` p = 1) or by their first page (p > 1)
(``radix_cache.py :: get_child_key`` / ``RadixKey.child_key``).

Rules (SGLang source in brackets)
---------------------------------
- **Lookup** (``Req._compute_max_prefix_len``; ``UnifiedTreeCore.match_prefix``): the key
  is the prompt capped at ``P − 1`` tokens, rounded down to a multiple of p. The walk
  compares runs; the match inside a node is rounded down to p (``RadixKey.match``). A
  match that ends inside a node **splits** it (``_split_node``): the upper half inherits
  ``lock_ref``; a lookup mutates the tree.
- **LRU time** (``components/base.py :: get_and_increase_time_counter``): a global
  counter, +1 per draw. A split gives the new upper node a fresh draw and then the
  suffix half another (``_split_node``); a new node gets a fresh draw. After a lookup the
  matched path is stamped with one draw ``c``: the deepest matched node gets ``c``, its
  parent ``c − 1e−5``, and so on up to the root (``_match_post_processor``). An insert
  touches every node it walks (fresh draw each, ``_touch_node``) before any split.
  Times are therefore all distinct and no tie-breaking rule is ever needed (the classic
  ``RadixCache`` used ``time.monotonic()``, whose ties would fall to ``heapq``'s tuple
  order; 0.5.23's default tree does not). We keep them as integers ``draw · 2**20 − k``
  (k = distance from the deepest matched node), which orders exactly like SGLang's floats
  while a path has fewer than 10**5 nodes. The per-level offsets only order a node
  against its own ancestors, which never compete in the eviction heap, so they cannot
  change a result; they are kept to mirror the engine.
- **Insert** (``_insert_walk_step`` / ``_insert_commit_step``): key rounded down to whole
  pages; the part already in the tree keeps its slots and the request's duplicates are
  freed; the rest becomes **one** new leaf.
- **What is inserted** (``common.py :: checkpoint_kv_cache``, ``release_kv_cache``):
  after each middle chunk of a chunked prefill, the prefix computed so far; after the
  prefill of a request that does not finish at once, the prompt; at finish, prompt +
  outputs up to the KV computed (``P + N − 1``), then the prompt again so that a node
  boundary sits at the prompt end; then the partial last page is freed and the lock
  released. Each insert is page-aligned down. (When the prompt was checkpointed after
  prefill the boundary already exists and the second insert only re-touches the path.)
- **lock_ref** (``inc_lock_ref`` / ``dec_lock_ref``): the request's last tree node and its
  ancestors are locked while it runs ("protected"); the lock moves to the new node at
  every checkpoint.
- **Eviction** (``components/full.py :: _evict_device_start / _evict_device_next_node``):
  the evictable leaves (unlocked, no children) by last access time; pop the oldest, free
  its **whole** run, push the parent when it becomes an evictable leaf; stop once the
  shortfall is covered (one call can free more than asked).
- **How much is evicted** (``common.py :: evict_from_tree_cache``, ``allocation.py``):
  ``shortfall = need − available`` when positive (PR #32016). Prefill:
  ``need`` = un-hit tokens of the chunk (``alloc_token_slots``), plus one page when p > 1
  (``alloc_paged_token_slots_extend``: "assume each request needs a new page").
  Decode: 1 token per step (p = 1); p tokens **every** step when p > 1
  (``alloc_paged_token_slots_decode``), so a step evicts one leaf whenever no page is
  free, even when the request's current page still has room.
- **Pool** (``allocator/token.py``, ``allocator/paged.py``): ``max_total_num_tokens``
  slots, all usable (slot 0 is an extra padding slot). p > 1: whole pages; a request's
  partial last page is private and freed when it ends.
- **Preemption** (``ScheduleBatch.release_req`` → ``release_kv_cache(req, tree,
  is_insert=False)``): the request's private slots are freed and its lock released;
  nothing new is inserted (what earlier checkpoints inserted stays cached).

Choices (SEMANTICS.md "Choices the golden replays make")
--------------------------------------------------------
- A request finishes on its output length: KV extent ``P + N − 1``.
  ``cache_last_token_on_stop=True`` models SGLang's overlap scheduler, which runs one
  more decode step for a request stopping on a stop token and caches ``P + N``; a
  :class:`KVSeq` cannot tell N = 1 from N = 0, so the extra token is added only when
  ``kv_len > P`` (N ≥ 2). The extra token continues a unique output segment; when the
  trace gives real output ids (which the KVSeq holds only up to ``P + N − 1``) it is
  modelled as unique content.
- No chunked prefill unless ``chunked_prefill_size`` is given (SGLang
  ``--chunked-prefill-size``; ≤ 0 disables, as -1 does in SGLang). A prompt whose
  remaining part exceeds the chunk size is prefilled in chunks of
  ``chunked_prefill_size // p * p`` tokens (``PrefillAdder.add_one_req``).
- A refused admission or extension (the pool cannot make room even by evicting all
  that is evictable) returns None / False and leaves the state untouched: no split, no
  LRU touch, no eviction. SGLang's scheduler would have run the lookup (and its touch)
  before deciding; a lone request that does not fit is an input error upstream.
"""
from __future__ import annotations

import heapq

import numpy as np

from radixkv.errors import ConfigError
from radixkv.policies._radix_kernels import common_prefix_end, page_span, token_key
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.trace.types import KVSeq

#: bits of an LRU time stamp below the counter draw (room for the per-level −1e-5 steps)
_STAMP_SHIFT = 20

#: estimated host bytes per tree node (SGLang's Python ``TreeNode``: object and
#: ``__dict__``, children dict, ``RadixKey`` and value-tensor headers) — an
#: order-of-magnitude estimate, not a measurement
NODE_OVERHEAD_BYTES = 1024
#: host bytes per cached token: an 8-byte token id in the node key (``array('q')``) and
#: an 8-byte int64 slot index in the node value tensor
BYTES_PER_TOKEN = 16


class _Node:
    """One radix-tree node: tokens ``[start, end)`` of the sequence ``(sid, send)``."""

    __slots__ = ("parent", "children", "by_token", "sid", "send", "start", "end", "lock_ref", "time", "key", "alive")

    def __init__(self, parent, sid, send, start, end, key, paged):
        self.parent = parent
        self.children = {}
        self.by_token = {} if paged else None  # first token -> children (p > 1, held walk)
        self.sid = sid
        self.send = send
        self.start = start
        self.end = end
        self.lock_ref = 0
        self.time = 0
        self.key = key
        self.alive = True


class _Req:
    """A running request: its content, locked node, and KV positions."""

    __slots__ = ("seq", "node", "owned", "computed", "kv_max", "evicted")

    def __init__(self, seq, node, owned, computed, kv_max):
        self.seq = seq
        self.node = node  # last tree node, locked (with its ancestors)
        self.owned = owned  # tokens [0, owned) use tree slots (page-aligned)
        self.computed = computed  # tokens [0, computed) have KV; [owned, computed) private
        self.kv_max = kv_max
        self.evicted = 0


def _with_extra_token(seq: KVSeq) -> KVSeq:
    """*seq* with one more KV token (the overlap scheduler's extra decode step)."""
    sid = seq.seg_id.copy()
    send = seq.seg_end.copy()
    if sid[-1] < 0 and (len(send) < 2 or send[-2] >= seq.prompt_len):
        send[-1] += 1  # the unique output segment grows by one token
    else:
        sid = np.append(sid, np.int64(-(2**62) - 2 * seq.index))
        send = np.append(send, np.int64(seq.kv_len + 1))
    return KVSeq(index=seq.index, prompt_len=seq.prompt_len, kv_len=seq.kv_len + 1, seg_id=sid, seg_end=send)


class RadixCache(PrefixCache):
    """SGLang RadixAttention over a ``max_total_num_tokens`` KV pool.

    Parameters
    ----------
    max_total_num_tokens : int
        Pool size in tokens (SGLang ``max_total_num_tokens`` / ``--max-total-tokens``), a
        multiple of *page_size*. All slots are usable.
    page_size : int
        SGLang ``--page-size`` p (default 1). With p > 1 the pool is counted in pages.
    chunked_prefill_size : int or None
        SGLang ``--chunked-prefill-size``; None or ≤ 0: no chunking. Must be ≥ p.
    cache_last_token_on_stop : bool
        Cache ``P + N`` instead of ``P + N − 1`` tokens (overlap scheduler, stop token);
        see the module docstring.

    Attributes
    ----------
    num_slots : int
        ``max_total_num_tokens // page_size`` (slots of ``page_size`` tokens).
    evicted_tokens_total, evictions : int
        Tokens and tree nodes evicted since construction.

    Raises
    ------
    radixkv.errors.ConfigError
        On a non-positive size, a size that is not a multiple of the page, or a chunk
        smaller than a page.
    """

    name = "radix"

    def __init__(
        self,
        max_total_num_tokens: int,
        page_size: int = 1,
        *,
        chunked_prefill_size: int | None = None,
        cache_last_token_on_stop: bool = False,
    ):
        p = int(page_size)
        if p < 1:
            raise ConfigError(f"page_size must be ≥ 1, got {page_size}", field="page_size")
        total = int(max_total_num_tokens)
        if total < p or total % p:
            raise ConfigError(
                f"max_total_num_tokens must be a positive multiple of page_size={p}, got {max_total_num_tokens}",
                field="max_total_num_tokens",
            )
        super().__init__(total // p, p)
        chunk = None if chunked_prefill_size is None or int(chunked_prefill_size) <= 0 else int(chunked_prefill_size)
        if chunk is not None and chunk < p:
            raise ConfigError(
                f"chunked_prefill_size={chunk} is smaller than page_size={p}", field="chunked_prefill_size"
            )
        self.page_size = p
        self.max_total_num_tokens = total
        self.chunked_prefill_size = chunk
        self._chunk = None if chunk is None else chunk // p * p
        self.cache_last_token_on_stop = bool(cache_last_token_on_stop)
        self._paged = p > 1
        self._root = _Node(None, None, None, 0, 0, None, self._paged)
        self._root.lock_ref = 1  # the root is never evicted (``reset``)
        self._clock = 0
        self._heap: list = []  # (time, push id, node): candidates for eviction
        self._push_id = 0
        self._n_nodes = 0
        self._free = self.num_slots  # free slots
        self._private = 0  # slots held by running requests outside the tree
        self._evictable_tok = 0  # tokens in unlocked nodes (``evictable_size_``)
        self._protected_tok = 0  # tokens in locked nodes (``protected_size_``)
        self._reqs: dict[int, _Req] = {}

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens: int, page_size: int = 1, **kwargs) -> "RadixCache":
        """A cache of ``capacity_tokens`` rounded down to a whole page, as SGLang rounds
        ``max_total_num_tokens`` (``pool_configurator.py :: calculate_pool_sizes``)."""
        p = int(page_size)
        if p < 1:
            raise ConfigError(f"page_size must be ≥ 1, got {page_size}", field="page_size")
        return cls(int(capacity_tokens) // p * p, p, **kwargs)

    # ------------------------------------------------------------------ small helpers
    def _tick(self) -> int:
        t = self._clock << _STAMP_SHIFT
        self._clock += 1
        return t

    def _key_at(self, sid, send, t):
        """Child key of the run starting at position *t* (first token or first page)."""
        if not self._paged:
            return token_key(sid, send, t)
        first, last, start = page_span(sid, send, t, self.page_size)
        if first == last:
            return (int(sid[first]), int(start))
        return (tuple(sid[first : last + 1].tolist()), tuple(send[first:last].tolist()), int(start))

    @staticmethod
    def _lcp(sid, send, node, pos, limit) -> int:
        if node.sid is sid:
            return limit
        return common_prefix_end(sid, send, node.sid, node.send, pos, limit)

    def _push_if_leaf(self, node) -> None:
        if node.lock_ref == 0 and not node.children and node.parent is not None:
            self._push_id += 1
            heapq.heappush(self._heap, (node.time, self._push_id, node))

    def _attach(self, parent, node) -> None:
        parent.children[node.key] = node
        if self._paged:
            tk = token_key(node.sid, node.send, node.start)
            parent.by_token.setdefault(tk, []).append(node)

    def _detach(self, parent, node) -> None:
        del parent.children[node.key]
        if self._paged:
            tk = token_key(node.sid, node.send, node.start)
            lst = parent.by_token[tk]
            lst.remove(node)
            if not lst:
                del parent.by_token[tk]

    # ------------------------------------------------------------------ tree operations
    def _split(self, child, at: int):
        """Split *child* at position *at* (``_split_node``); return the new upper node."""
        parent = child.parent
        upper = _Node(parent, child.sid, child.send, child.start, at, child.key, self._paged)
        upper.lock_ref = child.lock_ref
        self._detach(parent, child)
        self._attach(parent, upper)
        child.start = at
        child.key = self._key_at(child.sid, child.send, at)
        child.parent = upper
        self._attach(upper, child)
        upper.time = self._tick()  # new node: fresh draw
        child.time = self._tick()  # the suffix half is "used now"
        self._push_if_leaf(child)
        self._n_nodes += 1
        return upper

    def _match_plan(self, sid, send, K: int):
        """Read-only lookup of the first *K* tokens: (hit, full path nodes, split or None)."""
        p = self.page_size
        node = self._root
        pos = 0
        path = []
        while pos < K:
            child = node.children.get(self._key_at(sid, send, pos))
            if child is None:
                break
            m = self._lcp(sid, send, child, pos, min(child.end, K))
            if p > 1:
                m = pos + (m - pos) // p * p
            if m < child.end:
                return m, path, child
            path.append(child)
            node = child
            pos = child.end
        return pos, path, None

    def _held(self, seq: KVSeq) -> int:
        """Longest prefix of the prompt held at token granularity (no cap, no rounding)."""
        return self._token_walk(seq.seg_id, seq.seg_end, self._root, 0, seq.prompt_len)

    def _token_walk(self, sid, send, node, pos: int, limit: int) -> int:
        """Read-only token-level match of ``[pos, limit)`` below *node* (which ends at *pos*);
        returns the end of the match. With p > 1 a partial first page is found through the
        children's first-token index."""
        p = self.page_size
        while pos < limit:
            child = None
            if p == 1 or limit - pos >= p:
                child = node.children.get(self._key_at(sid, send, pos))
            if child is not None:
                m = self._lcp(sid, send, child, pos, min(child.end, limit))
                if m == child.end:
                    node = child
                    pos = m
                    continue
                return m
            if p > 1:
                best = pos
                for c in node.by_token.get(token_key(sid, send, pos), ()):
                    best = max(best, self._lcp(sid, send, c, pos, min(c.end, limit)))
                return best
            return pos
        return pos

    def _insert(self, seq: KVSeq, L: int):
        """Insert tokens ``[0, L)`` of *seq* (L page-aligned): (overlap, target node).

        ``_insert_walk_step``: touch each walked node, split on a partial overlap; then
        ``_insert_commit_step``: one new leaf for the rest.
        """
        sid, send = seq.seg_id, seq.seg_end
        p = self.page_size
        node = self._root
        pos = 0
        while pos < L:
            child = node.children.get(self._key_at(sid, send, pos))
            if child is None:
                break
            child.time = self._tick()
            m = self._lcp(sid, send, child, pos, min(child.end, L))
            if p > 1:
                m = pos + (m - pos) // p * p
            if m < child.end:
                node = self._split(child, m)
                pos = m
                break
            self._push_if_leaf(child)
            node = child
            pos = child.end
        overlap = pos
        if pos < L:
            leaf = _Node(node, sid, send, pos, L, self._key_at(sid, send, pos), self._paged)
            self._attach(node, leaf)
            leaf.time = self._tick()
            self._evictable_tok += L - pos
            self._n_nodes += 1
            self._push_if_leaf(leaf)
            node = leaf
        return overlap, node

    def _inc_lock(self, node) -> None:
        root = self._root
        while node is not root:
            if node.lock_ref == 0:
                n = node.end - node.start
                self._evictable_tok -= n
                self._protected_tok += n
            node.lock_ref += 1
            node = node.parent

    def _dec_lock(self, node) -> None:
        root = self._root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                n = node.end - node.start
                self._evictable_tok += n
                self._protected_tok -= n
                self._push_if_leaf(node)
            node = node.parent

    def _evict(self, num_tokens: int) -> int:
        """Evict whole LRU leaves until *num_tokens* tokens are freed (``RadixCache.evict``)."""
        freed = 0
        heap = self._heap
        p = self.page_size
        while freed < num_tokens and heap:
            t, _, node = heapq.heappop(heap)
            if not node.alive or node.lock_ref or node.children or node.time != t:
                continue  # stale entry
            parent = node.parent
            self._detach(parent, node)
            node.alive = False
            n = node.end - node.start
            freed += n
            self._evictable_tok -= n
            self._free += n // p
            self._n_nodes -= 1
            self.evictions += 1
            self._push_if_leaf(parent)
        self.evicted_tokens_total += freed
        return freed

    def _rebuild_heap(self) -> None:
        """Drop stale heap entries (called when they outnumber the nodes 4 to 1)."""
        live = []
        stack = [self._root]
        while stack:
            n = stack.pop()
            for c in n.children.values():
                if c.children:
                    stack.append(c)
                elif c.lock_ref == 0:
                    self._push_id += 1
                    live.append((c.time, self._push_id, c))
        heapq.heapify(live)
        self._heap = live

    def _checkpoint(self, r: _Req, L: int):
        """Insert ``[0, L)`` of the request, free its duplicates, adopt the rest."""
        overlap, target = self._insert(r.seq, L)
        if L > r.owned:
            p = self.page_size
            dup = (overlap - r.owned) // p
            self._free += dup
            self._private -= dup + (L - overlap) // p
            r.owned = L
        return target

    def _after_prefill(self, r: _Req) -> None:
        """``checkpoint_kv_cache`` after a middle chunk, or after the prefill of a request
        that goes on to decode; the lock moves to the new last node."""
        P = r.seq.prompt_len
        if r.computed > P or (r.computed == P and r.kv_max == P):
            return
        p = self.page_size
        target = self._checkpoint(r, r.computed // p * p)
        if target is not r.node:
            self._inc_lock(target)
            self._dec_lock(r.node)
            r.node = target

    def _evict_for(self, need_tokens: int) -> int:
        avail = self._free * self.page_size
        if need_tokens > avail:
            return self._evict(need_tokens - avail)
        return 0

    def _alloc(self, r: _Req, end: int) -> None:
        p = self.page_size
        slots = -(-end // p) - -(-r.computed // p)
        self._free -= slots
        self._private += slots
        r.computed = end

    # ------------------------------------------------------------------ public API
    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission | None:
        """Look up *seq*'s prompt, lock the match, evict and allocate its first chunk.

        Parameters
        ----------
        rid : int
            Request handle, unique among running requests.
        seq : KVSeq
            The request's KV content.
        n_tokens : int or None
            Tokens with KV after admission (hit + computed), ≤ P. Default: the prompt, or
            its first chunk under ``chunked_prefill_size``.

        Returns
        -------
        Admission or None
            ``hit_tokens`` (page-aligned, ≤ ``(P − 1)`` rounded down to p),
            ``held_tokens`` (token-level match of the whole prompt before admission) and
            the tokens evicted by this admission; None, state unchanged, when even evicting
            everything evictable cannot make room.

        Raises
        ------
        ValueError
            When *rid* is already running or *n_tokens* exceeds the prompt.
        """
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already running")
        P = seq.prompt_len
        p = self.page_size
        sid, send = seq.seg_id, seq.seg_end
        held = self._held(seq)
        K = (P - 1) // p * p  # ``_compute_max_prefix_len`` then ``page_aligned``
        hit, path, split = self._match_plan(sid, send, K)
        if n_tokens is None:
            target = P
            if self._chunk is not None and P - hit > self._chunk:
                target = hit + self._chunk
        else:
            target = int(n_tokens)
            if target > P:
                raise ValueError(f"n_tokens={target} exceeds the prompt ({P} tokens)")
            target = max(target, hit)
        new_slots = -(-target // p) - hit // p
        gain = sum(n.end - n.start for n in path if n.lock_ref == 0)
        if split is not None and split.lock_ref == 0:
            gain += hit - split.start
        if new_slots > self._free + (self._evictable_tok - gain) // p:
            return None
        # the lookup's side effects: split, then stamp the matched path
        if split is not None:
            last = self._split(split, hit)
        else:
            last = path[-1] if path else self._root
        if K > 0:
            cur = self._tick()
            n = last
            k = 0
            while n is not self._root:
                n.time = cur - k
                k += 1
                n = n.parent
            self._push_if_leaf(last)
        self._inc_lock(last)
        extra = p if p > 1 else 0
        ev = self._evict_for(target - hit + extra)
        kv_max = seq.kv_len
        if self.cache_last_token_on_stop and seq.kv_len > P:
            seq = _with_extra_token(seq)
            kv_max = seq.kv_len
        r = _Req(seq, last, hit, hit, kv_max)
        self._alloc(r, target)
        r.evicted = ev
        self._reqs[rid] = r
        self._after_prefill(r)
        return Admission(hit_tokens=hit, held_tokens=held, evicted_tokens=ev)

    def peek_hit(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Hit tokens :meth:`admit` would get now, with no side effect (no split, no LRU touch).

        The same lookup as :meth:`admit` (key: the prompt capped at ``P − 1`` tokens,
        rounded down to *page_size*; the match inside a node rounded down to pages), run
        read-only. It is what SGLang's ``--schedule-policy lpm`` sorts the waiting queue
        by (``schedule_policy.py :: SchedulePolicy._compute_prefix_matches``) and what
        the ``PrefillAdder`` budget subtracts.

        Parameters
        ----------
        seq : KVSeq
            The request's KV content.
        n_tokens : int or None
            As in :meth:`admit`; the lookup key does not depend on it (≤ P).

        Returns
        -------
        int
            Tokens (page-aligned). An :meth:`admit` may still refuse the request (None)
            when the pool cannot make room.
        """
        p = self.page_size
        K = (seq.prompt_len - 1) // p * p
        return int(self._match_plan(seq.seg_id, seq.seg_end, K)[0])

    def extend(self, rid: int, n_tokens: int) -> bool:
        """Compute *n_tokens* more tokens: the rest of the prompt (in chunks), then decode.

        Returns False, state unchanged, when the new slots exceed free + evictable.
        Duplicates freed by a checkpoint in the middle are not counted in that check.

        Raises
        ------
        ValueError
            When the request would pass its KV extent.
        """
        r = self._reqs[rid]
        p = self.page_size
        end = r.computed + int(n_tokens)
        if end > r.kv_max:
            raise ValueError(f"request {rid}: {end} tokens exceed its KV extent {r.kv_max}")
        need = -(-end // p) - -(-r.computed // p)
        if need > self._free + self._evictable_tok // p:
            return False
        P = r.seq.prompt_len
        extra = p if p > 1 else 0
        while r.computed < P and r.computed < end:
            step = min(end, P) - r.computed
            if self._chunk is not None and step > self._chunk:
                step = self._chunk
            r.evicted += self._evict_for(step + extra)
            self._alloc(r, r.computed + step)
            self._after_prefill(r)
        if r.computed < end:
            self._decode(r, end)
        return True

    def _decode(self, r: _Req, end: int) -> None:
        """Decode steps up to position *end*, one slot (p = 1) or page (p > 1) at a time.

        Per step (``alloc_for_decode``): if no slot/page is free, evict for ``p`` tokens
        (one leaf); then take a new page when the position starts one. Runs in
        O(evictions), jumping over steps that change nothing.
        """
        p = self.page_size
        q = r.computed
        while q < end:
            if self._free == 0:
                r.evicted += self._evict(p)
            first_b = -(-q // p) * p  # first position in [q, end) that starts a page
            nb = 0 if first_b >= end else (end - 1 - first_b) // p + 1
            if nb < self._free or nb == 0:
                self._free -= nb
                self._private += nb
                q = end
            else:
                F = self._free
                if F == 0:  # excluded by the check in ``extend``
                    raise RuntimeError("decode needs a page but none is free or evictable")
                self._free = 0
                self._private += F
                q = first_b + (F - 1) * p + 1
        r.computed = end

    def finish(self, rid: int) -> None:
        """``release_kv_cache``: insert the KV computed, then the prompt; free the rest; unlock."""
        r = self._reqs.pop(rid)
        p = self.page_size
        self._checkpoint(r, r.computed // p * p)
        self._insert(r.seq, min(r.seq.prompt_len, r.computed) // p * p)
        self._release(r)

    def preempt(self, rid: int) -> None:
        """Retraction (``release_kv_cache(..., is_insert=False)``): free, unlock, insert nothing."""
        self._release(self._reqs.pop(rid))

    def _release(self, r: _Req) -> None:
        p = self.page_size
        slots = -(-r.computed // p) - r.owned // p
        self._free += slots
        self._private -= slots
        self._dec_lock(r.node)
        if len(self._heap) > 4 * self._n_nodes + 1024:
            self._rebuild_heap()

    def fits_alone(self, seq: KVSeq) -> int:
        """Tokens by which *seq* overflows the empty pool (0 when it fits); counts the
        extra token of ``cache_last_token_on_stop``. A request that fits alone is always
        admitted by a sequential replay: everything else in the tree is evictable."""
        kv = seq.kv_len + (1 if self.cache_last_token_on_stop and seq.kv_len > seq.prompt_len else 0)
        p = self.page_size
        return max(0, -(-kv // p) - self.num_slots) * p

    def run_request(self, rid: int, seq: KVSeq) -> Admission | None:
        """Admit, prefill the rest of the prompt, decode to the KV extent, finish."""
        adm = self.admit(rid, seq)
        if adm is None:
            return None
        r = self._reqs[rid]
        if r.computed < r.kv_max and not self.extend(rid, r.kv_max - r.computed):
            self.finish(rid)
            return None
        self.finish(rid)
        return adm

    # ------------------------------------------------------------------ inspection
    @property
    def evictable_size(self) -> int:
        """Tokens in unlocked tree nodes (SGLang ``evictable_size_``)."""
        return self._evictable_tok

    @property
    def protected_size(self) -> int:
        """Tokens in locked tree nodes (SGLang ``protected_size_``)."""
        return self._protected_tok

    @property
    def num_nodes(self) -> int:
        """Tree nodes, root excluded."""
        return self._n_nodes

    def stats(self, detail: bool = True) -> PoolStats:
        """The pool now.

        ``used`` = locked tree slots + running requests' private slots; ``cached`` =
        unlocked tree slots; ``cached_tokens`` = tokens in the tree; ``valid_tokens`` adds
        the requests' private tokens. ``duplicate_tokens``: private tokens of running
        requests that the tree also holds (SGLang frees duplicates at each insert, so they
        live only inside running requests; e.g. the last prompt token of an exact repeat,
        or a prefix two running requests computed at once) — a walk per running request.
        ``metadata_bytes`` = nodes × ``NODE_OVERHEAD_BYTES`` + tree tokens ×
        ``BYTES_PER_TOKEN`` (an estimate). ``largest_free_run`` is −1 (slot positions are
        not modelled).
        """
        p = self.page_size
        tree_tok = self._evictable_tok + self._protected_tok
        private_tok = sum(r.computed - r.owned for r in self._reqs.values())
        used = self._private + self._protected_tok // p
        cached = self._evictable_tok // p
        return PoolStats(
            num_slots=self.num_slots,
            slot_tokens=self.slot_tokens,
            used_slots=used,
            cached_slots=cached,
            free_slots=self.num_slots - used - cached,
            valid_tokens=tree_tok + private_tok,
            cached_tokens=tree_tok,
            duplicate_tokens=sum(
                self._token_walk(r.seq.seg_id, r.seq.seg_end, r.node, r.owned, r.computed) - r.owned
                for r in self._reqs.values()
            ) if detail else -1,
            metadata_bytes=self._n_nodes * NODE_OVERHEAD_BYTES + tree_tok * BYTES_PER_TOKEN,
            largest_free_run=-1,
        )

    def check_invariants(self) -> None:
        """Recount the tree and the pool; raise AssertionError on any disagreement (tests)."""
        p = self.page_size
        ev = pr = nodes = 0
        stack = [self._root]
        while stack:
            n = stack.pop()
            for key, c in n.children.items():
                assert c.parent is n and c.alive and c.key == key
                assert c.start == n.end and c.end > c.start
                assert c.start % p == 0 and c.end % p == 0
                nodes += 1
                if c.lock_ref:
                    pr += c.end - c.start
                else:
                    ev += c.end - c.start
                stack.append(c)
        assert (ev, pr, nodes) == (self._evictable_tok, self._protected_tok, self._n_nodes)
        private = sum(-(-r.computed // p) - r.owned // p for r in self._reqs.values())
        assert private == self._private
        assert self._free >= 0
        assert self._free + self._private + (ev + pr) // p == self.num_slots
