"""``radixkv plan`` fixes from a fresh-user trial: vLLM's start-up check on max_model_len
(the plan sets ``--max-model-len`` where vLLM would refuse to start; ``radixkv memory``
says so), the prefix-caching verdict following its comparison, the least budget, and the
wording of bad inputs and undefined values. Expected values are worked out by hand.
"""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from radixkv.cli import main


# --- vLLM refuses to start when the pool cannot hold one max_model_len request ------------

def _pool(num_gpu_blocks, block_size=16):
    return SimpleNamespace(num_gpu_blocks=num_gpu_blocks, unit_tokens=block_size)


def test_start_rule_by_hand():
    # the rule lives beside the pool sizing and is public there (radixkv memory and
    # radixkv plan both take it from the memory package)
    from radixkv.memory import vllm_start_max_model_len as f
    from radixkv.memory import __all__ as memory_public
    from radixkv.memory.pool import vllm_start_max_model_len as g

    assert f is g and "vllm_start_max_model_len" in memory_public
    assert f.__module__ == "radixkv.memory.pool"

    # check_enough_kv_cache_memory: cdiv(L, 16) blocks must fit in num_gpu_blocks (null
    # block counted). 1,788 blocks hold L ≤ 28,608 tokens; the 131,072-token context needs
    # 8,192 blocks, so vLLM refuses and the largest length that starts is 28,608
    assert f(_pool(1788), 131072) == 28608
    assert f(_pool(8192), 131072) is None          # 8,192 × 16 = 131,072: starts
    assert f(_pool(8191), 131072) == 131056        # one block short
    assert f(_pool(100, 32), 3201) == 3200         # block_size 32: 100 × 32 = 3,200 < 3,201
    assert f(_pool(None), 131072) is None          # an SGLang pool: SGLang starts
    assert f(_pool(1788), 131072, hybrid=True) is None  # sliding/linear layers: not modelled


def test_plan_point_gets_max_model_len_where_vllm_would_refuse():
    from radixkv.plan.candidates import base_point, engine_command, pool_of, replay_argv, replay_settings

    p = base_point("vllm", "H100-80GB", 2)
    pool = pool_of(p, "Llama-3.1-70B")
    # KV bytes per token per rank: 80 layers × (8 KV heads / 2 ranks) × 128 × 2 (K, V) × 2 B
    per_block = 16 * 80 * 4 * 128 * 2 * 2
    assert per_block == 2_621_440
    s = replay_settings(p, "Llama-3.1-70B", pool, 20.0, {})
    m = s["max_model_len"]
    # vLLM's rule against the pool's byte budget: m tokens fit, m + 1 do not, m < 131,072
    assert math.ceil(m / 16) * per_block <= pool.budget_bytes < math.ceil((m + 1) / 16) * per_block
    assert m == 28608 and m < 131072
    cmd = engine_command(p, "Llama-3.1-70B", m)
    assert "--max-model-len 28608" in cmd
    argv = replay_argv("t.jsonl", s)
    assert argv[argv.index("--max-model-len") + 1] == "28608"
    # an 8B model on an A100-80GB holds far more than its 131,072-token context: unchanged
    q = base_point("vllm", "A100-80GB", 1)
    s8 = replay_settings(q, "Llama-3.1-8B", pool_of(q, "Llama-3.1-8B"), 1.0, {})
    assert "max_model_len" not in s8
    assert "--max-model-len" not in engine_command(q, "Llama-3.1-8B")


def test_memory_says_vllm_refuses_to_start(capsys):
    assert main(["memory", "--model", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "2", "--engine", "vllm",
                 "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["pools"]["vllm"]["max_model_len_to_start"] == 28608
    assert main(["memory", "--model", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "2", "--engine", "vllm"]) == 0
    text = capsys.readouterr().out
    assert "vLLM refuses to start with max_model_len 131,072" in text and "--max-model-len 28608 starts" in text
    # --max-model-len 28,608 starts: no such line, no key
    assert main(["memory", "--model", "Llama-3.1-70B", "--gpu", "H100-80GB", "--tp", "2", "--engine", "vllm",
                 "--max-model-len", "28608", "--json", "-"]) == 0
    assert "max_model_len_to_start" not in json.loads(capsys.readouterr().out)["pools"]["vllm"]


# --- the prefix-caching verdict follows the comparison -------------------------------------

def _outcome(caching, ttft, tpot, hit, slo):
    from radixkv.plan.candidates import Point
    from radixkv.plan.evaluate import Outcome

    m = {"ttft_p99_s": ttft, "tpot_p99_s": tpot, "token_hit_rate": hit, "ttft_p50_s": ttft, "tpot_p50_s": tpot}
    return Outcome(Point("vllm", "A100-80GB", 1, 1, 0.92, prefix_caching=caching), 1.0, settings={}, metrics=m,
                   slo=slo)


def _verdict(on, off, best_on=True, cost_model="roofline"):
    from radixkv.plan.report import caching_verdict

    slo = {"ttft_p99": 2.0, "tpot_p99": 0.05}
    a, b = _outcome(True, *on, slo), _outcome(False, *off, slo)
    best, flip = (a, b) if best_on else (b, a)
    res = SimpleNamespace(best=best, sensitivity=[("prefix_caching", flip)], budget_exhausted=False,
                          spec=SimpleNamespace(slo=slo, cost_model=cost_model))
    return caching_verdict(res)


def test_verdict_within_the_clock_error_is_either():
    # the trial's case: TPOT 5.8 ms on vs 5.5 ms off (5 % apart, the roofline's TPOT error is
    # 52 %), TTFT 12.7 vs 12.1 ms (5 %, error 27 %): both meet, neither is ahead
    d = _verdict((0.0127, 0.0058, 0.3), (0.0121, 0.0055, 0.0))
    assert d["verdict"] == "either"
    assert d["text"].startswith("prefix caching: either setting") and "equivalent" in d["text"]
    assert "keeps more margin" not in d["text"]


def test_verdict_within_the_clock_error_with_prefill_saved_is_on():
    # the same latencies as above, but the replay says caching saved prefill work
    # (Mooncake's plan: TTFT p99 2.50 s on vs 2.62 s off, 6.06e17 FLOPs saved): on
    from radixkv.plan.report import caching_verdict

    slo = {"ttft_p99": 2.0, "tpot_p99": 0.05}
    a, b = _outcome(True, 0.0127, 0.0058, 0.3, slo), _outcome(False, 0.0121, 0.0055, 0.0, slo)
    a.metrics["prefill_flops_saved"] = 6.06e17
    d = caching_verdict(SimpleNamespace(best=a, sensitivity=[("prefix_caching", b)], budget_exhausted=False,
                                        spec=SimpleNamespace(slo=slo, cost_model="roofline")))
    assert d["verdict"] == "on" and d["text"].startswith("prefix caching: turn it ON")
    assert "agree within the clock's measured error" in d["text"] and "fewer prefill FLOPs" in d["text"]


def test_verdict_zero_hit_rate_buys_nothing():
    # one request: identical results, 0 % hits
    d = _verdict((0.010, 0.005, 0.0), (0.010, 0.005, 0.0))
    assert d["verdict"] == "either" and "0 % hit rate: caching buys nothing here" in d["text"]
    assert "turn it ON" not in d["text"]


def test_verdict_on_ahead_beyond_the_error():
    # TTFT 1.0 s on vs 1.6 s off: 0.6 > 0.27 × 1.6 = 0.432; TPOT equal
    d = _verdict((1.0, 0.01, 0.5), (1.6, 0.01, 0.0))
    assert d["verdict"] == "on" and "turn it ON" in d["text"] and "on keeps more margin on ttft_p99" in d["text"]


def test_verdict_off_ahead_says_the_command_has_it_on():
    # TPOT 40 ms on vs 10 ms off: 30 > 0.52 × 40 = 20.8 ms; TTFT within 27 %
    d = _verdict((1.0, 0.040, 0.2), (1.1, 0.010, 0.0))
    assert d["verdict"] == "off" and "turn it OFF" in d["text"]
    assert "off keeps more margin on tpot_p99" in d["text"] and "the command above has it on" in d["text"]


def test_verdict_mixed_is_either():
    # on ahead on TTFT (1.0 vs 1.5 s: 0.5 > 0.405), off ahead on TPOT (40 vs 10 ms)
    d = _verdict((1.0, 0.040, 0.2), (1.5, 0.010, 0.0))
    assert d["verdict"] == "either" and "on is ahead on ttft_p99, off on tpot_p99" in d["text"]


def test_verdict_one_misses():
    d = _verdict((1.0, 0.01, 0.5), (2.5, 0.01, 0.0))  # off's TTFT 2.5 s > 2 s
    assert d["verdict"] == "on" and "off misses the SLO" in d["text"]
    d = _verdict((2.5, 0.01, 0.5), (1.0, 0.01, 0.0), best_on=False)
    assert d["verdict"] == "off" and "on misses the SLO" in d["text"]
    assert "the command above" not in d["text"]


def test_verdict_fitted_error_is_tighter_on_tpot():
    # TPOT 40 vs 22 ms: 18 ms apart, within the roofline's 52 % (20.8 ms), beyond fitted's 40 % (16 ms)
    assert _verdict((1.0, 0.040, 0.2), (1.0, 0.022, 0.0))["verdict"] == "either"
    assert _verdict((1.0, 0.040, 0.2), (1.0, 0.022, 0.0), cost_model="fitted")["verdict"] == "off"


# --- inputs ---------------------------------------------------------------------------------

def _trace(tmp_path, outputs=(4,), arrivals=None):
    lines = ['{"radixkv_trace": 1, "unit_tokens": 16}']
    for k, n in enumerate(outputs):
        ids = list(range(k * 8, k * 8 + 8))
        a = float(k) if arrivals is None else arrivals[k]
        lines.append(json.dumps({"hash_ids": ids, "input_length": 128, "output_length": n, "arrival_s": a}))
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("argv, needle", [
    (["--tp", "0"], "--tp must be whole numbers ≥ 1, got 0"),
    (["--tp", "two"], "--tp must be whole numbers ≥ 1"),
    (["--gpus", "H200-999GB"], "--gpus: unknown GPU 'H200-999GB'"),
    (["--budget", "1"], "--budget must be ≥ 2 replays"),
    (["--slo", "ttft_p99=-1s"], "ttft_p99 must be > 0, got '-1s'"),
])
def test_bad_flags_name_the_flag(tmp_path, capsys, argv, needle):
    t = _trace(tmp_path)
    slo = [] if "--slo" in argv else ["--slo", "ttft_p99=1s"]
    assert main(["plan", str(t), "--model", "Llama-3.1-8B", *slo, *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert "--model" not in err and "field 'gpu'" not in err


@pytest.mark.parametrize("line, key", [("budget = 2.7", "budget"), ('budget = "3"', "budget"),
                                       ("max_replicas = 1.5", "max_replicas"), ('tps = ["1"]', "tps")])
def test_toml_whole_numbers_only(tmp_path, line, key):
    from radixkv.errors import ConfigError
    from radixkv.plan.spec import load_spec

    t = _trace(tmp_path)
    spec = tmp_path / "p.toml"
    spec.write_text(f'trace = "{t.name}"\nmodel = "Llama-3.1-8B"\nslo = "ttft_p99=1s"\n{line}\n')
    with pytest.raises(ConfigError) as e:
        load_spec(spec)
    assert e.value.field == key and "whole number" in str(e.value)


def test_zero_span_and_no_decode(tmp_path, capsys):
    # one request with one output token: the span is 0 (no offered rate) and no request
    # decodes a second token, so TPOT has no value and a TPOT term cannot be met
    t = _trace(tmp_path, outputs=(1,))
    rc = main(["plan", str(t), "--model", "Llama-3.1-8B", "--gpus", "A100-80GB", "--tp", "1",
               "--slo", "ttft_p99=2s,tpot_p99=50ms", "--budget", "2", "--work-dir", str(tmp_path / "w")])
    cap = capsys.readouterr()
    assert rc != 0
    assert "no request decodes past its first output token" in cap.err and "(undefined > " not in cap.err
    assert main(["plan", str(t), "--model", "Llama-3.1-8B", "--gpus", "A100-80GB", "--tp", "1",
                 "--slo", "ttft_p99=2s", "--budget", "2", "--work-dir", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert "(n/a tokens/s offered)" in out and "nan" not in out
    # identical on/off at 0 % hits: either setting
    assert "prefix caching: either setting" in out and "caching buys nothing here" in out
