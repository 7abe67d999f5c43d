"""SGLang's step rules for the concurrent replay (SGLang 0.5.23, ``python/sglang/srt/managers/``).

This module is the reference. For :class:`radixkv.policies.radix.RadixCache` itself (and
a :class:`radixkv.cost.CostModel`, no ``on_step`` hook) ``replay_concurrent`` runs the same
rules compiled (:mod:`radixkv.replay.conc_sglang`), with the same results byte for byte;
a change to a rule here must be mirrored in :mod:`radixkv.replay._conc_sglang_kernels`
(``tests/test_conc_sglang.py`` compares the two).

:class:`SglangScheduler` builds each step as SGLang's default scheduler (not mixed-chunk,
no overlap, no priorities — those are :mod:`radixkv.replay.sched_sglang_priority` —, page-1
or paged full-attention KV) does. Each rule names the
function it follows:

- **Prefill first** (``scheduler.py :: Scheduler.get_next_batch_to_run``): a step is a
  prefill batch — the unfinished chunked request(s) first, then new admissions — when
  there is one, else a decode of every running request.
- **Batch formation, then allocation, then insertion** (``_get_new_batch_prefill_raw``,
  ``ScheduleBatch.prepare_for_extend``, ``process_batch_result_prefill``): each admitted
  request is matched against the tree and its match locked as the batch forms
  (``Req.init_next_round_input``, ``PrefillAdder._commit_prefill_admission``); the
  batch's KV is allocated after all members are matched; a prefill's tokens enter the
  tree only after the step's forward pass (``cache_unfinished_req``, per chunk with
  chunked prefill; ``cache_finished_req`` for a request that ends). So **members of one
  prefill batch never hit each other**, and a request admitted next to a chunked request
  hits only the chunks inserted by earlier steps. This needs a policy class declaring
  ``batch_visibility`` (``match_and_lock`` / ``commit`` / ``defer_insert``:
  :class:`radixkv.policies.radix.RadixCache`, and
  :class:`radixkv.policies.no_cache.NoCache`: SGLang's ``--disable-radix-cache`` is the
  same tree with matching off, run through the same formation-then-allocation flow, so
  cache off is admitted on the budget alone and allocated one chunk at a time); any
  other policy is admitted with ``admit`` at formation time and makes its KV visible by
  its own rules.
- **Admission budget** (``schedule_policy.py :: PrefillAdder``, ``mem_cache/prefill_budget.py
  :: PrefillBudget``): ``rem_total = free + evictable tokens (live, after the candidate's
  match is locked) − offset``; the offset starts at ``Σ_running min(N_r − g_r, 4096) ·
  new_token_ratio`` (``_get_running_request_total_token_offset``; a request in its
  chunked prefill is not in the running batch) and every admission adds
  ``ceil_page(chunk) + page + (min(N, 4096) if its prefill ends in this step else 0)``
  (``_update_prefill_budget`` → ``PrefillBudget.reserve``). A request is admitted when
  ``extend + min(N − g, 4096) + page < rem_total`` (``add_one_req`` →
  ``check_prefill``), its extend being fill − hit. Admission stops at the first refusal,
  when ``rem_total ≤ 0`` after an admission (``budget_state`` NO_TOKEN), when the chunk
  budget is spent (OTHER), or at ``max_num_seqs``. A prompt longer than the chunk budget
  left is truncated to it, page-aligned (``_select_prefill_admission``), and becomes the
  chunked request. A chunked request's next chunk takes ``min(budget, int(rem_total))`` (or
  the whole budget if that is ≤ 0: ``available_chunk_tokens``). One radixkv-specific
  rule: when nothing runs and nothing was admitted, the first waiting request is admitted
  whenever its first chunk fits the pool — SGLang instead clips ``max_new_tokens`` at
  arrival so such a request always passes the check.
- **new_token_ratio** (``scheduler_components/new_token_ratio_tracker.py ::
  NewTokenRatioTracker``): starts at 0.7; each decode step without retraction decays it
  by ``(0.7 − 0.7·0.14) / 600`` down to 0.098 (``decay_step``); after a retraction it is
  set to ``min(1, (Σ g_r + 20·n) / (Σ N_r + 1))`` over the n requests left running
  (``estimate_new_token_ratio_after_retract``, ``SGLANG_RETRACT_DECODE_STEPS = 20``);
  it is reset to 0.7 when the engine is idle (``self_check_during_idle`` → ``reset``).
- **Decode retraction** (``schedule_batch.py :: ScheduleBatch.retract_decode`` and
  ``_get_decode_retraction_order``): when the decode does not fit, requests are retracted
  — fewest outputs first, then the longest prompt, then the latest in the batch — until
  it fits; each is released without inserting anything (``release_req``) and
  **appended** to the waiting queue (``Scheduler._add_request_to_queue``).
- **What a retracted request re-matches** (``Req.init_next_round_input``): its
  ``fill_ids`` are prompt + generated tokens, matched up to ``len(fill_ids) − 1``; it
  recomputes the rest, and its next prefill inserts all of ``fill_ids``.
- ``schedule_policy='lpm'`` (``SchedulePolicy.calc_priority``): before each admission
  pass the waiting queue is sorted by longest cached prefix (stable), falling back to FCFS
  when more than 128 requests wait (``_determine_active_policy``), and always FCFS for a
  policy class with ``shares_prefixes = False`` (caching off: SGLang makes lpm FCFS when
  the tree is disabled, ``_validate_and_adjust_policy``). **In-batch prefix
  deprioritisation** (``_compute_prefix_matches``): walking the queue in its current
  order, a request whose cached prefix is ≤ 32 tokens is checked against the fills of
  the earlier such requests (SGLang's simulated waiting-queue tree); if it shares ≥ 32
  leading tokens with one of them it goes to the back (it will hit that request's KV in a
  later batch), else its fill joins the simulated tree
  (``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`` = ``..._DEPRIORITIZE_THRESHOLD`` = 32).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from radixkv.errors import ConfigError
from radixkv.replay.scheduler import LPM_MAX_WAITING, Scheduler, StepPlan

#: SGLang's defaults (``sglang/srt/environ.py``)
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
SGLANG_RETRACT_DECODE_STEPS = 20
#: ``schedule_policy.py``: IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD / _DEPRIORITIZE_THRESHOLD
IN_BATCH_PREFIX_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD = 32


def ratio_after_retract(gen, max_new) -> float:
    """``NewTokenRatioTracker.estimate_new_token_ratio_after_retract`` over the requests
    left running: ``min(1, (Σ generated + 20 · n) / (Σ max_new_tokens + 1))``.

    Parameters
    ----------
    gen, max_new : sequences of int
        Per remaining request: output tokens generated so far, and its output length N.
    """
    gen, max_new = list(gen), list(max_new)
    return min(1.0, (sum(gen) + SGLANG_RETRACT_DECODE_STEPS * len(gen)) / (sum(max_new) + 1))


def available_chunk_tokens(budget: int, rem_total: float) -> int:
    """Tokens a continuing chunked prefill may take this step (``PrefillAdder.add_chunked_req``).

    SGLang (``sglang/srt/mem_cache/prefill_budget.py``, ``available_chunk_tokens``) takes
    ``min(rem_chunk_tokens, int(rem_total_tokens))`` and, when that is ≤ 0, the whole
    ``rem_chunk_tokens`` so the chunked request always makes progress (it holds KV that
    only its completion frees). The truncation comes first: a remaining total in (0, 1)
    also gives the whole budget, not a 0-token chunk (which would stall the engine).

    Parameters
    ----------
    budget : int
        ``rem_chunk_tokens`` left in this step (tokens, > 0).
    rem_total : float
        ``rem_total_tokens``: free + evictable tokens minus the batch's reserved offset.
    """
    avail = min(int(budget), int(rem_total))
    return avail if avail > 0 else int(budget)


class SglangScheduler(Scheduler):
    """SGLang's scheduler: prefill-first steps, ``PrefillAdder`` budget, retraction.

    Parameters and attributes: :class:`radixkv.replay.scheduler.Scheduler`, plus

    Attributes
    ----------
    ratio : float
        SGLang's ``new_token_ratio`` now.
    deferred : bool
        Whether the policy class declares ``batch_visibility`` (it provides
        ``match_and_lock``, ``commit`` and ``defer_insert``); ``defer_insert`` is then
        switched on.
    shares_prefixes : bool
        The policy class's ``shares_prefixes`` (default True); False (caching off:
        :class:`radixkv.policies.no_cache.NoCache`) runs ``lpm`` as FCFS.
    """

    def __init__(self, trace, policy, config):
        super().__init__(trace, policy, config)
        self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO
        self.ratio_min = SGLANG_INIT_NEW_TOKEN_RATIO * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.ratio - self.ratio_min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        self.deferred = bool(getattr(policy, "batch_visibility", False))
        # a tree disabled (caching off) turns lpm into FCFS (_validate_and_adjust_policy)
        self.shares_prefixes = bool(getattr(policy, "shares_prefixes", True))
        # the budget and lpm see the device-resident prefix (len(req.prefix_indices)); a
        # policy that can also load from a host tier gives it as device_hit (HiCache)
        if getattr(policy, "device_hit", None) is not None:
            self._peek = policy.device_hit
        if self.deferred:
            policy.defer_insert = True
        self._page = int(policy.slot_tokens)
        if config.max_num_batched_tokens < self._page:
            raise ConfigError(
                f"SGLang's rules cut prefill chunks in whole pages: --max-num-batched-tokens "
                f"(--chunked-prefill-size) {config.max_num_batched_tokens} is below the page size {self._page}",
                field="max_num_batched_tokens",
            )

    # ------------------------------------------------------------------ helpers
    def _ceil_page(self, t: int) -> int:
        p = self._page
        return -(-t // p) * p

    def _room_tokens(self) -> int:
        """``allocator.available_size() + tree_cache.evictable_size()`` (tokens)."""
        return int(self.policy.room_slots()) * self.policy.slot_tokens

    def _fill_key(self, i: int):
        """Identity of request *i*'s first 32 fill tokens (None if its fill is shorter)."""
        t = IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD
        if self._n_tok(i) < t:
            return None
        seq = self.trace.kv_seq(i)
        out = []
        start = 0
        for sid, end in zip(seq.seg_id.tolist(), seq.seg_end.tolist()):
            if start >= t:
                break
            out.append((sid, start))
            start = end
        return tuple(out)

    # ------------------------------------------------------------------ queue order
    def _order_waiting(self) -> None:
        """``SchedulePolicy.calc_priority`` for ``lpm``: longest cached prefix first, the
        in-batch-deprioritised requests last (module docstring)."""
        if (self.cfg.schedule_policy != "lpm" or not self.shares_prefixes or len(self.waiting) > LPM_MAX_WAITING
                or not self.waiting):
            return
        tr = self.trace
        seen = set()
        keyed = []
        for k, i in enumerate(self.waiting):
            n = self._n_tok(i)
            hit = int(self._peek(tr.kv_seq(i), n))
            late = False
            if hit <= IN_BATCH_PREFIX_CHECK_THRESHOLD:
                key = self._fill_key(i)
                if key is not None and key in seen:
                    late = True
                elif key is not None:
                    seen.add(key)
            keyed.append(((1, 0) if late else (0, -hit), k, i))
        keyed.sort()
        self.waiting = deque(i for _, _, i in keyed)

    # ------------------------------------------------------------------ retraction
    def _victim(self) -> int:
        """``ScheduleBatch._get_decode_retraction_order``: fewest outputs, then the longest
        prompt, then the latest in the batch."""
        return min(self.running, key=lambda r: (self.gen[r], -self.P[r], -self.running.index(r)))

    def _requeue(self, v: int) -> None:
        """``Scheduler._add_request_to_queue(req, is_retracted=True)``: appended."""
        self.waiting.append(v)

    def idle(self) -> None:
        """``self_check_during_idle`` → ``NewTokenRatioTracker.reset``."""
        self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO

    def _prefilled(self, r: int) -> None:
        if self.deferred:
            self.policy.commit(r)  # cache_unfinished_req

    # ------------------------------------------------------------------ one step
    def schedule(self) -> StepPlan:
        """Build one step's batch: a prefill batch if there is one, else a decode of all."""
        plan = StepPlan([], [], [], [])
        self._head_check = None
        self._ff_blocked = False
        self.admitted_now = []
        clip = SGLANG_CLIP_MAX_NEW_TOKENS
        p = self._page
        budget = self.cfg.max_num_batched_tokens  # rem_chunk_tokens
        chunking = [r for r in self.running if self.ctx[r] < self.target[r]]
        # added left to right in running order from 0.0, an explicit loop: ``sum()`` of
        # floats is compensated since Python 3.12, and the compiled loop
        # (radixkv.replay._conc_sglang_kernels) must give the same bits on every version
        offset = 0.0
        for r in self.running:
            if self.ctx[r] >= self.target[r]:
                offset += min(self.N[r] - self.gen[r], clip) * self.ratio
        alloc = []  # (request, tokens) allocated after the batch forms (prepare_for_extend)
        # 1. the unfinished chunked prefills (PrefillAdder.add_chunked_req)
        for r in chunking:
            if budget <= 0:
                break
            avail = available_chunk_tokens(budget, self._room_tokens() - offset)
            left = self.target[r] - self.ctx[r]
            c = min(left, avail)
            offset += self._ceil_page(c) + p + (min(self.N[r], clip) if c >= left else 0)
            budget -= self._ceil_page(c)
            plan.add(r, c, self.ctx[r], True)
            alloc.append((r, c))
        # 2. new requests (the waiting-queue loop of _get_new_batch_prefill_raw)
        if self.waiting and budget > 0:
            self._order_waiting()
            while self.waiting:
                if budget <= 0:
                    break
                if len(self.running) >= self.cfg.max_num_seqs:
                    plan.blocked = True
                    break
                i = self.waiting[0]
                seq = self.trace.kv_seq(i)
                fill = self._n_tok(i)
                if self.deferred:
                    adm = self.policy.match_and_lock(i, seq, fill)
                    h = int(adm.hit_tokens)
                else:
                    adm = None
                    h = int(self._peek(seq, fill)) if self._peek is not None else 0
                extend = fill - h
                max_new = min(max(self.N[i] - self.gen[i], 0), clip)
                lone = not self.running and not plan.req
                fits = extend + max_new + p < self._room_tokens() - offset  # check_prefill
                c = extend
                if self._ceil_page(extend) > budget:  # truncated: the new chunked request
                    c = (h + budget // p * p) // p * p - h
                ok = c > 0 and (fits or (lone and self._lone_fits(i, h, c)))
                if not ok:
                    if self.deferred:
                        room_locked = self._room_tokens()
                        self.policy.preempt(i)  # drop the lock; nothing was allocated
                        if not lone:  # what a repeat of this check depends on (_blocked_bound)
                            self._head_check = (i, c, extend + max_new + p, room_locked,
                                                int(self.policy.room_slots()))
                    plan.blocked = True
                    break
                if not self.deferred:
                    adm = self._admit(i, seq, fill, h + c)
                    if adm is None:
                        plan.blocked = True
                        break
                    h = int(adm.hit_tokens)
                    c = max(min(c, fill - h), 0)
                    plan.load_tokens += adm.host_loaded_tokens  # HiCache load back
                self.waiting.popleft()
                self._record(i, adm, fill)  # ctx = h, target = fill
                self.running.append(i)
                chunked = h + c < fill
                offset += self._ceil_page(c) + p + (0 if chunked else min(self.N[i], clip))
                budget -= self._ceil_page(c)
                if self.deferred:
                    self.kv[i] = h
                    alloc.append((i, c))
                else:
                    self.kv[i] = self._kv_after_admit(i, h, fill, h + c)
                if c > 0:
                    plan.add(i, c, self.ctx[i], True)
                if self._room_tokens() - offset <= 0:  # budget_state: NO_TOKEN
                    plan.blocked = bool(self.waiting)
                    break
        # 3. allocate the batch's KV (ScheduleBatch.prepare_for_extend)
        for r, c in alloc:
            if r in self.running:
                self._grow(r, self.ctx[r] + c, plan)
        if plan.req:
            plan.n_running = len(self.running)
            return plan
        # 4. decode (update_running_batch): retract until it fits, else decay the ratio
        snap = list(self.running)
        _, m = self._plain_decodes(plan, snap, 0, len(snap))
        for r in snap[m:]:  # from the first refusal on: one by one, retracting as needed
            if r in self.running:
                self._serve_running(r, plan, 1)
        if plan.preempted:
            self.ratio = ratio_after_retract((self.gen[r] for r in self.running), (self.N[r] for r in self.running))
        elif plan.req:
            self.ratio = max(self.ratio - self.ratio_decay, self.ratio_min)
        plan.n_running = len(self.running)
        return plan

    def _lone_fits(self, i: int, h: int, c: int) -> bool:
        """The idle-engine exception (module docstring): the first chunk fits the pool."""
        S = self.policy.slot_tokens
        return -(-(h + c) // S) - h // S <= int(self.policy.room_slots())

    def _refusal_holds(self, plan: StepPlan) -> bool:
        """For :meth:`~radixkv.replay.scheduler.Scheduler.can_fast_forward`: (FCFS) a queue
        blocked by ``max_num_seqs``, or a head refused by the ``PrefillAdder`` budget while
        repeating its check changes nothing (a budget refusal may lift as
        ``new_token_ratio`` decays: :meth:`max_fast_forward` bounds the run).
        """
        if not plan.blocked or self.cfg.schedule_policy != "fcfs":
            return False
        if len(self.running) >= self.cfg.max_num_seqs:
            return True
        # a head refused by the PrefillAdder budget: the steps repeat while the check keeps
        # refusing it (max_fast_forward finds how long; each is then exactly a scheduled step)
        self._ff_blocked = self._head_check is not None and self._repeat_inert()
        return self._ff_blocked

    def _repeat_inert(self) -> bool:
        """Whether repeating the head's refused lookup changes nothing later steps see:
        :class:`~radixkv.policies.radix.RadixCache`'s own ``match_and_lock`` + ``preempt``
        (on an unchanged tree: the same hit, no split, the head's nodes stamped most recent
        again, no eviction while a slot is free) and its own decode rule."""
        from radixkv.policies.radix import RadixCache

        t = type(self.policy)
        return (issubclass(t, RadixCache) and t._admit is RadixCache._admit and t.extend is RadixCache.extend
                and t.preempt is RadixCache.preempt and t.match_and_lock is RadixCache.match_and_lock)

    def max_fast_forward(self) -> int:
        """The base bound; for a budget-refused head also :meth:`_blocked_bound`."""
        k = super().max_fast_forward()
        if self._ff_blocked and k > 1:
            k = self._blocked_bound(k)
        return k

    def _blocked_bound(self, k: int) -> int:
        """Most steps (≤ *k*, this one included) before the budget-refused head could be admitted.

        Step j of the run (j = 1 … k − 1) repeats this step's admission check
        (``PrefillAdder.add_one_req`` → ``check_prefill``) with the state after j decodes:
        every running request has j more outputs (``offset`` = Σ ``min(N − g − j, 4096) ·
        ratio_j``, summed in running order, ``ratio_j`` decayed j times one step at a time);
        the pool has the pages those decodes took fewer (``room``), and the head's hit is
        unchanged, since the run is bounded to steps whose decodes leave a slot free (no
        eviction touches the tree). The run stops before the first step whose check would
        pass; values within rounding of the boundary are recomputed exactly as
        :meth:`schedule` computes them.
        """
        i, c, need_tokens, room_locked, room_unlocked = self._head_check
        pol = self.policy
        S = int(pol.slot_tokens)
        run = self.running
        n = len(run)
        kv0 = np.fromiter((self.kv[r] for r in run), dtype=np.int64, count=n)
        ts = np.arange(0, k, dtype=np.int64)
        # newc[t]: pages the run's decodes start with t extra tokens per request
        newc = (-(-(kv0[None, :] + ts[:, None]) // S) - (-(-kv0 // S))[None, :]).sum(axis=1)
        free = int(pol.stats(detail=False).free_slots)
        # every decode of steps 1 … k' − 1 must leave a slot free (no eviction)
        k = min(k, int(np.searchsorted(newc, free - 1, side="right")))
        if k <= 1 or c <= 0:
            return max(k, 1)
        lock = room_unlocked - room_locked // S  # slots the head's locked match takes from room
        room_now = int(pol.room_slots())
        js = np.arange(1, k, dtype=np.int64)
        room_j = (room_now - newc[js - 1] - lock) * S
        d = self.ratio_decay
        ratios = np.maximum(np.cumsum(np.concatenate(([self.ratio], np.full(k - 2, -d)))), self.ratio_min)
        left = np.fromiter((self.N[r] - self.gen[r] for r in run), dtype=np.int64, count=n)
        rem = np.minimum(left[None, :] - js[:, None], SGLANG_CLIP_MAX_NEW_TOKENS).astype(np.float64)
        offset = np.cumsum(rem * ratios[:, None], axis=1)[:, -1]
        margin = (room_j - offset) - need_tokens
        near = np.abs(margin) <= 1e-6 * np.maximum(1.0, np.abs(offset))
        for t in np.flatnonzero(near).tolist():  # exact recomputation near the boundary
            j = t + 1
            ratio = float(ratios[t])
            off = 0.0  # left to right from 0.0 (see schedule)
            for r in run:
                off += min(self.N[r] - self.gen[r] - j, SGLANG_CLIP_MAX_NEW_TOKENS) * ratio
            margin[t] = 1.0 if need_tokens < int(room_j[t]) - off else -1.0
        passes = np.flatnonzero(margin > 0)
        return int(passes[0]) + 1 if passes.size else k

    def _on_fast_forward(self, k: int) -> None:
        if self._ff_blocked:  # the steps' decays, one at a time (as the steps make them)
            for _ in range(k - 1):
                self.ratio = max(self.ratio - self.ratio_decay, self.ratio_min)
            return
        self.ratio = max(self.ratio - self.ratio_decay * (k - 1), self.ratio_min)
