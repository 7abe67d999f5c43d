"""Published serving benchmarks, replayed: their workload as a trace, their metrics the way
the benchmark tool computes them, and the error of a replay against the published numbers.

The engines' own benchmark clients — vLLM ``benchmarks/benchmark_serving.py`` (``vllm bench
serve``) and SGLang ``python/sglang/bench_serving.py`` — send a list of prompts at a request
rate and print TTFT, TPOT, ITL and throughput. A *published run* (a result JSON or printout
posted with a model, GPU, tensor-parallel size and engine knobs) is a measurement of the
whole serving stack this module lets radixkv's concurrent replay be checked against.

Workload (:func:`workload_trace`)
    One request per prompt, prompt and output lengths as the run recorded them (or fixed
    lengths, the ``random`` dataset with ``range_ratio`` 0). Every prompt is built of token
    ids no other prompt uses, so no two requests share a prefix (the ``random`` dataset's
    random token ids; ShareGPT prompts share none to speak of) and prefix caching, on or
    off, finds no hit. Arrivals: all at t = 0 for ``request_rate = inf``; otherwise the
    tool's process, exponential gaps at the rate (or Gamma gaps of shape ``burstiness``),
    the first request at 0 (:func:`radixkv.replay.arrivals.arrival_times`, seeded).

Metrics (:func:`bench_metrics`), as vLLM 0.6 ``benchmark_serving.py :: calculate_metrics``
computes them (SGLang ``bench_serving.py :: calculate_metrics`` is the same for these):
    * TTFT — request sent to first streamed token, over every successful request; a request
      that streamed nothing keeps the tool's initial 0.0 and still counts (the ``empty``
      mask reproduces that);
    * TPOT — ``(latency − TTFT) / (output_len − 1)`` per request with ``output_len > 1``
      (the first token excluded), then mean / median / p99 over requests;
    * output throughput — total output tokens / benchmark duration (first send to last
      completion);
    * percentiles — ``numpy.percentile`` (linear interpolation), medians ``numpy.median``.
    * multi-step scheduling (vLLM 0.6 ``--num-scheduler-steps S`` > 1, V0 engine): the
      engine runs S decode steps per scheduling round and hands their tokens to the server
      when the round ends (vllm/worker/multi_step_model_runner.py; vllm/engine/
      llm_engine.py ``_process_model_outputs``); a sequence that finishes inside a round is
      returned at its end. With ``num_scheduler_steps`` S the metrics take a request's
      last token at ``S · ceil((N − 1) / S)`` of its decode steps instead of ``N − 1``
      (each of its mean decode step time): TPOT and the finish time grow, TTFT does not
      (the prefill step is single-step). A **model** of the streaming (rounds assumed to
      start at the request's first decode step); the replay itself still runs one token
      per step, so the wasted decode steps of finished sequences do not slow the others.
    radixkv's ``ttft_s`` and ``tpot_s`` columns (:data:`radixkv.replay.concurrent.COLUMNS`)
    are these same per-request quantities with the client at the engine (no HTTP, no
    tokenisation, no detokenisation). ITL is not modelled: the replay has no per-token
    streaming (and with multi-step scheduling the tool's ITL is the gap between chunks of
    several tokens); it is ``None``.

Errors (:func:`relative_errors`, :func:`error_summary`)
    Signed relative error ``replay / published − 1`` per metric; the summary gives the
    median and 90th percentile of its absolute value over runs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from radixkv.errors import InputError

#: metrics compared with the published ones (keys of :func:`bench_metrics` and of a run's
#: ``published`` dict): milliseconds, or output tokens per second
METRICS = ("ttft_median_ms", "ttft_p99_ms", "ttft_mean_ms", "tpot_median_ms", "tpot_mean_ms",
           "tpot_p99_ms", "output_throughput_tok_s")

_REQUIRED = ("id", "engine", "model", "gpu", "tp", "request_rate", "knobs", "published", "source")


def load_published_runs(path) -> list[dict]:
    """The runs of a published-runs JSON file (``{"runs": [...]}``), checked.

    Each run needs ``id``, ``engine`` (``vllm``/``sglang``), ``model``, ``gpu`` (preset
    names), ``tp`` (≥ 1), ``request_rate`` (``"inf"`` or > 0 req/s), ``knobs`` (dict),
    ``published`` (dict of :data:`METRICS`, numbers or null), ``source`` (dict with
    ``url``), and either ``input_lens`` and ``output_lens`` (equal-length lists of ints,
    prompts ≥ 1 token, outputs ≥ 0) or ``num_prompts``, ``input_len`` and ``output_len``
    (fixed lengths).

    Returns
    -------
    list of dict
        The runs as the file gives them, in file order.

    Raises
    ------
    radixkv.errors.InputError
        Unreadable file, no ``runs`` list, or a run with a missing or bad field (the error
        names the file, the run's 1-based record number and the field).
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read published runs: {e}", path=str(p)) from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list):
        raise InputError("no 'runs' list", path=str(p), field="runs")
    seen = set()
    for k, r in enumerate(runs, 1):
        def bad(field, why):
            return InputError(f"run {r.get('id', '?') if isinstance(r, dict) else '?'}: {why}",
                              path=str(p), line=k, field=field)
        if not isinstance(r, dict):
            raise bad(None, "a run must be a JSON object")
        for f in _REQUIRED:
            if f not in r:
                raise bad(f, "missing")
        if r["id"] in seen:
            raise bad("id", "duplicate id")
        seen.add(r["id"])
        if r["engine"] not in ("vllm", "sglang"):
            raise bad("engine", f"must be 'vllm' or 'sglang', got {r['engine']!r}")
        if not (isinstance(r["tp"], int) and r["tp"] >= 1):
            raise bad("tp", f"must be an integer ≥ 1, got {r['tp']!r}")
        rate = r["request_rate"]
        if rate != "inf" and not (isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate)):
            raise bad("request_rate", f"must be 'inf' or a number > 0, got {rate!r}")
        if not isinstance(r["knobs"], dict):
            raise bad("knobs", "must be an object")
        if not isinstance(r["published"], dict):
            raise bad("published", "must be an object")
        for m in METRICS:
            v = r["published"].get(m)
            if v is not None and not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise bad(f"published.{m}", f"must be a number ≥ 0 or null, got {v!r}")
        if not (isinstance(r["source"], dict) and isinstance(r["source"].get("url"), str)):
            raise bad("source", "must be an object with a 'url'")
        try:
            run_lengths(r)
        except ValueError as e:
            raise bad(getattr(e, "field", None) or "input_lens", str(e)) from None
    return runs


def run_lengths(run: dict) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) of a run's requests, int64 arrays of shape (n,).

    From ``input_lens``/``output_lens`` when the run lists them, else ``num_prompts``
    copies of ``input_len``/``output_len``.

    Raises
    ------
    ValueError
        Lists of different lengths, a prompt below 1 token or an output below 0, non-ints.
    """
    if "input_lens" in run or "output_lens" in run:
        ins, outs = run.get("input_lens"), run.get("output_lens")
        if not (isinstance(ins, list) and isinstance(outs, list) and len(ins) == len(outs) and ins):
            raise ValueError("input_lens and output_lens must be non-empty lists of the same length")
    else:
        n, pi, po = run.get("num_prompts"), run.get("input_len"), run.get("output_len")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (n, pi, po)) or n < 1:
            raise ValueError("give input_lens/output_lens, or num_prompts ≥ 1, input_len and output_len as integers")
        ins, outs = [pi] * n, [po] * n
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in ins + outs):
        raise ValueError("lengths must be integers")
    if min(ins) < 1 or min(outs) < 0:
        raise ValueError("prompts need ≥ 1 token and outputs ≥ 0")
    return np.asarray(ins, dtype=np.int64), np.asarray(outs, dtype=np.int64)


def workload_trace(prompt_lens, output_lens, *, name: str = "bench_serving"):
    """A trace of one request per prompt, no prefix shared between any two.

    Parameters
    ----------
    prompt_lens, output_lens : array-like of int, shape (n,)
        P ≥ 1 and N ≥ 0 of each request, in send order.
    name : str
        The trace's name.

    Returns
    -------
    radixkv.trace.Trace
        U = 1; request i (``req_id`` ``"r{i}"``, arrival 0) has prompt ids
        ``Σ_{j<i} P_j … Σ_{j≤i} P_j − 1`` (every id used once in the whole trace).
    """
    from radixkv.trace.types import Trace

    p = np.asarray(prompt_lens, dtype=np.int64)
    o = np.asarray(output_lens, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(p)[:-1]])
    return Trace.from_requests(
        req_id=[f"r{i}" for i in range(len(p))], arrival_s=np.zeros(len(p)), prompt_len=p,
        output_len=o, prompt_ids=[np.arange(s, s + n, dtype=np.int64) for s, n in zip(start, p)],
        name=name)


def workload_arrivals(trace, request_rate, *, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times of the benchmark client (float64 seconds, shape (n,)): all 0 for
    ``request_rate == "inf"`` (or ``math.inf``); else Poisson (``burstiness`` 1) or Gamma
    gaps at *request_rate* req/s from :func:`radixkv.replay.arrivals.arrival_times`.

    Raises
    ------
    radixkv.errors.ConfigError
        A rate or burstiness ≤ 0.
    """
    if request_rate == "inf" or (isinstance(request_rate, float) and math.isinf(request_rate)):
        return np.zeros(len(trace), dtype=np.float64)
    from radixkv.replay.arrivals import arrival_times

    return arrival_times(trace, arrival="poisson" if burstiness == 1.0 else "gamma",
                         request_rate=float(request_rate), burstiness=burstiness, seed=seed)


def bench_metrics(result, *, empty=None, num_scheduler_steps: int = 1) -> dict:
    """The benchmark tool's summary metrics of a concurrent replay (module docstring).

    Parameters
    ----------
    result : radixkv.replay.concurrent.ConcurrentResult
        The replay (its ``ttft_s``, ``tpot_s`` and ``output_tokens`` columns, ``duration_s``).
    empty : array-like of bool, shape (n,), or None
        Requests the published run saw stream nothing: their TTFT counts as 0, as the
        tool records it (default: none).
    num_scheduler_steps : int
        vLLM 0.6's ``--num-scheduler-steps`` of the run (default 1: a token streamed per
        step); > 1 applies the multi-step streaming model of the module docstring.

    Returns
    -------
    dict
        :data:`METRICS` (``*_ms`` in milliseconds, ``output_throughput_tok_s`` in output
        tokens per second), ``duration_s``, ``itl_median_ms`` (None: not modelled).
        A metric with no request to compute it from is None.
    """
    ttft = np.asarray(result["ttft_s"], dtype=np.float64).copy()
    if empty is not None:
        ttft[np.asarray(empty, dtype=bool)] = 0.0
    tpot = np.asarray(result["tpot_s"], dtype=np.float64)
    d = float(result.duration_s)
    S = int(num_scheduler_steps)
    if S < 1:
        raise ValueError(f"num_scheduler_steps must be ≥ 1, got {num_scheduler_steps}")
    if S > 1:
        N = np.asarray(result["output_tokens"], dtype=np.int64)
        m = N >= 2
        steps = np.where(m, N - 1, 1)
        rounded = S * -(-steps // S)  # S · ceil((N − 1) / S)
        tpot = np.where(m, tpot * rounded / steps, tpot)
        fin = np.asarray(result["finish_s"], dtype=np.float64)
        if fin.size:
            later = fin + np.where(m, tpot * steps - np.asarray(result["tpot_s"], dtype=np.float64) * steps, 0.0)
            d += max(0.0, float(np.max(later)) - float(np.max(fin)))
    tpot = tpot[~np.isnan(tpot)]

    def stat(x, f):
        return float(f(x)) * 1e3 if x.size else None

    return {
        "ttft_median_ms": stat(ttft, np.median),
        "ttft_p99_ms": stat(ttft, lambda x: np.percentile(x, 99)),
        "ttft_mean_ms": stat(ttft, np.mean),
        "tpot_median_ms": stat(tpot, np.median),
        "tpot_mean_ms": stat(tpot, np.mean),
        "tpot_p99_ms": stat(tpot, lambda x: np.percentile(x, 99)),
        "output_throughput_tok_s": float(np.sum(result["output_tokens"])) / d if d > 0 else None,
        "duration_s": d,
        "itl_median_ms": None,
    }


def relative_errors(model: dict, published: dict, metrics=METRICS) -> dict:
    """``model[m] / published[m] − 1`` for each metric m (None when either is missing or the
    published value is 0)."""
    out = {}
    for m in metrics:
        a, b = model.get(m), published.get(m)
        out[m] = None if a is None or b is None or b == 0 else float(a) / float(b) - 1.0
    return out


def error_summary(errors) -> dict:
    """Median and 90th percentile (numpy linear interpolation) of ``|error|`` over runs,
    in percent, the median signed error and the worst (largest |error|), ignoring None.

    Returns
    -------
    dict
        ``n``, ``median_abs_pct``, ``p90_abs_pct``, ``median_signed_pct``, ``worst_pct``
        (all None when no run has the metric).
    """
    e = np.asarray([x for x in errors if x is not None], dtype=np.float64)
    if not e.size:
        return {"n": 0, "median_abs_pct": None, "p90_abs_pct": None, "median_signed_pct": None, "worst_pct": None}
    a = np.abs(e)
    return {"n": int(e.size), "median_abs_pct": float(np.median(a)) * 100,
            "p90_abs_pct": float(np.percentile(a, 90)) * 100,
            "median_signed_pct": float(np.median(e)) * 100,
            "worst_pct": float(e[int(np.argmax(a))]) * 100}
