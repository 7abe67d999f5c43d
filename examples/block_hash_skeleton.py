"""A block-hash prefix cache to start a new policy from: vLLM's shape, in plain Python.

It passes the conformance kit as it is (``tests/test_policy_skeletons.py`` runs
``radixkv.check_policy`` on it) and replays from the command line::

    PYTHONPATH=examples radixkv replay traces/demo.jsonl \\
        --policy block_hash_skeleton:SkeletonBlockHash:16 --capacity-tokens 20000

The contract it keeps is docs/policy-contract.md. What it models, after vLLM v1
(``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``; the exact model is
:class:`radixkv.policies.block_hash.BlockHashCache`):

- a pool of ``num_slots`` blocks of ``block_size`` tokens; a full block is *cached* under
  the chained key of its content and every block before it
  (:func:`radixkv.policies.toolkit.block_keys`) as soon as it is full;
- a lookup walks the prompt's full blocks while their key is cached, and keeps at most
  ``(L − 1) // block_size`` of them (the last token is recomputed,
  :func:`~radixkv.policies.toolkit.capped_hit_blocks`);
- blocks no running request references wait in one free queue; new blocks come from its
  head, and a cached block taken from there is evicted (its key dropped);
- on finish a request's blocks are released tail first: a cached block goes to the
  queue's tail (evicted last), an uncached one to its head.

Simplifications against vLLM (a policy of your own may keep or change them): no null
block (every block is usable), and a full block whose key is already cached stays
uncached (vLLM keeps such duplicates under the same key).

**Where to change the eviction order**: :meth:`SkeletonBlockHash._release` (where a freed
block enters the queue) and :meth:`SkeletonBlockHash._take` (which block leaves it). Keep
the contract: only blocks with no running reference are in the queue.
"""
from __future__ import annotations

from collections import OrderedDict

from radixkv import Admission, PoolStats, PrefixCache
from radixkv.policies.toolkit import admit_length, block_keys, capped_hit_blocks, held_tokens


class SkeletonBlockHash(PrefixCache):
    """Block-hash prefix caching with an LRU free queue (vLLM v1's rules, simplified).

    Parameters
    ----------
    num_slots : int
        Blocks in the pool (all usable).
    block_size : int
        Tokens per block.
    """

    name = "skeleton-block-hash"   # --policy label
    size_name = "block_size"       # what NAME:SIZE sets
    default_size = 16
    admission_rule = "vllm"        # concurrent replay: the whole prompt must fit at admission
    engine = "vllm"                # pool sized by vLLM's memory rule / --num-gpu-blocks

    def __init__(self, num_slots: int, block_size: int = 16):
        super().__init__(num_slots, block_size)
        self.B = int(block_size)
        self.ref = [0] * num_slots            # running requests referencing each block
        self.key = [None] * num_slots         # the block's chained key while cached, else None
        self.owner = [None] * num_slots       # (KVSeq, end token) that computed a cached block
        self.parent = {}                      # key -> key of the block before it (None: first)
        self.by_key = {}                      # key -> block
        self.queue = OrderedDict((b, None) for b in range(num_slots))  # ref 0 blocks, head first
        self.running = {}                     # rid -> {"seq", "keys", "blocks", "tokens"}

    # ------------------------------------------------------------ the free queue
    def _take(self) -> int:
        """The next free block: the queue's head; a cached one is evicted."""
        b, _ = self.queue.popitem(last=False)
        if self.key[b] is not None:
            del self.by_key[self.key[b]]
            self.key[b] = self.owner[b] = None
            self.evictions += 1
            self.evicted_tokens_total += self.B
        return b

    def _release(self, b: int) -> None:
        """Block *b* lost its last running reference: cached → tail, uncached → head."""
        self.queue[b] = None
        if self.key[b] is None:
            self.queue.move_to_end(b, last=False)

    # ------------------------------------------------------------ building blocks
    def _lookup(self, keys, lookup_tokens: int) -> list:
        """Cached blocks of the prompt's leading full blocks, after the last-token cap."""
        hits = []
        for k in keys[: lookup_tokens // self.B]:
            b = self.by_key.get(int(k))
            if b is None:
                break
            hits.append(b)
        return hits[: capped_hit_blocks(len(hits), lookup_tokens, self.B)]

    def _cache_full(self, r, upto_tokens: int) -> None:
        """Cache the request's blocks that are full at *upto_tokens* tokens."""
        for j in range(upto_tokens // self.B):
            b = r["blocks"][j]
            k = int(r["keys"][j])
            if self.key[b] is None and k not in self.by_key:
                self.key[b], self.owner[b] = k, (r["seq"], (j + 1) * self.B)
                self.by_key[k] = b
                self.parent[k] = int(r["keys"][j - 1]) if j else None

    def _holders(self) -> list:
        """(KVSeq, tokens) whose first tokens have KV in the pool: the cached blocks'
        requests (longest end each) and the running requests."""
        ends = {}
        for b in self.by_key.values():
            seq, end = self.owner[b]
            if end > ends.get(id(seq), (None, 0))[1]:
                ends[id(seq)] = (seq, end)
        return list(ends.values()) + [(r["seq"], r["tokens"]) for r in self.running.values()]

    # ------------------------------------------------------------ the hooks
    def peek_hit(self, seq, n_tokens=None) -> int:
        lookup = max(seq.prompt_len, seq.prompt_len if n_tokens is None else int(n_tokens))
        return len(self._lookup(block_keys(seq, self.B), lookup)) * self.B

    def admit(self, rid, seq, n_tokens=None):
        n = admit_length(self.running, rid, seq, n_tokens)
        lookup = max(seq.prompt_len, n)
        keys = block_keys(seq, self.B)
        hits = self._lookup(keys, lookup)
        tokens = max(n, len(hits) * self.B)
        new = -(-tokens // self.B) - len(hits)
        if new + sum(1 for b in hits if self.ref[b] == 0) > len(self.queue):
            return None                                   # refused: nothing changed
        held = held_tokens(seq, self._holders(), start=len(hits) * self.B)
        for b in hits:
            if self.ref[b] == 0:
                del self.queue[b]
            self.ref[b] += 1
        evicted = self.evicted_tokens_total
        blocks = hits + [self._take() for _ in range(new)]
        for b in blocks[len(hits):]:
            self.ref[b] = 1
        r = self.running[rid] = {"seq": seq, "keys": keys, "blocks": blocks, "tokens": tokens}
        self._cache_full(r, tokens)
        return Admission(len(hits) * self.B, held, self.evicted_tokens_total - evicted)

    def extend(self, rid, n_tokens) -> bool:
        r = self.running[rid]
        tokens = r["tokens"] + int(n_tokens)
        need = -(-tokens // self.B) - len(r["blocks"])
        if need > len(self.queue):
            return False                                  # refused: nothing changed
        for _ in range(need):
            b = self._take()
            self.ref[b] = 1
            r["blocks"].append(b)
        r["tokens"] = tokens
        self._cache_full(r, tokens)
        return True

    def finish(self, rid) -> None:
        for b in reversed(self.running.pop(rid)["blocks"]):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self._release(b)

    def stats(self, detail: bool = True) -> PoolStats:
        held = {}                           # block -> (request, index) for blocks in use
        for r in self.running.values():
            for j, b in enumerate(r["blocks"]):
                held.setdefault(b, (r, j))
        used = len(held)                    # = blocks out of the free queue
        cached = len(self.by_key) - sum(1 for b in held if self.key[b] is not None)
        valid = cached * self.B + sum(self.B if self.key[b] is not None else min(self.B, r["tokens"] - j * self.B)
                                      for b, (r, j) in held.items())
        reachable = -1
        if detail:                          # a key whose chain back to the first block is cached
            ok = {}
            for k in sorted(self.by_key, key=lambda k: self.owner[self.by_key[k]][1]):
                p = self.parent[k]
                ok[k] = p is None or ok.get(p, False)
            reachable = sum(ok.values()) * self.B
        return PoolStats(num_slots=self.num_slots, slot_tokens=self.B, used_slots=used, cached_slots=cached,
                         free_slots=self.num_slots - used - cached, valid_tokens=valid, cached_tokens=reachable)
