"""What the host-memory KV tier policies (``sglang-hicache``, ``vllm-offload``) share: the
per-tier running totals they keep and the summary fields read from them."""
from __future__ import annotations

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
