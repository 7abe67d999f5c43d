"""Borrowed array views for Numba kernels: arrays without reference counts.

The one mechanism both sequential span kernels use (``_hash_span`` / ``_hash_kernels.run_seq``
for ``vllm``, ``_radix_span`` for ``sglang``).

Why: Numba counts references to every array it handles (``NRT_incref`` / ``NRT_decref``,
atomic read-modify-writes on the array's meminfo): binding an array to a new variable
— each argument of an inlined helper, each argument a function receives, each slice —
increments it, the variable's end decrements it. Its pruning pass removes the pairs it
can match, but not those of a helper inlined in a loop whose exits or nested helpers it
cannot pair, and such per-block loops then spend more time on the counts than on the work
(``docs/performance.md``, "`vllm:16` without reference counts").

What :func:`borrow` gives: a view of an array whose Numba type, :class:`BorrowedArray`,
has a data model with a plain pointer where an array's meminfo is, so Numba emits no
reference count operation for the view at all; its data pointer, shape, strides, dtype,
layout and read-only flag are the array's, so every read and write goes to the same
element of the same memory. A slice, ``view(dtype)`` or reshape of a borrowed view is an
ordinary Numba array whose meminfo is null (its counts are a null test, no atomic
operation). Kernels compiled for borrowed arguments are separate specialisations of
the same source.

Safety rules. The view does not keep its owner (the array it was made from) alive, and
Numba frees an array as soon as its last reference goes away:

1. Borrow only an argument of the function that calls :func:`borrow`, or a slice or
   ``view`` of such an argument. The caller holds its reference for the whole call,
   so the memory outlives every use of the view inside it. Never borrow an array the
   function allocated itself (``np.empty`` …): Numba drops a local variable's
   reference right after the variable's last use *by name*, which may be the
   ``borrow`` call itself, and the view then points at freed memory that the next
   allocation reuses (or that is unmapped). Allocate scratch in a caller and pass it
   down; ``tests/test_borrowed.py`` checks that every ``borrow(x)`` in the package
   borrows a parameter or a slice / ``view`` of one.
2. A view (or a slice of one) never leaves the call that borrowed it: it is not
   returned, not stored in an array, list, dict or global, and not given back to
   Python. Returning a :class:`BorrowedArray` to Python is refused when the kernel is
   compiled (its boxing raises); a slice of one would be boxed as a NumPy array with no
   owner, so that case is the kernel author's to avoid.
3. Passing views down to callees is what they are for; the callees may not keep them
   either (rule 2 applies to them).

With Numba's JIT disabled (``NUMBA_DISABLE_JIT=1``) :func:`borrow` returns its argument
(:func:`borrow_py`); the interpreted kernels of :mod:`radixkv.replay.jit` rebind it so.
"""
from __future__ import annotations

from numba import types
from numba.core import config as numba_config
from numba.core.datamodel import models
from numba.core.errors import NumbaTypeError
from numba.extending import box, intrinsic, overload, register_model

__all__ = ["BorrowedArray", "borrow", "borrow_py"]


class BorrowedArray(types.Array):
    """Numba type of a borrowed view: an ``Array`` whose meminfo is an untracked pointer
    (null). Slicing it gives an ordinary ``Array`` (``types.Array.copy``)."""

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


@box(BorrowedArray)
def _box_borrowed(typ, val, c):
    """A borrowed view cannot become a Python object (it would outlive its owner)."""
    raise NumbaTypeError(f"a {typ} cannot be returned to Python: a borrowed view must not outlive "
                         "the call that borrowed it (radixkv.policies._borrowed)")


@intrinsic
def borrow(typingctx, arr):
    """A :class:`BorrowedArray` view of the array *arr* (same data pointer, shape, strides,
    dtype and layout; meminfo null, so that no reference is held or counted); a borrowed
    view is returned as it is. See the module docstring for the rules that make it safe."""
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


def borrow_each(t):
    """A tuple of 5 arrays (an eviction order of :mod:`radixkv.policies._radix_kernels`)
    with each array viewed (:func:`borrow`), under the same rules; plain Python: *t* itself."""
    return t


@overload(borrow_each)
def _ov_borrow_each(t):
    if not isinstance(t, types.BaseTuple) or not all(isinstance(a, types.Array) for a in t):
        return None
    if len(t) == 5:
        return lambda t: (borrow(t[0]), borrow(t[1]), borrow(t[2]), borrow(t[3]), borrow(t[4]))
    return None


if numba_config.DISABLE_JIT:  # plain Python (NUMBA_DISABLE_JIT=1): an intrinsic cannot run
    borrow = borrow_py  # noqa: F811
