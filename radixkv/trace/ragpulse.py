"""Reader for RAGPulse (a week of a university RAG Q&A service).

Source: ``flashserve/RAGPulse`` ``data/`` (Wang et al., "RAGPulse: An Open-Source RAG
Workload Trace to Optimize RAG Serving Systems", arXiv:2511.12979); see
``shared/traces/ragpulse/SOURCE.md``. ``0_trace.jsonl`` has one request per line::

    {"timestamp": "82", "input_length": 3112, "output_length": 192,
     "hash_ids": {"sys_prompt": [...], "passages_ids": [...], "history": [...],
                  "web_search": [...], "user_input": [...]},
     "session_id": "..."}

and the sibling files ``1_sys_prompt.jsonl`` … ``5_web_search.jsonl`` give the token length
of every chunk id (``{"<component>_id": id, "token_length": n}``).

Representation (what is exact and what is approximated)
--------------------------------------------------------
The ids are *content* ids of variable-length chunks, not prefix-chained block hashes, and
a :class:`~radixkv.trace.types.Trace` has one fixed unit size. This reader:

1. lays a prompt out as its chunks in the order ``sys_prompt, passages_ids, history,
   web_search, user_input`` (the order of the keys; the real prompt order is not
   documented; ``order=`` picks another), followed by the ``T = input_length − Σ chunk lengths`` tokens (6–12 in the
   public file) that belong to no chunk — chat-template tokens. They are put **at the end
   as unique content**: their true place is unknown, and a unique tail never invents
   sharing the data do not show;
2. gives each chunk a prefix key: the chain of ``(component, id)`` of every chunk up to and
   including it (two chunks share a key iff the prompts agree on every chunk so far);
3. cuts the prompt into ``floor(P/U)`` units of ``U`` tokens (``partial_last_unit=False``;
   the ``P mod U`` trailing tokens are a unique tail, as WEKA). Unit ``k`` (tokens
   ``[kU, (k+1)U)``) gets the id of the pair *(prefix key of the chunk holding its last
   token, k)*, densely renumbered; a unit that reaches into the template tail gets a
   fresh id used nowhere else.

Two units get the same id iff the prompts agree on every chunk up to the one holding the
unit's last token: equal ids mean equal content *and* equal prefix, so the ids are
prefix-chained like Mooncake's. Nothing is expanded to tokens (about 1.3 M ids at U = 16).
What is lost: where two prompts diverge inside a unit (a chunk boundary not at a multiple
of U), the up-to ``U − 1`` shared tokens before the boundary count as a miss; so a
prefix hit is the chunk-level hit **rounded down to a multiple of U** — exactly what a
block cache with ``block_size = U`` (or a multiple of it) would see on the real tokens if
content differs from the first token of the first different chunk. The default ``U = 16``
is vLLM's default ``block_size`` (``vllm/config/cache.py``, ``CacheConfig.block_size``).

Request ids are ``r<i>`` with ``i`` the 0-based index of the request's line; the
timestamps (strings of integer seconds, not in order) are sorted stably — silently, unlike the
Mooncake, Azure and native readers (:func:`radixkv.trace._fields.warn_unsorted`): the published
file is not in time order by design (3,304 of its 7,106 lines), so a warning would say nothing
about a particular file; ``turn`` is the
request's 0-based position in its session in replay order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from radixkv.errors import TraceFormatError
from radixkv.trace import _fields as F
from radixkv.trace._io import read_lines
from radixkv.trace.types import Trace

#: prompt order of the components: (key in ``hash_ids``, component file, id field in that file)
COMPONENTS = (
    ("sys_prompt", "1_sys_prompt.jsonl", "sys_prompt_id"),
    ("passages_ids", "2_passages.jsonl", "passage_id"),
    ("history", "3_history.jsonl", "history_id"),
    ("web_search", "5_web_search.jsonl", "web_search_id"),
    ("user_input", "4_user_input.jsonl", "user_input_id"),
)
DEFAULT_UNIT_TOKENS = 16
_ID_BITS = 40  # chunk key = component << 40 | id


def _read_component(path: Path, id_field: str) -> dict:
    lengths = {}
    for ln, text in read_lines(path):
        obj = F.parse_json_line(text, path, ln)
        cid = F.as_int(F.get(obj, id_field, path, ln), path, ln, id_field)
        n = F.as_int(F.get(obj, "token_length", path, ln), path, ln, "token_length")
        if cid >= 1 << _ID_BITS:
            raise TraceFormatError(f"id {cid} is too large (< 2^{_ID_BITS} expected)", path=path, line=ln, field=id_field)
        if cid in lengths and lengths[cid] != n:
            raise TraceFormatError(f"id {cid} listed twice with different lengths ({lengths[cid]}, {n})",
                                   path=path, line=ln, field="token_length")
        lengths[cid] = n
    return lengths


def _parse_timestamp(v, path, ln) -> float:
    if type(v) is str:
        s = v.strip()
        if not s.isdigit():
            raise TraceFormatError(f"expected a string of integer seconds, got {v!r}", path=path, line=ln, field="timestamp")
        return float(int(s))
    return F.as_float(v, path, ln, "timestamp")


def read_ragpulse(path, *, unit_tokens: int = DEFAULT_UNIT_TOKENS, order=None) -> Trace:
    """Read RAGPulse's ``data`` folder (or its ``0_trace.jsonl``, siblings beside it).

    Parameters
    ----------
    path : str or Path
        The folder, or the ``0_trace.jsonl`` file.
    unit_tokens : int ≥ 2
        U, tokens per id (default 16). Sharing is kept at U granularity (module
        docstring); smaller U is finer but costs more ids (about ``Σ P / U``).
    order : sequence of str, optional
        The prompt order of the five components, as their ``hash_ids`` keys (a permutation
        of ``sys_prompt, passages_ids, history, web_search, user_input``). Default: that
        order, the order of the keys; the real prompt's order is not documented, so the
        hits depend on this assumption (``experiments/tab_traces.py`` measures how much).

    Returns
    -------
    Trace
        ``partial_last_unit=False``, ``session_id`` and ``turn`` columns, replay order.

    Raises
    ------
    radixkv.errors.TraceFormatError
        Naming the file, the 1-based line and the field (``hash_ids.<component>`` for
        chunk lists): invalid JSON, missing component file, missing / mistyped fields,
        negative or boolean lengths or ids, a chunk id missing from its component file,
        chunks longer than ``input_length``, an empty prompt; *order* not a permutation of
        the five component keys (field ``order``).
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    trace_file = folder / "0_trace.jsonl" if path.is_dir() else path
    U = int(unit_tokens)
    if U < 2:
        raise TraceFormatError(f"unit_tokens must be ≥ 2 (ids are never expanded to tokens), got {unit_tokens}",
                               field="unit_tokens")
    comps = COMPONENTS
    if order is not None:
        by_key = {c[0]: c for c in COMPONENTS}
        if isinstance(order, str) or sorted(order) != sorted(by_key):
            raise TraceFormatError(f"order must be a permutation of {', '.join(by_key)}, got {order!r}",
                                   field="order")
        comps = tuple(by_key[k] for k in order)
    lengths = []
    for _key, fname, id_field in comps:
        cpath = folder / fname
        if not cpath.is_file():
            raise TraceFormatError(f"component file {fname} is missing beside the trace", path=cpath)
        lengths.append(_read_component(cpath, id_field))

    lines = read_lines(trace_file)
    n = len(lines)
    arrival = np.zeros(n, dtype=np.float64)
    plen = np.zeros(n, dtype=np.int64)
    olen = np.zeros(n, dtype=np.int64)
    sess = [""] * n
    chunk_lens: list[np.ndarray] = [None] * n
    chunk_nodes: list[np.ndarray] = [None] * n
    trie: dict = {}
    for r, (ln, text) in enumerate(lines):
        obj = F.parse_json_line(text, trace_file, ln)
        arrival[r] = _parse_timestamp(F.get(obj, "timestamp", trace_file, ln), trace_file, ln)
        P = F.as_int(F.get(obj, "input_length", trace_file, ln), trace_file, ln, "input_length")
        if P < 1:
            raise TraceFormatError("empty prompt (input_length must be ≥ 1)", path=trace_file, line=ln, field="input_length")
        olen[r] = F.as_int(F.get(obj, "output_length", trace_file, ln), trace_file, ln, "output_length")
        sess[r] = F.as_str(F.get(obj, "session_id", trace_file, ln), trace_file, ln, "session_id")
        hid = F.get(obj, "hash_ids", trace_file, ln)
        if not isinstance(hid, dict):
            raise TraceFormatError("expected an object of component id lists", path=trace_file, line=ln, field="hash_ids")
        node = -1
        nodes, lens = [], []
        for c, (key, _fname, _idf) in enumerate(comps):
            field = f"hash_ids.{key}"
            ids = F.as_id_array(F.get(hid, key, trace_file, ln, field=field), trace_file, ln, field).tolist()
            table = lengths[c]
            for j, cid in enumerate(ids):
                L = table.get(cid)
                if L is None:
                    raise TraceFormatError(f"element {j}: id {cid} is not in {comps[c][1]}",
                                           path=trace_file, line=ln, field=field)
                k = (node, (c << _ID_BITS) | cid)
                nxt = trie.get(k)
                if nxt is None:
                    nxt = trie[k] = len(trie)
                node = nxt
                nodes.append(node)
                lens.append(L)
        if sum(lens) > P:
            raise TraceFormatError(f"chunks hold {sum(lens)} tokens, more than input_length {P}",
                                   path=trace_file, line=ln, field="input_length")
        plen[r] = P
        chunk_nodes[r] = np.asarray(nodes, dtype=np.int64)
        chunk_lens[r] = np.asarray(lens, dtype=np.int64)

    # unit ids: (chunk node holding the unit's last token, unit index) → dense id
    n_units = plen // U
    K = int(n_units.max()) + 1 if n else 1
    keys = np.full(int(n_units.sum()), -1, dtype=np.int64)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_units, out=off[1:])
    for r in range(n):
        m = int(n_units[r])
        if m == 0:
            continue
        ends = np.cumsum(chunk_lens[r])
        S = int(ends[-1]) if ends.size else 0
        last_tok = np.arange(1, m + 1, dtype=np.int64) * U - 1
        inside = last_tok < S
        j = np.searchsorted(ends, last_tok[inside], side="right")
        seg = keys[off[r]:off[r + 1]]
        seg[inside] = chunk_nodes[r][j] * K + np.flatnonzero(inside)
    shared = keys >= 0
    ids = np.empty_like(keys)
    uniq, inv = np.unique(keys[shared], return_inverse=True)
    ids[shared] = inv.reshape(-1)
    ids[~shared] = len(uniq) + np.arange(int((~shared).sum()), dtype=np.int64)

    order = np.argsort(arrival, kind="stable")
    turn = np.zeros(n, dtype=np.int64)
    seen: dict = {}
    for r in order.tolist():
        turn[r] = seen.get(sess[r], 0)
        seen[sess[r]] = turn[r] + 1
    return Trace.from_requests(
        req_id=[f"r{k}" for k in range(n)],
        arrival_s=arrival,
        prompt_len=plen,
        output_len=olen,
        prompt_ids=[ids[off[r]:off[r + 1]] for r in range(n)],
        unit_tokens=U,
        partial_last_unit=False,
        session_id=sess,
        turn=turn,
        name=str(path),
    )
