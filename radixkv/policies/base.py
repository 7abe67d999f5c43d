"""The one interface every prefix-cache policy implements.

A policy manages a fixed-size pool of ``num_slots`` slots of ``slot_tokens`` tokens each
(1 for a token pool such as SGLang's page-1 allocator; ``block_size`` / ``page_size``
otherwise). A replay drives it through the life of each request:

``admit``   look up the cached prefix of the prompt, then allocate slots so the first
            ``n_tokens`` tokens (default: the whole prompt) have KV, evicting cached
            content as the policy's engine would; or refuse (return None, state unchanged)
            when even eviction cannot make room.
``extend``  the request computes ``n`` more tokens (a prefill chunk or decode steps).
``finish``  the request is done: its KV becomes cached and evictable by the engine's rules.
``preempt`` the request is preempted by recompute (vLLM: freed as on finish).

The replay loop knows only this interface (docs/DESIGN.md: data flows one way). A new policy
subclasses :class:`PrefixCache`, implements the abstract hooks, and runs
:func:`radixkv.policies.check.check_policy` to see which contract it breaks.

Slots vs tokens: every count named ``*_slots`` is in slots, ``*_tokens`` in tokens.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from radixkv.trace.types import KVSeq


@dataclass(frozen=True)
class Admission:
    """What admitting one request did.

    Attributes
    ----------
    hit_tokens : int
        Prompt tokens served from the cache under the engine's rules (rounding, cap).
    held_tokens : int
        Length in tokens of the longest prefix of the prompt that the pool held at
        token granularity before admission, without block/page rounding and without the
        last-token cap (capped at the prompt length). ``held_tokens − hit_tokens`` is the
        request's *alignment loss* (docs/DESIGN.md).
    evicted_tokens : int
        Valid cached tokens evicted to make room for this admission.
    host_loaded_tokens : int
        Of ``hit_tokens``, those copied back from a host-memory tier for this admission
        (0 for a single-tier policy); the concurrent replay prices their copy.
    """

    hit_tokens: int
    held_tokens: int
    evicted_tokens: int
    host_loaded_tokens: int = 0


@dataclass(frozen=True)
class PoolStats:
    """The pool at one moment. ``used + cached + free == num_slots`` always.

    Attributes
    ----------
    num_slots : int
        Usable slots in the pool.
    slot_tokens : int
        Tokens per slot.
    used_slots : int
        Slots held by running requests (referenced; never evicted).
    cached_slots : int
        Slots holding cached KV that no running request references (evictable).
    free_slots : int
        Slots holding nothing reusable.
    valid_tokens : int
        Tokens of valid KV in used and cached slots (duplicates counted each time).
    cached_tokens : int
        Distinct tokens a lookup could hit (the cached content, running or not).
    duplicate_tokens : int
        Valid tokens stored more than once (vLLM: blocks with a key already cached).
    metadata_bytes : int
        Estimated host bytes of the policy's index (hash-table entries, tree nodes).
    largest_free_run : int
        Largest run of contiguous free slots, or −1 when the policy does not model slot
        positions.

    ``cached_tokens``, ``duplicate_tokens`` and ``largest_free_run`` may be −1 (not
    computed) in a ``stats(detail=False)`` answer.
    """

    num_slots: int
    slot_tokens: int
    used_slots: int
    cached_slots: int
    free_slots: int
    valid_tokens: int
    cached_tokens: int
    duplicate_tokens: int = 0
    metadata_bytes: int = 0
    largest_free_run: int = -1


class PrefixCache(ABC):
    """Base of every policy: a fixed pool of slots and the request life cycle.

    Parameters
    ----------
    num_slots : int
        Usable slots (≥ 1).
    slot_tokens : int
        Tokens per slot (≥ 1).

    Attributes
    ----------
    evicted_tokens_total : int
        Valid cached tokens evicted since construction.
    evictions : int
        Eviction events (slots, blocks or tree nodes freed from the cache).

    Raises
    ------
    radixkv.errors.ConfigError
        When the pool has no usable slot.
    """

    # ---------------------------------------------------------------- declaration
    # The registry (:mod:`radixkv.policies.registry`), the CLI, the concurrent scheduler
    # and warm-up read these class attributes; nothing checks a policy's name.

    #: short name used on the command line (``--policy NAME[:SIZE]``) and in reports
    name: str = "base"
    #: other names the command line accepts for this policy
    aliases: tuple = ()
    #: what ``NAME:SIZE`` sets, by the engine's knob name: ``"block_size"`` (filled in
    #: by ``--block-size``), ``"page_size"`` (``--page-size``), ``"unit_tokens"`` (the
    #: trace's unit U, never given by the user), or None (the policy takes no size)
    size_name: str | None = "block_size"
    #: the size when the spec gives none (tokens per slot)
    default_size: int | None = 16
    #: engine whose scheduler rules a concurrent replay applies to this policy:
    #: ``"vllm"`` (the whole prompt must fit at admission, vLLM's ``KVCacheManager``) or
    #: ``"sglang"`` (``PrefillAdder`` budget; :mod:`radixkv.replay.sched_sglang`)
    admission_rule: str = "vllm"
    #: decode promises the concurrent replay's fast-forward relies on to sample the pool
    #: after skipped decode steps without stepping one token at a time (both False: it
    #: steps). ``decode_free_first``: a decode takes free slots before evicting cached
    #: ones, so while a free slot is left it evicts nothing. ``decode_slot_local``: a
    #: decode that stays inside the request's last slot changes no slot count.
    decode_free_first: bool = False
    decode_slot_local: bool = False
    #: False for a policy that never matches a prefix (caching off): SGLang's rules then
    #: run ``--schedule-policy lpm`` as FCFS, as SGLang does with its tree disabled
    #: (``schedule_policy.py :: SchedulePolicy._validate_and_adjust_policy``)
    shares_prefixes: bool = True
    #: the engine whose memory rule and pool knob (``num_gpu_blocks`` /
    #: ``max_total_num_tokens``) size this policy's pool: ``"vllm"`` or ``"sglang"``
    engine: str = "vllm"
    #: policies with the same family share compiled kernels; warm-up compiles different
    #: families in parallel (None: nothing worth compiling ahead)
    kernel_family: str | None = None
    #: False for a cache-study model with no running requests (nothing is ever ``used``);
    #: :func:`~radixkv.policies.check.check_policy` then skips ``running_kv_resident``
    holds_running_kv: bool = True
    #: True for an offline reference that reads the whole trace before the replay (the
    #: constructor takes ``trace=``, the trace replayed in order with ``rid`` = its index,
    #: :class:`~radixkv.policies.radix_belady.BeladyRadixCache`): built by
    #: :func:`~radixkv.policies.registry.build_policy` with the trace, sequential replay only
    needs_trace: bool = False
    #: keyword of the constructor set by ``NAME:SIZE@OPTION`` (None: no option)
    option_name: str | None = None
    #: the option when the spec gives none (None: the constructor's default)
    default_option = None
    #: capability flags: which optional :class:`PoolStats` fields the policy measures. A
    #: metric whose flag is False is reported ``n/a`` in tables and ``null`` in JSON, never
    #: 0 (:func:`radixkv.metrics.summarize`, read through
    #: :func:`radixkv.policies.registry.measured_metrics`). ``models_duplication``:
    #: ``duplicate_tokens``; ``models_metadata``: ``metadata_bytes``;
    #: ``models_slot_positions``: ``largest_free_run`` (free-space scatter).
    models_duplication: bool = False
    models_metadata: bool = False
    models_slot_positions: bool = False

    def __init__(self, num_slots: int, slot_tokens: int):
        from radixkv.errors import ConfigError

        if int(num_slots) < 1:
            raise ConfigError(f"the pool needs at least one usable slot, got {num_slots}", field="num_slots")
        if int(slot_tokens) < 1:
            raise ConfigError(f"slot_tokens must be ≥ 1, got {slot_tokens}", field="slot_tokens")
        self.num_slots = int(num_slots)
        self.slot_tokens = int(slot_tokens)
        self.evicted_tokens_total = 0
        self.evictions = 0

    @property
    def capacity_tokens(self) -> int:
        """Pool size in tokens: ``num_slots × slot_tokens``."""
        return self.num_slots * self.slot_tokens

    # ------------------------------------------------------------------ hooks
    @abstractmethod
    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission | None:
        """Look up *seq*'s prompt and allocate KV for its first *n_tokens* tokens.

        Parameters
        ----------
        rid : int
            Handle of the request (unique among running requests).
        seq : KVSeq
            The request's KV content.
        n_tokens : int or None
            Tokens that must have KV after admission (hit + newly computed); default
            ``seq.prompt_len``. A chunked prefill admits its first chunk and extends.

        Returns
        -------
        Admission, or None when the pool cannot make room even by evicting everything
        evictable (the state is then unchanged).
        """

    @abstractmethod
    def extend(self, rid: int, n_tokens: int) -> bool:
        """Request *rid* computes *n_tokens* more tokens of its sequence.

        Returns False, with the state unchanged, when the pool cannot make room.
        """

    def extend_many(self, rids, n_tokens) -> int:
        """``extend(rids[j], n_tokens[j])`` for j = 0, 1, … in order, stopping at the first refusal.

        The concurrent replay's decode of a whole batch in one call. Policies may override
        it with a faster path; the result must be that of the loop.

        Parameters
        ----------
        rids : sequence of int
            Running requests, in the order their KV is allocated.
        n_tokens : sequence of int, or int
            Tokens each computes (same length as *rids*), or one count for all.

        Returns
        -------
        int
            How many leading items were applied; item ``j = result`` (when
            ``result < len(rids)``) was refused and left the state unchanged, and the
            items after it were not tried.

        Raises
        ------
        ValueError, KeyError
            As :meth:`extend`.
        """
        if isinstance(n_tokens, int):
            n_tokens = [n_tokens] * len(rids)
        ext = self.extend
        for j, (rid, n) in enumerate(zip(rids, n_tokens)):
            if not ext(rid, n):
                return j
        return len(rids)

    @abstractmethod
    def finish(self, rid: int) -> None:
        """Request *rid* ends; its KV is cached by the engine's rules and unreferenced."""

    def preempt(self, rid: int) -> None:
        """Request *rid* is preempted by recompute. Default: the same as :meth:`finish`."""
        self.finish(rid)

    @abstractmethod
    def stats(self, detail: bool = True) -> PoolStats:
        """The pool now (see :class:`PoolStats`).

        With ``detail=False`` a policy may leave fields that cost more than O(1) to compute
        (``cached_tokens``, ``duplicate_tokens``, ``largest_free_run``) at −1; the
        sequential replay asks for detail only at about 32 requests of its second half.
        """

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_capacity_tokens(cls, capacity_tokens: int, size: int | None = None, **options) -> "PrefixCache":
        """A fresh policy on a pool of about *capacity_tokens* usable tokens.

        Default: ``cls(capacity_tokens // size, size, **options)`` — a pool of whole
        slots of *size* tokens (``default_size`` when None). Override when the
        constructor takes the pool in other terms (vLLM's ``num_gpu_blocks`` counts the
        null block; SGLang's ``max_total_num_tokens`` counts tokens).

        Raises
        ------
        radixkv.errors.ConfigError
            When the capacity holds no whole slot.
        """
        from radixkv.errors import ConfigError

        size = int(cls.default_size or 1) if size is None else int(size)
        if size < 1:
            raise ConfigError(f"{cls.name}: size must be ≥ 1, got {size}", field="size")
        if int(capacity_tokens) // size < 1:
            raise ConfigError(f"{cls.name}: a pool of {capacity_tokens} tokens holds no {size}-token slot",
                              field="capacity")
        return cls(int(capacity_tokens) // size, size, **options)

    @classmethod
    def from_engine_pool(cls, pool, size: int | None, **options) -> "PrefixCache | None":
        """A policy on a pool given in an engine's own terms, or None to be built from
        its usable tokens instead (the default).

        Parameters
        ----------
        pool : radixkv.policies.registry.PoolSpec
            ``num_gpu_blocks`` (vLLM) or ``max_total_num_tokens`` (SGLang) is set.
        size : int or None
            As for :meth:`from_capacity_tokens`.
        """
        return None

    @classmethod
    def parse_option(cls, text: str):
        """The value of ``NAME:SIZE@TEXT`` for the constructor keyword ``option_name``.

        Default: the text itself. Raises :class:`~radixkv.errors.ConfigError` when the
        policy takes no option or the text is not a valid value. (``vllm``'s and
        ``sglang``'s eviction options: :func:`radixkv.policies.eviction.parse_option`.)
        """
        from radixkv.errors import ConfigError

        if cls.option_name is None:
            raise ConfigError(f"policy {cls.name!r} takes no '@option' (got {text!r})", field="policy")
        return text

    @classmethod
    def class_for_option(cls, value) -> tuple:
        """The class to build for an option value and the constructor keywords it sets.

        Default: ``(cls, {option_name: value})``, or ``(cls, {})`` when *value* is None.
        A class may answer with a subclass. (The eviction options of ``vllm`` and
        ``sglang`` — ``sglang:1@lfu`` builds
        :class:`~radixkv.policies.radix_priority.PriorityRadixCache` — are answered by
        :mod:`radixkv.policies.eviction`, above the subclass's module; the registry asks
        it first.)
        """
        return cls, ({} if value is None or cls.option_name is None else {cls.option_name: value})

    @classmethod
    def format_option(cls, value) -> str:
        """The text of an option value in a policy label (inverse of :meth:`parse_option`)."""
        return str(value)

    # ------------------------------------------------------------------ derived
    @staticmethod
    def _admit_length(running, rid: int, seq: KVSeq, n_tokens: int | None) -> int:
        """Validate an ``admit`` call (see :func:`radixkv.policies.toolkit.admit_length`)."""
        from radixkv.policies.toolkit import admit_length

        return admit_length(running, rid, seq, n_tokens)

    def peek_hit(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Hit tokens ``admit(rid, seq, n_tokens)`` would get now, without side effects.

        The scheduler's ``lpm`` order and the SGLang-style admission budget use it
        (SGLang ``schedule_policy.py :: PrefillAdder``; vLLM's ``get_computed_blocks`` is
        likewise side-effect free). Default: not available (:meth:`can_peek_hit` is
        False): raises NotImplementedError; the scheduler then refuses ``lpm`` and the
        SGLang budget counts the whole prompt as new.
        """
        raise NotImplementedError(f"{type(self).__name__} has no side-effect-free lookup (peek_hit)")

    @classmethod
    def can_peek_hit(cls) -> bool:
        """True when the class overrides :meth:`peek_hit`."""
        return cls.peek_hit is not PrefixCache.peek_hit

    def reusable_prefix(self, held_tokens, prompt_tokens):
        """The engine's reuse rule: what a prompt could hit if the pool held its first
        *held_tokens* tokens at token granularity, with no memory limit.

        Used by the miss-cause breakdown (:mod:`radixkv.replay.misses`) to split a
        counterfactual hit into block/page rounding and the last-token cap. Default (vLLM
        and SGLang): ``aligned = ⌊held / g⌋ · g`` with ``g = slot_tokens``, then
        ``capped = min(aligned, ⌊(P − 1) / g⌋ · g)`` — vLLM
        ``vllm/v1/core/kv_cache_manager.py :: get_computed_blocks`` looks up at most
        ``max_cache_hit_length = num_tokens − 1`` tokens in whole blocks; SGLang
        ``python/sglang/srt/managers/schedule_batch.py :: Req.init_next_round_input`` matches
        at most ``len(fill_ids) − 1`` tokens and ``RadixCache.match_prefix`` rounds down to a
        page. A policy with other rules overrides it.

        Parameters
        ----------
        held_tokens, prompt_tokens : np.ndarray, int64, shape (n,)
            Token-level held prefix (≤ P) and prompt length P of each request, tokens.

        Returns
        -------
        (aligned, capped) : two int64 arrays of shape (n,), tokens, with
        ``capped ≤ aligned ≤ held_tokens``.
        """
        import numpy as np

        g = self.slot_tokens
        held = np.asarray(held_tokens, dtype=np.int64)
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        aligned = held // g * g
        capped = np.minimum(aligned, np.maximum(prompt - 1, 0) // g * g)
        return aligned, capped

    def warm_kernels(self) -> None:
        """Compile (or load from Numba's cache) kernels a short replay may not reach.

        Called by :func:`radixkv.replay.run.warmup` on a scratch instance after a tiny
        replay, so that compile time is not counted as replay time. Default: nothing.
        """

    def room_slots(self) -> int:
        """Slots a new or growing request could get now: free plus evictable.

        Default from ``stats(detail=False)``; policies whose evictable slots are not all
        reclaimable by running requests (a static reservation) override it.
        """
        s = self.stats(detail=False)
        return s.free_slots + s.cached_slots

    def fits_alone(self, seq: KVSeq) -> int:
        """Tokens by which *seq*'s KV extent overflows the empty pool; 0 when it fits.

        The sequential replay refuses (as an input error) a request that cannot fit in
        the whole pool. Policies that need headroom beyond the KV extent (SGLang's extra
        page) or that allow larger requests (``unit-lru``) override this.
        """
        need = -(-seq.kv_len // self.slot_tokens)
        return max(0, need - self.num_slots) * self.slot_tokens

    def fits_alone_all(self, trace) -> np.ndarray:
        """:meth:`fits_alone` of every request of *trace*: int64 (n,), tokens by which each
        request's KV extent overflows the empty pool (0: fits). One array operation when
        the policy keeps this class's rule, else a call per request."""
        if type(self).fits_alone is PrefixCache.fits_alone:
            kv = np.asarray(trace.prompt_len, dtype=np.int64) + np.maximum(
                np.asarray(trace.output_len, dtype=np.int64) - 1, 0)
            need = -(-kv // self.slot_tokens)
            return np.maximum(0, need - self.num_slots) * self.slot_tokens
        return np.array([self.fits_alone(trace.kv_seq(i)) for i in range(len(trace))], dtype=np.int64)

    def overflow_detail(self, seq: KVSeq) -> str:
        """Why *seq* cannot fit the empty pool, for the error the replay raises.

        Called only when :meth:`fits_alone` is > 0. Policies whose pool is not one run of
        ``num_slots`` slots per request (several KV cache groups, a state pool) override
        it to name what they count.
        """
        over = self.fits_alone(seq)
        return (f"{over} tokens more than the whole pool of {self.capacity_tokens} tokens "
                f"({self.num_slots} slots of {self.slot_tokens} tokens: the capacity is rounded down to "
                f"whole blocks/pages)")

    def run_request(self, rid: int, seq: KVSeq) -> Admission | None:
        """Sequential life of one request: admit the prompt, decode to the KV extent, finish.

        Returns the admission, or None if the request did not fit (nothing changed).
        Policies may override this with a fused fast path giving the same result.
        """
        adm = self.admit(rid, seq)
        if adm is None:
            return None
        if seq.kv_len > seq.prompt_len:
            if not self.extend(rid, seq.kv_len - seq.prompt_len):
                # a lone request whose decode does not fit: free what it holds
                self.finish(rid)
                return None
        self.finish(rid)
        return adm
