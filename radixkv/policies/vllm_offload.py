"""``OffloadBlockHashCache``: vLLM's prefix cache with CPU KV offloading behind it.

vLLM 0.33 offloads KV to CPU memory with ``--kv-offloading-size GiB`` (``CacheConfig.
kv_offloading_size``; ``VllmConfig._post_init_kv_transfer_config`` installs the
``OffloadingConnector`` with ``cpu_bytes_to_use`` = GiB × 2³⁰; its knobs go in
``--kv-transfer-config``'s ``kv_connector_extra_config``). The GPU pool is vLLM's
block-hash prefix cache exactly as :class:`~radixkv.policies.block_hash.BlockHashCache`
models it: a CPU hit is loaded into freshly allocated GPU blocks that are then cached
under the same block hashes a recompute would give, in the same allocation order, so the
GPU pool evolves exactly as without offloading. What the tier adds is how many prompt
tokens are loaded instead of recomputed, and the CPU pool's own state
(:class:`~radixkv.policies.offload_cpu.CPUOffloadStore`). Goldens: the real scheduler,
connector and CPU manager driven on CPU (``tools/engines/vllm_offload_golden.py``,
docs/hicache.md). Rules (vLLM source, ``vllm/distributed/kv_transfer/kv_connector/v1/
offloading/scheduler.py :: OffloadingConnectorScheduler`` unless named):

- **Chunks and keys** (``offloading/config.py :: build_offloading_config``;
  ``RequestOffloadState.update_offload_keys``): an offload chunk is ``blocks_per_chunk``
  GPU blocks (``kv_connector_extra_config`` ``blocks_per_chunk``, or ``block_size`` in
  tokens; default 1); chunk c's key is the block hash of its last block. Only whole chunks
  of known tokens have keys.
- **Pool size** (``vllm/v1/kv_offload/cpu/spec.py :: CPUOffloadingSpec.__init__``):
  ``num_chunks = cpu_bytes_to_use // round_up(chunk bytes, page size 4096)``, chunk
  bytes = the KV bytes of ``blocks_per_chunk`` blocks on all workers.
- **Lookup** (``_lookup_complete_chunks``, ``_maximal_prefix_lookup``; called through
  ``get_num_new_matched_tokens`` from ``Scheduler.schedule`` with the GPU hit G, a
  multiple of the block size): from chunk ``G // T`` (T tokens per chunk) count the
  consecutive chunks present and stored; the hit ends at ``min(P // T, G // T + n) × T``
  and the CPU hit is that minus G — zero when under one chunk (T tokens). It may reach
  the whole prompt: the scheduler then recomputes the last prompt token
  (``Scheduler._update_waiting_for_remote_kv``), so the request computes from
  ``G + CPU hit`` tokens, one less when that is P.
- **Load** (``update_state_after_alloc``; ``cpu/manager.py :: prepare_load``,
  ``complete_load``): the chunks from ``(G // B) // blocks_per_chunk`` to the end of the
  hit are pinned, recorded as reused, and unpinned when the load completes (before the
  request's prefill); chunks up to the hit's end are not offered for storing
  (``OffloadPolicy.CHUNK_LEVEL``). Without a CPU hit every chunk is offered, GPU hits
  included.
- **Store** (``_build_store_jobs``, ``_calc_num_offloadable_tokens``;
  ``CPUOffloadingManager.prepare_store``): at every step that schedules the request, and
  once more at the step after it finishes, the whole chunks computed so far beyond those
  already offered are offered — prompt chunks only with ``offload_prompt_only`` (vLLM's
  default, ``OffloadingSpec.__init__``). A failed store (not enough idle chunks) is
  offered again at the next step. The CPU store's rules: :mod:`.offload_cpu`.
- **Request end** (``_build_connector_meta`` → ``on_request_finished``): after that
  step's stores, the request's keys go to the cache policy in prefix order.

Timing (the goldens' stand-in worker): a load completes in the step that issued it, a
store one step later (``OffloadingConnector.wait_for_save`` defers it to the next
step). In the sequential replay requests run one at a time.

**Concurrent replay** (:class:`radixkv.replay.sched_vllm_offload.VllmOffloadScheduler`
drives the connector; :meth:`OffloadBlockHashCache.start_concurrent` switches the hooks):
``admit``/``extend``/``finish``/``preempt`` then change the GPU pool only, and the
scheduler calls the connector's steps in vLLM's order — :meth:`cpu_lookup` for every
waiting request it considers (``get_num_new_matched_tokens``; None when a chunk of the
hit is still being stored, ``LookupResult.HIT_PENDING``, or being loaded by another
request, ``_chunks_being_loaded``: vLLM skips the request for the step),
:meth:`admit_load` for a CPU hit (blocks allocated, not cached, ``delay_cache_blocks``;
the load pinned), :meth:`promote` when the load has finished
(``Scheduler._update_waiting_for_remote_kv`` → ``cache_blocks``), :meth:`connector_step`
at the end of each step's scheduling (``build_connector_meta``: the store offers of the
scheduled requests in batch order, then of the requests finished in the previous step,
then their ``on_request_finished``), and :meth:`end_step` when the step's output comes
back (stores of the previous step complete, ``complete_store``). A preempted request
keeps its connector state (``req_context``, LRU rank) and offers every chunk again
after its next lookup (``next_stored_chunk_idx = 0``).
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import ConfigError
import radixkv.policies._hash_kernels as K
from radixkv.policies.base import Admission
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.host_tier import HostTierOptions, zero_host_totals
from radixkv.policies.offload_cpu import CPU_EVICTION_POLICIES, MAX_TRACKER_SIZE, ArrayLRUStore, CPUOffloadStore
from radixkv.trace.types import KVSeq

#: ``cpu/shared_offload_region.py :: SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT`` (``mmap.PAGESIZE``)
CHUNK_ALIGNMENT = 4096
#: option keys and their parsers (``kv_connector_extra_config`` names where vLLM has one)
_OPTIONS = {
    "host_tokens": int, "cpu_bytes": int, "kv_bytes_per_token": int, "blocks_per_chunk": int,
    "eviction_policy": str, "store_threshold": int, "offload_prompt_only": None,
}


def num_cpu_chunks(cpu_bytes: int, kv_bytes_per_token: int, block_size: int, blocks_per_chunk: int) -> int:
    """Chunks vLLM's CPU pool holds: ``CPUOffloadingSpec.__init__``'s
    ``cpu_bytes_to_use // round_up(kv_bytes_per_chunk, 4096)``.

    Parameters
    ----------
    cpu_bytes : int
        ``cpu_bytes_to_use`` (``--kv-offloading-size`` GiB × 2³⁰), bytes.
    kv_bytes_per_token : int
        KV bytes of one token over all layers and all TP ranks, bytes.
    block_size, blocks_per_chunk : int
        GPU block size (tokens) and blocks per offload chunk.
    """
    per_chunk = int(kv_bytes_per_token) * int(block_size) * int(blocks_per_chunk)
    aligned = -(-per_chunk // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
    return int(cpu_bytes) // aligned if aligned else 0


class _Off:
    """The connector's per-request state (``RequestOffloadState``)."""

    __slots__ = ("req", "keys", "P", "T", "next", "pending", "loads", "kv")

    def __init__(self, req, keys, P, kv=0):
        self.kv = kv  # the KV extent (tokens)
        self.req = req
        self.keys = keys  # chunk keys over the KV extent (Python ints)
        self.P = P
        self.T = 0  # tokens computed
        self.next = 0  # RequestGroupState.next_stored_chunk_idx
        self.pending = ()  # handle of the store in flight (completes at the next step)
        self.loads: list = []


class OffloadBlockHashCache(HostTierOptions, BlockHashCache):
    """vLLM block-hash prefix cache + CPU KV offloading (``--kv-offloading-size``).

    Parameters
    ----------
    num_gpu_blocks : int
        vLLM's ``num_gpu_blocks`` (block 0 is the null block).
    block_size : int
        GPU ``--block-size`` in tokens.
    host_tokens : int or None
        CPU pool in tokens: ``host_tokens // (block_size × blocks_per_chunk)`` chunks.
        0 or None without *cpu_bytes*: no CPU tier (equals ``vllm`` exactly).
    cpu_bytes : int or None
        vLLM's ``cpu_bytes_to_use`` (``--kv-offloading-size`` GiB × 2³⁰); needs
        *kv_bytes_per_token*; wins over *host_tokens*.
    kv_bytes_per_token : int or None
        The model's KV bytes per token over all TP ranks (``radixkv memory``).
    blocks_per_chunk : int
        GPU blocks per offload chunk (``kv_connector_extra_config`` ``blocks_per_chunk``;
        default 1).
    eviction_policy : str
        CPU pool policy, ``lru`` (default) or ``arc``.
    store_threshold : int
        Offers a chunk needs before it is stored (< 2: none; vLLM default 0).
    offload_prompt_only : bool
        Store prompt chunks only (vLLM's default True).
    verify : bool
        As :class:`BlockHashCache`.
    cpu_store : {None, 'array', 'dict'}
        The CPU store's implementation: ``array`` (:class:`~radixkv.policies.offload_cpu.ArrayLRUStore`,
        compiled; ``lru`` without ``store_threshold`` only) or ``dict``
        (:class:`~radixkv.policies.offload_cpu.CPUOffloadStore`); None (default): array when
        it applies. Same results.

    Attributes
    ----------
    host_capacity : int
        CPU pool in tokens (chunks × tokens per chunk; 0 without a tier).
    device_hit_tokens_total, host_hit_tokens_total, loaded_tokens_total,
    written_tokens_total, host_evicted_tokens_total : int
        Tokens hit on the GPU, hit on CPU (= loaded), loaded CPU→GPU, stored GPU→CPU and
        evicted from CPU, since construction (the summary's host-tier fields,
        :func:`radixkv.policies.host_tier.host_tier_summary`).
    last_gpu_hit, last_cpu_hit : int
        Tokens of the last admission's GPU hit and CPU hit.

    Raises
    ------
    radixkv.errors.ConfigError
        On a bad size or option.
    """

    name = "vllm-offload"
    aliases = ("vllm-cpu-offload",)
    option_name = "offload"
    bare_option = "eviction_policy"
    default_option = None
    models_host_tier = True
    #: host-tier flags this class takes (:mod:`radixkv.cli.host_tier_args`)
    host_tier_flags = ("host_cache_tokens", "kv_offloading_size")
    sequential_only = False
    #: CPU hits are loaded asynchronously (WAITING_FOR_REMOTE_KVS): the concurrent replay
    #: runs :class:`radixkv.replay.sched_vllm_offload.VllmOffloadScheduler`
    async_host_loads = True
    kernel_family = "hash"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16, *, host_tokens: int | None = None,
                 cpu_bytes: int | None = None, kv_bytes_per_token: int | None = None, blocks_per_chunk: int = 1,
                 eviction_policy: str = "lru", store_threshold: int = 0, offload_prompt_only: bool = True,
                 max_tracker_size: int = MAX_TRACKER_SIZE, verify: bool = False, cpu_store: str | None = None):
        super().__init__(num_gpu_blocks, block_size, verify=verify)
        bpc = int(blocks_per_chunk)
        if bpc < 1:
            raise ConfigError(f"blocks_per_chunk must be ≥ 1, got {blocks_per_chunk}", field="blocks_per_chunk")
        if eviction_policy not in CPU_EVICTION_POLICIES:
            raise ConfigError(f"unknown eviction_policy {eviction_policy!r}; known: {', '.join(CPU_EVICTION_POLICIES)}",
                              field="eviction_policy")
        self.blocks_per_chunk = bpc
        self.chunk_tokens = bpc * self.block_size
        if cpu_bytes is not None:
            if kv_bytes_per_token is None or int(kv_bytes_per_token) < 1:
                raise ConfigError("cpu_bytes (--kv-offloading-size) needs the model's KV bytes per token",
                                  field="kv_offloading_size")
            if int(cpu_bytes) < 0:
                raise ConfigError(f"cpu_bytes must be ≥ 0, got {cpu_bytes}", field="kv_offloading_size")
            chunks = num_cpu_chunks(cpu_bytes, kv_bytes_per_token, self.block_size, bpc)
        else:
            if host_tokens is not None and int(host_tokens) < 0:
                raise ConfigError(f"host_tokens must be ≥ 0, got {host_tokens}", field="host_tokens")
            chunks = int(host_tokens or 0) // self.chunk_tokens
        self.eviction_policy = eviction_policy
        self.store_threshold = int(store_threshold)
        self.offload_prompt_only = bool(offload_prompt_only)
        if not chunks:
            self.cpu = None
        elif cpu_store == "array" or (cpu_store is None and eviction_policy == "lru" and self.store_threshold < 2):
            if eviction_policy != "lru" or self.store_threshold >= 2:
                raise ConfigError("the array CPU store models the lru policy without store_threshold",
                                  field="cpu_store")
            self.cpu = ArrayLRUStore(chunks)
        else:
            self.cpu = CPUOffloadStore(chunks, eviction_policy, store_threshold, max_tracker_size)
        self.host_capacity = chunks * self.chunk_tokens
        self._off: dict[int, _Off] = {}
        self._conc = False
        zero_host_totals(self)
        self.last_gpu_hit = 0
        self.last_cpu_hit = 0

    # ------------------------------------------------------------------ options
    @classmethod
    def parse_option(cls, text: str) -> tuple:
        """``KEY=VALUE[,KEY=VALUE…]`` with keys
        ``host_tokens``, ``blocks_per_chunk``, ``eviction_policy`` (or a bare ``lru`` /
        ``arc``), ``store_threshold``, ``offload_prompt_only`` (true/false),
        ``cpu_bytes`` + ``kv_bytes_per_token`` (grammar:
        :class:`~radixkv.policies.host_tier.HostTierOptions`). E.g.
        ``vllm-offload:16@host_tokens=400000,arc``. Returns sorted pairs."""
        out: dict = {}
        for k, v in cls.option_pairs(text):
            if k not in _OPTIONS:
                raise ConfigError(f"policy {cls.name!r}: unknown option {k!r}; known: {', '.join(_OPTIONS)}",
                                  field="policy")
            if k == "eviction_policy":
                out[k] = cls.option_choice(v, CPU_EVICTION_POLICIES, "eviction policy")
            elif k == "offload_prompt_only":
                if v.lower() not in ("true", "false", "1", "0"):
                    raise ConfigError(f"policy {cls.name!r}: offload_prompt_only={v!r} is not true/false",
                                      field="policy")
                out[k] = v.lower() in ("true", "1")
            else:
                out[k] = cls.option_number(k, v, int, "an integer")
        return tuple(sorted(out.items()))

    # ------------------------------------------------------------------ chunk keys
    def _chunk_keys(self, seq: KVSeq):
        """Key of every whole chunk of *seq*'s KV extent: the chained key of the chunk's
        last block (``update_offload_keys``: every ``hashes_per_chunk``-th block hash). An
        int64 array for the array store, else a list of ints."""
        bpc = self.blocks_per_chunk
        nblk = seq.kv_len // self.block_size
        arr = self.cpu is not None and self.cpu.keys_array
        if nblk == 0:
            return np.zeros(0, dtype=np.int64) if arr else []
        keys, _ = K.seq_block_keys(seq.seg_id, seq.seg_end, self.block_size, nblk, self._key_mask)
        keys = keys[bpc - 1:: bpc]
        return np.ascontiguousarray(keys).view(np.int64) if arr else keys.tolist()

    # ------------------------------------------------------------------ connector steps
    def _cpu_hit(self, keys, P: int, gpu: int) -> int:
        """CPU hit tokens beyond the GPU hit *gpu* (``_lookup_complete_chunks`` /
        ``_maximal_prefix_lookup``), without side effects."""
        T = self.chunk_tokens
        n_keys = min(P // T, len(keys))  # chunks of the prompt (num_tokens = P at admission)
        max_hit = n_keys * T
        if self.cpu is None or max_hit - gpu < T:
            return 0
        start = gpu // T
        n, _ = self.cpu.run_length(keys, start, n_keys, True)
        ext = min(max_hit, T * (start + n)) - gpu
        return 0 if n == 0 or ext < T else ext

    def _lookup_load(self, o: _Off, gpu: int) -> int:
        """The CPU hit (:meth:`_cpu_hit`) and the load of its chunks
        (``update_state_after_alloc`` → ``prepare_load``; ``complete_load``)."""
        ext = self._cpu_hit(o.keys, o.P, gpu)
        if ext == 0:
            return 0
        T = self.chunk_tokens
        end = gpu + ext
        first = (gpu // self.block_size) // self.blocks_per_chunk
        self.cpu.load_range(o.req, first, end // T)
        self.cpu.unload_range(o.req, first, end // T)  # the load finishes before the request's prefill step
        o.next = end // T  # OffloadPolicy.CHUNK_LEVEL: the hit chunks are not offered again
        return ext

    def _store_point(self, o: _Off, T_after: int) -> None:
        """One ``_build_store_jobs`` visit: offer the new whole chunks computed by
        *T_after* tokens; then the previous step's store completes."""
        off = min(T_after, o.P) if self.offload_prompt_only else T_after
        n = min(off // self.chunk_tokens, len(o.keys))
        done, o.pending = o.pending, ()
        if n > o.next:
            got = self.cpu.store_range(o.req, o.next, n)
            if got is not None:
                stored, n_st, n_ev = got
                o.next = n
                o.pending = stored
                self.written_tokens_total += n_st * self.chunk_tokens
                self.host_evicted_tokens_total += n_ev * self.chunk_tokens
        self.cpu.complete(done)

    # ------------------------------------------------------------------ hooks
    def admit(self, rid: int, seq: KVSeq, n_tokens: int | None = None) -> Admission | None:
        """The GPU and CPU lookups (both side-effect free), the GPU admission of at least
        the hit tokens (:meth:`BlockHashCache.admit`; a CPU hit takes fresh GPU blocks,
        ``Scheduler.schedule`` → ``allocate_slots(num_external_computed_tokens=…)``), then
        the load and the store visit of the first step. ``hit_tokens`` counts GPU + CPU
        hit tokens, less the last prompt token when they cover the whole prompt (it is
        recomputed). None (nothing changed) when the GPU pool refuses."""
        if self._conc:
            return self._conc_admit(rid, seq, n_tokens)
        n = seq.prompt_len if n_tokens is None else int(n_tokens)
        if self.cpu is not None:
            gpu, _, _ = self._lookup(seq, n_tokens)
            ext = self._cpu_hit(self._chunk_keys(seq), seq.prompt_len, gpu * self.block_size)
            n = max(n, gpu * self.block_size + ext - (1 if gpu * self.block_size + ext == seq.prompt_len else 0))
        adm = super().admit(rid, seq, n)
        if adm is None:
            return None
        return self._after_admit(rid, seq, adm, max(n, adm.hit_tokens))

    def peek_hit(self, seq: KVSeq, n_tokens: int | None = None) -> int:
        """Hit tokens :meth:`admit` would report now (GPU + CPU, the last prompt token
        off a whole-prompt hit), without side effects. In the concurrent mode the GPU hit
        only (the scheduler asks the connector itself, :meth:`cpu_lookup`)."""
        gpu = super().peek_hit(seq, n_tokens)
        if self.cpu is None or self._conc:  # concurrent: the GPU lookup (get_computed_blocks)
            return gpu
        ext = self._cpu_hit(self._chunk_keys(seq), seq.prompt_len, gpu)
        return gpu + ext - (1 if gpu + ext == seq.prompt_len else 0)

    def _after_admit(self, rid, seq, adm, n_first):
        gpu = adm.hit_tokens
        self.device_hit_tokens_total += gpu
        self.last_gpu_hit, self.last_cpu_hit = gpu, 0
        if self.cpu is None:
            return adm
        P = seq.prompt_len
        keys = self._chunk_keys(seq)
        o = _Off(self.cpu.new_request(keys, self.chunk_tokens), keys, P)
        self._off[rid] = o
        ext = self._lookup_load(o, gpu)
        self.last_cpu_hit = ext
        self.host_hit_tokens_total += ext
        self.loaded_tokens_total += ext
        o.T = max(n_first, gpu + ext)
        self._store_point(o, o.T)
        hit = gpu + ext - (1 if gpu + ext == P else 0)
        return Admission(hit_tokens=hit, held_tokens=max(adm.held_tokens, hit), evicted_tokens=adm.evicted_tokens)

    def extend(self, rid: int, n_tokens: int) -> bool:
        """GPU extend, then one store visit per step: tokens up to the prompt are one
        (prefill) step, each token past it one decode step."""
        if not super().extend(rid, n_tokens):
            return False
        o = self._off.get(rid)
        if o is not None and not self._conc:
            self._steps(o, int(n_tokens))
        return True

    def _offerable(self, o: _Off, T_after: int) -> int:
        """Whole chunks a visit after *T_after* computed tokens may offer
        (``_calc_num_offloadable_tokens`` → ``storable_chunks``)."""
        off = min(T_after, o.P) if self.offload_prompt_only else T_after
        return min(off // self.chunk_tokens, len(o.keys))

    def _steps(self, o: _Off, n: int) -> None:
        """Store visits of *n* more computed tokens: up to the prompt one (prefill)
        step, then one step per token. Runs of visits that cannot change anything (no
        store in flight, no new chunk, no offer counter to bump) are skipped; a skipped
        visit that would re-offer a failed store still counts as a failed store."""
        if n <= 0:
            return
        if o.T < o.P:
            k = min(n, o.P - o.T)
            o.T += k
            n -= k
            self._store_point(o, o.T)
        T = self.chunk_tokens
        while n > 0:
            cap = self._offerable(o, o.T)
            stalled = o.next < cap
            if not len(o.pending) and (not stalled or not self._retry_matters()):
                if self.offload_prompt_only or cap == len(o.keys):
                    quiet = n
                else:
                    quiet = min(n, (cap + 1) * T - 1 - o.T)
                if quiet > 0:
                    if stalled:
                        self.cpu.failed_stores += quiet
                    o.T += quiet
                    n -= quiet
                    continue
            o.T += 1
            n -= 1
            self._store_point(o, o.T)

    def _retry_matters(self) -> bool:
        """A failed store offered again changes state only through the offer counter."""
        return self.cpu.counts is not None

    def finish(self, rid: int) -> None:
        """GPU release; the finish step's store visit (up to the KV extent, or the prompt),
        ``on_request_finished``, and the last stores complete."""
        if self._conc:
            BlockHashCache.finish(self, rid)
            if rid in self._off:
                self._fin.append(rid)
            return
        o = self._off.pop(rid, None)
        super().finish(rid)
        if o is None:
            return
        self._store_point(o, o.T)
        self.cpu.request_finished(o.req)
        self.cpu.complete(o.pending)
        o.pending = ()

    def preempt(self, rid: int) -> None:
        """GPU preemption; the request's CPU stores in flight complete (vLLM flushes them,
        ``_build_connector_meta``) and its connector state is dropped, so a re-admission
        looks up and offers every chunk again (``get_num_new_matched_tokens`` resets
        ``next_stored_chunk_idx``). Not covered by the goldens (sequential replay only)."""
        if self._conc:
            BlockHashCache.finish(self, rid)  # its connector state stays (req_context, LRU rank)
            return
        o = self._off.pop(rid, None)
        super().preempt(rid)
        if o is not None:
            self.cpu.complete(o.pending)

    def run_request(self, rid: int, seq: KVSeq) -> Admission | None:
        """Admit, decode to the KV extent, finish (the GPU side in one kernel call)."""
        if self.cpu is None:
            adm = super().run_request(rid, seq)
            if adm is not None:
                self.device_hit_tokens_total += adm.hit_tokens
                self.last_gpu_hit, self.last_cpu_hit = adm.hit_tokens, 0
            return adm
        adm = BlockHashCache.run_request(self, rid, seq)
        if adm is None:
            return None
        out = self._after_admit(rid, seq, adm, seq.prompt_len)
        o = self._off[rid]
        self._steps(o, seq.kv_len - seq.prompt_len)
        self._off.pop(rid)
        self._store_point(o, o.T)
        self.cpu.request_finished(o.req)
        self.cpu.complete(o.pending)
        return out

    def replay_span(self, trace, i0, i1, cols, detail=None):
        """No in-kernel loop with a CPU tier (the per-request Python path runs)."""
        if self.cpu is None:
            return super().replay_span(trace, i0, i1, cols, detail)
        return i0, 1

    # ------------------------------------------------------------------ concurrent replay
    def start_concurrent(self) -> None:
        """Let the concurrent scheduler drive the connector (module docstring): from now on
        the hooks change the GPU pool only. Call on a fresh policy.

        Raises
        ------
        RuntimeError
            When requests were already replayed.
        """
        if self._running or self._off:
            raise RuntimeError("start_concurrent needs a fresh policy")
        self._conc = True
        self._fin: list = []  # finished rows whose finish visit is due (finished_req_ids)
        self._loading: dict = {}  # row -> (chunk keys being loaded, first uncached block, end block)
        self._being_loaded: dict = {}  # key -> loads in flight (_chunks_being_loaded)
        self._stores_now: list = []  # keys whose store was issued in this step
        self._stores_prev: list = []  # ... in the previous step (complete at this step's end)

    def _conn(self, rid: int, seq: KVSeq, n_tok: int) -> _Off:
        """The row's connector state, made at its first lookup (``on_new_request``) and kept
        over preemptions; the keys are those of the whole KV extent."""
        o = self._off.get(rid)
        if o is None:
            keys = self._chunk_keys(seq)
            o = _Off(self.cpu.new_request(keys, self.chunk_tokens), keys, seq.prompt_len, seq.kv_len)
            self._off[rid] = o
        return o

    def cpu_lookup(self, rid: int, seq: KVSeq, n_tok: int, gpu: int):
        """The connector's hit beyond the GPU hit *gpu* (tokens) for a request whose
        known tokens are the first *n_tok* of *seq* (``get_num_new_matched_tokens``).

        Resets the row's store progress (``next_stored_chunk_idx = 0``). Returns the CPU
        hit in tokens (0: none, or no CPU tier), or None when vLLM defers the request:
        a chunk of the consecutive hit is resident but its store is still in flight
        (``CPUOffloadingManager.lookup`` → ``HIT_PENDING``, ``_maximal_prefix_lookup``),
        or a chunk of the hit is being loaded by another request
        (``_lookup_complete_chunks``: ``_chunks_being_loaded``).
        """
        if self.cpu is None:
            return 0
        o = self._conn(rid, seq, n_tok)
        o.next = 0
        T = self.chunk_tokens
        keys = o.keys
        n_keys = min(n_tok // T, len(keys))
        max_hit = n_keys * T
        if max_hit - gpu < T:
            return 0
        start = gpu // T
        n, pending = self.cpu.run_length(keys, start, n_keys, False)
        if n == 0:
            return 0
        if pending:
            return None
        ext = min(max_hit, T * (start + n)) - gpu
        if ext < T:
            return 0
        if self._being_loaded:
            bl = self._being_loaded
            for key in keys[start: -(-(gpu + ext) // T)]:
                if int(key) in bl:
                    return None
        return ext

    def load_admission_blocks(self, seq: KVSeq, n_tok: int, gpu: int, ext: int):
        """Blocks an async-load admission needs, without side effects:
        ``(full, now)`` — new blocks for the whole known sequence plus touched hit blocks
        (``allocate_slots(full_sequence_must_fit=True)``), and new blocks for the hit and
        the loaded tokens plus touched hit blocks (the allocation itself)."""
        h, tbl, L = self._lookup(seq, n_tok)
        touch = int(np.count_nonzero(self._b32[tbl[:h], K.R_REF] == 0)) if h else 0
        B = self.block_size
        return -(-L // B) - h + touch, -(-(gpu + ext) // B) - h + touch

    def admit_load(self, rid: int, seq: KVSeq, n_tok: int, ext: int) -> Admission:
        """Admit *rid* with a CPU hit of *ext* tokens loaded asynchronously: touch the GPU
        hit, allocate blocks for the loaded tokens without caching them
        (``allocate_slots(num_new_tokens=0, num_external_computed_tokens=ext,
        delay_cache_blocks=True)``), pin and record the load (``update_state_after_alloc``
        → ``prepare_load``; ``OffloadPolicy.CHUNK_LEVEL``: the hit chunks are not offered).
        The caller has checked the room (:meth:`load_admission_blocks`).

        Returns
        -------
        Admission
            ``hit_tokens`` = GPU hit + *ext*, one less when that is every known token;
            ``host_loaded_tokens`` = *ext*.
        """
        B = self.block_size
        keys = self._keys(seq)
        tbl = self._table(seq, True)
        code, hcap, held, ev, nblk = K.py_admit(
            self._blk, self._b32, self._kt, self._k32, self._pcid, self._pcs, self._st, self._stk, keys,
            seq.seg_id, seq.seg_end, B, seq.prompt_len, n_tok, 0, self.verify, tbl, K.FREE_QUEUE)
        if code == K.COLLISION:
            self._collision(seq)
        if code != K.OK:
            raise RuntimeError(f"request {rid}: the checked load admission was refused")
        gpu = int(hcap) * B
        end = gpu + int(ext)
        n_new = -(-end // B) - int(hcap)
        ev = int(ev) + int(K.py_take_new(self._blk, self._b32, self._kt, self._k32, self._st, self._stk, tbl,
                                          int(hcap), n_new, K.FREE_QUEUE))
        from radixkv.policies.block_hash import _Running

        self._running[rid] = _Running(seq, keys, tbl, int(hcap) + n_new, end)
        self._partial += end % B
        self.evictions += ev
        self.evicted_tokens_total += ev * B
        o = self._off[rid]
        T = self.chunk_tokens
        lo, hi = (gpu // B) // self.blocks_per_chunk, end // T
        self.cpu.load_range(o.req, lo, hi)
        for k in o.keys[lo:hi]:
            k = int(k)
            self._being_loaded[k] = self._being_loaded.get(k, 0) + 1
        self._loading[rid] = ((lo, hi), int(hcap), end // B)
        o.next = -(-end // T)
        o.T = end
        self.device_hit_tokens_total += gpu
        self.host_hit_tokens_total += int(ext)
        self.loaded_tokens_total += int(ext)
        self.last_gpu_hit, self.last_cpu_hit = gpu, int(ext)
        hit = end - (1 if end == n_tok else 0)
        return Admission(hit_tokens=hit, held_tokens=max(int(min(held, seq.prompt_len)), min(hit, seq.prompt_len)),
                         evicted_tokens=ev * B, host_loaded_tokens=int(ext))

    def load_done(self, rid: int) -> None:
        """The load of *rid* finished (the worker's ``completed_jobs`` → ``complete_load``:
        its chunks are unpinned and no longer being loaded)."""
        lo, hi = self._loading[rid][0]
        o = self._off[rid]
        self.cpu.unload_range(o.req, lo, hi)
        bl = self._being_loaded
        for k in o.keys[lo:hi]:
            k = int(k)
            c = bl[k] - 1
            if c:
                bl[k] = c
            else:
                del bl[k]

    def promote(self, rid: int) -> None:
        """Cache the loaded blocks of *rid* (``_update_waiting_for_remote_kv`` →
        ``KVCacheManager.cache_blocks``): they become GPU hits for later lookups."""
        _, lo, hi = self._loading.pop(rid)
        r = self._running[rid]
        K.py_cache_full(self._blk, self._b32, self._kt, self._k32, self._pcid, self._pcs, self._st, self._stk,
                        r.tbl, r.keys, lo, hi, r.seq.seg_id, r.seq.seg_end, self.block_size, K.FREE_QUEUE)

    def held_blocks(self, rid: int) -> int:
        """GPU blocks *rid* holds (0 when it holds none)."""
        r = self._running.get(rid)
        return 0 if r is None else int(r.n_blocks)

    def _conc_admit(self, rid: int, seq: KVSeq, n_tokens):
        """A GPU-only admission (the scheduler found no CPU hit)."""
        adm = BlockHashCache.admit(self, rid, seq, n_tokens)
        if adm is not None:
            self.device_hit_tokens_total += adm.hit_tokens
            self.last_gpu_hit, self.last_cpu_hit = adm.hit_tokens, 0
        return adm

    def connector_step(self, items) -> None:
        """One ``build_connector_meta``: store offers of the step's scheduled requests,
        *items* = ``[(row, tokens computed after the step), ...]`` in batch order, then
        the finish visits of the rows finished since the last call (offers up to
        ``max(P, KV extent)``), then their ``on_request_finished``."""
        if self.cpu is None:
            self._fin = []
            return
        for rid, t_after in items:
            o = self._off.get(rid)
            if o is not None:
                o.T = t_after
                self._offer(o, t_after)
        fin, self._fin = self._fin, []
        for rid in fin:
            o = self._off[rid]
            self._offer(o, max(o.P, o.kv))
        for rid in fin:
            self.cpu.request_finished(self._off.pop(rid).req)

    def _offer(self, o: _Off, t_after: int) -> None:
        """``_build_store_jobs`` for one request: offer the whole chunks computed by
        *t_after* tokens beyond those already offered (``prepare_store``)."""
        n = self._offerable(o, t_after)
        if n > o.next:
            got = self.cpu.store_range(o.req, o.next, n)
            if got is not None:
                stored, n_st, n_ev = got
                o.next = n
                if n_st:
                    self._stores_now.append(stored)
                self.written_tokens_total += n_st * self.chunk_tokens
                self.host_evicted_tokens_total += n_ev * self.chunk_tokens

    def connector_quiet(self, rows) -> bool:
        """Whether decode steps of *rows* would make no connector call that changes
        anything: prompt-only offloading, no store in flight, every row's chunks offered."""
        if self.cpu is None:
            return True
        if not self.offload_prompt_only or self._stores_now or self._stores_prev or self._fin:
            return False
        off = self._off
        return all(off[r].next >= self._offerable(off[r], off[r].T) for r in rows if r in off)

    def end_step(self) -> None:
        """The step's output came back: stores issued in the previous step complete."""
        if self.cpu is None:
            return
        for h in self._stores_prev:
            self.cpu.complete(h)
        self._stores_prev, self._stores_now = self._stores_now, []

    def host_cached_tokens(self) -> int:
        """Tokens in the CPU pool (resident chunks × tokens per chunk)."""
        return 0 if self.cpu is None else self.cpu.resident() * self.chunk_tokens
