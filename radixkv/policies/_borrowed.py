"""Borrowed array views for Numba kernels: arrays without reference counts.

Numba counts references to every array it handles (``NRT_incref`` / ``NRT_decref``,
atomic read-modify-writes on the array's meminfo): binding an array to a new variable
— each argument of an inlined helper, each argument a function receives — increments
it, the variable's end decrements it. Its pruning pass removes the pairs it can match,
but not those of a helper inlined in a loop whose exits or nested helpers it cannot
pair, and such per-block loops then spend more time on the counts than on the work
(``docs/performance.md``, "Token traces").

:func:`borrow` gives a view of an array whose type, :class:`BorrowedArray`, carries no
meminfo that Numba tracks: the same data pointer, shape and strides, and no reference
count operation is ever emitted for it. It is safe where the view does not outlive the
array it borrows from: a kernel borrows its own arguments (which its caller keeps alive
for the call) and passes the views down to helpers; a view must not be returned or
stored. A slice or ``view`` of a borrowed array is an ordinary array with a null
meminfo (reference counts on it are no-ops).

With Numba's JIT disabled (``NUMBA_DISABLE_JIT=1``) :func:`borrow` returns its argument
(:func:`borrow_py`); the interpreted kernels of :mod:`radixkv.replay.jit` rebind it so.
"""
from __future__ import annotations

from numba import types
from numba.core import config as numba_config
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model

__all__ = ["BorrowedArray", "borrow", "borrow_py"]


class BorrowedArray(types.Array):
    """Numba type of a borrowed view: an ``Array`` whose meminfo is an untracked pointer."""

    def __init__(self, dtype, ndim, layout, readonly=False, aligned=True):
        name = f"borrowed array({dtype}, {ndim}d, {layout})"
        super().__init__(dtype, ndim, layout, readonly=readonly, name=name, aligned=aligned)


@register_model(BorrowedArray)
class _BorrowedArrayModel(models.StructModel):
    """``ArrayModel``'s fields, with ``meminfo`` a plain pointer (nothing to count)."""

    def __init__(self, dmm, fe_type):
        members = [
            ("meminfo", types.voidptr),
            ("parent", types.pyobject),
            ("nitems", types.intp),
            ("itemsize", types.intp),
            ("data", types.CPointer(fe_type.dtype)),
            ("shape", types.UniTuple(types.intp, fe_type.ndim)),
            ("strides", types.UniTuple(types.intp, fe_type.ndim)),
        ]
        super().__init__(dmm, fe_type, members)


@intrinsic
def borrow(typingctx, arr):
    """A :class:`BorrowedArray` view of the array *arr* (same data, shape and strides;
    meminfo set to null so that no reference is held or counted); a borrowed view is
    returned as it is."""
    if isinstance(arr, BorrowedArray):
        return arr(arr), lambda context, builder, signature, args: args[0]
    if not isinstance(arr, types.Array):
        return None
    ret = BorrowedArray(arr.dtype, arr.ndim, arr.layout, readonly=not arr.mutable, aligned=arr.aligned)

    def codegen(context, builder, signature, args):
        src = context.make_array(signature.args[0])(context, builder, value=args[0])
        dst = context.make_array(signature.return_type)(context, builder)
        for name in ("parent", "nitems", "itemsize", "data", "shape", "strides"):
            setattr(dst, name, getattr(src, name))
        dst.meminfo = context.get_constant_null(types.voidptr)
        return dst._getvalue()

    return ret(arr), codegen


def borrow_py(arr):
    """Python stand-in of :func:`borrow` for kernels run as plain Python: the array itself.
    A module whose kernels may be executed with the JIT disabled (the interpreted twins
    of :mod:`radixkv.replay.jit`) binds ``borrow`` to it when ``DISABLE_JIT`` is set."""
    return arr


if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run
    borrow = borrow_py  # noqa: F811
