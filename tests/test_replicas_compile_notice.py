"""A replay with ``--replicas`` that compiles kernels (a cold Numba cache: the first
``vllm:16@lfu`` replay with replicas compiled its replica loop for 30+ s in silence) says
so on stderr, with the notice the single-engine warm-up prints
(:class:`radixkv.numba_cache.compile_notice`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from radixkv.cli import main

DEMO = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")


def test_a_compile_during_the_replicas_replay_is_announced(capsys, monkeypatch):
    import numba

    import radixkv.replay.multi_concurrent as MC

    real = MC.replay_multi_concurrent

    def fresh_kernel(x):  # stands for a radixkv kernel Numba's cache does not hold
        return x + 1

    fresh_kernel.__module__ = "radixkv.replay._fresh_kernel_for_test"

    def compiling(*a, **k):
        assert numba.njit(cache=False)(fresh_kernel)(np.int64(1)) == 2  # compiles now
        return real(*a, **k)

    monkeypatch.setattr(MC, "replay_multi_concurrent", compiling)
    assert main(["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "20000", "--limit", "20",
                 "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--replicas", "2"]) == 0
    err = capsys.readouterr().err
    assert "radixkv: compiling the kernels of vllm:16 (" in err, err
    assert "radixkv: compiled 1 kernel of vllm:16 in " in err, err
