"""vLLM v1's step rules for the concurrent replay (``vllm/v1/core/sched/scheduler.py``).

:class:`VllmScheduler` builds each step as vLLM 0.33's ``Scheduler.schedule`` does
(docs/engines/vllm.md §4), checked step by step against the real scheduler driven on CPU
(``tools/engines/vllm_scheduler_golden.py``; goldens in tests/data/concurrent/vllm). Each
rule and the vLLM code it follows:

- **Budget.** One token budget per step, ``max_num_batched_tokens``
  (``token_budget = max_num_scheduled_tokens``); every scheduled chunk or decode takes
  its tokens from it, and both loops below stop when it reaches 0.
- **Running first** (``schedule``: "First, schedule the RUNNING requests"), in running
  order (admission order; a re-admitted request goes to the end): a decode takes 1
  token, an unfinished prefill a chunk of ``min(remaining, budget)``, where remaining
  counts prompt + generated tokens not yet computed (``num_tokens_with_spec −
  num_computed_tokens``), capped by ``long_prefill_token_threshold``.
- **Preemption** (the ``allocate_slots`` retry loop of ``schedule``): a chunk or decode
  that cannot get KV (``policy.extend`` returns False) preempts ``running[-1]``, the
  most recently admitted request (FCFS policy), and retries until it fits or has
  preempted itself; the running loop then stops (``break``). ``_preempt_request``:
  blocks freed as on finish (``policy.preempt``), progress reset to 0, the request put
  at the **front** of the waiting queue (``prepend_request``; several preempted in one
  step end up newest first).
- **Waiting second**, only in a step without preemption ("if not preempted_reqs"), in
  queue order, while budget is left and fewer than ``max_num_seqs`` run; the first
  request that cannot be admitted stops admission for the step (``break``:
  head-of-line blocking).
- **Admission** of a waiting request of P prompt tokens with g already generated (g > 0
  after a preemption): its lookup covers all ``P + g`` known tokens (vLLM's
  ``request.num_tokens``; ``get_computed_blocks`` caps the hit at ``num_tokens − 1``)
  and the whole ``P + g`` must fit (``allocate_slots(full_sequence_must_fit=True)``,
  ``scheduler_reserve_full_isl``), but only the hit plus the first chunk,
  ``min(P + g − hit, long_prefill_token_threshold, budget)`` tokens, gets KV in the
  admission step; the rest is computed in later chunks like any prefill. Here a
  re-admission passes the policy its KV content with the generated tokens counted as
  prompt (``KVSeq.prompt_len = P + g``), so every policy looks up, checks and
  allocates exactly so, with no extra interface.
- **Chunked prefill off** (``enable_chunked_prefill=False``): a waiting request whose
  un-hit tokens (after the threshold cap) exceed the remaining budget is not admitted
  and admission stops ("If chunked_prefill is disabled, we can stop the scheduling
  here"). The hit comes from the policy's side-effect-free ``peek_hit`` (vLLM's
  ``get_computed_blocks``); a policy without one is taken to hit nothing. vLLM also
  requires ``max_model_len ≤ max_num_batched_tokens`` then
  (``SchedulerConfig.verify_max_model_len``): a request whose prompt + outputs cannot
  be computed in one step is refused up front.
- **long_prefill_token_threshold** (default 0, off): caps every chunk, running or
  admitted, when more than one request is running or waiting at the start of the step
  (``num_eligible_reqs > 1``).
- **watermark** (``SchedulerConfig.watermark``, default 0.0): an admission made while
  some request runs (``has_scheduled_reqs=bool(self.running)``, requests admitted earlier
  in the same pass included) must leave ``int(watermark × num_gpu_blocks)`` blocks free
  (``KVCacheManager.__init__``: ``watermark_blocks`` over all blocks, the null block
  included; ``allocate_slots``: blocks to allocate + watermark ≤ free blocks). The
  blocks an admission takes come from the policy's side-effect-free
  ``admission_slots(seq, n_tokens)`` (new blocks for the whole sequence + touched hit
  blocks, ``get_num_blocks_to_allocate``), compared with ``room_slots()`` (vLLM's
  ``get_num_free_blocks``: free + evictable). Decodes and chunks of running requests
  never see it.

Not modelled (vLLM defaults that leave them inert):
``long_prefill_token_threshold_adaptive`` (default False), async
scheduling, speculative decoding, KV connectors, encoder inputs and ``max_model_len``
truncation. The priority policy (``--scheduling-policy priority``) is
:mod:`radixkv.replay.sched_vllm_priority`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from radixkv.errors import ConfigError
from radixkv.replay.scheduler import Scheduler, StepPlan


class VllmScheduler(Scheduler):
    """vLLM v1 ``Scheduler.schedule``: running first, then FCFS admission (module docstring).

    Parameters and attributes: :class:`radixkv.replay.scheduler.Scheduler`.

    Raises
    ------
    radixkv.errors.ConfigError
        As the base class; with chunked prefill off, when a request's prompt + outputs
        exceed ``max_num_batched_tokens`` (vLLM refuses such a configuration); with a
        watermark, when the policy has no ``admission_slots``.
    """

    def __init__(self, trace, policy, config):
        super().__init__(trace, policy, config)
        self._chunked = bool(config.enable_chunked_prefill)
        self._threshold = int(config.long_prefill_token_threshold)
        self._cap = 0  # this step's chunk cap (0: none)
        # vLLM counts num_gpu_blocks, the null block included: usable slots + 1
        self._wm = int(float(config.watermark) * (policy.num_slots + 1))
        self._slots_of = getattr(policy, "admission_slots", None)
        if self._wm > 0 and self._slots_of is None:
            raise ConfigError(
                f"--watermark needs a policy that can tell the blocks an admission would take "
                f"(an admission_slots method); {type(policy).__name__} has none",
                field="watermark",
            )
        if not self._chunked:
            budget = int(config.max_num_batched_tokens)
            for i in range(len(trace)):
                need = self.P[i] + max(self.N[i] - 1, 0)
                if need > budget:
                    raise ConfigError(
                        f"request {str(trace.req_id[i])!r}: {need} prompt + output tokens exceed "
                        f"--max-num-batched-tokens {budget} with chunked prefill off (vLLM requires "
                        "max_model_len ≤ max_num_batched_tokens then)",
                        path=trace.name or None,
                        field="max_num_batched_tokens",
                    )

    def _victim(self) -> int:
        """``schedule``'s preemption on ``self.running.pop()``: the most recently admitted."""
        return self.running[-1]

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens a prefill with *remaining* tokens to compute gets with *budget* left,
        capped by this step's ``long_prefill_token_threshold`` (module docstring)."""
        c = remaining if self._cap <= 0 else min(remaining, self._cap)
        return min(c, budget)

    def schedule(self) -> StepPlan:
        """Build one step's batch, making the admit/extend/preempt calls it implies: the
        RUNNING pass, then, in a step without preemption, the WAITING pass."""
        plan = StepPlan([], [], [], [])
        self.admitted_now = []
        eligible = len(self.running) + self._n_waiting()
        self._cap = self._threshold if eligible > 1 else 0
        budget = self._running_pass(plan, self.cfg.max_num_batched_tokens)
        if plan.preempted == 0 and self._n_waiting():
            budget = self._admit_pass(plan, budget)
        plan.n_running = len(self.running)
        return plan

    def _running_pass(self, plan: StepPlan, budget: int) -> int:
        """Schedule the running requests in running order (FCFS: the first that preempts
        itself ends the pass); returns the budget left."""
        k = 0
        run = self.running
        while k < len(run) and budget > 0:
            j, m = self._plain_decodes(plan, run, k, min(len(run), k + budget))
            if j > k:
                budget -= m
                k += m
                if k == j or budget <= 0:
                    continue
                # run[k] was refused: the general path below preempts for it
            c = self._serve_running(run[k], plan, budget)
            if c < 0:
                break
            budget -= c
            k += 1
        return budget

    def _n_waiting(self) -> int:
        """Requests waiting (vLLM ``get_request_counts``; a subclass adds its other queues)."""
        return len(self.waiting)

    def _known_seq(self, i: int):
        """Request *i*'s KV content with its known tokens as the prompt (P + g; module docstring)."""
        seq = self.trace.kv_seq(i)
        g = self.gen[i]
        return seq if g == 0 else dataclasses.replace(seq, prompt_len=self.P[i] + g)

    def _admit_pass(self, plan: StepPlan, budget: int) -> int:
        """Admit waiting requests into *plan* (vLLM's WAITING loop; module docstring)."""
        self._order_waiting()
        pol = self.policy
        while self.waiting and budget > 0:
            if len(self.running) >= self.cfg.max_num_seqs:
                plan.blocked = True
                break
            i = self.waiting[0]
            seq = self._known_seq(i)
            n_tok = seq.prompt_len
            if not self._chunked:
                h = int(self._peek(seq, n_tok)) if self._peek is not None else 0
                if self._chunk(n_tok - h, n_tok) > budget:
                    plan.blocked = True
                    break
            if self._wm > 0 and self.running:
                if int(self._slots_of(seq, n_tok)) + self._wm > int(pol.room_slots()):
                    plan.blocked = True
                    break
            c = self._admit_first_chunk(self.waiting, i, seq, plan, budget)
            if c < 0:
                break
            budget -= c
        return budget

    def _admit_first_chunk(self, q, i: int, seq, plan: StepPlan, budget: int) -> int:
        """Admit *i*, the head of queue *q*, with its known content *seq*: the policy's
        lookup and the hit plus the first chunk get KV (module docstring, "Admission"),
        and its chunk joins *plan*. Returns the chunk's tokens, or −1 (``plan.blocked`` set)
        when the policy refuses it."""
        n_tok = seq.prompt_len
        # ask for the first chunk; the policy raises it to the hit when the hit is longer
        asked = min(n_tok, self._chunk(n_tok, budget))
        adm = self.policy.admit(i, seq, asked)
        if adm is None:
            plan.blocked = True
            return -1
        q.popleft()
        h = self._record(i, adm, n_tok)
        self.kv[i] = max(asked, h)
        self.running.append(i)
        c = self._serve_running(i, plan, budget)
        if c < 0:  # cannot happen when the policy checked that the whole sequence fits
            plan.blocked = True
        return c

    def max_fast_forward(self) -> int:
        """Most decode steps to run at once: the base bound, and no further than the step
        after a running request's decode caches a block that the blocked head of the
        waiting queue would then hit (:meth:`_hit_growth_bound`)."""
        k = super().max_fast_forward()
        if k > 1 and self.waiting and len(self.running) < self.cfg.max_num_seqs:
            k = self._hit_growth_bound(k)
        return k

    def _hit_growth_bound(self, k: int) -> int:
        """Cap *k* so that no step of the run could admit the waiting head.

        A head refused for room (or, chunked prefill off, for budget) is admitted without
        any request finishing when its hit grows: vLLM caches each block a decode fills
        (``KVCacheManager.allocate_slots`` → ``cache_blocks``), so a running request whose
        content shares the head's prefix (a conversation's previous turn still decoding)
        makes the head's next block hittable, and the lookup of the same step — vLLM
        schedules the running requests first, then the waiting ones
        (``get_computed_blocks``) — finds it; the head then needs one block less. With a
        ``peek_hit`` the head's lookup stops at block m and only a request filling block m
        (of the same content) matters; without one, any request filling a block whose
        content the head shares. A request whose KV reaches that block's end in step j of
        the run (step 0 is the scheduled one) bounds the run to j steps: step j is
        scheduled for real.
        """
        S = self.policy.slot_tokens
        head = self._known_seq(self.waiting[0])
        L = head.prompt_len
        m = int(self._peek(head, L)) // S if self._peek is not None else -1
        for r in self.running:
            K0 = self.kv[r]
            b = m if m >= 0 else K0 // S
            end = (b + 1) * S
            if K0 >= end or end > L:
                continue
            j = end - K0
            if j >= k:
                continue
            seq = self.trace.kv_seq(r)
            if end > seq.kv_len:
                continue
            if shared_prefix_tokens(head, seq) >= end:
                k = j
        return k

    def _refusal_holds(self, plan: StepPlan) -> bool:
        """For :meth:`~radixkv.replay.scheduler.Scheduler.can_fast_forward`: no waiting
        request could be admitted before a request finishes when (FCFS) admission was
        refused — by ``max_num_seqs``, by the pool (decodes only take blocks) or by the
        budget with chunked prefill off (the same decodes leave the same budget): refusals
        that only a finish can lift.
        """
        return plan.blocked and self.cfg.schedule_policy == "fcfs"


def shared_prefix_tokens(a, b) -> int:
    """Tokens of the longest common prefix of the contents of two ``KVSeq`` objects.

    Segments are compared as (id, end) pairs: the prefix ends at the first segment that
    differs; when only the ends differ (same unit id from the same start, one cut
    shorter) the shorter one's end still counts.

    Parameters
    ----------
    a, b : radixkv.trace.types.KVSeq

    Returns
    -------
    int
        Tokens, ≤ ``min(a.kv_len, b.kv_len)``.
    """
    n = min(len(a.seg_id), len(b.seg_id))
    if n == 0:
        return 0
    ia, ib = a.seg_id[:n], b.seg_id[:n]
    ea, eb = a.seg_end[:n], b.seg_end[:n]
    diff = (ia != ib) | (ea != eb)
    if not diff.any():
        return int(ea[n - 1])
    k = int(np.argmax(diff))
    if ia[k] == ib[k]:
        return int(min(ea[k], eb[k]))
    return int(ea[k - 1]) if k else 0
