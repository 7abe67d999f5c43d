"""The sequential replay's request loop for :class:`radixkv.policies.radix.RadixCache`
(any eviction order), inside one Numba call (:meth:`RadixCache.replay_span`).

For each request of a span: build its segments (:mod:`radixkv.trace._seq_kernel`),
run :func:`radixkv.policies._radix_kernels.run_request` (admit, decode, finish) and
write the row :func:`radixkv.replay.sequential.replay_sequential` would write from
``stats(detail=False)``. The loop stops, handing the request back to the Python loop,
whenever the Python path would do something the kernel does not: grow the arrays (the
same upper bounds as ``RadixCache._reserve``; a store that compacting frees by half is
compacted in the loop, as ``_reserve_exact`` would), report a request that does
not fit the pool, or a refusal.

Speed (same results): the loop runs on borrowed views of its arrays
(:func:`radixkv.policies._borrowed.borrow`: no reference counts on the state arrays in
the tree kernels' calls), and a token request's segments are built by copying its ids only, the
ends ``1, 2, …`` being kept in the scratch array between requests (``_token_seq_into``).
"""
from __future__ import annotations

import numba as nb
import numpy as np

import radixkv.policies._radix_kernels as K
from radixkv.policies._borrowed import borrow, borrow_each
from radixkv.trace._seq_kernel import kv_seq_into, kv_seq_len, prefetch_request

# column order of the ``out`` array (a subset of radixkv.records.COLUMNS)
C_PROMPT, C_HIT, C_HELD, C_EVICTED, C_USED, C_CACHED, C_FREE, C_VALID, C_CTOK, C_META = range(10)
NC = 10


_Z = np.int64(0)


@nb.njit(cache=True)
def _token_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, P, kv, unit_tokens, i, sid, send):
    """``kv_seq_into`` for a request of single-token segments (unit 1, one id per prompt
    token), with *send* kept as ``send[j] = j + 1`` between requests: copies the ids
    only (loops over slices, which the compiler vectorises). Returns the index of the one
    end it changed (the unique output segment's), −1 for none, or −2 when the request
    is not of this form (nothing written: the caller uses ``kv_seq_into``)."""
    a = id_offsets[i]
    k = id_offsets[i + 1] - a
    if unit_tokens != 1 or k != P:
        return -2
    src = ids[a:a + k]
    dst = sid[:k]
    for j in range(k):
        dst[j] = src[j]
    if kv <= P:
        return -1
    if has_out:
        b = out_offsets[i]
        src = out_ids[b:b + kv - P]
        dst = sid[k:kv]
        for j in range(kv - P):
            dst[j] = src[j]
        return -1
    sid[k] = -(2 * i + 2)  # types._unique_output_id
    send[k] = kv
    return k


@nb.njit(cache=True)
def replay_span(S, N, H1, H2, o, G, Q, R, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
                output_len, unit_tokens, i0, i1, num_slots, page, hi, node_bytes, token_bytes, out):
    """Replay requests ``i0 … i1−1``; returns ``(next request, status)``.

    ``hi`` (int64, shape (3,)) holds the Python-side upper bounds (nodes, store, rows)
    and is updated in place. status 1: all done, or request ``next`` must go through the
    Python path (arrays to grow, or it does not fit); otherwise the ``run_request``
    status of request ``next`` (0 refused, 2 refused at extension, −1 no page to decode),
    which the caller reports as the Python path would.
    """
    n_max = 0
    for i in range(i0, i1):
        m = kv_seq_len(id_offsets, out_offsets, has_out, prompt_len, output_len, unit_tokens, i)
        if m > n_max:
            n_max = m
    sid = np.empty(n_max, dtype=np.int64)
    send = np.empty(n_max + 1, dtype=np.int64)
    for j in range(n_max + 1):
        send[j] = j + 1
    # *sid* and *send* are passed as arguments and borrowed there: this call holds them
    # until ``_views`` returns (a local borrowed after its last use would be freed at once)
    return _views(S, N, H1, H2, o, G, Q, R, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
                  output_len, unit_tokens, i0, i1, num_slots, page, hi, node_bytes, token_bytes, out, sid, send)


@nb.njit(cache=True)
def _views(S, N, H1, H2, o, G, Q, R, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
           output_len, unit_tokens, i0, i1, num_slots, page, hi, node_bytes, token_bytes, out, sid, send):
    """:func:`_loop` on borrowed views of this call's array arguments (the caller keeps
    the arrays alive until it returns)."""
    return _loop(borrow(S), borrow(N), borrow(H1), borrow(H2), borrow_each(o), borrow(G), borrow(Q), borrow(R),
                 borrow(ids), borrow(id_offsets), borrow(out_ids), borrow(out_offsets), has_out,
                 borrow(prompt_len), borrow(output_len), unit_tokens, i0, i1, num_slots, page, borrow(hi),
                 node_bytes, token_bytes, borrow(out), borrow(sid), borrow(send))


@nb.njit(cache=True)
def _loop(S, N, H1, H2, o, G, Q, R, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
          output_len, unit_tokens, i0, i1, num_slots, page, hi, node_bytes, token_bytes, out, sid, send):
    """The loop of :func:`replay_span` on borrowed views; *sid*, *send*: scratch of
    length ≥ the longest request's segment count (+1 for *send*, which holds
    ``send[j] = j + 1`` on entry and on return)."""
    for i in range(i0, i1):
        P = prompt_len[i]
        kv = P + max(output_len[i] - 1, 0)
        if (kv + page - 1) // page > num_slots:
            return i, 1
        m = kv_seq_len(id_offsets, out_offsets, has_out, prompt_len, output_len, unit_tokens, i)
        hi[0] += 18
        hi[1] += m
        hi[2] += 1
        if hi[0] >= N.shape[0] or hi[1] > G.shape[1] or hi[2] >= Q.shape[0]:
            # RadixCache._reserve_exact(18, m): exact counts; growing is left to the
            # Python path
            nn = S[K.S_NNODES]
            if (nn + 1 + 18 <= N.shape[0] and S[K.S_QHW] + 1 < Q.shape[0] and S[K.S_GUSED] + m > G.shape[1]
                    and S[K.S_GUSED] - S[K.S_GGARB] + m <= G.shape[1] // 2):
                # only the store is short, and compacting it frees at least half of it:
                # ``_reserve_exact`` would compact it and go on (offsets change no result)
                K.compact_store(S, G, Q)
            if nn + 1 + 18 > N.shape[0] or S[K.S_GUSED] + m > G.shape[1] or S[K.S_QHW] + 1 >= Q.shape[0]:
                hi[0] -= 18
                hi[1] -= m
                hi[2] -= 1
                return i, 1
            hi[0] = nn + 1 + 18
            hi[1] = S[K.S_GUSED] + m
            hi[2] = S[K.S_QHW] + 1
        fix = _token_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, P, kv, unit_tokens, i, sid, send)
        if fix == -2:
            kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                        sid, send)
        if i + 1 < i1:
            prefetch_request(ids, id_offsets, out_ids, out_offsets, has_out, i + 1)
        before = S[K.S_EVTOT]
        status, hit, held, ev, evtot, evn = K.run_request(S, N, H1, H2, o, G, Q, R, sid[:m], send[:m], P, _Z, np.int64(i))
        if fix >= 0:
            send[fix] = fix + 1
        elif fix == -2:
            for j in range(m):
                send[j] = j + 1
        if status != 1:
            return i, status
        r = i - i0
        tree = S[K.S_EVTOK] + S[K.S_PROT]
        used = S[K.S_PRIV] + S[K.S_PROT] // page
        cached = S[K.S_EVTOK] // page
        out[r, C_PROMPT] = P
        out[r, C_HIT] = hit
        out[r, C_HELD] = held
        out[r, C_EVICTED] = S[K.S_EVTOT] - before
        out[r, C_USED] = used
        out[r, C_CACHED] = cached
        out[r, C_FREE] = num_slots - used - cached
        out[r, C_VALID] = tree
        out[r, C_CTOK] = tree
        out[r, C_META] = S[K.S_NNODES] * node_bytes + tree * token_bytes
    return i1, 1
