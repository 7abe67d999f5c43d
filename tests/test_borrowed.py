"""Borrowed array views (radixkv.policies._borrowed): a view addresses exactly its owner's
elements, takes and drops no reference, does not outlive its owner, and the kernels
borrow only what their callers keep alive.

Expected values come from NumPy on the same array (addresses, strides, element order)
or from the rules of the module docstring, not from the code under test."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import numba as nb
import numpy as np
import pytest
from numba.core.errors import NumbaError

from radixkv.policies._borrowed import BorrowedArray, borrow, borrow_py


@nb.njit
def _layout(a):
    b = borrow(a)
    return b.ctypes.data, b.shape, b.strides, b.size


@nb.njit
def _fill_in_order(a):
    """Writes 0, 1, 2, … through a borrowed view, in C order of the view's indices."""
    b = borrow(a)
    k = 0
    for idx in np.ndindex(b.shape):
        b[idx] = k
        k += 1
    return k


@nb.njit
def _sum_through(a):
    b = borrow(a)
    s = 0
    for idx in np.ndindex(b.shape):
        s += b[idx]
    return s


#: name -> (a function making the base array, the view of it that is borrowed)
OWNERS = {
    "1d C": (lambda: np.arange(7, dtype=np.int64), lambda x: x),
    "2d C int32": (lambda: np.arange(12, dtype=np.int32).reshape(3, 4), lambda x: x),
    "2d F": (lambda: np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)), lambda x: x),
    "3d C": (lambda: np.arange(120, dtype=np.int64).reshape(4, 5, 6), lambda x: x),
    "strided": (lambda: np.arange(120, dtype=np.int64).reshape(4, 5, 6), lambda x: x[1:, ::2, 1::3]),
    "negative strides": (lambda: np.arange(120, dtype=np.int64).reshape(4, 5, 6), lambda x: x[::-1, :, ::-2]),
    "uint64 column": (lambda: np.arange(20, dtype=np.uint64).reshape(10, 2), lambda x: x[:, 1]),
    "float64 2d": (lambda: np.linspace(0.0, 1.0, 15).reshape(5, 3), lambda x: x),
    "empty": (lambda: np.zeros((0, 3), dtype=np.int64), lambda x: x),
}


@pytest.mark.parametrize("name", list(OWNERS))
def test_view_has_the_owners_address_shape_and_strides(name):
    make, sl = OWNERS[name]
    a = sl(make())
    ptr, shape, strides, size = _layout(a)
    assert ptr == a.ctypes.data
    assert tuple(shape) == a.shape
    assert tuple(strides) == a.strides
    assert size == a.size


@pytest.mark.parametrize("name", list(OWNERS))
def test_writes_through_a_view_land_on_the_owners_elements(name):
    make, sl = OWNERS[name]
    base = make()
    expected = base.copy()
    sl(expected)[...] = np.arange(sl(expected).size).reshape(sl(expected).shape)  # C-order rank by NumPy
    assert _fill_in_order(sl(base)) == sl(base).size
    assert np.array_equal(base, expected)  # the view's elements, and nothing else of the base


def test_readonly_owner_reads_the_same_values():
    a = np.arange(10, dtype=np.int64)
    a.flags.writeable = False
    assert _sum_through(a) == 45
    assert _layout(a)[0] == a.ctypes.data


@nb.njit
def _slices_of_a_view(a):
    b = borrow(a)
    c = b[1:, ::2]  # an ordinary array (null meminfo), same memory
    c[0, 0] = -1
    v = b.view(np.int32)
    v[0, 1] = 7  # the high half of a[0, 0] (little-endian)
    return c.ctypes.data, c.shape[0], c.shape[1]


def test_slices_and_dtype_views_of_a_view_address_the_owner():
    a = np.zeros((4, 6), dtype=np.int64)
    ptr, r, c = _slices_of_a_view(a)
    assert ptr == a[1:, ::2].ctypes.data and (r, c) == a[1:, ::2].shape
    exp = np.zeros((4, 6), dtype=np.int64)
    exp[1, 0] = -1
    exp.view(np.int32)[0, 1] = 7
    assert np.array_equal(a, exp)


@nb.njit
def _twice(a):
    b = borrow(a)
    return borrow(b).ctypes.data == b.ctypes.data


def test_borrowing_a_view_returns_it_and_plain_python_is_the_identity():
    a = np.arange(3)
    assert _twice(a)
    assert borrow_py(a) is a


@nb.njit
def _borrow_only(a):
    return borrow(a)[0]


def test_a_view_takes_and_drops_no_reference_of_its_owner():
    a = np.arange(5, dtype=np.int64)
    _borrow_only(a)  # compile first
    before = sys.getrefcount(a)
    for _ in range(1000):
        assert _borrow_only(a) == 0
    assert sys.getrefcount(a) == before


@nb.njit
def _use_and_allocate(a):
    """Writes 1 through a view of the argument *a* after allocating an array of a's size;
    returns that array's sum (0 unless it shares a's memory)."""
    b = borrow(a)
    d = np.zeros(b.shape[0], dtype=np.int64)
    for i in range(b.shape[0]):
        b[i] = 1
    return d.sum()


@nb.njit
def _owner_allocated_in_the_caller(n):
    a = np.empty(n, dtype=np.int64)
    for j in range(n):
        a[j] = j
    s = _use_and_allocate(a)
    return s, a.sum()


@pytest.mark.parametrize("n", [8, 1000, 100_000])
def test_an_owner_passed_as_argument_outlives_its_view(n):
    # rule 1 of the module docstring: the caller holds *a* for the whole call, so the
    # array allocated inside cannot reuse its memory and the writes reach *a*
    assert _owner_allocated_in_the_caller(n) == (0, n)


@nb.njit
def _balanced(n):
    a = np.empty(n, dtype=np.int64)
    for j in range(n):
        a[j] = j
    return _use_and_allocate(a)


def test_borrowing_leaks_and_frees_nothing():
    from numba.core.runtime import _nrt_python as nrt
    from numba.core.runtime import rtsys

    _balanced(16)
    was_on = nrt.memsys_stats_enabled()
    nrt.memsys_enable_stats()
    try:
        s0 = rtsys.get_allocation_stats()
        for _ in range(50):
            _balanced(16)
        s1 = rtsys.get_allocation_stats()
    finally:
        if not was_on:
            nrt.memsys_disable_stats()
    # per call: a and d allocated, both freed, and nothing else (a view is not an allocation)
    assert s1.alloc - s0.alloc == 100
    assert s1.free - s0.free == 100
    assert s1.mi_alloc - s0.mi_alloc == s1.mi_free - s0.mi_free == 100


def test_a_borrowed_view_cannot_be_returned_to_python():
    @nb.njit
    def escape(a):
        return borrow(a)

    with pytest.raises(NumbaError, match="borrowed view must not outlive"):
        escape(np.arange(3))


@nb.njit
def _row_sum(a, i):
    s = a[i, 0]
    for j in range(1, a.shape[1]):
        s += a[i, j]
    return s


@nb.njit
def _sum_rows_borrowed(a):
    b = borrow(a)
    s = 0
    for i in range(b.shape[0]):
        s += _row_sum(b, i)
    return s


def test_no_reference_count_calls_on_a_view():
    a = np.arange(12, dtype=np.int64).reshape(4, 3)
    assert _sum_rows_borrowed(a) == 66
    sigs = [s for s in _row_sum.signatures if isinstance(s[0], BorrowedArray)]
    assert len(sigs) == 1
    ir = _row_sum.inspect_llvm(sigs[0])
    assert "call void @NRT_incref" not in ir and "call void @NRT_decref" not in ir


# ------------------------------------------------ the kernels follow the rules (source)
ROOT = Path(__file__).resolve().parents[1] / "radixkv"


def _params(fn: ast.FunctionDef) -> set:
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def _owned_by_caller(name: str, fn: ast.FunctionDef, params: set, depth: int = 0) -> bool:
    """*name* is a parameter of *fn*, or bound (once) to a subscript or ``.view(...)`` of
    one: memory the caller of *fn* holds for the whole call."""
    if name in params:
        return True
    if depth > 4:
        return False
    binds = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    if len(binds) != 1:
        return False
    v = binds[0].value
    if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name):
        return _owned_by_caller(v.value.id, fn, params, depth + 1)
    if (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "view"
            and isinstance(v.func.value, ast.Name)):
        return _owned_by_caller(v.func.value.id, fn, params, depth + 1)
    return False


def _caller_owned(arg: ast.expr, fn: ast.FunctionDef, params: set) -> bool:
    """*arg* is a name :func:`_owned_by_caller` accepts, or an item or field of one
    (``tr[0]``, ``pool.pc``: an array inside a tuple the caller holds for the call)."""
    if isinstance(arg, ast.Name):
        return _owned_by_caller(arg.id, fn, params)
    if isinstance(arg, (ast.Subscript, ast.Attribute)):
        return _caller_owned(arg.value, fn, params)
    return False


def _borrow_calls():
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "_borrowed.py":
            continue
        src = path.read_text()
        if "borrow(" not in src:
            continue
        tree = ast.parse(src)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "borrow":
                    yield path.relative_to(ROOT.parent), fn, call


def test_kernels_borrow_only_what_their_caller_keeps_alive():
    calls = list(_borrow_calls())
    users = {str(p) for p, _, _ in calls}
    assert {"radixkv/policies/_hash_span.py", "radixkv/policies/_hash_kernels.py",
            "radixkv/policies/_radix_span.py"} <= users
    bad = []
    for path, fn, call in calls:
        arg = call.args[0] if call.args else None
        if not (arg is not None and _caller_owned(arg, fn, _params(fn))):
            bad.append(f"{path}:{call.lineno} {fn.name}: borrow({ast.unparse(arg) if arg else ''})")
    assert not bad, "borrowed from an array the function itself owns (freed after its last use):\n" + "\n".join(bad)


def test_the_rule_check_sees_a_local_owner():
    src = ("def f(x, y):\n    a = np.empty(3)\n    b = x[1:]\n    c = y.view(np.int32)\n"
           "    return borrow(a), borrow(b), borrow(c), borrow(x)\n")
    fn = ast.parse(src).body[0]
    got = {c.args[0].id: _owned_by_caller(c.args[0].id, fn, _params(fn))
           for c in ast.walk(fn) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "borrow"}
    assert got == {"a": False, "b": True, "c": True, "x": True}


def test_the_rule_check_takes_items_of_a_parameter_not_of_a_local():
    src = ("def f(t, p):\n    a = (np.empty(3),)\n"
           "    return borrow(t[0]), borrow(p.q), borrow(p.q[1:]), borrow(a[0])\n")
    fn = ast.parse(src).body[0]
    got = [_caller_owned(c.args[0], fn, _params(fn))
           for c in ast.walk(fn) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "borrow"]
    assert got == [True, True, True, False]
