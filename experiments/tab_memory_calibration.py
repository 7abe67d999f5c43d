"""Table: radixkv's memory model against published start-up logs, and the KV bytes per token
and per request the paper quotes for C12/C16 (MHA vs GQA vs MLA, 7B/8B vs 70B).

Reads the calibration set ``tests/data/memory_calibration.json`` (published vLLM/SGLang
start-up logs, each with its source) and recomputes every entry with
``radixkv.memory.calibration.recompute``; the per-token figures come from
``ModelSpec.kv_bytes_per_token``, and each row names the calibration entries whose logs
reproduce that exact figure. Pure arithmetic, under a second; no trace is read.

    python experiments/tab_memory_calibration.py     # writes results/memory_calibration.json

Keys (for ``$memory_calibration/...`` in the paper template):

* ``entries``: one dict per log (``id``, ``engine``, ``rules_version``, ``model``,
  ``attention``, ``kv_cache_dtype``, ``gpu``, ``tp``, ``source``, ``kv_bytes_per_token``,
  ``bpt_exact``, ``inputs_logged``, ``logged_tokens``, ``model_tokens``, ``pool_err_pct``,
  ``logged_kv_gib``, ``model_kv_gib``, ``kv_gib_err_pct``, ``explanation``).
* ``summary/{vllm,sglang,all}``: ``entries``, ``median_pool_err_pct``,
  ``worst_pool_err_pct``, ``median_abs_pool_err_pct``, ``median_kv_gib_err_pct``,
  ``worst_kv_gib_err_pct``, ``within_5pct``.
* ``coverage``: ``entries``, ``models``, ``gpus``, ``tps``, ``bpt_exact``,
  ``bpt_checkable``, ``inputs_logged``, ``inputs_logged_worst_pool_err_pct``.
* ``kv_per_token``: one dict per (model, KV dtype, tp) (``key`` like
  ``Llama-3.1-8B/bf16/tp1``): ``attention``, ``kv_bytes_per_token_per_rank``,
  ``kv_bytes_per_token_total`` (summed over the ``tp`` ranks: an MLA latent is held whole
  by every rank, so at TP 8 it counts 8 times; the TP 1 row is one copy),
  ``kv_kib_per_token_total``, ``request_gib_4k_total``,
  ``request_gib_32k_total``, ``tokens_in_12gb`` (a 12 GB decimal pool on one rank),
  ``confirmed_by`` (calibration ids whose log reproduces this per-rank figure).
"""
from __future__ import annotations

import statistics

import _common as C  # noqa: I001 (puts the repository on sys.path)

from radixkv.memory import get_model
from radixkv.memory.calibration import entry_model, load_calibration, recompute

DATA = C.REPO / "tests" / "data" / "memory_calibration.json"
GIB = 2 ** 30

#: (model, KV dtype, tp) rows for C12/C16: MHA and GQA 7B/8B, 70B at TP 1 and 8, MLA.
KV_ROWS = [
    ("Llama-2-7B", "auto", 1), ("Llama-3.1-8B", "auto", 1), ("Llama-3.1-8B", "fp8", 1),
    ("Mistral-7B", "auto", 1), ("Qwen2.5-7B", "auto", 1),
    ("Llama-3.1-70B", "auto", 1), ("Llama-3.1-70B", "auto", 8),
    ("DeepSeek-V3", "auto", 1), ("DeepSeek-V3", "auto", 8), ("DeepSeek-V3", "fp8_ds_mla", 8),
    ("DeepSeek-V3.2-Exp", "fp8_ds_mla", 8),
]


def _attention(m) -> str:
    return "MLA" if m.is_mla else ("MHA" if m.num_kv_heads == m.num_attention_heads else "GQA")


def _summary(rows: list[dict]) -> dict:
    pe = [r["pool_err_pct"] for r in rows]
    ke = [r["kv_gib_err_pct"] for r in rows if r["kv_gib_err_pct"] is not None]
    return {
        "entries": len(rows),
        "median_pool_err_pct": statistics.median(pe),
        "median_abs_pool_err_pct": statistics.median(abs(x) for x in pe),
        "worst_pool_err_pct": max(pe, key=abs),
        "median_kv_gib_err_pct": statistics.median(ke) if ke else None,
        "worst_kv_gib_err_pct": max(ke, key=abs) if ke else None,
        "within_5pct": sum(abs(x) <= 5 for x in pe),
    }


def main() -> None:
    entries = load_calibration(DATA)
    rows = []
    for e in entries:
        r = recompute(e)
        m = entry_model(e)
        s = e["source"]
        src = (f"{s['repo']}:{s['path']}@{s['commit'][:12]}" if s["kind"] == "file"
               else f"{s['repo']}#{s['number']}")
        rows.append({
            "id": e["id"], "engine": e["engine"], "rules_version": e["rules_version"],
            "engine_version": e["engine_version"], "model": e["model"],
            "hf_model": e["hf_model"], "attention": _attention(m),
            "kv_cache_dtype": e.get("kv_cache_dtype", "auto"), "gpu": e["gpu"], "tp": e["tp"],
            "source": src,
            "kv_bytes_per_token": r["kv_bytes_per_token"], "bpt_exact": r["bpt_exact"],
            "inputs_logged": r["inputs_logged"],
            "logged_tokens": r["logged_tokens"], "model_tokens": r["model_tokens"],
            "pool_err_pct": r["pool_err_pct"], "logged_kv_gib": r["logged_kv_gib"],
            "model_kv_gib": r["model_kv_gib"], "kv_gib_err_pct": r["kv_gib_err_pct"],
            "explanation": e.get("explanation", ""),
        })
    summary = {eng: _summary([r for r in rows if r["engine"] == eng]) for eng in ("vllm", "sglang")}
    summary["all"] = _summary(rows)
    full = [r for r in rows if r["inputs_logged"]]
    coverage = {
        "entries": len(rows),
        "models": sorted({r["model"] for r in rows}),
        "gpus": sorted({r["gpu"] for r in rows if r["gpu"]}),
        "tps": sorted({r["tp"] for r in rows}),
        "bpt_exact": sum(r["bpt_exact"] is True for r in rows),
        "bpt_checkable": sum(r["bpt_exact"] is not None for r in rows),
        "inputs_logged": len(full),
        "inputs_logged_worst_pool_err_pct": max((r["pool_err_pct"] for r in full), key=abs)
        if full else None,
    }
    kv_rows = []
    for name, dt, tp in KV_ROWS:
        m = get_model(name)
        per_rank = m.kv_bytes_per_token(tp, dt)
        total = m.kv_bytes_per_token_total(tp, dt)
        label = m.dtype if dt == "auto" else dt
        kv_rows.append({
            "key": f"{name}/{label}/tp{tp}", "model": name, "attention": _attention(m),
            "kv_cache_dtype": label, "tp": tp,
            "kv_bytes_per_token_per_rank": per_rank, "kv_bytes_per_token_total": total,
            "kv_kib_per_token_total": total / 1024,
            "request_gib_4k_total": total * 4096 / GIB,
            "request_gib_32k_total": total * 32768 / GIB,
            "tokens_in_12gb": int(12e9 // per_rank),
            "confirmed_by": [r["id"] for r in rows if r["model"] == name and r["tp"] == tp
                             and r["kv_cache_dtype"] == dt and r["bpt_exact"]
                             and r["kv_bytes_per_token"] == per_rank],
        })
    doc = {"entries": rows, "summary": summary, "coverage": coverage, "kv_per_token": kv_rows}
    C.write_result("memory_calibration.json", doc, {
        "calibration_file": "tests/data/memory_calibration.json", "kv_rows": KV_ROWS})


if __name__ == "__main__":
    main()
