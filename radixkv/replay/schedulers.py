"""Which scheduler a concurrent replay runs: :func:`make_scheduler` picks vLLM's or SGLang's
step rules (and their priority and CPU-offloading variants) for a policy and its knobs.

It sits above :mod:`radixkv.replay.scheduler` (the shared request state and the rule
checks) and the engine modules ``sched_*`` that subclass it, so that the base module never
imports its subclasses (no import circle; ``tests/test_layers.py``).
"""
from __future__ import annotations

from radixkv.errors import ConfigError
from radixkv.replay.sched_sglang import SglangScheduler
from radixkv.replay.sched_sglang_priority import SglangPriorityScheduler
from radixkv.replay.sched_vllm import VllmScheduler
from radixkv.replay.sched_vllm_offload import VllmOffloadScheduler
from radixkv.replay.sched_vllm_priority import VllmPriorityScheduler
from radixkv.replay.scheduler import SchedulerConfig, rule_of

__all__ = ["make_scheduler"]


def make_scheduler(trace, policy, config: SchedulerConfig, arrivals=None):
    """The scheduler of one replay: vLLM's or SGLang's step rules.

    ``config.admission`` when set, else the policy class's rule (:func:`admission_rule_of`);
    under vLLM's rules, ``config.scheduling_policy == "priority"`` gives vLLM's priority
    scheduler (:mod:`radixkv.replay.sched_vllm_priority`), which reads *arrivals*
    (np.ndarray of float64, shape (n,), seconds; None: the trace's) as vLLM's
    ``arrival_time``; the other schedulers ignore them.

    Returns
    -------
    radixkv.replay.sched_vllm.VllmScheduler or radixkv.replay.sched_sglang.SglangScheduler

    Raises
    ------
    radixkv.errors.ConfigError
        When vLLM-only knobs (``enable_chunked_prefill=False``,
        ``long_prefill_token_threshold``, ``watermark``, ``scheduling_policy="priority"``)
        are set for SGLang's rules, ``enable_priority_scheduling`` for vLLM's, SGLang's
        priority scheduling without ``disable_priority_preemption``, or priority
        scheduling is asked of a policy with asynchronous host loads (``vllm-offload``:
        its scheduler models FCFS only).
    """
    rule = rule_of(policy, config)
    if rule == "sglang":
        cls = SglangPriorityScheduler if config.enable_priority_scheduling else SglangScheduler
    elif getattr(type(policy), "async_host_loads", False):  # vLLM CPU offloading (vllm-offload)
        if config.scheduling_policy != "fcfs":
            raise ConfigError(f"{type(policy).__name__} in --mode concurrent models vLLM's FCFS scheduler only: "
                              "drop --scheduling-policy priority", field="scheduling_policy")
        cls = VllmOffloadScheduler
    elif config.scheduling_policy == "priority":
        return VllmPriorityScheduler(trace, policy, config, arrivals)
    else:
        cls = VllmScheduler
    return cls(trace, policy, config)
