"""``radixkv replay | compare | curve`` end to end: outputs, determinism, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import DATA, shared_path
from radixkv.cli import main

MIXED = str(DATA / "golden" / "traces" / "mixed200.jsonl")
DEMO = str(Path(__file__).parent.parent / "traces" / "demo.jsonl")


def test_replay_json_is_byte_identical_across_runs(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        assert main(["replay", MIXED, "--policy", "vllm:16", "--num-gpu-blocks", "120",
                     "--json", str(out), "--no-timing", "--quiet"]) == 0
    assert a.read_bytes() == b.read_bytes()
    doc = json.loads(a.read_text())
    # vllm_mixed200_b16_n120 golden: the real vLLM's hits summed over the file
    golden = [json.loads(x) for x in (DATA / "golden" / "vllm" / "vllm_mixed200_b16_n120.jsonl").read_text().splitlines()]
    assert doc["results"][0]["summary"]["hit_tokens"] == sum(r["hit_tokens"] for r in golden)


def test_per_request_csv_matches_golden(tmp_path, capsys):
    out = tmp_path / "r.csv"
    assert main(["replay", MIXED, "--policy", "sglang:1", "--max-total-num-tokens", "1904",
                 "--per-request", str(out), "--quiet"]) == 0
    rows = [line.split(",") for line in out.read_text().splitlines()]
    assert rows[0][:3] == ["id", "prompt_tokens", "hit_tokens"]
    golden = [json.loads(x) for x in (DATA / "golden" / "sglang" / "sglang_mixed200_p1_c1904.jsonl").read_text().splitlines()]
    assert [(r[0], int(r[1]), int(r[2])) for r in rows[1:]] == [
        (g["id"], g["prompt_len"], g["hit_tokens"]) for g in golden
    ]


def test_compare_prints_one_column_per_policy(capsys):
    assert main(["compare", MIXED, "--policies", "vllm:16,vllm:32,sglang:1,none", "--capacity-tokens", "20000",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    header = [line for line in out.splitlines() if line.startswith("metric")][0]
    assert header.split()[1:] == ["vllm:16", "vllm:32", "sglang:1", "none:16"]  # none: vLLM block size (issue 31)


def test_curve_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["curve", MIXED, "--policies", "unit-lru,sglang:1", "--capacities", "2e3,1e5",
                 "--out", str(out), "--quiet"]) == 0
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [c["policy"] for c in doc["curves"]] == ["unit-lru", "sglang:1"]
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_trace_hits_and_evicts_under_both_engines(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["compare", DEMO, "--policies", "vllm:16,sglang:1", "--capacity-tokens", "20000", "--quiet",
                 "--json", str(out)]) == 0
    for r in json.loads(out.read_text())["results"]:
        assert r["summary"]["hit_tokens"] > 0 and r["summary"]["evicted_tokens"] > 0, r["policy"]


def test_compare_concurrent_mode(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["compare", MIXED, "--policies", "vllm:16,none:16,static:16@0.3", "--capacity-tokens", "8000",
                 "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
                 "--arrival", "poisson", "--request-rate", "50", "--quiet", "--json", str(out)]) == 0
    res = {r["policy"]: r["summary"] for r in json.loads(out.read_text())["results"]}
    assert res["none:16"]["token_hit_rate"] == 0.0
    assert res["vllm:16"]["token_hit_rate"] > 0.0
    assert "effective concurrency (peak)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["replay", MIXED, "--policy", "lfu", "--capacity-tokens", "1000"], "unknown policy 'lfu'"),
    (["replay", MIXED, "--policy", "vllm"], "give a pool size"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "10", "--num-gpu-blocks", "4"], "only one of"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "100"], "tokens more than the whole pool"),
    # 100 tokens // 16 = 6 blocks of 16 = 96 tokens: the message says how the capacity was rounded
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "100"], "tokens more than the whole pool of 96 tokens (6 slots of 16"),
    (["compare", MIXED, "--policies", "vllm:16,sglang:1,", "--capacity-tokens", "9999"], "entry 3 of 3 is empty"),
    (["compare", MIXED, "--policies", "vllm:16,,sglang:1", "--capacity-tokens", "9999"], "entry 2 of 3 is empty"),
    (["compare", MIXED, "--policies", "vllm:16,sglang,vllm", "--capacity-tokens", "9999"],
     "entry 3 ('vllm') is the same policy as entry 1 (vllm:16)"),
    (["curve", MIXED, "--policies", "sglang:1,sglang", "--capacities", "1e4"], "same policy as entry 1"),
    (["replay", MIXED, "--policy", "vllm", "--model", "Llama-3.1-8B"], "--model and --gpu go together"),
    (["replay", "/nonexistent/trace.jsonl", "--policy", "vllm", "--capacity-tokens", "1000"], "/nonexistent/trace.jsonl"),
    (["curve", MIXED, "--policies", "vllm", "--capacities", "1e4,abc"], "'abc' is not a number"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--json", MIXED], "overwrite an input file"),
    (["replay", MIXED, "--policy", "vllm", "--block-size", "0", "--capacity-tokens", "99999"], "--block-size must be ≥ 1"),
    (["replay", MIXED, "--policy", "vllm:16", "--block-size", "32", "--capacity-tokens", "99999"], "says size 16"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--model", "Llama-3.1-8B", "--gpu",
      "A100-80GB"], "would be ignored"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--gpu-memory-utilization", "0.5"],
     "explicit pool size"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--limit", "0"], "no requests to replay"),
    # the context check of a model-sized replay saw no request and said every prompt was too long
    (["replay", MIXED, "--policy", "vllm:16", "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "H100",
      "--limit", "0"], "no requests to replay"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "1e20"], "slots radixkv models"),
    # not a finite count: a message, not an OverflowError traceback
    (["curve", MIXED, "--policies", "vllm", "--capacities", "1e4,inf"], "'inf' is not a whole non-negative number"),
    # flags only the concurrent replay reads are refused in the sequential mode, not ignored
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--no-enable-prefix-caching"],
     "--no-enable-prefix-caching applies to the concurrent replay only"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--time-scale", "10"],
     "--time-scale applies to the concurrent replay only"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--static-reserved-fraction", "0.3"],
     "--static-reserved-fraction applies to the concurrent replay only"),
    # --replicas 0 was an IndexError traceback in --mode concurrent
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--mode", "concurrent", "--model",
      "Llama-3.1-8B", "--gpu", "A100-80GB", "--replicas", "0"], "--replicas must be ≥ 1, got 0"),
    (["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--replicas", "-2"],
     "--replicas must be ≥ 1, got -2"),
    (["compare", MIXED, "--policies", "vllm,sglang", "--capacity-tokens", "99999", "--max-num-seqs", "4"],
     "--max-num-seqs applies to the concurrent replay only"),
])
def test_bad_input_exits_2_with_a_message(argv, needle, capsys):
    assert main(argv + ["--quiet"]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_capacity_that_is_not_finite_is_a_usage_error(value, capsys):
    # inf raised OverflowError (a traceback); nan printed argparse's "invalid _int_tokens value"
    with pytest.raises(SystemExit) as e:
        main(["replay", MIXED, "--policy", "vllm", "--capacity-tokens", value, "--quiet"])
    assert e.value.code == 2
    assert f"argument --capacity-tokens: '{value}' is not a whole non-negative number" in capsys.readouterr().err


def test_two_outputs_on_one_path_are_refused_before_running(tmp_path, capsys):
    out = tmp_path / "same"
    out.write_text("keep me")
    assert main(["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--json", str(out),
                 "--per-request", str(out), "--quiet"]) == 2
    assert "two outputs" in capsys.readouterr().err
    assert out.read_text() == "keep me"


def test_output_into_a_directory_is_refused(tmp_path, capsys):
    assert main(["replay", MIXED, "--policy", "vllm", "--capacity-tokens", "99999", "--json", str(tmp_path),
                 "--quiet"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_weka_block64_equals_radix_page64_without_eviction():
    """With nothing evicted, vLLM at block 64 and SGLang at page 64 hit the same tokens.

    Why: both cap the lookup so the last prompt token is recomputed ((P−1)//64 blocks vs
    a key of P−1 tokens rounded down to 64), both round to whole 64-token units, and both
    cache the same content — every full 64-token block/page of prompt and output (vLLM
    hashes full blocks as they fill; SGLang inserts page-aligned prompt + outputs). With
    no eviction, what is cached is everything seen so far in both, so the longest cached
    page-aligned prefix is the same (docs/SEMANTICS.md, "Consequences worth testing").
    """
    from radixkv.policies.registry import PoolSpec, parse_policy
    from radixkv.replay.run import run_replay
    from radixkv.trace.load import load_trace

    trace = load_trace(shared_path("traces", "weka-claude-code", "traces"))
    pool = PoolSpec(capacity_tokens=60_000_000)
    rv, sv = run_replay(trace, parse_policy("vllm:64"), pool)
    rs, ss = run_replay(trace, parse_policy("sglang:64"), pool)
    assert sv["evicted_tokens"] == 0 and ss["evicted_tokens"] == 0
    assert list(rv["hit_tokens"]) == list(rs["hit_tokens"])


def test_lengths_only_trace_warns_that_every_hit_is_zero(tmp_path, capsys):
    # an Azure-format trace gives lengths only: no two prompts can be shown to share a prefix
    az = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,374,44\n")
    assert main(["replay", str(az), "--policy", "vllm:16", "--capacity-tokens", "9999", "--quiet",
                 "--json", "-"]) == 0
    cap = capsys.readouterr()
    assert "lengths only" in cap.err and "0 by construction" in cap.err
    assert json.loads(cap.out)["results"][0]["summary"]["hit_tokens"] == 0


def test_trace_with_ids_does_not_warn(capsys):
    assert main(["replay", MIXED, "--policy", "vllm:16", "--capacity-tokens", "9999", "--quiet"]) == 0
    assert "lengths only" not in capsys.readouterr().err


def test_policy_help_lists_every_builtin_policy(capsys):
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("vllm", "sglang", "unit-lru", "none", "static", "sglang-hicache"):
        assert f" {name} |" in text or f"| {name}," in text, name


def test_miss_causes_are_refused_on_a_lengths_only_trace(tmp_path, capsys):
    az = tmp_path / "AzureLLMInferenceTrace_code.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    assert main(["replay", str(az), "--policy", "sglang:1", "--capacity-tokens", "9999", "--miss-causes",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(az) in err and "lengths only" in err and "miss_causes" in err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_output_is_written(tmp_path, capsys):
    # os.access says /proc is writable for root; creating a file there fails. The --json
    # file must not be left behind by a run refused for its --per-request path.
    demo = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
    out = tmp_path / "out.json"
    rc = main(["replay", demo, "--policy", "vllm:16", "--capacity-tokens", "100000", "--json", str(out),
               "--per-request", "/proc/radixkv-x.csv"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "/proc/radixkv-x.csv" in err and "not writable" in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir()]  # no probe file left either


@pytest.mark.parametrize("argv, flag", [
    (["replay", "POLICY=vllm:16", "--page-size", "4"], "--page-size"),
    (["replay", "POLICY=sglang:1", "--block-size", "32"], "--block-size"),
    (["compare", "POLICIES=sglang:1,sglang:16", "--block-size", "32"], "--block-size"),
])
def test_a_size_flag_no_given_policy_has_is_refused_not_ignored(argv, flag, capsys):
    demo = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
    verb, pol = argv[0], argv[1].split("=", 1)
    args = [verb, demo, "--policy" if pol[0] == "POLICY" else "--policies", pol[1], *argv[2:],
            "--capacity-tokens", "20000"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"field '{flag[2:].replace('-', '_')}'" not in err and f"drop {flag}" in err


def test_block_and_page_size_flags_each_reach_their_own_policy_in_compare(tmp_path):
    # --block-size 32 reaches vllm, --page-size 16 reaches sglang: labels say so
    demo = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
    out = tmp_path / "c.json"
    assert main(["compare", demo, "--policies", "vllm,sglang", "--block-size", "32", "--page-size", "16",
                 "--capacity-tokens", "20000", "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert "vllm:32" in json.dumps(doc) and "sglang:16" in json.dumps(doc)


def test_per_request_csv_writes_unmeasured_values_as_empty_cells(tmp_path, capsys):
    # The sequential replay samples the costly pool statistics on some rows only (the last
    # request always), and SGLang's tree has no contiguous-run model: such cells are n/a
    # (empty), never a number like -1 or 0. vLLM's sampled statistic is cached_tokens
    # (reachable keys), SGLang's duplicate_tokens.
    sampled = {"vllm:16": "cached_tokens", "sglang:1": "duplicate_tokens"}
    for pol, col in sampled.items():
        path = tmp_path / f"{pol.replace(':', '_')}.csv"
        assert main(["replay", MIXED, "--policy", pol, "--capacity-tokens", "20000",
                     "--per-request", str(path), "--quiet"]) == 0
        head, *lines = path.read_text().splitlines()
        rows = [dict(zip(head.split(","), line.split(","))) for line in lines]
        assert len(rows) == 200
        assert all(not c.startswith("-") for r in rows for c in r.values()), pol
        filled = [r[col] != "" for r in rows]
        assert filled[-1] and 0 < sum(filled) < len(rows) // 2, pol
        if pol == "sglang:1":
            assert {r["largest_free_run"] for r in rows} == {""}
        else:
            assert [r["largest_free_run"] != "" for r in rows] == filled


def test_an_overloaded_concurrent_replay_says_so(capsys):
    # the demo's 300 requests compressed 100× into about 3 s cannot be served by one A100:
    # the queue grows (radixkv.replay.overload, by-hand tests in test_plan.py); at the
    # recorded rate it drains, and nothing is said
    demo = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
    base = ["replay", demo, "--policy", "vllm:16", "--mode", "concurrent", "--model", "Llama-3.1-8B",
            "--gpu", "A100-80GB", "--quiet"]
    assert main([*base, "--time-scale", "0.01"]) == 0
    err = capsys.readouterr().err
    assert "vllm:16: overloaded" in err and "queueing time" in err
    assert main(base) == 0
    assert "overloaded" not in capsys.readouterr().err


def test_replay_sizes_an_sglang_pool_by_sglangs_rule_with_per_engine_rule(tmp_path, capsys):
    # without the flag every policy's pool comes from vLLM's rule; with it, sglang:1 gets the
    # max_total_num_tokens that `radixkv memory --engine sglang` reports for the same GPU
    demo = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
    base = ["replay", demo, "--policy", "sglang:1", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--quiet"]
    assert main(["memory", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--engine", "sglang", "--json",
                 str(tmp_path / "m.json")]) == 0
    want = json.loads((tmp_path / "m.json").read_text())["pools"]["sglang"]["max_total_num_tokens"]
    assert main([*base, "--per-engine-rule", "--json", str(tmp_path / "r.json")]) == 0
    pool = json.loads((tmp_path / "r.json").read_text())["results"][0]["pool"]
    assert pool["engine_rule"] == "sglang" and pool["max_total_num_tokens"] == want
    assert main([*base, "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["results"][0]["pool"]["engine_rule"] == "vllm"
    capsys.readouterr()
    # SGLang's knob without the flag is refused, and the message now says how to use it
    assert main([*base, "--mem-fraction-static", "0.7"]) == 2
    assert "--per-engine-rule" in capsys.readouterr().err


def test_priority_scheduling_without_distinct_priorities_says_so(tmp_path, capsys):
    # the demo gives no priority column: priority scheduling is FCFS there and says so; a
    # trace with two priorities is not warned about
    demo = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
    base = ["--policy", "vllm:16", "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
            "--scheduling-policy", "priority", "--quiet"]
    assert main(["replay", demo, *base]) == 0
    assert "gives no priority: priority scheduling orders it as FCFS" in capsys.readouterr().err
    t = tmp_path / "p.jsonl"
    t.write_text("".join(json.dumps({"tokens": [k, k + 1, k + 2], "output_length": 2, "arrival_s": 0.0,
                                     "priority": k % 2}) + "\n" for k in range(4)))
    assert main(["replay", str(t), *base]) == 0
    assert "priority scheduling orders" not in capsys.readouterr().err
    t.write_text("".join(json.dumps({"tokens": [k, k + 1, k + 2], "output_length": 2, "arrival_s": 0.0,
                                     "priority": 3}) + "\n" for k in range(4)))
    assert main(["replay", str(t), *base]) == 0
    assert "gives every request the same priority" in capsys.readouterr().err


def test_compare_runs_each_engines_priority_scheduler_on_its_own_policies(tmp_path, capsys):
    """``compare --policies vllm:16,sglang:1 --scheduling-policy priority
    --enable-priority-scheduling``: each engine's flag reaches its own policies (the trial found
    each flag refused for the other engine's policy). The oracle: each policy replayed alone
    with only its engine's flag; every summary key must agree."""
    import random

    rng = random.Random(7)
    lines = ['{"radixkv_trace": 1, "unit_tokens": 1, "partial_last_unit": false}']
    shared = [rng.randrange(1, 30000) for _ in range(300)]
    for i in range(40):  # a burst at t=0 with mixed priorities: the order matters
        toks = shared[: rng.randrange(50, 300)] + [rng.randrange(1, 30000) for _ in range(rng.randrange(200, 900))]
        lines.append(json.dumps({"id": f"r{i}", "tokens": toks, "output_length": rng.randrange(5, 60),
                                 "arrival_s": 0.0, "priority": rng.randrange(0, 4)}))
    trace = tmp_path / "prio.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    base = ["--capacity-tokens", "6000", "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
            "--quiet", "--no-timing", "--max-num-seqs", "8"]
    vflag, sflag = ["--scheduling-policy", "priority"], ["--enable-priority-scheduling", "--disable-priority-preemption"]

    def summaries(verb_args, name):
        out = tmp_path / f"{name}.json"
        assert main([*verb_args, *base, "--json", str(out)]) == 0, capsys.readouterr().err
        return {r["policy"]: r["summary"] for r in json.loads(out.read_text())["results"]}

    both = summaries(["compare", str(trace), "--policies", "vllm:16,sglang:1", *vflag, *sflag], "both")
    alone_v = summaries(["replay", str(trace), "--policy", "vllm:16", *vflag], "v")["vllm:16"]
    alone_s = summaries(["replay", str(trace), "--policy", "sglang:1", *sflag], "s")["sglang:1"]
    fcfs_v = summaries(["replay", str(trace), "--policy", "vllm:16"], "f")["vllm:16"]
    assert both["vllm:16"] == alone_v and both["sglang:1"] == alone_s
    assert alone_v != fcfs_v  # the priority order did act on this trace (else the test shows nothing)
    # a flag no compared policy reads is still refused
    assert main(["compare", str(trace), "--policies", "vllm:16,vllm:32", *sflag, *base]) == 2
    assert "--enable-priority-scheduling is SGLang's" in capsys.readouterr().err
