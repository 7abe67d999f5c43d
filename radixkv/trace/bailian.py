"""Reader for the Qwen-Bailian traces (Alibaba Cloud Model Studio, ATC'25 study).

Source of the format: ``alibaba-edu/qwen-bailian-usagetraces-anon`` (README "Data
Specification of the Traces"; files ``qwen_traceA_blksz_16.jsonl``,
``qwen_traceB_blksz_16.jsonl``, ``qwen_coder_blksz_16.jsonl``,
``qwen_thinking_blksz_16.jsonl``, kept in Git LFS) and the readers that load it (NVIDIA
AIPerf, "Profile with Bailian Traces"). One request per line:

==================  ==============================================================
``chat_id``         int ≥ 0, the request's (randomised) id
``parent_chat_id``  int ≥ −1, the request this one continues; −1 for a session's root
                    (default −1, as AIPerf)
``timestamp``       number ≥ 0, **seconds** since the trace start
``input_length``    int ≥ 1, prompt tokens
``output_length``   int ≥ 0, output tokens
``type``            str, request type: ``text``, ``search``, ``image`` or ``file``
                    (another string is kept as it is; default '')
``turn``            int ≥ 0, turn number in the session (default 1, as AIPerf)
``hash_ids``        list of int ≥ 0: salted SipHash of each **16-token** block,
                    remapped to integers; the last block is partial when
                    ``input_length`` is not a multiple of 16, as in Mooncake's format,
                    so ``len(hash_ids) == ceil(input_length / 16)``
==================  ==============================================================

Other keys (e.g. ``time_to_parent_chat`` in some files) are ignored. Outputs are unique
content (no output ids). What the reader keeps as request attributes: ``req_id`` =
``str(chat_id)``; ``parent_id`` = ``str(parent_chat_id)`` ('' for a root); ``req_type``;
``turn``; ``session_id`` = the chat id of the session's root, found by following the parent
links (a parent missing from the file stands as its session's root). Errors name the file,
the 1-based line and the field.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from radixkv.errors import TraceFormatError
from radixkv.trace import _fields as F
from radixkv.trace._jsonl_fast import read_records
from radixkv.trace.mooncake import _check_covers, read_block_request
from radixkv.trace.types import Trace

#: tokens per Bailian hash id (the ``blksz_16`` of every published file name)
BAILIAN_BLOCK_TOKENS = 16
#: request types the published README names
BAILIAN_TYPES = ("text", "search", "image", "file")


def read_bailian(path, *, unit_tokens: int = BAILIAN_BLOCK_TOKENS) -> Trace:
    """Read a Qwen-Bailian JSONL trace (format in the module docstring).

    Parameters
    ----------
    path : str or Path
    unit_tokens : int
        Tokens per hash id; 16 for every published file.

    Returns
    -------
    Trace
        ``unit_tokens = 16``, ``partial_last_unit = True``, ``arrival_s = timestamp``,
        with ``session_id``, ``turn``, ``req_type`` and ``parent_id``; stable-sorted by
        arrival (an :class:`~radixkv.errors.InputWarning` when the file is not in time order).

    Raises
    ------
    radixkv.errors.TraceFormatError
        Naming file, line and field: invalid JSON, a missing field, a negative, boolean or
        non-integer length or id, an empty prompt, ``len(hash_ids) != ceil(input_length /
        16)``, a hash id covering two lengths (:mod:`radixkv.trace.consistency`), a request
        that is its own parent, a chat id used twice (naming both lines).
    """
    path = Path(path)
    U = int(unit_tokens)
    lines = read_records(path, ("hash_ids",))
    n = len(lines)
    ts = np.zeros(n, dtype=np.float64)
    plen = np.zeros(n, dtype=np.int64)
    olen = np.zeros(n, dtype=np.int64)
    turn = np.zeros(n, dtype=np.int64)
    chat = np.zeros(n, dtype=np.int64)
    parent = np.zeros(n, dtype=np.int64)
    rtype = [""] * n
    pids = [None] * n
    line_of_chat: dict = {}
    for k, (ln, obj) in enumerate(lines):
        c = F.as_int(F.get(obj, "chat_id", path, ln), path, ln, "chat_id")
        if c in line_of_chat:
            raise TraceFormatError(f"chat_id {c} repeats the chat_id of line {line_of_chat[c]}: chat ids must be "
                                   f"unique", path=path, line=ln, field="chat_id")
        line_of_chat[c] = ln
        chat[k] = c
        parent[k] = F.as_int(obj.get("parent_chat_id", -1), path, ln, "parent_chat_id", minimum=-1)
        if parent[k] == c:
            raise TraceFormatError(f"request {c} is its own parent", path=path, line=ln, field="parent_chat_id")
        ts[k] = F.as_float(F.get(obj, "timestamp", path, ln), path, ln, "timestamp")
        rtype[k] = F.as_str(obj.get("type", ""), path, ln, "type")
        turn[k] = F.as_int(obj.get("turn", 1), path, ln, "turn")
        plen[k], olen[k], pids[k] = read_block_request(obj, U, path, ln)
    line_of = [ln for ln, _ in lines]
    _check_covers(pids, plen, U, line_of, path, "hash_ids")
    F.warn_unsorted(ts, line_of, path, "timestamp")
    return Trace.from_requests(
        req_id=[str(c) for c in chat.tolist()],
        arrival_s=ts,
        prompt_len=plen,
        output_len=olen,
        prompt_ids=pids,
        unit_tokens=U,
        partial_last_unit=True,
        session_id=_session_roots(chat, parent),
        turn=turn,
        req_type=rtype,
        parent_id=["" if p < 0 else str(p) for p in parent.tolist()],
        name=str(path),
    )


def _session_roots(chat: np.ndarray, parent: np.ndarray) -> list:
    """The session of each request: the chat id (str) at the top of its chain of parent
    links; a parent not in the file is the top of its chain. A cycle of parent links
    (no root) gets the smallest chat id on the cycle, so the answer is deterministic."""
    index = {int(c): k for k, c in enumerate(chat.tolist())}
    root = [None] * len(chat)
    for k in range(len(chat)):
        path, seen = [], set()
        j = k
        while root[j] is None:
            path.append(j)
            seen.add(j)
            p = int(parent[j])
            if p < 0 or p not in index:
                top = str(int(chat[j])) if p < 0 else str(p)
                break
            j = index[p]
            if j in seen:  # a cycle
                cyc = path[path.index(j):]
                top = str(min(int(chat[i]) for i in cyc))
                break
        else:
            top = root[j]
        for i in path:
            root[i] = top
    return root
