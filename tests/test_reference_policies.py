"""The readable reference policies of tests/ are PrefixCaches: they pass the conformance
kit, agree with the built-ins call by call with several requests running, and replay from
the command line as ``module:Class`` with the real engines' hits."""
from __future__ import annotations

import json
import random

import pytest

from conftest import DATA
from radixkv import check_policy
from radixkv.cli import main
from radixkv.policies.check import _traces
from radixkv.policies.radix import RadixCache
from reference_sglang import ReferenceSGLang

MIXED = str(DATA / "golden" / "traces" / "mixed200.jsonl")


def _golden(engine, name):
    return [json.loads(x)["hit_tokens"] for x in (DATA / "golden" / engine / f"{name}.jsonl").read_text().splitlines() if x]


def test_reference_sglang_passes_the_kit():
    # page 4 (page 1 is covered call by call against RadixCache below)
    assert check_policy(lambda cap: ReferenceSGLang.from_capacity_tokens(cap, 4),
                        capacities=(64, 256, 4096)) == []


@pytest.mark.parametrize("seed", range(12))
def test_reference_sglang_equals_radix_cache_with_several_running(seed):
    """Random admits (whole or a first chunk), extends (chunks, decode), finishes and
    preemptions: the same admissions, extensions and pool after every call."""
    rng = random.Random(seed)
    tr = _traces(seed)[seed % 3]
    p = rng.choice([1, 2, 4])
    cap = rng.choice([64, 128, 256, 4096]) // p * p
    a, b = RadixCache(cap, p), ReferenceSGLang(cap, p)
    running, nxt = {}, 0
    for _ in range(150):
        op = rng.choice(["admit", "admit", "extend", "extend", "finish", "preempt"])
        if op == "admit" or not running:
            s = tr.kv_seq(rng.randrange(len(tr)))
            if a.fits_alone(s):
                continue
            n = rng.choice([None, rng.randint(1, s.prompt_len)])
            ra, rb = a.admit(nxt, s, n), b.admit(nxt, s, n)
            assert (ra is None) == (rb is None)
            if ra is not None:
                assert (ra.hit_tokens, ra.held_tokens, ra.evicted_tokens) == (rb.hit_tokens, rb.held_tokens,
                                                                              rb.evicted_tokens)
                running[nxt] = [s, max(n or s.prompt_len, ra.hit_tokens)]
            nxt += 1
        else:
            rid = rng.choice(sorted(running))
            s, t = running[rid]
            if op == "extend":
                if t < s.kv_len:
                    k = rng.randint(1, s.kv_len - t)
                    ok = a.extend(rid, k)
                    assert ok == b.extend(rid, k)
                    running[rid][1] += k if ok else 0
            elif op == "preempt" or t >= s.prompt_len:
                getattr(a, op)(rid)
                getattr(b, op)(rid)
                del running[rid]
        sa, sb = a.stats(), b.stats()
        assert (sa.used_slots, sa.cached_slots, sa.free_slots, sa.valid_tokens, sa.cached_tokens) == (
            sb.used_slots, sb.cached_slots, sb.free_slots, sb.valid_tokens, sb.cached_tokens)


@pytest.mark.parametrize("policy, pool, engine, golden", [
    ("reference_sglang:ReferenceSGLang:1", ["--max-total-num-tokens", "1904"], "sglang", "sglang_mixed200_p1_c1904"),
    ("reference_vllm:ReferenceVLLM:16", ["--num-gpu-blocks", "120"], "vllm", "vllm_mixed200_b16_n120"),
])
def test_reference_policies_replay_as_module_class(tmp_path, capsys, policy, pool, engine, golden):
    out = tmp_path / "r.csv"
    assert main(["replay", MIXED, "--policy", policy, "--per-request", str(out), "--quiet"] + pool) == 0
    hits = [int(line.split(",")[2]) for line in out.read_text().splitlines()[1:]]
    assert hits == _golden(engine, golden)  # the real engine's hits, request by request


def test_reference_vllm_replays_concurrently_like_the_builtin(tmp_path, capsys):
    """``--mode concurrent`` with a module:Class policy: the scheduler reads its class's
    admission_rule, and the readable model gives vllm:16's replay, request by request."""
    common = ["--capacity-tokens", "4000", "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
              "--arrival", "poisson", "--request-rate", "50", "--limit", "120", "--quiet"]
    csv = {}
    for pol in ("reference_vllm:ReferenceVLLM:16", "vllm:16"):
        csv[pol] = tmp_path / f"{pol.replace(':', '_')}.csv"
        assert main(["replay", MIXED, "--policy", pol, "--per-request", str(csv[pol])] + common) == 0
    assert csv["reference_vllm:ReferenceVLLM:16"].read_text() == csv["vllm:16"].read_text()


class _RadixInsertAtAdmit(RadixCache):
    """RadixCache without SGLang's batch visibility (inserts at admit/extend, as the
    reference does); the SGLang scheduler then drives both through the same calls."""

    batch_visibility = False


def test_reference_sglang_replays_concurrently_like_the_builtin():
    import radixkv
    from radixkv.replay.arrivals import arrival_times

    trace = radixkv.load_trace(MIXED).head(120)
    arr = arrival_times(trace, arrival="poisson", request_rate=50.0, seed=0)
    res = [radixkv.replay(trace, pol, mode="concurrent", model="Llama-3.1-8B", gpu="A100-80GB", arrivals=arr)
           for pol in (ReferenceSGLang(4000, 1), _RadixInsertAtAdmit(4000, 1))]
    assert res[0].meta["admission"] == res[1].meta["admission"] == "sglang"
    for col in ("hit_tokens", "held_tokens", "preemptions", "admit_s", "finish_s"):
        assert res[0][col].tolist() == res[1][col].tolist(), col
