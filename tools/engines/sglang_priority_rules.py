"""Drive SGLang 0.5.23's own priority-scheduling functions on CPU and write their answers.

Not imported by radixkv. Runs in the SGLang venv (install notes: tools/engines/README.md,
docs/golden.md), reusing :mod:`sglang_replay` beside it for the server arguments and the
real radix tree:

    $SGLANG_VENV/bin/python tools/engines/sglang_priority_rules.py \\
        --out tests/data/concurrent/sglang/priority_rules.json

Cases (each is SGLang's function on hand-made requests; tests/test_sched_sglang_priority.py
replays the same inputs through :mod:`radixkv.replay.sched_sglang_priority`):

- ``order``: requests get their priority through ``Scheduler._set_or_validate_priority``
  (a request without one gets SGLang's default) and their queue entry time through
  ``ReqTimeStats.set_wait_queue_entry_time`` in a given order of queue entries (a request
  entering twice, as a retracted one does, is stamped again); the queue is then ordered
  by ``SchedulePolicy("fcfs", ..., enable_priority_scheduling=True,
  schedule_low_priority_values_first=...).calc_priority``. Both directions; also with
  ``lpm`` (priorities ignored) and with no request carrying a priority.
- ``retraction``: ``ScheduleBatch._get_decode_retraction_order`` with
  ``--retraction-policy priority`` (and ``--enable-priority-scheduling``), both
  directions, on running requests with given priorities, prompt and output lengths; the
  golden is the retraction order (first retracted first).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: (rid, priority or None, prompt token ids); queue entries in ENTRIES order
WAITING = [
    ("a", 1, list(range(0, 8))),
    ("b", 3, list(range(100, 108))),
    ("c", 2, list(range(200, 208))),
    ("d", 3, list(range(300, 308))),
    ("e", 1, list(range(400, 408))),
    ("f", -4, list(range(500, 508))),
]
#: queue entries, in time order: "a" enters again last (retracted and put back)
ENTRIES = ["a", "b", "c", "d", "e", "f", "a"]
#: (rid, priority, prompt length, outputs generated, max_new_tokens)
RUNNING = [
    ("p", 1, 10, 5, 40), ("q", 3, 30, 0, 40), ("r", 2, 20, 9, 60), ("s", 3, 30, 2, 50),
    ("t", 1, 5, 5, 20), ("u", 2, 20, 9, 60),
]


def _server(low_first: bool, retraction: str = "length"):
    """Publish server arguments with priority scheduling on (SGLang reads them globally)."""
    from sglang_replay import SGLangReplayer, parse_args

    rp = SGLangReplayer(parse_args(["--trace", "-", "--out", "-", "--capacity-tokens", "4096"]))
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    sa = ServerArgs(model_path="dummy", page_size=1, enable_priority_scheduling=True,
                    schedule_low_priority_values_first=low_first, disable_priority_preemption=True,
                    retraction_policy=retraction)
    set_global_server_args_for_scheduler(sa)
    from sglang.srt.runtime_context import get_schedule

    g = get_schedule()
    if (g.enable_priority_scheduling, g.schedule_low_priority_values_first, g.retraction_policy) != (
            True, low_first, retraction):
        raise RuntimeError("SGLang did not take the priority server arguments")
    return rp


def _order_case(low_first: bool, policy: str, with_priorities: bool):
    rp = _server(low_first)  # first: it makes sglang's import chain loadable on CPU
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.managers.scheduler import Scheduler

    reqs = {}
    for rid, prio, p in WAITING:
        sp = rp.SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
        sp.normalize(None)
        reqs[rid] = rp.Req(rid=rid, origin_input_text="", origin_input_ids=rp.array("q", p), sampling_params=sp,
                           priority=prio if with_priorities else None)
    fake = SimpleNamespace(enable_priority_scheduling=True, schedule_low_priority_values_first=low_first,
                           abort_on_priority_when_disabled=False)
    for r in reqs.values():
        if not Scheduler._set_or_validate_priority(fake, r):
            raise RuntimeError("priority refused")
    for k, rid in enumerate(ENTRIES):  # distinct, increasing entry times
        reqs[rid].time_stats.set_wait_queue_entry_time(1000.0 + k)
    pol = SchedulePolicy(policy, rp.cache, False, True, low_first)
    queue = [reqs[rid] for rid in dict.fromkeys(ENTRIES)]  # each request once, first-entry order
    pol.calc_priority(queue)
    return {"low_first": low_first, "policy": policy, "with_priorities": with_priorities,
            "order": [r.rid for r in queue], "priority_seen": {r.rid: int(r.priority) for r in queue}}


def _retraction_case(low_first: bool):
    _server(low_first, "priority")
    from array import array

    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for rid, prio, plen, gen, max_new in RUNNING:
        sp = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
        sp.normalize(None)
        r = Req(rid=rid, origin_input_text="", origin_input_ids=array("q", range(plen)), sampling_params=sp,
                priority=prio)
        r.output_ids.extend([1] * gen)
        reqs.append(r)
    keep = ScheduleBatch._get_decode_retraction_order(reqs)  # most preferred to keep first
    order = [reqs[i].rid for i in reversed(keep)]  # retract_decode pops from the end
    return {"low_first": low_first, "retraction_order": order}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import sglang

    doc = {
        "sglang": sglang.__version__,
        "waiting": [[rid, prio, p] for rid, prio, p in WAITING],
        "entries": ENTRIES,
        "running": [list(x) for x in RUNNING],
        "order": [_order_case(lf, pol, wp) for lf, pol, wp in
                  [(False, "fcfs", True), (True, "fcfs", True), (False, "fcfs", False), (True, "fcfs", False),
                   (False, "lpm", True)]],
        "retraction": [_retraction_case(False), _retraction_case(True)],
    }
    tmp = a.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, a.out)
    print(json.dumps({k: doc[k] for k in ("order", "retraction")}, sort_keys=True))


if __name__ == "__main__":
    main()
