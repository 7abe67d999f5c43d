"""A readable reference policy of vLLM v1 prefix caching, written for clarity, not speed.

An independent reading of docs/SEMANTICS.md ("vLLM v1") used as the oracle of the
hypothesis tests, and a full :class:`~radixkv.policies.base.PrefixCache`: it passes
:func:`radixkv.check_policy` and replays through the command line as
``--policy reference_vllm:ReferenceVLLM:16`` (with ``tests/`` on ``PYTHONPATH``). It shares
no code with :mod:`radixkv.policies.block_hash`: tokens are expanded into tuples
(:func:`radixkv.policies.toolkit.expand_tokens`), a block's key is the exact tuple of
every token from the start of the sequence to the end of the block (the chain is exact,
with no hash collisions), the key map is a dict of lists in insertion order, and the free
queue — the eviction order, least recently freed first — is a ``SortedDict`` from a queue
position to a block: appending takes the largest position + 1, prepending the smallest
− 1, and removing a block from the middle (a hit on a cached block) is O(log n).

Rules (vLLM ``vllm/v1/core/kv_cache_manager.py`` and ``block_pool.py``):

- lookup: walk the prompt's full blocks while their key is cached; the hit is capped at
  ``(L − 1) // B`` blocks so the last token is recomputed (L = max(prompt, n_tokens));
- admission needs every new block at once (hit blocks taken out of the free queue
  count against it) or it is refused with nothing changed;
- a block is cached (its key recorded) as soon as it is full;
- new blocks come from the head of the free queue; a block taken from there loses its key
  (eviction);
- on finish a request's blocks are freed tail first: a block whose count drops to 0 goes
  to the queue's tail if it has a key, to its head if not.
"""
from __future__ import annotations

from sortedcontainers import SortedDict

from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.policies.toolkit import admit_length, expand_tokens


def expand(seq):
    """Token tuples of a KVSeq's KV extent (see :func:`radixkv.policies.toolkit.expand_tokens`)."""
    return list(expand_tokens(seq))


def cdiv(a, b):
    return -(-a // b)


class ReferenceVLLM(PrefixCache):
    """vLLM v1 ``KVCacheManager`` + ``BlockPool`` with one full-attention group.

    Parameters
    ----------
    num_gpu_blocks : int
        Blocks in the pool; block 0 is the null block, so ``num_gpu_blocks − 1`` are usable.
    block_size : int
        Tokens per block.
    """

    name = "reference-vllm"
    size_name = "block_size"
    default_size = 16
    admission_rule = "vllm"
    engine = "vllm"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16):
        super().__init__(num_gpu_blocks - 1, block_size)
        self.B = block_size
        self.n = num_gpu_blocks
        self.fq = SortedDict((b, b) for b in range(1, num_gpu_blocks))  # position -> block, head first
        self.pos = {b: b for b in range(1, num_gpu_blocks)}  # block -> position, while in the queue
        self.ref = [0] * num_gpu_blocks
        self.key = [None] * num_gpu_blocks  # the block's token prefix tuple, or None
        self.map = {}  # key -> [blocks], first inserted first
        self.running = {}  # rid -> {"toks", "blocks", "ntok", "P"}
        self.evicted_blocks = 0

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens, block_size=16, **kw):
        return cls(capacity_tokens // block_size + 1, block_size, **kw)

    @classmethod
    def from_engine_pool(cls, pool, size, **kw):
        return None if pool.num_gpu_blocks is None else cls(pool.num_gpu_blocks, size or 16, **kw)

    # -------------------------------------------------------------- the free queue
    @property
    def queue(self):
        """The free queue, head first (list of block ids)."""
        return list(self.fq.values())

    def _remove(self, b):
        del self.fq[self.pos.pop(b)]

    def _append(self, b):
        p = self.fq.peekitem(-1)[0] + 1 if self.fq else 0
        self.fq[p] = b
        self.pos[b] = p

    def _prepend(self, b):
        p = self.fq.peekitem(0)[0] - 1 if self.fq else 0
        self.fq[p] = b
        self.pos[b] = p

    def _pop_head(self):
        p, b = self.fq.popitem(0)
        del self.pos[b]
        if self.key[b] is not None:  # evict: drop the key
            self.map[self.key[b]].remove(b)
            if not self.map[self.key[b]]:
                del self.map[self.key[b]]
            self.key[b] = None
            self.evicted_blocks += 1
            self.evictions += 1
            self.evicted_tokens_total += self.B
        return b

    # -------------------------------------------------------------- building blocks
    def _cache(self, toks, blocks, lo, hi):
        for j in range(lo, hi):
            k = tuple(toks[: (j + 1) * self.B])
            b = blocks[j]
            assert self.key[b] is None
            self.key[b] = k
            self.map.setdefault(k, []).append(b)

    def _lookup(self, toks, L):
        """Cached blocks of the first ``L // B`` full blocks, stopping at the first miss."""
        hits = []
        while len(hits) < L // self.B:
            k = tuple(toks[: (len(hits) + 1) * self.B])
            if k not in self.map:
                break
            hits.append(self.map[k][0])
        return hits[: (L - 1) // self.B]

    def _held(self, toks, P):
        B = self.B
        c = 0
        while c < P // B and tuple(toks[: (c + 1) * B]) in self.map:
            c += 1
        if c * B >= P:
            return P
        target = toks[c * B: min((c + 1) * B, P)]
        best = 0
        for k in self.map:
            if len(k) == (c + 1) * B and list(k[: c * B]) == toks[: c * B]:
                m = 0
                while m < len(target) and k[c * B + m] == target[m]:
                    m += 1
                best = max(best, m)
        return c * B + best

    # -------------------------------------------------------------- the interface
    def peek_hit(self, seq, n_tokens=None):
        L = max(seq.prompt_len, seq.prompt_len if n_tokens is None else n_tokens)
        return len(self._lookup(expand(seq), L)) * self.B

    def admit(self, rid, seq, n_tokens=None):
        B = self.B
        n = admit_length(self.running, rid, seq, n_tokens)
        toks = expand(seq)
        P = seq.prompt_len
        L = max(P, n)
        hits = self._lookup(toks, L)
        held = self._held(toks, P)
        in_queue = sum(1 for b in hits if self.ref[b] == 0)
        if cdiv(L, B) - len(hits) + in_queue > len(self.fq):
            return None
        for b in hits:
            if self.ref[b] == 0:
                self._remove(b)
            self.ref[b] += 1
        t = max(n, len(hits) * B)
        before = self.evicted_blocks
        new = [self._pop_head() for _ in range(cdiv(t, B) - len(hits))]
        for b in new:
            self.ref[b] = 1
        blocks = hits + new
        self._cache(toks, blocks, len(hits), t // B)
        self.running[rid] = {"toks": toks, "blocks": blocks, "ntok": t, "P": P}
        return Admission(len(hits) * B, held, (self.evicted_blocks - before) * B)

    def extend(self, rid, n):
        r = self.running[rid]
        t = r["ntok"] + n
        need = cdiv(t, self.B) - len(r["blocks"])
        if need > len(self.fq):
            return False
        for _ in range(need):
            b = self._pop_head()
            self.ref[b] = 1
            r["blocks"].append(b)
        self._cache(r["toks"], r["blocks"], r["ntok"] // self.B, t // self.B)
        r["ntok"] = t
        return True

    def finish(self, rid):
        r = self.running.pop(rid)
        for b in reversed(r["blocks"]):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.key[b] is None:
                    self._prepend(b)
                else:
                    self._append(b)

    def stats(self, detail=True):
        B = self.B
        # blocks with ref_cnt > 0 (only a running request's blocks can have one)
        held = {b for r in self.running.values() for b in r["blocks"] if self.ref[b] > 0}
        used = len(held)
        keyed = sum(len(blocks) for blocks in self.map.values())  # blocks with a key
        cached = keyed - sum(1 for b in held if self.key[b] is not None)
        reachable = duplicates = best = -1  # they walk the cache or the pool: only with detail
        if detail:
            # a key is reachable when its parent key (one block shorter) is
            reach = set()
            for k in sorted(self.map, key=len):
                if len(k) == B or k[:-B] in reach:
                    reach.add(k)
            reachable = len(reach)
            duplicates = (keyed - len(self.map)) * B
            run = best = 0  # longest run of free blocks (no reference, no key) by block id
            for b in range(1, self.n):
                if self.ref[b] == 0 and self.key[b] is None:
                    run += 1
                    continue
                best, run = (run if run > best else best), 0
            best = run if run > best else best
        return PoolStats(
            num_slots=self.n - 1,
            slot_tokens=B,
            used_slots=used,
            cached_slots=cached,
            free_slots=self.n - 1 - used - cached,
            valid_tokens=keyed * B + sum(r["ntok"] % B for r in self.running.values()),
            cached_tokens=reachable * B if detail else -1,
            duplicate_tokens=duplicates,
            largest_free_run=best,
        )
