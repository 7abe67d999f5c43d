"""``--by ATTR``, ``--isolation MODE`` and ``--isolation-price`` of ``radixkv replay`` and
``compare``: the flags (what they do: :mod:`radixkv.cli.traffic_args`, :mod:`radixkv.breakdown`;
the cache keys: :mod:`radixkv.trace.cache_keys`)."""
from __future__ import annotations

from radixkv.breakdown import BY_ATTRIBUTES
from radixkv.trace.cache_keys import ISOLATION_MODES


def add_traffic_args(p) -> None:
    """Add the three flags to a ``replay`` / ``compare`` parser."""
    g = p.add_argument_group("traffic attributes")
    g.add_argument("--by", choices=list(BY_ATTRIBUTES), default=None,
                   help="also break hit rate, miss causes (with --miss-causes) and TTFT (concurrent mode) down by "
                        "this request attribute (default: not broken down)")
    g.add_argument("--isolation", choices=list(ISOLATION_MODES), default="cache_salt",
                   help="what salts the cache keys: the trace's cache_salt, every tenant its own salt (tenant), "
                        "or nothing (none: tenants share). LoRA adapters and images are keys in every mode")
    g.add_argument("--isolation-price", action="store_true",
                   help="replay the trace again without salts and report the hit tokens isolation loses "
                        "(per group with --by)")
