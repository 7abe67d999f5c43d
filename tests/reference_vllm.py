"""Brute-force model of vLLM v1 prefix caching, written for clarity, not speed.

An independent reading of docs/SEMANTICS.md ("vLLM v1") and docs/engines/vllm.md
sections 1–3, used as the oracle of the hypothesis tests. It shares no code with
``radixkv.policies.block_hash``: tokens are expanded into tuples, a block's key is the
exact tuple of every token from the start of the sequence to the end of the block (so
the chain is exact and there are no hash collisions), the free queue is a Python list
(head = index 0) and the key map is a dict of lists in insertion order.
"""
from __future__ import annotations

from dataclasses import dataclass


def expand(seq):
    """Token tuples of a KVSeq's KV extent: token = (segment id, offset in segment)."""
    out = []
    start = 0
    for sid, end in zip(seq.seg_id.tolist(), seq.seg_end.tolist()):
        out.extend((sid, off) for off in range(end - start))
        start = end
    return out


def cdiv(a, b):
    return -(-a // b)


@dataclass
class RefAdmission:
    hit_tokens: int
    held_tokens: int
    evicted_tokens: int


class ReferenceVLLM:
    """vLLM v1 ``KVCacheManager`` + ``BlockPool`` with one full-attention group.

    Parameters: ``num_gpu_blocks`` (block 0 is the null block) and ``block_size``.
    """

    def __init__(self, num_gpu_blocks, block_size):
        self.B = block_size
        self.n = num_gpu_blocks
        self.queue = list(range(1, num_gpu_blocks))  # free queue, head first
        self.ref = [0] * num_gpu_blocks
        self.key = [None] * num_gpu_blocks  # the block's token prefix tuple, or None
        self.map = {}  # key -> [blocks], first inserted first
        self.running = {}  # rid -> {"toks", "blocks", "ntok", "P"}
        self.evicted_blocks = 0

    # -------------------------------------------------------------- building blocks
    def _pop_head(self):
        b = self.queue.pop(0)
        if self.key[b] is not None:  # evict: drop the key
            self.map[self.key[b]].remove(b)
            if not self.map[self.key[b]]:
                del self.map[self.key[b]]
            self.key[b] = None
            self.evicted_blocks += 1
        return b

    def _cache(self, toks, blocks, lo, hi):
        for j in range(lo, hi):
            k = tuple(toks[: (j + 1) * self.B])
            b = blocks[j]
            assert self.key[b] is None
            self.key[b] = k
            self.map.setdefault(k, []).append(b)

    def _held(self, toks, P):
        B = self.B
        c = 0
        while c < P // B and tuple(toks[: (c + 1) * B]) in self.map:
            c += 1
        if c * B >= P:
            return P
        target = toks[c * B : min((c + 1) * B, P)]
        best = 0
        for k in self.map:
            if len(k) == (c + 1) * B and list(k[: c * B]) == toks[: c * B]:
                m = 0
                while m < len(target) and k[c * B + m] == target[m]:
                    m += 1
                best = max(best, m)
        return c * B + best

    # -------------------------------------------------------------- API
    def admit(self, rid, seq, n_tokens=None):
        B = self.B
        toks = expand(seq)
        P = seq.prompt_len
        n = P if n_tokens is None else n_tokens
        L = max(P, n)
        hits = []
        while len(hits) < L // B:
            k = tuple(toks[: (len(hits) + 1) * B])
            if k not in self.map:
                break
            hits.append(self.map[k][0])
        held = self._held(toks, P)
        hits = hits[: (L - 1) // B]
        in_queue = sum(1 for b in hits if self.ref[b] == 0)
        if cdiv(L, B) - len(hits) + in_queue > len(self.queue):
            return None
        for b in hits:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
        t = max(n, len(hits) * B)
        before = self.evicted_blocks
        new = [self._pop_head() for _ in range(cdiv(t, B) - len(hits))]
        for b in new:
            self.ref[b] = 1
        blocks = hits + new
        self._cache(toks, blocks, len(hits), t // B)
        self.running[rid] = {"toks": toks, "blocks": blocks, "ntok": t, "P": P}
        return RefAdmission(len(hits) * B, held, (self.evicted_blocks - before) * B)

    def extend(self, rid, n):
        r = self.running[rid]
        t = r["ntok"] + n
        need = cdiv(t, self.B) - len(r["blocks"])
        if need > len(self.queue):
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
                    self.queue.insert(0, b)
                else:
                    self.queue.append(b)

    preempt = finish

    def run_request(self, rid, seq):
        a = self.admit(rid, seq)
        if a is None:
            return None
        if seq.kv_len > seq.prompt_len and not self.extend(rid, seq.kv_len - seq.prompt_len):
            self.finish(rid)
            return None
        self.finish(rid)
        return a

    # -------------------------------------------------------------- stats
    def stats(self):
        B = self.B
        usable = range(1, self.n)
        used = sum(1 for b in usable if self.ref[b] > 0)
        cached = sum(1 for b in usable if self.ref[b] == 0 and self.key[b] is not None)
        keyed = sum(1 for b in usable if self.key[b] is not None)
        reachable = sum(
            1 for k in self.map if all(k[: j * B] in self.map for j in range(1, len(k) // B + 1))
        )
        run = best = 0
        for b in usable:
            if self.ref[b] == 0 and self.key[b] is None:
                run += 1
                best = max(best, run)
            else:
                run = 0
        return {
            "used_slots": used,
            "cached_slots": cached,
            "free_slots": self.n - 1 - used - cached,
            "valid_tokens": keyed * B + sum(r["ntok"] % B for r in self.running.values()),
            "cached_tokens": reachable * B,
            "duplicate_tokens": (keyed - len(self.map)) * B,
            "largest_free_run": best,
        }
