"""What a plan is asked: the SLO, the GPUs and their prices, the search space and budget.

A :class:`PlanSpec` comes from the command line (:func:`radixkv.cli.plan_cmd`) or from a
TOML file (:func:`load_spec`), whose keys are the flags' destinations::

    trace = "traces/demo.jsonl"          # relative to the TOML file
    model = "Llama-3.1-8B"
    slo = "ttft_p99=2s,tpot_p99=50ms"    # or a table: [slo] ttft_p99 = "2s"
    gpus = ["H100-80GB", "A100-80GB"]
    price = {H100-80GB = 2.5, A100-80GB = 1.6}   # $/GPU-hour; absent: cost in GPU-hours
    engine = "vllm"                      # vllm | sglang | both
    rate_scale = 1.0
    budget = 40                          # most replays
    executor = "local"                   # local | processes | dask

SLO terms are ``ttft_p50``, ``ttft_p99``, ``tpot_p50``, ``tpot_p99`` (the concurrent
replay's TTFT and TPOT percentiles, :meth:`radixkv.replay.concurrent.ConcurrentResult.summary`),
each with a unit: ``s`` or ``ms`` (a bare number is refused: "50" could be either).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from radixkv.errors import ConfigError

#: SLO term -> the concurrent replay's summary key it bounds
SLO_TERMS = {"ttft_p50": "ttft_p50_s", "ttft_p99": "ttft_p99_s", "tpot_p50": "tpot_p50_s", "tpot_p99": "tpot_p99_s"}
_UNITS = {"s": 1.0, "ms": 1e-3}
ENGINES = ("vllm", "sglang")
#: GPUs searched when none are given
DEFAULT_GPUS = ("H100-80GB", "A100-80GB")
#: tensor-parallel degrees searched
DEFAULT_TPS = (1, 2, 4, 8)
#: the fewest replays a plan may spend: the recommendation and its prefix-caching toggle
#: (the verdict's reserve); with 1 the verdict could never be replayed
MIN_BUDGET = 2
#: cost models a plan can price its steps with: the roofline of :mod:`radixkv.cost`, and,
#: in a tree that has :mod:`radixkv.clock`, its calibrated kinds (and a profile file's path)
COST_MODELS = ("roofline", "fitted", "profiled")


def cost_models_available() -> tuple:
    """The cost-model kinds this tree can replay with (``roofline`` always; the calibrated
    kinds of ``radixkv.clock`` when that package is present)."""
    try:
        import radixkv.clock  # noqa: F401
    except ImportError:
        return COST_MODELS[:1]
    return COST_MODELS


def parse_slo(text: str, *, where: str | None = None) -> dict:
    """``"ttft_p99=2s,tpot_p99=50ms"`` → ``{"ttft_p99": 2.0, "tpot_p99": 0.05}`` (seconds).

    Raises
    ------
    radixkv.errors.ConfigError
        An unknown term, a missing or unknown unit, a value ≤ 0, a term given twice, or
        no term at all (field ``slo``).
    """
    out: dict = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        term, sep, value = part.partition("=")
        term = term.strip().lower()
        if not sep:
            raise ConfigError(f"SLO term {part!r}: expected TERM=VALUE, e.g. ttft_p99=2s", path=where, field="slo")
        if term not in SLO_TERMS:
            raise ConfigError(f"unknown SLO term {term!r}; known: {', '.join(SLO_TERMS)}", path=where, field="slo")
        if term in out:
            raise ConfigError(f"SLO term {term!r} given twice", path=where, field="slo")
        m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)\s*", value)
        if not m:
            raise ConfigError(f"SLO {term}={value.strip()!r}: expected a number with a unit, s or ms (e.g. 2s, "
                              f"50ms)", path=where, field="slo")
        v = float(m.group(1)) * _UNITS[m.group(2)]
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"SLO {term} must be > 0, got {value.strip()!r}", path=where, field="slo")
        out[term] = v
    if not out:
        raise ConfigError("empty SLO: give at least one of " + ", ".join(SLO_TERMS), path=where, field="slo")
    return out


def format_seconds(v: float) -> str:
    """``0.05`` → ``"50ms"``, ``2.0`` → ``"2s"`` (the SLO's own spelling)."""
    return f"{v * 1e3:g}ms" if v < 1 else f"{v:g}s"


def format_slo(slo: dict) -> str:
    """The SLO as ``parse_slo`` reads it, terms in :data:`SLO_TERMS` order."""
    return ",".join(f"{t}={format_seconds(slo[t])}" for t in SLO_TERMS if t in slo)


def parse_prices(text, *, where: str | None = None) -> dict:
    """``"H100-80GB=2.5,A100-80GB=1.6"`` (or a dict) → ``{GPU name: $ per GPU-hour}``.

    GPU names are resolved by :func:`radixkv.memory.get_gpu` (case-insensitive presets).

    Raises
    ------
    radixkv.errors.ConfigError
        A malformed entry or a price ≤ 0 (field ``price``).
    radixkv.errors.InputError
        An unknown GPU.
    """
    from radixkv.memory import get_gpu

    if text is None:
        return {}
    items = text.items() if isinstance(text, dict) else (p.partition("=")[::2] for p in str(text).split(",") if p.strip())
    out = {}
    for name, value in items:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"price {name}={value!r}: expected GPU=DOLLARS_PER_HOUR", path=where,
                              field="price") from None
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"price of {name} must be > 0, got {value!r}", path=where, field="price")
        out[get_gpu(str(name).strip()).name] = v
    return out


@dataclass
class PlanSpec:
    """The question a plan answers.

    Attributes
    ----------
    trace : str
        Trace file (any format ``radixkv`` reads).
    model : str
        Model preset or path to a Hugging Face ``config.json``.
    slo : dict
        SLO term → bound in seconds (:func:`parse_slo`).
    gpus : tuple of str
        GPU presets searched (:data:`DEFAULT_GPUS`).
    prices : dict
        GPU → $ per GPU-hour; empty: cost is GPU-hours per hour of traffic.
    engines : tuple of str
        ``("vllm",)``, ``("sglang",)`` or both.
    rate_scale : float
        Multiple of the trace's recorded rate (arrival times divided by it).
    budget : int
        Most points replayed (the search stops refining when it is spent); at least
        :data:`MIN_BUDGET` (2), else ConfigError.
    executor, workers, scheduler :
        Where the replays run (:func:`radixkv.sweep.run_sweep`'s).
    tps : tuple of int
        Tensor-parallel degrees searched.
    kv_cache_dtypes : tuple
        KV dtypes searched (None = the model's dtype; ``"fp8"``).
    max_replicas : int
        Most replicas of one configuration.
    cost_model : str
        The step-time model (:func:`cost_models_available`): every replay of the plan runs
        with ``--cost-model`` set to it (the roofline leaves the flag at its default).
    work_dir : str or None
        Sweep results store of the replays (resumable); None: a temporary folder.
    """

    trace: str
    model: str
    slo: dict
    gpus: tuple = DEFAULT_GPUS
    prices: dict = field(default_factory=dict)
    engines: tuple = ("vllm",)
    rate_scale: float = 1.0
    budget: int = 40
    executor: str = "local"
    workers: int | None = None
    scheduler: str | None = None
    tps: tuple = DEFAULT_TPS
    kv_cache_dtypes: tuple = (None,)
    max_replicas: int = 64
    cost_model: str = "roofline"
    work_dir: str | None = None

    def __post_init__(self):
        from radixkv.memory import get_gpu, get_model

        get_model(self.model)  # an unknown model is an InputError here, before any work
        from radixkv.errors import InputError

        gpus = []
        for g in self.gpus:
            try:
                gpus.append(get_gpu(g).name)
            except InputError as e:  # the flag's name, not the preset lookup's field
                raise ConfigError(f"--gpus: {e.reason}", field="gpus") from None
        self.gpus = tuple(gpus)
        if not self.gpus:
            raise ConfigError("no GPU to search: give --gpus", field="gpus")
        missing = [g for g in self.gpus if self.prices and g not in self.prices]
        if missing:
            raise ConfigError(f"--price names no price for {', '.join(missing)}: price every GPU searched or none",
                              field="price")
        for e in self.engines:
            if e not in ENGINES:
                raise ConfigError(f"unknown engine {e!r}; one of vllm, sglang, both", field="engine")
        if not (self.rate_scale > 0 and math.isfinite(self.rate_scale)):
            raise ConfigError(f"--rate-scale must be > 0, got {self.rate_scale}", field="rate_scale")
        bad_tp = [t for t in self.tps if isinstance(t, bool) or not isinstance(t, int) or t < 1]
        if bad_tp or not self.tps:
            raise ConfigError(f"--tp must be whole numbers ≥ 1, got {', '.join(map(str, self.tps)) or 'none'}",
                              field="tp")
        if self.budget < MIN_BUDGET:
            raise ConfigError(f"--budget must be ≥ {MIN_BUDGET} replays (one for the recommendation, one for the "
                              f"prefix-caching verdict's other setting), got {self.budget}", field="budget")
        if self.max_replicas < 1:
            raise ConfigError(f"--max-replicas must be ≥ 1, got {self.max_replicas}", field="max_replicas")
        avail = cost_models_available()
        if self.cost_model not in avail and not (len(avail) > 1 and Path(self.cost_model).is_file()):
            raise ConfigError(f"cost model {self.cost_model!r} is not available in this tree; available: "
                              f"{', '.join(avail)}", field="cost_model")

    def price(self, gpu: str) -> float:
        """$ per GPU-hour of *gpu*, or 1.0 when the cost is counted in GPU-hours."""
        return self.prices.get(gpu, 1.0) if self.prices else 1.0

    @property
    def cost_unit(self) -> str:
        """``"$/h"`` with prices, else ``"GPU-h/h"`` (GPU-hours per hour of traffic)."""
        return "$/h" if self.prices else "GPU-h/h"


def parse_engines(text: str) -> tuple:
    """``vllm`` | ``sglang`` | ``both`` → a tuple of engines."""
    t = str(text).strip().lower()
    return ENGINES if t == "both" else (t,)


def load_spec(path, **overrides) -> PlanSpec:
    """A :class:`PlanSpec` from a TOML file (module docstring); *overrides* (keyword =
    value, e.g. from the command line) win over the file's keys.

    Raises
    ------
    radixkv.errors.ConfigError
        An unreadable file, bad TOML, an unknown key or a bad value (naming the file and key).
    """
    from radixkv.util import tomllib

    path = Path(path)
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError("no such plan spec file", path=where) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"not valid TOML ({e})", path=where) from None
    known = {"trace", "model", "slo", "gpus", "price", "engine", "rate_scale", "budget", "executor", "workers",
             "tps", "kv_cache_dtypes", "max_replicas", "cost_model", "work_dir"}
    for k in raw:
        if k not in known:
            raise ConfigError(f"unknown key {k!r}; known: {', '.join(sorted(known))}", path=where, field=k)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    for k in ("trace", "model", "slo"):
        if k not in raw:
            raise ConfigError(f"missing key {k!r}", path=where, field=k)
    trace = Path(str(raw["trace"]))
    if not trace.is_absolute() and "trace" not in overrides:
        trace = path.parent / trace
    slo = raw["slo"]
    if isinstance(slo, dict):
        slo = ",".join(f"{k}={v}" for k, v in slo.items())
    kw = {}
    for k, conv in (("rate_scale", float), ("budget", int), ("workers", int), ("max_replicas", int)):
        if k in raw:
            v = raw[k]
            if conv is int and (isinstance(v, bool) or not isinstance(v, int)):
                # TOML integers only: 2.7 is not truncated, "3" not read as a number
                raise ConfigError(f"key {k!r}: expected a whole number, got {v!r}", path=where, field=k)
            try:
                kw[k] = conv(v)
            except (TypeError, ValueError):
                raise ConfigError(f"key {k!r}: bad value {raw[k]!r}", path=where, field=k) from None
    for k in ("executor", "cost_model", "work_dir"):
        if k in raw:
            kw[k] = str(raw[k])
    if "gpus" in raw:
        kw["gpus"] = tuple(raw["gpus"]) if isinstance(raw["gpus"], list) else tuple(str(raw["gpus"]).split(","))
    if "tps" in raw:
        tps = raw["tps"] if isinstance(raw["tps"], list) else [raw["tps"]]
        if any(isinstance(t, bool) or not isinstance(t, int) for t in tps):
            raise ConfigError(f"key 'tps': expected whole numbers, got {raw['tps']!r}", path=where, field="tps")
        kw["tps"] = tuple(tps)
    if "kv_cache_dtypes" in raw:
        kw["kv_cache_dtypes"] = tuple(None if str(d) in ("auto", "") else str(d) for d in raw["kv_cache_dtypes"])
    return PlanSpec(trace=str(trace), model=str(raw["model"]), slo=parse_slo(slo, where=where),
                    prices=parse_prices(raw.get("price"), where=where),
                    engines=parse_engines(raw.get("engine", "vllm")), **kw)
