"""SGLang 0.5.23's hybrid radix caches (``UnifiedRadixCache`` with an SWA or a Mamba
component): goldens from SGLang's own classes driven on CPU
(tools/engines/sglang_hybrid_replay.py, tests/data/golden/sglang_hybrid/), hand-worked
rules (each also replayed through the real engine when written: same numbers), the
contract kit, the registry and the summary."""
from __future__ import annotations

import json

import pytest

from _golden_traces import native_trace
from conftest import GOLDEN_LOCAL
from radixkv.errors import ConfigError
from radixkv.policies.check import check_policy
from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.policies.sglang_mamba import SGLangMambaCache
from radixkv.policies.sglang_swa import SGLangSWACache
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace

HYB = GOLDEN_LOCAL / "sglang_hybrid"
MANIFEST = [json.loads(line) for line in (HYB / "manifest.jsonl").read_text().splitlines() if line]


def _gold(name):
    return [json.loads(line) for line in (HYB / f"{name}.jsonl").read_text().splitlines() if line]


def _spec(run):
    if run["mode"] == "swa":
        return (f"sglang-swa:{run['page_size']}@window={run['sliding_window_size']}"
                f"/swa_max_total_num_tokens={run['swa_capacity_tokens']}")
    return f"sglang-mamba:{run['page_size']}@max_mamba_cache_size={run['mamba_slots']}"


def _build(run):
    return build_policy(parse_policy(_spec(run)), PoolSpec(max_total_num_tokens=run["capacity_tokens"]),
                        chunked_prefill_size=run.get("chunked_prefill_size"))


@pytest.mark.parametrize("run", MANIFEST, ids=[m["name"] for m in MANIFEST])
def test_golden_runs_match_sglang(run):
    gold = _gold(run["name"])
    assert run["impl"] == "UnifiedRadixCache"
    trace = native_trace(GOLDEN_LOCAL / "traces" / run["trace"])
    pol = _build(run)
    rec = replay_sequential(trace, pol)
    assert [g["id"] for g in gold] == list(trace.req_id)
    bad = [(g["id"], g["hit_tokens"], h) for g, h in zip(gold, rec.columns["hit_tokens"].tolist())
           if g["hit_tokens"] != h]
    assert bad == []


@pytest.mark.parametrize("run", [m for m in MANIFEST if m["trace"] == "mixed200.jsonl" or m["chunked_prefill_size"]],
                         ids=lambda m: m["name"])
def test_golden_pool_state_after_every_request(run):
    # beyond the hits: the tree's Full tokens, SWA tokens / Mamba states and the free
    # slots of each pool after every request equal SGLang's own counters
    gold = _gold(run["name"])
    trace = native_trace(GOLDEN_LOCAL / "traces" / run["trace"])
    pol = _build(run)
    t = pol.tree
    for i, g in enumerate(gold):
        pol.run_request(i, trace.kv_seq(i))
        assert t.tree_full == g["cached_after"], g["id"]
        if run["mode"] == "swa":
            assert (t.tree_swa, t.swa_free, t.full_free) == (g["swa_cached_after"], g["swa_free"], g["full_free"])
        else:
            assert (t.tree_mamba, t.mamba_free) == (g["mamba_cached_after"], g["mamba_free"])


def test_goldens_are_not_full_attention_in_disguise():
    # SGLang's own full-attention tree on the same trace and full pool (shared golden
    # sglang_mixed200_p1_c6400) hits more than its SWA and Mamba trees: the hybrid rules
    # bind in these goldens, and both evict from their second pool
    full = sum(json.loads(x)["hit_tokens"] for x in
               (GOLDEN_LOCAL / "sglang" / "sglang_mixed200_p1_c6400.jsonl").read_text().splitlines() if x)
    by = {m["name"]: m for m in MANIFEST}
    assert by["sglang_swa_mixed200_p1_c6400_w64_s2400"]["hit_tokens"] < full
    assert by["sglang_mamba_mixed200_p1_c6400_m16"]["hit_tokens"] < full
    assert all(m["evicted_swa_tokens"] > 0 for m in MANIFEST if m["mode"] == "swa")
    assert all(m["evicted_mamba"] > 0 for m in MANIFEST if m["mode"] == "mamba")
    # chunked prefill changes what is cached (SWA freed behind each chunk, Mamba states
    # at chunk ends): the chunked runs differ from their unchunked twins
    assert by["sglang_mamba_mixed200_p1_c6400_m16_chunk256"]["hit_tokens"] != \
        by["sglang_mamba_mixed200_p1_c6400_m16"]["hit_tokens"]


def _adder_chunk_ends(hit, P, C, ps):
    # SGLang's PrefillAdder, worked from schedule_policy.py: the first pass chunks when
    # the un-hit prompt rounded up to a page exceeds C and cuts C // ps * ps tokens
    # (_select_prefill_admission); each later pass takes min(rest, C) (add_chunked_req)
    if -(-(P - hit) // ps) * ps <= C:
        return [P]
    ends = [hit + C // ps * ps]
    while ends[-1] < P:
        ends.append(min(P, ends[-1] + C))
    return ends


@pytest.mark.parametrize("run", [m for m in MANIFEST if m["chunked_prefill_size"]], ids=lambda m: m["name"])
def test_golden_chunk_ends_are_prefill_adders(run):
    # the chunk ends SGLang's own PrefillAdder picked (recorded by the harness) follow the
    # rule above on every request: no SWA / memory cap bound a lone request's chunk here
    gold = _gold(run["name"])
    C, ps = run["chunked_prefill_size"], run["page_size"]
    assert run["chunk_rule"] == "PrefillAdder"
    assert [g["chunk_ends"] for g in gold] == [_adder_chunk_ends(g["hit_tokens"], g["prompt_len"], C, ps)
                                               for g in gold]
    if C % ps:
        # the run sees both rules that differ from "every end on a page": later ends off
        # the page grid, and a first pass chunked though the rest is ≤ C
        assert sum(e % ps != 0 for g in gold for e in g["chunk_ends"][:-1]) > 0
        assert sum(len(g["chunk_ends"]) == 2 and g["prompt_len"] - g["hit_tokens"] <= C for g in gold) > 0


# ---------------------------------------------------------------------- hand-worked rules
A = list(range(1, 21))


def _trace(reqs):
    return Trace.from_requests(req_id=[f"r{i}" for i in range(len(reqs))], arrival_s=[0.0] * len(reqs),
                               prompt_len=[len(p) for p, _ in reqs], output_len=[len(o) for _, o in reqs],
                               prompt_ids=[p for p, _ in reqs], output_ids=[o for _, o in reqs], name="hand")


def _hits(pol, reqs):
    return replay_sequential(_trace(reqs), pol).columns["hit_tokens"].tolist()


def test_swa_tombstones_and_window_hit_rule_by_hand():
    # window 4, page 1, roomy pools.
    # r0: prompt A (20), 3 outputs. Its prefill checkpoint frees its own SWA below
    #   19 − 4 = 15 (free_swa_out_of_window_slots) and inserts [0,15) as a tombstone, the
    #   live [15,20) split into [15,16) + one window [16,20)
    #   (_maybe_split_leaf_for_swa_lock); at finish [20,22) is added, live.
    # r1: A + (100, 101, 7): walking 22 tokens, [0,15) is a tombstone, [15,16) has 1 < 4
    #   live tokens after it, [16,20) 5 ≥ 4 → valid, [20,22) valid → hit 22.
    # r2: A[:12] + 9: the match ends inside the tombstone [0,15) → hit 0 (a full-attention
    #   tree holds 12); r2 recomputes and its insert stops at the Full hit 12
    #   (swa_branching_seqlen), reviving [0,12) with its own SWA KV.
    # r3: the same prompt again → hit 12.
    pol = SGLangSWACache(1000, 1, 4, swa_max_total_num_tokens=1000)
    hits = _hits(pol, [(A, [100, 101, 102]), (A + [100, 101, 7], [1]), (A[:12] + [9], [1]), (A[:12] + [9], [1])])
    assert hits == [0, 22, 0, 12]
    gm = pol.group_metrics()
    assert gm["hit_tokens"] == 34 and gm["full_attention_hit_tokens"] == 34 + 12
    assert gm["groups"][1]["cached_tokens"] == 21  # SWA tokens the tree holds: [0,12) + [15,22) + r3's node


def test_swa_only_eviction_by_hand():
    # window 4, SWA pool 30 tokens (Full roomy). r0 (A, 1 output) inserts [0,16) + [16,20),
    # both live (a finished request frees nothing first): 20 SWA slots. r1 (20 new tokens)
    # is 10 SWA slots short: the SWA walk takes the least recent unlocked SWA node, the
    # inner [0,16), and tombstones it (16 ≥ 10; its Full KV stays).
    # r2: A + 5 → the last window [16,20) is live → hit 20 despite the tombstone.
    # r3: A[:10] + 77 → ends inside the tombstone → hit 0.
    pol = SGLangSWACache(1000, 1, 4, swa_max_total_num_tokens=30)
    hits = _hits(pol, [(A, [1]), (list(range(201, 221)), [1]), (A + [5], [1]), (A[:10] + [77], [1])])
    assert hits == [0, 0, 20, 0]
    assert pol.tree.evicted_full == 0 and pol.tree.evicted_swa == 32


def test_mamba_hit_stops_at_last_state_by_hand():
    # 10 Mamba slots. r0 (A[:10], 1 output) finishes with its state on node [0,10).
    # r1: A[:10] + (50, 51) → the state at 10 → hit 10; it leaves a state at 12.
    # r2: exact repeat of r0 → the lookup stops at P − 1 = 9, inside [0,10): the split
    #   upper half has no state → hit 0 (a full-attention tree: 9) — sglang#21158's class.
    # r3: A[:10] + (50, 51, 52) → state at 12 → hit 12.
    pol = SGLangMambaCache(1000, 1, 10)
    hits = _hits(pol, [(A[:10], [1]), (A[:10] + [50, 51], [1]), (A[:10], [1]), (A[:10] + [50, 51, 52], [1])])
    assert hits == [0, 10, 0, 12]
    assert pol.group_metrics()["full_attention_hit_tokens"] == 10 + 9 + 12


def test_mamba_pool_eviction_by_hand():
    # 2 Mamba slots, roomy Full pool: X, Y, Z of 10 tokens, one output each.
    # r2 (Z) needs a slot: the Mamba LRU's oldest state is X's, on a leaf → the leaf goes
    #   whole (10 Full tokens too). r3 (Y + 1) hits Y's state (10) and copies it: no slot
    #   is free, so with Y locked the walk takes Z (a leaf, 10 Full tokens).
    #   r4 (Z + 1) → 0.
    X, Y, Z = list(range(301, 311)), list(range(401, 411)), list(range(501, 511))
    pol = SGLangMambaCache(1000, 1, 2)
    hits = _hits(pol, [(X, [1]), (Y, [1]), (Z, [1]), (Y + [1], [1]), (Z + [1], [1])])
    assert hits == [0, 0, 0, 10, 0]
    assert pol.tree.evicted_full == 20 and pol.tree.evicted_mamba == 3


def test_chunk_ends_off_the_page_grid_by_hand():
    # page 4, chunk 6 (not a multiple of 4), roomy pools, window 4.
    # r0: 21 tokens, nothing cached: ceil4(21) = 24 > 6, so the first pass cuts 6 // 4 * 4
    #   = 4 (end 4); later passes take min(rest, 6): ends 10, 16, 21 (off the grid).
    # r1: 6 new tokens: 6 ≤ 6 but ceil4(6) = 8 > 6 → chunked too: 4, then 2.
    # r2: r0's prompt + 3 → hit 20 (P − 1 = 23, pages), 4 left → one pass.
    # SGLang 0.5.23's PrefillAdder (sglang_hybrid_replay.py, same pools) records the same
    # chunk_ends [4, 10, 16, 21], [4, 6], [24] and hits 0, 0, 20.
    pol = SGLangSWACache(1000, 4, 4, swa_max_total_num_tokens=1000, chunked_prefill_size=6)
    ends, prefill = [], pol._prefill

    def spy(r, n):
        prefill(r, n)
        ends.append(r.committed)

    pol._prefill = spy
    P0 = list(range(1, 22))
    hits = _hits(pol, [(P0, [900]), (list(range(101, 107)), [901]), (P0 + [50, 51, 52], [902])])
    assert hits == [0, 0, 20]
    assert ends == [4, 10, 16, 21, 4, 6, 24]
    with pytest.raises(ConfigError):
        SGLangSWACache(1000, 16, 4, chunked_prefill_size=8)  # first chunk 8 // 16 * 16 = 0


def test_chunked_swa_fit_uses_sglangs_admission_estimate_by_hand():
    # page 16, window 48, chunk 100: a 239-token prompt with 40 outputs (edge300's e4).
    # SWAPrefillBudget.check_prefill → estimate_swa_kv_tokens on empty pools: extend
    # ceil16(239) = 240, allocated min(240, 100) = 100, tail 100 − 48 = 52, plus
    # min(240 + 40, 48) = 48, plus a page 16 → 116; admitted iff 116 < the SWA pool.
    # SWA pool 256: fits (SGLang ran it: golden ..._s256_chunk100, e4 hits 48).
    # SWA pool 112: 116 + 1 − 112 = 5 over (SGLang would cap its chunks: not modelled).
    seq = _trace([(list(range(1, 240)), list(range(40)))]).kv_seq(0)
    assert SGLangSWACache(800, 16, 48, swa_max_total_num_tokens=256, chunked_prefill_size=100).fits_alone(seq) == 0
    assert SGLangSWACache(800, 16, 48, swa_max_total_num_tokens=112, chunked_prefill_size=100).fits_alone(seq) == 5
    # unchunked the SWA pool must hold the KV extent + a page: 278 → 288 + 16 − 256
    assert SGLangSWACache(800, 16, 48, swa_max_total_num_tokens=256).fits_alone(seq) == 48


# ---------------------------------------------------------------------- contract, registry
@pytest.mark.parametrize("page", [1, 4])
def test_swa_contract_kit(page):
    skipped = check_policy(lambda cap: SGLangSWACache(max(cap, 64), page, 8, swa_full_tokens_ratio=0.8))
    assert set(skipped) == {"chunked_admit"}


def test_mamba_contract_kit():
    # expect_hits=False: an exact repeat stops at P − 1, inside the node whose state is at
    # P, and hits 0 (test_mamba_hit_stops_at_last_state_by_hand) — SGLang's rule
    skipped = check_policy(lambda cap: SGLangMambaCache(max(cap, 64), 1, 3), expect_hits=False)
    assert set(skipped) == {"repeats_hit", "chunked_admit"}


def test_specs_and_pool_terms():
    s = parse_policy("sglang-swa:16@window=1024")
    pol = build_policy(s, PoolSpec(max_total_num_tokens=10_000))
    # swa_full_tokens_ratio 0.8 (SGLang's fallback), page-aligned down (pool_configurator)
    assert (pol.tree.full_cap, pol.tree.swa_cap, pol.tree.W) == (10_000 // 16 * 16, 8000 // 16 * 16, 1024)
    assert s.label == "sglang-swa:16@window=1024/swa_full_tokens_ratio=0.8"
    pol = build_policy(parse_policy("sglang-swa:1@window=64/swa_full_tokens_ratio=0.5"), PoolSpec(capacity_tokens=999))
    assert (pol.tree.full_cap, pol.tree.swa_cap) == (999, 499)
    pol = build_policy(parse_policy("sglang-mamba@max_mamba_cache_size=7"), PoolSpec(max_total_num_tokens=500))
    assert (pol.tree.full_cap, pol.tree.mamba_cap, pol.page_size) == (500, 7, 1)
    for bad in ("sglang-swa@window=0", "sglang-swa@win=4", "sglang-swa@window=4/swa_full_tokens_ratio=2",
                "sglang-mamba@max_mamba_cache_size=0"):
        with pytest.raises(ConfigError):
            parse_policy(bad)
    with pytest.raises(ConfigError):
        SGLangMambaCache(100, 16, 4)  # no_buffer needs page 1


def test_summary_reports_pools(tmp_path):
    from radixkv.metrics import summarize

    pol = SGLangSWACache(1000, 1, 4, swa_max_total_num_tokens=30)
    rec = replay_sequential(_trace([(A, [1]), (A + [5], [1])]), pol)
    g = summarize(rec)["kv_cache_groups"]
    assert g["hit_tokens"] == 20 and [x["kind"] for x in g["groups"]] == ["full_attention", "sliding_attention"]
    assert g["groups"][1]["capacity_tokens"] == 30
