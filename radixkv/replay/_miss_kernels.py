"""Numba kernels of the fast miss-cause shadows (:mod:`radixkv.replay.misses`).

Both shadows are caches that never evict, so they need no eviction structure: a hash set
of *prefixes seen*, keyed by a chained hash, where "the prefix through segment s is held"
is prefix-closed (if it holds through s it holds through every s' < s). A lookup is then a
binary search over a request's segments, O(log S) probes, and an insert walks the request's
segments from the end back to the first one already present, O(new + 1) probes — instead
of one probe per segment of every request.

- :func:`prefix_lengths` — the infinite token-level cache (``L``): a key per KV segment
  (the chain of (segment id, start) pairs through it, hashed by two independent
  multiply chains into a 128-bit key) holding the longest run of that segment's tokens any request computed.
- :func:`prefix_lengths_and_unit_lru_hits` — and, in the same pass, ``unit-lru`` on
  unbounded memory (``H∞``): its own 64-bit unit keys (:func:`radixkv.trace.keys.mix64`
  chains of the prompt's unit ids, as :mod:`radixkv.policies.unit_lru` keys them), so the
  hits are the policy's, collisions included; on traces without output ids read from the
  first shadow's table.
- :func:`trie_nodes` — the trie of every request's KV extent (``--explain``'s producers,
  the concurrent causes' covers).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from radixkv.policies.key_set import contains as _has_key
from radixkv.policies.key_set import regrow as _regrow_keys
from radixkv.policies.key_set import slot_of as _find_key
from radixkv.trace.keys import SEED, mix64



@nb.njit(cache=True)
def request_segments(r, prompt_len, output_len, ids, id_off, U, has_out, out_ids, out_off, sid, send):
    """Request *r*'s KV segments (:meth:`radixkv.trace.types.Trace.kv_seq`) written to
    ``sid[:k]`` / ``send[:k]`` (ids, exclusive end tokens); returns k. The unique prompt
    tail and unique output ids are ``Trace._unique_prompt_id`` / ``_unique_output_id``."""
    P = prompt_len[r]
    N = output_len[r]
    kv = P + (N - 1 if N > 1 else 0)
    a = id_off[r]
    b = id_off[r + 1]
    k = 0
    covered = 0
    for j in range(a, b):
        end = (j - a + 1) * U
        if end > P:
            end = P
        sid[k] = ids[j]
        send[k] = end
        k += 1
        covered = end
    if covered < P:
        sid[k] = -(2 * r + 1)
        send[k] = P
        k += 1
    if kv > P:
        if has_out:
            o = out_off[r]
            for j in range(kv - P):
                sid[k] = out_ids[o + j]
                send[k] = P + j + 1
                k += 1
        else:
            sid[k] = -(2 * r + 2)
            send[k] = kv
            k += 1
    return k


@nb.njit(cache=True)
def _segments_kernel(cols, fill, seg_id, seg_end, seg_off):
    """:func:`request_segments` of every request into one CSR layout (count when not
    *fill*, else write). Returns the segment count."""
    prompt_len, output_len, ids, id_off, U, has_out, out_ids, out_off = cols
    n = prompt_len.shape[0]
    k = 0
    for r in range(n):
        if fill:
            seg_off[r] = k
            k += request_segments(r, prompt_len, output_len, ids, id_off, U, has_out, out_ids, out_off,
                                  seg_id[k:], seg_end[k:])
        else:
            k += request_segments(r, prompt_len, output_len, ids, id_off, U, has_out, out_ids, out_off,
                                  seg_id, seg_end)
    if fill:
        seg_off[n] = k
    return k


def trace_segments(trace) -> tuple:
    """Every request's KV segments (those of :meth:`radixkv.trace.types.Trace.kv_seq`) in
    one CSR layout, built from the trace's columns in one compiled pass.

    Returns
    -------
    (seg_id, seg_end, seg_off) : int64 arrays; request r's segments are
    ``seg_id[seg_off[r]:seg_off[r+1]]`` with exclusive ends ``seg_end[...]`` (tokens).
    """
    cols, smax = trace_columns(trace)
    scratch = np.empty(smax, dtype=np.int64)
    k = _segments_kernel(cols, False, scratch, scratch.copy(), scratch[:0])
    seg_id = np.empty(k, dtype=np.int64)
    seg_end = np.empty(k, dtype=np.int64)
    seg_off = np.zeros(len(cols[0]) + 1, dtype=np.int64)
    _segments_kernel(cols, True, seg_id, seg_end, seg_off)
    return seg_id, seg_end, seg_off


@nb.njit(cache=True, inline="always")
def key3_home(a, b, c, mask):
    """Home row of the three-word key (a, b, c) in an open-addressed table of mask + 1 rows
    (a power of two): splitmix64's finaliser over a combination of the three words (full
    avalanche)."""
    h = np.uint64(a) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(b) * np.uint64(0xC2B2AE3D27D4EB4F) \
        ^ np.uint64(c) * np.uint64(0x165667B19E3779F9)
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    i = np.int64(h & np.uint64(mask))
    return i


@nb.njit(cache=True)
def _slot3(kt, a, b, c):
    """Row of key (a, b, c) in the open-addressed table *kt* (cap, 4) whose empty rows are
    all zero (value stored + 1): the key's row, or the first empty one."""
    mask = kt.shape[0] - 1
    i = key3_home(a, b, c, mask)
    while True:
        if kt[i, 3] == 0:
            return i
        if kt[i, 0] == a and kt[i, 1] == b and kt[i, 2] == c:
            return i
        i = (i + 1) & mask


@nb.njit(cache=True)
def _trie_nodes(seg_id, seg_end, seg_off, kt, node_of, hint, nkey):
    """The trie of every request's whole KV extent: node ``node_of[s]`` of each segment s
    (a node is one segment at one position below one parent node, keyed by (parent node,
    segment id, start position); 0 is the root). Returns the node count."""
    n = seg_off.shape[0] - 1
    nodes = 1
    for r in range(n):
        node = 0
        start = 0
        for s in range(seg_off[r], seg_off[r + 1]):
            sid = seg_id[s]
            c = hint[node]
            if c < 0 or nkey[c, 0] != sid or nkey[c, 1] != start:
                i = _slot3(kt, node, sid, start)
                if kt[i, 3] == 0:
                    kt[i, 0] = node
                    kt[i, 1] = sid
                    kt[i, 2] = start
                    kt[i, 3] = nodes + 1
                    nkey[nodes, 0] = sid
                    nkey[nodes, 1] = start
                    nodes += 1
                c = kt[i, 3] - 1
                hint[node] = c
            node_of[s] = c
            node = c
            start = seg_end[s]
    return nodes


def trie_nodes(segs):
    """:func:`_trie_nodes` over the segments *segs* (``trace_segments``): (node of each
    segment, int64 (S,); node count)."""
    seg_id, seg_end, seg_off = segs
    S = len(seg_id)
    cap = 1 << 10
    while cap < 2 * (S + 1):
        cap *= 2
    kt = np.zeros((cap, 4), dtype=np.int64)
    node_of = np.zeros(S, dtype=np.int64)
    hint = np.full(S + 1, -1, dtype=np.int64)
    nkey = np.zeros((S + 1, 2), dtype=np.int64)
    nodes = _trie_nodes(seg_id, seg_end, seg_off, kt, node_of, hint, nkey)
    return node_of, int(nodes)


@nb.njit(cache=True)
def _find(tab, a, b):
    """Row of 128-bit key (a, b) (uint64) in *tab* (cap, 3) int64 [a, b, value + 1]; the
    first empty row (0: tables start as zeros, which the OS hands out lazily) when absent."""
    mask = tab.shape[0] - 1
    i = np.int64(a & np.uint64(mask))
    ia = np.int64(a)
    ib = np.int64(b)
    while True:
        if tab[i, 2] == 0:
            return i
        if tab[i, 0] == ia and tab[i, 1] == ib:
            return i
        i = (i + 1) & mask


@nb.njit(cache=True)
def _regrow(tab, tab2):
    for i in range(tab.shape[0]):
        if tab[i, 2] > 0:
            j = _find(tab2, np.uint64(tab[i, 0]), np.uint64(tab[i, 1]))
            tab2[j, 0] = tab[i, 0]
            tab2[j, 1] = tab[i, 1]
            tab2[j, 2] = tab[i, 2]


#: what :func:`_shadow_kernel` computes beside ``L``: nothing, unit-lru's hits read from the
#: prefix table, unit-lru's hits from its own 64-bit unit keys
UNIT_NONE, UNIT_DERIVE, UNIT_KEYS = 0, 1, 2


@nb.njit(cache=True, inline="always")
def _held_prefix(tab, ha, hb, seg_end, S, P):
    """``L`` of a request whose S segments have chain keys ``(ha, hb)``: the longest prompt
    prefix (≤ *P*) the table's covers hold (prefix-closed: binary search over the
    segments that start before P, then the partial cover of the next one)."""
    sp = 0
    while sp < S and (seg_end[sp - 1] if sp > 0 else 0) < P:
        sp += 1
    lo = -1
    hi = sp
    while hi - lo > 1:
        mid = (lo + hi) // 2
        st = seg_end[mid - 1] if mid > 0 else 0
        if tab[_find(tab, ha[mid], hb[mid]), 2] - 1 >= seg_end[mid] - st:
            lo = mid
        else:
            hi = mid
    held = seg_end[lo] if lo >= 0 else 0
    if lo + 1 < sp:
        row = _find(tab, ha[lo + 1], hb[lo + 1])
        if tab[row, 2] > 1:
            held += tab[row, 2] - 1
    return held if held < P else P


@nb.njit(cache=True, inline="always")
def _leading_held(tab, ha, hb, ukeys, zero, keys, u, own):
    """Largest j < u whose unit chain is held (−1 if none; prefix-closed, so a binary
    search): in the key set ``ukeys``/``zero`` by its 64-bit key ``keys[j]`` when *own*,
    else in the prefix table by its chain key ``(ha[j], hb[j])``."""
    lo = -1
    hi = u
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _has_key(ukeys, zero, keys[mid]) if own else tab[_find(tab, ha[mid], hb[mid]), 2] > 0:
            lo = mid
        else:
            hi = mid
    return lo


@nb.njit(cache=True)
def _shadow_kernel(cols, tab, used, out, ukeys, zero, uu, hit, r0, ha, hb, keys, seg_id, seg_end, unit):
    """The infinite token-level cache over requests ``r0 …`` and, by *unit*, unit-lru on
    memory that never evicts, in one pass (each request's segments generated once).

    ``tab`` rows: a segment's 128-bit chain key (two independent multiply chains over the
    (segment id, start) pairs through it) → 1 + its cover (tokens of the segment, from its
    start, some request computed). Writes ``out[r] = (L, kv − L)``. With *unit*
    ``UNIT_KEYS``, ``hit[r]`` = tokens of r's leading prompt units (ids ≥ 0, whole, inside
    the prompt) whose chained 64-bit unit keys (:func:`radixkv.trace.keys.mix64`, as
    :mod:`radixkv.policies.unit_lru` keys them) an earlier prompt inserted, the keys in the
    set ``ukeys`` (one int64 per slot, 0 = free; key 0 itself is ``zero[0]``); with
    ``UNIT_DERIVE`` the same hits read from the first table: when outputs are unique ids
    (no ``out_ids``) the chain key of prompt unit j (every unit before it whole, so
    starting at j·U) is in the table exactly when an earlier prompt had the same ids
    through unit j (:func:`prefix_lengths_and_unit_lru_hits`). Returns ``(r, used, uu)``:
    r = n when done, else the request at which a table would pass half full (nothing of r
    done)."""
    prompt_len, output_len, ids, id_off, U, has_out, out_ids, out_off = cols
    n = prompt_len.shape[0]
    half = tab.shape[0] // 2
    uhalf = ukeys.shape[0] // 2
    K1 = np.uint64(0xBF58476D1CE4E5B9)
    K3 = np.uint64(0x94D049BB133111EB)
    K4 = np.uint64(0x165667B19E3779F9)
    for r in range(r0, n):
        S = request_segments(r, prompt_len, output_len, ids, id_off, U, has_out, out_ids, out_off, seg_id, seg_end)
        P = prompt_len[r]
        u = 0
        if unit != UNIT_NONE:
            while u < S and seg_id[u] >= 0 and seg_end[u] <= P:
                u += 1
        if used + S > half or (unit == UNIT_KEYS and uu + u > uhalf):
            return r, used, uu
        # ---- the infinite token-level cache
        a = np.uint64(0x243F6A8885A308D3)
        b = np.uint64(0x13198A2E03707344)
        start = 0
        for j in range(S):
            sid = seg_id[j]
            a = (a ^ np.uint64(sid)) * K1
            a ^= a >> np.uint64(29)
            b = (b + np.uint64(sid) + np.uint64(start) * K4) * K3
            ha[j] = a
            hb[j] = b
            start = seg_end[j]
        L = _held_prefix(tab, ha, hb, seg_end, S, P)
        out[r, 0] = L
        out[r, 1] = (seg_end[S - 1] if S > 0 else 0) - L
        if unit == UNIT_DERIVE:  # unit-lru: the leading prompt units whose chain an earlier request holds
            lo = _leading_held(tab, ha, hb, ukeys, zero, keys, u, False)
            hit[r] = seg_end[lo] if lo >= 0 else 0
        # insert the whole extent, from its end back to the first key already present
        for j in range(S - 1, -1, -1):
            run = seg_end[j] - (seg_end[j - 1] if j > 0 else 0)
            row = _find(tab, ha[j], hb[j])
            if tab[row, 2] == 0:
                tab[row, 0] = np.int64(ha[j])
                tab[row, 1] = np.int64(hb[j])
                tab[row, 2] = run + 1
                used += 1
                continue
            if tab[row, 2] < run + 1:
                tab[row, 2] = run + 1
            break
        if unit != UNIT_KEYS:
            continue
        # ---- unit-lru on memory that never evicts, its own keys
        h = SEED
        for j in range(u):
            h = mix64(h, np.uint64(seg_id[j]))
            keys[j] = h
        lo = _leading_held(tab, ha, hb, ukeys, zero, keys, u, True)
        hit[r] = seg_end[lo] if lo >= 0 else 0
        for j in range(u - 1, -1, -1):
            k = keys[j]
            if k == np.uint64(0):
                if zero[0] != 0:
                    break
                zero[0] = 1
                continue
            i = _find_key(ukeys, k)
            if ukeys[i] != 0:
                break
            ukeys[i] = np.int64(k)
            uu += 1
    return n, used, uu


#: most rows a table starts with (24 bytes each: 24 MB); beyond, it doubles as it fills
_MAX_INITIAL_ROWS = 1 << 20


def _initial_rows(segments: int) -> int:
    """Rows to start a table with: twice the segments (every key distinct, at most half
    full: no regrowth), a power of two, at least 4096 and at most :data:`_MAX_INITIAL_ROWS`."""
    cap = 1 << 12
    while cap < 2 * segments and cap < _MAX_INITIAL_ROWS:
        cap *= 2
    return cap


def trace_columns(trace):
    """The trace's columns as :func:`request_segments` reads them, and the most segments
    one request has."""
    z = np.zeros(0, dtype=np.int64)
    has_out = trace.out_ids is not None
    plen = np.asarray(trace.prompt_len, dtype=np.int64)
    olen = np.asarray(trace.output_len, dtype=np.int64)
    off = np.asarray(trace.id_offsets, dtype=np.int64)
    cols = (plen, olen, np.asarray(trace.ids, dtype=np.int64), off, int(trace.unit_tokens), has_out,
            np.asarray(trace.out_ids, dtype=np.int64) if has_out else z,
            np.asarray(trace.out_offsets, dtype=np.int64) if has_out else z)
    n = len(plen)
    if not n:
        return cols, 1
    outs = np.maximum(olen - 1, 0) if has_out else np.minimum(np.maximum(olen - 1, 0), 1)
    return cols, int(np.max(off[1:] - off[:-1] + 1 + outs))


def _shadows(trace, unit: int):
    """Run :func:`_shadow_kernel` over every request of *trace*, doubling a table (load ≤
    1/2, rehashed) whenever the kernel stops for room. Returns (out, hit) as
    :func:`prefix_lengths_and_unit_lru_hits`."""
    cols, smax = trace_columns(trace)
    n = len(cols[0])
    out = np.zeros((n, 2), dtype=np.int64)
    hit = np.zeros(n, dtype=np.int64)
    ha = np.zeros(smax, dtype=np.uint64)
    hb = np.zeros(smax, dtype=np.uint64)
    keys = np.zeros(smax, dtype=np.uint64)
    sid = np.zeros(smax, dtype=np.int64)
    send = np.zeros(smax, dtype=np.int64)
    cap = _initial_rows(len(cols[2]) + n)
    tab = np.zeros((cap, 3), dtype=np.int64)
    ucap = _initial_rows(len(cols[2])) if unit == UNIT_KEYS else 2
    ukeys = np.zeros(ucap, dtype=np.int64)
    zero = np.zeros(1, dtype=np.int64)
    r, used, uu = 0, 0, 0
    while True:
        r, used, uu = _shadow_kernel(cols, tab, used, out, ukeys, zero, uu, hit, r, ha, hb, keys, sid, send,
                                     np.int64(unit))
        if r >= n:
            return out, hit
        if used + smax > cap // 2:
            while cap // 2 < used + smax:
                cap *= 2
            tab2 = np.zeros((cap, 3), dtype=np.int64)
            _regrow(tab, tab2)
            tab = tab2
        if unit == UNIT_KEYS and uu + smax > ucap // 2:
            while ucap // 2 < uu + smax:
                ucap *= 2
            k2 = np.zeros(ucap, dtype=np.int64)
            _regrow_keys(ukeys, k2)
            ukeys = k2


def prefix_lengths(trace):
    """``L`` and ``kv − L`` per request of *trace* (see
    :func:`radixkv.replay.misses.token_prefix_lengths`), its KV segments generated request
    by request from the trace's columns (no whole-trace segment arrays).

    Returns
    -------
    np.ndarray, int64, shape (n, 2), tokens.
    """
    return _shadows(trace, UNIT_NONE)[0]


def prefix_lengths_and_unit_lru_hits(trace, derive=None):
    """:func:`prefix_lengths` of *trace* and ``unit-lru``'s hit tokens per request on memory
    that never evicts (``H∞``), in one pass.

    On a trace without output ids (unique outputs: Mooncake, WEKA) unit-lru's hits are
    read from the prefix table (*derive*, the default there): the chain of prompt units
    through unit j is held by an earlier request exactly when an earlier prompt had the
    same unit ids through j, which is what unit-lru's chained unit key stands for — the
    same values as the policy's own 64-bit keys unless two different id chains of the
    trace share a 64-bit key (a collision the policy itself would make; about N²/2⁶⁵ for
    N distinct chains, ~10⁻⁹ on Mooncake). With output ids (an output token may continue
    a prompt chain, which unit-lru never caches) its 64-bit keys go to a set of their own
    (one int64 per slot).

    Returns
    -------
    (np.ndarray int64 (n, 2), np.ndarray int64 (n,)), tokens.
    """
    if derive is None:
        derive = trace.out_ids is None
    return _shadows(trace, UNIT_DERIVE if derive else UNIT_KEYS)
