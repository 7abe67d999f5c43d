"""Shared fixtures.

Public traces and the full golden set are read from ``$RADIXKV_SHARED`` (``.ci/run``
exports ``RADIXKV_SHARED=../shared``); tests that need them skip with a reason when it is
unset. The small token-level golden traces and their golden runs are copied into
``tests/data/golden`` and always run.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

#: the suite tests the compiled kernels unless a test asks otherwise (radixkv.replay.jit)
os.environ.setdefault("RADIXKV_JIT", "compile")

DATA = Path(__file__).parent / "data"
GOLDEN_LOCAL = DATA / "golden"


def shared_path(*parts: str) -> Path:
    """Path under ``$RADIXKV_SHARED``; skips the calling test when unset or missing."""
    root = os.environ.get("RADIXKV_SHARED")
    if not root:
        pytest.skip("RADIXKV_SHARED is not set: public traces and golden files are not available")
    p = Path(root).joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} does not exist under RADIXKV_SHARED")
    return p


@pytest.fixture
def data_dir() -> Path:
    return DATA
