"""Per-request goldens of vLLM 0.33's hybrid KV cache manager (full + sliding-window groups).

Drives the real ``vllm.v1.core.kv_cache_manager.KVCacheManager`` on CPU with a hybrid
``KVCacheConfig``: several KV cache groups sharing one ``BlockPool`` — a
``FullAttentionSpec`` group and ``SlidingWindowSpec`` groups — so the manager builds vLLM's
``HybridKVCacheCoordinator`` (``vllm/v1/core/kv_cache_coordinator.py``) with a
``FullAttentionManager`` and ``SlidingWindowManager`` per group
(``vllm/v1/core/single_type_kv_cache_manager.py``). Each request runs alone, in the order
of docs/golden.md ("How each request was run"), with one ``allocate_slots`` call per
decode step (the sliding-window manager frees the blocks that leave the window at each
step, ``remove_skipped_blocks``, so the order of frees, and with it the free queue, depends
on stepping one token at a time):

1. ``get_computed_blocks`` (the coordinator's ``find_longest_cache_hit`` over all groups,
   capped at ``P − 1`` tokens);
2. ``allocate_slots(P − hit, full_sequence_must_fit=True)`` for the whole prompt, or with
   ``--max-num-batched-tokens N`` (chunked prefill) for a first chunk of N tokens and one
   ``allocate_slots`` per further chunk, the manager built with ``max_in_flight_tokens =
   N`` (one batch in flight) so the sliding-window admission cap binds;
3. one ``allocate_slots(req, 1)`` per output token except the last (KV extent
   ``P + max(N − 1, 0)``);
4. ``free``.

Mamba groups (``--groups full,mamba``: a ``MambaSpec`` in ``mamba_cache_mode="align"``, no
prefill checkpoint blocks, hash block = block size, so vLLM's ``MambaManager``): every
prefill chunk is clipped by the scheduler's own ``Scheduler._mamba_block_aligned_split``
(called on a stand-in holding the scheduler fields it reads), the request's
``shared_prefix_boundary`` is set from ``get_computed_blocks`` as the scheduler does, and
``new_step_starts`` is called before each step; records then add ``shared_prefix_boundary``
and ``chunks`` (the prefill chunk lengths).

Only the KV bookkeeping runs: no model, no scheduler object. The group specs' head and
dtype numbers only size memory, which is bypassed (the pool is given in blocks).
Without chunking ``max_in_flight_tokens`` is the manager's default (``max_model_len``), so
the sliding-window admission cap (``SlidingWindowSpec.max_admission_blocks_per_request``)
does not bind; ``prefix_cache_retention_interval`` is vLLM's default (None: dense).

Trace: native JSONL (``id``, ``tokens``, ``output_tokens``), or ``--mooncake FILE
--limit K`` (hash id ``h`` of a 512-token unit = tokens ``h·512 … h·512+511``, the last
unit cut to ``input_length``, outputs unique tokens, ids ``r<line>``; docs/golden.md).

Output JSONL, one line per request: ``id``, ``prompt_len``, ``hit_tokens`` (golden), and
diagnostics ``group_hit_blocks`` (non-null hit blocks of each group), ``kv_tokens``,
``free_blocks`` (after the request). Manifest line on stdout.

Usage::

    VLLM_TARGET_DEVICE=cpu /work/venvs/vllm/bin/python tools/engines/vllm_hybrid_replay.py \\
        --trace tests/data/golden/traces/mixed200.jsonl --groups full,swa:64 \\
        --block-size 16 --num-blocks 400 --out tests/data/golden/vllm_hybrid/NAME.jsonl

This file is a tool of the repository; the radixkv package never imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings


def _import_vllm():
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    warnings.filterwarnings("ignore")
    import torch

    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                            SlidingWindowSpec)
    from vllm.v1.request import Request, RequestStatus

    return dict(version=vllm.__version__, torch=torch, SamplingParams=SamplingParams,
                get_hash_fn_by_name=get_hash_fn_by_name, kv_cache_utils=kv_cache_utils,
                KVCacheManager=KVCacheManager, FullAttentionSpec=FullAttentionSpec,
                KVCacheConfig=KVCacheConfig, KVCacheGroupSpec=KVCacheGroupSpec, MambaSpec=MambaSpec,
                SlidingWindowSpec=SlidingWindowSpec, Request=Request, RequestStatus=RequestStatus,
                Scheduler=Scheduler)


def parse_groups(text: str) -> list:
    """``full,swa:W,mamba,...`` -> [("full", None), ("swa", W), ("mamba", None), ...]."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if part == "full":
            out.append(("full", None))
        elif part.startswith("swa:"):
            out.append(("swa", int(part[4:])))
        elif part == "mamba":
            out.append(("mamba", None))
        else:
            raise SystemExit(f"--groups: unknown group {part!r} (full, swa:W, mamba)")
    return out


class HybridReplayer:
    def __init__(self, groups, block_size: int, num_blocks: int, hash_algo: str = "sha256",
                 max_num_batched_tokens: int | None = None):
        v = self.v = _import_vllm()
        self.B = block_size
        self.mnbt = max_num_batched_tokens
        hash_fn = v["get_hash_fn_by_name"](hash_algo)
        v["kv_cache_utils"].init_none_hash(hash_fn)
        self.block_hasher = v["kv_cache_utils"].get_request_block_hasher(block_size, hash_fn)
        specs = []
        self.has_mamba = any(kind == "mamba" for kind, _ in groups)
        for i, (kind, w) in enumerate(groups):
            kw = dict(block_size=block_size, num_kv_heads=1, head_size=64, dtype=v["torch"].float16)
            if kind == "mamba":
                # align mode, no prefill checkpoint blocks: the scheduler splits prefill
                # chunks at block boundaries (Scheduler._mamba_block_aligned_split)
                spec = v["MambaSpec"](block_size=block_size, shapes=((1, 64),), dtypes=(v["torch"].float16,),
                                      mamba_cache_mode="align")
            elif kind == "full":
                spec = v["FullAttentionSpec"](**kw)
            else:
                spec = v["SlidingWindowSpec"](sliding_window=w, **kw)
            specs.append(v["KVCacheGroupSpec"]([f"layer.{i}"], spec))
        cfg = v["KVCacheConfig"](num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=specs)
        # chunked prefill: one batch in flight (VllmConfig.max_in_flight_tokens =
        # max_concurrent_batches × max_num_batched_tokens), which sets the sliding-window
        # admission cap; without it the manager defaults to max_model_len (no cap)
        self.mgr = v["KVCacheManager"](kv_cache_config=cfg, max_model_len=1 << 30, scheduler_block_size=block_size,
                                       hash_block_size=block_size, enable_caching=True, log_stats=True,
                                       max_in_flight_tokens=max_num_batched_tokens)
        self.coordinator_name = type(self.mgr.coordinator).__name__
        self.managers = [type(m).__name__ for m in self.mgr.coordinator.single_type_managers]
        # the scheduler state _mamba_block_aligned_split reads (hash block = block size, no
        # EAGLE, no hash lookahead, no prefill checkpoint blocks, no opt-in junction stop)
        from types import SimpleNamespace
        self._sched = SimpleNamespace(
            cache_config=SimpleNamespace(block_size=block_size), block_size=block_size, hash_block_size=block_size,
            mamba_partial_cache_hit=False, use_eagle_block_drop=False, num_hash_lookahead_tokens=0,
            mamba_has_prefill_checkpoint_blocks=False, mamba_prefill_checkpoint_alignment=None,
            max_num_scheduled_tokens=max_num_batched_tokens or (1 << 30),
            scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
            mamba_shared_prefix_checkpoint=False)

    def _split(self, req, n: int, new_local: int = 0) -> int:
        """The scheduler's Mamba align-mode chunk clip (vLLM's own function)."""
        if not self.has_mamba:
            return n
        return self.v["Scheduler"]._mamba_block_aligned_split(self._sched, req, n, new_local)

    def replay_one(self, rid, prompt, output) -> dict:
        v, mgr = self.v, self.mgr
        req = v["Request"](request_id=rid, prompt_token_ids=list(prompt),
                           sampling_params=v["SamplingParams"](max_tokens=max(1, len(output))),
                           pooling_params=None, block_hasher=self.block_hasher)
        P = len(prompt)
        blocks, hit, boundary = mgr.get_computed_blocks(req)
        req.shared_prefix_boundary = boundary
        rec = {"id": rid, "prompt_len": P, "hit_tokens": hit,
               "group_hit_blocks": [sum(1 for b in g if not b.is_null) for g in blocks.blocks]}
        if self.has_mamba:
            rec["shared_prefix_boundary"] = boundary
        chunk = P - hit if self.mnbt is None else min(P - hit, self.mnbt)
        chunk = self._split(req, chunk, hit)
        if self.has_mamba:
            rec["chunks"] = [chunk]
        mgr.new_step_starts()
        got = mgr.allocate_slots(req, chunk, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                                 full_sequence_must_fit=True, has_scheduled_reqs=False)
        if got is None:
            rec["error"] = "does_not_fit"
            mgr.free(req)
            rec["free_blocks"] = mgr.block_pool.get_num_free_blocks()
            return rec
        req.status = v["RequestStatus"].RUNNING
        req.num_computed_tokens = hit + chunk
        while req.num_computed_tokens < P:  # chunked prefill: the request runs alone
            chunk = P - req.num_computed_tokens if self.mnbt is None else min(P - req.num_computed_tokens, self.mnbt)
            chunk = self._split(req, chunk)
            if self.has_mamba:
                rec["chunks"].append(chunk)
            mgr.new_step_starts()
            if mgr.allocate_slots(req, chunk, has_scheduled_reqs=False) is None:
                rec["error"] = "prefill_oom"
                mgr.free(req)
                rec["free_blocks"] = mgr.block_pool.get_num_free_blocks()
                return rec
            req.num_computed_tokens += chunk
        if output:
            req.append_output_token_ids(output[0])
            for tok in output[1:]:
                mgr.new_step_starts()
                if mgr.allocate_slots(req, 1, has_scheduled_reqs=False) is None:
                    rec["error"] = "decode_oom"
                    break
                req.num_computed_tokens += 1
                req.append_output_token_ids(tok)
        rec["kv_tokens"] = req.num_computed_tokens
        mgr.free(req)
        rec["free_blocks"] = mgr.block_pool.get_num_free_blocks()
        return rec


def read_native(path):
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                yield str(r["id"]), r["tokens"], r.get("output_tokens") or []


def read_mooncake(path, limit):
    """Token requests of the first *limit* Mooncake lines (docs/golden.md conventions);
    outputs are unique negative-free tokens above every hash-id token."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            rows.append((i, json.loads(line)))
    rows.sort(key=lambda t: (t[1]["timestamp"], t[0]))
    top = 1 + max(max(r["hash_ids"] or [0]) for _, r in rows)
    nxt = top * 512
    for i, r in rows:
        toks = [h * 512 + k for h in r["hash_ids"] for k in range(512)][: r["input_length"]]
        out = list(range(nxt, nxt + r["output_length"]))
        nxt += r["output_length"]
        yield f"r{i}", toks, out


#: the golden runs of tests/data/golden/vllm_hybrid (``--all DIR`` regenerates them):
#: (trace under tests/data/golden/traces, groups, block_size, num_gpu_blocks)
CONFIGS = [
    ("mixed200", "full,swa:64", 16, 240),
    ("mixed200", "full,swa:64", 16, 800),
    ("mixed200", "full,swa:40", 16, 400),
    ("mixed200", "full,swa:17", 32, 200),
    ("mixed200", "full,swa:64,swa:160", 16, 600),
    ("edge300", "full,swa:48", 16, 80),
    ("edge300", "full,swa:33", 16, 64),
    # chunked prefill (max_num_batched_tokens): the sliding admission cap binds
    ("mixed200", "full,swa:64", 16, 240, 64),
    ("mixed200", "full,swa:40,swa:40", 32, 150, 96),
    ("edge300", "full,swa:48", 16, 60, 32),
    # Mamba "align" mode (Qwen3-Next-like: full attention + Gated DeltaNet groups)
    ("mixed200", "full,mamba", 16, 240),
    ("mixed200", "full,mamba", 16, 120),
    ("mixed200", "full,mamba,mamba,mamba", 16, 125),
    ("mixed200", "full,mamba", 32, 64),
    ("edge300", "full,mamba", 16, 48),
    ("edge300", "full,mamba,mamba,mamba", 16, 40),
    ("mixed200", "full,swa:64,mamba", 16, 250),
    ("mixed200", "full,mamba", 16, 120, 64),
    ("edge300", "full,mamba,mamba", 16, 50, 48),
    # vLLM's own group order for Qwen3-Next / Gemma 3 (groups numbered by first layer:
    # the full-attention group last)
    ("edge300", "mamba,mamba,mamba,full", 16, 40),
    ("mixed200", "mamba,mamba,mamba,full", 16, 125, 64),
    ("edge300", "swa:48,swa:48,full", 16, 80),
]


def run_one(trace_path, groups, block_size, num_blocks, out, reqs=None, limit=None, mnbt=None) -> dict:
    rp = HybridReplayer(parse_groups(groups), block_size, num_blocks, max_num_batched_tokens=mnbt)
    if reqs is None:
        reqs = read_native(trace_path)
    n = hit = prompt = err = 0
    t0 = time.perf_counter()
    tmp = out + ".tmp"
    with open(tmp, "w") as fo:
        for i, (rid, p, o) in enumerate(reqs):
            if limit is not None and i >= limit:
                break
            rec = rp.replay_one(rid, p, o)
            fo.write(json.dumps(rec) + "\n")
            n += 1
            prompt += rec["prompt_len"]
            if "error" in rec:
                err += 1
            else:
                hit += rec["hit_tokens"]
    os.replace(tmp, out)
    return {"name": os.path.basename(out)[:-6], "engine": f"vllm {rp.v['version']}",
            "coordinator": rp.coordinator_name, "managers": rp.managers,
            "trace": os.path.basename(trace_path), "limit": limit,
            "groups": groups, "block_size": block_size, "num_gpu_blocks": num_blocks,
            "max_num_batched_tokens": mnbt,
            "requests": n, "errors": err, "prompt_tokens": prompt, "hit_tokens": hit,
            "replay_s": round(time.perf_counter() - t0, 2)}


def golden_name(trace, groups, block_size, num_blocks, mnbt=None) -> str:
    return (f"vllm_hybrid_{trace}_b{block_size}_n{num_blocks}_" + groups.replace(",", "_").replace(":", "-")
            + ("" if mnbt is None else f"_t{mnbt}"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", metavar="DIR", help="regenerate every run of CONFIGS into DIR (+ manifest.jsonl)")
    ap.add_argument("--trace")
    ap.add_argument("--mooncake")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--out")
    ap.add_argument("--groups", default="full,swa:64", help="comma list of full | swa:W (one KV cache group each)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, help="chunked prefill step budget (default: none)")
    ap.add_argument("--num-blocks", type=int, help="num_gpu_blocks (block 0 is the null block)")
    args = ap.parse_args(argv)
    if args.all:
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "golden")
        lines = []
        for trace, groups, B, nb, *t in CONFIGS:
            mnbt = t[0] if t else None
            out = os.path.join(args.all, golden_name(trace, groups, B, nb, mnbt) + ".jsonl")
            m = run_one(os.path.join(here, "traces", trace + ".jsonl"), groups, B, nb, out, mnbt=mnbt)
            print(json.dumps(m))
            lines.append(json.dumps(m, sort_keys=True))
        tmp = os.path.join(args.all, "manifest.jsonl.tmp")
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, os.path.join(args.all, "manifest.jsonl"))
        return 0
    if not args.out or not (args.trace or args.mooncake):
        ap.error("give --all DIR, or --out with --trace or --mooncake")
    reqs = None if args.trace else read_mooncake(args.mooncake, args.limit)
    m = run_one(args.trace or args.mooncake, args.groups, args.block_size, args.num_blocks, args.out, reqs=reqs,
                limit=args.limit if args.trace else None, mnbt=args.max_num_batched_tokens)
    print(json.dumps(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
