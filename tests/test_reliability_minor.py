"""The minor failures of issue 31's bug hunt, each on a hand-written input: a request that
cannot fit the pool is diagnosed before any compile on both engines; a full disk names the
file; ``--policy none`` has the block size ``--block-size`` documents; a plug-in class
missing an abstract method is exit 2 naming it; sweep workers die with their parent."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from radixkv.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _trace(tmp_path, output_length):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"id": "a", "tokens": list(range(1, 19)), "output_length": output_length}) + "\n")
    return p


def _no_compile(monkeypatch):
    import radixkv.replay.jit as jit
    import radixkv.replay.run as run

    def boom(*a, **k):
        raise AssertionError("a kernel was compiled (or planned) before the request was refused")

    monkeypatch.setattr(jit, "before_replay", boom)
    monkeypatch.setattr(run, "warmup", boom)
    monkeypatch.setattr(run, "warmup_many", boom)


@pytest.mark.parametrize("policy,slots", [("vllm:16", "6250 slots of 16"), ("sglang:1", "100000 slots of 1")])
@pytest.mark.parametrize("mode", ["sequential", "concurrent"])
def test_a_request_that_cannot_fit_the_pool_is_refused_before_any_compile(tmp_path, capsys, monkeypatch, policy,
                                                                          slots, mode):
    # 10^12 output tokens: vLLM's sequential path said "out of memory" after compiling
    p = _trace(tmp_path, 10 ** 12)
    _no_compile(monkeypatch)
    extra = ["--model", "Llama-2-7B", "--gpu", "H100", "--max-model-len", str(2 * 10 ** 12)] \
        if mode == "concurrent" else []
    rc = main(["replay", str(p), "--policy", policy, "--capacity-tokens", "100000", "--mode", mode, "--quiet",
               *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    # KV extent 18 + 10^12 − 1 tokens, by hand
    assert "request 'a' (#0 in replay order) needs 1000000000017 tokens of KV" in err
    assert f"cannot fit the empty pool under {policy}" in err and slots in err
    assert "out of memory" not in err


def test_compare_refuses_it_before_compiling_too(tmp_path, capsys, monkeypatch):
    p = _trace(tmp_path, 10 ** 12)
    _no_compile(monkeypatch)
    monkeypatch.setattr("radixkv.replay.run.warmup_many", lambda *a, **k: (_ for _ in ()).throw(AssertionError()))
    rc = main(["compare", str(p), "--policies", "vllm:16,sglang:1", "--capacity-tokens", "100000", "--quiet"])
    assert rc == 2
    assert "cannot fit the empty pool under vllm:16" in capsys.readouterr().err


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, capsys, monkeypatch):
    out = tmp_path / "memory.json"
    out.write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    rc = main(["memory", "--model", "Llama-2-7B", "--gpu", "H100", "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"radixkv: error: {out}: No space left on device; {out} was not written" in err
    assert out.read_text() == "old\n"
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []  # no temporary file left


def test_policy_none_has_the_documented_block_size_16():
    from radixkv.policies.registry import parse_policy

    # `--block-size` help: "vLLM block_size in tokens for vllm/none/static specs without :SIZE (default 16)"
    assert parse_policy("none").size == 16 and parse_policy("none").label == "none:16"
    assert parse_policy("vllm").size == 16 and parse_policy("static").size == 16
    assert parse_policy("none:1").size == 1
    assert parse_policy("none", block_size=4).size == 4


def test_policy_none_allocates_vllm_blocks(tmp_path, capsys):
    # 2 requests of 18 prompt + 4 output tokens: KV extent 21 tokens = 2 blocks of 16 each
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"id": i, "tokens": list(range(1, 19)), "output_length": 4}) + "\n"
                         for i in ("a", "b")))
    out = tmp_path / "s.json"
    assert main(["replay", str(p), "--policy", "none", "--capacity-tokens", "32", "--json", str(out), "--quiet",
                 "--no-timing"]) == 0
    doc = json.loads(out.read_text())
    assert doc["results"][0]["policy"] == "none:16"
    assert doc["results"][0]["summary"]["hit_tokens"] == 0


def test_a_plugin_missing_an_abstract_method_is_exit_2_naming_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "halfpolicy31.py").write_text(textwrap.dedent("""
        from radixkv.policies.base import PrefixCache

        class HalfDone(PrefixCache):
            name = "half-done"

            def admit(self, rid, seq, n_tokens=None):
                return None

            def stats(self, detail=True):
                return None
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    p = _trace(tmp_path, 4)
    rc = main(["replay", str(p), "--policy", "halfpolicy31:HalfDone", "--capacity-tokens", "100", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "class halfpolicy31.HalfDone does not implement extend(), finish()" in err
    assert "Traceback" not in err


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_dies_with_its_parent(sig):
    # the parent forks a worker set up as the processes executor sets up its workers,
    # then is killed: the worker must not live on (adopted by init)
    script = textwrap.dedent("""
        import os, sys, time
        from radixkv.sweep.executors import _worker_init
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            _worker_init(parent)
            time.sleep(60)
            os._exit(0)
        print(pid, flush=True)
        time.sleep(60)
        """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        child = int(proc.stdout.readline())
        time.sleep(0.3)  # the child has set its watch
        assert _state(child) not in (None, "Z")
        os.kill(proc.pid, sig)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _state(child) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(child) in (None, "Z"), "the worker outlived its parent"
    finally:
        proc.kill()
        if _state(child) not in (None, "Z"):
            os.kill(child, signal.SIGKILL)
