"""Numba intrinsics shared by the compiled kernels of every layer (trace, policies, replay).

:func:`prefetch_row` and :func:`prefetch_once` ask the CPU to start loading the cache line
of ``arr[i, 0, …]`` (LLVM ``llvm.prefetch``, a read). They are hints: no result depends on
them. ``prefetch_row`` asks for high temporal locality (3: the line is about to be read and
written again, e.g. a block record or a key-table row); ``prefetch_once`` for moderate
locality (2: data streamed through once, e.g. a request's ids).

An intrinsic cannot run as plain Python: a kernel module binds a hint through
:func:`for_mode`, which gives a no-op stand-in when Numba's JIT is disabled.
"""
from __future__ import annotations

import llvmlite.ir as llir
from numba import types
from numba.core import cgutils
from numba.core import config as numba_config
from numba.extending import intrinsic


def _prefetch_codegen(locality: int):
    """Codegen of a prefetch of ``arr[i, 0, …]`` with LLVM locality *locality* (0 … 3)."""

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx] + [zero] * (aryty.ndim - 1),
                                       wraparound=False)
        i8p = llir.IntType(8).as_pointer()
        i32 = llir.IntType(32)
        fnty = llir.FunctionType(llir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # (address, rw = 0 read, locality, cache type = 1 data)
        builder.call(fn, [builder.bitcast(ptr, i8p), llir.Constant(i32, 0), llir.Constant(i32, locality),
                          llir.Constant(i32, 1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch_row(typingctx, arr, i):
    """Hint the CPU to load the cache line of ``arr[i, 0, …]`` (any array of ndim ≥ 1; *i*
    an integer row index, not checked), high locality. Changes no result."""
    return types.void(arr, i), _prefetch_codegen(3)


@intrinsic
def prefetch_once(typingctx, arr, i):
    """As :func:`prefetch_row` with moderate locality, for data read once. Changes no result."""
    return types.void(arr, i), _prefetch_codegen(2)


def _no_prefetch(arr, i):
    """No-op stand-in for the prefetch hints (plain Python)."""


def for_mode(hint):
    """*hint* (:func:`prefetch_row` or :func:`prefetch_once`), or a no-op Python stand-in
    when Numba's JIT is disabled at the time of the call. A kernel module binds its hint
    with ``_prefetch = for_mode(prefetch_row)`` at import, so that the module executed
    with the JIT disabled (``NUMBA_DISABLE_JIT=1``, or the interpreted twins of
    :mod:`radixkv.replay.jit`, which re-execute a module's source) calls the stand-in."""
    return _no_prefetch if numba_config.DISABLE_JIT else hint
