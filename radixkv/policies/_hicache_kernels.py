"""Numba kernels for :mod:`radixkv.policies.hicache`: token-run comparisons, and the
L3 page store's loops (:mod:`radixkv.policies.hicache_store`).

The HiCache tree stores each node's key as an int64 token array (``seq_tokens``); the
hot loops of a replay compare such arrays (prefix match, insert walk, the held-prefix
walk). These are pure functions of their arguments (no globals),
so they give the same results with ``NUMBA_DISABLE_JIT=1``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from radixkv.policies.key_set import add as _set_add
from radixkv.policies.key_set import contains as _set_contains
from radixkv.policies._static_kernels import LEN as _LEN
from radixkv.policies._static_kernels import _find as _lru_find
from radixkv.policies._static_kernels import insert as _lru_insert


@njit(cache=True)
def lcp_at(key, toks, off, limit):
    """Common prefix of node key *key* and ``toks[off:limit]`` (no copy of *toks*).

    Parameters
    ----------
    key : np.ndarray, int64, 1-D
        A node's tokens.
    toks : np.ndarray, int64, 1-D
        The request's tokens.
    off, limit : int
        The request's window ``[off, limit)``, ``0 <= off <= limit <= len(toks)``.

    Returns
    -------
    int
        Tokens in common, at most ``min(len(key), limit - off)``.
    """
    n = min(key.shape[0], limit - off)
    for i in range(n):
        if key[i] != toks[off + i]:
            return i
    return n


@njit(cache=True)
def seq_tokens_kernel(seg_id, seg_end, index, shift):
    """One int64 per token of a KV sequence (see ``hicache.seq_tokens``).

    Parameters
    ----------
    seg_id, seg_end : np.ndarray, int64, shape (S,)
        The sequence's segments (ids; exclusive ends in tokens, strictly increasing).
    index : int
        The request's index (makes unique content, ``seg_id < 0``, differ between requests).
    shift : int
        Bits of the in-segment offset: token ``t`` of segment ``s`` starting at ``a`` is
        ``seg_id[s] << shift | (t − a)`` for ``seg_id[s] ≥ 0``.

    Returns
    -------
    np.ndarray, int64, shape (seg_end[-1],)
        The tokens; unique content is ``-(1 + (index << 32) + t)``.
    """
    n = seg_end[-1]
    out = np.empty(n, np.int64)
    a = 0
    for s in range(seg_end.shape[0]):
        b = seg_end[s]
        sid = seg_id[s]
        if sid >= 0:
            base = sid << shift
            for t in range(a, b):
                out[t] = base + (t - a)
        else:
            base = -(1 + (index << 32))
            for t in range(a, b):
                out[t] = base - t
        a = b
    return out


@njit(cache=True)
def chain_page_hashes(start, toks, off, n_pages, page_size):
    """Chained page keys of ``toks[off : off + n_pages · page_size]`` (the L3 store's keys).

    SGLang keys a storage page by a hash of its tokens chained to the previous page's key
    (``hicache_storage.py :: get_hash_str`` via ``get_storage_hash_str``), so a page's key
    names the whole prefix that ends with it. This is a 64-bit stand-in for SGLang's
    SHA-256 chain: each token is folded into the state with the splitmix64 finaliser and
    the state at every page end is the page's key; keys equal exactly when the prefixes
    are equal, up to 64-bit collisions (probability ~ n² / 2⁶⁵ for n distinct pages).

    Parameters
    ----------
    start : int
        The chain state before the first page (the parent prefix's last key; the root's
        is a fixed seed).
    toks : np.ndarray, int64, 1-D
        Tokens (``hicache.seq_tokens`` values).
    off, n_pages, page_size : int
        The pages ``[off + i·page_size, off + (i+1)·page_size)`` for ``i < n_pages``.

    Returns
    -------
    np.ndarray, int64, shape (n_pages,)
        Page ``i``'s key.
    """
    out = np.empty(n_pages, np.int64)
    h = np.uint64(start)
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    m2 = np.uint64(0x94D049BB133111EB)
    g = np.uint64(0x9E3779B97F4A7C15)
    for i in range(n_pages):
        for j in range(page_size):
            z = h + g + np.uint64(toks[off + i * page_size + j])
            z = (z ^ (z >> np.uint64(30))) * m1
            z = (z ^ (z >> np.uint64(27))) * m2
            h = z ^ (z >> np.uint64(31))
        out[i] = np.int64(h)
    return out


# ---------------------------------------------------------------------- the L3 page store
# (radixkv.policies.hicache_store.PageStore). Unbounded: a key set (radixkv.policies.key_set).
# Capped: the LRU list of keys of radixkv.policies._static_kernels (nodes ``nk``/``nl``, index
# ``tab``, state ``st``; its module docstring gives the layout), with SGLang's file-evictor
# rule for a new page.


@njit(cache=True)
def set_add_all(tab, zero, keys):
    """Add every key of *keys* (int64, shape (n,)) to the key set (*tab*, *zero*); returns
    how many were new. The caller keeps room for n more keys."""
    new = 0
    for c in range(keys.shape[0]):
        new += _set_add(tab, zero, np.uint64(keys[c]))
    return new


@njit(cache=True)
def set_leading(tab, zero, keys):
    """Number of leading keys of *keys* (int64, shape (n,)) that the key set holds."""
    for c in range(keys.shape[0]):
        if not _set_contains(tab, zero, np.uint64(keys[c])):
            return c
    return keys.shape[0]


#: a capacity no store reaches: _static_kernels.insert then only refreshes or appends
_NO_EVICTION = np.int64(1 << 62)  # np.int64: not a literal (one insert for both calls)


@njit(cache=True)
def lru_write(nk, nl, tab, st, keys, page, cap, target):
    """Write the pages *keys* (int64, shape (n,)) to the capped store, in order.

    A held key becomes the most recent (``LRUFileEvictor.touch``). A new one
    (``LRUFileEvictor.reserve``): a page larger than *cap* tokens is not stored; when
    ``used + page > cap`` the least recent pages are removed until ``used <= target``
    tokens, and the page is not stored if it still does not fit; else it becomes the most
    recent. ``used`` = ``st[LEN] * page``. The caller keeps nodes for ``min(st[LEN] + n,
    cap // page)`` keys and the index at most half full.

    Returns
    -------
    (written, evicted) : int, int
        Tokens newly stored and tokens removed.
    """
    written = 0
    evicted = 0
    for c in range(keys.shape[0]):
        if _lru_find(nk, tab, keys[c]) < 0:
            if page > cap:
                continue
            if (st[_LEN] + 1) * page > cap:
                # least recent out while used > target (⇔ more than target // page pages)
                evicted += page * _lru_insert(nk, nl, tab, st, keys, c, c, target // page)
                if (st[_LEN] + 1) * page > cap:
                    continue
            written += page
        _lru_insert(nk, nl, tab, st, keys, c, c + 1, _NO_EVICTION)  # append, or refresh a held key
    return written, evicted
