"""A unit-granular model of vLLM's prefix cache for the sequential replay of hash-id traces.

The design check of the unit-granular pool of docs/performance.md ("Hash-id traces at
unit speed: the validated design"): plain Python, written to show that the sequential
replay of a hash-id trace (unit U tokens, ``U % block_size == 0``, no output ids) can be
modelled without block ids and without one key-table row per block, and still give
every record of :class:`radixkv.policies.block_hash.BlockHashCache` (hit, held,
evicted, used / cached / free blocks, valid / duplicate / cached tokens, metadata bytes,
``largest_free_run``). ``tests/test_unit_pool_model.py`` compares the two on hypothesis
traces and tight pools; a compiled port is future work.

What it keeps instead of blocks (sequential replay: between requests every block is in
vLLM's free queue, ``BlockPool.free_blocks`` / ``get_new_blocks`` / ``touch``):

- A block is named by the request table that cached it and its position in that
  table, ``(t, j)``: a block keeps its key from caching to eviction, and a hit serves
  the same block to later requests at the same position (equal chained keys mean equal
  positions).
- The free queue is ``[keyless head blocks] [never-used ids, ascending] [pieces]``: a
  piece is a range of positions of one table, highest position first (a finished
  request's blocks are freed tail first). Popping takes the head; a hit cuts the
  pieces holding its blocks; a finished request appends one piece for its new blocks
  and one per run of hit blocks served by the same table.
- Keys of *regular* blocks (wholly inside one trace unit) live in one record per
  unit, keyed by the key of the unit's first block, with the holders of each position
  in insertion order (vLLM's ``BlockHashToBlockMap``: the first holder is served).
  Keys step within a unit: the unit key is one splitmix64 round of the previous unit's
  key and the unit's id (the seed for the first unit), block k of the unit has key
  ``unit key + k × STEP`` (:func:`unit_keys`, :func:`block_key`). Only key equality is
  observable, and two regular blocks get equal keys iff their units up to their own and
  their positions are equal, i.e. iff their whole prefixes are (up to 64-bit
  collisions), so these keys give the per-block chain's hits although their values
  differ. Irregular blocks keep the per-block chain's keys (they are only counted).
  Other blocks (a unit cut by the prompt's end followed by output or a unique tail,
  output blocks) have one entry per key; a block whose first piece is a unit piece
  (a *straddle*) is also indexed by (parent key, first token) for ``held_tokens``.
- ``largest_free_run`` needs no ids: the keyless blocks are the never-used range and at
  most one partial block at the head (every request takes at least one new block, and
  takes the head first), which is adjacent to the range iff it was taken from it.
- Reachable keys = distinct keys: a cached key's parent key is held by a block behind
  it in the queue (freed after it, or touched and freed again later), so the cached
  keys are closed under prefixes.

Only ``run_request`` and ``stats`` are modelled (the sequential replay); the other hooks
raise ``NotImplementedError``.
"""
from __future__ import annotations

import numpy as np

from radixkv.policies import _hash_kernels as K
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.policies.block_hash import DUPLICATE_DICT_BYTES, KEY_ENTRY_BYTES

_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_M64 = (1 << 64) - 1
STEP = 0xD1B54A32D192ED03  # odd: the keys of a unit's blocks are distinct


def _mix(h, w):
    """splitmix64's finaliser of ``h ^ w`` (plain Python ints)."""
    z = ((h ^ w) + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def unit_keys(seq):
    """Key of each leading unit segment (id ≥ 0) of *seq*, chained from the seed."""
    out = []
    h = int(K.SEED) & _M64
    for sid in seq.seg_id:
        if sid < 0:
            break
        h = _mix(h, int(sid))
        out.append(h)
    return out


def block_key(seq, ukeys, j, B):
    """Key of regular block *j* (its unit's key stepped by its position there); the seed for j < 0."""
    if j < 0:
        return int(K.SEED) & _M64
    s = int(np.searchsorted(seq.seg_end, j * B, side="right"))
    first = (int(seq.seg_end[s - 1]) if s else 0) // B
    return (ukeys[s] + (j - first) * STEP) & _M64


class UnitPoolModel(PrefixCache):
    """``BlockHashCache(num_gpu_blocks, block_size)`` for sequential hash-id replays."""

    name = "unit-pool-model"
    size_name = "block_size"
    default_size = 16
    admission_rule = "vllm"
    engine = "vllm"
    models_duplication = True
    models_metadata = True
    models_slot_positions = True

    def __init__(self, num_gpu_blocks: int, block_size: int = 16):
        super().__init__(num_gpu_blocks - 1, block_size)
        self.B = block_size
        self.nb = num_gpu_blocks
        self.unused_lo = 1  # ids unused_lo … nb − 1 were never taken
        self.head_kl = 0  # keyless (partial) blocks at the queue's head: 0 or 1
        self.head_adj = False  # that block's id is unused_lo − 1
        # pieces: pid -> [prev, next, table, lo, hi] (positions hi … lo in queue order)
        self.pc = {}
        self.qh = self.qt = None
        self.next_pid = 0
        self.tab = {}  # table -> {"kind": per-position info, "pieces": set of pids}
        self.units = {}  # unit key -> {position: [tables, insertion order]}
        self.irr = {}  # block key of an irregular block -> [tables]
        self.strad = {}  # (parent key, first segment id, offset) -> [unit-part lengths]
        self.nhashed = 0
        self.nkeys = 0
        self.ndup = 0
        # work counters (the compiled port's cost drivers)
        self.ops = {"pieces_popped": 0, "pieces_cut": 0, "pieces_appended": 0, "unit_visits": 0}

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens, block_size=16, **kw):
        return cls(capacity_tokens // block_size + 1, block_size)

    # ------------------------------------------------------------------ the queue
    def _link_tail(self, t, lo, hi):
        pid = self.next_pid
        self.next_pid += 1
        self.pc[pid] = [self.qt, None, t, lo, hi]
        if self.qt is None:
            self.qh = pid
        else:
            self.pc[self.qt][1] = pid
        self.qt = pid
        self.tab[t]["pieces"].add(pid)
        self.ops["pieces_appended"] += 1

    def _unlink(self, pid):
        p, n, t = self.pc[pid][0], self.pc[pid][1], self.pc[pid][2]
        if p is None:
            self.qh = n
        else:
            self.pc[p][1] = n
        if n is None:
            self.qt = p
        else:
            self.pc[n][0] = p
        del self.pc[pid]
        self.tab[t]["pieces"].discard(pid)

    def _cut(self, t, lo, hi):
        """Take positions lo … hi of table t out of the queue (a hit touches them)."""
        j = hi
        while j >= lo:
            pid = next(q for q in self.tab[t]["pieces"] if self.pc[q][3] <= j <= self.pc[q][4])
            prev, nxt, _, plo, phi = self.pc[pid]
            a = max(lo, plo)  # cut a … j out of plo … phi
            self.ops["pieces_cut"] += 1
            if j < phi and a > plo:  # split: phi … j+1 stays, a-1 … plo after it
                self.pc[pid][3] = j + 1
                q = self.next_pid
                self.next_pid += 1
                self.pc[q] = [pid, nxt, t, plo, a - 1]
                self.pc[pid][1] = q
                if nxt is None:
                    self.qt = q
                else:
                    self.pc[nxt][0] = q
                self.tab[t]["pieces"].add(q)
            elif j < phi:
                self.pc[pid][3] = j + 1
            elif a > plo:
                self.pc[pid][4] = a - 1
            else:
                self._unlink(pid)
            j = a - 1

    def _pop(self, n):
        """Take n blocks from the head; returns (evicted, last block came from the never-used range)."""
        ev = 0
        from_unused = None
        if n and self.head_kl:  # the head partial again (taken last: its adjacency stays)
            self.head_kl = 0
            n -= 1
            if n == 0:
                return ev, None
        k = min(n, self.nb - self.unused_lo)
        if k:
            self.unused_lo += k
            n -= k
            from_unused = True
        while n:
            pid = self.qh
            _, _, t, lo, hi = self.pc[pid]
            k = min(n, hi - lo + 1)
            if k == hi - lo + 1:
                self._unlink(pid)
            else:
                self.pc[pid][4] = hi - k
            self._evict(t, hi - k + 1, hi)
            ev += k
            n -= k
            self.ops["pieces_popped"] += 1
            from_unused = False
        return ev, from_unused

    # ------------------------------------------------------------------ keys
    def _add_holder(self, lst, t):
        lst.append(t)
        if len(lst) == 1:
            self.nkeys += 1
        elif len(lst) == 2:
            self.ndup += 1
        self.nhashed += 1

    def _drop_holder(self, lst, t):
        lst.remove(t)
        if not lst:
            self.nkeys -= 1
        elif len(lst) == 1:
            self.ndup -= 1
        self.nhashed -= 1

    def _evict(self, t, lo, hi):
        kinds = self.tab[t]["kind"]
        last_unit = None
        for j in range(hi, lo - 1, -1):
            info = kinds[j]
            if info[0] == "u":
                rec = self.units[info[1]]
                if info[1] != last_unit:
                    self.ops["unit_visits"] += 1
                    last_unit = info[1]
                self._drop_holder(rec[info[2]], t)
                if not rec[info[2]]:
                    del rec[info[2]]
                    if not rec:
                        del self.units[info[1]]
            else:
                lst = self.irr[info[1]]
                self._drop_holder(lst, t)
                if not lst:
                    del self.irr[info[1]]
                if info[2] is not None:
                    self.strad[info[2]].remove(info[3])
                    if not self.strad[info[2]]:
                        del self.strad[info[2]]
        self.tab[t]["live"] -= hi - lo + 1
        if self.tab[t]["live"] == 0:
            del self.tab[t]

    # ------------------------------------------------------------------ a request
    def _classify(self, seq, keys, ukeys, n_full):
        """Per full block: ("u", unit key, position in unit) or ("i", key, straddle index key, unit-part length)."""
        B = self.B
        out = []
        ends = seq.seg_end
        starts = np.concatenate(([0], ends[:-1]))
        s = 0
        for j in range(n_full):
            a, b = j * B, (j + 1) * B
            while ends[s] <= a:
                s += 1
            sid = int(seq.seg_id[s])
            if sid >= 0 and starts[s] % B:
                raise ValueError("a unit starts inside a block: not a hash-id trace with U % block_size == 0")
            if sid >= 0 and ends[s] >= b:
                first = int(starts[s]) // B
                out.append(("u", ukeys[s], j - first))
            elif sid >= 0:
                pkey = block_key(seq, ukeys, j - 1, B)
                out.append(("i", int(keys[j]), (pkey, sid, a - int(starts[s])), int(ends[s]) - a))
            else:
                out.append(("i", int(keys[j]), None, 0))
        return out

    def _holders(self, info):
        if info[0] == "u":
            rec = self.units.get(info[1])
            return rec.get(info[2]) if rec else None
        return self.irr.get(info[1])

    def _held(self, seq, ukeys, h):
        """``held_tokens`` after h hit blocks (``_hash_kernels.lookup``)."""
        B, P = self.B, seq.prompt_len
        if h * B >= P:
            return P
        start, end = h * B, min(h * B + B, P)
        s = int(np.searchsorted(seq.seg_end, start, side="right"))
        sid = int(seq.seg_id[s])
        if sid < 0:
            return start  # a unique segment: no other block starts with its token
        seg_start = int(seq.seg_end[s - 1]) if s else 0
        off = start - seg_start
        lp = min(int(seq.seg_end[s]), end) - start  # the prompt's tokens of this unit in the block
        best = 0
        # a regular block (sid, off … off + B) under the last hit key
        rec = self.units.get(ukeys[s])
        if rec and rec.get(off // B):
            best = lp
        pkey = block_key(seq, ukeys, h - 1, B)
        for m in self.strad.get((pkey, sid, off), ()):
            best = max(best, min(m, lp))
        return start + best

    def run_request(self, rid, seq):
        B, P, kv = self.B, seq.prompt_len, seq.kv_len
        if -(-kv // B) > self.nb - 1:
            return None
        n_full = kv // B
        keys, _ = K.seq_block_keys(seq.seg_id, seq.seg_end, B, n_full, _ALL)  # irregular blocks' keys
        ukeys = unit_keys(seq)
        kinds = self._classify(seq, keys, ukeys, n_full)
        # lookup: consecutive prompt blocks whose key is held; the first holder is served
        served = []
        last_unit = None
        while len(served) < P // B:
            info = kinds[len(served)]
            if info[0] == "u" and info[1] != last_unit:
                self.ops["unit_visits"] += 1
                last_unit = info[1]
            lst = self._holders(info)
            if not lst:
                break
            served.append(lst[0])
        h = len(served)
        held = self._held(seq, ukeys, h)
        hcap = min(h, (P - 1) // B)
        # touch: hit blocks leave the queue (runs of one serving table at a time)
        j = 0
        runs = []
        while j < hcap:
            k = j
            while k + 1 < hcap and served[k + 1] == served[j]:
                k += 1
            runs.append((served[j], j, k))
            j = k + 1
        for t, lo, hi in runs:
            self._cut(t, lo, hi)
        # new blocks: the prompt's, then decode's (no block is freed in between)
        n_prompt = -(-P // B) - hcap
        n_kv = -(-kv // B) - hcap
        ev0, src0 = self._pop(n_prompt)
        ev1, src1 = self._pop(n_kv - n_prompt) if n_kv > n_prompt else (0, None)
        src = src1 if n_kv > n_prompt and src1 is not None else src0
        self.evictions += ev0 + ev1
        self.evicted_tokens_total += (ev0 + ev1) * B
        # cache the full new blocks; the table is named by rid
        t = ("r", rid, self.next_pid)
        self.tab[t] = {"kind": kinds, "pieces": set(), "live": n_full - hcap}
        for j in range(hcap, n_full):
            info = kinds[j]
            if info[0] == "u":
                lst = self.units.setdefault(info[1], {}).setdefault(info[2], [])
            else:
                lst = self.irr.setdefault(info[1], [])
                if info[2] is not None:
                    self.strad.setdefault(info[2], []).append(info[3])
            self._add_holder(lst, t)
        # release tail first: the partial block to the head, full ones to the tail
        if kv % B:
            if src is not None:  # (None: the head partial was taken again; adjacency stays)
                self.head_adj = src
            self.head_kl = 1
        if n_full > hcap:
            self._link_tail(t, hcap, n_full - 1)
        else:
            del self.tab[t]
        for tt, lo, hi in reversed(runs):
            self._link_tail(tt, lo, hi)
        return Admission(hit_tokens=hcap * B, held_tokens=min(held, P), evicted_tokens=ev0 * B)

    # ------------------------------------------------------------------ stats
    def stats(self, detail=True):
        B = self.B
        unused = self.nb - self.unused_lo
        if unused:
            run = unused + (1 if self.head_kl and self.head_adj else 0)
            run = max(run, self.head_kl)
        else:
            run = self.head_kl
        return PoolStats(
            num_slots=self.nb - 1, slot_tokens=B, used_slots=0, cached_slots=self.nhashed,
            free_slots=self.nb - 1 - self.nhashed, valid_tokens=self.nhashed * B,
            cached_tokens=self.nkeys * B if detail else -1,
            duplicate_tokens=(self.nhashed - self.nkeys) * B,
            metadata_bytes=self.nkeys * KEY_ENTRY_BYTES + self.ndup * DUPLICATE_DICT_BYTES,
            largest_free_run=run if detail else -1,
        )

    def admit(self, rid, seq, n_tokens=None):
        raise NotImplementedError("the unit-pool model covers the sequential replay only (run_request)")

    def extend(self, rid, n_tokens):
        raise NotImplementedError("the unit-pool model covers the sequential replay only (run_request)")

    def finish(self, rid):
        raise NotImplementedError("the unit-pool model covers the sequential replay only (run_request)")
