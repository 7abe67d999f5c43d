"""Read and validate a ``radixkv check`` configuration (TOML).

A configuration names traces, policies on pools, and assertions over the (trace, policy)
pairs; paths are relative to the configuration file and ``$NAME`` / ``${NAME}`` are
expanded from the environment (e.g. ``${RADIXKV_SHARED}/traces/...``)::

    baseline = "radixkv-baseline.json"     # optional: for [assert.baseline] bounds

    [[trace]]
    name = "demo"                          # optional (default: the file's stem)
    path = "traces/demo.jsonl"             # a file, a directory or a glob (one trace per match)
    format = "native"                      # optional (default: detected from content)
    limit = 1000                           # optional: the first K requests

    [[policy]]
    policy = "vllm:16"                     # NAME[:SIZE], as --policy takes it
    capacity_tokens = 20000                # or num_gpu_blocks (vLLM) / max_total_num_tokens (SGLang)
    name = "vllm16-small"                  # optional label (default: the spec); must be unique
    traces = ["demo"]                      # optional: the traces it runs on (default: all)
    verify = false                         # optional, vllm only: compare ids on every hash hit

    [[assert]]
    trace = "demo"                         # optional: a trace name or glob (default: every trace)
    policy = "vllm*"                       # optional: a policy label or glob (default: every policy)
    min_token_hit_rate = 0.30
    max_alignment_loss_share = 0.05
    min_cached_tokens = 5000               # cached-token capacity, second-half mean (tokens)
    max_evicted_tokens = 2000000
    golden = "golden/run.jsonl"            # per-request hit tokens equal this file's (by id, in order)
    [assert.baseline]                      # no worse than the baseline file by more than:
    token_hit_rate = 0.005                 #   (absolute; higher is better)
    evicted_tokens = 1000                  #   (lower is better)

Every key is checked: an unknown or mistyped key, a wrong type, a bad policy spec, a
trace path that matches nothing, a selector that matches no (trace, policy) pair is a
:class:`radixkv.errors.ConfigError` naming the file, the line (when it can be found)
and the key, such as ``policy[2].capcity_tokens``.
"""
from __future__ import annotations

import fnmatch
import glob
import inspect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from radixkv.errors import ConfigError
from radixkv.policies.registry import PolicySpec, PoolSpec, native_pool_knob, parse_policy

from radixkv.util import tomllib
from radixkv.validate import finite

#: threshold keys of an ``[[assert]]`` → (summary metric, "min" | "max")
BOUND_KEYS = {
    "min_token_hit_rate": ("token_hit_rate", "min"),
    "max_alignment_loss_share": ("alignment_loss_share", "max"),
    "min_cached_tokens": ("cached_tokens_second_half_mean", "min"),
    "max_evicted_tokens": ("evicted_tokens", "max"),
}

#: metrics ``[assert.baseline]`` may bound → True when higher is better
BASELINE_METRICS = {
    "token_hit_rate": True,
    "request_hit_rate": True,
    "mean_request_hit_ratio": True,
    "cached_tokens_second_half_mean": True,
    "alignment_loss_share": False,
    "evicted_tokens": False,
}
#: short names accepted in ``[assert.baseline]``
BASELINE_ALIASES = {"cached_tokens": "cached_tokens_second_half_mean"}

_POOL_KEYS = ("capacity_tokens", "num_gpu_blocks", "max_total_num_tokens")


@dataclass(frozen=True)
class TraceEntry:
    """One trace to replay: ``name`` (unique label), resolved ``path``, ``format``, ``limit``."""

    name: str
    path: Path
    format: str | None
    limit: int | None


@dataclass(frozen=True)
class PolicyEntry:
    """One policy on one pool: ``label`` (unique), ``spec``, ``pool``, the trace names it
    runs on (None: all) and constructor ``options`` (e.g. ``verify``)."""

    label: str
    spec: PolicySpec
    pool: PoolSpec
    traces: tuple | None
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Assertion:
    """One bound on one (trace, policy) pair.

    ``kind`` is ``"min"``, ``"max"`` (``bound`` is the threshold), ``"baseline"`` (``bound``
    is the tolerated worsening; ``higher_is_better`` says which way is worse) or
    ``"golden"`` (``golden`` is the file of per-request hits; the value is the number of
    requests whose hit differs, bound 0).
    """

    trace: str
    policy: str
    metric: str
    kind: str
    bound: float
    source: str  # the config key, e.g. "assert[1].min_token_hit_rate"
    higher_is_better: bool = True
    golden: Path | None = None

    @property
    def name(self) -> str:
        """Short name of what is asserted, e.g. ``token_hit_rate >= 0.3``."""
        if self.kind == "min":
            return f"{self.metric} >= {self.bound:g}"
        if self.kind == "max":
            return f"{self.metric} <= {self.bound:g}"
        if self.kind == "golden":
            return f"hit_tokens == golden {self.golden.name}"
        return f"{self.metric} within {self.bound:g} of baseline"


@dataclass(frozen=True)
class CheckConfig:
    """A validated configuration: traces, policies, the (trace, policy) pairs to replay
    (config order), the assertions, and the baseline file (None when not given)."""

    path: Path
    traces: list
    policies: list
    pairs: list
    assertions: list
    baseline: Path | None

    def input_files(self) -> list:
        """The files a check reads besides the baseline: this configuration, every trace
        and every golden file (no output, the baseline included, may replace one)."""
        golden = [a.golden for a in self.assertions if a.golden is not None]
        return list(dict.fromkeys([self.path, *(t.path for t in self.traces), *golden]))


class _Ctx:
    """The config file's text, to find the line a key is on for error messages."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines = text.splitlines()

    def line_of(self, table: str | None, index: int | None, key: str | None) -> int | None:
        """1-based line of *key* inside the *index*-th ``[[table]]`` (or the top level)."""
        start, end = 0, len(self.lines)
        if table is not None:
            heads = [i for i, s in enumerate(self.lines) if re.match(rf"\s*\[\[\s*{re.escape(table)}\s*\]\]", s)]
            if index is None or index >= len(heads):
                return None
            start = heads[index]
            nxt = [i for i, s in enumerate(self.lines) if i > start and re.match(r"\s*\[\[[^\]]+\]\]", s)]
            end = nxt[0] if nxt else len(self.lines)
            if key is None:
                return start + 1
        elif key is not None:
            firsts = [i for i, s in enumerate(self.lines) if re.match(r"\s*\[", s)]
            end = firsts[0] if firsts else len(self.lines)
        if key is None:
            return None
        pat = re.compile(rf"(^|[\s{{,.]){re.escape(key)}\s*=")
        for i in range(start, end):
            if pat.search(self.lines[i].split("#", 1)[0]):
                return i + 1
        return start + 1 if table is not None else None

    def error(self, message: str, *, table=None, index=None, key=None, field_name=None) -> ConfigError:
        where = field_name
        if where is None:
            where = key if table is None else f"{table}[{index + 1}]" + (f".{key}" if key else "")
        return ConfigError(message, path=self.path, line=self.line_of(table, index, key), field=where)


def _expand(text: str, ctx: _Ctx, **where) -> str:
    """Expand ``$NAME`` and ``${NAME}``; an unset variable is an error naming it.

    A variable that starts *text* and holds a relative path (``RADIXKV_SHARED=../shared``)
    is taken relative to the current folder, where the shell that set it was, not to the
    configuration file's folder: it is made absolute."""

    def sub(m):
        name = m.group(1) or m.group(2)
        if name not in os.environ:
            raise ctx.error(f"environment variable ${name} is not set", **where)
        value = os.environ[name]
        return os.path.abspath(value) if m.start() == 0 and value and not os.path.isabs(value) else value

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text)


def _check_keys(d: dict, allowed, ctx: _Ctx, table: str, index: int) -> None:
    for k in d:
        if k not in allowed:
            raise ctx.error(f"unknown key {k!r}; known: {', '.join(sorted(allowed))}", table=table, index=index, key=k)


def _typed(d: dict, key: str, types, ctx: _Ctx, table: str, index: int, what: str):
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ctx.error(f"must be {what}, got {v!r}", table=table, index=index, key=key)
    if not isinstance(v, types):
        raise ctx.error(f"must be {what}, got {v!r}", table=table, index=index, key=key)
    return v


def _list_of_tables(doc: dict, key: str, ctx: _Ctx) -> list:
    v = doc.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise ctx.error(f"must be an array of tables: write [[{key}]] sections", key=key)
    return v


def load_config(path) -> CheckConfig:
    """Read and validate the ``radixkv check`` configuration at *path*.

    Parameters
    ----------
    path : str or Path
        A TOML file (schema: this module's docstring).

    Returns
    -------
    CheckConfig

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the file, line and key of the first problem: TOML syntax, an unknown key,
        a wrong type or range, a bad policy spec, a trace path matching nothing, a
        duplicate name, an assertion that selects no (trace, policy) pair.
    """
    path = Path(path)
    from radixkv.validate import read_text

    try:
        text = read_text(path)  # a UTF-8 BOM is accepted, as in trace files; another encoding names the line
    except FileNotFoundError:
        raise ConfigError("no such configuration file", path=path) from None
    except IsADirectoryError:
        raise ConfigError("is a folder, not a configuration file", path=path) from None
    ctx = _Ctx(path, text)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        line = int(m.group(1)) if m else None
        key = None
        if line is not None and line <= len(ctx.lines):
            km = re.match(r"\s*([\w.\-\"]+)\s*=", ctx.lines[line - 1])
            key = km.group(1) if km else None
        raise ConfigError(f"not valid TOML: {re.sub(r' [(]at line.*[)]', '', msg)}", path=path, line=line,
                          field=key) from None
    base = path.resolve().parent
    top = {"baseline", "trace", "policy", "assert"}
    for k in doc:
        if k not in top:
            raise ctx.error(f"unknown top-level key {k!r}; known: {', '.join(sorted(top))}", key=k)

    baseline = None
    if "baseline" in doc:
        if not isinstance(doc["baseline"], str) or not doc["baseline"]:
            raise ctx.error("must be a file path (a string)", key="baseline")
        baseline = base / _expand(doc["baseline"], ctx, key="baseline")

    traces = _read_traces(_list_of_tables(doc, "trace", ctx), ctx, base)
    if not traces:
        raise ctx.error("no trace: add a [[trace]] section with a path", key="trace")
    policies = _read_policies(_list_of_tables(doc, "policy", ctx), ctx, {t.name for t in traces})
    if not policies:
        raise ctx.error("no policy: add a [[policy]] section (policy = \"vllm:16\", capacity_tokens = N)",
                        key="policy")
    pairs = [(t.name, p.label) for t in traces for p in policies if p.traces is None or t.name in p.traces]
    assertions = _read_assertions(_list_of_tables(doc, "assert", ctx), ctx, base, pairs)
    if baseline is None:
        for a in assertions:
            if a.kind == "baseline":
                raise ctx.error(f"{a.source} bounds the baseline, but no top-level baseline = \"FILE\" is given",
                                key="baseline", field_name="baseline")
    return CheckConfig(path=path, traces=traces, policies=policies, pairs=pairs, assertions=assertions,
                       baseline=baseline)


def _read_traces(rows, ctx: _Ctx, base: Path) -> list:
    out, names = [], {}
    for i, t in enumerate(rows):
        _check_keys(t, {"name", "path", "format", "limit"}, ctx, "trace", i)
        p = _typed(t, "path", str, ctx, "trace", i, "a path (a string)")
        if not p:
            raise ctx.error("missing: the trace file, directory or glob", table="trace", index=i, key="path")
        fmt = _typed(t, "format", str, ctx, "trace", i, "a format name (a string)")
        if fmt is not None:
            from radixkv.errors import InputError
            from radixkv.trace.detect import canonical_format

            try:
                fmt = canonical_format(fmt)
            except InputError as e:
                raise ctx.error(e.reason, table="trace", index=i, key="format") from None
        limit = _typed(t, "limit", int, ctx, "trace", i, "a whole number of requests")
        if limit is not None and limit < 1:
            raise ctx.error(f"must be ≥ 1, got {limit}", table="trace", index=i, key="limit")
        name = _typed(t, "name", str, ctx, "trace", i, "a string")
        pattern = _expand(p, ctx, table="trace", index=i, key="path")
        full = Path(pattern) if Path(pattern).is_absolute() else base / pattern
        if glob.has_magic(str(full)):
            matches = sorted(Path(m) for m in glob.glob(str(full)))
            if not matches:
                raise ctx.error(f"glob {pattern!r} matches no file (relative to {base})", table="trace", index=i,
                                key="path")
        else:
            if not full.exists():
                raise ctx.error(f"{full} does not exist", table="trace", index=i, key="path")
            matches = [full]
        for m in matches:
            label = m.stem if (name is None or len(matches) > 1) else name
            if name is not None and len(matches) > 1:
                label = f"{name}/{m.stem}"
            if label in names:
                raise ctx.error(f"trace name {label!r} is used twice (also trace[{names[label] + 1}]); "
                                f"give a distinct name", table="trace", index=i, key="name" if name else "path")
            names[label] = i
            out.append(TraceEntry(label, m, fmt, limit))
    return out


def _read_policies(rows, ctx: _Ctx, trace_names: set) -> list:
    out, labels = [], {}
    allowed = {"policy", "name", "traces", "verify", *_POOL_KEYS}
    for i, p in enumerate(rows):
        _check_keys(p, allowed, ctx, "policy", i)
        text = _typed(p, "policy", str, ctx, "policy", i, "a policy spec such as \"vllm:16\"")
        if not text:
            raise ctx.error("missing: a policy spec such as \"vllm:16\" or \"sglang:1\"", table="policy", index=i,
                            key="policy")
        try:
            spec = parse_policy(text)
        except ConfigError as e:
            raise ctx.error(e.reason, table="policy", index=i, key="policy") from None
        given = {k: p[k] for k in _POOL_KEYS if k in p}
        if len(given) != 1:
            raise ctx.error(f"give exactly one pool size of {', '.join(_POOL_KEYS)}"
                            + (f" (got {', '.join(given)})" if given else ""),
                            table="policy", index=i, key=next(iter(given)) if given else None)
        (pk, pv), = given.items()
        if isinstance(pv, bool) or not isinstance(pv, int) or pv < 1:
            raise ctx.error(f"must be a whole number ≥ 1, got {pv!r}", table="policy", index=i, key=pk)
        # what the policy class declares, never its name (radixkv.policies.registry)
        native = native_pool_knob(spec.build_class)
        if pk == "num_gpu_blocks" and native != pk:
            raise ctx.error(f"num_gpu_blocks is vLLM's pool size; {spec.label} takes capacity_tokens",
                            table="policy", index=i, key=pk)
        if pk == "max_total_num_tokens" and native != pk:
            raise ctx.error(f"max_total_num_tokens is SGLang's pool size; {spec.label} takes capacity_tokens",
                            table="policy", index=i, key=pk)
        options = {}
        verify = _typed(p, "verify", bool, ctx, "policy", i, "true or false")
        if verify:
            if not any("verify" in inspect.signature(c.__init__).parameters
                       for c in spec.build_class.__mro__ if "__init__" in vars(c)):
                raise ctx.error("verify applies to vllm policies only (a policy whose constructor takes verify)",
                                table="policy", index=i, key="verify")
            options["verify"] = True
        tr = p.get("traces")
        if tr is not None:
            if not isinstance(tr, list) or not all(isinstance(x, str) for x in tr):
                raise ctx.error("must be a list of trace names", table="policy", index=i, key="traces")
            for x in tr:
                if x not in trace_names:
                    raise ctx.error(f"no trace is named {x!r}; traces: {', '.join(sorted(trace_names))}",
                                    table="policy", index=i, key="traces")
            tr = tuple(tr)
        label = _typed(p, "name", str, ctx, "policy", i, "a string") or spec.label
        if label in labels:
            raise ctx.error(f"policy label {label!r} is used twice (also policy[{labels[label] + 1}]); "
                            f"give each a distinct name = \"...\"", table="policy", index=i,
                            key="name" if "name" in p else "policy")
        labels[label] = i
        out.append(PolicyEntry(label, spec, PoolSpec(**{pk: int(pv)}), tr, options))
    return out


def _read_assertions(rows, ctx: _Ctx, base: Path, pairs: list) -> list:
    out = []
    allowed = {"trace", "policy", "golden", "baseline", *BOUND_KEYS}
    for i, a in enumerate(rows):
        _check_keys(a, allowed, ctx, "assert", i)
        tsel = _typed(a, "trace", str, ctx, "assert", i, "a trace name or glob") or "*"
        psel = _typed(a, "policy", str, ctx, "assert", i, "a policy label or glob") or "*"
        chosen = [(t, p) for t, p in pairs if fnmatch.fnmatchcase(t, tsel) and fnmatch.fnmatchcase(p, psel)]
        if not chosen:
            raise ctx.error(f"selects no (trace, policy) pair: trace {tsel!r}, policy {psel!r}; pairs: "
                            + ", ".join(f"({t}, {p})" for t, p in pairs[:8]) + (" ..." if len(pairs) > 8 else ""),
                            table="assert", index=i, key="trace" if "trace" in a else ("policy" if "policy" in a else None))
        n_before = len(out)
        for key, (metric, kind) in BOUND_KEYS.items():
            if key not in a:
                continue
            v = a[key]
            if not finite(v):
                raise ctx.error(f"must be a finite number, got {v!r}", table="assert", index=i, key=key)
            if v < 0 or (metric.endswith(("_rate", "_share")) and v > 1):
                raise ctx.error(f"out of range: {v!r} (rates and shares are in [0, 1], counts ≥ 0)", table="assert",
                                index=i, key=key)
            for t, p in chosen:
                out.append(Assertion(t, p, metric, kind, float(v), f"assert[{i + 1}].{key}"))
        if "golden" in a:
            g = _typed(a, "golden", str, ctx, "assert", i, "a file path (a string)")
            gp = Path(_expand(g, ctx, table="assert", index=i, key="golden"))
            gp = gp if gp.is_absolute() else base / gp
            if not gp.is_file():
                raise ctx.error(f"{gp} does not exist", table="assert", index=i, key="golden")
            for t, p in chosen:
                out.append(Assertion(t, p, "golden_mismatches", "golden", 0.0, f"assert[{i + 1}].golden", golden=gp))
        if "baseline" in a:
            b = a["baseline"]
            if not isinstance(b, dict) or not b:
                raise ctx.error("must be a table of metric = tolerance, e.g. [assert.baseline] token_hit_rate = 0.005",
                                table="assert", index=i, key="baseline")
            for mk, tol in b.items():
                metric = BASELINE_ALIASES.get(mk, mk)
                if metric not in BASELINE_METRICS:
                    raise ctx.error(f"unknown baseline metric {mk!r}; known: "
                                    f"{', '.join(sorted(set(BASELINE_METRICS) | set(BASELINE_ALIASES)))}",
                                    table="assert", index=i, key=mk, field_name=f"assert[{i + 1}].baseline.{mk}")
                if not finite(tol) or tol < 0:
                    raise ctx.error(f"tolerance must be a finite number ≥ 0, got {tol!r}", table="assert", index=i, key=mk,
                                    field_name=f"assert[{i + 1}].baseline.{mk}")
                for t, p in chosen:
                    out.append(Assertion(t, p, metric, "baseline", float(tol), f"assert[{i + 1}].baseline.{mk}",
                                         higher_is_better=BASELINE_METRICS[metric]))
        if len(out) == n_before:
            raise ctx.error("asserts nothing: give a bound (" + ", ".join(BOUND_KEYS) + "), golden or [assert.baseline]",
                            table="assert", index=i)
    return out
