"""The one registry of policies: parse ``--policy``/``--policies`` specs, build a policy.

A policy is known by its class. Each :class:`~radixkv.policies.base.PrefixCache`
subclass declares, as class attributes, its ``name`` (and ``aliases``), what its size is
(``size_name``: ``block_size``, ``page_size``, the trace's ``unit_tokens``, or none) and
``default_size``, its ``admission_rule`` in the concurrent replay (``"vllm"`` or
``"sglang"``), the ``engine`` whose memory rule and pool knob size it, its
``kernel_family`` (warm-up) and an optional ``@option`` (``option_name``). The CLI, the
concurrent scheduler and warm-up read these attributes; no code checks a policy's name.

Where policies come from, in lookup order:

1. the built-ins:

   =========== ======================================================= ====================
   name        class                                                   size (default)
   =========== ======================================================= ====================
   ``vllm``    :class:`~radixkv.policies.block_hash.BlockHashCache`     ``block_size`` (16)
   ``sglang``  :class:`~radixkv.policies.radix.RadixCache`              ``page_size`` (1)
   ``unit-lru``:class:`~radixkv.policies.unit_lru.UnitLRUCache`         the trace's unit
   ``none``    :class:`~radixkv.policies.no_cache.NoCache`              ``block_size`` (1)
   ``static``  :class:`~radixkv.policies.static_reserved.StaticReservedCache` ``block_size`` (16)
   ``sglang-hicache`` :class:`~radixkv.policies.hicache.HiCacheRadixCache` ``page_size`` (1)
   ``vllm-offload`` :class:`~radixkv.policies.vllm_offload.OffloadBlockHashCache` ``block_size`` (16)
   =========== ======================================================= ====================

   ``static`` takes the reserved share of the pool after ``@`` (``static:16@0.3``);
   ``sglang`` takes SGLang's eviction policy (``--radix-eviction-policy``):
   ``sglang:1@lfu`` — ``lru`` (default, the built-in kernels), ``lfu``, ``fifo``,
   ``mru``, ``filo``, ``priority``, ``slru``, ``tlru``, built as
   :class:`~radixkv.policies.radix_priority.PriorityRadixCache`; ``vllm`` takes ``@lru``
   (the built-in free queue) or ``@lfu``
   (:class:`~radixkv.policies.block_priority.PriorityBlockHashCache`). A class decides
   what its option builds (``class_for_option``); those two eviction options are decided
   by :mod:`radixkv.policies.eviction` (:func:`option_class`);
2. classes registered in this process with :func:`register_policy`;
3. the entry-point group ``radixkv.policies`` of installed packages: in a package's
   ``pyproject.toml``::

       [project.entry-points."radixkv.policies"]
       lfu = "mypkg.lfu:LFUCache"

   makes ``--policy lfu:16`` work (the entry point's name is the policy's name);
4. ``package.module:Class[:SIZE][@OPTION]`` — any importable subclass of
   ``PrefixCache``, named in reports by its class attribute ``name`` when the class sets
   one, else by ``package.module:Class``.

A pool is given in one of three ways (:class:`PoolSpec`): usable tokens
(``capacity_tokens``, passed to the class's ``from_capacity_tokens``), or in an engine's
own terms (``num_gpu_blocks`` for vLLM — block 0 is the null block, so one fewer is
usable; ``max_total_num_tokens`` for SGLang), which a class takes natively through
``from_engine_pool`` or else as usable tokens (``(num_gpu_blocks − 1) × 16`` tokens;
``max_total_num_tokens`` tokens).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from radixkv.errors import ConfigError
import radixkv.policies.eviction as eviction
from radixkv.policies.base import PrefixCache

#: entry-point group outside packages register policy classes under
ENTRY_POINT_GROUP = "radixkv.policies"

_BUILTIN_PATHS = (
    "radixkv.policies.block_hash:BlockHashCache",
    "radixkv.policies.radix:RadixCache",
    "radixkv.policies.unit_lru:UnitLRUCache",
    "radixkv.policies.no_cache:NoCache",
    "radixkv.policies.static_reserved:StaticReservedCache",
    "radixkv.policies.hicache:HiCacheRadixCache",
    "radixkv.policies.vllm_hybrid:HybridBlockHashCache",
    "radixkv.policies.sglang_swa:SGLangSWACache",
    "radixkv.policies.sglang_mamba:SGLangMambaCache",
    "radixkv.policies.vllm_offload:OffloadBlockHashCache",
)
_REGISTERED: dict[str, type] = {}  # register_policy, in this process


def _import_class(path: str, what: str) -> type:
    """``package.module:Class`` → the class; ConfigError naming *what* when it fails."""
    mod_name, _, qual = path.partition(":")
    try:
        obj = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's input error
        raise ConfigError(f"{what}: cannot import module {mod_name!r}: {type(e).__name__}: {e}", field="policy") from None
    for part in qual.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{what}: module {mod_name!r} has no {qual!r}", field="policy") from None
    if not (isinstance(obj, type) and issubclass(obj, PrefixCache)):
        raise ConfigError(f"{what}: {path} is not a subclass of radixkv.policies.base.PrefixCache", field="policy")
    check_complete(obj, what)
    return obj


def check_complete(cls: type, what: str = "policy") -> None:
    """Refuse a policy class that leaves an abstract method of
    :class:`~radixkv.policies.base.PrefixCache` unimplemented (Python would raise a
    ``TypeError`` only when it is built, after the trace is read and kernels compiled).

    Raises
    ------
    ConfigError
        Naming the class and every missing method.
    """
    missing = sorted(getattr(cls, "__abstractmethods__", ()) or ())
    if missing:
        raise ConfigError(f"{what}: class {cls.__module__}.{cls.__qualname__} does not implement "
                          f"{', '.join(m + '()' for m in missing)} (abstract in radixkv.policies.base.PrefixCache; "
                          f"docs: README.md, Adding a policy)", field="policy")


def builtin_policies() -> dict[str, type]:
    """The built-in policy classes by name (aliases not included)."""
    out = {}
    for path in _BUILTIN_PATHS:
        cls = _import_class(path, "built-in policy")
        out[cls.name] = cls
    return out


def register_policy(cls: type, name: str | None = None) -> type:
    """Register *cls* under *name* (default ``cls.name``) in this process; returns *cls*
    (usable as a class decorator).

    Raises
    ------
    TypeError
        When *cls* is not a :class:`PrefixCache` subclass.
    """
    if not (isinstance(cls, type) and issubclass(cls, PrefixCache)):
        raise TypeError(f"{cls!r} is not a subclass of PrefixCache")
    _REGISTERED[(name or cls.name).lower()] = cls
    return cls


def _entry_points() -> dict:
    from importlib.metadata import entry_points

    return {ep.name.lower(): ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_policies() -> list[str]:
    """Every policy name ``--policy`` accepts now: built-ins, registered, entry points."""
    names = list(builtin_policies())
    names += [n for n in _REGISTERED if n not in names]
    names += [n for n in _entry_points() if n not in names]
    return names


def lookup_policy(name: str) -> type | None:
    """The class registered under *name* (case-insensitive; aliases too), or None.

    Raises
    ------
    ConfigError
        When an entry point of that name fails to load.
    """
    key = name.strip().lower()
    for cls in builtin_policies().values():
        if key == cls.name or key in cls.aliases:
            return cls
    if key in _REGISTERED:
        return _REGISTERED[key]
    ep = _entry_points().get(key)
    if ep is None:
        return None
    return _import_class(ep.value.replace(" ", ""), f"policy {name!r} (entry point {ENTRY_POINT_GROUP}:{ep.name})")


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy spec.

    Attributes
    ----------
    name : str
        The name reports use (the registry name, or the class's ``name`` when loaded as
        ``module:Class``, else ``module:Class``).
    size : int or None
        Block or page size in tokens (None: the policy takes none, or it is the trace's).
    option : object or None
        The ``@option`` value, passed as the class's ``option_name`` keyword.
    cls : type
        The :class:`PrefixCache` subclass.
    ref : str
        How to find the class again (the registry name or ``module:Class``); used by
        warm-up child processes.
    """

    name: str
    size: int | None
    option: object = None
    cls: type = field(default=None, compare=True)
    ref: str = field(default="", compare=False)

    def __post_init__(self):
        if self.cls is None:
            cls = lookup_policy(self.name)
            if cls is None:
                raise ConfigError(f"unknown policy {self.name!r}; known: {', '.join(available_policies())}",
                                  field="policy")
            object.__setattr__(self, "cls", cls)
        if not self.ref:
            object.__setattr__(self, "ref", self.name)

    @property
    def build_class(self) -> type:
        """The class :func:`build_policy` builds (the option may pick a subclass)."""
        return option_class(self.cls, self.option)[0] if self.cls.option_name else self.cls

    @property
    def label(self) -> str:
        s = self.name if self.size is None else f"{self.name}:{self.size}"
        return s if self.option is None else f"{s}@{self.cls.format_option(self.option)}"

    @property
    def ref_text(self) -> str:
        """A spec text that :func:`parse_policy` turns back into this spec."""
        s = self.ref if self.size is None else f"{self.ref}:{self.size}"
        return s if self.option is None else f"{s}@{self.cls.format_option(self.option)}"


@dataclass(frozen=True)
class PoolSpec:
    """How big the pool is: exactly one field should be set.

    Attributes
    ----------
    capacity_tokens : int or None
        Usable tokens, for any policy.
    num_gpu_blocks : int or None
        vLLM's ``num_gpu_blocks`` (block 0 reserved).
    max_total_num_tokens : int or None
        SGLang's ``max_total_num_tokens`` (all usable).
    """

    capacity_tokens: int | None = None
    num_gpu_blocks: int | None = None
    max_total_num_tokens: int | None = None

    def usable_tokens(self) -> int | None:
        """Usable tokens for a policy that does not take the engine's terms natively:
        ``capacity_tokens``, else ``max_total_num_tokens``, else
        ``(num_gpu_blocks − 1) × 16`` (vLLM's default block size; block 0 is the null
        block); None when nothing is set."""
        if self.capacity_tokens is not None:
            return int(self.capacity_tokens)
        if self.max_total_num_tokens is not None:
            return int(self.max_total_num_tokens)
        if self.num_gpu_blocks is not None:
            return (int(self.num_gpu_blocks) - 1) * 16
        return None


def option_class(cls: type, value) -> tuple:
    """The class to build for policy class *cls* with ``@option`` *value* and the constructor
    keywords the option sets: :func:`radixkv.policies.eviction.class_for_option` (the
    eviction options of ``vllm`` and ``sglang``, which may build a priority subclass; any
    other class's own :meth:`~radixkv.policies.base.PrefixCache.class_for_option`).

    Raises
    ------
    ConfigError
        As the class's hook (an option it cannot build).
    """
    return eviction.class_for_option(cls, value)


def native_pool_knob(cls: type) -> str | None:
    """The engine pool knob a policy class takes in the engine's own terms
    (``num_gpu_blocks`` for a vLLM-engine class, ``max_total_num_tokens`` for an
    SGLang-engine class) when it overrides ``from_engine_pool``; None otherwise (the pool
    is then converted to usable tokens)."""
    if cls.from_engine_pool.__func__ is PrefixCache.from_engine_pool.__func__:
        return None
    return {"vllm": "num_gpu_blocks", "sglang": "max_total_num_tokens"}.get(cls.engine)


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


def parse_policy(text: str, *, block_size: int | None = None, page_size: int | None = None) -> PolicySpec:
    """Parse ``NAME[:SIZE][@OPTION]`` or ``package.module:Class[:SIZE][@OPTION]``.

    *block_size* / *page_size* (``--block-size`` / ``--page-size``) fill in a missing
    size of a policy whose ``size_name`` is that knob.

    Raises
    ------
    ConfigError
        For an unknown name, a class that cannot be imported, a size that is not a
        positive integer or disagrees with the flag, or an option the policy rejects.
    """
    body, at, opt = text.strip().partition("@")
    parts = [p.strip() for p in body.split(":")]
    cls = lookup_policy(parts[0]) if parts[0] else None
    if cls is not None:
        key = parts[0].lower()
        # a built-in's aliases map to its name; a registered or entry-point name is kept
        name = cls.name if key in (cls.name,) + tuple(cls.aliases) else key
        ref, rest = name, parts[1:]
    elif len(parts) >= 2 and parts[1].replace(".", "").isidentifier() and not _is_int(parts[1]):
        ref = f"{parts[0]}:{parts[1]}"
        cls = _import_class(ref, f"policy {text!r}")
        name = cls.__dict__.get("name") or ref
        rest = parts[2:]
    else:
        raise ConfigError(f"unknown policy {text!r}; known: {', '.join(available_policies())} "
                          f"(or package.module:Class)", field="policy")
    if len(rest) > 1:
        raise ConfigError(f"policy {text!r}: expected NAME[:SIZE][@OPTION]", field="policy")
    size = rest[0] if rest else ""
    option = None
    if at:
        option = eviction.parse_option(cls, opt.strip())
    elif cls.option_name is not None:
        option = cls.default_option
    for flag, v in (("--block-size", block_size), ("--page-size", page_size)):
        if v is not None and int(v) < 1:
            raise ConfigError(f"{flag} must be ≥ 1, got {v}", field=flag.lstrip("-").replace("-", "_"))
    given = {"block_size": block_size, "page_size": page_size}.get(cls.size_name)
    flag = f"--{str(cls.size_name).replace('_', '-')}"
    if size and given is not None and _is_int(size) and int(size) != int(given):
        raise ConfigError(f"policy {text!r} says size {size} but {flag} says {given}", field="policy")
    if size:
        if cls.size_name in (None, "unit_tokens"):
            why = "it caches whole trace units" if cls.size_name == "unit_tokens" else "it has no block or page size"
            raise ConfigError(f"{name} takes no size: {why}", field="policy")
        if not _is_int(size):
            raise ConfigError(f"policy {text!r}: size {size!r} is not an integer", field="policy")
        val = int(size)
        if val < 1:
            raise ConfigError(f"policy {text!r}: size must be ≥ 1", field="policy")
        return PolicySpec(name, val, option, cls, ref)
    if given is not None:
        return PolicySpec(name, int(given), option, cls, ref)
    if cls.size_name in (None, "unit_tokens"):
        return PolicySpec(name, None, option, cls, ref)
    return PolicySpec(name, cls.default_size, option, cls, ref)


#: largest pool radixkv models, in slots (every policy keeps a few words per slot)
MAX_POOL_SLOTS = 1 << 28


def build_policy(spec: PolicySpec, pool: PoolSpec, *, unit_tokens: int = 1, trace=None, **options) -> PrefixCache:
    """A fresh policy of *spec* on *pool* (see :func:`_build`); a pool too large for this
    machine's memory is a :class:`ConfigError`, not a crash.

    *trace*: the trace the policy will replay, in order (``rid`` = its index), handed to a
    class that reads it ahead (``needs_trace``, e.g. ``sglang:P@belady``) and to no other.
    Such a class without *trace* is a :class:`ConfigError`: the caller is a replay it
    does not support (the concurrent ones)."""
    if getattr(spec.build_class, "needs_trace", False):
        if trace is None:
            raise ConfigError(sequential_only_message(spec), field="policy")
        options = {**options, "trace": trace}
    for name in ("capacity_tokens", "num_gpu_blocks", "max_total_num_tokens"):
        v = getattr(pool, name)
        if v is not None and v // max(1, spec.size or 1) > MAX_POOL_SLOTS:
            raise ConfigError(f"{spec.label}: a pool of {v:,} ({name}) is more than the {MAX_POOL_SLOTS:,} slots "
                              f"radixkv models; pools that never evict need only the trace's distinct tokens", field=name)
    try:
        return _build(spec, pool, unit_tokens=unit_tokens, **options)
    except MemoryError:
        raise ConfigError(f"{spec.label}: not enough memory to model this pool; try a smaller one",
                          field="capacity") from None


def sequential_only_message(spec: PolicySpec) -> str:
    """Why *spec* (a class with ``needs_trace``) is refused outside the sequential replay."""
    return (f"--policy {spec.label} reads the whole trace ahead (an offline reference: it evicts by next use) and "
            "runs in the sequential replay only (replay, compare, curve without --mode concurrent or --replicas)")


def _build(spec: PolicySpec, pool: PoolSpec, *, unit_tokens: int = 1, **options) -> PrefixCache:
    """A fresh policy of *spec* on *pool*.

    The class's ``from_engine_pool`` gets the first try (a pool in vLLM's or SGLang's own
    terms); otherwise ``from_capacity_tokens(pool.usable_tokens(), size, **options)``.

    Parameters
    ----------
    spec : PolicySpec
    pool : PoolSpec
    unit_tokens : int
        The trace's U (the size of a policy whose ``size_name`` is ``"unit_tokens"``).
    **options
        Passed to the policy's constructor (e.g. ``verify=True``, ``chunked_prefill_size``).

    Raises
    ------
    ConfigError
        When the pool has no usable slot or is given in terms the policy cannot use.
    """
    size = int(unit_tokens) if spec.cls.size_name == "unit_tokens" else spec.size
    cls, extra = option_class(spec.cls, spec.option) if spec.cls.option_name else (spec.cls, {})
    check_complete(cls, f"policy {spec.label}")
    options = {**extra, **options}
    if pool.num_gpu_blocks is not None or pool.max_total_num_tokens is not None:
        pol = cls.from_engine_pool(pool, size, **options)
        if pol is not None:
            return pol
    tokens = pool.usable_tokens()
    if tokens is None:
        raise ConfigError(f"{spec.label}: no pool size given (capacity tokens, num_gpu_blocks or max_total_num_tokens)",
                          field="capacity")
    if tokens < 1:
        raise ConfigError(f"{spec.label}: pool capacity must be ≥ 1 token, got {tokens}", field="capacity")
    if cls.size_name in ("block_size", "page_size") and size is not None and tokens // size < 1:
        what = "page" if cls.size_name == "page_size" else "block"
        raise ConfigError(f"{spec.label}: a pool of {tokens} tokens holds no {size}-token {what}", field="capacity")
    if size is None:
        return cls.from_capacity_tokens(int(tokens), **options)
    return cls.from_capacity_tokens(int(tokens), size, **options)


def measured_metrics(policy) -> dict[str, bool]:
    """Which optional pool metrics *policy* (an instance or a :class:`PrefixCache` subclass)
    measures, from its class's capability flags (``models_duplication``,
    ``models_metadata``, ``models_slot_positions``; see :class:`PrefixCache`).

    Returns
    -------
    dict ``{"duplication": bool, "metadata": bool, "slot_positions": bool}``; a False
    entry's metric is reported ``n/a`` / ``null`` by :func:`radixkv.metrics.summarize`.
    """
    cls = policy if isinstance(policy, type) else type(policy)
    return {"duplication": bool(getattr(cls, "models_duplication", False)),
            "metadata": bool(getattr(cls, "models_metadata", False)),
            "slot_positions": bool(getattr(cls, "models_slot_positions", False))}
