#!/usr/bin/env python3
"""Replay a JSONL token trace through SGLang 0.5.23's hybrid radix caches, on the CPU.

SGLang 0.5.23 has no separate ``SWARadixCache`` / ``MambaRadixCache`` classes any
more: ``mem_cache/registry.py :: create_unified_radix_cache`` builds one
``UnifiedRadixCache`` whose ``tree_components`` are ``(FULL, SWA)`` for a hybrid
sliding-window model and ``(FULL, MAMBA)`` for a hybrid SSM model. This script drives
that real cache (default tree core: Rust, as the server uses) with the allocators the
server builds for those models (``mem_cache/kv_cache_configurator.py``):

- ``--mode swa``: ``SWATokenToKVPoolAllocator`` (a full-attention token pool and a
  separate SWA token pool, ``--capacity-tokens`` / ``--swa-capacity-tokens``) over a
  stand-in ``BaseSWAKVPool`` that only keeps the full->SWA index mapping (no KV
  tensors); ``sliding_window_size`` = ``--sliding-window``.
- ``--mode mamba``: the default token allocator plus ``HybridReqToTokenPool`` with a
  tiny real ``MambaPool`` of ``--mamba-slots`` slots (SGLang's ``max_mamba_cache_size``)
  and the ``no_buffer`` strategy (``--mamba-radix-cache-strategy no_buffer``,
  page_size 1): the only states the tree gets are the ones a request donates when
  it checkpoints (prompt end) and when it finishes.

The scheduler's part is played as in ``sglang_replay.py`` (this folder), one request
at a time, plus the hybrid scheduler hooks:
  - ``ScheduleBatch.maybe_evict_swa`` before every decode allocation: from the
    second decode step on, when ``seqlen - 1 - window >= swa_evicted_seqlen +
    SGLANG_SWA_EVICTION_INTERVAL`` (128), ``tree_cache.evict_sliding_windows(req,
    seqlen - 1)``;
  - Mamba: ``alloc_req_slots -> ensure_mamba_capacity`` evicts mamba states when no
    slot is free for the request's own state; ``match_prefix`` copies the matched
    state (``cow_mamba``).

Output JSONL per request: id, prompt_len, hit_tokens (+ diagnostics: evicted
full/SWA tokens, evicted mamba states, tree sizes after the request).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_replay as base  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True)
    p.add_argument("--out", required=True, help="output JSONL ('-' = none)")
    p.add_argument("--mode", choices=["swa", "mamba"], required=True)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--capacity-tokens", type=int, required=True,
                   help="full-attention KV token slots (full_max_total_num_tokens)")
    p.add_argument("--swa-capacity-tokens", type=int, default=None,
                   help="SWA KV token slots (swa_max_total_num_tokens); swa mode")
    p.add_argument("--sliding-window", type=int, default=None,
                   help="sliding_window_size in tokens; swa mode")
    p.add_argument("--mamba-slots", type=int, default=None,
                   help="mamba state slots (max_mamba_cache_size); mamba mode")
    p.add_argument("--chunked-prefill-size", type=int, default=-1,
                   help="prefill chunk size in tokens (-1: whole prompt in one extend); each "
                   "middle chunk is checkpointed (checkpoint_kv_cache), as the scheduler does")
    p.add_argument("--chunk-rule", choices=["adder", "fixed"], default="adder",
                   help="with --chunked-prefill-size: 'adder' (default) lets SGLang's own "
                   "PrefillAdder (add_one_req, then add_chunked_req each pass; the hybrid "
                   "allocator's own prefill budget, SWAPrefillBudget for swa) admit the request "
                   "and pick every chunk end, as the scheduler does; 'fixed' is the older "
                   "harness rule (every chunk end rounded down to a page)")
    p.add_argument("--max-prefill-tokens", type=int, default=16384,
                   help="SGLang --max-prefill-tokens (PrefillAdder's rem_input_tokens; default 16384)")
    p.add_argument("--tree-core", choices=["rust", "python"], default=None)
    p.add_argument("--waiting-prefix-refresh-interval", type=int, default=32)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--check", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def _swa_pool_class():
    import torch
    from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool

    class MappingOnlySWAKVPool(BaseSWAKVPool):
        """Stand-in for ``SWAKVPool``: keeps only the full->SWA index mapping the
        allocator registers (``register_mapping`` / ``translate_loc_from_full_to_swa``
        as in ``mem_cache/swa_memory_pool.py``); no KV tensors. The tree's decisions
        never read KV values."""

        swa_req_ring_size = None
        request_window = None
        full_kv_pool = None
        swa_kv_pool = None

        def __init__(self):  # no KVCache buffers
            self.full_to_swa_index_mapping = None

        def register_mapping(self, m):
            self.full_to_swa_index_mapping = m

        def translate_loc_from_full_to_swa(self, kv_indices):
            return self.full_to_swa_index_mapping[kv_indices]

        def get_state_buf_infos(self):
            return [], [], []

        def get_key_buffer(self, layer_id):  # pragma: no cover - unused
            raise NotImplementedError

        def get_value_buffer(self, layer_id):  # pragma: no cover
            raise NotImplementedError

        def get_kv_buffer(self, layer_id):  # pragma: no cover
            raise NotImplementedError

        def set_kv_buffer(self, *a, **k):  # pragma: no cover
            raise NotImplementedError

    del torch
    return MappingOnlySWAKVPool


class HybridReplayer:
    def __init__(self, args):
        if args.tree_core is not None:
            os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = args.tree_core
        base._quiet_imports()
        base._ensure_torchvision_importable()
        from array import array

        import torch

        torch.set_num_threads(1)
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
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
        from sglang.srt.environ import envs

        self.array, self.torch, self.Req = array, torch, Req
        self.PrefillAdder = PrefillAdder
        self.SamplingParams = SamplingParams
        self.sgl_alloc, self.sgl_common = sgl_alloc, sgl_common
        self.CT = ComponentType
        self.mode = args.mode
        ps = self.page_size = args.page_size
        self.capacity = args.capacity_tokens // ps * ps
        self.refresh_interval = args.waiting_prefix_refresh_interval
        self.chunk = args.chunked_prefill_size
        self.chunk_rule = args.chunk_rule
        self.max_prefill_tokens = args.max_prefill_tokens
        self.chunk_ends = []  # extend_end of every prefill pass of the current request
        self._sched_passes = 0
        self.max_req_len = self.capacity - 1
        self.max_req_input_len = self.max_req_len - 5
        self.swa_eviction_interval = max(1, envs.SGLANG_SWA_EVICTION_INTERVAL.get())

        sa_kw = dict(model_path="dummy", page_size=ps)
        if self.mode == "mamba":
            sa_kw.update(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
        server_args = ServerArgs(**sa_kw)
        if self.mode == "mamba":
            # mamba_cache_chunk_size() reads the model's config unless pre-seeded
            # (arg_groups/overrides.py); 64 is FLA_CHUNK_SIZE, the GDN chunk of
            # Qwen3-Next. It only sets the grid of mamba_branching_seqlen.
            server_args._mamba_cache_chunk_size = 64
        set_global_server_args_for_scheduler(server_args)

        comps = [ComponentType.FULL]
        extra = {}
        if self.mode == "swa":
            if not args.sliding_window or not args.swa_capacity_tokens:
                raise SystemExit("--mode swa needs --sliding-window and --swa-capacity-tokens")
            from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

            self.swa_capacity = args.swa_capacity_tokens // ps * ps
            self.window = args.sliding_window
            self.req_to_token_pool = ReqToTokenPool(
                size=4, max_context_len=self.capacity + 2 * ps + 8, device="cpu",
                enable_memory_saver=False,
            )
            self.allocator = SWATokenToKVPoolAllocator(
                self.capacity, self.swa_capacity, page_size=ps, dtype=torch.bfloat16,
                device="cpu", kvcache=_swa_pool_class()(), need_sort=False,
                req_to_token_pool=self.req_to_token_pool,
            )
            comps.append(ComponentType.SWA)
            extra["sliding_window_size"] = self.window
        else:
            if not args.mamba_slots:
                raise SystemExit("--mode mamba needs --mamba-slots")
            if ps != 1:
                raise SystemExit("the no_buffer mamba strategy needs page_size 1 "
                                 "(MambaComponent asserts it)")
            self.mamba_slots = args.mamba_slots
            self.req_to_token_pool = self._hybrid_req_pool(args.mamba_slots)
            cls = TokenToKVPoolAllocator if ps == 1 else PagedTokenToKVPoolAllocator
            kw = dict(dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
            self.allocator = (cls(size=self.capacity, **kw) if ps == 1
                              else cls(size=self.capacity, page_size=ps, **kw))
            comps.append(ComponentType.MAMBA)
            extra["enable_mamba_extra_buffer"] = False
        params = CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator, page_size=ps,
            eviction_policy="lru", tree_components=tuple(comps), **extra,
        )
        self.cache = _counting_cache_class(UnifiedRadixCache)(params)
        core = getattr(self.cache, "tree_core", None)
        self.tree_core_name = type(core).__name__ if core is not None else "-"

    def _hybrid_req_pool(self, mamba_slots):
        import torch
        from sglang.srt.configs.mamba_utils import (
            Mamba2CacheParams,
            Mamba2StateDType,
            Mamba2StateShape,
        )
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

        shape = Mamba2StateShape(
            conv=[(4, 3)], temporal=(1, 2, 2), intermediate_size=4, conv_dim=4,
            ssm_state_size=2, num_heads=1, head_dim=2, state_size=2, conv_kernel=4,
        )
        cp = Mamba2CacheParams(
            shape=shape, layers=[0],
            dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32),
        )
        return HybridReqToTokenPool(
            size=4, mamba_size=mamba_slots, mamba_spec_state_size=4,
            max_context_len=self.capacity + 2 * self.page_size + 8, device="cpu",
            enable_memory_saver=False, cache_params=cp, mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False, enable_overlap_schedule=False,
        )

    # ------------------------------------------------------------------ #
    def sizes(self):
        c = self.cache
        out = {"cached_after": int(c.evictable_size()) + int(c.protected_size())}
        if self.mode == "swa":
            out["swa_cached_after"] = int(c.swa_evictable_size()) + int(c.swa_protected_size())
            out["swa_free"] = int(self.allocator.swa_available_size())
            out["full_free"] = int(self.allocator.full_available_size())
        else:
            out["mamba_cached_after"] = int(c.mamba_evictable_size()) + int(
                c.mamba_protected_size())
            out["mamba_free"] = int(self.req_to_token_pool.mamba_allocator.available_size())
        return out

    def _alloc_extend(self, req, prefix_len, seq_len):
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
                tree_cache=self.cache, prefix_lens=pl, prefix_lens_cpu=pl, seq_lens=sl,
                seq_lens_cpu=sl.clone(), last_loc=torch.tensor([last], dtype=torch.int64),
                extend_num_tokens=n,
            )
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(prefix_len, seq_len)), out)
        req.kv.kv_allocated_len = seq_len
        req.kv.kv_committed_len = seq_len

    # Chunked prefill through SGLang's own PrefillAdder: the same two methods as the
    # full-attention harness (sglang_replay.py). The adder builds its memory budget
    # from the allocator (``create_prefill_budget``): SWAPrefillBudget for the SWA
    # allocator (chunks also capped by the SWA pool: check_prefill's chunk cap,
    # available_chunk_tokens' ``remaining_swa - page_size``), the plain PrefillBudget
    # for the Mamba run (full_evictable_size); mamba_prefill_chunk_grid is 1 here (no
    # DCP, no extra buffer), so no mamba-grid rounding (floor_chunked_tokens).
    _prefill_adder = base.SGLangReplayer._prefill_adder
    _chunked_prefill = base.SGLangReplayer._chunked_prefill

    def _maybe_evict_swa(self, req):
        """ScheduleBatch.maybe_evict_swa for a decode batch of one request."""
        if self.mode != "swa" or req.decode_batch_idx < 1:
            return
        W = self.cache.swa_retain_window
        if req.seqlen - 1 - W >= req.kv.get_evicted_seqlen(self.CT.SWA) + self.swa_eviction_interval:
            self.allocator.free_group_begin()
            self.cache.evict_sliding_windows(req, req.seqlen - 1, eviction_interval=1)
            self.allocator.free_group_end()

    def _decode_step(self, req):
        torch = self.torch
        ps = self.page_size
        self._maybe_evict_swa(req)
        seq = req.kv.kv_committed_len
        need = ps if seq % ps == 0 else 0
        self.allocator.check_decode_capacity(num_tokens=need, tree_cache=self.cache)
        if ps == 1:
            loc = self.sgl_alloc.alloc_token_slots(self.cache, 1)
        else:
            row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
            nxt = torch.tensor([seq + 1], dtype=torch.int64)
            loc = self.sgl_alloc.alloc_paged_token_slots_decode(
                tree_cache=self.cache, seq_lens=nxt, seq_lens_cpu=nxt.clone(),
                last_loc=torch.tensor([int(row[seq - 1])], dtype=torch.int64),
                token_per_req=1,
            )
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(seq, seq + 1)), loc)
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1
        req.decode_batch_idx += 1

    def run_request(self, rid, prompt, output):
        P = len(prompt)
        rec = {"id": rid, "prompt_len": P, "hit_tokens": 0}
        if P == 0 or P >= self.max_req_input_len:
            rec.update(status="rejected", output_len=len(output))
            rec.update(self.sizes())
            return rec
        n = len(output)
        ps = self.page_size
        mem_cap = self.capacity - (-(-P // ps) * ps) - ps - 1
        n_eff = max(1, min(n, self.max_req_len - P - 1, mem_cap)) if n else 1
        outs = list(output[:n_eff]) if n else [0]
        sp = self.SamplingParams(temperature=0, max_new_tokens=n_eff, ignore_eos=True)
        sp.normalize(None)
        req = self.Req(rid=rid, origin_input_text="", origin_input_ids=self.array("q", prompt),
                       sampling_params=sp)
        c = self.cache
        ev0 = (c.evicted_tokens_total, c.evicted_swa_total, c.evicted_mamba_total)

        if self.refresh_interval > 0:
            if self._sched_passes % self.refresh_interval == 0:
                self.sgl_common.touch_waiting_prefix(req, c)
            self._sched_passes += 1

        req.init_next_round_input(c)
        hit = int(req.prefix_len)
        rec["hit_tokens"] = hit
        # alloc_req_slots: ensure_mamba_capacity, then the request row (+ mamba slot)
        self.sgl_alloc.alloc_req_slots(self.req_to_token_pool, [req], c)
        prefix_idx = c.prefix_device_indices(req)
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(0, hit)), prefix_idx)
        self.chunk_ends = []
        if self.chunk > 0 and self.chunk_rule == "adder":
            self._chunked_prefill(req)
            rec["chunk_ends"] = self.chunk_ends
        while self.chunk <= 0 or self.chunk_rule == "fixed":
            start, end = req.prefix_len, P
            if self.chunk > 0 and P - start > self.chunk:
                end = (start + self.chunk) // ps * ps
                if end <= start:
                    end = min(P, start + self.chunk)
            req.extend_end = end
            if req.lock is None:
                req.lock = c.lock(req.last_node)
            self._alloc_extend(req, start, end)
            if end >= P:
                break
            # a middle chunk: stash_chunked_request -> checkpoint_kv_cache
            self.sgl_common.checkpoint_kv_cache(req, c)
        req.output_ids.append(outs[0])
        req.update_finish_state()
        if not req.finished():
            self.sgl_common.checkpoint_kv_cache(req, c)
        k = 1
        while not req.finished():
            self._decode_step(req)
            req.output_ids.append(outs[k])
            k += 1
            req.update_finish_state()
        self.sgl_common.release_kv_cache(req, c, checkpoint=True)
        rec.update(
            status="ok" if n_eff == n or not n else "clipped",
            output_len=n,
            evicted_tokens=int(c.evicted_tokens_total - ev0[0]),
            evicted_swa_tokens=int(c.evicted_swa_total - ev0[1]),
            evicted_mamba=int(c.evicted_mamba_total - ev0[2]),
        )
        rec.update(self.sizes())
        return rec

    def check(self):
        c = self.cache
        assert int(c.protected_size()) == 0, c.protected_size()
        free = int(self.allocator.full_available_size() if self.mode == "swa"
                   else self.allocator.available_size())
        cached = int(c.evictable_size())
        assert free + cached == self.capacity, (free, cached, self.capacity)
        if self.mode == "mamba":
            mfree = int(self.req_to_token_pool.mamba_allocator.available_size())
            mcached = int(c.mamba_evictable_size())
            assert mfree + mcached == self.mamba_slots, (mfree, mcached, self.mamba_slots)
        else:
            sfree = int(self.allocator.swa_available_size())
            assert sfree + int(c.swa_evictable_size()) == self.swa_capacity, (
                sfree, c.swa_evictable_size(), self.swa_capacity)


def _counting_cache_class(basecls):
    class Counting(basecls):
        evicted_tokens_total = 0
        evicted_swa_total = 0
        evicted_mamba_total = 0
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
                self.evicted_swa_total += int(getattr(res, "swa_num_tokens_evicted", 0) or 0)
                self.evicted_mamba_total += int(getattr(res, "mamba_num_evicted", 0) or 0)
            return res

    Counting.__name__ = "Counting" + basecls.__name__
    return Counting


def run(args):
    rep = HybridReplayer(args)
    recs = []
    t0 = time.perf_counter()
    for i, (rid, prompt, output, _prio) in enumerate(base.iter_trace(args.trace)):
        if args.limit is not None and i >= args.limit:
            break
        recs.append(rep.run_request(rid, prompt, output))
        if args.check:
            rep.check()
    return rep, recs, time.perf_counter() - t0


def main(argv=None):
    args = parse_args(argv)
    rep, recs, dt = run(args)
    if args.out != "-":
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, args.out)
    ok = [r for r in recs if r["status"] != "rejected"]
    hit = sum(r["hit_tokens"] for r in ok)
    prompt = sum(r["prompt_len"] for r in ok)
    print(json.dumps({"mode": args.mode, "tree_core": rep.tree_core_name, "requests": len(recs),
                      "hit_tokens": hit, "prompt_tokens": prompt,
                      "token_hit_rate": round(hit / prompt, 6) if prompt else None,
                      "seconds": round(dt, 2)}))


if __name__ == "__main__":
    main()
