"""RadixCache with chunked prefill against real SGLang 0.5.23, request for request.

The goldens (tests/data/golden/sglang_chunked, made by
tools/engines/gen_sglang_chunked_goldens.py) hold what SGLang's own ``UnifiedRadixCache``
and allocators did with ``--chunked-prefill-size`` on, each request run alone, with
SGLang's ``PrefillAdder`` admitting the request and choosing every chunk end
(``add_one_req``, then ``add_chunked_req`` per pass) and every middle chunk published by
``checkpoint_kv_cache`` (``stash_chunked_request``). Pools are tight, so chunk ends (node
boundaries) decide what partial eviction keeps. Runs on Mooncake / WEKA slices read
``$RADIXKV_SHARED`` and skip without it. ``hit_tokens`` is golden; the harness's
``evicted_tokens`` and ``cached_after`` are checked too (they pin the eviction order and
the node boundaries).
"""
from __future__ import annotations

import json

import pytest

from _golden_traces import golden_trace
from conftest import GOLDEN_LOCAL, shared_path
from radixkv.policies.radix import RadixCache

_DIR = GOLDEN_LOCAL / "sglang_chunked"
_RUNS = [json.loads(line) for line in open(_DIR / "manifest.jsonl")]


def _gold(run: dict) -> list[dict]:
    return [json.loads(line) for line in open(_DIR / f"{run['name']}.jsonl")]


@pytest.mark.parametrize("run", _RUNS, ids=[r["name"] for r in _RUNS])
def test_chunked_golden(run):
    trace = golden_trace(run["trace"], GOLDEN_LOCAL, shared_path)
    gold = _gold(run)
    assert len(gold) == len(trace) == run["requests"]
    cache = RadixCache(run["capacity_tokens"], run["page_size"],
                       chunked_prefill_size=run["chunked_prefill_size"])
    mismatches = []
    for i in range(len(trace)):
        g = gold[i]
        assert (g["id"], g["prompt_len"]) == (trace.req_id[i], trace.prompt_len[i])
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
def test_engine_chunk_ends_follow_the_documented_rule(run):
    """The chunk ends SGLang's PrefillAdder chose (recorded by the harness) are the rule
    radixkv's docstring states: with hit h, page p, chunk C, the request is cut when
    its un-hit prompt, rounded up to a page, exceeds C; the first chunk then ends at
    h + ⌊C/p⌋·p, every later one C tokens further (not page-rounded), the last at P."""
    p, C = run["page_size"], run["chunked_prefill_size"]
    for g in _gold(run):
        P, h = g["prompt_len"], g["hit_tokens"]
        ends = []
        if -(-(P - h) // p) * p > C:
            e = h + C // p * p
            while e < P:
                ends.append(e)
                e += C
        ends.append(P)
        assert g["chunk_ends"] == ends, g["id"]


def test_goldens_exercise_chunking_and_eviction():
    """Every run chunks some prompts and evicts; runs at pages 4, 16 and 64 use chunk
    sizes that are not a multiple of the page (the continuing chunks leave the page grid),
    and on three of them that changes hits (docs/golden.md "SGLang chunked prefill")."""
    for run in _RUNS:
        assert run["chunked_requests"] > 0 and run["evicted_tokens"] > 0, run["name"]
    off_grid = [r for r in _RUNS if r["chunked_prefill_size"] % r["page_size"]]
    assert {r["page_size"] for r in off_grid} == {4, 16, 64}


def test_chunking_changes_what_the_engine_hits():
    """The engine's own numbers: on the same trace and pool, chunked prefill changes the
    hit tokens (node boundaries at chunk ends change what whole-node eviction keeps):
    mixed200, page 1, 1,904 tokens: 41,016 hit tokens unchunked (tests/data/golden/sglang)
    vs 43,688 with 64-token chunks."""
    plain = [json.loads(line) for line in open(GOLDEN_LOCAL / "sglang" / "sglang_mixed200_p1_c1904.jsonl")]
    chunked = _gold(next(r for r in _RUNS if r["name"] == "sglang_mixed200_p1_c1904_chunk64"))
    assert sum(g["hit_tokens"] for g in plain) == 41016
    assert sum(g["hit_tokens"] for g in chunked) == 43688


def test_local_manifest_totals_match_files():
    for run in _RUNS:
        gold = _gold(run)
        assert sum(g["hit_tokens"] for g in gold) == run["hit_tokens"], run["name"]
        assert sum(g["evicted_tokens"] for g in gold) == run["evicted_tokens"], run["name"]


def test_reference_model_reproduces_an_off_grid_chunked_golden():
    """The brute-force reference (tests/reference_sglang.py, which the property tests
    compare RadixCache with) also matches the engine with chunks off the page grid."""
    from _golden_traces import native_trace
    from reference_sglang import RefRadixCache, expand

    run = next(r for r in _RUNS if r["name"] == "sglang_edge300_p16_c448_chunk40")
    trace = native_trace(GOLDEN_LOCAL / "traces" / run["trace"])
    ref = RefRadixCache(run["capacity_tokens"], run["page_size"], chunked_prefill_size=run["chunked_prefill_size"])
    for i, g in enumerate(_gold(run)):
        s = trace.kv_seq(i)
        kv = expand(s)
        hit, _, ev = ref.run(kv[: s.prompt_len], kv)
        assert (hit, ev, ref.tree_tokens()) == (g["hit_tokens"], g["evicted_tokens"], g["cached_after"]), g["id"]
