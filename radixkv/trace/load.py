"""One entry point for every trace format: :func:`load_trace`, and :func:`save_trace`."""
from __future__ import annotations

import importlib
from pathlib import Path

from radixkv.errors import TraceFormatError
from radixkv.trace.detect import FORMATS, canonical_format, detect_format
from radixkv.trace.types import Trace

#: format → (module, reader function); imported on first use
_READERS = {
    "native": ("radixkv.trace.native", "read_native"),
    "mooncake": ("radixkv.trace.mooncake", "read_mooncake"),
    "weka": ("radixkv.trace.weka", "read_weka"),
    "ragpulse": ("radixkv.trace.ragpulse", "read_ragpulse"),
    "azure": ("radixkv.trace.azure", "read_azure"),
    "npz": ("radixkv.trace.binary", "read_npz"),
    "bailian": ("radixkv.trace.bailian", "read_bailian"),
}
assert set(_READERS) == set(FORMATS)


def load_trace(path, format: str | None = None, **options) -> Trace:  # noqa: A002 (the CLI's --format)
    """Read a trace in any supported format.

    Parameters
    ----------
    path : str or Path
        A file, or a directory (WEKA conversations, RAGPulse's ``data`` folder).
    format : str, optional
        ``native``, ``mooncake``, ``weka``, ``ragpulse``, ``azure``, ``npz`` or ``bailian``
        (aliases: ``binary``, ``jsonl``, ``kv-cache-tester``, ``qwen-bailian``); detected from the content when None
        (rules: :mod:`radixkv.trace.detect`).
    **options
        Passed to the format's reader (e.g. ``conversation_spacing_s`` for ``weka``).

    Returns
    -------
    Trace
        In replay order. A text trace file read before with the same bytes, format and
        options comes from the binary cache of :mod:`radixkv.trace.cache` (the same
        columns; ``RADIXKV_TRACE_CACHE=off`` parses every time).

    Raises
    ------
    radixkv.errors.TraceFormatError
        Unknown format name, undetectable content, or any malformed record (the reader's
        error names file, line/record and field; when *format* was given and the content
        looks like another format, the message says which).
    """
    fmt = detect_format(path) if format is None else canonical_format(format)
    if not Path(path).exists():
        raise TraceFormatError("no such file or directory", path=path)
    module, func = _READERS[fmt]
    reader = getattr(importlib.import_module(module), func)
    from radixkv.trace.cache import cached_read

    try:
        return cached_read(path, fmt, options, lambda: reader(path, **options))
    except TypeError as e:
        if options and "unexpected keyword" in str(e):
            raise TraceFormatError(f"option not understood by the {fmt} reader: {e}", path=path) from None
        raise
    except TraceFormatError as e:
        guess = None if format is None else _guess(path)
        if guess is None or guess == fmt:
            raise
        raise TraceFormatError(f"{e.reason} (read as {fmt}, as asked; its content looks like {guess})",
                               path=e.path, line=e.line, field=e.field) from None


def _guess(path):
    """The detected format of *path*, or None when detection fails too."""
    try:
        return detect_format(path)
    except TraceFormatError:
        return None


def save_trace(trace: Trace, path) -> None:
    """Write *trace* as ``.npz`` (binary) or ``.jsonl`` (native), chosen by the extension.

    Raises
    ------
    radixkv.errors.TraceFormatError
        Any other extension.
    """
    if output_format(path) == "npz":
        from radixkv.trace.binary import write_npz

        write_npz(trace, path)
    else:
        from radixkv.trace.native import write_native

        write_native(trace, path)


def output_format(path) -> str:
    """The format :func:`save_trace` writes *path* in: ``npz`` for ``.npz``, ``native`` for
    ``.jsonl`` / ``.json``; any other extension raises TraceFormatError."""
    suffix = Path(path).suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix in (".jsonl", ".json"):
        return "native"
    raise TraceFormatError(f"cannot tell the output format from {suffix!r}: use .npz or .jsonl", path=path)
