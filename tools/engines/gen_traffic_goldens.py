#!/usr/bin/env python3
"""Golden per-request hits of the real engines on the issue-33 traffic trace: cache salts,
LoRA adapters and images (tests/data/golden/traffic/traffic.jsonl, written by
make_traffic_trace.py).

Runs, in one process per engine, the harnesses of this folder over every run below and
writes ``<out>/<engine>_<trace>_<size>_<pool>.jsonl`` plus ``<out>/manifest_<engine>.jsonl``:

* vLLM 0.33 (``vllm_replay.py``: the real ``KVCacheManager`` and block hasher, each
  request's ``cache_salt``, ``LoRARequest`` and ``MultiModalFeatureSpec`` items);
* SGLang 0.5.23 (``sglang_replay.py``: the real ``UnifiedRadixCache``, each ``Req``'s
  ``cache_salt`` and ``lora_id``, the prompt padded by ``pad_mm_tokens``).

Each trace is run as written and with its salts removed (``nosalt``: ``cache_salt`` dropped
from every line), so the goldens also give the price of isolation::

    $VLLM_VENV/bin/python tools/engines/gen_traffic_goldens.py --engine vllm --out tests/data/golden/traffic
    $SGLANG_VENV/bin/python tools/engines/gen_traffic_goldens.py --engine sglang --out tests/data/golden/traffic

(vLLM: about 3 minutes, most of it importing vllm; SGLang: about a minute.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

#: engine -> (size, pool) runs; vLLM pools in num_gpu_blocks (block 0 reserved), SGLang in tokens
RUNS = {
    "vllm": [(16, 100000), (16, 90), (16, 200), (32, 60)],
    "sglang": [(1, 1000000), (1, 1500), (1, 3200), (16, 1600)],
}
TRACES = ("traffic.jsonl",)


def _nosalt(path: str, tmpdir: str) -> str:
    out = os.path.join(tmpdir, "nosalt_" + os.path.basename(path))
    with open(path) as f, open(out, "w") as g:
        for line in f:
            if line.strip():
                r = json.loads(line)
                r.pop("cache_salt", None)
                g.write(json.dumps(r) + "\n")
    return out


def _write(path: str, recs) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def run_vllm(trace_path, size, pool):
    import vllm_replay

    rp = vllm_replay.VllmPrefixCacheReplayer(block_size=size, num_blocks=pool, count_evictions=True)
    recs = [rp.replay_one(rid, prompt, output, **keys) for rid, prompt, output, keys in vllm_replay.read_trace(trace_path)]
    return recs, {"engine": f"vllm {rp.version}", "block_size": size, "num_gpu_blocks": pool}


def run_sglang(trace_path, size, pool):
    import sglang_replay

    args = sglang_replay.parse_args(["--trace", trace_path, "--out", "-", "--page-size", str(size),
                                     "--capacity-tokens", str(pool), "--check", "--quiet"])
    rep = sglang_replay.SGLangReplayer(args)
    recs = []
    for rid, prompt, output, prio, keys in sglang_replay.iter_trace_keys(trace_path):
        recs.append(rep.run_request(rid, prompt, output, prio, **keys))
        rep.check()
    return recs, {"engine": "sglang 0.5.23", "impl": rep.impl_name, "tree_core": rep.tree_core_name,
                  "page_size": size, "capacity_tokens": pool}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=sorted(RUNS), required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    run = run_vllm if a.engine == "vllm" else run_sglang
    manifest = []
    with tempfile.TemporaryDirectory() as tmp:
        for trace in TRACES:
            src = os.path.join(a.out, trace)
            for variant, path in (("", src), ("nosalt_", _nosalt(src, tmp))):
                for size, pool in RUNS[a.engine]:
                    t0 = time.perf_counter()
                    recs, meta = run(path, size, pool)
                    tag = "b" if a.engine == "vllm" else "p"
                    unit = "n" if a.engine == "vllm" else "c"
                    name = f"{a.engine}_{variant}{trace.split('.')[0]}_{tag}{size}_{unit}{pool}"
                    _write(os.path.join(a.out, name + ".jsonl"), recs)
                    hit = sum(r.get("hit_tokens", 0) for r in recs)
                    errors = sum(1 for r in recs if "error" in r or r.get("status") not in (None, "ok"))
                    manifest.append({"name": name, "trace": trace, "salts": not variant, **meta,
                                     "requests": len(recs), "hit_tokens": hit, "not_ok": errors})
                    print(name, hit, errors, f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)
    _write(os.path.join(a.out, f"manifest_{a.engine}.jsonl"), manifest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
