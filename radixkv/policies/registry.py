"""Policies by name: parse ``--policy``/``--policies`` specs and build a policy on a pool.

A spec is ``NAME`` or ``NAME:SIZE`` where SIZE is the block size (vLLM, ``none``) or the
page size (SGLang):

=========== ======================================= ==================================
name        class                                   size (default)
=========== ======================================= ==================================
``vllm``    :class:`~radixkv.policies.block_hash.BlockHashCache`  ``block_size`` (16)
``sglang``  :class:`~radixkv.policies.radix.RadixCache`           ``page_size`` (1)
``unit-lru``:class:`~radixkv.policies.unit_lru.UnitLRUCache`      the trace's unit (fixed)
``none``    :class:`~radixkv.policies.no_cache.NoCache`           block size (1)
``static``  :class:`~radixkv.policies.static_reserved.StaticReservedCache` block size (16)
=========== ======================================= ==================================

``static`` also takes the reserved share of the pool after ``@``: ``static:16@0.3``
(default 0.3). ``sglang`` takes SGLang's eviction policy after ``@`` (``--radix-eviction-policy``):
``sglang:1@lfu`` — ``lru`` (default, the built-in kernels), ``lfu``, ``fifo``, ``mru``,
``filo``, ``priority``, ``slru``, ``tlru`` (SGLang's default configs), through
:class:`~radixkv.policies.radix_priority.PriorityRadixCache`; ``vllm`` takes ``@lru`` (the
built-in free queue) or ``@lfu`` (:class:`~radixkv.policies.block_priority.PriorityBlockHashCache`).

A pool is given in one of three ways (:class:`PoolSpec`): usable tokens
(``capacity_tokens``: vLLM gets ``capacity // block_size`` usable blocks, SGLang the
capacity rounded down to a page, ``unit-lru`` ``capacity // U`` units, ``none`` the
capacity rounded down to its block size), or in an engine's own terms
(``num_gpu_blocks`` for vLLM — block 0 is the null block, so one fewer is usable;
``max_total_num_tokens`` for SGLang).
"""
from __future__ import annotations

from dataclasses import dataclass

from radixkv.errors import ConfigError
from radixkv.policies.base import PrefixCache

POLICY_NAMES = ("vllm", "sglang", "unit-lru", "none", "static")
_DEFAULT_SIZE = {"vllm": 16, "sglang": 1, "unit-lru": None, "none": 1, "static": 16}
_DEFAULT_FRACTION = 0.3


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy spec: ``name``, ``size`` (block or page size in tokens) and, for
    ``static``, the reserved ``fraction`` of the pool."""

    name: str
    size: int | None
    fraction: float | None = None
    #: SGLang eviction policy (``sglang`` only; None = LRU)
    eviction: str | None = None

    @property
    def label(self) -> str:
        s = self.name if self.size is None else f"{self.name}:{self.size}"
        if self.eviction is not None:
            return f"{s}@{self.eviction}"
        return s if self.fraction is None else f"{s}@{self.fraction:g}"


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


def parse_policy(text: str, *, block_size: int | None = None, page_size: int | None = None) -> PolicySpec:
    """Parse ``NAME[:SIZE]``; *block_size* / *page_size* fill in a missing size.

    Raises
    ------
    ConfigError
        For an unknown name or a size that is not a positive integer.
    """
    body, _, frac = text.strip().partition("@")
    name, _, size = body.partition(":")
    name = name.strip().lower()
    aliases = {"vllm": "vllm", "block": "vllm", "sglang": "sglang", "radix": "sglang",
               "unit-lru": "unit-lru", "unit_lru": "unit-lru", "none": "none", "off": "none", "static": "static"}
    if name not in aliases:
        raise ConfigError(f"unknown policy {text!r}; known: {', '.join(POLICY_NAMES)}", field="policy")
    name = aliases[name]
    if name == "static":
        try:
            f = float(frac) if frac else _DEFAULT_FRACTION
        except ValueError:
            raise ConfigError(f"policy {text!r}: reserved fraction {frac!r} is not a number", field="policy") from None
        spec = parse_policy(body.replace("static", "none", 1), block_size=16 if block_size is None else block_size)
        return PolicySpec("static", spec.size, f)
    if frac and name in ("sglang", "vllm"):
        if name == "sglang":
            from radixkv.policies.radix_priority import EVICTION_POLICIES
        else:
            from radixkv.policies.block_priority import BLOCK_EVICTION_POLICIES as EVICTION_POLICIES

        ev = frac.strip().lower()
        if ev not in EVICTION_POLICIES:
            raise ConfigError(f"policy {text!r}: unknown eviction policy {frac!r}; known: "
                              f"{', '.join(EVICTION_POLICIES)}", field="policy")
        spec = parse_policy(body, block_size=block_size, page_size=page_size)
        return PolicySpec(spec.name, spec.size, None, ev)
    if frac:
        raise ConfigError(f"policy {text!r}: only 'static' (fraction), 'sglang' and 'vllm' (eviction policy) take '@'",
                          field="policy")
    for flag, v in (("--block-size", block_size), ("--page-size", page_size)):
        if v is not None and int(v) < 1:
            raise ConfigError(f"{flag} must be ≥ 1, got {v}", field=flag.lstrip("-").replace("-", "_"))
    given = {"vllm": block_size, "none": block_size, "sglang": page_size}.get(name)
    if size and given is not None and int(size) != int(given):
        flag = "--page-size" if name == "sglang" else "--block-size"
        raise ConfigError(f"policy {text!r} says size {size} but {flag} says {given}", field="policy")
    if size:
        if name == "unit-lru":
            raise ConfigError("unit-lru takes no size: it caches whole trace units", field="policy")
        try:
            val = int(size)
        except ValueError:
            raise ConfigError(f"policy {text!r}: size {size!r} is not an integer", field="policy") from None
        if val < 1:
            raise ConfigError(f"policy {text!r}: size must be ≥ 1", field="policy")
        return PolicySpec(name, val)
    if name in ("vllm", "none") and block_size is not None:
        return PolicySpec(name, int(block_size))
    if name == "sglang" and page_size is not None:
        return PolicySpec(name, int(page_size))
    return PolicySpec(name, _DEFAULT_SIZE[name])


#: largest pool radixkv models, in slots (every policy keeps a few words per slot)
MAX_POOL_SLOTS = 1 << 28


def build_policy(spec: PolicySpec, pool: PoolSpec, *, unit_tokens: int = 1, **options) -> PrefixCache:
    """A fresh policy of *spec* on *pool* (see :func:`_build`); a pool too large for this
    machine's memory is a :class:`ConfigError`, not a crash."""
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


def _build(spec: PolicySpec, pool: PoolSpec, *, unit_tokens: int = 1, **options) -> PrefixCache:
    """A fresh policy of *spec* on *pool*.

    Parameters
    ----------
    spec : PolicySpec
    pool : PoolSpec
    unit_tokens : int
        The trace's U (used by ``unit-lru``).
    **options
        Passed to the policy's constructor (e.g. ``verify=True``, ``chunked_prefill_size``).

    Raises
    ------
    ConfigError
        When the pool has no usable slot or is given in terms the policy cannot use.
    """
    cap, ngb, mtt = pool.capacity_tokens, pool.num_gpu_blocks, pool.max_total_num_tokens
    if spec.name == "vllm":
        from radixkv.policies.block_hash import BlockHashCache

        if spec.eviction not in (None, "lru"):
            from radixkv.policies.block_priority import PriorityBlockHashCache as BlockHashCache  # noqa: F811

            options = {**options, "eviction_policy": spec.eviction}

        if ngb is not None:
            return BlockHashCache(int(ngb), spec.size, **options)
        tokens = cap if cap is not None else mtt
        _need(tokens, spec)
        if tokens // spec.size < 1:
            raise ConfigError(f"{spec.label}: a pool of {tokens} tokens holds no {spec.size}-token block", field="capacity")
        return BlockHashCache.from_capacity_tokens(int(tokens), spec.size, **options)
    if spec.name == "sglang":
        from radixkv.policies.radix import RadixCache

        if spec.eviction not in (None, "lru"):
            from radixkv.policies.radix_priority import PriorityRadixCache as RadixCache  # noqa: F811

            options = {**options, "eviction_policy": spec.eviction}

        if mtt is not None:
            return RadixCache(int(mtt) // spec.size * spec.size, spec.size, **options)
        tokens = cap if cap is not None else _vllm_usable_tokens(ngb, 16)
        _need(tokens, spec)
        if tokens // spec.size < 1:
            raise ConfigError(f"{spec.label}: a pool of {tokens} tokens holds no {spec.size}-token page", field="capacity")
        return RadixCache.from_capacity_tokens(int(tokens), spec.size, **options)
    tokens = cap if cap is not None else (mtt if mtt is not None else _vllm_usable_tokens(ngb, 16))
    _need(tokens, spec)
    if spec.name == "unit-lru":
        from radixkv.policies.unit_lru import UnitLRUCache

        return UnitLRUCache.from_capacity_tokens(int(tokens), unit_tokens)
    if spec.name == "static":
        from radixkv.policies.static_reserved import StaticReservedCache

        return StaticReservedCache(int(tokens) // spec.size, spec.size, spec.fraction)
    from radixkv.policies.no_cache import NoCache

    return NoCache(int(tokens) // spec.size, spec.size)


def _vllm_usable_tokens(num_gpu_blocks, block_size):
    if num_gpu_blocks is None:
        return None
    return (int(num_gpu_blocks) - 1) * block_size


def _need(tokens, spec):
    if tokens is None:
        raise ConfigError(f"{spec.label}: no pool size given (capacity tokens, num_gpu_blocks or max_total_num_tokens)",
                          field="capacity")
    if tokens < 1:
        raise ConfigError(f"{spec.label}: pool capacity must be ≥ 1 token, got {tokens}", field="capacity")


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
