"""radixkv: replay LLM request traces through faithful models of vLLM's block-hash prefix
cache and SGLang's RadixAttention tree over a fixed-size GPU memory pool.

The library API (loaded on first use, so ``import radixkv`` stays cheap):

=================== ===================================================================
``load_trace``      read a trace in any supported format (:mod:`radixkv.trace.load`)
``replay``          sequential or concurrent replay behind one call (:mod:`radixkv.api`)
``summarize``       the summary metrics of either replay (:mod:`radixkv.api`)
``ReplaySpec``,     one replay on one engine (trace, policy, pool, mode, knobs) and the
``run``, ``PoolSpec`` call that runs it, as ``radixkv replay`` does: (result, summary)
                    (:mod:`radixkv.replay.spec`); the pool (:mod:`radixkv.policies.registry`)
``format_table``    the plain-text table the CLI prints (:mod:`radixkv.report`)
``check_policy``    the policy conformance kit (:mod:`radixkv.policies.check`;
                    ``parametrize_with_checks`` there makes one pytest test per rule)
``PolicyContractError``, what the kit raises (``failures``: rule → message; ``tracebacks``)
``CheckNotApplicable``  and a check that does not apply to a policy
``InputError``,     bad input (:mod:`radixkv.errors`): ``TraceFormatError`` (a trace),
``TraceFormatError``, ``ConfigError`` (a configuration); ``InputWarning``: input read
``ConfigError``,    but changed (e.g. sorted)
``InputWarning``
``parse_policy``    a policy spec (``vllm:16``, ``module:Class:16``) → its class and size
``PrefixCache``     the base class of every policy (:mod:`radixkv.policies.base`)
``Admission``,      what a policy returns
``PoolStats``
``Trace``, ``KVSeq`` the trace and one request's KV content (:mod:`radixkv.trace.types`)
``replay_replicas``  N replicas behind a router, sequential (:mod:`radixkv.replay.routing`)
``replay_multi_concurrent``  N replicas behind a router on one clock, concurrent
                    (:mod:`radixkv.replay.multi_concurrent`)
``cost_model``      a step-time model by kind: roofline, fitted, profiled, a profile
                    file (:mod:`radixkv.clock.calibrated`, docs/clock.md)
``CalibratedCostModel`` the measured-table step-time model (:mod:`radixkv.clock.calibrated`)
``make_plan``,      the cheapest deployment meeting a latency SLO on a trace
``PlanSpec``        (:mod:`radixkv.plan`; ``radixkv plan``)
=================== ===================================================================

Helpers for policy authors are in :mod:`radixkv.policies.toolkit`.
"""
__version__ = "0.1.0"

from radixkv.numba_cache import keyed_cache_dir as _keyed_cache_dir

_keyed_cache_dir()  # Numba's cache keyed by the kernel sources (radixkv.numba_cache.source_key)
del _keyed_cache_dir

_EXPORTS = {
    "load_trace": "radixkv.trace.load",
    "replay": None,  # the subpackage radixkv.replay, callable as radixkv.api.replay
    "summarize": "radixkv.api",
    "ReplaySpec": "radixkv.replay.spec",
    "run": "radixkv.replay.spec",
    "PoolSpec": "radixkv.policies.registry",
    "format_table": "radixkv.report",
    "check_policy": "radixkv.policies.check",
    "PolicyContractError": "radixkv.policies.check",
    "CheckNotApplicable": "radixkv.policies.check",
    "InputError": "radixkv.errors",
    "TraceFormatError": "radixkv.errors",
    "ConfigError": "radixkv.errors",
    "InputWarning": "radixkv.errors",
    "parse_policy": "radixkv.policies.registry",
    "register_policy": "radixkv.policies.registry",
    "PrefixCache": "radixkv.policies.base",
    "Admission": "radixkv.policies.base",
    "PoolStats": "radixkv.policies.base",
    "Trace": "radixkv.trace.types",
    "KVSeq": "radixkv.trace.types",
    "replay_replicas": "radixkv.replay.routing",
    "replay_multi_concurrent": "radixkv.replay.multi_concurrent",
    "cost_model": "radixkv.clock.calibrated",
    "CalibratedCostModel": "radixkv.clock.calibrated",
    "make_plan": "radixkv.plan.search",
    "PlanSpec": "radixkv.plan.spec",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'radixkv' has no attribute {name!r}")
    import importlib

    mod = _EXPORTS[name]
    value = importlib.import_module("radixkv.replay") if mod is None else getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
