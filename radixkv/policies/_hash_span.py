"""The sequential replay's request loop for :class:`radixkv.policies.block_hash.BlockHashCache`,
inside one Numba call (:meth:`BlockHashCache.replay_span`).

For each request of a span: build its segments (:mod:`radixkv.trace._seq_kernel`), run
:func:`radixkv.policies._hash_kernels.run_seq` (hash, admit, decode, release) and write
the row :func:`radixkv.replay.sequential.replay_sequential` would write from
``stats(detail=False)`` — from ``stats(detail=True)`` in the detail rows it names: with
no request running between a span's requests, that adds the reachable keys (a counter)
and the longest run of free block ids (one pass over the blocks). The loop hands the
request back to the Python loop when the Python path would do something else: widen the
content-piece arrays, report a request that does not fit the pool, or a refusal.
"""
from __future__ import annotations

import numba as nb
import numpy as np

# Kernels here inline _hash_kernels. Numba alone would check only this file's stamp; radixkv keys
# its Numba cache folder by a hash of every kernel source (radixkv.numba_cache.source_key), so a
# change to _hash_kernels is a cold cache here too: nothing to touch in this file.
import radixkv.policies._hash_kernels as K
from radixkv.policies._borrowed import borrow
from radixkv.trace._seq_kernel import (kv_seq_ids_then_output_into, kv_seq_into, kv_seq_is_ids_then_output,
                                       kv_seq_is_prompt_ids, kv_seq_len)

C_PROMPT, C_HIT, C_HELD, C_EVICTED, C_USED, C_CACHED, C_FREE, C_VALID, C_DUP, C_META, C_CTOK, C_LFR = range(12)
NC = 12


@nb.njit(cache=True)
def replay_span(blk, kt, pcid, pcs, state, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
                output_len, unit_tokens, i0, i1, num_slots, block_size, key_mask, key_bytes, dup_bytes, out, half, every,
                n_rows, fo):
    """Replay requests ``i0 … i1−1``; returns ``(next request, status)``.

    *fo*: the free order (:data:`radixkv.policies._hash_kernels.FREE_QUEUE`, vLLM's free
    queue: a priority order replays request by request).

    Row ``i`` is a detail row (``cached_tokens`` and ``largest_free_run`` filled, as
    ``stats(detail=True)``; −1 otherwise) when ``i ≥ half`` and ``(i − half) % every == 0``
    (``every ≥ 1``), or ``i == n_rows − 1``.

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
                 sid, send, scratch, one_to_n, half, every, n_rows, fo)


@nb.njit(cache=True)
def _loop(blk, kt, pcid, pcs, state, ids, id_offsets, out_ids, out_offsets, has_out, prompt_len,
          output_len, unit_tokens, i0, i1, num_slots, B, key_mask, key_bytes, dup_bytes, out,
          sid, send, scratch, one_to_n, half, every, n_rows, fo):
    """The loop of :func:`replay_span`, on borrowed views of its arguments; *sid*,
    *send*: scratch of length ≥ the longest request's segment count; *scratch*: int64
    (2, ≥ the most blocks of a request's KV); *one_to_n*: ``1 … n`` (n ≥ the longest
    prompt of a request whose segments are its prompt ids, and > the prompt of one whose
    segments are its prompt ids then an output: its entry P holds kv while it runs);
    *half*, *every*, *n_rows*: the detail rows (:func:`replay_span`)."""
    st = state[: K.NST]
    # borrowed views of this call's arguments (no reference counts per request;
    # radixkv.policies._borrowed): the caller keeps the arrays alive until we return
    bblk, bkt, bpcid, bpcs, bstate = borrow(blk), borrow(kt), borrow(pcid), borrow(pcs), borrow(state)
    bscratch, bsid, bsend = borrow(scratch), borrow(sid), borrow(send)
    bone, bids = borrow(one_to_n), borrow(ids)
    b32 = blk.view(np.int32)  # the blocks as stats() sees them (largest_free_run)
    for i in range(i0, i1):
        P = prompt_len[i]
        patched = False
        kv = P + max(output_len[i] - 1, 0)
        if (kv + B - 1) // B > num_slots:
            return i, 1
        if kv_seq_is_prompt_ids(id_offsets, prompt_len, output_len, unit_tokens, i):
            # the segments are the prompt ids, one token each: views, no copy
            a = id_offsets[i]
            vsid = bids[a:a + P]
            vsend = bone[:P]
            n_tok = P // B  # every full block is a token block (K.run_seq hashes them directly)
        elif kv_seq_is_ids_then_output(id_offsets, prompt_len, output_len, unit_tokens, has_out, i):
            # the prompt ids then one output segment: the ids are copied, the ends are
            # one_to_n's 1 … P with its entry P set to kv for this request (restored below)
            m = kv_seq_ids_then_output_into(ids, id_offsets, prompt_len, i, sid)
            bone[P] = kv
            patched = True
            vsid = bsid[:m]
            vsend = bone[:m]
            n_tok = P // B  # the full blocks of the prompt are token blocks
        else:
            m = kv_seq_into(ids, id_offsets, out_ids, out_offsets, has_out, prompt_len, output_len, unit_tokens, i,
                            sid, send)
            vsid = bsid[:m]
            vsend = bsend[:m]
            n_tok = 0
        # (no prefetch of the next request's ids here: asking for all of them at once,
        # ~560 lines, made the bench trace's replay 16 % slower; the block hash asks for
        # its ids a few pages ahead, _hash_kernels._IDS_AHEAD)
        before = st[K.ST_EVICTIONS]
        code, hit_blocks, held, ev, decoded, total_ev = K.run_seq(
            bblk, bkt, bpcid, bpcs, bstate, bscratch, vsid, vsend, B, P, kv, np.bool_(False), key_mask, n_tok, fo)
        if patched:
            bone[P] = P + 1
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
        if (i >= half and (i - half) % every == 0) or i == n_rows - 1:
            # stats(detail=True): nothing runs, so no partial block; the reachable keys
            # are a counter, the free run one pass over the blocks
            out[r, C_CTOK] = st[K.ST_NREACH] * B
            out[r, C_LFR] = K.largest_free_run(b32)
        else:
            out[r, C_CTOK] = -1
            out[r, C_LFR] = -1
    return i1, 1
