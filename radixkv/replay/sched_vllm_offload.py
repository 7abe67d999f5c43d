"""vLLM v1's step rules with CPU KV offloading: asynchronous loads of CPU hits.

:class:`VllmOffloadScheduler` is :class:`~radixkv.replay.sched_vllm.VllmScheduler` (the
running pass, preemption, budget, chunk cap) with vLLM 0.33's waiting pass as it runs
with a KV connector whose loads are asynchronous — the ``OffloadingConnector``
(``vllm/v1/core/sched/scheduler.py :: Scheduler.schedule``, the "schedule the WAITING
requests" loop; connector calls in ``vllm/distributed/kv_transfer/kv_connector/v1/
offloading/scheduler.py :: OffloadingConnectorScheduler``). The policy is
:class:`~radixkv.policies.vllm_offload.OffloadBlockHashCache` in its concurrent mode;
checked step by step against the real scheduler, connector and CPU manager driven on CPU
(``tools/engines/vllm_offload_golden.py --concurrent``; goldens in
tests/data/golden/vllm_offload/concurrent). The rules:

- **Two waiting queues.** Requests that hold KV blocks while waiting (a load in flight or
  landed, ``_holds_kv_blocks``) sit in ``kv_holding_waiting``, which the pass drains
  before ``waiting``. The pass stops when the budget is spent, when ``max_num_seqs``
  requests run, or at the first allocation that fails (``break``).
- **Skips.** A request is *skipped* for the step — taken out of its queue and put back at
  the front, in order, when the pass ends (``skip_request``, ``prepend_requests``) — while
  its load is in flight, or when the connector defers its lookup (a chunk of its CPU hit
  is still being stored or is being loaded for another request; ``get_num_new_matched_tokens``
  → None). A skip does not stop the pass.
- **Lookup.** A waiting request (``num_computed_tokens == 0``) looks up the GPU prefix
  cache (hit G, a multiple of the block size, capped at known tokens − 1) and then the
  connector from G (``OffloadBlockHashCache.cpu_lookup``).
- **Load admission** (CPU hit E > 0, ``load_kv_async``): no tokens are scheduled. The
  whole known sequence must fit the free + evictable blocks (``full_sequence_must_fit``),
  and the blocks for G + E (new ones plus touched hit blocks) must fit them less the
  blocks every in-flight prefill still needs for its whole sequence
  (``reserved_blocks = _inflight_prefill_reserved_blocks()``; in-flight prefills: loads
  not yet promoted, and requests whose prompt is not yet fully scheduled). The blocks are
  allocated uncached, the load issued, the request goes to ``kv_holding_waiting``
  (WAITING_FOR_REMOTE_KVS). It counts as admitted now (``admit_s``, ``hit_tokens`` = G +
  E, one less when that is every known token).
- **Promotion.** Once its load has finished (``finished_recving``), the pass
  (``_update_waiting_for_remote_kv``) caches its blocks and sets its computed tokens to
  G + E (known tokens − 1 when the load covered all), then schedules it like a waiting
  request with computed tokens: a chunk of the rest, the whole sequence checked to fit;
  a failure stops the pass and it stays first in ``kv_holding_waiting``.
- **Connector step** at the end of every ``schedule`` (``build_connector_meta``): store
  offers of the scheduled requests in batch order, then of the requests finished in the
  previous step (vLLM iterates ``finished_req_ids``, a Python set whose order follows
  string hashing; here: finish order — the goldens are checked to be the same under two
  hash seeds).

Timing of transfers. The goldens' stand-in worker finishes a load in the step that issued
it (the request is promoted at the next step) and a store one step later; this scheduler
does the same on a step clock (:class:`radixkv.cost.UnitStepCost`, no host link). With a
:class:`radixkv.cost.HostLink` and a priced :class:`radixkv.cost.CostModel` a load starts
when its step starts (or when the link is free: loads share the link one after another,
in issue order) and takes ``HostLink.load_time``; it lands at the end of the first step
that ends after it completes (the worker reports transfers at the end of a step). While
only loads are in flight the engine waits for the earliest one (``load_wait``). Stores
still complete one step after they were issued (GPU→CPU copies run on the other direction
of the link, overlapped with compute).

Not modelled (refused): ``--no-enable-chunked-prefill``, ``--watermark``, ``lpm``, and
the connector's sync loads (``sync_load_budget_bytes``, default 0: every load is async).
"""
from __future__ import annotations

from collections import deque

from radixkv.errors import ConfigError
from radixkv.replay.sched_vllm import VllmScheduler

#: states of a request in ``kv_holding_waiting``
_LOADING, _LOADED, _HOLDS = 1, 2, 3


class VllmOffloadScheduler(VllmScheduler):
    """vLLM's scheduler with the ``OffloadingConnector`` (module docstring).

    Parameters
    ----------
    trace, policy, config
        As :class:`~radixkv.replay.sched_vllm.VllmScheduler`; *policy* must have
        ``start_concurrent`` (:class:`~radixkv.policies.vllm_offload.OffloadBlockHashCache`),
        and is switched to its concurrent mode.

    Attributes
    ----------
    holding : collections.deque of int
        ``kv_holding_waiting``: rows holding KV blocks while waiting.
    host_load_s : float
        Seconds of host→GPU copies issued (sum of ``HostLink.load_time``; 0 on a step clock).

    Raises
    ------
    radixkv.errors.ConfigError
        On a knob this model does not cover (chunked prefill off, watermark, lpm).
    """

    def __init__(self, trace, policy, config):
        if not config.enable_chunked_prefill or config.watermark or config.schedule_policy != "fcfs":
            raise ConfigError("vllm-offload in --mode concurrent models vLLM's FCFS scheduler with chunked prefill "
                              "and no watermark: drop --no-enable-chunked-prefill / --watermark / lpm",
                              field="policy")
        super().__init__(trace, policy, config)
        policy.start_concurrent()
        self.holding: deque = deque()
        self._hstate: dict = {}  # row -> _LOADING / _LOADED / _HOLDS
        self._inflight: set = set()  # _inflight_prefills
        self._issued: list = []  # (row, tokens) loads issued in this step
        self._flight: list = []  # (done time, row) loads in flight (timed mode)
        self._deferred = False  # a lookup was deferred in this step
        self._link = None
        self._cost = None
        self._link_free = 0.0
        self._t = None  # (start, end) of the step being completed (timed mode)
        self.host_load_s = 0.0
        self._B = int(policy.block_size)

    # ------------------------------------------------------------------ clock
    def attach_link(self, cost, host_link) -> None:
        """Price loads on *host_link* with *cost*'s KV bytes (timed mode); None: the
        step convention of the goldens (a load lands at the end of its step)."""
        self._cost, self._link = cost, host_link

    def step_window(self, t_start: float, t_end: float) -> None:
        """The step being completed runs from *t_start* to *t_end* seconds."""
        self._t = (t_start, t_end)

    def load_wait(self, now: float):
        """Seconds the engine idles until a load lands, when nothing else can run but
        loads are in flight (issued in this step or earlier); None when none is."""
        if not self._issued and not self._flight:
            return None
        if self._link is None:
            return float(getattr(self._cost, "step_s", 1.0))
        self._time_loads(now)
        return max(min(d for d, _ in self._flight) - now, 0.0)

    def idle_gap(self, now: float, t_next: float) -> None:
        """Nothing runs or waits until *t_next*: vLLM keeps stepping while the connector
        has jobs in flight (``Scheduler.has_requests``), empty steps that make the finish
        visits and complete the stores — at most two are needed. On a step clock the gap
        holds ``t_next − now`` steps; in time, empty steps take no time."""
        k = 2
        if self._link is None:
            k = min(k, int(round((t_next - now) / float(getattr(self._cost, "step_s", 1.0)))))
        for _ in range(k):
            self.policy.connector_step([])
            self.policy.end_step()

    def _time_loads(self, t_start: float) -> None:
        """Give the loads issued in this step their completion times (FIFO on the link)."""
        for r, tok in self._issued:
            start = max(t_start, self._link_free)
            dt = self._link.load_time(self._cost, tok)
            self.host_load_s += dt
            self._link_free = start + dt
            self._flight.append((self._link_free, r))
        self._issued = []

    def _land_loads(self) -> None:
        """Loads that finished by the end of this step: ``finished_recving``."""
        if self._link is None:
            landed = [r for r, _ in self._issued]
            self._issued = []
        else:
            t0, t1 = self._t
            self._time_loads(t0)
            landed = [r for d, r in self._flight if d <= t1]
            self._flight = [(d, r) for d, r in self._flight if d > t1]
        for r in landed:
            self.policy.load_done(r)
            self._hstate[r] = _LOADED

    # ------------------------------------------------------------------ step
    def _n_waiting(self) -> int:
        return len(self.waiting) + len(self.holding)

    def has_waiting_kv(self) -> bool:
        """Whether some request waits while holding KV blocks (a load in flight or landed)."""
        return bool(self.holding)

    def schedule(self):
        """vLLM's step (running pass, then the waiting pass of the module docstring), then
        the connector's store offers."""
        self._deferred = False
        plan = super().schedule()
        items = []
        for r, c in zip(plan.req, plan.new):
            t = self.ctx[r] + c
            items.append((r, t))
            if t >= self.target[r]:
                self._inflight.discard(r)  # _update_after_schedule
        self.policy.connector_step(items)
        return plan

    def complete(self, plan) -> None:
        """Apply the step, then the worker's report: loads that landed, stores of the
        previous step completed."""
        super().complete(plan)
        for r in self.finished_now:
            self._inflight.discard(r)
        self._land_loads()
        self.policy.end_step()

    def _preempt(self, v: int, plan) -> None:
        self._inflight.discard(v)
        super()._preempt(v, plan)

    def _reserved(self) -> int:
        """``_inflight_prefill_reserved_blocks``: blocks the in-flight prefills still need
        for their whole known sequence."""
        B = self._B
        held = self.policy.held_blocks
        return sum(max(-(-self.target[r] // B) - held(r), 0) for r in self._inflight)

    def _admit_pass(self, plan, budget: int) -> int:
        """vLLM's waiting loop with a KV connector (module docstring)."""
        pol = self.policy
        B = self._B
        skip_h, skip_w = [], []
        while budget > 0:
            q = self.holding if self.holding else self.waiting
            if not q:
                break
            if len(self.running) >= self.cfg.max_num_seqs:
                plan.blocked = True
                break
            i = q[0]
            st = self._hstate.get(i)
            if st == _LOADING:
                q.popleft()
                skip_h.append(i)
                continue
            if st is not None:  # computed tokens held: promote (once) and schedule a chunk
                if st == _LOADED:
                    pol.promote(i)
                    self._hstate[i] = _HOLDS
                n_tok = self.target[i]
                c = self._chunk(n_tok - self.ctx[i], budget)
                if -(-n_tok // B) - pol.held_blocks(i) > int(pol.room_slots()):
                    plan.blocked = True
                    break
                if not pol.extend(i, max(self.ctx[i] + c - self.kv[i], 0)):
                    plan.blocked = True
                    break
                q.popleft()
                del self._hstate[i]
                self.kv[i] = max(self.kv[i], self.ctx[i] + c)
                self.running.append(i)
                if self.ctx[i] + c < n_tok:
                    self._inflight.add(i)
                plan.add(i, c, self.ctx[i], True)
                budget -= c
                continue
            seq = self._known_seq(i)
            n_tok = seq.prompt_len
            gpu = int(pol.peek_hit(seq, n_tok))
            ext = pol.cpu_lookup(i, seq, n_tok, gpu)
            if ext is None:  # the connector deferred the lookup
                self._deferred = True
                q.popleft()
                skip_w.append(i)
                continue
            if ext > 0:  # asynchronous load: blocks now, tokens after the load lands
                full, now = pol.load_admission_blocks(seq, n_tok, gpu, ext)
                room = int(pol.room_slots())
                if full > room or now > room - self._reserved():
                    plan.blocked = True
                    break
                adm = pol.admit_load(i, seq, n_tok, ext)
                q.popleft()
                self._record(i, adm, n_tok)
                self.kv[i] = gpu + ext
                self._hstate[i] = _LOADING
                self._inflight.add(i)
                self._issued.append((i, ext))
                skip_h.append(i)
                continue
            c = self._admit_first_chunk(q, i, seq, plan, budget)
            if c < 0:
                break
            if self.ctx[i] + c < n_tok:
                self._inflight.add(i)
            budget -= c
        self.holding.extendleft(reversed(skip_h))
        self.waiting.extendleft(reversed(skip_w))
        return budget

    # ------------------------------------------------------------------ fast-forward
    def can_fast_forward(self, plan) -> bool:
        """The base rule, and nothing in flight that the next steps would change: no
        request holding KV while waiting, no deferred lookup, no store issued in this or
        the previous step, and every running request's offers done."""
        if not super().can_fast_forward(plan) or self.holding or self._deferred or self._issued or self._flight:
            return False
        return self.policy.connector_quiet(self.running)

    def fast_forward(self, k: int):
        out = super().fast_forward(k)
        for r in self.finished_now:
            self._inflight.discard(r)
        for _ in range(min(k, 2)):
            self.policy.end_step()
        return out
