"""Continuous-batching scheduler of a concurrent replay (vLLM v1 style, SGLang options).

One call of :meth:`Scheduler.schedule` builds the batch of one engine step and makes the
policy calls that step implies; :meth:`Scheduler.complete` applies the step's results.
Time is not known here: :mod:`radixkv.replay.concurrent` prices each step with a
:class:`radixkv.cost.CostModel` and advances the clock.

Request life (tokens)
---------------------
A request with P prompt and N output tokens is *admitted* with ``policy.admit`` for its
first chunk, then computes the rest of its un-hit prompt in chunks of the step budget
(chunked prefill), each chunk a ``policy.extend`` in the step that computes it — so the
policy makes a chunk's blocks hittable exactly when the engine would (vLLM: when the
chunk is scheduled). The step that completes the prompt samples output 1 (TTFT).
Each later step is a decode: it feeds the last sampled token (``policy.extend(rid, 1)``,
one more token of KV) and samples the next. After output N the request finishes
(``policy.finish``), holding ``P + N − 1`` tokens of KV — the KV extent of docs/SEMANTICS.md.
N = 0 finishes when its prefill completes.

vLLM v1 rules (``vllm/v1/core/sched/scheduler.py :: Scheduler.schedule``; docs/engines/vllm.md §4)
-----------------------------------------------------------------------------------------
- One token budget per step, ``max_num_batched_tokens``. RUNNING requests are served
  first, in admission order: a decode takes 1 token, an unfinished prefill a chunk of
  ``min(remaining, budget)``.
- A decode that cannot get KV (``policy.extend`` returns False) preempts ``running[-1]``,
  the most recently admitted request, by recompute (``_preempt_request``:
  ``policy.preempt``, progress reset, **prepended** to the waiting queue), and retries
  until it fits or preempts itself.
- WAITING requests are admitted only in a step with no preemption, in queue order, while
  fewer than ``max_num_seqs`` run and budget is left; admission stops at the first request
  the policy refuses (``policy.admit`` returns None: head-of-line blocking, as vLLM's loop
  ``break``\\ s). The admission asks for ``min(P, budget)`` tokens and the policy
  decides whether the whole prompt must fit first (vLLM's default
  ``scheduler_reserve_full_isl``: ``BlockHashCache``, ``NoCache`` and
  ``StaticReservedCache`` check it; SGLang's ``RadixCache`` leaves it to the SGLang
  budget below, so pair it with ``admission='sglang'``). If the hit covers more than the
  first chunk, the same step extends to ``hit + min(P − hit, budget)`` tokens, as vLLM
  schedules ``min(P − hit, budget)`` new tokens.
- A re-admitted request looks up and recomputes prompt + generated tokens:
  ``policy.admit(rid, seq, n_tokens=P + g)``, KV for all of it at once. Its hit is not
  counted (hit rate counts first admissions only, docs/SEMANTICS.md). A policy that refuses
  ``n_tokens > P`` (raises ValueError; SGLang's ``RadixCache``, whose engine looks up the
  prompt + outputs too) is re-admitted on its prompt and recomputes the generated tokens
  as further chunks: its lookup then covers the prompt only.

SGLang options (``python/sglang/srt/managers/schedule_policy.py``, ``scheduler.py``)
-------------------------------------------------------------------------------------
- ``admission='sglang'``: ``PrefillAdder``'s budget. A request is admitted when
  ``extend + min(N − g, 4096) ≤ rem_total``, where extend is its un-hit prompt and
  ``rem_total = (free + evictable tokens) − Σ_running min(N_r − g_r, 4096) · new_token_ratio
  − Σ(already admitted in this pass)``; ``new_token_ratio`` starts at 0.7, decays by
  ``(0.7 − 0.7·0.14) / 600`` per decode step to ``0.098`` and is reset to 0.7 after a
  retraction (``SGLANG_INIT_NEW_TOKEN_RATIO``, ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``,
  ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``, ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``;
  SGLang sets the ratio after a retraction from the retracted work — simplified here).
  Steps are prefill-first, as SGLang's default (non-mixed) scheduler: a step is a prefill
  batch (the unfinished chunked request, then new admissions) when there is one, else a
  decode of every running request. A decode that runs out of KV retracts the request
  with the fewest outputs, longest prompt on ties (``ScheduleBatch.retract_decode``), to
  the front of the waiting queue. When nothing runs, the first waiting request is admitted
  whenever the pool takes it.
- ``schedule_policy='lpm'``: before each admission pass the waiting queue is sorted by
  longest cached prefix (stable), falling back to FCFS when more than 128 requests wait
  (``SchedulePolicy._determine_active_policy``). In-batch prefix deprioritisation is not
  modelled. It needs a side-effect-free lookup: the policy must provide
  ``peek_hit(seq, n_tokens) -> int``.

Optional policy hooks (duck-typed, not in the base interface)
-------------------------------------------------------------
``peek_hit(seq, n_tokens)``  hit tokens an admission would get, without changing state
                            (needed by ``lpm``; used by ``admission='sglang'``, which
                            otherwise assumes no hit, a conservative budget).

The scheduler also calls ``PrefixCache.room_slots()`` (free + evictable slots, in the base
class), which :class:`radixkv.policies.static_reserved.StaticReservedCache` overrides
(its reserved part is never available to running requests).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from radixkv.errors import ConfigError

SCHEDULE_POLICIES = ("fcfs", "lpm")
ADMISSIONS = ("vllm", "sglang")

#: SGLang's defaults (``sglang/srt/environ.py``)
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
#: ``lpm`` falls back to FCFS above this many waiting requests (SGLang ``schedule_policy.py``)
LPM_MAX_WAITING = 128


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of the concurrent scheduler, named as the engines name them.

    Parameters
    ----------
    max_num_seqs : int
        Most requests RUNNING at once (vLLM ``--max-num-seqs``; SGLang
        ``--max-running-requests``). Default 256: vLLM's default on an A100 and on GPUs
        below 70 GiB (``EngineArgs.get_batch_defaults``).
    max_num_batched_tokens : int
        Token budget of one step (vLLM ``--max-num-batched-tokens``; SGLang
        ``--chunked-prefill-size``). Default 8192: vLLM's default for the offline
        ``LLM`` class below 70 GiB and for the OpenAI server on H100/H200-class GPUs (the
        server on an A100 uses 2048; docs/engines/vllm.md §4). Chunked prefill is always on.
    schedule_policy : {'fcfs', 'lpm'}
        Order of the waiting queue (SGLang ``--schedule-policy``; vLLM is FCFS).
    admission : {'vllm', 'sglang'}
        Admission and preemption rules (module docstring).

    Raises
    ------
    radixkv.errors.ConfigError
        On a non-positive limit or an unknown name.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    schedule_policy: str = "fcfs"
    admission: str = "vllm"

    def __post_init__(self):
        if int(self.max_num_seqs) < 1:
            raise ConfigError(f"--max-num-seqs must be ≥ 1, got {self.max_num_seqs}", field="max_num_seqs")
        if int(self.max_num_batched_tokens) < 1:
            raise ConfigError(f"--max-num-batched-tokens must be ≥ 1, got {self.max_num_batched_tokens}",
                              field="max_num_batched_tokens")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ConfigError(f"unknown --schedule-policy {self.schedule_policy!r}; choose fcfs or lpm",
                              field="schedule_policy")
        if self.admission not in ADMISSIONS:
            raise ConfigError(f"unknown admission rule {self.admission!r}; choose vllm or sglang", field="admission")


@dataclass
class StepPlan:
    """The batch of one step.

    Attributes
    ----------
    req, new, ctx : list of int
        Per item: request row, tokens computed this step, KV tokens before them.
    prefill : list of bool
        Whether the item is a prefill chunk (else a decode).
    n_running : int
        Requests in the running set while the step runs.
    preempted : int
        Preemptions made while building the step.
    blocked : bool
        Admission was tried and refused (by the policy, the SGLang budget or
        ``max_num_seqs``); stays refused until a request finishes (FCFS).
    """

    req: list
    new: list
    ctx: list
    prefill: list
    n_running: int = 0
    preempted: int = 0
    blocked: bool = False

    @property
    def empty(self) -> bool:
        return not self.req

    @property
    def pure_decode(self) -> bool:
        return bool(self.req) and not any(self.prefill)


class Scheduler:
    """State of every request and the waiting/running queues of one replay.

    Parameters
    ----------
    trace : radixkv.trace.Trace
        Requests in replay order; the row is the policy's ``rid``.
    policy : radixkv.policies.base.PrefixCache
        A fresh policy (nothing running).
    config : SchedulerConfig

    Attributes (per request, lists indexed by row)
    ----------------------------------------------
    gen : generated (sampled) output tokens; ctx : tokens whose KV is computed;
    target : tokens the current admission must compute (P, or P + g on re-admission);
    hit, held, evicted : of the first admission (tokens); admissions, preemptions : counts;
    recomputed : prompt tokens computed again after preemptions.

    Raises
    ------
    radixkv.errors.ConfigError
        When ``lpm`` is asked of a policy without ``peek_hit``, or a request cannot fit in
        the whole pool (``policy.fits_alone``).
    """

    def __init__(self, trace, policy, config: SchedulerConfig):
        self.trace = trace
        self.policy = policy
        self.cfg = config
        n = len(trace)
        self.P = [int(x) for x in trace.prompt_len]
        self.N = [int(x) for x in trace.output_len]
        self.gen = [0] * n
        self.ctx = [0] * n
        self.kv = [0] * n
        self.target = [0] * n
        self.hit = [0] * n
        self.held = [0] * n
        self.evicted = [0] * n
        self.admissions = [0] * n
        self.preemptions = [0] * n
        self.recomputed = [0] * n
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.finished_now: list[int] = []
        self.first_token_now: list[int] = []
        self.admitted_now: list[int] = []
        self.sg = config.admission == "sglang"
        self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO
        self.ratio_min = SGLANG_INIT_NEW_TOKEN_RATIO * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.ratio - self.ratio_min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        self._beyond_prompt = True  # policy accepts admit(n_tokens > P) until it says otherwise
        self._peek = getattr(policy, "peek_hit", None)
        if config.schedule_policy == "lpm" and self._peek is None:
            raise ConfigError(
                f"--schedule-policy lpm needs a policy that can look up a prefix without side effects "
                f"(a peek_hit method); {type(policy).__name__} has none",
                field="schedule_policy",
            )
        fits = getattr(policy, "fits_alone", None)
        if fits is not None:
            for i in range(n):
                over = fits(trace.kv_seq(i))
                if over > 0:
                    raise ConfigError(
                        f"request {str(trace.req_id[i])!r} needs {over} tokens more than the whole pool "
                        f"({policy.capacity_tokens} tokens); it could never run",
                        path=trace.name or None,
                        field="num_slots",
                    )

    # ------------------------------------------------------------------ queue
    def enqueue(self, i: int) -> None:
        """Request row *i* arrives: append it to the waiting queue."""
        self.waiting.append(i)

    def _n_tok(self, i: int) -> int:
        """Tokens a (re-)admission of *i* must hold: prompt + tokens generated so far."""
        return self.P[i] + self.gen[i]

    def _order_waiting(self) -> None:
        if self.cfg.schedule_policy != "lpm" or len(self.waiting) > LPM_MAX_WAITING or len(self.waiting) < 2:
            return
        tr = self.trace
        keyed = [(-int(self._peek(tr.kv_seq(i), self._n_tok(i))), k, i) for k, i in enumerate(self.waiting)]
        keyed.sort()
        self.waiting = deque(i for _, _, i in keyed)

    # ------------------------------------------------------------------ preemption
    def _preempt(self, v: int, plan: StepPlan) -> None:
        if v in plan.req:  # SGLang may retract a request already in this decode batch
            j = plan.req.index(v)
            for col in (plan.req, plan.new, plan.ctx, plan.prefill):
                del col[j]
        self.running.remove(v)
        self.policy.preempt(v)
        self.ctx[v] = 0
        self.kv[v] = 0
        self.target[v] = 0
        self.preemptions[v] += 1
        self.waiting.appendleft(v)
        if self.sg:
            self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO

    def _victim(self) -> int:
        if not self.sg:
            return self.running[-1]  # vLLM: the most recently admitted
        # SGLang retract_decode: fewest outputs first, then the longest prompt
        return min(self.running, key=lambda r: (self.gen[r], -self.P[r], -self.running.index(r)))

    def _grow(self, r: int, upto: int, plan: StepPlan) -> bool:
        """Make *r*'s KV cover *upto* tokens, preempting until it fits.

        Returns False when *r* itself was preempted.
        """
        need = upto - self.kv[r]
        while need > 0:
            if self.policy.extend(r, need):
                self.kv[r] = upto
                return True
            v = self._victim()
            self._preempt(v, plan)
            plan.preempted += 1
            if v == r:
                return False
        return True

    def _serve_running(self, r: int, plan: StepPlan, budget: int) -> int:
        """Schedule *r*'s next chunk or decode; returns tokens used, or −1 if *r* was preempted."""
        pre = self.ctx[r] < self.target[r]
        c = min(self.target[r] - self.ctx[r], budget) if pre else 1
        if not self._grow(r, self.ctx[r] + c, plan):
            return -1
        plan.req.append(r)
        plan.new.append(c)
        plan.ctx.append(self.ctx[r])
        plan.prefill.append(pre)
        return c

    # ------------------------------------------------------------------ admission
    def _admit(self, i: int, seq, n_tok: int, budget: int):
        """``policy.admit`` for a first chunk (first admission) or prompt + generated.

        A first admission asks for ``min(P, budget)`` tokens (the first chunk; the
        policy's hit may cover more). A re-admission asks for all ``P + g`` tokens so the
        lookup covers the generated ones (vLLM); a policy that refuses ``n_tokens > P``
        (ValueError) is re-admitted on its prompt and recomputes the generated tokens
        as more chunks (its lookup then covers the prompt only).
        """
        if self.gen[i] == 0:
            return self.policy.admit(i, seq, min(n_tok, budget))
        if self._beyond_prompt:
            try:
                return self.policy.admit(i, seq, n_tok)
            except ValueError:
                self._beyond_prompt = False
        return self.policy.admit(i, seq, min(self.P[i], budget))

    def _admit_pass(self, plan: StepPlan, budget: int) -> int:
        """Admit waiting requests into *plan* while budget, seats and memory allow."""
        self._order_waiting()
        rem_total = None
        clip = SGLANG_CLIP_MAX_NEW_TOKENS
        if self.sg:
            reserved = sum(min(self.N[r] - self.gen[r], clip) * self.ratio for r in self.running)
            rem_total = int(self.policy.room_slots()) * self.policy.slot_tokens - reserved
        tr = self.trace
        while self.waiting and budget > 0:
            if len(self.running) >= self.cfg.max_num_seqs:
                plan.blocked = True
                break
            i = self.waiting[0]
            seq = tr.kv_seq(i)
            n_tok = self._n_tok(i)
            if rem_total is not None:
                peek = int(self._peek(seq, n_tok)) if self._peek is not None else 0
                need = (n_tok - peek) + min(self.N[i] - self.gen[i], clip)
                if need > rem_total and self.running:
                    plan.blocked = True
                    break
            adm = self._admit(i, seq, n_tok, budget)
            if adm is None:
                plan.blocked = True
                break
            self.waiting.popleft()
            h = int(adm.hit_tokens)
            if rem_total is not None:
                rem_total -= (n_tok - h) + min(self.N[i] - self.gen[i], clip)
            if self.admissions[i] == 0:
                self.hit[i] = h
                self.held[i] = int(adm.held_tokens)
                self.admitted_now.append(i)
            else:
                self.recomputed[i] += n_tok - h
            self.evicted[i] += int(adm.evicted_tokens)
            self.admissions[i] += 1
            self.ctx[i] = h
            self.target[i] = n_tok
            self.kv[i] = self._kv_after_admit(i, h, n_tok, budget)
            self.running.append(i)
            c = self._serve_running(i, plan, budget)
            if c < 0:  # preempted itself: the pool could not hold its first chunk
                plan.blocked = True
                break
            budget -= c
        return budget

    def _kv_after_admit(self, i: int, h: int, n_tok: int, budget: int) -> int:
        """Tokens with KV right after ``_admit`` (``max(asked, hit)``, the interface rule)."""
        if self.gen[i] > 0 and self._beyond_prompt:
            return max(n_tok, h)
        asked = min(n_tok if self.gen[i] == 0 else self.P[i], budget)
        return max(asked, h)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> StepPlan:
        """Build one step's batch, making the admit/extend/preempt calls it implies."""
        plan = StepPlan([], [], [], [])
        self.admitted_now = []
        budget = self.cfg.max_num_batched_tokens
        if self.sg:
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
        else:
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

    def complete(self, plan: StepPlan) -> None:
        """Apply a finished step: advance progress, sample tokens, finish requests.

        Fills ``finished_now`` and ``first_token_now`` with the rows that finished or got
        their first token in this step.
        """
        self.finished_now = []
        self.first_token_now = []
        for r, n, pre in zip(plan.req, plan.new, plan.prefill):
            if pre:
                self.ctx[r] += n
                if self.ctx[r] < self.target[r]:
                    continue
                if self.N[r] > 0:
                    if self.gen[r] == 0:
                        self.first_token_now.append(r)
                    self.gen[r] += 1
            else:
                self.ctx[r] += 1
                self.gen[r] += 1
            if self.gen[r] >= self.N[r]:
                self._finish(r)
        if self.finished_now:
            fin = set(self.finished_now)
            self.running = [r for r in self.running if r not in fin]

    def _finish(self, r: int) -> None:
        self.policy.finish(r)
        self.finished_now.append(r)

    # ------------------------------------------------------------------ fast-forward
    def can_fast_forward(self, plan: StepPlan) -> bool:
        """Whether the steps after *plan* repeat it (same decodes) until a finish or arrival.

        True for a pure-decode step without preemption that served every running request,
        when no waiting request could be admitted before a request finishes: the queue is
        empty, or (FCFS) admission was refused — a refusal that only a finish can lift
        under vLLM's rules, or ``max_num_seqs`` under SGLang's.
        """
        if not plan.pure_decode or plan.preempted or len(plan.req) != len(self.running):
            return False
        if not self.waiting:
            return True
        if not plan.blocked or self.cfg.schedule_policy != "fcfs":
            return False
        if self.sg:
            return len(self.running) >= self.cfg.max_num_seqs
        return True

    def max_fast_forward(self) -> int:
        """Most decode steps (this one included) all running requests can make together.

        Bounded by the first finish and by the pool: the extra KV of k − 1 more tokens per
        request (whole slots) plus one slot of headroom per request must fit in the room
        the policy reports.
        """
        run = self.running
        k_fin = min(self.N[r] - self.gen[r] for r in run)
        if k_fin <= 1:
            return max(k_fin, 1)
        S = self.policy.slot_tokens
        kv = np.fromiter((self.kv[r] for r in run), dtype=np.int64, count=len(run))
        base = -(-kv // S)

        def need(k):
            return int((-(-(kv + k - 1) // S) - base).sum())

        room = int(self.policy.room_slots()) - len(run)
        if need(k_fin) <= room:
            return k_fin
        lo, hi = 1, k_fin  # need(lo) = 0 ≤ room < need(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need(mid) <= room:
                lo = mid
            else:
                hi = mid
        return lo

    def fast_forward(self, k: int) -> None:
        """Run the k − 1 decode steps after the scheduled one and complete all k.

        Raises
        ------
        RuntimeError
            When the policy refuses KV that its reported room said was there (a policy
            that under-reports room must provide ``room_slots``).
        """
        if k > 1:
            for r in self.running:
                if not self.policy.extend(r, k - 1):
                    raise RuntimeError(
                        f"{type(self.policy).__name__} refused {k - 1} decode tokens of request {r} "
                        "that its reported free + evictable room should hold"
                    )
                self.kv[r] += k - 1
        self.finished_now = []
        self.first_token_now = []
        for r in self.running:
            self.ctx[r] += k
            self.gen[r] += k
            if self.gen[r] >= self.N[r]:
                self._finish(r)
        if self.finished_now:
            fin = set(self.finished_now)
            self.running = [r for r in self.running if r not in fin]
        if self.sg:
            self.ratio = max(self.ratio - self.ratio_decay * (k - 1), self.ratio_min)
