"""The numba kernels of the radix policy, compiled and as plain Python (``py_func``).

``py_func`` is the function numba compiles, run by the interpreter: the same code path as
``NUMBA_DISABLE_JIT=1``. Expected values are worked out by hand from the segment model
(token at t = (id, start) of the segment holding t).
"""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.policies._radix_kernels import common_prefix_end, page_span, segment_at, token_key


def _py(kernel):
    """The interpreted function (``py_func``); the kernel itself under NUMBA_DISABLE_JIT=1."""
    return getattr(kernel, "py_func", kernel)


def _a(*xs):
    return np.asarray(xs, dtype=np.int64)


# a: ids 5 [0,4), 6 [4,6), -1 [6,9)
A = (_a(5, 6, -1), _a(4, 6, 9))
# b: ids 5 [0,4), 6 [4,8)  -> equal to a on [0,6), then a's -1 vs b's 6 (start 4) differ
B = (_a(5, 6), _a(4, 8))
# c: ids 5 [0,2), 5 [2,4) -> same ids as a on [0,4) but the segment at 2 starts at 2, not 0
C = (_a(5, 5), _a(2, 4))


@pytest.mark.parametrize("jit", [True, False])
def test_common_prefix_end(jit):
    f = common_prefix_end if jit else _py(common_prefix_end)
    assert f(*A, *B, 0, 8) == 6  # differ at 6
    assert f(*A, *B, 0, 5) == 5  # equal up to the limit
    assert f(*A, *B, 2, 6) == 6
    assert f(*A, *B, 7, 7) == 7  # empty range
    assert f(*A, *C, 0, 4) == 2  # token 2: (5, 0) in a, (5, 2) in c
    assert f(*A, *C, 3, 4) == 3
    assert f(*A, *A, 0, 9) == 9


@pytest.mark.parametrize("jit", [True, False])
def test_token_key_and_segment_at(jit):
    tk = token_key if jit else _py(token_key)
    sa = segment_at if jit else _py(segment_at)
    assert tuple(tk(*A, 0)) == (5, 0)
    assert tuple(tk(*A, 3)) == (5, 0)
    assert tuple(tk(*A, 4)) == (6, 4)
    assert tuple(tk(*A, 8)) == (-1, 6)
    assert [sa(A[1], t) for t in (0, 3, 4, 5, 6, 8)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("jit", [True, False])
def test_page_span(jit):
    ps = page_span if jit else _py(page_span)
    # page [4, 8) of a: segments 1 (6, [4,6)) and 2 (-1, [6,9)); first segment starts at 4
    assert tuple(ps(*A, 4, 4)) == (1, 2, 4)
    # page [0, 2): inside segment 0 (starts at 0)
    assert tuple(ps(*A, 0, 2)) == (0, 0, 0)
    # page [2, 4) of c: segment 1 starting at 2
    assert tuple(ps(*C, 2, 2)) == (1, 1, 2)


def test_jit_and_python_agree_on_random_runs():
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        ta = rng.integers(0, 3, n)
        tb = ta.copy()
        if rng.random() < 0.7:
            k = int(rng.integers(0, n))
            tb[k:] = rng.integers(0, 3, n - k)
        # token traces: one segment per token (id = token, start = position)
        a = (ta.astype(np.int64), np.arange(1, n + 1, dtype=np.int64))
        b = (tb.astype(np.int64), np.arange(1, n + 1, dtype=np.int64))
        brute = next((t for t in range(n) if ta[t] != tb[t]), n)
        assert common_prefix_end(*a, *b, 0, n) == brute == _py(common_prefix_end)(*a, *b, 0, n)


@pytest.mark.parametrize("jit", [True, False])
def test_segment_at_matches_searchsorted(jit):
    """segment_at first tries the index a run of single-token segments gives (a guess it
    checks); numpy's searchsorted is the oracle on token runs, stored runs that start
    mid-sequence, runs with wider segments mixed in, and positions before and past them."""
    sa = segment_at if jit else _py(segment_at)
    rng = np.random.default_rng(7)
    for _ in range(200 if jit else 40):
        n = int(rng.integers(1, 25))
        widths = np.where(rng.random(n) < 0.2, rng.integers(2, 6, n), 1)  # mostly single tokens
        start = int(rng.integers(0, 40))  # a stored sequence begins at a segment's start
        ends = (start + np.cumsum(widths)).astype(np.int64)
        for t in range(0, int(ends[-1]) + 3):
            assert sa(ends, t) == np.searchsorted(ends, t, side="right"), (ends.tolist(), t)
    assert sa(np.zeros(0, dtype=np.int64), 5) == 0  # no segments: searchsorted's answer


def _token_keys(ids, ends):
    """Per-token identities (id, start of the token's segment) of a run of segments."""
    keys, s = [], 0
    for i, e in zip(ids.tolist(), ends.tolist()):
        keys += [(i, s)] * (e - s)
        s = e
    return keys


@pytest.mark.parametrize("jit", [True, False])
def test_common_prefix_end_on_long_runs(jit):
    """Runs of 60–400 segments, long enough for the blocks the scan skips at once (64
    single-token segments, then 32 and 8 of any width): token runs, and runs with
    2-token segments mixed in; *b* is *a*, or *a* with one id changed, or with one
    segment one token wider (every later boundary moves). The oracle compares the
    per-token (id, segment start) identities from a random position to a random limit."""
    f = common_prefix_end if jit else _py(common_prefix_end)
    rng = np.random.default_rng(11)
    for _ in range(400 if jit else 60):
        n = int(rng.integers(60, 400))
        widths = np.where(rng.random(n) < (0.05 if rng.random() < 0.5 else 0.0), 2, 1)
        ids = rng.integers(0, 4, n)
        ids_b, widths_b = ids.copy(), widths.copy()
        k = int(rng.integers(0, n))
        r = rng.random()
        if r < 0.4:
            ids_b[k] += 1
        elif r < 0.7:
            widths_b[k] += 1
        a = (ids.astype(np.int64), np.cumsum(widths).astype(np.int64))
        b = (ids_b.astype(np.int64), np.cumsum(widths_b).astype(np.int64))
        ka, kb = _token_keys(*a), _token_keys(*b)
        m = min(len(ka), len(kb))
        pos = int(rng.integers(0, m)) if rng.random() < 0.5 else 0
        limit = int(rng.integers(pos, m + 1)) if rng.random() < 0.5 else m
        brute = next((t for t in range(pos, limit) if ka[t] != kb[t]), limit)
        assert f(*a, *b, pos, limit) == brute, (n, k, r, pos, limit)
