"""Benchmark: radixkv beside the other prefix-cache simulators, whole processes, one input.

The input is the shared yardstick (``$RADIXKV_SHARED/bench/gen_peers_trace.py``: 2,000
chat/RAG requests, 4,452,479 prompt tokens) and its pool, 2,048 usable blocks of 16 tokens
(32,768 tokens), prompts only (outputs not cached: what kvlint and kvcache-simulator model).
Each row runs as its own process on the same file (written once in the tool's own format);
every command runs once untimed, then ``--repeat`` rounds alternate them; printed: best-of-N
wall and CPU time (child user + system), hits, and the ratio to the radixkv row of the same
model. The load average is printed too (a shared machine: CPU time is the stable figure).

=================================  ====================================================
radixkv ``vllm:16`` (2,049 blocks)  kvlint ``VLLMBlockSimulator(16, 2048)``
radixkv ``sglang:1`` (32,768)       kvlint ``SGLangRadixSimulator(32768, 1)``; SGLang
                                    0.5.23's own ``UnifiedRadixCache`` on CPU (the golden
                                    harness ``golden/harness/sglang_replay.py``; its own
                                    replay time is printed apart from its 15–25 s import)
radixkv ``unit-lru`` on the 16-token  kvcache-simulator ``run --policies lru`` (C++) at
hash ids (2,048 units), hits of the   4 GiB = 2,048 blocks of llama-3.1-8b (2 MiB each);
second half of the requests           it counts hits over the last 50 % of requests
=================================  ====================================================

None of the peers is a radixkv dependency. ``--peer-python`` is a Python with
``kvlint`` and ``kvcache-simulator`` installed (``pip install kvlint kvcache-simulator``);
``--sglang-python`` one with SGLang 0.5.23 installed as ``golden/harness/README-sglang.md``
says (CPU torch); a peer whose interpreter is not given is skipped.

    python experiments/bench_peers.py --peer-python VENV/bin/python [--sglang-python SGL/bin/python] [--repeat 3]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_process import run_timed

HERE = Path(__file__).resolve().parent
BLOCK, BLOCKS = 16, 2048

_KVLINT = r"""
import json, sys
from kvlint.sim.sglang_radix import SGLangRadixSimulator
from kvlint.sim.vllm_blocks import VLLMBlockSimulator
sim = VLLMBlockSimulator(16, 2048) if sys.argv[2] == "vllm" else SGLangRadixSimulator(32768, 1)
hit = prompt = 0
with open(sys.argv[1]) as f:
    for line in f:
        r = json.loads(line)
        hit += sim.feed_tokens(r["request_id"], r["token_ids"]).cached_tokens
        prompt += len(r["token_ids"])
print(json.dumps({"hit_tokens": hit, "prompt_tokens": prompt}))
"""


def write_inputs(tmp: Path) -> dict:
    """The yardstick trace in each tool's format; returns their paths."""
    subprocess.run([sys.executable, str(Path(os.environ.get("RADIXKV_SHARED", HERE.parent.parent / "shared"))
                                        / "bench" / "gen_peers_trace.py")],
                   cwd=tmp, check=True, stderr=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (tmp / "trace_tokens.jsonl").read_text().splitlines()]
    hashes = [json.loads(x) for x in (tmp / "trace_mooncake.jsonl").read_text().splitlines()]
    with open(tmp / "tokens.jsonl", "w") as f:  # radixkv native, prompts only
        for r in rows:
            f.write(json.dumps({"id": r["request_id"], "tokens": r["token_ids"], "output_length": 0,
                                "arrival_s": r["timestamp"]}) + "\n")
    with open(tmp / "hashes.jsonl", "w") as f:  # radixkv native, 16-token hash ids
        f.write(json.dumps({"radixkv_trace": 1, "unit_tokens": BLOCK, "partial_last_unit": False}) + "\n")
        for r, h in zip(rows, hashes):
            f.write(json.dumps({"id": r["request_id"], "hash_ids": h["hash_ids"], "input_length": h["input_length"],
                                "output_length": 0, "arrival_s": r["timestamp"]}) + "\n")
    with open(tmp / "sglang.jsonl", "w") as f:  # the SGLang harness's input
        for r in rows:
            f.write(json.dumps({"id": r["request_id"], "tokens": r["token_ids"]}) + "\n")
    return {"tokens": tmp / "tokens.jsonl", "hashes": tmp / "hashes.jsonl", "sglang": tmp / "sglang.jsonl",
            "peers_tokens": tmp / "trace_tokens.jsonl", "peers_hashes": tmp / "trace_mooncake.jsonl",
            "n": len(rows)}


def version(python: str, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    p = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return p.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-python", default=None, help="a Python with kvlint and kvcache-simulator")
    ap.add_argument("--sglang-python", default=None, help="a Python with SGLang 0.5.23 (golden/harness/README-sglang.md)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    shared = Path(os.environ.get("RADIXKV_SHARED", HERE.parent.parent / "shared"))
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    with tempfile.TemporaryDirectory(prefix="radixkv-bench-peers-") as t:
        tmp = Path(t)
        f = write_inputs(tmp)
        rk = [sys.executable, "-m", "radixkv", "replay"]
        half = f["n"] // 2
        runs = {  # name -> (argv, reads its hits: () -> (hit tokens, prompt tokens), model, tool, version)
            "radixkv vllm:16": (rk + [str(f["tokens"]), "--policy", "vllm:16", "--num-gpu-blocks", str(BLOCKS + 1),
                                      "--json", str(tmp / "rv.json")],
                                lambda: _summary(tmp / "rv.json"), "vllm", "radixkv", "this tree"),
            "radixkv sglang:1": (rk + [str(f["tokens"]), "--policy", "sglang:1", "--max-total-num-tokens",
                                       str(BLOCK * BLOCKS), "--json", str(tmp / "rs.json")],
                                 lambda: _summary(tmp / "rs.json"), "sglang", "radixkv", "this tree"),
            "radixkv unit-lru": (rk + [str(f["hashes"]), "--policy", "unit-lru", "--capacity-tokens",
                                       str(BLOCK * BLOCKS), "--per-request", str(tmp / "ru.csv")],
                                 lambda: _second_half(tmp / "ru.csv", half), "lru", "radixkv", "this tree"),
        }
        if args.peer_python:
            pp = args.peer_python
            kvs = str(Path(pp).parent / "kvcache-simulator")
            for model in ("vllm", "sglang"):
                runs[f"kvlint {model}"] = ([pp, "-c", _KVLINT, str(f["peers_tokens"]), model],
                                           None, model, "kvlint", version(pp, "kvlint"))
            runs["kvcache-simulator lru"] = (
                [kvs, "run", "--trace", str(f["peers_hashes"]), "--model", "llama-3.1-8b", "--policies", "lru",
                 "--budgets-gib", "4", "--no-progress", "--format", "json", "-o", str(tmp / "kvs.json")],
                lambda: _kvsim(tmp / "kvs.json"), "lru", "kvcache-simulator", version(pp, "kvcache-simulator"))
        if args.sglang_python:
            runs["SGLang UnifiedRadixCache"] = (
                [args.sglang_python, str(shared / "golden/harness/sglang_replay.py"), "--trace", str(f["sglang"]),
                 "--out", str(tmp / "sg.jsonl"), "--capacity-tokens", str(BLOCK * BLOCKS), "--page-size", "1",
                 "--quiet"], None, "sglang", "SGLang 0.5.23 (engine code)", version(args.sglang_python, "sglang"))
        out = {}
        print(f"load average before: {os.getloadavg()}", flush=True)
        for name, (argv, *_rest) in runs.items():  # warm (and the first outputs)
            out[name] = _run(argv, env, tmp)
        best = {n: (float("inf"), float("inf")) for n in runs}
        for _ in range(args.repeat):
            for name, (argv, *_rest) in runs.items():
                w, c = run_timed(argv, env, str(tmp))
                best[name] = (min(best[name][0], w), min(best[name][1], c))
        print(f"load average after: {os.getloadavg()}")
        hits = {}
        for name, (_argv, read, *_r) in runs.items():
            hits[name] = read() if read else _stdout_hits(out[name])
    ref = {model: name for name, (_a, _r, model, tool, _v) in runs.items() if tool == "radixkv"}
    print(f"best of {args.repeat}, whole processes; ratio = wall / the radixkv row of the same model")
    print(f"{'tool':<28} {'version':<10} {'model':<7} {'hit tokens':>12} {'hit rate':>9} {'wall s':>8} {'CPU s':>7} "
          f"{'ratio':>7}")
    for name, (_a, _r, model, tool, ver) in runs.items():
        h, p = hits[name]
        w, c = best[name]
        r = w / best[ref[model]][0]
        print(f"{tool:<28} {ver:<10} {model:<7} {h:>12,} {h / p if p else float('nan'):9.4f} {w:8.2f} {c:7.2f} {r:7.2f}")
    if "SGLang UnifiedRadixCache" in out:
        s = json.loads(out["SGLang UnifiedRadixCache"].strip().splitlines()[-1])
        print(f"SGLang's own replay loop (its import excluded, first run): {s['replay_seconds']} s")


def _run(argv, env, cwd) -> str:
    p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv[:4])} …\n{p.stderr[-2000:]}")
    return p.stdout


def _summary(path):
    s = json.loads(Path(path).read_text())["results"][0]["summary"]
    return s["hit_tokens"], s["prompt_tokens"]


def _second_half(path, half):
    with open(path) as f:
        rows = list(csv.DictReader(f))[half:]
    return sum(int(r["hit_tokens"]) for r in rows), sum(int(r["prompt_tokens"]) for r in rows)


def _kvsim(path):
    r = json.loads(Path(path).read_text())["points"][0]["results"]["lru"]
    return r["hitTokens"], r["totalTokens"]


def _stdout_hits(text):
    last = json.loads(text.strip().splitlines()[-1])
    return last["hit_tokens"], last.get("prompt_tokens", 0)


if __name__ == "__main__":
    main()
