"""Compiled or interpreted kernels (radixkv.replay.jit): same results, and the cold-cache rule.

Expected hits come from the real engines' golden files; the interpreted and compiled
replays must agree on every summary metric, not only hits.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GOLDEN_LOCAL
from radixkv.errors import ConfigError
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay import jit
from radixkv.replay.run import run_replay
from radixkv.trace.load import load_trace

ROOT = Path(__file__).parents[1]


def _reset_jit():
    for fam in list(jit.FAMILY_MODULES):
        jit.use_compiled(fam)
    jit._decided.clear()
    jit._interp_tokens.clear()
    jit._prepaid.clear()


@pytest.fixture
def restore_jit():
    # before too: replays run by earlier tests in this process leave their decisions behind
    _reset_jit()
    yield
    _reset_jit()


@pytest.mark.parametrize("policy, pool", [("vllm:16", PoolSpec(num_gpu_blocks=120)),
                                          ("sglang:16", PoolSpec(max_total_num_tokens=1904)),
                                          ("static:16", PoolSpec(capacity_tokens=3000))])
def test_interpreted_and_compiled_summaries_are_equal(monkeypatch, restore_jit, policy, pool):
    trace = load_trace(GOLDEN_LOCAL / "traces" / "mixed200.jsonl")
    spec = parse_policy(policy)
    out = {}
    for m in ("compile", "interpret"):
        monkeypatch.setenv("RADIXKV_JIT", m)
        jit._decided.clear()
        _, s = run_replay(trace, spec, pool)
        out[m] = s.pop("timing_s")["kernels"], s
    assert out["compile"][0] == "compiled" and out["interpret"][0] == "interpreted"
    assert out["compile"][1] == out["interpret"][1]
    assert out["compile"][1]["evicted_tokens"] > 0  # the pool is tight: eviction order matters


def test_bad_mode_is_an_input_error(monkeypatch):
    monkeypatch.setenv("RADIXKV_JIT", "fast")
    with pytest.raises(ConfigError, match="RADIXKV_JIT"):
        jit.mode()


def test_cold_cache_small_replay_runs_interpreted_without_compiling(tmp_path):
    # a fresh NUMBA_CACHE_DIR: auto mode must not compile anything for a small replay, and
    # must still give the engine's hits; a budget below the replay's size chooses compiling
    code = """
import json, sys
from numba.core.dispatcher import Dispatcher
from radixkv.policies import _hash_kernels, _radix_kernels
from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay import jit
from radixkv.replay.run import run_replay
from radixkv.trace.load import load_trace
t = load_trace(sys.argv[1])
rec, s = run_replay(t, parse_policy("vllm:16"), PoolSpec(num_gpu_blocks=120))
gold = [json.loads(l)["hit_tokens"] for l in open(sys.argv[2])]
compiles = [n for m in (_hash_kernels, _radix_kernels) for n, d in vars(m).items()
            if isinstance(d, Dispatcher) and d.overloads]  # the cache was empty: loaded = compiled
jit.INTERPRET_MAX_TOKENS = 10
big = jit.plan([(parse_policy("sglang:1"), 11)])
print(json.dumps({"kernels": s["timing_s"]["kernels"], "same": rec["hit_tokens"].tolist() == gold,
                  "compiles": compiles, "big": big}))
"""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), RADIXKV_JIT="auto",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN_LOCAL / "traces" / "mixed200.jsonl"),
                          str(GOLDEN_LOCAL / "vllm" / "vllm_mixed200_b16_n120.jsonl")],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"kernels": "interpreted", "same": True, "compiles": [], "big": {"radix": "compiled"}}


def test_many_small_replays_switch_to_compiled(monkeypatch, restore_jit):
    # interpreted work is bounded: once the replays asked for exceed the budget, compile
    monkeypatch.setenv("RADIXKV_JIT", "auto")
    monkeypatch.setattr(jit, "INTERPRET_MAX_TOKENS", 100)
    monkeypatch.setattr(jit, "is_warm", lambda spec: False)
    spec = parse_policy("vllm:16")
    assert jit.before_replay(spec, 60) == "interpreted"
    assert jit.is_interpreted("hash")
    assert jit.before_replay(spec, 30) == "interpreted"  # 90 ≤ 100
    assert jit.before_replay(spec, 30) == "compiled"  # 120 > 100
    assert not jit.is_interpreted("hash")


def test_planned_work_is_not_counted_twice(monkeypatch, restore_jit):
    monkeypatch.setenv("RADIXKV_JIT", "auto")
    monkeypatch.setattr(jit, "INTERPRET_MAX_TOKENS", 100)
    monkeypatch.setattr(jit, "is_warm", lambda spec: False)
    spec = parse_policy("sglang:1")
    assert jit.plan([(spec, 40), (spec, 40)]) == {"radix": "interpreted"}
    assert jit.before_replay(spec, 40) == "interpreted"
    assert jit.before_replay(spec, 40) == "interpreted"  # both were planned: still 80 in all
    assert jit.before_replay(spec, 40) == "compiled"  # 120 > 100


def test_priority_policies_run_with_their_family():
    # an eviction hook's kernels are its family's (its priority function, called by address
    # when compiled, is called from Python by the interpreted twins: tests/test_jit_priority.py)
    assert jit.family_of(parse_policy("vllm:16@lfu")) == "hash"
    assert jit.family_of(parse_policy("sglang:1@lfu")) == "radix"
    assert jit.family_of(parse_policy("vllm:16@lru")) == "hash"


def test_cold_cache_small_jsonl_is_read_by_the_plain_path(tmp_path):
    # the JSONL readers' Numba fast path is skipped on a cold cache for a small file (no
    # compile) and gives the same records as the compiled fast path
    code = """
import json, sys
import numpy as np
from radixkv.trace import _jsonl_fast as J
recs = J.read_records(sys.argv[1], ("tokens", "output_tokens"))
cold = {"compiled": bool(J._parse_uints.overloads), "arrays": any(isinstance(r["tokens"], np.ndarray) for _, r in recs)}
J.warmup()
fast = J.read_records(sys.argv[1], ("tokens", "output_tokens"))
same = [(ln, {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}) for ln, r in recs] == \\
       [(ln, {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}) for ln, r in fast]
print(json.dumps({**cold, "same": same, "fast_arrays": all(isinstance(r["tokens"], np.ndarray) for _, r in fast)}))
"""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), RADIXKV_JIT="auto",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN_LOCAL / "traces" / "mixed200.jsonl")],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"compiled": False, "arrays": False, "same": True, "fast_arrays": True}


@pytest.mark.parametrize("policy", ["vllm:16", "sglang:1"])
def test_interpreted_kernels_do_not_warn_on_uint64_wraparound(monkeypatch, restore_jit, policy):
    # the hash kernels wrap uint64 modulo 2**64 on purpose; run as plain Python (the cold-cache
    # path of every small replay) numpy scalars used to print "RuntimeWarning: overflow
    # encountered in scalar multiply" to the user (replay --miss-causes on the README demo).
    # Hand-worked: r0 = 40 new tokens; r1 = the same 40 + 8 new, pool ample.
    # vllm:16 -> r1 hits 2 full blocks = 32 (the 40-token prefix ends mid-block);
    # sglang:1 -> r1 hits all 40. Everything else r1 misses is first seen (compulsory).
    import warnings

    from radixkv.replay.misses import MISS_COLUMNS
    from radixkv.trace.types import Trace

    a = list(range(1000, 1040))
    t = Trace.from_requests(req_id=["r0", "r1"], arrival_s=[0.0, 1.0], prompt_len=[40, 48],
                            output_len=[0, 0], prompt_ids=[a, a + list(range(5000, 5008))],
                            output_ids=[[], []])
    monkeypatch.setenv("RADIXKV_JIT", "interpret")
    jit._decided.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rec, s = run_replay(t, parse_policy(policy), PoolSpec(capacity_tokens=4096), miss_causes=True)
    assert s["timing_s"]["kernels"] == "interpreted"
    hit = 32 if policy == "vllm:16" else 40
    assert list(rec["hit_tokens"]) == [0, hit]
    causes = {k: [int(v) for v in rec[k]] for k in MISS_COLUMNS}
    assert causes["miss_compulsory_tokens"] == [40, 8]
    assert causes["miss_alignment_tokens"] == [0, 40 - hit]
    assert causes["miss_capacity_tokens"] == [0, 0]


def test_a_warmed_up_cache_is_warm_in_the_next_process():
    # `radixkv warmup vllm:16 sglang:1` fills Numba's cache; a later process must find it
    # warm (and so replay compiled): vLLM's block pool builds a numba.typed.List, whose
    # constructor Numba compiles in every process and never caches, and that compile
    # made the probe report a cold cache forever. The probe (jit.is_warm) asks for the
    # sequential replay's kernels, which every warm-up scope compiles: the warm-up here
    # compiles only those (the concurrent loops would add ~75 s of CPU to the suite)
    env = dict(os.environ, RADIXKV_JIT="auto", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    specs = '[parse_policy("vllm:16"), parse_policy("sglang:1")]'
    head = "from radixkv.policies.registry import parse_policy\nfrom radixkv.replay import jit, run\n"
    for code in (head + f"for s in {specs}: run.warmup(s, concurrent=False)\n",
                 head + f"print([jit.is_warm(s) for s in {specs}])\n"):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900,
                             cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[True, True]"


def test_a_compile_is_announced_on_stderr(capsys):
    """Issue 32: a compile names what compiles and why, and how long it took; kernels
    already compiled print nothing."""
    import re

    import numba

    from radixkv.numba_cache import compile_notice

    def twice(x):
        return 2 * x

    twice.__module__ = "radixkv._probe"  # a radixkv kernel (others' compiles are not shown)
    kern = numba.njit(twice)
    with compile_notice("probe:1", "a test"):
        assert kern(21) == 42
    err = capsys.readouterr().err
    assert "radixkv: compiling the kernels of probe:1 (a test)" in err
    assert re.search(r"radixkv: compiled 1 kernel of probe:1 in \d+\.\d s", err), err
    with compile_notice("probe:1", "a test"):
        assert kern(4) == 8  # compiled already: silent
    assert capsys.readouterr().err == ""


def test_a_priority_policy_runs_as_its_family_runs(monkeypatch, restore_jit):
    # the trial's crash: on a cold cache, compare --policies vllm:16,vllm:16@lfu interpreted the
    # small vllm:16 replay, which rebound _hash_kernels' names to plain Python functions, and the
    # priority kernels (then compiled only) failed to type them ("Untyped global name"). The
    # priority kernels now belong to the family: interpreted with it, compiled with it
    monkeypatch.setenv("RADIXKV_JIT", "interpret")
    for base, prio in (("vllm:16", "vllm:16@lfu"), ("sglang:1", "sglang:1@lfu")):
        fam = jit.family_of(parse_policy(base))
        jit._decided.clear()
        assert jit.plan([(parse_policy(base), 100)]) == {fam: "interpreted"} and jit.is_interpreted(fam)
        assert jit.before_replay(parse_policy(prio), 100) == "interpreted" and jit.is_interpreted(fam)
        jit.use_compiled(fam)
        jit._decided.clear()
        assert jit.plan([(parse_policy(base), 100), (parse_policy(prio), 100)]) == {fam: "interpreted"}
        assert jit.is_interpreted(fam)
        jit.use_compiled(fam)
        jit._decided.clear()