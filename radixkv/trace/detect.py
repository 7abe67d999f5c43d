"""Guess a trace file's format from its content (and, for directories, their files).

Rules, tried in order:

* a directory holding ``0_trace.jsonl`` → ``ragpulse``; a directory holding ``*.json``
  files → ``weka`` (the first file in name order must look like a kv-cache-tester
  conversation);
* a file whose first bytes are a zip header (``PK\\x03\\x04``) → ``npz``;
* a file whose first non-blank line is the CSV header ``TIMESTAMP,ContextTokens,...`` →
  ``azure``;
* a JSON document decoded as a *whole* object with ``requests`` and ``block_size`` →
  ``weka`` (checked when the first line is not a JSON object on its own, or has those keys);
* JSONL, by the keys of the first non-blank line: ``radixkv_trace`` → ``native``;
  ``hash_ids`` holding an object → ``ragpulse``; ``timestamp`` + ``hash_ids`` +
  ``input_length`` → ``mooncake``; ``tokens``, or ``hash_ids`` + ``input_length`` without
  ``timestamp`` → ``native``.

Anything else raises :class:`~radixkv.errors.TraceFormatError`.
"""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.errors import TraceFormatError

#: format names understood by :func:`radixkv.trace.load.load_trace`
FORMATS = ("native", "mooncake", "weka", "ragpulse", "azure", "npz")
#: accepted spellings → canonical name
ALIASES = {"binary": "npz", "jsonl": "native", "kv-cache-tester": "weka", "azure-csv": "azure"}

_SNIFF_BYTES = 1 << 16


def canonical_format(fmt: str) -> str:
    """Canonical name of *fmt* (a name of :data:`FORMATS` or an alias); else TraceFormatError."""
    f = ALIASES.get(str(fmt).lower(), str(fmt).lower())
    if f not in FORMATS:
        raise TraceFormatError(
            f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)} (aliases: {', '.join(sorted(ALIASES))})",
            field="format",
        )
    return f


def detect_format(path) -> str:
    """Name (one of :data:`FORMATS`) of the format of the file or directory *path*.

    Raises
    ------
    radixkv.errors.TraceFormatError
        The path does not exist, or its content matches no known format.
    """
    path = Path(path)
    if not path.exists():
        raise TraceFormatError("no such file or directory", path=path)
    if path.is_dir():
        if (path / "0_trace.jsonl").is_file():
            return "ragpulse"
        jsons = sorted(p for p in path.iterdir() if p.suffix == ".json" and p.is_file())
        if jsons:
            if _looks_weka_document(jsons[0]):
                return "weka"
            raise TraceFormatError(f"{jsons[0].name} is not a kv-cache-tester conversation "
                                   "(no 'requests' and 'block_size')", path=path)
        raise TraceFormatError("directory holds neither 0_trace.jsonl (RAGPulse) nor .json conversations (WEKA)",
                               path=path)
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", path=path) from None
    if head.startswith(b"PK\x03\x04"):
        return "npz"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    first = next((ln for ln in text.split("\n") if ln.strip()), "")
    if first.strip().startswith("TIMESTAMP,") and "ContextTokens" in first:
        return "azure"
    if not first:
        what = ("the file is empty (or holds only blank lines)" if len(head) < _SNIFF_BYTES
                else f"the first {_SNIFF_BYTES:,} bytes are blank")
        raise TraceFormatError(f"{what}: a trace needs at least one request", path=path)
    if not first.lstrip().startswith("{"):
        raise TraceFormatError("unknown trace format: not JSON Lines, a kv-cache-tester JSON document, "
                               "an Azure CSV or a radixkv .npz", path=path)
    obj = _first_json_line(path)
    if not isinstance(obj, dict) or ("requests" in obj and "block_size" in obj):
        if _looks_weka_document(path):
            return "weka"
        if not isinstance(obj, dict):
            raise TraceFormatError("unknown trace format: the first line is not a JSON object", path=path)
    keys = set(obj)
    if "radixkv_trace" in keys:
        return "native"
    hid = obj.get("hash_ids")
    if isinstance(hid, dict):
        return "ragpulse"
    if "timestamp" in keys and "hash_ids" in keys and "input_length" in keys:
        return "mooncake"
    if "tokens" in keys or ("hash_ids" in keys and "input_length" in keys):
        return "native"
    raise TraceFormatError(f"unknown trace format: first record has keys {sorted(keys)}", path=path)


def _first_json_line(path: Path):
    """The decoded first non-blank line, or None when it is not valid JSON."""
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                if line.strip():
                    return json.loads(line)
    except (OSError, json.JSONDecodeError):
        return None
    return None


def _looks_weka_document(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8-sig") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(doc, dict) and "requests" in doc and "block_size" in doc
