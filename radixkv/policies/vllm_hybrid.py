"""``HybridBlockHashCache``: vLLM 0.33's hybrid KV cache manager (full + sliding-window groups).

A model of ``vllm/v1/core/kv_cache_manager.py :: KVCacheManager`` with a hybrid
``KVCacheConfig`` — several KV cache groups sharing one ``BlockPool`` — as vLLM builds it
for models whose layers are not all full attention (Gemma 3, gpt-oss: one group of full
attention layers and groups of sliding-window layers, ``v1/core/kv_cache_utils.py ::
get_kv_cache_groups``). The coordinator is ``kv_cache_coordinator.py ::
HybridKVCacheCoordinator``; each group has a ``single_type_kv_cache_manager.py ::
FullAttentionManager`` or ``SlidingWindowManager``. Rules (docs/engines/vllm.md "Hybrid
models"):

- **Pool.** ``num_gpu_blocks`` block ids, block 0 the null block, one free queue shared by
  every group (``BlockPool``); a block id belongs to one group at a time. All groups use
  one ``block_size`` B (the scheduler, hash and group block sizes are equal here).
- **Keys.** A block's key is its chained block hash together with its group id
  (``kv_cache_utils.make_block_hash_with_group_id``): each group caches its own blocks
  under its own keys. A key may be held by several blocks; the first inserted that is
  still cached serves hits (``BlockHashToBlockMap.get_one_block``).
- **Lookup** (``HybridKVCacheCoordinator.find_longest_cache_hit``, capped at
  ``max(P, n) − 1`` tokens, ``KVCacheManager.get_computed_blocks``). Groups with equal
  specs are looked up together (a block index hits only if every one of them holds it).
  Full attention first: its hit is the run of cached blocks from the start
  (``FullAttentionManager.find_longest_cache_hit``). A sliding-window group of window W
  then needs only the last ``need = ceil((W − 1) / B)`` blocks before the hit point: it
  scans from the candidate end leftwards for ``need`` consecutive cached blocks and cuts
  the hit to the end of the first such run; with no such run, the run of cached blocks at
  the start of the prompt (shorter than ``need``) is the hit
  (``SlidingWindowManager.find_longest_cache_hit``). With one full and one other spec
  group one pass decides; otherwise passes repeat until no group lowers the length.
- **Admission** (``allocate_slots(full_sequence_must_fit=True)``): per group
  ``ceil(L / B) − hit_blocks`` new blocks plus the hit blocks it touches that sit in the
  free queue (``SingleTypeKVCacheManager.get_num_blocks_to_allocate``); a sliding group
  touches only the blocks inside the window, the ``(hit − W + 1) // B`` skipped ones stay
  where they are (``add_local_computed_blocks`` pads them with the null block). The
  sliding-window admission cap (``SlidingWindowSpec.max_admission_blocks_per_request``)
  is not modelled: with the manager's default ``max_in_flight_tokens = max_model_len``
  it never binds. Groups touch their hits in group order, then take new blocks from the
  free-queue head in group order (``allocate_new_computed_blocks``,
  ``allocate_new_blocks``); a taken block that has a key loses it (the eviction).
- **Steps.** Before allocating, each sliding group frees the blocks wholly before
  ``computed − W + 1`` (``SlidingWindowManager.get_num_skipped_tokens``,
  ``remove_skipped_blocks``: from the newest such block back to the first already
  freed, hashed blocks appended to the free-queue tail in that order). After allocating,
  every group caches its blocks that the computed tokens fill (``cache_blocks``; dense
  retention, vLLM's default ``prefix_cache_retention_interval = None``).
- **Release** (``KVCacheCoordinator.free``): group by group, each group's blocks tail
  first (its leading null blocks dropped), hashed blocks to the free-queue tail,
  unhashed ones to the head (``BlockPool.free_blocks``).

Mamba groups (``windows`` entry :data:`MAMBA`; ``single_type_kv_cache_manager.py ::
MambaManager`` with ``mamba_cache_mode="align"``, hash block = block size; docs/engines/vllm.md
"Mamba groups"): block ``j`` of a Mamba group holds the recurrent state after ``(j + 1)·B``
tokens. Lookup takes the right-most block index whose state is cached (one block, nulls
before it); a step takes at most one new block (its last token's state) and first frees all
earlier states; a state is keyed when a step ends on its boundary. :meth:`run_request`
splits the prefill as vLLM's scheduler does (:meth:`mamba_chunk`), so states land at
``(P − 1)//B·B`` and at the shared-prefix junction; ``admit``/``extend`` are single steps.

Exact against vLLM 0.33.0's own ``KVCacheManager`` on the goldens of
``tests/data/golden/vllm_hybrid/`` (``tools/engines/vllm_hybrid_replay.py``).

Per-group metrics (:meth:`group_metrics`): hit tokens, the tokens the full-attention
group alone held (what a full-attention model with this pool state would have hit: the
reuse the sliding groups cost), blocks held per group.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from radixkv.errors import ConfigError
import radixkv.policies._hash_kernels as K
from radixkv.policies.base import Admission, PoolStats, PrefixCache
from radixkv.trace.types import KVSeq

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def parse_option_text(text: str) -> tuple:
    """``window=W[xK][+W2…][/max_num_batched_tokens=N]`` → ``(windows, N or None)``.

    ``max_num_batched_tokens`` (vLLM's knob) turns on chunked prefill in
    :meth:`HybridBlockHashCache.run_request` and the sliding-window admission cap.

    Raises
    ------
    ConfigError
        Malformed text (see :func:`parse_groups`) or N < 1.
    """
    head, _, tail = str(text).strip().partition("/")
    mnbt = None
    if tail:
        k, _, v = tail.strip().lower().partition("=")
        if k != "max_num_batched_tokens" or not v.isdigit() or int(v) < 1:
            raise ConfigError(f"hybrid option {text!r}: expected /max_num_batched_tokens=N after the windows",
                              field="policy")
        mnbt = int(v)
    return parse_groups(head), mnbt


#: the group entry of a Mamba (linear-attention / SSM) group in ``windows``
MAMBA = "mamba"
#: the full-attention group's place in ``windows`` when it is not the first group
FULL = "full"


def parse_groups(text: str) -> tuple:
    """``window=W[xK][+W2[xK2]…]`` or ``mamba[xK]`` (or both, ``window=64+mamba``) → the
    groups after the full-attention group; a ``full`` part places the full-attention group
    among them (``mambax3+full``: vLLM numbers groups by their first layer, so Qwen3-Next's
    Mamba groups and Gemma 3's sliding ones come before the full one).

    ``window=64`` = one full-attention group and one sliding-window group of 64 tokens;
    ``window=1024x6`` = six identical sliding groups (Gemma 3 in vLLM: 10 full layers,
    52 sliding ones in 6 groups of at most 10 layers); ``window=64+160`` = two sliding
    groups with different windows; ``mambax3`` = three Mamba groups in vLLM's "align"
    cache mode (Qwen3-Next: 12 full-attention layers, 36 Gated DeltaNet layers in 3
    groups of 12).

    Returns
    -------
    tuple of int or str
        Per group in group order: its window (tokens) for a sliding group, :data:`MAMBA`
        for a Mamba group, :data:`FULL` for the full-attention group when placed.

    Raises
    ------
    ConfigError
        Malformed text, a window < 2, or more than one ``full``.
    """
    t = str(text).strip().lower()
    if t.startswith("window="):
        t = t[len("window="):]
    elif not t.startswith((MAMBA, FULL)):
        raise ConfigError(f"hybrid groups {text!r}: expected window=W[xK][+W2…] or mamba[xK]", field="policy")
    out: list = []
    for part in t.split("+"):
        w, _, k = part.partition("x")
        try:
            k = int(k or 1)
            w = w if w in (MAMBA, FULL) else int(w)
        except ValueError:
            raise ConfigError(f"hybrid groups {text!r}: {part!r} is not W, WxK, mamba or mambaxK",
                              field="policy") from None
        if (w not in (MAMBA, FULL) and w < 2) or k < 1:
            raise ConfigError(f"hybrid groups {text!r}: a window must be ≥ 2 tokens and K ≥ 1", field="policy")
        out += [w] * k
    if out.count(FULL) > 1 or out == [FULL]:
        raise ConfigError(f"hybrid groups {text!r}: one full-attention group and at least one other",
                          field="policy")
    return tuple(out)


class _Req:
    __slots__ = ("seq", "keys", "blocks", "ncached", "n_tokens", "L", "junction")

    def __init__(self, seq, keys, blocks, ncached, n_tokens, L, junction=0):
        self.junction = junction  # vLLM Request.shared_prefix_boundary
        self.seq = seq
        self.keys = keys
        self.blocks = blocks      # per group: list of block ids, 0 = null block
        self.ncached = ncached    # per group: vLLM's num_cached_block
        self.n_tokens = n_tokens  # tokens with KV (vLLM num_computed_tokens after the step)
        self.L = L


class HybridBlockHashCache(PrefixCache):
    """vLLM's hybrid KV cache manager: one full-attention group and sliding-window and/or
    Mamba (align mode) groups on one block pool.

    Parameters
    ----------
    num_gpu_blocks : int
        vLLM's ``num_gpu_blocks``: block ids shared by all groups, block 0 the null block.
    block_size : int
        Tokens per block (every group; vLLM ``--block-size``).
    windows : tuple of (int or "mamba") or str
        Per group after the full-attention one, in group order: the sliding window
        (tokens), or :data:`MAMBA` for a Mamba group; :data:`FULL` places the
        full-attention group among them (else it is group 0); or the option text of
        :func:`parse_groups` (``"window=64"``, ``"mambax3+full"``). Default: one sliding
        group of 64 tokens.
    max_num_batched_tokens : int or None
        vLLM's step budget. None (default): a prompt is prefilled in one
        ``allocate_slots`` step and nothing caps admission (the goldens without
        chunking). N: :meth:`run_request` prefills in chunks of N tokens, as vLLM's
        chunked prefill does, and the admission check caps each sliding group at
        ``ceil((W − 1 + N) / B) + 1`` blocks (``SlidingWindowSpec.max_admission_blocks_per_request``
        with ``max_in_flight_tokens = N``, one batch in flight,
        ``VllmConfig.max_in_flight_tokens``).

    Attributes
    ----------
    num_slots : int
        ``num_gpu_blocks − 1`` (a slot is one block id in any group).
    slot_tokens : int
        ``block_size``.

    Raises
    ------
    radixkv.errors.ConfigError
        ``num_gpu_blocks < 2``, ``block_size < 1``, bad windows, or a Mamba group with
        ``max_num_batched_tokens < block_size`` (vLLM's align mode could not schedule a
        block-aligned chunk).
    """

    name = "vllm-hybrid"
    size_name = "block_size"
    default_size = 16
    admission_rule = "vllm"
    engine = "vllm"
    kernel_family = None
    option_name = "windows"
    default_option = ((64,), None)
    models_duplication = False
    models_metadata = False
    models_slot_positions = False

    def __init__(self, num_gpu_blocks: int, block_size: int = 16, windows=(64,), max_num_batched_tokens=None):
        nb, B = int(num_gpu_blocks), int(block_size)
        if B < 1:
            raise ConfigError(f"block_size must be ≥ 1, got {block_size}", field="block_size")
        if nb < 2:
            raise ConfigError(f"num_gpu_blocks must be ≥ 2 (block 0 is vLLM's null block), got {num_gpu_blocks}",
                              field="num_gpu_blocks")
        if isinstance(windows, str):
            windows = parse_groups(windows)
        windows = tuple(w if w in (MAMBA, FULL) else int(w) for w in windows)
        if (not windows or windows.count(FULL) > 1 or windows == (FULL,)
                or any(w not in (MAMBA, FULL) and w < 2 for w in windows)):
            raise ConfigError(f"windows must be ≥ 2 tokens, got {windows}", field="windows")
        super().__init__(nb - 1, B)
        self.num_gpu_blocks = nb
        self.block_size = B
        self.windows = windows
        #: per group: None for full attention, the window, or MAMBA
        self.group_window = (tuple(None if w == FULL else w for w in windows) if FULL in windows
                             else (None,) + windows)
        #: the full-attention group's id
        self._full_gid = self.group_window.index(None)
        G = len(self.group_window)
        # spec groups (HybridKVCacheCoordinator.verify_and_split_kv_cache_groups): equal
        # specs share one lookup; full attention first, the others in group order
        specs: dict = {}
        for g, w in enumerate(self.group_window):
            specs.setdefault(w, []).append(g)
        self._spec_groups = sorted(((w, tuple(gs)) for w, gs in specs.items()), key=lambda t: t[0] is not None)
        self._need = {w: -(-(w - 1) // B) for w in windows if w not in (MAMBA, FULL)}
        #: per group: True for a Mamba group (align mode)
        self._mamba = tuple(w == MAMBA for w in self.group_window)
        self.has_mamba = any(self._mamba)
        #: the concurrent replay's scheduler does not clip prefill chunks to block
        #: boundaries as vLLM's does in Mamba align mode (mamba_chunk), so a Mamba model is
        #: refused there (radixkv.replay.settings.policy_from_args)
        self.sequential_only = self.has_mamba
        if max_num_batched_tokens is not None and int(max_num_batched_tokens) < 1:
            raise ConfigError(f"max_num_batched_tokens must be ≥ 1, got {max_num_batched_tokens}",
                              field="max_num_batched_tokens")
        self.max_num_batched_tokens = None if max_num_batched_tokens is None else int(max_num_batched_tokens)
        m = self.max_num_batched_tokens
        #: per group: the admission cap in blocks (None: none)
        if self.has_mamba and m is not None and m < B:
            raise ConfigError(f"max_num_batched_tokens {m} < block_size {B}: vLLM's Mamba align mode schedules "
                              f"block-aligned prefill chunks", field="max_num_batched_tokens")
        self._cap = tuple(None if (w is None or w == MAMBA or m is None) else -(-(w - 1 + m) // B) + 1
                          for w in self.group_window)
        self._ref = [0] * nb
        self._key: list = [None] * nb          # (group, hash) or None
        self._cached: dict = {}                # (group, hash) -> {block: None}, insertion order
        self._free: OrderedDict = OrderedDict((b, None) for b in range(1, nb))
        self._running: dict[int, _Req] = {}
        self._hashed = 0
        self._partial = 0
        # per-group counters (group_metrics)
        self._g_hit = [0] * G
        self._g_keyed = [0] * G      # keyed (cached-content) blocks per group, now
        self._g_keyed_sum = [0] * G  # Σ over finished requests of _g_keyed sampled then
        self._nfinish = 0
        self._full_alone = 0
        self._hit_total = 0
        self._nadmit = 0

    # ------------------------------------------------------------------ option
    @classmethod
    def parse_option(cls, text: str):
        """``window=W[xK][+W2…][/max_num_batched_tokens=N]`` → ``(windows, N or None)``
        (see :func:`parse_option_text`)."""
        return parse_option_text(text)

    @classmethod
    def class_for_option(cls, value):
        """``(windows, N)`` → this class with ``windows`` and ``max_num_batched_tokens``."""
        if value is None:
            return cls, {}
        if isinstance(value, str):
            value = parse_option_text(value)
        windows, mnbt = value if len(value) == 2 and isinstance(value[0], tuple) else (tuple(value), None)
        return cls, {"windows": windows, "max_num_batched_tokens": mnbt}

    @classmethod
    def format_option(cls, value) -> str:
        if len(value) == 2 and isinstance(value[0], tuple):
            w, m = value
            return cls.format_option(w) + ("" if m is None else f"/max_num_batched_tokens={m}")
        out, i = [], 0
        while i < len(value):
            j = i
            while j < len(value) and value[j] == value[i]:
                j += 1
            out.append(f"{value[i]}" + (f"x{j - i}" if j - i > 1 else ""))
            i = j
        return ("" if value and value[0] in (MAMBA, FULL) else "window=") + "+".join(out)

    @classmethod
    def from_capacity_tokens(cls, capacity_tokens: int, block_size: int = 16, **kw) -> "HybridBlockHashCache":
        """The pool of a full-attention model with the same layers and GPU memory.

        A model of ``G`` equal groups keeps each block id for the layers of one group
        (vLLM ``kv_cache_utils.py :: get_kv_cache_groups`` with uniform page sizes: a
        block id indexes one page in each of ``group_size`` shared tensors), so memory
        that holds ``capacity_tokens // B`` full-attention blocks holds ``G ×`` that many
        block ids: ``num_gpu_blocks = G × (capacity_tokens // B) + 1``.

        Raises
        ------
        radixkv.errors.ConfigError
            When the capacity holds no whole block.
        """
        B = int(block_size)
        if B < 1:
            raise ConfigError(f"block_size must be ≥ 1, got {block_size}", field="block_size")
        w = kw.get("windows", cls.default_option[0])
        w = parse_groups(w) if isinstance(w, str) else tuple(w)
        G = len(w) + (FULL not in w)
        usable = int(capacity_tokens) // B
        if usable < 1:
            raise ConfigError(f"capacity of {capacity_tokens} tokens holds no {B}-token block", field="capacity_tokens")
        return cls(G * usable + 1, B, **kw)

    @classmethod
    def from_engine_pool(cls, pool, size, **kw):
        """vLLM's own ``num_gpu_blocks`` (all groups' block ids, block 0 the null block)."""
        if pool.num_gpu_blocks is None:
            return None
        return cls(int(pool.num_gpu_blocks), cls.default_size if size is None else int(size), **kw)

    @classmethod
    def engine_pool_for_model(cls, model, budget_bytes: int, size, option, *, tp: int = 1,
                              kv_cache_dtype: str | None = None) -> int:
        """vLLM's ``num_gpu_blocks`` for *model*'s KV cache groups on a KV budget per rank
        (the ``--model``/``--gpu`` pool: :func:`radixkv.memory.hybrid.vllm_hybrid_num_gpu_blocks`,
        exact against vLLM 0.33's own sizing), checking that the policy's block size and
        groups are the ones vLLM gives the model.

        Parameters
        ----------
        model : ModelSpec or str
            A spec, preset name or ``config.json`` path.
        budget_bytes : int
            vLLM's ``available_kv_cache_memory`` per rank.
        size : int or None
            The policy's block size (None: 16).
        option : tuple or None
            The policy's parsed option (:meth:`parse_option`).

        Raises
        ------
        radixkv.errors.ConfigError
            When *size* is not the block size vLLM runs the model with (Mamba align mode
            raises it, ``Platform._align_hybrid_block_size``), or the option's groups are
            not the model's (the message names the policy spec to use).
        """
        from radixkv.memory import get_model
        from radixkv.memory.hybrid import (vllm_hybrid_block_size, vllm_hybrid_num_gpu_blocks,
                                           vllm_hybrid_policy_option, vllm_kv_cache_groups)

        m = get_model(model) if isinstance(model, str) else model
        B = cls.default_size if size is None else int(size)
        groups, _ = vllm_kv_cache_groups(m)
        want_B = vllm_hybrid_block_size(m, block_size=B, tp=tp, kv_cache_dtype=kv_cache_dtype)
        want = vllm_hybrid_policy_option(groups)
        windows = cls.default_option[0] if option is None else (option[0] if isinstance(option[0], tuple)
                                                                 else tuple(option))
        if len(groups) < 2 or B != want_B or parse_groups(want) != tuple(windows):
            raise ConfigError(f"{m.name}: vLLM runs this model with block_size {want_B} and KV cache groups "
                              f"in the order {want!r}; use --policy vllm-hybrid:{want_B}@{want}"
                              if len(groups) > 1 else
                              f"{m.name} has one KV cache group (full attention only): use --policy vllm:{B}",
                              field="policy")
        return vllm_hybrid_num_gpu_blocks(m, budget_bytes, block_size=B, tp=tp, kv_cache_dtype=kv_cache_dtype)

    # ------------------------------------------------------------------ pool primitives
    def _get(self, g: int, h: int) -> int:
        d = self._cached.get((g, h))
        return next(iter(d)) if d else 0

    def _touch(self, blocks) -> None:
        ref, free = self._ref, self._free
        for b in blocks:
            if b:
                if ref[b] == 0:
                    del free[b]
                ref[b] += 1

    def _take(self, n: int) -> tuple[list, int]:
        """Pop *n* blocks from the free-queue head (BlockPool.get_new_blocks); evicted count."""
        out, ev = [], 0
        free, key, cached = self._free, self._key, self._cached
        for _ in range(n):
            b, _ = free.popitem(last=False)
            k = key[b]
            if k is not None:
                d = cached[k]
                del d[b]
                if not d:
                    del cached[k]
                key[b] = None
                self._hashed -= 1
                self._g_keyed[k[0]] -= 1
                ev += 1
            self._ref[b] = 1
            out.append(b)
        return out, ev

    def _release(self, ordered) -> None:
        """BlockPool.free_blocks: *ordered* by eviction priority (first evicted first)."""
        last, first = [], []
        ref, key = self._ref, self._key
        for b in ordered:
            if not b:
                continue
            ref[b] -= 1
            if ref[b] == 0:
                (first if key[b] is None else last).append(b)
        free = self._free
        for b in reversed(first):
            free[b] = None
            free.move_to_end(b, last=False)
        for b in last:
            free[b] = None

    # ------------------------------------------------------------------ lookup
    def _find(self, keys, max_len: int):
        """HybridKVCacheCoordinator.find_longest_cache_hit: (hit tokens, per-group hit block
        lists with 0 for null, the full group's own hit in tokens, the longest hit any one
        group lookup found)."""
        B = self.block_size
        G = len(self.group_window)
        hit_len = max_len
        lists: list = [None] * G
        lens = [0] * G
        full_len = None
        longest = 0
        simple = len(self._spec_groups) == 2
        while True:
            curr = hit_len
            for w, gids in self._spec_groups:
                if w is None:
                    if full_len is not None:
                        curr = min(curr, full_len)
                        continue
                    blocks = [[] for _ in gids]
                    for j in range(min(curr // B, len(keys))):
                        got = [self._get(g, keys[j]) for g in gids]
                        if not all(got):
                            break
                        for lst, b in zip(blocks, got):
                            lst.append(b)
                    full_len = len(blocks[0]) * B
                    curr = full_len
                elif w == MAMBA:
                    blocks, curr = self._find_mamba(keys, curr, gids)
                else:
                    blocks, curr = self._find_swa(keys, curr, gids, self._need[w])
                longest = max(longest, curr)
                for g, lst in zip(gids, blocks):
                    lists[g] = lst
                    lens[g] = curr
            if curr >= hit_len:
                break
            hit_len = curr
            if simple:
                break
        nb = hit_len // B
        for gids in (self._spec_groups[0][1],):  # truncate the full group to the final length
            for g in gids:
                del lists[g][nb:]
        return hit_len, lists, full_len, longest

    def _find_mamba(self, keys, max_len: int, gids):
        """MambaManager.find_longest_cache_hit (align mode, hash block = block size): the
        last block index below *max_len* whose state every group of *gids* holds; the hit
        is one state block after null blocks."""
        B = self.block_size
        for i in range(min(max_len // B, len(keys)) - 1, -1, -1):
            got = [self._get(g, keys[i]) for g in gids]
            if all(got):
                return [[0] * i + [b] for b in got], (i + 1) * B
        return [[] for _ in gids], 0

    def _find_swa(self, keys, max_len: int, gids, need: int):
        """SlidingWindowManager.find_longest_cache_hit (no EAGLE, alignment = block)."""
        B = self.block_size
        m = min(max_len // B, len(keys))
        comp = [[0] * m for _ in gids]
        run = 0
        found = False
        for i in range(m - 1, -1, -1):
            got = [self._get(g, keys[i]) for g in gids]
            if all(got):
                for c, b in zip(comp, got):
                    c[i] = b
                run += 1
                if run >= need:
                    for c in comp:
                        del c[i + run:]
                    found = True
                    break
            else:
                run = 0
        if not found:
            for c in comp:
                del c[run:]
        return comp, len(comp[0]) * B

    def _keys(self, seq: KVSeq) -> list:
        with np.errstate(over="ignore"):  # interpreted kernels wrap as the compiled ones do
            keys, _ = K.seq_block_keys(seq.seg_id, seq.seg_end, self.block_size, seq.kv_len // self.block_size,
                                       _MASK)
        return keys.tolist()

    # ------------------------------------------------------------------ steps
    def _skip_blocks(self, g: int, computed: int) -> int:
        w = self.group_window[g]
        if w is None:
            return 0
        if w == MAMBA:  # MambaManager.get_num_skipped_tokens: all but the last token's state
            return max(0, computed - 1) // self.block_size
        return max(0, computed - w + 1) // self.block_size

    def _remove_skipped(self, r: _Req, computed: int) -> None:
        """remove_skipped_blocks for every sliding and Mamba group: a sliding group frees
        from the newest skipped block back to the first already freed; a Mamba group
        (``MambaManager._remove_blocks_in_range``, align mode) frees every state block
        before the last token's, newest first, stepping over the null gaps prefill leaves."""
        for g, w in enumerate(self.group_window):
            if w is None:
                continue
            blocks = r.blocks[g]
            n = min(self._skip_blocks(g, computed), len(blocks))
            freed = []
            mamba = w == MAMBA
            for i in range(n - 1, -1, -1):
                if blocks[i] == 0:
                    if mamba:
                        continue
                    break
                freed.append(blocks[i])
                blocks[i] = 0
            if freed:
                self._release(freed)

    def _cache(self, r: _Req, n_tokens: int) -> None:
        """cache_blocks: key every block the computed tokens fill, group by group."""
        nfull = min(n_tokens // self.block_size, len(r.keys))
        key, cached = self._key, self._cached
        for g in range(len(self.group_window)):
            blocks = r.blocks[g]
            for i in range(r.ncached[g], nfull):
                b = blocks[i]
                if b == 0 or key[b] is not None:
                    continue
                k = (g, r.keys[i])
                key[b] = k
                cached.setdefault(k, {})[b] = None
                self._hashed += 1
                self._g_keyed[g] += 1
            if nfull > r.ncached[g]:
                r.ncached[g] = nfull

    # ------------------------------------------------------------------ hooks
    def _lookup(self, seq: KVSeq, n_tokens):
        L = max(seq.prompt_len, self._admit_length((), -1, seq, n_tokens))
        keys = self._keys(seq)
        hit, lists, full_len, longest = self._find(keys, L - 1)
        # KVCacheManager.get_computed_blocks: the shared-prefix junction (a longer hit one
        # group found than all agree on), where a Mamba model's prefill stops to cache a state
        junction = longest if longest > hit else 0
        return keys, L, hit, lists, full_len, junction

    def _group_need(self, g: int, ntok: int, hit: int, lists, cap: bool) -> int:
        """Blocks group *g* takes from the free queue to admit *ntok* tokens after a hit of
        *hit* tokens (``get_num_blocks_to_allocate``): new blocks plus touched hit blocks
        that sit in the free queue. A Mamba group (align mode) takes at most one new block,
        the state block of the step's last token."""
        B = self.block_size
        req = -(-ntok // B)
        if self._mamba[g]:
            new = min(max(req - len(lists[g]), 0), 1)
            return new + sum(1 for b in lists[g] if b and self._ref[b] == 0)
        skip = self._skip_blocks(g, hit)
        if cap and self._cap[g] is not None:
            req = min(req, self._cap[g])
        new = max(req - max(skip, hit // B), 0)
        return new + sum(1 for b in lists[g][skip:] if b and self._ref[b] == 0)

    def _need_blocks(self, L: int, hit: int, lists) -> int:
        return sum(self._group_need(g, L, hit, lists, True) for g in range(len(self.group_window)))

    def mamba_chunk(self, start: int, n: int, prompt_len: int, junction: int = 0) -> int:
        """The prefill chunk vLLM's scheduler gives a request running alone in Mamba align
        mode (``Scheduler._mamba_block_aligned_split``, hash block = block size, no EAGLE,
        no prefill checkpoint blocks): of *n* tokens from *start*, a chunk that ends before
        the prompt's end is cut down to a block boundary, and a chunk stops at the last block
        boundary before the prompt's last token (``get_mamba_prefill_checkpoint_position``:
        ``(P − 1) // B × B``), at the next block boundary when it starts inside a block, and
        at the shared-prefix *junction*. Returns the chunk length (tokens)."""
        B = self.block_size
        P = prompt_len
        if start >= P:
            return n
        end = start + n
        if end < P:
            budget = self.max_num_batched_tokens or (1 << 62)
            aligned = end // B * B
            if aligned > start or B <= budget:
                end = aligned
        stops = ((start // B + 1) * B if start % B else 0, (P - 1) // B * B, junction)
        cut = [x for x in stops if start < x < end]
        if cut:
            end = min(cut)
        return max(end - start, 0)

    def peek_hit(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Hit tokens ``admit`` would get now, without side effects (``get_computed_blocks``)."""
        return self._lookup(seq, n_tokens)[2]

    def admission_slots(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Blocks ``admit`` would take out of the free queue (all groups), without side effects."""
        _, L, hit, lists, _, _ = self._lookup(seq, n_tokens)
        return self._need_blocks(L, hit, lists)

    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None, *, _chunk: int | None = None
              ) -> Admission | None:
        """Look up *seq* over all groups and allocate its first *n_tokens* tokens in each.

        Returns None (state unchanged) when the blocks all groups need for
        ``L = max(P, n_tokens)`` tokens, plus the touched hit blocks, exceed the free queue.

        Raises
        ------
        ValueError
            When *rid* is running or *n_tokens* is out of ``[1, seq.kv_len]``.
        """
        n = self._admit_length(self._running, rid, seq, n_tokens)
        keys, L, hit, lists, full_len, junction = self._lookup(seq, n_tokens)
        if self._need_blocks(L, hit, lists) > len(self._free):
            return None
        B = self.block_size
        G = len(self.group_window)
        ntok = max(n, hit) if _chunk is None else min(L, hit + _chunk)
        if self.has_mamba and _chunk is not None:
            ntok = hit + self.mamba_chunk(hit, ntok - hit, seq.prompt_len, junction)
        # the step's own check (allocate_slots without the cap): blocks up to ntok
        step = sum(self._group_need(g, ntok, hit, lists, False) for g in range(G))
        if step > len(self._free):
            return None
        r = _Req(seq, keys, [None] * G, [0] * G, ntok, L, junction)
        for g in range(G):  # touch every group's hits first (allocate_new_computed_blocks)
            skip = self._skip_blocks(g, hit)
            kept = lists[g][skip:]
            self._touch(kept)
            r.blocks[g] = [0] * skip + kept
            r.ncached[g] = len(r.blocks[g])
        ev = self._alloc(r, r.n_tokens)
        self._cache(r, r.n_tokens)
        self._running[rid] = r
        self._partial += r.n_tokens % B
        for g in range(G):  # a Mamba group's one state block serves the whole hit
            self._g_hit[g] += (hit if any(lists[g]) else 0) if self._mamba[g] else sum(1 for b in lists[g] if b) * B
        self._full_alone += full_len  # already under the last-token cap (_lookup's L − 1)
        self._hit_total += hit
        self._nadmit += 1
        held = min(full_len if full_len is not None else hit, seq.prompt_len)
        return Admission(hit_tokens=hit, held_tokens=max(held, hit), evicted_tokens=ev * B)

    def _alloc(self, r: _Req, n_tokens: int) -> int:
        need = -(-n_tokens // self.block_size)
        ev = 0
        for g in range(len(self.group_window)):
            k = need - len(r.blocks[g])
            if k > 0:
                if self._mamba[g]:  # MambaManager.allocate_new_blocks: nulls, then one state block
                    r.blocks[g].extend([0] * (k - 1))
                    k = 1
                got, e = self._take(k)
                r.blocks[g].extend(got)
                ev += e
        self.evictions += ev
        self.evicted_tokens_total += ev * self.block_size
        return ev

    def extend(self, rid: int, n_tokens: int) -> bool:
        """*rid* computes *n_tokens* more tokens: one ``allocate_slots`` step (sliding groups
        free what left the window, new blocks in every group, full blocks cached).

        Returns False when the new blocks exceed the free queue (the freeing of
        out-of-window blocks, done first as in vLLM, stays done).

        Raises
        ------
        ValueError
            When the request would pass its KV extent.
        KeyError
            When *rid* is not running.
        """
        r = self._running[rid]
        n = int(n_tokens)
        if n < 0 or r.n_tokens + n > r.seq.kv_len:
            raise ValueError(f"request {rid}: extending {r.n_tokens} tokens by {n} passes its KV extent {r.seq.kv_len}")
        if n == 0:
            return True
        self._remove_skipped(r, r.n_tokens)
        t = r.n_tokens + n
        need = -(-t // self.block_size)
        if sum(min(max(need - len(b), 0), 1) if mb else max(need - len(b), 0)
               for b, mb in zip(r.blocks, self._mamba)) > len(self._free):
            return False
        self._alloc(r, t)
        self._cache(r, t)
        B = self.block_size
        self._partial += t % B - r.n_tokens % B
        r.n_tokens = t
        return True

    def finish(self, rid: int) -> None:
        """Free *rid*'s blocks group by group, tail first (KVCacheCoordinator.free).

        Raises
        ------
        KeyError
            When *rid* is not running.
        """
        r = self._running.pop(rid)
        self._partial -= r.n_tokens % self.block_size
        for blocks in r.blocks:
            i = 0
            while i < len(blocks) and blocks[i] == 0:
                i += 1
            self._release(reversed(blocks[i:]))
        self._nfinish += 1
        for g, n in enumerate(self._g_keyed):
            self._g_keyed_sum[g] += n

    def fits_alone(self, seq: KVSeq) -> int:
        """Tokens by which *seq* overflows the empty pool (0 when it fits). Without
        chunking the admission needs ``ceil(P / B)`` blocks in every group, and at the end
        of its decode the full group holds ``ceil(kv_len / B)`` and each sliding group
        what ``remove_skipped_blocks`` left at ``kv_len − 1`` computed tokens. With
        ``max_num_batched_tokens`` a sliding group holds at most its admission cap, the
        full group ``ceil(kv_len / B)`` (an estimate of the peak: the replay reports a
        request refused alone either way)."""
        B = self.block_size
        P, kv = seq.prompt_len, seq.kv_len
        G = len(self.group_window)
        if self.max_num_batched_tokens is not None:
            need = -(-kv // B) + sum(min(-(-kv // B), 2) if self._mamba[g] else min(-(-kv // B), self._cap[g])
                                     for g in range(G) if g != self._full_gid)
        else:
            need = sum(1 if mb else -(-P // B) for mb in self._mamba)
            if kv > P:
                need = max(need, sum(-(-kv // B) - self._skip_blocks(g, kv - 1) for g in range(G)))
        return max(0, need - self.num_slots) * B

    def overflow_detail(self, seq: KVSeq) -> str:
        """Name the blocks *seq* needs over all KV cache groups against the pool's blocks.

        The pool's blocks are shared by every group (vLLM ``KVCacheCoordinator`` over one
        ``BlockPool``), so a request needs blocks in each group at once; the count is
        :meth:`fits_alone`'s. Without ``max_num_batched_tokens`` the whole prompt is
        admitted in one step, so every sliding-window group needs ``ceil(P / B)`` blocks.
        """
        B = self.block_size
        need = self.fits_alone(seq) // B + self.num_slots
        hint = ("" if self.max_num_batched_tokens is not None else
                f"; without --max-num-batched-tokens the whole prompt is prefilled in one step, so each "
                f"sliding-window group also needs a block per {B} prompt tokens (chunked prefill needs fewer)")
        return (f"{need} blocks of {B} tokens across its {len(self.group_window)} KV cache groups at once, "
                f"and the pool has {self.num_slots} blocks shared by all groups{hint}")

    def run_request(self, rid: int, seq: KVSeq) -> Admission | None:
        """Admit the prompt, decode one token per step to the KV extent, finish.

        One step per token, as vLLM's scheduler calls ``allocate_slots``: the sliding
        groups free out-of-window blocks step by step, which orders the free queue. With
        ``max_num_batched_tokens`` N the prompt is prefilled in steps of N tokens (the
        request runs alone, so every step gives it the whole budget).
        """
        m = self.max_num_batched_tokens
        a = self.admit(rid, seq, _chunk=m if m is not None or not self.has_mamba else seq.prompt_len)
        if a is None:
            return None
        r = self._running[rid]
        while r.n_tokens < seq.prompt_len:  # further prefill chunks (chunked prefill, Mamba split)
            c = seq.prompt_len - r.n_tokens if m is None else min(m, seq.prompt_len - r.n_tokens)
            if self.has_mamba:
                c = self.mamba_chunk(r.n_tokens, c, seq.prompt_len, r.junction)
            if not self.extend(rid, c):
                self.finish(rid)
                return None
        for _ in range(seq.kv_len - seq.prompt_len):
            if not self.extend(rid, 1):
                self.finish(rid)
                return None
        self.finish(rid)
        return a

    # ------------------------------------------------------------------ stats
    def stats(self, detail: bool = True) -> PoolStats:
        """Block ids of all groups: ``used`` (ref_cnt > 0), ``cached`` (in the free queue
        with a key), ``free``. ``valid_tokens`` = B × keyed blocks + the partial blocks of
        running requests (one per group). ``cached_tokens`` = B × distinct keys of the
        full-attention group (an upper bound on what a lookup could hit: a sliding group
        may lack the blocks before a hit point)."""
        used = sum(1 for b in range(1, self.num_gpu_blocks) if self._ref[b] > 0)
        cached = sum(1 for b in self._free if self._key[b] is not None)
        B = self.block_size
        G = len(self.group_window)
        full_keys = sum(1 for (g, _h) in self._cached if g == self._full_gid) if detail else -1
        return PoolStats(num_slots=self.num_slots, slot_tokens=B, used_slots=used, cached_slots=cached,
                         free_slots=self.num_slots - used - cached, valid_tokens=self._hashed * B + G * self._partial,
                         cached_tokens=full_keys * B if detail else -1)

    def group_metrics(self) -> dict:
        """Per KV cache group since construction (JSON-ready).

        ``groups``: per group its kind (``full_attention`` / ``sliding_attention`` /
        ``mamba``), window, ``hit_tokens`` (B × the non-null hit blocks it served: a sliding
        group serves only the blocks inside its window; a Mamba group's one state block
        serves the whole hit, so its hit tokens are the request's hit), ``held_blocks`` (referenced by running requests) and
        ``cached_blocks`` (keyed, unreferenced) now, and ``keyed_blocks_mean`` — the
        memory each group's cached content takes, in block ids, averaged over the moments
        after each request finished.
        ``hit_tokens`` (the hybrid's hit), ``full_attention_hit_tokens`` (what the full
        group alone held, capped as vLLM caps a hit: the hit a full-attention model would
        have had on this pool state) and ``hybrid_loss_tokens`` (their difference).
        """
        G = len(self.group_window)
        held = [0] * G
        cached = [0] * G
        for b in range(1, self.num_gpu_blocks):
            k = self._key[b]
            if k is not None and self._ref[b] == 0:
                cached[k[0]] += 1
        for r in self._running.values():
            for g, blocks in enumerate(r.blocks):
                held[g] += sum(1 for b in blocks if b)
        kinds = {None: "full_attention", MAMBA: "mamba"}
        groups = [{"group": g, "kind": kinds.get(w, "sliding_attention"), "window": None if w == MAMBA else w,
                   "hit_tokens": self._g_hit[g], "held_blocks": held[g], "cached_blocks": cached[g],
                   "keyed_blocks_mean": self._g_keyed_sum[g] / self._nfinish if self._nfinish else None}
                  for g, w in enumerate(self.group_window)]
        return {"groups": groups, "hit_tokens": self._hit_total, "full_attention_hit_tokens": self._full_alone,
                "hybrid_loss_tokens": self._full_alone - self._hit_total, "admissions": self._nadmit}

    # ------------------------------------------------------------------ inspection
    def free_queue(self) -> np.ndarray:
        """Block ids in the free queue, head first (int64)."""
        return np.fromiter(self._free, dtype=np.int64, count=len(self._free))

    def block_table(self, rid: int, group: int = 0) -> np.ndarray:
        """Block ids of running *rid* in *group* (0 = the null block), in order."""
        return np.asarray(self._running[rid].blocks[group], dtype=np.int64)
