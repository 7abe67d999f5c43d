"""The columnar in-memory trace and the KV content of one request.

A :class:`Trace` holds every request of a workload in numpy columns, already in **replay
order** (ascending arrival time, ties kept in file order: a stable sort). Prompt ids live
in one flat array sliced by CSR offsets; so do output ids when the trace gives them.

Granularity
-----------
``unit_tokens`` (U) is the number of tokens one id stands for: 1 for token-id traces, 512
for Mooncake hash ids, 64 for the WEKA traces. Ids are never expanded to tokens in memory.
Following the convention of the golden replays (docs/golden.md), an id ``h``
of a U-token unit stands for the U distinct tokens ``h·U … h·U+U−1``, so a unit at
position k of a prompt covers tokens ``[k·U, (k+1)·U)``.

- ``partial_last_unit=True`` (Mooncake): a prompt of P tokens has ``ceil(P/U)`` ids, the
  last one covering only ``P − (ceil(P/U)−1)·U`` tokens (the first tokens of its unit).
- ``partial_last_unit=False`` (WEKA): ``floor(P/U)`` ids, and the ``P mod U`` trailing
  tokens are unique content that matches nothing.

Outputs: when the trace gives output ids (token traces only, U = 1) they are real content
that a later prompt may contain; otherwise a request's output is unique content.

KV content as segments
----------------------
:class:`KVSeq` describes the KV a request can ever hold (its prompt, then its outputs up
to the KV extent ``P + N − 1``) as *segments*: runs of tokens ``(seg_id, offset)`` with
offset 0, 1, … inside the segment. Two token positions hold the same token iff their
segment ids are equal and their offsets are equal. Real ids are ≥ 0; unique content gets
a negative id that no other request uses. Because trace units always start at multiples
of U, equal ids at equal positions have equal offsets, so comparing ``(id, segment
start)`` compares token content exactly, without expanding anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixkv.errors import InputError


def _unique_prompt_id(i: int) -> int:
    """Segment id of request *i*'s unique prompt tail (negative, unique per request)."""
    return -(2 * i + 1)


def _unique_output_id(i: int) -> int:
    """Segment id of request *i*'s unique output (negative, unique per request)."""
    return -(2 * i + 2)


@dataclass(frozen=True)
class KVSeq:
    """The token content of one request's KV, as segments.

    Attributes
    ----------
    index : int
        Row of the request in its :class:`Trace` (replay order).
    prompt_len : int
        P, prompt tokens.
    kv_len : int
        Tokens of KV the request can ever hold: ``P + max(N − 1, 0)`` (the last sampled
        token is never fed back; docs/SEMANTICS.md "KV extent").
    seg_id : np.ndarray, int64, shape (S,)
        Id of each segment; ≥ 0 for trace content, < 0 for unique content.
    seg_end : np.ndarray, int64, shape (S,)
        Exclusive end position (tokens) of each segment; strictly increasing,
        ``seg_end[-1] == kv_len``. Segment s covers ``[seg_end[s-1], seg_end[s])``.
    """

    index: int
    prompt_len: int
    kv_len: int
    seg_id: np.ndarray
    seg_end: np.ndarray

    @property
    def output_kv_len(self) -> int:
        """Output tokens that get KV: ``kv_len − prompt_len``."""
        return self.kv_len - self.prompt_len


@dataclass
class Trace:
    """A request trace in columns, in replay order.

    All arrays have one row per request (n requests) unless noted.

    Attributes
    ----------
    req_id : np.ndarray of str, shape (n,)
        Request ids as the trace names them (or as the reader assigns them).
    arrival_s : np.ndarray, float64, shape (n,)
        Arrival time in seconds from the trace start; non-decreasing.
    prompt_len : np.ndarray, int64, shape (n,)
        Prompt length P in tokens, ≥ 1.
    output_len : np.ndarray, int64, shape (n,)
        Output length N in tokens, ≥ 0.
    ids : np.ndarray, int64, shape (total_ids,)
        All prompt ids, request after request; each ≥ 0.
    id_offsets : np.ndarray, int64, shape (n+1,)
        Request i's prompt ids are ``ids[id_offsets[i]:id_offsets[i+1]]``.
    unit_tokens : int
        U, tokens per id.
    partial_last_unit : bool
        See module docstring. Irrelevant (and normalised to False) when U = 1.
    out_ids, out_offsets : np.ndarray int64 or None
        Output token ids in CSR form (U = 1 only), ``out_offsets[i+1] − out_offsets[i] ==
        output_len[i]``; None when the trace does not give output ids.
    session_id : np.ndarray of str, shape (n,), or None
        Conversation each request belongs to ('' when unknown).
    turn : np.ndarray, int64, shape (n,), or None
        Turn number within the session (−1 when unknown).
    tenant, cache_salt, lora : np.ndarray of str, shape (n,), or None
        Who sent the request (a report attribute), its cache salt (vLLM's ``cache_salt``,
        SGLang's ``extra_key``) and its LoRA adapter ('' = none / base model). Salt and
        adapter are cache keys (:mod:`radixkv.trace.cache_keys`).
    priority : np.ndarray, int64, shape (n,), or None
        Scheduling priority as the engines take it (vLLM: lower value served first; 0 when
        absent). Carried, not yet used by the schedulers.
    req_type, parent_id : np.ndarray of str, shape (n,), or None
        Request type (Qwen-Bailian: text, search, image, file) and the id of the request
        this one continues ('' for a root): report attributes.
    mm_offsets : np.ndarray, int64, shape (n+1,), or None
        Multimodal items in CSR form: request i's items are ``mm_offsets[i]:mm_offsets[i+1]``
        of ``mm_hash`` (str (m,), content hash), ``mm_start`` and ``mm_length`` (int64 (m,),
        tokens: the item's placeholder span in the prompt), in increasing, non-overlapping
        order.
    raw_ids, raw_out_ids : np.ndarray int64 or None
        The file's ids when the cache keys differ from them (salts, LoRA, images):
        ``ids`` / ``out_ids`` then hold the key ids every policy compares
        (:func:`radixkv.trace.cache_keys.cache_key_ids`); None otherwise.
    isolation : str
        Which column salted the key ids (``cache_salt``, ``tenant`` or ``none``).
    name : str
        Where the trace came from (a path or a generator name), for reports.

    Raises
    ------
    radixkv.errors.InputError
        From :meth:`validate` when columns disagree.
    """

    req_id: np.ndarray
    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    ids: np.ndarray
    id_offsets: np.ndarray
    unit_tokens: int = 1
    partial_last_unit: bool = False
    out_ids: np.ndarray | None = None
    out_offsets: np.ndarray | None = None
    session_id: np.ndarray | None = None
    turn: np.ndarray | None = None
    tenant: np.ndarray | None = None
    cache_salt: np.ndarray | None = None
    lora: np.ndarray | None = None
    priority: np.ndarray | None = None
    req_type: np.ndarray | None = None
    parent_id: np.ndarray | None = None
    mm_offsets: np.ndarray | None = None
    mm_hash: np.ndarray | None = None
    mm_start: np.ndarray | None = None
    mm_length: np.ndarray | None = None
    raw_ids: np.ndarray | None = None
    raw_out_ids: np.ndarray | None = None
    isolation: str = "cache_salt"
    name: str = ""
    _seq_cache: dict = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_requests(
        cls,
        *,
        req_id,
        arrival_s,
        prompt_len,
        output_len,
        prompt_ids,
        unit_tokens: int = 1,
        partial_last_unit: bool = False,
        output_ids=None,
        session_id=None,
        turn=None,
        tenant=None,
        cache_salt=None,
        lora=None,
        priority=None,
        req_type=None,
        parent_id=None,
        mm=None,
        name: str = "",
    ) -> "Trace":
        """Build a trace from per-request lists given in *file order*, and sort it.

        Parameters
        ----------
        req_id, arrival_s, prompt_len, output_len : sequences of length n
        prompt_ids : sequence of n int sequences (ids of each prompt)
        output_ids : None, or sequence of n (int sequence or None); if any request gives
            output ids, all must.
        session_id, turn, tenant, cache_salt, lora, priority, req_type, parent_id : None or
            sequences of length n (the columns of the class docstring).
        mm : None, or sequence of n (None or sequence of ``(content_hash, start, length)``):
            each request's multimodal items, in prompt order (tokens).

        The result is in replay order: a stable sort by ``arrival_s``; its ``ids`` are the
        cache key ids (:mod:`radixkv.trace.cache_keys`).
        """
        n = len(prompt_len)
        arrival = np.asarray(arrival_s, dtype=np.float64).reshape(n)
        order = np.argsort(arrival, kind="stable")
        lens = np.fromiter((len(prompt_ids[i]) for i in order), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        flat = (
            np.concatenate([np.asarray(prompt_ids[i], dtype=np.int64) for i in order])
            if n and offsets[-1]
            else np.zeros(0, dtype=np.int64)
        )
        out_flat = out_off = None
        if output_ids is not None:
            olens = np.fromiter((len(output_ids[i]) for i in order), dtype=np.int64, count=n)
            out_off = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(olens, out=out_off[1:])
            out_flat = (
                np.concatenate([np.asarray(output_ids[i], dtype=np.int64) for i in order])
                if n and out_off[-1]
                else np.zeros(0, dtype=np.int64)
            )
        t = cls(
            req_id=np.asarray([str(req_id[i]) for i in order], dtype=str),
            arrival_s=arrival[order],
            prompt_len=np.asarray(prompt_len, dtype=np.int64)[order],
            output_len=np.asarray(output_len, dtype=np.int64)[order],
            ids=flat,
            id_offsets=offsets,
            unit_tokens=int(unit_tokens),
            partial_last_unit=bool(partial_last_unit) and int(unit_tokens) > 1,
            out_ids=out_flat,
            out_offsets=out_off,
            session_id=None if session_id is None else np.asarray([str(session_id[i]) for i in order], dtype=str),
            turn=None if turn is None else np.asarray(turn, dtype=np.int64)[order],
            name=name,
        )
        for col, vals in (("tenant", tenant), ("cache_salt", cache_salt), ("lora", lora), ("req_type", req_type),
                          ("parent_id", parent_id)):
            if vals is not None:
                setattr(t, col, np.asarray([str(vals[i]) for i in order], dtype=str).reshape(n))
        if priority is not None:
            t.priority = np.asarray(priority, dtype=np.int64).reshape(n)[order]
        if mm is not None:
            items = [list(mm[i] or ()) for i in order]
            cnt = np.fromiter((len(x) for x in items), dtype=np.int64, count=n)
            t.mm_offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(cnt, out=t.mm_offsets[1:])
            flat = [it for x in items for it in x]
            t.mm_hash = np.asarray([str(h) for h, _, _ in flat], dtype=str).reshape(len(flat))
            t.mm_start = np.asarray([a for _, a, _ in flat], dtype=np.int64).reshape(len(flat))
            t.mm_length = np.asarray([b for _, _, b in flat], dtype=np.int64).reshape(len(flat))
        t.validate()
        t.apply_cache_keys()
        return t

    #: per-request columns beside the lengths and ids (str columns, then int64 ones)
    STR_COLUMNS = ("session_id", "tenant", "cache_salt", "lora", "req_type", "parent_id")
    INT_COLUMNS = ("turn", "priority")

    def apply_cache_keys(self, isolation: str | None = None) -> "Trace":
        """Set ``ids`` / ``out_ids`` to the cache key ids of the file's ids (salts, LoRA,
        images: :func:`radixkv.trace.cache_keys.cache_key_ids`), keeping the file's ids in
        ``raw_ids`` / ``raw_out_ids`` when they differ; in place, returns *self*. A trace
        without those columns is left as it is.

        Parameters
        ----------
        isolation : str, optional
            ``cache_salt`` (the default: the trace's salts), ``tenant`` (one salt per
            tenant) or ``none`` (salts ignored); None keeps ``self.isolation``.
        """
        from radixkv.trace.cache_keys import cache_key_ids

        mode = self.isolation if isolation is None else isolation
        keyed = cache_key_ids(self, mode)
        self.isolation = mode
        if keyed is None:
            if self.raw_ids is not None:
                self.ids, self.out_ids = self.raw_ids, self.raw_out_ids
                self.raw_ids = self.raw_out_ids = None
        else:
            if self.raw_ids is None:
                self.raw_ids, self.raw_out_ids = self.ids, self.out_ids
            self.ids, self.out_ids = keyed
        self._seq_cache.clear()
        return self

    def with_isolation(self, isolation: str) -> "Trace":
        """A copy of this trace keyed with another isolation mode (``cache_salt``,
        ``tenant``, ``none``; :meth:`apply_cache_keys`): the same trace with and without
        salts gives the price of isolation in hit tokens. Columns are shared, not copied."""
        import dataclasses

        t = dataclasses.replace(self, _seq_cache={})
        return t.apply_cache_keys(isolation)

    @property
    def file_ids(self) -> np.ndarray:
        """The prompt ids as the file gives them (``raw_ids`` when keyed, else ``ids``)."""
        return self.ids if self.raw_ids is None else self.raw_ids

    @property
    def file_out_ids(self) -> np.ndarray | None:
        """The output ids as the file gives them (None when the trace has none)."""
        return self.out_ids if self.raw_ids is None else self.raw_out_ids

    def validate(self) -> None:
        """Check that the columns agree; raise :class:`InputError` naming the request."""
        n = len(self.prompt_len)
        U = self.unit_tokens
        if U < 1:
            raise InputError(f"unit_tokens must be ≥ 1, got {U}", path=self.name or None, field="unit_tokens")
        for col in ("req_id", "arrival_s", "output_len"):
            if len(getattr(self, col)) != n:
                raise InputError(f"column {col} has {len(getattr(self, col))} rows, expected {n}", path=self.name or None)
        if len(self.id_offsets) != n + 1:
            raise InputError("id_offsets must have n+1 entries", path=self.name or None)
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise InputError("requests are not in replay order (arrival_s decreases)", path=self.name or None)
        bad = np.flatnonzero(self.prompt_len < 1)
        if bad.size:
            raise InputError(f"request {str(self.req_id[bad[0]])!r}: empty prompt", path=self.name or None, field="prompt_len")
        bad = np.flatnonzero(self.output_len < 0)
        if bad.size:
            raise InputError(f"request {str(self.req_id[bad[0]])!r}: negative output length", path=self.name or None, field="output_len")
        if self.ids.size and self.ids.min() < 0:
            raise InputError("ids must be ≥ 0", path=self.name or None, field="ids")
        nids = np.diff(self.id_offsets)
        if U == 1:
            expect = self.prompt_len
        elif self.partial_last_unit:
            expect = -(-self.prompt_len // U)
        else:
            expect = self.prompt_len // U
        bad = np.flatnonzero(nids != expect)
        if bad.size:
            i = bad[0]
            raise InputError(
                f"request {str(self.req_id[i])!r}: {nids[i]} ids for a {self.prompt_len[i]}-token prompt, "
                f"expected {expect[i]} at unit_tokens={U}",
                path=self.name or None,
                field="ids",
            )
        for col in self.STR_COLUMNS + self.INT_COLUMNS:
            c = getattr(self, col)
            if c is not None and len(c) != n:
                raise InputError(f"column {col} has {len(c)} rows, expected {n}", path=self.name or None, field=col)
        if self.mm_offsets is not None:
            self._validate_mm()
        from radixkv.trace.consistency import first_duplicate_id

        dup = first_duplicate_id(self.req_id)
        if dup is not None:
            raise InputError(f"request #{dup[1]} (replay order) repeats id {str(self.req_id[dup[1]])!r} of request "
                             f"#{dup[0]}: request ids must be unique", path=self.name or None, field="id")
        if self.out_ids is not None:
            if U != 1:
                raise InputError("output ids are only allowed in token traces (unit_tokens = 1)", path=self.name or None)
            olen = np.diff(self.out_offsets)
            bad = np.flatnonzero(olen != self.output_len)
            if bad.size:
                i = bad[0]
                raise InputError(
                    f"request {str(self.req_id[i])!r}: {olen[i]} output ids but output_len {self.output_len[i]}",
                    path=self.name or None,
                    field="output_tokens",
                )

    def _validate_mm(self) -> None:
        """Multimodal items lie inside their prompt, in increasing non-overlapping order."""
        off = self.mm_offsets
        m = len(self.mm_hash) if self.mm_hash is not None else -1
        if (len(off) != len(self) + 1 or off[0] != 0 or off[-1] != m or np.any(np.diff(off) < 0)
                or self.mm_start is None or self.mm_length is None or len(self.mm_start) != m
                or len(self.mm_length) != m):
            raise InputError("multimodal columns disagree (mm_offsets, mm_hash, mm_start, mm_length)",
                             path=self.name or None, field="mm")
        if not m:
            return
        req = np.repeat(np.arange(len(self), dtype=np.int64), np.diff(off))
        end = self.mm_start + self.mm_length
        prev_end = np.zeros(m, dtype=np.int64)
        prev_end[1:] = end[:-1]
        prev_end[off[:-1][np.diff(off) > 0]] = 0  # the first item of a request follows nothing
        for bad, why in ((self.mm_length < 1, "an item needs a length ≥ 1"),
                         (self.mm_start < prev_end, "items must be in prompt order and must not overlap"),
                         (end > self.prompt_len[req], "an item must end inside the prompt")):
            hit = np.flatnonzero(bad)
            if hit.size:
                j = int(hit[0])
                raise InputError(f"request {str(self.req_id[req[j]])!r}: multimodal item {j - int(off[req[j]])} "
                                 f"(start {int(self.mm_start[j])}, length {int(self.mm_length[j])}): {why}",
                                 path=self.name or None, field="mm")
        from radixkv.trace.cache_keys import first_mm_conflict

        bad = first_mm_conflict(off, self.mm_hash, self.mm_start, self.mm_length, self.file_ids, self.id_offsets,
                                self.unit_tokens)
        if bad is not None:
            k, q, kf, why = bad
            raise InputError(f"request {str(self.req_id[k])!r}: multimodal item {q} has content hash "
                             f"{str(self.mm_hash[int(off[k]) + q])!r}, which {why} in request {str(self.req_id[kf])!r}: "
                             f"one content hash must name one item", path=self.name or None, field="mm")

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.prompt_len)

    @property
    def n_requests(self) -> int:
        return len(self.prompt_len)

    def prompt_ids(self, i: int) -> np.ndarray:
        """Prompt ids of request *i* (a view; int64)."""
        return self.ids[self.id_offsets[i] : self.id_offsets[i + 1]]

    def output_ids(self, i: int) -> np.ndarray | None:
        """Output ids of request *i* (a view), or None when the trace has none."""
        if self.out_ids is None:
            return None
        return self.out_ids[self.out_offsets[i] : self.out_offsets[i + 1]]

    def kv_len(self, i: int) -> int:
        """KV extent of request *i*: ``P + max(N − 1, 0)`` tokens (docs/SEMANTICS.md)."""
        return int(self.prompt_len[i] + max(int(self.output_len[i]) - 1, 0))

    def kv_seq(self, i: int) -> KVSeq:
        """The segments of request *i*'s KV content (prompt, then outputs to the KV extent).

        See the module docstring for the segment model. The result is memoised.
        """
        s = self._seq_cache.get(i)
        if s is not None:
            return s
        P = int(self.prompt_len[i])
        N = int(self.output_len[i])
        kv = P + max(N - 1, 0)
        U = self.unit_tokens
        pids = self.prompt_ids(i)
        ids_parts = []
        end_parts = []
        if U == 1:
            ids_parts.append(pids)
            end_parts.append(np.arange(1, P + 1, dtype=np.int64))
        else:
            k = len(pids)
            ends = np.arange(1, k + 1, dtype=np.int64) * U
            if k:
                ends[-1] = min(ends[-1], P)
            ids_parts.append(pids)
            end_parts.append(ends)
            covered = int(ends[-1]) if k else 0
            if covered < P:
                ids_parts.append(np.array([_unique_prompt_id(i)], dtype=np.int64))
                end_parts.append(np.array([P], dtype=np.int64))
        if kv > P:
            oids = self.output_ids(i)
            if oids is not None:
                ids_parts.append(oids[: kv - P])
                end_parts.append(np.arange(P + 1, kv + 1, dtype=np.int64))
            else:
                ids_parts.append(np.array([_unique_output_id(i)], dtype=np.int64))
                end_parts.append(np.array([kv], dtype=np.int64))
        s = KVSeq(
            index=i,
            prompt_len=P,
            kv_len=kv,
            seg_id=np.ascontiguousarray(np.concatenate(ids_parts), dtype=np.int64),
            seg_end=np.ascontiguousarray(np.concatenate(end_parts), dtype=np.int64),
        )
        self._seq_cache[i] = s
        return s

    def head(self, k: int | None) -> "Trace":
        """The first *k* requests in replay order (``--limit K``); the whole trace if None."""
        if k is None or k >= len(self):
            return self
        if k < 0:
            raise InputError(f"--limit must be ≥ 0, got {k}", field="limit")
        o = self.id_offsets
        t = Trace(
            req_id=self.req_id[:k],
            arrival_s=self.arrival_s[:k],
            prompt_len=self.prompt_len[:k],
            output_len=self.output_len[:k],
            ids=self.ids[: o[k]],
            id_offsets=o[: k + 1],
            unit_tokens=self.unit_tokens,
            partial_last_unit=self.partial_last_unit,
            out_ids=None if self.out_ids is None else self.out_ids[: self.out_offsets[k]],
            out_offsets=None if self.out_offsets is None else self.out_offsets[: k + 1],
            session_id=None if self.session_id is None else self.session_id[:k],
            turn=None if self.turn is None else self.turn[:k],
            name=self.name,
        )
        for col in self.STR_COLUMNS[1:] + self.INT_COLUMNS[1:]:
            c = getattr(self, col)
            if c is not None:
                setattr(t, col, c[:k])
        if self.mm_offsets is not None:
            m = int(self.mm_offsets[k])
            t.mm_offsets, t.mm_hash = self.mm_offsets[: k + 1], self.mm_hash[:m]
            t.mm_start, t.mm_length = self.mm_start[:m], self.mm_length[:m]
        if self.raw_ids is not None:
            t.raw_ids = self.raw_ids[: o[k]]
            t.raw_out_ids = None if self.raw_out_ids is None else self.raw_out_ids[: self.out_offsets[k]]
        t.isolation = self.isolation
        return t

    @property
    def total_prompt_tokens(self) -> int:
        return int(self.prompt_len.sum())

    @property
    def total_output_tokens(self) -> int:
        return int(self.output_len.sum())
