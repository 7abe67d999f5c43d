"""Concurrent replay on several replicas (radixkv.replay.multi_concurrent): one replica =
the single-engine replay byte for byte, hand-worked 2-replica runs, refusals."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from radixkv.cli.concurrent_args import add_concurrent_args
from radixkv.cli.routing_args import add_routing_args, routed
from radixkv.cost import UnitStepCost
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.policies.unit_lru import UnitLRUCache
from radixkv.replay.concurrent import COLUMNS, replay_concurrent
from radixkv.replay.multi_concurrent import replay_multi_concurrent
from radixkv.replay.routing import ROUTERS
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.util import dumps_json

from _conc_cases import COST, request_trace


def _trace(prompts, outputs, arrivals, sessions=None):
    return request_trace(prompts, outputs, arrivals, sessions=sessions, name="t")


def _busy_trace(seed=5, n=120):
    """Shared-prefix prompts in bursts separated by idle gaps: queueing, chunking,
    preemption on a small pool, fast-forwarded decodes and idle engines all happen."""
    rng = np.random.default_rng(seed)
    roots = [list(rng.integers(1, 10**6, size=int(rng.integers(8, 40)))) for _ in range(6)]
    prompts, outs, arr, sess = [], [], [], []
    t = 0.0
    for i in range(n):
        k = int(rng.integers(0, 6))
        prompts.append(roots[k] + list(rng.integers(1, 10**6, size=int(rng.integers(1, 30)))))
        outs.append(int(rng.integers(0, 40)))
        t += float(rng.exponential(0.002)) + (0.5 if i % 40 == 39 else 0.0)
        arr.append(t)
        sess.append(f"s{k}")
    return _trace(prompts, outs, arr, sess)


POLICIES = {
    "vllm": lambda: BlockHashCache(40, 4),   # 39 usable blocks of 4 tokens: preemption under bursts
    "sglang": lambda: RadixCache(150, 1),
}


@pytest.mark.parametrize("engine", sorted(POLICIES))
@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("cost", ["roofline", "unit"])
def test_one_replica_equals_plain_concurrent_replay(engine, router, cost):
    t = _busy_trace()
    c = COST if cost == "roofline" else UnitStepCost(0.001)
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8)
    plain = replay_concurrent(t, POLICIES[engine](), c, config=cfg)
    multi = replay_multi_concurrent(t, [POLICIES[engine]()], c, router, config=cfg)
    ps = plain.summary()
    # the scenario exercises what it claims to (else equality would prove little)
    assert ps["preemptions"] > 0 and ps["hit_tokens"] > 0 and ps["concurrency_peak"] > 1
    assert dumps_json(multi.aggregate.summary()) == dumps_json(ps)
    assert dumps_json(multi.replicas[0].summary()) == dumps_json(ps)
    for col in COLUMNS:
        np.testing.assert_array_equal(multi.aggregate[col], plain[col], err_msg=col)
    assert multi.replica.tolist() == [0] * len(t)
    assert multi.routing["load_imbalance"] == 1.0


A = list(range(100, 108))
B = list(range(200, 208))
C = list(range(300, 308))
D = list(range(400, 408))


def _run(t, router, **kw):
    # vLLM rules, block 4, a pool that never evicts, 8 tokens per step, 1 s per step
    return replay_multi_concurrent(t, [BlockHashCache(101, 4), BlockHashCache(101, 4)], UnitStepCost(1.0), router,
                                   config=SchedulerConfig(max_num_batched_tokens=8), **kw)


def test_two_replicas_by_hand_cache_blind_vs_prefix_aware():
    # r0 t=0 A (8 tok, 10 outputs); r1 t=1 A+C (16 tok, 1 output); r2 t=2 B (8 tok, 1 output).
    # Steps of 1 s, 8 tokens each; a request arriving at t joins the step starting at t.
    t = _trace([A, A + C, B], [10, 1, 1], [0.0, 1.0, 2.0], sessions=["s", "s", "u"])
    # round-robin: r0→0, r1→1, r2→0.
    #   replica 0: r0 prefill [0,1) (first token at 1), decodes to t=10.
    #     r2 at t=2: step [2,3) = r0's decode (1) + a 7-token chunk of r2; [3,4) r2's last
    #     token → first token at 4: TTFT 2.
    #   replica 1: r1 misses, 16 tokens in 2 steps [1,3): TTFT 2.
    # least-load: r1 at t=1 sees loads (1, 0) → 1; r2 at t=2 sees (1, 1) (r1 runs until 3),
    #   tie on load and on requests sent (1, 1) → lowest index 0: the same routes.
    for router in ("round-robin", "least-load"):
        m = _run(t, router)
        assert m.replica.tolist() == [0, 1, 0], router
        assert m.aggregate["ttft_s"].tolist() == [1.0, 2.0, 2.0]
        assert m.aggregate["hit_tokens"].tolist() == [0, 0, 0]
    # prefix-aware: r1 matches 8 of its 16 tokens in replica 0's tree (0.5 > 0.3) → 0:
    #   hits A's 2 blocks; step [1,2) = r0 decode + 7-token chunk, [2,3) the last token →
    #   TTFT 2. r2 at t=2: no match anywhere → the smaller tree (replica 1, empty) → idle
    #   replica: [2,3) → TTFT 1.
    # session: s's first request goes to the least-loaded (tie → 0), r1 follows it; u's
    #   first request r2 sees loads (2, 0) → 1: the same routes.
    for router in ("prefix-aware", "session"):
        m = _run(t, router)
        assert m.replica.tolist() == [0, 0, 1], router
        assert m.aggregate["ttft_s"].tolist() == [1.0, 2.0, 1.0]
        assert m.aggregate["hit_tokens"].tolist() == [0, 8, 0]
        assert m.summary()["token_hit_rate"] == 8 / 32
    # aggregate metrics of round-robin by hand: duration 0 → 10 s; running requests:
    #   replica 0: [0,2) 1, [2,4) 2 (r0, r2), [4,10) 1 → 12 request·s; replica 1: [1,3) 1 → 2.
    #   Busy time (either replica running): 10 s. Peak: 3 at [2,3). Outputs 12 in 10 s.
    s = _run(t, "round-robin").summary()
    assert s["duration_s"] == 10.0
    assert s["concurrency_mean"] == pytest.approx(14 / 10)
    assert s["concurrency_busy_mean"] == pytest.approx(14 / 10)
    assert s["concurrency_peak"] == 3
    assert s["throughput_output_tokens_per_s"] == pytest.approx(12 / 10)
    assert s["steps"] == 10 + 2
    r0, r1 = s["replicas"]
    assert (r0["requests"], r1["requests"]) == (2, 1)
    assert r0["concurrency_mean"] == pytest.approx(12 / 10) and r1["concurrency_mean"] == pytest.approx(2 / 10)
    assert s["routing"]["requests_per_replica"] == [2, 1]
    assert s["routing"]["load_imbalance"] == pytest.approx(2 / 1.5)
    assert s["routing"]["busy_s_per_replica"] == [10.0, 2.0]


def test_least_load_reads_in_flight_requests_at_arrival():
    # r0 t=0 A, 10 outputs (replica 0 busy to t=10); r1 t=1 B, 1 output: replica 1, step
    # [1,2), finished AT t=2; r2 t=2 C. Least-load sees (1, 0) → replica 1, idle: TTFT 1.
    # Round-robin sends r2 to replica 0: r0's decode + 7-token chunk, then 1 → TTFT 2.
    t = _trace([A, B, C], [10, 1, 1], [0.0, 1.0, 2.0])
    ll, rr = _run(t, "least-load"), _run(t, "round-robin")
    assert ll.replica.tolist() == [0, 1, 1] and rr.replica.tolist() == [0, 1, 0]
    assert ll.aggregate["ttft_s"].tolist() == [1.0, 1.0, 1.0]
    assert rr.aggregate["ttft_s"].tolist() == [1.0, 1.0, 2.0]
    # a request still running when the next arrives counts: r1 with 2 outputs finishes at
    # t=3, so at t=2 the loads are (1, 1) → tie on requests sent (1, 1) → replica 0.
    t2 = _trace([A, B, C], [10, 2, 1], [0.0, 1.0, 2.0])
    assert _run(t2, "least-load").replica.tolist() == [0, 1, 0]


def test_random_router_is_seeded():
    t = _busy_trace(n=40)
    pols = lambda: [RadixCache(400, 1) for _ in range(3)]  # noqa: E731
    a = replay_multi_concurrent(t, pols(), COST, "random", seed=7)
    b = replay_multi_concurrent(t, pols(), COST, "random", seed=7)
    c = replay_multi_concurrent(t, pols(), COST, "random", seed=8)
    assert dumps_json(a.summary()) == dumps_json(b.summary())
    assert a.replica.tolist() != c.replica.tolist()
    assert sorted(set(a.replica.tolist())) == [0, 1, 2]


def test_exported():
    import radixkv

    assert radixkv.replay_multi_concurrent is replay_multi_concurrent
    assert "replay_replicas" in radixkv.__all__


def test_refusals():
    t = _trace([A], [1], [0.0])
    with pytest.raises(ConfigError, match="holds_running_kv"):
        replay_multi_concurrent(t, [UnitLRUCache(100, 1)], COST, "round-robin")
    p = RadixCache(100, 1)
    with pytest.raises(ConfigError, match="own policy instance"):
        replay_multi_concurrent(t, [p, p], COST, "round-robin")
    with pytest.raises(ConfigError, match="session ids"):
        replay_multi_concurrent(t, [RadixCache(100, 1), RadixCache(100, 1)], COST, "session")
    with pytest.raises(ConfigError, match="could never run"):
        big = _trace([A, list(range(1000, 1200))], [1, 1], [0.0, 0.0])
        replay_multi_concurrent(big, [RadixCache(100, 1), RadixCache(100, 1)], COST, "round-robin")
    ap = argparse.ArgumentParser()
    add_concurrent_args(ap)
    add_routing_args(ap)
    with pytest.raises(ConfigError, match="not modelled in the concurrent mode"):
        routed(ap.parse_args(["--mode", "concurrent", "--replicas", "2", "--kv-pool", "global"]))
    assert routed(ap.parse_args(["--mode", "concurrent", "--replicas", "2"]))
    # concurrent load is the requests in flight: a load window given there would be silently unused
    with pytest.raises(ConfigError, match="sequential replicas only"):
        routed(ap.parse_args(["--mode", "concurrent", "--replicas", "2", "--router", "least-load",
                              "--router-load-window", "30"]))
    assert routed(ap.parse_args(["--replicas", "2", "--router", "least-load", "--router-load-window", "30"]))


def test_cli_concurrent_replicas(tmp_path, capsys):
    from radixkv.cli import main

    t = _busy_trace(n=60)  # written as Mooncake JSONL: each token id becomes a 512-token block hash
    path = tmp_path / "t.jsonl"
    with open(path, "w") as f:
        for i in range(len(t)):
            f.write(json.dumps({"timestamp": int(t.arrival_s[i] * 1000), "input_length": 512 * int(t.prompt_len[i]),
                                "output_length": int(t.output_len[i]),
                                "hash_ids": [int(x) for x in t.prompt_ids(i)]}) + "\n")
    out = tmp_path / "o.json"
    rc = main(["replay", str(path), "--policy", "sglang:1", "--capacity-tokens", "400000", "--mode", "concurrent",
               "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--replicas", "3", "--router", "prefix-aware",
               "--json", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "replica 2" in text and "TTFT" in text
    doc = json.loads(out.read_text())
    s = doc["results"][0]["summary"]
    assert s["routing"]["n_replicas"] == 3
    assert sum(r["requests"] for r in s["replicas"]) == s["requests"] == 60
    assert sum(s["routing"]["requests_per_replica"]) == 60


@pytest.mark.parametrize("engine", sorted(POLICIES))
@pytest.mark.parametrize("router", ["round-robin", "random"])
def test_state_blind_routes_equal_independent_replays(engine, router):
    # round-robin and random do not read the replicas' state, so each replica must behave
    # as a single engine replaying just its requests at their arrival times (the oracle:
    # replay_concurrent on the sub-trace). Integer columns are equal; times agree up to
    # float rounding (a replica's decode runs are also cut at the other replicas' arrivals).
    from radixkv.replay.routing import take

    t = _busy_trace()
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8)
    arr = np.asarray(t.arrival_s) - t.arrival_s[0]
    small = {"vllm": lambda: BlockHashCache(32, 4), "sglang": lambda: RadixCache(120, 1)}[engine]  # preemption on 3
    m = replay_multi_concurrent(t, [small() for _ in range(3)], COST, router, config=cfg, arrivals=arr)
    assert sum(m.routing["requests_per_replica"]) == len(t)
    preempted = 0
    for r in range(3):
        idx = np.flatnonzero(m.replica == r)
        solo = replay_concurrent(take(t, idx), small(), COST, config=cfg, arrivals=arr[idx])
        rep = m.replicas[r]
        for col in ("hit_tokens", "held_tokens", "evicted_tokens", "preemptions", "recomputed_tokens",
                    "prompt_tokens", "output_tokens"):
            np.testing.assert_array_equal(rep[col], solo[col], err_msg=col)
        for col in ("admit_s", "first_token_s", "finish_s", "ttft_s", "e2e_s"):
            np.testing.assert_allclose(rep[col], solo[col], rtol=1e-9, atol=1e-9, err_msg=col)
            np.testing.assert_allclose(m.aggregate[col][idx], solo[col], rtol=1e-9, atol=1e-9, err_msg=col)
        preempted += int(solo["preemptions"].sum())
    assert preempted > 0  # the oracle covers preemption too


@pytest.mark.parametrize("engine", sorted(POLICIES))
def test_aggregate_pool_shares_are_the_replicas_busy_weighted_means(engine):
    # each replica's pool shares are means over ITS busy time; the aggregate's are over all
    # replicas' pools, so they are the busy-time-weighted means of the replicas' (equal
    # pools), and the peak fragmentation share is the largest replica's. Oracle: each
    # replica replayed alone on its requests (round-robin reads no state). Before the fix
    # the aggregate divided by the union of busy times (a replica idle while another ran
    # counted as an empty pool), giving means below every replica's.
    from radixkv.replay.routing import take

    t = _busy_trace()
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8)
    arr = np.asarray(t.arrival_s) - t.arrival_s[0]
    small = {"vllm": lambda: BlockHashCache(32, 4), "sglang": lambda: RadixCache(120, 1)}[engine]
    m = replay_multi_concurrent(t, [small() for _ in range(3)], COST, "round-robin", config=cfg, arrivals=arr)
    solos = []
    for r in range(3):
        idx = np.flatnonzero(m.replica == r)
        solos.append(replay_concurrent(take(t, idx), small(), COST, config=cfg, arrivals=arr[idx]))
    busy = np.asarray([s.busy_s for s in solos])
    agg = m.aggregate.summary()
    assert busy.sum() > m.aggregate.busy_s  # the replicas overlap: the union is shorter
    for key in ("pool_cached_share_mean", "pool_used_share_mean", "internal_fragmentation_share_mean"):
        vals = np.asarray([s.summary()[key] for s in solos])
        want = float(np.sum(vals * busy) / busy.sum())
        assert agg[key] == pytest.approx(want, rel=1e-9), key
        assert vals.min() - 1e-12 <= agg[key] <= vals.max() + 1e-12, key
    peak = max(s.summary()["internal_fragmentation_share_peak"] for s in solos)
    assert agg["internal_fragmentation_share_peak"] == pytest.approx(peak, rel=1e-12)
