"""The command-line knobs a replay reads, shared by the CLI and by sweep/plan grids.

A sweep grid's keys are ``radixkv replay``'s flags (:mod:`radixkv.sweep.grid` reads each
key's type, choices and default from that verb's parser), so the flags' argparse
definitions live here, below both: the verbs of :mod:`radixkv.cli` add them to their
parsers, and the grid builds the same ``replay`` parser without importing the CLI. A flag
is defined here and nothing more; what its value does is the library's
(:mod:`radixkv.replay.settings`, :mod:`radixkv.replay.pool_settings`). The table of flags
that other flags make moot is here too (:mod:`radixkv.flags.moot`): the verbs refuse such a
flag and a sweep grid the same key.

- :mod:`~radixkv.flags.replay`      trace, policy sizes, pool, window, miss causes, and
  ``add_replay_flags``: every flag of ``radixkv replay`` in its order
- :mod:`~radixkv.flags.concurrent`  the concurrent replay (``--mode concurrent``)
- :mod:`~radixkv.flags.host_tier`   the host-memory and L3 KV tiers
- :mod:`~radixkv.flags.routing`     several replicas and their router
- :mod:`~radixkv.flags.moot`        flags that other flags make moot, refused
- :mod:`~radixkv.flags.traffic`     ``--by``, ``--isolation``, ``--isolation-price``
- :mod:`~radixkv.flags.executor`    where replays run (``--executor``, ``--workers``, ``--scheduler``)
- :mod:`~radixkv.flags.output`      ``--json`` and ``--report``
"""
