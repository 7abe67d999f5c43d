"""What the host-memory KV tier policies (``sglang-hicache``, ``vllm-offload``) share: the
per-tier running totals they keep and the summary fields read from them."""
from __future__ import annotations

from radixkv.metrics import HOST_TIER_KEYS

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
    if not getattr(type(policy), "models_host_tier", False):
        return dict.fromkeys(HOST_TIER_KEYS)
    return {
        "host_capacity_tokens": int(policy.host_capacity),
        "device_hit_tokens": int(policy.device_hit_tokens_total),
        "host_hit_tokens": int(policy.host_hit_tokens_total),
        "host_loaded_tokens": int(policy.loaded_tokens_total),
        "host_hit_rate": policy.loaded_tokens_total / prompt_tokens if prompt_tokens else None,
        "gpu_to_host_tokens": int(policy.written_tokens_total),
        "host_to_gpu_tokens": int(policy.loaded_tokens_total),
        "host_evicted_tokens": int(policy.host_evicted_tokens_total),
    }
