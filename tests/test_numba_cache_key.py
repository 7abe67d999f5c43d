"""Numba's cache is keyed by radixkv's kernel sources (radixkv.numba_cache.source_key).

Numba validates a cached kernel against its own file's time stamp only, so a kernel that
inlines another module's functions was loaded stale after only that module changed (the
span/batch/priority kernels inline _hash_kernels). A change to any kernel source must
give a different cache folder; a change elsewhere must not.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import radixkv.numba_cache as NC

REPO = Path(__file__).resolve().parents[1]


def _tree(root: Path, kernel: str, other: str) -> None:
    (root / "sub").mkdir(parents=True, exist_ok=True)
    (root / "sub" / "_k.py").write_text("from numba import njit\n" + kernel)
    (root / "plain.py").write_text(other)


def test_the_key_follows_kernel_sources_only(tmp_path):
    _tree(tmp_path, "x = 1\n", "y = 1\n")
    k0 = NC.source_key(tmp_path)
    _tree(tmp_path, "x = 1\n", "y = 2\n")  # a module without Numba changed
    assert NC.source_key(tmp_path) == k0
    _tree(tmp_path, "x = 2\n", "y = 2\n")  # a kernel module changed
    k1 = NC.source_key(tmp_path)
    assert k1 != k0 and len(k1) == 12
    (tmp_path / "sub" / "_k2.py").write_text("import numba\n")  # a kernel module added
    k2 = NC.source_key(tmp_path)
    assert k2 != k1
    # a module that only names Numba (the package __init__ calling keyed_cache_dir) holds no kernel
    (tmp_path / "plain.py").write_text("from radixkv.numba_cache import keyed_cache_dir  # numba's cache\n")
    assert NC.source_key(tmp_path) == k2


def test_importing_radixkv_points_numba_at_the_keyed_folder_and_children_agree(tmp_path):
    import numba

    want = NC.CACHE_PREFIX + NC.source_key()
    assert os.path.basename(numba.config.CACHE_DIR) == want
    code = "import os, radixkv, numba; print(os.environ['NUMBA_CACHE_DIR']); print(numba.config.CACHE_DIR)"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "nc"), PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    first = out.stdout.split()
    assert first == [str(tmp_path / "nc" / want)] * 2  # under the user's folder
    env["NUMBA_CACHE_DIR"] = first[0]  # a child process inherits the keyed folder: not keyed twice
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == first


def _load_kernel_module(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_kernel_compiled_after_its_sources_changed_stays_out_of_the_keyed_folder(tmp_path, monkeypatch):
    """The key is taken when radixkv is imported; a kernel module read after an edit would
    compile the new source into the old key's folder (a stale load later, once the edit is
    undone). Written for the purpose: a kernel module under radixkv's name, its source
    stamped as the key was taken; unchanged, its compile is saved in the folder (an index
    file appears); edited after the key was taken, it compiles from the new source (3, not
    2) and nothing is saved there."""
    import numba

    src = tmp_path / "src"
    src.mkdir()
    kern = src / "_probe_kernels.py"
    kern.write_text("from numba import njit\n\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    stamps: list = []
    NC.source_key(src, stamps)
    assert [p for p, _, _ in stamps] == [str(kern)]
    monkeypatch.setattr(NC, "_keyed_stamps", stamps)
    # the guard sits in radixkv's wrapper of Numba's compile, installed when radixkv was imported
    from numba.core.dispatcher import Dispatcher

    NC.install_compile_lock()
    assert getattr(Dispatcher.compile, "__wrapped__", None) is not None

    unchanged = tmp_path / "cache-unchanged"
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(unchanged))
    assert not NC.sources_changed()
    assert _load_kernel_module(kern, "radixkv._probe_unchanged").f(1) == 2
    assert list(unchanged.rglob("*.nbi"))  # saved under the key

    kern.write_text("from numba import njit\n\n@njit(cache=True)\ndef f(x):\n    return x + 2\n")
    os.utime(kern, ns=(stamps[0][1] + 10**9, stamps[0][1] + 10**9))  # a later time stamp, whatever the clock
    edited = tmp_path / "cache-edited"
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(edited))
    assert NC.sources_changed()
    assert _load_kernel_module(kern, "radixkv._probe_edited").f(1) == 3
    assert not list(edited.rglob("*.nbi")) and not list(edited.rglob("*.nbc"))  # nothing saved
