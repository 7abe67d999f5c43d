"""SGLang 0.5.23's unified radix tree with its auxiliary components (SWA, Mamba).

The engine behind :class:`radixkv.policies.sglang_swa.SGLangSWACache` and
:class:`radixkv.policies.sglang_mamba.SGLangMambaCache`: a pure-Python model of
``srt/mem_cache/unified_radix_cache.py :: UnifiedRadixCache`` over
``unified_cache/unified_tree_core.py :: UnifiedTreeCore`` with the components of
``unified_cache/components/`` (``full.py :: FullComponent`` always, plus
``swa.py :: SWAComponent`` or ``mamba.py :: MambaComponent``), the pools the server
builds for such models (``allocator/swa.py :: SWATokenToKVPoolAllocator`` — a
full-attention token pool and a separate sliding-window token pool; or the token pool
plus ``memory_pool.py :: HybridReqToTokenPool``'s Mamba state slots) and the
request-side rules of ``mem_cache/common.py`` / ``managers/schedule_batch.py``.

Every method names the SGLang function it mirrors; the rules are listed in the policy
modules. Slots are counted, never named: which slot id holds a token does not change
any hit. Tokens are int64 codes (:func:`token_codes`): equal codes ⇔ equal tokens.
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.trace.types import KVSeq

#: ``environ.py :: SGLANG_SWA_EVICTION_INTERVAL`` default (decode steps between the
#: out-of-window frees of a running request)
SWA_EVICTION_INTERVAL = 128
#: ``managers/schedule_policy.py :: CLIP_MAX_NEW_TOKENS`` (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``,
#: default 4096): the decode tokens an admission estimate counts at most
CLIP_MAX_NEW_TOKENS = 4096
_OFF_BITS = 24


def token_codes(seq: KVSeq) -> np.ndarray:
    """The KV extent of *seq* as int64 token codes, shape (kv_len,).

    A token at offset k of a segment with id s gets ``s · 2**24 + k``; two positions get
    equal codes iff they hold the same token (segment ids and offsets equal,
    :mod:`radixkv.trace.types`). Segments longer than 2**24 tokens are refused.
    """
    ends = seq.seg_end.astype(np.int64)
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1]
    lens = ends - starts
    if len(lens) and int(lens.max()) >= (1 << _OFF_BITS):
        raise ValueError("a segment of 2**24 tokens or more cannot be coded")
    base = np.repeat(seq.seg_id.astype(np.int64) << _OFF_BITS, lens)
    off = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(starts, lens)
    return base + off


class _Node:
    __slots__ = ("key", "children", "parent", "swa", "mamba", "lock_full", "lock_swa",
                 "lock_mamba", "swa_uuid", "last_access", "id")

    def __init__(self, nid):
        self.key = None
        self.children = {}
        self.parent = None
        self.swa = False
        self.mamba = False
        self.lock_full = 0
        self.lock_swa = 0
        self.lock_mamba = 0
        self.swa_uuid = None
        self.last_access = 0.0
        self.id = nid


class _LRU:
    """``unified_tree_core.py :: UnifiedLRUList`` (no session partition): a doubly linked
    list, head side most recent. ``prev`` points towards the head."""

    def __init__(self):
        self.head = object()
        self.tail = object()
        self.nxt = {self.head: self.tail}
        self.prv = {self.tail: self.head}

    def __contains__(self, node):
        return node in self.nxt

    def _add_after(self, a, node):
        b = self.nxt[a]
        self.nxt[a] = node
        self.nxt[node] = b
        self.prv[b] = node
        self.prv[node] = a

    def remove(self, node):
        a, b = self.prv.pop(node), self.nxt.pop(node)
        self.nxt[a] = b
        self.prv[b] = a

    def insert_mru(self, node):
        self.insert_after(self.head, node)

    def insert_after(self, prev_node, node):
        assert prev_node in self.nxt and node not in self.nxt
        self._add_after(prev_node, node)

    def reset_mru(self, node):
        self.remove(node)
        self._add_after(self.head, node)

    def reset_window(self, nodes):
        """``reset_node_and_window_ancestors_mru``: the first of *nodes* (a node, then
        its ancestors) to the head, each next one right behind the previous one."""
        prev = self.head
        for node in nodes:
            self.remove(node)
            self._add_after(prev, node)
            prev = node

    def prev_unlocked(self, node, locked):
        """``get_prev_no_lock``: the nearest more recent node whose lock is 0 (None at head)."""
        x = self.prv[node]
        while x is not self.head and locked(x):
            x = self.prv[x]
        return None if x is self.head else x

    def lru_unlocked(self, locked):
        """``get_lru_no_lock``: the least recent unlocked node."""
        return self.prev_unlocked(self.tail, locked)


class _Req:
    __slots__ = ("codes", "P", "kv", "committed", "alloc_end", "cpl", "evicted", "lock",
                 "swa_branch", "decode_idx", "holds_mamba", "hit", "full_hit")

    def __init__(self, codes, P, kv):
        self.codes = codes
        self.P = P
        self.kv = kv
        self.committed = 0      # tokens with KV (kv_committed_len)
        self.alloc_end = 0      # end of the allocated pages (positions)
        self.cpl = 0            # cache_protected_len: [0, cpl) is the tree's
        self.evicted = 0        # SWA cursor (get_evicted_seqlen(SWA))
        self.lock = None        # (anchor node, swa boundary uuid, mamba locked)
        self.swa_branch = None  # swa_branching_seqlen
        self.decode_idx = 0     # decode_batch_idx
        self.holds_mamba = False
        self.hit = 0
        self.full_hit = 0


class UnifiedTree:
    """The tree, its components and the pools (see the module docstring).

    Parameters
    ----------
    page_size : int
        Tokens per page (``--page-size``).
    full_tokens : int
        Full-attention KV token slots (``full_max_total_num_tokens``; a multiple of the page).
    swa_tokens, window : int or None
        SWA pool slots (``swa_max_total_num_tokens``) and ``sliding_window_size``; None
        for a tree without an SWA component.
    mamba_slots : int or None
        Mamba state slots (``max_mamba_cache_size``); None for a tree without a Mamba
        component.
    """

    def __init__(self, page_size, full_tokens, swa_tokens=None, window=None, mamba_slots=None,
                 swa_eviction_interval=SWA_EVICTION_INTERVAL):
        self.ps = int(page_size)
        self.has_swa = window is not None
        self.has_mamba = mamba_slots is not None
        self.W = int(window) if self.has_swa else 0
        self.full_cap = int(full_tokens)
        self.swa_cap = int(swa_tokens) if self.has_swa else 0
        self.mamba_cap = int(mamba_slots) if self.has_mamba else 0
        self.full_free = self.full_cap
        self.swa_free = self.swa_cap
        self.mamba_free = self.mamba_cap
        self.swa_interval = int(swa_eviction_interval)
        self._clock = 0.0
        self._nid = 0
        self._uuid = 0
        self.root = self._new_node()
        self.root.key = np.zeros(0, dtype=np.int64)
        self.lru_swa = _LRU()
        self.lru_mamba = _LRU()
        self.tree_full = 0
        self.tree_swa = 0
        self.tree_mamba = 0
        self.locked_full = 0    # Full tokens of nodes some lock pins
        self.nodes = 0
        # totals of what eviction freed (tracker of UnifiedRadixCache._evict)
        self.evicted_full = 0
        self.evicted_swa = 0
        self.evicted_mamba = 0

    # ------------------------------------------------------------------ primitives
    def _tick(self):
        """``components/base.py :: get_and_increase_time_counter``."""
        t = self._clock
        self._clock += 1.0
        return t

    def _new_node(self):
        """``UnifiedTreeNode.__init__``: two clock draws (last access, creation)."""
        n = _Node(self._nid)
        self._nid += 1
        n.last_access = self._tick()
        self._tick()
        return n

    def _ck(self, codes, off):
        """``RadixKey.child_key``: the first token (page 1) or the first page."""
        if self.ps == 1:
            return int(codes[off])
        return codes[off:off + self.ps].tobytes()

    def _match_len(self, key, codes, off, n, page=True):
        """``RadixKey.match``: common prefix of *key* and ``codes[off:off+n]``, rounded
        down to a page (*page* False: in tokens)."""
        m = min(len(key), n)
        neq = np.flatnonzero(key[:m] != codes[off:off + m])
        k = m if len(neq) == 0 else int(neq[0])
        return k // self.ps * self.ps if page else k

    def _is_leaf(self, node):
        """``UnifiedTreeCore._is_device_leaf`` (non-HiCache: every live node has Full)."""
        return (node is not self.root and not node.children and node.lock_full == 0
                and node.lock_swa == 0 and node.lock_mamba == 0)

    def _swa_locked(self, n):
        return n.lock_swa > 0

    def _mamba_locked(self, n):
        return n.lock_mamba > 0

    def _upward(self, node, window=float("inf")):
        """(*node* and its ancestors below the root, nearest first; their tokens). With
        *window*: only until they cover ``window`` tokens (tombstones counted), the SWA
        segment of ``SWAComponent._iter_swa_lock_nodes`` / ``refresh_lru``."""
        out, cov, root = [], 0, self.root
        while node is not root and cov < window:
            out.append(node)
            cov += len(node.key)
            node = node.parent
        return out, cov

    def _refresh_swa(self, node):
        """``SWAComponent.refresh_lru``: the nodes holding SWA KV within ``window +
        page_size`` tokens above *node* (itself included) to the head of the SWA LRU."""
        self.lru_swa.reset_window([x for x in self._upward(node, self.W + self.ps)[0] if x.swa])

    # ------------------------------------------------------------------ split
    def _split(self, child, k):
        """``UnifiedTreeCore._split_node``: a new parent holds ``child.key[:k]``; locks are
        copied to it (``redistribute_on_node_split`` of Full and SWA), the SWA boundary
        mark moves to it, a Mamba state stays on the child; the parent is placed right
        behind the child in each LRU it has data for; the child gets a fresh access time."""
        new = self._new_node()
        parent = child.parent
        ck_parent = self._ck(child.key, 0)
        new.parent = parent
        new.key = child.key[:k]
        child.key = child.key[k:]
        new.children = {self._ck(child.key, 0): child}
        child.parent = new
        new.lock_full = child.lock_full
        if self.has_swa:
            new.lock_swa = child.lock_swa
            new.swa = child.swa
            new.swa_uuid = child.swa_uuid
            child.swa_uuid = None
        parent.children[ck_parent] = new
        if new.swa:
            self.lru_swa.insert_after(child, new)
        child.last_access = self._tick()
        self.nodes += 1
        return new

    # ------------------------------------------------------------------ match
    def match(self, codes, limit):
        """``UnifiedTreeCore.match_prefix`` → (hit tokens, best node, full_kv_hit_length).

        The key is ``codes[:limit]`` rounded down to a page. The walk splits a node the
        match ends inside; a node is a valid end when every component's validator
        accepts it (``create_match_validator``: Full always; SWA: no tombstone since
        the last one and at least ``window`` tokens of live nodes after it — the count
        starts at infinity; Mamba: the node holds a state). Post-processing
        (``_match_post_processor``): SWA refreshes the best node and the ancestors
        within ``window + page_size`` tokens (``SWAComponent.refresh_lru``), Mamba the
        best node (``MambaComponent.refresh_lru``), then the best node's path is stamped
        with one clock draw, minus 1e-5 per level up.
        """
        if limit // self.ps * self.ps <= 0:
            return 0, self.root, 0
        best_len, best, full_hit = self._walk(codes, limit, True)
        if self.has_swa:
            self._refresh_swa(best)
        if self.has_mamba and best.mamba:
            self.lru_mamba.reset_mru(best)
        t = self._tick()
        x = best
        while x is not None:
            x.last_access = t
            t -= 0.00001
            x = x.parent
        return best_len, best, full_hit

    def peek(self, codes, limit):
        """The hit of :meth:`match` without its side effects (no split, no LRU or access
        time change). A match that ends inside a node would split it; the upper half
        keeps the node's SWA KV and has no Mamba state (``redistribute_on_node_split``),
        which is what the validators see here."""
        return self._walk(codes, limit, False)[0]

    def _walk(self, codes, limit, split):
        """The walk of :meth:`match` (*split* True: the node the match ends inside is
        split) or of :meth:`peek` (False: the validators see that node's upper half
        without splitting it) → (hit tokens, best node, full_kv_hit_length). The best
        node of a peek is the unsplit node when the hit ends inside it."""
        n = limit // self.ps * self.ps
        node, off = self.root, 0
        best, best_len, full_hit = self.root, 0, 0
        swa_len = float("inf")
        W = self.W
        while off < n:
            child = node.children.get(self._ck(codes, off))
            if child is None:
                break
            k = self._match_len(child.key, codes, off, n - off)
            full_hit += k
            partial = k < len(child.key)
            if partial and split:
                child = self._split(child, k)
            off += k
            ok = True
            if self.has_swa:
                if not child.swa:
                    swa_len, ok = 0, False
                else:
                    swa_len += k
                    ok = swa_len >= W
            if self.has_mamba and (partial or not child.mamba):
                ok = False
            if ok:
                best, best_len = child, off
            if partial:
                break
            node = child
        return best_len, best, full_hit

    # ------------------------------------------------------------------ locks
    def lock(self, node):
        """``UnifiedTreeCore.inc_lock_ref``: Full path lock to the root; SWA segment lock
        from *node* up until ``window`` tokens are covered (tombstones counted), the last
        node stamped with a boundary uuid (``SWAComponent.acquire_component_lock``); Mamba
        locks the node alone. Returns the receipt."""
        for x in self._upward(node)[0]:
            if x.lock_full == 0:
                self.locked_full += len(x.key)
            x.lock_full += 1
        uuid = None
        if self.has_swa:
            seg, covered = self._upward(node, self.W)
            for x in seg:
                x.lock_swa += 1
            if covered >= self.W:  # the segment's last node marks its boundary
                x = seg[-1]
                if x.swa_uuid is None:
                    self._uuid += 1
                    x.swa_uuid = self._uuid
                uuid = x.swa_uuid
        mamba = False
        if self.has_mamba and node is not self.root:
            node.lock_mamba += 1
            mamba = True
        return (node, uuid, mamba)

    def unlock(self, receipt):
        """``UnifiedTreeCore.dec_lock_ref``: Mamba, SWA (up to the uuid boundary, or to
        the root without one), then Full."""
        if receipt is None:
            return
        node, uuid, mamba = receipt
        if mamba:
            node.lock_mamba -= 1
        if self.has_swa and node is not self.root:
            x = node
            while x is not self.root:
                x.lock_swa -= 1
                assert x.lock_swa >= 0
                if uuid is not None and x.swa_uuid == uuid:
                    break
                x = x.parent
        x = node
        while x is not self.root:
            x.lock_full -= 1
            assert x.lock_full >= 0
            if x.lock_full == 0:
                self.locked_full -= len(x.key)
            x = x.parent

    # ------------------------------------------------------------------ eviction
    def _delete_leaf(self, x, tracker):
        """``evict_device_leaf`` → ``_delete_unbacked_device_leaf``: free every component
        on the leaf and remove it (its parent keeps its Full value, so the tombstone
        walk upwards stops at once)."""
        L = len(x.key)
        self.full_free += L
        self.tree_full -= L
        tracker[0] += L
        if x.swa:
            self._drop_swa(x, tracker)
        if x.mamba:
            self._drop_mamba(x, tracker)
        del x.parent.children[self._ck(x.key, 0)]
        x.parent = None
        self.nodes -= 1

    def _drop_swa(self, x, tracker):
        """Free the node's SWA KV (a leaf's deletion, or a tombstone:
        ``SWAComponent.evict_component`` on an internal node)."""
        L = len(x.key)
        self.swa_free += L
        self.tree_swa -= L
        tracker[1] += L
        self.lru_swa.remove(x)
        x.swa = False

    def _drop_mamba(self, x, tracker):
        """Free the node's Mamba state (a leaf's deletion, or a tombstone)."""
        self.mamba_free += 1
        self.tree_mamba -= 1
        tracker[2] += 1
        self.lru_mamba.remove(x)
        x.mamba = False

    def evict_for_alloc(self, full=0, swa=0, mamba=0):
        """``UnifiedRadixCache.evict_for_alloc`` with shortfalls: each component's target
        is its free size now plus its shortfall; components walk in tree order (Full,
        SWA, Mamba), each skipped when its target is already met or, when it has no
        target-driven walk, when what earlier walks freed covers its request
        (``_evict_components``).

        - Full (``FullComponent._evict_device_*``): a heap of the evictable leaves by
          last access time; pop, delete, push the parent when it became a leaf; stop
          when the target is met.
        - SWA / Mamba (``SWAComponent`` / ``MambaComponent._evict_device_next_node``): walk
          the component's LRU from the least recent unlocked node towards the most
          recent; an evictable leaf is deleted whole, an internal node loses only this
          component's data (tombstone); stop when the target is met or the freed count
          reaches the request.
        """
        tracker = [0, 0, 0]
        req = (full, swa, mamba)
        frees = (lambda: self.full_free, lambda: self.swa_free, lambda: self.mamba_free)
        targets = {ct: frees[ct]() + n for ct, n in enumerate(req) if n > 0}

        def reached(ct):
            t = targets.get(ct)
            return t is not None and frees[ct]() >= t

        comps = [0] + ([1] if self.has_swa else []) + ([2] if self.has_mamba else [])
        for ct in comps:
            rc = req[ct]
            to_target = ct == 0 and rc > 0
            if reached(ct) or (not to_target and tracker[ct] >= rc):
                continue
            if ct == 0:
                self._walk_full(reached, tracker)
            else:
                self._walk_aux(ct, rc, reached, tracker)
        self.evicted_full += tracker[0]
        self.evicted_swa += tracker[1]
        self.evicted_mamba += tracker[2]
        return tracker

    def _walk_full(self, reached, tracker):
        import heapq

        heap = [(n.last_access, n.id, n) for n in self._leaves()]
        heapq.heapify(heap)
        while heap:
            _, _, x = heapq.heappop(heap)
            if x.parent is None or not self._is_leaf(x):
                continue
            parent = x.parent
            self._delete_leaf(x, tracker)
            if reached(0):
                break
            if self._is_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))

    def _leaves(self):
        out = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif self._is_leaf(n):
                out.append(n)
        return out

    def _walk_aux(self, ct, quota, reached, tracker):
        lru, locked = (self.lru_swa, self._swa_locked) if ct == 1 else (self.lru_mamba, self._mamba_locked)
        cursor = lru.lru_unlocked(locked)
        while True:
            if cursor is not None and cursor not in lru:
                cursor = lru.lru_unlocked(locked)
            if tracker[ct] >= quota or cursor is None:
                break
            x = cursor
            cursor = lru.prev_unlocked(x, locked)
            if self._is_leaf(x):
                self._delete_leaf(x, tracker)
            else:  # a tombstone; SWA's cascades to Mamba (lower priority, ``_cascade_evict``)
                if ct == 1:
                    self._drop_swa(x, tracker)
                if x.mamba:
                    self._drop_mamba(x, tracker)
            if reached(ct):
                break

    # ------------------------------------------------------------------ insert
    def insert(self, codes, L, prev_prefix_len, window_start, swa_branch=None, mamba_value=False):
        """``UnifiedTreeCore.begin_insert`` (walk, overlap, commit, tail) of
        ``codes[:L]`` (L a multiple of the page) whose KV the request holds from
        ``prev_prefix_len`` on. Returns ``(prefix_len, target node, mamba_exist,
        swa_branch_inserted)``; pool counts are updated for the request's duplicates
        it frees and the slots the tree adopts (the caller moves the request's row).

        - Overlap (``_insert_overlap_step``): on a node past ``prev_prefix_len`` an SWA
          tombstone whose span reaches ``window_start`` (the request's SWA cursor) is
          split at it and the live part adopts the request's KV, its old Full KV freed
          (``SWAComponent.update_component_on_insert_overlap`` /
          ``_recover_from_incoming``); the request's other overlapping KV is a duplicate
          and freed (Full only below the cursor).
        - Commit: the rest becomes one new leaf (``_add_new_node``); SWA tombstones its
          part below the cursor (a split) and caps the live part at one page-aligned
          window (``_maybe_split_leaf_for_swa_lock``), publishing the live nodes oldest
          first (``commit_insert_component_data``); Mamba puts the state on the leaf, on
          an existing node without one, or reports it already there (``mamba_exist``).
        - Tail: SWA refreshes the target and its window ancestors (``refresh_lru``).
        """
        ps = self.ps
        self.root.last_access = self._tick()
        if L == 0:
            return 0, self.root, True, False
        node = self.root
        total = 0
        W = self.W
        while total < L:
            ck = self._ck(codes, total)
            child = node.children.get(ck)
            if child is None:
                break
            child.last_access = self._tick()
            k = self._match_len(child.key, codes, total, L - total)
            if k < len(child.key):
                child = self._split(child, k)
            node = child
            consumed = k
            if self.has_swa and prev_prefix_len < total + k and not node.swa:
                live = self._clip_to_window(node, total, total + k, window_start)
                if live is not None:
                    # adopt the request's KV: its old Full KV is freed (Full only)
                    self.full_free += total + k - live
                    self._publish_swa(node)
                    consumed = min(consumed, live - total)
            dup_start = max(0, prev_prefix_len - total)
            if dup_start < consumed:
                abs_start = total + dup_start
                n_dup = consumed - dup_start
                swa_gone = min(max(window_start - abs_start, 0), n_dup) if self.has_swa else n_dup
                self.full_free += n_dup
                if self.has_swa:
                    self.swa_free += n_dup - swa_gone
            total += k
        prefix_len = total
        mamba_exist = False
        branch_inserted = swa_branch is not None and L >= swa_branch
        is_new = total < L
        if is_new:
            leaf = self._new_node()
            leaf.parent = node
            leaf.key = codes[total:L].copy()
            node.children[self._ck(leaf.key, 0)] = leaf
            self.tree_full += L - total
            self.nodes += 1
            target = leaf
        else:
            target = node
        if self.has_swa and is_new and self._clip_to_window(target, prefix_len, L, window_start) is not None:
            # ``_maybe_split_leaf_for_swa_lock``: the live part capped at one page-aligned window
            tail = -(-W // ps) * ps
            if target.lock_swa == 0 and len(target.key) > tail:
                split_at = len(target.key) - tail
                if ps == 1 or (split_at % ps == 0 and len(target.key) % ps == 0):
                    self._publish_swa(self._split(target, split_at))
            self._publish_swa(target)
        if self.has_mamba:
            assert mamba_value
            if target.mamba:  # a new leaf has none
                self.lru_mamba.reset_mru(target)
                mamba_exist = True
            else:
                target.mamba = True
                self.lru_mamba.insert_mru(target)
                self.tree_mamba += 1
            if not is_new:
                target.last_access = self._tick()
        if target is not self.root and self.has_swa:
            self._refresh_swa(target)
        return prefix_len, target, mamba_exist, branch_inserted

    def _clip_to_window(self, node, start, end, window_start):
        """``_clip_to_window``: *node* holds positions ``[start, end)``; its part below the
        request's SWA cursor *window_start* is split off (the upper node, left a
        tombstone). Returns where the live part (still *node*) starts, or None when none
        of it is live (nothing split)."""
        live = max(start, window_start)
        if live >= end:
            return None
        if live > start:
            self._split(node, live - start)
        return live

    def _publish_swa(self, node):
        """``SWARebuild``: the node's SWA value from the request's live SWA slots, put at
        the head of the SWA LRU (``set_component_device_value``)."""
        node.swa = True
        self.tree_swa += len(node.key)
        self.lru_swa.insert_mru(node)

    # ------------------------------------------------------------------ capacity
    def room(self, lock_at=None):
        """What eviction could make free in each pool (full tokens, SWA tokens, Mamba
        slots): the free part plus every unlocked node's data, treating the nodes a
        lock at *lock_at* would take as locked (Full: its path; SWA: its window
        segment; Mamba: the node). O(nodes)."""
        path, seg = set(), set()
        if lock_at is not None:
            path = set(self._upward(lock_at)[0])
            if self.has_swa:
                seg = set(self._upward(lock_at, self.W)[0])
        full, swa, mamba = self.full_free, self.swa_free, self.mamba_free
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.lock_full == 0 and n not in path:
                full += len(n.key)
            if n.swa and n.lock_swa == 0 and n not in seg:
                swa += len(n.key)
            if n.mamba and n.lock_mamba == 0 and n is not lock_at:
                mamba += 1
        return full, swa, mamba

    # ------------------------------------------------------------------ request side
    def depth(self, node):
        """Tokens on the path from the root to *node*."""
        return self._upward(node)[1]

    def swa_held(self, r):
        """SWA slots the request holds: its positions in ``[max(cpl, cursor), alloc_end)``."""
        return max(0, r.alloc_end - max(r.cpl, r.evicted))

    def free_out_of_window(self, r, pre_len, interval=1):
        """``common.py :: free_swa_out_of_window_slots`` (prefix-sharing cache): free the
        request's own SWA slots from ``max(cursor, cpl)`` up to ``pre_len`` minus the
        window rounded up to a page (page-aligned down); the cursor moves there."""
        if not self.has_swa:
            return
        if pre_len - self.W < r.evicted + interval:
            return
        ev = max(r.evicted, r.cpl)
        r.evicted = ev
        ps = self.ps
        thr = pre_len - (-(-max(self.W, ps) // ps)) * ps
        new = max(ev, thr)
        if ps > 1:
            new = new // ps * ps
        if new > ev:
            self.swa_free += new - ev
            r.evicted = new

    def alloc(self, r, n_new_tokens, demand):
        """Allocate the request's positions up to ``r.committed + n_new_tokens``: evict
        for ``demand`` tokens in each pool first (``evict_to_free_tokens``), then take
        whole pages (``alloc_extend`` / ``alloc_decode``). Returns False when a pool is
        still short (the engine would raise)."""
        ps = self.ps
        end = r.committed + n_new_tokens
        new_alloc_end = -(-end // ps) * ps
        need = new_alloc_end - r.alloc_end
        fs = max(0, demand - self.full_free)
        ss = max(0, demand - self.swa_free) if self.has_swa else 0
        if fs or ss:
            self.evict_for_alloc(full=fs, swa=ss)
        if need > self.full_free or (self.has_swa and need > self.swa_free):
            return False
        self.full_free -= need
        if self.has_swa:
            self.swa_free -= need
        r.alloc_end = new_alloc_end
        r.committed = end
        return True

    def checkpoint(self, r, up_to, finished):
        """``UnifiedRadixCache.checkpoint_into_tree`` of ``codes[:up_to]``.

        SWA (``SWAComponent.prepare_for_caching_req``): the insert stops at the request's
        SWA branching point when one is pending; a running request first frees its
        out-of-window slots at ``len(key) − 1`` (``free_out_of_window_slots``). Mamba
        (no extra buffer): the state at ``up_to`` — a copy into a fresh slot while the
        request runs, the request's own slot once it finished. Then the insert, the
        row handed to the tree up to the target's depth, the lock moved to the target,
        and the component clean-up (``cleanup_after_caching_req``).
        """
        eff = up_to
        if self.has_swa and r.swa_branch is not None and r.swa_branch > r.cpl and r.swa_branch <= up_to:
            eff = r.swa_branch
        if self.has_mamba and not finished:
            self._alloc_mamba()  # the state's copy (a finished request donates its own slot)
        if not finished and self.has_swa:
            self.free_out_of_window(r, eff - 1)
        if eff <= 0:
            if self.has_mamba and finished:
                self.mamba_free += 1
                r.holds_mamba = False
            return 0
        L = eff // self.ps * self.ps
        prefix_len, target, mamba_exist, branch_ins = self.insert(
            r.codes, L, r.cpl, r.evicted, r.swa_branch if self.has_swa else None, self.has_mamba)
        # the row [cpl, depth) is the tree's now: the request no longer holds those slots
        r.cpl = max(r.cpl, self.depth(target))
        self.unlock(r.lock)
        r.lock = self.lock(target)
        if self.has_swa and branch_ins:
            r.swa_branch = None
            if not finished:
                self.free_out_of_window(r, up_to - 1)
        if mamba_exist:  # the tree holds that state already: the copy / own slot is freed
            self.mamba_free += 1
        if self.has_mamba and finished:
            r.holds_mamba = False
        return prefix_len

    def _alloc_mamba(self):
        """``MambaComponent._alloc_mamba_slot``: one slot, evicting a state when none is free."""
        if self.mamba_free < 1:
            self.evict_for_alloc(mamba=1)
        assert self.mamba_free >= 1, "Can not alloc mamba cache"
        self.mamba_free -= 1

    def release(self, r):
        """``common.py :: release_kv_cache``: the final checkpoint at the KV committed,
        then the request's remaining slots freed (Full; SWA above its cursor), the lock
        dropped, and the Mamba slot freed if the tree did not take it."""
        self.checkpoint(r, r.committed, finished=True)
        self.free_request(r)

    def free_request(self, r):
        """The request's own slots freed (Full above ``cpl``; SWA above its cursor) and
        its lock dropped (``release_kv_cache``'s tail, also without a checkpoint)."""
        self.full_free += max(0, r.alloc_end - r.cpl)
        if self.has_swa:
            self.swa_free += self.swa_held(r)
        r.alloc_end = r.cpl
        self.unlock(r.lock)
        r.lock = None


# ---------------------------------------------------------------------- policy base


class UnifiedHybridCache(PrefixCache):
    """Base of the SGLang hybrid policies: the request life cycle of SGLang's scheduler
    around :class:`UnifiedTree`, one request at a time (the harness
    ``tools/engines/sglang_hybrid_replay.py`` plays the same part with SGLang's own
    classes).

    Life of a request (``managers/schedule_batch.py``, ``mem_cache/common.py``,
    ``mem_cache/allocation.py``):

    0. every ``waiting_prefix_refresh_interval``-th admission first touches the whole
       prompt (``SchedulePolicy._touch_waiting_prefixes`` → ``touch_prefix``: the match
       walk with its splits and LRU refreshes, no cap);
    1. match the prompt capped at ``P − 1`` tokens (``Req.init_next_round_input``);
       Mamba copies the matched state into a request slot (``finalize_match_result_in_cache``);
    2. the request's own Mamba slot (``alloc_req_slots`` → ``ensure_mamba_capacity``);
    3. lock the match (``inc_lock_ref``); allocate the prompt's pages after evicting
       for ``P − hit`` tokens (page 1) or ``P − hit + page_size`` (paged) in each pool
       (``alloc_token_slots`` / ``alloc_paged_token_slots_extend``);
    4. a request that decodes checkpoints its prompt (``checkpoint_kv_cache``);
    5. each decode step: SWA out-of-window frees (``ScheduleBatch.maybe_evict_swa``),
       evict for one page (``alloc_for_decode``), allocate;
    6. finish: ``release_kv_cache`` (checkpoint at the KV committed, free the rest,
       unlock).
    """

    size_name = "page_size"
    default_size = 1
    admission_rule = "sglang"
    engine = "sglang"
    kernel_family = None
    models_duplication = False
    models_metadata = False
    models_slot_positions = False
    #: every prefill chunk is a checkpoint (SWA frees, Mamba states at chunk ends), so
    #: a chunked prefill leaves another cache than a whole one, as in SGLang
    chunked_prefill_changes_cache = True

    def __init__(self, tree: UnifiedTree, waiting_prefix_refresh_interval: int = 32,
                 chunked_prefill_size: int | None = None):
        super().__init__(tree.full_cap // tree.ps, tree.ps)
        chunk = None if chunked_prefill_size is None or int(chunked_prefill_size) <= 0 else int(chunked_prefill_size)
        if chunk is not None and chunk < tree.ps:
            # PrefillAdder._select_prefill_admission rounds the first chunk down to a
            # page: 0 tokens, AddReqResult.OTHER, the request never runs
            raise ConfigError(f"chunked_prefill_size={chunk} is smaller than page_size={tree.ps}: SGLang's "
                              "PrefillAdder cuts a first chunk of 0 tokens and never admits a longer prompt",
                              field="chunked_prefill_size")
        #: SGLang's ``--chunked-prefill-size`` for :meth:`run_request` (None: one extend)
        self.chunked_prefill_size = chunk
        self.tree = tree
        self.page_size = tree.ps
        self.max_total_num_tokens = tree.full_cap
        self.refresh_interval = int(waiting_prefix_refresh_interval)
        self._passes = 0
        self._reqs: dict[int, _Req] = {}
        self._hit_total = 0
        self._full_alone = 0
        self._nadmit = 0
        self._nfinish = 0
        self._sum_tree = [0, 0, 0]

    # ------------------------------------------------------------------ lookup helpers
    def _held(self, codes, n):
        """Token-level length of the prompt's longest prefix in the tree (no page
        rounding, no cap, no side effect)."""
        t = self.tree
        node, off = t.root, 0
        while off < n:
            child, k = None, 0
            if t.ps == 1:
                cands = [node.children[int(codes[off])]] if int(codes[off]) in node.children else []
            else:
                cands = [c for c in node.children.values() if int(c.key[0]) == int(codes[off])]
            for c in cands:  # the child sharing the most tokens (pages are keyed whole)
                kc = t._match_len(c.key, codes, off, n - off, page=False)
                if kc > k:
                    child, k = c, kc
            if child is None:
                break
            off += k
            if k < len(child.key):
                break
            node = child
        return off

    # ------------------------------------------------------------------ life cycle
    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission | None:
        """Steps 0–4 above for the prompt, or its first *n_tokens* tokens (a chunked
        prefill, continued by :meth:`extend`).

        Raises
        ------
        ValueError
            *rid* already running, or *n_tokens* other than the prompt length (chunked
            prefill and re-admission are not modelled for the hybrid caches).
        """
        return self._admit(rid, seq, n_tokens)

    def _admit(self, rid, seq, n_tokens, first_chunk=False):
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already running")
        P = seq.prompt_len
        first = P if n_tokens is None else int(n_tokens)
        if not 1 <= first <= P:
            raise ValueError(f"{self.name} admits 1 … P tokens of the prompt (n_tokens={n_tokens}, P={P}); "
                             "re-admission past the prompt is not modelled")
        if self.fits_alone(seq):
            return None
        t = self.tree
        codes = token_codes(seq)
        r = _Req(codes, P, seq.kv_len)
        held = self._held(codes, P)
        ev0 = t.evicted_full
        if self.refresh_interval > 0:
            if self._passes % self.refresh_interval == 0:
                t.match(codes, P)
            self._passes += 1
        hit, best, full_hit = t.match(codes, P - 1)
        full_alone = full_hit
        r.hit = hit
        r.cpl = hit
        r.committed = hit
        r.alloc_end = hit
        if t.has_swa:
            fa = full_hit // t.ps * t.ps
            r.swa_branch = fa if fa > hit else None
        end = self._chunk_end(hit, P, first=True) if first_chunk else max(first, hit)
        if not self._fits(r, best, end - hit, mamba_slots=1 + (end < P or seq.kv_len > P)):
            # refused (SGLang's PrefillAdder would not admit it): nothing allocated
            return None
        r.lock = t.lock(best)
        if t.has_mamba:
            # the request's Mamba slot: the copy-on-write of the matched state
            # (``MambaComponent.finalize_match_result_in_cache``; the matched node is pinned
            # while a state is evicted for it), else a fresh slot (``ensure_mamba_capacity``).
            # Done after the lock here; the lock pins the same node: the same eviction.
            t._alloc_mamba()
            r.holds_mamba = True
        if end > hit:
            self._prefill(r, end - hit)
        self._reqs[rid] = r
        self._hit_total += hit
        self._full_alone += full_alone
        self._nadmit += 1
        ev = t.evicted_full - ev0
        self.evicted_tokens_total = t.evicted_full
        return Admission(hit_tokens=hit, held_tokens=held, evicted_tokens=ev)

    def _fits(self, r, lock_at, n, mamba_slots=0):
        """Whether *n* more tokens (and, for a Mamba tree, *mamba_slots* slots) fit
        after evicting everything evictable, with the request's lock at *lock_at*."""
        t = self.tree
        ps = t.ps
        if not t.has_mamba:
            mamba_slots = 0
        need = -(-(r.committed + n) // ps) * ps - r.alloc_end
        if need <= t.full_free and (not t.has_swa or need <= t.swa_free) and mamba_slots <= t.mamba_free:
            return True
        full, swa, mamba = t.room(lock_at)
        if need > full or (t.has_swa and need > swa):
            return False
        return not t.has_mamba or mamba_slots <= mamba

    def _prefill(self, r, n):
        """One prefill chunk of *n* tokens (steps 3–4): evict, allocate, then checkpoint
        — after a middle chunk (``checkpoint_kv_cache`` at ``extend_end``) or after the
        last one when the request decodes."""
        t = self.tree
        demand = n if t.ps == 1 else n + t.ps
        if not t.alloc(r, n, demand):
            raise RuntimeError(f"{self.name}: a prefill of {n} tokens does not fit after eviction")
        if r.committed < r.P or r.kv > r.P:
            t.checkpoint(r, r.committed, finished=False)

    def extend(self, rid: int, n_tokens: int) -> bool:
        """*n_tokens* more tokens: the rest of a chunked prefill (:meth:`run_request` passes
        one ``add_chunked_req`` chunk at a time, see :meth:`_chunk_end`), then decode
        steps (step 5), one token each."""
        r = self._reqs[rid]
        t = self.tree
        n_tokens = int(n_tokens)
        if r.committed + n_tokens > r.kv:
            raise ValueError(f"request {rid}: extend past its KV extent {r.kv}")
        if not self._fits(r, r.lock[0], n_tokens, mamba_slots=1 if r.committed < r.P else 0):
            return False  # refused before anything changes
        if r.committed < r.P:
            k = min(n_tokens, r.P - r.committed)
            self._prefill(r, k)
            n_tokens -= k
        for _ in range(n_tokens):
            if t.has_swa and r.decode_idx >= 1:
                pre = r.committed
                if pre - t.W >= r.evicted + t.swa_interval:
                    t.free_out_of_window(r, pre, 1)
            if not t.alloc(r, 1, t.ps):
                return False
            r.decode_idx += 1
        self.evicted_tokens_total = t.evicted_full
        return True

    def finish(self, rid: int) -> None:
        """Step 6: ``release_kv_cache`` with the checkpoint."""
        r = self._reqs.pop(rid)
        self.tree.release(r)
        t = self.tree
        self._nfinish += 1
        self._sum_tree[0] += t.tree_full
        self._sum_tree[1] += t.tree_swa
        self._sum_tree[2] += t.tree_mamba

    def peek_hit(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """The hit :meth:`admit` would get now (the prompt capped at P − 1), with no side
        effect: SGLang's scheduler uses the same match for ``lpm`` and its budget."""
        return self.tree.peek(token_codes(seq), seq.prompt_len - 1)

    def _chunk_end(self, start: int, P: int, first: bool = False) -> int:
        """End of the prefill pass starting at *start* (SGLang's ``PrefillAdder``).

        The first pass (``add_one_req`` → ``_select_prefill_admission``) chunks when the
        un-hit prompt, rounded up to a page, exceeds ``chunked_prefill_size``; its chunk
        is ``chunked_prefill_size`` rounded down to a page and its end is rounded down
        to a page (*start*, the hit, is page-aligned). Every later pass
        (``add_chunked_req``) takes ``min(rest, chunked_prefill_size)`` as is, without
        page rounding: with a chunk size that is not a multiple of the page size the
        ends leave the page grid (each checkpoint inserts the whole pages before it).
        The memory terms of both (``SWAPrefillBudget.check_prefill``'s chunk cap,
        ``available_chunk_tokens``) are not modelled: a lone request that fits (see
        :meth:`fits_alone`) is not capped by them on the goldens (tools/engines/
        sglang_hybrid_replay.py drives the real ``PrefillAdder`` and records
        ``chunk_ends``)."""
        c, ps = self.chunked_prefill_size, self.tree.ps
        if c is None:
            return P
        if first:
            f = c // ps * ps
            return P if P - start <= f else (start + f) // ps * ps
        return min(P, start + c)

    def run_request(self, rid: int, seq: KVSeq) -> Admission | None:
        """Admit, prefill (in chunks of ``chunked_prefill_size``, each middle chunk
        checkpointed), decode to the KV extent one token per step, finish."""
        if self.chunked_prefill_size is None:
            return super().run_request(rid, seq)
        P = seq.prompt_len
        adm = self._admit(rid, seq, None, first_chunk=True)
        if adm is None:
            return None
        r = self._reqs[rid]
        while r.committed < seq.kv_len:  # the prompt's chunks, then the decode steps
            end = self._chunk_end(r.committed, P) if r.committed < P else seq.kv_len
            if not self.extend(rid, end - r.committed):
                self.finish(rid)
                return None
        self.finish(rid)
        return adm

    def preempt(self, rid: int) -> None:
        """Retraction: ``release_kv_cache(checkpoint=False)`` — the request's own slots
        freed, the lock dropped, its Mamba slot freed; nothing inserted."""
        r = self._reqs.pop(rid)
        t = self.tree
        t.free_request(r)
        if t.has_mamba and r.holds_mamba:
            t.mamba_free += 1
            r.holds_mamba = False

    def fits_alone(self, seq: KVSeq) -> int:
        """Tokens by which *seq* overflows the empty pools: its KV extent plus one page
        of headroom (the paged extend's estimate) against each token pool.

        With chunked prefill the SWA term is SGLang's own admission estimate instead
        (``mem_cache/prefill_budget.py :: estimate_swa_kv_tokens`` as
        ``SWAPrefillBudget.check_prefill`` calls it, the cached prefix 0 on empty pools):
        ``max(min(ceil_p(P), C) − W, 0) + min(ceil_p(P) + max_new, W) + page`` must stay
        below the SWA pool, ``max_new`` = the request's outputs capped at
        ``CLIP_MAX_NEW_TOKENS`` (4096). A request past it is refused here: SGLang would
        run it with chunks capped by the SWA pool (``_chunk_cap``), which is not
        modelled. Its own out-of-window SWA is freed behind each chunk, so the KV
        extent does not bound it."""
        t = self.tree
        need = -(-seq.kv_len // t.ps) * t.ps + (t.ps if t.ps > 1 else 0)
        over = max(0, need - t.full_cap)
        if t.has_swa:
            swa_need = need
            if self.chunked_prefill_size is not None:
                ext = -(-seq.prompt_len // t.ps) * t.ps
                max_new = min(seq.kv_len - seq.prompt_len + 1, CLIP_MAX_NEW_TOKENS)
                swa_need = (max(min(ext, self.chunked_prefill_size) - t.W, 0) + min(ext + max_new, t.W)
                            + t.ps + 1)  # + 1: check_prefill wants needed < remaining_swa
            over = max(over, swa_need - t.swa_cap)
        return over

    def stats(self, detail: bool = True) -> PoolStats:
        """Full-attention pool in pages: ``used`` = held by running requests, ``cached``
        = the tree's Full KV (all evictable between requests), ``free``. The SWA pool
        and the Mamba slots are reported by :meth:`group_metrics`."""
        t = self.tree
        ps = t.ps
        own = sum(r.alloc_end - r.cpl for r in self._reqs.values())
        used = (own + t.locked_full) // ps
        cached = (t.tree_full - t.locked_full) // ps
        return PoolStats(num_slots=self.num_slots, slot_tokens=ps, used_slots=used, cached_slots=cached,
                         free_slots=self.num_slots - used - cached, valid_tokens=t.tree_full + own,
                         cached_tokens=t.tree_full if detail else -1)

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens: int, page_size: int = 1, **kw):
        """Full pool of *capacity_tokens* (SGLang's ``max_total_num_tokens``)."""
        return cls(int(capacity_tokens), page_size, **kw)

    @classmethod
    def from_engine_pool(cls, pool, size, **kw):
        if pool.max_total_num_tokens is None:
            return None
        return cls(int(pool.max_total_num_tokens), cls.default_size if size is None else int(size), **kw)

    def _mean_tree(self, ct: int):
        """Mean of the tree's component *ct* (0 Full tokens, 1 SWA tokens, 2 Mamba states)
        over the moments after each request finished; None before the first."""
        return self._sum_tree[ct] / self._nfinish if self._nfinish else None

    def group_metrics(self) -> dict:
        """Per pool since construction (JSON-ready), with the names of
        :meth:`radixkv.policies.vllm_hybrid.HybridBlockHashCache.group_metrics`.

        ``groups``: the full-attention pool and the component's pool (the subclass's
        ``_aux_group``: the sliding-window pool in tokens, or the Mamba state pool in
        slots), each with its capacity, what the tree holds now and its mean over the
        moments after each request finished. ``hit_tokens`` (the hybrid's hit),
        ``full_attention_hit_tokens`` (the Full KV the same walk matched, capped at P − 1
        and page-aligned: what a full-attention model with this tree would have hit) and
        ``hybrid_loss_tokens`` (their difference)."""
        t = self.tree
        full = {"group": 0, "kind": "full_attention", "window": None, "capacity_tokens": t.full_cap,
                "cached_tokens": t.tree_full, "cached_tokens_mean": self._mean_tree(0),
                "evicted_tokens": t.evicted_full}
        return {"groups": [full, self._aux_group()], "hit_tokens": self._hit_total,
                "full_attention_hit_tokens": self._full_alone,
                "hybrid_loss_tokens": self._full_alone - self._hit_total, "admissions": self._nadmit}
