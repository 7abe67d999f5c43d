"""The compiled concurrent vLLM loop's pool operations are chosen by the pool value's type
(radixkv.replay._conc_vllm_kernels, "Pools and their operations"): a pool registered
with ``pool_op`` is served by its own functions, each built-in pool by its own, and a
pool type without an operation fails to compile naming it. (The whole loop on the two
built-in pools is compared byte for byte in test_conc_vllm_fast.py and
test_conc_vllm_unit.py.)"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from radixkv.policies.block_hash import BlockHashCache
from radixkv.replay import _conc_vllm_block_kernels as BPK
from radixkv.replay import _conc_vllm_kernels as CK
from radixkv.replay import _conc_vllm_unit_kernels as UK

#: a third pool: counters only
TinyPool = namedtuple("TinyPool", ["q", "block_size"])
#: a pool type nobody registered
Unregistered = namedtuple("Unregistered", ["q", "block_size"])


@CK.pool_op(CK.pool_counts, TinyPool)
def _tiny_counts(pool):
    return pool.q[2], pool.q[1], pool.q[0]


@CK.pool_op(CK.pool_room, TinyPool, inline="never")
def _tiny_room(pool, budget, cap_run):
    return CK.S_POOL + 1 if budget > pool.q[0] else 0


@njit
def _counts(pool):
    return CK.pool_counts(pool)


@njit
def _room(pool, budget, cap_run):
    return CK.pool_room(pool, budget, cap_run)


def test_a_registered_pool_is_served_by_its_own_operations():
    p = TinyPool(np.array([7, 8, 9], dtype=np.int64), 16)
    assert _counts(p) == (9, 8, 7)
    assert _room(p, 6, 1) == 0
    assert _room(p, 8, 1) == CK.S_POOL + 1


def test_the_built_in_pools_report_their_own_counters():
    pol = BlockHashCache(9, 4)  # 8 usable blocks, nothing held or cached
    pol._st[[3, 6, 7]] = (5, 2, 3)  # hashed, used, cached as the per-block pool keeps them
    assert _counts(BPK.new_pool(pol)) == (2, 3, 5)
    arrays = UK.new_pool(9, 2, 1, 1)
    arrays[6][[UK.Q_NUSED, UK.Q_NCACHED, UK.Q_NHASHED]] = (4, 1, 6)
    up = UK.unit_pool(arrays, np.zeros((6, 1), dtype=np.int64), 2, 8, 4)
    assert _counts(up) == (4, 1, 6)
    # the unit pool asks for more unit records when an iteration may need more than it has:
    # 64 records, a 128-row key table; budget 4: 2·1 + 4 + 4 = 10 records at most
    assert _room(up, 4, 1) == 0
    assert _room(up, 4 * 40, 1) == UK.S_GROW_UNITS  # 2·40 + 8 = 88 > 64


def test_a_pool_without_the_operation_fails_to_compile_naming_it():
    with pytest.raises(TypingError, match="pool_counts"):
        _counts(Unregistered(np.zeros(3, dtype=np.int64), 16))
