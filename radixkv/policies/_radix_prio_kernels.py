"""Numba kernels of the radix tree evicting by a policy-defined priority (the hook).

The built-in :class:`~radixkv.policies.radix.RadixCache` evicts in LRU order through
the kernels of :mod:`radixkv.policies._radix_kernels`, which are left untouched. This
module is the generic path used by :class:`~radixkv.policies.radix_priority.PriorityRadixCache`:
the same request life (lookup, split, insert, eviction, lock moves — every rule of
:mod:`radixkv.policies.radix`), plus

- per-node statistics SGLang's ``UnifiedTreeNode`` keeps for its eviction strategies
  (``srt/mem_cache/unified_cache/unified_tree_core.py``): creation time, hit count,
  request priority, T-LRU branch high-water depth (fields ``F_CREATED``, ``F_HITS``,
  ``F_PRIO``, ``F_HIST`` after the LRU kernels' fields; ``F_TIME`` is the last access);
- an eviction heap ordered by ``(k1, k2, last access, push id)`` where ``(k1, k2) =
  priority(N, x, params)`` is a jitted function of the node's row (the priority
  hook, SGLang's ``EvictionStrategy.get_priority``; ties fall to the older last
  access, as ``UnifiedTreeNode.__lt__`` breaks ``heapq`` ties).

The priority function has the signature :data:`PRIORITY_SIG`
``(int64[:, ::1] N, int64 x, float64[::1] params) -> (float64, float64)`` and is passed
as a first-class function (:data:`PRIORITY_FN`): the kernels are compiled once (and
cached on disk) for every priority, built-in or user-written.

Exactness of the lazy heap: SGLang rebuilds its heap from all evictable leaves at each
eviction call (``components/full.py :: _evict_device_start``). Here every evictable leaf
has exactly one *valid* heap entry, pushed with its current key; a node's valid entry is
the one whose push id equals ``N[x, F_VER]``. A node is (re)pushed whenever it becomes an
evictable leaf and whenever a field its key reads changes while it is one (a touch, a hit
count or priority update in an insert walk). So the heap's minimum valid entry is SGLang's
heap minimum, provided the priority reads only the node's row (not the clock or other
nodes), which is the contract of the hook.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from radixkv.policies._radix_kernels import (
    F_ALIVE, F_DOWN, F_END, F_K1, F_K2, F_LOCK, F_T1, F_T2, F_NCHILD, F_PARENT, F_SEQ, F_START, F_TIME, NF, NR,
    R_COMP, R_EVICTED, R_KVMAX, R_NODE, R_OWNED, R_PLEN, R_SEQ,
    S_EVN, S_EVTOK, S_EVTOT, S_FREE, S_HLEN, S_HW, S_NFREE, S_NNODES, S_P, S_PRIV, S_PROT,
    S_PUSH, S_CHUNK,
    _alloc, _attach, _detach, _find_child, _inc_lock, _lcp, _new_node, _seq_decref, _set_keys,
    _tick, match_plan, register_seq, token_walk,
)

#: node fields after the LRU kernels' ``NF`` fields
F_CREATED, F_HITS, F_PRIO, F_HIST, F_VER, F_TAG = NF, NF + 1, NF + 2, NF + 3, NF + 4, NF + 5
#: row width of the node array on the generic path
NF_EXT = NF + 6
#: request fields after the LRU kernels' ``NR``: inserted length (SGLang
#: ``req.kv.cache_inserted_len``), request priority (``req.priority or 0``) and a tag
#: the caller gives the request (e.g. its trace index), copied to the nodes it creates
R_INS, R_PRI, R_TAG = NR, NR + 1, NR + 2
NR_EXT = NR + 3

_Z = np.int64(0)
_M1 = np.int64(-1)

_I2 = types.int64[:, ::1]
_I1 = types.int64[::1]
_F2 = types.float64[:, ::1]
_F1 = types.float64[::1]
_IA = types.int64[:]
#: signature of a priority function: (N, x, params) -> (k1, k2); smaller is evicted first
PRIORITY_SIG = types.UniTuple(types.float64, 2)(_I2, types.int64, _F1)
#: the numba type of a priority function argument
PRIORITY_FN = types.FunctionType(PRIORITY_SIG)


def function_addresses(fn) -> np.ndarray:
    """int64 array ``[cfunc wrapper address, numba entry address]`` of a priority
    function compiled with :data:`PRIORITY_SIG` (keep *fn* alive while it is used).

    The kernels take this array, not the function: passing a first-class function
    object costs ~20 µs of typing per kernel call, an int64 array ~0.1 µs."""
    cres = fn.get_compile_result(PRIORITY_SIG)
    c_addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
    jit_addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    return np.array([c_addr, jit_addr], dtype=np.int64)


@intrinsic
def _fn(typingctx, addrs):
    """The priority function at the addresses ``addrs[0], addrs[1]`` (see
    :func:`function_addresses`) as a first-class function value."""
    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        c_addr = builder.load(cgutils.gep(builder, arr.data, 0))
        jit_addr = builder.load(cgutils.gep(builder, arr.data, 1))
        f = cgutils.create_struct_proxy(PRIORITY_FN)(context, builder)
        vp = context.get_value_type(types.voidptr)
        f.c_addr = builder.inttoptr(c_addr, vp)
        f.py_addr = cgutils.get_null_value(vp)
        f.jit_addr = builder.inttoptr(jit_addr, vp)
        return f._getvalue()
    return PRIORITY_FN(addrs), codegen


# ------------------------------------------------------------------ the priority heap
# HK, shape (cap, 3) float64: (k1, k2, last access); HI, shape (cap, 2) int64: (push id, node)

@njit(cache=True)
def _less(HK, HI, i, j):
    for f in range(3):
        if HK[i, f] != HK[j, f]:
            return HK[i, f] < HK[j, f]
    return HI[i, 0] < HI[j, 0]


@njit(cache=True)
def _swap(HK, HI, i, j):
    for f in range(3):
        v = HK[i, f]
        HK[i, f] = HK[j, f]
        HK[j, f] = v
    for f in range(2):
        w = HI[i, f]
        HI[i, f] = HI[j, f]
        HI[j, f] = w


@njit(cache=True)
def _sift_down(HK, HI, i, n):
    while True:
        a = 2 * i + 1
        if a >= n:
            return
        b = a + 1
        m = b if b < n and _less(HK, HI, b, a) else a
        if _less(HK, HI, m, i):
            _swap(HK, HI, i, m)
            i = m
        else:
            return


@njit(cache=True)
def _is_evictable_leaf(N, x):
    return N[x, F_ALIVE] == 1 and N[x, F_LOCK] == 0 and N[x, F_NCHILD] == 0 and N[x, F_PARENT] != -1


@njit(cache=True)
def _fill(S, N, HK, HI, i, x, pf, pp):
    k1, k2 = pf(N, x, pp)
    S[S_PUSH] += 1
    HK[i, 0] = k1
    HK[i, 1] = k2
    HK[i, 2] = N[x, F_TIME]
    HI[i, 0] = S[S_PUSH]
    HI[i, 1] = x
    N[x, F_VER] = S[S_PUSH]


@njit(cache=True)
def _rebuild(S, N, HK, HI, pf, pp):
    k = _Z
    for x in range(1, S[S_HW]):
        if N[x, F_ALIVE] == 1:
            N[x, F_VER] = 0
            if N[x, F_LOCK] == 0 and N[x, F_NCHILD] == 0:
                _fill(S, N, HK, HI, k, x, pf, pp)
                k += 1
    S[S_HLEN] = k
    for i in range(k // 2 - 1, -1, -1):
        _sift_down(HK, HI, i, k)


@njit(cache=True)
def heap_rebuild(S, N, HK, HI, fa, pp):
    """Replace the heap by one entry per evictable leaf, keyed by *pf* (drops stale ones)."""
    pf = _fn(fa)
    _rebuild(S, N, HK, HI, pf, pp)


@njit(cache=True)
def _push(S, N, HK, HI, x, pf, pp):
    """Push *x* with its current key when it is an evictable leaf (invalidates older entries)."""
    if not _is_evictable_leaf(N, x):
        return
    if S[S_HLEN] == HK.shape[0]:
        _rebuild(S, N, HK, HI, pf, pp)  # x is an evictable leaf: it is in the rebuilt heap
        return
    i = S[S_HLEN]
    S[S_HLEN] = i + 1
    _fill(S, N, HK, HI, i, x, pf, pp)
    while i > 0:
        up = (i - 1) // 2
        if _less(HK, HI, i, up):
            _swap(HK, HI, i, up)
            i = up
        else:
            break


@njit(cache=True)
def _pop(S, HK, HI):
    n = S[S_HLEN] - 1
    ver = HI[0, 0]
    x = HI[0, 1]
    if n > 0:
        for f in range(3):
            HK[0, f] = HK[n, f]
        for f in range(2):
            HI[0, f] = HI[n, f]
        _sift_down(HK, HI, _Z, n)
    S[S_HLEN] = n
    return ver, x


# ------------------------------------------------------------------ tree operations

@njit(cache=True)
def _new(S, N, Q, seq, start, end):
    x = _new_node(S, N, Q, seq, start, end)
    for f in range(NF, NF_EXT):
        N[x, f] = 0
    return x


@njit(cache=True)
def _split(S, N, H1, H2, HK, HI, G, Q, child, at, pf, pp):
    """``_split_node``: the upper half inherits lock, hit count, priority, creation time
    and T-LRU history; fresh last access for the upper node, then for the suffix."""
    parent = N[child, F_PARENT]
    upper = _new(S, N, Q, N[child, F_SEQ], N[child, F_START], at)
    N[upper, F_LOCK] = N[child, F_LOCK]
    for f in (F_K1, F_K2, F_T1, F_T2):  # the upper half keeps the child's keys
        N[upper, f] = N[child, f]
    N[upper, F_HITS] = N[child, F_HITS]
    N[upper, F_PRIO] = N[child, F_PRIO]
    N[upper, F_CREATED] = N[child, F_CREATED]
    N[upper, F_HIST] = N[child, F_HIST]
    N[upper, F_TAG] = N[child, F_TAG]
    _detach(S, N, H1, H2, parent, child)
    _attach(S, N, H1, H2, parent, upper)
    N[child, F_START] = at
    _set_keys(S, N, G, Q, child)
    _attach(S, N, H1, H2, upper, child)
    N[upper, F_TIME] = _tick(S)
    N[child, F_TIME] = _tick(S)
    _push(S, N, HK, HI, child, pf, pp)
    S[S_NNODES] += 1
    return upper


@njit(cache=True)
def _walked(S, N, HK, HI, x, ins_len, prio, pf, pp):
    """An insert walked node *x* (after its split): ``node.priority = max(...)`` and
    ``_finish_insert_walk_node``'s hit count (only past what the request inserted)."""
    if N[x, F_END] > ins_len:
        N[x, F_HITS] += 1
    if prio > N[x, F_PRIO]:
        N[x, F_PRIO] = prio


@njit(cache=True)
def _insert(S, N, H1, H2, HK, HI, G, Q, s, L, known, ins_len, prio, tag, pf, pp):
    """Insert tokens ``[0, L)`` of stored sequence *s*: (overlap, target); see
    ``_radix_kernels._insert``, plus the statistics of the priority hook."""
    off = Q[s, 0]
    n = Q[s, 1]
    qid = G[0, off:off + n]
    qend = G[1, off:off + n]
    p = S[S_P]
    node = _Z
    pos = _Z
    if known != 0 and L > 0:
        x = known
        while x != 0:
            N[N[x, F_PARENT], F_DOWN] = x
            x = N[x, F_PARENT]
        c = _Z
        while c != known:
            c = N[c, F_DOWN]
            N[c, F_TIME] = _tick(S)
            end = N[c, F_END]
            if L < end:
                node = _split(S, N, H1, H2, HK, HI, G, Q, c, L, pf, pp)
                _walked(S, N, HK, HI, node, ins_len, prio, pf, pp)
                pos = L
                break
            _walked(S, N, HK, HI, c, ins_len, prio, pf, pp)
            _push(S, N, HK, HI, c, pf, pp)
            node = c
            pos = end
            if pos >= L:
                break
    while pos < L:
        c = _find_child(S, N, H1, G, Q, node, qid, qend, s, pos)
        if c == -1:
            break
        N[c, F_TIME] = _tick(S)
        end = N[c, F_END]
        m = _lcp(N, G, Q, c, qid, qend, s, pos, min(end, L))
        if p > 1:
            m = pos + (m - pos) // p * p
        if m < end:
            node = _split(S, N, H1, H2, HK, HI, G, Q, c, m, pf, pp)
            _walked(S, N, HK, HI, node, ins_len, prio, pf, pp)
            pos = m
            break
        _walked(S, N, HK, HI, c, ins_len, prio, pf, pp)
        _push(S, N, HK, HI, c, pf, pp)
        node = c
        pos = end
    overlap = pos
    if pos < L:
        leaf = _new(S, N, Q, s, pos, L)
        _set_keys(S, N, G, Q, leaf)
        _attach(S, N, H1, H2, node, leaf)
        N[leaf, F_TIME] = _tick(S)
        N[leaf, F_CREATED] = _tick(S)  # ``UnifiedTreeNode.__init__``: a second draw
        N[leaf, F_PRIO] = prio
        N[leaf, F_TAG] = tag
        N[leaf, F_HITS] = 1 if L > ins_len else 0
        # ``_set_tlru_lens_and_raise_history``: the branch's high-water depth
        N[leaf, F_HIST] = L
        a = node
        while a != 0 and N[a, F_HIST] < L:
            N[a, F_HIST] = L
            a = N[a, F_PARENT]
        S[S_EVTOK] += L - pos
        S[S_NNODES] += 1
        _push(S, N, HK, HI, leaf, pf, pp)
        node = leaf
    return overlap, node


@njit(cache=True)
def _dec_lock(S, N, HK, HI, x, pf, pp):
    while x != 0:
        N[x, F_LOCK] -= 1
        if N[x, F_LOCK] == 0:
            n = N[x, F_END] - N[x, F_START]
            S[S_EVTOK] += n
            S[S_PROT] -= n
            _push(S, N, HK, HI, x, pf, pp)
        x = N[x, F_PARENT]


@njit(cache=True)
def _evict(S, N, H1, H2, HK, HI, Q, num_tokens, pf, pp):
    """Evict whole leaves in priority order until *num_tokens* tokens are freed."""
    freed = 0
    p = S[S_P]
    while freed < num_tokens and S[S_HLEN] > 0:
        ver, x = _pop(S, HK, HI)
        if N[x, F_VER] != ver or not _is_evictable_leaf(N, x):
            continue  # stale entry
        parent = N[x, F_PARENT]
        _detach(S, N, H1, H2, parent, x)
        N[x, F_ALIVE] = 0
        N[x, F_VER] = 0
        n = N[x, F_END] - N[x, F_START]
        _seq_decref(S, Q, N[x, F_SEQ])
        N[x, F_PARENT] = S[S_NFREE]
        S[S_NFREE] = x
        freed += n
        S[S_EVTOK] -= n
        S[S_FREE] += n // p
        S[S_NNODES] -= 1
        S[S_EVN] += 1
        _push(S, N, HK, HI, parent, pf, pp)
    S[S_EVTOT] += freed
    return freed


@njit(cache=True)
def _evict_for(S, N, H1, H2, HK, HI, Q, need, pf, pp):
    avail = S[S_FREE] * S[S_P]
    if need > avail:
        return _evict(S, N, H1, H2, HK, HI, Q, need - avail, pf, pp)
    return 0


@njit(cache=True)
def _checkpoint(S, N, H1, H2, HK, HI, G, Q, R, L, pf, pp):
    overlap, target = _insert(S, N, H1, H2, HK, HI, G, Q, R[R_SEQ], L, R[R_NODE], R[R_INS], R[R_PRI], R[R_TAG], pf, pp)
    if L > R[R_INS]:
        R[R_INS] = L
    if L > R[R_OWNED]:
        p = S[S_P]
        dup = (overlap - R[R_OWNED]) // p
        S[S_FREE] += dup
        S[S_PRIV] -= dup + (L - overlap) // p
        R[R_OWNED] = L
    return target


@njit(cache=True)
def _after_prefill(S, N, H1, H2, HK, HI, G, Q, R, pf, pp):
    P = R[R_PLEN]
    c = R[R_COMP]
    if c > P or (c == P and R[R_KVMAX] == P):
        return
    p = S[S_P]
    target = _checkpoint(S, N, H1, H2, HK, HI, G, Q, R, c // p * p, pf, pp)
    if target != R[R_NODE]:
        _inc_lock(S, N, target)
        _dec_lock(S, N, HK, HI, R[R_NODE], pf, pp)
        R[R_NODE] = target


@njit(cache=True)
def _admit(S, N, H1, H2, HK, HI, G, Q, R, sid, send, P, n_tokens, prio, tag, pf, pp):
    p = S[S_P]
    chunk = S[S_CHUNK]
    K = (P - 1) // p * p
    hit, last, split, gain = match_plan(S, N, H1, G, Q, sid, send, K)
    if p > 1:
        held = token_walk(S, N, H1, H2, G, Q, sid, send, _M1, _Z, _Z, P)
    elif hit < K:
        held = hit
    elif split != -1:
        end = N[split, F_END]
        held = _lcp(N, G, Q, split, sid, send, _M1, K, min(end, P))
        if held == end:
            held = token_walk(S, N, H1, H2, G, Q, sid, send, _M1, split, end, P)
    else:
        held = token_walk(S, N, H1, H2, G, Q, sid, send, _M1, last, K, P)
    if n_tokens < 0:
        target = P
        if chunk > 0 and P - hit > chunk:
            target = hit + chunk
    else:
        target = max(n_tokens, hit)
    new_slots = -(-target // p) - hit // p
    if new_slots > S[S_FREE] + (S[S_EVTOK] - gain) // p:
        return False, hit, held, _Z
    f = np.searchsorted(send, hit, side="right")
    f = f - 1 if f > 0 else 0
    s = register_seq(S, G, Q, sid[f:], send[f:])
    if split != -1:
        last = _split(S, N, H1, H2, HK, HI, G, Q, split, hit, pf, pp)
    if K > 0:
        cur = _tick(S)
        x = last
        k = 0
        while x != 0:
            N[x, F_TIME] = cur - k
            k += 1
            x = N[x, F_PARENT]
        _push(S, N, HK, HI, last, pf, pp)
    _inc_lock(S, N, last)
    extra = p if p > 1 else 0
    ev = _evict_for(S, N, H1, H2, HK, HI, Q, target - hit + extra, pf, pp)
    R[R_NODE] = last
    R[R_OWNED] = hit
    R[R_COMP] = hit
    R[R_KVMAX] = send[send.shape[0] - 1]
    R[R_SEQ] = s
    R[R_PLEN] = P
    R[R_INS] = 0
    R[R_PRI] = prio
    R[R_TAG] = tag
    _alloc(S, R, target)
    R[R_EVICTED] = ev
    _after_prefill(S, N, H1, H2, HK, HI, G, Q, R, pf, pp)
    return True, hit, held, ev


@njit(cache=True)
def admit(S, N, H1, H2, HK, HI, G, Q, R, sid, send, P, n_tokens, prio, tag, fa, pp):
    """``_radix_kernels.admit`` with priority eviction; *prio*: the request's priority,
    *tag*: copied to the nodes the request creates. Returns (admitted, hit, held, evicted)."""
    pf = _fn(fa)
    return _admit(S, N, H1, H2, HK, HI, G, Q, R, sid, send, P, n_tokens, prio, tag, pf, pp)


@njit(cache=True)
def _decode(S, N, H1, H2, HK, HI, Q, R, end, pf, pp):
    p = S[S_P]
    q = R[R_COMP]
    while q < end:
        if S[S_FREE] == 0:
            R[R_EVICTED] += _evict(S, N, H1, H2, HK, HI, Q, p, pf, pp)
        first_b = -(-q // p) * p
        nb = 0 if first_b >= end else (end - 1 - first_b) // p + 1
        if nb < S[S_FREE] or nb == 0:
            S[S_FREE] -= nb
            S[S_PRIV] += nb
            q = end
        else:
            F = S[S_FREE]
            if F == 0:
                return False
            S[S_FREE] = 0
            S[S_PRIV] += F
            q = first_b + (F - 1) * p + 1
    R[R_COMP] = end
    return True


@njit(cache=True)
def _extend(S, N, H1, H2, HK, HI, G, Q, R, n_tokens, pf, pp):
    p = S[S_P]
    end = R[R_COMP] + n_tokens
    need = -(-end // p) - -(-R[R_COMP] // p)
    if need > S[S_FREE] + S[S_EVTOK] // p:
        return 0
    P = R[R_PLEN]
    chunk = S[S_CHUNK]
    extra = p if p > 1 else 0
    while R[R_COMP] < P and R[R_COMP] < end:
        step = min(end, P) - R[R_COMP]
        if chunk > 0 and step > chunk:
            step = chunk
        R[R_EVICTED] += _evict_for(S, N, H1, H2, HK, HI, Q, step + extra, pf, pp)
        _alloc(S, R, R[R_COMP] + step)
        _after_prefill(S, N, H1, H2, HK, HI, G, Q, R, pf, pp)
    if R[R_COMP] < end:
        if not _decode(S, N, H1, H2, HK, HI, Q, R, end, pf, pp):
            return -1
    return 1


@njit(cache=True)
def extend(S, N, H1, H2, HK, HI, G, Q, R, n_tokens, fa, pp):
    """``_radix_kernels.extend`` with priority eviction: 1, 0 (no room) or −1."""
    pf = _fn(fa)
    return _extend(S, N, H1, H2, HK, HI, G, Q, R, n_tokens, pf, pp)


@njit(cache=True)
def _release(S, N, HK, HI, Q, R, pf, pp):
    p = S[S_P]
    slots = -(-R[R_COMP] // p) - R[R_OWNED] // p
    S[S_FREE] += slots
    S[S_PRIV] -= slots
    _dec_lock(S, N, HK, HI, R[R_NODE], pf, pp)
    _seq_decref(S, Q, R[R_SEQ])
    if S[S_HLEN] > 4 * S[S_NNODES] + 1024:
        _rebuild(S, N, HK, HI, pf, pp)


@njit(cache=True)
def release(S, N, HK, HI, Q, R, fa, pp):
    """Free the request's private slots, unlock its path, drop its sequence reference."""
    pf = _fn(fa)
    _release(S, N, HK, HI, Q, R, pf, pp)


@njit(cache=True)
def _finish(S, N, H1, H2, HK, HI, G, Q, R, pf, pp):
    p = S[S_P]
    L = R[R_COMP] // p * p
    _checkpoint(S, N, H1, H2, HK, HI, G, Q, R, L, pf, pp)
    # ``checkpoint_into_tree``: the prompt again, only when it ends before the KV
    # inserted, with priority + 1 and counted as already inserted
    Pal = R[R_PLEN] // p * p
    if 0 < Pal < L:
        _insert(S, N, H1, H2, HK, HI, G, Q, R[R_SEQ], Pal, R[R_NODE], Pal, R[R_PRI] + 1, R[R_TAG], pf, pp)
    _release(S, N, HK, HI, Q, R, pf, pp)


@njit(cache=True)
def finish(S, N, H1, H2, HK, HI, G, Q, R, fa, pp):
    """Insert the KV computed, then the prompt (when shorter); free the rest; unlock."""
    pf = _fn(fa)
    _finish(S, N, H1, H2, HK, HI, G, Q, R, pf, pp)


@njit(cache=True)
def run_request(S, N, H1, H2, HK, HI, G, Q, R, sid, send, P, prio, tag, fa, pp):
    """admit, extend to the KV extent, finish: (status, hit, held, evicted, evicted
    tokens in total, evictions in total); status as ``_radix_kernels.run_request``."""
    pf = _fn(fa)
    ok, hit, held, ev = _admit(S, N, H1, H2, HK, HI, G, Q, R, sid, send, P, _M1, prio, tag, pf, pp)
    if not ok:
        return _Z, hit, held, ev, S[S_EVTOT], S[S_EVN]
    status = np.int64(1)
    if R[R_COMP] < R[R_KVMAX]:
        e = _extend(S, N, H1, H2, HK, HI, G, Q, R, R[R_KVMAX] - R[R_COMP], pf, pp)
        if e < 0:
            return _M1, hit, held, ev, S[S_EVTOT], S[S_EVN]
        if e == 0:
            status = np.int64(2)
    _finish(S, N, H1, H2, HK, HI, G, Q, R, pf, pp)
    return status, hit, held, ev, S[S_EVTOT], S[S_EVN]
