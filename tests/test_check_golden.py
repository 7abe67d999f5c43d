"""The real engines' golden replays as ``radixkv check`` configurations.

tests/data/golden/check.toml asserts, for every local golden run (vLLM 0.33.0 and SGLang
0.5.23 on the token traces), that each request's hit tokens equal the engine's;
check_shared.toml does the same for the Mooncake and WEKA runs under ``$RADIXKV_SHARED``.
test_radix_golden.py keeps SGLang's per-request ``evicted_tokens`` and ``cached_after``
checks in pytest (a check assertion compares hits only).
"""
from __future__ import annotations

import json
import os

from conftest import GOLDEN_LOCAL, shared_path
from radixkv.check.config import load_config
from radixkv.check.run import run_check
from radixkv.cli import main


def _runs(root, engine):
    man = root / engine / "manifest.jsonl"
    return [json.loads(line)["name"] for line in man.read_text().splitlines() if line]


def test_local_goldens_hold(capsys):
    assert main(["check", str(GOLDEN_LOCAL / "check.toml")]) == 0
    out = capsys.readouterr().out
    assert "12 of 12 assertions hold" in out


def test_local_config_covers_every_local_golden_run():
    cfg = load_config(GOLDEN_LOCAL / "check.toml")
    covered = {a.golden.stem for a in cfg.assertions if a.kind == "golden"}
    local = {n for e in ("vllm", "sglang") for n in _runs(GOLDEN_LOCAL, e) if (GOLDEN_LOCAL / e / f"{n}.jsonl").exists()}
    assert covered == local
    # each golden file is asserted on the pair its manifest names, once
    assert sorted((a.policy, a.golden.stem) for a in cfg.assertions) == sorted((n, n) for n in local)


def test_interpreted_kernels_match_the_engines_too(monkeypatch):
    # the same goldens with the kernels run as plain Python (what a cold cache uses)
    monkeypatch.setenv("RADIXKV_JIT", "interpret")
    from radixkv.replay import jit

    try:
        res = run_check(load_config(GOLDEN_LOCAL / "check.toml"))
    finally:
        for fam in list(jit.FAMILY_MODULES):
            jit.use_compiled(fam)
        jit._decided.clear()
    assert res.ok, [o.line() for o in res.failures]
    assert all(s["timing_s"]["kernels"] == "interpreted" for s in res.summaries.values())


def test_every_shared_golden_run_is_in_a_config():
    root = shared_path("golden")
    shared = {n for e in ("vllm", "sglang") for n in _runs(root, e)}
    os.environ.setdefault("RADIXKV_SHARED", str(root.parent))
    names = {a.golden.stem for c in ("check.toml", "check_shared.toml")
             for a in load_config(GOLDEN_LOCAL / c).assertions}
    assert shared <= names


def test_shared_goldens_hold(capsys):
    shared_path("golden")
    assert main(["check", str(GOLDEN_LOCAL / "check_shared.toml")]) == 0
