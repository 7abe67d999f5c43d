"""The results store of a sweep: one JSON line per finished cell, one file per cell.

Layout of the output directory ``DIR``:

=========================  ==============================================================
``DIR/cells/<key>.jsonl``  one finished cell: a single JSON line (see :func:`make_row`)
``DIR/errors/<key>.json``  the last failure of a cell that has not finished (a rerun
                           retries it and removes this file when it succeeds)
``DIR/.traces/<sha>/``     the sweep's traces as memory-mappable ``.npy`` columns
=========================  ==============================================================

Each cell file is written atomically (a temporary file in the same folder, then
``os.replace``), so a cell is either finished and complete or absent — a sweep killed at
any moment loses at most the cells that were running. Files are named by the cell's key,
so concurrent writers never touch the same file and a rerun knows what is done by
listing ``cells/``.

A row (``json.loads`` of a cell file) holds ``key``; ``trace`` (``path`` as the grid
wrote it, ``sha256``, ``name``, ``unit_tokens``); ``settings`` (the normalised grid
settings that differ from ``radixkv replay``'s defaults, with ``policy``); ``metrics``
(every summary metric of the replay; a metric the mode does not model is absent or
null); ``pool`` (where the pool size came from); ``timing_s`` (``trace_load``,
``compile``, ``replay``, ``cell`` seconds and ``prompt_tokens_per_s``); ``radixkv`` (the
version) and ``worker`` (``host:pid``).
"""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.errors import InputError
from radixkv.util import _finite, atomic_write_text

CELLS = "cells"
ERRORS = "errors"
TRACES = ".traces"


def _line(obj) -> str:
    return json.dumps(_finite(obj), sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"


def make_row(cell, result: dict, trace_meta: dict) -> dict:
    """The stored row of a finished cell (see the module docstring)."""
    from radixkv import __version__

    return {
        "key": cell.key,
        "trace": {"path": cell.trace.text, "sha256": cell.trace.sha256, **trace_meta},
        "settings": cell.settings,
        "metrics": result["metrics"],
        "pool": result["pool"],
        "timing_s": result["timing_s"],
        "radixkv": __version__,
        "worker": result.get("worker"),
    }


def write_row(out_dir, row: dict) -> None:
    """Store a finished cell (atomically) and drop its old error record, if any."""
    out_dir = Path(out_dir)
    (out_dir / CELLS).mkdir(exist_ok=True)  # the sweep's own folder: made here, not by atomic_write_text
    atomic_write_text(out_dir / CELLS / f"{row['key']}.jsonl", _line(row))
    err = out_dir / ERRORS / f"{row['key']}.json"
    if err.exists():
        err.unlink()


def write_error(out_dir, cell, result: dict) -> None:
    """Record a failed cell's error (atomically); the cell stays unfinished."""
    from radixkv import __version__

    doc = {"key": cell.key, "trace": {"path": cell.trace.text, "sha256": cell.trace.sha256},
           "settings": cell.settings, "error": result["error"], "radixkv": __version__,
           "worker": result.get("worker")}
    (Path(out_dir) / ERRORS).mkdir(exist_ok=True)  # the sweep's own folder
    atomic_write_text(Path(out_dir) / ERRORS / f"{cell.key}.json", _line(doc))


def done_keys(out_dir, expected: dict | None = None) -> set[str]:
    """Keys of the finished cells in *out_dir* (empty when it does not exist).

    A cell file that is not a complete row (truncated by a copy or a full disk, edited,
    not UTF-8) does not count: the cell is run again and its file replaced, with an
    :class:`~radixkv.errors.InputWarning` naming the file.

    *expected*: ``{key: {"pool": dict, "steps": (max_num_batched_tokens, max_num_seqs)
    or None}}``, the pool each cell runs on today (its ``pool`` record, as
    :func:`radixkv.replay.pool_settings.pool_for_policy` describes it) and the step knobs
    of a concurrent cell (:func:`radixkv.sweep.grid.cell_expected`); a key may be
    absent, or either entry None (not checked). A cell's key holds only the settings that
    differ from the defaults, so a row stored before a default changed (the memory
    model's pool, the step knobs that follow the engine's defaults on the GPU) has the key
    of today's cell: a row whose ``pool`` differs, or whose ``metrics.scheduler`` records
    other knobs or none (written before radixkv recorded them), does not count either,
    with a warning naming the file."""
    import warnings

    from radixkv.errors import InputWarning

    d = Path(out_dir) / CELLS
    if not d.is_dir():
        return set()
    keys = set()
    for p in sorted(d.iterdir()):
        if not p.name.endswith(".jsonl") or p.name.startswith("."):
            continue
        try:
            row = _check_row(_read_row(p), p)
        except InputError as e:
            warnings.warn(InputWarning(f"{e.reason}: the cell is run again", path=e.path, line=e.line,
                                       field=e.field), stacklevel=2)
            continue
        key = p.name[: -len(".jsonl")]
        stale = _stale(row, (expected or {}).get(key) or {})
        if stale:
            warnings.warn(InputWarning(f"{stale[1]}: the cell is run again", path=p, field=stale[0]), stacklevel=2)
            continue
        keys.add(key)
    return keys


def _stale(row: dict, want: dict) -> tuple[str, str] | None:
    """``(field, reason)`` when a stored *row* was not run as its cell runs today (see
    :func:`done_keys`), else None."""
    pool = want.get("pool")
    if pool is not None and row.get("pool") != json.loads(json.dumps(pool)):
        return "pool", f"ran on the pool {row.get('pool')}; the cell now runs on {pool}"
    steps = want.get("steps")
    if steps is not None:
        got = row["metrics"].get("scheduler")
        have = None if not isinstance(got, dict) else (got.get("max_num_batched_tokens"), got.get("max_num_seqs"))
        if have != tuple(steps):
            ran = ("records no step knobs (a row of an older radixkv, or edited)" if have is None else
                   f"ran with max_num_batched_tokens {have[0]}, max_num_seqs {have[1]}")
            return "metrics.scheduler", (f"{ran}; the cell now runs with max_num_batched_tokens {steps[0]}, "
                                         f"max_num_seqs {steps[1]}")
    return None


def _read_row(p: Path):
    from radixkv import validate

    text = validate.read_text(p)
    if not text.endswith("\n"):  # every row is written as one line ending in a newline
        raise InputError("truncated: a cell file is one JSON line ending in a newline", path=p,
                         line=text.count("\n") + 1)
    return validate.loads(text, path=p)


def _check_row(row, p: Path) -> dict:
    """*row* checked as a cell row of file *p* (module docstring); returns it."""
    from radixkv import validate

    validate.table(row, path=p, field=None, line=1, what="a sweep cell row (a JSON object)")
    if row.get("key") != p.name[: -len(".jsonl")]:
        raise InputError("not a sweep cell row (its key does not match the file name)", path=p, line=1, field="key")
    for k in ("trace", "settings", "metrics"):
        validate.table(row.get(k), path=p, line=1, field=k)
    for k in ("path", "sha256"):
        if not isinstance(row["trace"].get(k), str):
            raise InputError("must be a string", path=p, line=1, field=f"trace.{k}")
    if not isinstance(row["settings"].get("policy"), str):
        raise InputError("must be a policy spec (a string)", path=p, line=1, field="settings.policy")
    for k in ("pool", "timing_s"):
        if row.get(k) is not None:
            validate.table(row[k], path=p, line=1, field=k)
    for k, v in row["metrics"].items():
        # numbers (finite, or null: n/a); flags (``overloaded``) and structured values pass as they are
        if not isinstance(v, (str, dict, list, bool)):
            validate.number(v, path=p, line=1, field=f"metrics.{k}", null=True)
    return row


def read_rows(out_dir) -> list[dict]:
    """Every finished cell's row, sorted by key (no pandas needed).

    Raises
    ------
    radixkv.errors.InputError
        *out_dir* has no ``cells/`` folder, or a cell file is not a complete row: not
        UTF-8, truncated, invalid JSON, ``NaN``, a missing or mistyped field (the message
        names the file and the field).
    """
    d = Path(out_dir) / CELLS
    if not d.is_dir():
        raise InputError("not a sweep results directory (no cells/ folder)", path=out_dir)
    rows = []
    for p in sorted(d.iterdir()):
        if not p.name.endswith(".jsonl") or p.name.startswith("."):
            continue
        rows.append(_check_row(_read_row(p), p))
    return rows


def read_errors(out_dir) -> list[dict]:
    """The error records of the cells that failed and have not finished since.

    Raises
    ------
    radixkv.errors.InputError
        A record that is not one JSON object (the message names the file)."""
    from radixkv import validate

    d = Path(out_dir) / ERRORS
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        doc, _ = validate.read_json(p)
        out.append(validate.table(doc, path=p, field=None, line=1, what="a sweep error record (a JSON object)"))
    return out


def flatten_row(row: dict) -> dict:
    """One flat record of a row: ``key``, ``trace`` (path), ``trace_sha256``,
    ``trace_name``, the settings (grid keys), every metric (``hit_length_histogram``
    stays a dict), ``pool.<field>``, ``timing_s.<field>``, ``radixkv``, ``worker``."""
    out = {"key": row["key"], "trace": row["trace"]["path"], "trace_sha256": row["trace"]["sha256"],
           "trace_name": row["trace"].get("name")}
    out.update(row["settings"])
    out.update(row["metrics"])
    out.update({f"pool.{k}": v for k, v in row.get("pool", {}).items()})
    out.update({f"timing_s.{k}": v for k, v in row.get("timing_s", {}).items()})
    out["radixkv"] = row.get("radixkv")
    out["worker"] = row.get("worker")
    return out


def load_results(out_dir):
    """The finished cells of a sweep as a :class:`pandas.DataFrame`, one row per cell.

    Columns are those of :func:`flatten_row`. A grid key a cell left at its default
    (which the store omits) is filled with ``radixkv replay``'s default, so every row
    has every grid key. Metrics a mode does not model are NaN / None.

    Raises
    ------
    ImportError
        pandas is not installed; the message gives the install command (``pip install
        'radixkv[dask]'``, the extra of pyproject.toml, or ``pip install pandas``).
    radixkv.errors.InputError
        See :func:`read_rows`.
    """
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("radixkv.sweep.load_results needs pandas, which radixkv's base install does not "
                          "include: pip install 'radixkv[dask]' (the sweep extra: pandas and dask), or pip install "
                          "pandas; without pandas, radixkv.sweep.read_rows gives the same rows as dicts and "
                          "`radixkv sweep-show DIR` prints them") from None
    from radixkv.sweep.grid import omitted_value, replay_defaults

    rows = read_rows(out_dir)
    flat = [flatten_row(r) for r in rows]
    setting_keys = sorted({k for r in rows for k in r["settings"]})
    defaults = replay_defaults()
    for row, rec in zip(rows, flat):
        for k in setting_keys:
            if k not in rec and k in defaults:
                rec[k] = omitted_value(row["settings"], k)
    return pd.DataFrame(flat)
