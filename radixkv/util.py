"""Small helpers with no radixkv dependencies: atomic file writes, deterministic JSON."""
from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path


def _default_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file (0o666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_output(path, *, binary: bool = False):
    """Open a temporary file beside *path*; on success rename it onto *path*.

    The temporary file lives in the destination directory, so :func:`os.replace` is an
    atomic rename on POSIX: readers of *path* see either the old file or the complete new
    one, never a partial write. On any exception the temporary file is removed and *path*
    is left untouched. The new file gets the usual mode (0o666 less the umask), not
    ``mkstemp``'s 0o600.

    Yields
    ------
    file object
        Opened ``"wb"`` when *binary*, else ``"w"`` with UTF-8 and ``"\\n"`` newlines.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.chmod(tmp, _default_mode())
        f = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path, data: bytes) -> None:
    """Write *data* to *path* atomically (see :func:`atomic_output`)."""
    with atomic_output(path, binary=True) as f:
        f.write(data)


def atomic_write_text(path, text: str) -> None:
    """Write UTF-8 *text* to *path* atomically (see :func:`atomic_output`)."""
    with atomic_output(path) as f:
        f.write(text)


def _finite(obj):
    """Replace NaN and infinities by None, recursively (JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps_json(obj) -> str:
    """Deterministic standard JSON: sorted keys, two-space indent, NaN as null, trailing newline."""
    return json.dumps(_finite(obj), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
