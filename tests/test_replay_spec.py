"""radixkv.ReplaySpec and radixkv.run: one replay on one engine, the call behind the CLI's
replay and compare, checks, sweep cells and radixkv.replay's sequential mode (issue 28,
"one way to run a replay")."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import radixkv
from conftest import DATA
from radixkv.errors import ConfigError

MIXED = DATA / "golden" / "traces" / "mixed200.jsonl"
CONC = {"model": "Llama-3.1-8B", "gpu": "A100-80GB"}


def _golden(engine, name):
    return [json.loads(x)["hit_tokens"] for x in (DATA / "golden" / engine / f"{name}.jsonl").read_text().splitlines()
            if x]


def test_exported_from_radixkv():
    for name in ("ReplaySpec", "run", "PoolSpec"):
        assert name in radixkv.__all__
    assert radixkv.run.__module__ == "radixkv.replay.spec"


@pytest.mark.parametrize("policy, pool, golden", [
    ("vllm:16", {"num_gpu_blocks": 120}, ("vllm", "vllm_mixed200_b16_n120")),
    ("sglang:1", {"max_total_num_tokens": 1904}, ("sglang", "sglang_mixed200_p1_c1904")),
])
def test_sequential_run_gives_the_real_engines_hits(policy, pool, golden):
    # the goldens are the per-request hits of the real vLLM / SGLang code on this trace
    trace = radixkv.load_trace(str(MIXED))
    rec, summ = radixkv.run(radixkv.ReplaySpec(trace, radixkv.parse_policy(policy), radixkv.PoolSpec(**pool)))
    gold = _golden(*golden)
    assert rec["hit_tokens"].tolist() == gold
    assert summ["policy"] == policy and summ["hit_tokens"] == sum(gold)
    assert set(summ["timing_s"]) >= {"compile", "replay", "prompt_tokens_per_s"}


def test_limit_replays_the_head():
    trace = radixkv.load_trace(str(MIXED))
    rec, summ = radixkv.run(radixkv.ReplaySpec(trace, radixkv.parse_policy("vllm:16"),
                                               radixkv.PoolSpec(num_gpu_blocks=120), limit=50))
    assert summ["requests"] == 50 and rec["hit_tokens"].tolist() == _golden("vllm", "vllm_mixed200_b16_n120")[:50]


def test_concurrent_run_is_the_cli_replay(tmp_path):
    from radixkv.cli import main

    trace = radixkv.load_trace(str(MIXED))
    spec = radixkv.ReplaySpec(trace, radixkv.parse_policy("vllm:16"), radixkv.PoolSpec(capacity_tokens=8000),
                              mode="concurrent", knobs=CONC)
    res, summ = radixkv.run(spec)
    out = tmp_path / "c.json"
    assert main(["replay", str(MIXED), "--policy", "vllm:16", "--capacity-tokens", "8000", "--mode", "concurrent",
                 "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--quiet", "--json", str(out), "--no-timing"]) == 0
    cli = json.loads(out.read_text())["results"][0]["summary"]
    summ.pop("timing_s")
    assert summ == cli
    # a namespace is read as given (the command line's, with its pool flag): the same replay
    _, again = radixkv.run(spec.__class__(**{**spec.__dict__,
                                              "knobs": argparse.Namespace(**CONC, capacity_tokens=8000)}))
    again.pop("timing_s")
    assert again == cli
    # radixkv.replay runs it too (its cost model and scheduler config given as objects)
    api = radixkv.summarize(radixkv.replay(trace, "vllm:16", capacity_tokens=8000, mode="concurrent", **CONC))
    assert api == cli
    # without the pool flag the namespace says "sized by the memory model": the engine's
    # own step budget on an A100 (vLLM EngineArgs.get_batch_defaults: 2048 tokens)
    _, model_sized = radixkv.run(spec.__class__(**{**spec.__dict__, "knobs": argparse.Namespace(**CONC)}))
    assert model_sized["scheduler"]["max_num_batched_tokens"] == 2048
    assert cli["scheduler"]["max_num_batched_tokens"] == 8192


def test_knobs_reach_the_concurrent_replay():
    # max_num_seqs 1: one request at a time, so the running peak is 1 (default: more)
    trace = radixkv.load_trace(str(MIXED))
    base = dict(policy=radixkv.parse_policy("sglang:1"), pool=radixkv.PoolSpec(capacity_tokens=20000),
                mode="concurrent", limit=60)
    _, one = radixkv.run(radixkv.ReplaySpec(trace, knobs={**CONC, "max_num_seqs": 1, "time_scale": 0.01}, **base))
    _, many = radixkv.run(radixkv.ReplaySpec(trace, knobs={**CONC, "time_scale": 0.01}, **base))
    assert one["concurrency_peak"] == 1 and many["concurrency_peak"] > 1


@pytest.mark.parametrize("kw, field", [
    ({"mode": "batch"}, "mode"),
    ({"mode": "concurrent", "measure_last": 0.5, "knobs": CONC}, "measure_last"),
    ({"mode": "concurrent", "limit": 0, "knobs": CONC}, "limit"),
])
def test_bad_specs_are_config_errors_naming_the_field(kw, field):
    trace = radixkv.load_trace(str(MIXED))
    with pytest.raises(ConfigError) as e:
        radixkv.run(radixkv.ReplaySpec(trace, radixkv.parse_policy("vllm:16"), radixkv.PoolSpec(capacity_tokens=8000),
                                       **kw))
    assert e.value.field == field


def test_api_concurrent_with_a_context_limit_is_the_cli_replay(tmp_path):
    # requests longer than max_model_len are refused; the others keep the arrival times
    # drawn for the whole trace (the CLI's rule, radixkv.replay.context.serve_with_arrivals)
    from radixkv.cli import main

    path = Path(__file__).parents[1] / "traces" / "customer_service.jsonl"  # arrivals from 0.035 s on
    trace = radixkv.load_trace(str(path)).head(200)
    long_first = int(trace.prompt_len[0]) - 1  # the first request is refused
    out = tmp_path / "c.json"
    assert main(["replay", str(path), "--limit", "200", "--policy", "sglang:1", "--capacity-tokens", "8000",
                 "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--max-model-len", str(long_first), "--quiet",
                 "--json", str(out), "--no-timing"]) == 0
    cli = json.loads(out.read_text())["results"][0]["summary"]
    assert cli["rejected_requests"] >= 1
    api = radixkv.summarize(radixkv.replay(trace, "sglang:1", capacity_tokens=8000, mode="concurrent",
                                           max_model_len=long_first, **CONC))
    assert api == cli


def _split_hits(trace, policy, cap, n):
    """The oracle of round-robin over *n* replicas with a pool each: request i goes to
    replica i mod n, so each replica replays every n-th request alone, in order."""
    import numpy as np

    from radixkv.replay.routing import take

    total = 0
    for k in range(n):
        idx = np.arange(k, len(trace), n)
        rec, _ = radixkv.run(radixkv.ReplaySpec(take(trace, idx), radixkv.parse_policy(policy),
                                                radixkv.PoolSpec(capacity_tokens=cap)))
        total += int(rec["hit_tokens"].sum())
    return total


@pytest.mark.parametrize("policy", ["vllm:16", "sglang:1"])
def test_sequential_replicas_are_the_replicas_replayed_apart(policy):
    trace = radixkv.load_trace(str(MIXED))
    res, summ = radixkv.run(radixkv.ReplaySpec(trace, radixkv.parse_policy(policy),
                                               radixkv.PoolSpec(capacity_tokens=3000),
                                               knobs={"replicas": 2, "router": "round-robin"}))
    assert summ["hit_tokens"] == _split_hits(trace, policy, 3000, 2)
    assert summ["routing"]["n_replicas"] == 2 and summ["requests"] == len(trace)
    assert summ["policy"] == f"{policy} x2 round-robin (local)"


def test_a_sweep_cell_with_replicas_routes_them():
    # a sequential cell with replicas = 2 ran one pool before (the key was dropped silently)
    from radixkv.sweep.cell import replay_cell

    trace = radixkv.load_trace(str(MIXED))
    out = replay_cell(trace, {"policy": "vllm:16", "capacity_tokens": 3000, "replicas": 2})
    assert out["metrics"]["hit_tokens"] == _split_hits(trace, "vllm:16", 3000, 2)
    assert out["metrics"]["routing"]["n_replicas"] == 2


@pytest.mark.parametrize("kw, field", [
    ({"knobs": {"mode": "concurrent"}}, "mode"),  # the mode is said once, in the spec
    ({"knobs": {"replicas": 2}, "miss_causes": True}, "miss_causes"),  # sequential replicas: not modelled
    ({"knobs": {"replicas": 2}, "measure_last": 0.5}, "measure_last"),
    ({"knobs": {"replicas": 0}}, "replicas"),
    ({"knobs": {"router": "random"}}, "replicas"),  # a router without replicas
])
def test_bad_routing_specs_are_config_errors(kw, field):
    trace = radixkv.load_trace(str(MIXED))
    with pytest.raises(ConfigError) as e:
        radixkv.run(radixkv.ReplaySpec(trace, radixkv.parse_policy("vllm:16"), radixkv.PoolSpec(capacity_tokens=8000),
                                       **kw))
    assert e.value.field == field


def test_knob_names_are_the_replay_flags_and_a_typo_is_refused():
    # every knob a Mapping may hold is a flag destination of `radixkv replay` (the parser the
    # command line and sweep grids build from radixkv.flags)
    from radixkv.replay.settings import KNOBS
    from radixkv.sweep.grid import _replay_parser

    assert KNOBS <= {a.dest for a in _replay_parser()._actions}
    trace = radixkv.load_trace(str(MIXED))
    base = dict(trace=trace, policy=radixkv.parse_policy("vllm:16"), pool=radixkv.PoolSpec(capacity_tokens=8000),
                mode="concurrent")
    with pytest.raises(ConfigError, match="max_num_seqs") as e:
        radixkv.run(radixkv.ReplaySpec(knobs={**CONC, "max_num_seq": 4}, **base))
    assert e.value.field == "max_num_seq"
    with pytest.raises(ConfigError, match=r"ReplaySpec\(limit=") as e:
        radixkv.run(radixkv.ReplaySpec(knobs={**CONC, "limit": 4}, **base))


def test_objects_reach_the_replicas_and_the_sequential_mode_refuses_them():
    # arrival times given as an array reach the replicas' clock as they reach one engine's:
    # every request arriving at once queues more than the trace's spread-out arrivals
    import numpy as np

    path = Path(__file__).parents[1] / "traces" / "customer_service.jsonl"  # arrivals spread over ~10 min
    trace = radixkv.load_trace(str(path))
    base = dict(trace=trace, policy=radixkv.parse_policy("vllm:16"), pool=radixkv.PoolSpec(capacity_tokens=20000),
                mode="concurrent", limit=150, knobs={**CONC, "replicas": 2})
    _, spread = radixkv.run(radixkv.ReplaySpec(**base))
    _, burst = radixkv.run(radixkv.ReplaySpec(**base, arrivals=np.zeros(150)))
    assert burst["queue_mean_s"] > spread["queue_mean_s"]
    with pytest.raises(ConfigError) as e:
        radixkv.run(radixkv.ReplaySpec(**base, arrivals=np.zeros(3)))
    assert e.value.field == "arrivals"
    with pytest.raises(ConfigError) as e:
        radixkv.run(radixkv.ReplaySpec(**{**base, "mode": "sequential", "knobs": None}, arrivals=np.zeros(150)))
    assert e.value.field == "arrivals"


def test_spec_fields_are_checked_and_texts_are_read():
    spec = radixkv.ReplaySpec(str(MIXED), "vllm:16", radixkv.PoolSpec(num_gpu_blocks=120))  # a path, a spec text
    rec, _ = radixkv.run(spec)
    assert rec["hit_tokens"].tolist() == _golden("vllm", "vllm_mixed200_b16_n120")
    trace = radixkv.load_trace(str(MIXED))
    with pytest.raises(TypeError, match="pool"):
        radixkv.ReplaySpec(trace, "vllm:16", 8000)
    with pytest.raises(TypeError, match="knobs"):
        radixkv.ReplaySpec(trace, "vllm:16", radixkv.PoolSpec(capacity_tokens=8000), knobs=[("model", "x")])
    for bad in (-1, 2.5, True, "50"):
        with pytest.raises(ConfigError) as e:
            radixkv.ReplaySpec(trace, "vllm:16", radixkv.PoolSpec(capacity_tokens=8000), limit=bad)
        assert e.value.field == "limit"
    with pytest.raises(ConfigError) as e:  # a namespace's mode must agree too
        radixkv.run(radixkv.ReplaySpec(trace, "vllm:16", radixkv.PoolSpec(capacity_tokens=8000), mode="concurrent",
                                       knobs=argparse.Namespace(**CONC, mode="sequential")))
    assert e.value.field == "mode"
    with pytest.raises(ConfigError) as e:  # a misspelt kv_pool is not read as "local"
        radixkv.run(radixkv.ReplaySpec(trace, "vllm:16", radixkv.PoolSpec(capacity_tokens=8000),
                                       knobs={"replicas": 2, "kv_pool": "globl"}))
    assert e.value.field == "kv_pool"
