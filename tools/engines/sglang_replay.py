#!/usr/bin/env python3
"""Replay a JSONL token trace through SGLang's own prefix cache, on the CPU.

This is a *reference peer* for radixkv: it imports the installed `sglang`
package and drives its real radix cache (tree, eviction, lock refs) and its
real token-slot allocator, one request at a time, the way the SGLang
scheduler would handle a request that runs alone.  Nothing of the cache logic
is re-implemented here; this file only plays the scheduler's part.

Trace format (JSONL, one request per line):
    {"id": "r1", "tokens": [1, 2, 3, ...], "output_tokens": [7, 8, ...]}
`tokens` is the prompt; `output_tokens` is optional (default []); `priority`
is optional (an int; absent = None, which SGLang treats as 0: ``req.priority or 0``).

radixkv copy (tools/engines/): adds ``--eviction-policy-config`` (the strategy's
keyword arguments, SGLang's ``eviction_policy_config``) and the per-request
``priority`` field; see tools/engines/gen_sglang_evict_goldens.py.

Cache namespaces and images (issue 33): the optional fields ``cache_salt`` (str: the
``Req``'s ``cache_salt``), ``lora`` (str: the ``Req``'s ``lora_id``, which ``Req.__init__``
appends to ``extra_key``) and ``mm`` (list of ``{"hash", "offset", "length"}``): the
prompt is padded as the scheduler does before the request reaches the tree
(``duplicate_pad_mm_input_ids`` with ``pad_mm_tokens``, Qwen2.5-VL's ``pad_input_ids``),
each item a ``MultimodalDataItem`` (image, inclusive offsets) whose ``set_hash`` takes the
first 8 bytes of the SHA-256 of the trace's content hash (SGLang hashes the pixels; any
injective map of content to hash gives the same tree). A native header line is skipped.

With ``--hicache-storage-backend file`` (HiCache mode) a step -1 comes first: the
arrival-time L3 prefetch of ``Scheduler._prefetch_kvcache`` (``_storage_prefetch``),
waited for until ``check_prefetch_progress`` admits the request; storage writes are
reaped at every HiCache step (``_drain_storage_writes``).

Per-request lifecycle (mirrors sglang/srt/managers + mem_cache/common.py of
sglang 0.5.23):
  0. every 32nd request, the FCFS scheduler's waiting-prefix refresh touches
     the full prompt (SchedulePolicy._touch_waiting_prefixes);
  1. Req(...) is built; Req.init_next_round_input(tree_cache) matches the
     prompt with the engine's rule "match at most len(prompt)-1 tokens",
     page-aligned down.  -> hit_tokens = req.prefix_len
  2. the matched node is locked (tree_cache.lock), as PrefillAdder does;
  3. KV slots for the un-hit prompt tokens are taken with the engine's own
     alloc_token_slots / alloc_paged_token_slots_extend, which evict through
     the cache when the pool is short;  with --chunked-prefill-size the
     prompt is prefilled in chunks and checkpointed after each chunk; the
     chunk ends come from SGLang's own PrefillAdder (add_one_req for the
     first pass, add_chunked_req for each later one; --chunk-rule adder,
     the default; 'fixed' keeps the older every-end-page-rounded rule);
  4. after prefill, if the request is not finished, checkpoint_kv_cache
     publishes the prompt (what cache_unfinished_req used to do);
  5. each further output token takes one decode step: check_decode_capacity
     then alloc_token_slots(1) / alloc_paged_token_slots_decode;
  6. when the request finishes (max_new_tokens = len(output_tokens)),
     release_kv_cache(checkpoint=True) inserts prompt + output[:-1]
     (page-aligned), frees the rest and unlocks (cache_finished_req).

Output JSONL per request: id, prompt_len, hit_tokens (+ diagnostics).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Replay a token trace through SGLang's real radix cache (CPU)."
    )
    p.add_argument("--trace", required=True, help="input JSONL trace")
    p.add_argument("--out", required=True, help="output JSONL, one line per request")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument(
        "--capacity-tokens",
        type=int,
        required=True,
        help="KV token slots in the pool (SGLang's max_total_num_tokens); "
        "rounded down to a multiple of --page-size as SGLang does",
    )
    p.add_argument(
        "--impl",
        choices=["unified", "radix"],
        default="unified",
        help="unified = UnifiedRadixCache (what sglang 0.5.23 builds by default); "
        "radix = the classic RadixCache class (radix_cache.py)",
    )
    p.add_argument(
        "--tree-core",
        choices=["rust", "python"],
        default=None,
        help="TreeCore backend for --impl unified (engine default: rust, "
        "falls back to python when the bundled extension cannot load)",
    )
    p.add_argument(
        "--eviction-policy",
        default="lru",
        help="radix eviction policy (lru, lfu, fifo, mru, filo, priority, slru, tlru)",
    )
    p.add_argument(
        "--eviction-policy-config",
        default=None,
        help="JSON object of keyword arguments for the eviction strategy (SGLang's "
        "eviction_policy_config), e.g. '{\"threshold\": 64, \"next_prompt_estimate\": 32}' "
        "for tlru or '{\"protected_threshold\": 2}' for slru",
    )
    p.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=-1,
        help="prefill chunk size in tokens; -1 disables chunking (SGLang's default "
        "is 2048..16384 by GPU memory; it only changes node boundaries, not hits "
        "of a lone request)",
    )
    p.add_argument(
        "--chunk-rule",
        choices=["adder", "fixed"],
        default="adder",
        help="with --chunked-prefill-size: 'adder' (default) lets SGLang's own "
        "PrefillAdder (add_one_req, then add_chunked_req each pass) admit the request and "
        "pick every chunk end, as the scheduler does; 'fixed' is the older harness rule "
        "(every chunk end rounded down to a page)",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=16384,
        help="SGLang --max-prefill-tokens (PrefillAdder's rem_input_tokens; default 16384)",
    )
    p.add_argument(
        "--extra-decode-step",
        action="store_true",
        help="model the overlap scheduler finishing on a stop token: one more decode "
        "step runs, so the KV of the last output token is cached too",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="model context length (only used for the engine's request-length caps)",
    )
    p.add_argument(
        "--waiting-prefix-refresh-interval",
        type=int,
        default=32,
        help="the FCFS scheduler (SGLANG_ENABLE_WAITING_PREFIX_REFRESH, default on, LRU "
        "only) touches the full prompt of waiting requests on every 32nd scheduling pass "
        "that has a waiting queue; with one request at a time that is requests "
        "0, 32, 64, ... (0 = off)",
    )
    p.add_argument(
        "--hicache-write-policy",
        choices=["write_through", "write_through_selective", "write_back"],
        default=None,
        help="turn on HiCache (--enable-hierarchical-cache) with this write policy "
        "(SGLang --hicache-write-policy); off by default",
    )
    p.add_argument(
        "--hicache-ratio",
        type=float,
        default=2.0,
        help="host pool size as a multiple of the device pool (SGLang --hicache-ratio)",
    )
    p.add_argument(
        "--hicache-size",
        type=int,
        default=0,
        help="host pool size in GB (SGLang --hicache-size; 0 = use --hicache-ratio)",
    )
    p.add_argument(
        "--hicache-storage-backend",
        choices=["file"],
        default=None,
        help="HiCache L3 storage backend (SGLang --hicache-storage-backend); needs "
        "--hicache-write-policy. The store lives in a fresh temporary folder",
    )
    p.add_argument(
        "--hicache-storage-prefetch-policy",
        choices=["best_effort", "wait_complete", "timeout"],
        default="wait_complete",
        help="SGLang --hicache-storage-prefetch-policy; the harness waits for every "
        "prefetch to finish before admitting (see _storage_prefetch)",
    )
    p.add_argument(
        "--hicache-storage-prefetch-threshold",
        type=int,
        default=256,
        help="prefetch_threshold of --hicache-storage-backend-extra-config (tokens)",
    )
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument(
        "--check",
        action="store_true",
        help="after every request assert free + cached == capacity and nothing locked",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads; 1 is fastest for these tiny tensor ops",
    )
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def _quiet_imports():
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("sglang").setLevel(logging.WARNING)


def _ensure_torchvision_importable():
    """sglang's import chain (memory_pool -> configs -> multimodal utils) does
    `import torchvision.transforms` at module level, although the prefix cache
    never uses it.  With the CPU torch 2.13 wheel there is no working
    torchvision, so we register an inert placeholder package in that case only.
    Nothing in the cache / allocator / scheduler code path touches it."""
    try:
        import torchvision  # noqa: F401

        return False
    except Exception:
        pass
    import importlib.machinery
    import types

    class _Inert:
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return self

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Inert()

    def _module(name):
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        m.__path__ = []
        def _getattr(attr):  # PEP 562 module __getattr__
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Inert()

        m.__getattr__ = _getattr
        m.__version__ = "0.0.0"  # lets version probes (transformers) parse it
        return m

    for name in (
        "torchvision",
        "torchvision.transforms",
        "torchvision.transforms.functional",
        "torchvision.transforms.v2",
        "torchvision.transforms.v2.functional",
        "torchvision.io",
        "torchvision.ops",
    ):
        sys.modules[name] = _module(name)
    return True


class SGLangReplayer:
    """Owns the pools and the tree; runs requests one at a time."""

    def __init__(self, args):
        self.storage_dir = None  # set by _storage_server_args in HiCache mode with an L3 store
        if args.tree_core is not None:
            os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = args.tree_core
        _quiet_imports()
        self.torchvision_placeholder = _ensure_torchvision_importable()
        from array import array

        import torch

        torch.set_num_threads(max(1, args.torch_threads))

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.managers.schedule_policy import PrefillAdder
        from sglang.srt.mem_cache import allocation as sgl_alloc
        from sglang.srt.mem_cache import common as sgl_common
        from sglang.srt.mem_cache.allocator import (
            PagedTokenToKVPoolAllocator,
            TokenToKVPoolAllocator,
        )
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import (
            ServerArgs,
            set_global_server_args_for_scheduler,
        )

        self.array = array
        self.torch = torch
        self.Req = Req
        self.PrefillAdder = PrefillAdder
        self.SamplingParams = SamplingParams
        self.sgl_alloc = sgl_alloc
        self.sgl_common = sgl_common

        ps = args.page_size
        if ps < 1:
            raise SystemExit("--page-size must be >= 1")
        self.page_size = ps
        self.capacity = args.capacity_tokens // ps * ps
        if self.capacity <= 0:
            raise SystemExit("--capacity-tokens must hold at least one page")
        self.extra_decode_step = args.extra_decode_step
        self.chunk = args.chunked_prefill_size
        self.chunk_rule = args.chunk_rule
        self.max_prefill_tokens = args.max_prefill_tokens
        self.chunk_ends = []  # extend_end of every prefill pass of the current request
        self.refresh_interval = (
            args.waiting_prefix_refresh_interval
            if args.eviction_policy.lower() == "lru"
            else 0
        )
        self._sched_passes = 0

        # The engine's request-length caps (tp_worker / scheduler):
        #   max_req_len = min(context_len - 1, kv_capacity - 1)
        #   prompts of >= max_req_len - 5 tokens are rejected,
        #   max_new_tokens is clipped to max_req_len - prompt_len - 1.
        ctx = args.context_length if args.context_length else 1 << 40
        self.max_req_len = min(ctx - 1, self.capacity - 1)
        self.max_req_input_len = self.max_req_len - 5

        self.hicache = args.hicache_write_policy is not None
        if self.hicache:
            server_args = ServerArgs(
                model_path="dummy",
                page_size=ps,
                enable_hierarchical_cache=True,
                hicache_ratio=args.hicache_ratio,
                hicache_size=args.hicache_size,
                hicache_write_policy=args.hicache_write_policy,
                hicache_io_backend="direct",
                hicache_mem_layout="layer_first",
                **self._storage_server_args(args),
            )
        else:
            server_args = ServerArgs(model_path="dummy", page_size=ps)
        if self.hicache and self.storage_dir is not None:
            _single_rank_storage(server_args)
        else:
            set_global_server_args_for_scheduler(server_args)
        kvcache = _hicache_kv_pool(self.capacity, ps) if self.hicache else None

        # One request runs at a time; a few spare rows cost nothing.
        self.req_to_token_pool = ReqToTokenPool(
            size=4,
            max_context_len=self.capacity + 2 * ps + 8,
            device="cpu",
            enable_memory_saver=False,
        )
        # The real allocators hand out integer slot ids from a free list; they
        # never touch KV tensors, so no KV pool is attached (kvcache=None),
        # except in HiCache mode, whose host pool is shaped after a (tiny) one.
        if ps == 1:
            self.allocator = TokenToKVPoolAllocator(
                size=self.capacity,
                dtype=torch.bfloat16,
                device="cpu",
                kvcache=kvcache,
                need_sort=False,
            )
        else:
            self.allocator = PagedTokenToKVPoolAllocator(
                size=self.capacity,
                page_size=ps,
                dtype=torch.bfloat16,
                device="cpu",
                kvcache=kvcache,
                need_sort=False,
            )

        params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=ps,
            eviction_policy=args.eviction_policy,
            eviction_policy_config=(
                json.loads(args.eviction_policy_config)
                if args.eviction_policy_config
                else None
            ),
            tree_components=(ComponentType.FULL,),
        )
        base = UnifiedRadixCache if args.impl == "unified" else RadixCache
        self.cache = _counting_cache_class(base)(params)
        self.host_capacity = None
        if self.hicache:
            if args.impl != "unified":
                raise SystemExit("HiCache runs only with --impl unified (UnifiedRadixCache.init_hicache)")
            self.cache.init_hicache(server_args, params)
            if self.storage_dir is not None:
                # the storage read path allocates its staging pages with the host pool's
                # pin_memory flag; a CPU-only torch has no pinned allocator
                for pool in {id(p): p for p in (self.cache.cache_controller.mem_pool_host,
                                                getattr(self.cache.cache_controller, "storage_host_pool", None))
                             if p is not None}.values():
                    if hasattr(pool, "pin_memory"):
                        pool.pin_memory = False
            self.host_capacity = int(self.cache.cache_controller.mem_pool_host.size)
            _count_transfers(self.cache)
        self.impl_name = type(self.cache).__mro__[1].__name__
        core = getattr(self.cache, "tree_core", None)
        self.tree_core_name = type(core).__name__ if core is not None else "-"
        self._rid = 0

    # ------------------------------------------------------------------ #
    def cached_tokens(self) -> int:
        return int(self.cache.evictable_size()) + int(self.cache.protected_size())

    def _alloc_extend(self, req, prefix_len: int, seq_len: int):
        """Prefill allocation for [prefix_len, seq_len) as alloc_for_extend does."""
        torch = self.torch
        n = seq_len - prefix_len
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        if self.page_size == 1:
            out = self.sgl_alloc.alloc_token_slots(self.cache, n)
        else:
            last = int(row[prefix_len - 1]) if prefix_len > 0 else -1
            pl = torch.tensor([prefix_len], dtype=torch.int64)
            sl = torch.tensor([seq_len], dtype=torch.int64)
            out = self.sgl_alloc.alloc_paged_token_slots_extend(
                tree_cache=self.cache,
                prefix_lens=pl,
                prefix_lens_cpu=pl,
                seq_lens=sl,
                seq_lens_cpu=sl.clone(),
                last_loc=torch.tensor([last], dtype=torch.int64),
                extend_num_tokens=n,
            )
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(prefix_len, seq_len)), out)
        req.kv.kv_allocated_len = seq_len
        req.kv.kv_committed_len = seq_len

    def _prefill_adder(self):
        """A fresh ``PrefillAdder`` for one scheduling pass, built with the arguments
        ``Scheduler.get_new_batch_prefill`` gives it for a lone request: no running
        batch, no mixed decode tokens, ``rem_input_tokens = max_prefill_tokens``,
        ``rem_chunk_tokens = chunked_prefill_size``."""
        return self.PrefillAdder(
            self.page_size, self.cache, self.allocator, None, 1.0,
            self.max_prefill_tokens, self.chunk,
        )

    def _chunked_prefill(self, req):
        """Prefill *req* in the chunks SGLang's own ``PrefillAdder`` picks.

        Pass 1 (``Scheduler.get_new_batch_prefill``): ``add_one_req`` admits the request
        (its memory check, lock of the matched node) and, when the un-hit prompt does not
        fit in ``rem_chunk_tokens``, cuts it (``_select_prefill_admission``: the chunk
        end rounded down to a page) and makes it the chunked request. Every later pass:
        ``stash_chunked_request`` -> ``checkpoint_kv_cache`` (insert what is computed,
        move the lock), then ``chunked_req.init_next_round_input()`` (no tree lookup) and
        ``add_chunked_req`` (``min(rest, available_chunk_tokens)``, *not* page-rounded),
        until a pass takes the rest. Each pass allocates ``[prefix_len, extend_end)`` as
        ``alloc_for_extend`` does (evicting through the tree when short)."""
        adder = self._prefill_adder()
        res = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if not adder.can_run_list or adder.can_run_list[-1] is not req:
            raise RuntimeError(f"request {req.rid}: PrefillAdder.add_one_req refused it alone ({res})")
        chunked = adder.new_chunked_req is req
        self.chunk_ends.append(int(req.extend_end))
        self._alloc_extend(req, req.prefix_len, req.extend_end)
        while chunked:
            self.sgl_common.checkpoint_kv_cache(req, self.cache)  # stash_chunked_request
            req.init_next_round_input()
            adder = self._prefill_adder()
            chunked = adder.add_chunked_req(req) is req
            if not adder.can_run_list or adder.can_run_list[-1] is not req:
                raise RuntimeError(f"request {req.rid}: add_chunked_req made no progress")
            self.chunk_ends.append(int(req.extend_end))
            self._alloc_extend(req, req.prefix_len, req.extend_end)
        assert req.extend_end == len(req.full_untruncated_fill_ids), (req.rid, req.extend_end)

    def _decode_step(self, req):
        """One decode step for a lone request (check_decode_mem + alloc_for_decode)."""
        torch = self.torch
        ps = self.page_size
        seq = req.kv.kv_committed_len
        need = ps if seq % ps == 0 else 0
        self.allocator.check_decode_capacity(num_tokens=need, tree_cache=self.cache)
        if ps == 1:
            loc = self.sgl_alloc.alloc_token_slots(self.cache, 1)
        else:
            row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
            nxt = torch.tensor([seq + 1], dtype=torch.int64)
            loc = self.sgl_alloc.alloc_paged_token_slots_decode(
                tree_cache=self.cache,
                seq_lens=nxt,
                seq_lens_cpu=nxt.clone(),
                last_loc=torch.tensor([int(row[seq - 1])], dtype=torch.int64),
                token_per_req=1,
            )
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(seq, seq + 1)), loc)
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1

    def _padded(self, prompt, mm):
        """The prompt as the scheduler pads it for the tree (module docstring)."""
        import hashlib

        from sglang.srt.managers.mm_utils import duplicate_pad_mm_input_ids, pad_mm_tokens
        from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

        items = []
        for it in mm:
            item = MultimodalDataItem(modality=Modality.IMAGE,
                                      offsets=[(it["offset"], it["offset"] + it["length"] - 1)])
            item.set_hash(int.from_bytes(hashlib.sha256(it["hash"].encode()).digest()[:8], "big"))
            items.append(item)
        placeholder = prompt[mm[0]["offset"]]
        inputs = MultimodalInputs(mm_items=items, im_token_id=placeholder)
        return list(duplicate_pad_mm_input_ids(self.array("q", prompt), inputs, pad_mm_tokens))

    def run_request(self, rid: str, prompt, output, priority=None, cache_salt=None, lora=None, mm=None) -> dict:
        if mm:
            prompt = self._padded(prompt, mm)
        P = len(prompt)
        rec = {"id": rid, "prompt_len": P, "hit_tokens": 0}
        if P == 0 or P >= self.max_req_input_len:
            rec.update(status="rejected", output_len=len(output), evicted_tokens=0,
                       cached_after=self.cached_tokens())
            return rec
        n = len(output)
        # scheduler clip (max_req_len - P - 1) and allocator clip
        # (BaseTokenToKVPoolAllocator.max_new_tokens_for_memory)
        ps = self.page_size
        mem_cap = self.capacity - (-(-P // ps) * ps) - ps - 1
        n_eff = max(1, min(n, self.max_req_len - P - 1, mem_cap)) if n else 1
        # no output in the trace: behave like max_new_tokens=1 with a placeholder token;
        # the KV of the only sampled token is never computed, so it is never cached
        outs = list(output[:n_eff]) if n else [0]

        sp = self.SamplingParams(temperature=0, max_new_tokens=n_eff, ignore_eos=True)
        sp.normalize(None)
        req = self.Req(
            rid=rid,
            origin_input_text="",
            origin_input_ids=self.array("q", prompt),
            sampling_params=sp,
            priority=priority,
            cache_salt=cache_salt or None,
            lora_id=lora or None,
        )
        ev0 = self.cache.evicted_tokens_total

        if self.storage_dir is not None:
            rec["storage_hit_tokens"] = self._storage_prefetch(req)

        # 0. scheduling pass (SchedulePolicy.calc_priority -> _touch_waiting_prefixes):
        #    with the default FCFS policy every 32nd pass touches the *full* prompt
        #    (no P-1 cap), which refreshes LRU and may split a node at P.
        if self.refresh_interval > 0:
            if self._sched_passes % self.refresh_interval == 0:
                self.sgl_common.touch_waiting_prefix(req, self.cache)
            self._sched_passes += 1

        # 1. prefix match (last-token rule + page alignment happen inside)
        req.init_next_round_input(self.cache)
        hit = int(req.prefix_len)
        rec["hit_tokens"] = hit
        if self.hicache:
            ctl = self.cache.cache_controller
            w0, l0, h0 = ctl.n_written, ctl.n_loaded, self.cache.host_evicted_total
            rec["host_hit_tokens"] = int(req.host_hit_length)
            rec["loaded_tokens"] = 0
            if req.needs_host_load_back():
                # PrefillAdder.add_one_req: pin the device match, then (host-locked
                # best match) init_load_back; a lone request always passes
                # memory_budget.prepare_load_back (its prompt + outputs + a page fit,
                # see mem_cap above), so that check is not run here.
                from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

                pin = self.cache.lock(req.last_node)
                hl = self.cache.inc_host_lock_ref(req.best_match_node).to_dec_params()
                try:
                    loaded = self.cache.init_load_back(
                        InitLoadBackParams(
                            best_match_node=req.best_match_node,
                            host_hit_length=req.host_hit_length,
                            req=req,
                        )
                    )
                finally:
                    self.cache.dec_host_lock_ref(req.best_match_node, hl)
                    self.cache.unlock(pin)
                req.host_loaded_length, req.last_node = loaded
                req.prefix_len += req.host_loaded_length
                req.kv.cache_protected_len = req.prefix_len
                rec["loaded_tokens"] = int(req.host_loaded_length)
                hit = int(req.prefix_len)

        # 2./3. admit: lock the matched node, then allocate the extend part
        self.req_to_token_pool.alloc([req])
        prefix_idx = self.cache.prefix_device_indices(req)
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(0, hit)), prefix_idx)
        self.chunk_ends = []
        if self.chunk > 0 and self.chunk_rule == "adder":
            self._chunked_prefill(req)
            rec["chunk_ends"] = self.chunk_ends
        while self.chunk <= 0 or self.chunk_rule == "fixed":
            start = req.prefix_len
            end = P
            if self.chunk > 0 and P - start > self.chunk:
                end = (start + self.chunk) // ps * ps
                if end <= start:
                    end = min(P, start + self.chunk)
            req.extend_end = end
            if req.lock is None:
                req.lock = self.cache.lock(req.last_node)
            self._alloc_extend(req, start, end)
            if end >= P:
                break
            # a middle chunk: stash_chunked_request -> checkpoint_kv_cache
            self.sgl_common.checkpoint_kv_cache(req, self.cache)

        # 4. prefill produced the first output token
        self._hicache_step()
        req.output_ids.append(outs[0])
        req.update_finish_state()
        if not req.finished():
            self.sgl_common.checkpoint_kv_cache(req, self.cache)

        # 5. decode steps
        k = 1
        while not req.finished():
            self._hicache_step()
            self._decode_step(req)
            req.output_ids.append(outs[k])
            k += 1
            req.update_finish_state()
        if self.extra_decode_step and n > 0:
            # overlap scheduler: the step feeding the last (stop) token already ran
            self._decode_step(req)

        # 6. finish: insert into the tree, free the rest, unlock
        self.sgl_common.release_kv_cache(req, self.cache, checkpoint=True)
        self._hicache_step()
        if self.hicache:
            rec.update(
                written_tokens=int(ctl.n_written - w0),
                load_tokens=int(ctl.n_loaded - l0),
                host_evicted_tokens=int(self.cache.host_evicted_total - h0),
                host_cached_after=int(self.host_capacity - ctl.mem_pool_host.available_size()),
            )

        rec.update(
            status="ok" if n_eff == n or not n else "clipped",
            output_len=n,
            evicted_tokens=int(self.cache.evicted_tokens_total - ev0),
            cached_after=self.cached_tokens(),
        )
        return rec

    def _storage_server_args(self, args) -> dict:
        if args.hicache_storage_backend is None:
            self.storage_dir = None
            return {}
        import tempfile

        self.storage_dir = tempfile.mkdtemp(prefix="hicache_file_")
        return {
            "hicache_storage_backend": args.hicache_storage_backend,
            "hicache_storage_prefetch_policy": args.hicache_storage_prefetch_policy,
            "hicache_storage_backend_extra_config": json.dumps(
                {"prefetch_threshold": args.hicache_storage_prefetch_threshold}),
            "file_storage_path": self.storage_dir,
        }

    def _storage_prefetch(self, req) -> int:
        """The arrival-time L3 prefetch, as ``Scheduler._prefetch_kvcache`` issues it
        (a stamping match; only from a backed-up or root ``last_host_node``; the tokens
        after the device + host match up to ``_compute_max_prefix_len``), then the
        scheduler steps (``check_hicache_events``) until ``check_prefetch_progress``
        says the request may be admitted. Stand-in: the real controller threads
        (storage hit query, L3 → host transfer) run as they do, but the harness waits
        for them (polling every millisecond) before the admission, whatever
        ``--hicache-storage-prefetch-policy`` says; with ``best_effort`` the wait is
        for the hit query and transfer to land first. Returns the tokens inserted on
        host from storage (``prefetch_loaded_tokens_by_reqid``)."""
        c = self.cache
        req.init_next_round_input(c)
        last_host = req.last_host_node
        matched = req.prefix_len + req.host_hit_length
        handle = req.cache_request_handle
        if not (c.is_backuped(last_host) or c.is_root(last_host)):
            return 0
        ids = req.full_untruncated_fill_ids
        end = req._compute_max_prefix_len(len(ids))
        c.prefetch_from_storage(handle, last_host, ids[matched:end], c.get_last_hash_value(last_host), None,
                                matched_prefix_tokens=ids[:matched], extra_key=req.extra_key,
                                cache_salt=req.cache_salt)
        t0 = time.time()
        while True:
            c.check_hicache_events()
            if c.has_ongoing_prefetch(handle):
                op = c.ongoing_prefetch[handle].operation
                landed = op.host_indices is not None and op.completed_tokens >= len(op.hash_value) * self.page_size
                if (landed or op.is_terminated()) and c.check_prefetch_progress(handle):
                    break
            else:
                break
            if time.time() - t0 > 60:
                raise RuntimeError(f"request {req.rid}: storage prefetch did not finish in 60 s")
            time.sleep(0.001)
        return int(c.prefetch_loaded_tokens_by_reqid.pop(handle, 0) or 0)

    def _drain_storage_writes(self):
        """Wait for the backup thread to write every acked host node to storage
        (``ongoing_backup`` empty), as the model's convention (writes land before the
        next request's lookup)."""
        c = self.cache
        t0 = time.time()
        while c.ongoing_backup:
            time.sleep(0.001)
            c.check_hicache_events()
            if time.time() - t0 > 60:
                raise RuntimeError("storage writes did not finish in 60 s")

    def _hicache_step(self):
        """The scheduler's per-step HiCache events (``check_hicache_events``) after
        the forward pass started the queued loads (``ready_to_load_host_cache``).
        On CPU every transfer is done when polled, so all acks are reaped here:
        a write-through or load-back finishes before the next scheduler step."""
        if not self.hicache:
            return
        self.cache.ready_to_load_host_cache()
        self.cache.check_hicache_events()
        assert not self.cache.ongoing_write_through and not self.cache.ongoing_load_back
        if self.storage_dir is not None:
            self._drain_storage_writes()

    def check(self):
        free = int(self.allocator.available_size())
        cached = self.cached_tokens()
        prot = int(self.cache.protected_size())
        assert prot == 0, f"protected tokens left after a request: {prot}"
        assert free + cached == self.capacity, (free, cached, self.capacity)


def _single_rank_storage(server_args):
    """Publish the server args as the scheduler of world rank 0 (one TP / PP rank): the
    storage path reads this process's ranks (``_generate_storage_config``)."""
    from sglang.srt.runtime_context import SpawnRanks, publish

    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))


def _hicache_kv_pool(capacity, page_size):
    """A 1-layer, 1-head, 8-dim bf16 device KV pool: HiCache's host pool copies its
    geometry; the tree's decisions never depend on the KV values."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    _cpu_hicache_patches()
    return MHATokenToKVPool(
        size=capacity, page_size=page_size, dtype=torch.bfloat16, head_num=1, head_dim=8,
        layer_num=1, device="cpu", enable_memory_saver=False, enable_alt_stream=False,
    )


def _cpu_hicache_patches():
    """Let HiCache's host pool and transfer engine run on a CPU-only torch.

    - ``pool_host/common.py :: _cuda_host_register`` (cudaHostRegister of the host
      buffer) becomes a no-op;
    - the sgl_kernel copy kernels ``pool_host/mha.py`` calls (``transfer_kv_*``)
      become no-ops: the KV values are never read, only the tree's bookkeeping;
    - ``torch.cpu.Stream`` gains the ``synchronize`` the L2 transfer engine calls.
    Nothing in the tree, eviction, host allocator or controller logic is touched.
    """
    import torch
    import sglang.srt.mem_cache.pool_host.common as phc
    import sglang.srt.mem_cache.pool_host.mha as phm

    phc._cuda_host_register = lambda *a, **k: None
    for name in dir(phm):
        if name.startswith("transfer_kv_"):
            setattr(phm, name, lambda *a, **k: None)
    for name in ("transfer_kv_direct", "transfer_kv_per_layer", "transfer_kv_all_layer"):
        setattr(phm, name, lambda *a, **k: None)
    if not hasattr(torch.cpu.Stream, "synchronize"):
        torch.cpu.Stream.synchronize = lambda self: None


def _count_transfers(cache):
    """Count tokens moved GPU→host (``write``) and host→GPU (``load``) by the real
    controller, and host tokens freed by ``evict_host``."""
    ctl = cache.cache_controller
    ctl.n_written = 0
    ctl.n_loaded = 0
    cache.host_evicted_total = 0
    write, load, evict_host = ctl.write, ctl.load, cache.evict_host

    def counted_write(device_indices, *a, **k):
        out = write(device_indices, *a, **k)
        if out is not None:
            ctl.n_written += len(device_indices)
        return out

    def counted_load(host_indices, *a, **k):
        out = load(host_indices, *a, **k)
        if out is not None:
            ctl.n_loaded += len(host_indices)
        return out

    def counted_evict_host(num_tokens, *a, **k):
        n = evict_host(num_tokens, *a, **k)
        cache.host_evicted_total += int(n)
        return n

    ctl.write, ctl.load, cache.evict_host = counted_write, counted_load, counted_evict_host


def _counting_cache_class(base):
    """Subclass of the real cache that only counts the tokens eviction frees."""

    class Counting(base):
        evicted_tokens_total = 0
        _evict_depth = 0

        def evict(self, params, *a, **kw):
            return self._counted(super().evict, params, *a, **kw)

        def evict_for_alloc(self, params, *a, **kw):
            return self._counted(super().evict_for_alloc, params, *a, **kw)

        def _counted(self, fn, params, *a, **kw):
            self._evict_depth += 1
            try:
                res = fn(params, *a, **kw)
            finally:
                self._evict_depth -= 1
            if self._evict_depth == 0 and res is not None:
                self.evicted_tokens_total += int(res.num_tokens_evicted)
            return res

    Counting.__name__ = "Counting" + base.__name__
    return Counting


def iter_trace(path):
    """``(id, prompt, output, priority)`` per request (the keys of :func:`iter_trace_keys` left out)."""
    for rid, prompt, output, priority, _keys in iter_trace_keys(path):
        yield rid, prompt, output, priority


def iter_trace_keys(path):
    """``(id, prompt, output, priority, {"cache_salt", "lora", "mm"})`` per request."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            if "radixkv_trace" in obj:
                continue
            rid = str(obj.get("id", lineno))
            yield (rid, obj["tokens"], obj.get("output_tokens") or [], obj.get("priority"),
                   {"cache_salt": obj.get("cache_salt"), "lora": obj.get("lora"), "mm": obj.get("mm")})


def main(argv=None):
    args = parse_args(argv)
    t_import = time.perf_counter()
    rep = SGLangReplayer(args)
    t_ready = time.perf_counter()
    if not args.quiet:
        print(
            f"# sglang peer: impl={rep.impl_name} tree_core={rep.tree_core_name} "
            f"page_size={rep.page_size} capacity={rep.capacity} "
            f"policy={args.eviction_policy} chunk={args.chunked_prefill_size} "
            f"(setup {t_ready - t_import:.1f}s)",
            file=sys.stderr,
        )

    n_req = n_rej = 0
    tot_prompt = tot_hit = tot_out = tot_evicted = 0
    t0 = time.perf_counter()
    with open(args.out, "w") as fo:
        for rid, prompt, output, priority, keys in iter_trace_keys(args.trace):
            if args.limit is not None and n_req >= args.limit:
                break
            rec = rep.run_request(rid, prompt, output, priority, **keys)
            if args.check:
                rep.check()
            fo.write(json.dumps(rec) + "\n")
            n_req += 1
            if rec["status"] == "rejected":
                n_rej += 1
                continue
            tot_prompt += rec["prompt_len"]
            tot_hit += rec["hit_tokens"]
            tot_out += len(output)
            tot_evicted += rec["evicted_tokens"]
    dt = time.perf_counter() - t0

    rate = tot_hit / tot_prompt if tot_prompt else 0.0
    summary = {
        "impl": rep.impl_name,
        "tree_core": rep.tree_core_name,
        "page_size": rep.page_size,
        "capacity_tokens": rep.capacity,
        "requests": n_req,
        "rejected": n_rej,
        "prompt_tokens": tot_prompt,
        "hit_tokens": tot_hit,
        "token_hit_rate": round(rate, 6),
        "output_tokens": tot_out,
        "evicted_tokens": tot_evicted,
        "hicache_write_policy": args.hicache_write_policy,
        "host_capacity_tokens": rep.host_capacity,
        "cached_tokens_at_end": rep.cached_tokens(),
        "replay_seconds": round(dt, 3),
        "requests_per_s": round(n_req / dt, 2) if dt > 0 else None,
        "prompt_tokens_per_s": round(tot_prompt / dt, 1) if dt > 0 else None,
    }
    print(
        f"requests={n_req} rejected={n_rej} prompt_tokens={tot_prompt} "
        f"hit_tokens={tot_hit} token_hit_rate={rate:.4f} evicted_tokens={tot_evicted}"
    )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
