"""Sweeps: a grid of replays (traces × policies × sizes × pools × knobs) run as independent
cells on one process, a pool of processes or a Dask cluster, each finished cell stored at
once so that a rerun resumes where a crash or Ctrl-C stopped.

- :func:`run_sweep` runs ``GRID.toml`` into a results directory (``radixkv sweep``).
- :func:`load_results` reads that directory as a pandas DataFrame, one row per cell;
  :func:`read_rows` gives the same rows as plain dicts.
- :func:`load_grid` parses and expands a grid (:mod:`radixkv.sweep.grid` gives the format).
"""
from radixkv.sweep.grid import Cell, Grid, load_grid
from radixkv.sweep.run import SweepReport, run_settings, run_sweep
from radixkv.sweep.store import load_results, read_errors, read_rows

__all__ = ["Cell", "Grid", "SweepReport", "load_grid", "load_results", "read_errors", "read_rows",
           "run_settings", "run_sweep"]
