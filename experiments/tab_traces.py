"""The public traces' artifacts: what their ids can and cannot show, and how much the
conclusions drawn from them lean on a reader's assumption (paper §3, "Trace artifacts").

* **WEKA** ids are numbered per file (``hash_id_scope: "local"``): the reader gives every
  file its own namespace, so no id is shared between two files — sharing between sessions
  (two users' identical Claude Code system prompt and tool definitions) is impossible by
  construction. Counted here: ids shared across files (0 by construction, checked) and the
  hit tokens that cross a session boundary *inside* a file (a sub-agent and its parent).
  The released v8 set was filtered upstream to conversations with a cache rate of at least
  60 % (``SOURCE.md``, repo CHANGELOG): recorded here as a constant with its source.
  Prompts are as long as Claude served them; the requests longer than Llama-3.1-8B's
  context (the model of the concurrent experiments) are counted under each engine's rule
  (:func:`radixkv.replay.context.apply_context_limit`: vLLM serves P ≤ L − 1, SGLang
  P ≤ L − 7).
* **Mooncake**: 512-token hash blocks, no session ids; the same context count.
* **RAGPulse**: content ids of chunks, chained into prefixes by the reader in a component
  order the trace does not document. The infinite-cache token hit rate is computed for
  each order with the system prompt first and the question last (the 3! orders of
  passages, history and web search), beside the reader's default; and the prompt lengths
  (for C18: these are ~3 k-token RAG prompts, not long documents).

    python experiments/tab_traces.py [--quick]     # -> results/traces.json (seconds)
"""
from __future__ import annotations

import itertools

import _common as C  # noqa: I001

import numpy as np

from radixkv.memory.presets import get_model
from radixkv.replay.context import apply_context_limit
from radixkv.trace.load import load_trace
from radixkv.trace.stats import infinite_cache_hits

MODEL = "Llama-3.1-8B"  # the model of fig_concurrent / fig_routing_concurrent / fig_hicache
#: kv-cache-tester's CHANGELOG for the v8 set (shared/traces/weka-claude-code/SOURCE.md)
WEKA_FILTER = {"min_cache_rate": 0.60, "source": "callanjfox/kv-cache-tester CHANGELOG (v8 set), quoted in "
                                                 "shared/traces/weka-claude-code/SOURCE.md"}
RAG_DEFAULT = ("sys_prompt", "passages_ids", "history", "web_search", "user_input")


def _context(tr, L: int) -> dict:
    P = np.asarray(tr.prompt_len, dtype=np.int64)
    out = {"max_prompt_tokens": int(P.max()), "requests": int(len(tr))}
    for engine in ("vllm", "sglang"):
        _, info = apply_context_limit(tr, L, engine)
        rej = set(info.rejected_ids)
        mask = np.array([r in rej for r in tr.req_id], dtype=bool)
        out[engine] = {"refused_requests": int(mask.sum()), "refused_share": float(mask.mean()),
                       "refused_prompt_token_share": float(P[mask].sum() / P.sum())}
    return out


def weka(L: int) -> dict:
    tr = C.load("weka")
    sess = np.asarray(tr.session_id)
    files = np.array([s.split("/")[0] for s in sess])
    ids = np.asarray(tr.ids, dtype=np.int64)
    off = np.asarray(tr.id_offsets, dtype=np.int64)
    owner: dict = {}
    cross_file_ids = 0
    for i in range(len(tr)):
        for x in np.unique(ids[off[i]:off[i + 1]]).tolist():
            f = owner.setdefault(x, files[i])
            if f != files[i]:
                cross_file_ids += 1
                owner[x] = None  # count each id once
    return {"files": int(len(np.unique(files))), "sessions": int(len(np.unique(sess))),
            "subagent_sessions": int(sum("/" in s for s in np.unique(sess))),
            "ids_shared_across_files": cross_file_ids, "id_scope": "per file (hash_id_scope local)",
            "upstream_filter": WEKA_FILTER, "context": _context(tr, L)}


def mooncake(L: int) -> dict:
    tr = C.load("mooncake")
    return {"unit_tokens": int(tr.unit_tokens), "has_sessions": tr.session_id is not None,
            "context": _context(tr, L)}


def ragpulse(quick: bool) -> dict:
    C.load("ragpulse")  # provenance (sha256 of the file read below)
    path = C.shared(C.TRACES["ragpulse"][0])
    middles = list(itertools.permutations(RAG_DEFAULT[1:4]))
    if quick:
        middles = middles[:2]
    rows = []
    for mid in middles:
        order = (RAG_DEFAULT[0], *mid, RAG_DEFAULT[4])
        tr = load_trace(path, order=order)
        P = np.asarray(tr.prompt_len, dtype=np.int64)
        hit = infinite_cache_hits(tr)
        rows.append({"order": list(order), "default": order == RAG_DEFAULT,
                     "token_hit_rate": float(hit.sum() / P.sum())})
        print(f"ragpulse {' > '.join(order)}: {rows[-1]['token_hit_rate']:.4f}", flush=True)
    rates = [r["token_hit_rate"] for r in rows]
    P = np.asarray(C.load("ragpulse").prompt_len, dtype=np.int64)
    return {"orders": rows, "token_hit_rate_min": min(rates), "token_hit_rate_max": max(rates),
            "token_hit_rate_default": next(r["token_hit_rate"] for r in rows if r["default"]),
            "prompt_tokens": {"p50": float(np.median(P)), "p99": float(np.percentile(P, 99)), "max": int(P.max()),
                              "mean": float(P.mean())}}


def main() -> None:
    L = int(get_model(MODEL).max_position_embeddings)
    doc = {"model": MODEL, "max_model_len": L, "weka": weka(L), "mooncake": mooncake(L),
           "ragpulse": ragpulse(C.QUICK)}
    w = doc["weka"]["context"]["vllm"]
    print(f"weka: {w['refused_requests']} of {doc['weka']['context']['requests']} requests over {L:,} tokens; "
          f"{doc['weka']['ids_shared_across_files']} ids shared across files", flush=True)
    C.write_result("traces.json", doc, {"model": MODEL, "max_model_len": L, "ragpulse_orders":
                                        "system prompt first, question last, 3! orders of the rest"})


if __name__ == "__main__":
    main()
