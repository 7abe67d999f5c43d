"""Table: fidelity — radixkv's caches against the real engines' golden runs.

Every golden run in ``$RADIXKV_SHARED/golden`` (vLLM 0.33.0 and SGLang 0.5.23, each
request run alone on CPU; golden/README.md) is replayed through ``BlockHashCache`` /
``RadixCache`` with the run's pool and block/page size; a request whose hit tokens differ
from the engine's is a mismatch.

    python experiments/tab_fidelity.py [--quick]    # writes results/fidelity.json

About 1 min on 2 idle cores (the same in --quick).
"""
from __future__ import annotations

import _common as C  # noqa: I001

import json
import sys

from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.trace.load import load_trace

#: golden trace name → (path under $RADIXKV_SHARED, format, first requests)
SHARED = {"moon_conv_1500.jsonl": ("traces/mooncake-fast25/conversation_trace.jsonl", "mooncake", 1500),
          "weka_0001.jsonl": ("traces/weka-claude-code/traces/trace_0001.json", "weka", None)}


def _trace(name: str):
    if name in SHARED:
        rel, fmt, limit = SHARED[name]
        C._READ[name] = {"path": "$RADIXKV_SHARED/" + rel, "sha256": C.sha256_path(C.shared(rel))}
        return load_trace(C.shared(rel), format=fmt).head(limit)
    p = C.shared("golden", "traces", name)
    C._READ[name] = {"path": "$RADIXKV_SHARED/golden/traces/" + name, "sha256": C.sha256_path(p)}
    return load_trace(p, format="native")


def main() -> None:
    runs = []
    for engine in ("vllm", "sglang"):
        for line in C.shared("golden", engine, "manifest.jsonl").read_text().splitlines():
            if not line.strip():
                continue
            m = json.loads(line)
            gold = [json.loads(x) for x in C.shared("golden", engine, f"{m['name']}.jsonl").read_text().splitlines() if x]
            tr = _trace(m["trace"])
            if engine == "vllm":
                cache = BlockHashCache(m["num_gpu_blocks"], m["block_size"])
            else:
                cache = RadixCache(m["capacity_tokens"], m["page_size"])
            bad = 0
            for i in range(len(tr)):
                a = cache.run_request(i, tr.kv_seq(i))
                if a is None or a.hit_tokens != gold[i]["hit_tokens"] or gold[i]["id"] != tr.req_id[i]:
                    bad += 1
            runs.append({"name": m["name"], "engine": m["engine"], "trace": m["trace"], "requests": len(tr),
                         "hit_tokens": sum(g["hit_tokens"] for g in gold), "mismatching_requests": bad})
            print(f"{m['name']}: {bad} of {len(tr)} mismatching", flush=True)
    doc = {"runs": runs, "total_runs": len(runs), "total_requests": sum(r["requests"] for r in runs),
           "total_mismatching_requests": sum(r["mismatching_requests"] for r in runs),
           "vllm_runs": sum(r["engine"].startswith("vllm") for r in runs),
           "sglang_runs": sum(r["engine"].startswith("sglang") for r in runs),
           "scheduler": scheduler_goldens()}
    C.write_result("fidelity.json", doc, {"golden": "$RADIXKV_SHARED/golden/{vllm,sglang}/manifest.jsonl",
                                          "replay": "sequential, each request alone",
                                          "scheduler_golden": "tests/data/concurrent/vllm/*.jsonl (step level, "
                                                              "vLLM 0.33 v1 Scheduler on CPU)"})


def scheduler_goldens() -> dict:
    """The concurrent replay against vLLM's real scheduler, step by step.

    Every golden in ``tests/data/concurrent/vllm`` (vLLM 0.33's v1 ``Scheduler`` driven on
    CPU by ``tools/engines/vllm_scheduler_golden.py``) is replayed on a step clock and
    compared request by request (first-admission hit, admission and finish steps,
    preemptions) and step by step (scheduled requests and token counts, preemptions), by
    ``tests/_vllm_sched_golden.py``. SGLang's scheduler has per-rule tests, not goldens."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_vllm_sched_golden", C.REPO / "tests" / "_vllm_sched_golden.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    rows = []
    for p in mod.golden_files():
        c = mod.compare(mod.load_golden(p))
        rows.append({"name": p.stem, "requests": c.n_requests, "steps": c.n_steps,
                     "mismatching_requests": len(c.requests), "mismatching_steps": len(c.steps)})
        print(f"scheduler {p.stem}: {c.summary()}", flush=True)
    return {"runs": rows, "total_runs": len(rows), "total_requests": sum(r["requests"] for r in rows),
            "total_steps": sum(r["steps"] for r in rows),
            "total_mismatching_requests": sum(r["mismatching_requests"] for r in rows),
            "total_mismatching_steps": sum(r["mismatching_steps"] for r in rows)}


if __name__ == "__main__":
    main()
