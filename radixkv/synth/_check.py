"""Parameter checks shared by the scenario modules."""
from __future__ import annotations

import dataclasses
import math

from radixkv.errors import InputError
from radixkv.synth.distributions import IntDist, TimeDist


def require(cond: bool, message: str, field: str) -> None:
    """Raise :class:`InputError` naming *field* unless *cond*."""
    if not cond:
        raise InputError(message, field=field)


def check_params(p) -> None:
    """Check every field of a scenario's parameter dataclass against its declared type.

    ``int`` fields must be integers ≥ 0 (≥ 1 for counts named ``n_…``); ``float`` fields
    finite numbers ≥ 0; ``IntDist`` / ``TimeDist`` fields instances of those families.
    """
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if t == "int":
            lo = 1 if f.name.startswith("n_") else 0
            require(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{f.name} must be an integer ≥ {lo}, got {v!r}", f.name)
        elif t == "float":
            require(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0, f"{f.name} must be a number ≥ 0, got {v!r}", f.name)
        elif t == "IntDist":
            require(isinstance(v, IntDist), f"{f.name} must be a length distribution (e.g. uniform:LO,HI), got {v!r}", f.name)
        elif t == "TimeDist":
            require(isinstance(v, TimeDist), f"{f.name} must be a time distribution (e.g. lognormal_s:MEDIAN,SIGMA), got {v!r}", f.name)
