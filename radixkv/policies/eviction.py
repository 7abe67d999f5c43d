"""Which class serves an eviction option: ``sglang:1@lfu``, ``vllm:16@lfu``, ``sglang:1@belady``.

SGLang's ``--radix-eviction-policy`` (:class:`~radixkv.policies.radix.RadixCache`'s
``@option``) and vLLM's block-pool eviction hook
(:class:`~radixkv.policies.block_hash.BlockHashCache`'s) take a name: ``lru`` (or no
option) builds the class itself, whose kernels are LRU; any other name builds its
priority subclass, :class:`~radixkv.policies.radix_priority.PriorityRadixCache` or
:class:`~radixkv.policies.block_priority.PriorityBlockHashCache`, with
``eviction_policy=NAME``; ``belady`` (SGLang's tree only) builds
:class:`~radixkv.policies.radix_belady.BeladyRadixCache`, the offline reference that
reads the trace ahead (sequential replay only). Those subclasses' modules import the
base classes' modules and compile their priority functions on import (about a second of cache loads), so they are
imported here, above both, and only when an option asks for them
(:mod:`radixkv.policies.registry` calls :func:`parse_option` and
:func:`class_for_option`).

The rule serves a class whose ``parse_option`` / ``class_for_option`` is not its own: the
two base classes, their priority subclasses, and any subclass of them that leaves the
hook alone; a class that defines the hook (``vllm-offload``'s ``@offload``) answers it
itself.
"""
from __future__ import annotations

import sys

from radixkv.errors import ConfigError
from radixkv.policies.base import PrefixCache


#: SGLang's radix tree evicting by next use (:class:`radixkv.policies.radix_belady.BeladyRadixCache`,
#: an offline reference, not an SGLang ``--radix-eviction-policy``): ``sglang:P@belady``
BELADY = "belady"


def _family(cls: type, hook: str) -> str | None:
    """``"radix"`` or ``"block"`` when *cls*'s *hook* (``parse_option`` or
    ``class_for_option``) is this module's rule for :class:`RadixCache` or
    :class:`BlockHashCache` (the class is one of them or a subclass that does not define
    *hook*), else None. The base modules are looked up, not imported: a subclass of one
    of them means it is loaded."""
    owner = next((k for k in cls.__mro__ if hook in vars(k)), None)
    if owner is not PrefixCache:
        return None
    radix = sys.modules.get("radixkv.policies.radix")
    if radix is not None and issubclass(cls, radix.RadixCache):
        return "radix"
    block = sys.modules.get("radixkv.policies.block_hash")
    if block is not None and issubclass(cls, block.BlockHashCache):
        return "block"
    return None


def parse_option(cls: type, text: str):
    """The value of *cls*'s ``@TEXT``: for an eviction option, a name of
    :data:`radixkv.policies.radix_priority.EVICTION_POLICIES` (SGLang) or
    :data:`radixkv.policies.block_priority.BLOCK_EVICTION_POLICIES` (vLLM), lower-cased;
    otherwise the class's own ``parse_option``.

    Raises
    ------
    radixkv.errors.ConfigError
        For an unknown eviction policy, naming the known ones; or as the class's hook.
    """
    fam = _family(cls, "parse_option")
    if fam is None:
        return cls.parse_option(text)
    if fam == "radix":
        from radixkv.policies.radix_priority import EVICTION_POLICIES

        names = [*EVICTION_POLICIES, BELADY]
    else:
        from radixkv.policies.block_priority import BLOCK_EVICTION_POLICIES as names
    ev = text.strip().lower()
    if ev not in names:
        raise ConfigError(f"policy {cls.name!r}: unknown eviction policy {text!r}; known: "
                          f"{', '.join(names)}", field="policy")
    return ev


def class_for_option(cls: type, value) -> tuple:
    """The class to build for *cls* with option *value* and the constructor keywords it
    sets (the contract of :meth:`~radixkv.policies.base.PrefixCache.class_for_option`).

    For an eviction option: ``lru`` (or None) builds *cls* itself (vLLM's free queue,
    SGLang's LRU kernels); another name builds the priority subclass with
    ``eviction_policy=value``; a class that already is one (a priority subclass, or one
    of its subclasses) keeps itself and takes the value; ``belady`` builds
    :class:`~radixkv.policies.radix_belady.BeladyRadixCache` (SGLang's tree only).
    Otherwise the class's own ``class_for_option``.

    Raises
    ------
    radixkv.errors.ConfigError
        For a subclass of the base class that is not a priority subclass, asked for
        another eviction policy (it has no eviction hook).
    """
    fam = _family(cls, "class_for_option")
    if fam is None:
        return cls.class_for_option(value)
    if fam == "radix" and value == BELADY:
        from radixkv.policies.radix import RadixCache
        from radixkv.policies.radix_belady import BeladyRadixCache

        if cls is RadixCache or issubclass(cls, BeladyRadixCache):
            return (BeladyRadixCache if cls is RadixCache else cls), {}
        raise ConfigError(f"{cls.__name__} has no eviction hook for {value!r}: @belady is "
                          f"{BeladyRadixCache.__name__}, over SGLang's own RadixCache", field="policy")
    mod_name = "radixkv.policies.radix_priority" if fam == "radix" else "radixkv.policies.block_priority"
    prio = sys.modules.get(mod_name)
    prio_cls = None if prio is None else prio.PriorityRadixCache if fam == "radix" else prio.PriorityBlockHashCache
    if prio_cls is not None and issubclass(cls, prio_cls):
        return cls, ({} if value is None else {"eviction_policy": value})
    if value in (None, "lru"):
        return cls, {}
    if fam == "radix":
        from radixkv.policies.radix import RadixCache as base
        from radixkv.policies.radix_priority import PriorityRadixCache as prio_cls
    else:
        from radixkv.policies.block_hash import BlockHashCache as base
        from radixkv.policies.block_priority import PriorityBlockHashCache as prio_cls
    if cls is not base:
        raise ConfigError(f"{cls.__name__} has no eviction hook for {value!r}: subclass {prio_cls.__name__}",
                          field="policy")
    return prio_cls, {"eviction_policy": value}
