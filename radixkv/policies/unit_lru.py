"""``UnitLRUCache``: the cache-study model behind published hit-rate-vs-capacity curves.

This is the cache that the Mooncake paper's Figure 9 (Qin et al., FAST'25, §4 "cache
capacity" study), kvcache-simulator and llmtrafficlens simulate: a cache of trace units
(Mooncake's 512-token hash ids, WEKA's 64-token ids, single tokens of a token trace) with
no running requests and no GPU pool rules:

1. a request hits its *leading* cached units — units are keyed by prefix (a unit's key
   chains every id before it, :mod:`radixkv.trace.keys`), so the hit stops at the first
   miss; hit tokens = the tokens those units cover (hit units × U, the last one partial
   when the prompt ends inside it — i.e. capped at the prompt length); no last-token cap;
2. then it touches (hit) or inserts (miss) **all** its prompt units in prompt order, each
   becoming most recently used, evicting the least recently used unit whenever the cache
   holds ``capacity_units`` units;
3. outputs are never cached; a WEKA-style unhashed tail is not a unit and is not cached;
   a request with more units than the capacity is allowed (it evicts its own first units).

Capacity in tokens becomes ``capacity_tokens // U`` units; a partial last unit takes a
whole unit of capacity.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import types
from numba.typed import Dict

from radixkv.errors import ConfigError
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.trace.keys import SEED, mix64
from radixkv.trace.types import KVSeq

#: host bytes per cached unit: key 8 + token count 8 + two links 16 + dict entry ~16
_META_BYTES = 48

# state vector indices
_HEAD, _TAIL, _SIZE, _VALID, _EVICTIONS, _EVICTED_TOK = range(6)


@nb.njit(cache=True)
def _new_index():
    """An empty typed dict unit key (uint64) → slot (int64). Made in a cached kernel: Numba
    compiles ``Dict.empty`` called from Python afresh in every process (~0.5–1 s)."""
    return Dict.empty(key_type=types.uint64, value_type=types.int64)


@nb.njit(cache=True)
def _touch_request(seg_id, seg_end, prompt_len, index, slot_key, slot_tok, prev, nxt, state):
    """Hit then touch/insert one prompt's units; returns (hit_tokens, evicted_tokens)."""
    cap = slot_key.shape[0]
    # units: leading prompt segments with a real id (>= 0)
    n = 0
    while n < seg_id.shape[0] and seg_id[n] >= 0 and seg_end[n] <= prompt_len:
        n += 1
    keys = np.empty(n, dtype=np.uint64)
    h = SEED
    for j in range(n):
        h = mix64(h, np.uint64(seg_id[j]))
        keys[j] = h
    hit = 0
    while hit < n and keys[hit] in index:
        hit += 1
    hit_tokens = seg_end[hit - 1] if hit > 0 else 0
    evicted_tok = 0
    for j in range(n):
        k = keys[j]
        ntok = seg_end[j] - (seg_end[j - 1] if j > 0 else 0)
        if k in index:
            s = index[k]
            if state[_TAIL] == s:
                continue
            # unlink s
            p = prev[s]
            q = nxt[s]
            if p >= 0:
                nxt[p] = q
            else:
                state[_HEAD] = q
            prev[q] = p  # q >= 0 because s is not the tail
        else:
            if state[_SIZE] == cap:
                s = state[_HEAD]
                q = nxt[s]
                state[_HEAD] = q
                if q >= 0:
                    prev[q] = -1
                else:
                    state[_TAIL] = -1
                del index[slot_key[s]]
                state[_VALID] -= slot_tok[s]
                evicted_tok += slot_tok[s]
                state[_EVICTIONS] += 1
            else:
                s = state[_SIZE]
                state[_SIZE] += 1
            slot_key[s] = k
            slot_tok[s] = ntok
            state[_VALID] += ntok
            index[k] = s
        # append s at the MRU end
        t = state[_TAIL]
        prev[s] = t
        nxt[s] = -1
        if t >= 0:
            nxt[t] = s
        else:
            state[_HEAD] = s
        state[_TAIL] = s
    state[_EVICTED_TOK] += evicted_tok
    return hit_tokens, evicted_tok


@nb.njit(cache=True)
def _touch_span(ids, id_offsets, prompt_len, unit_tokens, i0, i1, index, slot_key, slot_tok, prev, nxt, state, out):
    """:func:`_touch_request` for requests ``i0 … i1−1``; per request ``out`` gets (hit
    tokens, evicted tokens, units cached, valid tokens)."""
    m = 0
    for i in range(i0, i1):
        m = max(m, id_offsets[i + 1] - id_offsets[i])
    seg_id = np.empty(m, dtype=np.int64)
    seg_end = np.empty(m, dtype=np.int64)
    for i in range(i0, i1):
        a = id_offsets[i]
        k = id_offsets[i + 1] - a
        P = prompt_len[i]
        for j in range(k):
            seg_id[j] = ids[a + j]
            e = (j + 1) * unit_tokens
            seg_end[j] = e if e < P else P
        hit, ev = _touch_request(seg_id[:k], seg_end[:k], P, index, slot_key, slot_tok, prev, nxt, state)
        r = i - i0
        out[r, 0] = hit
        out[r, 1] = ev
        out[r, 2] = state[_SIZE]
        out[r, 3] = state[_VALID]


class UnitLRUCache(PrefixCache):
    """LRU cache of prefix-keyed trace units (the cache-study policy ``unit-lru``).

    Parameters
    ----------
    capacity_units : int
        Units the cache holds (≥ 1).
    unit_tokens : int
        U, tokens per unit (the trace's ``unit_tokens``).

    Raises
    ------
    ConfigError
        When the capacity is below one unit.

    Notes
    -----
    One request costs one Numba call: O(units) dictionary and linked-list operations.
    """

    name = "unit-lru"
    aliases = ("unit_lru",)
    size_name = "unit_tokens"  # the trace's U, never given on the command line
    default_size = None
    kernel_family = "unit_lru"
    models_metadata = True
    holds_running_kv = False

    def __init__(self, capacity_units: int, unit_tokens: int = 1):
        if int(capacity_units) < 1:
            raise ConfigError(
                f"unit-lru needs a capacity of at least one unit ({unit_tokens} tokens), got {capacity_units} units",
                field="capacity",
            )
        super().__init__(int(capacity_units), int(unit_tokens))
        self._index = None  # the store is allocated on the first request (see _alloc)
        self._state = np.array([-1, -1, 0, 0, 0, 0], dtype=np.int64)

    def _alloc(self) -> None:
        """Allocate the unit store (a one-pass curve builds caches it never fills)."""
        cap = self.num_slots
        self._index = _new_index()
        self._slot_key = np.zeros(cap, dtype=np.uint64)
        self._slot_tok = np.zeros(cap, dtype=np.int64)
        self._prev = np.full(cap, -1, dtype=np.int64)
        self._next = np.full(cap, -1, dtype=np.int64)

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens: int, unit_tokens: int = 1) -> "UnitLRUCache":
        """A cache of ``capacity_tokens // unit_tokens`` units."""
        return cls(int(capacity_tokens) // int(unit_tokens), unit_tokens)

    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission:
        if self._index is None:
            self._alloc()
        hit, ev = _touch_request(
            seq.seg_id, seq.seg_end, seq.prompt_len, self._index,
            self._slot_key, self._slot_tok, self._prev, self._next, self._state,
        )
        self.evicted_tokens_total = int(self._state[_EVICTED_TOK])
        self.evictions = int(self._state[_EVICTIONS])
        return Admission(hit_tokens=int(hit), held_tokens=int(hit), evicted_tokens=int(ev))

    def reusable_prefix(self, held_tokens, prompt_tokens):
        """No block rounding below the trace's unit and no last-token cap (rule 1 of the
        module docstring): ``(held, held)``. A token-level held prefix of a unit trace ends
        at a unit boundary or at the prompt end, since different unit ids share no token."""
        held = np.asarray(held_tokens, dtype=np.int64)
        return held, held.copy()

    def extend(self, rid: int, n_tokens: int) -> bool:
        return True  # no running requests: nothing is allocated

    def finish(self, rid: int) -> None:
        return None

    def run_request(self, rid: int, seq: KVSeq) -> Admission:
        return self.admit(rid, seq)

    def replay_span(self, trace, i0: int, i1: int, cols: dict) -> tuple[int, int]:
        """Sequential replay of requests ``i0 … i1−1`` of *trace* in one kernel call.

        Fills rows ``i0 … i1−1`` of *cols* exactly as :meth:`run_request` then
        :meth:`stats` would and returns ``(i1, 1)`` (a unit-lru request is never refused).
        """
        if i1 <= i0:
            return i0, 1
        if self._index is None:
            self._alloc()
        out = np.zeros((i1 - i0, 4), dtype=np.int64)
        _touch_span(trace.ids, trace.id_offsets, trace.prompt_len, int(trace.unit_tokens), int(i0), int(i1),
                    self._index, self._slot_key, self._slot_tok, self._prev, self._next, self._state, out)
        self.evicted_tokens_total = int(self._state[_EVICTED_TOK])
        self.evictions = int(self._state[_EVICTIONS])
        size = out[:, 2]
        cols["prompt_tokens"][i0:i1] = trace.prompt_len[i0:i1]
        cols["hit_tokens"][i0:i1] = out[:, 0]
        cols["held_tokens"][i0:i1] = out[:, 0]
        cols["evicted_tokens"][i0:i1] = out[:, 1]
        cols["used_slots"][i0:i1] = 0
        cols["cached_slots"][i0:i1] = size
        cols["free_slots"][i0:i1] = self.num_slots - size
        cols["valid_tokens"][i0:i1] = out[:, 3]
        cols["cached_tokens"][i0:i1] = out[:, 3]
        cols["duplicate_tokens"][i0:i1] = 0
        cols["metadata_bytes"][i0:i1] = size * _META_BYTES
        cols["largest_free_run"][i0:i1] = -1
        return i1, 1

    @classmethod
    def replay_curve(cls, trace, policies: list["UnitLRUCache"], *, limit: int | None = None, label: str | None = None):
        """Sequential replays of *trace* through every policy of *policies* in one pass.

        LRU is a stack algorithm (Mattson et al. 1970): one pass computing each unit
        reference's LRU stack distance with a Fenwick tree (:mod:`radixkv.policies._lru_stack`)
        gives every capacity's hits, insertions and evictions at once, in
        O(A (K + log A)) for A unit references and K capacities (see
        :func:`radixkv.policies._lru_stack.lru_curve`).

        Parameters
        ----------
        trace : Trace
        policies : list of UnitLRUCache
            Fresh caches, one per capacity, all with ``unit_tokens == trace.unit_tokens``
            (they are not modified; only their sizes are read).
        limit : int or None
            Replay only the first *limit* requests.
        label : str or None
            The policy spec for the records (default ``unit-lru``).

        Returns
        -------
        list of Records, one per policy, identical column by column to
        :func:`radixkv.replay.sequential.replay_sequential` on that policy;
        ``meta["replay_s"]`` is the whole pass's wall time (seconds) and
        ``meta["evictions"]`` the policy's eviction count.

        Raises
        ------
        ConfigError
            When there is no request, or a policy's unit differs from the trace's.
        """
        import time

        from radixkv.policies._lru_stack import dense_index, lru_curve, unit_keys
        from radixkv.records import COLUMNS, Records

        t = trace.head(limit)
        n = len(t)
        if n == 0:
            raise ConfigError("no requests to replay (empty trace or --limit 0)", path=trace.name or None, field="limit")
        U = int(t.unit_tokens)
        for p in policies:
            if p.slot_tokens != U:
                raise ConfigError(f"unit-lru built for {p.slot_tokens}-token units on a trace of {U}-token units",
                                  path=trace.name or None, field="unit_tokens")
        t0 = time.perf_counter()
        ids = np.ascontiguousarray(t.ids[: int(t.id_offsets[n])], dtype=np.int64)
        offs = np.ascontiguousarray(t.id_offsets[: n + 1], dtype=np.int64)
        plen = np.ascontiguousarray(t.prompt_len, dtype=np.int64)
        keys, ends = unit_keys(ids, offs, plen, U)
        key_idx, n_keys = dense_index(keys)
        caps = np.array([p.num_slots for p in policies], dtype=np.int64)
        K = len(caps)
        hit = np.zeros((n, K), dtype=np.int64)
        evicted = np.zeros((n, K), dtype=np.int64)
        size = np.zeros((n, K), dtype=np.int64)
        valid = np.zeros((n, K), dtype=np.int64)
        evictions = np.zeros(K, dtype=np.int64)
        lru_curve(key_idx, ends, offs, n_keys, caps,
                  hit, evicted, size, valid, evictions)
        elapsed = time.perf_counter() - t0
        out = []
        for k, p in enumerate(policies):
            cols = {c: np.zeros(n, dtype=np.int64) for c in COLUMNS}
            cols["prompt_tokens"] = plen.copy()
            cols["hit_tokens"] = hit[:, k].copy()
            cols["held_tokens"] = hit[:, k].copy()
            cols["alignment_loss_tokens"] = np.zeros(n, dtype=np.int64)
            cols["evicted_tokens"] = evicted[:, k].copy()
            cols["cached_slots"] = size[:, k].copy()
            cols["free_slots"] = p.num_slots - size[:, k]
            cols["valid_tokens"] = valid[:, k].copy()
            cols["cached_tokens"] = valid[:, k].copy()
            cols["metadata_bytes"] = size[:, k] * _META_BYTES
            cols["largest_free_run"] = np.full(n, -1, dtype=np.int64)
            out.append(Records(
                req_id=t.req_id, columns=cols, num_slots=p.num_slots, slot_tokens=p.slot_tokens,
                policy=label or p.name,
                meta={"replay_s": elapsed, "trace": trace.name, "requests": n, "evictions": int(evictions[k]),
                      "one_pass": True},
            ))
        return out

    def stats(self, detail: bool = True) -> PoolStats:
        size = int(self._state[_SIZE])
        valid = int(self._state[_VALID])
        return PoolStats(
            num_slots=self.num_slots,
            slot_tokens=self.slot_tokens,
            used_slots=0,
            cached_slots=size,
            free_slots=self.num_slots - size,
            valid_tokens=valid,
            cached_tokens=valid,
            metadata_bytes=size * _META_BYTES,
        )

    def fits_alone(self, seq: KVSeq) -> int:
        """Always 0: a request larger than the capacity is allowed."""
        return 0
