"""Requests longer than the model's context (issue 31): refused as vLLM refuses them at
input processing (P ≥ max_model_len), aborted as SGLang aborts them (P ≥ context_len − 6),
never served; outputs capped to the context; counted as ``rejected_requests``. Without a
model or --max-model-len nothing changes.

The trace is worked by hand with max_model_len L = 64 (vLLM serves P ≤ 63, caps P + N at
64; SGLang serves P ≤ 58, caps N at L − P − 2):

====  =======================================  ====  ==========================  =========================
id    prompt tokens                            P     vLLM:16                     SGLang:1
====  =======================================  ====  ==========================  =========================
a     1..32                                    32    hit 0                       hit 0
x     1..16, 100..163                          80    refused                     refused
d     1..16, 400..443                          60    hit 16 (a's first block)    refused (60 > 58)
c     1..16, 100..131, 200..207  (N = 20)      56    hit 16 (48 if x served),    hit 16 (48 if x served),
                                                     N capped to 64 − 56 = 8     N capped to 64 − 56 − 2 = 6
f     1..16, 400..431, 500                     49    hit 48 (d's 3 blocks)       hit 16 (d refused)
====  =======================================  ====  ==========================  =========================
"""
from __future__ import annotations

import json

import pytest

from radixkv import replay, summarize
from radixkv.cli import main

R = lambda a, b: list(range(a, b + 1))  # noqa: E731
REQS = [("a", R(1, 32), 2), ("x", R(1, 16) + R(100, 163), 2), ("d", R(1, 16) + R(400, 443), 2),
        ("c", R(1, 16) + R(100, 131) + R(200, 207), 20), ("f", R(1, 16) + R(400, 431) + [500], 2)]
HITS = {"vllm:16": {"a": 0, "d": 16, "c": 16, "f": 48}, "sglang:1": {"a": 0, "c": 16, "f": 16}}
REJECTED = {"vllm:16": 1, "sglang:1": 2}
C_OUTPUT = {"vllm:16": 8, "sglang:1": 6}


@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "t.jsonl"
    # arrivals 100 s apart: each request finishes before the next arrives (concurrent mode)
    p.write_text("".join(json.dumps({"id": i, "tokens": t, "output_length": n, "arrival_s": 100.0 * k}) + "\n"
                         for k, (i, t, n) in enumerate(REQS)))
    return p


@pytest.mark.parametrize("policy", ["vllm:16", "sglang:1"])
def test_sequential_replay_refuses_requests_past_the_context(trace_file, policy):
    rec = replay(str(trace_file), policy, capacity_tokens=4096, max_model_len=64)
    got = dict(zip(map(str, rec.req_id), map(int, rec["hit_tokens"])))
    assert got == HITS[policy]
    s = summarize(rec)
    assert s["rejected_requests"] == REJECTED[policy]
    assert s["requests"] == 5 - REJECTED[policy]


@pytest.mark.parametrize("policy", ["vllm:16", "sglang:1"])
def test_concurrent_cli_refuses_them_and_caps_outputs(trace_file, policy, capsys):
    out = trace_file.parent / "s.json"
    pr = trace_file.parent / "r.csv"
    rc = main(["replay", str(trace_file), "--policy", policy, "--mode", "concurrent", "--model", "Llama-2-7B",
               "--gpu", "H100", "--capacity-tokens", "4096", "--max-model-len", "64", "--json", str(out),
               "--per-request", str(pr), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads(out.read_text())["results"][0]["summary"]
    assert s["rejected_requests"] == REJECTED[policy]
    rows = [line.split(",") for line in pr.read_text().splitlines()]
    col = {name: i for i, name in enumerate(rows[0])}
    got = {r[0]: int(r[col["hit_tokens"]]) for r in rows[1:]}
    assert got == HITS[policy]
    outs = {r[0]: int(r[col["output_tokens"]]) for r in rows[1:]}
    assert outs == {"a": 2, "d": 2, "c": C_OUTPUT[policy], "f": 2} if policy == "vllm:16" else \
        {"a": 2, "c": C_OUTPUT[policy], "f": 2}


def test_the_model_preset_gives_the_context(tmp_path, capsys):
    # the bug hunt's case: a 5,000-token prompt with Llama-2-7B (context 4,096) was served with hits
    p = tmp_path / "t.jsonl"
    long = R(1, 5000)
    p.write_text(json.dumps({"id": "long", "tokens": long, "output_length": 1, "arrival_s": 0}) + "\n"
                 + json.dumps({"id": "again", "tokens": long, "output_length": 1, "arrival_s": 100}) + "\n"
                 + json.dumps({"id": "short", "tokens": R(1, 100), "output_length": 1, "arrival_s": 200}) + "\n")
    rc = main(["replay", str(p), "--policy", "vllm:16", "--mode", "concurrent", "--model", "Llama-2-7B", "--gpu",
               "H100", "--capacity-tokens", "20000", "--json", str(tmp_path / "s.json"), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads((tmp_path / "s.json").read_text())["results"][0]["summary"]
    assert s["rejected_requests"] == 2 and s["requests"] == 1 and s["hit_tokens"] == 0


def test_no_model_changes_nothing(trace_file):
    a = summarize(replay(str(trace_file), "vllm:16", capacity_tokens=4096))
    assert "rejected_requests" not in a
    assert a["requests"] == 5 and a["hit_tokens"] == 0 + 16 + 16 + 48 + 48  # x hit 16; c hits x's 3 blocks


def test_every_request_refused_is_a_named_error(trace_file):
    from radixkv.errors import ConfigError

    with pytest.raises(ConfigError, match="max_model_len"):
        replay(str(trace_file), "vllm:16", capacity_tokens=4096, max_model_len=20)


def test_replicas_refuse_them_before_routing(trace_file, capsys):
    out = trace_file.parent / "s.json"
    rc = main(["replay", str(trace_file), "--policy", "vllm:16", "--mode", "concurrent", "--model", "Llama-2-7B",
               "--gpu", "H100", "--capacity-tokens", "4096", "--max-model-len", "64", "--replicas", "2",
               "--json", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads(out.read_text())["results"][0]["summary"]
    assert s["rejected_requests"] == 1 and s["requests"] == 4


@pytest.mark.parametrize("mode", ["sequential", "concurrent"])
def test_explain_counts_rows_after_the_refused_request(trace_file, capsys, mode):
    # f is row 3 once x is refused; its hit (48, by hand) comes from d's 3 blocks
    base = ["replay", str(trace_file), "--policy", "vllm:16", "--capacity-tokens", "4096", "--max-model-len", "64",
            "--mode", mode, "--quiet"] + (["--model", "Llama-2-7B", "--gpu", "H100"] if mode == "concurrent" else [])
    rc = main(base + ["--explain", "f", "--json", "-"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["explain"]["request"] == "f" and doc["explain"]["hit_tokens"] == 48
    rc = main(base + ["--explain", "x"])
    assert rc == 2 and "request 'x' is not served" in capsys.readouterr().err


def test_sequential_replicas_refuse_them_too(trace_file, capsys):
    out = trace_file.parent / "s.json"
    rc = main(["replay", str(trace_file), "--policy", "sglang:1", "--capacity-tokens", "4096", "--max-model-len", "64",
               "--replicas", "2", "--json", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads(out.read_text())["results"][0]["summary"]
    assert s["rejected_requests"] == 2 and s["requests"] == 3
