"""``--executor``, ``--workers`` and ``--scheduler``: where replays run (``radixkv sweep``,
``compare``, ``curve``; the executors: :mod:`radixkv.sweep.executors`)."""
from __future__ import annotations


def add_executor_args(p, *, dask_help: bool = True) -> None:
    """``--executor``, ``--workers`` and ``--scheduler`` (shared with ``compare`` and ``curve``)."""
    g = p.add_argument_group("where cells run")
    g.add_argument("--executor", choices=["local", "processes", "dask"], default=None,
                   help="local: this process (default); processes: a pool of worker processes; "
                        "dask: a dask.distributed cluster (pip install 'radixkv[dask]')")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes (processes, local Dask cluster; default: the CPUs)")
    g.add_argument("--scheduler", default=None, metavar="ADDR",
                   help="address of an existing Dask scheduler, e.g. tcp://host:8786 (implies --executor dask)")
