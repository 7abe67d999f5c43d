"""The L3 page store on arrays (radixkv/policies/hicache_store.py) against a brute-force
oracle: an insertion-ordered dict written here from the rules of SGLang's file backend
(``HiCacheFile.set`` / ``batch_exists`` / ``get``; ``LRUFileEvictor.reserve`` / ``touch``:
over the cap, evict least recent pages until at most ``int(cap × 0.9) − page`` tokens are
held, and skip a page that still does not fit)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.policies.hicache_store import PageStore


class Oracle:
    def __init__(self, cap, page):
        self.cap, self.page, self.d = cap, page, {}

    @property
    def used(self):
        return len(self.d) * self.page

    def write(self, keys):
        w = e = 0
        for k in keys:
            if k in self.d:
                if self.cap is not None:
                    self.d[k] = self.d.pop(k)
                continue
            if self.cap is not None:
                if self.page > self.cap:
                    continue
                if self.used + self.page > self.cap:
                    target = max(0, int(self.cap * 0.9) - self.page)
                    while self.used > target:
                        del self.d[next(iter(self.d))]
                        e += self.page
                    if self.used + self.page > self.cap:
                        continue
            self.d[k] = None
            w += self.page
        return w, e

    def leading(self, keys):
        n = 0
        for k in keys:
            if k not in self.d:
                break
            n += 1
        return n

    def touch(self, keys):
        # the prefetch reads the leading pages batch_exists found: those become most recent
        if self.cap is not None:
            for k in keys[:self.leading(keys)]:
                self.d[k] = self.d.pop(k)


# keys from a small pool (repeats, touches and evictions happen), including 0, negative
# keys and the extremes of int64 (the set keeps 0 in a flag; the table takes any other value)
KEY = st.sampled_from([0, 1, 2, 3, 5, 8, 13, 21, -1, -7, 2**63 - 1, -(2**63), 4096, 8192, 12288])
OPS = st.lists(st.tuples(st.sampled_from(["write", "leading", "touch"]), st.lists(KEY, max_size=12)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(cap=st.one_of(st.none(), st.integers(0, 40)), page=st.integers(1, 4), ops=OPS)
def test_store_matches_the_dict_oracle(cap, page, ops):
    s, o = PageStore(cap, page), Oracle(cap, page)
    for op, keys in ops:
        a = np.array(keys, dtype=np.int64)
        if op == "write":
            assert s.write(a) == o.write(keys)
        elif op == "leading":
            assert s.leading(a) == o.leading(keys)
        else:
            s.touch(a)
            o.touch(keys)
        assert s.used == o.used
        assert len(s) == len(o.d)
    # every key the oracle holds is held, and the LRU order agrees: writing one new key
    # to a full store evicts the same pages from both
    for k in o.d:
        assert s.leading(np.array([k], dtype=np.int64)) == 1


def test_growth_keeps_every_key_and_the_lru_order():
    # 10,000 distinct keys force the tables past their first size (4,096 rows) several times
    keys = (np.arange(1, 10_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)  # distinct
    unb = PageStore(None, 1)
    assert unb.write(keys) == (10_000, 0)
    assert unb.leading(keys) == 10_000 and unb.used == 10_000
    assert unb.write(keys[:50]) == (0, 0)  # held: nothing new
    cap = PageStore(6_000, 2)  # 3,000 pages of 2 tokens
    w, e = cap.write(keys[:3_000])
    assert (w, e) == (6_000, 0)
    cap.touch(keys[:10])  # keys 0-9 now the most recent
    # one more page: over the cap, evict down to int(6000 * 0.9) - 2 = 5,398 tokens =
    # 2,699 pages, i.e. the 301 least recent: keys 10..310
    assert cap.write(keys[3_000:3_001]) == (2, 602)
    assert cap.leading(keys[:10]) == 10
    assert cap.leading(keys[10:311]) == 0 and cap.leading(keys[311:3_001]) == 2_690
