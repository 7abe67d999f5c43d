"""An eviction priority as a compiled function called by address.

A priority is a jitted function ``priority(N, x, params) -> (k1, k2)`` of node (or block)
*x*'s row of an int64 array *N* and a float64 parameter vector (SGLang's
``EvictionStrategy.get_priority``, ``srt/mem_cache/evict_policy.py``); smaller is evicted
first. The kernels that call one (the radix tree's keyed order,
:mod:`radixkv.policies._radix_kernels`; vLLM's priority pool,
:mod:`radixkv.policies._hash_kernels`, its free order ``PrioOrder``) take the int64 array of its two addresses
(:func:`function_addresses`) and rebuild the function value inside compiled code
(:func:`priority_at`), so they are compiled once (and cached on disk) for every
priority, built-in or user-written. Run as plain Python (the interpreted kernels of
:mod:`radixkv.replay.jit`), :func:`priority_at_python` stands in for :func:`priority_at`.
"""
from __future__ import annotations

import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I2 = types.int64[:, ::1]
_F1 = types.float64[::1]
#: signature of a priority function: (N, x, params) -> (k1, k2); smaller is evicted first
PRIORITY_SIG = types.UniTuple(types.float64, 2)(_I2, types.int64, _F1)
#: the numba type of a priority function value
PRIORITY_FN = types.FunctionType(PRIORITY_SIG)


def function_addresses(fn) -> np.ndarray:
    """int64 array ``[cfunc wrapper address, numba entry address]``, shape (2,), of a
    priority function compiled with :data:`PRIORITY_SIG` (keep *fn* alive while it is used).

    The kernels take this array, not the function: passing a first-class function
    object costs ~20 µs of typing per kernel call, an int64 array ~0.1 µs."""
    cres = fn.get_compile_result(PRIORITY_SIG)
    c_addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
    jit_addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    _BY_ADDRESS[int(c_addr)] = fn
    return np.array([c_addr, jit_addr], dtype=np.int64)


#: cfunc address → the compiled priority function :func:`function_addresses` gave it for
#: (kept alive here, so an address is never reused by another function in this process)
_BY_ADDRESS: dict = {}


def priority_at_python(addrs):
    """:func:`priority_at` for plain Python (the interpreted kernels' twin): the compiled
    priority function whose addresses :func:`function_addresses` returned as *addrs*,
    called from Python. It is the same compiled function the compiled kernels call, so an
    interpreted replay gets the same keys (bit for bit) as a compiled one.

    Parameters
    ----------
    addrs : numpy.ndarray
        int64, shape (2,), from :func:`function_addresses` in this process.

    Raises
    ------
    KeyError
        *addrs* did not come from :func:`function_addresses` in this process.
    """
    return _BY_ADDRESS[int(addrs[0])]




@intrinsic
def priority_at(typingctx, addrs):
    """The priority function at the addresses ``addrs[0], addrs[1]`` (see
    :func:`function_addresses`) as a first-class function value (compiled code only)."""
    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        c_addr = builder.load(cgutils.gep(builder, arr.data, 0))
        jit_addr = builder.load(cgutils.gep(builder, arr.data, 1))
        f = cgutils.create_struct_proxy(PRIORITY_FN)(context, builder)
        vp = context.get_value_type(types.voidptr)
        f.c_addr = builder.inttoptr(c_addr, vp)
        f.py_addr = cgutils.get_null_value(vp)
        f.jit_addr = builder.inttoptr(jit_addr, vp)
        return f._getvalue()
    return PRIORITY_FN(addrs), codegen


#: compiled-only intrinsics and their plain-Python forms: an interpreted twin of a kernel
#: module gets the second wherever its source names the first (radixkv.replay.jit)
PYTHON_FORMS = ((priority_at, priority_at_python),)
