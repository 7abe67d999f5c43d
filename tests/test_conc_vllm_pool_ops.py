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
from radixkv.replay import _conc_vllm_piece_kernels as PK

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
    # the piece pool (block 2, units of 4 tokens, one 1-unit request; 8 usable blocks)
    pp = PK.new_pool(9, 2, 4, np.array([0]), np.array([0, 1]), np.zeros((6, 1), dtype=np.int64), 1)
    pp.us[[PK.U_NUSED, PK.U_NCACHED, PK.U_NHASHED, PK.U_Z, PK.U_PEND]] = (4, 3, 6, 2, 3)
    # a decode run took 3 blocks not yet popped: 2 keyless, then 1 hashed that its pop evicts
    assert _counts(pp) == (4, 3 - 1, 6 - 1)
    # it asks for bigger key tables when a step could fill one past half: its unit-key table
    # has 4 · (11 // 2 + 64) → 512 rows; budget 4: 2·2 + 4 + 4 = 12 new records at most
    assert pp.um.shape[0] == 512
    assert _room(pp, 4, 1) == 0
    assert _room(pp, 400, 1) == PK.S_GROW_TABLES  # 2 · (400 + 8) > 512


def test_a_pool_without_the_operation_fails_to_compile_naming_it():
    with pytest.raises(TypingError, match="pool_counts"):
        _counts(Unregistered(np.zeros(3, dtype=np.int64), 16))
