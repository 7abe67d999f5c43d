"""SGLang's priority scheduling for the concurrent replay (``--enable-priority-scheduling``).

SGLang 0.5.23's scheduler (``python/sglang/srt/managers/``) with
``--enable-priority-scheduling``: the step of :mod:`radixkv.replay.sched_sglang`
(prefill first, ``PrefillAdder`` budget, retraction, ``new_token_ratio``) with the waiting
queue ordered by priority. Each rule and the SGLang code it follows:

- **Direction** (``schedule_policy.py :: SchedulePolicy.__init__``: ``priority_sign = 1 if
  schedule_low_priority_values_first else -1``): by default **higher** priority values
  are served first; ``--schedule-low-priority-values-first`` turns it round (vLLM's
  direction).
- **Waiting order** (``SchedulePolicy.calc_priority`` →
  ``_sort_by_priority_and_fcfs``): before each admission pass, under the ``fcfs``
  schedule policy only, the queue is sorted by ``(priority × sign,
  wait_queue_entry_time)``. The entry time is stamped each time the request enters the
  queue (``scheduler.py :: Scheduler._add_request_to_queue`` →
  ``ReqTimeStats.set_wait_queue_entry_time``, which overwrites it): on arrival, and again
  when a retracted request is put back, so a retracted request queues behind the
  requests of its priority already waiting. Here the entry is a counter of queue
  entries (SGLang's ``perf_counter`` stamps are distinct and increase in the same order).
  Admission still stops at the first refusal (head-of-line blocking).
- **lpm ignores priorities**: ``calc_priority`` sorts by priority only when the configured
  policy is FCFS; with ``--schedule-policy lpm`` the order is :mod:`sched_sglang`'s.
- **Requests without a priority** (``Scheduler._set_or_validate_priority``): SGLang gives
  them the least preferred value (``-sys.maxsize - 1``, or ``sys.maxsize`` when low
  values go first); a trace without a ``priority`` column gives every request the same
  value, so the order is the queue-entry order (FCFS). The native trace reader writes 0
  for a request without the field in a trace that has the column.
- **Retraction** (``schedule_batch.py :: ScheduleBatch._get_decode_retraction_order``):
  ``--retraction-policy length`` (default) keeps :mod:`sched_sglang`'s order;
  ``priority`` retracts the least preferred priority first, then as ``length`` (fewest
  outputs, longest prompt, latest in the batch).

Not modelled, refused by :func:`radixkv.replay.scheduler.rule_of`: SGLang's priority
**preemption** (``schedule_policy.py :: PrefillAdder.preempt_to_schedule``, on by default
with ``--priority-scheduling-preemption-threshold`` 10: when the running batch is full, a
waiting request whose priority beats running ones by more than the threshold releases
them), so a replay needs ``--disable-priority-preemption``. Also not modelled: aborts on
a full queue (``--max-queued-requests``), ``--default-priority-value``.

Runs on the Python loop (the compiled SGLang loop, :mod:`radixkv.replay.conc_sglang`,
models FCFS and lpm). SGLang's scheduler loop needs a model worker and has no step
golden; its ordering (``_set_or_validate_priority``, entry stamps, ``calc_priority``, both
directions, lpm, no priorities) and retraction (``_get_decode_retraction_order``, both
directions) functions were run on CPU by tools/engines/sglang_priority_rules.py
(tests/data/concurrent/sglang/priority_rules.json), and radixkv gives the same orders;
the step-level consequences have hand-worked tests (tests/test_sched_sglang_priority.py).
"""
from __future__ import annotations

from collections import deque

from radixkv.replay.sched_sglang import SglangScheduler
from radixkv.replay.scheduler import priorities


class SglangPriorityScheduler(SglangScheduler):
    """SGLang's scheduler with ``--enable-priority-scheduling`` (module docstring).

    Parameters
    ----------
    trace : radixkv.trace.Trace
        Its ``priority`` column (int64 (n,)) gives each request's priority; none: all equal.
    policy, config
        As :class:`~radixkv.replay.sched_sglang.SglangScheduler`;
        ``config.schedule_low_priority_values_first`` and ``config.retraction_policy``
        are read here.

    Raises
    ------
    radixkv.errors.ConfigError
        As :class:`~radixkv.replay.sched_sglang.SglangScheduler`.
    """

    def __init__(self, trace, policy, config):
        super().__init__(trace, policy, config)
        n = len(trace)
        pr = priorities(trace)
        sign = 1 if config.schedule_low_priority_values_first else -1
        self._pkey = (pr * sign).tolist()  # smaller = served first
        self._entry = [0] * n  # wait_queue_entry_time, as a counter of queue entries
        self._entries = 0
        self._by_priority_retraction = config.retraction_policy == "priority"

    def _stamp(self, i: int) -> None:
        self._entries += 1
        self._entry[i] = self._entries

    def enqueue(self, i: int) -> None:
        """Arrival: ``_add_request_to_queue`` appends and stamps the entry time."""
        self._stamp(i)
        self.waiting.append(i)

    def _requeue(self, v: int) -> None:
        """A retracted request: appended, its entry time stamped again."""
        self._stamp(v)
        self.waiting.append(v)

    def _order_waiting(self) -> None:
        """``calc_priority``: under ``fcfs``, sort by (priority × sign, entry time); under
        ``lpm``, :class:`~radixkv.replay.sched_sglang.SglangScheduler`'s order."""
        if self.cfg.schedule_policy != "fcfs":
            super()._order_waiting()
            return
        if len(self.waiting) > 1:
            pk, ent = self._pkey, self._entry
            self.waiting = deque(sorted(self.waiting, key=lambda i: (pk[i], ent[i])))

    def _victim(self) -> int:
        """``_get_decode_retraction_order``: with ``retraction_policy == "priority"`` the
        least preferred priority first, then the ``length`` order."""
        if not self._by_priority_retraction:
            return super()._victim()
        run = self.running
        # retraction_key = (priority × (−sign), outputs, −prompt), sorted in reverse and
        # popped from the end: the smallest key goes first, the latest in the batch on a tie
        k = min(range(len(run)), key=lambda j: (-self._pkey[run[j]], self.gen[run[j]], -self.P[run[j]], -j))
        return run[k]

    def run_ends_at_arrival(self) -> bool:
        """Always: an arrival of a preferred priority becomes the head at the next pass and
        may pass the budget check where the refused head did not."""
        return True
