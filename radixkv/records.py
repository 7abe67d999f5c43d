"""Per-request records of a replay: numpy columns, one row per request in replay order."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: columns of :class:`Records`, with their units (all int64, shape (n,))
COLUMNS = {
    "prompt_tokens": "tokens",
    "hit_tokens": "tokens served from the cache (engine rules)",
    "held_tokens": "tokens of the prompt the pool held as a token-level prefix",
    "alignment_loss_tokens": "held_tokens - hit_tokens",
    "evicted_tokens": "valid cached tokens evicted while admitting the request",
    "used_slots": "slots held by running requests after the request",
    "cached_slots": "evictable cached slots after the request",
    "free_slots": "free slots after the request",
    "valid_tokens": "valid KV tokens in used + cached slots after the request",
    "cached_tokens": "distinct hittable tokens after the request (-1: not sampled)",
    "duplicate_tokens": "valid tokens stored more than once after the request (-1: not sampled)",
    "metadata_bytes": "host bytes of the policy's index after the request",
    "largest_free_run": "largest contiguous run of free slots after the request (-1: not modelled)",
}

#: per-request columns the breakdown adds to :class:`~Records`, in
#: CSV order (all int64, tokens); with ``hit_tokens`` they sum to ``prompt_tokens``
MISS_COLUMNS = {
    "miss_compulsory_tokens": "prompt tokens no earlier request computed (infinite token-level cache misses)",
    "miss_capacity_tokens": "prompt tokens the same policy with unbounded memory would hit (evicted)",
    "miss_alignment_tokens": "prompt tokens held at token level but not in a whole block/page",
    "miss_last_token_cap_tokens": "whole blocks/pages lost only to the engine's last-token rule",
    "miss_not_cached_tokens": "reusable under the engine's rules but never cached by this policy",
}

#: causes in the order of the stacked bars and tables (hit first)
CAUSES = ("hit", "compulsory", "capacity", "alignment", "last_token_cap", "not_cached")
#: causes that exist only in the concurrent / multi-replica modes (``None`` in sequential)
CONCURRENT_CAUSES = ("in_flight", "preemption", "routing")

#: columns whose -1 means "not sampled / not modelled" (n/a): an empty cell in the CSV
NA_COLUMNS = ("cached_tokens", "duplicate_tokens", "largest_free_run")


@dataclass
class RequestColumns:
    """Per-request columns, one row per request in replay order: the base of
    :class:`Records` (sequential replay) and of
    :class:`radixkv.replay.conc_result.ConcurrentResult` (concurrent replay).

    Attributes
    ----------
    req_id : np.ndarray of str, shape (n,)
    columns : dict[str, np.ndarray]
        Column name -> values, each of shape (n,); the subclass names its columns.

    ``len()`` is n; ``result[name]`` is ``result.columns[name]`` (KeyError for an unknown name).
    """

    req_id: np.ndarray
    columns: dict

    def __len__(self) -> int:
        return len(self.req_id)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]


@dataclass
class Records(RequestColumns):
    """What a sequential replay saw, request by request: ``req_id`` and ``columns`` of
    :class:`RequestColumns` (every key of :data:`COLUMNS`, each int64 of shape (n,)), and

    Attributes
    ----------
    num_slots, slot_tokens : int
        The pool the replay ran on.
    policy : str
        The policy's spec (e.g. ``vllm:16``).
    """

    num_slots: int
    slot_tokens: int
    policy: str
    meta: dict = field(default_factory=dict)

    @property
    def capacity_tokens(self) -> int:
        return self.num_slots * self.slot_tokens

    def write_csv(self, path) -> None:
        """Write one row per request (``id``, every column of :data:`COLUMNS`, then any
        extra column such as the miss causes of :mod:`radixkv.replay.misses`) atomically
        to *path*. A value of :data:`NA_COLUMNS` the replay did not sample or the policy
        does not model (−1 in :attr:`columns`) is an empty cell (n/a), never a number."""
        from radixkv.util import write_columns_csv

        names = ["prompt_tokens", "hit_tokens"] + [c for c in COLUMNS if c not in ("prompt_tokens", "hit_tokens")]
        names += [c for c in self.columns if c not in COLUMNS]  # e.g. the miss causes (replay/misses.py)
        cols = [[("" if v < 0 else v) for v in self.columns[c].tolist()] if c in NA_COLUMNS
                else self.columns[c].tolist() for c in names]
        write_columns_csv(path, self.req_id, names, cols)
