"""Write ``stress150.jsonl``: a small token trace that stresses a concurrent scheduler.

Deterministic (``random.Random(seed)``), radixkv native JSONL (``id``, ``tokens``,
``output_tokens``; every request at t = 0). What it holds, and why:

- multi-turn conversations whose turn k re-sends turn k − 1's prompt and outputs plus new
  user tokens, queued right behind the previous turn: the later turn is looked up while
  the earlier one still decodes, so its hit grows with every block the earlier turn
  fills (and a preempted turn may lose its blocks before it is re-admitted);
- prompts on shared system prompts, some of exactly a block multiple (16 or 32) of
  tokens (the last-token cap of the hit);
- exact duplicates queued together (blocks of the same content computed twice at once);
- outputs from 0 to a few hundred tokens (N = 0 and 1 finish at prefill; long ones make
  decodes run out of blocks and preempt).

Token ids are < 100 to keep the file small (16 random ids still never repeat by chance). Usage::

    python tools/engines/make_stress_trace.py [--out tests/data/concurrent/traces/stress150.jsonl]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(seed: int = 150) -> list[dict]:
    """The requests, in queue order."""
    rng = random.Random(seed)

    def toks(n):
        return [rng.randrange(100) for _ in range(n)]

    def outlen():
        u = rng.random()
        if u < 0.08:
            return rng.choice([0, 1])
        if u < 0.8:
            return rng.randint(2, 90)
        return rng.randint(150, 420)

    systems = [toks(n) for n in (40, 96, 160, 257, 384)]
    reqs = []
    convs = []  # open conversations: [id, prompt, outputs, turn]
    n_conv = 0
    while len(reqs) < 150:
        u = rng.random()
        if u < 0.35 and len(convs) < 6:
            sysp = rng.choice(systems[:3])
            prompt = sysp + toks(rng.randint(10, 120))
            conv = [f"c{n_conv}", prompt, None, 0]
            n_conv += 1
            convs.append(conv)
        elif u < 0.65 and convs:
            conv = rng.choice(convs)
            conv[1] = conv[1] + conv[2] + toks(rng.randint(8, 80))
            conv[3] += 1
            if len(conv[1]) > 600:
                convs.remove(conv)
                continue
        elif u < 0.72 and reqs:
            base = rng.choice(reqs[-12:])
            for _ in range(rng.randint(1, 3)):
                if len(reqs) >= 150:
                    break
                n = outlen()
                reqs.append({"id": f"d{len(reqs)}", "tokens": list(base["tokens"]), "output_tokens": toks(n)})
            continue
        else:
            sysp = rng.choice(systems)
            tail = rng.randint(1, 200)
            if rng.random() < 0.3:  # a block-multiple prompt
                blk = rng.choice([16, 32])
                tail = max(blk, -(-(len(sysp) + tail) // blk) * blk) - len(sysp)
                tail = max(tail, 0) or blk
            p = sysp + toks(tail)
            n = outlen()
            reqs.append({"id": f"s{len(reqs)}", "tokens": p, "output_tokens": toks(n)})
            continue
        n = outlen() if conv[3] < 3 else rng.randint(2, 60)
        out = toks(n)
        conv[2] = out
        reqs.append({"id": f"{conv[0]}t{conv[3]}", "tokens": list(conv[1]), "output_tokens": out})
    return reqs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "concurrent" / "traces" / "stress150.jsonl")
    ap.add_argument("--seed", type=int, default=150)
    a = ap.parse_args(argv)
    reqs = build(a.seed)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=a.out.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        for r in reqs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, a.out)
    P = [len(r["tokens"]) for r in reqs]
    N = [len(r["output_tokens"]) for r in reqs]
    print(f"{a.out}: {len(reqs)} requests, prompts {min(P)}–{max(P)} (mean {sum(P) / len(P):.0f}), "
          f"outputs {min(N)}–{max(N)}, longest P + N {max(p + n for p, n in zip(P, N))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
