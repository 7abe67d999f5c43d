"""Per-request goldens of vLLM 0.33's CPU KV offloading (``--kv-offloading-size``).

Drives the real v1 ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``) with its real
``KVCacheManager`` and, as its KV connector, the real ``OffloadingConnector`` in the
scheduler role (``vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py``
→ ``offloading/scheduler.py :: OffloadingConnectorScheduler``) over the real
``CPUOffloadingSpec`` / ``CPUOffloadingManager`` with its ``lru`` or ``arc`` cache policy
(``vllm/v1/kv_offload/cpu/``). The offloading is switched on the way ``vllm serve
--kv-offloading-size GiB`` does it: ``CacheConfig.kv_offloading_size`` →
``VllmConfig._post_init_kv_transfer_config`` picks the connector and sets
``cpu_bytes_to_use``; the connector's own knobs (``eviction_policy``, ``block_size`` of
an offload chunk, ``store_threshold``, ``offload_prompt_only``) go in
``kv_connector_extra_config`` as with ``--kv-transfer-config``.

The only stand-ins are the model executor and the connector's worker half (GPU↔CPU
copies need a GPU):

- the executor samples one token per request whose prompt is computed, as
  ``vllm_scheduler_golden.py`` does (the trace's next output token, else a unique one);
- the worker half reports every **load** job of a step as finished in that step's
  output (``finished_recving`` + ``completed_jobs``), and every **store** job one step
  later (the real worker submits stores at the next step's ``start_kv_transfers``,
  ``OffloadingConnector.wait_for_save``).

``--concurrent`` drives many requests at once through the same scheduler
(:func:`run_concurrent`). Otherwise requests run **one at a time**: request i is added when the engine is idle (the engine
steps while ``Scheduler.has_requests()``, as ``EngineCore.step`` does: unfinished
requests, finished ones not yet reported, or connector jobs in flight). radixkv's
sequential replay is the same protocol.

Output per configuration: ``<out>/<name>.jsonl``, a header line ``{"config", "engine",
"requests", "num_cpu_chunks", "trace"}`` then one line per request in trace order:
``{"i", "id", "prompt", "gpu", "cpu", "computed", "stored", "evicted", "loaded",
"store_fail"}``: ``gpu`` the GPU prefix-cache hit (tokens,
``num_new_local_computed_tokens``), ``cpu`` the connector's hit
(``get_num_new_matched_tokens``, tokens loaded from CPU), ``computed`` the request's
``num_computed_tokens`` when its prefill was first scheduled (gpu + cpu, one less when
they cover the whole prompt), ``stored``/``evicted``/``loaded`` CPU chunks stored,
evicted and loaded for it, ``store_fail`` how many ``prepare_store`` calls returned None.
A ``manifest.jsonl`` lists the configurations.

Usage (vLLM CPU venv, tools/engines/README.md)::

    /work/venvs/vllm/bin/python tools/engines/vllm_offload_golden.py --out tests/data/golden/vllm_offload
    PYTHONHASHSEED=0 /work/venvs/vllm/bin/python tools/engines/vllm_offload_golden.py --concurrent
    /work/venvs/vllm/bin/python tools/engines/vllm_offload_golden.py --list

This file is a tool of the repository; the radixkv package never imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "data" / "golden" / "traces"

#: The model's KV bytes per GPU block: one layer, one KV head of 64 fp16 values, K and V:
#: 2 x 64 x 2 bytes x block_size tokens (4,096 bytes at block 16 = one 4 KiB page, so a
#: chunk needs no alignment padding). ``cpu_chunks`` below is turned into vLLM's GiB.
HEAD_SIZE = 64

#: name -> knobs. ``num_gpu_blocks`` counts vLLM's null block. ``cpu_chunks``: the CPU
#: pool in offload chunks (``kv_offloading_size`` = chunks x chunk bytes / 2**30 GiB).
#: ``chunk_tokens``: the connector's ``block_size`` (tokens per offload chunk; None: one
#: GPU block per chunk).
CONFIGS = {
    "mixed200_b16_n120_c64_lru": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120, cpu_chunks=64),
    "mixed200_b16_n120_c400_lru": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120, cpu_chunks=400),
    "mixed200_b16_n120_c64_arc": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120, cpu_chunks=64,
                                      eviction_policy="arc"),
    "mixed200_b16_n120_c400_arc": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120, cpu_chunks=400,
                                       eviction_policy="arc"),
    "mixed200_b16_k64_n120_c30_lru": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120, cpu_chunks=30,
                                          chunk_tokens=64),
    "mixed200_b16_k64_n120_c100_arc": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120,
                                           cpu_chunks=100, chunk_tokens=64, eviction_policy="arc"),
    "mixed200_b32_n64_c150_lru": dict(trace="mixed200.jsonl", block_size=32, num_gpu_blocks=64, cpu_chunks=150),
    "edge300_b16_n40_c24_lru": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=40, cpu_chunks=24),
    "edge300_b16_n40_c80_arc": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=40, cpu_chunks=80,
                                    eviction_policy="arc"),
    "edge300_b16_k32_n40_c20_arc": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=40, cpu_chunks=20,
                                        chunk_tokens=32, eviction_policy="arc"),
    "mixed200_b16_n120_c200_lru_thr2": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120,
                                            cpu_chunks=200, store_threshold=2),
    "edge300_b16_n40_c60_lru_all": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=40, cpu_chunks=60,
                                        offload_prompt_only=False),
    "mixed200_b16_n120_c64_lru_thr2": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120,
                                           cpu_chunks=64, store_threshold=2),
    "mixed200_b16_n120_c48_arc_thr2": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120,
                                           cpu_chunks=48, store_threshold=2, eviction_policy="arc"),
    "edge300_b16_k32_n40_c12_arc_all": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=40,
                                            cpu_chunks=12, chunk_tokens=32, eviction_policy="arc",
                                            offload_prompt_only=False),
    "mixed200_b16_n120_c40_lru_all": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120,
                                          cpu_chunks=40, offload_prompt_only=False),
    # the first 300 requests of the Mooncake conversation trace ($RADIXKV_SHARED; --shared)
    "moon_conv_300_b16_n8001_c100000_lru": dict(trace="mooncake:300", block_size=16, num_gpu_blocks=8001,
                                                cpu_chunks=100000, shared=True),
    "moon_conv_300_b16_k64_n8001_c20000_arc": dict(trace="mooncake:300", block_size=16, num_gpu_blocks=8001,
                                                   cpu_chunks=20000, chunk_tokens=64, eviction_policy="arc",
                                                   shared=True),
}
DEFAULTS = dict(eviction_policy="lru", chunk_tokens=None, store_threshold=0, offload_prompt_only=True,
                max_model_len=4096, shared=False)
#: Mooncake conversation trace under $RADIXKV_SHARED
MOONCAKE = ("traces", "mooncake-fast25", "conversation_trace.jsonl")

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 1,
    "num_hidden_layers": 1, "vocab_size": 32000, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "torch_dtype": "float16",
}
UNIQUE_TOKEN_BASE = 10_000_000


def read_trace(cfg: dict) -> list[dict]:
    """The configuration's requests: a token trace of tests/data/golden/traces, or
    ``mooncake:K``, the first K lines of the Mooncake conversation trace as tokens (hash
    id h of a 512-token unit = tokens h·512 … h·512+511, the last unit cut to the input
    length; outputs unique tokens, docs/golden.md conventions), ids ``r<line>``."""
    name = cfg["trace"]
    if not name.startswith("mooncake:"):
        return [json.loads(x) for x in open(TRACES / name) if x.strip()]
    k = int(name.split(":")[1])
    path = Path(os.environ.get("RADIXKV_SHARED", "/work/shared")).joinpath(*MOONCAKE)
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i >= k:
                break
            r = json.loads(line)
            toks = [h * 512 + j for h in r["hash_ids"] for j in range(512)][: r["input_length"]]
            out.append({"id": f"r{i}", "tokens": toks, "output_length": int(r["output_length"])})
    return out


def full_config(name: str) -> dict:
    return {**DEFAULTS, **CONFIGS[name]}


def chunk_bytes(cfg: dict) -> int:
    """KV bytes of one offload chunk (all blocks of it), the unit vLLM sizes the CPU pool in."""
    B = cfg["block_size"]
    bpc = (cfg["chunk_tokens"] or B) // B
    return 2 * HEAD_SIZE * 2 * B * bpc


def make_scheduler(model_dir: str, cfg: dict, concurrent: bool = False):
    """The real Scheduler with the OffloadingConnector, and the request block hasher.
    *concurrent*: the step budget, seats and chunk cap of the configuration
    (``max_num_batched_tokens``, ``max_num_seqs``, ``long_prefill_token_threshold``)."""
    import torch
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    B, nb = cfg["block_size"], cfg["num_gpu_blocks"]
    mml = cfg["max_model_len"]
    mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16", max_model_len=mml)
    # one step computes any whole prompt (no chunked prefill splits in a lone-request run)
    if concurrent:
        sc = SchedulerConfig(max_num_batched_tokens=cfg["max_num_batched_tokens"], max_num_seqs=cfg["max_num_seqs"],
                             max_model_len=mml, enable_chunked_prefill=True,
                             long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
                             is_encoder_decoder=False)
    else:
        sc = SchedulerConfig(max_num_batched_tokens=mml, max_num_seqs=16, max_model_len=mml,
                             enable_chunked_prefill=True, is_encoder_decoder=False)
    gib = cfg["cpu_chunks"] * chunk_bytes(cfg) / float(1 << 30)
    cc = CacheConfig(block_size=B, cache_dtype="auto", enable_prefix_caching=True, kv_offloading_size=gib,
                     kv_offloading_backend="native")
    extra = {"eviction_policy": cfg["eviction_policy"], "offload_prompt_only": cfg["offload_prompt_only"]}
    if cfg["chunk_tokens"]:
        extra["block_size"] = cfg["chunk_tokens"]
    if cfg["store_threshold"]:
        extra["store_threshold"] = cfg["store_threshold"]
    ktc = KVTransferConfig(kv_connector_extra_config=extra)
    vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc, kv_transfer_config=ktc)
    if vc.kv_transfer_config.kv_connector != "OffloadingConnector":
        raise RuntimeError(f"kv_offloading_size chose {vc.kv_transfer_config.kv_connector!r}")
    spec = FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=HEAD_SIZE, dtype=torch.float16)
    kcc = KVCacheConfig(num_blocks=nb, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    cc.num_gpu_blocks = nb
    sched = Scheduler(vllm_config=vc, kv_cache_config=kcc, structured_output_manager=StructuredOutputManager(vc),
                      block_size=B, log_stats=True)
    conn = sched.connector
    if type(conn).__name__ != "OffloadingConnector":
        raise RuntimeError(f"the scheduler built connector {type(conn).__name__}")
    man = conn.connector_scheduler.manager
    if man._num_chunks != cfg["cpu_chunks"]:
        raise RuntimeError(f"vLLM sized the CPU pool to {man._num_chunks} chunks, not {cfg['cpu_chunks']}")
    if sched.kv_cache_manager.watermark_blocks != 0 or sched.scheduler_config.async_scheduling:
        raise RuntimeError("unexpected scheduler knobs (watermark / async scheduling)")
    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    return sched, kv_cache_utils.get_request_block_hasher(B, hash_fn)


def run(name: str, model_dir: str, cfg: dict | None = None):
    """Drive configuration *name*; returns (header, request lines)."""
    import vllm
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request

    cfg = full_config(name) if cfg is None else {**DEFAULTS, **cfg}
    reqs = read_trace(cfg)
    longest = max(len(r["tokens"]) + max(int(r.get("output_length", len(r.get("output_tokens", [])))), 1)
                  for r in reqs)
    if longest > cfg["max_model_len"]:
        cfg["max_model_len"] = -(-longest // 4096) * 4096
    Path(model_dir, "config.json").write_text(json.dumps(
        {**MODEL_CONFIG, "max_position_embeddings": max(8192, cfg["max_model_len"])}))
    sched, hasher = make_scheduler(model_dir, cfg)
    # unique sampled tokens: above every prompt token
    base = max(UNIQUE_TOKEN_BASE, 1 + max(max(r["tokens"], default=0) for r in reqs))
    conn = sched.connector
    cs = conn.connector_scheduler
    man = cs.manager
    cur = {}  # the running request's counters (spies below write into it)

    # spies: call the real methods unchanged and note what they returned
    real_match = cs.get_num_new_matched_tokens

    def match_spy(request, num_computed_tokens, max_num_new_tokens=None):
        ext, async_load = real_match(request, num_computed_tokens, max_num_new_tokens=max_num_new_tokens)
        cur.setdefault("lookups", []).append((int(num_computed_tokens), ext))
        return ext, async_load

    cs.get_num_new_matched_tokens = match_spy
    real_store = man.prepare_store

    def store_spy(keys, req_context):
        out = real_store(keys, req_context)
        if out is None:
            cur["store_fail"] = cur.get("store_fail", 0) + 1
        else:
            cur["stored"] = cur.get("stored", 0) + len(out.keys_to_store)
            cur["evicted"] = cur.get("evicted", 0) + len(out.evicted_keys)
        return out

    man.prepare_store = store_spy
    real_load = man.prepare_load

    def load_spy(keys, req_context):
        cur["loaded"] = cur.get("loaded", 0) + len(keys)
        return real_load(keys, req_context)

    man.prepare_load = load_spy

    lines = []
    pending_stores: list[int] = []
    for i, r in enumerate(reqs):
        outs = r.get("output_tokens", [])
        N = int(r["output_length"]) if "output_length" in r else len(outs)
        if len(r["tokens"]) + max(N, 1) > cfg["max_model_len"]:
            raise ValueError(f"{cfg['trace']}: request {r['id']} is longer than max_model_len")
        obj = Request(request_id=r["id"], prompt_token_ids=list(r["tokens"]),
                      sampling_params=SamplingParams(max_tokens=max(1, N), ignore_eos=True),
                      pooling_params=None, block_hasher=hasher)
        cur.clear()
        sched.add_request(obj)
        computed = None
        steps = 0
        while sched.has_requests():
            out = sched.schedule()
            meta = out.kv_connector_metadata
            nsched = dict(out.num_scheduled_tokens)
            if r["id"] in nsched and computed is None:
                computed = obj.num_computed_tokens - nsched[r["id"]]
            done_jobs = list(pending_stores)
            pending_stores = []
            recv = set()
            if meta is not None:
                for jid, job in meta.load_jobs.items():
                    done_jobs.append(jid)
                    recv.add(job.req_id)
                pending_stores.extend(meta.store_jobs)
            ids = list(nsched)
            sampled = []
            for rid in ids:
                done = obj.num_computed_tokens >= obj.num_tokens
                g = obj.num_output_tokens
                if done:
                    tok = outs[g] if g < len(outs) else base + 100_000 * i + g
                    sampled.append([int(tok)])
                else:
                    sampled.append([])
            wm = OffloadingWorkerMetadata(completed_jobs={j: 1 for j in done_jobs}) if done_jobs else None
            kco = KVConnectorOutput(finished_recving=recv or None, kv_connector_worker_meta=wm)
            sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={x: k for k, x in enumerate(ids)},
                                                            sampled_token_ids=sampled, kv_connector_output=kco))
            steps += 1
            if steps > 100_000:
                raise RuntimeError("no progress")
        lk = cur.get("lookups", [])
        if len(lk) != 1:
            raise RuntimeError(f"request {r['id']}: {len(lk)} connector lookups (a lone request makes one)")
        gpu, cpu = lk[0]
        lines.append({"i": i, "id": r["id"], "prompt": len(r["tokens"]), "gpu": gpu, "cpu": int(cpu or 0),
                      "computed": computed, "stored": cur.get("stored", 0), "evicted": cur.get("evicted", 0),
                      "loaded": cur.get("loaded", 0), "store_fail": cur.get("store_fail", 0)})
    header = {"config": {"name": name, **cfg}, "engine": f"vllm {vllm.__version__}", "requests": len(reqs),
              "num_cpu_chunks": man._num_chunks, "trace": cfg["trace"]}
    return header, lines


#: Concurrent configurations (``--concurrent``): many requests share the real Scheduler at
#: once. Extra knobs over CONFIGS: ``max_num_batched_tokens``, ``max_num_seqs``,
#: ``arrival_every`` (request i is added just before step i·k; 0: all before step 0),
#: ``limit`` (first requests of the trace; 0: all).
CONC_CONFIGS = {
    "conc_mixed200_b16_n120_c200_t256_s16_lru": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120,
                                                     cpu_chunks=200, max_num_batched_tokens=256, max_num_seqs=16),
    "conc_mixed200_b16_n150_c400_t512_s32_arc": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=150,
                                                     cpu_chunks=400, max_num_batched_tokens=512, max_num_seqs=32,
                                                     eviction_policy="arc"),
    "conc_mixed200_b16_k64_n120_c60_t128_s8_arr2_lru": dict(trace="mixed200.jsonl", block_size=16,
                                                            num_gpu_blocks=120, cpu_chunks=60, chunk_tokens=64,
                                                            max_num_batched_tokens=128, max_num_seqs=8,
                                                            arrival_every=2),
    "conc_edge300_b16_n40_c24_t128_s16_lru": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=40,
                                                  cpu_chunks=24, max_num_batched_tokens=128, max_num_seqs=16),
    "conc_edge300_b16_n48_c80_t64_s4_arr2_arc": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=48,
                                                     cpu_chunks=80, max_num_batched_tokens=64, max_num_seqs=4,
                                                     arrival_every=2, eviction_policy="arc"),
    "conc_stress150_b16_n80_c120_t64_s32_lru": dict(trace="stress150.jsonl", block_size=16, num_gpu_blocks=80,
                                                    cpu_chunks=120, max_num_batched_tokens=64, max_num_seqs=32),
    "conc_stress150_b32_n40_c50_t128_s16_thr48_arc": dict(trace="stress150.jsonl", block_size=32,
                                                          num_gpu_blocks=40, cpu_chunks=50,
                                                          max_num_batched_tokens=128, max_num_seqs=16,
                                                          long_prefill_token_threshold=48, eviction_policy="arc"),
    "conc_edge300_b16_k32_n40_c30_t128_s16_all_thr2": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=40,
                                                          cpu_chunks=30, chunk_tokens=32,
                                                          max_num_batched_tokens=128, max_num_seqs=16,
                                                          offload_prompt_only=False, store_threshold=2),
    # sparse arrivals: the engine idles between requests with connector jobs in flight
    "conc_edge300_b16_n40_c40_t128_s4_arr9_lru": dict(trace="edge300.jsonl", limit=150, block_size=16,
                                                      num_gpu_blocks=40, cpu_chunks=40, max_num_batched_tokens=128,
                                                      max_num_seqs=4, arrival_every=9),
}
CONC_DEFAULTS = dict(max_num_batched_tokens=512, max_num_seqs=16, arrival_every=0, limit=0,
                     long_prefill_token_threshold=0)
#: where concurrent traces are looked for after tests/data/golden/traces
CONC_TRACES = ROOT / "tests" / "data" / "concurrent" / "traces"


def run_concurrent(name: str, model_dir: str, cfg: dict | None = None):
    """Drive concurrent configuration *name* through the real Scheduler with the
    OffloadingConnector; returns (header, request lines, step lines).

    Engine loop (as ``vllm_scheduler_golden.py``): step k is the k-th ``schedule()`` call
    (empty steps included); request i is added just before step ``arrive[i]``; the engine
    steps while requests arrive, are unfinished, or the connector has jobs in flight
    (``Scheduler.has_requests``). Stand-in worker: every load job a step issues is reported
    finished in that step's output (``finished_recving`` and ``completed_jobs``), so the
    request is promoted from WAITING_FOR_REMOTE_KVS at the next step; every store job is
    reported one step later. ``jobs_to_flush`` needs nothing more: a job in flight at any
    step was issued the step before and completes in this step's output anyway.

    Determinism: vLLM hands the connector ``finished_req_ids`` as a Python set, so when
    several requests finish in one step the order of their ``on_request_finished`` calls
    (and so the CPU pool's LRU recency) follows string hashing. Run with
    ``PYTHONHASHSEED=0`` (the committed goldens were); ``totals`` in the header can differ
    under another seed, and so can the schedule of a configuration where that order
    changes an eviction (``conc_stress150_b16_n80_c120_t64_s32_lru`` from step 2800 under
    seed 1); the other seven give the same request and step lines under seeds 0 and 1.

    Request line: ``{"i", "id", "arrive", "gpu", "cpu", "hit", "admit", "first", "finish",
    "preempt", "loads"}`` — ``gpu``/``cpu`` the GPU prefix hit and the connector's hit of
    the lookup that admitted the request the first time, ``hit`` the tokens it computes
    from (gpu + cpu, one less when they cover every known token), ``admit`` the step of
    that admission (blocks allocated; for a CPU hit the step that issued the load),
    ``first`` the first step that scheduled tokens for it, ``finish`` the step whose output
    finished it, ``preempt`` its preemptions, ``loads`` its load jobs.
    Step line (only steps that scheduled, preempted or loaded): ``{"s", "r": [row, tokens,
    ...], "p": [rows], "l": [row, cpu tokens, ...], "a": [row, hit, ...]}`` — scheduled
    requests in the scheduler's order, preempted requests in preemption order, loads
    issued (admissions into WAITING_FOR_REMOTE_KVS; rows in trace order), and admissions from the waiting
    queues that scheduled tokens at once (hit as above), ``d``: requests whose lookup the
    connector deferred (``get_num_new_matched_tokens`` → None: a hit chunk's store or
    load is in flight), skipped for the step; empty keys left out.
    """
    import vllm
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    cfg = {**DEFAULTS, **CONC_DEFAULTS, **(CONC_CONFIGS[name] if cfg is None else cfg)}
    tp = TRACES / cfg["trace"]
    if not tp.exists():
        tp = CONC_TRACES / cfg["trace"]
    reqs = [json.loads(x) for x in open(tp) if x.strip()]
    if cfg["limit"]:
        reqs = reqs[: cfg["limit"]]
    n = len(reqs)
    outs = [r.get("output_tokens", []) for r in reqs]
    nout = [int(r["output_length"]) if "output_length" in r else len(outs[k]) for k, r in enumerate(reqs)]
    longest = max(len(r["tokens"]) + max(nout[k], 1) for k, r in enumerate(reqs))
    if longest > cfg["max_model_len"]:
        cfg["max_model_len"] = -(-longest // 4096) * 4096
    Path(model_dir, "config.json").write_text(json.dumps(
        {**MODEL_CONFIG, "max_position_embeddings": max(8192, cfg["max_model_len"])}))
    sched, hasher = make_scheduler(model_dir, cfg, concurrent=True)
    conn = sched.connector
    cs = conn.connector_scheduler
    man = cs.manager
    row = {r["id"]: i for i, r in enumerate(reqs)}
    every = cfg["arrival_every"]
    arrive = [i * every for i in range(n)]
    lookups: dict = {}  # this step's lookups: req id -> (gpu, cpu)
    real_match = cs.get_num_new_matched_tokens

    def match_spy(request, num_computed_tokens, max_num_new_tokens=None):
        ext, async_load = real_match(request, num_computed_tokens, max_num_new_tokens=max_num_new_tokens)
        lookups[request.request_id] = (int(num_computed_tokens), None if ext is None else int(ext))
        return ext, async_load

    cs.get_num_new_matched_tokens = match_spy
    tot = {"stored": 0, "evicted": 0, "loaded": 0, "store_fail": 0}
    real_store = man.prepare_store

    def store_spy(keys, req_context):
        out = real_store(keys, req_context)
        if out is None:
            tot["store_fail"] += 1
        else:
            tot["stored"] += len(out.keys_to_store)
            tot["evicted"] += len(out.evicted_keys)
        return out

    man.prepare_store = store_spy
    real_load = man.prepare_load

    def load_spy(keys, req_context):
        tot["loaded"] += len(keys)
        return real_load(keys, req_context)

    man.prepare_load = load_spy

    objs: dict = {}
    gpu, cpu, hit, admit, first, finish = ([None] * n for _ in range(6))
    preempt, loads = [0] * n, [0] * n
    steps = []
    pending_stores: list = []
    step = nxt = 0
    while nxt < n or sched.has_requests():
        while nxt < n and arrive[nxt] <= step:
            r = reqs[nxt]
            obj = Request(request_id=r["id"], prompt_token_ids=list(r["tokens"]),
                          sampling_params=SamplingParams(max_tokens=max(1, nout[nxt]), ignore_eos=True),
                          pooling_params=None, block_hasher=hasher)
            objs[r["id"]] = obj
            sched.add_request(obj)
            nxt += 1
        before = {rid: (o.status, o.num_computed_tokens) for rid, o in objs.items()}
        lookups.clear()
        out = sched.schedule()
        meta = out.kv_connector_metadata
        nsched = dict(out.num_scheduled_tokens)
        rec = {"s": step}
        r_list, a_list, l_list = [], [], []
        for rid, k in nsched.items():
            i = row[rid]
            r_list += [i, int(k)]
            if first[i] is None:
                first[i] = step
            st, comp = before[rid]
            if st in (RequestStatus.WAITING, RequestStatus.PREEMPTED) and comp == 0:
                g, c = lookups[rid]
                h = objs[rid].num_computed_tokens - k
                a_list += [i, int(h)]
                if admit[i] is None:
                    admit[i], gpu[i], cpu[i], hit[i] = step, g, c, int(h)
        for rid, o in objs.items():
            if o.status == RequestStatus.WAITING_FOR_REMOTE_KVS and before[rid][0] != o.status:
                i = row[rid]
                g, c = lookups[rid]
                l_list += [i, c]
                loads[i] += 1
                if admit[i] is None:
                    P = o.num_tokens
                    admit[i], gpu[i], cpu[i], hit[i] = step, g, c, g + c - (1 if g + c == P else 0)
        pre_ids = set(out.preempted_req_ids or ())
        order = [q.request_id for q in list(sched.waiting)[: len(pre_ids)]][::-1]
        if set(order) != pre_ids:
            raise RuntimeError(f"step {step}: cannot order the preempted requests {sorted(pre_ids)}")
        for rid in order:
            preempt[row[rid]] += 1
        d_list = [row[x] for x, (g, c) in lookups.items() if c is None]
        for key, val in (("r", r_list), ("p", [row[x] for x in order]), ("l", l_list), ("a", a_list),
                         ("d", d_list)):
            if val:
                rec[key] = val
        done_jobs = list(pending_stores)
        pending_stores = []
        recv = set()
        if meta is not None:
            for jid, job in meta.load_jobs.items():
                done_jobs.append(jid)
                recv.add(job.req_id)
            pending_stores.extend(meta.store_jobs)
        ids = list(nsched)
        sampled = []
        for rid in ids:
            o = objs[rid]
            if o.num_computed_tokens >= o.num_tokens:
                i = row[rid]
                g = o.num_output_tokens
                tok = outs[i][g] if g < len(outs[i]) else UNIQUE_TOKEN_BASE + 100_000 * i + g
                sampled.append([int(tok)])
            else:
                sampled.append([])
        wm = OffloadingWorkerMetadata(completed_jobs={j: 1 for j in done_jobs}) if done_jobs else None
        kco = KVConnectorOutput(finished_recving=recv or None, kv_connector_worker_meta=wm)
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={x: k for k, x in enumerate(ids)},
                                                        sampled_token_ids=sampled, kv_connector_output=kco))
        for rid in ids:
            if objs[rid].is_finished() and finish[row[rid]] is None:
                finish[row[rid]] = step
        if len(rec) > 1:
            steps.append(rec)
        step += 1
        if step > 1_000_000:
            raise RuntimeError("no progress")
    req_lines = [{"i": i, "id": reqs[i]["id"], "arrive": arrive[i], "gpu": gpu[i], "cpu": cpu[i], "hit": hit[i],
                  "admit": admit[i], "first": first[i], "finish": finish[i], "preempt": preempt[i],
                  "loads": loads[i]} for i in range(n)]
    header = {"config": {"name": name, **cfg}, "engine": f"vllm {vllm.__version__}", "requests": n, "steps": step,
              "num_cpu_chunks": man._num_chunks, "trace": cfg["trace"], "totals": tot}
    return header, req_lines, steps


def write(path: Path, objs: list) -> None:
    """Write JSON lines atomically (temporary file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            for obj in objs:
                f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "golden" / "vllm_offload")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--shared", action="store_true",
                    help="also the Mooncake configurations (read from $RADIXKV_SHARED)")
    ap.add_argument("--concurrent", action="store_true",
                    help="the concurrent configurations (CONC_CONFIGS) into <out>/concurrent")
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join(CONC_CONFIGS if a.concurrent else CONFIGS))
        return 0
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if a.concurrent:
        return main_concurrent(a)
    names = a.only or [n for n in CONFIGS if a.shared or not CONFIGS[n].get("shared")]
    manifest = []
    with tempfile.TemporaryDirectory() as model_dir:
        Path(model_dir, "config.json").write_text(json.dumps(MODEL_CONFIG))
        for nm in names:
            header, lines = run(nm, model_dir)
            sub = a.out / "shared" if header["config"]["shared"] else a.out
            write(sub / f"{nm}.jsonl", [header, *lines])
            manifest.append({"name": nm, **header["config"], "engine": header["engine"],
                             "num_cpu_chunks": header["num_cpu_chunks"]})
            tot = {k: sum(x[k] for x in lines) for k in ("gpu", "cpu", "stored", "evicted", "store_fail")}
            print(f"{nm}: {len(lines)} requests, {tot}", flush=True)
    if a.only is None:
        write(a.out / "manifest.jsonl", [m for m in manifest if not m["shared"]])
        if a.shared:
            write(a.out / "shared" / "manifest.jsonl", [m for m in manifest if m["shared"]])
    return 0


def main_concurrent(a) -> int:
    """Write the concurrent goldens (header, request lines, step lines) and their manifest."""
    names = a.only or list(CONC_CONFIGS)
    manifest = []
    with tempfile.TemporaryDirectory() as model_dir:
        Path(model_dir, "config.json").write_text(json.dumps(MODEL_CONFIG))
        for nm in names:
            header, req_lines, steps = run_concurrent(nm, model_dir)
            write(a.out / "concurrent" / f"{nm}.jsonl", [header, *req_lines, *steps])
            manifest.append({"name": nm, **header["config"], "engine": header["engine"],
                             "num_cpu_chunks": header["num_cpu_chunks"]})
            print(f"{nm}: {header['requests']} requests, {header['steps']} steps, "
                  f"gpu {sum(x['gpu'] for x in req_lines)} cpu {sum(x['cpu'] for x in req_lines)} "
                  f"preempt {sum(x['preempt'] for x in req_lines)} loads {sum(x['loads'] for x in req_lines)} "
                  f"{header['totals']}", flush=True)
    if a.only is None:
        write(a.out / "concurrent" / "manifest.jsonl", manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
