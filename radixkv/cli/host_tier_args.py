"""CLI flags of a host-memory (L2) KV tier, SGLang HiCache's names (defined in
:mod:`radixkv.flags.host_tier`), and the policy options they set.

``--hicache-ratio R``          host pool = R × the device pool (SGLang ``--hicache-ratio``)
``--hicache-size GB``          host pool in GB at the model's KV bytes per token (SGLang
                               ``--hicache-size``; needs ``--model``); wins over the ratio
``--host-cache-tokens N``      host pool in tokens (radixkv's own; 0 turns the tier off; refused
                               together with ``--hicache-size`` or ``--hicache-ratio``)
``--hicache-write-policy P``   ``write_through`` | ``write_through_selective`` | ``write_back``
``--hicache-storage-backend B``           L3 store behind the host pool (``file``; SGLang's name)
``--hicache-storage-prefetch-policy P``   ``best_effort`` | ``wait_complete`` | ``timeout``
``--storage-cache-tokens N``              L3 capacity in tokens (radixkv's own research knob;
                                          default unbounded as SGLang's file backend; 0: off)
``--kv-offloading-size GiB``   vLLM's CPU offloading buffer (``CacheConfig.kv_offloading_size``,
                               all TP ranks together; needs ``--model``), for ``vllm-offload``

They fill the options of a policy spec whose class models a host tier
(``models_host_tier``, e.g. ``sglang-hicache``), so ``--policy sglang-hicache:64
--hicache-ratio 4`` is ``--policy sglang-hicache:64@hicache_ratio=4``; an option the spec
already gives wins over the flag. A class lists the flags it takes in ``host_tier_flags``
(default: the four SGLang ones); any other flag, or any flag for a policy without a host
tier, is a ConfigError.
"""
from __future__ import annotations

import math
from dataclasses import replace

from radixkv.errors import ConfigError
from radixkv.flags.host_tier import add_host_tier_args  # noqa: F401  (importable from here, as before)

_FLAGS = ("hicache_ratio", "hicache_size", "host_cache_tokens", "hicache_write_policy", "kv_offloading_size",
          "hicache_storage_backend", "hicache_storage_prefetch_policy", "storage_cache_tokens")
#: the flags a host-tier class takes unless it says otherwise (``host_tier_flags``)
_SGLANG_FLAGS = ("hicache_ratio", "hicache_size", "host_cache_tokens", "hicache_write_policy",
                 "hicache_storage_backend", "hicache_storage_prefetch_policy", "storage_cache_tokens")


def host_tier_spec(spec, args):
    """*spec* with the host-tier flags merged into its options (unchanged when none is given).

    Raises
    ------
    radixkv.errors.ConfigError
        A flag given for a policy without a host tier; ``--hicache-size`` without
        ``--model``; a negative, NaN or infinite size.
    """
    if getattr(args, "host_link", None) is not None and getattr(args, "mode", "sequential") != "concurrent":
        raise ConfigError("--host-link prices load backs in time: it needs --mode concurrent", field="host_link")
    given = {k: getattr(args, k, None) for k in _FLAGS if getattr(args, k, None) is not None}
    if not given:
        return spec
    if not getattr(spec.build_class, "models_host_tier", False):
        flag = "--" + next(iter(given)).replace("_", "-")
        raise ConfigError(f"{flag} sets a host-memory KV tier, which policy {spec.label!r} does not model "
                          f"(use sglang-hicache or vllm-offload)", field=next(iter(given)))
    takes = getattr(spec.build_class, "host_tier_flags", _SGLANG_FLAGS)
    for k in given:
        if k not in takes:
            raise ConfigError(f"--{k.replace('_', '-')} does not apply to policy {spec.label!r} (it takes "
                              f"{', '.join('--' + t.replace('_', '-') for t in takes)})", field=k)
    sizes = [k for k in ("host_cache_tokens", "hicache_size", "hicache_ratio") if k in given]
    if "host_cache_tokens" in sizes and len(sizes) > 1:
        other = "--" + sizes[1].replace("_", "-")
        raise ConfigError(f"--host-cache-tokens and {other} both size the host pool: give one", field="host_cache_tokens")
    opts = {}
    if "hicache_write_policy" in given:
        opts["write_policy"] = given["hicache_write_policy"]
    for k in ("hicache_ratio", "hicache_size", "kv_offloading_size"):
        # argparse's float() takes 'nan' and 'inf', which no pool size can be
        if k in given and not math.isfinite(given[k]):
            raise ConfigError(f"--{k.replace('_', '-')} must be a finite number ≥ 0, got {given[k]}", field=k)
    if "hicache_ratio" in given:
        if given["hicache_ratio"] < 0:
            raise ConfigError("--hicache-ratio must be ≥ 0", field="hicache_ratio")
        opts["hicache_ratio"] = float(given["hicache_ratio"])
    if "hicache_size" in given:
        gb = given["hicache_size"]
        if gb < 0:
            raise ConfigError("--hicache-size must be ≥ 0", field="hicache_size")
        if getattr(args, "model", None) is None:
            raise ConfigError("--hicache-size is in GB: give --model for its KV bytes per token "
                              "(or use --host-cache-tokens)", field="hicache_size")
        from radixkv.memory.presets import get_model

        bpt = get_model(args.model).kv_bytes_per_token(int(getattr(args, "tp", 1) or 1),
                                                       getattr(args, "kv_cache_dtype", None))
        # SGLang pool_host/base.py: int(hicache_size * 1e9 // size_per_token)
        opts["host_tokens"] = int(gb * 1e9 // bpt)
    if "kv_offloading_size" in given:
        gib = given["kv_offloading_size"]
        if gib < 0:
            raise ConfigError("--kv-offloading-size must be ≥ 0", field="kv_offloading_size")
        if getattr(args, "model", None) is None:
            raise ConfigError("--kv-offloading-size is in GiB: give --model for its KV bytes per token "
                              "(or use --host-cache-tokens)", field="kv_offloading_size")
        from radixkv.memory.presets import get_model

        tp = int(getattr(args, "tp", 1) or 1)
        # vLLM config/vllm.py _post_init_kv_transfer_config: cpu_bytes_to_use = GiB * 2**30;
        # kv_offload/cpu/spec.py: a chunk holds the KV of every worker (world_size copies)
        opts["cpu_bytes"] = int(gib * (1 << 30))
        opts["kv_bytes_per_token"] = get_model(args.model).kv_bytes_per_token(
            tp, getattr(args, "kv_cache_dtype", None)) * tp
    if "hicache_storage_backend" in given:
        opts["hicache_storage_backend"] = given["hicache_storage_backend"]
    if "hicache_storage_prefetch_policy" in given:
        opts["prefetch_policy"] = given["hicache_storage_prefetch_policy"]
    if "storage_cache_tokens" in given:
        if given["storage_cache_tokens"] < 0:
            raise ConfigError("--storage-cache-tokens must be ≥ 0", field="storage_cache_tokens")
        opts["storage_tokens"] = int(given["storage_cache_tokens"])
    if "host_cache_tokens" in given:
        if given["host_cache_tokens"] < 0:
            raise ConfigError("--host-cache-tokens must be ≥ 0", field="host_cache_tokens")
        opts["host_tokens"] = int(given["host_cache_tokens"])
    opts.update(dict(spec.option or ()))  # the spec's own options win
    return replace(spec, option=tuple(sorted(opts.items())))
