#!/usr/bin/env python3
"""Golden per-request hits of SGLang 0.5.23's radix cache with chunked prefill on.

Runs ``sglang_replay.py`` (this folder: the real ``UnifiedRadixCache``, default Rust tree
core, the real token / paged allocators) with ``--chunked-prefill-size`` and the default
``--chunk-rule adder``: SGLang's own ``PrefillAdder`` admits each request and picks every
chunk end (``add_one_req`` for the first pass, ``add_chunked_req`` for each later one),
and every middle chunk is published with ``checkpoint_kv_cache`` (``stash_chunked_request``,
the former ``cache_unfinished_req``) before the next chunk is allocated. Requests run one
at a time, in trace order, on pools small enough to evict. Writes
``<out>/<name>.jsonl`` (one line per request: ``id``, ``prompt_len``, ``hit_tokens``,
``chunk_ends`` = the ``extend_end`` of every prefill pass, ``evicted_tokens``,
``cached_after``, ...) and ``<out>/manifest.jsonl``. Needs the SGLang 0.5.23 CPU venv
(``/work/shared/golden/harness/README-sglang.md``; about 5 minutes on 2 cores)::

    HF_HUB_OFFLINE=1 $SGLANG_VENV/bin/python tools/engines/gen_sglang_chunked_goldens.py \\
        --traces tests/data/golden/traces --out tests/data/golden/sglang_chunked \\
        [--shared $RADIXKV_SHARED] [--only NAME] [--list]

Runs on the token traces of ``tests/data/golden/traces`` always; with ``--shared`` also on
real-trace slices (Mooncake conversation, first 300 lines; WEKA ``trace_0001`` and
``trace_0002``, which have no sub-agents),
expanded to token ids by the convention of ``shared/golden/README.md`` ("Traces and
conventions": hash id h of a U-token unit = tokens ``h*U .. h*U+U-1``, Mooncake's last
unit cut to ``input_length``, WEKA's trailing ``in - 64*len(hash_ids)`` tokens and all
outputs unique, from one counter above every unit token, in replay order).

Two chunk sizes per page size matter: a multiple of the page (SGLang's defaults 2048 ..
16384 are multiples of every page size), and one that is not (``add_chunked_req`` does
not round a continuing chunk to a page, so chunk ends after the first drift off the page
grid and the tree's node boundaries with them).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: (trace name, page_size, capacity_tokens, chunked_prefill_size)
RUNS = (
    ("mixed200.jsonl", 1, 1904, 64),
    ("mixed200.jsonl", 1, 1904, 256),
    ("mixed200.jsonl", 16, 1904, 64),
    ("mixed200.jsonl", 16, 1904, 100),
    ("edge300.jsonl", 1, 640, 48),
    ("edge300.jsonl", 16, 640, 64),
    ("edge300.jsonl", 16, 640, 40),
    ("mixed200.jsonl", 4, 1904, 50),
    ("mixed200.jsonl", 16, 1904, 40),
    ("edge300.jsonl", 16, 448, 40),
    ("moon_conv_300.jsonl", 1, 131072, 4096),
    ("moon_conv_300.jsonl", 16, 131072, 4096),
    ("moon_conv_300.jsonl", 16, 131072, 3000),
    ("weka_0001.jsonl", 1, 211200, 8192),
    ("weka_0001.jsonl", 64, 211200, 8192),
    ("weka_0002.jsonl", 1, 100000, 2048),
    ("weka_0002.jsonl", 64, 99968, 3000),
)
#: shared trace name -> (path under RADIXKV_SHARED, format, first K requests)
SHARED = {
    "moon_conv_300.jsonl": ("traces/mooncake-fast25/conversation_trace.jsonl", "mooncake", 300),
    "weka_0001.jsonl": ("traces/weka-claude-code/traces/trace_0001.json", "weka", None),
    "weka_0002.jsonl": ("traces/weka-claude-code/traces/trace_0002.json", "weka", None),
}


def run_name(trace: str, ps: int, cap: int, chunk: int) -> str:
    """``sglang_<trace stem>_p<page>_c<capacity>_chunk<chunk>``."""
    stem = trace.split(".")[0].replace("moon_conv_", "mooncake_conv").replace("weka_", "weka")
    return f"sglang_{stem}_p{ps}_c{cap}_chunk{chunk}"


def _mooncake_tokens(path, limit):
    reqs = []
    with open(path) as f:
        for i, line in enumerate(f):
            if limit and i >= limit:
                break
            r = json.loads(line)
            reqs.append((f"r{i}", r["hash_ids"], r["input_length"], r["output_length"]))
    U = 512
    top = (max(max(h) for _, h, _, _ in reqs) + 1) * U
    for rid, hs, n_in, n_out in reqs:
        toks = [h * U + t for h in hs for t in range(U)][:n_in]
        assert len(toks) == n_in, rid
        out = list(range(top, top + n_out))
        top += n_out
        yield {"id": rid, "tokens": toks, "output_tokens": out}


def _weka_tokens(path, limit):
    d = json.load(open(path))
    U = 64
    flat = []

    def walk(rs):
        for r in rs:
            if r.get("type") == "subagent":
                walk(r.get("requests", []))
            else:
                flat.append(r)

    walk(d["requests"])
    order = sorted(range(len(flat)), key=lambda k: (flat[k]["t"], k))
    flat = [flat[k] for k in order][: limit or None]
    top = (max(max(r["hash_ids"]) for r in flat) + 1) * U
    for i, r in enumerate(flat):
        toks = [h * U + t for h in r["hash_ids"] for t in range(U)]
        tail = r["in"] - len(toks)
        assert tail >= 0
        toks += list(range(top, top + tail))
        top += tail
        out = list(range(top, top + r["out"]))
        top += r["out"]
        yield {"id": f"r{i}", "tokens": toks, "output_tokens": out}


def trace_file(name: str, traces: str, shared: str | None, tmp: str) -> str | None:
    """Path of a token trace for *name* (None: a shared trace without ``--shared``)."""
    if name not in SHARED:
        return os.path.join(traces, name)
    if shared is None:
        return None
    out = os.path.join(tmp, name)
    if not os.path.exists(out):
        rel, fmt, limit = SHARED[name]
        gen = _mooncake_tokens if fmt == "mooncake" else _weka_tokens
        with open(out, "w") as f:
            for r in gen(os.path.join(shared, rel), limit):
                f.write(json.dumps(r) + "\n")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="tests/data/golden/traces", help="folder of the token traces")
    ap.add_argument("--out", default="tests/data/golden/sglang_chunked")
    ap.add_argument("--shared", default=None, help="RADIXKV_SHARED folder: add the Mooncake / WEKA runs")
    ap.add_argument("--only", default=None, help="comma-separated run names")
    ap.add_argument("--list", action="store_true", help="print the run names and stop")
    a = ap.parse_args(argv)
    runs = [(run_name(*r), *r) for r in RUNS]
    if a.list:
        for r in runs:
            print(r[0])
        return
    only = set(a.only.split(",")) if a.only else None
    import sglang_replay  # the SGLang venv is needed from here on

    os.makedirs(a.out, exist_ok=True)
    mpath = os.path.join(a.out, "manifest.jsonl")
    manifest = {}
    if os.path.exists(mpath):
        for line in open(mpath):
            m = json.loads(line)
            manifest[m["name"]] = m
    tmp = tempfile.mkdtemp(prefix="sglang_chunked_")
    for name, trace, ps, cap, chunk in runs:
        if only is not None and name not in only:
            continue
        path = trace_file(trace, a.traces, a.shared, tmp)
        if path is None:
            print(f"{name}: skipped (needs --shared)", file=sys.stderr)
            continue
        args = sglang_replay.parse_args([
            "--trace", path, "--out", "-", "--page-size", str(ps), "--capacity-tokens", str(cap),
            "--chunked-prefill-size", str(chunk), "--check", "--quiet"])
        rep = sglang_replay.SGLangReplayer(args)
        t0 = time.perf_counter()
        recs = []
        for rid, prompt, output, prio in sglang_replay.iter_trace(args.trace):
            recs.append(rep.run_request(rid, prompt, output, prio))
            rep.check()
        dt = time.perf_counter() - t0
        bad = [r["id"] for r in recs if r["status"] != "ok"]
        if bad:
            raise SystemExit(f"{name}: requests rejected or clipped by the pool: {bad[:5]}")
        tmpf = os.path.join(a.out, name + ".jsonl.tmp")
        with open(tmpf, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        os.replace(tmpf, os.path.join(a.out, name + ".jsonl"))
        hit = sum(r["hit_tokens"] for r in recs)
        ev = sum(r["evicted_tokens"] for r in recs)
        chunked = sum(len(r["chunk_ends"]) > 1 for r in recs)
        manifest[name] = {
            "name": name, "engine": "sglang 0.5.23", "impl": rep.impl_name, "tree_core": rep.tree_core_name,
            "trace": trace, "shared": trace in SHARED, "page_size": ps, "capacity_tokens": cap,
            "chunked_prefill_size": chunk, "requests": len(recs),
            "prompt_tokens": sum(r["prompt_len"] for r in recs), "hit_tokens": hit,
            "evicted_tokens": ev, "chunked_requests": chunked,
        }
        print(f"{name}: hit {hit}, evicted {ev}, {chunked} of {len(recs)} chunked, {dt:.1f}s", file=sys.stderr)
    order = [r[0] for r in runs]
    with open(mpath + ".tmp", "w") as f:
        for n in order:
            if n in manifest:
                f.write(json.dumps(manifest[n]) + "\n")
    os.replace(mpath + ".tmp", mpath)


if __name__ == "__main__":
    main()
