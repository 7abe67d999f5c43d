"""``BlockHashCache``: vLLM v1 Automatic Prefix Caching, block for block.

A faithful model of vLLM 0.33.0's ``KVCacheManager`` + ``BlockPool`` with one
full-attention KV cache group (``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``,
``kv_cache_utils.py``, ``single_type_kv_cache_manager.py``). The rules, with their
sources (docs/SEMANTICS.md "vLLM v1", docs/engines/vllm.md sections 1–4):

- **Keys.** Only full blocks are cached. A block's key chains its parent's key with its
  content (``kv_cache_utils.hash_block_tokens``); here a 64-bit hash over the block's
  ``KVSeq`` pieces, see :mod:`radixkv.policies._hash_kernels`.
- **Lookup.** Walk the prompt's block keys from the start and stop at the first miss
  (``FullAttentionManager.find_longest_cache_hit``); with duplicates a key serves the
  first block inserted under it that is still cached (``BlockPool.get_cached_block`` →
  ``BlockHashToBlockMap.get_one_block``: the first entry of an insertion-ordered
  ``{block_id: block}`` dict; evicting one duplicate, ``BlockHashToBlockMap.pop``, removes
  only that block and keeps the others in order).
  The hit is capped so the last prompt token is recomputed:
  ``hit = min(consecutive hit blocks, (P − 1) // B) × B``
  (``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length = num_tokens − 1``).
- **Admission.** ``ceil(P / B) − hit_blocks`` new blocks plus the hit blocks that sit in
  the free queue must fit in the free-queue length, else the request is refused and
  nothing changes (``SingleTypeKVCacheManager.get_num_blocks_to_allocate``,
  ``allocate_slots``; the whole prompt must fit, ``scheduler_reserve_full_isl``).
  Hit blocks with ref_cnt 0 leave the free queue (``BlockPool.touch``); new blocks are
  popped from the head, and a popped block that still has a key loses it: that is the
  eviction (``get_new_blocks`` → ``_maybe_evict_cached_block``).
- **Caching.** At the end of every step, each block completely covered by the tokens
  computed so far gets its key (``cache_full_blocks``), prompt and decode alike, so a
  running request's full blocks are hittable at once. No dedup: two blocks may carry the
  same key.
- **Release.** ``finish``/``preempt`` release the blocks tail first; a block whose
  ref_cnt reaches 0 goes back to the free queue, unhashed (partial) blocks at the
  **head**, hashed ones appended to the **tail** (``BlockPool.free_blocks``, vLLM PR
  #42656), so a child is evicted before its parent.
- **Pool.** ``num_gpu_blocks`` blocks, block 0 the permanent null block; the free queue
  starts as blocks 1 … n−1 in ascending id order (``BlockPool.__init__``).

Choices where the engine leaves the simulator a choice (stated, not hidden):

- A refused admission changes nothing (vLLM's ``get_computed_blocks`` does not touch
  ref counts or the free queue before ``allocate_slots`` succeeds, so this is exact).
- ``admit(..., n_tokens)`` with ``n_tokens < P`` admits a first prefill chunk (the check
  still needs the whole prompt to fit; a chunk shorter than the hit is raised to it); ``n_tokens > P`` re-admits a preempted request
  whose first ``n_tokens`` tokens (prompt + generated) are known: the lookup covers them
  and the hit is capped at ``(n_tokens − 1) // B`` blocks, as for vLLM's resumed
  requests (``num_tokens`` = prompt + output so far).
- Several unhashed blocks of one request (not produced by this model, where only the
  last block can be partial) would be pushed on the head one by one, tail first.
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
import radixkv.policies._hash_batch_kernels as BK
import radixkv.policies._hash_kernels as K
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.trace.types import KVSeq

#: Estimated host bytes of one entry of vLLM's ``BlockHashToBlockMap``: the key, a
#: ``BlockHashWithGroupId`` bytes object of 32 (sha256) + 4 (group id) bytes
#: (``sys.getsizeof`` = 69 B in CPython 3.11), plus one slot of the Python dict
#: (measured 52 B per entry amortised over a 100,000-entry dict, index and growth slack
#: included).
KEY_ENTRY_BYTES = 121
#: Extra bytes for a key held by several blocks: vLLM then stores an inner
#: ``{block_id: block}`` dict (``sys.getsizeof`` of a 2-entry dict = 224 B in CPython 3.11).
DUPLICATE_DICT_BYTES = 224


def _aligned(rows: int, cols: int, align: int) -> np.ndarray:
    """Zeroed C-contiguous int64 array (rows, cols) whose data starts on an *align*-byte boundary."""
    extra = align // 8
    buf = np.zeros(rows * cols + extra, dtype=np.int64)
    off = (-buf.ctypes.data % align) // 8
    return buf[off: off + rows * cols].reshape(rows, cols)


class HashCollisionError(RuntimeError):
    """``verify=True`` found a hit whose stored content differs from the prompt's."""


class _Running:
    """Host-side record of one running request."""

    __slots__ = ("seq", "keys", "tbl", "n_blocks", "n_tokens", "tag")

    def __init__(self, seq, keys, tbl, n_blocks, n_tokens, tag=0):
        self.seq = seq
        self.keys = keys
        self.tbl = tbl
        self.n_blocks = n_blocks
        self.n_tokens = n_tokens
        self.tag = tag  # the free order's tag of the request (BlockHashCache._order)


class BlockHashCache(PrefixCache):
    """vLLM v1 prefix cache: chained block hashes, ref counts and one LRU free queue.

    Parameters
    ----------
    num_gpu_blocks : int
        vLLM's ``num_gpu_blocks`` (``--num-gpu-blocks-override``); block 0 is the null
        block, so ``num_gpu_blocks − 1`` blocks are usable (≥ 2 required).
    block_size : int
        Tokens per block, vLLM ``--block-size`` (default 16, ``CacheConfig``).
    verify : bool
        Compare the stored content of every hit block with the prompt and raise
        :class:`HashCollisionError` if a 64-bit hash collision served the wrong block.

    Attributes
    ----------
    slot_tokens : int
        ``block_size``.
    num_slots : int
        ``num_gpu_blocks − 1``.

    Raises
    ------
    radixkv.errors.ConfigError
        When ``num_gpu_blocks < 2`` or ``≥ 2³¹`` (block ids are 32-bit), or
        ``block_size < 1``.

    Notes
    -----
    State is numpy arrays driven by numba kernels (:mod:`._hash_kernels`): one kernel
    call per admit / extend / finish / :meth:`run_request` (which also hashes). Host
    memory is ``(64 + 8 + 10 × (C − 1)) × num_gpu_blocks`` bytes (a 64-byte block record,
    a cascade-stack slot, content pieces beyond the first at 8 + 2 bytes) plus a key table
    of ``3 × num_gpu_blocks + 2`` rows rounded up to a power of two (32 B each), where
    C ≤ ``block_size`` is the most pieces any cached block needed (1 for hash-id traces
    whose units are multiples of ``block_size``, ``block_size`` for token traces). E.g. a
    token trace at ``block_size`` 16 and 6.25 M blocks (10⁸ tokens): about 1.9 GB.
    ``stats`` is O(1) except ``largest_free_run`` (one pass over the block records);
    ``cached_tokens`` is kept incrementally. The per-block arrays are made on first use.

    The sequential replay (:meth:`replay_span`) of a hash-id trace whose unit U is a
    multiple of ``block_size`` (≥ 2), without output ids, on a fresh pool of this class
    with ``verify`` off runs on a unit-granular model instead
    (:mod:`radixkv.policies._hash_unit_kernels`: work per unit and per free-queue piece,
    host memory that grows with the cached units, not the pool), with the same records;
    afterwards :meth:`run_request` and :meth:`stats` continue it, and the per-block hooks
    (``admit``, ``extend``, ``finish``, ``peek_hit``, ``free_queue``, …) raise
    ``RuntimeError``. Set ``unit_granular = False`` to keep the per-block kernels.
    """

    name = "vllm"
    models_duplication = True
    models_metadata = True
    models_slot_positions = True
    decode_slot_local = True  # ``allocate_slots`` takes a block only when a token starts one
    aliases = ("block",)
    size_name = "block_size"
    default_size = 16
    admission_rule = "vllm"
    engine = "vllm"
    kernel_family = "hash"
    #: vllm:16@lfu, through the block-pool eviction hook: :mod:`radixkv.policies.eviction`
    #: parses it and builds :class:`~radixkv.policies.block_priority.PriorityBlockHashCache`
    #: for an order other than ``lru`` (that module imports this one)
    option_name = "eviction_policy"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16, *, verify: bool = False,
                 _key_bits: int = 64):
        nb = int(num_gpu_blocks)
        B = int(block_size)
        if B < 1:
            raise ConfigError(f"block_size must be ≥ 1, got {block_size}", field="block_size")
        if nb < 2:
            raise ConfigError(
                f"num_gpu_blocks must be ≥ 2 (block 0 is vLLM's null block), got {num_gpu_blocks}",
                field="num_gpu_blocks",
            )
        if nb >= 2**31:
            raise ConfigError(f"num_gpu_blocks must be < 2**31 (32-bit block ids), got {num_gpu_blocks}",
                              field="num_gpu_blocks")
        super().__init__(nb - 1, B)
        self.num_gpu_blocks = nb
        self.block_size = B
        self.verify = bool(verify)
        self._key_mask = np.uint64((1 << int(_key_bits)) - 1 if _key_bits < 64 else 0xFFFFFFFFFFFFFFFF)
        # key table: power of two with a free row left when every hashed block has a key,
        # a parent key and a sibling group (parent key, first token) of its own
        # (≤ 3 (nb − 1) rows); typical load ≤ 1/2
        cap = 8
        while cap < 3 * nb + 2:
            cap *= 2
        self._kt_rows = cap
        self._arrays = None  # the per-block pool, made on first use (_pool_arrays)
        self._unit = None  # the unit-granular pool of a sequential hash-id replay (replay_span)
        self._pcid = np.zeros((nb, 0), dtype=np.int64)
        # piece starts are < block_size: 2 bytes each unless the blocks are huge
        self._pcs_dtype = np.int16 if B < 2**15 else np.int32
        self._pcs = np.zeros((nb, 0), dtype=self._pcs_dtype)
        self._running: dict[int, _Running] = {}
        self._dr_lists = None  # decode_run: typed lists of per-request arrays, position = rid
        self._dr_owner: list = []
        self._partial = 0  # Σ over running requests of their partial block's tokens
        self._scratch = np.zeros(64, dtype=np.int64)
        self._scratch2 = np.zeros((2, 64), dtype=np.int64)  # run_request: keys, block table

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens: int, block_size: int = 16, **kw) -> "BlockHashCache":
        """A pool of ``capacity_tokens // block_size`` usable blocks (plus the null block).

        Raises
        ------
        radixkv.errors.ConfigError
            When the capacity holds no whole block.
        """
        B = int(block_size)
        if B < 1:
            raise ConfigError(f"block_size must be ≥ 1, got {block_size}", field="block_size")
        usable = int(capacity_tokens) // B
        if usable < 1:
            raise ConfigError(
                f"capacity of {capacity_tokens} tokens holds no {B}-token block", field="capacity_tokens"
            )
        return cls(usable + 1, B, **kw)

    @classmethod
    def from_engine_pool(cls, pool, size, **kw):
        """vLLM's own terms: ``num_gpu_blocks`` blocks, block 0 the null block."""
        if pool.num_gpu_blocks is None:
            return None
        return cls(int(pool.num_gpu_blocks), cls.default_size if size is None else int(size), **kw)

    # ------------------------------------------------------------------ per-block arrays
    def _pool_arrays(self):
        """The per-block pool (block records, key table, counters), made and initialised on
        first use: a pool that replays a hash-id trace at unit granularity never needs it.

        Raises
        ------
        RuntimeError
            When this pool has run at unit granularity (``replay_span`` on a hash-id
            trace): it keeps no per-block state, so per-block hooks cannot continue it.
        """
        if self._arrays is None:
            if self._unit is not None:
                raise RuntimeError(
                    f"{type(self).__name__}: this pool replayed a hash-id trace at unit granularity "
                    "(sequential replay_span, radixkv.policies._hash_unit_kernels) and keeps no per-block state; "
                    "admit/extend/finish/peek_hit/free_queue need a fresh pool (or unit_granular = False)")
            nb = self.num_gpu_blocks
            blk = _aligned(nb, K.NF, 64)
            kt = _aligned(self._kt_rows, K.NT, 32)
            state = np.zeros(K.NST + nb + 1, dtype=np.int64)  # counters, then the cascade stack
            K.init_pool(blk, blk.view(np.int32), state[: K.NST])
            self._arrays = (blk, blk.view(np.int32), kt, kt.view(np.int32), state, state[: K.NST], state[K.NST:])
        return self._arrays

    _blk = property(lambda self: self._pool_arrays()[0])
    _b32 = property(lambda self: self._pool_arrays()[1])
    _kt = property(lambda self: self._pool_arrays()[2])
    _k32 = property(lambda self: self._pool_arrays()[3])
    _state = property(lambda self: self._pool_arrays()[4])
    _st = property(lambda self: self._pool_arrays()[5])
    _stk = property(lambda self: self._pool_arrays()[6])

    #: run the sequential replay of a hash-id trace whose unit is a multiple of
    #: ``block_size`` on the unit-granular pool (same records; False: per block)
    unit_granular = True
    #: ``replay_span`` takes ``detail=(half, every, n)`` and fills those rows as
    #: ``stats(detail=True)`` would (:func:`radixkv.replay.sequential.replay_rows`)
    span_detail_rows = True

    def _unit_eligible(self, trace) -> bool:
        """True when ``replay_span`` may switch this pool to the unit-granular model: this
        class itself (no subclass hooks), ``verify`` off, 64-bit keys, ``block_size`` ≥ 2,
        the trace's unit a multiple of it, no output ids, nothing cached or running yet,
        compiled kernels."""
        U = int(trace.unit_tokens)
        B = self.block_size
        if not (self.unit_granular and type(self) is BlockHashCache and not self.verify and B >= 2
                and U >= B and U % B == 0 and trace.out_ids is None and not self._running and not self._partial
                and int(self._key_mask) == 0xFFFFFFFFFFFFFFFF and hasattr(K.run_seq, "py_func")):
            return False
        if self._arrays is None:
            return True
        st = self._st
        return st[K.ST_NHASHED] == 0 and st[K.ST_NUSED] == 0 and st[K.ST_EVICTIONS] == 0

    # ------------------------------------------------------------------ helpers
    def _tag(self, rid) -> int:
        """The tag a request's blocks carry in the free order's statistics (0: none kept)."""
        return 0

    def _order(self, tag: int) -> tuple:
        """The pool kernels' last arguments: the free order (``fo`` of
        :func:`radixkv.policies._hash_kernels.admit`), a one-tuple. Here vLLM's free queue
        (:data:`~radixkv.policies._hash_kernels.FREE_QUEUE`); a subclass evicting by a
        priority gives its :class:`~radixkv.policies._hash_kernels.PrioOrder` for a request of *tag*."""
        return (K.FREE_QUEUE,)

    def _keys(self, seq: KVSeq) -> np.ndarray:
        """Chained keys of every full block of *seq*'s KV extent; grows piece storage."""
        keys, max_pieces = K.seq_block_keys(seq.seg_id, seq.seg_end, self.block_size,
                                            seq.kv_len // self.block_size, self._key_mask)
        if max_pieces - 1 > self._pcid.shape[1]:
            self._grow_pieces(max_pieces)
        return keys

    def _grow_pieces(self, max_pieces: int) -> None:
        """Widen the content-piece arrays so that a block of *max_pieces* pieces fits."""
        cx = self._pcid.shape[1]
        c = min(self.block_size - 1, max(2 * cx, int(max_pieces) - 1))
        pcid = np.zeros((self.num_gpu_blocks, c), dtype=np.int64)
        pcs = np.zeros((self.num_gpu_blocks, c), dtype=self._pcs_dtype)
        pcid[:, :cx] = self._pcid
        pcs[:, :cx] = self._pcs
        self._pcid, self._pcs = pcid, pcs

    def _table(self, seq: KVSeq, persistent: bool) -> np.ndarray:
        n = -(-seq.kv_len // self.block_size)
        if persistent:
            return np.empty(n, dtype=np.int64)
        if self._scratch.shape[0] < n:
            self._scratch = np.empty(max(n, 2 * self._scratch.shape[0]), dtype=np.int64)
        return self._scratch

    def _lookup(self, seq: KVSeq, n_tokens: int | None):
        """Side-effect-free lookup of *seq*'s first ``max(P, n_tokens)`` tokens: (hit blocks,
        the scratch table whose first entries are the hit block ids, the looked-up length L
        in tokens). Shared by :meth:`peek_hit` and :meth:`admission_slots`."""
        L = max(seq.prompt_len, self._admit_length((), -1, seq, n_tokens))
        B = self.block_size
        n_look = L // B
        keys, _ = K.seq_block_keys(seq.seg_id, seq.seg_end, B, n_look, self._key_mask)
        tbl = self._table(seq, False)
        code, h = K.py_peek(self._blk, self._b32, self._kt, self._k32, self._pcid, self._pcs, keys, n_look,
                            seq.seg_id, seq.seg_end, B, L, self.verify, tbl)
        if code == K.COLLISION:
            self._collision(seq)
        return int(h), tbl, L

    def _collision(self, seq: KVSeq):
        raise HashCollisionError(
            f"request row {seq.index}: a 64-bit block-hash collision served a block whose content "
            "differs from the prompt (verify=True)"
        )

    # ------------------------------------------------------------------ hooks
    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission | None:
        """Look up *seq*'s prompt and allocate blocks for its first *n_tokens* tokens.

        Parameters
        ----------
        rid : int
            Handle of the request; must not be running.
        seq : KVSeq
            The request's KV content.
        n_tokens : int or None
            Tokens that have KV after admission; default ``seq.prompt_len``. Fewer than P
            admits a first prefill chunk; more than P re-admits a preempted request (see
            the module docstring). Must satisfy ``1 ≤ n_tokens ≤ seq.kv_len``.

        Returns
        -------
        Admission or None
            None (state unchanged) when ``ceil(L / B) − hit_blocks`` new blocks plus the
            touched hit blocks exceed the free queue (L = ``max(P, n_tokens)``).

        Raises
        ------
        ValueError
            When *rid* is already running or *n_tokens* is out of range.
        HashCollisionError
            With ``verify=True``, on a hash collision (state unchanged).
        """
        P = seq.prompt_len
        n = self._admit_length(self._running, rid, seq, n_tokens)
        keys = self._keys(seq)
        tbl = self._table(seq, True)
        tag = self._tag(rid)
        code, hit_blocks, held, ev, nblk = K.py_admit(
            self._blk, self._b32, self._kt, self._k32, self._pcid, self._pcs, self._st, self._stk, keys,
            seq.seg_id, seq.seg_end, self.block_size, P, max(P, n), n, self.verify, tbl, *self._order(tag))
        if code == K.COLLISION:
            self._collision(seq)
        if code == K.REFUSED:
            return None
        B = self.block_size
        ntok = max(n, int(hit_blocks) * B)
        self._running[rid] = _Running(seq, keys, tbl, int(nblk), ntok, tag)
        self._partial += ntok % B
        self.evictions += int(ev)
        self.evicted_tokens_total += int(ev) * B
        return Admission(hit_tokens=int(hit_blocks) * B, held_tokens=int(min(held, P)), evicted_tokens=int(ev) * B)

    def peek_hit(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Hit tokens that ``admit(rid, seq, n_tokens)`` would get now, without side effects.

        The lookup of :meth:`admit` (first-miss walk, hit capped at ``(L − 1) // B``
        blocks, L = ``max(P, n_tokens)``) with no touch, no free-queue change and no
        allocation. The value is returned whether or not the admission would fit (the
        scheduler's ``lpm`` ordering and SGLang-style admission budget use it; vLLM's
        ``get_computed_blocks`` is likewise side-effect free).

        Parameters
        ----------
        seq : KVSeq
            The request's KV content.
        n_tokens : int or None
            As for :meth:`admit`; default ``seq.prompt_len``.

        Returns
        -------
        int
            Hit tokens, a multiple of ``block_size``.

        Raises
        ------
        ValueError
            When *n_tokens* is out of ``[1, seq.kv_len]``.
        HashCollisionError
            With ``verify=True``, on a hash collision.
        """
        h, _, _ = self._lookup(seq, n_tokens)
        return h * self.block_size

    def admission_slots(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Blocks that ``admit(rid, seq, n_tokens)`` would take out of the free queue, without
        side effects: new blocks for the whole sequence plus the hit blocks it would touch.

        vLLM's ``get_num_blocks_to_allocate`` for an admission checked on the full sequence
        (``allocate_slots(full_sequence_must_fit=True)``): ``ceil(L / B) − hit_blocks`` plus
        the hit blocks with ref_cnt 0 (they leave the free queue when touched), L =
        ``max(P, n_tokens)``. :meth:`admit` refuses exactly when this exceeds the free
        queue; the scheduler compares it with the free queue minus vLLM's watermark
        (``KVCacheManager.allocate_slots``).

        Parameters
        ----------
        seq : KVSeq
            The request's KV content.
        n_tokens : int or None
            As for :meth:`admit`; default ``seq.prompt_len``.

        Returns
        -------
        int
            Blocks (≥ 0).

        Raises
        ------
        ValueError
            When *n_tokens* is out of ``[1, seq.kv_len]``.
        HashCollisionError
            With ``verify=True``, on a hash collision.
        """
        h, tbl, L = self._lookup(seq, n_tokens)
        touch = int(np.count_nonzero(self._b32[tbl[:h], K.R_REF] == 0)) if h else 0
        return -(-L // self.block_size) - h + touch

    def extend(self, rid: int, n_tokens: int) -> bool:
        """Request *rid* computes *n_tokens* more tokens (a prefill chunk or decode steps).

        Blocks that become full are cached at the end of the step (vLLM
        ``cache_blocks``). Returns False, state unchanged, when the new blocks exceed the
        free queue.

        Raises
        ------
        ValueError
            When the request would pass its KV extent ``seq.kv_len`` (content unknown).
        KeyError
            When *rid* is not running.
        """
        r = self._running[rid]
        n = int(n_tokens)
        if n < 0 or r.n_tokens + n > r.seq.kv_len:
            raise ValueError(
                f"request {rid}: extending {r.n_tokens} tokens by {n} passes its KV extent {r.seq.kv_len}"
            )
        if n == 0:
            return True
        ok, nblk, ev = K.py_extend(
            self._blk, self._b32, self._kt, self._k32, self._pcid, self._pcs, self._st, self._stk, r.keys,
            r.seq.seg_id, r.seq.seg_end, self.block_size, r.tbl, r.n_blocks, r.n_tokens, n, *self._order(r.tag))
        if not ok:
            return False
        r.n_blocks = int(nblk)
        B = self.block_size
        self._partial += (r.n_tokens + n) % B - r.n_tokens % B
        r.n_tokens += n
        self.evictions += int(ev)
        self.evicted_tokens_total += int(ev) * self.block_size
        return True

    def extend_many(self, rids, n_tokens) -> int:
        """:meth:`PrefixCache.extend_many`: the same as :meth:`extend` item by item, but a
        step that neither takes a block nor fills one (most decode tokens) only counts
        tokens, without a kernel call."""
        if type(self).extend is not BlockHashCache.extend or type(self)._order is not BlockHashCache._order:
            # a subclass's extend or free order decides
            return super().extend_many(rids, n_tokens)
        if isinstance(n_tokens, int):
            n_tokens = [n_tokens] * len(rids)
        running = self._running
        B = self.block_size
        for j, (rid, n) in enumerate(zip(rids, n_tokens)):
            r = running[rid]
            n = int(n)
            n0 = r.n_tokens
            t = n0 + n
            if n <= 0 or t > r.seq.kv_len:
                if not self.extend(rid, n):  # raises on bad input; n == 0 is a no-op
                    return j
                continue
            nblk = (t + B - 1) // B
            if nblk <= r.n_blocks and t // B == n0 // B:  # the kernel would only count tokens
                r.n_blocks = nblk
                self._partial += t % B - n0 % B
                r.n_tokens = t
            elif not self.extend(rid, n):
                return j
        return len(rids)

    def decode_run(self, rids, kv0, k: int, out: np.ndarray) -> bool:
        """Steps 2 … k of a fast-forwarded run of k decode steps of *rids*, in one kernel
        call: the same ``extend`` calls, in the same order, as the scheduler's lazy
        ``decode_slot_local`` loop makes (``Scheduler._lazy_slot_local``), and the same
        pool samples.

        Parameters
        ----------
        rids : list of int
            The running requests, in running order (step 1 already applied).
        kv0 : np.ndarray, int64, shape (n,)
            The scheduler's KV tokens of each request after step 1.
        k : int
            Steps in the run (≥ 2).
        out : np.ndarray, int64, shape (k, 3)
            Row 0 holds the pool after step 1; rows 1 … k − 2 are filled with
            ``used_slots``, ``cached_slots``, ``valid_tokens`` after each step.

        Returns
        -------
        bool
            False (nothing done) for a subclass that overrides ``extend`` or the free order: the scheduler
            then makes the calls one by one.

        Raises
        ------
        RuntimeError
            When the pool refuses a block (the scheduler's room bound said it was there).
        ValueError
            When a request would pass its KV extent.
        """
        if type(self).extend is not BlockHashCache.extend or type(self)._order is not BlockHashCache._order:
            return False
        rs = [self._running[rid] for rid in rids]
        kern = BK.decode_run_slot_local
        # per-request arrays in lists kept across runs (position = rid), refreshed when
        # the rid's record changed (a new admission)
        if self._dr_lists is None:
            self._dr_lists = [_typed_list([]) for _ in range(4)]
            self._dr_owner = []
        lists, owner = self._dr_lists, self._dr_owner
        for rid, r in zip(rids, rs):
            if rid >= len(owner):
                grow = rid + 1 - len(owner)
                owner.extend([None] * grow)
                for lst in lists:
                    for _ in range(grow):
                        lst.append(_EMPTY)
            if owner[rid] is not r:
                owner[rid] = r
                lists[0][rid] = r.keys
                lists[1][rid] = r.seq.seg_id
                lists[2][rid] = r.seq.seg_end
                lists[3][rid] = r.tbl
        n = len(rs)
        at = np.asarray(rids, dtype=np.int64)
        nblk = np.fromiter((r.n_blocks for r in rs), dtype=np.int64, count=n)
        ntok = np.fromiter((r.n_tokens for r in rs), dtype=np.int64, count=n)
        kvlen = np.fromiter((r.seq.kv_len for r in rs), dtype=np.int64, count=n)
        status, ev, partial = kern(self._blk, self._b32, self._kt, self._k32, self._pcid, self._pcs, self._st,
                                   self._stk, *lists, at, nblk, ntok, kvlen, np.asarray(kv0, dtype=np.int64),
                                   self.block_size, int(k), out, self._partial, K.FREE_QUEUE)
        for r, b, t in zip(rs, nblk.tolist(), ntok.tolist()):
            r.n_blocks = b
            r.n_tokens = t
        self._partial = int(partial)
        self.evictions += int(ev)
        self.evicted_tokens_total += int(ev) * self.block_size
        if status <= -2:
            j = -2 - int(status)
            raise ValueError(f"request {rids[j]}: a decode run passes its KV extent {rs[j].seq.kv_len}")
        if status >= 0:
            raise RuntimeError(f"{type(self).__name__} refused decode tokens of request {rids[int(status)]} "
                               "that its reported free + evictable room should hold")
        return True

    def warm_kernels(self) -> None:
        """Compile the batched decode kernel and, for this class itself, the unit-keyed
        pool's kernels; the sequential warm-up replay uses neither. (The compiled
        concurrent loop is a driver's: :func:`radixkv.replay.run.warmup` warms it.)"""
        kern = BK.decode_run_slot_local
        if not hasattr(kern, "py_func"):
            return
        z = np.zeros(0, dtype=np.int64)
        out = np.zeros((2, 3), dtype=np.int64)
        lists = [_typed_list([]) for _ in range(4)]
        kern(self._blk, self._b32, self._kt, self._k32, self._pcid, self._pcs, self._st, self._stk, *lists,
             z, z.copy(), z.copy(), z.copy(), z.copy(), self.block_size, 2, out, 0, K.FREE_QUEUE)
        if type(self) is BlockHashCache and self.block_size >= 2 and self.unit_granular:
            from radixkv.policies._hash_unit_kernels import warm as warm_units

            warm_units(self.block_size)

    def _warm_kernels_lean(self) -> None:
        """The lean warm-up's part of :meth:`warm_kernels` (:func:`radixkv.replay.run.warmup`
        with ``lean=True``): nothing for this class itself — on a token-id trace with the
        default settings the compiled concurrent loop runs, which calls neither the batched
        decode (the Python loop's) nor the unit-keyed pool (hash-id traces'); a subclass
        runs on the Python loop, so it warms both as before."""
        if type(self) is not BlockHashCache:
            self.warm_kernels()

    def finish(self, rid: int) -> None:
        """Release *rid*'s blocks tail first (hashed ones stay cached, evictable).

        Raises
        ------
        KeyError
            When *rid* is not running.
        """
        r = self._running.pop(rid)
        self._partial -= r.n_tokens % self.block_size
        K.py_free(self._b32, self._st, r.tbl, r.n_blocks, *self._order(r.tag))

    def preempt(self, rid: int) -> None:
        """Preemption by recompute: the blocks are freed exactly as on finish.

        vLLM ``Scheduler._preempt_request`` → ``KVCacheManager.free`` (docs/engines/vllm.md §4).
        """
        self.finish(rid)

    def run_request(self, rid: int, seq: KVSeq) -> Admission | None:
        """Admit, decode to the KV extent, finish: one kernel call (same result as the base)."""
        if rid in self._running:
            raise ValueError(f"request {rid} is already running")
        if self._unit is not None:
            return self._unit_run_request(seq)
        B = self.block_size
        kv = seq.kv_len
        if self._scratch2.shape[1] * B < kv:
            self._scratch2 = np.zeros((2, max(-(-kv // B), 2 * self._scratch2.shape[1])), dtype=np.int64)
        args = (self._scratch2, seq.seg_id, seq.seg_end, B, seq.prompt_len, kv, self.verify, self._key_mask, 0,
                *self._order(self._tag(rid)))
        code, hit_blocks, held, ev, decoded, total_ev = K.run_seq(
            self._blk, self._kt, self._pcid, self._pcs, self._state, *args)
        if code == K.NEED_PIECES:
            self._grow_pieces(hit_blocks)
            code, hit_blocks, held, ev, decoded, total_ev = K.run_seq(
                self._blk, self._kt, self._pcid, self._pcs, self._state, *args)
        if code == K.COLLISION:
            self._collision(seq)
        if code == K.REFUSED:
            return None
        # evictions by the decode step are the difference of the pool counter
        self.evictions = total_ev
        self.evicted_tokens_total = total_ev * B
        if not decoded:
            return None
        P = seq.prompt_len
        return Admission(hit_tokens=hit_blocks * B, held_tokens=held if held < P else P, evicted_tokens=ev * B)

    def replay_span(self, trace, i0: int, i1: int, cols: dict, detail=None) -> tuple[int, int]:
        """Sequential replay of requests ``i0 … i1−1`` of *trace* in one kernel call.

        Fills rows ``i0 … next−1`` of *cols* (the columns of
        :func:`radixkv.replay.sequential.replay_sequential`) exactly as
        :meth:`run_request` then ``stats(detail=False)`` would — ``stats(detail=True)``
        for the detail rows that *detail* ``(half, every, n)`` names (rows ``r ≥ half``
        with ``(r − half) % every == 0``, ``every ≥ 1``, and row ``n − 1``; see
        :attr:`span_detail_rows`) — and returns
        ``(next, status)``: ``next == i1`` when the span is done; otherwise request
        *next* goes through the Python path (status 1: content pieces to widen, or it
        does not fit the pool) or was refused (status 0 at admission, 2 at decode).
        Returns ``(i0, 1)`` when the fast path does not apply (requests running,
        ``verify=True``, kernels interpreted).
        """
        import radixkv.policies._hash_span as KS

        if i1 > i0 and self._unit is None and self._unit_eligible(trace):
            from radixkv.policies._hash_unit_kernels import UnitPool

            self._unit = UnitPool(self.num_gpu_blocks, self.block_size, int(trace.unit_tokens))
        if self._unit is not None:
            if detail is None:
                return self._unit_span(trace, i0, i1, cols)
            return self._unit_span_detail(trace, i0, i1, cols, detail)
        if self._running or self._partial or self.verify or i1 <= i0:
            return i0, 1
        if not hasattr(K.run_seq, "py_func"):
            return i0, 1  # the kernels run interpreted (radixkv.replay.jit): no compiled loop
        out = np.zeros((i1 - i0, KS.NC), dtype=np.int64)
        has_out = trace.out_ids is not None
        oids = trace.out_ids if has_out else trace.ids[:0]
        ooff = trace.out_offsets if has_out else trace.id_offsets[:1]
        nxt, status = KS.replay_span(
            self._blk, self._kt, self._pcid, self._pcs, self._state,
            trace.ids, trace.id_offsets, oids, ooff, has_out, trace.prompt_len, trace.output_len,
            int(trace.unit_tokens), int(i0), int(i1), self.num_slots, self.block_size, self._key_mask,
            KEY_ENTRY_BYTES, DUPLICATE_DICT_BYTES, out, *_detail_args(detail, i1), K.FREE_QUEUE)
        total_ev = int(self._st[K.ST_EVICTIONS])
        self.evictions = total_ev
        self.evicted_tokens_total = total_ev * self.block_size
        k = nxt - i0
        if k:
            for name, c in (("prompt_tokens", KS.C_PROMPT), ("hit_tokens", KS.C_HIT), ("held_tokens", KS.C_HELD),
                            ("evicted_tokens", KS.C_EVICTED), ("used_slots", KS.C_USED),
                            ("cached_slots", KS.C_CACHED), ("free_slots", KS.C_FREE),
                            ("valid_tokens", KS.C_VALID), ("duplicate_tokens", KS.C_DUP),
                            ("metadata_bytes", KS.C_META), ("cached_tokens", KS.C_CTOK),
                            ("largest_free_run", KS.C_LFR)):
                cols[name][i0:nxt] = out[:k, c]
        return int(nxt), int(status)

    # ------------------------------------------------------------------ stats
    def stats(self, detail: bool = True) -> PoolStats:
        """The pool now: O(1), plus one pass over the blocks for ``largest_free_run``.

        ``used_slots`` = blocks with ref_cnt > 0; ``cached_slots`` = blocks in the free
        queue that keep a key; ``free_slots`` = the rest. ``valid_tokens`` = B × hashed
        blocks + the filled part of each running request's partial block.
        ``cached_tokens`` = B × distinct keys reachable from the start of a chain (every
        ancestor key cached): what a lookup could hit. ``duplicate_tokens`` = B × (hashed
        blocks − distinct keys). ``metadata_bytes`` = distinct keys × ``KEY_ENTRY_BYTES``
        + keys held more than once × ``DUPLICATE_DICT_BYTES`` (vLLM's host-side map).
        ``largest_free_run`` counts consecutive block ids that are free.
        With ``detail=False`` (O(1), no loop over running requests) ``cached_tokens``
        and ``largest_free_run`` are −1, as the base class allows (the reachable-key
        count is kept incrementally, but −1 keeps replay records the same whatever the
        policy).
        """
        if self._unit is not None:
            return self._unit_stats(detail)
        st = self._st.tolist()
        B = self.block_size
        used = st[K.ST_NUSED]
        cached = st[K.ST_NCACHED]
        nhashed = st[K.ST_NHASHED]
        nkeys = st[K.ST_NKEYS]
        return PoolStats(
            num_slots=self.num_slots,
            slot_tokens=B,
            used_slots=used,
            cached_slots=cached,
            free_slots=self.num_slots - used - cached,
            valid_tokens=nhashed * B + self._partial,
            cached_tokens=st[K.ST_NREACH] * B if detail else -1,
            duplicate_tokens=(nhashed - nkeys) * B,
            metadata_bytes=nkeys * KEY_ENTRY_BYTES + st[K.ST_NDUPKEYS] * DUPLICATE_DICT_BYTES,
            largest_free_run=int(K.largest_free_run(self._b32)) if detail else -1,
        )

    # ------------------------------------------------------------------ unit granularity
    def _unit_run_request(self, seq: KVSeq) -> Admission | None:
        """:meth:`run_request` on the unit-granular pool."""
        import radixkv.policies._hash_unit_kernels as UK

        code, h, held, ev0, _ = self._unit.run_request(seq)
        if code == UK.NOT_UNIT:
            raise ValueError(f"request row {seq.index}: its segments are not units of {self._unit.U} tokens "
                             "then unique content (this pool runs a hash-id trace at unit granularity)")
        total = self._unit.counters()[3]
        self.evictions = total
        self.evicted_tokens_total = total * self.block_size
        if code == UK.REFUSED:
            return None
        P = seq.prompt_len
        B = self.block_size
        return Admission(hit_tokens=h * B, held_tokens=held if held < P else P, evicted_tokens=ev0 * B)

    def _unit_span(self, trace, i0: int, i1: int, cols: dict) -> tuple[int, int]:
        """:meth:`replay_span` on the unit-granular pool (a request that does not fit goes
        to the Python path, which reports it)."""
        import radixkv.policies._hash_unit_kernels as UK

        nxt, code, out = self._unit.span(trace, i0, i1, KEY_ENTRY_BYTES, DUPLICATE_DICT_BYTES)
        if code == UK.NOT_UNIT:
            raise ValueError(f"trace row {nxt}: its segments are not units of {self._unit.U} tokens")
        total = self._unit.counters()[3]
        self.evictions = total
        self.evicted_tokens_total = total * self.block_size
        k = nxt - i0
        if k:
            for name, c in (("prompt_tokens", UK.C_PROMPT), ("hit_tokens", UK.C_HIT), ("held_tokens", UK.C_HELD),
                            ("evicted_tokens", UK.C_EVICTED), ("used_slots", UK.C_USED),
                            ("cached_slots", UK.C_CACHED), ("free_slots", UK.C_FREE),
                            ("valid_tokens", UK.C_VALID), ("duplicate_tokens", UK.C_DUP),
                            ("metadata_bytes", UK.C_META)):
                cols[name][i0:nxt] = out[:k, c]
            cols["cached_tokens"][i0:nxt] = -1
            cols["largest_free_run"][i0:nxt] = -1
        return int(nxt), 1

    def _unit_span_detail(self, trace, i0: int, i1: int, cols: dict, detail) -> tuple[int, int]:
        """:meth:`_unit_span` with the detail rows of *detail* ``(half, every, n)``: the
        span stops before each of them, runs it alone and takes its two detailed columns
        from :meth:`_unit_stats` (``detail=True``; no request runs, so the other columns
        are the span's)."""
        half, every, n = detail
        i = i0
        while i < i1:
            # the next detail row from i on
            d = min(half if i < half else i + (half - i) % every, n - 1)
            if d > i:
                e = min(d, i1)
                j, status = self._unit_span(trace, i, e, cols)
                if j < e:
                    return j, status
                i = j
                continue
            j, status = self._unit_span(trace, i, i + 1, cols)
            if j == i:
                return j, status
            st = self._unit_stats(True)
            cols["cached_tokens"][i] = st.cached_tokens
            cols["largest_free_run"][i] = st.largest_free_run
            i = j
        return i1, 1

    def _unit_stats(self, detail: bool) -> PoolStats:
        """:meth:`stats` of the unit-granular pool (no request runs; reachable keys =
        distinct keys, see :mod:`radixkv.policies._hash_unit_kernels`)."""
        nh, nk, nd, _ = self._unit.counters()
        B = self.block_size
        return PoolStats(
            num_slots=self.num_slots, slot_tokens=B, used_slots=0, cached_slots=nh,
            free_slots=self.num_slots - nh, valid_tokens=nh * B,
            cached_tokens=nk * B if detail else -1, duplicate_tokens=(nh - nk) * B,
            metadata_bytes=nk * KEY_ENTRY_BYTES + nd * DUPLICATE_DICT_BYTES,
            largest_free_run=self._unit.largest_free_run() if detail else -1,
        )

    # ------------------------------------------------------------------ inspection
    def free_queue(self) -> np.ndarray:
        """Block ids in the free queue, head (next to be taken) first; int64, O(length)."""
        return K.free_queue(self._b32, self._st)

    def block_table(self, rid: int) -> np.ndarray:
        """Block ids held by running request *rid*, in order (int64 copy)."""
        r = self._running[rid]
        return r.tbl[: r.n_blocks].copy()


_EMPTY = np.zeros(0, dtype=np.int64)


def _detail_args(detail, i1: int) -> tuple[int, int, int]:
    """``(half, every, n_rows)`` of :func:`radixkv.policies._hash_span.replay_span`: those
    of *detail*, or, when it is None, values that name no row below *i1*."""
    if detail is None:
        return int(i1), 1, 0
    half, every, n = detail
    return int(half), int(every), int(n)


def _typed_list(arrays):
    """A Numba typed List of 1-D int64 arrays (the batched kernel's argument)."""
    from numba import types
    from numba.typed import List

    out = List.empty_list(types.int64[::1])
    for a in arrays:
        out.append(a)
    return out
