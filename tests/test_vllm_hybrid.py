"""HybridBlockHashCache (vLLM 0.33 hybrid KV cache manager): goldens from vLLM's own
``KVCacheManager`` with full + sliding-window groups, hand-worked rules, the contract kit.

Goldens: tests/data/golden/vllm_hybrid/ (tools/engines/vllm_hybrid_replay.py --all).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from _golden_traces import mooncake_trace, native_trace
from conftest import GOLDEN_LOCAL, shared_path
from radixkv.errors import ConfigError
from radixkv.policies.check import CHECKS, check_policy
from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.policies.vllm_hybrid import HybridBlockHashCache, parse_groups
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import KVSeq

HYB = GOLDEN_LOCAL / "vllm_hybrid"
MANIFEST = [json.loads(line) for line in (HYB / "manifest.jsonl").read_text().splitlines() if line]


def _windows(groups: str) -> tuple:
    parts = groups.split(",")
    if parts[0] == "full":  # the default place of the full-attention group
        parts = parts[1:]
    return tuple(g if g in ("mamba", "full") else int(g[4:]) for g in parts)


@pytest.mark.parametrize("run", MANIFEST, ids=[m["name"] for m in MANIFEST])
def test_golden_runs_match_vllm(run):
    gold = [json.loads(line) for line in (HYB / f"{run['name']}.jsonl").read_text().splitlines() if line]
    assert run["coordinator"] == "HybridKVCacheCoordinator"
    trace = native_trace(GOLDEN_LOCAL / "traces" / run["trace"])
    opt = "window=" + "+".join(map(str, _windows(run["groups"])))
    if run.get("max_num_batched_tokens"):
        opt += f"/max_num_batched_tokens={run['max_num_batched_tokens']}"
    spec = parse_policy(f"vllm-hybrid:{run['block_size']}@{opt}")
    pol = build_policy(spec, PoolSpec(num_gpu_blocks=run["num_gpu_blocks"]))
    rec = replay_sequential(trace, pol)
    hits = rec.columns["hit_tokens"].tolist()
    assert [g["id"] for g in gold] == list(trace.req_id)
    bad = [(g["id"], g["hit_tokens"], h) for g, h in zip(gold, hits) if g["hit_tokens"] != h]
    assert bad == []


def test_goldens_exercise_the_sliding_rule():
    # the golden runs are not full-attention runs in disguise: in some requests the
    # sliding group served fewer blocks than the full group held (vLLM's own diagnostics)
    n = 0
    for run in MANIFEST:
        for line in (HYB / f"{run['name']}.jsonl").read_text().splitlines():
            g = json.loads(line)["group_hit_blocks"]
            n += any(x < g[0] for x in g[1:])
    assert n > 0


def test_goldens_exercise_the_mamba_rules():
    # vLLM's own diagnostics in the Mamba (align mode) runs: some requests hit less than
    # the full-attention group held (a shared-prefix junction above the hit), some prefills
    # were split at that junction, and the runs evicted (a full-attention pool this small
    # cannot hold the trace: hits well below the roomy run's)
    mamba = [m for m in MANIFEST if "mamba" in m["groups"]]
    assert len(mamba) >= 2 and all("MambaManager" in m["managers"] for m in mamba)
    junction = split = 0
    for run in mamba:
        assert run["errors"] == 0
        for line in (HYB / f"{run['name']}.jsonl").read_text().splitlines():
            g = json.loads(line)
            junction += g["shared_prefix_boundary"] > g["hit_tokens"]
            split += g["shared_prefix_boundary"] in (g["hit_tokens"] + c for c in g["chunks"][:1])
    assert junction > 0 and split > 0
    by = {m["name"]: m["hit_tokens"] for m in mamba}
    assert by["vllm_hybrid_mixed200_b16_n120_full_mamba"] < by["vllm_hybrid_mixed200_b16_n240_full_mamba"]


def _seq(segs, ends, prompt_len, kv_len):
    return KVSeq(index=0, prompt_len=prompt_len, kv_len=kv_len, seg_id=np.array(segs, dtype=np.int64),
                 seg_end=np.array(ends, dtype=np.int64))


def test_mamba_align_mode_by_hand():
    # B = 4, full + one Mamba group, a pool that evicts nothing. A Mamba group keeps one
    # state per block boundary a step ended on (MambaManager, align mode); the scheduler
    # ends prefill chunks at (P − 1) // B × B and at the shared-prefix junction.
    pol = HybridBlockHashCache(64, 4, windows=("mamba",))
    # A: 16 prompt tokens, 1 output. Chunks [12, 4] (last cacheable boundary 15 // 4 × 4 = 12):
    # states cached at 12 and 16; the full group caches blocks 0 … 3
    assert pol.mamba_chunk(0, 16, 16) == 12 and pol.mamba_chunk(12, 4, 16) == 4
    assert pol.run_request(0, _seq([1, 2], [8, 16], 16, 16)).hit_tokens == 0
    # B shares A's first 8 tokens: the full group holds 2 blocks but no state sits at 8 ->
    # hit 0, junction 8; its prefill stops there ([8, 4, 4]) and caches the state at 8
    assert pol.peek_hit(_seq([1, 3], [8, 16], 16, 16)) == 0
    assert pol._lookup(_seq([1, 3], [8, 16], 16, 16), None)[5] == 8
    assert [pol.mamba_chunk(0, 16, 16, 8), pol.mamba_chunk(8, 8, 16, 8), pol.mamba_chunk(12, 4, 16, 8)] == [8, 4, 4]
    assert pol.run_request(1, _seq([1, 3], [8, 16], 16, 16)).hit_tokens == 0
    # C shares the same 8 tokens: now the state at 8 is there
    assert pol.run_request(2, _seq([1, 4], [8, 16], 16, 16)).hit_tokens == 8
    # A again: capped at 15 tokens -> the full group's 3 blocks, the state at 12
    assert pol.run_request(3, _seq([1, 2], [8, 16], 16, 16)).hit_tokens == 12
    gm = pol.group_metrics()
    # a full-attention model would also have hit B's 8 tokens
    assert (gm["hit_tokens"], gm["full_attention_hit_tokens"], gm["hybrid_loss_tokens"]) == (20, 28, 8)
    assert [g["kind"] for g in gm["groups"]] == ["full_attention", "mamba"]
    assert gm["groups"][1]["hit_tokens"] == 20


def test_group_order_full_last():
    # vLLM numbers groups by first layer (Qwen3-Next: 3 Mamba groups, then full attention);
    # the lookup still starts with full attention, allocation and frees go in group order
    pol = HybridBlockHashCache(64, 4, windows=("mamba", "full"))
    assert pol.group_window == ("mamba", None) and pol._full_gid == 1
    seq = _seq([1], [13], 8, 13)
    pol.admit(0, seq, _chunk=8)  # first chunk of 4 tokens: Mamba group 0 takes block 1, full 2
    assert pol.block_table(0, 0).tolist() == [1] and pol.block_table(0, 1).tolist() == [2]
    gm = pol.group_metrics()
    assert [g["kind"] for g in gm["groups"]] == ["mamba", "full_attention"]


def test_mamba_frees_all_but_the_last_states():
    # B = 4, prompt 8, 6 output tokens (KV extent 13). Chunks [4, 4] (boundary 7 // 4 × 4 = 4).
    # Free queue 1 … 15: step 1 takes 1 (full) and 2 (state at 4); step 2: nothing skipped
    # yet ((4 − 1) // 4 = 0), takes 3 (full) and 4 (state at 8, after no null).
    pol = HybridBlockHashCache(16, 4, windows=("mamba",))
    seq = _seq([1], [13], 8, 13)
    pol.admit(0, seq, _chunk=8)
    assert pol.block_table(0, 1).tolist() == [2]
    assert pol.extend(0, 4)
    assert pol.block_table(0, 0).tolist() == [1, 3] and pol.block_table(0, 1).tolist() == [2, 4]
    # decode at 8 computed: (8 − 1) // 4 = 1 -> state block 2 freed (keyed: free-queue tail);
    # 9 tokens need 3 blocks: the full group takes 5, the Mamba group 6
    assert pol.extend(0, 1)
    assert pol.block_table(0, 1).tolist() == [0, 4, 6] and pol.free_queue().tolist()[-1] == 2
    for _ in range(4):  # computed 9 … 12: at 12, 9 … 12 → (12 − 1) // 4 = 2: state 4 freed
        assert pol.extend(0, 1)
    assert pol.block_table(0, 1).tolist() == [0, 0, 6, 8]
    with pytest.raises(ConfigError):
        HybridBlockHashCache(16, 16, windows=("mamba",), max_num_batched_tokens=8)


def test_no_eviction_equals_full_attention_golden():
    # nothing evicted: every group caches every block, so the hybrid hits what vLLM's
    # full-attention manager hit (the shared golden vllm_mixed200_b16_n100000, vLLM 0.33)
    gold = [json.loads(line) for line in
            (GOLDEN_LOCAL / "vllm" / "vllm_mixed200_b16_n100000.jsonl").read_text().splitlines() if line]
    pol = HybridBlockHashCache(200_000, 16, windows=(64,))
    rec = replay_sequential(native_trace(GOLDEN_LOCAL / "traces" / "mixed200.jsonl"), pol)
    assert rec.columns["hit_tokens"].tolist() == [g["hit_tokens"] for g in gold]
    gm = pol.group_metrics()
    assert gm["hybrid_loss_tokens"] == 0 and gm["hit_tokens"] == sum(g["hit_tokens"] for g in gold)


def test_sliding_hit_rule_by_hand():
    # B = 4, window 9: need = ceil(8 / 4) = 2 contiguous blocks before the hit point
    # (SlidingWindowManager._contiguous_blocks_for_hit). Keys of 6 blocks; the full group
    # holds all 6, the sliding group blocks {0, 1, 3, 4}.
    pol = HybridBlockHashCache(64, 4, windows=(9,))
    keys = list(range(100, 106))
    for j, k in enumerate(keys):
        for g in ((0, 1) if j in (0, 1, 3, 4) else (0,)):
            b, _ = pol._take(1)
            pol._key[b[0]] = (g, k)
            pol._cached[(g, k)] = {b[0]: None}
    # cap 5 blocks: scan 4 (hit, run 1), 3 (hit, run 2) -> hit ends at block 5
    hit, lists, full, _ = pol._find(keys, 5 * 4)
    assert (hit, full) == (20, 20)
    assert [b != 0 for b in lists[1]] == [False, False, False, True, True]
    # cap 6 blocks: 5 misses, then 4, 3 -> same
    assert pol._find(keys, 6 * 4)[0] == 20
    # cap 3 blocks: 2 misses (run 0), 1 and 0 hit but the run reaches the start -> 2 blocks
    assert pol._find(keys, 3 * 4)[0] == 8
    # window 13: need 3: no run of 3 -> the run at the start, blocks 0 and 1
    pol3 = HybridBlockHashCache(64, 4, windows=(13,))
    pol3._key, pol3._cached, pol3._free = pol._key, pol._cached, pol._free
    assert pol3._find(keys, 6 * 4)[0] == 8


def test_window_frees_blocks_during_decode_and_finish_order():
    # B = 4, window 5 (need 1). Prompt 8 tokens (2 blocks), 6 output tokens: KV extent 13.
    # Free queue at start: 1 … 15. Admission takes 1, 2 (full) and 3, 4 (sliding).
    pol = HybridBlockHashCache(16, 4, windows=(5,))
    seq = KVSeq(index=0, prompt_len=8, kv_len=13, seg_id=np.array([1], dtype=np.int64),
                seg_end=np.array([13], dtype=np.int64))
    assert pol.admit(0, seq).hit_tokens == 0
    assert pol.block_table(0, 0).tolist() == [1, 2] and pol.block_table(0, 1).tolist() == [3, 4]
    # step at 8 computed: skipped = (8 − 5 + 1) // 4 = 1 block -> block 3 freed (hashed: tail)
    assert pol.extend(0, 1)
    assert pol.block_table(0, 1).tolist() == [0, 4, 6] and pol.block_table(0, 0).tolist() == [1, 2, 5]
    assert pol.free_queue().tolist()[-1] == 3
    for _ in range(4):  # computed 9 … 12
        assert pol.extend(0, 1)
    # at 12 computed: skipped (12 − 4) // 4 = 2 blocks -> block 4 freed too; 13 tokens: 4 blocks
    assert pol.block_table(0, 1).tolist() == [0, 0, 6, 8]
    pol.finish(0)
    q = pol.free_queue().tolist()
    # unhashed partial blocks (7: full group's 4th, 8: sliding's 4th... ) go to the head;
    # hashed ones to the tail: freed sliding 3 then 4, then full 5, 2, 1, then sliding 6
    assert q[-6:] == [3, 4, 5, 2, 1, 6]
    assert set(q[:2]) == {7, 8}


def test_parse_and_pool_terms():
    assert parse_groups("window=64") == (64,)
    assert parse_groups("window=1024x3+64") == (1024, 1024, 1024, 64)
    assert HybridBlockHashCache.format_option((1024, 1024, 64)) == "window=1024x2+64"
    assert parse_groups("mambax3") == ("mamba",) * 3 and parse_groups("window=64+mamba") == (64, "mamba")
    assert HybridBlockHashCache.format_option(("mamba",) * 3) == "mambax3"
    assert parse_policy("vllm-hybrid:16@mambax3").label == "vllm-hybrid:16@mambax3"
    assert parse_groups("mambax3+full") == ("mamba",) * 3 + ("full",)
    assert parse_policy("vllm-hybrid:16@window=1024x6+full").label == "vllm-hybrid:16@window=1024x6+full"
    for bad in ("full", "mamba+full+full", "fullx2+mamba"):
        with pytest.raises(ConfigError):
            parse_groups(bad)
    for bad in ("64", "window=", "window=1", "window=ax2"):
        with pytest.raises(ConfigError):
            parse_groups(bad)
    spec = parse_policy("vllm-hybrid:16@window=64")
    assert spec.label == "vllm-hybrid:16@window=64"
    s2 = parse_policy("vllm-hybrid:16@window=1024x6/max_num_batched_tokens=8192")
    assert s2.label == "vllm-hybrid:16@window=1024x6/max_num_batched_tokens=8192"
    pol = build_policy(s2, PoolSpec(num_gpu_blocks=1000))
    # admission cap of a sliding group: ceil((1024 − 1 + 8192) / 16) + 1 = 576 + 1 blocks
    assert pol.windows == (1024,) * 6 and pol._cap == (None,) + (577,) * 6
    for bad in ("window=64/chunk=8", "window=64/max_num_batched_tokens=0"):
        with pytest.raises(ConfigError):
            parse_policy(f"vllm-hybrid:16@{bad}")
    # equal GPU memory as a full-attention pool of 1,600 tokens: 2 groups -> 2 × 100 block ids
    pol = build_policy(spec, PoolSpec(capacity_tokens=1600))
    assert pol.num_gpu_blocks == 201
    assert build_policy(spec, PoolSpec(num_gpu_blocks=77)).num_gpu_blocks == 77


#: kit checks a Mamba group breaks by design: admit()/extend() are single allocate_slots
#: steps, and a state is cached only where a step ends on a block boundary, so a prompt
#: admitted whole in one step leaves no state before its end (repeats_hit, chunked_admit:
#: run_request and vLLM's scheduler split the prefill, mamba_chunk); an extend frees the
#: states before its first token before it checks the free queue, as allocate_slots does
#: (refusal_changes_nothing, several_running)
MAMBA_BY_DESIGN = {"repeats_hit", "chunked_admit", "refusal_changes_nothing", "several_running"}


@pytest.mark.parametrize("windows", [(9,), (5, 17), (9, "mamba")])
def test_contract_kit(windows):
    # every check but run_request_equivalent: run_request decodes one allocate_slots step
    # per token, as vLLM's scheduler does, and a sliding group frees out-of-window blocks
    # at each step, so it differs by design from one extend() of all decode tokens
    skip = {"run_request_equivalent"} | (MAMBA_BY_DESIGN if "mamba" in windows else set())
    checks = [c.name for c in CHECKS if c.name not in skip]
    check_policy(lambda cap: HybridBlockHashCache.from_capacity_tokens(max(cap, 16), 4, windows=windows),
                 checks=checks)


def test_run_request_steps_one_token_at_a_time():
    # the difference the kit's run_request_equivalent would flag, shown by hand: B = 4,
    # window 5, prompt 8, KV extent 13 (see the decode test above). One extend(5) frees
    # only block 3 (skipped at 8 computed) and takes 2 blocks per group at once; stepping
    # frees 3, then 4 at 12 computed, so the tail of the free queue differs.
    seq = KVSeq(index=0, prompt_len=8, kv_len=13, seg_id=np.array([1], dtype=np.int64),
                seg_end=np.array([13], dtype=np.int64))
    a = HybridBlockHashCache(16, 4, windows=(5,))
    a.run_request(0, seq)
    b = HybridBlockHashCache(16, 4, windows=(5,))
    b.admit(0, seq)
    b.extend(0, 5)
    assert b.block_table(0, 1).tolist() == [0, 4, 7, 8]  # group 0 took 5, 6 first
    b.finish(0)
    assert a.free_queue().tolist()[-6:] == [3, 4, 5, 2, 1, 6]
    assert b.free_queue().tolist()[-6:] == [3, 5, 2, 1, 7, 4]


SHARED_RUNS = [json.loads(line) for line in (HYB / "shared" / "manifest.jsonl").read_text().splitlines() if line]


@pytest.mark.parametrize("run", SHARED_RUNS, ids=[m["name"] for m in SHARED_RUNS])
def test_mooncake_golden(run):
    # 300 Mooncake requests (4.27 M prompt tokens): 20–40 s each, so only with RADIXKV_SLOW=1
    if os.environ.get("RADIXKV_SLOW") != "1":
        pytest.skip("the Mooncake hybrid goldens replay only with RADIXKV_SLOW=1")
    shared = shared_path("traces")
    gold = [json.loads(line) for line in (HYB / "shared" / f"{run['name']}.jsonl").read_text().splitlines() if line]
    trace = mooncake_trace(shared / "mooncake-fast25" / "conversation_trace.jsonl", limit=run["limit"])
    pol = HybridBlockHashCache(run["num_gpu_blocks"], run["block_size"], windows=_windows(run["groups"]),
                               max_num_batched_tokens=run.get("max_num_batched_tokens"))
    hits = replay_sequential(trace, pol).columns["hit_tokens"].tolist()
    assert [(g["id"], g["hit_tokens"]) for g in gold] == list(zip(trace.req_id, hits))


def test_summary_reports_groups_and_null_for_one_group_policies():
    from radixkv.replay.run import run_replay

    trace = native_trace(GOLDEN_LOCAL / "traces" / "mixed200.jsonl")
    _, s1 = run_replay(trace, parse_policy("vllm:16"), PoolSpec(num_gpu_blocks=120))
    assert s1["kv_cache_groups"] is None  # one group: not modelled, null (never 0)
    run = next(m for m in MANIFEST if m["name"] == "vllm_hybrid_mixed200_b16_n240_full_swa-64")
    _, s2 = run_replay(trace, parse_policy("vllm-hybrid:16@window=64"), PoolSpec(num_gpu_blocks=240))
    g = s2["kv_cache_groups"]
    assert s2["hit_tokens"] == g["hit_tokens"] == run["hit_tokens"]  # vLLM's own total
    assert [x["kind"] for x in g["groups"]] == ["full_attention", "sliding_attention"]
    # the full group alone held at least the hit; the loss is their difference
    assert g["full_attention_hit_tokens"] - g["hit_tokens"] == g["hybrid_loss_tokens"] >= 0
    # vLLM's diagnostics: blocks the full group served in this run (group_hit_blocks[0])
    gold = [json.loads(line) for line in (HYB / f"{run['name']}.jsonl").read_text().splitlines() if line]
    assert g["groups"][0]["hit_tokens"] == 16 * sum(x["group_hit_blocks"][0] for x in gold)
    assert g["groups"][1]["hit_tokens"] == 16 * sum(x["group_hit_blocks"][1] for x in gold)


def test_concurrent_summary_reports_groups_and_refuses_mamba(tmp_path, capsys):
    from radixkv.cli import main

    trace = str(GOLDEN_LOCAL / "traces" / "edge300.jsonl")
    base = ["replay", trace, "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "H100-80GB",
            "--num-gpu-blocks", "200", "--no-timing"]
    out = tmp_path / "c.json"
    assert main(base + ["--policy", "vllm-hybrid:16@window=64", "--json", str(out)]) == 0
    s = json.loads(out.read_text())["results"][0]["summary"]
    g = s["kv_cache_groups"]
    assert [x["kind"] for x in g["groups"]] == ["full_attention", "sliding_attention"]
    # every admission's hit is counted there, first admissions in the summary: no fewer
    assert g["hit_tokens"] >= s["hit_tokens"] and g["full_attention_hit_tokens"] >= g["hit_tokens"]
    assert main(base + ["--policy", "vllm:16", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["results"][0]["summary"]["kv_cache_groups"] is None
    # Mamba groups: vLLM's scheduler clips prefill chunks in align mode; the concurrent
    # scheduler does not, so the replay is refused rather than wrong
    assert main(base + ["--policy", "vllm-hybrid:16@mamba"]) != 0
    assert "sequential replay only" in capsys.readouterr().err


def test_request_too_large_names_the_groups():
    """A 100-token prompt at block 16 needs ceil(100/16) = 7 blocks in each of 2 groups
    (full + sliding, no chunking): 14 blocks against a 10-block pool, 9 of them usable
    (vLLM's BlockPool keeps block 0 as the null block). The error counts blocks over the
    groups, not tokens of one pool."""
    from radixkv.trace.types import Trace

    spec = parse_policy("vllm-hybrid:16@window=32")
    pol = build_policy(spec, PoolSpec(num_gpu_blocks=10))
    tr = Trace.from_requests(req_id=["r0"], arrival_s=[0.0], prompt_len=[100], output_len=[0],
                             prompt_ids=[list(range(100))], name="t")
    assert pol.fits_alone(tr.kv_seq(0)) == (14 - 9) * 16
    with pytest.raises(ConfigError) as e:
        replay_sequential(tr, pol)
    msg = str(e.value)
    assert "14 blocks of 16 tokens across its 2 KV cache groups" in msg
    assert "pool has 9 blocks" in msg and "--max-num-batched-tokens" in msg
