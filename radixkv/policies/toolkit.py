"""Helpers for policy authors: the building blocks the built-in policies use, in public.

A request's KV content is a :class:`~radixkv.trace.types.KVSeq`: runs of tokens
(segments) rather than token ids, so that two requests share a prefix exactly when their
segments agree. These helpers work on that form:

=========================== ==============================================================
:func:`admit_length`        the ``admit`` argument rule: not running, ``1 ≤ n ≤ kv_len``
:func:`block_keys`          vLLM-style chained keys of a sequence's full blocks (int64)
:func:`capped_hit_blocks`   vLLM's last-token cap on a block hit
:func:`common_prefix_len`   tokens two sequences share from the start (or from a position)
:func:`held_tokens`         token-level prefix of a prompt held by any of some sequences
:func:`token_key`           the identity of the token at one position
:func:`page_key`            the identity of a page (SGLang's child key at page size > 1)
:func:`expand_tokens`       a sequence as one hashable tuple per token (slow; for tests
                            and readable reference policies)
=========================== ==============================================================

All positions and lengths are in tokens.
"""
from __future__ import annotations

import numpy as np

from radixkv.trace.types import KVSeq

__all__ = [
    "admit_length", "block_keys", "capped_hit_blocks", "common_prefix_len", "held_tokens",
    "token_key", "page_key", "expand_tokens",
]

_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


def admit_length(running, rid: int, seq: KVSeq, n_tokens: int | None) -> int:
    """Validate an ``admit(rid, seq, n_tokens)`` call and return the tokens to admit.

    Parameters
    ----------
    running : container
        Handles of the running requests (``rid in running`` must be False).
    rid : int
        The request's handle.
    seq : KVSeq
    n_tokens : int or None
        Tokens that must have KV after admission; None means the prompt.

    Returns
    -------
    int
        ``seq.prompt_len`` when *n_tokens* is None, else ``n_tokens``.

    Raises
    ------
    ValueError
        When *rid* is already running or ``not 1 ≤ n_tokens ≤ seq.kv_len``.
    """
    if rid in running:
        raise ValueError(f"request {rid} is already running")
    n = seq.prompt_len if n_tokens is None else int(n_tokens)
    if not 1 <= n <= seq.kv_len:
        raise ValueError(f"n_tokens must be in [1, kv_len={seq.kv_len}], got {n}")
    return n


def block_keys(seq: KVSeq, block_size: int, n_blocks: int | None = None) -> np.ndarray:
    """Chained keys of the first *n_blocks* full blocks of *seq*'s KV extent.

    Block j's key hashes its content and block j−1's key (vLLM
    ``vllm/v1/core/kv_cache_utils.py :: hash_block_tokens``: equal keys ⇔ equal prefixes
    up to hash collisions, 64-bit here). The same keys as
    :class:`~radixkv.policies.block_hash.BlockHashCache`.

    Parameters
    ----------
    seq : KVSeq
    block_size : int
        Tokens per block (≥ 1).
    n_blocks : int or None
        Blocks to hash; default every full block of the KV extent (``kv_len // block_size``).

    Returns
    -------
    np.ndarray, int64, shape (n_blocks,)

    Raises
    ------
    ValueError
        When *n_blocks* exceeds the full blocks of the sequence, or *block_size* < 1.
    """
    from radixkv.policies._hash_kernels import seq_block_keys

    B = int(block_size)
    if B < 1:
        raise ValueError(f"block_size must be ≥ 1, got {block_size}")
    full = seq.kv_len // B
    n = full if n_blocks is None else int(n_blocks)
    if not 0 <= n <= full:
        raise ValueError(f"n_blocks must be in [0, {full}] for a {seq.kv_len}-token sequence, got {n_blocks}")
    keys, _ = seq_block_keys(seq.seg_id, seq.seg_end, B, n, _ALL_ONES)
    return keys


def capped_hit_blocks(found_blocks: int, lookup_tokens: int, block_size: int) -> int:
    """Blocks of a hit after vLLM's last-token cap: ``min(found, (L − 1) // B)``.

    The last token of a looked-up sequence of L tokens is always recomputed so that the
    model produces logits for it (vLLM ``vllm/v1/core/kv_cache_manager.py ::
    get_computed_blocks``, ``max_cache_hit_length = request.num_tokens - 1``).
    """
    from radixkv.policies._hash_kernels import hit_cap

    cap = getattr(hit_cap, "py_func", hit_cap)  # the compiled pools' rule, run as Python
    return max(0, cap(int(found_blocks), int(lookup_tokens), int(block_size)))


def common_prefix_len(a: KVSeq, b: KVSeq, start: int = 0, limit: int | None = None) -> int:
    """End of the common prefix of *a* and *b*: the first position ≥ *start* where they hold
    different tokens, or *limit* (default the shorter KV extent) when they agree up to it.

    The caller asserts the two agree on ``[0, start)``; the scan moves segment by
    segment. Returns an int in ``[start, limit]`` (``start`` when ``start ≥ limit``).
    """
    from radixkv.policies._radix_kernels import common_prefix_end

    lim = min(a.kv_len, b.kv_len) if limit is None else min(int(limit), a.kv_len, b.kv_len)
    if start >= lim:
        return int(start) if start <= lim else int(lim)
    return int(common_prefix_end(a.seg_id, a.seg_end, b.seg_id, b.seg_end, int(start), int(lim)))


def held_tokens(seq: KVSeq, holders, start: int = 0) -> int:
    """Longest prefix of *seq*'s prompt the pool holds token by token (``Admission.held_tokens``).

    Parameters
    ----------
    seq : KVSeq
        The request being admitted.
    holders : iterable of (KVSeq, int)
        Sequences with KV in the pool and how many of their first tokens have it.
    start : int
        A position known to be held (e.g. the hit), from which comparison starts.

    Returns
    -------
    int
        In ``[start, seq.prompt_len]``: no block or page rounding, no last-token cap.
    """
    best = min(int(start), seq.prompt_len)
    for other, n_valid in holders:
        lim = min(seq.prompt_len, int(n_valid), other.kv_len)
        if lim <= best:
            continue
        best = max(best, common_prefix_len(seq, other, 0, lim))
    return best


def token_key(seq: KVSeq, t: int) -> tuple:
    """Identity of the token at position *t*: ``(segment id, segment start)`` plus the
    offset is implied by the position; two sequences hold the same token at *t* exactly
    when these pairs are equal (int pair)."""
    from radixkv.policies._radix_kernels import token_key as _tk

    a, b = _tk(seq.seg_id, seq.seg_end, int(t))
    return int(a), int(b)


def page_key(seq: KVSeq, t: int, page_size: int) -> tuple:
    """Identity of the page ``[t, t + page_size)``: SGLang's child key of a run starting at
    *t* (``sglang/srt/mem_cache/radix_cache.py :: get_child_key`` — the first token at
    page size 1, the first page otherwise), as an int pair (a 63-bit hash of the page's
    segments and its first segment's start). Requires ``t + page_size ≤ seq.kv_len``."""
    from radixkv.policies._radix_kernels import child_key

    a, b = child_key(seq.seg_id, seq.seg_end, int(t), int(page_size))
    return int(a), int(b)


def expand_tokens(seq: KVSeq, n: int | None = None) -> tuple:
    """The first *n* tokens of *seq* (default its KV extent) as hashable
    ``(segment id, segment start, offset)`` triples: equal triples ⇔ equal tokens. O(n)
    Python objects — for readable policies and tests, not for speed."""
    n = seq.kv_len if n is None else int(n)
    out = []
    start = 0
    for sid, end in zip(seq.seg_id.tolist(), seq.seg_end.tolist()):
        if start >= n:
            break
        out.extend((sid, start, k) for k in range(min(end, n) - start))
        start = end
    return tuple(out)
