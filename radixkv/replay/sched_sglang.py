"""SGLang's step rules for the concurrent replay (SGLang 0.5.23, ``python/sglang/srt/managers/``).

:class:`SglangScheduler` builds each step as SGLang's default (non-mixed) scheduler does:

- **Prefill first** (``scheduler.py :: Scheduler.get_next_batch_to_run``): a step is a
  prefill batch (the unfinished chunked request, then new admissions) when there is one,
  else a decode of every running request.
- **Admission budget** (``schedule_policy.py :: PrefillAdder``): a request is admitted
  when ``extend + min(N − g, 4096) ≤ rem_total``, where extend is its un-hit prompt and
  ``rem_total = (free + evictable tokens) − Σ_running min(N_r − g_r, 4096) ·
  new_token_ratio − Σ(already admitted in this pass)``. When nothing runs, the first
  waiting request is admitted whenever the pool takes it.
- **new_token_ratio** (``scheduler.py``): starts at 0.7, decays by
  ``(0.7 − 0.7·0.14) / 600`` per decode step to ``0.098`` and is reset to 0.7 after a
  retraction (``SGLANG_INIT_NEW_TOKEN_RATIO``, ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``,
  ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``, ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` in
  ``sglang/srt/environ.py``).
- **Decode retraction** (``schedule_batch.py :: ScheduleBatch.retract_decode``): a decode
  that runs out of KV retracts the request with the fewest outputs, longest prompt on
  ties, to the front of the waiting queue.
- ``schedule_policy='lpm'``: before each admission pass the waiting queue is sorted by
  longest cached prefix (stable), falling back to FCFS when more than 128 requests wait
  (``SchedulePolicy._determine_active_policy``).
"""
from __future__ import annotations

from radixkv.replay.scheduler import Scheduler, StepPlan

#: SGLang's defaults (``sglang/srt/environ.py``)
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
SGLANG_CLIP_MAX_NEW_TOKENS = 4096


class SglangScheduler(Scheduler):
    """SGLang's scheduler: prefill-first steps, ``PrefillAdder`` budget, retraction.

    Parameters and attributes: :class:`radixkv.replay.scheduler.Scheduler`, plus

    Attributes
    ----------
    ratio : float
        SGLang's ``new_token_ratio`` now.
    """

    def __init__(self, trace, policy, config):
        super().__init__(trace, policy, config)
        self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO
        self.ratio_min = SGLANG_INIT_NEW_TOKEN_RATIO * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.ratio - self.ratio_min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        self._rem_total = 0.0

    # ------------------------------------------------------------------ retraction
    def _victim(self) -> int:
        """``ScheduleBatch.retract_decode``: fewest outputs first, then the longest prompt."""
        return min(self.running, key=lambda r: (self.gen[r], -self.P[r], -self.running.index(r)))

    def _on_preempt(self, v: int) -> None:
        self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO

    # ------------------------------------------------------------------ admission budget
    def _begin_admit_pass(self) -> None:
        clip = SGLANG_CLIP_MAX_NEW_TOKENS
        reserved = sum(min(self.N[r] - self.gen[r], clip) * self.ratio for r in self.running)
        self._rem_total = int(self.policy.room_slots()) * self.policy.slot_tokens - reserved

    def _may_admit(self, i: int, seq, n_tok: int) -> bool:
        peek = int(self._peek(seq, n_tok)) if self._peek is not None else 0
        need = (n_tok - peek) + min(self.N[i] - self.gen[i], SGLANG_CLIP_MAX_NEW_TOKENS)
        return not (need > self._rem_total and self.running)

    def _admitted(self, i: int, n_tok: int, hit: int) -> None:
        self._rem_total -= (n_tok - hit) + min(self.N[i] - self.gen[i], SGLANG_CLIP_MAX_NEW_TOKENS)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> StepPlan:
        """Build one step's batch: a prefill batch if there is one, else a decode of all."""
        plan = StepPlan([], [], [], [])
        self.admitted_now = []
        budget = self.cfg.max_num_batched_tokens
        for r in list(self.running):
            if budget <= 0:
                break
            if r in self.running and self.ctx[r] < self.target[r]:
                c = self._serve_running(r, plan, budget)
                budget -= max(c, 0)
        if self.waiting and plan.preempted == 0:
            budget = self._admit_pass(plan, budget)
        if plan.empty:
            for r in list(self.running):
                if r in self.running:
                    self._serve_running(r, plan, 1)
            if plan.req:
                self.ratio = max(self.ratio - self.ratio_decay, self.ratio_min)
        plan.n_running = len(self.running)
        return plan

    def can_fast_forward(self, plan: StepPlan) -> bool:
        """Whether the steps after *plan* repeat it (same decodes) until a finish or arrival.

        A pure-decode step without preemption that served every running request, with an
        empty waiting queue, or (FCFS) a queue blocked by ``max_num_seqs`` (a budget
        refusal may lift as ``new_token_ratio`` decays, so it does not fast-forward).
        """
        if not plan.pure_decode or plan.preempted or len(plan.req) != len(self.running):
            return False
        if not self.waiting:
            return True
        if not plan.blocked or self.cfg.schedule_policy != "fcfs":
            return False
        return len(self.running) >= self.cfg.max_num_seqs

    def _on_fast_forward(self, k: int) -> None:
        self.ratio = max(self.ratio - self.ratio_decay * (k - 1), self.ratio_min)
