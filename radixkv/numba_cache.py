"""The ``RADIXKV_JIT`` setting, and whether Numba's cache already holds a kernel.

Shared by the replay (:mod:`radixkv.replay.jit`, which runs small replays' kernels
interpreted on a cold cache) and the trace readers (which skip a Numba fast path whose
compile would cost more than it saves). No radixkv dependencies beyond the errors.
"""
from __future__ import annotations

import os

from radixkv.errors import ConfigError

MODES = ("auto", "compile", "interpret")


def mode() -> str:
    """The ``RADIXKV_JIT`` setting: ``auto`` (default), ``compile`` or ``interpret``.

    Raises
    ------
    radixkv.errors.ConfigError
        For any other value.
    """
    m = os.environ.get("RADIXKV_JIT", "auto").strip().lower() or "auto"
    if m not in MODES:
        raise ConfigError(f"RADIXKV_JIT={m!r}; known: {', '.join(MODES)}", field="RADIXKV_JIT")
    return m


class ColdCache(Exception):
    """Raised inside :func:`without_compiling` when Numba starts compiling."""


def without_compiling(fn, *args, **kwargs):
    """Call ``fn(*args, **kwargs)`` but stop, raising :class:`ColdCache`, at the first
    Numba compile it would start: kernels already loaded or in Numba's on-disk cache
    (``NUMBA_CACHE_DIR``) run; a kernel that would compile ends the call (nothing is
    left half-compiled)."""
    from numba.core import event

    class _Stop(event.Listener):
        def on_start(self, ev):
            raise ColdCache()

        def on_end(self, ev):
            pass

    listener = _Stop()
    event.register("numba:compile", listener)
    try:
        return fn(*args, **kwargs)
    finally:
        event.unregister("numba:compile", listener)


def is_cached(fn, *args) -> bool:
    """True when calling the Numba kernel *fn* on *args* needs no compile (then it is loaded)."""
    try:
        without_compiling(fn, *args)
    except ColdCache:
        return False
    return True
