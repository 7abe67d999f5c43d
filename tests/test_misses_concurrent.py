"""Miss causes of the concurrent and multi-replica replays (radixkv/replay/conc_misses.py).

Hand-worked cases give each cause from the engine rules (docs/miss-causes.md,
docs/SEMANTICS.md); on hypothesis traces (random arrivals, small pools that evict and
preempt, small step budgets that chunk) every cause is ≥ 0, the causes plus the hit sum to
the prompt request by request, and the compulsory misses equal a brute-force oracle (every
prompt against every earlier-admitted request's KV extent, token by token, in the
admission order the replay's own ``admit_step`` / ``admit_s`` columns give).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.replay.conc_misses import MissRecorder, attach_concurrent_causes
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.multi_concurrent import replay_multi_concurrent
from radixkv.replay.scheduler import SchedulerConfig
from reference_sglang import expand
from test_radix_property import token_traces, unit_traces

EXAMPLES = int(os.environ.get("RADIXKV_MISSES_EXAMPLES", 30))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
from _conc_cases import COST, request_trace
SPLIT = ("hit_tokens", "miss_compulsory_tokens", "miss_alignment_tokens", "miss_last_token_cap_tokens",
         "miss_not_cached_tokens", "miss_in_flight_tokens", "miss_capacity_tokens", "miss_preemption_tokens")


def _trace(prompts, outputs, arrivals):
    return request_trace(prompts, outputs, arrivals)


def _run(trace, text, capacity=None, cfg=None, policy=None):
    cfg = cfg or SchedulerConfig()
    spec = parse_policy(text)
    pol = policy or build_policy(spec, PoolSpec(capacity_tokens=capacity), unit_tokens=trace.unit_tokens)
    rec = MissRecorder(trace, pol, cfg)
    res = replay_concurrent(trace, pol, COST, config=cfg, recorder=rec)
    attach_concurrent_causes(trace, spec, res, [rec])
    res.test_recorders = [rec]
    return res


def _run_multi(trace, text, capacity, n, router="round-robin", cfg=None):
    cfg = cfg or SchedulerConfig()
    spec = parse_policy(text)
    pols = [build_policy(spec, PoolSpec(capacity_tokens=capacity), unit_tokens=trace.unit_tokens) for _ in range(n)]
    recs = [MissRecorder(trace, p, cfg, replica=i) for i, p in enumerate(pols)]
    m = replay_multi_concurrent(trace, pols, COST, router, config=cfg, recorders=recs, seed=1)
    attach_concurrent_causes(trace, spec, m.aggregate, recs, replica=m.replica)
    m.aggregate.test_recorders = recs
    return m


def _row(res, i):
    return {k.replace("miss_", "").replace("_tokens", ""): int(v[i]) for k, v in res.columns.items()
            if k.startswith("miss_") or k == "hit_tokens"}


# ---------------------------------------------------------------------- hand-worked
def test_same_sglang_prefill_batch_is_in_flight():
    # Two identical 40-token prompts at t = 0, page 1, a 10,000-token pool: SGLang puts
    # both in the first prefill batch; the tree gets the first prompt only after the batch
    # (cache_unfinished_req), so the second hits 0. Had the first been inserted, the second
    # would match its first P − 1 = 39 tokens (Req.init_next_round_input): in-flight 39,
    # last-token cap 1, compulsory 0.
    p = list(range(40))
    r = _run(_trace([p, p], [4, 4], [0.0, 0.0]), "sglang:1", 10_000)
    assert list(r["admit_step"]) == [1, 1]
    assert _row(r, 0) == {"hit": 0, "compulsory": 40, "alignment": 0, "last_token_cap": 0, "not_cached": 0,
                          "in_flight": 0, "capacity": 0, "preemption": 0}
    assert _row(r, 1) == {"hit": 0, "compulsory": 0, "alignment": 0, "last_token_cap": 1, "not_cached": 0,
                          "in_flight": 39, "capacity": 0, "preemption": 0}
    s = r.summary()["miss_causes"]
    assert s["mode"] == "concurrent" and s["tokens"]["routing"] is None and s["nesting_violations"] == 0


def test_same_vllm_step_hits_the_scheduled_blocks():
    # vLLM hashes a request's blocks when the step schedules them (allocate_slots →
    # cache_blocks), so the second request of the same step already hits the first's two
    # full blocks (32 tokens): no in-flight miss, 8 tokens of alignment (40 − 32).
    p = list(range(40))
    r = _run(_trace([p, p], [4, 4], [0.0, 0.0]), "vllm:16", 10_000)
    assert _row(r, 1) == {"hit": 32, "compulsory": 0, "alignment": 8, "last_token_cap": 0, "not_cached": 0,
                          "in_flight": 0, "capacity": 0, "preemption": 0}


def test_chunked_prompt_sent_twice_sglang():
    # 200-token prompt twice at t = 0, max_num_batched_tokens (chunked_prefill_size) 64,
    # page 1. Steps 1–3: chunks of 64 of the first request (budget used up); step 4: its
    # last 8 tokens, then the second is admitted with 56 left. The tree holds the first
    # 192 tokens (three chunks inserted after steps 1–3): hit 192. With the whole first
    # prompt inserted it would hit P − 1 = 199: in-flight 7 (the chunk of step 4), cap 1.
    q = list(range(1000, 1200))
    cfg = SchedulerConfig(max_num_batched_tokens=64)
    r = _run(_trace([q, q], [2, 2], [0.0, 0.0]), "sglang:1", 10_000, cfg)
    assert list(r["admit_step"]) == [1, 4]
    assert _row(r, 1) == {"hit": 192, "compulsory": 0, "alignment": 0, "last_token_cap": 1, "not_cached": 0,
                          "in_flight": 7, "capacity": 0, "preemption": 0}


def test_chunked_prompt_sent_twice_vllm():
    # The same under vLLM's rules, block 16: in step 4 the first request's last chunk is
    # scheduled (its blocks hashed) before the second is admitted, so the second hits the
    # 12 full blocks of 199 looked-up tokens = 192: alignment 8, nothing in flight.
    q = list(range(1000, 1200))
    cfg = SchedulerConfig(max_num_batched_tokens=64)
    r = _run(_trace([q, q], [2, 2], [0.0, 0.0]), "vllm:16", 10_000, cfg)
    assert list(r["admit_step"]) == [1, 4]
    assert _row(r, 1) == {"hit": 192, "compulsory": 0, "alignment": 8, "last_token_cap": 0, "not_cached": 0,
                          "in_flight": 0, "capacity": 0, "preemption": 0}


def test_preempted_request_readmitted():
    # vLLM rules, block 4, 6 usable blocks (+ the null block). A (ids 0–3) and B (100–103)
    # arrive at 0, 4-token prompts, N = 13 (KV extent 16 = 4 blocks each). Both decode in
    # lockstep; when A's KV reaches 13 tokens it needs a 4th block, all 6 are held (3 + 3)
    # → B (running[-1]) is preempted holding 12 computed tokens in 3 full, hashed blocks,
    # freed tail first. A's 4th block evicts B's 3rd. A finishes; B is re-admitted on its
    # prompt + 9 generated tokens (13), hitting its 2 surviving blocks (8 tokens ≥ P): it
    # computes no prompt position again, so its preemption miss is 0; recomputed_tokens is
    # 13 − 8 = 5 (generated tokens' KV, outside the prompt split). First admissions: all
    # compulsory.
    a, b = list(range(4)), list(range(100, 104))
    r = _run(_trace([a, b], [13, 13], [0.0, 0.0]), "vllm:4", policy=BlockHashCache(7, 4))
    assert list(r["preemptions"]) == [0, 1]
    assert list(r["recomputed_tokens"]) == [0, 5]
    assert _row(r, 1) == {"hit": 0, "compulsory": 4, "alignment": 0, "last_token_cap": 0, "not_cached": 0,
                          "in_flight": 0, "capacity": 0, "preemption": 0}
    s = r.summary()["miss_causes"]
    assert s["tokens"]["preemption"] == 0 and s["preemption_in_split"] is True


def test_vllm_preemption_recomputes_prompt_positions():
    # The same pool (block 4, 6 usable blocks), 8-token prompts A = 0–7, B = 100–107, N = 13
    # (KV extent 20 = 5 blocks each). Step 1: both prefills (2 blocks each, 4 free). Step 2:
    # each decode computes position 8 → a 3rd block each (6 held). Steps 3–5: positions 9–11.
    # Step 6: position 12 needs a 4th block, none free → B (running[-1]) is preempted with
    # positions 0–11 computed (blocks B1 = 0–3, B2 = 4–7, B3 = 8–11, hashed, freed tail
    # first: B3, B2, B1 in the free queue). A's 4th block (step 6) evicts B3, its 5th
    # (position 16, step 10) evicts B2. A finishes at step 13 (13 outputs). B is
    # re-admitted on prompt + 5 sampled outputs = 13 tokens, looks up 12: B1 hit, B2 gone →
    # hit 4; it recomputes positions 4–12 (recomputed_tokens 9). Of those, prompt positions
    # 4–7 it had computed itself at its first admission → preemption 4. Its first admission
    # (step 1, next to A whose prompt differs) hit 0 with all 8 tokens compulsory; the 4
    # recomputed positions leave compulsory: compulsory 4 + preemption 4 = 8.
    a, b = list(range(8)), list(range(100, 108))
    r = _run(_trace([a, b], [13, 13], [0.0, 0.0]), "vllm:4", policy=BlockHashCache(7, 4))
    assert list(r["preemptions"]) == [0, 1]
    assert list(r["recomputed_tokens"]) == [0, 9]
    assert _row(r, 0) == {"hit": 0, "compulsory": 8, "alignment": 0, "last_token_cap": 0, "not_cached": 0,
                          "in_flight": 0, "capacity": 0, "preemption": 0}
    assert _row(r, 1) == {"hit": 0, "compulsory": 4, "alignment": 0, "last_token_cap": 0, "not_cached": 0,
                          "in_flight": 0, "capacity": 0, "preemption": 4}
    s = r.summary()["miss_causes"]
    assert s["tokens"]["preemption"] == 4 and s["share"]["preemption"] == 4 / 16
    assert s["tokens"]["compulsory"] == 12 and s["nesting_violations"] == 0


def test_sglang_retraction_recomputes_prompt_positions(monkeypatch):
    # SGLang rules, RadixCache of 20 tokens, page 1, new_token_ratio starting at 0.1 (as
    # after a long decay; tests/test_sched_sglang.py::test_retraction_order_ratio_and_rematch
    # works out steps 1–9 of A = [1..4], B = [5..8], N = 8 each): A admitted at step 1, B
    # at step 2, C (16 tokens 100–115, N = 2) refused until A and B leave (it needs
    # 16 + 2 + 1 = 19 tokens of room). Step 9: the decode does not fit, B (latest in the
    # batch) is retracted (prompt in the tree, unlocked; 6 decode tokens dropped) and
    # appended behind C; A finishes. Steps 10–11: C runs (its 16 + 1 tokens leave the
    # tree no room for B's prompt next to A's 11). Step 12: B re-admitted with fill
    # 4 + 7 = 11 and its prompt gone: hit 0, recomputed_tokens 11 (the replay's count).
    # Given those engine events, the split: B's first admission hit 0 with all 4 prompt
    # tokens compulsory (A's prompt differs); its re-admission computes prompt positions
    # 0–3 again, which it had computed itself at step 2 → preemption 4, compulsory 0.
    import radixkv.replay.sched_sglang as S

    monkeypatch.setattr(S, "SGLANG_INIT_NEW_TOKEN_RATIO", 0.1)
    A, B, C = [1, 2, 3, 4], [5, 6, 7, 8], list(range(100, 116))
    r = _run(_trace([A, B, C], [8, 8, 2], [0.0, 0.0, 0.0]), "sglang:1", 20)
    assert list(r["admit_step"]) == [1, 2, 10] and list(r["finish_step"]) == [9, 12, 11]
    assert list(r["preemptions"]) == [0, 1, 0]
    assert list(r["recomputed_tokens"]) == [0, 11, 0]
    assert _row(r, 1) == {"hit": 0, "compulsory": 0, "alignment": 0, "last_token_cap": 0, "not_cached": 0,
                          "in_flight": 0, "capacity": 0, "preemption": 4}
    assert _row(r, 2)["compulsory"] == 16


def test_recomputed_positions_by_hand():
    from radixkv.replay.conc_misses import recomputed_positions

    # admission 1 computed [0, 12) of a 10-token prompt, admission 2 (final) hit 4: [4, 10) twice
    assert recomputed_positions([(0, 12), (4, -1)], 0, 10) == [(4, 10)]
    # the first admission hit 3: positions below 3 were hits, never counted
    assert recomputed_positions([(3, 6), (0, 5), (2, -1)], 3, 10) == [(3, 6)]
    # three admissions: [2, 5), [5, 9), final from 3 → covered twice: [3, 9)
    assert recomputed_positions([(2, 5), (5, 9), (3, -1)], 2, 12) == [(3, 9)]
    # preempted before its first chunk (no run), or re-admitted past the prompt: nothing
    assert recomputed_positions([(-1, 0), (0, -1)], 0, 8) == []
    assert recomputed_positions([(0, 7), (9, -1)], 0, 8) == []


@pytest.mark.parametrize("text,routing,alignment,cap", [("sglang:1", 39, 0, 1), ("vllm:16", 32, 8, 0)])
def test_round_robin_repeat_on_other_replica_is_routing(text, routing, alignment, cap):
    # 2 replicas, round-robin: the 40-token prompt at t = 0 runs on replica 0 and is in its
    # cache long before the repeat at t = 100, which round-robin sends to replica 1 (empty
    # cache): hit 0. Replica 0's cache would give it 39 (SGLang: P − 1) or 32 (vLLM: 2
    # blocks of 16): routing.
    p = list(range(40))
    m = _run_multi(_trace([p, p], [4, 4], [0.0, 100.0]), text, 10_000, 2)
    assert m.replica.tolist() == [0, 1]
    assert _row(m.aggregate, 1) == {"hit": 0, "compulsory": 0, "alignment": alignment, "last_token_cap": cap,
                                    "not_cached": 0, "in_flight": 0, "capacity": 0, "preemption": 0,
                                    "routing": routing}
    s = m.summary()["miss_causes"]
    assert s["mode"] == "multi-replica" and s["tokens"]["routing"] == routing


def test_recorder_changes_nothing():
    # the replay with the recorder gives the same columns and summary as without
    p = list(range(40))
    t = _trace([p, p[:30] + [7] * 5, p], [4, 3, 9], [0.0, 0.0, 0.01])
    for text in ("vllm:16", "sglang:1"):
        spec = parse_policy(text)
        plain = replay_concurrent(t, build_policy(spec, PoolSpec(capacity_tokens=96), unit_tokens=1), COST,
                                  config=SchedulerConfig())  # as _run gives it (scheduler.source "given")
        r = _run(t, text, 96)
        s = r.summary()
        s.pop("miss_causes")
        assert s == plain.summary()
        for c in plain.columns:
            np.testing.assert_array_equal(plain.columns[c], r.columns[c])


# ---------------------------------------------------------------------- oracle + properties
def _oracle_held(trace, order):
    """Brute force: longest prefix of each prompt held by the KV extent of any request
    admitted before it (in *order*), token by token."""
    seqs = [expand(trace.kv_seq(i)) for i in range(len(trace))]
    out = np.zeros(len(trace), dtype=np.int64)
    for k, i in enumerate(order):
        P = int(trace.prompt_len[i])
        best = 0
        for j in order[:k]:
            q = seqs[j]
            m = 0
            while m < P and m < len(q) and q[m] == seqs[i][m]:
                m += 1
            best = max(best, m)
        out[i] = best
    return out


def _oracle_recomputed(res, trace):
    """Brute force, position by position: the prompt positions at or after the first
    admission's hit that two or more admissions computed (each admission's computed range
    as the recorder saw it, ``MissRecorder.admission_runs``). Returns one set per request."""
    runs = {}
    for rec in res.test_recorders:
        runs.update(rec.admission_runs())
    out = [set() for _ in range(len(trace))]
    for r, rr in runs.items():
        P, H = int(trace.prompt_len[r]), int(res["hit_tokens"][r])
        for p in range(H, P):
            times = sum(1 for a, b in rr if a >= 0 and a <= p < (P if b < 0 else b))
            if times >= 2:
                out[r].add(p)
    return out


def _check(res, trace, multi, order):
    c = res.columns
    total = np.zeros(len(trace), dtype=np.int64)
    for k in SPLIT + (("miss_routing_tokens",) if multi else ()):
        assert (c[k] >= 0).all(), (k, c[k])
        total += c[k]
    assert (total == np.asarray(trace.prompt_len)).all()
    assert (c["miss_preemption_tokens"] <= c["recomputed_tokens"]).all()
    assert (c["miss_preemption_tokens"][c["preemptions"] == 0] == 0).all()
    assert res.summary()["miss_causes"]["nesting_violations"] == 0
    # compulsory against the infinite-cache oracle: positions [L, P) of the first admission,
    # less those computed again after a preemption (counted as preemption)
    held = _oracle_held(trace, order)
    again = _oracle_recomputed(res, trace)
    for r in range(len(trace)):
        P = int(trace.prompt_len[r])
        assert c["miss_preemption_tokens"][r] == len(again[r])
        assert c["miss_compulsory_tokens"][r] == sum(1 for p in range(int(held[r]), P) if p not in again[r])


@st.composite
def _timed(draw):
    t = draw(st.one_of(token_traces(), unit_traces()))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 1e-4, 1e-3, 0.05, 5.0]), min_size=len(t), max_size=len(t)))
    return dataclasses.replace(t, arrival_s=np.cumsum(np.asarray(gaps, dtype=np.float64)), _seq_cache={})


def _pool(trace, g, slack):
    need = max(-(-trace.kv_len(i) // g) for i in range(len(trace))) + 2
    return (need + slack) * g


@SETTINGS
@given(_timed(), st.sampled_from(["vllm:1", "vllm:4", "sglang:1", "sglang:4", "vllm:4@lfu"]), st.integers(0, 12),
       st.sampled_from([8, 16, 8192]))
def test_concurrent_causes_sum_and_nest(trace, text, slack, budget):
    spec = parse_policy(text)
    g = spec.size
    cfg = SchedulerConfig(max_num_batched_tokens=max(budget, g))
    r = _run(trace, text, _pool(trace, g, slack), cfg)
    rows = np.arange(len(trace))
    _check(r, trace, False, rows[np.lexsort((rows, r["admit_step"]))])


@SETTINGS
@given(_timed(), st.sampled_from(["vllm:4", "sglang:1", "sglang:4"]), st.integers(0, 12),
       st.sampled_from(["round-robin", "random", "least-load"]), st.integers(2, 3))
def test_multi_replica_causes_sum_and_nest(trace, text, slack, router, n):
    spec = parse_policy(text)
    m = _run_multi(trace, text, _pool(trace, spec.size, slack), n, router, SchedulerConfig(max_num_batched_tokens=16))
    rows = np.arange(len(trace))
    _check(m.aggregate, trace, True, rows[np.lexsort((rows, m.replica, m.aggregate["admit_s"]))])


def _stem_trace(seed, n=40):
    """n requests over three shared stems with unique tails, long outputs, bursty arrivals."""
    rng = np.random.default_rng(seed)
    stems = [list(range(k * 1000, k * 1000 + 48)) for k in range(3)]
    prompts, outs, arr = [], [], []
    for i in range(n):
        st_ = stems[int(rng.integers(3))][: int(rng.integers(4, 48))]
        prompts.append(st_ + list(range(10 ** 6 + 100 * i, 10 ** 6 + 100 * i + int(rng.integers(1, 20)))))
        outs.append(int(rng.integers(1, 40)))
        arr.append(float(rng.choice([0.0, 1e-4, 5e-3])))
    return _trace(prompts, outs, np.cumsum(arr).tolist())


@pytest.mark.parametrize("text,replicas", [("vllm:4", 1), ("sglang:1", 1), ("vllm:4", 3), ("sglang:4", 2)])
def test_preemption_in_split_on_tight_pools(monkeypatch, text, replicas):
    # tight pools over stem-sharing traces preempt (vLLM) or retract (SGLang, with
    # new_token_ratio started at 0.1 as after a long decay): the split still sums to the
    # prompt with every cause ≥ 0, compulsory and preemption match the brute-force oracles,
    # and some prompt positions are computed again (the case is exercised, not vacuous)
    import radixkv.replay.sched_sglang as S

    monkeypatch.setattr(S, "SGLANG_INIT_NEW_TOKEN_RATIO", 0.1)
    seen = 0
    for seed in range(3):
        t = _stem_trace(seed)
        pool = _pool(t, parse_policy(text).size, 2)
        rows = np.arange(len(t))
        if replicas == 1:
            r = _run(t, text, pool, SchedulerConfig(max_num_batched_tokens=32))
            _check(r, t, False, rows[np.lexsort((rows, r["admit_step"]))])
        else:
            m = _run_multi(t, text, pool, replicas, cfg=SchedulerConfig(max_num_batched_tokens=32))
            r = m.aggregate
            _check(r, t, True, rows[np.lexsort((rows, m.replica, r["admit_s"]))])
        seen += int(r["miss_preemption_tokens"].sum())
        assert r.summary()["miss_causes"]["tokens"]["preemption"] == int(r["miss_preemption_tokens"].sum())
    assert seen > 0


# ---------------------------------------------------------------------- CLI
def test_cli_concurrent_and_replicas(tmp_path, capsys):
    import json

    from radixkv.cli import main

    p = list(range(40))
    path = tmp_path / "t.jsonl"
    rows = [(0.0, p), (0.0, p), (100.0, p)]
    path.write_text("".join(json.dumps({"id": f"r{i}", "arrival_s": t, "tokens": r, "output_tokens": [1, 2]}) + "\n"
                            for i, (t, r) in enumerate(rows)))
    conc = ["--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--quiet", "--no-timing"]
    csv, js, js0 = tmp_path / "r.csv", tmp_path / "r.json", tmp_path / "r0.json"
    assert main(["replay", str(path), "--policy", "sglang:1", "--capacity-tokens", "4096", "--miss-causes",
                 "--per-request", str(csv), "--json", str(js), *conc]) == 0
    head, *lines = csv.read_text().splitlines()
    cols = head.split(",")
    r1 = dict(zip(cols, lines[1].split(",")))
    # the hand-worked same-batch case (test_same_sglang_prefill_batch_is_in_flight)
    assert (r1["hit_tokens"], r1["miss_in_flight_tokens"], r1["miss_last_token_cap_tokens"]) == ("0", "39", "1")
    assert "miss_routing_tokens" not in cols
    mc = json.loads(js.read_text())["results"][0]["summary"]["miss_causes"]
    assert mc["mode"] == "concurrent" and mc["tokens"]["in_flight"] == 39 and mc["share"]["routing"] is None
    # without the flag: no miss columns or key
    assert main(["replay", str(path), "--policy", "sglang:1", "--capacity-tokens", "4096", "--json", str(js0),
                 *conc]) == 0
    assert "miss_causes" not in json.loads(js0.read_text())["results"][0]["summary"]
    # 2 replicas, round-robin: r0 → 0, r1 → 1 (in flight on the other replica: r0's prompt is
    # not inserted anywhere at t = 0 → in-flight 39), r2 → 0 at t = 100 hits 39 there
    assert main(["replay", str(path), "--policy", "sglang:1", "--capacity-tokens", "4096", "--miss-causes",
                 "--replicas", "2", "--router", "round-robin", "--json", str(js), *conc]) == 0
    mc = json.loads(js.read_text())["results"][0]["summary"]["miss_causes"]
    assert mc["mode"] == "multi-replica"
    assert (mc["tokens"]["hit"], mc["tokens"]["in_flight"], mc["tokens"]["routing"]) == (39, 39, 0)
    png = tmp_path / "m.png"
    assert main(["compare", str(path), "--policies", "vllm:16,sglang:1", "--capacity-tokens", "4096",
                 "--miss-plot", str(png), *conc]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["replay", str(path), "--policy", "vllm:16", "--capacity-tokens", "4096", "--miss-causes",
                 "--no-enable-prefix-caching", *conc]) != 0
    assert "--miss-causes" in capsys.readouterr().err


def _cli_fix(tmp_path, cap, extra=()):
    import json

    from radixkv.cli import main

    A, B = list(range(45)), list(range(500, 545))
    path = tmp_path / "fx.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "arrival_s": t, "tokens": r, "output_length": 1}) + "\n"
                            for i, (t, r) in enumerate([(0.0, A), (1.0, B), (2.0, A)])))
    js = tmp_path / "fx.json"
    assert main(["replay", str(path), "--policy", "vllm:16", "--capacity-tokens", str(cap), "--miss-fix",
                 "--json", str(js), "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
                 "--quiet", "--no-timing", *extra]) == 0
    return json.loads(js.read_text())["results"][0]["summary"]


def test_concurrent_miss_fix_by_hand(tmp_path):
    # vLLM rules, block 16; A (45 tokens) at 0 s, B (45 other tokens) at 1 s, A again at 2 s,
    # one output each: the requests never overlap. A holds 3 blocks (A1, A2 hashed; the
    # 13-token tail not), freed tail first to the back of the free queue. A's repeat looks
    # up 44 tokens: 2 blocks = 32 if both survive B. B takes the 3 blocks at the head:
    #   3 usable blocks (48 tokens): B evicts A1, A2 (and the tail) → hit 0, capacity 32;
    #   4 blocks: queue [free, tail, A2, A1] → A2 evicted, A1 hit → capacity 16;
    #   5 blocks or more: both survive → capacity 0.
    # The search from 48 tokens (target ≤ 16): 96 → 0 (bracket [48, 96]); bisect in log
    # capacity: round(√(48·96)) = 68 (4 blocks: 16, hi), round(√(48·68)) = 57 (3 blocks:
    # 32, lo), round(√(57·68)) = 62 (3 blocks: 32, lo) → 68 tokens.
    # At block 8 on the same 48 tokens (6 blocks) A holds 6 blocks and B evicts all: gained 0.
    fix = _cli_fix(tmp_path, 48)["miss_causes"]["fix"]
    assert fix["capacity_curve"] == [[48, 32], [57, 32], [62, 32], [68, 16], [96, 0]]
    assert fix["capacity_tokens_to_halve"] == 68
    assert (fix["smaller_size"], fix["hit_tokens_gained_at_smaller_size"]) == (8, 0)
    # on a pool that evicts nothing: no capacity miss to halve; A's repeat hits 32 at block
    # 16 and 40 at block 8 (44 tokens looked up: 5 blocks of 8): gained 8
    s = _cli_fix(tmp_path, 10_000)
    assert s["hit_tokens"] == 32 and s["miss_causes"]["tokens"]["capacity"] == 0
    fix = s["miss_causes"]["fix"]
    assert fix["capacity_tokens_to_halve"] is None
    assert (fix["smaller_size"], fix["hit_tokens_gained_at_smaller_size"]) == (8, 8)
    # with replicas: per replica, round-robin sends A's repeat to replica 0 again (r0 → 0,
    # r1 → 1, r2 → 0) where nothing else ran: hit 32, nothing to halve
    s = _cli_fix(tmp_path, 48, ("--replicas", "2", "--router", "round-robin"))
    assert s["hit_tokens"] == 32 and s["miss_causes"]["fix"]["capacity_tokens_to_halve"] is None


def _cli_explain(tmp_path, rows, text, cap, rid, extra=()):
    import json

    from radixkv.cli import main

    path = tmp_path / "ex.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "arrival_s": t, "tokens": r, "output_length": n}) + "\n"
                            for i, (t, r, n) in enumerate(rows)))
    js = tmp_path / "ex.json"
    assert main(["replay", str(path), "--policy", text, "--capacity-tokens", str(cap), "--explain", rid,
                 "--json", str(js), "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
                 "--quiet", *extra]) == 0
    return json.loads(js.read_text())["explain"]


def _spans(ex):
    return [(s["start"], s["end"], s["status"], s["produced_by"]) for s in ex["spans"]]


def test_concurrent_explain_in_flight_and_history(tmp_path):
    # SGLang, page 1: r0 and r1 (the same 40 tokens) at t = 0 share the first prefill batch
    # (step 1): r1's prompt is held by r0's KV extent, which nobody had inserted at r1's
    # admission → one in-flight span [0, 40) produced by r0; r1's hit 0, in-flight 39, cap 1;
    # admitted in step 1, so no step before it changed anything.
    p = list(range(40))
    rows = [(0.0, p, 2), (0.0, p, 2), (100.0, p, 2)]
    ex = _cli_explain(tmp_path, rows, "sglang:1", 4096, "r1")
    assert ex["mode"] == "concurrent" and ex["admit_step"] == 1 and ex["hit_tokens"] == 0
    assert _spans(ex) == [(0, 40, "in_flight", "r0")]
    assert ex["causes"]["in_flight"] == 39 and ex["causes"]["last_token_cap"] == 1
    assert ex["history"] == [] and ex["admission"]["hittable_before_step"] == 0
    # r2 at t = 100: step 1's batch inserted both prompts after the step
    # (cache_unfinished_req): r2's hittable prefix rose 0 → 39 there (capped at P − 1);
    # nothing later changes it; it hits 39; its prompt was first computed by r0, inserted
    ex = _cli_explain(tmp_path, rows, "sglang:1", 4096, "r2")
    assert _spans(ex) == [(0, 40, "inserted", "r0")]
    assert [(h["step"], h["hittable_before"], h["hittable_after"], h["event"], h["prefills"]) for h in ex["history"]] \
        == [(1, 0, 39, "inserted", ["r0", "r1"])]
    assert ex["hit_tokens"] == 39 and ex["causes"]["last_token_cap"] == 1


def test_concurrent_explain_eviction(tmp_path):
    # vLLM rules, block 16, 64-token pool (4 blocks): r0 (40 tokens, one output) at 0 s runs
    # alone in step 1, its 2 full blocks hashed → r2's hittable prefix 0 → 32 (39 looked up);
    # r1 (64 other tokens) at 1 s takes all 4 blocks in step 2 → 32 → 0, evicted in r1's
    # prefill step. r2 (= r0's prompt) at 2 s hits 0: capacity 32, alignment 8.
    a, b = list(range(40)), list(range(1000, 1064))
    ex = _cli_explain(tmp_path, [(0.0, a, 1), (1.0, b, 1), (2.0, a, 1)], "vllm:16", 64, "r2")
    assert [(h["step"], h["hittable_before"], h["hittable_after"], h["event"], h["prefills"]) for h in ex["history"]] \
        == [(1, 0, 32, "inserted", ["r0"]), (2, 32, 0, "evicted", ["r1"])]
    assert _spans(ex) == [(0, 40, "inserted", "r0")]
    assert ex["hit_tokens"] == 0 and ex["causes"]["capacity"] == 32 and ex["causes"]["alignment"] == 8


def test_concurrent_explain_replicas(tmp_path, capsys):
    # 2 replicas, round-robin: r0 → replica 0, r1 (same 40 tokens, t = 100) → replica 1,
    # whose cache never held them: one span inserted only in another replica's cache,
    # routing 39 (SGLang: P − 1), and no change on replica 1 before r1's admission
    p = list(range(40))
    ex = _cli_explain(tmp_path, [(0.0, p, 2), (100.0, p, 2)], "sglang:1", 4096, "r1",
                      ("--replicas", "2", "--router", "round-robin"))
    assert ex["mode"] == "multi-replica" and ex["replica"] == 1
    assert _spans(ex) == [(0, 40, "other_replica", "r0")] and ex["spans"][0]["produced_by_replica"] == 0
    assert ex["causes"]["routing"] == 39 and ex["history"] == []
    out = capsys.readouterr().out
    assert "inserted only in another replica's cache" in out


def test_stacked_bar_holds_preemption():
    # a concurrent summary's preemption is part of the split (preemption_in_split true):
    # its segment is stacked and the bar reaches 1; a summary written before (false) leaves
    # it out
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from radixkv.plots import draw_miss_causes

    share = {"hit": 0.5, "compulsory": 0.25, "capacity": 0.125, "alignment": 0.0, "last_token_cap": 0.0,
             "not_cached": 0.0, "in_flight": 0.0, "preemption": 0.125, "routing": None}
    for flag, labels, top in ((True, {"preemption"}, 1.0), (False, set(), 0.875)):
        fig, ax = plt.subplots()
        draw_miss_causes(ax, [("vllm:16", {"share": share, "preemption_in_split": flag})])
        got = {c.get_label() for c in ax.containers}
        assert ({"preemption"} & got) == labels
        assert max(p.get_y() + p.get_height() for p in ax.patches) == pytest.approx(top)
        plt.close(fig)


def test_concurrent_explain_gives_the_replayed_arrival(tmp_path):
    # --time-scale 0.5 halves the trace's times: r2 in the trace at 100 s arrives at 50 s
    p = list(range(40))
    ex = _cli_explain(tmp_path, [(0.0, p, 2), (0.0, p, 2), (100.0, p, 2)], "sglang:1", 4096, "r2",
                      extra=("--time-scale", "0.5"))
    assert ex["arrival_s"] == 50.0 and ex["admit_s"] >= 50.0
