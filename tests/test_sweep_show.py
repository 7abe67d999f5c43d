"""``radixkv sweep-show`` and ``sweep-plot --x/--y``: the results table, plotting any swept
knob, refusing (exit 2, the reason) when there is nothing to draw, the example grid, and
``load_results`` without pandas. Most tests build a results folder by hand (cell rows as
the store writes them), so the expected values are the ones written in the test."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.plots import log_ticks, short_number, sweep_lines
from radixkv.sweep.show import capacity_tokens as _capacity_tokens

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "sweep-grid.toml"


def _row(key, policy, metrics, settings=None, pool=None, trace="demo.jsonl"):
    return {"key": key, "trace": {"path": trace, "sha256": "0" * 64, "name": "demo", "unit_tokens": 1},
            "settings": {"policy": policy, **(settings or {})}, "metrics": metrics, "pool": pool or {},
            "timing_s": {}, "radixkv": "0", "worker": "h:1"}


def _store(tmp_path, rows):
    d = tmp_path / "out"
    (d / "cells").mkdir(parents=True)
    for r in rows:
        (d / "cells" / f"{r['key']}.jsonl").write_text(json.dumps(r) + "\n")
    return d


# A concurrent gpu_memory_utilization grid as the issue had it: vLLM-engine cells sized by
# num_gpu_blocks (no pool_capacity_tokens in a concurrent summary), SGLang's by tokens.
GMU = [
    _row(f"a{i}", "vllm:16", {"token_hit_rate": 0.5 + i / 100, "ttft_p99_s": 0.07 - i / 1000},
         {"gpu_memory_utilization": u, "mode": "concurrent", "model": "Llama-3.1-8B", "gpu": "A100-80GB"},
         {"num_gpu_blocks": nb, "engine_rule": "vllm"})
    for i, (u, nb) in enumerate([(0.5, 11823), (0.7, 20015), (0.9, 28207)])
] + [
    _row(f"b{i}", "sglang:1", {"token_hit_rate": 0.6 + i / 100, "ttft_p99_s": 0.08 - i / 1000},
         {"gpu_memory_utilization": u, "mode": "concurrent", "model": "Llama-3.1-8B", "gpu": "A100-80GB"},
         {"capacity_tokens": cap, "engine_rule": "vllm"})
    for i, (u, cap) in enumerate([(0.5, 189152), (0.7, 320224), (0.9, 451296)])
]


def test_vllm_pool_in_blocks_reads_as_usable_tokens():
    # block 0 is the null block: (11,823 - 1) x 16 = 189,152 tokens; at block size 32: 11,822 x 32
    assert _capacity_tokens(GMU[0]) == 189_152
    assert _capacity_tokens(_row("x", "vllm:32", {}, pool={"num_gpu_blocks": 11823})) == 378_304
    assert _capacity_tokens(_row("x", "sglang:1", {}, pool={"capacity_tokens": 5})) == 5


def test_sweep_lines_on_any_knob_and_metric():
    by_cap = sweep_lines(GMU)["demo.jsonl"]
    assert by_cap == {"sglang:1": [(189152, 0.6), (320224, 0.61), (451296, 0.62)],
                      "vllm:16": [(189152, 0.5), (320224, 0.51), (451296, 0.52)]}
    by_gmu = sweep_lines(GMU, x="gpu_memory_utilization", metric="ttft_p99_s")["demo.jsonl"]
    assert by_gmu == {"sglang:1": [(0.5, 0.08), (0.7, 0.079), (0.9, 0.078)],
                      "vllm:16": [(0.5, 0.07), (0.7, 0.069), (0.9, 0.068)]}


def test_sweep_plot_refuses_with_the_reason_and_writes_nothing(tmp_path, capsys):
    # without a pool size in tokens or blocks, capacity cannot be the x axis: the case
    rows = [dict(r, pool={}) for r in GMU]
    d = _store(tmp_path, rows)
    png = tmp_path / "p.png"
    assert main(["sweep-plot", str(d), "--out", str(png)]) == 2
    err = capsys.readouterr().err
    assert "nothing to draw from 6 cells: no cell has a number for 'capacity_tokens'" in err
    assert "the grid sweeps gpu_memory_utilization; use --x gpu_memory_utilization" in err
    assert not png.exists()
    # a knob the grid does not sweep: one value, no line to draw (the vLLM cells: vllm serve's
    # 256 on an A100; the SGLang cells run SGLang's max_running_requests, assumed 2048)
    dv = _store(tmp_path / "vllm", rows[:3])
    assert main(["sweep-plot", str(dv), "--x", "max_num_seqs", "--out", str(png)]) == 2
    assert "every cell has max_num_seqs = 256" in capsys.readouterr().err and not png.exists()
    # a metric no cell has: the ones they have
    assert main(["sweep-plot", str(d), "--x", "gpu_memory_utilization", "--y", "evictions", "--out", str(png)]) == 2
    assert "'evictions'" in (err := capsys.readouterr().err) and "token_hit_rate, ttft_p99_s" in err
    # and what it can draw
    assert main(["sweep-plot", str(d), "--x", "gpu_memory_utilization", "--y", "ttft_p99_s"]) == 0
    assert "(2 lines from 6 cells)" in capsys.readouterr().out
    assert (d / "ttft_p99_s_vs_gpu_memory_utilization.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_show_table_and_json(tmp_path, capsys):
    d = _store(tmp_path, GMU)
    (d / "errors").mkdir()
    (d / "errors" / "c0.json").write_text(json.dumps({"key": "c0", "error": {}}) + "\n")
    assert main(["sweep-show", str(d)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{d}: 6 finished cells, 1 failed (see {d}/errors/)"
    assert lines[1].split() == ["policy", "gpu_memory_utilization", "pool", "(tokens)", "token_hit_rate",
                                "hit_tokens", "evictions", "ttft_p99_s", "key"]
    # sorted by policy, then the knob; the pool in usable tokens; metrics no cell has n/a (TTFT p50
    # left out: no cell has it)
    assert lines[3].split() == ["sglang:1", "0.5", "189,152", "0.6000", "n/a", "n/a", "0.0800", "b0"]
    assert lines[8].split() == ["vllm:16", "0.9", "451,296", "0.5200", "n/a", "n/a", "0.0680", "a2"]
    assert len(lines) == 9
    assert main(["sweep-show", str(d), "--metrics", "ttft_p99_s", "--json", "-"]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert doc["columns"] == ["policy", "gpu_memory_utilization", "capacity_tokens", "ttft_p99_s", "key"]
    assert [c["key"] for c in doc["cells"]] == ["b0", "b1", "b2", "a0", "a1", "a2"]
    assert doc["cells"][3] == {"policy": "vllm:16", "gpu_memory_utilization": 0.5, "capacity_tokens": 189152,
                               "ttft_p99_s": 0.07, "key": "a0"}
    assert doc["failed"] == ["c0"]
    assert "6 finished cells" in cap.err  # the table went to stderr
    assert main(["sweep-show", str(d), "--metrics", "nope"]) == 2
    assert "no cell of the sweep has the metric 'nope'" in capsys.readouterr().err


def test_log_ticks_do_not_overlap():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert [short_number(v) for v in (2000, 4992, 12345, 100_000, 1_500_000, 512)] == \
        ["2k", "5k", "12k", "100k", "1.5M", "512"]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    caps = [1000, 1100, 1200, 2000, 5000, 10_000, 20_000, 50_000]
    ax.plot(caps, [0.1] * len(caps))
    ax.set_xscale("log")
    log_ticks(ax, caps)
    # span log10(50) = 1.7 decades < 2.4 (0.3 x 8): labels at least 0.3 decade apart
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1k", "2k", "5k", "10k", "20k", "50k"]
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    plt.close(fig)


def test_example_grid_runs_and_shows(tmp_path, capsys):
    from radixkv.sweep import load_grid

    g = load_grid(EXAMPLE)
    assert len(g.cells) == 12 and g.traces[0].path.resolve() == (ROOT / "traces" / "demo.jsonl").resolve()
    # the same grid on the first 30 requests (the trace path made absolute)
    text = EXAMPLE.read_text().replace('"../traces/demo.jsonl"', json.dumps(str(ROOT / "traces" / "demo.jsonl")))
    small = tmp_path / "g.toml"
    small.write_text(text + "limit = 30\n")
    out = tmp_path / "o"
    assert main(["sweep", str(small), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["sweep-show", str(out), "--json", "-"]) == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert [(c["policy"], c["capacity_tokens"]) for c in cells][:4] == [("none:16", n // 16 * 16) for n in (2000, 5000, 20000, 100000)]  # whole 16-token blocks
    # no caching: no hit; the rest as `radixkv replay` gives them
    assert all(c["token_hit_rate"] == 0 and c["hit_tokens"] == 0 for c in cells[:4])
    c = next(c for c in cells if c["policy"] == "sglang:1" and c["capacity_tokens"] == 5000)
    assert main(["replay", str(ROOT / "traces" / "demo.jsonl"), "--policy", "sglang:1", "--capacity-tokens", "5000",
                 "--limit", "30", "--quiet", "--json", "-"]) == 0
    s = json.loads(capsys.readouterr().out)["results"][0]["summary"]
    assert (c["hit_tokens"], c["token_hit_rate"], c["evictions"]) == (s["hit_tokens"], s["token_hit_rate"],
                                                                      s["evictions"])


def test_load_results_without_pandas_says_how_to_install(tmp_path, monkeypatch):
    from radixkv.sweep import load_results

    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"pip install 'radixkv\[dask\]'"):
        load_results(_store(tmp_path, GMU[:1]))
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("pandas") for dep in extras["dask"])  # the extra named holds pandas
