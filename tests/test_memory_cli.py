"""``radixkv memory``: output and exit codes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cli import main

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def _run(capsys, *argv):
    rc = main(["memory", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_report(capsys):
    rc, out, _ = _run(capsys, "--model", "llama-3.1-8b", "--gpu", "A100-80GB",
                      "--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--json")
    assert rc == 0
    r = json.loads(out)
    assert r["kv_bytes_per_token_per_rank"] == 131_072
    assert r["request_kv_bytes_per_rank"] == 8192 * 131_072      # 1 GiB
    assert list(r["pools"]) == ["vllm"]                          # only the knob's engine
    v = r["pools"]["vllm"]
    assert v["memory_fraction"] == 0.9
    # fits = usable blocks // (8192 / 16 = 512 blocks per request)
    assert v["max_concurrent_requests_at_max_model_len"] == (v["num_gpu_blocks"] - 1) // 512
    assert out == json.dumps(r, sort_keys=True, indent=2) + "\n"  # sorted keys
    rc2, out2, _ = _run(capsys, "--model", "llama-3.1-8b", "--gpu", "A100-80GB",
                        "--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--json")
    assert out2 == out                                           # deterministic


def test_both_engines_and_mla_tp(capsys):
    rc, out, _ = _run(capsys, "--model", "DeepSeek-V3", "--gpu", "h200-141gb", "--tp", "8",
                      "--json")
    r = json.loads(out)
    assert rc == 0 and set(r["pools"]) == {"vllm", "sglang"}
    assert r["kv_bytes_per_token_per_rank"] == 70_272            # not split by tp
    assert r["kv_bytes_per_token_total"] == 8 * 70_272
    assert r["pools"]["sglang"]["memory_fraction"] == 0.886


def test_text_report_and_config_path(capsys):
    rc, out, _ = _run(capsys, "--model", str(CONFIGS / "qwen2.5-7b.json"), "--gpu", "L40S",
                      "--kv-cache-dtype", "fp8")
    assert rc == 0
    assert "28,672 B per rank" in out                            # 57,344 / 2
    assert "num_gpu_blocks" in out and "max_total_num_tokens" in out


@pytest.mark.parametrize("argv", [
    ["--model", "Llama-9-1T", "--gpu", "H100-80GB"],
    ["--model", "Llama-3.1-8B", "--gpu", "TPUv5"],
    ["--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--gpu-memory-utilization", "0"],
    ["--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--gpu-memory-utilization", "1.5"],
    ["--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--gpu-memory-utilization", "-0.2"],
    ["--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--gpu-memory-utilization", "nan"],
    ["--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--mem-fraction-static", "1.2"],
    ["--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--tp", "0"],
    ["--model", "Qwen2.5-7B", "--gpu", "H100-80GB", "--tp", "8"],
    ["--model", "Llama-3.1-8B", "--gpu", "H100-80GB", "--kv-cache-dtype", "fp3"],
    ["--model", "Llama-3.1-70B", "--gpu", "RTX-4090"],
])
def test_bad_input_exits_2(capsys, argv):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("radixkv: error: ")


def test_unknown_model_lists_presets(capsys):
    rc, _, err = _run(capsys, "--model", "nope", "--gpu", "H100-80GB")
    assert rc == 2 and "DeepSeek-V3" in err and "Llama-2-7B" in err


# Llama-3.1-70B on an A100-80GB at tp 2 (worked out by hand): weights 70.55e9 params x 2 B / 2
# ranks = 65.7 GiB per rank of 80 GiB. SGLang with mem_fraction_static 0.5 reserves at least
# half of what is free before loading (~40 GiB), so 80 - 65.7 - 40 < 0: no page fits. vLLM at
# its default gpu_memory_utilization 0.92 has 73.6 - 65.7 = 7.9 GiB before its estimates
# (activations, CUDA graphs, non-torch: under 4 GiB together): its pool fits.
_70B_TP2 = ("--model", "Llama-3.1-70B", "--gpu", "A100-80GB", "--tp", "2", "--kv-cache-dtype", "fp8")


def test_both_engines_shows_the_one_that_fits_and_why_the_other_does_not(capsys):
    rc, out, err = _run(capsys, *_70B_TP2, "--mem-fraction-static", "0.5", "--engine", "both", "--json")
    assert rc == 0 and err == ""
    r = json.loads(out)
    assert list(r["pools"]) == ["vllm"] and list(r["does_not_fit"]) == ["sglang"]
    why = r["does_not_fit"]["sglang"]
    assert "mem_fraction_static" in why and "SGLang would leave -" in why
    # the pool shown is the one --engine vllm alone gives; --engine sglang alone is exit 2 with the same reason
    _, vout, _ = _run(capsys, *_70B_TP2, "--engine", "vllm", "--json")
    assert r["pools"]["vllm"] == json.loads(vout)["pools"]["vllm"]
    assert r["pools"]["vllm"]["capacity_tokens"] > 0
    rc_s, _, err_s = _run(capsys, *_70B_TP2, "--mem-fraction-static", "0.5", "--engine", "sglang")
    # (the command line names the flag, --mem-fraction-static, where the JSON names the field)
    assert rc_s == 2 and why.split("': ", 1)[1] in err_s and "--mem-fraction-static" in err_s
    # the text report has both sections, in engine order
    rc_t, text, _ = _run(capsys, *_70B_TP2, "--mem-fraction-static", "0.5", "--engine", "both")
    assert rc_t == 0
    heads = [ln for ln in text.splitlines() if ln.startswith("[")]
    assert heads[0].startswith("[vllm] gpu_memory_utilization 0.92")
    assert heads[1] == f"[sglang] does not fit: {why}"


def test_the_issue_command_shows_vllms_pool(capsys):
    # issue 32: this exited 2 with only SGLang's error
    rc, out, _ = _run(capsys, *_70B_TP2, "--engine", "both", "--json")
    assert rc == 0 and json.loads(out)["pools"]["vllm"]["capacity_tokens"] > 0


def test_no_engine_fits_is_exit_2_with_both_reasons(capsys):
    # tp 1: 141 GB of bf16 weights on an 80 GiB GPU, neither engine has room
    rc, out, err = _run(capsys, "--model", "Llama-3.1-70B", "--gpu", "A100-80GB", "--engine", "both")
    assert rc == 2 and out == ""
    assert "no engine's KV pool fits" in err and "vLLM would leave" in err and "SGLang would leave" in err


def test_no_fraction_is_advised_where_the_weights_alone_do_not_fit(capsys):
    # Llama-3.1-70B in bf16: ~70.6e9 parameters x 2 B = ~141e9 B on one rank, above the
    # A100-80GB's 85.9e9 B: no gpu_memory_utilization / mem_fraction_static can help, only tp
    rc, out, err = _run(capsys, "--model", "Llama-3.1-70B", "--gpu", "A100-80GB")
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "field 'gpu_memory_utilization'" in err and "field 'mem_fraction_static'" in err
    assert err.count("the weights alone") == 2 and err.count("raise tp") == 2
    assert "raise gpu_memory_utilization" not in err and "raise mem_fraction_static" not in err


def test_no_fraction_is_advised_where_even_the_whole_gpu_is_too_little(capsys):
    # Llama-3.1-8B in bf16: ~8.03e9 x 2 B = ~16.06e9 B of weights, under the T4's 15 GiB =
    # 16.11e9 B, but with the profiling pass and workspaces beside them nothing is left at 1.0
    rc, out, err = _run(capsys, "--model", "Llama-3.1-8B", "--gpu", "T4", "--gpu-memory-utilization", "0.9")
    assert rc == 2 and out == "" and "--gpu-memory-utilization: vLLM would leave" in err
    assert "even gpu_memory_utilization = 1.0 would leave too little" in err and "raise tp" in err
    assert "raise gpu_memory_utilization" not in err


@pytest.mark.parametrize("argv, knob", [
    # (with vLLM's 2048-token A100 profiling pass 0.20 already fits; 0.19 does not)
    (("--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--gpu-memory-utilization", "0.19"), "gpu_memory_utilization"),
    (("--model", "Llama-3.1-70B", "--gpu", "A100-80GB", "--tp", "2", "--mem-fraction-static", "0.8"),
     "mem_fraction_static"),
])
def test_the_advised_fraction_is_the_least_that_fits(capsys, argv, knob):
    import re

    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and (f"field '{knob}'" in err or "--" + knob.replace("_", "-") + ":" in err)
    least = re.search(rf"raise {knob} to at least ([0-9.]+) \(or raise tp\)", err).group(1)
    step = 10.0 ** -(len(least) - 2)  # the advice's last digit
    flag = "--" + knob.replace("_", "-")
    i = argv.index(flag)
    at = lambda v: _run(capsys, *argv[:i], flag, v, *argv[i + 2:])[0]  # noqa: E731
    assert at(least) == 0  # the advice is enough ...
    assert at(f"{float(least) - step:.{len(least) - 2}f}") == 2  # ... and one step less is not
