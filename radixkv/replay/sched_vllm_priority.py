"""vLLM v1's priority scheduling for the concurrent replay (``--scheduling-policy priority``).

vLLM 0.33's ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``) with
``SchedulerConfig.policy = "priority"``: the same step as FCFS
(:mod:`radixkv.replay.sched_vllm`: budget, running first, admission only in a step without
preemption, head-of-line blocking, chunked prefill, ``long_prefill_token_threshold``,
watermark) with three rules changed. Each rule and the vLLM code it follows:

- **Waiting order.** The waiting queue is a heap (``request_queue.py ::
  PriorityRequestQueue``, built by ``create_request_queue``) ordered by
  ``Request.__lt__`` (``vllm/v1/request.py``): lower ``priority`` first, then earlier
  ``arrival_time``, then the smaller ``request_id`` **as a string** (so ``"r10"`` comes
  before ``"r2"`` when both arrive at once). Admission takes the heap's head
  (``peek_request`` / ``pop_request``) and still stops at the first request that cannot be
  admitted (``break``): a high-priority request that does not fit blocks the lower ones.
  Here the priority is the trace's ``priority`` column (0 when the trace has none, vLLM's
  default) and the arrival time the replay's arrival of the request, in seconds.
- **Victim.** When a running request cannot get KV for its chunk or decode
  (``allocate_slots`` returns None in the RUNNING loop of ``schedule``), the request
  preempted is ``max(self.running, key=(priority, arrival_time))``: the lowest priority,
  latest arrival; among equal keys the first in running order (Python's ``max``), not
  the last admitted as in FCFS. It may be a request already scheduled in this step
  (earlier in running order): its entry leaves the step and its tokens go back to the
  step's budget (``token_budget += restored``), and the loop index moves back by one when
  the victim stood before the current request (``if victim_index < req_index``).
- **After preempting itself.** When the victim is the request being scheduled, FCFS stops
  the running loop (``break``); priority goes on with the next running request
  (``continue``: "The requests after it have higher priority and may still fit").
- **Back in the queue.** A preempted request is pushed into the heap
  (``_preempt_request`` → ``PriorityRequestQueue.prepend_request`` = ``add_request``), so
  it takes its (priority, arrival) place, not the front. As in FCFS no admission follows
  in a step that preempted (``if not preempted_reqs``).

What vLLM does **not** do, and neither does this model: a waiting request of higher
priority never preempts a running one to get admitted (admission only asks
``allocate_slots`` and breaks on None); preemption happens only when a running request's
growth fails.

The compiled loop (:mod:`radixkv.replay.conc_vllm_fast`) models the FCFS scheduler
class only; this one runs on the Python reference loop of
:func:`radixkv.replay.concurrent.replay_concurrent` (and of the multi-replica replay).
Checked step by step against vLLM's real scheduler with ``policy="priority"``
(``tools/engines/vllm_scheduler_golden.py``, goldens ``*_prio*`` in
tests/data/concurrent/vllm; tests/test_concurrent_vllm_priority.py).
"""
from __future__ import annotations

import heapq

import numpy as np

from radixkv.errors import ConfigError
from radixkv.replay.sched_vllm import VllmScheduler
from radixkv.replay.scheduler import priorities


class _PriorityQueue:
    """The waiting queue as vLLM's ``PriorityRequestQueue``: a heap of request rows by rank.

    Offers what the schedulers use of a deque: ``q[0]`` (the head only), ``popleft``,
    ``append`` and ``appendleft`` (both a heap push: no front in a priority queue),
    ``len``, truth value, iteration in queue order.
    """

    __slots__ = ("_heap", "_rank")

    def __init__(self, rank):
        self._heap: list = []
        self._rank = rank

    def append(self, i: int) -> None:
        heapq.heappush(self._heap, (self._rank[i], i))

    appendleft = append

    def popleft(self) -> int:
        return heapq.heappop(self._heap)[1]

    def __getitem__(self, k: int) -> int:
        if k != 0:
            raise IndexError("a priority queue shows its head only")
        return self._heap[0][1]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self):
        return (i for _, i in sorted(self._heap))


class VllmPriorityScheduler(VllmScheduler):
    """vLLM v1 ``Scheduler.schedule`` with ``policy="priority"`` (module docstring).

    Parameters
    ----------
    trace : radixkv.trace.Trace
        Its ``priority`` column (int64 (n,), lower = served first) gives each request's
        priority; a trace without one has priority 0 everywhere.
    policy, config
        As :class:`~radixkv.replay.sched_vllm.VllmScheduler`.
    arrivals : np.ndarray of float64, shape (n,), or None
        The replay's arrival times, s (vLLM's ``arrival_time``; the second key of both
        orders). None: the trace's ``arrival_s``.

    Raises
    ------
    radixkv.errors.ConfigError
        As :class:`~radixkv.replay.sched_vllm.VllmScheduler`; when the arrivals do not
        match the trace.
    """

    def __init__(self, trace, policy, config, arrivals=None):
        super().__init__(trace, policy, config)
        n = len(trace)
        pr = priorities(trace)
        arr = np.asarray(trace.arrival_s if arrivals is None else arrivals, dtype=np.float64)
        if arr.shape != (n,):
            raise ConfigError(f"{arr.size} arrival times for {n} requests", field="arrivals")
        prio, at, rid = pr.tolist(), arr.tolist(), [str(x) for x in trace.req_id]
        # PriorityRequestQueue order: Request.__lt__ = (priority, arrival_time, request_id);
        # the row breaks a tie of equal ids (vLLM: id(self), creation order)
        order = sorted(range(n), key=lambda i: (prio[i], at[i], rid[i], i))
        rank = [0] * n
        for k, i in enumerate(order):
            rank[i] = k
        self._rank = rank
        self._vkey = list(zip(prio, at))  # the victim's key: (priority, arrival_time)
        self.waiting = _PriorityQueue(rank)
        self._k = 0  # index of the running request being scheduled
        self._budget = 0  # the step's token budget left

    def _victim(self) -> int:
        """``max(self.running, key=(priority, arrival_time))``: first in running order on a tie."""
        key = self._vkey
        return max(self.running, key=key.__getitem__)

    def _before_preempt(self, v: int, plan) -> None:
        """A victim already scheduled in this step gives its tokens back to the budget; one
        standing before the request being grown in running order moves the loop index back
        (module docstring)."""
        if self.running.index(v) < self._k:
            self._k -= 1
        if v in plan.req:
            self._budget += plan.new[plan.req.index(v)]

    def run_ends_at_arrival(self) -> bool:
        """Always: an arrival of higher priority becomes the queue's head and may be
        admitted where the refused head was not, so a fast-forwarded run of decodes stops
        at the next arrival even with requests waiting."""
        return True

    def _running_pass(self, plan, budget: int) -> int:
        """The running loop with the priority victim (module docstring): a request that
        preempts itself does not end it."""
        self._budget = budget
        self._k = 0
        run = self.running
        while self._k < len(run) and self._budget > 0:
            c = self._serve_running(run[self._k], plan, self._budget)
            if c < 0:  # preempted itself: the loop goes on with the next request (index already there)
                continue
            self._budget -= c
            self._k += 1
        return self._budget
