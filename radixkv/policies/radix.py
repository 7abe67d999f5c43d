"""``RadixCache``: SGLang's RadixAttention prefix cache, exact to the engine.

A radix tree of token runs over one pool of KV slots, as SGLang 0.5.23 runs it for a
full-attention model (``srt/mem_cache/unified_radix_cache.py :: UnifiedRadixCache`` with
its tree core ``unified_cache/unified_tree_core.py :: UnifiedTreeCore``; the classic
``srt/mem_cache/radix_cache.py :: RadixCache`` and the Rust tree core give the same hits,
docs/engines/sglang.md §0). Every rule below names its source; the golden files in
the shared golden set (docs/golden.md; real SGLang, request for request) are reproduced exactly.

Tree
----
Each node holds a run of tokens ``[start, end)`` (its depth in the tree is its first token
position) and the same number of KV slots. Runs are stored as references into the
segments of the request that inserted them (copied once into a segment store), so no
token array is ever built; comparisons run segment by segment
(:func:`~radixkv.policies._radix_kernels.common_prefix_end`). Children are keyed by their
first token (``page_size`` p = 1) or by their first page (p > 1)
(``radix_cache.py :: get_child_key`` / ``RadixKey.child_key``).

The whole tree — nodes, child hash table, eviction heap, segment store — lives in int64
arrays, and every operation (a whole sequential request: lookup, split, insert,
eviction, lock moves) is one numba call into :mod:`radixkv.policies._radix_kernels`;
this class only checks arguments, keeps the arrays large enough and wraps results.

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
  prefill the boundary already exists and the second insert only re-touches the path;
  when the prompt does not end before the KV inserted, it would re-touch the nodes just
  touched, in the same order, which changes no eviction, and is skipped, as SGLang's
  ``checkpoint_into_tree`` skips it.)
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

Choices (docs/SEMANTICS.md "Choices the golden replays make")
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
  remaining part exceeds the chunk size is prefilled in chunks: the first one of
  ``chunked_prefill_size // p * p`` tokens (``PrefillAdder.add_one_req`` →
  ``_select_prefill_admission`` rounds its end down to a page), every later one of
  ``chunked_prefill_size`` tokens as given (``add_chunked_req`` takes
  ``min(rest, available_chunk_tokens)`` without rounding; for a lone request the memory
  term never binds, since its admission checked that the whole prompt and its outputs
  fit). With a size that is not a multiple of p the later chunk ends leave the page
  grid; each checkpoint inserts the whole pages computed so far, and the next chunk's
  allocation (chunk tokens + one page of headroom) continues the request's partial page.
  Checked against SGLang's own ``PrefillAdder`` (tests/test_radix_chunked_golden.py).
- A refused admission or extension (the pool cannot make room even by evicting all
  that is evictable) returns None / False and leaves the state untouched: no split, no
  LRU touch, no eviction. SGLang's scheduler would have run the lookup (and its touch)
  before deciding; a lone request that does not fit is an input error upstream.
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
import radixkv.policies._radix_kernels as K
from radixkv.policies._radix_kernels import child_key, token_key
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.trace.types import KVSeq

#: bits of an LRU time stamp below the counter draw (room for the per-level −1e-5 steps)
_STAMP_SHIFT = K.STAMP_SHIFT

#: estimated host bytes per tree node (SGLang's Python ``TreeNode``: object and
#: ``__dict__``, children dict, ``RadixKey`` and value-tensor headers) — an
#: order-of-magnitude estimate, not a measurement
NODE_OVERHEAD_BYTES = 1024
#: host bytes per cached token: an 8-byte token id in the node key (``array('q')``) and
#: an 8-byte int64 slot index in the node value tensor
BYTES_PER_TOKEN = 16


class _Req:
    """A running request: its content and its row of kernel state (``R_*`` fields)."""

    __slots__ = ("seq", "row")

    def __init__(self, seq):
        self.seq = seq
        self.row = np.zeros(K.NR, dtype=np.int64)

    @property
    def node(self) -> int:
        """Last tree node, locked (with its ancestors)."""
        return int(self.row[K.R_NODE])

    @property
    def owned(self) -> int:
        """Tokens ``[0, owned)`` use tree slots (page-aligned)."""
        return int(self.row[K.R_OWNED])

    @property
    def computed(self) -> int:
        """Tokens ``[0, computed)`` have KV; ``[owned, computed)`` are private."""
        return int(self.row[K.R_COMP])

    @property
    def kv_max(self) -> int:
        """The request's KV extent (tokens)."""
        return int(self.row[K.R_KVMAX])

    @property
    def evicted(self) -> int:
        """Tokens evicted on the request's behalf."""
        return int(self.row[K.R_EVICTED])


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


class SGLangPoolTerms:
    """The device pool in SGLang's terms, shared by the policies on SGLang's radix tree
    (:class:`RadixCache` and its eviction orders,
    :class:`~radixkv.policies.hicache.HiCacheRadixCache`).

    ``max_total_num_tokens`` tokens in pages of ``--page-size`` p, all usable
    (``allocator/token.py``, ``allocator/paged.py``); a size from outside is rounded down
    to a whole page (``pool_configurator.py :: calculate_pool_sizes``).
    """

    size_name = "page_size"
    default_size = 1
    admission_rule = "sglang"
    engine = "sglang"

    @staticmethod
    def pool_terms(max_total_num_tokens: int, page_size: int) -> tuple[int, int]:
        """``(max_total_num_tokens, page_size)`` as ints, checked.

        Raises
        ------
        radixkv.errors.ConfigError
            On a page below 1 or a size that is not a positive multiple of the page.
        """
        p = int(page_size)
        if p < 1:
            raise ConfigError(f"page_size must be ≥ 1, got {page_size}", field="page_size")
        total = int(max_total_num_tokens)
        if total < p or total % p:
            raise ConfigError(
                f"max_total_num_tokens must be a positive multiple of page_size={p}, got {max_total_num_tokens}",
                field="max_total_num_tokens",
            )
        return total, p

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens: int, page_size: int = 1, **kwargs):
        """A cache of ``capacity_tokens`` rounded down to a whole page, as SGLang rounds
        ``max_total_num_tokens`` (``pool_configurator.py :: calculate_pool_sizes``)."""
        p = int(page_size)
        if p < 1:
            raise ConfigError(f"page_size must be ≥ 1, got {page_size}", field="page_size")
        return cls(int(capacity_tokens) // p * p, p, **kwargs)

    @classmethod
    def from_engine_pool(cls, pool, size, **kwargs):
        """SGLang's own terms: ``max_total_num_tokens``, rounded down to a whole page."""
        if pool.max_total_num_tokens is None:
            return None
        p = cls.default_size if size is None else int(size)
        return cls(int(pool.max_total_num_tokens) // p * p, p, **kwargs)


class RadixCache(SGLangPoolTerms, PrefixCache):
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

    name = "sglang"
    aliases = ("radix",)
    models_duplication = True
    models_metadata = True
    decode_free_first = True  # ``_decode`` evicts only when no slot/page is free
    #: ``replay_span`` takes ``detail=(half, every, n)`` and fills those rows as
    #: ``stats(detail=True)`` would (:func:`radixkv.replay.sequential.replay_rows`)
    span_detail_rows = True
    #: ``match_and_lock`` / ``commit`` / ``defer_insert`` drive this class's kernels
    #: (SGLang's batch visibility in :mod:`radixkv.replay.sched_sglang`)
    batch_visibility = True
    kernel_family = "radix"
    #: sglang:1@lfu (SGLang --radix-eviction-policy): :mod:`radixkv.policies.eviction` parses
    #: it and builds :class:`~radixkv.policies.radix_priority.PriorityRadixCache` for an order
    #: other than ``lru`` (that module imports this one, so this class cannot name it)
    option_name = "eviction_policy"

    def __init__(
        self,
        max_total_num_tokens: int,
        page_size: int = 1,
        *,
        chunked_prefill_size: int | None = None,
        cache_last_token_on_stop: bool = False,
    ):
        total, p = self.pool_terms(max_total_num_tokens, page_size)
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
        S = np.zeros(K.NS, dtype=np.int64)
        S[K.S_FREE] = self.num_slots
        S[K.S_NFREE] = -1
        S[K.S_QFREE] = -1
        S[K.S_HW] = 1
        S[K.S_P] = p
        S[K.S_CHUNK] = 0 if chunk is None else chunk  # as given: the kernels round the first chunk
        self._S = S
        N = np.zeros((256, K.NF), dtype=np.int64)
        N[0, K.F_PARENT] = -1
        N[0, K.F_SEQ] = -1
        N[0, K.F_LOCK] = 1  # the root is never evicted (``reset``)
        N[0, K.F_ALIVE] = 1
        self._N = N
        self._H1 = self._empty_table(1024)
        self._H2 = self._empty_table(1024 if self._paged else 1)
        self._HP = np.zeros((1024, 3), dtype=np.int64)
        self._G = np.zeros((2, 4096), dtype=np.int64)
        self._Q = np.zeros((256, 4), dtype=np.int64)
        self._reqs: dict[int, _Req] = {}
        self._row = np.zeros(K.NR, dtype=np.int64)  # scratch request row (run_request)
        self._tag = 0  # the last tag given to a request whose handle is not an int
        # upper bounds on the node count, store use and sequence rows (see ``_reserve``)
        self._nn_hi = 1
        self._g_hi = 0
        self._q_hi = 0

    @staticmethod
    def _empty_table(n: int) -> np.ndarray:
        h = np.zeros((n, 4), dtype=np.int64)
        h[:, 3] = -1
        return h

    # ------------------------------------------------------------------ array capacity
    def _order(self):
        """The eviction order passed to the tree kernels (:mod:`radixkv.policies._radix_kernels`,
        "Eviction orders"): LRU over the heap ``_HP``."""
        return K.lru_order(self._HP)

    def _grow_heap(self, size: int) -> None:
        """Make the eviction heap hold at least *size* entries (existing ones kept)."""
        if size > self._HP.shape[0]:
            HP2 = np.zeros((size, 3), dtype=np.int64)
            HP2[: self._HP.shape[0]] = self._HP
            self._HP = HP2

    def _next_tag(self, rid) -> int:
        """The tag given to a request's nodes (read by keyed eviction orders): its handle
        when an int, else a counter."""
        if isinstance(rid, (int, np.integer)):
            return int(rid)
        self._tag += 1
        return self._tag

    def _before_request(self, rid, seq) -> None:
        """Called before each admission (subclasses: e.g. advance a clock in an eviction
        priority's parameters)."""

    def _state(self):
        return self._S, self._N, self._H1, self._H2, self._order(), self._G, self._Q

    def _reserve(self, new_nodes: int, new_segments: int) -> None:
        """Make the arrays hold *new_nodes* more nodes and a sequence of *new_segments*.

        Checked against upper bounds kept in Python (the counts only grow by what the
        calls reserve); the arrays are read and grown only when a bound reaches a
        capacity."""
        self._nn_hi += new_nodes
        self._g_hi += new_segments
        self._q_hi += 1
        if self._nn_hi >= self._N.shape[0] or self._g_hi > self._G.shape[1] or self._q_hi >= self._Q.shape[0]:
            self._reserve_exact(new_nodes, new_segments)

    def _reserve_exact(self, new_nodes: int, new_segments: int) -> None:
        S = self._S
        nn, used, qhw = int(S[K.S_NNODES]), int(S[K.S_GUSED]), int(S[K.S_QHW])
        if nn + 1 + new_nodes > self._N.shape[0]:
            self._grow_nodes(nn + 1 + new_nodes)
        if used + new_segments > self._G.shape[1]:
            live = used - int(S[K.S_GGARB])
            size = self._G.shape[1]
            if live + new_segments <= size // 2:
                K.compact_store(S, self._G, self._Q)  # at least half the store comes free
            else:
                while live + new_segments > size // 2:
                    size *= 2
                G2 = np.zeros((2, size), dtype=np.int64)
                G2[:, :used] = self._G[:, :used]
                self._G = G2
                K.compact_store(S, G2, self._Q)
        if qhw + 1 >= self._Q.shape[0]:
            Q2 = np.zeros((2 * self._Q.shape[0], 4), dtype=np.int64)
            Q2[: self._Q.shape[0]] = self._Q
            self._Q = Q2
        self._nn_hi = nn + 1 + new_nodes
        self._g_hi = int(S[K.S_GUSED]) + new_segments
        self._q_hi = int(S[K.S_QHW]) + 1

    def reserve_arrays(self, new_nodes: int, new_segments: int, new_rows: int) -> None:
        """Make the tree's arrays hold *new_nodes* more nodes, *new_segments* more stored
        segments and *new_rows* more stored sequences (for a caller that runs the tree
        kernels itself: the compiled concurrent loop, :mod:`radixkv.replay.conc_sglang`),
        then :meth:`sync_bounds`. Grows or compacts as :meth:`_reserve` does."""
        self._reserve_exact(int(new_nodes), int(new_segments))
        S = self._S
        while int(S[K.S_QHW]) + int(new_rows) >= self._Q.shape[0]:
            Q2 = np.zeros((2 * self._Q.shape[0], 4), dtype=np.int64)
            Q2[: self._Q.shape[0]] = self._Q
            self._Q = Q2
        self.sync_bounds()

    def sync_bounds(self) -> None:
        """Reset the Python-side upper bounds of :meth:`_reserve` (nodes, store use,
        sequence rows) and the eviction totals from the arrays, after kernels were run
        on them directly."""
        S = self._S
        self._nn_hi = int(S[K.S_NNODES]) + 1
        self._g_hi = int(S[K.S_GUSED])
        self._q_hi = int(S[K.S_QHW])
        self._sync()

    def _grow_nodes(self, need: int) -> None:
        cap = self._N.shape[0]
        while cap < need:
            cap *= 2
        N2 = np.zeros((cap, K.NF), dtype=np.int64)
        N2[: self._N.shape[0]] = self._N
        self._N = N2
        self._H1 = self._empty_table(4 * cap)
        self._H2 = self._empty_table(4 * cap if self._paged else 1)
        K.rehash(self._S, N2, self._H1, self._H2)
        self._grow_heap(4 * cap)

    def _node_budget(self, P: int) -> int:
        """Upper bound on the nodes one request's calls can create (≤ 2 per checkpoint)."""
        chunks = 1 if self._chunk is None else P // self._chunk + 2
        return 2 * chunks + 8

    def _sync(self) -> None:
        self.evicted_tokens_total = int(self._S[K.S_EVTOT])
        self.evictions = int(self._S[K.S_EVN])

    def warm_kernels(self) -> None:
        """Compile the store compaction and heap rebuild (a tiny replay reaches neither).
        (The compiled concurrent loop is a driver's: :func:`radixkv.replay.run.warmup`
        warms it.)"""
        K.compact_store(self._S, self._G, self._Q)
        self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        """Drop stale heap entries (done by the kernels when they outnumber the nodes)."""
        K.heap_rebuild(self._S, self._N, self._order())

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
            Tokens with KV after admission (hit + computed). Default: the prompt, or its
            first chunk under ``chunked_prefill_size``. Above P (≤ ``seq.kv_len``): the
            re-admission of a retracted request, whose lookup and prefill cover prompt +
            generated tokens (SGLang ``Req.init_next_round_input``: ``fill_ids =
            origin_input_ids + output_ids``, matched up to ``len(fill_ids) − 1``); the
            checkpoint after that prefill inserts all *n_tokens*.

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
            When *rid* is already running or *n_tokens* is not in ``[1, seq.kv_len]``.
        """
        if n_tokens is not None and not 1 <= int(n_tokens) <= seq.kv_len:
            raise ValueError(f"n_tokens must be in [1, kv_len={seq.kv_len}], got {n_tokens}")
        return self._admit(rid, seq, n_tokens, None)

    def match_and_lock(self, rid: int, seq: KVSeq, fill_tokens: int) -> Admission:
        """Look up the first *fill_tokens* tokens of *seq* and lock the match; allocate nothing.

        SGLang's batch formation (``scheduler.py :: Scheduler._get_new_batch_prefill_raw``):
        ``Req.init_next_round_input`` matches ``fill_ids`` (the prompt, or prompt +
        outputs after a retraction) against the tree, up to ``len(fill_ids) − 1`` tokens
        rounded down to pages, and ``PrefillAdder._commit_prefill_admission`` locks the
        matched node. The request's KV is allocated by later :meth:`extend` calls
        (``ScheduleBatch.prepare_for_extend``), after every member of the batch has been
        matched. With p > 1 the lookup may evict up to one page (the per-request page
        of ``alloc_paged_token_slots_extend``) before the allocation does.

        Returns
        -------
        Admission
            ``hit_tokens``, ``held_tokens`` (token-level match of the first *fill_tokens*)
            and the tokens evicted (0 with p = 1).

        Raises
        ------
        ValueError
            When *rid* is already running or *fill_tokens* is not in ``[1, seq.kv_len]``.
        """
        if not 1 <= int(fill_tokens) <= seq.kv_len:
            raise ValueError(f"fill_tokens must be in [1, kv_len={seq.kv_len}], got {fill_tokens}")
        adm = self._admit(rid, seq, 0, int(fill_tokens))
        if adm is None:  # cannot happen: nothing is allocated beyond the match
            raise RuntimeError(f"request {rid}: a lookup without allocation was refused")
        return adm

    @property
    def defer_insert(self) -> bool:
        """Whether a prefill's KV enters the tree only at :meth:`commit` (default False).

        False: :meth:`admit` and :meth:`extend` insert the computed prompt prefix at once
        (the sequential replay, where one request runs at a time). True: the concurrent
        SGLang scheduler calls :meth:`commit` after the step's forward pass, as SGLang
        inserts a prefill's tokens in ``process_batch_result_prefill`` →
        ``tree_cache.cache_unfinished_req``, so members of one prefill batch cannot hit
        each other (a finishing request inserts at :meth:`finish`).
        """
        return bool(self._S[K.S_DEFER])

    @defer_insert.setter
    def defer_insert(self, on: bool) -> None:
        self._S[K.S_DEFER] = 1 if on else 0

    def commit(self, rid: int) -> None:
        """Insert request *rid*'s computed prompt prefix into the tree and move its lock
        there (``cache_unfinished_req``; the checkpoint :meth:`admit`/:meth:`extend` make
        themselves unless :attr:`defer_insert`). Nothing happens past the prompt (decode)
        or when the request ends with its prompt (its :meth:`finish` inserts)."""
        r = self._reqs[rid]
        self._reserve(8, 0)
        K.py_commit(*self._state(), r.row)
        self._sync()

    def _admit(self, rid, seq, n_tokens, fill_tokens):
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already running")
        P = seq.prompt_len
        if fill_tokens is None and n_tokens is not None and int(n_tokens) > P:
            fill_tokens = int(n_tokens)
        plen = P if fill_tokens is None else int(fill_tokens)
        if self.cache_last_token_on_stop and seq.kv_len > P:
            seq = _with_extra_token(seq)
        self._before_request(rid, seq)
        self._reserve(self._node_budget(plen), len(seq.seg_id))
        r = _Req(seq)
        ok, hit, held, ev = K.py_admit(*self._state(), r.row, seq.seg_id, seq.seg_end, plen,
                                       -1 if n_tokens is None else int(n_tokens), 0, self._next_tag(rid))
        if not ok:
            return None
        self._reqs[rid] = r
        self._sync()
        return Admission(hit_tokens=int(hit), held_tokens=int(held), evicted_tokens=int(ev))

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
            As in :meth:`admit`: above P the key covers the first ``n_tokens − 1``
            tokens (a retracted request's prompt + outputs), else the prompt's ``P − 1``.

        Returns
        -------
        int
            Tokens (page-aligned). An :meth:`admit` may still refuse the request (None)
            when the pool cannot make room.
        """
        p = self.page_size
        fill = seq.prompt_len if n_tokens is None else max(int(n_tokens), seq.prompt_len)
        key = (min(fill, seq.kv_len) - 1) // p * p
        return int(K.match_plan(self._S, self._N, self._H1, self._G, self._Q, seq.seg_id, seq.seg_end, key)[0])

    def extend(self, rid: int, n_tokens: int) -> bool:
        """Compute *n_tokens* more tokens: the rest of the prompt (in chunks), then decode.

        Returns False, state unchanged, when the new slots exceed free + evictable.
        Duplicates freed by a checkpoint in the middle are not counted in that check.
        Decode steps (``alloc_for_decode``): if no slot/page is free, evict for ``p``
        tokens (one leaf); then take a new page when the position starts one; they run
        in O(evictions), jumping over steps that change nothing.

        Raises
        ------
        ValueError
            When the request would pass its KV extent.
        """
        r = self._reqs[rid]
        row = r.row
        comp = int(row[K.R_COMP])
        end = comp + int(n_tokens)
        if end > int(row[K.R_KVMAX]):
            raise ValueError(f"request {rid}: {end} tokens exceed its KV extent {int(row[K.R_KVMAX])}")
        if comp < int(row[K.R_PLEN]):  # a decode creates no node (no insert, no split)
            self._reserve(self._node_budget(r.seq.prompt_len), 0)
        e = K.py_extend(*self._state(), r.row, int(n_tokens))
        self._sync()
        if e < 0:
            raise RuntimeError("decode needs a page but none is free or evictable")
        return e == 1

    def extend_many(self, rids, n_tokens) -> int:
        """:meth:`PrefixCache.extend_many`: the same as :meth:`extend` item by item, but a
        decode that takes only free slots (no eviction, no prompt left; the common case)
        updates the slot counts here, without a kernel call — the arithmetic of the
        ``_decode`` kernel (``alloc_for_decode``: a new page when the position starts one,
        taken from the free slots while at least one stays free)."""
        if type(self).extend is not RadixCache.extend:  # a subclass's extend decides
            return super().extend_many(rids, n_tokens)
        one = isinstance(n_tokens, int)
        S = self._S
        p = self.page_size
        free = int(S[K.S_FREE])
        priv = int(S[K.S_PRIV])
        reqs = self._reqs
        C, PL, KM = K.R_COMP, K.R_PLEN, K.R_KVMAX
        for j, rid in enumerate(rids):
            n = int(n_tokens if one else n_tokens[j])
            row = reqs[rid].row
            comp = int(row[C])
            end = comp + n
            if n > 0 and comp >= int(row[PL]) and end <= int(row[KM]):
                nb = -(-end // p) - -(-comp // p)  # pages the decode starts
                if free > nb or (nb == 0 and free > 0):
                    free -= nb
                    priv += nb
                    row[C] = end
                    continue
            S[K.S_FREE] = free
            S[K.S_PRIV] = priv
            if not self.extend(rid, n):  # the general path (raises on bad input)
                return j
            free = int(S[K.S_FREE])
            priv = int(S[K.S_PRIV])
        S[K.S_FREE] = free
        S[K.S_PRIV] = priv
        return len(rids)

    def finish(self, rid: int) -> None:
        """``release_kv_cache``: insert the KV computed, then the prompt; free the rest; unlock."""
        r = self._reqs.pop(rid)
        self._reserve(8, 0)
        K.py_finish(*self._state(), r.row)
        self._sync()

    def preempt(self, rid: int) -> None:
        """Retraction (``release_kv_cache(..., is_insert=False)``): free, unlock, insert nothing."""
        r = self._reqs.pop(rid)
        K.py_release(self._S, self._N, self._order(), self._Q, r.row)

    def fits_alone(self, seq: KVSeq) -> int:
        """Tokens by which *seq* overflows the empty pool (0 when it fits); counts the
        extra token of ``cache_last_token_on_stop``. A request that fits alone is always
        admitted by a sequential replay: everything else in the tree is evictable."""
        kv = seq.kv_len + (1 if self.cache_last_token_on_stop and seq.kv_len > seq.prompt_len else 0)
        p = self.page_size
        return max(0, -(-kv // p) - self.num_slots) * p

    def fits_alone_all(self, trace) -> np.ndarray:
        """:meth:`fits_alone` of every request of *trace* as one array operation: int64
        (n,), tokens by which each request overflows the empty pool (0: fits). The KV
        extent is ``P + max(N − 1, 0)`` (:meth:`radixkv.trace.types.Trace.kv_len`), plus
        one when ``cache_last_token_on_stop`` and the request decodes. A subclass that
        overrides :meth:`fits_alone` gets a call per request (the base class's rule).
        (The per-request form cost ~1 µs a request and built every request's segments
        before the replay did: a tenth of ``sglang:1``'s replay of the bench trace.)"""
        if type(self).fits_alone is not RadixCache.fits_alone:
            return super().fits_alone_all(trace)
        P = np.asarray(trace.prompt_len, dtype=np.int64)
        kv = P + np.maximum(np.asarray(trace.output_len, dtype=np.int64) - 1, 0)
        if self.cache_last_token_on_stop:
            kv = kv + (kv > P)
        p = self.page_size
        return np.maximum(0, -(-kv // p) - self.num_slots) * p

    def run_request(self, rid: int, seq: KVSeq) -> Admission | None:
        """Admit, prefill the rest of the prompt, decode to the KV extent, finish (one
        kernel call)."""
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already running")
        P = seq.prompt_len
        if self.cache_last_token_on_stop and seq.kv_len > P:
            seq = _with_extra_token(seq)
        self._before_request(rid, seq)
        sid = seq.seg_id
        # ``_reserve`` inlined (this is the sequential replay's hot path)
        self._nn_hi += (18 if self._chunk is None else self._node_budget(P) + 8)
        self._g_hi += len(sid)
        self._q_hi += 1
        if self._nn_hi >= self._N.shape[0] or self._g_hi > self._G.shape[1] or self._q_hi >= self._Q.shape[0]:
            self._reserve_exact(self._node_budget(P) + 8, len(sid))
        tag = rid if type(rid) is int else self._next_tag(rid)
        status, hit, held, ev, self.evicted_tokens_total, self.evictions = K.py_run_request(
            self._S, self._N, self._H1, self._H2, self._order(), self._G, self._Q, self._row,
            sid, seq.seg_end, P, 0, tag)
        if status < 0:
            raise RuntimeError("decode needs a page but none is free or evictable")
        if status != 1:
            return None
        return Admission(hit, held, ev)

    def replay_span(self, trace, i0: int, i1: int, cols: dict, detail=None) -> tuple[int, int]:
        """Sequential replay of requests ``i0 … i1−1`` of *trace* in one kernel call.

        Fills rows ``i0 … next−1`` of *cols* (the columns of
        :func:`radixkv.replay.sequential.replay_sequential`) exactly as ``run_request``
        then ``stats(detail=False)`` would — ``stats(detail=True)`` for the detail rows
        that *detail* ``(half, every, n)`` names (rows ``r ≥ half`` with
        ``(r − half) % every == 0``, and row ``n − 1``; see :attr:`span_detail_rows`) —
        and returns ``(next, status)``: ``next == i1`` when the span is done; otherwise
        request *next* must go through the Python path (status 1: it does not fit the
        pool), or was refused with ``run_request`` status *status* (0, 2 or −1; nothing
        else ran). Arrays that must grow (or the store be compacted, when the kernel
        loop did not) first are grown here, as ``run_request`` would, and the kernel
        goes on. Returns ``(i0, 1)`` when the fast path does not apply (requests
        running, chunked prefill, ``cache_last_token_on_stop``, kernels interpreted).
        """
        import radixkv.policies._radix_span as KS
        from radixkv.trace._seq_kernel import kv_seq_len

        if self._reqs or self._chunk is not None or self.cache_last_token_on_stop or i1 <= i0:
            return i0, 1
        if type(self)._before_request is not RadixCache._before_request:
            return i0, 1  # a hook the span does not call
        if not hasattr(K.run_request, "py_func"):
            return i0, 1  # the kernels run interpreted (radixkv.replay.jit): no compiled loop
        out = np.zeros((i1 - i0, KS.NC), dtype=np.int64)
        hi = np.array([self._nn_hi, self._g_hi, self._q_hi], dtype=np.int64)
        has_out = trace.out_ids is not None
        oids = trace.out_ids if has_out else trace.ids[:0]
        ooff = trace.out_offsets if has_out else trace.id_offsets[:1]
        unit = int(trace.unit_tokens)
        p = self.page_size
        nxt = int(i0)
        grown = -1
        while True:
            nxt, status = KS.replay_span(
                self._S, self._N, self._H1, self._H2, self._order(), self._G, self._Q, self._row,
                trace.ids, trace.id_offsets, oids, ooff, has_out, trace.prompt_len, trace.output_len,
                unit, nxt, int(i1), self.num_slots, p, hi, NODE_OVERHEAD_BYTES, BYTES_PER_TOKEN, out[nxt - i0:])
            if status != 1 or nxt >= i1 or nxt == grown:
                break
            kv = int(trace.prompt_len[nxt]) + max(int(trace.output_len[nxt]) - 1, 0)
            if -(-kv // p) > self.num_slots:
                break  # does not fit the pool: the Python path reports it
            # the arrays must grow (or the store be compacted) first: as ``run_request`` would
            m = int(kv_seq_len(trace.id_offsets, ooff, has_out, trace.prompt_len, trace.output_len, unit, nxt))
            self._reserve_exact(self._node_budget(int(trace.prompt_len[nxt])) + 8, m)
            hi[:] = (self._nn_hi, self._g_hi, self._q_hi)
            grown = nxt
        self._nn_hi, self._g_hi, self._q_hi = (int(x) for x in hi)
        self._sync()
        k = nxt - i0
        if k:
            for name, c in (("prompt_tokens", KS.C_PROMPT), ("hit_tokens", KS.C_HIT), ("held_tokens", KS.C_HELD),
                            ("evicted_tokens", KS.C_EVICTED), ("used_slots", KS.C_USED),
                            ("cached_slots", KS.C_CACHED), ("free_slots", KS.C_FREE),
                            ("valid_tokens", KS.C_VALID), ("cached_tokens", KS.C_CTOK),
                            ("metadata_bytes", KS.C_META)):
                cols[name][i0:nxt] = out[:k, c]
            dup = cols["duplicate_tokens"]
            dup[i0:nxt] = -1
            cols["largest_free_run"][i0:nxt] = -1
            if detail is not None:
                # no request runs between a span's requests: ``stats(detail=True)``
                # differs from the row written only in its duplicates, a sum over none
                half, every, n = detail
                first = max(half, i0)
                first += -(first - half) % every
                dup[first:nxt:every] = 0
                if i0 <= n - 1 < nxt:
                    dup[n - 1] = 0
        if status == -1:
            raise RuntimeError("decode needs a page but none is free or evictable")
        return int(nxt), int(status)

    # ------------------------------------------------------------------ inspection
    @property
    def evictable_size(self) -> int:
        """Tokens in unlocked tree nodes (SGLang ``evictable_size_``)."""
        return int(self._S[K.S_EVTOK])

    @property
    def protected_size(self) -> int:
        """Tokens in locked tree nodes (SGLang ``protected_size_``)."""
        return int(self._S[K.S_PROT])

    @property
    def num_nodes(self) -> int:
        """Tree nodes, root excluded."""
        return int(self._S[K.S_NNODES])

    def room_slots(self) -> int:
        """Free + evictable slots, ``num_slots − used`` as :meth:`stats` counts it, in O(1)."""
        S = self._S
        return self.num_slots - int(S[K.S_PRIV]) - int(S[K.S_PROT]) // self.page_size

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
        S = self._S
        v = S.tolist()
        ev_tok, prot_tok = v[K.S_EVTOK], v[K.S_PROT]
        tree_tok = ev_tok + prot_tok
        private_tok = sum(r.computed - r.owned for r in self._reqs.values()) if self._reqs else 0
        used = v[K.S_PRIV] + prot_tok // p
        cached = ev_tok // p
        return PoolStats(
            num_slots=self.num_slots,
            slot_tokens=self.slot_tokens,
            used_slots=used,
            cached_slots=cached,
            free_slots=self.num_slots - used - cached,
            valid_tokens=tree_tok + private_tok,
            cached_tokens=tree_tok,
            duplicate_tokens=sum(
                K.token_walk_seq(S, self._N, self._H1, self._H2, self._G, self._Q, r.row[K.R_SEQ], r.row[K.R_NODE],
                                 r.row[K.R_OWNED], r.row[K.R_COMP]) - r.owned
                for r in self._reqs.values()
            ) if detail else -1,
            metadata_bytes=v[K.S_NNODES] * NODE_OVERHEAD_BYTES + tree_tok * BYTES_PER_TOKEN,
            largest_free_run=-1,
        )

    def check_invariants(self) -> None:
        """Recount the tree, its child index, the sequence store and the pool; raise
        AssertionError on any disagreement (tests)."""
        p = self.page_size
        S, N, G, Q = self._S, self._N, self._G, self._Q
        hw = int(S[K.S_HW])
        alive = [x for x in range(1, hw) if N[x, K.F_ALIVE] == 1]
        children: dict = {}
        ev = pr = 0
        for x in alive:
            par, start, end = int(N[x, K.F_PARENT]), int(N[x, K.F_START]), int(N[x, K.F_END])
            assert N[par, K.F_ALIVE] == 1
            assert start == N[par, K.F_END] and end > start
            assert start % p == 0 and end % p == 0
            s = int(N[x, K.F_SEQ])
            assert Q[s, K.Q_REFS] > 0
            off, n = int(Q[s, K.Q_OFF]), int(Q[s, K.Q_LEN])
            sid, send = G[0, off:off + n], G[1, off:off + n]
            assert end <= send[-1]
            key = tuple(int(v) for v in child_key(sid, send, start, p))
            assert key == (int(N[x, K.F_K1]), int(N[x, K.F_K2]))
            assert tuple(int(v) for v in token_key(sid, send, start)) == (int(N[x, K.F_T1]), int(N[x, K.F_T2]))
            children.setdefault(par, []).append(x)
            if N[x, K.F_LOCK]:
                pr += end - start
            else:
                ev += end - start
        for x in [0] + alive:
            assert N[x, K.F_NCHILD] == len(children.get(x, []))
        entries = {(int(h[0]), int(h[1]), int(h[2]), int(h[3])) for h in self._H1 if h[3] != -1}
        assert len(entries) == len(alive) and all(
            (int(N[x, K.F_PARENT]), int(N[x, K.F_K1]), int(N[x, K.F_K2]), x) in entries for x in alive)
        assert (ev, pr, len(alive)) == (int(S[K.S_EVTOK]), int(S[K.S_PROT]), int(S[K.S_NNODES]))
        free_list, x = set(), int(S[K.S_NFREE])
        while x != -1:
            assert N[x, K.F_ALIVE] == 0 and x not in free_list
            free_list.add(x)
            x = int(N[x, K.F_PARENT])
        assert len(free_list) + len(alive) + 1 == hw
        refs: dict = {}
        for x in alive:
            refs[int(N[x, K.F_SEQ])] = refs.get(int(N[x, K.F_SEQ]), 0) + 1
        for r in self._reqs.values():
            refs[int(r.row[K.R_SEQ])] = refs.get(int(r.row[K.R_SEQ]), 0) + 1
        for s in range(int(S[K.S_QHW])):
            assert Q[s, K.Q_REFS] == refs.get(s, 0)
        private = sum(-(-r.computed // p) - r.owned // p for r in self._reqs.values())
        assert private == S[K.S_PRIV]
        assert S[K.S_FREE] >= 0
        assert S[K.S_FREE] + S[K.S_PRIV] + (ev + pr) // p == self.num_slots
