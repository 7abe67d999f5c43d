#!/usr/bin/env python3
"""Replay a token trace through vLLM's own v1 prefix-cache code (CPU only).

This drives the real ``vllm.v1.core.kv_cache_manager.KVCacheManager`` (and
through it vLLM's BlockPool, FreeKVCacheBlockQueue, block hashing and
FullAttentionManager) the way the v1 scheduler drives it for one request that
runs alone: prefix lookup, slot allocation for the prompt (optionally in
chunked-prefill chunks), one decode step per generated token except the last,
then free.  No model, no GPU and no scheduler object are involved; only the
KV-cache bookkeeping, which is all that decides hits and evictions.

Trace: JSONL, one request per line:
    {"id": str, "tokens": [int, ...], "output_tokens": [int, ...]}
``tokens`` is the prompt; ``output_tokens`` is optional (default []).
Optional per request (radixkv's native fields, issue 33): ``cache_salt`` (str, passed as
the ``Request``'s ``cache_salt``), ``lora`` (str: a ``LoRARequest`` with that name, an
int id numbered in order of first use and a fixed path), ``mm`` (list of ``{"hash",
"offset", "length"}``: ``MultiModalFeatureSpec`` items with that identifier and
``PlaceholderRange``, no data — the block hasher reads only identifier and range). A
radixkv native header line (``radixkv_trace``) is skipped.

Copied from ../shared/golden/harness/vllm_replay.py; what changed: the three optional
fields above.

Output: JSONL, one line per request:
    {"id", "prompt_len", "hit_tokens", ...extra diagnostic fields}
and a summary on stdout.

Engine facts this follows (vLLM v1, checked on vllm 0.33.0):
* The hit is capped at prompt_len - 1 and rounded down to whole blocks.
* KV is computed for prompt + output[:-1]: the last sampled token is never fed
  back, so it never reaches the cache.  Only full blocks are cached.
* A request with no output tokens is treated as max_tokens=1 producing nothing
  extra (prefill only), which caches exactly the prompt's full blocks.

Needs the vllm package importable (see README-vllm.md for the venv recipe).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings


def _import_vllm():
    # Keep vLLM's import chain quiet and away from any accelerator probing.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401  (the vllm import chain needs it)

    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )
    from vllm.v1.request import Request, RequestStatus
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return {
        "version": getattr(vllm, "__version__", "?"),
        "SamplingParams": SamplingParams,
        "get_hash_fn_by_name": get_hash_fn_by_name,
        "kv_cache_utils": kv_cache_utils,
        "KVCacheManager": KVCacheManager,
        "FullAttentionSpec": FullAttentionSpec,
        "KVCacheConfig": KVCacheConfig,
        "KVCacheGroupSpec": KVCacheGroupSpec,
        "Request": Request,
        "RequestStatus": RequestStatus,
        "LoRARequest": LoRARequest,
        "MultiModalFeatureSpec": MultiModalFeatureSpec,
        "PlaceholderRange": PlaceholderRange,
        "torch": torch,
    }


class VllmPrefixCacheReplayer:
    """One vLLM KVCacheManager with a single full-attention KV cache group."""

    def __init__(
        self,
        block_size: int = 16,
        num_blocks: int = 1024,
        hash_algo: str = "sha256",
        max_num_batched_tokens: int | None = None,
        max_model_len: int = 1 << 30,
        exact_decode: bool = False,
        count_evictions: bool = False,
    ) -> None:
        v = self.v = _import_vllm()
        self.version = v["version"]
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.exact_decode = exact_decode
        self.count_evictions = count_evictions

        # Same hashing set-up as EngineCore.__init__ (vllm/v1/engine/core.py).
        hash_fn = v["get_hash_fn_by_name"](hash_algo)
        v["kv_cache_utils"].init_none_hash(hash_fn)
        self.block_hasher = v["kv_cache_utils"].get_request_block_hasher(
            block_size, hash_fn
        )

        # The spec's head/dtype numbers only matter for memory sizing, which
        # is bypassed here: the pool size is given directly in blocks.
        spec = v["FullAttentionSpec"](
            block_size=block_size,
            num_kv_heads=1,
            head_size=64,
            dtype=v["torch"].float16,
        )
        kv_cache_config = v["KVCacheConfig"](
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[v["KVCacheGroupSpec"](["layer.0"], spec)],
        )
        self.manager = v["KVCacheManager"](
            kv_cache_config=kv_cache_config,
            max_model_len=max_model_len,
            scheduler_block_size=block_size,
            hash_block_size=block_size,
            enable_caching=True,
            log_stats=True,
            enable_kv_cache_events=count_evictions,
        )
        self.block_pool = self.manager.block_pool
        self.evicted_blocks = 0
        self.prefix_queries = 0  # vLLM's own PrefixCacheStats.queries
        self.prefix_hits = 0  # vLLM's own PrefixCacheStats.hits

    # ------------------------------------------------------------------ #
    def _drain_events(self) -> int:
        if not self.count_evictions:
            return 0
        n = 0
        for ev in self.manager.take_events():
            if type(ev).__name__ == "BlockRemoved":
                n += len(ev.block_hashes)
        return n

    def _allocate(self, req, num_new_tokens, **kw):
        return self.manager.allocate_slots(req, num_new_tokens, **kw)

    def _lora(self, name):
        if not name:
            return None
        ids = self.__dict__.setdefault("_lora_ids", {})
        ids.setdefault(name, len(ids) + 1)
        return self.v["LoRARequest"](lora_name=name, lora_int_id=ids[name], lora_path="/adapters/" + name)

    def _mm(self, items):
        if not items:
            return None
        v = self.v
        return [v["MultiModalFeatureSpec"](data=None, modality="image", identifier=it["hash"],
                                           mm_position=v["PlaceholderRange"](offset=it["offset"],
                                                                             length=it["length"]),
                                           mm_hash=it["hash"])
                for it in items]

    def replay_one(self, rid: str, prompt: list[int], output: list[int], cache_salt=None, lora=None,
                   mm=None) -> dict:
        v = self.v
        mgr = self.manager
        max_tokens = max(1, len(output))
        req = v["Request"](
            request_id=rid,
            prompt_token_ids=list(prompt),
            sampling_params=v["SamplingParams"](max_tokens=max_tokens),
            pooling_params=None,
            mm_features=self._mm(mm),
            lora_request=self._lora(lora),
            cache_salt=cache_salt or None,
            block_hasher=self.block_hasher,
        )
        P = len(prompt)
        rec = {"id": rid, "prompt_len": P}

        # 1) Prefix-cache lookup (Scheduler.schedule, waiting-queue branch).
        computed_blocks, num_hit, _ = mgr.get_computed_blocks(req)
        rec["hit_tokens"] = num_hit

        # 2) Admission + prefill allocation, chunk by chunk if a token budget
        #    is set (chunked prefill).  has_scheduled_reqs=False: the request
        #    runs alone, so the watermark is not applied.
        remaining = P - num_hit
        first = True
        while remaining > 0:
            chunk = remaining
            if self.max_num_batched_tokens:
                chunk = min(chunk, self.max_num_batched_tokens)
            if first:
                blocks = self._allocate(
                    req,
                    chunk,
                    num_new_computed_tokens=num_hit,
                    new_computed_blocks=computed_blocks,
                    full_sequence_must_fit=True,
                    has_scheduled_reqs=False,
                )
            else:
                blocks = self._allocate(req, chunk, has_scheduled_reqs=False)
            if blocks is None:
                # Would never be admitted in a real engine (it would wait
                # forever, or vLLM would refuse it as too long).
                rec["error"] = "does_not_fit"
                mgr.free(req)
                rec["evicted_blocks"] = self._drain_events()
                self.evicted_blocks += rec["evicted_blocks"]
                return rec
            if first:
                # Scheduler records stats at admission (record_prefix_cache_stats).
                mgr.record_prefix_cache_stats(req, num_hit)
                req.status = v["RequestStatus"].RUNNING
                req.num_computed_tokens = num_hit
                first = False
            req.num_computed_tokens += chunk
            remaining -= chunk

        # 3) Decode.  After the prefill step the first output token is sampled
        #    and appended; every further output token is produced by a decode
        #    step that first computes KV for the previously sampled token.
        if output:
            req.append_output_token_ids(output[0])
            if self.exact_decode:
                for tok in output[1:]:
                    if self._allocate(req, 1) is None:
                        rec["error"] = "decode_oom"
                        break
                    req.num_computed_tokens += 1
                    req.append_output_token_ids(tok)
            elif len(output) > 1:
                # Same end state as len(output)-1 single-token steps when the
                # request runs alone: blocks come off the free-queue head in
                # the same order and the same full blocks get cached.
                req.append_output_token_ids(list(output[1:]))
                n_dec = len(output) - 1
                # allocate_slots caps caching at request.num_tokens; computed
                # tokens go up to P + len(output) - 1.
                if self._allocate(req, n_dec) is None:
                    rec["error"] = "decode_oom"
                else:
                    req.num_computed_tokens += n_dec

        rec["kv_tokens"] = req.num_computed_tokens
        rec["req_blocks"] = len(mgr.get_block_ids(rid)[0])
        rec["hit_blocks"] = num_hit // self.block_size
        rec["new_blocks"] = rec["req_blocks"] - rec["hit_blocks"]

        # 4) Finish: free in reverse order (tail blocks evicted first).
        mgr.free(req)
        rec["evicted_blocks"] = self._drain_events()
        self.evicted_blocks += rec["evicted_blocks"]
        return rec

    def stats(self) -> dict:
        s = self.manager.make_prefix_cache_stats()
        if s is not None:
            self.prefix_queries += s.queries
            self.prefix_hits += s.hits
        cached = sum(1 for b in self.block_pool.blocks if b.block_hash is not None)
        return {
            "vllm_prefix_cache_queries": self.prefix_queries,
            "vllm_prefix_cache_hits": self.prefix_hits,
            "cached_blocks_end": cached,
            "distinct_cached_hashes_end": len(self.block_pool.cached_block_hash_to_block),
            "free_blocks_end": self.block_pool.get_num_free_blocks(),
            "usable_blocks": self.num_blocks - 1,
        }


def read_trace(path: str):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "radixkv_trace" in r:
                continue
            yield (str(r["id"]), r["tokens"], r.get("output_tokens") or [],
                   {"cache_salt": r.get("cache_salt"), "lora": r.get("lora"), "mm": r.get("mm")})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument(
        "--num-blocks",
        type=int,
        required=True,
        help="total KV blocks in the pool (vLLM num_gpu_blocks; block 0 is "
        "vLLM's reserved null block, so num_blocks-1 are usable)",
    )
    ap.add_argument(
        "--hash-algo",
        default="sha256",
        choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
    )
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="chunked-prefill token budget (default: whole prompt in one step)",
    )
    ap.add_argument(
        "--exact-decode",
        action="store_true",
        help="one allocate_slots call per decode step (slow; same result)",
    )
    ap.add_argument(
        "--count-evictions",
        action="store_true",
        help="count evicted blocks via vLLM's KV-cache events",
    )
    ap.add_argument("--limit", type=int, default=None, help="replay first N only")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    rp = VllmPrefixCacheReplayer(
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        hash_algo=args.hash_algo,
        max_num_batched_tokens=args.max_num_batched_tokens,
        exact_decode=args.exact_decode,
        count_evictions=args.count_evictions,
    )
    t_init = time.perf_counter() - t0

    n_req = n_prompt = n_hit = n_err = n_out = 0
    t1 = time.perf_counter()
    with open(args.out, "w") as fo:
        for i, (rid, prompt, output, keys) in enumerate(read_trace(args.trace)):
            if args.limit is not None and i >= args.limit:
                break
            rec = rp.replay_one(rid, prompt, output, **keys)
            fo.write(json.dumps(rec) + "\n")
            n_req += 1
            n_prompt += rec["prompt_len"]
            n_out += len(output)
            if "error" in rec:
                n_err += 1
            else:
                n_hit += rec["hit_tokens"]
    t_replay = time.perf_counter() - t1

    summary = {
        "vllm_version": rp.version,
        "block_size": args.block_size,
        "num_blocks": args.num_blocks,
        "hash_algo": args.hash_algo,
        "requests": n_req,
        "errors": n_err,
        "prompt_tokens": n_prompt,
        "output_tokens": n_out,
        "hit_tokens": n_hit,
        "token_hit_rate": (n_hit / n_prompt) if n_prompt else 0.0,
        "evicted_blocks": rp.evicted_blocks if args.count_evictions else None,
        "init_s": round(t_init, 3),
        "replay_s": round(t_replay, 3),
        "requests_per_s": round(n_req / t_replay, 1) if t_replay else None,
        "prompt_tokens_per_s": round(n_prompt / t_replay) if t_replay else None,
    }
    summary.update(rp.stats())
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
