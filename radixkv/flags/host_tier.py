"""Command-line flags of a host-memory (L2) KV tier and an L3 store, SGLang HiCache's names
and vLLM's offloading buffer: their table, and what they set in a policy spec, are
:mod:`radixkv.cli.host_tier_args`'s (``host_tier_spec``)."""
from __future__ import annotations


def add_host_tier_args(p) -> None:
    """Add the host-tier flags to parser *p*."""
    g = p.add_argument_group("host-memory KV tier (sglang-hicache, vllm-offload)")
    g.add_argument("--hicache-ratio", type=float, default=None, metavar="R",
                   help="host KV pool = R x the device pool (SGLang --hicache-ratio; the policy's default 2.0)")
    g.add_argument("--hicache-size", type=float, default=None, metavar="GB",
                   help="host KV pool in GB (1e9 bytes) at the model's KV bytes per token (SGLang --hicache-size; "
                        "needs --model)")
    g.add_argument("--host-cache-tokens", type=int, default=None, metavar="N",
                   help="host KV pool in tokens (0: no host tier)")
    g.add_argument("--hicache-write-policy", default=None,
                   choices=("write_through", "write_through_selective", "write_back"),
                   help="SGLang --hicache-write-policy (default write_through)")
    g.add_argument("--host-link", default=None, metavar="LINK",
                   help="host-to-GPU link that prices load backs in --mode concurrent: pcie4-x16, pcie5-x16, "
                        "nvlink-c2c (radixkv.cost.HOST_LINKS) or bytes/s per direction")
    g.add_argument("--hicache-storage-backend", default=None, choices=("file",),
                   help="SGLang --hicache-storage-backend: an L3 store behind the host pool (sglang-hicache; "
                        "sequential replay)")
    g.add_argument("--hicache-storage-prefetch-policy", default=None,
                   choices=("best_effort", "wait_complete", "timeout"),
                   help="SGLang --hicache-storage-prefetch-policy (the sequential replay completes every "
                        "prefetch before admission, so all three give the same hits)")
    g.add_argument("--storage-cache-tokens", type=int, default=None, metavar="N",
                   help="L3 capacity in tokens, page LRU as SGLang's capped file backend (default: unbounded, "
                        "SGLang's file default; 0: no L3 tier)")
    g.add_argument("--kv-offloading-size", type=float, default=None, metavar="GiB",
                   help="vLLM CPU KV offloading buffer in GiB (2**30 bytes), all TP ranks together "
                        "(vLLM --kv-offloading-size; policy vllm-offload; needs --model)")
