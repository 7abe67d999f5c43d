"""SGLang HiCache's L3 ``file`` store as radixkv models it: a store of page keys on arrays.

The policy (:class:`radixkv.policies.hicache.HiCacheRadixCache`) writes a node's pages
here when its host backup completes and asks, at a request's arrival, how many leading
pages of the rest of its prompt the store holds (the prefetch). A page is known by its
chained 64-bit key (:func:`radixkv.policies._hicache_kernels.chain_page_hashes`).

Unbounded (SGLang's default: ``HiCacheFile`` without a byte cap) the store is a set of
keys (:mod:`radixkv.policies.key_set`, 8 bytes a slot at load ≤ 3/4). Capped
(``storage_tokens``; ``storage/file/lru_file_evictor.py :: LRUFileEvictor``) it is the LRU
list of keys of :mod:`radixkv.policies._static_kernels` (16 bytes a node, 32–64 bytes of
index), never more nodes than ``cap // page``. Both grow by doubling, so memory follows what is held.
"""
from __future__ import annotations

import numpy as np

import radixkv.policies._hicache_kernels as K
import radixkv.policies._static_kernels as SK
from radixkv.policies.key_set import regrow

#: SGLang ``SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO`` default (``environ.py``): a capped
#: file store evicts down to this share of its cap (``LRUFileEvictor._evict_locked``)
FILE_EVICTION_RATIO = 0.9

_MIN_ROWS = 1 << 12


class PageStore:
    """The L3 store: page keys, unbounded or capped by least-recent-use.

    Parameters
    ----------
    capacity_tokens : int or None
        The cap in tokens (None: unbounded).
    page_size : int
        Tokens per page (≥ 1); every page counts this many tokens.

    Attributes
    ----------
    used : int
        Tokens held (pages × page_size).
    """

    def __init__(self, capacity_tokens: int | None, page_size: int):
        self.capacity = None if capacity_tokens is None else int(capacity_tokens)
        self.page = int(page_size)
        self.used = 0
        if self.capacity is None:
            self._n = 0
            self._tab = np.zeros(_MIN_ROWS, dtype=np.int64)
            self._zero = np.zeros(1, dtype=np.int64)
        else:
            self._max_nodes = self.capacity // self.page
            self._st = SK.empty_state()
            self._nk = np.zeros(0, dtype=np.int64)
            self._nl = np.full((2, 0), -1, dtype=np.int32)
            self._grow(min(self._max_nodes, _MIN_ROWS // 2))

    def __len__(self) -> int:
        """Pages held."""
        return self.used // self.page

    def _grow(self, nodes: int) -> None:
        """Give the capped store *nodes* nodes (≥ the ones in use), keeping its list."""
        nodes = max(int(nodes), 1)
        n = len(self._nk)
        nk = np.zeros(nodes, dtype=np.int64)
        nl = np.full((2, nodes), -1, dtype=np.int32)
        nk[:n] = self._nk
        nl[:, :n] = self._nl
        self._nk, self._nl = nk, nl
        self._tab = np.zeros((SK.table_rows(nodes), 2), dtype=np.int64)
        SK.rebuild(self._nk, self._nl, self._st, self._tab)

    # ---------------------------------------------------------------- operations
    def write(self, keys: np.ndarray) -> tuple[int, int]:
        """Store the pages *keys* (int64, shape (n,)), in order (``HiCacheFile.set``).

        Unbounded: a new key is added, a held one skipped. Capped: a held key becomes the
        most recent; a new one is reserved as ``LRUFileEvictor.reserve`` does (over the
        cap, least recent pages are removed until at most ``int(cap × 0.9) − page``
        tokens remain; a page that still does not fit is not stored).

        Returns
        -------
        (written, evicted) : int, int
            Tokens newly stored and tokens removed.
        """
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        p = self.page
        if self.capacity is None:
            need = self._n + len(keys)
            if need > len(self._tab) * 3 // 4:
                rows = len(self._tab)
                while need > rows * 3 // 4:
                    rows *= 2
                tab2 = np.zeros(rows, dtype=np.int64)
                regrow(self._tab, tab2)
                self._tab = tab2
            new = int(K.set_add_all(self._tab, self._zero, keys))
            self._n += new
            self.used += new * p
            return new * p, 0
        need = min(int(self._st[SK.LEN]) + len(keys), self._max_nodes)
        if need > len(self._nk):
            self._grow(min(max(need, 2 * len(self._nk)), self._max_nodes))
        cap = self.capacity
        target = max(0, int(cap * FILE_EVICTION_RATIO) - p)
        w, e = K.lru_write(self._nk, self._nl, self._tab, self._st, keys, p, cap, target)
        self.used = int(self._st[SK.LEN]) * p
        return int(w), int(e)

    def leading(self, keys: np.ndarray) -> int:
        """How many leading pages of *keys* (int64, shape (n,)) the store holds
        (``HiCacheFile.batch_exists``; no page becomes more recent)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if self.capacity is None:
            return int(K.set_leading(self._tab, self._zero, keys))
        return int(SK.found(self._nk, self._tab, keys, 0, len(keys)))

    def touch(self, keys: np.ndarray) -> None:
        """Make the leading held pages of *keys* (int64, shape (n,)) the most recent, in
        order: the pages a prefetch reads are the leading ones :meth:`leading` found
        (``HiCacheFile.get`` → ``LRUFileEvictor.touch``; nothing to do unbounded)."""
        if self.capacity is None:
            return
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        held = keys[:SK.found(self._nk, self._tab, keys, 0, len(keys))]
        # _static_kernels.touch refreshes keys[n-1], ..., keys[0]: reversed, the first key
        # is refreshed first and the last ends most recent
        SK.touch(self._nk, self._nl, self._tab, self._st, held[::-1].copy(), len(held))
