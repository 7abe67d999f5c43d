"""Numba kernels of :class:`radixkv.policies.block_hash.BlockHashCache` (vLLM v1 APC).

Pure functions over numpy arrays (``@njit(cache=True)``); the Python class owns the
arrays, validation and error messages. Every whole operation on the pool (lookup,
admission, extension, release, statistics) is one kernel call, so a request costs a few
calls whatever its length.

Pool layout (``nb`` = ``num_gpu_blocks`` blocks; block 0 is vLLM's null block and is
never touched). Records are one 64-byte cache line (block) or half of one (table row),
64-/32-byte aligned: replaying is bound by memory latency once the pool outgrows the CPU
cache, so a block costs about three cache misses (its record, its key's row, the row
of its parent key, which the previous block of the same chain has just touched); the
rows of blocks about to be evicted or cached are prefetched a batch ahead
(``llvm.prefetch``; a hint that changes no result).

``blk`` : int64, shape (nb, 8), with ``b32 = blk.view(int32)``, shape (nb, 16)
    Per-block record. int32 fields (``b32`` columns ``R_*``): ``ref_cnt``; free-queue
    links (−1 = none; a usable block is in the free queue iff its ref_cnt is 0); the
    duplicate chain of its key (blocks holding the same key, in insertion order, vLLM
    ``BlockHashToBlockMap``); the sibling chain of its parent key (hashed blocks with
    the same parent hash, for ``held_tokens``); the number of content pieces (0 = the
    block carries no block hash). int64 fields (``blk`` columns ``W_*``): its key and
    its parent's key (uint64 hashes stored bit for bit), and the first content piece.
``pcid`` : int64, shape (nb, C − 1); ``pcs`` : int16 (int32 when ``block_size`` ≥ 2¹⁵), shape (nb, C − 1)
    Content pieces 1 … C − 1 of each hashed block (segment id; first position of the
    piece inside the block), for ``held_tokens`` and ``verify``. A block of
    ``block_size`` pieces (one token each: piece k starts at k) leaves its ``pcs`` row
    unwritten. A block's content is
    its pieces ``(segment id, offset in segment, start in block)``: piece 0 (in ``blk``)
    may start inside its segment, every later piece starts at its segment's first token
    (offset 0); a piece ends where the next starts (the last at ``block_size``). C is the
    most pieces any cached block needed (1 for hash-id traces whose units are multiples
    of ``block_size``, ``block_size`` for token traces).
``kt`` : int64, shape (cap, 4), with ``k32 = kt.view(int32)``, shape (cap, 8): the key table
    Open addressing, linear probing, backward-shift deletion. One row per hash that is
    the key or the parent key of a hashed block: ``kt[:, T_KEY]`` the hash; int32
    fields (``k32`` columns): number of blocks holding it as key and head / tail of
    their duplicate chain; number of hashed blocks whose parent key it is and head of
    their sibling chain; ``reach`` = number of blocks holding it whose parent key is the
    seed or reachable (the key is reachable, a lookup can hit it, iff ``reach > 0``). A
    row is occupied iff its two counts (the int64 word ``W_OCC``) are not both 0.
    Sibling groups: under a parent key with two or more children the sibling chain is
    kept grouped by first token, and each group (parent key, first token) has a row of
    its own keyed by :func:`_group_key`, with ``T_CCNT`` = −(members) and ``T_HEAD`` =
    its first block in the chain; the held-token lookup walks only the prompt's group
    instead of every sibling. A lone child has no group row. At most 3 (nb − 1) rows.
``st`` : int64, shape (NST,)
    Pool counters, indices ``ST_*``.

The manager rules (:func:`admit`, :func:`extend`, :func:`free`, :func:`run_request`,
:func:`run_seq`: lookup with the last-token cap :func:`hit_cap`, ``allocate_slots``,
caching full blocks, tail-first freeing) are written once for every free order, passed
as their last argument ``fo``, a :class:`PrioOrder` chosen at run time (one Numba type for
every order, so ``vllm:16`` and ``vllm:16@lfu`` share one compile): :data:`FREE_QUEUE`
(no priority function) is vLLM's free queue, any other evicts by a priority (section
"free order: a priority" below; ``vllm:B@ORDER``).

Hash function
-------------
A block's key is a 64-bit chained hash: starting from the parent block's key (or the
fixed seed :data:`SEED` for the first block, vLLM ``init_none_hash``), each piece
``(segment id, offset, length)`` of the block is folded in with the splitmix64
finaliser — the id as one word and, unless the piece is a whole single-token segment (a
token of a token trace), ``offset << 32 | length`` as a second word (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
OOPSLA 2014). A block of an even ``block_size ≥ 8`` of single-token segments (a token-trace block) is
hashed without a chain: its tokens are taken in pairs, pair k = tokens (2k, 2k + 1) gives
``mum(x₂ₖ ⊕ c₂ₖ, x₂ₖ₊₁ ⊕ c₂ₖ₊₁)`` — the 128-bit product of the two words, its high
and low halves xor-ed (the multiply-fold of wyhash, Wang Yi 2019; rapidhash) — with
fixed odd constants ``c_t`` (:data:`_TOK_C`, position t mod 64), the values are summed
modulo 2⁶⁴ and the sum is folded into the parent key, ``h = mix(parent, Σ)``. The
pairs are independent, so the CPU overlaps their multiplications: one multiply per two
tokens instead of two per token on a chain (the token hash costs about a third of
the earlier four-chain fold). It is not cryptographic (vLLM uses sha256 over a pickle of
``(parent hash, token ids, extra keys)``, ``kv_cache_utils.hash_block_tokens``); modelled
as a random 64-bit function, the chance that any two of n distinct blocks collide is at
most ``n² / 2⁶⁵``: about 2.7 % for n = 10⁹ distinct blocks, 2.7·10⁻⁸ for n = 10⁶. The
class's ``verify=True`` compares the stored content on every hit and raises on a
collision. (Under a collision the incremental reachable-key count may also differ from
a breadth-first search, :func:`reachable_keys`, if a key becomes its own ancestor.)
"""
from __future__ import annotations

from collections import namedtuple

import llvmlite.ir as ir
import numpy as np
from numba import njit, types
from numba.core import config as numba_config
from numba.extending import intrinsic

from radixkv._intrinsics import for_mode, prefetch_row
from radixkv.policies._borrowed import borrow, borrow_py
from radixkv.policies._priority_fn import priority_at as _fn

if numba_config.DISABLE_JIT:  # the interpreted twin (radixkv.replay.jit): an intrinsic cannot run
    borrow = borrow_py  # noqa: F811

# int32 fields of a block record (b32 columns)
R_REF = 0  # ref_cnt (vLLM KVCacheBlock.ref_cnt)
R_FPREV = 1  # free-queue previous block, -1 = none
R_FNEXT = 2  # free-queue next block, -1 = none
R_DNEXT = 3  # next block with the same key (insertion order), -1 = none
R_DPREV = 4  # previous block with the same key, -1 = none
R_CNEXT = 5  # next block with the same parent key, -1 = none
R_CPREV = 6  # previous block with the same parent key, -1 = none
R_PCN = 7  # number of content pieces; 0 = no block hash
# int64 fields of a block record (blk columns)
W_KEY = 4  # block hash (uint64 bits)
W_PKEY = 5  # parent block hash (uint64 bits)
W_ID0 = 6  # segment id of the first content piece
W_OFF0 = 7  # offset in its segment of the block's first token
NF = 8  # int64 words per block record

# key-table row: int64 columns of kt, int32 columns of k32
T_KEY = 0  # the hash (int64 word 0)
W_OCC = 1  # int64 word 1 = (T_CNT, T_CCNT): non-zero iff the row is occupied
T_CNT = 2  # blocks holding this key
T_CCNT = 3  # hashed blocks whose parent key this is
T_HEAD = 4  # first block of the duplicate chain (served on a hit)
T_TAIL = 5  # last block of the duplicate chain
T_CHEAD = 6  # first block of the sibling chain
T_REACH = 7  # blocks holding this key whose parent key is the seed or reachable
NT = 4  # int64 words per table row

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
ST_NREACH = 9  # keys with reach > 0 (reachable from the seed)
NST = 10

#: seed of the hash chain: the parent key of a sequence's first block (vLLM NONE_HASH)
SEED = np.int64(0x1E3779B97F4A7C15)

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
#: per-position constants of a token block's pairs (:func:`_mum`): odd 64-bit words, the
#: splitmix64 sequence from seed 0 with the top and bottom bits set (so that a token id
#: ≥ 0 never cancels one: ``x ⊕ c ≠ 0``); position t uses ``_TOK_C[t % 64]``
_TOK_C = np.empty(64, dtype=np.uint64)


def _fill_tok_c() -> None:
    m = (1 << 64) - 1
    x = 0
    for t in range(64):
        x = (x + 0x9E3779B97F4A7C15) & m
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        _TOK_C[t] = (z ^ (z >> 31)) | (1 << 63) | 1


_fill_tok_c()


@njit(cache=True, inline="always")
def _mix(h, w):
    """Fold the 64-bit word *w* into the running hash *h* (splitmix64 finaliser)."""
    z = (h ^ w) + _GOLD
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@intrinsic
def _mum(typingctx, a, b):
    """``hi ⊕ lo`` of the 128-bit product of the uint64 words *a* and *b* (one ``mul``)."""
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        i128 = ir.IntType(128)
        p = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
        lo = builder.trunc(p, i64)
        hi = builder.trunc(builder.lshr(p, ir.Constant(i128, 64)), i64)
        return builder.xor(lo, hi)

    return sig, codegen


if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run

    def _mum(a, b):  # noqa: F811
        """Python twin of the 128-bit multiply-fold (same value)."""
        p = int(a) * int(b)
        return np.uint64((p ^ (p >> 64)) & ((1 << 64) - 1))


#: domain constant of sibling-group keys (keeps them apart from block keys)
_GROUP = np.uint64(0x5851F42D4C957F2D)


@njit(cache=True, inline="always")
def _group_key(pkey, id0, off0):
    """Key-table key of the sibling group (parent key, first token): the hashed blocks
    whose parent key is *pkey* and whose first token is token *off0* of segment *id0*
    (a 64-bit hash of the three, like a block key)."""
    h = _mix(_mix(np.uint64(pkey) ^ _GROUP, np.uint64(id0)), np.uint64(off0))
    return np.int64(h)


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
    keys : int64 array, shape (n_blocks,)
        ``keys[j]`` = the 64 bits of block j's hash, chained on ``keys[j−1]`` (``SEED``
        for j = 0).
    max_pieces : int
        Largest number of pieces (runs of one segment) in any of these blocks.
    """
    keys = np.empty(n_blocks, dtype=np.int64)
    return keys, _block_keys_into(seg_id, seg_end, block_size, n_blocks, key_mask, keys)


@njit(cache=True, inline="always")
def _block_keys_into(seg_id, seg_end, block_size, n_blocks, key_mask, keys):
    """:func:`seq_block_keys` writing into ``keys[:n_blocks]``; returns ``max_pieces``."""
    return _block_keys_tok_into(seg_id, seg_end, block_size, n_blocks, key_mask, keys, 0)


@njit(cache=True, inline="always")
def _token_pairs(seg_id, us, block_size):
    """The sum of the pair products of the token block whose ids start at ``seg_id[us]``
    (*us* an unsigned index; ``block_size`` even, ≥ 8; module docstring): uint64."""
    acc = np.uint64(0)
    if block_size == 16:  # the common case, unrolled by the compiler
        for k in range(8):
            acc += _mum(np.uint64(seg_id[us + np.uint64(2 * k)]) ^ _TOK_C[2 * k],
                        np.uint64(seg_id[us + np.uint64(2 * k + 1)]) ^ _TOK_C[2 * k + 1])
    else:
        for t in range(0, block_size, 2):
            k = t & 63
            acc += _mum(np.uint64(seg_id[us + np.uint64(t)]) ^ _TOK_C[k],
                        np.uint64(seg_id[us + np.uint64(t + 1)]) ^ _TOK_C[k + 1])
    return acc


@njit(cache=True, inline="always")
def _block_keys_tok_into(seg_id, seg_end, block_size, n_blocks, key_mask, keys, n_tok):
    """:func:`_block_keys_into` for a sequence whose first ``n_tok`` blocks are known to
    be token blocks (``seg_end[k] == k + 1`` for every ``k < n_tok × block_size``: the
    caller built the segments from a token trace's ids). Those blocks are hashed from
    the ids alone, without reading ``seg_end``; the keys are the same whatever *n_tok*
    (0 = nothing known). Returns ``max_pieces``."""
    parent = np.uint64(SEED)
    s = 0
    seg_start = 0
    max_pieces = 0
    nseg = seg_end.shape[0]
    j0 = 0
    if n_tok > 0 and block_size >= 8 and block_size % 2 == 0:
        # what the token-block branch below computes for these blocks, without its
        # segment searches and checks (an odd or small block_size takes that branch)
        j0 = min(n_tok, n_blocks)
        for j in range(j0):
            t0 = j * block_size
            _prefetch_row(seg_id, t0 + _IDS_AHEAD)
            _prefetch_row(seg_id, t0 + _IDS_AHEAD + 8)
            h = _mix(parent, _token_pairs(seg_id, np.uint64(t0), block_size)) & key_mask
            keys[j] = np.int64(h)
            parent = h
        if j0 > 0:
            max_pieces = block_size
            s = j0 * block_size - 1  # the cursor the branch below leaves after a token block
            seg_start = s
    for j in range(j0, n_blocks):
        start = j * block_size
        end = start + block_size
        h = parent
        while seg_end[s] <= start:
            seg_start = seg_end[s]
            s += 1
        if seg_start == start and s + block_size <= nseg and seg_end[s + block_size - 1] == end:
            # block_size one-token segments (seg_end strictly increases): a token-trace
            # block, hashed from its ids alone; an even block_size from 8 on as a sum of
            # independent pair products (module docstring), so the multiplications overlap
            e = s + block_size
            # unsigned indices: with a signed ``s + k`` Numba wraps each read for a negative
            # index (a compare and a move per id, spilled to the stack); no slice either (a
            # view of an array that is not borrowed costs two atomic reference counts). The
            # sequence is read from memory once per replay: ask for the ids _IDS_AHEAD
            # positions on (a hint; the hardware stream prefetcher stops at page
            # boundaries, and a request's ids span several pages)
            us = np.uint64(s)
            _prefetch_row(seg_id, s + _IDS_AHEAD)
            _prefetch_row(seg_id, s + _IDS_AHEAD + 8)
            if block_size >= 8 and block_size % 2 == 0:
                h = _mix(h, _token_pairs(seg_id, us, block_size))
            else:
                for t in range(s, e):
                    h = _mix(h, np.uint64(seg_id[t]))
            s = e - 1
            seg_start = end - 1
            npieces = block_size
        else:
            pos = start
            npieces = 0
            while pos < end:
                while seg_end[s] <= pos:
                    seg_start = seg_end[s]
                    s += 1
                stop = min(seg_end[s], end)
                h = _mix(h, np.uint64(seg_id[s]))
                if pos != seg_start or stop - pos != 1:
                    # a piece other than one whole single-token segment also folds in
                    # its offset and length (each < 2^32 tokens)
                    h = _mix(h, (np.uint64(pos - seg_start) << np.uint64(32)) | np.uint64(stop - pos))
                npieces += 1
                pos = stop
        h = h & key_mask
        keys[j] = np.int64(h)
        parent = h
        if npieces > max_pieces:
            max_pieces = npieces
    return max_pieces


# ---------------------------------------------------------------------- prefetch
#: a cache-line hint (radixkv._intrinsics; a no-op stand-in without the JIT)
_prefetch_row = for_mode(prefetch_row)


#: blocks handled per batch of prefetches when popping from the free queue / caching
_PF = 32
#: how far ahead (in ids) the token-block hash asks for a sequence's ids (3 KiB; 128 to
#: 1,536 measured alike on the bench trace, none 12 % slower)
_IDS_AHEAD = 384


# ---------------------------------------------------------------------- hash table
@njit(cache=True, inline="always")
def _find(kt, key):
    """Row of *key* in the key table, or −1."""
    mask = kt.shape[0] - 1
    i = key & mask
    while kt[i, W_OCC] != 0:
        if kt[i, T_KEY] == key:
            return i
        i = (i + 1) & mask
    return -1


@njit(cache=True, inline="always")
def _slot_for_insert(kt, key):
    """First empty row on *key*'s probe path (the key must be absent)."""
    mask = kt.shape[0] - 1
    i = key & mask
    while kt[i, W_OCC] != 0:
        i = (i + 1) & mask
    return i


@njit(cache=True, inline="always")
def _find_or_add(kt, key):
    """Row of *key*; an absent key gets a zeroed row (unoccupied until a count is set)."""
    mask = kt.shape[0] - 1
    i = key & mask
    while kt[i, W_OCC] != 0:
        if kt[i, T_KEY] == key:
            return i
        i = (i + 1) & mask
    kt[i, 0] = key
    kt[i, 1] = 0
    kt[i, 2] = 0
    kt[i, 3] = 0
    return i


@njit(cache=True, inline="always")
def _delete_slot(kt, i):
    """Empty row *i* and close the gap (backward-shift deletion, Knuth vol. 3, 6.4 R)."""
    mask = kt.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if kt[j, W_OCC] == 0:
            break
        k = kt[j, T_KEY] & mask
        # move j into the hole i unless its home k lies cyclically in (i, j]
        if i <= j:
            stay = i < k <= j
        else:
            stay = k > i or k <= j
        if not stay:
            for c in range(NT):
                kt[i, c] = kt[j, c]
            i = j
    for c in range(NT):
        kt[i, c] = 0


# ---------------------------------------------------------------------- free queue
@njit(cache=True, inline="always")
def _fq_remove(b32, st, b):
    p = b32[b, R_FPREV]
    n = b32[b, R_FNEXT]
    if p >= 0:
        b32[p, R_FNEXT] = n
    else:
        st[ST_FQH] = n
    if n >= 0:
        b32[n, R_FPREV] = p
    else:
        st[ST_FQT] = p
    b32[b, R_FPREV] = -1
    b32[b, R_FNEXT] = -1
    st[ST_FQLEN] -= 1


@njit(cache=True, inline="always")
def _fq_append(b32, st, b):
    t = st[ST_FQT]
    b32[b, R_FPREV] = t
    b32[b, R_FNEXT] = -1
    if t >= 0:
        b32[t, R_FNEXT] = b
    else:
        st[ST_FQH] = b
    st[ST_FQT] = b
    st[ST_FQLEN] += 1


@njit(cache=True, inline="always")
def _fq_prepend(b32, st, b):
    h = st[ST_FQH]
    b32[b, R_FNEXT] = h
    b32[b, R_FPREV] = -1
    if h >= 0:
        b32[h, R_FPREV] = b
    else:
        st[ST_FQT] = b
    st[ST_FQH] = b
    st[ST_FQLEN] += 1


@njit(cache=True)
def init_pool(blk, b32, st):
    """Empty pool: every usable block 1..nb−1 in the free queue in ascending id order.

    vLLM ``BlockPool.__init__``: ``FreeKVCacheBlockQueue(all blocks)`` then block 0 is
    popped as the permanent ``null_block``.
    """
    nb = blk.shape[0]
    blk[:, :] = 0
    for b in range(nb):
        for c in (R_FPREV, R_FNEXT, R_DNEXT, R_DPREV, R_CNEXT, R_CPREV):
            b32[b, c] = -1
    st[:] = 0
    st[ST_FQH] = -1
    st[ST_FQT] = -1
    for b in range(1, nb):
        _fq_append(b32, st, b)


@njit(cache=True)
def free_queue(b32, st):
    """Block ids in the free queue, head (next to be taken) first; int64, O(length)."""
    out = np.empty(st[ST_FQLEN], dtype=np.int64)
    b = st[ST_FQH]
    i = 0
    while b >= 0:
        out[i] = b
        i += 1
        b = b32[b, R_FNEXT]
    return out


# ---------------------------------------------------------------------- free order: a priority
# The pool's kernels (admit, extend, free, run_request, run_seq) take the free order as their
# last argument ``fo``, a :class:`PrioOrder` whose priority addresses ``fa`` choose the order
# at run time: ``fa[0] == 0`` (:data:`FREE_QUEUE`) is vLLM's free queue above (hashed blocks
# appended at release, taken from the head); any other evicts the hashed free block of smallest priority
# (``vllm:B@ORDER``, :class:`radixkv.policies.block_priority.PriorityBlockHashCache`). vLLM's
# queue always holds every free block *without* a key before every free block *with* one
# (the pool starts with keyless blocks; ``free_blocks`` prepends keyless blocks and appends
# hashed ones; a key is dropped only when its block leaves the queue), so taking a block
# is: the first keyless free block if there is one, else evicting the oldest released
# hashed block. A priority order keeps the keyless part as vLLM's linked list and puts the
# hashed free blocks in a heap ordered by ``(k1, k2, release time, push id)``, ``(k1, k2)
# = priority(E, b, params)`` — a jitted function of the block's statistics row ``E[b]``
# (signature :data:`~radixkv.policies._priority_fn.PRIORITY_SIG`, passed as its addresses
# ``fa``) — or, in bucket mode, in one release-ordered list per integer ``k1``. With the
# priority ``(release time, 0)`` the order is vLLM's exactly. Block statistics change only
# while a block is out of the heap (a hit takes it out of the free set), so a block is
# pushed once per release and the heap is exact.
#
# ``E`` : int64, shape (nb, NE): per block ``E_TIME`` release time (a counter draw when its
# ref_cnt reached 0 with a key: vLLM's free-queue order); ``E_HITS`` hits served since it
# got its key; ``E_CACHED`` the draw when it got its key; ``E_DEPTH`` its index in its
# chain (block j covers tokens ``[jB, (j+1)B)``); ``E_TAG`` the request that cached it;
# ``E_VER`` the push id of its valid heap entry (bucket mode: its bucket); ``E_BNEXT`` /
# ``E_BPREV`` its bucket links. ``H`` : float64, shape (cap, 5): the heap. ``BK`` : int64,
# shape (NBUCKETS, 2): head and tail of each bucket. ``pst`` : int64, shape (NP,): clock,
# push counter, heap length, mode (0 heap, 1 buckets), non-empty bucket mask, and the tag
# of the request the next calls serve (set by :func:`order_tag`: stored on the blocks it
# caches).

E_TIME, E_HITS, E_CACHED, E_DEPTH, E_TAG, E_VER, E_BNEXT, E_BPREV = range(8)
#: bucket mode: the block's bucket (shares the heap mode's version column)
E_BKT = E_VER
NE = 8  # 64-byte rows
P_CLOCK, P_PUSH, P_HLEN, P_MODE, P_BMASK, P_TAG = range(6)
NP = 6
#: bucket mode: buckets 0 … NBUCKETS − 1 (k1 clamped), each in release order
NBUCKETS = 63

#: a priority free order: the block statistics, heap, buckets, counters, the priority's
#: addresses ``fa`` int64 (2,) and its parameters ``pp`` float64 (P,)
PrioOrder = namedtuple("PrioOrder", ["E", "H", "BK", "pst", "fa", "pp"])

#: vLLM's own free queue as a free order: no priority function (``fa`` is ``[0, 0]``), its
#: other arrays empty and never written (the kernels branch on ``fa[0]`` before touching them)
FREE_QUEUE = PrioOrder(np.zeros((0, NE), dtype=np.int64), np.zeros((0, 5), dtype=np.float64),
                       np.zeros((0, 2), dtype=np.int64), np.zeros(NP, dtype=np.int64),
                       np.zeros(2, dtype=np.int64), np.zeros(1, dtype=np.float64))


@njit(cache=True, inline="always")
def borrow_order(fo):
    """Free order *fo* with each of its arrays a borrowed view (:mod:`radixkv.policies._borrowed`:
    no reference counts where the kernels pass it on; inlined, so the views stay in the
    caller, which holds *fo*). Every caller of the pool kernels passes the order this way,
    so they compile once for it; plain Python: the same arrays."""
    return PrioOrder(borrow(fo.E), borrow(fo.H), borrow(fo.BK), borrow(fo.pst), borrow(fo.fa), borrow(fo.pp))


@njit(cache=True, inline="always")
def is_free_queue(fo):
    """Whether free order *fo* is vLLM's free queue (:data:`FREE_QUEUE`), not a priority."""
    return fo.fa[0] == 0


@njit(cache=True)
def order_tag(fo, tag):
    """The request the next kernel calls serve has tag *tag* (a priority order stores it
    on the blocks it caches, ``E_TAG``); nothing for vLLM's free queue."""
    if not is_free_queue(fo):
        fo.pst[P_TAG] = tag


# The heap: H, float64 shape (cap, 5): (k1, k2, release time, push id, block), exact
# for integers < 2**53; one row per entry keeps a sift to one cache line per level.

@njit(cache=True, inline="always")
def _less(H, i, j):
    for f in range(4):
        if H[i, f] != H[j, f]:
            return H[i, f] < H[j, f]
    return False


@njit(cache=True, inline="always")
def _swap(H, i, j):
    for f in range(5):
        v = H[i, f]
        H[i, f] = H[j, f]
        H[j, f] = v


@njit(cache=True)
def _sift_down(H, i, n):
    # a 4-ary heap: half the levels of a binary one, its four children often in one or
    # two cache lines (rows of 40 bytes)
    while True:
        a = 4 * i + 1
        if a >= n:
            return
        m = a
        for c in range(a + 1, min(a + 4, n)):
            if _less(H, c, m):
                m = c
        if _less(H, m, i):
            _swap(H, i, m)
            i = m
        else:
            return


@njit(cache=True)
def _fill(E, H, pst, i, b, pf, pp):
    k1, k2 = pf(E[:], b, pp[:])  # full slices: plain arrays of the signature also for borrowed views
    pst[P_PUSH] += 1
    H[i, 0] = k1
    H[i, 1] = k2
    H[i, 2] = E[b, E_TIME]
    H[i, 3] = pst[P_PUSH]
    H[i, 4] = b
    E[b, E_VER] = pst[P_PUSH]


@njit(cache=True)
def _rebuild(b32, E, H, pst, pf, pp):
    k = np.int64(0)  # not the literal 0: one _fill and _sift_down for every caller
    for b in range(1, b32.shape[0]):
        E[b, E_VER] = 0
        if b32[b, R_REF] == 0 and b32[b, R_PCN] != 0:
            _fill(E, H, pst, k, b, pf, pp)
            k += 1
    pst[P_HLEN] = k
    for i in range((k - 2) // 4, -1, -1):
        _sift_down(H, i, k)


@njit(cache=True)
def rebuild(b32, E, H, pst, fa, pp):
    """Replace the heap by one entry per hashed free block (drops stale entries)."""
    _rebuild(b32, E, H, pst, _fn(fa), pp)


@njit(cache=True)
def _push(b32, E, H, pst, b, pf, pp):
    if pst[P_HLEN] == H.shape[0]:
        _rebuild(b32, E, H, pst, pf, pp)  # b is hashed and free: it is in the rebuilt heap
        return
    i = pst[P_HLEN]
    pst[P_HLEN] = i + 1
    _fill(E, H, pst, i, b, pf, pp)
    while i > 0:
        up = (i - 1) // 4
        if _less(H, i, up):
            _swap(H, i, up)
            i = up
        else:
            break


@njit(cache=True)
def _pop_valid(b32, E, H, pst):
    """The hashed free block of smallest priority (removed from the heap)."""
    while pst[P_HLEN] > 0:
        n = pst[P_HLEN] - 1
        ver = np.int64(H[0, 3])
        b = np.int64(H[0, 4])
        if n > 0:
            for f in range(5):
                H[0, f] = H[n, f]
            _sift_down(H, np.int64(0), n)
        pst[P_HLEN] = n
        if E[b, E_VER] == ver and b32[b, R_REF] == 0 and b32[b, R_PCN] != 0:
            E[b, E_VER] = 0
            return b
    return -1


# Bucket mode: for priorities (k1, release time) with k1 a small integer class (LFU by
# saturating hit count, segments, priority classes): one FIFO list per class, appended at
# release — a release has the latest time, so each list stays in priority order — and
# popped from the lowest non-empty class (a 63-bit mask). O(1) per block.

@njit(cache=True, inline="always")
def _bappend(E, BK, pst, b, k):
    E[b, E_BKT] = k
    t = BK[k, 1]
    E[b, E_BPREV] = t
    E[b, E_BNEXT] = -1
    if t >= 0:
        E[t, E_BNEXT] = b
    else:
        BK[k, 0] = b
        pst[P_BMASK] |= np.int64(1) << k
    BK[k, 1] = b


@njit(cache=True, inline="always")
def _bunlink(E, BK, pst, b):
    k = E[b, E_BKT]
    p = E[b, E_BPREV]
    n = E[b, E_BNEXT]
    if p >= 0:
        E[p, E_BNEXT] = n
    else:
        BK[k, 0] = n
    if n >= 0:
        E[n, E_BPREV] = p
    else:
        BK[k, 1] = p
    if BK[k, 0] < 0:
        pst[P_BMASK] &= ~(np.int64(1) << k)


@njit(cache=True, inline="always")
def _bpop(E, BK, pst):
    m = pst[P_BMASK]
    k = 0
    while (m >> k) & 1 == 0:
        k += 1
    b = BK[k, 0]
    _bunlink(E, BK, pst, b)
    return b


@njit(cache=True)
def _prio_take(b32, st, fo):
    """The priority order's next block for ``get_new_blocks`` (the keyless list empty):
    the hashed free block of smallest priority, out of the free set."""
    st[ST_FQLEN] -= 1
    if fo.pst[P_MODE] == 1:
        return _bpop(fo.E, fo.BK, fo.pst)
    return _pop_valid(b32, fo.E, fo.H, fo.pst)


@njit(cache=True)
def _prio_touch(b32, st, fo, b):
    """A hit on block *b* (``BlockPool.touch``): out of the free set if free; one hit more."""
    if b32[b, R_REF] == 0:  # a hit block always has a key: it is in the heap / a bucket
        if fo.pst[P_MODE] == 1:
            _bunlink(fo.E, fo.BK, fo.pst, b)
        fo.E[b, E_VER] = 0
        st[ST_FQLEN] -= 1
    fo.E[b, E_HITS] += 1


@njit(cache=True)
def _prio_release(b32, st, fo, b):
    """Hashed block *b* reached ref_cnt 0: into the heap / its bucket with a fresh release time."""
    E, pst = fo.E, fo.pst
    pst[P_CLOCK] += 1
    E[b, E_TIME] = pst[P_CLOCK]
    pf = _fn(fo.fa)
    if pst[P_MODE] == 1:
        k1, _ = pf(E[:], b, fo.pp[:])
        k = 0 if k1 < 0 else (NBUCKETS - 1 if k1 > NBUCKETS - 1 else np.int64(k1))
        _bappend(E, fo.BK, pst, b, k)
    else:
        _push(b32, E, fo.H, pst, b, pf, fo.pp)
    st[ST_FQLEN] += 1


@njit(cache=True)
def _prio_cached(fo, tbl, lo, hi):
    """Blocks ``tbl[lo:hi]`` got their keys: their statistics start."""
    E, pst = fo.E, fo.pst
    for j in range(lo, hi):
        b = tbl[j]
        pst[P_CLOCK] += 1
        E[b, E_CACHED] = pst[P_CLOCK]
        E[b, E_HITS] = 0
        E[b, E_DEPTH] = j
        E[b, E_TAG] = pst[P_TAG]


# ---------------------------------------------------------------------- reachability
@njit(cache=True)
def _cascade(blk, b32, kt, k32, st, stk, key, delta):
    """*key* just became reachable (delta +1) or unreachable (−1): update its subtree.

    Every hashed block whose parent key is *key* gains (loses) its contribution to its
    own key's ``reach``; keys whose ``reach`` crosses 0 are pushed on *stk* in turn.
    """
    stk[0] = key
    top = 1
    while top > 0:
        top -= 1
        i = _find(kt, stk[top])
        if i < 0 or k32[i, T_CCNT] == 0:  # no row / no children (T_CHEAD is then stale)
            continue
        c = k32[i, T_CHEAD]
        while c >= 0:
            ck = blk[c, W_KEY]
            ki = _find(kt, ck)
            old = k32[ki, T_REACH]
            k32[ki, T_REACH] = old + delta
            if delta > 0 and old == 0:
                st[ST_NREACH] += 1
                stk[top] = ck
                top += 1
            elif delta < 0 and old == 1:
                st[ST_NREACH] -= 1
                stk[top] = ck
                top += 1
            c = b32[c, R_CNEXT]


# ---------------------------------------------------------------------- key table ops
@njit(cache=True, inline="always")
def _drop_key(blk, b32, kt, k32, st, stk, b):
    """Remove block *b*'s key: its duplicate chain, its parent's sibling chain, reach.

    A row whose two counts reach 0 is deleted at once (an all-zero row reads as empty
    to the probes); deletion moves rows, so rows are found again after it.
    """
    key = blk[b, W_KEY]
    pkey = blk[b, W_PKEY]
    parent_ok = pkey == SEED or k32[_find(kt, pkey), T_REACH] > 0
    # the key's row: duplicate chain and reach
    i = _find(kt, key)
    n = b32[b, R_DNEXT]
    p = b32[b, R_DPREV]
    if p >= 0:
        b32[p, R_DNEXT] = n
    else:
        k32[i, T_HEAD] = n
    if n >= 0:
        b32[n, R_DPREV] = p
    else:
        k32[i, T_TAIL] = p
    b32[b, R_DNEXT] = -1
    b32[b, R_DPREV] = -1
    c = k32[i, T_CNT] - 1
    k32[i, T_CNT] = c
    if c == 0:
        st[ST_NKEYS] -= 1
    elif c == 1:
        st[ST_NDUPKEYS] -= 1
    flip = False
    if parent_ok:
        k32[i, T_REACH] -= 1
        if k32[i, T_REACH] == 0:
            st[ST_NREACH] -= 1
            flip = True
    alive = c != 0 or k32[i, T_CCNT] != 0
    if not alive:
        _delete_slot(kt, i)
    # the parent key's row: sibling chain, and the groups of a branching parent
    j = _find(kt, pkey)
    cc = k32[j, T_CCNT]
    if cc >= 2:  # b leaves its group; a head passes the role to its successor
        g = _find(kt, _group_key(pkey, blk[b, W_ID0], blk[b, W_OFF0]))
        if k32[g, T_CCNT] == -1:
            _delete_slot(kt, g)
            j = _find(kt, pkey)  # deletion moves rows
        else:
            k32[g, T_CCNT] += 1
            if k32[g, T_HEAD] == b:
                k32[g, T_HEAD] = b32[b, R_CNEXT]
    n = b32[b, R_CNEXT]
    p = b32[b, R_CPREV]
    if p >= 0:
        b32[p, R_CNEXT] = n
    else:
        k32[j, T_CHEAD] = n
    if n >= 0:
        b32[n, R_CPREV] = p
    b32[b, R_CNEXT] = -1
    b32[b, R_CPREV] = -1
    k32[j, T_CCNT] = cc - 1
    if cc == 2:  # one child left: a lone child has no group row
        x = k32[j, T_CHEAD]
        _delete_slot(kt, _find(kt, _group_key(pkey, blk[x, W_ID0], blk[x, W_OFF0])))
    elif cc == 1 and k32[j, T_CNT] == 0:
        _delete_slot(kt, j)
    b32[b, R_PCN] = 0
    st[ST_NHASHED] -= 1
    if flip and alive:  # without children (a leaf, the common case) nothing to cascade
        _cascade(blk, b32, kt, k32, st, stk, key, np.int64(-1))


@njit(cache=True, inline="always")
def _add_key(blk, b32, kt, k32, st, stk, b, key, pkey):
    """Give block *b* the key *key* (parent *pkey*); duplicates go to the chain's end.

    vLLM ``BlockPool.cache_full_blocks`` / ``BlockHashToBlockMap.insert``: no dedup.
    """
    blk[b, W_KEY] = key
    blk[b, W_PKEY] = pkey
    st[ST_NHASHED] += 1
    i = _find_or_add(kt, key)
    c = k32[i, T_CNT]
    if c == 0:
        k32[i, T_HEAD] = b
        b32[b, R_DPREV] = -1
        st[ST_NKEYS] += 1
    else:
        t = k32[i, T_TAIL]
        b32[t, R_DNEXT] = b
        b32[b, R_DPREV] = t
        if c == 1:
            st[ST_NDUPKEYS] += 1
    b32[b, R_DNEXT] = -1
    k32[i, T_TAIL] = b
    k32[i, T_CNT] = c + 1
    # sibling chain. Under a parent key with two or more children it is kept grouped by
    # first token, each group (parent key, first token) a row of the table naming its
    # head: a new block goes right after its group's head, or starts a group at the
    # chain's head (the chain's order is not observable: lookups take the longest
    # match, reach counts are order-free). A lone child has no group row (most parents
    # of a chain), so the common case pays nothing for the index.
    j = _find_or_add(kt, pkey)
    cc = k32[j, T_CCNT]
    if cc == 0:
        b32[b, R_CNEXT] = -1
        b32[b, R_CPREV] = -1
        k32[j, T_CHEAD] = b
        k32[j, T_CCNT] = 1  # (a new row reads as empty until a count is set)
    else:
        if cc == 1:  # the parent branches: the lone child gets its group row
            x = k32[j, T_CHEAD]
            gx = _find_or_add(kt, _group_key(pkey, blk[x, W_ID0], blk[x, W_OFF0]))
            k32[gx, T_CCNT] = -1
            k32[gx, T_HEAD] = x
        g = _find_or_add(kt, _group_key(pkey, blk[b, W_ID0], blk[b, W_OFF0]))
        gh = k32[g, T_HEAD] if k32[g, T_CCNT] < 0 else -1
        k32[g, T_CCNT] -= 1
        if gh >= 0:
            n = b32[gh, R_CNEXT]
            b32[b, R_CNEXT] = n
            b32[b, R_CPREV] = gh
            b32[gh, R_CNEXT] = b
            if n >= 0:
                b32[n, R_CPREV] = b
        else:
            k32[g, T_HEAD] = b
            h = k32[j, T_CHEAD]
            b32[b, R_CNEXT] = h
            b32[h, R_CPREV] = b
            b32[b, R_CPREV] = -1
            k32[j, T_CHEAD] = b
        k32[j, T_CCNT] = cc + 1
    if pkey == SEED or k32[j, T_REACH] > 0:  # (no row moved since i was found)
        k32[i, T_REACH] += 1
        if k32[i, T_REACH] == 1:
            st[ST_NREACH] += 1
            if k32[i, T_CCNT] > 0:  # children cached before their parent
                _cascade(blk, b32, kt, k32, st, stk, key, np.int64(1))


# ---------------------------------------------------------------------- content
@njit(cache=True)
def _seg_index(seg_end, pos):
    """Index of the segment holding token position *pos* (first ``seg_end > pos``)."""
    return np.searchsorted(seg_end, pos, side="right")


@njit(cache=True, inline="always")
def _store_pieces(blk, b32, pcid, pcs, b, seg_id, seg_end, start, block_size, s):
    """Record tokens ``[start, start + B)`` of the sequence as *b*'s content.

    *s* is the index of a segment at or before the one holding *start*; returns the
    index of the segment holding the block's last token (a cursor for the next block).
    """
    while seg_end[s] <= start:
        s += 1
    seg_start = seg_end[s - 1] if s > 0 else 0
    end = start + block_size
    blk[b, W_ID0] = seg_id[s]
    blk[b, W_OFF0] = start - seg_start
    e = s + block_size - 1
    if seg_start == start and e < seg_end.shape[0] and seg_end[e] == end:
        # block_size one-token segments (a token-trace block): piece k is segment s + k,
        # starting at k (what the loop below writes, without its searches; the starts
        # are implied by the count, so ``pcs`` is not written: _lcp_block)
        # unsigned indices (with a signed ``s + k`` the copy was a masked gather)
        us = np.uint64(s)
        ub = np.uint64(b)
        for k in range(1, block_size):
            uk = np.uint64(k)
            pcid[ub, uk - np.uint64(1)] = seg_id[us + uk]
        b32[b, R_PCN] = block_size
        return e
    pos = min(seg_end[s], end)
    k = 1
    while pos < end:
        s += 1
        while seg_end[s] <= pos:
            s += 1
        pcid[b, k - 1] = seg_id[s]
        pcs[b, k - 1] = pos - start
        k += 1
        pos = min(seg_end[s], end)
    b32[b, R_PCN] = k
    return s


@njit(cache=True)
def _lcp_block(blk, b32, pcid, pcs, b, block_size, seg_id, seg_end, start, end, s):
    """Tokens that block *b*'s content shares with sequence tokens ``[start, end)``.

    Length of the longest common prefix, at most ``end − start``; *s* = index of the
    segment holding *start*. Two tokens are equal iff their segment ids and their
    offsets in the segment are equal (``KVSeq``).
    """
    seg_start = seg_end[s - 1] if s > 0 else 0
    npc = b32[b, R_PCN]
    k = 0
    pos = start
    while pos < end and k < npc:
        while seg_end[s] <= pos:
            seg_start = seg_end[s]
            s += 1
        r = pos - start
        if k == 0:
            pid = blk[b, W_ID0]
            poff = blk[b, W_OFF0]
            pstart = 0
        else:
            pid = pcid[b, k - 1]
            poff = 0
            pstart = pcs[b, k - 1] if npc < block_size else k
        if npc == block_size:  # one token a piece: piece k is token k (its pcs unwritten)
            pend = k + 1
        else:
            pend = pcs[b, k] if k + 1 < npc else block_size
        if pid != seg_id[s] or poff + (r - pstart) != pos - seg_start:
            break
        step = min(pend - r, seg_end[s] - pos, end - pos)
        pos += step
        if r + step == pend:
            k += 1
    return pos - start


# ---------------------------------------------------------------------- lookup
@njit(cache=True)
def lookup(blk, b32, kt, k32, pcid, pcs, keys, n_look, seg_id, seg_end, block_size, prompt_len, verify,
           hit_out):
    """Longest chain of cached blocks and the prompt held at token granularity.

    vLLM ``FullAttentionManager.find_longest_cache_hit`` with ``BlockPool.get_cached_block``
    (the first block inserted under a key that is still cached: the head of its duplicate
    chain). Does not change the pool.

    Parameters
    ----------
    keys : int64 (≥ n_look,)
        The sequence's chained block keys.
    n_look : int
        Blocks that may be looked up (``lookup_len // B``).
    prompt_len : int
        P, for ``held`` (0: skip it).
    verify : bool
        Compare each hit block's stored content with the sequence.
    hit_out : int64 (≥ n_look,)
        Receives the served block of each hit.

    Returns
    -------
    (code, n_hit, held) : ``n_hit`` = consecutive hit blocks (uncapped); ``held`` = the
        prompt tokens held at token granularity (``Admission.held_tokens``): ``n_hit × B``
        plus the longest common prefix of the next prompt block with any hashed block
        whose parent key is the last hit key, capped at P; ``code`` = ``COLLISION`` when
        *verify* found a wrong block.
    """
    B = block_size
    h = 0
    s = 0
    mask = kt.shape[0] - 1
    for j in range(min(4, n_look)):
        _prefetch_row(kt, keys[j] & mask)
    while h < n_look:
        if h + 4 < n_look:
            _prefetch_row(kt, keys[h + 4] & mask)
        i = _find(kt, keys[h])
        if i < 0 or k32[i, T_CNT] == 0:
            break
        b = k32[i, T_HEAD]
        if verify:
            while seg_end[s] <= h * B:
                s += 1
            if _lcp_block(blk, b32, pcid, pcs, b, B, seg_id, seg_end, h * B, (h + 1) * B, s) != B:
                return COLLISION, h, 0
        hit_out[h] = b
        h += 1
    if h * B >= prompt_len:
        return OK, h, prompt_len
    start = h * B
    end = min(start + B, prompt_len)
    pkey = keys[h - 1] if h > 0 else SEED
    best = 0
    j = _find(kt, pkey)
    if j >= 0 and k32[j, T_CCNT] > 0:
        s0 = _seg_index(seg_end, start)
        b = k32[j, T_CHEAD]
        n = 1
        if k32[j, T_CCNT] > 1:
            # a branching parent: only the group (parent key, first token) can share a
            # prefix with the prompt's block (contiguous in the chain from its head)
            g = _find(kt, _group_key(pkey, seg_id[s0], start - (seg_end[s0 - 1] if s0 > 0 else 0)))
            n = -k32[g, T_CCNT] if g >= 0 and k32[g, T_CCNT] < 0 else 0
            b = k32[g, T_HEAD] if n > 0 else -1
        for _ in range(n):
            if best >= end - start:
                break
            m = _lcp_block(blk, b32, pcid, pcs, b, B, seg_id, seg_end, start, end, s0)
            if m > best:
                best = m
            b = b32[b, R_CNEXT]
    return OK, h, start + best


@njit(cache=True, inline="always")
def hit_cap(n_hit, lookup_len, block_size):
    """Hit blocks after vLLM's last-token cap: ``min(n_hit, (L − 1) // B)`` for a lookup of
    L = *lookup_len* tokens. The last token is always computed so that the model produces
    its logits, so a fully cached sequence still computes its last block (vLLM
    ``vllm/v1/core/kv_cache_manager.py :: get_computed_blocks``, ``max_cache_hit_length =
    request.num_tokens - 1``). Every pool applies it through this function."""
    return min(n_hit, (lookup_len - 1) // block_size)


@njit(cache=True)
def peek(blk, b32, kt, k32, pcid, pcs, keys, n_look, seg_id, seg_end, block_size, lookup_len, verify,
         hit_out):
    """Capped hit blocks of a lookup, as ``admit`` computes them; changes nothing.

    Returns ``(code, min(n_hit, (lookup_len − 1) // B))``.
    """
    code, h, _ = lookup(blk, b32, kt, k32, pcid, pcs, keys, n_look, seg_id, seg_end, block_size,
                        np.int64(0), verify, hit_out)
    return code, hit_cap(h, lookup_len, block_size)


# ---------------------------------------------------------------------- allocate
@njit(cache=True)
def _take_new(blk, b32, kt, k32, st, stk, tbl, at, n_new, fo):
    """Take *n_new* blocks from the free order into ``tbl[at:]``; evict their keys.

    vLLM ``BlockPool.get_new_blocks`` → ``_maybe_evict_cached_block``: the free-queue head
    (*fo* :data:`FREE_QUEUE`), or the keyless list's head and then the hashed free blocks of smallest
    priority (a :class:`PrioOrder`). Returns the number of blocks whose key was dropped.
    The caller has checked ``n_new ≤ free blocks``. Batches of ``_PF`` blocks: first the
    blocks are taken and the table rows of their keys and parent keys are prefetched,
    then their keys are dropped in order.
    """
    ev = 0
    mask = kt.shape[0] - 1
    k0 = 0
    while k0 < n_new:
        k1 = min(k0 + _PF, n_new)
        for k in range(k0, k1):
            b = st[ST_FQH]
            if is_free_queue(fo):
                _fq_remove(b32, st, b)
            elif b >= 0:
                _fq_remove(b32, st, b)
            else:
                b = _prio_take(b32, st, fo)
            tbl[at + k] = b
            if b32[b, R_PCN] != 0:
                _prefetch_row(kt, blk[b, W_KEY] & mask)
                _prefetch_row(kt, blk[b, W_PKEY] & mask)
        for k in range(k0, k1):
            b = tbl[at + k]
            if b32[b, R_PCN] != 0:
                _drop_key(blk, b32, kt, k32, st, stk, b)
                ev += 1
            b32[b, R_REF] = 1
        k0 = k1
    st[ST_NCACHED] -= ev
    st[ST_NUSED] += n_new
    st[ST_EVICTIONS] += ev
    return ev


@njit(cache=True)
def _cache_full(blk, b32, kt, k32, pcid, pcs, st, stk, tbl, keys, lo, hi, seg_id, seg_end, block_size, fo):
    """Give blocks ``tbl[lo:hi]`` their keys and content (vLLM ``BlockPool.cache_full_blocks``);
    a :class:`PrioOrder` *fo* starts their statistics."""
    s = _seg_index(seg_end, lo * block_size) if hi > lo else 0
    mask = kt.shape[0] - 1
    for j in range(lo, min(lo + 8, hi)):
        _prefetch_row(kt, keys[j] & mask)
    for j in range(lo, hi):
        if j + 8 < hi:
            _prefetch_row(kt, keys[j + 8] & mask)
        pkey = keys[j - 1] if j > 0 else SEED
        b = tbl[j]
        s = _store_pieces(blk, b32, pcid, pcs, b, seg_id, seg_end, j * block_size, block_size, s)
        _add_key(blk, b32, kt, k32, st, stk, b, keys[j], pkey)
    if not is_free_queue(fo):
        _prio_cached(fo, tbl, lo, hi)


@njit(cache=True)
def admit(blk, b32, kt, k32, pcid, pcs, st, stk, keys, seg_id, seg_end, block_size, prompt_len, lookup_len,
          n_tokens, verify, tbl, fo):
    """Look up and allocate one request (vLLM ``get_computed_blocks`` + ``allocate_slots``).

    Parameters
    ----------
    prompt_len : int
        P (``held`` is capped at P).
    lookup_len : int
        The request's known tokens (P, or prompt + generated for a resumed request); the
        hit is capped at ``(lookup_len − 1) // B`` blocks and the whole of it must fit.
    n_tokens : int
        Tokens that get KV now (at least the hit): ``ceil(n_tokens / B)`` blocks are held.
    tbl : int64 (≥ ceil(kv_len / B),)
        Receives the request's block table.
    fo : PrioOrder
        The free order (section "free order: a priority"): :data:`FREE_QUEUE`, vLLM's free queue.

    Returns
    -------
    (code, hit_blocks, held_tokens, evicted_blocks, n_blocks)
        ``code`` OK, REFUSED (no state change) or COLLISION (no state change).
    """
    B = block_size
    code, h, held = lookup(blk, b32, kt, k32, pcid, pcs, keys, lookup_len // B, seg_id, seg_end, B,
                           prompt_len, verify, tbl)
    if code != OK:
        return code, 0, 0, 0, 0
    hcap = hit_cap(h, lookup_len, B)
    n_touch = 0
    for k in range(hcap):
        if b32[tbl[k], R_REF] == 0:
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
        if b32[b, R_REF] == 0:
            if is_free_queue(fo):
                _fq_remove(b32, st, b)
            st[ST_NUSED] += 1
            st[ST_NCACHED] -= 1  # a hit block always has a key
        if not is_free_queue(fo):
            _prio_touch(b32, st, fo, b)
        b32[b, R_REF] += 1
    t = max(n_tokens, hcap * B)
    nblk = (t + B - 1) // B
    ev = _take_new(blk, b32, kt, k32, st, stk, tbl, hcap, nblk - hcap, fo)
    _cache_full(blk, b32, kt, k32, pcid, pcs, st, stk, tbl, keys, hcap, t // B, seg_id, seg_end, B, fo)
    return OK, hcap, held, ev, nblk


@njit(cache=True)
def extend(blk, b32, kt, k32, pcid, pcs, st, stk, keys, seg_id, seg_end, block_size, tbl, n_blocks,
           n_computed, n_more, fo):
    """The request computes *n_more* tokens: allocate, then cache blocks that became full.

    vLLM ``allocate_slots`` for a decode step or a later prefill chunk, then
    ``cache_blocks``. Returns ``(ok, new n_blocks, evicted blocks)``; ``ok`` False leaves
    the pool unchanged. *fo*: the free order, as :func:`admit`.
    """
    B = block_size
    t = n_computed + n_more
    nblk = (t + B - 1) // B
    n_new = nblk - n_blocks
    if n_new > st[ST_FQLEN]:
        return False, n_blocks, 0
    ev = 0
    if n_new > 0:
        ev = _take_new(blk, b32, kt, k32, st, stk, tbl, n_blocks, n_new, fo)
    _cache_full(blk, b32, kt, k32, pcid, pcs, st, stk, tbl, keys, n_computed // B, t // B, seg_id, seg_end, B, fo)
    return True, nblk, ev


@njit(cache=True)
def free(b32, st, tbl, n_blocks, fo):
    """Release a request's blocks tail first (vLLM ``KVCacheManager.free`` → ``BlockPool.free_blocks``).

    A block whose ref_cnt reaches 0 goes to the free queue: hashed blocks are appended to
    the tail (a priority order *fo*: into its heap / bucket with a fresh release
    time), unhashed (partial) blocks pushed on the head, each in tail-first order.
    """
    for k in range(n_blocks - 1, -1, -1):
        b = tbl[k]
        b32[b, R_REF] -= 1
        if b32[b, R_REF] == 0:
            st[ST_NUSED] -= 1
            if b32[b, R_PCN] != 0:
                if is_free_queue(fo):
                    _fq_append(b32, st, b)
                else:
                    _prio_release(b32, st, fo, b)
                st[ST_NCACHED] += 1
            else:
                _fq_prepend(b32, st, b)


@njit(cache=True)
def run_request(blk, b32, kt, k32, pcid, pcs, st, stk, keys, seg_id, seg_end, block_size, prompt_len, kv_len,
                verify, tbl, fo):
    """Admit the prompt, decode to the KV extent in one step, free: the fused fast path.

    Same result as ``admit`` + ``extend(kv_len − P)`` + ``free`` (the base class's
    ``run_request``). Returns ``(code, hit_blocks, held, evicted_blocks, decoded)``;
    ``decoded`` False when the decode did not fit (the request was freed after its
    prefill, as the base class does).
    """
    code, hcap, held, ev, nblk = admit(blk, b32, kt, k32, pcid, pcs, st, stk, keys, seg_id, seg_end,
                                       block_size, prompt_len, prompt_len, prompt_len, verify, tbl, fo)
    if code != OK:
        return code, hcap, held, ev, False
    ok = True
    if kv_len > prompt_len:
        ok, nblk2, ev2 = extend(blk, b32, kt, k32, pcid, pcs, st, stk, keys, seg_id, seg_end, block_size,
                                tbl, nblk, prompt_len, kv_len - prompt_len, fo)
        if ok:
            nblk = nblk2
    free(b32, st, tbl, nblk, fo)
    return OK, hcap, held, ev, ok


NEED_PIECES = 3  # run_seq: a block has more content pieces than ``pcid`` holds (nothing changed)


@njit(cache=True)
def run_seq(blk, kt, pcid, pcs, state, scratch, seg_id, seg_end, block_size, prompt_len, kv_len, verify,
            key_mask, n_tok, fo):
    """:func:`run_request` that also hashes the sequence: one call per request.

    ``state`` = ``st`` followed by the cascade stack; ``scratch`` int64 (2, ≥ ceil(kv_len / B))
    receives the keys (row 0) and the block table (row 1). Returns ``(code, hit_blocks,
    held, evicted_blocks, decoded, total evictions)``; code ``NEED_PIECES`` (with
    ``hit_blocks`` = the pieces needed) when ``pcid`` must grow first, nothing changed.
    ``n_tok``: the leading blocks known to be token blocks (``seg_end[k] == k + 1`` for
    ``k < n_tok × block_size``; 0 = nothing known), hashed without the segment checks
    (:func:`_block_keys_tok_into`; same keys). *fo*: the free order, as :func:`admit`.
    """
    b32 = blk.view(np.int32)
    k32 = kt.view(np.int32)
    st = state[:NST]
    stk = state[NST:]
    keys = scratch[0]
    tbl = scratch[1]
    # the request runs on borrowed views of the pool and the sequence (no reference
    # counts in the per-block loops of its inlined helpers; radixkv.policies._borrowed)
    sid = borrow(seg_id)
    send = borrow(seg_end)
    mp = _block_keys_tok_into(sid, send, block_size, kv_len // block_size, key_mask, borrow(keys), n_tok)
    if mp - 1 > pcid.shape[1]:
        return NEED_PIECES, mp, 0, 0, False, st[ST_EVICTIONS]
    code, hcap, held, ev, ok = run_request(borrow(blk), borrow(b32), borrow(kt), borrow(k32), borrow(pcid),
                                           borrow(pcs), borrow(st), borrow(stk), borrow(keys), sid, send,
                                           block_size, prompt_len, kv_len, verify, borrow(tbl),
                                           borrow_order(fo))
    return code, hcap, held, ev, ok, st[ST_EVICTIONS]


# ---------------------------------------------------------------------- entries from Python
# BlockHashCache's Python methods call these: each borrows its array arguments
# (radixkv.policies._borrowed) and calls the kernel it is named after. That kernel, and all it
# inlines, then compiles once per free order, for borrowed views, whoever calls it: the
# compiled concurrent loop's pool seam and run_seq borrow the same way.

@njit(cache=True)
def py_peek(blk, b32, kt, k32, pcid, pcs, keys, n_look, seg_id, seg_end, block_size, lookup_len, verify, hit_out):
    """:func:`peek` on borrowed views of the arrays (same arguments and result)."""
    return peek(borrow(blk), borrow(b32), borrow(kt), borrow(k32), borrow(pcid), borrow(pcs), borrow(keys), n_look,
                borrow(seg_id), borrow(seg_end), block_size, lookup_len, verify, borrow(hit_out))


@njit(cache=True)
def py_admit(blk, b32, kt, k32, pcid, pcs, st, stk, keys, seg_id, seg_end, block_size, prompt_len, lookup_len,
             n_tokens, verify, tbl, fo):
    """:func:`admit` on borrowed views of the arrays (same arguments and result)."""
    return admit(borrow(blk), borrow(b32), borrow(kt), borrow(k32), borrow(pcid), borrow(pcs), borrow(st),
                 borrow(stk), borrow(keys), borrow(seg_id), borrow(seg_end), block_size, prompt_len, lookup_len,
                 n_tokens, verify, borrow(tbl), borrow_order(fo))


@njit(cache=True)
def py_extend(blk, b32, kt, k32, pcid, pcs, st, stk, keys, seg_id, seg_end, block_size, tbl, n_blocks,
              n_computed, n_more, fo):
    """:func:`extend` on borrowed views of the arrays (same arguments and result)."""
    return extend(borrow(blk), borrow(b32), borrow(kt), borrow(k32), borrow(pcid), borrow(pcs), borrow(st),
                  borrow(stk), borrow(keys), borrow(seg_id), borrow(seg_end), block_size, borrow(tbl), n_blocks,
                  n_computed, n_more, borrow_order(fo))


@njit(cache=True)
def py_free(b32, st, tbl, n_blocks, fo):
    """:func:`free` on borrowed views of the arrays (same arguments)."""
    free(borrow(b32), borrow(st), borrow(tbl), n_blocks, borrow_order(fo))


@njit(cache=True)
def py_take_new(blk, b32, kt, k32, st, stk, tbl, at, n_new, fo):
    """:func:`_take_new` on borrowed views of the arrays (same arguments and result)."""
    return _take_new(borrow(blk), borrow(b32), borrow(kt), borrow(k32), borrow(st), borrow(stk), borrow(tbl), at,
                     n_new, borrow_order(fo))


@njit(cache=True)
def py_cache_full(blk, b32, kt, k32, pcid, pcs, st, stk, tbl, keys, lo, hi, seg_id, seg_end, block_size, fo):
    """:func:`_cache_full` on borrowed views of the arrays (same arguments)."""
    _cache_full(borrow(blk), borrow(b32), borrow(kt), borrow(k32), borrow(pcid), borrow(pcs), borrow(st),
                borrow(stk), borrow(tbl), borrow(keys), lo, hi, borrow(seg_id), borrow(seg_end), block_size,
                borrow_order(fo))


# ---------------------------------------------------------------------- statistics
@njit(cache=True)
def largest_free_run(b32):
    """Longest run of consecutive block ids that are free (ref_cnt 0, no key); O(nb)."""
    best = 0
    cur = 0
    for b in range(1, b32.shape[0]):
        if b32[b, R_REF] == 0 and b32[b, R_PCN] == 0:
            cur += 1
            if cur > best:
                best = cur
        else:
            cur = 0
    return best


@njit(cache=True)
def reachable_keys(blk, b32, kt, k32):
    """Distinct keys a lookup can reach, by breadth-first search from ``SEED``; O(hashed blocks).

    A key is reachable when some block holds it whose parent key is the seed or a
    reachable key. The pool maintains the same count incrementally (``st[ST_NREACH]``,
    used by ``stats``); this search is its independent check.
    """
    queue = np.empty(blk.shape[0] + 1, dtype=np.int64)
    seen = np.zeros(kt.shape[0], dtype=np.uint8)
    queue[0] = SEED
    qh = 0
    qt = 1
    n = 0
    while qh < qt:
        pkey = queue[qh]
        qh += 1
        j = _find(kt, pkey)
        if j < 0 or k32[j, T_CCNT] == 0:
            continue
        b = k32[j, T_CHEAD]
        while b >= 0:
            i = _find(kt, blk[b, W_KEY])
            if seen[i] == 0:
                seen[i] = 1
                n += 1
                queue[qt] = blk[b, W_KEY]
                qt += 1
            b = b32[b, R_CNEXT]
    return n
