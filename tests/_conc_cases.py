"""Shared pieces of the concurrent-replay tests (one copy instead of one per test file).

- :data:`COST` / :data:`COST_OVERHEAD`: the small made-up model (1e9 parameters, 8 layers)
  the tests price engine steps with, without and with SGLang-like 0.7 ms of fixed step
  overhead. Its numbers are arbitrary: the tests compare two replays of the same steps or
  work step counts out by hand, never against a price.
- :func:`request_trace`: a trace of requests ``q0, q1, …`` from prompt id lists.
- :func:`draw_sglang_case`, :func:`draw_vllm_case`: hypothesis draws of a small concurrent
  case (stem-sharing requests from :func:`conftest.draw_stem_requests`, a pool a little
  above the longest request so it evicts and retracts/preempts, and scheduler settings
  that chunk); for tests that replay one case two ways and compare.
"""
from __future__ import annotations

from conftest import draw_stem_requests
from radixkv.cost import CostModel
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.trace.types import Trace


def _cost(step_overhead_s: float = 0.0) -> CostModel:
    return CostModel(params=1e9, num_layers=8, attn_dim=1024, kv_bytes_per_token=1e5, peak_flops=1e14,
                     hbm_bytes_per_s=1e12, step_overhead_s=step_overhead_s)


COST = _cost()
COST_OVERHEAD = _cost(0.0007)


def request_trace(prompts, outputs, arrivals=None, *, output_ids: bool = False, sessions=None, name=None) -> Trace:
    """Requests ``q0, q1, …`` with these prompts (lists of token ids).

    *outputs*: output token counts, or with *output_ids* lists of output token ids;
    *arrivals*: seconds (default all 0); *sessions*: session ids (default none).
    """
    n = len(prompts)
    return Trace.from_requests(req_id=[f"q{i}" for i in range(n)],
                               arrival_s=[0.0] * n if arrivals is None else arrivals,
                               prompt_len=[len(p) for p in prompts],
                               output_len=[len(o) for o in outputs] if output_ids else outputs,
                               prompt_ids=prompts, output_ids=outputs if output_ids else None,
                               session_id=sessions, name="" if name is None else name)


def _extent(prompts, outputs) -> int:
    """Most KV tokens one request holds: its prompt plus all outputs but the last."""
    return max(len(p) + max(o - 1, 0) for p, o in zip(prompts, outputs))


def draw_sglang_case(draw, st):
    """``(trace, capacity tokens, page size, SchedulerConfig)`` for SGLang's rules: up to 12
    requests, pages of 1/4/16, a pool 1–15 pages above the longest request, 1–6 running,
    step budgets 16–4096, fcfs or lpm."""
    prompts, outputs, arrivals = draw_stem_requests(draw, st, 12, 60, 80)
    size = draw(st.sampled_from([1, 1, 4, 16]))
    cap = (-(-_extent(prompts, outputs) // size) + 1 + draw(st.integers(0, 14))) * size
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.sampled_from([16, 32, 64, 4096])),
        schedule_policy=draw(st.sampled_from(["fcfs", "fcfs", "lpm"])),
    )
    return request_trace(prompts, outputs, arrivals), cap, size, cfg


def draw_vllm_case(draw, st, max_n: int, admissions=(None,)):
    """``(trace, num_gpu_blocks, block size, SchedulerConfig)`` for vLLM's rules: up to
    *max_n* requests, blocks of 1/2/4/16, a pool 3–15 blocks above the longest request,
    chunked prefill on or off (off: the 4096-token budget), 1–5 running, the long-prefill
    threshold and the watermark sometimes set, ``admission`` drawn from *admissions*."""
    prompts, outputs, arrivals = draw_stem_requests(draw, st, max_n, 60, 60)
    size = draw(st.sampled_from([1, 2, 4, 16]))
    nb = _extent(prompts, outputs) // size + 3 + draw(st.integers(0, 12))
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([4096] if not chunked else [8, 16, 64, 4096]))
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 24])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1])),
        admission=draw(st.sampled_from(list(admissions))),
    )
    return request_trace(prompts, outputs, arrivals), nb, size, cfg
