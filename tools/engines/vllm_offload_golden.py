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

Requests run **one at a time**: request i is added when the engine is idle (the engine
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


def make_scheduler(model_dir: str, cfg: dict):
    """The real Scheduler with the OffloadingConnector, and the request block hasher."""
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
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join(CONFIGS))
        return 0
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
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


if __name__ == "__main__":
    sys.exit(main())
