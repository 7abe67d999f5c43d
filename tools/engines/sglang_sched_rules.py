"""Drive SGLang 0.5.23's own scheduling functions on CPU and write their answers as goldens.

Not imported by radixkv. Runs in the SGLang venv (install notes: tools/engines/README.md,
docs/golden.md), reusing :mod:`sglang_replay` beside it for the real radix tree and pools:

    $SGLANG_VENV/bin/python tools/engines/sglang_sched_rules.py --out tests/data/concurrent/sglang/rules.json

Cases (each is SGLang's function on hand-made requests; the tests replay the same inputs
through radixkv's :mod:`radixkv.replay.sched_sglang`):

- ``lpm``: a history of requests is run through the real ``UnifiedRadixCache`` (page 1),
  then a waiting queue of ``Req`` objects is ordered by ``SchedulePolicy("lpm",
  ...).calc_priority`` (prefix matching, the in-batch prefix check against the
  simulated waiting-queue tree, ``_sort_by_longest_prefix``); the golden is the order.
- ``retraction``: ``ScheduleBatch._get_decode_retraction_order`` on running requests
  with given prompt and output lengths (the golden is the retraction order, first
  retracted first) and ``NewTokenRatioTracker.estimate_new_token_ratio_after_retract``
  over the requests left after each retraction.
- ``ratio``: ``NewTokenRatioTracker.from_config()`` (init, min, decay per step).
- ``disabled``: ``--disable-radix-cache`` (``UnifiedRadixCache`` built with
  ``CacheInitParams(disable=True)``, as ``registry.py :: default_radix_cache_factory``
  does): a ``PrefillAdder`` over a 70-token pool (page 1, ``rem_chunk_tokens`` 64,
  ``new_token_ratio`` 0.7, nothing running) is offered :data:`DISABLED_QUEUE` in order
  (requests with ``ignore_eos`` False: radixkv's convention, the ``new_token_ratio``
  estimate); the golden is each ``add_one_req`` result, the admitted requests and the
  remaining total. The same queue is offered again with the first request's KV allocated
  before the second is checked (the rule radixkv applied before: KV taken as the batch
  forms), and ``SchedulePolicy("lpm", disabled tree).policy`` (FCFS).

SGLang's scheduler loop itself (``Scheduler.event_loop_normal`` with a model runner) is
not driven: it needs a model worker, so the step-level rules are covered by the
hand-worked tests of tests/test_sched_sglang.py instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: the cases (token ids); the tests read them back from the golden file
HISTORY = [list(range(0, 60)), list(range(100, 130)) + list(range(500, 520)), list(range(200, 236))]
WAITING = [
    ("w0", list(range(300, 340))),                      # nothing cached, 40 tokens
    ("w1", list(range(0, 50)) + [7] * 5),               # 49 cached (history 0)
    ("w2", list(range(300, 340)) + [9, 9]),             # shares ≥ 32 with w0: deprioritised
    ("w3", list(range(100, 130)) + [1, 2, 3]),          # 30 cached, ≤ 32: checked, new → kept
    ("w4", list(range(100, 130)) + [1, 2, 3, 4]),       # 30 cached, shares 33 with w3 → deprioritised
    ("w5", list(range(200, 236)) + [5]),                # 36 cached (> 32: not checked)
    ("w6", list(range(600, 620))),                      # 20 tokens, nothing cached
]
RUNNING = [  # (rid, prompt length, outputs generated, max_new_tokens)
    ("a", 10, 5, 40), ("b", 30, 2, 40), ("c", 20, 2, 60), ("d", 30, 2, 50), ("e", 5, 9, 20),
]

#: (rid, prompt length, max_new_tokens) offered to the disabled-cache PrefillAdder
DISABLED_QUEUE = [("A", 20, 5), ("B", 20, 5), ("C", 20, 5)]
DISABLED_POOL, DISABLED_CHUNK, DISABLED_RATIO = 70, 64, 0.7


def _lpm_case():
    from sglang_replay import SGLangReplayer, parse_args

    rp = SGLangReplayer(parse_args(["--trace", "-", "--out", "-", "--capacity-tokens", "4096"]))
    for i, p in enumerate(HISTORY):
        rp.run_request(f"h{i}", p, [90000 + i, 90100 + i])
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    reqs = []
    for rid, p in WAITING:
        sp = rp.SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
        sp.normalize(None)
        reqs.append(rp.Req(rid=rid, origin_input_text="", origin_input_ids=rp.array("q", p), sampling_params=sp))
    pol = SchedulePolicy("lpm", rp.cache, False, False, True)
    queue = list(reqs)
    pol.calc_priority(queue)
    return {"history": HISTORY, "waiting": [[rid, p] for rid, p in WAITING],
            "order": [r.rid for r in queue],
            "prefix_len": {r.rid: int(r.prefix_len) for r in reqs}}


def _retraction_case():
    from sglang_replay import SGLangReplayer, parse_args

    SGLangReplayer(parse_args(["--trace", "-", "--out", "-", "--capacity-tokens", "64"]))  # server args
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.sampling.sampling_params import SamplingParams
    from array import array

    reqs = []
    for rid, plen, gen, max_new in RUNNING:
        sp = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
        sp.normalize(None)
        r = Req(rid=rid, origin_input_text="", origin_input_ids=array("q", range(plen)), sampling_params=sp)
        r.output_ids.extend([1] * gen)
        reqs.append(r)
    keep = ScheduleBatch._get_decode_retraction_order(reqs)  # most-preferred to keep first
    order, ratios = [], []
    left = list(keep)
    while len(left) > 1:
        order.append(reqs[left.pop()].rid)
        ratios.append(NewTokenRatioTracker.estimate_new_token_ratio_after_retract([reqs[i] for i in left]))
    return {"running": [list(x) for x in RUNNING], "retraction_order": order, "ratio_after": ratios}


def _disabled_case():
    from sglang_replay import SGLangReplayer, parse_args

    rp = SGLangReplayer(parse_args(["--trace", "-", "--out", "-", "--capacity-tokens", str(DISABLED_POOL)]))
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params = CacheInitParams(disable=True, req_to_token_pool=rp.req_to_token_pool,
                             token_to_kv_pool_allocator=rp.allocator, page_size=1,
                             tree_components=(ComponentType.FULL,))
    cache = UnifiedRadixCache(params)

    def offer(alloc_first):
        reqs = []
        for k, (rid, plen, max_new) in enumerate(DISABLED_QUEUE):
            sp = rp.SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=False)
            sp.normalize(None)
            r = rp.Req(rid=rid, origin_input_text="", origin_input_ids=rp.array("q", range(1000 * k, 1000 * k + plen)),
                       sampling_params=sp)
            r.init_next_round_input(cache)
            reqs.append(r)
        adder = rp.PrefillAdder(1, cache, rp.allocator, None, DISABLED_RATIO, 1 << 30, DISABLED_CHUNK)
        results, taken = [], None
        for k, r in enumerate(reqs):
            if alloc_first and k == 1:
                taken = rp.allocator.alloc(DISABLED_QUEUE[0][1])  # the first request's KV, taken early
            res = adder.add_one_req(r, has_chunked_req=False, truncation_align_size=None)
            results.append(res.name)
            if res.name != "CONTINUE":
                break
        out = {"results": results, "admitted": [r.rid for r in adder.can_run_list],
               "rem_total_tokens": float(adder.rem_total_tokens), "available": int(rp.allocator.available_size())}
        if taken is not None:
            rp.allocator.free(taken)
        return out

    return {"pool": DISABLED_POOL, "chunk": DISABLED_CHUNK, "ratio": DISABLED_RATIO,
            "queue": [list(x) for x in DISABLED_QUEUE], "evictable": int(cache.evictable_size()),
            "formed": offer(False), "allocated_while_forming": offer(True),
            "lpm_policy": SchedulePolicy("lpm", cache, False, False, True).policy.name}


def _ratio_case():
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker

    t = NewTokenRatioTracker.from_config()
    return {"init": t.init, "min": t.min, "decay": t.decay}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import sglang

    doc = {"sglang": sglang.__version__, "lpm": _lpm_case(), "retraction": _retraction_case(), "ratio": _ratio_case(),
           "disabled": _disabled_case()}
    tmp = a.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, a.out)
    print(json.dumps(doc, sort_keys=True)[:600])


if __name__ == "__main__":
    main()
