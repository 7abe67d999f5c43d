"""What a warm-up compiles (radixkv.replay.run.warmup; its tiny runs in radixkv.replay.warm):
the lean scope of ``radixkv warmup`` (token-id traces, default settings) leaves out vLLM's
piece-pool loop, unit-keyed pool and batched decode; ``--full`` and a plain ``warmup(spec)``
keep them. Checked on the calls the tiny warm-up run makes (the kernels themselves are not
run here)."""
from __future__ import annotations

import pytest

import radixkv.replay.run as run
import radixkv.replay.warm as warm
from radixkv.policies import block_hash as BH
from radixkv.policies.registry import parse_policy


@pytest.fixture
def calls(monkeypatch):
    got = []
    monkeypatch.setattr(warm, "vllm_loop", lambda *a, **k: got.append(("vllm loop", a, k)))
    monkeypatch.setattr(warm, "sglang_loop", lambda *a, **k: got.append(("sglang loop", a, k)))
    monkeypatch.setattr(BH.BlockHashCache, "warm_kernels", lambda self: got.append(("warm_kernels", type(self).__name__)))
    monkeypatch.setattr(warm, "replay_sequential", lambda *a, **k: None)
    return got


def test_lean_scope_skips_the_piece_pool_and_the_python_loop_kernels(calls):
    warm._tiny_run(parse_policy("vllm:16"), True, True)
    assert calls == [("vllm loop", (16,), {"pieces": False})]


def test_full_scope_warms_everything(calls):
    warm._tiny_run(parse_policy("vllm:16"), True, False)
    assert calls == [("warm_kernels", "BlockHashCache"), ("vllm loop", (16,), {"pieces": True})]


def test_sglang_loop_is_warmed_in_either_scope(calls):
    for lean in (True, False):
        warm._tiny_run(parse_policy("sglang:1"), True, lean)
    assert calls == [("sglang loop", (1,), {})] * 2


def test_sequential_scope_warms_no_loop(calls):
    warm._tiny_run(parse_policy("vllm:16"), False, False)
    assert calls == []


def test_scopes_nest(monkeypatch):
    monkeypatch.setattr(warm, "_WARM", set())
    spec = parse_policy("vllm:16")
    warm._WARM.add((spec, run._scope(True, lean=True)))
    assert run._is_warm(spec, run._scope(False)) and run._is_warm(spec, run._scope(True, True))
    assert not run._is_warm(spec, run._scope(True, False))
    warm._WARM.add((spec, run._scope(True, False)))
    assert run._is_warm(spec, run._scope(True, False))


def _cold_cache():
    from radixkv.numba_cache import ColdCache

    raise ColdCache()  # what a tiny run under without_compiling raises at the first compile


def test_warmup_many_passes_the_scope_to_the_compile_children(monkeypatch):
    seen, argv = [], []
    monkeypatch.setattr(run, "warmup", lambda s, **k: seen.append((s.label, k)) or 0.0)
    monkeypatch.setattr(warm, "_WARM", set())
    monkeypatch.setattr(warm, "_tiny_run", lambda *a: _cold_cache())  # every kernel must compile

    class _P:
        def __init__(self, args, **kw):
            argv.append(args[-3:])

        def poll(self):
            return 0

        def wait(self):
            return 0

    import subprocess

    monkeypatch.setattr(subprocess, "Popen", _P)
    monkeypatch.setattr(run.jit, "mode", lambda: "compile")
    run.warmup_many([parse_policy("vllm:16"), parse_policy("sglang:1")], lean=True)
    assert argv == [["sglang:1", "1", "1"]]  # spec, concurrent, lean
    assert all(k == {"concurrent": True, "lean": True} for _, k in seen) and seen[0][0] == "vllm:16"


@pytest.mark.parametrize("lean", [True, False])
def test_warmup_many_on_a_warm_cache_starts_no_child_process(monkeypatch, lean):
    # a fresh process (nothing warm in it) over a cache that holds every kernel: the tiny
    # runs compile nothing, so they are loaded here and no child is started (before the
    # fix: one child per family after the first, each loading what was already there)
    started, ran = [], []
    monkeypatch.setattr(warm, "_WARM", set())
    monkeypatch.setattr(warm, "_tiny_run", lambda spec, concurrent, lean: ran.append((spec.label, concurrent, lean)))

    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("a child started"))
    monkeypatch.setattr(run.jit, "mode", lambda: "compile")
    specs = [parse_policy("vllm:16"), parse_policy("sglang:1"), parse_policy("unit-lru")]
    run.warmup_many(specs, lean=lean)
    assert started == []
    fams = [s.label for s in specs if s.build_class.kernel_family]
    assert ran == [(label, True, lean) for label in fams]  # each family's tiny run once, nothing after
    assert all(run._is_warm(s, run._scope(True, lean)) for s in specs if s.build_class.kernel_family)
