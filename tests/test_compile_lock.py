"""Two processes on one Numba cache never compile the same radixkv kernel at once
(radixkv.numba_cache.install_compile_lock): the second waits for the first's compile and
loads it from the cache instead of compiling it again."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("fcntl")

# holds the kernel's lock (as a process compiling it would), then, told to, compiles the
# kernel with the lock left off in itself (Numba saves it to the cache) and lets go
_HOLDER = """
import fcntl, os, sys
import numpy as np
from numba import typeof
import radixkv.numba_cache as NC
from radixkv.trace import _jsonl_fast as J
# the signature J.warmup compiles: a byte buffer and two ints
path = NC._lock_path(J._parse_uints, tuple(typeof(a) for a in (np.frombuffer(b"1", dtype=np.uint8), 0, 1)))
os.makedirs(os.path.dirname(path), exist_ok=True)
f = open(path, "a+b")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
J.warmup()
print("compiled", flush=True)
fcntl.flock(f, fcntl.LOCK_UN)
"""

# compiles (or loads) the same kernel and says whether Numba compiled it here
_WAITER = """
import time
from numba.core import event
from radixkv.trace import _jsonl_fast as J
compiled = []
class L(event.Listener):
    def on_start(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__name__)
    def on_end(self, ev):
        pass
event.register("numba:compile", L())
print("ready", flush=True)
J.warmup()
print("compiled here:", sorted(set(compiled) & {"_parse_uints"}), flush=True)
"""


def _env(tmp_path, **extra):
    return dict(os.environ, PYTHONPATH=str(REPO), NUMBA_CACHE_DIR=str(tmp_path / "nc"), RADIXKV_JIT="compile",
                **extra)


def test_a_kernel_compiling_in_another_process_is_waited_for_and_loaded(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], env=_env(tmp_path, RADIXKV_COMPILE_LOCK="0"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = subprocess.Popen([sys.executable, "-c", _WAITER], env=_env(tmp_path), stdout=subprocess.PIPE,
                                  text=True)
        assert waiter.stdout.readline().strip() == "ready"  # Numba imported, the kernel called next
        time.sleep(1.0)
        assert waiter.poll() is None  # waiting for the lock (without it: compiling, seen below)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "compiled"
        out, _ = waiter.communicate(timeout=300)
        assert waiter.returncode == 0
        assert out.strip() == "compiled here: []"  # loaded from the cache the holder filled (after "ready")
    finally:
        holder.kill()
        holder.wait()


def test_without_the_lock_the_waiting_process_compiles_itself(tmp_path):
    # the check above can fail: with RADIXKV_COMPILE_LOCK=0 the second process compiles
    out = subprocess.run([sys.executable, "-c", _WAITER], env=_env(tmp_path, RADIXKV_COMPILE_LOCK="0"),
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.strip().splitlines() == ["ready", "compiled here: ['_parse_uints']"]


def test_the_compile_log_names_what_was_compiled_and_what_was_loaded(tmp_path):
    """RADIXKV_COMPILE_LOG: a process on a fresh cache compiles the JSONL parser's kernel
    (one line: compiled, its signature with the argument type classes: a read-only byte
    buffer and two int64), the next process on that cache loads it (one line: loaded)."""
    import json

    log = tmp_path / "log"
    code = "from radixkv.trace import _jsonl_fast as J; J.warmup()"
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, RADIXKV_COMPILE_LOG=str(log)),
                       timeout=300, check=True)
    rows = [json.loads(line) for p in log.glob("*.jsonl") for line in p.read_text().splitlines()]
    mine = sorted((r for r in rows if r["fn"] == "radixkv.trace._jsonl_fast._parse_uints"), key=lambda r: r["t"])
    assert [r["how"] for r in mine] == ["compiled", "loaded"]
    assert mine[0]["sig"] == "(Array:readonly array(uint8, 1d, C), Integer:int64, Integer:int64)"
    assert mine[0]["pid"] != mine[1]["pid"] and mine[0]["depth"] == mine[1]["depth"] == 0


def _race_savers(tmp_path, save):
    """Two threads, each with its own handle on one kernel's cache index, save 3 signatures
    each with *save* (an ``IndexDataCacheFile.save``); every index write is slowed so that
    the other thread reads the index meanwhile. Returns what a fresh handle loads per key."""
    import threading

    from numba.core.caching import IndexDataCacheFile

    class Slow(IndexDataCacheFile):
        def _save_index(self, overloads):
            time.sleep(0.05)
            super()._save_index(overloads)

    def saver(t):
        h = Slow(str(tmp_path), "kernel-1.py311", ("stamp", 1))
        for i in range(3):
            save(h, ("sig", t, i), ("code", t, i))

    threads = [threading.Thread(target=saver, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    fresh = IndexDataCacheFile(str(tmp_path), "kernel-1.py311", ("stamp", 1))
    return {(t, i): fresh.load(("sig", t, i)) for t in range(2) for i in range(3)}


def test_two_savers_of_one_kernel_keep_every_signature(tmp_path):
    # two processes compiling two signatures of one kernel side by side (the lock is per
    # signature) save to its one index in turn: each signature loads its own code
    import radixkv.numba_cache  # noqa: F401  (installs the locks when Numba is loaded)
    from numba.core.caching import IndexDataCacheFile

    assert getattr(IndexDataCacheFile.save, "__wrapped__", None) is not None
    (tmp_path / "locked").mkdir()
    got = _race_savers(tmp_path / "locked", IndexDataCacheFile.save)
    assert got == {(t, i): ("code", t, i) for t in range(2) for i in range(3)}
    # the check above can fail: Numba's own save, raced, loses signatures
    (tmp_path / "plain").mkdir()
    raw = _race_savers(tmp_path / "plain", IndexDataCacheFile.save.__wrapped__)
    assert any(raw[k] != ("code",) + k for k in raw)
