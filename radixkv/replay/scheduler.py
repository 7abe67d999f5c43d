"""Shared state of the concurrent replay's continuous-batching scheduler.

One call of ``schedule()`` builds the batch of one engine step and makes the policy calls
that step implies; ``complete()`` applies the step's results. Time is not known here:
:mod:`radixkv.replay.concurrent` prices each step with a :class:`radixkv.cost.CostModel`
and advances the clock.

This module holds what every engine's scheduler shares — :class:`SchedulerConfig`,
:class:`StepPlan`, the per-request state, the waiting/running queues and the policy calls
of admission, growth, preemption and finish (:class:`Scheduler`). The engine rules live
in one module each:

- :mod:`radixkv.replay.sched_vllm` — vLLM v1's step (``Scheduler.schedule``);
- :mod:`radixkv.replay.sched_sglang` — SGLang's (``PrefillAdder`` budget, prefill-first
  steps, decode retraction, ``new_token_ratio``).

Which one a replay uses comes from the policy **class**: its ``admission_rule``
attribute (``"vllm"`` or ``"sglang"``, read by :func:`admission_rule_of`);
``SchedulerConfig.admission`` overrides it. :func:`radixkv.replay.schedulers.make_scheduler` builds it.

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

A re-admitted (preempted) request looks up and recomputes prompt + generated tokens:
here ``policy.admit(rid, seq, n_tokens=P + g)``, KV for all of it at once (vLLM's rules
instead allocate the hit plus a first chunk: :mod:`radixkv.replay.sched_vllm`). Its hit is not
counted (hit rate counts first admissions only, docs/SEMANTICS.md). A policy that refuses
``n_tokens > P`` (raises ValueError) is re-admitted on its prompt and recomputes the
generated tokens as further chunks: its lookup then covers the prompt only.

Optional policy hooks (duck-typed, not in the base interface)
-------------------------------------------------------------
``peek_hit(seq, n_tokens)``  hit tokens an admission would get, without changing state
                            (needed by ``lpm``; used by SGLang's admission budget, which
                            otherwise assumes no hit, a conservative budget).

The scheduler also calls ``PrefixCache.room_slots()`` (free + evictable slots, in the base
class), which :class:`radixkv.policies.static_reserved.StaticReservedCache` overrides
(its reserved part is never available to running requests).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from radixkv.errors import ConfigError

SCHEDULE_POLICIES = ("fcfs", "lpm")
#: vLLM's ``--scheduling-policy`` (``SchedulerConfig.policy``)
SCHEDULING_POLICIES = ("fcfs", "priority")
#: SGLang's ``--retraction-policy``
RETRACTION_POLICIES = ("length", "priority")
ADMISSIONS = ("vllm", "sglang")

#: ``lpm`` falls back to FCFS above this many waiting requests (SGLang
#: ``schedule_policy.py :: SchedulePolicy._determine_active_policy``)
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
        server on an A100 uses 2048; docs/engines/vllm.md §4). Chunked prefill: see
        ``enable_chunked_prefill``.
    schedule_policy : {'fcfs', 'lpm'}
        Order of the waiting queue (SGLang ``--schedule-policy``; vLLM is FCFS).
    admission : {'vllm', 'sglang'} or None
        Engine whose step rules (admission, preemption, step composition) the replay
        follows; None (default): the policy class's ``admission_rule``
        (:func:`admission_rule_of`).
    enable_chunked_prefill : bool
        vLLM ``--enable-chunked-prefill`` (default True). False: a waiting request whose
        un-hit tokens exceed the step's remaining budget is not admitted and admission
        stops (vLLM rules only; :mod:`radixkv.replay.sched_vllm`).
    long_prefill_token_threshold : int
        vLLM ``--long-prefill-token-threshold`` (default 0 = off): a prefill chunk takes at
        most this many tokens when more than one request is running or waiting (vLLM
        rules only; :mod:`radixkv.replay.sched_vllm`).
    watermark : float
        vLLM ``--watermark`` (default 0.0, in [0, 1)): share of the pool's blocks an
        admission must leave free while other requests run (vLLM rules only).
    scheduling_policy : {'fcfs', 'priority'}
        vLLM ``--scheduling-policy`` (``SchedulerConfig.policy``, default ``fcfs``).
        ``priority``: waiting queue by (priority, arrival), preemption of the running
        request with the largest (priority, arrival), from the trace's ``priority``
        column (vLLM rules only; :mod:`radixkv.replay.sched_vllm_priority`).
    enable_priority_scheduling : bool
        SGLang ``--enable-priority-scheduling`` (default False): the waiting queue sorted
        by (priority, queue entry) before each admission pass, **higher** values first
        unless ``schedule_low_priority_values_first`` (SGLang rules only;
        :mod:`radixkv.replay.sched_sglang_priority`). SGLang's priority preemption of
        running requests is not modelled: ``disable_priority_preemption`` must be set.
    schedule_low_priority_values_first : bool
        SGLang ``--schedule-low-priority-values-first`` (default False).
    disable_priority_preemption : bool
        SGLang ``--disable-priority-preemption`` (default False).
    retraction_policy : {'length', 'priority'}
        SGLang ``--retraction-policy`` (default ``length``): ``priority`` retracts the
        least preferred priority first when a decode does not fit (needs
        ``enable_priority_scheduling``).
    knob_source : str or None
        Where ``max_num_batched_tokens`` / ``max_num_seqs`` came from, as the outputs report
        it (``scheduler.source``, :func:`radixkv.replay.settings.step_knobs`): None (a config
        built in code) reads ``"given"``. Not a knob: no part of equality and no effect on
        the replay.

    Raises
    ------
    radixkv.errors.ConfigError
        On a non-positive limit or an unknown name.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    schedule_policy: str = "fcfs"
    admission: str | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    watermark: float = 0.0
    scheduling_policy: str = "fcfs"
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    disable_priority_preemption: bool = False
    retraction_policy: str = "length"
    knob_source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if int(self.max_num_seqs) < 1:
            raise ConfigError(f"--max-num-seqs must be ≥ 1, got {self.max_num_seqs}", field="max_num_seqs")
        if int(self.max_num_batched_tokens) < 1:
            raise ConfigError(f"--max-num-batched-tokens must be ≥ 1, got {self.max_num_batched_tokens}",
                              field="max_num_batched_tokens")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ConfigError(f"unknown --schedule-policy {self.schedule_policy!r}; choose fcfs or lpm",
                              field="schedule_policy")
        if int(self.long_prefill_token_threshold) < 0:
            raise ConfigError(f"--long-prefill-token-threshold must be ≥ 0, got {self.long_prefill_token_threshold}",
                              field="long_prefill_token_threshold")
        if not 0.0 <= float(self.watermark) < 1.0:
            raise ConfigError(f"--watermark must be in [0, 1), got {self.watermark}", field="watermark")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ConfigError(f"unknown --scheduling-policy {self.scheduling_policy!r}; choose fcfs or priority",
                              field="scheduling_policy")
        if self.scheduling_policy == "priority" and self.schedule_policy != "fcfs":
            raise ConfigError(f"--scheduling-policy priority orders the waiting queue itself: drop "
                              f"--schedule-policy {self.schedule_policy}", field="scheduling_policy")
        if self.retraction_policy not in RETRACTION_POLICIES:
            raise ConfigError(f"unknown --retraction-policy {self.retraction_policy!r}; choose length or priority",
                              field="retraction_policy")
        if not self.enable_priority_scheduling:
            # SGLang: "--retraction-policy priority requires --enable-priority-scheduling"
            # (arg_groups/validation_hook.py); the other two do nothing without it
            for name, on in (("retraction_policy", self.retraction_policy == "priority"),
                             ("schedule_low_priority_values_first", self.schedule_low_priority_values_first),
                             ("disable_priority_preemption", self.disable_priority_preemption)):
                if on:
                    flag = "--" + name.replace("_", "-") + (" priority" if name == "retraction_policy" else "")
                    raise ConfigError(f"{flag} needs --enable-priority-scheduling", field=name)
        if self.admission is not None and self.admission not in ADMISSIONS:
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
    preempted_rows : list of int
        The requests preempted while building the step, in preemption order.
    blocked : bool
        Admission was tried and refused (by the policy, the SGLang budget or
        ``max_num_seqs``); stays refused until a request finishes (FCFS).
    load_tokens : int
        Tokens of KV the step's admissions copy back from a host-memory tier
        (``Admission.host_loaded_tokens``; priced by :class:`radixkv.cost.HostLink`).
    """

    req: list
    new: list
    ctx: list
    prefill: list
    n_running: int = 0
    preempted: int = 0
    blocked: bool = False
    preempted_rows: list = field(default_factory=list)
    load_tokens: int = 0

    @property
    def empty(self) -> bool:
        return not self.req

    def add(self, r: int, new: int, ctx: int, prefill: bool) -> None:
        """Append one item: request row *r* computes *new* tokens after *ctx* tokens of KV,
        a prefill chunk or (*prefill* False) a decode."""
        self.req.append(r)
        self.new.append(new)
        self.ctx.append(ctx)
        self.prefill.append(prefill)

    @property
    def pure_decode(self) -> bool:
        return bool(self.req) and not any(self.prefill)


def admission_rule_of(policy) -> str:
    """The engine whose scheduler a *policy* runs under: its class's ``admission_rule``.

    ``"sglang"`` for a policy whose admission leaves the whole-prompt room check to
    SGLang's ``PrefillAdder`` budget (:class:`radixkv.policies.radix.RadixCache`),
    ``"vllm"`` for every other (the base class default, vLLM's ``KVCacheManager`` check).

    Raises
    ------
    radixkv.errors.ConfigError
        When the class declares a rule that is not in :data:`ADMISSIONS`.
    """
    rule = getattr(type(policy), "admission_rule", "vllm")
    if rule not in ADMISSIONS:
        raise ConfigError(f"{type(policy).__name__}.admission_rule is {rule!r}; choose one of {ADMISSIONS}",
                          field="admission")
    return rule


def rule_of(policy, config: "SchedulerConfig") -> str:
    """The rule of a replay (``config.admission``, else the policy class's), checked
    against the knobs: see :func:`radixkv.replay.schedulers.make_scheduler` (same errors)."""
    rule = config.admission if config.admission is not None else admission_rule_of(policy)
    if rule == "sglang" and (not config.enable_chunked_prefill or config.long_prefill_token_threshold
                             or config.watermark):
        raise ConfigError("--no-enable-chunked-prefill, --long-prefill-token-threshold and --watermark are "
                          "vLLM knobs; SGLang's rules (--admission sglang) do not use them", field="admission")
    if rule == "sglang" and config.scheduling_policy != "fcfs":
        raise ConfigError("--scheduling-policy priority is vLLM's priority scheduler; under SGLang's rules "
                          "(--admission sglang) use --enable-priority-scheduling", field="scheduling_policy")
    if rule == "vllm" and config.enable_priority_scheduling:
        raise ConfigError("--enable-priority-scheduling is SGLang's; under vLLM's rules use "
                          "--scheduling-policy priority", field="enable_priority_scheduling")
    if rule == "sglang" and config.enable_priority_scheduling and not config.disable_priority_preemption:
        raise ConfigError("SGLang preempts running requests for a waiting one of higher priority "
                          "(PrefillAdder.preempt_to_schedule, --priority-scheduling-preemption-threshold), which "
                          "radixkv does not model: add --disable-priority-preemption", field="disable_priority_preemption")
    return rule


def priorities(trace) -> np.ndarray:
    """The trace's ``priority`` column as int64, shape (n,); 0 everywhere when the trace
    has none (vLLM's default priority; under SGLang's rules all requests equal)."""
    n = len(trace)
    return np.zeros(n, dtype=np.int64) if trace.priority is None else np.asarray(trace.priority, dtype=np.int64)


class Scheduler:
    """State of every request and the waiting/running queues of one replay (engine-neutral).

    Subclasses give the engine's step: :meth:`schedule`, :meth:`_victim`,
    :meth:`can_fast_forward` (and :meth:`_chunk`, a prefill chunk's size). The rules both
    engines share are here: a running request's next chunk or decode
    (:meth:`_serve_running`), a stretch of plain decodes (:meth:`_plain_decodes`), growth
    with preemption (:meth:`_grow`, :meth:`_preempt`), an admission's bookkeeping
    (:meth:`_record`), a finished step (:meth:`complete`) and fast-forwarded decodes
    (:meth:`fast_forward`). Build one with :func:`radixkv.replay.schedulers.make_scheduler`.

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
        self._beyond_prompt = True  # policy accepts admit(n_tokens > P) until it says otherwise
        can = getattr(policy, "can_peek_hit", None)
        self._peek = getattr(policy, "peek_hit", None) if (can is None or can()) else None
        if config.schedule_policy == "lpm" and self._peek is None:
            raise ConfigError(
                f"--schedule-policy lpm needs a policy that can look up a prefix without side effects "
                f"(a peek_hit method); {type(policy).__name__} has none",
                field="schedule_policy",
            )
        fits_all = getattr(policy, "fits_alone_all", None)
        fits = getattr(policy, "fits_alone", None)
        if fits_all is not None or fits is not None:
            if fits_all is not None:
                overs = np.asarray(fits_all(trace), dtype=np.int64)
            else:
                overs = np.array([fits(trace.kv_seq(i)) for i in range(n)], dtype=np.int64)
            for i in np.flatnonzero(overs > 0)[:1].tolist():
                over = int(overs[i])
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

    def _record(self, i: int, adm, n_tok: int) -> int:
        """Per-request bookkeeping of an admission of row *i* holding *n_tok* tokens (the
        first, or a re-admission after a preemption); returns its hit in tokens."""
        h = int(adm.hit_tokens)
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
        return h

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
        plan.preempted_rows.append(v)
        self.policy.preempt(v)
        self.ctx[v] = 0
        self.kv[v] = 0
        self.target[v] = 0
        self.preemptions[v] += 1
        self._requeue(v)

    def _requeue(self, v: int) -> None:
        """Put preempted request *v* back in the waiting queue (default: at the front,
        vLLM's ``self.waiting.prepend_request``)."""
        self.waiting.appendleft(v)

    def idle(self) -> None:
        """The engine has nothing to run (no running, no waiting request); default: nothing."""

    def _victim(self) -> int:
        """The running request to preempt when a request cannot get KV."""
        raise NotImplementedError

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
            self._before_preempt(v, plan)
            self._preempt(v, plan)
            plan.preempted += 1
            if v == r:
                return False
        return True

    def _before_preempt(self, v: int, plan: StepPlan) -> None:
        """Called by :meth:`_grow` just before *v* is preempted; default: nothing (vLLM's
        priority scheduler gives back *v*'s budget and moves its running-loop index)."""

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens a prefill with *remaining* tokens to compute gets with *budget* left
        (default: as many as the budget allows; vLLM caps it further)."""
        return min(remaining, budget)

    def _serve_running(self, r: int, plan: StepPlan, budget: int) -> int:
        """Schedule *r*'s next chunk or decode; returns tokens used, or −1 if *r* was preempted."""
        pre = self.ctx[r] < self.target[r]
        c = self._chunk(self.target[r] - self.ctx[r], budget) if pre else 1
        if not self._grow(r, self.ctx[r] + c, plan):
            return -1
        plan.add(r, c, self.ctx[r], pre)
        return c

    def _plain_decodes(self, plan: StepPlan, run: list, k: int, lim: int) -> tuple:
        """The stretch of plain decodes (KV = computed tokens) ``run[k:j]`` (j ≤ *lim*: the
        first request from k that is not one) gets one decode token each in one
        ``policy.extend_many`` call, added to *plan* up to the first refusal. Returns
        (j, m): m of them got it (m < j − k: ``run[k + m]`` was refused)."""
        ctx, target, kv = self.ctx, self.target, self.kv
        j = k
        while j < lim and ctx[run[j]] >= target[run[j]] and kv[run[j]] == ctx[run[j]]:
            j += 1
        if j == k:
            return j, 0
        rids = run[k:j]
        m = self.policy.extend_many(rids, 1)
        got = rids[:m]
        for r in got:
            kv[r] += 1
        plan.req.extend(got)
        plan.new.extend([1] * m)
        plan.ctx.extend([ctx[r] for r in got])
        plan.prefill.extend([False] * m)
        return j, m

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

    def _kv_after_admit(self, i: int, h: int, n_tok: int, budget: int) -> int:
        """Tokens with KV right after ``_admit`` (``max(asked, hit)``, the interface rule)."""
        if self.gen[i] > 0 and self._beyond_prompt:
            return max(n_tok, h)
        asked = min(n_tok if self.gen[i] == 0 else self.P[i], budget)
        return max(asked, h)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> StepPlan:
        """Build one step's batch, making the admit/extend/preempt calls it implies."""
        raise NotImplementedError

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
                    self._prefilled(r)
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
            elif pre:
                self._prefilled(r)
        if self.finished_now:
            fin = set(self.finished_now)
            self.running = [r for r in self.running if r not in fin]

    def _prefilled(self, r: int) -> None:
        """Engine hook: a prefill chunk of *r* ran and *r* goes on (default: nothing)."""

    def _finish(self, r: int) -> None:
        self.policy.finish(r)
        self.finished_now.append(r)

    # ------------------------------------------------------------------ fast-forward
    def can_fast_forward(self, plan: StepPlan) -> bool:
        """Whether the steps after *plan* repeat it (same decodes) until a finish or arrival:
        a pure-decode step without preemption that served every running request, with an
        empty waiting queue or a refused one that the engine's :meth:`_refusal_holds` says
        stays refused."""
        if not plan.pure_decode or plan.preempted or len(plan.req) != len(self.running):
            return False
        return not self.waiting or self._refusal_holds(plan)

    def _refusal_holds(self, plan: StepPlan) -> bool:
        """Engine rule: whether the waiting head refused in *plan* stays refused over the
        decode steps that repeat it."""
        raise NotImplementedError

    def run_ends_at_arrival(self) -> bool:
        """Whether a fast-forwarded run must stop at the next arrival: when the waiting queue
        is empty (the arrival would be admitted). A queue that is not empty was refused
        and FCFS puts the arrival behind it, so the run goes on to the next finish;
        vLLM's priority queue overrides this (an arrival may become the head)."""
        return not self.waiting

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

    def fast_forward(self, k: int) -> np.ndarray:
        """Run the k − 1 decode steps after the scheduled one and complete all k.

        Returns the pool after each of the k steps, as the step-by-step replay samples it
        (``policy.stats(detail=False)`` after the step; after the finishes for step k),
        so that every time-averaged metric is integrated over the skipped steps exactly.

        The policy is advanced as cheaply as its declared decode behaviour allows:

        - ``decode_free_first`` (decode takes free slots before evicting cached ones):
          while the new slots of a run of steps leave at least one slot free, the run is
          one ``extend(r, m)`` per request and its stats follow from the first sample
          (used += new slots, free −= new slots, valid += one token per request per step);
        - ``decode_slot_local`` (a decode that stays inside the request's last slot changes
          no slot count): a request is extended only at the steps where its next token
          starts a slot (catching up its lag); valid tokens are corrected by the lag;
        - otherwise every step is ``extend(r, 1)`` for each request, then ``stats``.

        Returns
        -------
        np.ndarray, int64, shape (k, 3)
            Per step: ``used_slots``, ``cached_slots``, ``valid_tokens``.

        Raises
        ------
        RuntimeError
            When the policy refuses KV that its reported room said was there (a policy
            that under-reports room must provide ``room_slots``).
        """
        run = list(self.running)
        out = np.empty((k, 3), dtype=np.int64)
        if k > 1:
            self._decode_run(run, k, out)
            for r in run:
                self.kv[r] += k - 1
        self.finished_now = []
        self.first_token_now = []
        for r in run:
            self.ctx[r] += k
            self.gen[r] += k
            if self.gen[r] >= self.N[r]:
                self._finish(r)
        if self.finished_now:
            fin = set(self.finished_now)
            self.running = [r for r in self.running if r not in fin]
        out[k - 1] = self._pool_sample()
        self._on_fast_forward(k)
        return out

    def _pool_sample(self):
        st = self.policy.stats(detail=False)
        return st.used_slots, st.cached_slots, st.valid_tokens

    def _extend_all(self, rids, ns) -> None:
        """``_extend`` of each ``(rids[j], ns[j])`` in order (*ns* may be one int), in one
        ``policy.extend_many`` call; items of 0 tokens are skipped."""
        if isinstance(ns, int):
            if ns <= 0:
                return
        elif 0 in ns:
            keep = [j for j, m in enumerate(ns) if m > 0]
            rids = [rids[j] for j in keep]
            ns = [ns[j] for j in keep]
        done = self.policy.extend_many(rids, ns)
        if done < len(rids):
            m = ns if isinstance(ns, int) else ns[done]
            raise RuntimeError(
                f"{type(self.policy).__name__} refused {m} decode tokens of request {rids[done]} "
                "that its reported free + evictable room should hold"
            )

    def _decode_run(self, run, k: int, out: np.ndarray) -> None:
        """Extend every request of *run* by k − 1 tokens (running order within each step);
        fill ``out[0:k-1]``, the pool after steps 1 … k − 1 (step 1 was applied by
        ``schedule``; ``out[t]`` is the pool when every request has t extra tokens)."""
        pol = self.policy
        n = len(run)
        S = int(pol.slot_tokens)
        kv0 = np.fromiter((self.kv[r] for r in run), dtype=np.int64, count=n)
        out[0] = self._pool_sample()
        free_first = bool(getattr(pol, "decode_free_first", False))
        if not free_first and getattr(pol, "decode_slot_local", False):
            self._lazy_slot_local(run, kv0, S, k, out)
            return
        newc = None
        if free_first:  # newc[t]: new slots of the whole run after t extra tokens
            ts = np.arange(1, k, dtype=np.int64)
            res, cnt = np.unique(kv0 % S, return_counts=True)
            newc = np.zeros(k, dtype=np.int64)
            for rr, c in zip(res.tolist(), cnt.tolist()):
                newc[1:] += c * (-(-(rr + ts) // S) - (-(-rr // S)))
        t = 1  # every request holds t − 1 extra tokens
        while t <= k - 2:
            if newc is not None:
                st = pol.stats(detail=False)
                lim = newc[t - 1] + st.free_slots - 1  # keep one slot free: nothing is evicted
                m = int(np.searchsorted(newc[t:k - 1], lim, side="right"))
                if m > 0:
                    self._extend_all(run, m)
                    seg = np.arange(t, t + m)
                    out[t:t + m, 0] = st.used_slots + newc[seg] - newc[t - 1]
                    out[t:t + m, 1] = st.cached_slots
                    out[t:t + m, 2] = st.valid_tokens + n * (seg - (t - 1))
                    t += m
                    continue
            self._extend_all(run, 1)
            out[t] = self._pool_sample()
            t += 1
        self._extend_all(run, 1)  # step k

    def _lazy_slot_local(self, run, kv0, S: int, k: int, out: np.ndarray) -> None:
        """The k − 1 extra tokens of a ``decode_slot_local`` policy's run: at each step only
        the requests whose token starts a new slot are extended (in running order,
        catching up their lag); the lag's tokens are added to the sampled valid tokens."""
        batch = getattr(self.policy, "decode_run", None)
        if batch is not None and batch(run, kv0, k, out):
            return
        n = len(run)
        by_res: dict[int, list] = {}
        for i, x in enumerate(kv0.tolist()):
            by_res.setdefault(x % S, []).append(i)
        applied = [0] * n
        u, c, v = out[0]
        A = 0  # Σ applied
        last = 1
        for t in range(1, k - 1):
            hit = by_res.get((1 - t) % S)  # token kv0 + t − 1 starts a slot
            if not hit:
                continue
            if t > last:
                seg = np.arange(last, t)
                out[last:t, 0] = u
                out[last:t, 1] = c
                out[last:t, 2] = v + n * seg - A
            self._extend_all([run[i] for i in hit], [t - applied[i] for i in hit])
            for i in hit:
                A += t - applied[i]
                applied[i] = t
            u, c, v = self._pool_sample()
            out[t] = (u, c, v + n * t - A)
            last = t + 1
        if last < k - 1:
            seg = np.arange(last, k - 1)
            out[last:k - 1, 0] = u
            out[last:k - 1, 1] = c
            out[last:k - 1, 2] = v + n * seg - A
        self._extend_all(run, [(k - 1) - a for a in applied])  # step k: everyone to k − 1 extra tokens

    def _on_fast_forward(self, k: int) -> None:
        """Engine bookkeeping after :meth:`fast_forward` of *k* steps (default: none)."""
