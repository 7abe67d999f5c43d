"""Priority policies (``sglang:P@ORDER``, ``vllm:B@ORDER``) under ``RADIXKV_JIT=interpret``:
their kernels run as plain Python with the rest of their family, the priority function
called from Python through ``_priority_fn.priority_at_python`` (the Numba intrinsic
``priority_at`` has no Python form), and give the compiled replay's bytes; a compiled
replay after an interpreted one in the same process works, and no interpreted twin is
left bound in any radixkv module once the family is compiled again.

Expected values: the compiled replay's output (the two paths run the same kernel source;
the compiled one is checked against SGLang/vLLM goldens elsewhere), compared byte for byte.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACE = str(ROOT / "traces" / "demo.jsonl")
POLICIES = ["sglang:1@lfu", "vllm:16@lfu"]


def _cli(jit_mode, *argv):
    env = {**os.environ, "RADIXKV_JIT": jit_mode, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "radixkv", *argv], capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    out.pop("load_s", None)
    for r in out["results"]:
        kernels = r.pop("timing_s").get("kernels")
        # a concurrent replay's timing_s says nothing of the kernels
        assert kernels in (None, "compiled" if jit_mode == "compile" else "interpreted")
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", ["sequential", "concurrent"])
def test_interpreted_replay_gives_the_compiled_bytes(policy, mode):
    argv = ["replay", TRACE, "--policy", policy, "--capacity-tokens", "3000", "--limit", "60", "--json"]
    if mode == "concurrent":
        argv += ["--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "H100-80GB"]
    compiled = _cli("compile", *argv)
    if mode == "sequential":
        assert compiled["results"][0]["summary"]["evictions"] > 0  # the eviction order matters here
    assert _cli("interpret", *argv) == compiled


def test_priority_at_has_a_python_form():
    from radixkv.policies.radix_priority import LFU, F_HITS, F_TIME, _priority_of
    from radixkv.policies._priority_fn import function_addresses, priority_at
    from radixkv.replay import jit

    fn = _priority_of(LFU)
    addrs = function_addresses(fn)
    N = np.zeros((4, 32), dtype=np.int64)
    N[1, F_HITS], N[1, F_TIME] = 7, 42
    pp = np.zeros(4, dtype=np.float64)
    with pytest.raises(NotImplementedError):  # the intrinsic itself: compiled code only
        priority_at(addrs)
    twin = jit._interpreted_module("radixkv.policies._radix_kernels")
    assert twin.priority_at(addrs) is fn
    # SGLang's LFUStrategy: (hit count, last access), by hand
    assert twin.priority_at(addrs)(N, 1, pp) == (7.0, 42.0)


def test_compiled_after_interpreted_in_one_process(monkeypatch):
    from radixkv.policies.registry import parse_policy
    from radixkv.replay import jit
    from radixkv.trace.load import load_trace
    import radixkv

    tr = load_trace(TRACE).head(60)
    for name in ("_decided", "_interp_tokens", "_prepaid"):  # this test's decisions only
        monkeypatch.setattr(jit, name, {})
    monkeypatch.setenv("RADIXKV_JIT", "interpret")
    assert set(jit.plan([(parse_policy(p), 1) for p in POLICIES]).values()) == {"interpreted"}
    first = {p: radixkv.summarize(radixkv.replay(tr, p, capacity_tokens=3000)) for p in POLICIES}
    for p in POLICIES:
        assert jit.is_interpreted(jit.family_of(parse_policy(p)))
    monkeypatch.setenv("RADIXKV_JIT", "compile")
    for p in POLICIES:
        jit.mark_compiled(parse_policy(p))
        assert not jit.is_interpreted(jit.family_of(parse_policy(p)))
    # no interpreted twin is left bound in any radixkv module
    left = [f"{m.__name__}.{a}" for m in list(sys.modules.values())
            if m is not None and getattr(m, "__name__", "").startswith("radixkv.")
            and not m.__name__.endswith("__interpreted")
            for a, v in list(vars(m).items()) if str(getattr(v, "__module__", "")).endswith("__interpreted")]
    assert left == []
    again = {p: radixkv.summarize(radixkv.replay(tr, p, capacity_tokens=3000)) for p in POLICIES}
    drop = ("replay_s", "prompt_tokens_per_s", "compile_s")
    for p in POLICIES:
        assert {k: v for k, v in again[p].items() if k not in drop} == \
            {k: v for k, v in first[p].items() if k not in drop}
