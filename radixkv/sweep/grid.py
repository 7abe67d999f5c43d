"""A sweep grid: read ``GRID.toml``, check every key, expand it into cells.

A grid is a TOML file whose keys are ``radixkv replay`` flags (dashes as underscores),
plus ``traces`` and ``policies``. A value is one setting or a list of settings; every list
is an axis, and the cells are the cartesian product of the axes::

    traces = ["demo.jsonl", "customer_service.jsonl"]   # relative to the grid file
    policies = ["vllm:16", "vllm:32", "sglang:1", "none"]
    capacity_tokens = [5000, 20000, 100000]             # the pools
    # block_size = [16, 32]   (sizes: fill in policies given without a size)
    # mode = "concurrent"; model = "Llama-3.1-8B"; gpu = "A100-80GB"; max_num_seqs = [64, 256]

Values are checked as the command line checks them (the flag's own type and choices),
and each cell's pool flags as ``radixkv replay`` checks them; a bad grid raises a
:class:`~radixkv.errors.ConfigError` naming the grid file and the key. Trace paths may use
``~`` and ``$VARS`` (e.g. ``$RADIXKV_SHARED/traces/...``).

Cells are normalised before they are keyed, so that two spellings of one replay are one
cell: a block/page size goes into the policy's spec (``vllm`` with ``block_size = 32`` is
``vllm:32``), concurrent-mode knobs are dropped from sequential cells, one engine's
scheduler knobs from the concurrent cells that run under the other engine's rules (as
``radixkv compare`` does; a key that no cell reads is refused), and settings equal
to the flag's default are dropped (``max_num_seqs``: :func:`drops_setting`). A cell's key is the SHA-256 (first 16 hex digits) of
its normalised settings and its trace file's SHA-256, so renaming or moving a trace does
not re-run it, and changing a byte of it does.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from radixkv.errors import ConfigError, InputError

#: grid keys that are not ``radixkv replay`` flags
_OWN_KEYS = ("traces", "policies", "format", "per_engine_rule")
#: replay flags a grid may not set (outputs, progress, the positional trace/policy)
_NOT_GRID = ("trace", "policy", "json", "per_request", "quiet", "no_timing", "func", "help")
#: replay flags a sweep cell would accept and then not act on (its result is the summary
#: metrics alone): refused by name rather than ignored without a word
_NOT_IN_CELL = ("report", "timeline", "explain", "by", "isolation", "isolation_price", "miss_fix",
                "measure_last", "host_cache_tokens", "storage_cache_tokens")


@functools.lru_cache(maxsize=1)
def _replay_parser() -> argparse.ArgumentParser:
    """The ``radixkv replay`` parser: the one source of truth for every knob's name, type,
    choices and default. A grid's keys *are* that verb's flags, so the grid builds the
    verb's parser from the same definitions the command line does
    (:func:`radixkv.flags.replay.add_replay_flags`, below the CLI: the grid imports nothing
    of :mod:`radixkv.cli`); the logic the flags feed lives in the library,
    :mod:`radixkv.replay.settings` and :mod:`radixkv.replay.pool_settings`."""
    from radixkv.flags.replay import add_replay_flags

    p = argparse.ArgumentParser(prog="radixkv replay")
    add_replay_flags(p)
    return p


@functools.lru_cache(maxsize=1)
def _replay_actions() -> dict[str, argparse.Action]:
    """The ``radixkv replay`` parser's actions by destination (:func:`_replay_parser`)."""
    acts = {}
    for a in _replay_parser()._actions:
        if a.dest not in _NOT_GRID and a.dest != argparse.SUPPRESS:
            acts.setdefault(a.dest, a)
    return acts


def _concurrent_only(acts) -> set[str]:
    """Flags that only a concurrent replay reads: the replay parser's concurrent-replay
    group (:func:`radixkv.flags.concurrent.add_concurrent_args`, the group that holds
    ``--mode``) but ``--mode``; ``--max-num-batched-tokens`` also sizes vLLM's profiling
    pass, so it stays (it is defined with the pool flags)."""
    group = next(g for g in _replay_parser()._action_groups if any(a.dest == "mode" for a in g._group_actions))
    return {a.dest for a in group._group_actions} - {"mode", "max_num_batched_tokens", "help"}


def concurrent_only_keys() -> frozenset:
    """The grid knobs only a concurrent cell reads (:func:`_concurrent_only`): dropped from
    sequential cells, and shown ``n/a`` for them (:func:`radixkv.sweep.show.setting`)."""
    return frozenset(_concurrent_only(_replay_actions()))


def replay_defaults() -> dict:
    """Every grid knob's default, as ``radixkv replay`` has it (``policies``/``traces``
    excluded)."""
    d = {k: a.default for k, a in _replay_actions().items()}
    d["per_engine_rule"] = False
    d["format"] = None
    return d


def omitted_value(settings: dict, key: str):
    """The value a cell whose *settings* (a store row's ``settings``, with ``policy``) omit
    the knob *key* runs with: ``radixkv replay``'s default, except ``max_num_seqs``, whose
    default depends on the cell (:func:`radixkv.replay.settings.step_defaults`: the
    engine's on the GPU the pool is sized on, else 256). :mod:`radixkv.sweep.show` reads
    an omitted knob as it.

    Raises
    ------
    radixkv.errors.InputError
        ``max_num_seqs`` of a concurrent cell sized on an unknown GPU (field ``gpu``).
    """
    if key != "max_num_seqs":
        return replay_defaults().get(key)
    from radixkv.policies.registry import parse_policy

    ns = argparse.Namespace(**{**replay_defaults(), **settings})
    return _omitted_seqs(ns, parse_policy(settings["policy"]))


def drops_setting(settings: dict, key: str) -> bool:
    """Whether a cell's normalised *settings* (with ``policy``) leave out *key*: its value
    is the one the cell runs with when it is left out. ``max_num_seqs`` is left out only
    at 256 where the cell's default is 256 (:func:`omitted_value`), so the cells and
    their keys are those of before its default followed the GPU. The grid
    (:func:`load_grid`) and :mod:`radixkv.plan`'s cells drop keys by this rule."""
    from radixkv.policies.registry import parse_policy

    ns = argparse.Namespace(**{**replay_defaults(), **settings})
    return _drops(key, settings[key], ns, parse_policy(settings["policy"]), replay_defaults())


def _drops(key: str, value, ns, spec, defaults: dict) -> bool:
    if key == "max_num_seqs":
        from radixkv.replay.settings import STEP_DEFAULTS

        return value == STEP_DEFAULTS[1] == _omitted_seqs(ns, spec)
    return value == defaults.get(key)


def cell_expected(settings: dict) -> dict:
    """What a cell with normalised *settings* (with ``policy``) runs with today, for
    :func:`radixkv.sweep.store.done_keys` to check stored rows against: ``{"pool": where
    its pool comes from (:func:`radixkv.replay.pool_settings.pool_for_policy`), "steps":
    (max_num_batched_tokens, max_num_seqs) of a concurrent cell — the given knobs, else the
    defaults of :func:`radixkv.replay.settings.step_knobs` under the cell's scheduler rule
    — or None for a sequential one}``; an entry the settings cannot give today (an unknown
    GPU, a pool that does not fit: the cell's run reports it) is None."""
    from radixkv.policies.registry import parse_policy
    from radixkv.replay.pool_settings import pool_for_policy
    from radixkv.replay.settings import step_knobs

    ns = argparse.Namespace(**{**replay_defaults(), **settings})
    spec = parse_policy(settings["policy"])
    out = {"pool": None, "steps": None}
    try:
        out["pool"] = pool_for_policy(ns, spec, per_engine_rule=bool(ns.per_engine_rule))[1]
        if ns.mode == "concurrent":
            out["steps"] = step_knobs(ns, _scheduler_rule(ns, spec))[:2]
    except InputError:
        pass
    return out


def _omitted_seqs(ns, spec) -> int:
    """``max_num_seqs`` of the cell *ns* (policy *spec*) when its settings omit it."""
    from radixkv.replay.settings import STEP_DEFAULTS, step_defaults

    if ns.mode != "concurrent":
        return STEP_DEFAULTS[1]
    return step_defaults(ns, _scheduler_rule(ns, spec))[1]


@dataclass(frozen=True)
class TraceEntry:
    """A trace of the grid: the path as written, the resolved path, its SHA-256 (hex)."""

    text: str
    path: Path
    sha256: str


@dataclass
class Cell:
    """One replay of the grid.

    Attributes
    ----------
    key : str
        16 hex digits: SHA-256 of the normalised settings and the trace's SHA-256.
    trace : TraceEntry
    settings : dict
        Normalised settings that differ from ``radixkv replay``'s defaults, always with
        ``policy`` (a full spec label such as ``vllm:16``); JSON-ready.
    """

    key: str
    trace: TraceEntry
    settings: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Short readable description: trace file name and the settings."""
        rest = " ".join(f"{k}={v}" for k, v in sorted(self.settings.items()) if k != "policy")
        return f"{self.trace.path.name} {self.settings['policy']}" + (f" {rest}" if rest else "")


@dataclass
class Grid:
    """A parsed grid: its file, its traces and its cells (in grid order, duplicates merged)."""

    path: Path
    traces: list
    cells: list
    axes: dict


def file_sha256(path) -> str:
    """SHA-256 (hex) of a file's bytes; of a directory, over its files' relative paths
    and bytes in sorted order."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if f is not path:
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _listify(v):
    return list(v) if isinstance(v, list) else [v]


def _convert(key: str, value, action: argparse.Action, where: str):
    """One grid value, checked and converted as the command line would."""
    if isinstance(value, (dict, list)):
        raise ConfigError(f"key {key!r}: expected a value or a flat list of values, got {value!r}",
                          path=where, field=key)
    if action.nargs == 0:  # store_true / store_false flags
        if not isinstance(value, bool):
            raise ConfigError(f"key {key!r}: expected true or false, got {value!r}", path=where, field=key)
        return value
    if isinstance(value, bool):
        raise ConfigError(f"key {key!r}: expected a value, got {value!r}", path=where, field=key)
    if isinstance(value, float) and not math.isfinite(value):  # TOML's inf and nan
        raise ConfigError(f"key {key!r}: expected a finite number, got {value!r}", path=where, field=key)
    conv = action.type
    if conv is not None:
        text = repr(value) if isinstance(value, float) else str(value)
        try:
            value = conv(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
            raise ConfigError(f"key {key!r}: bad value {value!r} ({e})", path=where, field=key) from None
    elif not isinstance(value, str):
        raise ConfigError(f"key {key!r}: expected a string, got {value!r}", path=where, field=key)
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"key {key!r}: {value!r} is not one of {', '.join(map(str, action.choices))}",
                          path=where, field=key)
    return value


def load_grid(path, *, hash_traces: bool = True) -> Grid:
    """Read and expand ``GRID.toml``: :func:`_load_grid`, with the line of the key at fault
    added to its errors (the first line that sets the key; none when the key is not on a
    line of its own, e.g. a pool rule that two keys break together).

    Parameters and errors as :func:`_load_grid`'s.
    """
    try:
        return _load_grid(path, hash_traces=hash_traces)
    except ConfigError as e:
        line = None if e.line is not None or e.path != str(Path(path)) else _key_line(Path(path), e.field)
        if line is None:
            raise
        raise ConfigError(e.reason, path=e.path, line=line, field=e.field) from None


def _key_line(path: Path, key) -> int | None:
    """1-based line of the first ``KEY =`` of the grid file (top level or ``[grid]``), or None."""
    if not key:
        return None
    from radixkv.validate import read_text

    try:
        lines = read_text(path).splitlines()
    except (OSError, ValueError):
        return None
    pat = re.compile(rf"""^\s*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')\s*=""")
    return next((i + 1 for i, s in enumerate(lines) if pat.match(s)), None)


def _load_grid(path, *, hash_traces: bool = True) -> Grid:
    """Read and expand ``GRID.toml``.

    Parameters
    ----------
    path : str or Path
    hash_traces : bool
        Compute each trace's SHA-256 (needed for cell keys; reads every trace file once).

    Returns
    -------
    Grid

    Raises
    ------
    radixkv.errors.ConfigError
        An unreadable file, an unknown key, a bad value, a missing trace, or a cell that
        ``radixkv replay`` would refuse; the message names the grid file and the key.
    """
    from radixkv.util import tomllib

    path = Path(path)
    where = str(path)
    from radixkv.errors import InputError
    from radixkv.validate import read_text

    try:
        raw = tomllib.loads(read_text(path))  # a UTF-8 BOM is accepted
    except FileNotFoundError:
        raise ConfigError("no such grid file", path=where) from None
    except InputError as e:  # not UTF-8: names the line
        raise ConfigError(e.reason, path=where, line=e.line) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML ({e})", path=where) from None
    if isinstance(raw.get("grid"), dict) and len(raw) == 1:
        raw = raw["grid"]  # a [grid] table is accepted too
    acts = _replay_actions()
    known = set(acts) | set(_OWN_KEYS)
    for key in raw:
        if key not in known:
            alias = key.replace("-", "_")
            hint = f" (did you mean {alias!r}?)" if alias in known else ""
            raise ConfigError(f"unknown key {key!r}{hint}; grid keys are 'traces', 'policies', 'format', "
                              f"'per_engine_rule' and the flags of `radixkv replay` with underscores",
                              path=where, field=key)
    for key in raw:
        if key in _NOT_IN_CELL:
            raise ConfigError(f"{key!r} is an output or analysis flag of `radixkv replay` that a sweep cell does "
                              "not run (a cell keeps the summary metrics only); run `radixkv replay` on the cell "
                              "you want it for", path=where, field=key)
    for key in ("traces", "policies"):
        if key not in raw:
            raise ConfigError(f"missing key {key!r}", path=where, field=key)
        vals = _listify(raw[key])
        if not vals or not all(isinstance(v, str) and v.strip() for v in vals):
            raise ConfigError(f"key {key!r}: expected a non-empty string or list of strings", path=where, field=key)
    if "format" in raw and not isinstance(raw["format"], str):
        raise ConfigError("key 'format': expected a string", path=where, field="format")
    if "per_engine_rule" in raw and not all(isinstance(v, bool) for v in _listify(raw["per_engine_rule"])):
        raise ConfigError("key 'per_engine_rule': expected true or false", path=where, field="per_engine_rule")

    # traces: resolve, check, hash (once each)
    traces = []
    for text in _listify(raw["traces"]):
        p = Path(os.path.expandvars(os.path.expanduser(text)))
        if not p.is_absolute():
            p = path.parent / p
        if not p.exists():
            raise ConfigError(f"trace {text!r}: no such file or directory ({p})", path=where, field="traces")
        traces.append(TraceEntry(text, p, file_sha256(p) if hash_traces else ""))

    # axes: converted values per key
    axes: dict = {}
    for key, value in raw.items():
        if key in ("traces", "format"):
            continue
        vals = _listify(value)
        if not vals:
            raise ConfigError(f"key {key!r}: an empty list makes an empty grid", path=where, field=key)
        if key == "policies":
            axes[key] = [v.strip() for v in vals]
        elif key == "per_engine_rule":
            axes[key] = vals
        else:
            axes[key] = [_convert(key, v, acts[key], where) for v in vals]
    defaults = replay_defaults()
    conc_only = _concurrent_only(acts)

    keys = list(axes)
    cells: dict[str, Cell] = {}
    any_concurrent = False
    for tr in traces:
        for combo in itertools.product(*(axes[k] for k in keys)):
            s = dict(zip(keys, combo))
            settings = _normalise(s, defaults, conc_only, where)
            any_concurrent |= settings.get("mode") == "concurrent"
            if "format" in raw:
                settings["format"] = raw["format"]
            key = cell_key(tr.sha256, settings)
            cells.setdefault(key, Cell(key, tr, settings))
    unused = [k for k in keys if k in conc_only and not any_concurrent]
    if unused:
        raise ConfigError(f"key {unused[0]!r} is a concurrent-mode knob but no cell has mode = \"concurrent\"",
                          path=where, field=unused[0])
    if any_concurrent:
        _refuse_unread_scheduler_knobs(keys, axes, cells.values(), defaults, where)
    _refuse_unused_memory_knobs(keys, cells.values(), where)
    return Grid(path, traces, list(cells.values()), {k: axes[k] for k in keys})


def _normalise(s: dict, defaults: dict, conc_only: set, where: str) -> dict:
    """One cell's settings: the policy's spec with its size, concurrent knobs only in
    concurrent cells, defaults dropped; checked as ``radixkv replay`` checks its flags."""
    from radixkv.flags.moot import refuse_moot_flags
    from radixkv.policies.registry import parse_policy
    from radixkv.replay.pool_settings import check_pool_args

    s = dict(s)
    explicit_pool = any(s.get(k) is not None for k in ("capacity_tokens", "num_gpu_blocks", "max_total_num_tokens"))
    if s.get("mode", defaults["mode"]) != "concurrent" and explicit_pool:
        for k in ("model", "gpu", "tp"):  # they only price steps, which a sequential replay does not do
            s.pop(k, None)
    ns = argparse.Namespace(**{**defaults, **s})
    try:
        spec = parse_policy(s["policies"], block_size=ns.block_size, page_size=ns.page_size)
    except ConfigError as e:
        raise ConfigError(e.reason, path=where, field="policies") from None
    try:
        check_pool_args(ns)
    except ConfigError as e:
        raise ConfigError(e.reason, path=where, field=e.field) from None
    try:  # an unknown model or GPU stops the grid here, not each of its cells when it runs
        from radixkv.memory.presets import get_gpu, get_model

        if ns.gpu is not None:
            get_gpu(ns.gpu)
        if ns.model is not None:
            get_model(ns.model)
    except InputError as e:
        raise ConfigError(e.reason, path=where, line=_key_line(Path(where), e.field) if e.field else None,
                          field=e.field) from None
    _refuse_routing_without_replicas(s, ns, where)
    try:  # a key the other keys make moot, as radixkv replay refuses the flag (radixkv.flags.moot)
        refuse_moot_flags(ns)
    except ConfigError as e:
        raise ConfigError(f"key {e.field!r}: {e.reason}", path=where, field=e.field) from None
    if ns.replicas is not None:  # the routing the replay refuses (global pool on one clock, ...)
        from radixkv.replay.settings import routed

        try:
            routed(ns)
        except ConfigError as e:
            raise ConfigError(f"key {e.field!r}: {e.reason}", path=where, field=e.field) from None
    concurrent = ns.mode == "concurrent"
    if (concurrent or ns.replicas is not None) and getattr(spec.build_class, "needs_trace", False):
        from radixkv.policies.registry import sequential_only_message

        raise ConfigError(sequential_only_message(spec), path=where, field="policies")
    if concurrent and not (ns.model and ns.gpu):
        raise ConfigError("mode = \"concurrent\" prices each step on a model and a GPU: set 'model' and 'gpu'",
                          path=where, field="model" if not ns.model else "gpu")
    if concurrent:
        ns = _own_engine_knobs(s, ns, spec, where)
    out = {"policy": spec.label}
    for k, v in s.items():
        if k in ("policies", "block_size", "page_size"):
            continue
        if k in conc_only and not concurrent:
            continue
        if _drops(k, v, ns, spec, defaults):
            continue
        out[k] = v
    return out


def _refuse_routing_without_replicas(s: dict, ns, where: str) -> None:
    """Refuse a cell that sets ``router`` or ``kv_pool`` with no ``replicas``: the replay
    would refuse it when the cell runs (:func:`radixkv.replay.settings.routed`: "--router
    and --kv-pool need --replicas N"), so the grid is refused when it is read.

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the grid file and the key (``router`` or ``kv_pool``; its line is added by
        :func:`load_grid`).
    """
    if ns.replicas is not None:
        return
    for key in ("router", "kv_pool"):
        if key in s:
            raise ConfigError(f"key {key!r} routes requests over several replicas, but the grid sets no "
                              f"'replicas': add replicas = N (N ≥ 2) or drop {key!r}", path=where, field=key)


def _scheduler_rule(ns, spec) -> str:
    """The scheduler rule (``"vllm"`` or ``"sglang"``) a concurrent cell runs under: its
    ``admission``, else the admission rule of the class that runs (``NoCache`` under
    ``enable_prefix_caching = false``, ``StaticReservedCache`` under
    ``static_reserved_fraction``, else the policy's), as
    :func:`radixkv.replay.settings.policy_from_args` builds it."""
    if getattr(ns, "admission", None):
        return ns.admission
    cls = spec.build_class
    if not getattr(ns, "enable_prefix_caching", True):
        from radixkv.policies.no_cache import NoCache as cls
    elif getattr(ns, "static_reserved_fraction", None) is not None:
        from radixkv.policies.static_reserved import StaticReservedCache as cls
    return getattr(cls, "admission_rule", "vllm")


def _own_engine_knobs(s: dict, ns, spec, where: str):
    """A concurrent cell's settings without the other engine's scheduler knobs
    (:data:`radixkv.replay.settings.VLLM_ONLY_KNOBS` / ``SGLANG_ONLY_KNOBS``), as ``radixkv
    compare`` reads them for each policy (:func:`radixkv.replay.settings.args_for_rule`):
    removed from *s* in place; a key that no cell reads is refused by
    :func:`_refuse_unread_scheduler_knobs`. Then the cell's scheduler flags are checked as
    its replay checks them (:func:`radixkv.replay.scheduler.rule_of`), so a cell the replay
    would refuse stops the grid before anything runs.

    Returns the namespace *ns* with the dropped knobs at their defaults.

    Raises
    ------
    radixkv.errors.ConfigError
        The replay's message, naming the grid file and the key (``field``).
    """
    import dataclasses

    from radixkv.replay.scheduler import rule_of
    from radixkv.replay.settings import SGLANG_ONLY_KNOBS, VLLM_ONLY_KNOBS, concurrent_config_from_args

    rule = _scheduler_rule(ns, spec)
    other = SGLANG_ONLY_KNOBS if rule == "vllm" else VLLM_ONLY_KNOBS
    for k, default in other.items():
        if k in s:
            del s[k]
            setattr(ns, k, default)
    try:
        rule_of(None, dataclasses.replace(concurrent_config_from_args(ns, rule=rule), admission=rule))
    except InputError as e:  # ConfigError, or an unknown GPU (InputError) the step defaults look up
        if e.field == "disable_priority_preemption" and "enable_priority_scheduling" in s:
            # the replay names the flag to add; a grid adds the key, beside the key that asked for it
            reason = e.reason.replace("add --disable-priority-preemption",
                                      "add disable_priority_preemption = true to the grid")
            raise ConfigError(reason, path=where, line=_key_line(Path(where), "enable_priority_scheduling"),
                              field="enable_priority_scheduling") from None
        raise ConfigError(e.reason, path=where, line=_key_line(Path(where), e.field) if e.field else None,
                          field=e.field) from None
    return ns


def _refuse_unread_scheduler_knobs(keys, axes: dict, cells, defaults: dict, where: str) -> None:
    """A grid key of one engine's scheduler knobs (:data:`radixkv.replay.settings.VLLM_ONLY_KNOBS`,
    ``SGLANG_ONLY_KNOBS``) set away from its default where no cell runs under that engine's
    rules (:func:`_own_engine_knobs` dropped it from every cell): refused naming the key,
    rather than a grid whose every cell ignores it.

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the grid file and the key (``field``).
    """
    from radixkv.replay.settings import SGLANG_ONLY_KNOBS, VLLM_ONLY_KNOBS

    for key in keys:
        engine = "SGLang" if key in SGLANG_ONLY_KNOBS else "vLLM" if key in VLLM_ONLY_KNOBS else None
        if engine is None or all(v == defaults.get(key) for v in axes[key]):
            continue
        if not any(key in c.settings for c in cells):
            rule = engine.lower()
            raise ConfigError(f"key {key!r} is read by {engine}'s scheduler rules only, but no concurrent cell runs "
                              f"under them (admission = \"{rule}\" or a policy whose admission rule is {rule}'s), "
                              "so every cell would ignore it", path=where, field=key)


#: the memory model's knob of each engine's pool rule (radixkv.replay.pool_settings)
_MEMORY_KNOB = {"gpu_memory_utilization": "vllm", "mem_fraction_static": "sglang"}


def _refuse_unused_memory_knobs(keys, cells, where: str) -> None:
    """A grid axis of one engine's memory knob where no cell sizes a pool by that engine's
    rule (the memory model uses vLLM's rule for every policy unless ``per_engine_rule``):
    every value would give the same pool, so the axis is refused naming the key, as
    ``radixkv replay``/``compare`` refuse the flag."""
    from radixkv.policies.registry import parse_policy

    used = set()
    for c in cells:
        st = c.settings
        if any(st.get(k) is not None for k in ("capacity_tokens", "num_gpu_blocks", "max_total_num_tokens",
                                                "pool_from_log")) or not (st.get("model") and st.get("gpu")):
            continue
        own = parse_policy(st["policy"]).cls.engine
        used.add(own if st.get("per_engine_rule") and own in ("vllm", "sglang") else "vllm")
    for key in keys:
        engine = _MEMORY_KNOB.get(key)
        if engine is not None and engine not in used:
            how = ("set per_engine_rule = true with an SGLang policy" if engine == "sglang"
                   else "a vLLM policy, or per_engine_rule = false, sized by model and gpu")
            raise ConfigError(f"key {key!r} sizes a pool by {engine}'s memory rule, but no cell's pool is sized by "
                              f"that rule, so every value gives the same pool ({how})", path=where, field=key)


def cell_key(trace_sha256: str, settings: dict) -> str:
    """The stable key of a cell: SHA-256 of ``{"trace_sha256": ..., **settings}`` as
    sorted-key JSON, first 16 hex digits."""
    doc = json.dumps({"trace_sha256": trace_sha256, "settings": settings}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()[:16]
