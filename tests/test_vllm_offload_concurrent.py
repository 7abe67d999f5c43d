"""``vllm-offload`` in the concurrent replay: against vLLM 0.33's real scheduler, connector
and CPU manager driven concurrently (tests/data/golden/vllm_offload/concurrent, written by
``tools/engines/vllm_offload_golden.py --concurrent`` with ``PYTHONHASHSEED=0``), and by
hand on the time clock."""
from __future__ import annotations

import pytest

from _vllm_offload_conc import compare, golden_files
from _conc_cases import request_trace
from radixkv.cost import CostModel, HostLink, UnitStepCost
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.vllm_offload import OffloadBlockHashCache
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.scheduler import SchedulerConfig

_FILES = golden_files()


def test_there_are_concurrent_goldens():
    assert len(_FILES) >= 6


@pytest.mark.parametrize("path", _FILES, ids=[p.stem for p in _FILES])
def test_concurrent_golden(path):
    """Per request: GPU hit, CPU hit, hit, first-admission step, first scheduled step,
    finish step, preemptions; per step: scheduled tokens, preemptions, loads issued."""
    bad_r, bad_s, n, m = compare(path)
    assert not bad_r, f"{len(bad_r)} of {n} requests mismatch, first {bad_r[:2]}"
    assert not bad_s, f"{len(bad_s)} of {m} steps mismatch, first {bad_s[:2]}"


def test_goldens_exercise_loads_deferrals_and_preemptions():
    import json

    loads = defer = pre = 0
    for p in _FILES:
        for line in open(p):
            rec = json.loads(line)
            loads += len(rec.get("l", [])) // 2
            defer += len(rec.get("d", []))
            pre += len(rec.get("p", []))
    assert loads > 300 and defer > 20 and pre > 100


A = list(range(1000, 1012))  # 12 tokens: 3 blocks of 4
B = list(range(2000, 2024))  # 24 tokens: 6 blocks


def _trace(prompts, arrivals):
    return request_trace(prompts, [[9]] * len(prompts), arrivals, output_ids=True)


def _pol(host_tokens):
    # 6 usable GPU blocks of 4 tokens; CPU chunks of one block
    return OffloadBlockHashCache(7, 4, host_tokens=host_tokens)


def test_timed_load_then_one_token_prefill():
    """By hand. A (12) runs alone and is stored to CPU; B (24 = the whole GPU pool) evicts
    A's blocks; A + 1 token then misses the GPU and hits 12 tokens on CPU: the step at its
    arrival only issues the load (nothing runs; the engine waits for it: 12 × 131,072 B
    over the link), the next step promotes it and computes 1 token after 12. Without the
    CPU tier it recomputes 13 tokens."""
    tr = _trace([A, B, A + [7]], [0.0, 10.0, 20.0])
    cost = CostModel.from_specs("Llama-3.1-8B", "H100-80GB")
    assert cost.kv_bytes_per_token == 131072
    slow = HostLink(1e8)
    res = replay_concurrent(tr, _pol(100), cost, host_link=slow)
    s = res.summary()
    load = 12 * 131072 / 1e8
    assert int(res["hit_tokens"][2]) == 12 and s["host_hit_tokens"] == 12 and s["device_hit_tokens"] == 0
    assert s["host_load_s"] == pytest.approx(load)
    assert res["ttft_s"][2] == pytest.approx(load + cost.step_time([1], [12]), rel=1e-12)
    assert res["admit_s"][2] == 20.0  # admitted (blocks allocated, load issued) on arrival
    fast = replay_concurrent(tr, _pol(100), cost, host_link=HostLink.parse("pcie5-x16"))
    assert fast["ttft_s"][2] == pytest.approx(12 * 131072 / HostLink.parse("pcie5-x16").bytes_per_s
                                              + cost.step_time([1], [12]), rel=1e-12)
    none = replay_concurrent(tr, _pol(0), cost)
    assert int(none["hit_tokens"][2]) == 0
    assert none["ttft_s"][2] == pytest.approx(cost.step_time([13], [0]), rel=1e-12)
    # a 13-token prefill costs about what a 1-token step does (weight reads): the load's
    # extra step makes even PCIe 5 slower than recomputing here
    assert none["ttft_s"][2] < fast["ttft_s"][2] < res["ttft_s"][2]


def test_step_clock_load_takes_one_step():
    """The goldens' convention: the load lands at the end of the step that issued it, so
    the request computes one step later (TTFT 2 steps instead of 1)."""
    tr = _trace([A, B, A + [7]], [0.0, 10.0, 20.0])
    res = replay_concurrent(tr, _pol(100), UnitStepCost())
    assert list(res["ttft_s"]) == [1.0, 1.0, 2.0]
    assert list(res["admit_step"])[2] == res["finish_step"][2] - 1


def test_zero_cpu_tier_concurrent_equals_vllm():
    """host_tokens=0: the concurrent replay equals ``vllm``'s, column for column."""
    from radixkv.trace.load import load_trace

    from _vllm_offload_conc import TRACE_DIRS

    tr = load_trace(TRACE_DIRS[0] / "edge300.jsonl", format="native")
    cfg = SchedulerConfig(max_num_batched_tokens=128, max_num_seqs=16)
    a = replay_concurrent(tr, OffloadBlockHashCache(40, 16, host_tokens=0), UnitStepCost(), config=cfg)
    b = replay_concurrent(tr, BlockHashCache(40, 16), UnitStepCost(), config=cfg)
    for k in b.columns:
        assert (a.columns[k] == b.columns[k]).all() or k in ("first_token_s", "tpot_s"), k
    sa, sb = a.summary(), b.summary()
    for k in sb:
        if k in ("prefill_flops", "prefill_flops_saved") or k.startswith("tpot"):
            continue
        assert sa[k] == sb[k] or (sa[k] != sa[k] and sb[k] != sb[k]), k
    assert sa["preemptions"] > 0


def test_refused_knobs():
    tr = _trace([A], [0.0])
    for cfg in (SchedulerConfig(enable_chunked_prefill=False), SchedulerConfig(watermark=0.1)):
        with pytest.raises(ConfigError, match="vllm-offload"):
            replay_concurrent(tr, _pol(100), UnitStepCost(), config=cfg)
    with pytest.raises(ConfigError, match="host link"):
        replay_concurrent(tr, _pol(100), CostModel.from_specs("Llama-3.1-8B", "H100-80GB"))


def test_replicas_refused():
    """The multi-replica concurrent replay has no clock hooks for asynchronous loads."""
    from radixkv.replay.multi_concurrent import replay_multi_concurrent

    tr = _trace([A, B], [0.0, 1.0])
    with pytest.raises(ConfigError, match="one replica"):
        replay_multi_concurrent(tr, [_pol(100), _pol(100)], UnitStepCost(), "round-robin")
