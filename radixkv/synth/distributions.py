"""Named distributions for synthetic workloads: lengths (tokens), counts and times (s).

Every scenario parameter that varies is one of the classes below, so a parameter's
distribution is stated by its value, e.g. ``LogNormalInt(median=200, sigma=0.7, lo=10,
hi=1500)``, and can be given on the command line as text (:func:`parse_dist`):

=====================================  =================================================
text                                   distribution
=====================================  =================================================
``uniform:LO,HI``                      :class:`UniformInt`, integers LO..HI, equal weight
``loguniform:LO,HI``                   :class:`LogUniformInt`, ``floor(exp(U(ln LO, ln(HI+1))))``
``lognormal:MEDIAN,SIGMA,LO,HI``       :class:`LogNormalInt`, ``round(MEDIAN·e^(SIGMA·Z))`` clipped
``const:V``                            :class:`UniformInt` with LO = HI = V
``lognormal_s:MEDIAN,SIGMA``           :class:`LogNormalTime`, seconds, ``MEDIAN·e^(SIGMA·Z)``
``exponential_s:MEAN``                 :class:`ExponentialTime`, seconds
=====================================  =================================================

Z is a standard normal variate. Integer distributions have an exact probability mass
function over ``LO..HI`` (:meth:`IntDist.pmf`) so their mean is exact, which the arrival
model needs (the session rate is the request rate divided by the mean turn count).

Zipf popularity (:func:`zipf_pmf`) is the finite form P(rank r) ∝ r^(−s), r = 1..n, as in
Breslau et al., "Web caching and Zipf-like distributions", INFOCOM 1999.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from radixkv.errors import InputError


#: largest value an integer distribution may take (tokens or counts): a longer prompt
#: than any model serves, and small enough that ``pmf`` (O(hi − lo)) stays in memory
MAX_VALUE = 10_000_000


class IntDist:
    """A distribution of non-negative integers over ``lo..hi`` (tokens or counts)."""

    lo: int
    hi: int

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw *size* values; int64 array of shape (size,)."""
        raise NotImplementedError

    def draw(self, rng: np.random.Generator) -> int:
        """Draw one value (a Python int); the same value as ``sample(rng, 1)[0]``."""
        raise NotImplementedError

    def pmf(self) -> np.ndarray:
        """Probabilities of ``lo, lo+1, …, hi``; float64, shape (hi − lo + 1,), sums to 1."""
        raise NotImplementedError

    def mean(self) -> float:
        """Exact mean, from :meth:`pmf`."""
        k = np.arange(self.lo, self.hi + 1, dtype=np.float64)
        return float(np.dot(k, self.pmf()))

    def _check(self) -> None:
        if not (0 <= self.lo <= self.hi):
            raise InputError(f"{self}: need 0 ≤ lo ≤ hi", field="distribution")
        if self.hi > MAX_VALUE:
            raise InputError(f"{self}: values above {MAX_VALUE:,} (tokens or counts) are not supported",
                             field="distribution")


@dataclass(frozen=True)
class UniformInt(IntDist):
    """Integers ``lo..hi`` with equal probability (``const:V`` is ``lo == hi == V``)."""

    lo: int
    hi: int

    def __post_init__(self):
        self._check()

    def sample(self, rng, size):
        return rng.integers(self.lo, self.hi + 1, size=size, dtype=np.int64)

    def draw(self, rng):
        return int(rng.integers(self.lo, self.hi + 1, dtype=np.int64))

    def pmf(self):
        n = self.hi - self.lo + 1
        return np.full(n, 1.0 / n)

    def __str__(self):
        return f"const:{self.lo}" if self.lo == self.hi else f"uniform:{self.lo},{self.hi}"


@dataclass(frozen=True)
class LogUniformInt(IntDist):
    """``floor(exp(X))`` with X uniform on ``[ln lo, ln(hi+1))``: every octave equally likely.

    P(k) = ln((k+1)/k) / ln((hi+1)/lo) for k in lo..hi; needs lo ≥ 1.
    """

    lo: int
    hi: int

    def __post_init__(self):
        self._check()
        if self.lo < 1:
            raise InputError(f"{self}: loguniform needs lo ≥ 1", field="distribution")

    def sample(self, rng, size):
        x = rng.uniform(math.log(self.lo), math.log(self.hi + 1), size=size)
        return np.clip(np.floor(np.exp(x)).astype(np.int64), self.lo, self.hi)

    def draw(self, rng):
        x = rng.uniform(math.log(self.lo), math.log(self.hi + 1))
        return min(max(math.floor(math.exp(x)), self.lo), self.hi)

    def pmf(self):
        k = np.arange(self.lo, self.hi + 1, dtype=np.float64)
        return np.log((k + 1) / k) / math.log((self.hi + 1) / self.lo)

    def __str__(self):
        return f"loguniform:{self.lo},{self.hi}"


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(np.asarray(z, dtype=np.float64) / math.sqrt(2.0)))


@dataclass(frozen=True)
class LogNormalInt(IntDist):
    """``round(median · exp(sigma · Z))`` clipped to ``lo..hi`` (the clipped mass sits at the ends)."""

    median: float
    sigma: float
    lo: int
    hi: int

    def __post_init__(self):
        self._check()
        if not (self.median > 0 and self.sigma >= 0):
            raise InputError(f"{self}: lognormal needs median > 0 and sigma ≥ 0", field="distribution")

    def sample(self, rng, size):
        x = self.median * np.exp(self.sigma * rng.standard_normal(size))
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)

    def draw(self, rng):
        x = self.median * math.exp(self.sigma * rng.standard_normal())
        return int(min(max(round(x), self.lo), self.hi))  # round(): half to even, as np.rint

    def pmf(self):
        k = np.arange(self.lo, self.hi + 1, dtype=np.float64)
        if self.sigma == 0:
            p = np.zeros(k.size)
            p[int(np.clip(round(self.median), self.lo, self.hi)) - self.lo] = 1.0
            return p
        # value k is drawn when median·e^(σZ) rounds to k (ties to even ignored: measure 0)
        upper = np.where(k == self.hi, np.inf, k + 0.5)
        lower = np.where(k == self.lo, 0.0, k - 0.5)
        with np.errstate(divide="ignore"):
            zu = np.where(np.isinf(upper), np.inf, np.log(upper / self.median) / self.sigma)
            zl = np.where(lower <= 0, -np.inf, np.log(np.maximum(lower, 1e-300) / self.median) / self.sigma)
        return _norm_cdf(zu) - _norm_cdf(zl)

    def __str__(self):
        return f"lognormal:{self.median:g},{self.sigma:g},{self.lo},{self.hi}"


class TimeDist:
    """A distribution of positive durations in seconds."""

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        """Draw values (float64 seconds) of the given shape."""
        raise NotImplementedError

    def mean(self) -> float:
        raise NotImplementedError


@dataclass(frozen=True)
class LogNormalTime(TimeDist):
    """``median_s · exp(sigma · Z)`` seconds; mean ``median_s · exp(sigma²/2)``."""

    median_s: float
    sigma: float

    def __post_init__(self):
        if not (self.median_s > 0 and self.sigma >= 0):
            raise InputError(f"{self}: needs median_s > 0 and sigma ≥ 0", field="distribution")

    def sample(self, rng, size):
        return self.median_s * np.exp(self.sigma * rng.standard_normal(size))

    def mean(self):
        return self.median_s * math.exp(self.sigma**2 / 2)

    def __str__(self):
        return f"lognormal_s:{self.median_s:g},{self.sigma:g}"


@dataclass(frozen=True)
class ExponentialTime(TimeDist):
    """Exponential durations with mean ``mean_s`` seconds."""

    mean_s: float

    def __post_init__(self):
        if not self.mean_s > 0:
            raise InputError(f"{self}: needs mean_s > 0", field="distribution")

    def sample(self, rng, size):
        return rng.exponential(self.mean_s, size)

    def mean(self):
        return self.mean_s

    def __str__(self):
        return f"exponential_s:{self.mean_s:g}"


_INT_KINDS = {"uniform": (UniformInt, 2), "loguniform": (LogUniformInt, 2), "lognormal": (LogNormalInt, 4), "const": (None, 1)}
_TIME_KINDS = {"lognormal_s": (LogNormalTime, 2), "exponential_s": (ExponentialTime, 1)}


def parse_dist(text: str, kind: type, *, field: str | None = None):
    """Parse ``NAME:ARGS`` (see the module table) into an :class:`IntDist` or :class:`TimeDist`.

    Parameters
    ----------
    text : str
        E.g. ``"uniform:2,10"``, ``"lognormal_s:25,0.8"``.
    kind : type
        :class:`IntDist` or :class:`TimeDist`: which family the parameter takes.
    field : str, optional
        Parameter name, for the error message.

    Raises
    ------
    radixkv.errors.InputError
        Unknown name, wrong number of arguments, or a non-numeric argument.
    """
    kinds = _INT_KINDS if kind is IntDist else _TIME_KINDS
    name, _, args = text.partition(":")
    if name not in kinds:
        raise InputError(f"unknown distribution {name!r} in {text!r}; expected one of {sorted(kinds)}", field=field)
    cls, nargs = kinds[name]
    parts = [a for a in args.split(",") if a.strip()] if args else []
    if len(parts) != nargs:
        raise InputError(f"{name} takes {nargs} argument(s), got {text!r}", field=field)
    try:
        vals = [float(a) for a in parts]
    except ValueError:
        raise InputError(f"non-numeric argument in {text!r}", field=field) from None
    try:
        if kind is IntDist:
            if any(v != int(v) for v in vals[-2:] if name == "lognormal") or (
                name != "lognormal" and any(v != int(v) for v in vals)
            ):
                raise InputError(f"{name} bounds must be integers, got {text!r}", field=field)
            if name == "const":
                return UniformInt(int(vals[0]), int(vals[0]))
            if name == "lognormal":
                return LogNormalInt(vals[0], vals[1], int(vals[2]), int(vals[3]))
            return cls(*map(int, vals))
        return cls(*vals)
    except InputError as e:
        raise InputError(e.reason, field=field) from None


def zipf_pmf(n: int, s: float) -> np.ndarray:
    """Finite Zipf popularity: P(rank r) = r^(−s) / Σ_{j=1..n} j^(−s), r = 1..n.

    Returns float64, shape (n,); index 0 is rank 1 (the most popular item). ``s = 0`` is
    uniform. Source: Breslau et al., INFOCOM 1999 ("Zipf-like", exponent ≤ 1 for web
    requests); any s ≥ 0 is allowed because n is finite.
    """
    if n < 1 or s < 0:
        raise InputError(f"zipf needs n ≥ 1 and s ≥ 0, got n={n}, s={s}", field="zipf_s")
    w = np.arange(1, n + 1, dtype=np.float64) ** (-float(s))
    return w / w.sum()
