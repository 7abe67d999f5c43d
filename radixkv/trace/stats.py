"""Summary statistics of a trace (``radixkv trace inspect``) and its infinite-cache hit ratio.

Infinite-cache prefix hit ratio
-------------------------------
Replay the prompts in order into a cache that never evicts and holds *prompts only*
(outputs are not cached). Request i hits the longest run of its leading units whose
*prefix chain* (the unit together with every unit before it in the prompt) appeared in an
earlier request, so a unit matches only at the same position after the same
predecessors — what a radix tree or a block-hash table keyed by chained hashes stores.
In tokens: ``hit_i = min(h_i · U, P_i)`` with ``h_i`` the matching units, ``U`` the
trace's unit_tokens and ``P_i`` the prompt length (the cap matters only for a partial last
unit). No engine rounding (block size, the last-token rule of vLLM's
``KVCacheManager.get_computed_blocks`` or SGLang's ``match_prefix``) is applied: this is
the trace's own upper bound, e.g. Mooncake FAST'25 Table 2's "cache ratio".

The chains are kept exactly (no hashing): a trie whose node ``(parent node, id)`` map
lives in a Numba typed dict, one lookup per unit — about 0.5 s for the 5.3 M units of
the WEKA subset.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from radixkv.trace.types import Trace

#: percentiles reported for prompt and output lengths
PERCENTILES = (50, 90, 99)


@nb.njit(cache=True)
def _leading_hit_units(ids, offsets):
    """Matching leading units per request against all earlier prompts (exact trie).

    ids : int64 (total_ids,), each ≥ 0; offsets : int64 (n+1,). Returns int64 (n,).
    """
    n = offsets.shape[0] - 1
    hit = np.zeros(n, dtype=np.int64)
    child = dict()
    child[(np.int64(-1), np.int64(-1))] = np.int64(-1)  # types the dict; ids are ≥ 0, so never looked up
    n_nodes = np.int64(0)
    for i in range(n):
        node = np.int64(-1)
        h = 0
        matching = True
        for k in range(offsets[i], offsets[i + 1]):
            key = (node, ids[k])
            c = child.get(key, np.int64(-2))
            if c == -2:
                c = n_nodes
                n_nodes += 1
                child[key] = c
                matching = False
            elif matching:
                h += 1
            node = c
        hit[i] = h
    return hit


def infinite_cache_hits(trace: Trace) -> np.ndarray:
    """Hit tokens of every request under an infinite prompt-only prefix cache.

    Returns
    -------
    np.ndarray, int64, shape (n,)
        ``min(h_i · U, P_i)`` per request, replay order (rule in the module docstring).
    """
    if len(trace) == 0:
        return np.zeros(0, dtype=np.int64)
    h = _leading_hit_units(np.ascontiguousarray(trace.ids, dtype=np.int64),
                           np.ascontiguousarray(trace.id_offsets, dtype=np.int64))
    return np.minimum(h * int(trace.unit_tokens), trace.prompt_len)


def _dist(x: np.ndarray) -> dict:
    x = np.asarray(x)
    if x.size == 0:
        return {"total": 0, "mean": None, "min": None, **{f"p{q}": None for q in PERCENTILES}, "max": None}
    out = {"total": int(x.sum()), "mean": float(x.mean()), "min": int(x.min())}
    for q in PERCENTILES:
        out[f"p{q}"] = float(np.percentile(x, q))
    out["max"] = int(x.max())
    return out


def describe(trace: Trace) -> dict:
    """Summary of *trace*, as a JSON-ready dict.

    Keys
    ----
    name, requests, unit_tokens, partial_last_unit
    prompt_tokens, output_tokens : dict
        ``total``, ``mean``, ``min``, ``p50``, ``p90``, ``p99`` (numpy's default linear
        interpolation), ``max``; tokens.
    ids_per_request : dict
        Same statistics of the number of prompt ids per request.
    ids_total : int
        Prompt id references (``len(trace.ids)``).
    distinct_ids : int
        Distinct prompt ids.
    has_output_ids : bool
    sessions : int or None
        Distinct ``session_id`` values, when the trace has them.
    arrival_first_s, arrival_last_s, time_span_s : float, seconds
    infinite_cache_hit_ratio : dict
        ``token_weighted`` = Σ hit / Σ P and ``mean_per_request`` = mean of hit_i / P_i
        (rule: module docstring); ``hit_tokens`` = Σ hit.
    """
    n = len(trace)
    hits = infinite_cache_hits(trace)
    P = trace.prompt_len
    nids = np.diff(trace.id_offsets)
    return {
        "name": trace.name,
        "requests": int(n),
        "unit_tokens": int(trace.unit_tokens),
        "partial_last_unit": bool(trace.partial_last_unit),
        "prompt_tokens": _dist(P),
        "output_tokens": _dist(trace.output_len),
        "ids_per_request": _dist(nids),
        "ids_total": int(trace.ids.size),
        "distinct_ids": int(np.unique(trace.ids).size),
        "has_output_ids": trace.out_ids is not None,
        "sessions": None if trace.session_id is None else int(np.unique(trace.session_id).size),
        "arrival_first_s": float(trace.arrival_s[0]) if n else None,
        "arrival_last_s": float(trace.arrival_s[-1]) if n else None,
        "time_span_s": float(trace.arrival_s[-1] - trace.arrival_s[0]) if n else 0.0,
        "infinite_cache_hit_ratio": {
            "token_weighted": float(hits.sum() / P.sum()) if n else None,
            "mean_per_request": float(np.mean(hits / P)) if n else None,
            "hit_tokens": int(hits.sum()),
        },
    }


def format_description(d: dict) -> str:
    """Human-readable table of :func:`describe`'s output."""
    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float) and not float(v).is_integer():
            return f"{v:,.1f}"
        return f"{int(v):,}"

    lines = [
        f"trace              {d['name']}",
        *([f"converted from     {d['source']}"] if d.get("source") else []),
        f"requests           {d['requests']:,}",
        f"unit_tokens        {d['unit_tokens']}"
        + (" (last unit partial)" if d["partial_last_unit"] else (" (unique tail after full units)" if d["unit_tokens"] > 1 else "")),
        f"ids                {d['ids_total']:,} references, {d['distinct_ids']:,} distinct",
    ]
    if d["sessions"] is not None:
        lines.append(f"sessions           {d['sessions']:,}")
    lines.append(
        f"time span          {d['time_span_s']:,.3f} s"
        + (f" ({d['arrival_first_s']:,.3f} .. {d['arrival_last_s']:,.3f})" if d["requests"] else "")
    )
    head = f"{'':18} {'total':>14} {'mean':>10} {'min':>8} " + " ".join(f"{'p' + str(q):>9}" for q in PERCENTILES) + f" {'max':>9}"
    lines.append(head)
    for key, label in (("prompt_tokens", "prompt tokens"), ("output_tokens", "output tokens"),
                       ("ids_per_request", "ids per request")):
        s = d[key]
        lines.append(
            f"{label:18} {fmt(s['total']):>14} {fmt(s['mean']):>10} {fmt(s['min']):>8} "
            + " ".join(f"{fmt(s['p' + str(q)]):>9}" for q in PERCENTILES)
            + f" {fmt(s['max']):>9}"
        )
    h = d["infinite_cache_hit_ratio"]
    if h["token_weighted"] is not None:
        lines.append(
            f"infinite-cache prefix hit ratio: {h['token_weighted']:.4f} token-weighted, "
            f"{h['mean_per_request']:.4f} mean per request ({h['hit_tokens']:,} hit tokens)"
        )
    return "\n".join(lines)
