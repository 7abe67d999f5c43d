"""A brute-force reference model of SGLang's radix cache, written for clarity, not speed.

:class:`ReferenceSGLang` (at the end) is the same model as a full
:class:`~radixkv.policies.base.PrefixCache`: it passes :func:`radixkv.check_policy`,
agrees with :class:`~radixkv.policies.radix.RadixCache` call by call with several requests
running, and replays from the command line as ``--policy
reference_sglang:ReferenceSGLang:1`` (with ``tests/`` on ``PYTHONPATH``). Its eviction
order is SGLang's: a heap of the evictable leaves by last access, rebuilt per call.

Independent of :mod:`radixkv.policies.radix`: it follows docs/SEMANTICS.md
("SGLang RadixAttention") and docs/engines/sglang.md directly, in the engine's own
shape — node keys are explicit token tuples, LRU times are SGLang's float counter (+1.0
per draw, the matched path stamped ``c, c − 1e−5, …`` upwards), the eviction heap is
rebuilt from all evictable leaves on every call as ``RadixCache.evict`` does, and memory
is a free-slot count. Tokens are any hashable values; :func:`expand` turns a
:class:`~radixkv.trace.types.KVSeq` into one tuple per token.

It runs one request at a time (the golden harness's order, docs/golden.md):
match (cap ``P − 1``, page-aligned) → lock → evict the shortfall and allocate each prefill
chunk (checkpoint after a middle chunk, and after the prefill when decode follows) →
decode one token at a time → finish (insert the KV computed, then the prompt; free the
partial page; unlock).
"""
from __future__ import annotations

import heapq


def expand(seq) -> tuple:
    """One hashable token per KV position of *seq*: ``(segment id, segment start, offset)``."""
    out = []
    start = 0
    for sid, end in zip(seq.seg_id.tolist(), seq.seg_end.tolist()):
        out.extend((sid, start, k) for k in range(end - start))
        start = end
    return tuple(out)


class RefNode:
    def __init__(self, key: tuple, parent):
        self.key = key
        self.parent = parent
        self.children = {}
        self.lock_ref = 0
        self.last_access = 0.0


class RefRadixCache:
    """SGLang radix cache over ``capacity_tokens`` slots with page size *page_size*."""

    def __init__(self, capacity_tokens: int, page_size: int = 1, chunked_prefill_size=None):
        self.p = page_size
        self.free_pages = capacity_tokens // page_size
        self.capacity_pages = self.free_pages
        # SGLang's PrefillAdder: the first chunk is the size rounded down to a page
        # (add_one_req), every later one the size as given (add_chunked_req); the engine's
        # chunk ends are in tests/data/golden/sglang_chunked
        self.chunk = None if not chunked_prefill_size else int(chunked_prefill_size)
        self.counter = 0.0
        self.root = RefNode((), None)
        self.root.lock_ref = 1

    # ---------------------------------------------------------------- tree
    def draw(self) -> float:
        t = self.counter
        self.counter += 1.0
        return t

    def child_key(self, tokens):
        return tokens[0] if self.p == 1 else tuple(tokens[: self.p])

    def key_match(self, a, b) -> int:
        """Common prefix of *a* and *b* in whole pages (token by token at page 1)."""
        p = self.p
        i = 0
        while i + p <= min(len(a), len(b)) and a[i : i + p] == b[i : i + p]:
            i += p
        return i

    def split(self, child, k):
        new = RefNode(child.key[:k], child.parent)
        new.lock_ref = child.lock_ref
        new.last_access = self.draw()
        self.draw()  # creation_time
        child.parent.children[self.child_key(child.key)] = new
        child.key = child.key[k:]
        child.parent = new
        new.children[self.child_key(child.key)] = child
        child.last_access = self.draw()
        return new

    def match_prefix(self, key):
        key = key[: len(key) // self.p * self.p]
        if not key:
            return 0, self.root
        node = self.root
        matched = 0
        while key and self.child_key(key) in node.children:
            child = node.children[self.child_key(key)]
            k = self.key_match(child.key, key)
            matched += k
            if k < len(child.key):
                node = self.split(child, k)
                break
            node = child
            key = key[k:]
        t = self.draw()
        n = node
        while n is not None:
            n.last_access = t
            t -= 0.00001
            n = n.parent
        return matched, node

    def insert(self, key):
        key = key[: len(key) // self.p * self.p]
        self.root.last_access = self.draw()
        node = self.root
        total = 0
        while key and self.child_key(key) in node.children:
            child = node.children[self.child_key(key)]
            child.last_access = self.draw()
            k = self.key_match(child.key, key)
            if k < len(child.key):
                child = self.split(child, k)
            node = child
            total += k
            key = key[k:]
        if key:
            leaf = RefNode(tuple(key), node)
            leaf.last_access = self.draw()
            self.draw()  # creation_time
            node.children[self.child_key(key)] = leaf
            node = leaf
        return total, node

    def nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            for c in n.children.values():
                yield c
                stack.append(c)

    def tree_tokens(self) -> int:
        return sum(len(n.key) for n in self.nodes())

    def evict(self, num_tokens: int) -> int:
        heap = [(n.last_access, i, n) for i, n in enumerate(self.nodes()) if n.lock_ref == 0 and not n.children]
        heapq.heapify(heap)
        uid = len(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, n = heapq.heappop(heap)
            del n.parent.children[self.child_key(n.key)]
            self.free_pages += len(n.key) // self.p
            evicted += len(n.key)
            par = n.parent
            if par is not self.root and par.lock_ref == 0 and not par.children:
                uid += 1
                heapq.heappush(heap, (par.last_access, uid, par))
        return evicted

    def lock(self, node, d):
        while node is not self.root:
            node.lock_ref += d
            node = node.parent

    def held(self, prompt) -> int:
        """Longest token-level prefix of *prompt* on any root-to-node path (brute force)."""
        best = 0
        stack = [(self.root, ())]
        while stack:
            n, prefix = stack.pop()
            s = prefix + n.key
            k = 0
            while k < min(len(s), len(prompt)) and s[k] == prompt[k]:
                k += 1
            best = max(best, k)
            for c in n.children.values():
                stack.append((c, s))
        return best

    # ---------------------------------------------------------------- one request
    def ensure(self, need_tokens: int) -> int:
        avail = self.free_pages * self.p
        return self.evict(need_tokens - avail) if need_tokens > avail else 0

    def take(self, pages: int):
        assert self.free_pages >= pages, "the reference ran out of memory"
        self.free_pages -= pages

    def run(self, prompt: tuple, kv: tuple):
        """Run one request alone; return ``(hit, held, evicted tokens)``.

        *kv* is every token that gets KV (prompt, then outputs up to ``P + N − 1``).
        """
        p = self.p
        P = len(prompt)
        held = self.held(prompt)
        hit, node = self.match_prefix(prompt[: P - 1])
        self.lock(node, +1)
        owned = hit  # positions [0, owned) are the tree's slots
        done = hit  # positions [0, done) have KV
        ev = 0
        extra = p if p > 1 else 0
        while done < P:
            step = P - done
            size = self.chunk if done > hit or self.chunk is None else self.chunk // p * p
            if self.chunk is not None and step > size:
                step = size
            ev += self.ensure(step + extra)
            self.take(-(-(done + step) // p) - -(-done // p))
            done += step
            if done < P or len(kv) > P:
                L = done // p * p
                total, new_node = self.insert(kv[:L])
                if L > owned:
                    self.free_pages += (total - owned) // p  # duplicates
                    owned = L
                self.lock(new_node, +1)
                self.lock(node, -1)
                node = new_node
        for pos in range(P, len(kv)):
            ev += self.ensure(p)
            if pos % p == 0:
                self.take(1)
        L1 = len(kv) // p * p
        total, _ = self.insert(kv[:L1])
        if L1 > owned:
            self.free_pages += (total - owned) // p
            owned = L1
        self.insert(prompt[: P // p * p])
        self.free_pages += -(-len(kv) // p) - owned // p
        self.lock(node, -1)
        return hit, held, ev


# ---------------------------------------------------------------------------------------
# The same rules as a PrefixCache: requests admitted, extended and finished one call at a
# time, several running at once (what the concurrent replay and check_policy drive).
# ---------------------------------------------------------------------------------------
from radixkv.policies.base import Admission, PoolStats, PrefixCache  # noqa: E402
from radixkv.policies.toolkit import admit_length  # noqa: E402


class _Running:
    def __init__(self, kv, P, node, hit):
        self.kv = kv  # token tuples of the KV extent
        self.P = P
        self.node = node  # the tree node the request locks (with its ancestors)
        self.owned = hit  # positions [0, owned) are the tree's slots
        self.done = hit  # positions [0, done) have KV


class ReferenceSGLang(PrefixCache):
    """SGLang's radix cache as a readable :class:`PrefixCache`, built on :class:`RefRadixCache`.

    One request's life, split at the interface's calls (the rules of :meth:`RefRadixCache.run`):

    - ``admit(n)``: match the prompt capped at ``P − 1`` (splitting a node, stamping the
      path), lock the match, evict the shortfall of the ``n − hit`` new tokens (plus a page
      when p > 1) and take their pages; then checkpoint (insert what has KV, move the lock)
      when the prefill is not done or a decode follows. Refused with nothing changed when
      the free pages plus the evictable pages off the matched path cannot hold them.
    - ``extend(k)``: the rest of the prompt as one more chunk (same rule), then decode
      steps (each evicts the shortfall of one page, or one token at p = 1).
    - ``finish``: insert the KV computed, then the prompt; free the partial page; unlock.
    - ``preempt``: free the private pages and unlock; insert nothing.
    """

    name = "reference-sglang"
    size_name = "page_size"
    default_size = 1
    admission_rule = "sglang"
    engine = "sglang"

    def __init__(self, max_total_num_tokens: int, page_size: int = 1):
        super().__init__(max_total_num_tokens // page_size, page_size)
        self.tree = RefRadixCache(max_total_num_tokens, page_size)
        self.running: dict = {}

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens, page_size=1, **kw):
        return cls(capacity_tokens // page_size * page_size, page_size, **kw)

    @classmethod
    def from_engine_pool(cls, pool, size, **kw):
        p = size or 1
        return None if pool.max_total_num_tokens is None else cls(pool.max_total_num_tokens // p * p, p, **kw)

    # ------------------------------------------------------------ helpers
    def _peek(self, key):
        """Tokens a match of *key* would hit, and the nodes it would pass, without touching the tree."""
        t = self.tree
        key = key[: len(key) // t.p * t.p]
        node, matched, path = t.root, 0, []
        while key and t.child_key(key) in node.children:
            child = node.children[t.child_key(key)]
            k = t.key_match(child.key, key)
            path.append((child, k))
            matched += k
            if k < len(child.key):
                break
            node, key = child, key[k:]
        return matched, path

    def _evictable_pages(self, path):
        """Pages eviction could free once the matched *path* is locked."""
        t = self.tree
        unlocked = sum(len(n.key) for n in t.nodes() if n.lock_ref == 0)
        on_path = sum(k for n, k in path if n.lock_ref == 0)
        return (unlocked - on_path) // t.p

    def _evict_and_take(self, tokens_needed, pages):
        ev = self.tree.ensure(tokens_needed)
        self.tree.take(pages)
        self.evicted_tokens_total += ev
        return ev

    def _checkpoint(self, r):
        """Insert what has KV (page-aligned) and move the lock to its node."""
        t = self.tree
        L = r.done // t.p * t.p
        total, node = t.insert(r.kv[:L])
        if L > r.owned:
            t.free_pages += (total - r.owned) // t.p  # the request's duplicates
            r.owned = L
        t.lock(node, +1)
        t.lock(r.node, -1)
        r.node = node

    def _prefill(self, r, step):
        """One prefill chunk of *step* tokens (room already checked)."""
        t = self.tree
        extra = t.p if t.p > 1 else 0
        ev = self._evict_and_take(step + extra, -(-(r.done + step) // t.p) - -(-r.done // t.p))
        r.done += step
        if r.done < r.P or len(r.kv) > r.P:
            self._checkpoint(r)
        return ev

    # ------------------------------------------------------------ the interface
    def peek_hit(self, seq, n_tokens=None):
        kv = expand(seq)
        return self._peek(kv[: seq.prompt_len - 1])[0]

    def admit(self, rid, seq, n_tokens=None):
        n = admit_length(self.running, rid, seq, n_tokens)
        P = seq.prompt_len
        if n > P:
            raise ValueError(f"n_tokens={n} exceeds the prompt ({P} tokens)")
        t = self.tree
        kv = expand(seq)
        hit, path = self._peek(kv[: P - 1])
        pages = -(-n // t.p) - hit // t.p
        if pages > t.free_pages + self._evictable_pages(path):
            return None
        held = t.held(kv[:P])
        before = self.evicted_tokens_total
        hit2, node = t.match_prefix(kv[: P - 1])
        assert hit2 == hit
        t.lock(node, +1)
        r = _Running(kv, P, node, hit)
        self.running[rid] = r
        self._prefill(r, max(0, n - hit))  # a chunk of no new token still evicts its extra page
        return Admission(hit, held, self.evicted_tokens_total - before)

    def extend(self, rid, n_tokens):
        t = self.tree
        r = self.running[rid]
        step = min(n_tokens, max(0, r.P - r.done))
        decode = n_tokens - step
        pages = -(-(r.done + n_tokens) // t.p) - -(-r.done // t.p)
        if pages > t.free_pages + self._evictable_pages([]):
            return False
        if step:
            self._prefill(r, step)
        for _ in range(decode):
            self.evicted_tokens_total += t.ensure(t.p)
            if r.done % t.p == 0:
                t.take(1)
            r.done += 1
        return True

    def _release(self, r):
        t = self.tree
        t.free_pages += -(-r.done // t.p) - r.owned // t.p  # private pages
        t.lock(r.node, -1)

    def finish(self, rid):
        t = self.tree
        r = self.running.pop(rid)
        L = r.done // t.p * t.p
        total, _ = t.insert(r.kv[:L])
        if L > r.owned:
            t.free_pages += (total - r.owned) // t.p
            r.owned = L
        t.insert(r.kv[: min(r.P, r.done) // t.p * t.p])
        self._release(r)

    def preempt(self, rid):
        self._release(self.running.pop(rid))

    def stats(self, detail=True):
        t = self.tree
        p = t.p
        locked = sum(len(n.key) for n in t.nodes() if n.lock_ref > 0)
        tree = t.tree_tokens()
        private = sum(r.done - r.owned for r in self.running.values())
        used = locked // p + sum(-(-r.done // p) - r.owned // p for r in self.running.values())
        cached = (tree - locked) // p
        return PoolStats(
            num_slots=self.num_slots, slot_tokens=p, used_slots=used, cached_slots=cached,
            free_slots=self.num_slots - used - cached, valid_tokens=tree + private, cached_tokens=tree,
        )
