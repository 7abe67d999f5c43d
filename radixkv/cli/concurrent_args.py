"""The concurrent replay's flags and the replay they describe, as the verbs use them.

The flags (``--mode``, ``--max-num-seqs``, the arrival process, the engines' scheduling and
cost-model knobs; their table is :mod:`radixkv.flags.concurrent`'s docstring) are defined
in :mod:`radixkv.flags.concurrent`, below the CLI, since a sweep grid reads them as its keys
(:mod:`radixkv.sweep.grid`); the replay they describe is the library's
(:mod:`radixkv.replay.settings`). Both are importable from here.
"""
from __future__ import annotations

from radixkv.flags.concurrent import add_concurrent_args, refuse_concurrent_only_flags  # noqa: F401
from radixkv.replay.settings import (  # noqa: F401
    concurrent_config_from_args, cost_model_from_args, policy_from_args, run_concurrent_from_args,
)
