#!/usr/bin/env python3
"""Write the seeded multi-tenant token trace of the issue-33 goldens (stdlib only).

``tests/data/golden/traffic/traffic.jsonl``: radixkv native JSONL (``id``, ``tokens``,
``output_tokens``, ``arrival_s``, ``tenant``, ``cache_salt``, ``lora``, ``mm``), what both
harnesses (vllm_replay.py, sglang_replay.py) read. Conversations of 1–4 turns (turn k's
prompt = turn k−1's prompt + its output + new user tokens), turns of different
conversations interleaved; four tenants, two of them salted (``cache_salt`` = the tenant)
and two unsalted (they share); LoRA adapters ``a1``/``a2`` or none per conversation; three
shared system prompts; images (four content hashes, each with its own length, placeholder
token 151655, Qwen2.5-VL's ``<|image_pad|>``) in some first turns, kept in later turns;
some conversations repeat another's first prompt under another tenant, adapter or image.

    python tools/engines/make_traffic_trace.py --out tests/data/golden/traffic/traffic.jsonl
"""
from __future__ import annotations

import argparse
import json
import random

PLACEHOLDER = 151655
IMAGES = {"img-a": 20, "img-b": 33, "img-c": 48, "img-d": 17}
TENANTS = {"t1": "t1", "t2": "t2", "t3": "", "t4": ""}  # tenant -> cache salt
ADAPTERS = ["", "", "a1", "a2"]


def build(seed: int = 33, conversations: int = 70) -> list:
    rng = random.Random(seed)
    systems = [[rng.randrange(1000, 30000) for _ in range(n)] for n in (64, 100, 37)]
    convs = []
    for c in range(conversations):
        if c >= 8 and rng.random() < 0.3:  # a repeat of an earlier first prompt, other keys
            src = convs[rng.randrange(len(convs))]
            first = dict(src["first"])
            tenant = rng.choice(list(TENANTS))
            lora = rng.choice(ADAPTERS)
            mm = [dict(x) for x in first["mm"]]
            if mm and rng.random() < 0.5:  # same text, another image of the same length? no: swap hash+tokens
                new = rng.choice([h for h in IMAGES if h != mm[0]["hash"]])
                toks = list(first["tokens"])
                o, L = mm[0]["offset"], mm[0]["length"]
                toks[o:o + L] = [PLACEHOLDER] * IMAGES[new]
                tail_shift = IMAGES[new] - L
                mm[0] = {"hash": new, "offset": o, "length": IMAGES[new]}
                for x in mm[1:]:
                    x["offset"] += tail_shift
                first = {"tokens": toks, "mm": mm}
        else:
            tenant = rng.choice(list(TENANTS))
            lora = rng.choice(ADAPTERS)
            toks = list(rng.choice(systems))
            mm = []
            if rng.random() < 0.4:
                for h in rng.sample(sorted(IMAGES), rng.choice([1, 1, 2])):
                    toks += [rng.randrange(1000, 30000) for _ in range(rng.randrange(0, 12))]
                    mm.append({"hash": h, "offset": len(toks), "length": IMAGES[h]})
                    toks += [PLACEHOLDER] * IMAGES[h]
            toks += [rng.randrange(1000, 30000) for _ in range(rng.randrange(5, 60))]
            first = {"tokens": toks, "mm": mm}
        convs.append({"first": first, "tenant": tenant, "lora": lora, "turns": rng.choice([1, 1, 2, 3, 4])})
    # interleave: each conversation's turns in order, conversations mixed
    queue = []
    for c, conv in enumerate(convs):
        queue += [c] * conv["turns"]
    rng.shuffle(queue)
    state = {}
    out = []
    t = 0.0
    for c in queue:
        conv = convs[c]
        k = state.get(c, 0)
        if k == 0:
            prompt, mm = list(conv["first"]["tokens"]), [dict(x) for x in conv["first"]["mm"]]
        else:
            prev = state[("last", c)]
            prompt = prev["tokens"] + prev["output_tokens"] + [rng.randrange(1000, 30000)
                                                               for _ in range(rng.randrange(3, 40))]
            mm = [dict(x) for x in prev["mm"]]
        n_out = rng.choice([0, 1, rng.randrange(2, 40), rng.randrange(2, 40)])
        rec = {"id": f"c{c}t{k}", "tokens": prompt, "output_tokens": [rng.randrange(1000, 30000) for _ in range(n_out)],
               "arrival_s": round(t, 3), "tenant": conv["tenant"], "cache_salt": TENANTS[conv["tenant"]],
               "lora": conv["lora"], "mm": mm}
        t += 0.25
        state[c] = k + 1
        state[("last", c)] = rec
        out.append(rec)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=33)
    args = ap.parse_args(argv)
    recs = build(args.seed)
    with open(args.out, "w") as f:
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    n_tok = sum(len(r["tokens"]) for r in recs)
    print(f"wrote {len(recs)} requests, {n_tok} prompt tokens to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
