"""``SGLangSWACache``: SGLang 0.5.23's radix cache for a hybrid sliding-window model.

SGLang 0.5.23 serves a model whose layers mix full attention and sliding-window
attention (Gemma 3, gpt-oss, …) with one ``UnifiedRadixCache`` whose components are
``(FULL, SWA)`` (``mem_cache/registry.py :: create_unified_radix_cache``; the older
``SWARadixCache`` class is gone) over ``allocator/swa.py :: SWATokenToKVPoolAllocator``:
a full-attention token pool of ``max_total_num_tokens`` slots and a sliding-window pool
of ``swa_max_total_num_tokens = page_floor(max_total_num_tokens × swa_full_tokens_ratio)``
slots (``model_executor/pool_configurator.py :: _solve_pool_sizes``, ratio default 0.8).
A token's KV takes one slot in each pool while both halves are live. The model is
:mod:`radixkv.policies._sglang_unified` (pure Python); the rules, by SGLang function:

- **Tombstones** (``unified_cache/components/swa.py :: SWAComponent``): a tree node keeps
  its Full KV and may lose its SWA KV (``evict_component`` on an internal node); the
  node stays, its SWA half is a tombstone.
- **Hit rule** (``SWAComponent.create_match_validator``): walking the prompt (capped at
  P − 1, page-aligned), a node is a valid end of the hit when it holds SWA KV and the live
  nodes since the last tombstone on the path cover at least ``sliding_window_size``
  tokens (before any tombstone the count is infinite); the hit is the deepest valid node.
  The Full KV beyond it (``full_kv_hit_length``) is recomputed, and the request's first
  checkpoint inserts only up to that point (``finalize_match_result_in_tree_core``'s
  ``swa_branching_seqlen``, ``prepare_for_caching_req``), which revives those
  tombstones with the request's fresh KV (``update_component_on_insert_overlap``).
- **Request-side frees** (``common.py :: free_swa_out_of_window_slots``): a running
  request frees its own SWA slots below ``position − window`` (rounded to pages): at its
  prefill checkpoint (``checkpoint_into_tree``) and every
  ``SGLANG_SWA_EVICTION_INTERVAL`` (128) decode steps after the first
  (``ScheduleBatch.maybe_evict_swa``); what it inserts below that cursor is a tombstone
  (``_clip_to_window``).
- **Window leaves** (``_maybe_split_leaf_for_swa_lock``): a new leaf's live part is split
  so the leaf is one page-aligned window; both parts hold SWA KV.
- **Locks** (``acquire_component_lock``): Full locks the path to the root, SWA only the
  nodes covering the last window above the locked node.
- **Two LRUs**: Full evicts leaves by last access time (``FullComponent``, a heap); SWA
  keeps its own LRU list of nodes holding SWA KV (``UnifiedLRUList``) refreshed only
  within ``window + page_size`` tokens above the matched / inserted node
  (``SWAComponent.refresh_lru``).
- **Eviction** (``UnifiedRadixCache.evict_for_alloc`` / ``_evict_components``): each
  pool's shortfall is a target; Full walks first (deleting a leaf frees both halves),
  then SWA walks its LRU from the oldest unlocked node: a leaf is deleted whole, an
  internal node is tombstoned (SWA-only eviction).

- **Chunked prefill** (``chunked_prefill_size``, sequential :meth:`run_request`): chunk
  ends as ``managers/schedule_policy.py :: PrefillAdder`` picks them — the first pass
  (``add_one_req`` → ``_select_prefill_admission``) chunks when the un-hit prompt rounded
  up to a page exceeds the size, cutting ``size // page × page`` tokens; every later pass
  (``add_chunked_req``) takes ``min(rest, size)`` unrounded, so a size that is not a
  multiple of the page puts the later ends off the page grid. Each middle chunk is
  checkpointed (``stash_chunked_request`` → ``checkpoint_kv_cache``: its whole pages
  inserted, out-of-window SWA freed). SWA brings no other chunk rule here: its prefill
  budget (``mem_cache/prefill_budget.py :: SWAPrefillBudget``) caps a chunk only when
  the SWA pool is short (``check_prefill`` when the request could never fit,
  ``available_chunk_tokens``' ``remaining_swa − page``), which the goldens' lone
  requests never hit; those caps are not modelled.

Exact against SGLang 0.5.23's own classes on the goldens of
``tests/data/golden/sglang_hybrid/`` (``tools/engines/sglang_hybrid_replay.py``, which
drives SGLang's own ``PrefillAdder`` for chunked runs).
Not modelled: SWAPrefillBudget's chunk caps (above), HiCache,
``SGLANG_OPT_RELEASE_PREFILL_SWA``, the unified memory pool (``--enable-unified-memory``).
"""
from __future__ import annotations

from radixkv.errors import ConfigError
from radixkv.policies._sglang_unified import SWA_EVICTION_INTERVAL, UnifiedHybridCache, UnifiedTree

#: ``arg_groups/fields/schedule.py :: swa_full_tokens_ratio`` fallback
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8


def parse_swa_option(text):
    """``window=W[/swa_full_tokens_ratio=R | /swa_max_total_num_tokens=N]`` →
    ``(W, ("ratio", R) | ("tokens", N))``.

    Raises
    ------
    ConfigError
        Malformed text, W < 1, R outside (0, 1], N < 1.
    """
    parts = [p.strip() for p in str(text).strip().lower().split("/") if p.strip()]
    if not parts or not parts[0].startswith("window="):
        raise ConfigError(f"sglang-swa option {text!r}: expected window=W[/swa_full_tokens_ratio=R]",
                          field="policy")
    try:
        w = int(parts[0][len("window="):])
    except ValueError:
        raise ConfigError(f"sglang-swa option {text!r}: window must be an integer", field="policy") from None
    if w < 1:
        raise ConfigError(f"sglang-swa option {text!r}: window must be ≥ 1 token", field="policy")
    pool = ("ratio", DEFAULT_SWA_FULL_TOKENS_RATIO)
    for p in parts[1:]:
        k, _, v = p.partition("=")
        try:
            if k == "swa_full_tokens_ratio":
                r = float(v)
                if not 0 < r <= 1:
                    raise ValueError
                pool = ("ratio", r)
            elif k == "swa_max_total_num_tokens":
                n = int(v)
                if n < 1:
                    raise ValueError
                pool = ("tokens", n)
            else:
                raise KeyError
        except (ValueError, KeyError):
            raise ConfigError(f"sglang-swa option {text!r}: bad {p!r} (swa_full_tokens_ratio=R in (0, 1] or "
                              "swa_max_total_num_tokens=N)", field="policy") from None
    return w, pool


class SGLangSWACache(UnifiedHybridCache):
    """SGLang's radix cache of a hybrid sliding-window model (module docstring).

    Parameters
    ----------
    max_total_num_tokens : int
        Full-attention pool in tokens (SGLang's ``full_max_total_num_tokens``), rounded
        down to a page.
    page_size : int
        Tokens per page.
    sliding_window_size : int
        The SWA layers' window, tokens.
    swa_max_total_num_tokens : int or None
        SWA pool in tokens; default ``page_floor(int(max_total_num_tokens ×
        swa_full_tokens_ratio))``.
    swa_full_tokens_ratio : float
        SGLang's ``--swa-full-tokens-ratio`` (default 0.8).
    waiting_prefix_refresh_interval : int
        Every k-th admission touches its whole prompt first (the FCFS scheduler's
        waiting-prefix refresh with one request per pass); 0 turns it off.
    chunked_prefill_size : int or None
        SGLang's ``--chunked-prefill-size`` for :meth:`run_request`: prefill chunks
        (first one page-rounded, later ones of this many tokens as given: see the module
        docstring), each middle chunk checkpointed (its out-of-window SWA freed);
        None or ≤ 0: the prompt in one extend.

    Raises
    ------
    radixkv.errors.ConfigError
        Page < 1, a pool without a whole page, window < 1, a chunk size below the page
        size (SGLang's first chunk would be 0 tokens: never admitted).
    """

    name = "sglang-swa"
    option_name = "swa"
    default_option = (1024, ("ratio", DEFAULT_SWA_FULL_TOKENS_RATIO))

    def __init__(self, max_total_num_tokens: int, page_size: int = 1, sliding_window_size: int = 1024,
                 swa_max_total_num_tokens: int | None = None,
                 swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO,
                 waiting_prefix_refresh_interval: int = 32, chunked_prefill_size: int | None = None):
        ps = int(page_size)
        if ps < 1:
            raise ConfigError(f"page_size must be ≥ 1, got {page_size}", field="page_size")
        full = int(max_total_num_tokens) // ps * ps
        if swa_max_total_num_tokens is None:
            swa = int(full * float(swa_full_tokens_ratio)) // ps * ps
        else:
            swa = int(swa_max_total_num_tokens) // ps * ps
        if full < ps or swa < ps:
            raise ConfigError(f"pools of {full} full / {swa} SWA tokens hold no {ps}-token page",
                              field="max_total_num_tokens")
        if int(sliding_window_size) < 1:
            raise ConfigError(f"sliding_window_size must be ≥ 1, got {sliding_window_size}", field="policy")
        self.sliding_window_size = int(sliding_window_size)
        self.swa_max_total_num_tokens = swa
        super().__init__(UnifiedTree(ps, full, swa_tokens=swa, window=self.sliding_window_size,
                                     swa_eviction_interval=SWA_EVICTION_INTERVAL),
                         waiting_prefix_refresh_interval, chunked_prefill_size)

    @classmethod
    def parse_option(cls, text: str):
        """See :func:`parse_swa_option`."""
        return parse_swa_option(text)

    @classmethod
    def class_for_option(cls, value):
        if value is None:
            return cls, {}
        if isinstance(value, str):
            value = parse_swa_option(value)
        w, (kind, v) = value
        kw = {"sliding_window_size": w}
        kw["swa_full_tokens_ratio" if kind == "ratio" else "swa_max_total_num_tokens"] = v
        return cls, kw

    @classmethod
    def format_option(cls, value) -> str:
        w, (kind, v) = value
        return f"window={w}/" + (f"swa_full_tokens_ratio={v}" if kind == "ratio" else f"swa_max_total_num_tokens={v}")

    def _aux_group(self) -> dict:
        """The sliding-window pool's row of :meth:`group_metrics`."""
        t = self.tree
        return {"group": 1, "kind": "sliding_attention", "window": t.W, "capacity_tokens": t.swa_cap,
                "cached_tokens": t.tree_swa, "cached_tokens_mean": self._mean_tree(1),
                "evicted_tokens": t.evicted_swa}
