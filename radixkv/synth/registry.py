"""Scenario names, and parameters given as ``name=value`` text (the CLI's ``--param``)."""
from __future__ import annotations

import dataclasses

from radixkv.errors import InputError
from radixkv.synth.agent_tools import AgentTools
from radixkv.synth.customer_service import CustomerService
from radixkv.synth.distributions import IntDist, TimeDist, parse_dist
from radixkv.synth.enterprise import Enterprise
from radixkv.synth.long_doc_qa import LongDocQA
from radixkv.synth.mix import Mix
from radixkv.synth.multi_turn import MultiTurn
from radixkv.trace.types import Trace

#: scenario name → generator object (``.generate``, ``.params_cls``, ``.summary``)
SCENARIOS = {s.name: s for s in (LongDocQA(), AgentTools(), Enterprise(), CustomerService(), MultiTurn(), Mix())}


def get_scenario(name: str):
    """The scenario called *name*; :class:`InputError` (field ``scenario``) if unknown."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise InputError(f"unknown scenario {name!r}; expected one of {sorted(SCENARIOS)}", field="scenario") from None


def _parse_value(cls, key: str, text: str, full: str):
    flds = {f.name: f for f in dataclasses.fields(cls)}
    head, dot, rest = key.partition(".")
    if head not in flds:
        raise InputError(f"{cls.__name__} has no parameter {head!r}; known: {sorted(flds)}", field=full)
    f = flds[head]
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    is_group = t not in ("int", "float", "IntDist", "TimeDist")
    if dot:
        if not is_group:
            raise InputError(f"parameter {head!r} has no sub-parameters", field=full)
        return head, {rest: text}
    if is_group:
        raise InputError(f"parameter {head!r} is a group; give {head}.<name>=<value>", field=full)
    try:
        if t == "int":
            return head, int(text)
        if t == "float":
            return head, float(text)
    except ValueError:
        raise InputError(f"{head} expects a {t}, got {text!r}", field=full) from None
    if t == "IntDist":
        return head, parse_dist(text, IntDist, field=full)
    if t == "TimeDist":
        return head, parse_dist(text, TimeDist, field=full)
    raise InputError(f"parameter {head!r} cannot be set from text", field=full)  # pragma: no cover


def params_from_text(cls, items: list[str] | dict[str, str], *, prefix: str = ""):
    """Parameters of class *cls* with some fields set from text.

    Parameters
    ----------
    cls : a scenario's parameter dataclass
    items : list of ``"name=value"`` strings, or a dict name → value text. Integer and
        float fields take numbers; distribution fields take ``uniform:LO,HI`` etc.
        (:func:`radixkv.synth.distributions.parse_dist`); nested groups (the mix's
        components) take ``group.name=value``.

    Raises
    ------
    radixkv.errors.InputError
        Unknown name, malformed value, or a value the parameter class rejects (the field
        is named ``"--param <name>"``).
    """
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for it in items:
            k, eq, v = it.partition("=")
            if not eq or not k.strip():
                raise InputError(f"expected name=value, got {it!r}", field="--param")
            pairs.append((k.strip(), v.strip()))
    plain, groups = {}, {}
    for k, v in pairs:
        head, val = _parse_value(cls, k, v, f"--param {prefix}{k}")
        if isinstance(val, dict):
            groups.setdefault(head, {}).update(val)
        else:
            plain[head] = val
    defaults = cls()
    for head, sub in groups.items():
        plain[head] = params_from_text(type(getattr(defaults, head)), sub, prefix=f"{prefix}{head}.")
    try:
        return dataclasses.replace(defaults, **plain)
    except InputError as e:
        raise InputError(e.reason, field=f"--param {prefix}{e.field}" if e.field else "--param") from None


def generate(scenario: str, n_requests: int, seed: int, *, rate: float = 1.0, arrival: str = "poisson", cv: float = 2.0, params=None) -> Trace:
    """Generate a synthetic trace.

    Parameters
    ----------
    scenario : str
        One of :data:`SCENARIOS`: ``long_doc_qa``, ``agent_tools``, ``enterprise``,
        ``customer_service``, ``multi_turn``, ``mix``.
    n_requests : int ≥ 1
    seed : int ≥ 0
        Same arguments → identical trace.
    rate : float, default 1.0
        Long-run request rate, requests/s.
    arrival : {"poisson", "gamma"}, default "poisson"
    cv : float, default 2.0
        Coefficient of variation of gamma inter-start gaps (bursty when > 1).
    params : the scenario's parameter dataclass, dict or list of ``name=value`` text, or None

    Returns
    -------
    Trace
        Token ids (``unit_tokens = 1``, vocabulary 32,000) with output ids.

    Raises
    ------
    radixkv.errors.InputError
        Unknown scenario or parameter, bad value.
    """
    scn = get_scenario(scenario)
    if params is not None and not isinstance(params, scn.params_cls):
        if not isinstance(params, (dict, list, tuple)):
            raise InputError(f"{scenario} takes {scn.params_cls.__name__}, a dict or a list of name=value, "
                             f"got {type(params).__name__}", field="params")
        params = params_from_text(scn.params_cls, list(params) if isinstance(params, tuple) else params)
    return scn.generate(n_requests, seed, rate=rate, arrival=arrival, cv=cv, params=params)
