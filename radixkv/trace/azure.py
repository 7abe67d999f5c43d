"""Reader for the Azure LLM inference trace 2023 (Splitwise) CSV files.

Source: ``Azure/AzurePublicDataset`` ``data/AzureLLMInferenceTrace_{code,conv}.csv``
(Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting",
ISCA 2024); see ``shared/traces/azure-llm-2023/SOURCE.md``. Header
``TIMESTAMP,ContextTokens,GeneratedTokens``; one call per row, e.g.
``2023-11-16 18:17:03.9799600,4808,10`` (wall clock with 7 fractional digits, i.e. 100 ns
ticks; prompt tokens; output tokens).

Representation
--------------
The trace has **no prefix identity** (no ids, sessions or hashes), so every prompt is
unique content. Without expanding anything, a prompt is stored as *zero* ids and a
unique tail: ``partial_last_unit=False`` with a unit larger than any prompt, so
``floor(P/U) = 0``. ``U`` is the smallest power of two above the longest prompt and at
least 2^20 (1,048,576); a power of two keeps every power-of-two block or page size a
divisor of U. Outputs are unique too. Hit rates on this trace are 0 by construction; use
it for arrivals and lengths only.

Arrival times are seconds since the earliest row (the first row in the public files),
computed from integer 100 ns ticks so no precision is lost before the subtraction. Rows
are sorted stably by time (rows out of time order get an :class:`~radixkv.errors.InputWarning`
naming how many and the first); request ids are ``r<i>``, ``i`` the 0-based data-row index.
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np

from radixkv.errors import TraceFormatError
from radixkv.trace import _fields as F
from radixkv.trace._io import read_lines
from radixkv.trace.types import Trace

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MIN_UNIT_TOKENS = 1 << 20
_EPOCH = _dt.datetime(1970, 1, 1)


def _ticks(text: str, path, ln) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fffffff]`` → integer 100 ns ticks since 1970 (no time zone)."""
    s = text.strip()
    base, _, frac = s.partition(".")
    try:
        t = _dt.datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise TraceFormatError(f"expected a time like 2023-11-16 18:17:03.9799600, got {text!r}",
                               path=path, line=ln, field="TIMESTAMP") from None
    if frac and (not frac.isdigit() or len(frac) > 7):
        raise TraceFormatError(f"fractional seconds must be 1-7 digits, got {frac!r}", path=path, line=ln, field="TIMESTAMP")
    d = t - _EPOCH
    ticks = (d.days * 86400 + d.seconds) * 10_000_000
    if frac:
        ticks += int(frac.ljust(7, "0"))
    return ticks


def _count(text: str, path, ln, field: str, minimum: int) -> int:
    s = text.strip()
    if not s.isdigit():
        raise TraceFormatError(f"expected a non-negative integer, got {text!r}", path=path, line=ln, field=field)
    v = int(s)
    if v < minimum:
        raise TraceFormatError(f"must be ≥ {minimum}, got {v}", path=path, line=ln, field=field)
    return v


def read_azure(path) -> Trace:
    """Read an Azure LLM inference 2023 CSV (representation: module docstring).

    Returns
    -------
    Trace
        Zero ids per prompt (all unique tail), ``U`` = max(2^20, next power of two above
        the longest prompt), ``partial_last_unit=False``, no session column.

    Raises
    ------
    radixkv.errors.TraceFormatError
        Naming the file, the 1-based line (the header is line 1) and the column: a wrong
        header, a row without exactly three fields, a malformed time, a negative or
        non-integer token count, an empty prompt (ContextTokens 0); a file with the header
        and no request.
    """
    path = Path(path)
    lines = read_lines(path)
    if not lines:
        raise TraceFormatError("empty file (no header)", path=path, line=1)
    ln, head = lines[0]
    cols = tuple(c.strip() for c in head.lstrip("\ufeff").split(","))
    if cols != HEADER:
        got = head.strip() if len(head.strip()) <= 60 else head.strip()[:57] + "..."
        raise TraceFormatError(f"expected the header {','.join(HEADER)}, got {got!r}",
                               path=path, line=ln, field="header")
    n = len(lines) - 1
    if n == 0:  # as the native reader says it (radixkv.trace.native)
        raise TraceFormatError(f"no requests in the file: it holds only the header (line {ln}); a trace needs at "
                               "least one request", path=path)
    ticks = np.zeros(n, dtype=np.int64)
    plen = np.zeros(n, dtype=np.int64)
    olen = np.zeros(n, dtype=np.int64)
    for r, (ln, text) in enumerate(lines[1:]):
        parts = text.split(",")
        if len(parts) != 3:
            raise TraceFormatError(f"expected 3 comma-separated fields, got {len(parts)}", path=path, line=ln,
                                   field=HEADER[len(parts)] if len(parts) < 3 else "row")  # the first missing
        ticks[r] = _ticks(parts[0], path, ln)
        plen[r] = _count(parts[1], path, ln, "ContextTokens", 1)
        olen[r] = _count(parts[2], path, ln, "GeneratedTokens", 0)
    F.warn_unsorted(ticks, [ln for ln, _ in lines[1:]], path, "TIMESTAMP",
                    show=lambda k: lines[1 + k][1].split(",")[0].strip())
    arrival = (ticks - ticks.min()) / 1e7
    U = MIN_UNIT_TOKENS
    while U <= int(plen.max()):
        U <<= 1
    empty = np.zeros(0, dtype=np.int64)
    return Trace.from_requests(
        req_id=[f"r{k}" for k in range(n)],
        arrival_s=arrival,
        prompt_len=plen,
        output_len=olen,
        prompt_ids=[empty] * n,
        unit_tokens=U,
        partial_last_unit=False,
        name=str(path),
    )
