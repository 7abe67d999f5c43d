"""The tutorial policy examples/hits_times_length.py: its eviction order on a hand-worked
case, and its script on a golden trace (LRU and LFU rates checked against real SGLang)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from conftest import GOLDEN_LOCAL
from radixkv.policies.radix import RadixCache
from radixkv.policies.radix_priority import PriorityRadixCache, eviction_policy
from radixkv.trace.types import Trace

_EX = Path(__file__).resolve().parent.parent / "examples" / "hits_times_length.py"


def _example():
    spec = importlib.util.spec_from_file_location("hits_times_length", _EX)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tutorial_is_short():
    assert len(_EX.read_text().splitlines()) < 80


def test_hand_worked_eviction_order():
    """Pool of 40 tokens, page 1, each request caches its prompt (one output token).

    X = 20 tokens, Y = 10 tokens, then Y+1 (hits Y: Y's hit count 2, new 1-token leaf Z),
    then W = 10 new tokens with 9 free: one leaf must go. Leaves: X (1 hit × 20 tokens,
    oldest) and Z (1 hit × 1 token, newest). hits × length evicts Z (1 < 20), so X + 1
    then hits X's 20 tokens; LRU and LFU (tie on hits, older first) evict X: 0 hits.
    """
    X, Y, W = list(range(100, 120)), list(range(200, 210)), list(range(400, 410))
    prompts = [X, Y, Y + [300], W, X + [500]]
    n = len(prompts)
    trace = Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n,
                                prompt_len=[len(p) for p in prompts], output_len=[1] * n,
                                prompt_ids=prompts)
    ex = _example()

    def hits(cache):
        return [cache.run_request(i, trace.kv_seq(i)).hit_tokens for i in range(n)]

    assert hits(ex.HitsTimesLengthCache(40, 1)) == [0, 0, 10, 0, 20]
    assert hits(RadixCache(40, 1)) == [0, 0, 10, 0, 0]
    assert hits(PriorityRadixCache(40, 1, eviction_policy=eviction_policy("lfu"))) == [0, 0, 10, 0, 0]


def test_script_on_golden_trace(capsys):
    """The script's LRU and LFU rates are the real engine's (goldens of edge300 at 640)."""
    ex = _example()
    trace_path = GOLDEN_LOCAL / "traces" / "edge300.jsonl"
    rates = ex.main([str(trace_path), "--capacity-tokens", "640"])
    out = capsys.readouterr().out
    assert "hits x length" in out
    total = sum(len(json.loads(line)["tokens"]) for line in open(trace_path))
    gold = {pol: sum(json.loads(line)["hit_tokens"] for line in
                     open(GOLDEN_LOCAL / "sglang_evict" / f"sglang_{pol}_edge300_p1_c640.jsonl"))
            for pol in ("lru", "lfu")}
    assert rates["sglang:1 (LRU)"] == gold["lru"] / total
    assert rates["sglang:1@lfu"] == gold["lfu"] / total
    assert 0 < rates["hits x length"] <= 1


def test_priority_functions_from_files_loaded_by_path_are_not_disk_cached():
    """Numba cannot reload a cached function whose module is not importable by name (a
    second process failed with "No module named '<dynamic>'"): such functions compile
    afresh; the built-in priorities, importable from radixkv, stay disk-cached."""
    from radixkv.policies import radix_priority as rp
    ex = _example()
    assert not rp._importable(ex.hits_times_length.py_func)
    assert rp._importable(rp.eviction_policy("lfu").function.py_func)
