"""Helpers shared by the experiment scripts: where the public traces are, where results go."""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPO = HERE.parent


def shared(*parts: str) -> Path:
    """A path under ``$RADIXKV_SHARED`` (default ``../shared`` beside the repository)."""
    root = Path(os.environ.get("RADIXKV_SHARED", REPO.parent / "shared"))
    p = root.joinpath(*parts)
    if not p.exists():
        sys.exit(f"{p} not found: set RADIXKV_SHARED to the folder holding traces/ (see traces/README.md)")
    return p


def result(name: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / name
