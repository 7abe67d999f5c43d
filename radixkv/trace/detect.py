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
  ``hash_ids`` holding an object → ``ragpulse``; ``chat_id`` or ``parent_chat_id`` →
  ``bailian`` (Qwen-Bailian); ``timestamp`` + ``hash_ids`` +
  ``input_length`` → ``mooncake``; ``tokens``, or ``hash_ids`` + ``input_length`` without
  ``timestamp`` → ``native`` (``mooncake`` when the ids count 512-token blocks, not tokens);
* any other first record: the JSONL format sharing the most of its keys (ties: native,
  mooncake, ragpulse), so that format's reader names the missing or unknown field, file
  and line (a native line without ``tokens`` is a native error, not an unknown format).

A first line that is not valid JSON is reported with its line and column; a first record
sharing no key with any format raises :class:`~radixkv.errors.TraceFormatError` naming its keys.
"""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.errors import TraceFormatError

#: format names understood by :func:`radixkv.trace.load.load_trace`
FORMATS = ("native", "mooncake", "weka", "ragpulse", "azure", "npz", "bailian")
#: accepted spellings → canonical name
ALIASES = {"binary": "npz", "jsonl": "native", "kv-cache-tester": "weka", "azure-csv": "azure",
           "qwen-bailian": "bailian"}

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
    if not first.lstrip().startswith(("{", "[")):
        raise TraceFormatError("unknown trace format: not JSON Lines, a kv-cache-tester JSON document, "
                               "an Azure CSV or a radixkv .npz", path=path)
    ln, obj, err = _first_json_line(path)
    if not isinstance(obj, dict) or ("requests" in obj and "block_size" in obj):
        if _looks_weka_document(path):
            return "weka"
    if err is not None:
        _raise_invalid_json(path, ln, err)
    if not isinstance(obj, dict):
        what = "null" if obj is None else f"a JSON {type(obj).__name__}"
        raise TraceFormatError(f"unknown trace format: expected a JSON object per line (JSON Lines), a "
                               f"kv-cache-tester JSON document, an Azure CSV or a radixkv .npz; got {what}",
                               path=path, line=ln)
    keys = set(obj)
    if "radixkv_trace" in keys:
        return "native"
    hid = obj.get("hash_ids")
    if isinstance(hid, dict):
        return "ragpulse"
    if "chat_id" in keys or "parent_chat_id" in keys:
        return "bailian"
    if "timestamp" in keys and "hash_ids" in keys and "input_length" in keys:
        return "mooncake"
    if "tokens" in keys:
        return "native"
    if "hash_ids" in keys and "input_length" in keys:
        return "mooncake" if _mooncake_blocks(obj) else "native"
    return _closest_jsonl_format(obj, path, ln)


#: the request keys of each JSON Lines format (native: radixkv.trace.native._REQUEST_KEYS)
_MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
_RAGPULSE_KEYS = _MOONCAKE_KEYS | {"session_id"}


def _mooncake_blocks(obj: dict) -> bool:
    """A line with ``hash_ids`` + ``input_length`` but no ``timestamp``: True when its ids
    count 512-token blocks (Mooncake's ``ceil(input_length / 512)``) and not tokens (a
    headerless native line needs ``len(hash_ids) == input_length``) — a Mooncake line
    missing its timestamp, which the Mooncake reader then names."""
    ids, P = obj.get("hash_ids"), obj.get("input_length")
    if type(ids) is not list or type(P) is not int or P < 1:
        return False
    from radixkv.trace.mooncake import MOONCAKE_BLOCK_TOKENS as U

    return len(ids) != P and len(ids) == -(-P // U)


def _closest_jsonl_format(obj: dict, path: Path, line: int) -> str:
    """The JSON Lines format sharing the most keys with the first record, whose reader then
    names the missing or unknown field (file, line, field); ties go to the order of
    :data:`FORMATS`. No key in common: TraceFormatError naming the keys."""
    from radixkv.trace.native import _REQUEST_KEYS

    keys = set(obj)
    best, score = None, 0
    for fmt, known in (("native", _REQUEST_KEYS), ("mooncake", _MOONCAKE_KEYS), ("ragpulse", _RAGPULSE_KEYS)):
        n = len(keys & known)
        if n > score:
            best, score = fmt, n
    if best is None or (best == "ragpulse" and not (path.parent / "1_sys_prompt.jsonl").is_file()):
        if best == "ragpulse":  # no component files beside it: Mooncake's reader names the field
            return "mooncake"
        raise TraceFormatError(f"unknown trace format: the first record has keys {sorted(keys)}, none of a "
                               f"native, Mooncake or RAGPulse request", path=path, line=line)
    return best


def _first_json_line(path: Path):
    """``(line, value, error)`` of the first non-blank line: its 1-based number, its decoded
    JSON value (None when it is not JSON) and the :class:`json.JSONDecodeError` (or None)."""
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            for ln, line in enumerate(f, 1):
                if line.strip():
                    try:
                        return ln, json.loads(line), None
                    except json.JSONDecodeError as e:
                        return ln, None, e
    except OSError:
        pass
    return 1, None, None


def _raise_invalid_json(path: Path, ln: int, err: json.JSONDecodeError):
    """The first non-blank line (number *ln*) is not JSON: name where. When the file is one
    JSON document spread over lines (a kv-cache-tester conversation), the document's own
    error position is reported; else the line's."""
    from radixkv.trace._io import decode_utf8

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", path=path) from None
    try:
        doc = json.loads(decode_utf8(raw, path))  # not UTF-8: that error, with its line
    except json.JSONDecodeError as whole:
        if whole.lineno > ln:
            err = whole
            ln = whole.lineno
    else:
        raise TraceFormatError(f"unknown trace format: one JSON {type(doc).__name__} over several lines, not "
                               f"JSON Lines nor a kv-cache-tester conversation (an object with 'requests' and "
                               f"'block_size')", path=path)
    raise TraceFormatError(f"invalid JSON: {err.msg} (column {err.colno})", path=path, line=ln)


def _looks_weka_document(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8-sig") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(doc, dict) and "requests" in doc and "block_size" in doc
