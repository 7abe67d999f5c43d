"""Numba kernels of :class:`radixkv.policies.block_hash.BlockHashCache` (vLLM v1 APC).

Pure functions over numpy arrays (``@njit(cache=True)``); the Python class owns the
arrays, validation and error messages. Every whole operation on the pool (lookup,
admission, extension, release, statistics) is one kernel call, so a request costs a few
calls whatever its length.

Pool layout (``nb`` = ``num_gpu_blocks`` blocks; block 0 is vLLM's null block and is
never touched)

``bi`` : int64, shape (NBI, nb)
    Per-block integers, rows named by the ``BI_*`` constants: ``ref_cnt``; free-queue
    links (``prev``/``next``, −1 = none) and membership; whether the block carries a
    block hash; the duplicate chain of its key (blocks holding the same key, in insertion
    order, vLLM ``BlockHashToBlockMap``); the sibling chain of its parent key (blocks
    whose parent hash is the same, for ``held_tokens``); the number of content pieces.
``bk`` : uint64, shape (2, nb)
    Block hash (key) and parent block hash of each hashed block.
``pc`` : int64, shape (3, nb, C)
    Content of each hashed block as at most C pieces ``(segment id, offset in segment,
    end of the piece inside the block)``, for ``held_tokens`` and ``verify``.
``tk``/``tv`` : key table, open addressing with linear probing and backward-shift
    deletion; ``tk`` uint64 (cap,) keys; ``tv`` int64 (3, cap): first block, last block,
    number of blocks (0 = empty slot). Maps block hash -> duplicate chain.
``ck``/``cv`` : child table, same scheme; ``cv`` int64 (2, cap): first block of the
    sibling chain, number of blocks. Maps parent block hash -> hashed blocks under it.
``st`` : int64, shape (NST,)
    Pool counters, indices ``ST_*``.

Hash function
-------------
A block's key is a 64-bit chained hash: starting from the parent block's key (or the
fixed seed :data:`SEED` for the first block, vLLM ``init_none_hash``), every 64-bit word
of the block's pieces ``(segment id, offset, length)`` is folded in with the splitmix64
finaliser (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
OOPSLA 2014). It is not cryptographic (vLLM uses sha256 over a pickle of
``(parent hash, token ids, extra keys)``, ``kv_cache_utils.hash_block_tokens``); modelled
as a random 64-bit function, the chance that any two of n distinct blocks collide is at
most ``n² / 2⁶⁵``: about 2.7 % for n = 10⁹ distinct blocks, 2.7·10⁻⁸ for n = 10⁶. The
class's ``verify=True`` compares the stored content on every hit and raises on a
collision.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# rows of bi
BI_REF = 0  # ref_cnt (vLLM KVCacheBlock.ref_cnt)
BI_FPREV = 1  # free-queue previous block, -1 = none
BI_FNEXT = 2  # free-queue next block, -1 = none
BI_INFQ = 3  # 1 when the block is in the free queue
BI_HASKEY = 4  # 1 when the block carries a block hash (is in the key table)
BI_DNEXT = 5  # next block with the same key (insertion order), -1 = none
BI_DPREV = 6  # previous block with the same key, -1 = none
BI_CNEXT = 7  # next block with the same parent key, -1 = none
BI_CPREV = 8  # previous block with the same parent key, -1 = none
BI_PCN = 9  # number of content pieces
NBI = 10

# rows of bk
BK_KEY = 0
BK_PKEY = 1

# st
ST_FQH = 0  # free-queue head block, -1 = empty
ST_FQT = 1  # free-queue tail block, -1 = empty
ST_FQLEN = 2  # free-queue length (blocks with ref_cnt 0)
ST_NHASHED = 3  # blocks carrying a key
ST_NKEYS = 4  # distinct keys in the key table
ST_EVICTIONS = 5  # blocks evicted (key dropped when taken from the free queue)
ST_NUSED = 6  # blocks with ref_cnt > 0
ST_NCACHED = 7  # blocks with ref_cnt 0 and a key
ST_NDUPKEYS = 8  # keys held by more than one block
NST = 9

#: seed of the hash chain: the parent key of a sequence's first block (vLLM NONE_HASH)
SEED = np.uint64(0x9E3779B97F4A7C15)

# return codes
OK = 0
REFUSED = 1  # no room: state unchanged
COLLISION = 2  # verify found a hit block whose content differs (hash collision)

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@njit(cache=True, inline="always")
def _mix(h, w):
    """Fold the 64-bit word *w* into the running hash *h* (splitmix64 finaliser)."""
    z = (h ^ w) + _GOLD
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True)
def seq_block_keys(seg_id, seg_end, block_size, n_blocks, key_mask):
    """Chained keys of the first *n_blocks* full blocks of a sequence.

    Parameters
    ----------
    seg_id, seg_end : int64 arrays, shape (S,)
        The sequence's segments (``KVSeq``); ``seg_end[-1] ≥ n_blocks × block_size``.
    block_size : int
        Tokens per block (B).
    n_blocks : int
        Full blocks to hash.
    key_mask : uint64
        AND-ed into every key (all ones in use; tests narrow it to force collisions).

    Returns
    -------
    keys : uint64 array, shape (n_blocks,)
        ``keys[j]`` = hash of block j chained on ``keys[j−1]`` (``SEED`` for j = 0).
    max_pieces : int
        Largest number of pieces (runs of one segment) in any of these blocks.
    """
    keys = np.empty(n_blocks, dtype=np.uint64)
    parent = SEED
    s = 0
    seg_start = 0
    max_pieces = 0
    for j in range(n_blocks):
        start = j * block_size
        end = start + block_size
        h = parent
        pos = start
        npieces = 0
        while pos < end:
            while seg_end[s] <= pos:
                seg_start = seg_end[s]
                s += 1
            stop = min(seg_end[s], end)
            h = _mix(h, np.uint64(seg_id[s]))
            h = _mix(h, np.uint64(pos - seg_start))
            h = _mix(h, np.uint64(stop - pos))
            npieces += 1
            pos = stop
        h = h & key_mask
        keys[j] = h
        parent = h
        if npieces > max_pieces:
            max_pieces = npieces
    return keys, max_pieces


# ---------------------------------------------------------------------- hash tables
@njit(cache=True, inline="always")
def _find(tk, tcount, key):
    """Slot of *key* in an open-addressing table, or −1. ``tcount[slot] == 0`` = empty."""
    mask = tk.shape[0] - 1
    i = np.int64(key & np.uint64(mask))
    while tcount[i] != 0:
        if tk[i] == key:
            return i
        i = (i + 1) & mask
    return -1


@njit(cache=True, inline="always")
def _slot_for_insert(tk, tcount, key):
    """First empty slot on *key*'s probe path (the key must be absent)."""
    mask = tk.shape[0] - 1
    i = np.int64(key & np.uint64(mask))
    while tcount[i] != 0:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _delete_slot(tk, tv, cnt_row, i):
    """Empty slot *i* and close the gap (backward-shift deletion, Knuth vol. 3, 6.4 R).

    ``tv`` is the value array (rows moved with the key); ``tv[cnt_row]`` is the
    occupancy count (0 = empty).
    """
    mask = tk.shape[0] - 1
    nrow = tv.shape[0]
    j = i
    while True:
        j = (j + 1) & mask
        if tv[cnt_row, j] == 0:
            break
        k = np.int64(tk[j] & np.uint64(mask))
        # move j into the hole i unless its home k lies cyclically in (i, j]
        if i <= j:
            stay = i < k <= j
        else:
            stay = k > i or k <= j
        if not stay:
            tk[i] = tk[j]
            for r in range(nrow):
                tv[r, i] = tv[r, j]
            i = j
    for r in range(nrow):
        tv[r, i] = 0
    tv[cnt_row, i] = 0


# ---------------------------------------------------------------------- free queue
@njit(cache=True, inline="always")
def _fq_remove(bi, st, b):
    p = bi[BI_FPREV, b]
    n = bi[BI_FNEXT, b]
    if p >= 0:
        bi[BI_FNEXT, p] = n
    else:
        st[ST_FQH] = n
    if n >= 0:
        bi[BI_FPREV, n] = p
    else:
        st[ST_FQT] = p
    bi[BI_FPREV, b] = -1
    bi[BI_FNEXT, b] = -1
    bi[BI_INFQ, b] = 0
    st[ST_FQLEN] -= 1


@njit(cache=True, inline="always")
def _fq_append(bi, st, b):
    t = st[ST_FQT]
    bi[BI_FPREV, b] = t
    bi[BI_FNEXT, b] = -1
    if t >= 0:
        bi[BI_FNEXT, t] = b
    else:
        st[ST_FQH] = b
    st[ST_FQT] = b
    bi[BI_INFQ, b] = 1
    st[ST_FQLEN] += 1


@njit(cache=True, inline="always")
def _fq_prepend(bi, st, b):
    h = st[ST_FQH]
    bi[BI_FNEXT, b] = h
    bi[BI_FPREV, b] = -1
    if h >= 0:
        bi[BI_FPREV, h] = b
    else:
        st[ST_FQT] = b
    st[ST_FQH] = b
    bi[BI_INFQ, b] = 1
    st[ST_FQLEN] += 1


@njit(cache=True)
def init_pool(bi, st):
    """Empty pool: every usable block 1..nb−1 in the free queue in ascending id order.

    vLLM ``BlockPool.__init__``: ``FreeKVCacheBlockQueue(all blocks)`` then block 0 is
    popped as the permanent ``null_block``.
    """
    nb = bi.shape[1]
    bi[:, :] = 0
    bi[BI_FPREV, :] = -1
    bi[BI_FNEXT, :] = -1
    bi[BI_DNEXT, :] = -1
    bi[BI_DPREV, :] = -1
    bi[BI_CNEXT, :] = -1
    bi[BI_CPREV, :] = -1
    st[:] = 0
    st[ST_FQH] = -1
    st[ST_FQT] = -1
    for b in range(1, nb):
        _fq_append(bi, st, b)


# ---------------------------------------------------------------------- key table ops
@njit(cache=True)
def _drop_key(bi, bk, tk, tv, ck, cv, st, b):
    """Remove block *b* from the key table and its parent's sibling chain."""
    key = bk[BK_KEY, b]
    i = _find(tk, tv[2], key)
    n = bi[BI_DNEXT, b]
    p = bi[BI_DPREV, b]
    if p >= 0:
        bi[BI_DNEXT, p] = n
    else:
        tv[0, i] = n
    if n >= 0:
        bi[BI_DPREV, n] = p
    else:
        tv[1, i] = p
    tv[2, i] -= 1
    if tv[2, i] == 0:
        _delete_slot(tk, tv, 2, i)
        st[ST_NKEYS] -= 1
    elif tv[2, i] == 1:
        st[ST_NDUPKEYS] -= 1
    bi[BI_DNEXT, b] = -1
    bi[BI_DPREV, b] = -1
    # sibling chain under the parent key
    pkey = bk[BK_PKEY, b]
    j = _find(ck, cv[1], pkey)
    n = bi[BI_CNEXT, b]
    p = bi[BI_CPREV, b]
    if p >= 0:
        bi[BI_CNEXT, p] = n
    else:
        cv[0, j] = n
    if n >= 0:
        bi[BI_CPREV, n] = p
    cv[1, j] -= 1
    if cv[1, j] == 0:
        _delete_slot(ck, cv, 1, j)
    bi[BI_CNEXT, b] = -1
    bi[BI_CPREV, b] = -1
    bi[BI_HASKEY, b] = 0
    st[ST_NHASHED] -= 1


@njit(cache=True)
def _add_key(bi, bk, tk, tv, ck, cv, st, b, key, pkey):
    """Give block *b* the key *key* (parent *pkey*); duplicates go to the chain's end.

    vLLM ``BlockPool.cache_full_blocks`` / ``BlockHashToBlockMap.insert``: no dedup.
    """
    bk[BK_KEY, b] = key
    bk[BK_PKEY, b] = pkey
    bi[BI_HASKEY, b] = 1
    st[ST_NHASHED] += 1
    i = _find(tk, tv[2], key)
    if i < 0:
        i = _slot_for_insert(tk, tv[2], key)
        tk[i] = key
        tv[0, i] = b
        tv[1, i] = b
        tv[2, i] = 1
        bi[BI_DPREV, b] = -1
        bi[BI_DNEXT, b] = -1
        st[ST_NKEYS] += 1
    else:
        t = tv[1, i]
        bi[BI_DNEXT, t] = b
        bi[BI_DPREV, b] = t
        bi[BI_DNEXT, b] = -1
        tv[1, i] = b
        tv[2, i] += 1
        if tv[2, i] == 2:
            st[ST_NDUPKEYS] += 1
    j = _find(ck, cv[1], pkey)
    if j < 0:
        j = _slot_for_insert(ck, cv[1], pkey)
        ck[j] = pkey
        cv[0, j] = b
        cv[1, j] = 1
        bi[BI_CPREV, b] = -1
        bi[BI_CNEXT, b] = -1
    else:
        h = cv[0, j]
        bi[BI_CNEXT, b] = h
        bi[BI_CPREV, b] = -1
        bi[BI_CPREV, h] = b
        cv[0, j] = b
        cv[1, j] += 1


# ---------------------------------------------------------------------- content
@njit(cache=True)
def _seg_index(seg_end, pos):
    """Index of the segment holding token position *pos* (first ``seg_end > pos``)."""
    return np.searchsorted(seg_end, pos, side="right")


@njit(cache=True)
def _store_pieces(bi, pc, b, seg_id, seg_end, start, block_size):
    """Record the pieces of tokens ``[start, start + B)`` of the sequence as *b*'s content."""
    s = _seg_index(seg_end, start)
    seg_start = seg_end[s - 1] if s > 0 else 0
    end = start + block_size
    pos = start
    k = 0
    while pos < end:
        while seg_end[s] <= pos:
            seg_start = seg_end[s]
            s += 1
        stop = min(seg_end[s], end)
        pc[0, b, k] = seg_id[s]
        pc[1, b, k] = pos - seg_start
        pc[2, b, k] = stop - start
        k += 1
        pos = stop
    bi[BI_PCN, b] = k


@njit(cache=True)
def _lcp_block(bi, pc, b, seg_id, seg_end, start, end):
    """Tokens that block *b*'s content shares with sequence tokens ``[start, end)``.

    Length of the longest common prefix, at most ``end − start``. Two tokens are equal
    iff their segment ids and their offsets in the segment are equal (``KVSeq``).
    """
    s = _seg_index(seg_end, start)
    return _lcp_block_at(bi, pc, b, seg_id, seg_end, start, end, s)


@njit(cache=True)
def _lcp_block_at(bi, pc, b, seg_id, seg_end, start, end, s):
    """:func:`_lcp_block` with ``s`` = index of the segment holding *start*."""
    seg_start = seg_end[s - 1] if s > 0 else 0
    npc = bi[BI_PCN, b]
    k = 0
    piece_start = 0  # relative to start
    pos = start
    while pos < end and k < npc:
        while seg_end[s] <= pos:
            seg_start = seg_end[s]
            s += 1
        r = pos - start
        if pc[0, b, k] != seg_id[s] or pc[1, b, k] + (r - piece_start) != pos - seg_start:
            break
        step = min(pc[2, b, k] - r, seg_end[s] - pos, end - pos)
        pos += step
        if r + step == pc[2, b, k]:
            piece_start = pc[2, b, k]
            k += 1
    return pos - start


# ---------------------------------------------------------------------- lookup
@njit(cache=True)
def lookup(bi, bk, tk, tv, ck, cv, pc, keys, n_look, seg_id, seg_end, block_size,
           prompt_len, verify, hit_out):
    """Longest chain of cached blocks and the prompt held at token granularity.

    vLLM ``FullAttentionManager.find_longest_cache_hit`` with ``BlockPool.get_cached_block``
    (the first block inserted under a key, i.e. the head of its duplicate chain). Does not
    change the pool.

    Parameters
    ----------
    keys : uint64 (≥ n_look,)
        The sequence's chained block keys.
    n_look : int
        Blocks that may be looked up (``lookup_len // B``).
    prompt_len : int
        P, for ``held``.
    verify : bool
        Compare each hit block's stored content with the sequence.
    hit_out : int64 (≥ n_look,)
        Receives the served block of each hit.

    Returns
    -------
    (code, n_hit, held) : ``n_hit`` = consecutive hit blocks (uncapped); ``held`` = the
        prompt tokens held at token granularity (``PoolStats``/``Admission.held_tokens``);
        ``code`` = ``COLLISION`` when *verify* found a wrong block.
    """
    h = 0
    while h < n_look:
        i = _find(tk, tv[2], keys[h])
        if i < 0:
            break
        b = tv[0, i]
        if verify:
            if _lcp_block(bi, pc, b, seg_id, seg_end, h * block_size, (h + 1) * block_size) != block_size:
                return COLLISION, h, 0
        hit_out[h] = b
        h += 1
    B = block_size
    if h * B >= prompt_len:
        return OK, h, prompt_len
    # the next prompt block (possibly partial): best common prefix with any cached block
    # continuing the chain
    start = h * B
    end = min(start + B, prompt_len)
    pkey = keys[h - 1] if h > 0 else SEED
    best = 0
    j = _find(ck, cv[1], pkey)
    if j >= 0:
        s0 = _seg_index(seg_end, start)
        b = cv[0, j]
        while b >= 0 and best < end - start:
            m = _lcp_block_at(bi, pc, b, seg_id, seg_end, start, end, s0)
            if m > best:
                best = m
            b = bi[BI_CNEXT, b]
    return OK, h, start + best


# ---------------------------------------------------------------------- allocate
@njit(cache=True)
def _take_new(bi, bk, tk, tv, ck, cv, st, tbl, at, n_new, block_size):
    """Pop *n_new* blocks from the free-queue head into ``tbl[at:]``; evict their keys.

    vLLM ``BlockPool.get_new_blocks`` → ``_maybe_evict_cached_block``. Returns the number
    of blocks whose key was dropped. The caller has checked ``n_new ≤ free-queue length``.
    """
    ev = 0
    for k in range(n_new):
        b = st[ST_FQH]
        _fq_remove(bi, st, b)
        if bi[BI_HASKEY, b] == 1:
            _drop_key(bi, bk, tk, tv, ck, cv, st, b)
            st[ST_NCACHED] -= 1
            ev += 1
        bi[BI_REF, b] = 1
        st[ST_NUSED] += 1
        tbl[at + k] = b
    st[ST_EVICTIONS] += ev
    return ev


@njit(cache=True)
def _cache_full(bi, bk, tk, tv, ck, cv, pc, st, tbl, keys, lo, hi, seg_id, seg_end, block_size):
    """Give blocks ``tbl[lo:hi]`` their keys (vLLM ``BlockPool.cache_full_blocks``)."""
    for j in range(lo, hi):
        pkey = keys[j - 1] if j > 0 else SEED
        _add_key(bi, bk, tk, tv, ck, cv, st, tbl[j], keys[j], pkey)
        _store_pieces(bi, pc, tbl[j], seg_id, seg_end, j * block_size, block_size)


@njit(cache=True)
def admit(bi, bk, tk, tv, ck, cv, pc, st, keys, seg_id, seg_end, block_size, prompt_len,
          lookup_len, n_tokens, verify, tbl):
    """Look up and allocate one request (vLLM ``get_computed_blocks`` + ``allocate_slots``).

    Parameters
    ----------
    prompt_len : int
        P (``held`` is capped at P).
    lookup_len : int
        The request's known tokens (P, or prompt + generated for a resumed request); the
        hit is capped at ``(lookup_len − 1) // B`` blocks and the whole of it must fit.
    n_tokens : int
        Tokens that get KV now (≥ the hit): ``ceil(n_tokens / B)`` blocks are held.
    tbl : int64 (≥ ceil(kv_len / B),)
        Receives the request's block table.

    Returns
    -------
    (code, hit_blocks, held_tokens, evicted_blocks, n_blocks)
        ``code`` OK, REFUSED (no state change) or COLLISION (no state change).
    """
    B = block_size
    n_look = lookup_len // B
    code, h, held = lookup(bi, bk, tk, tv, ck, cv, pc, keys, n_look, seg_id, seg_end, B,
                           prompt_len, verify, tbl)
    if code != OK:
        return code, 0, 0, 0, 0
    hcap = min(h, (lookup_len - 1) // B)
    n_touch = 0
    for k in range(hcap):
        if bi[BI_REF, tbl[k]] == 0:
            n_touch += 1
    # admission check (vLLM get_num_blocks_to_allocate; the whole sequence must fit,
    # scheduler_reserve_full_isl): new blocks for the whole lookup length plus the hit
    # blocks sitting in the free queue, within the free-queue length
    need_full = (lookup_len + B - 1) // B - hcap
    if need_full + n_touch > st[ST_FQLEN]:
        return REFUSED, hcap, held, 0, 0
    # touch (BlockPool.touch): hit blocks with ref_cnt 0 leave the free queue
    for k in range(hcap):
        b = tbl[k]
        if bi[BI_REF, b] == 0:
            _fq_remove(bi, st, b)
            st[ST_NUSED] += 1
            if bi[BI_HASKEY, b] == 1:
                st[ST_NCACHED] -= 1
        bi[BI_REF, b] += 1
    t = max(n_tokens, hcap * B)
    nblk = (t + B - 1) // B
    ev = _take_new(bi, bk, tk, tv, ck, cv, st, tbl, hcap, nblk - hcap, B)
    _cache_full(bi, bk, tk, tv, ck, cv, pc, st, tbl, keys, hcap, t // B, seg_id, seg_end, B)
    return OK, hcap, held, ev, nblk


@njit(cache=True)
def extend(bi, bk, tk, tv, ck, cv, pc, st, keys, seg_id, seg_end, block_size, tbl,
           n_blocks, n_computed, n_more):
    """The request computes *n_more* tokens: allocate, then cache blocks that became full.

    vLLM ``allocate_slots`` for a decode step or a later prefill chunk, then
    ``cache_blocks``. Returns ``(ok, new n_blocks, evicted blocks)``; ``ok`` False leaves
    the pool unchanged.
    """
    B = block_size
    t = n_computed + n_more
    nblk = (t + B - 1) // B
    n_new = nblk - n_blocks
    if n_new > st[ST_FQLEN]:
        return False, n_blocks, 0
    ev = 0
    if n_new > 0:
        ev = _take_new(bi, bk, tk, tv, ck, cv, st, tbl, n_blocks, n_new, B)
    _cache_full(bi, bk, tk, tv, ck, cv, pc, st, tbl, keys, n_computed // B, t // B, seg_id, seg_end, B)
    return True, nblk, ev


@njit(cache=True)
def free(bi, st, tbl, n_blocks):
    """Release a request's blocks tail first (vLLM ``KVCacheManager.free`` → ``BlockPool.free_blocks``).

    A block whose ref_cnt reaches 0 goes to the free queue: hashed blocks are appended to
    the tail, unhashed (partial) blocks pushed on the head, each in tail-first order.
    """
    for k in range(n_blocks - 1, -1, -1):
        b = tbl[k]
        bi[BI_REF, b] -= 1
        if bi[BI_REF, b] == 0:
            st[ST_NUSED] -= 1
            if bi[BI_HASKEY, b] == 1:
                _fq_append(bi, st, b)
                st[ST_NCACHED] += 1
            else:
                _fq_prepend(bi, st, b)


@njit(cache=True)
def run_request(bi, bk, tk, tv, ck, cv, pc, st, keys, seg_id, seg_end, block_size, prompt_len,
                kv_len, verify, tbl):
    """Admit the prompt, decode to the KV extent in one step, free: the fused fast path.

    Same result as ``admit`` + ``extend(kv_len − P)`` + ``free`` (the base class's
    ``run_request``). Returns ``(code, hit_blocks, held, evicted_blocks, decoded)``;
    ``decoded`` False when the decode did not fit (the request was freed after its
    prefill, as the base class does).
    """
    code, hcap, held, ev, nblk = admit(bi, bk, tk, tv, ck, cv, pc, st, keys, seg_id, seg_end,
                                       block_size, prompt_len, prompt_len, prompt_len, verify, tbl)
    if code != OK:
        return code, hcap, held, ev, False
    ok = True
    if kv_len > prompt_len:
        ok, nblk2, ev2 = extend(bi, bk, tk, tv, ck, cv, pc, st, keys, seg_id, seg_end, block_size,
                                tbl, nblk, prompt_len, kv_len - prompt_len)
        if ok:
            nblk = nblk2
    free(bi, st, tbl, nblk)
    return OK, hcap, held, ev, ok


# ---------------------------------------------------------------------- statistics
@njit(cache=True)
def largest_free_run(bi):
    """Longest run of consecutive block ids that are free (ref_cnt 0, no key); O(nb)."""
    best = 0
    cur = 0
    for b in range(1, bi.shape[1]):
        if bi[BI_REF, b] == 0 and bi[BI_HASKEY, b] == 0:
            cur += 1
            if cur > best:
                best = cur
        else:
            cur = 0
    return best


@njit(cache=True)
def reachable_keys(bi, bk, tk, tv, ck, cv):
    """Distinct keys a lookup can reach: chains from the seed with every ancestor cached.

    Breadth-first over the child table from ``SEED``; O(hashed blocks).
    """
    nb = bi.shape[1]
    queue = np.empty(nb + 1, dtype=np.uint64)
    seen = np.zeros(tk.shape[0], dtype=np.uint8)
    queue[0] = SEED
    qh = 0
    qt = 1
    n = 0
    while qh < qt:
        pkey = queue[qh]
        qh += 1
        j = _find(ck, cv[1], pkey)
        if j < 0:
            continue
        b = cv[0, j]
        while b >= 0:
            i = _find(tk, tv[2], bk[BK_KEY, b])
            if seen[i] == 0:
                seen[i] = 1
                n += 1
                queue[qt] = bk[BK_KEY, b]
                qt += 1
            b = bi[BI_CNEXT, b]
    return n
