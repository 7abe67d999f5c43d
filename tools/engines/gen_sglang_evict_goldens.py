#!/usr/bin/env python3
"""Golden per-request hits of SGLang 0.5.23's RadixCache under each eviction policy.

Runs ``sglang_replay.py`` (this folder; the real ``UnifiedRadixCache``, default tree
core) in one process for every policy x run below and writes
``<out>/sglang_<policy>_<trace>_p<page>_c<capacity>.jsonl`` plus ``<out>/manifest.jsonl``.
Needs an SGLang 0.5.23 CPU venv (README-sglang.md of the harness)::

    $SGLANG_VENV/bin/python tools/engines/gen_sglang_evict_goldens.py \\
        --traces tests/data/golden/traces --out tests/data/golden/sglang_evict

Conventions: the token traces carry no request priority, so every request has
``priority=None`` (SGLang: ``req.priority or 0``); ``tlru`` runs with
``TLRU_CONFIG`` (SGLang's defaults 0/0 make it plain LRU); ``slru`` with SGLang's
default ``protected_threshold=2``. The waiting-prefix refresh is LRU-only in SGLang and
so is off for every other policy (sglang_replay.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_replay  # noqa: E402

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")
#: (trace file, page_size, capacity_tokens): tight pools that evict
RUNS = (
    ("mixed200.jsonl", 1, 1904),
    ("mixed200.jsonl", 16, 1904),
    ("edge300.jsonl", 1, 640),
    ("edge300.jsonl", 16, 640),
)
TLRU_CONFIG = {"threshold": 96, "next_prompt_estimate": 32}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", required=True, help="folder holding the token traces")
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", default=",".join(POLICIES))
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    manifest = []
    for pol in a.policies.split(","):
        for trace, ps, cap in RUNS:
            name = f"sglang_{pol}_{trace.split('.')[0]}_p{ps}_c{cap}"
            argv = ["--trace", os.path.join(a.traces, trace), "--out", "-", "--page-size", str(ps),
                    "--capacity-tokens", str(cap), "--eviction-policy", pol, "--check", "--quiet"]
            cfg = TLRU_CONFIG if pol == "tlru" else None
            if cfg:
                argv += ["--eviction-policy-config", json.dumps(cfg)]
            args = sglang_replay.parse_args(argv)
            rep = sglang_replay.SGLangReplayer(args)
            t0 = time.perf_counter()
            recs = []
            for rid, prompt, output, prio in sglang_replay.iter_trace(args.trace):
                recs.append(rep.run_request(rid, prompt, output, prio))
                rep.check()
            dt = time.perf_counter() - t0
            tmp = os.path.join(a.out, name + ".jsonl.tmp")
            with open(tmp, "w") as f:
                for r in recs:
                    f.write(json.dumps(r) + "\n")
            os.replace(tmp, os.path.join(a.out, name + ".jsonl"))
            hit = sum(r["hit_tokens"] for r in recs)
            manifest.append({"name": name, "engine": "sglang 0.5.23", "impl": rep.impl_name,
                             "tree_core": rep.tree_core_name, "trace": trace, "page_size": ps,
                             "capacity_tokens": cap, "eviction_policy": pol,
                             "eviction_policy_config": cfg, "hit_tokens": hit})
            print(name, hit, f"{dt:.1f}s", file=sys.stderr)
    tmp = os.path.join(a.out, "manifest.jsonl.tmp")
    with open(tmp, "w") as f:
        for m in manifest:
            f.write(json.dumps(m) + "\n")
    os.replace(tmp, os.path.join(a.out, "manifest.jsonl"))


if __name__ == "__main__":
    main()
