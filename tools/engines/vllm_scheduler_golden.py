"""Step-level goldens of vLLM 0.33's real v1 ``Scheduler`` for radixkv's concurrent replay.

Drives ``vllm.v1.core.sched.scheduler.Scheduler`` (with its real ``KVCacheManager``,
``BlockPool`` and block hasher) on CPU, one ``schedule()`` + ``update_from_output()``
per engine step, with a stand-in model executor:

- a request whose prompt (or recomputed prompt + outputs, after a preemption) is fully
  computed by a step samples one token in that step; the token is the trace's next output
  token (``output_tokens[g]``), so a later turn that re-sends the output hits the same
  blocks, as in radixkv's KV content model (a unique token when the trace gives none);
- a request stops after its trace output length ``N`` tokens (``max_tokens = max(N, 1)``,
  ``ignore_eos``; N = 0 behaves as N = 1: the prefill step samples the one token and the
  request finishes, holding KV for the prompt only, as radixkv's N = 0).

Time is counted in steps: step k is the k-th ``schedule()`` call (from 0), empty steps
included. **Arrivals**: a request with arrival step ``a`` is added to the scheduler just
before step ``a`` (``add_request``); a configuration gives all requests ``a = 0`` (the
whole trace waits at step 0, in file order) or ``a = i * every`` for the i-th request
(``arrival_every``). radixkv replays the same trace with arrival times ``a`` seconds and a
cost of one second per step (:class:`radixkv.cost.UnitStepCost`).

Output: one compact JSONL file per configuration (``--out DIR/<name>.jsonl``):

- line 1, the header: ``{"config": {...}, "engine": "vllm <version>", "requests": n,
  "steps": m, "trace": <file name>}``;
- one line per request, in trace order: ``{"i": row, "id": str, "arrive": step,
  "hit": tokens, "admit": step, "finish": step, "preempt": count}`` — ``hit`` is what
  the first admission's lookup found (``num_computed_tokens`` when it was scheduled),
  ``admit`` the step of the first admission, ``finish`` the step whose output finished it;
- one line per step that scheduled tokens or preempted: ``{"s": step, "r": [row, n, row,
  n, ...], "p": [rows], "a": [row, hit, ...]}`` — ``r`` the scheduled requests in the
  scheduler's order (running first, then admissions) with their token counts, ``p`` the
  requests preempted while building the step (in preemption order), ``a`` the requests
  admitted from the waiting queue (first admissions and re-admissions) with the tokens
  their lookup hit. Keys with empty lists are left out. A run of consecutive steps that
  repeat the same ``r`` with no ``p`` or ``a`` is written once with ``"n": run length``
  (``s`` its first step).

Usage (see README.md here for the CPU venv)::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 /work/venvs/vllm/bin/python \\
        tools/engines/vllm_scheduler_golden.py --out tests/data/concurrent/vllm [--only NAME ...]

The model directory holds only a ``config.json`` (a small Llama config written by this
script into a temporary folder): the scheduler needs the model's ``max_model_len`` and
dtype, never its weights. This file is a tool of the repository; the radixkv package never
imports it.
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
#: where the configurations' traces are looked for, in order
TRACE_DIRS = (ROOT / "tests" / "data" / "golden" / "traces", ROOT / "tests" / "data" / "concurrent" / "traces")


def trace_path(name: str) -> Path:
    """The trace file *name* in the first of ``TRACE_DIRS`` that has it."""
    for d in TRACE_DIRS:
        if (d / name).exists():
            return d / name
    raise FileNotFoundError(f"{name} is in none of {[str(d) for d in TRACE_DIRS]}")

#: the golden configurations: name -> knobs. ``num_gpu_blocks`` counts vLLM's null block
#: (usable blocks = num_gpu_blocks − 1); ``limit`` keeps the trace's first requests (0: all);
#: ``arrival_every`` k gives request i arrival step i·k (0: all at step 0). ``max_model_len`` must cover every request's
#: prompt + output and, with chunked prefill off, be ≤ max_num_batched_tokens (vLLM's
#: ``SchedulerConfig.verify_max_model_len``).
CONFIGS = {
    "mixed200_b16_n120_t512_s16": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=120,
                                       max_num_batched_tokens=512, max_num_seqs=16),
    "mixed200_b16_n150_t64_s64": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=150,
                                      max_num_batched_tokens=64, max_num_seqs=64),
    "mixed200_b32_n64_t256_s32": dict(trace="mixed200.jsonl", block_size=32, num_gpu_blocks=64,
                                      max_num_batched_tokens=256, max_num_seqs=32),
    "mixed200_b16_n200_t2048_s256_nochunk": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=200,
                                                 max_num_batched_tokens=2048, max_num_seqs=256,
                                                 chunked_prefill=False, max_model_len=2048),
    "mixed200_b16_n150_t1024_s16_nocache": dict(trace="mixed200.jsonl", block_size=16, num_gpu_blocks=150,
                                                max_num_batched_tokens=1024, max_num_seqs=16,
                                                prefix_caching=False),
    "mixed150_b32_n62_t64_s8_arr1": dict(trace="mixed200.jsonl", limit=150, block_size=32, num_gpu_blocks=62,
                                         max_num_batched_tokens=64, max_num_seqs=8, arrival_every=1),
    "edge300_b16_n40_t128_s16": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=40,
                                     max_num_batched_tokens=128, max_num_seqs=16),
    "edge300_b32_n20_t512_s2_nochunk": dict(trace="edge300.jsonl", block_size=32, num_gpu_blocks=20,
                                            max_num_batched_tokens=512, max_num_seqs=2,
                                            chunked_prefill=False, max_model_len=512),
    "edge300_b16_n48_t64_s4_arr2": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=48,
                                        max_num_batched_tokens=64, max_num_seqs=4, arrival_every=2),
    "edge300_b32_n30_t256_s64_nocache": dict(trace="edge300.jsonl", block_size=32, num_gpu_blocks=30,
                                             max_num_batched_tokens=256, max_num_seqs=64,
                                             prefix_caching=False),
    "stress150_b16_n80_t64_s32": dict(trace="stress150.jsonl", block_size=16, num_gpu_blocks=80,
                                      max_num_batched_tokens=64, max_num_seqs=32),
    "stress150_b32_n40_t128_s16_thr48": dict(trace="stress150.jsonl", block_size=32, num_gpu_blocks=40,
                                             max_num_batched_tokens=128, max_num_seqs=16,
                                             long_prefill_token_threshold=48),
    "stress150_b16_n80_t128_s32_wm0.1": dict(trace="stress150.jsonl", block_size=16, num_gpu_blocks=80,
                                             max_num_batched_tokens=128, max_num_seqs=32, watermark=0.1),
    "mixed200_b32_n90_t512_s16_wm0.05_arr2": dict(trace="mixed200.jsonl", block_size=32, num_gpu_blocks=90,
                                                  max_num_batched_tokens=512, max_num_seqs=16, watermark=0.05,
                                                  arrival_every=2),
    "stress150_b16_n90_t1024_s8_nochunk_arr3": dict(trace="stress150.jsonl", block_size=16, num_gpu_blocks=90,
                                                    max_num_batched_tokens=1024, max_num_seqs=8,
                                                    chunked_prefill=False, max_model_len=1024,
                                                    arrival_every=3),
    # vLLM's priority scheduler (SchedulerConfig.policy = "priority"): each request gets
    # priority random.Random(seed).randrange(levels) in file order (``priorities``) and
    # arrival_time = its arrival step; the request lines then carry "prio"
    "stress150_b16_n80_t64_s32_prio3": dict(trace="stress150.jsonl", block_size=16, num_gpu_blocks=80,
                                            max_num_batched_tokens=64, max_num_seqs=32,
                                            scheduling_policy="priority", priorities=(1, 3)),
    "mixed150_b32_n62_t64_s8_arr1_prio3": dict(trace="mixed200.jsonl", limit=150, block_size=32, num_gpu_blocks=62,
                                               max_num_batched_tokens=64, max_num_seqs=8, arrival_every=1,
                                               scheduling_policy="priority", priorities=(2, 3)),
    "edge300_b16_n48_t64_s4_arr2_prio4": dict(trace="edge300.jsonl", block_size=16, num_gpu_blocks=48,
                                              max_num_batched_tokens=64, max_num_seqs=4, arrival_every=2,
                                              scheduling_policy="priority", priorities=(3, 4)),
    "stress150_b32_n40_t128_s16_thr48_prio2": dict(trace="stress150.jsonl", block_size=32, num_gpu_blocks=40,
                                                   max_num_batched_tokens=128, max_num_seqs=16,
                                                   long_prefill_token_threshold=48,
                                                   scheduling_policy="priority", priorities=(4, 2)),
    "mixed200_b32_n90_t512_s16_wm0.05_arr2_prio3": dict(trace="mixed200.jsonl", block_size=32, num_gpu_blocks=90,
                                                        max_num_batched_tokens=512, max_num_seqs=16, watermark=0.05,
                                                        arrival_every=2, scheduling_policy="priority",
                                                        priorities=(5, 3)),
    "stress150_b16_n90_t1024_s8_nochunk_arr3_prio3": dict(trace="stress150.jsonl", block_size=16,
                                                          num_gpu_blocks=90, max_num_batched_tokens=1024,
                                                          max_num_seqs=8, chunked_prefill=False, max_model_len=1024,
                                                          arrival_every=3, scheduling_policy="priority",
                                                          priorities=(6, 3)),
}

DEFAULTS = dict(chunked_prefill=True, prefix_caching=True, max_model_len=4096, arrival_every=0,
                long_prefill_token_threshold=0, watermark=0.0, limit=0)

#: a small Llama config: only max_position_embeddings and the dtype matter to the scheduler
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 1,
    "num_hidden_layers": 1, "vocab_size": 32000, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "torch_dtype": "float16",
}

#: unique sampled tokens (trace outputs that the trace does not give) start here
UNIQUE_TOKEN_BASE = 10_000_000


def full_config(name: str) -> dict:
    """The configuration *name* with defaults filled in."""
    return {**DEFAULTS, **CONFIGS[name]}


def make_scheduler(model_dir: str, cfg: dict):
    """A real vLLM v1 ``Scheduler`` for *cfg*, and the request block hasher EngineCore uses."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    B, nb = cfg["block_size"], cfg["num_gpu_blocks"]
    mml = cfg["max_model_len"]
    mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16", max_model_len=mml)
    sc = SchedulerConfig(max_num_batched_tokens=cfg["max_num_batched_tokens"], max_num_seqs=cfg["max_num_seqs"],
                         max_model_len=mml, enable_chunked_prefill=cfg["chunked_prefill"],
                         long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
                         watermark=cfg["watermark"], is_encoder_decoder=False,
                         policy=cfg.get("scheduling_policy", "fcfs"))
    cc = CacheConfig(block_size=B, cache_dtype="auto", enable_prefix_caching=cfg["prefix_caching"])
    vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc)
    spec = FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=64, dtype=torch.float16)
    kcc = KVCacheConfig(num_blocks=nb, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    cc.num_gpu_blocks = nb
    sched = Scheduler(vllm_config=vc, kv_cache_config=kcc, structured_output_manager=StructuredOutputManager(vc),
                      block_size=B, log_stats=True)
    got = sched.scheduler_config
    want = {"max_num_batched_tokens": cfg["max_num_batched_tokens"], "max_num_seqs": cfg["max_num_seqs"],
            "enable_chunked_prefill": cfg["chunked_prefill"],
            "long_prefill_token_threshold": cfg["long_prefill_token_threshold"], "watermark": cfg["watermark"],
            "async_scheduling": False, "policy": cfg.get("scheduling_policy", "fcfs")}
    for k, v in want.items():
        if getattr(got, k, v) != v:
            raise RuntimeError(f"vLLM changed scheduler_config.{k} to {getattr(got, k)!r} (wanted {v!r})")
    if sched.kv_cache_manager.watermark_blocks != int(cfg["watermark"] * nb):
        raise RuntimeError("vLLM's watermark_blocks is not watermark × num_gpu_blocks")
    if sched.kv_cache_manager.enable_caching != cfg["prefix_caching"]:
        raise RuntimeError("vLLM changed enable_prefix_caching")
    hash_fn = get_hash_fn_by_name("sha256")  # as EngineCore sets it up
    kv_cache_utils.init_none_hash(hash_fn)
    return sched, kv_cache_utils.get_request_block_hasher(B, hash_fn)


def load_trace(path: Path) -> list[dict]:
    """The trace's requests in file order (``id``, ``tokens``, optional ``output_tokens``)."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out


def run(name: str, model_dir: str, cfg: dict | None = None) -> tuple[dict, list[dict], list[dict]]:
    """Drive the scheduler over configuration *name* (or the knobs *cfg*, defaults filled
    in from ``DEFAULTS``); returns (header, request lines, step lines)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    import vllm

    cfg = full_config(name) if cfg is None else {**DEFAULTS, **cfg}
    reqs = load_trace(trace_path(cfg["trace"]))
    if cfg.get("limit"):
        reqs = reqs[: cfg["limit"]]
    n = len(reqs)
    every = cfg["arrival_every"]
    arrive = [i * every for i in range(n)]
    for r in reqs:
        if len(r["tokens"]) + max(int(r.get("output_length", len(r.get("output_tokens", [])))), 1) > cfg["max_model_len"]:
            raise ValueError(f"{cfg['trace']}: request {r['id']} is longer than max_model_len")
    sched, hasher = make_scheduler(model_dir, cfg)
    prio = priorities(cfg, n)
    # the order of preemptions, as _preempt_request makes them (FCFS: also the head of the
    # waiting queue, reversed; a priority queue has no such order)
    pre_order: list = []
    real_preempt = sched._preempt_request

    def preempt_and_record(request, *a, **k):
        pre_order.append(request.request_id)
        return real_preempt(request, *a, **k)

    sched._preempt_request = preempt_and_record
    row = {r["id"]: i for i, r in enumerate(reqs)}
    outs = [r.get("output_tokens", []) for r in reqs]
    # output lengths: output_length when given (then the outputs are unique tokens unless
    # output_tokens are given too), else the length of output_tokens
    nout = [int(r["output_length"]) if "output_length" in r else len(outs[k]) for k, r in enumerate(reqs)]
    objs = {}
    first_hit, admit, finish, preempt = [None] * n, [None] * n, [None] * n, [0] * n
    steps = []
    step = 0
    nxt = 0
    while nxt < n or sched.has_unfinished_requests():
        while nxt < n and arrive[nxt] <= step:
            r = reqs[nxt]
            N = nout[nxt]
            extra = {} if prio is None else dict(priority=prio[nxt], arrival_time=float(arrive[nxt]))
            obj = Request(request_id=r["id"], prompt_token_ids=list(r["tokens"]),
                          sampling_params=SamplingParams(max_tokens=max(1, N), ignore_eos=True),
                          pooling_params=None, block_hasher=hasher, **extra)
            objs[r["id"]] = obj
            sched.add_request(obj)
            nxt += 1
        waiting_before = {rid for rid, o in objs.items()
                          if o.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)}
        computed_before = {rid: objs[rid].num_computed_tokens for rid in objs}
        pre_order.clear()
        out = sched.schedule()
        nsched = dict(out.num_scheduled_tokens)
        rec = {"s": step}
        r_list, a_list = [], []
        for rid, k in nsched.items():
            i = row[rid]
            r_list += [i, int(k)]
            if rid in waiting_before:
                o = objs[rid]
                # the hit: tokens computed at admission, before this step's chunk
                hit = o.num_computed_tokens - k
                a_list += [i, int(hit)]
                if admit[i] is None:
                    admit[i] = step
                    first_hit[i] = int(hit)
            elif computed_before[rid] == 0:
                raise RuntimeError(f"step {step}: {rid} scheduled from nowhere")
        pre_ids = set(out.preempted_req_ids or ())
        order = list(pre_order)
        if set(order) != pre_ids or len(order) != len(pre_ids):
            raise RuntimeError(f"step {step}: cannot order the preempted requests {sorted(pre_ids)}")
        if prio is None:
            # FCFS: preempted requests are prepended one by one and nothing else is queued
            # after a preemption, so the queue's head, reversed, is their order too
            head = [q.request_id for q in list(sched.waiting)[: len(pre_ids)]][::-1]
            if head != order:
                raise RuntimeError(f"step {step}: preemption order {order} is not the queue's head {head}")
        pre = [row[rid] for rid in order]
        for i in pre:
            preempt[i] += 1
        if r_list:
            rec["r"] = r_list
        if pre:
            rec["p"] = pre
        if a_list:
            rec["a"] = a_list
        ids = list(nsched)
        sampled = []
        for rid in ids:
            o = objs[rid]
            done = o.num_computed_tokens >= o.num_tokens  # advanced by schedule()
            g = o.num_output_tokens
            if done:
                i = row[rid]
                tok = outs[i][g] if g < len(outs[i]) else UNIQUE_TOKEN_BASE + 100_000 * i + g
                sampled.append([int(tok)])
            else:
                sampled.append([])
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                                        sampled_token_ids=sampled))
        for rid in ids:
            if objs[rid].is_finished() and finish[row[rid]] is None:
                finish[row[rid]] = step
        if r_list or pre:
            steps.append(rec)
        step += 1
        if step > 10_000_000:
            raise RuntimeError("no progress")
    req_lines = [{"i": i, "id": reqs[i]["id"], "arrive": arrive[i], "hit": first_hit[i], "admit": admit[i],
                  "finish": finish[i], "preempt": preempt[i], **({} if prio is None else {"prio": prio[i]})}
                 for i in range(n)]
    header = {"config": {"name": name, **cfg}, "engine": f"vllm {vllm.__version__}", "requests": n,
              "steps": step, "trace": cfg["trace"]}
    return header, req_lines, steps


def priorities(cfg: dict, n: int) -> list | None:
    """The requests' priorities of a ``scheduling_policy="priority"`` configuration: with
    ``priorities = (seed, levels)``, ``random.Random(seed).randrange(levels)`` for each
    request in file order; None under FCFS."""
    if cfg.get("scheduling_policy", "fcfs") != "priority":
        return None
    import random

    seed, levels = cfg["priorities"]
    rng = random.Random(seed)
    return [rng.randrange(levels) for _ in range(n)]


def run_length(steps: list) -> list:
    """Merge runs of consecutive steps that repeat the same ``r`` with no ``p``/``a`` into one
    record with ``"n": run length`` (``s`` is the run's first step)."""
    out = []
    for rec in steps:
        last = out[-1] if out else None
        if (last is not None and "p" not in rec and "a" not in rec and "p" not in last and "a" not in last
                and last.get("r") == rec.get("r") and last["s"] + last.get("n", 1) == rec["s"]):
            last["n"] = last.get("n", 1) + 1
        else:
            out.append(dict(rec))
    return out


def write(path: Path, header: dict, req_lines: list, steps: list) -> None:
    """Write one golden file atomically (temporary file in the same folder, then rename)."""
    steps = run_length(steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            for obj in [header, *req_lines, *steps]:
                f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "concurrent" / "vllm")
    ap.add_argument("--only", nargs="*", default=None, help="configuration names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the configuration names and exit")
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join(CONFIGS))
        return 0
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names = a.only or list(CONFIGS)
    for nm in names:
        if nm not in CONFIGS:
            ap.error(f"unknown configuration {nm!r}; --list shows them")
    with tempfile.TemporaryDirectory() as model_dir:
        Path(model_dir, "config.json").write_text(json.dumps(MODEL_CONFIG))
        for nm in names:
            header, req_lines, steps = run(nm, model_dir)
            write(a.out / f"{nm}.jsonl", header, req_lines, steps)
            pre = sum(r["preempt"] for r in req_lines)
            hit = sum(r["hit"] for r in req_lines)
            print(f"{nm}: {header['requests']} requests, {header['steps']} steps, hit {hit} tokens, "
                  f"{pre} preemptions", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
