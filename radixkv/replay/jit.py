"""Compiled or interpreted kernels: what a cold Numba cache costs, and how to avoid paying it.

The policies' kernels (:mod:`radixkv.policies._hash_kernels` for ``vllm`` and ``static``,
:mod:`radixkv.policies._radix_kernels` for ``sglang``) are pure functions over numpy
arrays, written so that the same source gives the same results compiled by Numba or run
as plain Python (``NUMBA_DISABLE_JIT=1``; the golden tests run both ways). Compiling a
family on a cold cache costs about 8 s (vLLM's block pool) and 13 s (SGLang's tree) of
CPU on a 2-core machine; loading it from Numba's on-disk cache takes well under a
second. Interpreted, the kernels replay about 0.1–0.5 M tokens per second, so a small
replay (the README demo: 0.16 M tokens per policy) finishes sooner interpreted than
compiled.

Rule (``RADIXKV_JIT``, default ``auto``):

- ``compile``: always use the compiled kernels (compile on a cold cache).
- ``interpret``: always run the kernels as plain Python (slow; for debugging and tests).
- ``auto``: use the compiled kernels when Numba's cache already holds them
  (:func:`is_warm`); on a cold cache, run a family interpreted when the replays planned
  for it are small (at most :data:`INTERPRET_MAX_TOKENS` prompt + output tokens in all),
  and compile it otherwise.

``radixkv warmup`` fills the cache (for CI images and cached CI directories); after it,
``auto`` always uses the compiled kernels.

Interpreted kernels are the kernel modules' own source executed a second time with
Numba's JIT disabled (:func:`_interpreted_module`); switching a family swaps the
module attributes that name its kernels (:func:`use_interpreted`,
:func:`use_compiled`), so the policy classes need no change.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys

import numpy as np

from radixkv.numba_cache import ColdCache, mode, without_compiling

__all__ = ["mode", "family_of", "plan", "before_replay", "mark_compiled", "is_warm", "is_interpreted",
           "use_interpreted", "use_compiled", "trace_tokens", "INTERPRET_MAX_TOKENS"]

#: kernel family → the modules holding its Numba kernels
FAMILY_MODULES = {
    "hash": ("radixkv.policies._hash_kernels", "radixkv.policies._hash_batch_kernels",
             "radixkv.policies._static_kernels"),
    "radix": ("radixkv.policies._radix_kernels",),
}

#: the kernel families of the priority policies (``vllm:B@ORDER``, ``sglang:P@ORDER``,
#: whose priority functions the kernels call by address) → the switchable family that holds
#: their kernels: they run compiled or interpreted with it (interpreted, the kernels call
#: the compiled priority function from Python: ``_priority_fn.priority_at_python``)
BASE_FAMILY = {"block_priority": "hash", "radix_priority": "radix"}

#: on a cold cache, ``auto`` interprets a family whose planned replays total at most
#: this many prompt + output tokens (about 3–7 s interpreted on one 2020s core, against
#: 8–13 s of compiling)
INTERPRET_MAX_TOKENS = 1_000_000

_twins: dict = {}
_swapped: dict = {}  # family -> [(module, name, original value)]
_compiled_of: dict = {}  # family -> {id(interpreted twin as bound): (that twin, compiled kernel)}
_warm: dict = {}  # family -> bool (probe result)


def family_of(spec) -> str | None:
    """The kernel family of a :class:`~radixkv.policies.registry.PolicySpec`: the built
    class's ``kernel_family`` when it is one of :data:`FAMILY_MODULES`, the family holding
    its kernels for a priority policy (:data:`BASE_FAMILY`: ``@lfu``, ...), else None
    (none to switch)."""
    fam = getattr(getattr(spec, "build_class", None), "kernel_family", None)  # declared by the class
    fam = BASE_FAMILY.get(fam, fam)
    return fam if fam in FAMILY_MODULES else None


def _interpreted_module(name: str):
    """Module *name* executed afresh with Numba's JIT disabled: its ``@njit`` functions are
    plain Python functions calling each other (cached per process)."""
    if name in _twins:
        return _twins[name]
    from numba.core import config

    orig = importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name + "__interpreted", orig.__file__)
    twin = importlib.util.module_from_spec(spec)
    old = config.DISABLE_JIT
    config.DISABLE_JIT = True
    try:
        spec.loader.exec_module(twin)
    finally:
        config.DISABLE_JIT = old
    from radixkv.policies._priority_fn import PYTHON_FORMS

    for attr, val in list(vars(twin).items()):  # compiled-only intrinsics: their Python forms
        for compiled_only, python_form in PYTHON_FORMS:
            if val is compiled_only:
                setattr(twin, attr, python_form)
    _twins[name] = twin
    return twin


def _wrapping(fn):
    """*fn* (an interpreted kernel) called with numpy's integer-overflow warning off.

    The hash kernels rely on uint64 arithmetic wrapping modulo 2**64 (splitmix64 in
    ``_hash_kernels._mix``, the node hash of ``_radix_kernels``); compiled code wraps
    silently, but numpy scalars warn ``RuntimeWarning: overflow encountered in scalar
    multiply`` on every such step when the same source runs as plain Python. The values
    are the same either way; only the spurious warning is suppressed, for the call."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with np.errstate(over="ignore"):
            return fn(*args, **kwargs)
    return call


def is_interpreted(family: str) -> bool:
    """True while *family* runs interpreted in this process."""
    return family in _swapped


def use_interpreted(family: str) -> None:
    """Run *family*'s kernels as plain Python in this process: every ``radixkv`` module
    attribute bound to one of its compiled kernels is rebound to the interpreted twin."""
    if family in _swapped:
        return
    from numba.core.dispatcher import Dispatcher

    swaps = []
    by_func = {}
    plain = {}  # id(a callable a family module defines) -> (it, its plain-Python form in the twin)
    back = _compiled_of[family] = {}
    twins = []
    for modname in FAMILY_MODULES[family]:
        orig = importlib.import_module(modname)
        twin = _interpreted_module(modname)
        twins.append(twin)
        for attr, val in vars(orig).items():
            tw = getattr(twin, attr, None)
            if not callable(val) or not callable(tw) or tw is val or id(val) in plain:
                continue  # not a kernel, or one the module imports (its twin holds the same object)
            plain[id(val)] = (val, tw)
            if isinstance(val, Dispatcher):
                by_func[id(val)] = w = _wrapping(tw)
                back[id(w)] = (w, val)
    for twin in twins:  # a twin calls the family's other twins (kernels, intrinsics' Python forms),
        for attr, val in list(vars(twin).items()):  # never a compiled kernel: its globals are rebound
            pair = plain.get(id(val))  # below, so it could not compile
            if pair is not None and pair[0] is val:
                setattr(twin, attr, pair[1])
    for mod in list(sys.modules.values()):
        if mod is None or not getattr(mod, "__name__", "").startswith("radixkv.") or mod.__name__.endswith("__interpreted"):
            continue
        for attr, val in list(vars(mod).items()):
            if id(val) in by_func:
                swaps.append((mod, attr, val))
                setattr(mod, attr, by_func[id(val)])
    _swapped[family] = swaps


def use_compiled(family: str) -> None:
    """Undo :func:`use_interpreted` for *family* (the compiled kernels are used again),
    in the modules it rebound and in any ``radixkv`` module imported since that bound an
    interpreted twin by name (``from ... import kernel``): no twin stays where a compiled
    kernel would find it as a global it cannot type."""
    if family not in _swapped:
        return
    for mod, attr, val in _swapped.pop(family):
        setattr(mod, attr, val)
    back = _compiled_of.pop(family, {})
    for mod in list(sys.modules.values()):
        if mod is None or not getattr(mod, "__name__", "").startswith("radixkv."):
            continue
        for attr, val in list(vars(mod).items()):
            pair = back.get(id(val))
            if pair is not None and pair[0] is val:
                setattr(mod, attr, pair[1])


def is_warm(spec) -> bool:
    """True when Numba's cache holds every kernel *spec*'s sequential replay needs
    (nothing compiles).

    Probes by running the warm-up's tiny replay with a listener that stops at the
    first ``numba:compile`` event: kernels found in the cache load, the first one that
    would compile ends the probe. Cached per family for the process.
    """
    fam = family_of(spec)
    if fam is None:
        return True
    if fam in _warm:
        return _warm[fam]
    from radixkv.replay.warm import _WARM, _tiny_run

    was = is_interpreted(fam)
    use_compiled(fam)
    try:
        without_compiling(_tiny_run, spec, False)
        warm = True
        _WARM.add((spec, 0))
    except ColdCache:
        warm = False
    finally:
        if was:
            use_interpreted(fam)
    _warm[fam] = warm
    return warm


_decided: dict = {}  # family -> "compiled" | "interpreted"
_interp_tokens: dict = {}  # family -> tokens planned to run interpreted so far
_prepaid: dict = {}  # family -> tokens planned by plan() and not yet replayed


def plan(work) -> dict:
    """Decide compiled or interpreted kernels for the replays in *work* and switch.

    Families already decided in this process keep their decision, except that an
    interpreted family switches to compiled once the tokens it has been asked to replay
    interpreted exceed :data:`INTERPRET_MAX_TOKENS` (many small replays cost as much
    as a big one).

    Parameters
    ----------
    work : iterable of (PolicySpec, tokens)
        Each planned replay and its prompt + output tokens (over the replayed requests).

    Returns
    -------
    dict family → ``"compiled"`` or ``"interpreted"`` (families in *work* only).

    Raises
    ------
    radixkv.errors.ConfigError
        For a bad ``RADIXKV_JIT``.
    """
    m = mode()
    tokens: dict = {}
    spec_of: dict = {}
    work = list(work)
    for spec, n in work:
        fam = family_of(spec)
        if fam is None:
            continue
        tokens[fam] = tokens.get(fam, 0) + int(n)
        spec_of.setdefault(fam, spec)
    out = {}
    for fam, n in tokens.items():
        if m != "auto":
            interp = m == "interpret"
        elif _decided.get(fam) == "compiled":
            interp = False
        else:
            total = _interp_tokens.get(fam, 0) + n
            interp = total <= INTERPRET_MAX_TOKENS and not is_warm(spec_of[fam])
        if interp:
            _interp_tokens[fam] = _interp_tokens.get(fam, 0) + n
            _prepaid[fam] = _prepaid.get(fam, 0) + n
            use_interpreted(fam)
        else:
            use_compiled(fam)
        _decided[fam] = out[fam] = "interpreted" if interp else "compiled"
    return out


def before_replay(spec, tokens: int) -> str | None:
    """Called by :func:`radixkv.replay.run.run_replay` before each replay of *tokens*
    tokens: plans the family if no plan covers it yet, and switches an interpreted
    family to compiled once its unplanned interpreted work exceeds the budget.

    Returns ``"compiled"``, ``"interpreted"`` or None (a policy without a family).
    """
    fam = family_of(spec)
    if fam is None:
        return None
    if fam not in _decided:
        plan([(spec, tokens)])
    if _decided[fam] == "interpreted" and mode() == "auto":
        paid = min(_prepaid.get(fam, 0), tokens)
        _prepaid[fam] = _prepaid.get(fam, 0) - paid
        if tokens > paid:
            _interp_tokens[fam] = _interp_tokens.get(fam, 0) + tokens - paid
            if _interp_tokens[fam] > INTERPRET_MAX_TOKENS:
                use_compiled(fam)
                _decided[fam] = "compiled"
    return _decided[fam]


def mark_compiled(spec) -> None:
    """Record that *spec*'s family is compiled from now on (an explicit warm-up)."""
    fam = family_of(spec)
    if fam is not None and mode() != "interpret":
        use_compiled(fam)
        _decided[fam] = "compiled"


def trace_tokens(trace, limit=None) -> int:
    """Prompt + output tokens of the first *limit* requests of *trace* (all when None)."""
    k = len(trace) if limit is None else min(len(trace), max(0, int(limit)))
    return int(trace.prompt_len[:k].sum() + trace.output_len[:k].sum())
