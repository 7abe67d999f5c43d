"""An offline reference: the radix tree evicting the leaf whose next use is farthest away.

:class:`BeladyRadixCache` reads the whole trace first and, through the eviction hook of
:class:`~radixkv.policies.radix_priority.PriorityRadixCache`, evicts the evictable leaf
whose **next use** is latest (never used again: first; ties: older last access first) —
Belady's MIN rule (Belady 1966, "A study of replacement algorithms for a virtual-storage
computer") applied to SGLang's tree. Everything else (lookups, splits, inserts, how much is
evicted, whole-leaf eviction) is SGLang's, as in :class:`~radixkv.policies.radix.RadixCache`.

Next use of a node
    The node holds tokens ``[start, end)`` of the request that created it (its *tag*).
    Request *j* uses it when *j*'s lookup key (the prompt capped at ``P − 1`` tokens,
    rounded down to pages) covers the node's first page with the same content: *j*'s
    tokens ``[0, start + p)`` equal the creator's. The next use is the first such *j*
    after the request being served.

What it bounds and what it does not
    - Its hit rate is ≤ the infinite-capacity hit rate (nothing can hit what an
      unbounded tree would not hold) — a true bound, checked in the tests.
    - It is **not** proven optimal, and not an upper bound on every policy: Belady's rule
      is optimal for a flat cache of equal-size pages; here items are tree nodes of
      unequal lengths, only leaves may be evicted, a whole leaf goes at once, a leaf's
      value depends on its ancestors staying, and "next use" ignores how much of the node
      the use reads. On the traces we tried it beats LRU at every capacity of a curve
      (tests/test_radix_belady.py), which is what the reference is for: how far LRU is
      from a clairvoyant choice of the same kind (evicting leaves), not from the optimum.

Use: a sequential replay in trace order with ``rid`` = the request's trace index
(``run_request(i, trace.kv_seq(i))``, what :func:`~radixkv.replay.sequential.replay_sequential`
does); on the command line ``sglang:P@belady`` (sequential ``replay``, ``compare``,
``curve``; a concurrent replay is refused: requests there overlap, and the compiled loop
does not tell the tree which request is being served). Building the next-use tables
walks every token of the trace in Python: meant for small traces (≈10⁵–10⁶ tokens).
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
from radixkv.policies.radix_priority import (
    F_START, F_TAG, F_TIME, EvictionPriority, PriorityRadixCache, priority_function,
)

# layout of the parameter vector: [now, page size, base of OFF, base of CID, base of PTR,
# base of USERS, then the tables] (all float64, exact for integers < 2**53)
_NOW, _P, _OFF, _CID, _PTR, _USERS, _HEAD = range(7)


@priority_function
def _next_use_priority(N, x, pp):
    p = int(pp[_P])
    r = N[x, F_TAG]
    k = N[x, F_START] // p
    cid = int(pp[int(pp[_CID]) + int(pp[int(pp[_OFF]) + r]) + k])
    ptr = int(pp[_PTR])
    lo = int(pp[ptr + cid])
    hi = int(pp[ptr + cid + 1])
    users = int(pp[_USERS])
    now = pp[_NOW]
    while lo < hi:  # first user after now
        mid = (lo + hi) // 2
        if pp[users + mid] <= now:
            lo = mid + 1
        else:
            hi = mid
    if lo < int(pp[ptr + cid + 1]):
        return -pp[users + lo], float(N[x, F_TIME])
    return -np.inf, float(N[x, F_TIME])


def next_use_tables(trace, page_size: int) -> np.ndarray:
    """The parameter vector of :class:`NextUse` for *trace* at *page_size*.

    For request r and page k of its KV (tokens ``[kp, kp + p)``), a content id of the
    prefix ``[0, (k + 1)p)``; for each content id, the requests whose lookup key covers
    it, ascending. Returns float64, shape (7 + n + Σ pages + ids + 1 + Σ uses,).
    """
    p = int(page_size)
    ids: dict = {}
    offs, cids = [], []
    users: list[list[int]] = []
    for r in range(len(trace)):
        s = trace.kv_seq(r)
        sid, send = s.seg_id.tolist(), s.seg_end.tolist()
        tok = []
        start = 0
        for i, e in zip(sid, send):
            tok.extend([(i, start)] * (e - start))
            start = e
        offs.append(len(cids))
        key = (s.prompt_len - 1) // p * p
        prev = -1
        for k in range(len(tok) // p):
            c = ids.setdefault((prev, tuple(tok[k * p:(k + 1) * p])), len(ids))
            if c == len(users):
                users.append([])
            if (k + 1) * p <= key:
                users[c].append(r)
            cids.append(c)
            prev = c
    ptr = np.zeros(len(users) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(u) for u in users])
    flat = np.fromiter((r for u in users for r in u), dtype=np.int64, count=int(ptr[-1]))
    n = len(trace)
    head = np.zeros(_HEAD)
    head[_P] = p
    head[_OFF] = _HEAD
    head[_CID] = _HEAD + n
    head[_PTR] = _HEAD + n + len(cids)
    head[_USERS] = head[_PTR] + len(ptr)
    return np.concatenate([head, np.asarray(offs, float), np.asarray(cids, float), ptr.astype(float),
                           flat.astype(float)])


class NextUse(EvictionPriority):
    """Priority ``(−next use, last access)``: the leaf used farthest ahead goes first."""

    name = "belady"
    function = _next_use_priority

    def __init__(self, tables: np.ndarray):
        self.tables = tables

    def params(self):
        return self.tables


class BeladyRadixCache(PriorityRadixCache):
    """SGLang's radix tree with clairvoyant leaf eviction (see the module docstring).

    Parameters
    ----------
    max_total_num_tokens, page_size, **kwargs
        As :class:`~radixkv.policies.radix.RadixCache`.
    trace : radixkv.trace.Trace
        The trace that will be replayed, in order, with ``rid`` = trace index.

    Raises
    ------
    radixkv.errors.ConfigError
        As :class:`~radixkv.policies.radix.RadixCache`; when no trace is given.
    ValueError
        When a request's ``rid`` is not a trace index.
    """

    name = "radix-belady"
    #: built with the trace it replays (``sglang:P@belady``: radixkv.policies.eviction)
    needs_trace = True

    def __init__(self, max_total_num_tokens: int, page_size: int = 1, *, trace=None, **kwargs):
        if trace is None:
            raise ConfigError("belady needs the trace it will replay (trace=...)", field="trace")
        self._n = len(trace)
        super().__init__(max_total_num_tokens, page_size,
                         eviction_policy=NextUse(next_use_tables(trace, page_size)), **kwargs)

    @property
    def label(self) -> str:
        return f"sglang:{self.page_size}@belady"

    def _before_request(self, rid, seq) -> None:
        if not isinstance(rid, (int, np.integer)) or not 0 <= rid < self._n:
            raise ValueError(f"belady: request handle {rid!r} is not a trace index (0..{self._n - 1})")
        self._pp[_NOW] = float(rid)
