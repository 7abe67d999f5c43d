"""Replays: sequential (:mod:`.sequential`), concurrent (:mod:`.concurrent`), one replay
end to end (:mod:`.run`), capacity curves (:mod:`.curve`).

The package is also callable: ``radixkv.replay(trace, policy, ...)`` is
:func:`radixkv.api.replay` (both replay modes behind one call), so that the public API
name and the subpackage name agree.
"""
import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        from radixkv.api import replay

        return replay(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
