"""``radixkv plan`` (issue 30): the recommendation checked by the plain concurrent replay,
the next cheaper point it considered missing the SLO, monotonicity in the SLO, same bytes,
bad inputs, and the pieces (SLO parsing, the overload test, the throughput bound) against
values worked out by hand.

One small trace (40 multi-turn requests, synthesized, replayed at 80x its rate so that
one A100 is not enough) and one plan are shared by the module's tests.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from radixkv.cli import main
from radixkv.errors import ConfigError

SLO = "ttft_p99=100ms,tpot_p99=40ms"
BASE = ["--model", "Llama-3.1-8B", "--gpus", "A100-80GB", "--tp", "1", "--rate-scale", "80", "--budget", "30"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    trace = d / "mt40.jsonl"
    assert main(["trace", "synth", "multi_turn", "--requests", "40", "--seed", "3", "--rate", "4",
                 "--out", str(trace)]) == 0
    out = d / "plan.json"
    assert main(["plan", str(trace), "--slo", SLO, *BASE, "--work-dir", str(d / "work"), "--json", str(out)]) == 0
    return d, trace, json.loads(out.read_text())


def _replay(argv, tmp_path, name):
    """The plain ``radixkv replay`` of *argv* (the plan's printed command), its JSON summary."""
    out = tmp_path / f"{name}.json"
    assert main([*argv, "--quiet", "--json", str(out)]) == 0
    return json.loads(out.read_text())["results"][0]["summary"]


def _meets(summ, slo_s: dict) -> bool:
    return all(summ[f"{t}_s"] <= b for t, b in slo_s.items())


def test_recommendation_meets_slo_in_plain_replay_and_next_cheaper_misses(small, tmp_path):
    _, _, doc = small
    rec, nxt = doc["recommendation"], doc["next_cheaper"]
    slo = {"ttft_p99": 0.1, "tpot_p99": 0.04}
    assert rec["point"]["replicas"] >= 2 and nxt is not None
    assert nxt["cost_per_hour"] < rec["cost_per_hour"]
    a = _replay(rec["replay_argv"], tmp_path, "rec")
    assert _meets(a, slo), (a["ttft_p99_s"], a["tpot_p99_s"])
    b = _replay(nxt["replay_argv"], tmp_path, "next")
    assert not _meets(b, slo), (b["ttft_p99_s"], b["tpot_p99_s"])
    # the printed knobs are the engine's flags of the recommendation
    cmd = rec["engine_command"]
    for flag in ("--tensor-parallel-size 1", "--gpu-memory-utilization", "--max-num-batched-tokens",
                 "--max-num-seqs", "--block-size"):
        assert flag in cmd
    # vLLM's own defaults on an A100 (EngineArgs.get_batch_defaults, OpenAI server; CacheConfig),
    # by hand: 0.92, 2048 tokens, 256 sequences, block 16. The knob step changes at most one
    # of them; every other one is printed as the default.
    pt = rec["point"]
    hand = {"gpu_memory_utilization": 0.92, "max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 16}
    changed = [k for k, v in hand.items() if pt[k] != v]
    assert len(changed) <= 1, changed
    for k, v in hand.items():
        if k not in changed:
            assert f"--{k.replace('_', '-')} {v:g} " in cmd, (k, cmd)


def test_stricter_slo_never_cheaper_and_looser_never_dearer(small, tmp_path):
    d, trace, doc = small
    cost = doc["recommendation"]["cost_per_hour"]
    for slo, rel in (("ttft_p99=80ms,tpot_p99=40ms", "ge"), ("ttft_p99=200ms,tpot_p99=40ms", "le")):
        out = tmp_path / f"{rel}.json"
        assert main(["plan", str(trace), "--slo", slo, *BASE, "--work-dir", str(d / "work"), "--json", str(out)]) == 0
        c = json.loads(out.read_text())["recommendation"]["cost_per_hour"]
        assert (c >= cost) if rel == "ge" else (c <= cost), (slo, c, cost)


def test_same_inputs_same_bytes(small, tmp_path, capsys):
    """A fresh plan (no work dir, worker processes) writes the bytes the first one wrote,
    although its idle worker replayed points ahead of the search (some never asked for)."""
    d, trace, _ = small
    out = tmp_path / "again.json"
    capsys.readouterr()
    assert main(["plan", str(trace), "--slo", SLO, *BASE, "--executor", "processes", "--workers", "2",
                 "--json", str(out)]) == 0
    assert out.read_bytes() == (d / "plan.json").read_bytes()
    m = re.search(r"; (\d+) started ahead on idle workers, (\d+) of them used\)", capsys.readouterr().out)
    assert m and int(m.group(1)) >= 1, "the search's sequential steps left the second worker idle"


def test_plan_counts_and_verdict(small):
    _, _, doc = small
    s = doc["search"]
    assert 0 < s["replayed"] <= 30
    v = doc["prefix_caching"]
    assert v["verdict"] in ("on", "off", "either") and v["text"]
    if v["verdict"] == "either":  # only when both settings meet the SLO
        assert v["on"]["meets_slo"] and v["off"]["meets_slo"]
    knobs = {r["knob"] for r in doc["sensitivity"]}
    assert {"prefix_caching", "max_num_batched_tokens", "max_num_seqs", "block_size", "router"} <= knobs
    # an overloaded point reports no latency
    for p in doc["points"]:
        if p["overloaded"]:
            assert p["ttft_p99_s"] is None and not p["meets_slo"]


@pytest.mark.parametrize("argv, needle", [
    (["--slo", "ttft_p99=1ms", "--gpus", "A100-80GB", "--tp", "1", "--budget", "4"], "no feasible plan: closest is"),
    (["--slo", SLO, "--gpus", "Z100"], "Z100"),
    (["--slo", SLO, "--model", "Llama-3.1-70B", "--gpus", "A100-40GB", "--tp", "1"], "fits no GPU"),
    (["--slo", "ttft_p99=2"], "unit"),
    (["--slo", SLO, "--gpus", "A100-80GB", "--price", "H100-80GB=2"], "price"),
])
def test_bad_inputs_exit_2(small, capsys, argv, needle):
    _, trace, _ = small
    full = ["plan", str(trace), "--model", "Llama-3.1-8B", *argv]
    if "--model" in argv:
        full = ["plan", str(trace), *argv]
    assert main(full) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    if "no feasible" in needle:
        assert "misses ttft_p99" in err


def test_parse_slo():
    from radixkv.plan.spec import parse_slo

    assert parse_slo("ttft_p99=2s, tpot_p99=50ms") == {"ttft_p99": 2.0, "tpot_p99": 0.05}
    assert parse_slo("ttft_p50=250ms") == {"ttft_p50": 0.25}
    for bad in ("ttft_p99=2", "ttft_p98=2s", "ttft_p99=0s", "ttft_p99=1s,ttft_p99=2s", "", "ttft_p99"):
        with pytest.raises(ConfigError):
            parse_slo(bad)


def test_overload_metrics_by_hand():
    from radixkv.replay.overload import overload_metrics

    a = np.arange(100, dtype=np.float64)
    # load 2x capacity: request at t waits t*(1 - 1/2) = t/2 -> slope 0.5, tail mean of t/2 over t=75..99 = 43.5
    m = overload_metrics(a, a / 2)
    assert m["overloaded"] is True
    assert m["queue_growth_s_per_s"] == pytest.approx(0.5)
    assert m["queue_tail_mean_s"] == pytest.approx(43.5)
    # a stationary queue of 0.2 s: slope 0, not overloaded
    m = overload_metrics(a, np.full(100, 0.2))
    assert m["overloaded"] is False and m["queue_growth_s_per_s"] == pytest.approx(0.0)
    assert overload_metrics(a[:3], a[:3])["overloaded"] is None


def test_overload_slope_does_not_depend_on_blas_threads(tmp_path):
    """The queue-growth slope is the same bits with 1 and 2 BLAS threads (a Dask worker runs
    with 1): np.dot over 12,031 requests, as it was computed, differs in its last bits between
    the two (OpenBLAS splits the sum over its threads), which made the Mooncake plan on Dask
    differ from the local one."""
    import os
    import subprocess
    import sys

    code = ("import numpy as np; from radixkv.replay.overload import overload_metrics as m; "
            "r = np.random.default_rng(0); a = np.sort(r.uniform(0, 3600, 12031)); q = r.exponential(2.0, 12031); "
            "print(repr(m(a, q)['queue_growth_s_per_s']))")
    out = []
    for n in ("1", "2"):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=n, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
        out.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  check=True).stdout)
    assert out[0] == out[1], out
    # and it is the least-squares slope, to the last bits (an independent computation in exact rationals)
    from fractions import Fraction

    r = np.random.default_rng(0)
    a, q = np.sort(r.uniform(0, 3600, 12031)), r.exponential(2.0, 12031)
    A, Q = [Fraction(float(x)) for x in a], [Fraction(float(x)) for x in q]
    ma, mq = sum(A) / len(A), sum(Q) / len(Q)
    exact = sum((x - ma) * (y - mq) for x, y in zip(A, Q)) / sum((x - ma) ** 2 for x in A)
    assert float(out[0]) == pytest.approx(float(exact), rel=1e-9)


def test_throughput_bound_by_hand():
    """Decode bound of Llama-3.1-8B on one A100-80GB: weights 8,030,261,248 params x 2 B;
    2,039e9 B/s x 0.8 (A100-80GB SXM datasheet bandwidth, the preset's). 1,000 output tokens at
    max_num_seqs 10 -> 100 steps, each >= W / (bw * mbu)."""
    from radixkv.memory import get_gpu
    from radixkv.plan.candidates import Point
    from radixkv.plan.prune import Workload, busy_lower_bound_s, min_replicas

    bw = get_gpu("A100-80GB").hbm_bytes_per_s
    w = 8_030_261_248 * 2
    p = Point("vllm", "A100-80GB", 1, 1, 0.9, max_num_seqs=10)
    wl = Workload(prompt_tokens=0, output_tokens=1000, longest_tokens=100, span_s=1.0, requests=10,
                  hit_rate_bound=0.0)
    expect = 100 * w / (bw * 0.8)
    assert busy_lower_bound_s(p, "Llama-3.1-8B", wl, {}) == pytest.approx(expect)
    assert min_replicas(p, "Llama-3.1-8B", wl, {}) == math.ceil(expect / 1.0)


def test_toml_spec(tmp_path):
    from radixkv.plan.spec import load_spec

    (tmp_path / "t.jsonl").write_text("")
    f = tmp_path / "plan.toml"
    f.write_text('trace = "t.jsonl"\nmodel = "Mistral-7B"\n[slo]\nttft_p99 = "2s"\ntpot_p99 = "50ms"\n'
                 '[price]\nA100-80GB = 1.6\n', encoding="utf-8")
    s = load_spec(f, gpus=["A100-80GB"])
    assert s.slo == {"ttft_p99": 2.0, "tpot_p99": 0.05}
    assert s.prices == {"A100-80GB": 1.6} and s.gpus == ("A100-80GB",) and s.trace == str(tmp_path / "t.jsonl")
    f.write_text('trace = "t.jsonl"\nmodel = "Mistral-7B"\nslo = "ttft_p99=2s"\nbudgett = 3\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="budgett"):
        load_spec(f)


@pytest.mark.slow
def test_same_bytes_on_dask(small, tmp_path):
    """The plan on a Dask LocalCluster writes the bytes the local executor wrote."""
    pytest.importorskip("distributed")
    d, trace, _ = small
    out = tmp_path / "dask.json"
    assert main(["plan", str(trace), "--slo", SLO, *BASE, "--executor", "dask", "--workers", "2",
                 "--json", str(out)]) == 0
    assert out.read_bytes() == (d / "plan.json").read_bytes()


def test_requests_longer_than_the_context_are_reported_as_refused(tmp_path, capsys):
    # Mistral-7B's context is 32,768 tokens: of five prompts (1,008 ×3 and 40,000 ×2
    # tokens, 16-token units) vLLM refuses the two long ones; the plan must say so, and its
    # JSON carries the count (worked out by hand from the lengths, not read from a replay)
    lines = ['{"radixkv_trace": 1, "unit_tokens": 16}']
    base = 0
    for k, P in enumerate([1008, 40000, 1008, 40000, 1008]):
        ids = list(range(base, base + P // 16))
        base += len(ids)
        lines.append(json.dumps({"hash_ids": ids, "input_length": P, "output_length": 4, "arrival_s": float(k)}))
    trace = tmp_path / "long.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "plan.json"
    assert main(["plan", str(trace), "--model", "Mistral-7B", "--slo", "ttft_p99=60s,tpot_p99=1s",
                 "--gpus", "A100-80GB", "--tp", "1", "--budget", "6", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "REFUSED: 2 of 5 requests" in text and "the other 3 only" in text
    assert json.loads(out.read_text())["recommendation"]["rejected_requests"] == 2


def test_the_caching_verdict_is_replayed_when_the_budget_runs_out(small, tmp_path):
    """A budget the search spends before step 4 (the sensitivity) still replays the caching
    toggle at the recommendation: both settings are in the verdict. Budgets from 2 up to
    the one the small plan needs are tried; each must both run out and give a verdict."""
    d, trace, doc = small
    ran_out = 0
    for budget in range(2, doc["search"]["replayed"]):
        out = tmp_path / f"b{budget}.json"
        argv = ["plan", str(trace), "--slo", SLO, *BASE[:-1], str(budget), "--work-dir", str(d / "work"),
                "--json", str(out)]
        try:
            rc = main(argv)
        except SystemExit as e:  # a budget too small to find any feasible point
            rc = e.code
        if rc != 0:
            continue
        got = json.loads(out.read_text())
        if not got["search"]["budget_exhausted"]:
            continue
        ran_out += 1
        pc = got["prefix_caching"]
        assert pc["on"] is not None and pc["off"] is not None, (budget, pc["text"])
        assert got["search"]["replayed"] <= budget
    assert ran_out >= 1, "no budget both ran out and found a plan: the test checks nothing"
