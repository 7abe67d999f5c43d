"""Borrowed array views without reference counts, for compiled request loops (Numba).

Numba counts references to every array it passes around: each call of a compiled helper
increments and decrements the count of each array argument (and of each slice it takes),
and those counts are atomic operations (``NRT_incref`` / ``NRT_decref``) that its
pruning pass leaves in place across calls. The radix tree's helpers take 5–8 state arrays
each, so a short request paid hundreds of them (docs/performance.md, "The sequential
replay loop inside the kernels").

:func:`borrow` returns the same array (same data pointer, shape, strides, dtype) with no
owner: its ``meminfo`` is NULL, so every count on it, and on any slice of it, is a
null check and no atomic operation. The caller must keep the owning array alive for as
long as the view is used, which holds when the view is made from an argument of a
compiled function (its caller holds the owner) and only passed down to calls — never
returned, stored in another array's place that outlives the call, or given back to
Python. Nothing else changes: reads and writes go to the same memory.

With ``NUMBA_DISABLE_JIT=1`` (plain Python) :func:`borrow` returns its argument.
"""
from __future__ import annotations

from numba.core import cgutils
from numba.core import config as numba_config
from numba.extending import intrinsic


@intrinsic
def borrow(typingctx, arr):
    """The array *arr* (any Numba array type) with no owner: ``meminfo`` and ``parent``
    NULL; same type, data, shape and strides. See the module docstring for when it is
    safe."""
    sig = arr(arr)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        ary.parent = cgutils.get_null_value(ary.parent.type)
        return ary._getvalue()

    return sig, codegen


if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run

    def borrow(arr):  # noqa: F811
        """Plain-Python stand-in: the array itself."""
        return arr
