"""``SGLangMambaCache``: SGLang 0.5.23's radix cache for a hybrid SSM (Mamba) model.

SGLang 0.5.23 serves a model whose layers mix full attention with linear-attention / SSM
layers (Qwen3-Next, Nemotron-H, Jamba, …) with one ``UnifiedRadixCache`` whose
components are ``(FULL, MAMBA)`` (``mem_cache/registry.py :: create_unified_radix_cache``;
the older ``MambaRadixCache`` class is gone). Full-attention KV lives in the token pool
(``max_total_num_tokens`` slots); each SSM state (all SSM layers of one sequence
position) takes one slot of ``memory_pool.py :: HybridReqToTokenPool``'s Mamba pool
(``max_mamba_cache_size`` slots), shared by running requests and the tree. The model is
:mod:`radixkv.policies._sglang_unified` (pure Python); the rules, by SGLang function:

- **States only where checkpointed** (``unified_cache/components/mamba.py ::
  MambaComponent``, strategy ``no_buffer`` — ``--mamba-radix-cache-strategy no_buffer``,
  the resolved strategy when the overlap scheduler is off, page size 1 asserted): a
  node holds a state only if a request inserted one ending exactly there: a running
  request's prompt end (a copy into a new slot, ``prepare_for_caching_req``) and a
  finished request's KV end (its own slot, donated). A node split keeps the state on
  the lower half (``redistribute_on_node_split``).
- **Hit rule** (``create_match_validator``): the hit ends at the deepest node on the
  matched path that holds a state; Full KV matched beyond it is recomputed.
- **Copy-on-write** (``finalize_match_result_in_cache``): a hit copies the node's state
  into a slot of the request (evicting a state if none is free); a request without a
  hit takes a fresh slot (``allocation.py :: ensure_mamba_capacity``). A state the tree
  already holds at the insert point is not taken twice (``mamba_exist``; the copy or
  the request's slot is freed, ``cleanup_after_caching_req``).
- **Locks** (``acquire_component_lock``): the matched node's state only; Full locks the
  whole path.
- **Mamba LRU** (``refresh_lru``): only the state a match used is refreshed (ancestors
  are not); new states enter at the head.
- **Eviction** (``UnifiedRadixCache.evict_for_alloc``): Full evicts leaves by last
  access time, a leaf taking its state with it; a short Mamba pool walks the Mamba LRU
  from the oldest unlocked state: a state on a leaf deletes the leaf (Full KV too), a
  state on an inner node is dropped alone (tombstone), ``_evict_device_next_node``.

``mamba_max_states_per_path`` (default −1, unlimited) is not modelled, nor the
``extra_buffer`` strategy (states tracked every ``mamba_track_interval`` tokens with
ping-pong buffers; the server's default when the overlap scheduler is on) and HiCache.
Chunked prefill (``chunked_prefill_size``) follows ``PrefillAdder`` as for
:class:`~radixkv.policies.sglang_swa.SGLangSWACache`; at page 1 (the only page size
here) every chunk is ``min(rest, size)`` tokens. Mamba brings no chunk rule of its own
in this configuration: ``PrefillAdder.floor_chunked_tokens`` rounds a cut to the Mamba
kernel chunk only with the extra buffer and DCP (``mamba_prefill_chunk_grid``), and the
per-slot budget terms (``_mamba_gap_budget_for_req``, ``rem_mamba_slots``) only apply to
the unified Mamba allocators. Exact against SGLang 0.5.23's own classes on the goldens
of ``tests/data/golden/sglang_hybrid/`` (``tools/engines/sglang_hybrid_replay.py``,
SGLang's own ``PrefillAdder`` for chunked runs).
"""
from __future__ import annotations

from radixkv.errors import ConfigError
from radixkv.policies._sglang_unified import UnifiedHybridCache, UnifiedTree


def parse_mamba_option(text) -> int:
    """``max_mamba_cache_size=K`` → K (Mamba state slots, ≥ 1).

    Raises
    ------
    ConfigError
        Malformed text or K < 1.
    """
    t = str(text).strip().lower()
    k, _, v = t.partition("=")
    if k != "max_mamba_cache_size" or not v.isdigit() or int(v) < 1:
        raise ConfigError(f"sglang-mamba option {text!r}: expected max_mamba_cache_size=K (K ≥ 1)",
                          field="policy")
    return int(v)


class SGLangMambaCache(UnifiedHybridCache):
    """SGLang's radix cache of a hybrid SSM model (module docstring).

    Parameters
    ----------
    max_total_num_tokens : int
        Full-attention KV pool, tokens.
    page_size : int
        Must be 1 (``MambaComponent`` asserts it without the extra buffer).
    max_mamba_cache_size : int
        Mamba state slots (SGLang ``--max-mamba-cache-size``), shared by running
        requests (one each) and cached states.
    waiting_prefix_refresh_interval, chunked_prefill_size : int
        As :class:`~radixkv.policies.sglang_swa.SGLangSWACache` (a middle chunk's
        checkpoint leaves a state at the chunk end).

    Raises
    ------
    radixkv.errors.ConfigError
        page_size ≠ 1, an empty pool, fewer than 1 Mamba slot.
    """

    name = "sglang-mamba"
    option_name = "max_mamba_cache_size"
    default_option = 256

    def __init__(self, max_total_num_tokens: int, page_size: int = 1, max_mamba_cache_size: int = 256,
                 waiting_prefix_refresh_interval: int = 32, chunked_prefill_size: int | None = None):
        if int(page_size) != 1:
            raise ConfigError("sglang-mamba models the no_buffer strategy, which needs page_size 1 "
                              f"(got {page_size})", field="page_size")
        if int(max_total_num_tokens) < 1:
            raise ConfigError(f"max_total_num_tokens must be ≥ 1, got {max_total_num_tokens}",
                              field="max_total_num_tokens")
        if int(max_mamba_cache_size) < 1:
            raise ConfigError(f"max_mamba_cache_size must be ≥ 1, got {max_mamba_cache_size}", field="policy")
        self.max_mamba_cache_size = int(max_mamba_cache_size)
        super().__init__(UnifiedTree(1, int(max_total_num_tokens), mamba_slots=self.max_mamba_cache_size),
                         waiting_prefix_refresh_interval, chunked_prefill_size)

    @classmethod
    def parse_option(cls, text: str):
        """See :func:`parse_mamba_option`."""
        return parse_mamba_option(text)

    @classmethod
    def format_option(cls, value) -> str:
        return f"max_mamba_cache_size={value}"

    def _aux_group(self) -> dict:
        """The Mamba state pool's row of :meth:`group_metrics` (in slots)."""
        t = self.tree
        return {"group": 1, "kind": "mamba", "window": None, "capacity_slots": t.mamba_cap,
                "cached_states": t.tree_mamba, "cached_states_mean": self._mean_tree(2),
                "evicted_states": t.evicted_mamba}
