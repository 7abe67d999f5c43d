"""Command-line flags of the multi-replica replay, shared by ``radixkv replay`` and ``compare``
(their table: :mod:`radixkv.cli.routing_args`; the routers: :mod:`radixkv.replay.routing`)."""
from __future__ import annotations

from radixkv.replay import routing as R


def add_routing_args(parser) -> None:
    """Add the multi-replica flags to *parser* (an argparse parser)."""
    g = parser.add_argument_group("several replicas (radixkv.replay.routing)")
    g.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="N replicas, each with its own pool of the given size (unset: one pool)")
    g.add_argument("--router", choices=R.ROUTERS, default=None, help="request router (round-robin)")
    g.add_argument("--kv-pool", choices=["local", "global"], default="local",
                   help="local: a pool per replica; global: one shared pool of N x the size")
    g.add_argument("--router-seed", type=int, default=0, help="seed of --router random (0)")
    g.add_argument("--router-load-window", type=float, default=None, metavar="S",
                   help=f"sequential replicas: seconds a request counts toward its replica's load "
                        f"({R.LOAD_WINDOW_S:g}); refused with --mode concurrent, where load is the requests in flight")
    g.add_argument("--cache-threshold", type=float, default=R.CACHE_THRESHOLD,
                   help=f"prefix-aware: least matched share of the prompt that routes by cache ({R.CACHE_THRESHOLD:g})")
    g.add_argument("--balance-abs-threshold", type=float, default=R.BALANCE_ABS_THRESHOLD,
                   help=f"prefix-aware: load gap (requests) beyond which load decides ({R.BALANCE_ABS_THRESHOLD:g})")
    g.add_argument("--balance-rel-threshold", type=float, default=R.BALANCE_REL_THRESHOLD,
                   help=f"prefix-aware: load ratio beyond which load decides ({R.BALANCE_REL_THRESHOLD:g})")
    g.add_argument("--max-tree-tokens", type=int, default=None, metavar="N",
                   help="prefix-aware's approximate tree per replica (default: the replica's pool)")
