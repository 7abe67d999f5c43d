"""Compiled kernels of the array CPU offload store (:class:`radixkv.policies.offload_cpu.ArrayLRUStore`).

The same rules as :class:`radixkv.policies.offload_cpu.CPUOffloadStore` with the ``lru``
policy (``vllm/v1/kv_offload/cpu/manager.py :: CPUOffloadingManager``,
``cpu/policies/lru.py :: LRUCachePolicy``), on arrays:

- **Table.** Resident keys → slots, an open-addressing hash table with linear probing and
  backward-shift deletion (``ht_key`` int64, ``ht_slot`` int32, −1 empty; size a power of
  two ≥ 2 × slots). A slot holds the key, its reference count (−1 store in flight, 0 idle,
  > 0 pinned), its LRU rank and a generation.
- **Ranks** are pairs ``(major, minor)`` compared lexicographically: ``(r, −position)``
  when request rank r inserts or first observes the key, ``(n, 0)`` for the fresh ranks
  of ``on_request_finished`` (one counter for both, as the Python model's
  ``r · 2**40 − position``, without its bound on the counter).
- **Eviction order** is a binary min-heap of ``(major, minor, slot, generation)`` with
  lazy invalidation: every rank change pushes an entry and bumps the slot's generation,
  so older entries of the slot are skipped when popped (vLLM's own LRU keeps its idle
  chunks in a lazily invalidated heap). ``evict`` pops the smallest valid entries,
  takes the idle, unprotected ones, and pushes the others back; when too few are found
  nothing changes. A full heap is rebuilt from the resident slots (same order: ranks are
  unique). A free slot has reference count −2; freeing bumps its generation.
- **Request state**: per chunk index of the request, flags ``SEEN`` (observed; the
  ``on_request_finished`` order is the seen chunks by position, i.e. by index),
  ``INSERTED``, ``REUSED``, ``STORE_MISS``; its rank in ``rs[0]`` (0: none yet).

Counters live in ``st`` (int64): see the ``S_*`` indices.
"""
from __future__ import annotations

import numpy as np
from numba import njit

SEEN, INSERTED, REUSED, STORE_MISS = 1, 2, 4, 8
S_NEXT, S_HEAP, S_NRES, S_NIDLE, S_OFFER, S_STORED, S_EVICTED, S_LOADED, S_FAILED, S_NFREE = range(10)
NST = 10


@njit(cache=True, inline="always")
def _h(key, mask):
    x = np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)
    return np.int64(x >> np.uint64(17)) & mask


@njit(cache=True)
def find(ht_key, ht_slot, key):
    """Slot of *key*, or −1."""
    mask = ht_key.shape[0] - 1
    i = _h(key, mask)
    while True:
        s = ht_slot[i]
        if s < 0:
            return -1
        if ht_key[i] == key:
            return s
        i = (i + 1) & mask


@njit(cache=True)
def _ht_insert(ht_key, ht_slot, key, slot):
    mask = ht_key.shape[0] - 1
    i = _h(key, mask)
    while ht_slot[i] >= 0:
        i = (i + 1) & mask
    ht_key[i] = key
    ht_slot[i] = slot


@njit(cache=True)
def _ht_delete(ht_key, ht_slot, key):
    mask = ht_key.shape[0] - 1
    i = _h(key, mask)
    while ht_key[i] != key or ht_slot[i] < 0:
        i = (i + 1) & mask
    # backward-shift deletion
    j = i
    while True:
        j = (j + 1) & mask
        if ht_slot[j] < 0:
            break
        k = _h(ht_key[j], mask)
        # move j into i when k is not cyclically in (i, j]
        if (i <= j and (k <= i or k > j)) or (i > j and (k <= i and k > j)):
            ht_key[i] = ht_key[j]
            ht_slot[i] = ht_slot[j]
            i = j
    ht_slot[i] = -1


@njit(cache=True, inline="always")
def _less(a_maj, a_min, b_maj, b_min):
    return a_maj < b_maj or (a_maj == b_maj and a_min < b_min)


@njit(cache=True)
def _push(hp_maj, hp_min, hp_slot, hp_gen, st, maj, mn, slot, gen):
    i = st[S_HEAP]
    st[S_HEAP] = i + 1
    while i > 0:
        p = (i - 1) >> 1
        if not _less(maj, mn, hp_maj[p], hp_min[p]):
            break
        hp_maj[i] = hp_maj[p]
        hp_min[i] = hp_min[p]
        hp_slot[i] = hp_slot[p]
        hp_gen[i] = hp_gen[p]
        i = p
    hp_maj[i] = maj
    hp_min[i] = mn
    hp_slot[i] = slot
    hp_gen[i] = gen


@njit(cache=True)
def _pop(hp_maj, hp_min, hp_slot, hp_gen, st):
    """Remove the smallest entry; returns (maj, min, slot, gen)."""
    top = (hp_maj[0], hp_min[0], hp_slot[0], hp_gen[0])
    n = st[S_HEAP] - 1
    st[S_HEAP] = n
    if n > 0:
        maj, mn, sl, gn = hp_maj[n], hp_min[n], hp_slot[n], hp_gen[n]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and _less(hp_maj[c + 1], hp_min[c + 1], hp_maj[c], hp_min[c]):
                c += 1
            if not _less(hp_maj[c], hp_min[c], maj, mn):
                break
            hp_maj[i] = hp_maj[c]
            hp_min[i] = hp_min[c]
            hp_slot[i] = hp_slot[c]
            hp_gen[i] = hp_gen[c]
            i = c
        hp_maj[i] = maj
        hp_min[i] = mn
        hp_slot[i] = sl
        hp_gen[i] = gn
    return top


@njit(cache=True)
def _rank(s_maj, s_min, s_gen, s_ref, hp_maj, hp_min, hp_slot, hp_gen, st, slot, maj, mn):
    """Give *slot* rank (maj, mn): a new heap entry, older ones invalidated."""
    if st[S_HEAP] >= hp_maj.shape[0]:  # rebuild from the resident slots (ranks are unique)
        st[S_HEAP] = 0
        for s in range(s_ref.shape[0]):
            if s_ref[s] != -2:
                s_gen[s] += 1
                _push(hp_maj, hp_min, hp_slot, hp_gen, st, s_maj[s], s_min[s], s, s_gen[s])
    s_gen[slot] += 1
    s_maj[slot] = maj
    s_min[slot] = mn
    _push(hp_maj, hp_min, hp_slot, hp_gen, st, maj, mn, slot, s_gen[slot])


@njit(cache=True)
def lookup_run(ht_key, ht_slot, s_ref, keys, lo, hi, stop_pending):
    """Consecutive resident keys from ``keys[lo]`` (before ``hi``): (count, any of them
    still being stored). *stop_pending*: a key being stored ends the run (not counted)."""
    n = 0
    pending = False
    for c in range(lo, hi):
        s = find(ht_key, ht_slot, keys[c])
        if s < 0:
            break
        if s_ref[s] < 0:
            if stop_pending:
                break
            pending = True
        n += 1
    return n, pending


@njit(cache=True)
def _access(ht_key, ht_slot, s_key, s_ref, s_maj, s_min, s_gen, hp_maj, hp_min, hp_slot, hp_gen, st,
            keys, flags, rs, T, c):
    """First observation of chunk *c* by the request (``on_request_access``): a resident
    key whose rank is below ``(r, −position)`` takes it."""
    if rs[0] == 0:
        st[S_NEXT] += 1
        rs[0] = st[S_NEXT]
    s = find(ht_key, ht_slot, keys[c])
    if s >= 0:
        r = rs[0]
        pos = (c + 1) * T
        if _less(s_maj[s], s_min[s], r, -pos):
            _rank(s_maj, s_min, s_gen, s_ref, hp_maj, hp_min, hp_slot, hp_gen, st, s, r, -pos)


@njit(cache=True)
def prepare_load(ht_key, ht_slot, s_key, s_ref, s_maj, s_min, s_gen, hp_maj, hp_min, hp_slot, hp_gen, st,
                 keys, flags, rs, T, lo, hi):
    """``prepare_load`` of chunks ``lo … hi−1``: pin, then record them as observed and reused."""
    for c in range(lo, hi):
        s = find(ht_key, ht_slot, keys[c])
        if s_ref[s] == 0:
            st[S_NIDLE] -= 1
        s_ref[s] += 1
    st[S_LOADED] += hi - lo
    first = True
    for c in range(lo, hi):
        if flags[c] & SEEN == 0:
            flags[c] |= SEEN
            if first and rs[0] == 0:
                st[S_NEXT] += 1
                rs[0] = st[S_NEXT]
            first = False
            _access(ht_key, ht_slot, s_key, s_ref, s_maj, s_min, s_gen, hp_maj, hp_min, hp_slot, hp_gen, st,
                    keys, flags, rs, T, c)
    for c in range(lo, hi):
        if flags[c] & INSERTED == 0:
            flags[c] |= REUSED


@njit(cache=True)
def complete_load(ht_key, ht_slot, s_ref, st, keys, lo, hi):
    """``complete_load``: unpin; back at 0 the chunk is idle."""
    for c in range(lo, hi):
        s = find(ht_key, ht_slot, keys[c])
        s_ref[s] -= 1
        if s_ref[s] == 0:
            st[S_NIDLE] += 1


@njit(cache=True)
def prepare_store(ht_key, ht_slot, s_key, s_ref, s_maj, s_min, s_gen, s_stamp, free_slots,
                  hp_maj, hp_min, hp_slot, hp_gen, st, keys, flags, rs, T, lo, hi, out_slots):
    """``prepare_store`` of chunks ``lo … hi−1`` (every offer stored; no threshold).

    Returns ``(ok, n_stored, n_evicted)``; the stored slots go to ``out_slots[:n_stored]``.
    ``ok`` False: the pool could not make room (nothing stored or evicted; the offer was
    recorded, a failed store counted)."""
    C = s_key.shape[0]
    st[S_OFFER] += 1
    offer = st[S_OFFER]
    n_new = 0
    for c in range(lo, hi):
        s = find(ht_key, ht_slot, keys[c])
        if s < 0:
            n_new += 1
            flags[c] |= STORE_MISS  # on_store_miss: nothing for LRU
            rec = True
        else:
            s_stamp[s] = offer  # protected from this offer's evictions
            rec = s_ref[s] >= 0
            if rec and flags[c] & INSERTED == 0:
                flags[c] |= REUSED
        if rec and flags[c] & SEEN == 0:
            flags[c] |= SEEN
            _access(ht_key, ht_slot, s_key, s_ref, s_maj, s_min, s_gen, hp_maj, hp_min, hp_slot, hp_gen, st,
                    keys, flags, rs, T, c)
    if n_new == 0:
        return True, 0, 0
    need = n_new - (C - st[S_NRES])
    n_ev = 0
    if need > 0:
        if need > st[S_NIDLE]:
            st[S_FAILED] += 1
            return False, 0, 0
        # evict: the `need` idle, unprotected slots of smallest rank
        stash_n = 0
        got = 0
        ok = False
        while st[S_HEAP] > 0:
            maj, mn, sl, gn = _pop(hp_maj, hp_min, hp_slot, hp_gen, st)
            if s_gen[sl] != gn or s_ref[sl] == -2:
                continue  # stale
            if s_ref[sl] == 0 and s_stamp[sl] != offer:
                out_slots[got] = sl
                got += 1
                if got == need:
                    ok = True
                    break
            else:
                out_slots[C + stash_n] = sl
                stash_n += 1
        for j in range(stash_n):
            sl = out_slots[C + j]
            _push(hp_maj, hp_min, hp_slot, hp_gen, st, s_maj[sl], s_min[sl], sl, s_gen[sl])
        if not ok:
            for j in range(got):
                sl = out_slots[j]
                _push(hp_maj, hp_min, hp_slot, hp_gen, st, s_maj[sl], s_min[sl], sl, s_gen[sl])
            st[S_FAILED] += 1
            return False, 0, 0
        for j in range(got):
            sl = out_slots[j]
            _ht_delete(ht_key, ht_slot, s_key[sl])
            s_ref[sl] = -2  # free: every heap entry of it is stale
            s_gen[sl] += 1
            free_slots[st[S_NFREE]] = sl
            st[S_NFREE] += 1
        st[S_NIDLE] -= got
        st[S_NRES] -= got
        n_ev = got
    if rs[0] == 0:
        st[S_NEXT] += 1
        rs[0] = st[S_NEXT]
    r = rs[0]
    k = 0
    for c in range(lo, hi):
        key = keys[c]
        if find(ht_key, ht_slot, key) >= 0:
            continue
        st[S_NFREE] -= 1
        sl = free_slots[st[S_NFREE]]
        s_key[sl] = key
        s_ref[sl] = -1
        s_stamp[sl] = 0
        _ht_insert(ht_key, ht_slot, key, sl)
        _rank(s_maj, s_min, s_gen, s_ref, hp_maj, hp_min, hp_slot, hp_gen, st, sl, r, -(c + 1) * T)
        flags[c] |= INSERTED
        out_slots[k] = sl
        k += 1
    st[S_NRES] += n_new
    st[S_STORED] += n_new
    st[S_EVICTED] += n_ev
    return True, n_new, n_ev


@njit(cache=True)
def complete_store(s_ref, st, slots, n):
    """``complete_store``: in-flight slots become idle."""
    for j in range(n):
        s = slots[j]
        if s_ref[s] == -1:
            s_ref[s] = 0
            st[S_NIDLE] += 1


@njit(cache=True)
def request_finished(ht_key, ht_slot, s_ref, s_maj, s_min, s_gen, hp_maj, hp_min, hp_slot, hp_gen, st, keys, flags):
    """``on_request_finished``: the seen chunks, tail first, take fresh ranks."""
    for c in range(keys.shape[0] - 1, -1, -1):
        if flags[c] & SEEN:
            s = find(ht_key, ht_slot, keys[c])
            if s >= 0:
                st[S_NEXT] += 1
                _rank(s_maj, s_min, s_gen, s_ref, hp_maj, hp_min, hp_slot, hp_gen, st, s, st[S_NEXT], 0)
