"""``NoCache``: the baseline with prefix caching off.

Every prompt is computed in full; a request's slots are freed when it finishes and nothing
is kept (vLLM ``--no-enable-prefix-caching``; SGLang ``--disable-radix-cache``). The pool
is counted in blocks of ``block_size`` tokens, each request taking ``ceil(tokens /
block_size)`` blocks as vLLM allocates them; the spec ``none`` has vLLM's default block
size 16 (as ``--block-size`` says: vllm, none and static default to 16), ``none:1`` is a
token pool (SGLang's ``--disable-radix-cache`` at page size 1).

Under each engine's concurrent rules ``NoCache`` follows what that engine does with its
cache off:

- **vLLM** (``--no-enable-prefix-caching``): :meth:`NoCache.admit` allocates the first
  chunk at admission and admits it only if the whole prompt fits (``KVCacheManager``
  with prefix caching off; :mod:`radixkv.replay.sched_vllm`).
- **SGLang** (``--disable-radix-cache``): SGLang 0.5.23 keeps the same tree class with
  matching, inserting, locking and eviction switched off
  (``mem_cache/registry.py :: default_radix_cache_factory`` → ``create_unified_radix_cache``
  with ``CacheInitParams(disable=True)``; ``mem_cache/unified_radix_cache.py ::
  UnifiedRadixCache._match_tree`` returns an empty match, ``insert`` / ``inc_lock_ref`` /
  ``evict`` do nothing, ``evictable_size`` is 0) and runs the same scheduler: the
  ``PrefillAdder`` forms the batch against ``available_size() + evictable_size()`` minus
  its reserved offset, and the batch's KV is allocated after it forms
  (``ScheduleBatch.prepare_for_extend``), one chunk at a time. So ``NoCache`` declares
  ``batch_visibility`` and provides :meth:`NoCache.match_and_lock` (an empty match that
  allocates nothing), :meth:`NoCache.commit` (nothing to insert) and ``defer_insert``,
  and :mod:`radixkv.replay.sched_sglang` drives it on the path it drives
  :class:`radixkv.policies.radix.RadixCache` on; the vLLM whole-prompt check of
  :meth:`NoCache.admit` is not applied there. It also declares ``shares_prefixes =
  False``: SGLang turns ``--schedule-policy lpm`` into FCFS when the tree is disabled
  (``managers/schedule_policy.py :: SchedulePolicy._validate_and_adjust_policy``).
  Checked against SGLang's own ``PrefillAdder`` over a disabled tree
  (tools/engines/sglang_sched_rules.py, ``disabled``; tests/test_no_cache_sglang.py).
  Requests are taken as radixkv's SGLang rules take them everywhere, without
  ``ignore_eos`` (running requests' decodes estimated with ``new_token_ratio``). Not
  modelled: SGLang's separate admission for ``ignore_eos`` requests on a disabled tree
  (``PrefillAdder.add_one_req`` → ``add_one_req_ignore_eos``, a peak-memory simulation
  of the running decodes).
"""
from __future__ import annotations

from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.trace.types import KVSeq


class NoCache(PrefixCache):
    """No prefix caching: hits are always 0 and finished requests free everything.

    Parameters
    ----------
    num_slots : int
        Usable slots.
    block_size : int
        Tokens per slot (1 = a token pool).
    """

    name = "none"
    models_metadata = True
    decode_free_first = True  # nothing is cached
    aliases = ("off",)
    size_name = "block_size"
    default_size = 16  # vLLM's block_size default, as --block-size's help says
    #: SGLang's rules form a prefill batch, then allocate it (module docstring):
    #: :mod:`radixkv.replay.sched_sglang` calls :meth:`match_and_lock`, :meth:`commit`
    #: and sets ``defer_insert``; vLLM's rules call :meth:`admit` only
    batch_visibility = True
    #: SGLang's ``supports_prefix_sharing()`` is False with the tree disabled
    shares_prefixes = False
    #: no effect (nothing is ever inserted); set by SGLang's scheduler
    defer_insert = False

    def __init__(self, num_slots: int, block_size: int = 1):
        super().__init__(num_slots, block_size)
        self._tokens: dict[int, int] = {}  # rid -> tokens with KV
        self._used = 0  # slots held

    def _slots(self, tokens: int) -> int:
        return -(-tokens // self.slot_tokens)

    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission | None:
        n = seq.prompt_len if n_tokens is None else int(n_tokens)
        need = self._slots(n)
        # a first prefill chunk (n < P) is admitted only if the whole prompt fits, as
        # vLLM's KVCacheManager checks with prefix caching off (scheduler_reserve_full_isl)
        if self._used + self._slots(max(n, seq.prompt_len)) > self.num_slots:
            return None
        self._used += need
        self._tokens[rid] = n
        return Admission(hit_tokens=0, held_tokens=0, evicted_tokens=0)

    def match_and_lock(self, rid: int, seq: KVSeq, fill_tokens: int) -> Admission:
        """Start request *rid* with no KV: an empty match, nothing locked or allocated.

        SGLang with ``--disable-radix-cache`` (``mem_cache/unified_radix_cache.py ::
        UnifiedRadixCache._match_tree`` returns ``empty_match_result`` when ``disable``):
        the ``PrefillAdder`` admits on its budget alone
        (``managers/schedule_policy.py :: PrefillAdder.add_one_req``) and the request's
        KV is allocated chunk by chunk with :meth:`extend`
        (``ScheduleBatch.prepare_for_extend``) after the batch forms. A later
        :meth:`preempt` (or :meth:`finish`) frees what :meth:`extend` took.

        Parameters
        ----------
        rid : int
            Request handle, unique among running requests.
        seq : KVSeq
            The request's KV content (only its length is read).
        fill_tokens : int
            Tokens the prefill will cover (prompt, or prompt + outputs after a
            retraction), in ``[1, seq.kv_len]``.

        Returns
        -------
        Admission
            All zero (no hit, nothing held, nothing evicted).

        Raises
        ------
        ValueError
            When *rid* is already running or *fill_tokens* is not in ``[1, seq.kv_len]``.
        """
        if rid in self._tokens:
            raise ValueError(f"request {rid} is already running")
        if not 1 <= int(fill_tokens) <= seq.kv_len:
            raise ValueError(f"fill_tokens must be in [1, kv_len={seq.kv_len}], got {fill_tokens}")
        self._tokens[rid] = 0
        return Admission(hit_tokens=0, held_tokens=0, evicted_tokens=0)

    def commit(self, rid: int) -> None:
        """After a prefill step (``cache_unfinished_req``): nothing to insert with the tree
        disabled (``UnifiedRadixCache.checkpoint_into_tree`` returns when ``disable``)."""

    def admission_slots(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Slots ``admit(rid, seq, n_tokens)`` would take (side-effect free): the whole
        sequence, ``ceil(max(P, n_tokens) / block_size)`` (no hits; as
        :meth:`radixkv.policies.block_hash.BlockHashCache.admission_slots`)."""
        n = seq.prompt_len if n_tokens is None else int(n_tokens)
        return self._slots(max(n, seq.prompt_len))

    def extend(self, rid: int, n_tokens: int) -> bool:
        t = self._tokens[rid]
        extra = self._slots(t + n_tokens) - self._slots(t)
        if self._used + extra > self.num_slots:
            return False
        self._used += extra
        self._tokens[rid] = t + n_tokens
        return True

    def finish(self, rid: int) -> None:
        t = self._tokens.pop(rid)
        self._used -= self._slots(t)

    def peek_hit(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Always 0: nothing is cached."""
        return 0

    def stats(self, detail: bool = True) -> PoolStats:
        valid = sum(self._tokens.values())
        return PoolStats(
            num_slots=self.num_slots,
            slot_tokens=self.slot_tokens,
            used_slots=self._used,
            cached_slots=0,
            free_slots=self.num_slots - self._used,
            valid_tokens=valid,
            cached_tokens=0,
        )
