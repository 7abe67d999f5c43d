"""What the host-memory KV tier policies (``sglang-hicache``, ``vllm-offload``) share: the
per-tier running totals they keep, the summary fields read from them, and the grammar of
their ``@KEY=VALUE`` policy option."""
from __future__ import annotations

import re

from radixkv.errors import ConfigError
from radixkv.metrics import HOST_TIER_KEYS, STORAGE_TIER_KEYS

#: the running totals (tokens, since construction) a policy with ``models_host_tier`` keeps
HOST_TOTALS = ("device_hit_tokens_total", "host_hit_tokens_total", "loaded_tokens_total",
               "written_tokens_total", "host_evicted_tokens_total")


def zero_host_totals(policy) -> None:
    """Set every :data:`HOST_TOTALS` attribute of *policy* to 0 (at construction)."""
    for name in HOST_TOTALS:
        setattr(policy, name, 0)


def host_tier_summary(policy, prompt_tokens: int) -> dict:
    """Per-tier totals of a finished sequential replay, for the summary.

    Parameters
    ----------
    policy : PrefixCache
        The replayed policy; a class without ``models_host_tier`` gets every key None
        (reported ``n/a`` / JSON ``null``, never 0).
    prompt_tokens : int
        Prompt tokens replayed (the denominator of ``host_hit_rate``).

    Returns
    -------
    dict
        ``host_capacity_tokens`` (host pool, tokens), ``device_hit_tokens`` (hits served
        from GPU memory), ``host_hit_tokens`` (tokens lookups found on host only),
        ``host_loaded_tokens`` (of those, loaded back and hit; the rest were under
        ``load_back_threshold`` and recomputed), ``host_hit_rate`` (loaded / prompt
        tokens), ``gpu_to_host_tokens`` and ``host_to_gpu_tokens`` (tokens copied each way;
        bytes = tokens × the model's KV bytes per token), ``host_evicted_tokens``.
    """
    out = storage_tier_summary(policy, prompt_tokens)
    if not getattr(type(policy), "models_host_tier", False):
        return {**dict.fromkeys(HOST_TIER_KEYS), **out}
    return {**out,
        "host_capacity_tokens": int(policy.host_capacity),
        "device_hit_tokens": int(policy.device_hit_tokens_total),
        "host_hit_tokens": int(policy.host_hit_tokens_total),
        "host_loaded_tokens": int(policy.loaded_tokens_total),
        "host_hit_rate": policy.loaded_tokens_total / prompt_tokens if prompt_tokens else None,
        "gpu_to_host_tokens": int(policy.written_tokens_total),
        "host_to_gpu_tokens": int(policy.loaded_tokens_total),
        "host_evicted_tokens": int(policy.host_evicted_tokens_total),
    }


def storage_tier_summary(policy, prompt_tokens: int) -> dict:
    """Totals of an L3 storage tier behind the host pool (``sglang-hicache`` with
    ``hicache_storage_backend``), for the summary; every key None when the policy has
    no such tier (``hicache_storage_backend`` None), never 0.

    Returns
    -------
    dict
        ``storage_backend`` (e.g. ``"file"``), ``storage_capacity_tokens`` (None:
        unbounded, SGLang's file backend default), ``storage_hit_tokens`` (tokens
        prefetched L3→host for a request, then found on host by its match),
        ``storage_hit_rate`` (those / prompt tokens), ``storage_to_host_tokens`` (the
        same tokens, as traffic), ``host_to_storage_tokens`` (new pages written, in
        tokens), ``storage_evicted_tokens`` (a capped store's evictions).
    """
    backend = getattr(policy, "hicache_storage_backend", None)
    if backend is None:
        return dict.fromkeys(STORAGE_TIER_KEYS)
    hit = int(policy.storage_hit_tokens_total)
    cap = policy.storage_capacity
    return {
        "storage_backend": backend,
        "storage_capacity_tokens": None if cap is None else int(cap),
        "storage_hit_tokens": hit,
        "storage_hit_rate": hit / prompt_tokens if prompt_tokens else None,
        "host_to_storage_tokens": int(policy.storage_written_tokens_total),
        "storage_to_host_tokens": hit,
        "storage_evicted_tokens": int(policy.storage_evicted_tokens_total),
        "host_to_storage_bytes": None,
        "storage_to_host_bytes": None,
    }


class HostTierOptions:
    """The policy option of a host-tier class (``sglang-hicache:16@write_back,hicache_ratio=4``,
    ``vllm-offload:16@host_tokens=400000,arc``): ``KEY=VALUE`` pairs separated by ``,``,
    ``+`` or ``;`` (``+`` inside a comma-separated ``--policies`` list), ``-`` in a key read
    as ``_``, a bare word the value of :attr:`bare_option`. The parsed value is a tuple of
    sorted ``(keyword, value)`` pairs (hashable: a policy spec is a dict key), the
    constructor's keywords. A class lists its keys and checks in ``parse_option``, with
    :meth:`option_pairs`, :meth:`option_choice` and :meth:`option_number`.
    """

    #: the keyword a bare word (no ``=``) sets
    bare_option = ""

    @classmethod
    def option_pairs(cls, text: str):
        """The ``(key, value)`` pairs of *text*, stripped, in order."""
        for part in re.split(r"[,+;]", str(text)):
            part = part.strip()
            if not part:
                continue
            k, eq, v = part.partition("=")
            k, v = k.strip().replace("-", "_"), v.strip()
            yield (k, v) if eq else (cls.bare_option, k)

    @classmethod
    def option_choice(cls, value: str, known, what: str, word: str = "known") -> str:
        """*value* when it is one of *known*; else ConfigError ``unknown WHAT 'value'; WORD: …``."""
        if value not in known:
            raise ConfigError(f"policy {cls.name!r}: unknown {what} {value!r}; {word}: {', '.join(known)}",
                              field="policy")
        return value

    @classmethod
    def option_number(cls, key: str, value: str, convert, what: str = "a number"):
        """``convert(value)``; a ValueError becomes ConfigError ``KEY='value' is not WHAT``."""
        try:
            return convert(value)
        except ValueError:
            raise ConfigError(f"policy {cls.name!r}: {key}={value!r} is not {what}", field="policy") from None

    @classmethod
    def class_for_option(cls, value):
        """The keywords of ``parse_option`` (a tuple of ``(keyword, value)`` pairs)."""
        return cls, dict(value or ())

    @classmethod
    def format_option(cls, value) -> str:
        """Inverse of ``parse_option``: floats as ``%g``, booleans as ``true`` / ``false``."""
        return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else format(v, 'g') if isinstance(v, float) else v}"
                        for k, v in (value or ()))
