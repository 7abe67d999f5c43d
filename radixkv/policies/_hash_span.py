"""The sequential replay's request loop for :class:`radixkv.policies.block_hash.BlockHashCache`,
inside one Numba call (:meth:`BlockHashCache.replay_span`).

For each request of a span: build its segments (:mod:`radixkv.trace._seq_kernel`), run
:func:`radixkv.policies._hash_kernels.run_seq` (hash, admit, decode, release) and write
the row :func:`radixkv.replay.sequential.replay_sequential` would write from
``stats(detail=False)``. The loop hands the request back to the Python loop when the
Python path would do something else: widen the content-piece arrays, report a request
that does not fit the pool, or a refusal.
"""
from __future__ import annotations

import numba as nb
import numpy as np

# Kernels here inline _hash_kernels. Numba alone would check only this file's stamp; radixkv keys
# its Numba cache folder by a hash of every kernel source (radixkv.numba_cache.source_key), so a
# change to _hash_kernels is a cold cache here too: nothing to touch in this file.
import radixkv.policies._hash_kernels as K
from radixkv.policies._borrowed import borrow
from radixkv.trace._seq_kernel import kv_seq_into, kv_seq_is_prompt_ids, kv_seq_len, prefetch_request

C_PROMPT, C_HIT, C_HELD, C_EVICTED, C_USED, C_CACHED, C_FREE, C_VALID, C_DUP, C_META = range(10)
NC = 10


@nb.njit(cache=True)
def replay_span(blk, kt, pcid, pcs, state, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
                output_len, unit_tokens, i0, i1, num_slots, block_size, key_mask, key_bytes, dup_bytes, out):
    """Replay requests ``i0 … i1−1``; returns ``(next request, status)``.

    status 1: all done, or request ``next`` must go through the Python path (pieces to
    widen, or it does not fit); 0: request ``next`` was refused at admission (nothing
    changed); 2: its decode did not fit (it was released).
    """
    B = block_size
    n_max = 0
    kv_max = 0
    for i in range(i0, i1):
        m = kv_seq_len(id_offsets, out_offsets, has_out, prompt_len, output_len, unit_tokens, i)
        if m > n_max:
            n_max = m
        kv = prompt_len[i] + max(output_len[i] - 1, 0)
        if kv > kv_max:
            kv_max = kv
    sid = np.empty(n_max, dtype=np.int64)
    send = np.empty(n_max, dtype=np.int64)
    scratch = np.zeros((2, max(1, (kv_max + B - 1) // B)), dtype=np.int64)
    one_to_n = np.arange(1, n_max + 1)  # the ends of one-token segments
    # the scratch arrays are passed as arguments, not borrowed here: this call holds them
    # until _loop returns (a local borrowed after its last use would be freed at once)
    return _loop(blk, kt, pcid, pcs, state, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
                 output_len, unit_tokens, i0, i1, num_slots, B, key_mask, key_bytes, dup_bytes, out,
                 sid, send, scratch, one_to_n)


@nb.njit(cache=True)
def _loop(blk, kt, pcid, pcs, state, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
          output_len, unit_tokens, i0, i1, num_slots, B, key_mask, key_bytes, dup_bytes, out,
          sid, send, scratch, one_to_n):
    """The loop of :func:`replay_span`, on borrowed views of its arguments; *sid*,
    *send*: scratch of length ≥ the longest request's segment count; *scratch*: int64
    (2, ≥ the most blocks of a request's KV); *one_to_n*: ``1 … n`` (n ≥ the longest
    prompt of a request whose segments are its prompt ids)."""
    st = state[: K.NST]
    # borrowed views of this call's arguments (no reference counts per request;
    # radixkv.policies._borrowed): the caller keeps the arrays alive until we return
    bblk, bkt, bpcid, bpcs, bstate = borrow(blk), borrow(kt), borrow(pcid), borrow(pcs), borrow(state)
    bscratch, bsid, bsend = borrow(scratch), borrow(sid), borrow(send)
    bone, bids = borrow(one_to_n), borrow(ids)
    for i in range(i0, i1):
        P = prompt_len[i]
        kv = P + max(output_len[i] - 1, 0)
        if (kv + B - 1) // B > num_slots:
            return i, 1
        if kv_seq_is_prompt_ids(id_offsets, prompt_len, output_len, unit_tokens, i):
            # the segments are the prompt ids, one token each: views, no copy
            a = id_offsets[i]
            vsid = bids[a:a + P]
            vsend = bone[:P]
        else:
            m = kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                            sid, send)
            vsid = bsid[:m]
            vsend = bsend[:m]
        if i + 1 < i1:
            prefetch_request(ids, id_offsets, out_ids, out_offsets, has_out, i + 1)
        before = st[K.ST_EVICTIONS]
        code, hit_blocks, held, ev, decoded, total_ev = K.run_seq(
            bblk, bkt, bpcid, bpcs, bstate, bscratch, vsid, vsend, B, P, kv, False, key_mask)
        if code == K.NEED_PIECES:
            return i, 1
        if code == K.REFUSED:
            return i, 0
        if not decoded:
            return i, 2
        r = i - i0
        nh = st[K.ST_NHASHED]
        nk = st[K.ST_NKEYS]
        used = st[K.ST_NUSED]
        cached = st[K.ST_NCACHED]
        out[r, C_PROMPT] = P
        out[r, C_HIT] = hit_blocks * B
        out[r, C_HELD] = held if held < P else P
        out[r, C_EVICTED] = (total_ev - before) * B
        out[r, C_USED] = used
        out[r, C_CACHED] = cached
        out[r, C_FREE] = num_slots - used - cached
        out[r, C_VALID] = nh * B
        out[r, C_DUP] = (nh - nk) * B
        out[r, C_META] = nk * key_bytes + st[K.ST_NDUPKEYS] * dup_bytes
    return i1, 1
