"""The step-time models of radixkv.clock: the measured-error computation on a hand-built
profile, the calibrated model's step time worked out by hand, the compiled loops against
the Python loop and a hand computation, the CLI's --cost-model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from radixkv.clock import error as E
from radixkv.clock.calibrated import CalibratedCostModel, cost_model, from_file
from radixkv.clock.vidur import read_vidur
from radixkv.cost import CostModel
from radixkv.errors import ConfigError, InputError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.replay import conc_sglang, conc_vllm_fast
from radixkv.replay.concurrent import replay_concurrent
from radixkv.replay.scheduler import SchedulerConfig
from radixkv.util import dumps_json

from _conc_cases import request_trace

DATA = Path(__file__).parent / "data" / "clock" / "vidur"


# ------------------------------------------------------------------ (1) the error computation
def test_measured_time_of_a_hand_built_profile():
    """tests/data/clock/vidur: Llama-2-7B (32 layers) on a100. TP 1, n = 1: three rows
    whose layer sums are 0.51, 0.71 and 0.55 ms (each 0.01 + pre_proj + 0.01 + 0.05 +
    0.01 + 0.2 + 0.02 + 0.1 + 2 × 0.005 with pre_proj 0.1, 0.3, 0.14) → median 0.55 ms,
    embeddings 0.2, 0.2, 0.6 → median 0.2 ms once → 32 × 0.55 + 0.2 = 17.8 ms. TP 2,
    n = 1024: layer 0.4 ms; the all-reduce of 1024 × 4096 × 2 = 8 MiB lies a third of the
    way from 4 MiB (0.1 ms) to 16 MiB (0.4 ms): 0.2 ms, two per layer; embedding 0.1 ms →
    32 × (0.4 + 0.4) + 0.1 = 25.7 ms."""
    profs, ar = read_vidur(DATA)
    cases, skipped = E.build_cases(profs, ar)
    assert skipped == []
    by = {c.prof.tp: c for c in cases}
    assert list(by[1].tokens) == [1] and list(by[2].tokens) == [1024]
    assert by[1].meas_s[0] == pytest.approx(17.8e-3, rel=1e-12)
    assert by[2].comm_s[0] == pytest.approx(0.4e-3, rel=1e-12)
    assert by[2].meas_s[0] == pytest.approx(25.7e-3, rel=1e-12)


def test_roofline_error_of_a_hand_built_profile():
    """The CostModel roofline (MFU 0.6, MBU 0.8) on the TP-1 point: one layer's linear
    weights 4096 × (4096 + 2 × 32 × 128) + 4096² + 3 × 4096 × 11008 = 202,375,168; at one
    token the weight read wins: 2 bytes × that / (2.039e12 × 0.8) per layer, × 32 layers
    = 7.9404 ms against 17.8 ms measured: −55.39 %."""
    profs, ar = read_vidur(DATA)
    case = [c for c in E.build_cases(profs, ar)[0] if c.prof.tp == 1][0]
    assert case.prof.shape.linear_params() == 202_375_168
    pred = E.predict_roofline(case, 0.6, 0.8)
    want = 32 * 2 * 202_375_168 / (2.039e12 * 0.8)
    assert pred[0] == pytest.approx(want, rel=1e-12)
    st = E.error_stats(pred, case.meas_s)
    assert st["n"] == 1 and st["signed_median"] == pytest.approx(want / 17.8e-3 - 1, rel=1e-9)
    assert st["signed_median"] == pytest.approx(-0.5539, abs=1e-4)


def test_error_stats_by_hand():
    """Errors +0.1, −0.2, 0, +0.5: |e| sorted 0, .1, .2, .5; median .15; p90 at rank 2.7
    (linear) = .2 + .7 × .3 = .41; worst +.5; signed median .05."""
    st = E.error_stats([1.1, 0.8, 1.0, 1.5], [1.0, 1.0, 1.0, 1.0])
    assert st["median"] == pytest.approx(0.15)
    assert st["p90"] == pytest.approx(0.41)
    assert st["worst"] == pytest.approx(0.5)
    assert st["signed_median"] == pytest.approx(0.05)
    assert E.error_stats([], [])["median"] is None


def test_bad_profile_names_file_line_and_column(tmp_path):
    d = tmp_path / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf"
    d.mkdir(parents=True)
    src = (DATA / "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv").read_text().splitlines()
    src[2] = src[2].replace(",0.3,", ",x,", 1)
    (d / "mlp.csv").write_text("\n".join(src) + "\n")
    with pytest.raises(InputError) as ei:
        read_vidur(tmp_path)
    msg = str(ei.value)
    assert "mlp.csv" in msg and "line 3" in msg and "attn_pre_proj" in msg


# ------------------------------------------------------------------ (2) the calibrated model
def _model(**kw):
    base = dict(kind="fitted", params=1e9, num_layers=2, attn_dim=10, kv_bytes_per_token=4.0, peak_flops=1e6,
                hbm_bytes_per_s=1e4, tp=1, table_tokens=(1, 100, 1000), table_seconds=(0.01, 0.02, 0.11),
                attn_mfu=0.5, attn_mbu=0.5, step_overhead_s=0.001)
    base.update(kw)
    return CalibratedCostModel(**base)


def test_step_time_by_hand():
    """Items (n, c) = (10, 0), (1, 20): Σn = 11 → table 0.01 + 0.01 × 10/99; Σa = 55 + 21
    = 76 → attention FLOPs 4 × 2 × 10 × 76 = 6080 over 1e6 × 0.5 = 0.01216 s; Σb = 10 + 21
    = 31 → 4 × 31 bytes over 1e4 × 0.5 = 0.0248 s (wins); + 0.001."""
    c = _model()
    want = (0.01 + 0.01 * 10 / 99) + 0.0248 + 0.001
    assert c.step_time([10, 1], [0, 20]) == pytest.approx(want, rel=1e-12)
    assert c.step_time([], []) == 0.0
    # beyond the last breakpoint the last segment extends: Σn = 2000 → 0.11 + 0.0001 × 1000
    assert c.token_time(2000) == pytest.approx(0.21, rel=1e-12)
    assert c.token_time(0.5) == 0.01  # below the first: the first value
    # decode steps: batch 2 holding 10 tokens: step j has Σa = Σb = 10 + 2j + 2
    d = c.decode_steps_time(2, 10, 3)
    for j in range(3):
        x = 10 + 2 * j + 2
        tab = 0.01 + 0.01 * (2 - 1) / 99
        want = tab + max(80 * x / 5e5, 4 * x / 5e3) + 0.001
        assert d[j] == pytest.approx(want, rel=1e-12)
        assert d[j] == c.step_time([1, 1], [4 + 2 * j, 6])  # the same sums, the same bits


def test_bad_tables_refused():
    with pytest.raises(ConfigError, match="ascending"):
        _model(table_tokens=(1, 1, 5))
    with pytest.raises(ConfigError, match="same|breakpoint"):
        _model(table_seconds=(0.1,))
    with pytest.raises(ConfigError, match="attn_mfu"):
        _model(attn_mfu=0.0)


def test_packaged_models_and_missing_profiles():
    f = cost_model("fitted", "Llama-2-7B", "A100-80GB", tp=2)
    assert isinstance(f, CalibratedCostModel) and f.kind == "fitted"
    p = cost_model("profiled", "Llama-2-7B", "H100-80GB")
    assert p.kind == "profiled" and "Llama-2-7b" in p.source
    assert type(cost_model("roofline", "Llama-2-7B", "A100-80GB")) is CostModel
    with pytest.raises(ConfigError, match="H200-141GB"):
        cost_model("profiled", "Llama-2-7B", "H200-141GB")
    with pytest.raises(ConfigError, match="h4096-q32-kv8-f14336-gated at TP 1 on H100-80GB"):
        cost_model("profiled", "Llama-3.1-8B", "H100-80GB")
    with pytest.raises(ConfigError, match="dense"):
        cost_model("fitted", "DeepSeek-V3", "H100-80GB")
    with pytest.raises(ConfigError, match="not one of"):
        cost_model("nonsense", "Llama-2-7B", "A100-80GB")


def test_profile_file(tmp_path):
    """A user profile: layer 1 ms at 1 token, 3 ms at 101 tokens (+ 0.5 ms comm at both),
    Llama-2-7B's 32 layers → 48 ms at 1 token, 112 ms at 101."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"tokens": [1, 101], "layer_s": [0.001, 0.003], "comm_s": [0.0005, 0.0005]}))
    c = from_file(path, "Llama-2-7B", "A100-80GB")
    assert c.token_time(1) == pytest.approx(0.048) and c.token_time(51) == pytest.approx(0.08)
    path.write_text(json.dumps({"tokens": [1, 2], "layer_s": ["a", 1]}))
    with pytest.raises(InputError, match="layer_s"):
        from_file(path, "Llama-2-7B", "A100-80GB")


# ------------------------------------------------------------------ (3) the loops
def _tiny():
    return request_trace([list(range(50)), list(range(30)) + [900 + i for i in range(20)], [7, 8, 9]],
                         [3, 2, 4], arrivals=[0.0, 0.01, 0.5])


def _assert_same(a, b):
    assert dumps_json(a.summary()) == dumps_json(b.summary())
    for k, v in a.columns.items():
        assert np.array_equal(v, b.columns[k], equal_nan=True), k
    assert dumps_json(a.meta) == dumps_json(b.meta)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_compiled_loops_equal_python_loop_and_hand(monkeypatch, engine):
    """Both compiled loops price a CalibratedCostModel as the Python loop does, bit for
    bit; and a lone request (50-token prompt, 3 outputs) takes a prefill step of Σn = 50,
    Σa = 50·51/2, Σb = 50, then two decodes with Σa = Σb = 51 and 52: its finish time is
    the sum of those three step times from the module formula."""
    c = _model(table_tokens=(1, 64, 4096), table_seconds=(0.002, 0.003, 0.05), kv_bytes_per_token=2e3,
               hbm_bytes_per_s=1e9, peak_flops=1e12)
    tr = _tiny()
    if engine == "vllm":
        make = lambda: BlockHashCache(40, 4)  # noqa: E731
        monkeypatch.setattr(conc_vllm_fast, "_eligible", lambda *a: False)
        py = replay_concurrent(tr, make(), c)
        monkeypatch.undo()
        calls = []
        orig = conc_vllm_fast.replay_compiled
        monkeypatch.setattr(conc_vllm_fast, "replay_compiled", lambda *a, **k: calls.append(1) or orig(*a, **k))
        kern = replay_concurrent(tr, make(), c)
        assert calls
    else:
        make = lambda: RadixCache(160, 1)  # noqa: E731
        monkeypatch.setattr(conc_sglang, "ENABLED", False)
        py = replay_concurrent(tr, make(), c)
        monkeypatch.setattr(conc_sglang, "ENABLED", True)
        assert conc_sglang.applicable(make(), c, SchedulerConfig(), None, "sglang")
        kern = replay_concurrent(tr, make(), c)
    _assert_same(py, kern)

    def hand(sn, sa, sb):
        tab = 0.002 + 0.001 * (sn - 1) / 63
        return tab + max(4 * 2 * 10 * sa / (1e12 * 0.5), 2e3 * sb / (1e9 * 0.5)) + 0.001

    one = request_trace([list(range(50))], [3])
    for make1 in (lambda: BlockHashCache(40, 4), lambda: RadixCache(160, 1)):
        r = replay_concurrent(one, make1(), c)
        want = hand(50, 50 * 51 // 2, 50) + hand(1, 51, 51) + hand(1, 52, 52)
        assert r.columns["finish_s"][0] == pytest.approx(want, rel=1e-12)
        assert r.columns["ttft_s"][0] == pytest.approx(hand(50, 50 * 51 // 2, 50), rel=1e-12)


# ------------------------------------------------------------------ (4) the CLI
def test_cli_cost_model(tmp_path, capsys):
    from radixkv.cli import main

    tr = tmp_path / "t.jsonl"
    tr.write_text("".join(json.dumps({"timestamp": i * 0.1, "input_length": 1000, "output_length": 3,
                                      "hash_ids": [i % 2, 10 + i]}) + "\n" for i in range(6)))
    base = ["replay", str(tr), "--policy", "vllm:16", "--mode", "concurrent", "--model", "Llama-2-7B",
            "--gpu", "A100-80GB", "--capacity-tokens", "8192"]
    outs = {}
    for kind in ("roofline", "fitted", "profiled"):
        out = tmp_path / f"{kind}.json"
        assert main(base + ["--cost-model", kind, "--json", str(out)]) == 0
        doc = json.loads(out.read_text())["results"][0]
        outs[kind] = doc["summary"]
        assert doc.get("cost_model") == (None if kind == "roofline" else kind)  # recorded unless the default
    assert main(base + ["--json", str(tmp_path / "d.json")]) == 0
    assert json.loads((tmp_path / "d.json").read_text())["results"][0]["summary"] == outs["roofline"]  # the default
    assert outs["fitted"]["ttft_p50_s"] != outs["roofline"]["ttft_p50_s"]
    assert outs["fitted"]["hit_tokens"] == outs["profiled"]["hit_tokens"] == outs["roofline"]["hit_tokens"]
    assert main(base[:-4] + ["--gpu", "H200-141GB", "--capacity-tokens", "8192", "--cost-model", "profiled"]) == 2
    assert "H200-141GB" in capsys.readouterr().err


def test_api_cost_by_name():
    """radixkv.replay(cost="profiled", model=, gpu=) prices with the profiled table; a
    string without model/gpu is refused."""
    import radixkv

    tr = request_trace([list(range(50))], [3])
    r = radixkv.replay(tr, "vllm:16", capacity_tokens=4096, mode="concurrent", cost="profiled",
                       model="Llama-2-7B", gpu="A100-80GB")
    c = cost_model("profiled", "Llama-2-7B", "A100-80GB")
    first = c.step_time([50], [0])
    assert r.columns["ttft_s"][0] == pytest.approx(first, rel=1e-12)
    with pytest.raises(ConfigError, match="model"):
        radixkv.replay(tr, "vllm:16", capacity_tokens=4096, mode="concurrent", cost="fitted")


@pytest.mark.slow
def test_packaged_data_is_built_from_the_measurements():
    """radixkv/clock/data/{fitted,profiles}.json are what radixkv.clock.build makes from
    Vidur's measurements ($RADIXKV_SHARED/measurements/vidur; skipped without them)."""
    import os

    from radixkv.clock.build import build
    from radixkv.clock.calibrated import DATA

    root = Path(os.environ.get("RADIXKV_SHARED", Path(__file__).parents[2] / "shared")) / "measurements" / "vidur"
    if not (root / "compute").is_dir():
        pytest.skip("Vidur's measurements are not at hand (RADIXKV_SHARED)")
    fitted, prof = build(root)
    assert dumps_json(fitted) == (DATA / "fitted.json").read_text()
    assert dumps_json(prof) == (DATA / "profiles.json").read_text()


def test_cli_request_intake(tmp_path, capsys):
    """--request-intake-s D with six requests sent at once: the front end takes them in one
    after another (one busy period), so all six reach the engine at 6·D, the engine's
    timeline is the default run's shifted by 6·D, and each TTFT grows by exactly 6·D;
    TPOT does not move. The flag needs --mode concurrent."""
    from radixkv.cli import main

    tr = tmp_path / "t.jsonl"
    tr.write_text("".join(json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 3,
                                      "hash_ids": [i % 2, 10 + i]}) + "\n" for i in range(6)))
    base = ["replay", str(tr), "--policy", "vllm:16", "--mode", "concurrent", "--model", "Llama-2-7B",
            "--gpu", "A100-80GB", "--capacity-tokens", "8192"]
    assert main(base + ["--json", str(tmp_path / "a.json")]) == 0
    assert main(base + ["--request-intake-s", "0.01", "--json", str(tmp_path / "b.json")]) == 0
    ra, rb = (json.loads((tmp_path / f).read_text())["results"][0] for f in ("a.json", "b.json"))
    assert rb["request_intake_s"] == 0.01 and "request_intake_s" not in ra
    a, b = ra["summary"], rb["summary"]
    for k in ("ttft_p50_s", "ttft_p99_s", "ttft_mean_s"):
        assert b[k] == pytest.approx(a[k] + 0.06)
    assert b["tpot_p50_s"] == pytest.approx(a["tpot_p50_s"])
    assert main(base[:4] + base[6:] + ["--request-intake-s", "0.01"]) == 2
    assert "--mode concurrent" in capsys.readouterr().err
