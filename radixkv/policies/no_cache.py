"""``NoCache``: the baseline with prefix caching off.

Every prompt is computed in full; a request's slots are freed when it finishes and nothing
is kept (vLLM ``--no-enable-prefix-caching``; SGLang ``--disable-radix-cache``). The pool
is counted in blocks of ``block_size`` tokens, each request taking ``ceil(tokens /
block_size)`` blocks as vLLM allocates them; the spec ``none`` has vLLM's default block
size 16 (as ``--block-size`` says: vllm, none and static default to 16), ``none:1`` is a
token pool (SGLang's ``--disable-radix-cache`` at page size 1).
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
