"""The per-request miss-cause breakdown (radixkv/replay/misses.py).

Hand-worked cases give each cause its expected count from the engine rules
(docs/SEMANTICS.md); a brute-force Python oracle (explicit token tuples, every earlier
request's KV extent compared position by position) checks the infinite token-level cache
on hypothesis traces; and on those traces and the goldens every cause is ≥ 0 and the causes
plus the hit sum to the prompt, request by request.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.misses import MISS_COLUMNS, token_prefix_lengths
from radixkv.replay.run import run_replay
from radixkv.trace.types import Trace
from reference_sglang import expand
from test_radix_property import token_traces, unit_traces

EXAMPLES = int(os.environ.get("RADIXKV_MISSES_EXAMPLES", 60))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _trace(prompts, outs=None):
    n = len(prompts)
    outs = outs or [[] for _ in prompts]
    return Trace.from_requests(req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n,
                               prompt_len=[len(p) for p in prompts], output_len=[len(o) for o in outs],
                               prompt_ids=prompts, output_ids=outs)


def _causes(trace, policy, capacity):
    rec, summ = run_replay(trace, parse_policy(policy), PoolSpec(capacity_tokens=capacity), miss_causes=True)
    rows = []
    for i in range(len(rec)):
        rows.append({"P": int(rec["prompt_tokens"][i]), "hit": int(rec["hit_tokens"][i]),
                     **{k[5:-7]: int(rec[k][i]) for k in MISS_COLUMNS}})
    return rows, summ


def _check_sums(rec):
    total = rec["hit_tokens"].copy()
    for k in MISS_COLUMNS:
        assert (rec[k] >= 0).all(), (k, rec[k])
        total = total + rec[k]
    assert (total == rec["prompt_tokens"]).all()


# ---------------------------------------------------------------------- hand-worked
def test_first_seen_prompt_is_all_compulsory():
    t = _trace([list(range(100, 140))])
    for pol in ("vllm:16", "sglang:1", "unit-lru"):
        rows, summ = _causes(t, pol, 256)
        assert rows[0] == {"P": 40, "hit": 0, "compulsory": 40, "capacity": 0, "alignment": 0,
                           "last_token_cap": 0, "not_cached": 0}, pol
        assert summ["miss_causes"]["share"]["compulsory"] == 1.0
        assert summ["miss_causes"]["tokens"]["in_flight"] is None  # not modelled sequentially


def test_repeat_after_eviction_is_capacity():
    # A (64 tokens), then B (64 other tokens) on a 64-token pool evicts A, then A again.
    a, b = list(range(64)), list(range(1000, 1064))
    t = _trace([a, b, a])
    rows, _ = _causes(t, "vllm:16", 64)
    # vLLM: L = 64 tokens held by an infinite cache; whole blocks: 64; the last-token cap
    # leaves (64 − 1) // 16 = 3 blocks = 48; unbounded vLLM hits 48; actual 0 (evicted).
    assert rows[2] == {"P": 64, "hit": 0, "compulsory": 0, "capacity": 48, "alignment": 0,
                       "last_token_cap": 16, "not_cached": 0}
    rows, _ = _causes(t, "sglang:1", 64)
    # SGLang page 1: the lookup covers P − 1 = 63 tokens
    assert rows[2] == {"P": 64, "hit": 0, "compulsory": 0, "capacity": 63, "alignment": 0,
                       "last_token_cap": 1, "not_cached": 0}
    # with room for both, the same request hits what the cap allows: nothing is capacity
    rows, _ = _causes(t, "vllm:16", 256)
    assert rows[2] == {"P": 64, "hit": 48, "compulsory": 0, "capacity": 0, "alignment": 0,
                       "last_token_cap": 16, "not_cached": 0}


def test_forty_token_repeat_at_block_16_is_alignment():
    # 40 = 2 blocks + 8 tokens: the partial third block is never cached (vLLM hashes full
    # blocks only; SGLang page 16 inserts whole pages) → 8 alignment tokens; the cap does
    # not bite ((40 − 1) // 16 = 2 = the full blocks held).
    p = list(range(40))
    t = _trace([p, p])
    for pol in ("vllm:16", "sglang:16"):
        rows, _ = _causes(t, pol, 512)
        assert rows[1] == {"P": 40, "hit": 32, "compulsory": 0, "capacity": 0, "alignment": 8,
                           "last_token_cap": 0, "not_cached": 0}, pol
    # page 1: no rounding; the last token is recomputed
    rows, _ = _causes(t, "sglang:1", 512)
    assert rows[1] == {"P": 40, "hit": 39, "compulsory": 0, "capacity": 0, "alignment": 0,
                       "last_token_cap": 1, "not_cached": 0}
    # a 48-token repeat (3 whole blocks): vLLM recomputes the whole last block
    q = list(range(48))
    rows, _ = _causes(_trace([q, q]), "vllm:16", 512)
    assert rows[1] == {"P": 48, "hit": 32, "compulsory": 0, "capacity": 0, "alignment": 0,
                       "last_token_cap": 16, "not_cached": 0}


def test_outputs_are_cacheable_content_and_unit_lru_does_not_cache_them():
    # turn 2 = turn 1's prompt (20) + its output (5 tokens, KV extent keeps 4) + 11 new.
    p1, o1 = list(range(20)), [900, 901, 902, 903, 904]
    p2 = p1 + o1 + list(range(500, 511))
    t = _trace([p1, p2], [o1, [1]])
    rows, _ = _causes(t, "sglang:1", 512)
    # L = 24 (prompt + 4 output tokens with KV; the 5th output token is never fed back)
    assert rows[1] == {"P": 36, "hit": 24, "compulsory": 12, "capacity": 0, "alignment": 0,
                       "last_token_cap": 0, "not_cached": 0}
    rows, _ = _causes(t, "unit-lru", 512)
    # unit-lru caches prompts only (its module docstring, rule 3): the outputs are not_cached
    assert rows[1] == {"P": 36, "hit": 20, "compulsory": 12, "capacity": 0, "alignment": 0,
                       "last_token_cap": 0, "not_cached": 4}
    rows, _ = _causes(t, "none:1", 512)  # a token pool (plain "none" has vLLM blocks of 16)
    # none: L = 24 and the cap (35) does not bite: all 24 reusable tokens are not cached
    assert rows[1]["not_cached"] == 24 and rows[1]["last_token_cap"] == 0 and rows[1]["hit"] == 0


def test_csv_and_summary(tmp_path):
    p = list(range(40))
    t = _trace([p, p, list(range(2000, 2007))])
    rec, summ = run_replay(t, parse_policy("vllm:16"), PoolSpec(capacity_tokens=512), miss_causes=True)
    out = tmp_path / "r.csv"
    rec.write_csv(out)
    lines = out.read_text().splitlines()
    head = lines[0].split(",")
    for k in MISS_COLUMNS:
        assert k in head
    row = dict(zip(head, lines[2].split(",")))
    assert row["miss_alignment_tokens"] == "8" and row["hit_tokens"] == "32"
    mc = summ["miss_causes"]
    assert mc["tokens"] == {"hit": 32, "compulsory": 40 + 7, "capacity": 0, "alignment": 8, "last_token_cap": 0,
                            "not_cached": 0, "in_flight": None, "preemption": None, "routing": None}
    assert mc["share"]["alignment"] == 8 / 87
    plain, _ = run_replay(t, parse_policy("vllm:16"), PoolSpec(capacity_tokens=512))
    assert "miss_causes" not in _ and "miss_compulsory_tokens" not in plain.columns


# ---------------------------------------------------------------------- oracle + properties
def _oracle_held(trace):
    """Brute force: longest prefix of each prompt held by any earlier KV extent."""
    seqs = [expand(trace.kv_seq(i)) for i in range(len(trace))]
    out = []
    for i, s in enumerate(seqs):
        P = int(trace.prompt_len[i])
        best = 0
        for q in seqs[:i]:
            k = 0
            while k < P and k < len(q) and q[k] == s[k]:
                k += 1
            best = max(best, k)
        out.append(best)
    return out


@SETTINGS
@given(st.one_of(token_traces(), unit_traces()))
def test_infinite_cache_matches_brute_force(trace):
    held, new = token_prefix_lengths(trace)
    assert held.tolist() == _oracle_held(trace)
    assert (new == np.array([trace.kv_len(i) for i in range(len(trace))]) - held).all()


@SETTINGS
@given(token_traces())
def test_producer_spans_match_brute_force(trace):
    """--explain's spans on token-id traces (one token a segment): token p of the last
    prompt is produced by the first earlier request whose KV extent starts with the prompt's
    first p + 1 tokens, for every p below the held prefix L; spans merge equal neighbours."""
    from radixkv.replay.misses import producer_spans

    seqs = [expand(trace.kv_seq(i)) for i in range(len(trace))]
    for i in range(len(trace)):
        sub = trace.head(i + 1)
        spans, held = producer_spans(sub)
        assert held.tolist() == _oracle_held(sub)
        want = []
        for p in range(int(held[i])):
            j = next(j for j in range(i) if len(seqs[j]) > p and seqs[j][:p + 1] == seqs[i][:p + 1])
            if want and want[-1][2] == j:
                want[-1][1] = p + 1
            else:
                want.append([p, p + 1, j])
        assert [[s["start"], s["end"], s["produced_by_index"]] for s in spans] == want


@SETTINGS
@given(st.one_of(token_traces(), unit_traces()), st.sampled_from(["vllm:1", "vllm:4", "sglang:1", "sglang:4",
                                                                   "unit-lru", "static:4@0.5", "sglang:1@lfu",
                                                                   "vllm:4@lfu"]),
       st.integers(0, 40))
def test_causes_sum_to_prompt_and_are_nonnegative(trace, policy, slack):
    from hypothesis import assume

    from radixkv.trace.consistency import first_cover_conflict

    if policy == "unit-lru" and trace.unit_tokens > 1:
        # unit-lru hits whole units by id; every reader rejects a unit id covering two
        # lengths (docs/DESIGN.md, input rules), an in-memory Trace is not checked
        assume(first_cover_conflict(trace.ids, trace.id_offsets, trace.prompt_len, trace.unit_tokens) is None)
    spec = parse_policy(policy)
    g = trace.unit_tokens if spec.size is None else spec.size
    need = max(-(-trace.kv_len(i) // g) for i in range(len(trace))) + 1
    if spec.name == "static":  # half of its pool is reserved for the cache
        need = 2 * need + 2
    rec, summ = run_replay(trace, spec, PoolSpec(capacity_tokens=(need + slack) * g), miss_causes=True)
    _check_sums(rec)
    assert (rec["miss_compulsory_tokens"] == rec["prompt_tokens"] - np.array(_oracle_held(trace))).all()
    if not policy.startswith("unit-lru"):
        # vLLM and SGLang cache every whole block/page of a KV extent: nothing is "not cached"
        assert (rec["miss_not_cached_tokens"] == 0).all()
    assert summ["miss_causes"]["nesting_violations"] == 0


@pytest.mark.parametrize("name", ["edge300", "mixed200"])
@pytest.mark.parametrize("policy", ["vllm:16", "sglang:1", "unit-lru"])
def test_goldens_sum(name, policy, data_dir):
    from _golden_traces import native_trace

    t = native_trace(data_dir / "golden" / "traces" / f"{name}.jsonl")
    for cap in (2048, 10 ** 6):
        rec, summ = run_replay(t, parse_policy(policy), PoolSpec(capacity_tokens=cap), miss_causes=True)
        _check_sums(rec)
        assert summ["miss_causes"]["nesting_violations"] == 0


# ---------------------------------------------------------------------- CLI
def test_cli_replay_compare_and_fix(tmp_path, capsys):
    import json

    from radixkv.cli import main

    p = list(range(40))
    path = tmp_path / "t.jsonl"
    rows = [p, list(range(100, 164)), p, list(range(100, 164))]
    path.write_text("".join(json.dumps({"id": f"r{i}", "tokens": r, "output_tokens": []}) + "\n"
                            for i, r in enumerate(rows)))
    csv = tmp_path / "r.csv"
    js = tmp_path / "r.json"
    assert main(["replay", str(path), "--policy", "vllm:16", "--capacity-tokens", "64", "--miss-fix", "--quiet",
                 "--per-request", str(csv), "--json", str(js), "--no-timing"]) == 0
    head, *lines = csv.read_text().splitlines()
    cols = head.split(",")
    assert cols[-5:] == list(MISS_COLUMNS)
    # r2 repeats r0 after r1 filled the 64-token pool: 32 tokens were hittable (40 → 2
    # blocks, the cap does not bite), so 32 capacity + 8 alignment tokens
    r2 = dict(zip(cols, lines[2].split(",")))
    assert (r2["hit_tokens"], r2["miss_capacity_tokens"], r2["miss_alignment_tokens"]) == ("0", "32", "8")
    fix = json.loads(js.read_text())["results"][0]["summary"]["miss_causes"]["fix"]
    # r3 repeats r1 (64 tokens, 4 blocks: 48 hittable under the cap) after r2 took 3 of the
    # 4 blocks from the free queue's head — r1's blocks were appended tail first, so its
    # first block survives: r3 hits 16, misses 32 to capacity; 32 + 32 = 64 at 64 tokens
    assert fix["capacity_curve"][0] == [64, 64]
    assert fix["capacity_tokens_to_halve"] is not None and 64 < fix["capacity_tokens_to_halve"] <= 128
    assert fix["smaller_size"] == 8
    out = capsys.readouterr().out
    assert "prompt share: capacity miss" in out
    png = tmp_path / "m.png"
    assert main(["compare", str(path), "--policies", "vllm:16,sglang:1", "--capacity-tokens", "64", "--quiet",
                 "--miss-plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the sequential replicas have no miss causes (--miss-fix works with --mode concurrent:
    # tests/test_misses_concurrent.py::test_concurrent_miss_fix_by_hand)
    assert main(["replay", str(path), "--policy", "vllm:16", "--capacity-tokens", "64", "--miss-fix",
                 "--replicas", "2", "--quiet"]) != 0
    assert "--miss-fix" in capsys.readouterr().err


def test_library_call():
    import radixkv

    p = list(range(40))
    t = _trace([p, p])
    rec = radixkv.replay(t, "sglang:16", capacity_tokens=512, miss_causes=True)
    mc = radixkv.summarize(rec)["miss_causes"]
    assert mc["tokens"]["alignment"] == 8 and mc["tokens"]["hit"] == 32 and mc["tokens"]["compulsory"] == 40
    with pytest.raises(radixkv.errors.ConfigError):
        radixkv.replay(t, radixkv.parse_policy("vllm:16").cls(32, 16), miss_causes=True)


@SETTINGS
@given(st.one_of(token_traces(), unit_traces()))
def test_trace_segments_are_kv_seqs(trace):
    from radixkv.replay.misses import trace_segments

    sid, send, off = trace_segments(trace)
    for i in range(len(trace)):
        s = trace.kv_seq(i)
        assert sid[off[i]:off[i + 1]].tolist() == s.seg_id.tolist()
        assert send[off[i]:off[i + 1]].tolist() == s.seg_end.tolist()


def test_explain_names_producer_and_evictor(capsys):
    from radixkv.replay.misses import explain

    a, b = list(range(40)), list(range(1000, 1064))
    t = _trace([a, b, a])
    ex = explain(t, parse_policy("vllm:16"), PoolSpec(capacity_tokens=64), "r2")
    assert ex["index"] == 2 and ex["hit_tokens"] == 0
    assert ex["causes"] == {"compulsory": 0, "alignment": 8, "last_token_cap": 0, "not_cached": 0, "capacity": 32}
    # all 40 tokens were first computed by r0
    assert [(s["start"], s["end"], s["produced_by"]) for s in ex["spans"]] == [(0, 40, "r0")]
    # r0 made 2 blocks (32 tokens) hittable; r1 (4 blocks on a 4-block pool) evicted them
    assert [(h["after_request"], h["hittable_before"], h["hittable_after"], h["event"]) for h in ex["history"]] == [
        ("r0", 0, 32, "inserted"), ("r1", 32, 0, "evicted")]
    # two producers: r1 branches off r0 after 20 tokens; r2 follows r1 for 10 more, then 6 new
    x = list(range(5000, 5020))
    t2 = _trace([a, a[:20] + x, a[:20] + x[:10] + [7] * 6])
    ex = explain(t2, parse_policy("sglang:1"), PoolSpec(capacity_tokens=4096), "r2")
    assert [(s["start"], s["end"], s["produced_by"]) for s in ex["spans"]] == [(0, 20, "r0"), (20, 30, "r1")]
    assert ex["hit_tokens"] == 30 and ex["causes"]["compulsory"] == 6
    with pytest.raises(Exception, match="no request 'zz'"):
        explain(t, parse_policy("vllm:16"), PoolSpec(capacity_tokens=64), "zz")


def test_cli_explain(tmp_path, capsys):
    import json

    from radixkv.cli import main

    path = tmp_path / "t.jsonl"
    rows = [list(range(40)), list(range(1000, 1064)), list(range(40))]
    path.write_text("".join(json.dumps({"id": f"r{i}", "tokens": r, "output_tokens": []}) + "\n"
                            for i, r in enumerate(rows)))
    assert main(["replay", str(path), "--policy", "vllm:16", "--capacity-tokens", "64", "--explain", "r2"]) == 0
    out = capsys.readouterr().out
    assert "first computed by r0" in out and "evicted by r1" in out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_golden_configuration_sums(engine, data_dir):
    """Every golden run's trace and pool (the engines' own configurations, shared folder), for
    its engine's policy and unit-lru: causes ≥ 0 and summing to the prompt, request by request."""
    import json

    from _golden_traces import golden_trace
    from conftest import shared_path

    rows = [json.loads(x) for x in shared_path("golden", engine, "manifest.jsonl").read_text().splitlines() if x.strip()]
    for row in rows:
        t = golden_trace(row["trace"], data_dir / "golden", shared_path)
        if engine == "vllm":
            spec, pool = parse_policy(f"vllm:{row['block_size']}"), PoolSpec(num_gpu_blocks=row["num_gpu_blocks"])
        else:
            spec, pool = parse_policy(f"sglang:{row['page_size']}"), PoolSpec(max_total_num_tokens=row["capacity_tokens"])
        for s, p in ((spec, pool), (parse_policy("unit-lru"), PoolSpec(capacity_tokens=pool.usable_tokens()))):
            try:
                rec, summ = run_replay(t, s, p, miss_causes=True)
            except Exception as e:  # unit-lru on a pool smaller than one unit of a hash-id trace
                if s.name == "unit-lru" and "capacity" in str(e):
                    continue
                raise
            _check_sums(rec)
            assert summ["miss_causes"]["nesting_violations"] == 0, (row["name"], s.label)


@pytest.mark.slow
def test_mooncake_capacity_share_falls_compulsory_constant():
    """The issue's check on the Mooncake conversation trace at 1M / 3M / 10M tokens."""
    if os.environ.get("RADIXKV_SLOW") != "1":
        pytest.skip("full public-trace replays run only with RADIXKV_SLOW=1")
    from conftest import shared_path

    from radixkv.trace.load import load_trace

    t = load_trace(shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl"))
    for pol in ("vllm:16", "sglang:1", "unit-lru"):
        shares = []
        for cap in (10 ** 6, 3 * 10 ** 6, 10 ** 7):
            rec, summ = run_replay(t, parse_policy(pol), PoolSpec(capacity_tokens=cap), miss_causes=True)
            _check_sums(rec)
            shares.append(summ["miss_causes"]["share"])
        assert shares[0]["compulsory"] == shares[1]["compulsory"] == shares[2]["compulsory"]
        assert shares[0]["capacity"] > shares[1]["capacity"] > shares[2]["capacity"]


@pytest.mark.slow
def test_weka_traces_sum():
    if os.environ.get("RADIXKV_SLOW") != "1":
        pytest.skip("full public-trace replays run only with RADIXKV_SLOW=1")
    from conftest import shared_path

    from radixkv.trace.load import load_trace

    for f in sorted(shared_path("traces", "weka-claude-code", "traces").glob("*.json")):
        t = load_trace(f)
        for pol in ("vllm:16", "sglang:1", "unit-lru"):
            rec, summ = run_replay(t, parse_policy(pol), PoolSpec(capacity_tokens=10 ** 6), miss_causes=True)
            _check_sums(rec)


def test_curve_points_carry_causes(tmp_path):
    import json

    from radixkv.cli import main

    path = tmp_path / "t.jsonl"
    rows = [list(range(40)), list(range(1000, 1064)), list(range(40)), list(range(1000, 1064))]
    path.write_text("".join(json.dumps({"id": f"r{i}", "tokens": r, "output_tokens": []}) + "\n"
                            for i, r in enumerate(rows)))
    js = tmp_path / "c.json"
    assert main(["curve", str(path), "--policies", "vllm:16", "--capacities", "64,4096", "--miss-causes",
                 "--quiet", "--no-timing", "--json", str(js)]) == 0
    pts = json.loads(js.read_text())["curves"][0]["points"]
    # the per-request breakdown at each capacity, summed, is what the curve point says
    for pt in pts:
        _, summ = run_replay(_trace(rows), parse_policy("vllm:16"), PoolSpec(capacity_tokens=pt["capacity_tokens"]),
                             miss_causes=True)
        assert {k: v for k, v in pt["miss_causes"]["tokens"].items()} == summ["miss_causes"]["tokens"]
    # hand-worked at 64 tokens: capacity 32 (r2) + 32 (r3); at 4096 nothing is evicted
    assert [pt["miss_causes"]["tokens"]["capacity"] for pt in pts] == [64, 0]
    assert pts[0]["miss_causes"]["tokens"]["compulsory"] == pts[1]["miss_causes"]["tokens"]["compulsory"] == 104


@SETTINGS
@given(st.one_of(token_traces(), unit_traces()),
       st.sampled_from([("vllm:1", {}), ("vllm:4", {}), ("sglang:1", {}), ("sglang:4", {}), ("unit-lru", {}),
                        ("vllm:4@lfu", {}), ("sglang:2@lfu", {}), ("sglang:1", {"cache_last_token_on_stop": True})]))
def test_unbounded_hit_without_replay_matches_the_shadow_replay(trace, case):
    # the fast H∞ (no replay: the rule on L, or unit-lru's key set) equals the hits of the
    # same policy replayed on a pool that never evicts
    from radixkv.replay import misses

    text, opts = case
    spec = parse_policy(text)
    probe, how = misses.unbounded_rule(trace, spec, **opts)
    assert how is not None
    misses._MEMO.clear()
    held, hit_unb, aligned, capped, pool, _ = misses._shadows(trace, trace, spec, None, opts)
    srec, spol = misses.capacity_shadow(trace, spec, **opts)
    assert hit_unb.tolist() == np.asarray(srec["hit_tokens"]).tolist()
    assert pool == spol.capacity_tokens
