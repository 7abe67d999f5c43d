"""RadixCache against real SGLang 0.5.23: every golden run, request for request.

The golden files ($RADIXKV_SHARED/golden/sglang, docs/golden.md; copies of the token-level ones in
tests/data/golden/sglang) hold the hits SGLang's own ``UnifiedRadixCache`` produced with
each request run alone (docs/golden.md). Only ``hit_tokens`` is golden; the harness's
diagnostics ``evicted_tokens`` (evicted while the request ran) and ``cached_after``
(tokens held by the tree afterwards) are checked as well, since they pin the eviction
order and the node boundaries. The tight pools (c640, c1904) exercise eviction order.
"""
from __future__ import annotations

import json

import pytest

from _golden_traces import golden_trace
from conftest import GOLDEN_LOCAL, shared_path
from radixkv.policies.radix import RadixCache

#: every SGLang golden run (the local manifest is a copy of the shared one)
_RUNS = [json.loads(line) for line in open(GOLDEN_LOCAL / "sglang" / "manifest.jsonl")]


def _replay_and_compare(run: dict, trace, gold: list[dict]) -> None:
    assert len(gold) == len(trace)
    cache = RadixCache(run["capacity_tokens"], run["page_size"])
    mismatches = []
    for i in range(len(trace)):
        g = gold[i]
        assert g["id"] == trace.req_id[i]
        assert g["prompt_len"] == trace.prompt_len[i]
        before = cache.evicted_tokens_total
        adm = cache.run_request(i, trace.kv_seq(i))
        assert adm is not None, f"{g['id']}: refused"
        got = (adm.hit_tokens, cache.evicted_tokens_total - before, cache.stats().cached_tokens)
        want = (g["hit_tokens"], g["evicted_tokens"], g["cached_after"])
        if got != want:
            mismatches.append((g["id"], got, want))
    cache.check_invariants()
    assert not mismatches, f"{len(mismatches)} of {len(trace)} differ, first: {mismatches[:3]}"


@pytest.mark.parametrize("run", _RUNS, ids=[r["name"] for r in _RUNS])
def test_golden(run):
    local = GOLDEN_LOCAL / "sglang" / f"{run['name']}.jsonl"
    path = local if local.exists() else shared_path("golden", "sglang", f"{run['name']}.jsonl")
    trace = golden_trace(run["trace"], GOLDEN_LOCAL, shared_path)
    gold = [json.loads(line) for line in open(path)]
    _replay_and_compare(run, trace, gold)


def test_local_manifest_matches_shared():
    """The runs tested are exactly the shared manifest's SGLang runs."""
    manifest = shared_path("golden", "sglang", "manifest.jsonl")
    assert [json.loads(line) for line in open(manifest)] == _RUNS


def test_reference_model_reproduces_local_golden():
    """The brute-force reference model (tests/reference_sglang.py) also matches the engine,
    so the property tests compare RadixCache with a model the engine vouches for."""
    from _golden_traces import native_trace
    from reference_sglang import RefRadixCache, expand

    for run in _RUNS:
        if run["name"] not in ("sglang_mixed200_p16_c1904", "sglang_edge300_p1_c640"):
            continue
        trace = native_trace(GOLDEN_LOCAL / "traces" / run["trace"])
        gold = [json.loads(line) for line in open(GOLDEN_LOCAL / "sglang" / f"{run['name']}.jsonl")]
        ref = RefRadixCache(run["capacity_tokens"], run["page_size"])
        for i in range(len(trace)):
            s = trace.kv_seq(i)
            kv = expand(s)
            hit, _, ev = ref.run(kv[: s.prompt_len], kv)
            assert (hit, ev, ref.tree_tokens()) == (gold[i]["hit_tokens"], gold[i]["evicted_tokens"], gold[i]["cached_after"]), gold[i]["id"]
