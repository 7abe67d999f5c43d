"""The concurrent replay's flags and the replay they describe, as the verbs use them.

The flags (``--mode``, ``--max-num-seqs``, the arrival process, the engines' scheduling and
cost-model knobs; their table is :mod:`radixkv.flags.concurrent`'s docstring) are defined
in :mod:`radixkv.flags.concurrent`, below the CLI, since a sweep grid reads them as its keys
(:mod:`radixkv.sweep.grid`); the replay they describe is the library's
(:mod:`radixkv.replay.settings`). Both are importable from here.
"""
from __future__ import annotations

from radixkv.errors import ConfigError

from radixkv.flags.concurrent import add_concurrent_args, refuse_concurrent_only_flags  # noqa: F401
from radixkv.replay.settings import (  # noqa: F401
    concurrent_config_from_args, cost_model_from_args, policy_from_args, run_concurrent_from_args,
)


def refuse_sequential_only(args, specs) -> None:
    """Refuse, before the trace is loaded, a policy that reads the trace ahead (its class's
    ``needs_trace``: ``sglang:P@belady``) in a replay other than the one-pool sequential
    one (``--mode concurrent``, ``--replicas``).

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the policy (field ``policy``).
    """
    if getattr(args, "mode", "sequential") != "concurrent" and getattr(args, "replicas", None) is None:
        return
    from radixkv.policies.registry import sequential_only_message

    for spec in specs:
        if getattr(spec.build_class, "needs_trace", False):
            raise ConfigError(sequential_only_message(spec), field="policy")


def refuse_scheduler_conflicts(args, specs, *, routed: bool = False) -> None:
    """Refuse, before the trace is loaded or any kernel compiled, the scheduler flags that
    the concurrent replay of each of *specs* would refuse (an engine's knob under the other
    engine's rules, ``--enable-priority-scheduling`` without ``--disable-priority-preemption``,
    ...): the same check, :func:`radixkv.replay.scheduler.rule_of`, on the flags as each
    policy reads them (:func:`radixkv.replay.settings.args_for_rule` in a comparison of both
    engines; *routed*: the flags as given, as the replicas read them). Without
    ``--mode concurrent`` nothing is checked here (:func:`refuse_concurrent_only_flags`).

    The rule is the one the replay uses: ``--admission``, else the admission rule of the
    class that runs (``NoCache`` under ``--no-enable-prefix-caching``,
    ``StaticReservedCache`` under ``--static-reserved-fraction``, else the policy's). Under
    vLLM's rules a step budget below the running-request cap is refused too
    (:func:`radixkv.replay.settings.check_step_knobs`), on the knobs after the defaults.

    Raises
    ------
    radixkv.errors.ConfigError
        The replay's own message, naming the flags (field = the flag's dest).
    """
    refuse_sequential_only(args, specs)
    if getattr(args, "mode", "sequential") != "concurrent":
        return
    import dataclasses

    from radixkv.replay.scheduler import rule_of
    from radixkv.replay.settings import args_for_rule, concurrent_config_from_args

    admission = getattr(args, "admission", None)
    rules = [admission or getattr(s.build_class, "admission_rule", "vllm") for s in specs]
    for spec, rule in zip(specs, rules):
        own = args if routed else args_for_rule(args, rule, rules)
        cls = spec.build_class
        if not getattr(own, "enable_prefix_caching", True):
            from radixkv.policies.no_cache import NoCache as cls
        elif getattr(own, "static_reserved_fraction", None) is not None:
            from radixkv.policies.static_reserved import StaticReservedCache as cls
        runs = admission or getattr(cls, "admission_rule", "vllm")
        rule_of(None, dataclasses.replace(concurrent_config_from_args(own, rule=runs), admission=runs))
