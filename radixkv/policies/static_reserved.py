"""``StaticReservedCache``: the statically partitioned pool some deployment guides draw.

Not an engine: neither vLLM nor SGLang works this way (both keep cached KV in the same
pool as running requests and evict it on demand: docs/SEMANTICS.md). It models the picture of
claims C2/C8 in CLAIMS.md — "with caching on, part of memory is reserved as a KV pool ...
because the pool takes memory from running requests" — so that a replay can show what
such a design would cost next to the real ones.

Rules (self-contained; block granularity like vLLM):

- The pool of ``num_slots`` blocks of ``block_size`` tokens is split once:
  ``reserved_slots = floor(reserved_fraction × num_slots)`` blocks hold cached prefixes
  and nothing else; the other ``working_slots`` hold running requests and nothing else.
- A running request keeps its whole KV in working blocks, ``ceil(tokens / B)`` of them,
  hit tokens included: a hit copies the cached prefix into the request's own blocks, so
  it saves prefill compute but no memory. Admission needs the whole prompt to fit in the
  free working blocks (as vLLM's ``scheduler_reserve_full_isl``); evicting the cache
  never makes room for a running request.
- The cache holds full blocks keyed by chained block hashes (vLLM's keys,
  :func:`radixkv.policies._hash_kernels.seq_block_keys`). A lookup walks the prompt's
  keys from the start and stops at the first miss; the hit is capped so the last token
  is recomputed: ``hit = min(found, (L − 1) // B) × B`` with L the looked-up length
  (the prompt, or prompt + generated tokens on a re-admission).
- Each block is copied into the cache as soon as a step completes it (prompt chunks and
  decode), like vLLM's ``cache_full_blocks``; a hit refreshes its blocks. The cache is
  one LRU list over blocks, evicted from the least recently used end when full. Blocks
  are inserted and refreshed deepest first, so a parent block is always more recent
  than its child and is evicted after it (vLLM frees blocks tail first for the same
  reason); no block is ever pinned, since running requests hold their own copies.
- ``reserved_fraction = 0`` is caching off with the whole pool for running requests.
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
import radixkv.policies._static_kernels as SK
from radixkv.policies._hash_kernels import seq_block_keys
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.trace.types import KVSeq

_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
#: estimated host bytes of one cache entry of the modelled design (a Python int key in an
#: OrderedDict: the int object, the dict slot and the linked-list node) — an estimate, not
#: a measurement; radixkv's own list costs 48–80 bytes per entry (:mod:`._static_kernels`)
ENTRY_BYTES = 128


class _Req:
    __slots__ = ("seq", "keys", "tokens", "blocks", "cached")

    def __init__(self, seq, keys, tokens, blocks, cached):
        self.seq = seq
        self.keys = keys  # keys of every full block of the KV extent (int64 array)
        self.tokens = tokens  # tokens with KV
        self.blocks = blocks  # working blocks held
        self.cached = cached  # full blocks already copied to the cache


class StaticReservedCache(PrefixCache):
    """A pool split into a fixed cache part and a part for running requests.

    Parameters
    ----------
    num_slots : int
        Blocks in the pool (all usable).
    block_size : int
        Tokens per block (default 16, vLLM's).
    reserved_fraction : float
        Share of the blocks reserved for cached prefixes, in [0, 1); default 0.3.

    Raises
    ------
    radixkv.errors.ConfigError
        When the fraction is out of range or leaves no working block.
    """

    name = "static"
    size_name = "block_size"
    default_size = 16
    kernel_family = "hash"  # its keys come from the block-hash kernels
    option_name = "reserved_fraction"  # static:16@0.3
    default_option = 0.3
    models_metadata = True

    def __init__(self, num_slots: int, block_size: int = 16, reserved_fraction: float = 0.3):
        super().__init__(num_slots, block_size)
        f = float(reserved_fraction)
        if not 0.0 <= f < 1.0:
            raise ConfigError(f"reserved_fraction must be in [0, 1), got {reserved_fraction}", field="reserved_fraction")
        self.reserved_fraction = f
        self.reserved_slots = int(np.floor(f * self.num_slots))
        self.working_slots = self.num_slots - self.reserved_slots
        if self.working_slots < 1:
            raise ConfigError("the reservation leaves no block for running requests", field="reserved_fraction")
        # the cache part: an LRU list of block keys (least recent first), grown on demand
        self._st = SK.empty_state()
        self._alloc_nodes(min(self.reserved_slots, 1024))
        self._reqs: dict[int, _Req] = {}
        self._used = 0
        # keys of recently looked-up sequences: id(seg_id) -> (seg_id, seg_end, kv_len, keys);
        # a blocked waiting head is peeked at every engine step
        self._key_memo: dict = {}
        self._walk = None  # the last lookup's walk (_found): [keys, cached leading keys]

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens: int, block_size: int = 16, **kw) -> "StaticReservedCache":
        """A pool of ``capacity_tokens // block_size`` blocks."""
        return cls(int(capacity_tokens) // int(block_size), block_size, **kw)

    @classmethod
    def parse_option(cls, text: str) -> float:
        """The reserved fraction of ``static:B@F``."""
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"policy 'static': reserved fraction {text!r} is not a number", field="policy") from None

    @classmethod
    def format_option(cls, value) -> str:
        return f"{float(value):g}"

    # ------------------------------------------------------------------ helpers
    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.slot_tokens)

    def _alloc_nodes(self, m: int) -> None:
        """Room for *m* list nodes (keeps the listed ones; rebuilds the index)."""
        old = getattr(self, "_nk", None)
        nk = np.zeros(m, dtype=np.int64)
        nl = np.full((2, m), -1, dtype=np.int32)
        if old is not None:
            nk[: len(old)] = old
            nl[:, : len(old)] = self._nl
        self._nk, self._nl = nk, nl
        self._tab = np.zeros((SK.table_rows(m), 2), dtype=np.int64)
        SK.rebuild(self._nk, self._nl, self._st, self._tab)

    def _keys(self, seq: KVSeq) -> np.ndarray:
        """Keys of every full block of *seq*'s KV extent, int64 (memoised per content
        arrays: the caller must not mutate the returned array)."""
        m = self._key_memo.get(id(seq.seg_id))
        if m is not None and m[0] is seq.seg_id and m[1] is seq.seg_end and m[2] == seq.kv_len:
            return m[3]
        keys, _ = seq_block_keys(seq.seg_id, seq.seg_end, self.slot_tokens, seq.kv_len // self.slot_tokens, _ALL_ONES)
        if len(self._key_memo) >= 64:
            self._key_memo.clear()
        self._key_memo[id(seq.seg_id)] = (seq.seg_id, seq.seg_end, seq.kv_len, keys)
        return keys

    def _found(self, keys, L: int) -> int:
        """Hit blocks of a lookup of the first L tokens (vLLM cap: ``(L − 1) // B``).

        The walk over the last looked-up key array is remembered (``_walk``: the array and
        how many of its leading keys are cached): the next lookup of the same array resumes
        from there, since cached keys leave only by eviction and :meth:`_insert` forgets
        the walk whenever it evicts.
        """
        cap = max(0, min((L - 1) // self.slot_tokens, len(keys)))
        w = self._walk
        if w is not None and w[0] is keys:
            if w[1] >= cap:
                return cap
            j0 = w[1]
        else:
            j0 = 0
            w = self._walk = [keys, 0]
        j = int(SK.found(self._nk, self._tab, keys, j0, cap))
        w[1] = j
        return j

    def _insert(self, keys, lo: int, hi: int) -> None:
        """Copy full blocks ``lo … hi−1`` into the cache, deepest first (then refresh);
        then evict least recently used blocks down to ``reserved_slots``."""
        if self.reserved_slots == 0 or hi <= lo:
            return
        need = int(self._st[SK.LEN]) + hi - lo
        if need > len(self._nk):
            self._alloc_nodes(max(need, min(2 * len(self._nk), self.reserved_slots + hi - lo)))
        ev = int(SK.insert(self._nk, self._nl, self._tab, self._st, keys, lo, hi, self.reserved_slots))
        if ev:
            self._walk = None  # a key of the remembered walk may have left
        self.evictions += ev
        self.evicted_tokens_total += ev * self.slot_tokens

    def _touch(self, keys, n: int) -> None:
        if n > 0:
            SK.touch(self._nk, self._nl, self._tab, self._st, keys, n)

    def room_slots(self) -> int:
        """Working blocks a running request can still get (the reserved part never counts)."""
        return self.working_slots - self._used

    def fits_alone(self, seq: KVSeq) -> int:
        """Tokens by which *seq*'s KV extent overflows the working part; 0 when it fits."""
        return max(0, self._blocks(seq.kv_len) - self.working_slots) * self.slot_tokens

    def peek_hit(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Hit tokens an admission of the first *n_tokens* tokens would get; no side effect."""
        L = max(seq.prompt_len, seq.prompt_len if n_tokens is None else int(n_tokens))
        return self._found(self._keys(seq), L) * self.slot_tokens

    # ------------------------------------------------------------------ hooks
    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission | None:
        """Look up the first ``L = max(P, n_tokens)`` tokens; allocate working blocks.

        Parameters
        ----------
        rid : int
            Request handle, not running.
        seq : KVSeq
            The request's KV content.
        n_tokens : int or None
            Tokens with KV after admission (at least the hit); default P. Values above P
            re-admit a preempted request (prompt + generated tokens).

        Returns
        -------
        Admission or None
            None (nothing changed) when ``ceil(L / B)`` blocks exceed the free working
            blocks. ``held_tokens`` counts the whole cached blocks of the prompt before
            the cap; ``evicted_tokens`` is 0 (admission never evicts; copying computed
            blocks into the cache may).

        Raises
        ------
        ValueError
            When *rid* is running or *n_tokens* is outside ``[1, kv_len]``.
        """
        P = seq.prompt_len
        n = self._admit_length(self._reqs, rid, seq, n_tokens)
        L = max(P, n)
        if self._blocks(L) > self.working_slots - self._used:
            return None
        keys = self._keys(seq)
        B = self.slot_tokens
        found = self._found(keys, L)
        n_prompt_blocks = min(P // B, len(keys))
        held_blocks = found
        if held_blocks < n_prompt_blocks:
            held_blocks = int(SK.found(self._nk, self._tab, keys, found, n_prompt_blocks))
        hit = found * B
        self._touch(keys, found)
        tokens = max(n, hit)
        blocks = self._blocks(tokens)
        self._used += blocks
        r = _Req(seq, keys, tokens, blocks, found)
        self._reqs[rid] = r
        self._cache_full(r)
        return Admission(hit_tokens=hit, held_tokens=min(held_blocks * B, P), evicted_tokens=0)

    def _cache_full(self, r: _Req) -> None:
        full = min(r.tokens // self.slot_tokens, len(r.keys))
        if full > r.cached:
            self._insert(r.keys, r.cached, full)
            r.cached = full

    def extend(self, rid: int, n_tokens: int) -> bool:
        """Compute *n_tokens* more tokens; False (nothing changed) when the working part is full.

        Raises
        ------
        ValueError
            When the request would pass its KV extent.
        """
        r = self._reqs[rid]
        t = r.tokens + int(n_tokens)
        if t > r.seq.kv_len:
            raise ValueError(f"request {rid} would pass its KV extent ({r.seq.kv_len} tokens)")
        extra = self._blocks(t) - r.blocks
        if extra > self.working_slots - self._used:
            return False
        self._used += extra
        r.blocks += extra
        r.tokens = t
        self._cache_full(r)
        return True

    def finish(self, rid: int) -> None:
        """Free the request's working blocks (its full blocks are already in the cache)."""
        r = self._reqs.pop(rid)
        self._used -= r.blocks

    def stats(self, detail: bool = True) -> PoolStats:
        """``used`` = working blocks held, ``cached`` = cache entries, ``free`` = the rest
        (free working blocks and unfilled reserved blocks)."""
        cached = int(self._st[SK.LEN])
        valid = sum(r.tokens for r in self._reqs.values()) + cached * self.slot_tokens
        return PoolStats(
            num_slots=self.num_slots,
            slot_tokens=self.slot_tokens,
            used_slots=self._used,
            cached_slots=cached,
            free_slots=self.num_slots - self._used - cached,
            valid_tokens=valid,
            cached_tokens=cached * self.slot_tokens,
            metadata_bytes=cached * ENTRY_BYTES,
        )
