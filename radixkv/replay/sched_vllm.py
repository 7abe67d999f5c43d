"""vLLM v1's step rules for the concurrent replay (``vllm/v1/core/sched/scheduler.py``).

:class:`VllmScheduler` builds each step as vLLM's ``Scheduler.schedule`` does
(docs/engines/vllm.md §4):

- One token budget per step, ``max_num_batched_tokens``. RUNNING requests are served
  first, in admission order: a decode takes 1 token, an unfinished prefill a chunk of
  ``min(remaining, budget)``.
- A decode that cannot get KV (``policy.extend`` returns False) preempts ``running[-1]``,
  the most recently admitted request, by recompute (``Scheduler._preempt_request``:
  ``policy.preempt``, progress reset, **prepended** to the waiting queue), and retries
  until it fits or preempts itself.
- WAITING requests are admitted only in a step with no preemption, in queue order, while
  fewer than ``max_num_seqs`` run and budget is left; admission stops at the first request
  the policy refuses (``policy.admit`` returns None: head-of-line blocking, as vLLM's loop
  ``break``\\ s). The admission asks for ``min(P, budget)`` tokens and the policy
  decides whether the whole prompt must fit first (vLLM's default
  ``scheduler_reserve_full_isl``: ``BlockHashCache``, ``NoCache`` and
  ``StaticReservedCache`` check it). If the hit covers more than the first chunk, the
  same step extends to ``hit + min(P − hit, budget)`` tokens, as vLLM schedules
  ``min(P − hit, budget)`` new tokens.
- Re-admission after preemption: prompt + generated tokens (:mod:`radixkv.replay.scheduler`).
"""
from __future__ import annotations

from radixkv.replay.scheduler import Scheduler, StepPlan


class VllmScheduler(Scheduler):
    """vLLM v1 ``Scheduler.schedule``: running first, then FCFS admission (module docstring).

    Parameters and attributes: :class:`radixkv.replay.scheduler.Scheduler`.
    """

    def _victim(self) -> int:
        """``Scheduler._preempt_request`` on ``self.running.pop()``: the most recently admitted."""
        return self.running[-1]

    def schedule(self) -> StepPlan:
        """Build one step's batch, making the admit/extend/preempt calls it implies."""
        plan = StepPlan([], [], [], [])
        self.admitted_now = []
        budget = self.cfg.max_num_batched_tokens
        k = 0
        while k < len(self.running) and budget > 0:
            c = self._serve_running(self.running[k], plan, budget)
            if c < 0:
                break
            budget -= c
            k += 1
        if plan.preempted == 0 and self.waiting:
            budget = self._admit_pass(plan, budget)
        plan.n_running = len(self.running)
        return plan

    def can_fast_forward(self, plan: StepPlan) -> bool:
        """Whether the steps after *plan* repeat it (same decodes) until a finish or arrival.

        True for a pure-decode step without preemption that served every running request,
        when no waiting request could be admitted before a request finishes: the queue is
        empty, or (FCFS) admission was refused — a refusal that only a finish can lift.
        """
        if not plan.pure_decode or plan.preempted or len(plan.req) != len(self.running):
            return False
        if not self.waiting:
            return True
        return plan.blocked and self.cfg.schedule_policy == "fcfs"
