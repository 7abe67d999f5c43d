"""radixkv.replay.bench_serving: a published benchmark's workload, its metrics computed the
benchmark tool's way, and the error of a replay — on hand-built cases whose answers are
worked out below, and on the published-runs data file (its numbers against each other)."""
import json

import numpy as np
import pytest

from radixkv.cost import UnitStepCost
from radixkv.errors import InputError
from radixkv.policies.no_cache import NoCache
from radixkv.replay.bench_serving import (bench_metrics, error_summary, load_published_runs, relative_errors,
                                          workload_arrivals, workload_trace)
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.scheduler import SchedulerConfig

DATA = "tests/data/published_serving_runs.json"


def _tiny_replay():
    """Two requests sent at t = 0: A (100 prompt tokens, 3 outputs), B (100, 1 output), on a
    clock of 10 ms per step. By hand, under vLLM's rules with a 2048-token budget: step 1
    (0–10 ms) prefills both and samples the first token of each (TTFT 10 ms each; B is
    done); steps 2 and 3 decode A (tokens 2 and 3 at 20 and 30 ms). A's TPOT =
    (30 − 10) / (3 − 1) = 10 ms; B has none (N < 2). Duration 30 ms, 4 output tokens:
    133.33 tok/s."""
    tr = workload_trace([100, 100], [3, 1])
    cfg = SchedulerConfig(max_num_batched_tokens=2048, enable_chunked_prefill=False, admission="vllm")
    return replay_concurrent(tr, NoCache(64, 16), UnitStepCost(0.01), arrivals=workload_arrivals(tr, "inf"),
                             config=cfg)


def test_metrics_of_a_hand_built_run():
    m = bench_metrics(_tiny_replay())
    assert m["ttft_median_ms"] == pytest.approx(10.0)
    assert m["ttft_p99_ms"] == pytest.approx(10.0)
    assert m["tpot_median_ms"] == pytest.approx(10.0)
    assert m["tpot_p99_ms"] == pytest.approx(10.0)
    assert m["duration_s"] == pytest.approx(0.03)
    assert m["output_throughput_tok_s"] == pytest.approx(4 / 0.03)
    assert m["itl_median_ms"] is None  # not modelled: n/a, never 0


def test_an_empty_response_counts_as_ttft_zero_like_the_tool():
    # B streamed nothing in the "published" run: the tool keeps TTFT 0.0 for it, so the
    # TTFTs are [10, 0] ms: median 5, mean 5, p99 = 0 + 0.99 × (10 − 0) = 9.9 (linear)
    m = bench_metrics(_tiny_replay(), empty=[False, True])
    assert m["ttft_median_ms"] == pytest.approx(5.0)
    assert m["ttft_mean_ms"] == pytest.approx(5.0)
    assert m["ttft_p99_ms"] == pytest.approx(9.9)


def test_error_against_a_hand_built_published_run():
    published = {"ttft_median_ms": 8.0, "tpot_median_ms": 12.5, "output_throughput_tok_s": 100.0,
                 "ttft_p99_ms": None}
    e = relative_errors(bench_metrics(_tiny_replay()), published,
                        metrics=("ttft_median_ms", "tpot_median_ms", "output_throughput_tok_s", "ttft_p99_ms"))
    assert e["ttft_median_ms"] == pytest.approx(10 / 8 - 1)        # +25 %
    assert e["tpot_median_ms"] == pytest.approx(10 / 12.5 - 1)     # −20 %
    assert e["output_throughput_tok_s"] == pytest.approx(4 / 0.03 / 100 - 1)  # +33.3 %
    assert e["ttft_p99_ms"] is None


def test_error_summary_by_hand():
    # |errors| 0.1, 0.2, 0.3 (None ignored): median 20 %; p90 at rank 0.9 × 2 = 1.8 between
    # 0.2 and 0.3 → 28 %; median signed 10 %; worst +30 %
    s = error_summary([0.1, -0.2, None, 0.3])
    assert s["n"] == 3
    assert s["median_abs_pct"] == pytest.approx(20.0)
    assert s["p90_abs_pct"] == pytest.approx(28.0)
    assert s["median_signed_pct"] == pytest.approx(10.0)
    assert s["worst_pct"] == pytest.approx(30.0)
    assert error_summary([None])["median_abs_pct"] is None


def test_workload_shares_no_prefix_and_poisson_is_seeded():
    tr = workload_trace([3, 2, 4], [1, 1, 1])
    ids = [tr.prompt_ids(i).tolist() for i in range(3)]
    assert ids == [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    a = workload_arrivals(tr, 2.0, seed=1)
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert np.array_equal(a, workload_arrivals(tr, 2.0, seed=1))
    assert np.array_equal(workload_arrivals(tr, "inf"), np.zeros(3))


def test_published_runs_file_is_consistent():
    runs = load_published_runs(DATA)
    assert len(runs) >= 10
    assert len({r["gpu"] for r in runs}) >= 2 and len({r["model"] for r in runs}) >= 2
    for r in runs:
        p = r["published"]
        # each request's lengths add up to the tool's totals, and the totals over the
        # duration give its output throughput (three numbers of the source, checked
        # against one another)
        assert sum(r["input_lens"]) == p["total_input_tokens"], r["id"]
        assert sum(r["output_lens"]) == p["total_output_tokens"], r["id"]
        assert p["total_output_tokens"] / p["duration_s"] == pytest.approx(p["output_throughput_tok_s"], rel=1e-9)
        assert r["source"]["url"].startswith("https://")


@pytest.mark.parametrize("edit, field", [
    (lambda r: r.pop("gpu"), "gpu"),
    (lambda r: r.update(output_lens=r["output_lens"][:-1]), "input_lens"),
    (lambda r: r.update(request_rate=-1), "request_rate"),
    (lambda r: r["published"].update(ttft_median_ms="fast"), "published.ttft_median_ms"),
])
def test_bad_run_names_file_record_and_field(tmp_path, edit, field):
    doc = json.loads(open(DATA).read())
    edit(doc["runs"][1])
    p = tmp_path / "runs.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError) as ei:
        load_published_runs(p)
    assert ei.value.path == str(p) and ei.value.line == 2 and ei.value.field == field


def test_multi_step_streaming_by_hand():
    # num_scheduler_steps 10: A (N = 3, two decode steps of 10 ms) is handed to the client at
    # the end of a 10-step round: its decode span is 10 × 10 ms, TPOT = 100 / (3 − 1) = 50 ms,
    # its last token at 10 + 100 = 110 ms (duration 0.11 s, 4 tokens). TTFT is unchanged
    # (10 ms: the prefill step is single-step). With 2 steps a round, 2 decode steps fill
    # exactly one round: nothing changes.
    m = bench_metrics(_tiny_replay(), num_scheduler_steps=10)
    assert m["ttft_median_ms"] == pytest.approx(10.0)
    assert m["tpot_median_ms"] == pytest.approx(50.0)
    assert m["duration_s"] == pytest.approx(0.11)
    assert m["output_throughput_tok_s"] == pytest.approx(4 / 0.11)
    assert bench_metrics(_tiny_replay(), num_scheduler_steps=2) == bench_metrics(_tiny_replay())
    with pytest.raises(ValueError):
        bench_metrics(_tiny_replay(), num_scheduler_steps=0)


def test_request_intake_by_hand():
    # both requests sent at 0, 5 ms of intake each: the front end takes them in by 5 and
    # 10 ms, one busy period, so both reach the engine at 10 ms; step 1 (10–20 ms) prefills
    # both: TTFT 20 ms from the send; A's tokens 2, 3 at 30, 40 ms: TPOT 10 ms; duration
    # from the first send (0) to 40 ms; queue_s counts the intake (10 ms).
    tr = workload_trace([100, 100], [3, 1])
    cfg = SchedulerConfig(max_num_batched_tokens=2048, enable_chunked_prefill=False, admission="vllm")
    res = replay_concurrent(tr, NoCache(64, 16), UnitStepCost(0.01), arrivals=workload_arrivals(tr, "inf"),
                            config=cfg, request_intake_s=0.005)
    m = bench_metrics(res)
    assert m["ttft_median_ms"] == pytest.approx(20.0)
    assert m["tpot_median_ms"] == pytest.approx(10.0)
    assert m["duration_s"] == pytest.approx(0.04)
    assert list(res["arrival_s"]) == [0.0, 0.0]
    assert list(res["queue_s"]) == pytest.approx([0.01, 0.01])
    assert res.meta["request_intake_s"] == 0.005
    assert "request_intake_s" not in _tiny_replay().meta  # the default leaves the output as it was
