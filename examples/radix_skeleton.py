"""A radix-tree prefix cache to start a new policy from: SGLang's shape, in plain Python.

It passes the conformance kit as it is (``tests/test_policy_skeletons.py`` runs
``radixkv.check_policy`` on it) and replays from the command line::

    PYTHONPATH=examples radixkv replay traces/demo.jsonl \\
        --policy radix_skeleton:SkeletonRadix --capacity-tokens 20000

The contract it keeps is docs/policy-contract.md. What it models, after SGLang's
RadixAttention (``python/sglang/srt/mem_cache/radix_cache.py :: RadixCache``; the exact
model is :class:`radixkv.policies.radix.RadixCache`):

- a pool of ``num_slots`` token slots (page size 1); finished requests' KV lives in a
  radix tree whose edges are runs of tokens (a node is split where two prompts diverge);
- a lookup matches the prompt down the tree and keeps at most ``L − 1`` tokens (the last
  token is recomputed);
- a running request locks the nodes of its hit (``lock_ref``): locked nodes are never
  evicted; its own new tokens are private until it finishes, when they are inserted
  (tokens another request inserted meanwhile are freed as duplicates);
- eviction frees whole unlocked leaves, least recently used first.

**Where to change the eviction order**: :meth:`SkeletonRadix._victim` (which evictable leaf
goes next). Keep the contract: a locked node, or one with children, is never evicted.
"""
from __future__ import annotations

import itertools

from radixkv import Admission, PoolStats, PrefixCache
from radixkv.policies.toolkit import admit_length, expand_tokens


class _Node:
    __slots__ = ("key", "parent", "children", "lock", "last_access")

    def __init__(self, key: tuple, parent):
        self.key = key                # the run of tokens on the edge into this node
        self.parent = parent
        self.children = {}            # first token of a child's run -> child
        self.lock = 0                 # running requests whose hit passes through this node
        self.last_access = 0


class SkeletonRadix(PrefixCache):
    """RadixAttention with LRU eviction of whole leaves (SGLang's rules at page size 1).

    Parameters
    ----------
    num_slots : int
        Token slots in the pool.
    page_size : int
        Must be 1 (a page size > 1 rounds hits and tree runs to whole pages; see
        :class:`radixkv.policies.radix.RadixCache`).
    """

    name = "skeleton-radix"
    size_name = "page_size"
    default_size = 1
    admission_rule = "sglang"      # concurrent replay: SGLang's PrefillAdder budget
    engine = "sglang"              # pool sized by SGLang's memory rule / --max-total-num-tokens

    def __init__(self, num_slots: int, page_size: int = 1):
        if int(page_size) != 1:
            raise ValueError("SkeletonRadix models page size 1 only")
        super().__init__(num_slots, 1)
        self.root = _Node((), None)
        self.clock = itertools.count(1)
        self.tree_tokens = 0          # tokens in the tree (locked or not)
        self.locked_tokens = 0        # tokens in locked nodes
        self.running = {}             # rid -> {"toks", "node" (end of its hit), "hit", "tokens"}

    # ------------------------------------------------------------ the tree
    def _match(self, toks) -> tuple[int, list]:
        """Tokens of *toks* the tree holds from the start, and the nodes passed (a node
        matched partly is the last)."""
        node, t, path = self.root, 0, []
        while t < len(toks) and toks[t] in node.children:
            child = node.children[toks[t]]
            k = 0
            while k < len(child.key) and t + k < len(toks) and child.key[k] == toks[t + k]:
                k += 1
            path.append(child)
            t += k
            if k < len(child.key):
                break
            node = child
        return t, path

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut *node*'s run after *k* tokens; returns the new upper node."""
        upper = _Node(node.key[:k], node.parent)
        upper.lock, upper.last_access = node.lock, node.last_access
        upper.children[node.key[k]] = node
        node.parent.children[node.key[0]] = upper
        node.key, node.parent = node.key[k:], upper
        return upper

    def _node_at(self, toks, n: int) -> _Node:
        """The node whose run ends exactly at token *n* of *toks* (splitting a run that
        *n* falls inside; the root for n = 0). The tree must hold ``toks[:n]``."""
        t, path = self._match(toks[:n])
        assert t == n
        if not path:
            return self.root
        over = sum(len(x.key) for x in path) - n
        return self._split(path[-1], len(path[-1].key) - over) if over else path[-1]

    def _lock(self, node: _Node, d: int) -> None:
        """Add *d* to ``lock`` of *node* and every node above it (SGLang ``inc_lock_ref`` /
        ``dec_lock_ref``); a split later copies the lock to the new upper node."""
        while node is not self.root:
            if node.lock == 0:
                self.locked_tokens += len(node.key)
            node.lock += d
            if node.lock == 0:
                self.locked_tokens -= len(node.key)
            node = node.parent

    def _victim(self):
        """The next node to evict: the least recently used unlocked leaf (None: none)."""
        leaves = [x for x in self._nodes() if not x.children and x.lock == 0]
        return min(leaves, key=lambda x: x.last_access, default=None)

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            yield x
            stack.extend(x.children.values())

    def _private_tokens(self) -> int:
        return sum(r["tokens"] - r["hit"] for r in self.running.values())

    def _room(self, need: int) -> bool:
        """Evict until *need* slots are free; False (nothing evicted) when it cannot."""
        free = self.num_slots - self.tree_tokens - self._private_tokens()
        if free + self.tree_tokens - self.locked_tokens < need:
            return False
        while free < need:
            x = self._victim()
            del x.parent.children[x.key[0]]
            self.tree_tokens -= len(x.key)
            self.evicted_tokens_total += len(x.key)
            self.evictions += 1
            free += len(x.key)
        return True

    def _insert(self, toks) -> None:
        """Add *toks* to the tree (the part it does not hold yet)."""
        t, _ = self._match(toks)
        node = self._node_at(toks, t)
        if t < len(toks):
            leaf = _Node(tuple(toks[t:]), node)
            node.children[toks[t]] = leaf
            self.tree_tokens += len(leaf.key)
            leaf.last_access = next(self.clock)
        now = next(self.clock)
        while node is not self.root:
            node.last_access = now
            node = node.parent

    # ------------------------------------------------------------ the hooks
    def peek_hit(self, seq, n_tokens=None) -> int:
        lookup = max(seq.prompt_len, seq.prompt_len if n_tokens is None else int(n_tokens))
        return min(self._match(expand_tokens(seq, lookup))[0], lookup - 1)

    def admit(self, rid, seq, n_tokens=None):
        n = admit_length(self.running, rid, seq, n_tokens)
        lookup = max(seq.prompt_len, n)
        toks = expand_tokens(seq)
        matched, _ = self._match(toks[:lookup])
        hit = min(matched, lookup - 1)
        held = min(matched, seq.prompt_len)   # token granularity, no last-token cap
        tokens = max(n, hit)
        node = self._node_at(toks, hit)
        self._lock(node, +1)                  # the hit is not evictable while we make room
        evicted = self.evicted_tokens_total
        if not self._room(tokens - hit):
            self._lock(node, -1)
            return None                       # refused: stats() unchanged
        now, x = next(self.clock), node
        while x is not self.root:
            x.last_access, x = now, x.parent
        self.running[rid] = {"toks": toks, "node": node, "hit": hit, "tokens": tokens}
        return Admission(hit, held, self.evicted_tokens_total - evicted)

    def extend(self, rid, n_tokens) -> bool:
        if not self._room(int(n_tokens)):
            return False
        self.running[rid]["tokens"] += int(n_tokens)
        return True

    def finish(self, rid) -> None:
        r = self.running.pop(rid)
        self._lock(r["node"], -1)
        self._insert(r["toks"][: r["tokens"]])    # the request's KV is cached; duplicates are freed

    def stats(self, detail: bool = True) -> PoolStats:
        used = self.locked_tokens + self._private_tokens()
        cached = self.tree_tokens - self.locked_tokens
        return PoolStats(num_slots=self.num_slots, slot_tokens=1, used_slots=used, cached_slots=cached,
                         free_slots=self.num_slots - used - cached, valid_tokens=used + cached,
                         cached_tokens=self.tree_tokens if detail else -1)
