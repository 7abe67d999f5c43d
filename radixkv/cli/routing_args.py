"""Command-line flags of the multi-replica replay, shared by ``radixkv replay`` and ``compare``.

=========================================== ============================================
flag                                        meaning (default)
=========================================== ============================================
``--replicas N``                            N replicas, each with its own pool of the
                                            given size and its own policy instance (unset:
                                            the plain single-pool replay)
``--router NAME``                           round-robin, random, least-load, session,
                                            prefix-aware (round-robin)
``--kv-pool {local,global}``                local: a pool per replica; global: ONE pool of
                                            N × the given size for all (local)
``--router-seed S``                         ``random``'s seed (0)
``--router-load-window S``                  seconds a request counts toward its replica's
                                            load (60)
``--cache-threshold X``                     prefix-aware, SGLang router's name (0.3)
``--balance-abs-threshold N``               prefix-aware, SGLang router's name (64)
``--balance-rel-threshold X``               prefix-aware, SGLang router's name (1.5)
``--max-tree-tokens N``                     prefix-aware's approximate tree per replica
                                            (default: the replica's pool)
=========================================== ============================================

The flags are defined in :mod:`radixkv.flags.routing`. See :mod:`radixkv.replay.routing` for
the routers and what the approximate tree approximates. With ``--mode concurrent`` the
replicas run on one clock (:mod:`radixkv.replay.multi_concurrent`; load = requests in flight
at the arrival, and ``--router-load-window`` is refused); ``--kv-pool global`` is refused
there (:data:`radixkv.replay.multi_concurrent.GLOBAL_POOL_REFUSAL` says why).
"""
from __future__ import annotations

from radixkv.flags.routing import add_routing_args  # noqa: F401  (importable from here, as before)
from radixkv.replay import routing as R
# the library's (radixkv.replay.settings); the verbs call them from here
from radixkv.replay.settings import routed, run_routed_concurrent_result  # noqa: F401


def report_replay(trace, spec, res, summ, args, load_s, desc, make_doc, format_table) -> int:
    """``radixkv replay --replicas N``: aggregate table, per-replica table, routing line, JSON;
    with ``--mode concurrent``, ``--per-request CSV`` (a ``replica`` column names the replica
    that served each request) and ``--report``. *res*, *summ*: the replay's result and
    summary (:func:`radixkv.replay.spec.run`)."""
    from radixkv.cli._output import emit, human
    from radixkv.util import dumps_json

    from radixkv.report import CONCURRENT_ROWS

    conc = getattr(args, "mode", "sequential") == "concurrent"
    rows = CONCURRENT_ROWS if conc else None
    out = human(args.json)
    print(f"trace {args.trace}: {summ['requests']:,} requests, unit_tokens={trace.unit_tokens}; "
          f"{'concurrent' if conc else 'sequential'} replay on {args.replicas} replicas; load {load_s:.2f} s", file=out)
    print(format_table([summ], rows_spec=rows), file=out)
    per = [dict(r, policy=f"replica {k}") for k, r in enumerate(summ["replicas"]) if r is not None]
    if per and summ["routing"]["kv_pool"] == "local":
        print(format_table(per, timing=False, rows_spec=rows), file=out)
    from radixkv.report import steps_lines

    for line in steps_lines([summ]):
        print(line, file=out)
    print(describe(summ), file=out)
    doc = make_doc(trace, args, load_s, [(spec, summ)], [desc])
    emit(args.json, dumps_json(doc), args.json, args.per_request, args.report)
    if args.report:
        from radixkv.cli.report_cmd import run_tables, write_run_report

        write_run_report(args.report, doc, run_tables(summ["policy"], res.aggregate), stream=out)
    if args.per_request:
        res.write_csv(args.per_request)
        print(f"wrote {args.per_request}", file=out)
    return 0


def describe(summ) -> str:
    """One line on where requests went: counts per replica, load imbalance, tree memory."""
    r = summ["routing"]
    s = (f"{r['router']} over {r['n_replicas']} replicas, {r['kv_pool']} KV pool; requests per replica "
         f"{r['requests_per_replica']}, load imbalance (max/mean) {r['load_imbalance']:.3f}")
    if r.get("busy_imbalance") is not None:
        s += f", busy-time imbalance {r['busy_imbalance']:.3f}"
    if r.get("tree_bytes_peak") is not None:
        s += (f"; approximate trees peak {sum(r['tree_nodes_peak']):,} nodes, "
              f"{r['tree_bytes_peak']:,} bytes at {R.TREE_NODE_BYTES} B/node")
    return s
