"""``radixkv sweep``: grid expansion, executors agree byte for byte, resume after an
interrupt, failed cells, bad grids, the results table and plot."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.sweep import load_grid, read_errors, read_rows, run_sweep
from radixkv.sweep import cell as cell_mod

TRACES = Path(__file__).resolve().parent.parent / "traces"

# 2 traces x 2 policies x 2 pools x (1 sequential + 2 concurrent max_num_seqs) = 24 cells
GRID24 = """
traces = ["{demo}", "{cs}"]
policies = ["vllm:16", "sglang:1"]
capacity_tokens = [3000, 20000]
limit = 40
mode = ["sequential", "concurrent"]
model = "Llama-3.1-8B"
gpu = "A100-80GB"
max_num_seqs = [2, 64]
"""


def _grid(tmp_path, text, name="grid.toml"):
    p = tmp_path / name
    p.write_text(text.format(demo=TRACES / "demo.jsonl", cs=TRACES / "customer_service.jsonl"))
    return p


def _metrics(out_dir) -> dict:
    """key -> the cell's metrics as canonical JSON bytes (timings excluded)."""
    return {r["key"]: json.dumps(r["metrics"], sort_keys=True) for r in read_rows(out_dir)}


@pytest.fixture(scope="module")
def grid24(tmp_path_factory):
    d = tmp_path_factory.mktemp("grid24")
    return _grid(d, GRID24)


@pytest.fixture(scope="module")
def local24(grid24, tmp_path_factory):
    out = tmp_path_factory.mktemp("local24") / "out"
    rep = run_sweep(grid24, out, executor="local", progress=False)
    assert rep.done == 24 and not rep.failed
    return out


def test_grid_expands_to_the_product_with_normalised_duplicates_merged(grid24):
    g = load_grid(grid24)
    assert len(g.cells) == 24
    seq = [c for c in g.cells if c.settings.get("mode") != "concurrent"]
    conc = [c for c in g.cells if c.settings.get("mode") == "concurrent"]
    assert len(seq) == 8 and len(conc) == 16
    # concurrent knobs are dropped from sequential cells, kept in concurrent ones
    assert all("max_num_seqs" not in c.settings and "model" not in c.settings for c in seq)
    assert {c.settings["max_num_seqs"] for c in conc} == {2, 64}
    assert len({c.key for c in g.cells}) == 24


def test_sizes_go_into_the_policy_spec_and_defaults_do_not_change_keys(tmp_path):
    g = load_grid(_grid(tmp_path, 'traces = ["{demo}"]\npolicies = ["vllm", "sglang"]\n'
                                  "block_size = [16, 32]\ncapacity_tokens = 20000\n"))
    # vllm takes both block sizes; sglang ignores block_size -> one cell
    assert sorted(c.settings["policy"] for c in g.cells) == ["sglang:1", "vllm:16", "vllm:32"]
    a = load_grid(_grid(tmp_path, 'traces = ["{demo}"]\npolicies = "vllm:16"\ncapacity_tokens = 20000\n', "a.toml"))
    b = load_grid(_grid(tmp_path, 'traces = ["{demo}"]\npolicies = "vllm"\nblock_size = 16\n'
                                  'capacity_tokens = 2e4\nmode = "sequential"\nverify = false\n', "b.toml"))
    assert [c.key for c in a.cells] == [c.key for c in b.cells]


def test_cell_key_follows_trace_content_not_path(tmp_path):
    shutil.copy(TRACES / "demo.jsonl", tmp_path / "copy.jsonl")
    text = 'traces = ["{t}"]\npolicies = "none"\ncapacity_tokens = 20000\n'
    k1 = load_grid(_grid(tmp_path, text.replace("{t}", str(TRACES / "demo.jsonl")), "1.toml")).cells[0].key
    k2 = load_grid(_grid(tmp_path, text.replace("{t}", "copy.jsonl"), "2.toml")).cells[0].key
    assert k1 == k2
    with open(tmp_path / "copy.jsonl", "a") as f:
        f.write("\n")
    k3 = load_grid(_grid(tmp_path, text.replace("{t}", "copy.jsonl"), "3.toml")).cells[0].key
    assert k3 != k1


def _loaded_and_compiled_once_per_worker(out):
    """Each worker loaded each trace at most once and compiled each policy at most once."""
    loads, compiles = {}, {}
    for r in read_rows(out):
        t = r["timing_s"]
        if t["trace_load"] > 0:
            k = (r["worker"], r["trace"]["sha256"])
            loads[k] = loads.get(k, 0) + 1
        if t["compile"] > 0:
            k = (r["worker"], r["settings"]["policy"])
            compiles[k] = compiles.get(k, 0) + 1
    assert all(v == 1 for v in loads.values()), loads
    assert all(v == 1 for v in compiles.values()), compiles


def test_processes_executor_gives_byte_identical_metrics(grid24, local24, tmp_path):
    out = tmp_path / "out"
    rep = run_sweep(grid24, out, executor="processes", workers=2, progress=False)
    assert rep.done == 24 and not rep.failed
    assert _metrics(out) == _metrics(local24)
    _loaded_and_compiled_once_per_worker(out)


def test_trace_cache_round_trip_is_memory_mapped_and_loaded_once(tmp_path):
    import numpy as np

    from radixkv.trace.load import load_trace

    tr = load_trace(TRACES / "multi_turn.jsonl")
    cell_mod.write_trace_cache(tr, tmp_path / "c")
    back = cell_mod.read_trace_cache(tmp_path / "c")
    for name in ("req_id", "arrival_s", "prompt_len", "output_len", "ids", "id_offsets", "out_ids", "out_offsets",
                 "session_id", "turn"):
        a, b = getattr(tr, name), getattr(back, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (back.unit_tokens, back.partial_last_unit, back.name) == (tr.unit_tokens, tr.partial_last_unit, tr.name)
    assert isinstance(back.ids, np.memmap)
    ref = cell_mod.TraceRef("test-sha-" + tmp_path.name, str(tmp_path / "c"), "/nonexistent")
    t1, s1 = cell_mod.get_trace(ref)
    t2, s2 = cell_mod.get_trace(ref)
    assert t1 is t2 and s1 > 0 and s2 == 0.0


def test_interrupt_in_a_worker_process_then_rerun_finishes_the_rest(grid24, local24, tmp_path, monkeypatch):
    real = cell_mod.replay_cell
    victim = {"policy": "sglang:1", "capacity_tokens": 20000, "limit": 40}

    def interrupt_one(trace, settings):
        if settings == victim and trace.name.endswith("customer_service.jsonl"):
            raise KeyboardInterrupt
        return real(trace, settings)

    monkeypatch.setattr(cell_mod, "replay_cell", interrupt_one)  # forked workers inherit the patch
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(grid24, out, executor="processes", workers=2, progress=False)
    stored = len(_metrics(out))
    assert stored < 24
    monkeypatch.setattr(cell_mod, "replay_cell", real)
    rep = run_sweep(grid24, out, executor="processes", workers=2, progress=False)
    assert (rep.skipped, rep.done) == (stored, 24 - stored)
    assert _metrics(out) == _metrics(local24)


def test_dask_executor_gives_byte_identical_metrics(grid24, local24, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        out = tmp_path / "out"
        rep = run_sweep(grid24, out, executor="dask", scheduler=cluster.scheduler_address, progress=False)
    assert rep.done == 24 and not rep.failed
    assert _metrics(out) == _metrics(local24)
    _loaded_and_compiled_once_per_worker(out)
    workers = {r["worker"] for r in read_rows(out)}
    assert len(workers) == 1  # processes=False: both workers live in this process


def test_a_cell_equals_radixkv_replay_of_the_same_flags(local24, tmp_path, capsys):
    """The cell's metrics are what `radixkv replay` reports for the same settings."""
    row = next(r for r in read_rows(local24)
               if r["settings"] == {"policy": "vllm:16", "capacity_tokens": 3000, "limit": 40}
               and r["trace"]["path"].endswith("demo.jsonl"))
    out = tmp_path / "r.json"
    assert main(["replay", str(TRACES / "demo.jsonl"), "--policy", "vllm:16", "--capacity-tokens", "3000",
                 "--limit", "40", "--quiet", "--json", str(out)]) == 0
    summ = json.loads(out.read_text())["results"][0]["summary"]
    summ.pop("policy")
    assert json.dumps(summ, sort_keys=True) == json.dumps(row["metrics"], sort_keys=True)
    capsys.readouterr()


def test_interrupt_after_half_then_rerun_finishes_only_the_rest(grid24, local24, tmp_path, monkeypatch):
    real = cell_mod.replay_cell
    calls = []

    def interrupt_at_13(trace, settings):
        calls.append(settings)
        if len(calls) == 13:
            raise KeyboardInterrupt
        return real(trace, settings)

    monkeypatch.setattr(cell_mod, "replay_cell", interrupt_at_13)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(grid24, out, executor="local", progress=False)
    first = set(_metrics(out))
    assert len(first) == 12
    assert not list((out / "cells").glob(".*"))  # no temporary file left behind

    ran = []
    monkeypatch.setattr(cell_mod, "replay_cell", lambda t, s: ran.append(s) or real(t, s))
    rep = run_sweep(grid24, out, executor="local", progress=False)
    assert (rep.skipped, rep.done, len(ran)) == (12, 12, 12)
    assert _metrics(out) == _metrics(local24)
    # a third run has nothing to do
    rep = run_sweep(grid24, out, executor="local", progress=False)
    assert (rep.skipped, rep.done, len(ran)) == (24, 0, 12)


def test_killed_sweep_process_resumes_with_only_the_rest(grid24, local24, tmp_path, monkeypatch):
    """A `radixkv sweep` process killed (SIGKILL) mid-run; the rerun does only what is missing."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    # each cell slowed by 0.3 s so that the kill lands mid-run
    code = ("import sys, time; import radixkv.sweep.cell as c; real = c.replay_cell; "
            "c.replay_cell = lambda t, s: (time.sleep(0.3), real(t, s))[1]; "
            "from radixkv.cli import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(TRACES.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", code, "sweep", str(grid24), "--out", str(out), "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "cells").is_dir() and len(list((out / "cells").glob("*.jsonl"))) >= 6:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    stored = set(_metrics(out))
    assert 6 <= len(stored) < 24
    ran = []
    real = cell_mod.replay_cell
    monkeypatch.setattr(cell_mod, "replay_cell", lambda t, s: ran.append(s) or real(t, s))
    rep = run_sweep(grid24, out, executor="local", progress=False)
    assert (rep.skipped, rep.done, len(ran)) == (len(stored), 24 - len(stored), 24 - len(stored))
    assert _metrics(out) == _metrics(local24)


def test_cli_reports_an_interrupt_with_exit_130(grid24, tmp_path, monkeypatch, capsys):
    def boom(trace, settings):
        raise KeyboardInterrupt

    monkeypatch.setattr(cell_mod, "replay_cell", boom)
    assert main(["sweep", str(grid24), "--out", str(tmp_path / "o"), "--quiet"]) == 130
    assert "0 of 24 cells are stored" in capsys.readouterr().err


def test_a_temp_file_from_a_killed_writer_is_not_a_finished_cell(grid24, local24, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(local24, out)
    victims = sorted((out / "cells").iterdir())[:3]
    for v in victims:  # what os.replace never got to rename
        v.rename(v.with_name("." + v.name + ".x1y2.tmp"))
    rep = run_sweep(grid24, out, executor="local", progress=False)
    assert (rep.skipped, rep.done) == (21, 3)
    assert _metrics(out) == _metrics(local24)


def test_failed_cell_is_recorded_others_go_on_exit_1(tmp_path, capsys):
    # a 100-token pool cannot hold the demo trace's first prompt (hundreds of tokens)
    g = _grid(tmp_path, 'traces = ["{demo}"]\npolicies = ["vllm:16", "none"]\ncapacity_tokens = [100, 20000]\n'
                        "limit = 20\n")
    out = tmp_path / "out"
    assert main(["sweep", str(g), "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("capacity_tokens=100") == 2 and "cell(s) failed" in err
    rows = read_rows(out)
    assert sorted(r["settings"]["capacity_tokens"] for r in rows) == [20000, 20000]
    errors = read_errors(out)
    assert len(errors) == 2 and all(e["error"]["type"] == "ConfigError" for e in errors)
    # a rerun retries only the two failed cells
    rep = run_sweep(g, out, executor="local", progress=False)
    assert (rep.skipped, rep.done, len(rep.failed)) == (2, 0, 2)


@pytest.mark.parametrize("text, key", [
    ('traces = ["{demo}"]\npolicies = "vllm"\ncapacity = 100\n', "capacity"),
    ('traces = ["{demo}"]\npolicies = "vllm"\ncapacity_tokens = "lots"\n', "capacity_tokens"),
    ('traces = ["{demo}"]\ncapacity_tokens = 100\n', "policies"),
    ('traces = ["{demo}"]\npolicies = "lfu"\ncapacity_tokens = 100\n', "policies"),
    ('traces = ["nowhere.jsonl"]\npolicies = "vllm"\ncapacity_tokens = 100\n', "traces"),
    ('traces = ["{demo}"]\npolicies = "vllm"\ncapacity_tokens = 100\nmax_num_seqs = [4, 8]\n', "max_num_seqs"),
    ('traces = ["{demo}"]\npolicies = "vllm"\ncapacity_tokens = 100\nmode = "concurrent"\n', "model"),
    ('traces = ["{demo}"]\npolicies = "vllm"\ncapacity_tokens = 100\nschedule_policy = "lifo"\n',
     "schedule_policy"),
    ('traces = ["{demo}"]\npolicies = "vllm"\n', "capacity"),
    # flags a cell would accept and never act on (it keeps only the summary metrics)
    ('traces = ["{demo}"]\npolicies = "vllm"\ncapacity_tokens = 100\nmeasure_last = 0.5\n', "measure_last"),
    ('traces = ["{demo}"]\npolicies = "vllm"\ncapacity_tokens = 100\nby = "tenant"\n', "by"),
    # an engine's memory knob where no cell's pool is sized by that engine's rule: same pool every value
    ('traces = ["{demo}"]\npolicies = ["vllm:16", "sglang:1"]\nmodel = "Llama-3.1-8B"\ngpu = "A100-80GB"\n'
     'mem_fraction_static = [0.5, 0.8]\n', "mem_fraction_static"),
    ('traces = ["{demo}"\n', None),
])
def test_bad_grid_exits_2_naming_the_key(tmp_path, capsys, text, key):
    g = _grid(tmp_path, text)
    assert main(["sweep", str(g), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(g) in err
    if key is not None:
        assert f"field '{key}'" in err
    assert not (tmp_path / "out").exists()


def test_dask_missing_gives_the_install_command(grid24, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    assert main(["sweep", str(grid24), "--out", str(tmp_path / "o"), "--executor", "dask"]) == 2
    assert "pip install 'radixkv[dask]'" in capsys.readouterr().err


def test_load_results_is_a_dataframe_with_every_grid_key(local24):
    pd = pytest.importorskip("pandas")
    from radixkv.sweep import load_results

    df = load_results(local24)
    assert isinstance(df, pd.DataFrame) and len(df) == 24
    for col in ("key", "trace", "trace_sha256", "policy", "capacity_tokens", "mode", "max_num_seqs",
                "token_hit_rate", "timing_s.replay", "radixkv"):
        assert col in df.columns, col
    # defaults filled in: sequential cells show mode "sequential"
    assert sorted(df["mode"].value_counts().items()) == [("concurrent", 16), ("sequential", 8)]
    seq = df[df["mode"] == "sequential"]
    # a bigger pool never lowers the LRU hit rate of these traces (same trace, same policy)
    for (_, _), grp in seq.groupby(["trace", "policy"]):
        grp = grp.sort_values("capacity_tokens")
        assert list(grp["token_hit_rate"]) == sorted(grp["token_hit_rate"])


def test_sweep_plot_draws_a_line_per_policy_and_varying_knob(local24, tmp_path, capsys):
    png = tmp_path / "hr.png"
    assert main(["sweep-plot", str(local24), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # per trace: 2 policies sequential + 2 policies x 2 max_num_seqs concurrent = 6 lines; 2 traces
    assert "(12 lines from 24 cells)" in capsys.readouterr().out


def test_compare_on_processes_matches_local(tmp_path, capsys):
    base = ["compare", str(TRACES / "demo.jsonl"), "--policies", "vllm:16,sglang:1,none",
            "--capacity-tokens", "5000", "--limit", "60", "--quiet", "--no-timing"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(base + ["--json", str(a)]) == 0
    assert main(base + ["--json", str(b), "--executor", "processes", "--workers", "2"]) == 0
    assert a.read_bytes() == b.read_bytes()
    capsys.readouterr()


def test_curve_on_processes_matches_local(tmp_path, capsys):
    base = ["curve", str(TRACES / "demo.jsonl"), "--policies", "vllm:16,sglang:1", "--capacities", "100,3000,20000",
            "--limit", "60", "--quiet", "--no-timing", "--skip-too-small"]
    assert main(base + ["--out", str(tmp_path / "a")]) == 0
    assert main(base + ["--out", str(tmp_path / "b"), "--executor", "processes", "--workers", "2"]) == 0
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert a == b
    assert any("skipped" in p for c in a["curves"] for p in c["points"])
    capsys.readouterr()


def test_an_sglang_memory_axis_with_per_engine_rule_is_a_real_axis(tmp_path):
    # with per_engine_rule the sglang:1 cells are sized by mem_fraction_static: two values,
    # two SGLang cells (the grid is accepted, not refused as an axis that changes nothing)
    from radixkv.sweep.grid import load_grid

    g = _grid(tmp_path, 'traces = ["{demo}"]\npolicies = ["vllm:16", "sglang:1"]\nmodel = "Llama-3.1-8B"\n'
                        'gpu = "A100-80GB"\nper_engine_rule = true\nmem_fraction_static = [0.5, 0.8]\n')
    cells = load_grid(g).cells
    sg = sorted(c.settings.get("mem_fraction_static") for c in cells if c.settings["policy"] == "sglang:1")
    assert sg == [0.5, 0.8]


_CONC = 'traces = ["{demo}"]\ncapacity_tokens = 20000\nmode = "concurrent"\nmodel = "Llama-3.1-8B"\ngpu = "A100-80GB"\n'


@pytest.mark.parametrize("policies, knob", [
    ('["vllm:16", "vllm:32"]', "enable_priority_scheduling = true"),  # SGLang's knob, vLLM cells only
    ('["sglang:1"]', 'scheduling_policy = "priority"'),  # vLLM's knob, SGLang cells only
    ('["sglang:1", "vllm:16"]\nadmission = "sglang"', "watermark = 0.1"),  # every cell under SGLang's rules
])
def test_an_engine_knob_no_cell_reads_is_refused_up_front_naming_key_and_line(tmp_path, capsys, policies, knob):
    # before the fix every cell failed at run time (exit 1) with the replay's own refusal
    g = _grid(tmp_path, _CONC + f"policies = {policies}\n" + knob + "\n")
    line = g.read_text().splitlines().index(knob) + 1
    assert main(["sweep", str(g), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    key = knob.split(" =")[0]
    assert f"{g}, line {line}, field '{key}'" in err and "no concurrent cell runs under them" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_priority_without_preemption_off_names_the_grid_key_and_line(tmp_path, capsys):
    # SGLang's priority preemption is not modelled: the grid must turn it off with its own key
    # (not the command line's flag), at the line of the key that asked for priority scheduling
    g = _grid(tmp_path, _CONC + 'policies = ["sglang:1"]\nenable_priority_scheduling = true\n')
    line = g.read_text().splitlines().index("enable_priority_scheduling = true") + 1
    assert main(["sweep", str(g), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{g}, line {line}" in err and "disable_priority_preemption = true" in err, err
    assert "--disable-priority-preemption" not in err and "preempt_to_schedule" in err
    assert not (tmp_path / "out").exists()


def test_an_engine_knob_applies_to_that_engines_cells_only(tmp_path):
    # SGLang's priority knobs with one vLLM and one SGLang policy: the vLLM cell is the one the
    # grid without those knobs has (same key), the SGLang cell keeps them, as `compare` reads them
    both = _grid(tmp_path, _CONC + 'policies = ["vllm:16", "sglang:1"]\nenable_priority_scheduling = true\n'
                 "disable_priority_preemption = true\n")
    plain = _grid(tmp_path, _CONC + 'policies = ["vllm:16", "sglang:1"]\n', name="plain.toml")
    cells = {c.settings["policy"]: c for c in load_grid(both).cells}
    ref = {c.settings["policy"]: c for c in load_grid(plain).cells}
    assert cells["vllm:16"].key == ref["vllm:16"].key
    assert cells["sglang:1"].settings["enable_priority_scheduling"] is True
    assert cells["sglang:1"].key != ref["sglang:1"].key


@pytest.mark.parametrize("keys, key", [
    ("replicas = 1\nrouter = \"prefix-aware\"\n", "router"),   # one replica serves every request
    ("replicas = 1\nkv_pool = \"global\"\n", "kv_pool"),       # one replica has one pool anyway
    ("replicas = [1, 2]\nrouter = \"session\"\n", "router"),    # the replicas = 1 cells
])
def test_a_moot_key_is_refused_naming_key_and_line(tmp_path, capsys, keys, key):
    # the command line refuses --router / --kv-pool global with --replicas 1 (radixkv.flags.moot);
    # a grid cell with the same keys is refused before anything runs, naming the key and its line
    g = _grid(tmp_path, _CONC + 'policies = ["vllm:16"]\n' + keys)
    line = next(i + 1 for i, s in enumerate(g.read_text().splitlines()) if s.startswith(key + " ="))
    assert main(["sweep", str(g), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{g}, line {line}, field '{key}'" in err and "--replicas 1" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_rerun_replays_a_stored_cell_whose_step_knobs_are_not_todays(tmp_path):
    """A cell's key holds only the settings that differ from the defaults, so a row stored
    before a default changed has today's key. A concurrent row whose recorded step knobs
    differ from the ones the cell runs with now, or that records none (an older radixkv),
    is run again; a matching row and a sequential row are kept."""
    import warnings

    from radixkv.errors import InputWarning

    # pool sized on the GPU, knobs not given: vLLM's server defaults on an A100 are
    # max_num_batched_tokens 2048, max_num_seqs 256 (EngineArgs.get_batch_defaults)
    g = _grid(tmp_path, 'traces = ["{demo}"]\npolicies = "vllm:16"\nlimit = 30\nmodel = "Llama-3.1-8B"\n'
                        'gpu = "A100-80GB"\nmode = ["sequential", "concurrent"]\n')
    out = tmp_path / "out"
    assert run_sweep(g, out, executor="local", progress=False).done == 2
    rows = {r["settings"].get("mode", "sequential"): r for r in read_rows(out)}
    conc = rows["concurrent"]
    assert (conc["metrics"]["scheduler"]["max_num_batched_tokens"], conc["metrics"]["scheduler"]["max_num_seqs"]) == (2048, 256)
    before = _metrics(out)
    path = out / "cells" / f"{conc['key']}.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = run_sweep(g, out, executor="local", progress=False)  # nothing stale: no warning
    assert rep.skipped == 2 and rep.done == 0

    for change in ("knobs", "absent"):
        row = json.loads(path.read_text())
        if change == "knobs":
            row["metrics"]["scheduler"]["max_num_seqs"] = 1024
        else:
            del row["metrics"]["scheduler"]
        path.write_text(json.dumps(row) + "\n")
        with pytest.warns(InputWarning, match="the cell is run again") as w:
            rep = run_sweep(g, out, executor="local", progress=False)
        assert rep.skipped == 1 and rep.done == 1
        assert str(path) in str(w[0].message)
        assert _metrics(out) == before  # the rerun restored the row of today's knobs

    # a sequential row sized on the GPU by an older memory model (another pool): run again
    seq_path = out / "cells" / f"{rows['sequential']['key']}.jsonl"
    row = json.loads(seq_path.read_text())
    row["pool"]["num_gpu_blocks"] -= 480
    seq_path.write_text(json.dumps(row) + "\n")
    with pytest.warns(InputWarning, match="ran on the pool") as w:
        rep = run_sweep(g, out, executor="local", progress=False)
    assert rep.skipped == 1 and rep.done == 1 and str(seq_path) in str(w[0].message)
    assert _metrics(out) == before


def test_unknown_gpu_of_a_concurrent_grid_names_the_file_and_line(tmp_path, capsys):
    g = _grid(tmp_path, 'traces = ["{demo}"]\npolicies = "vllm:16"\nlimit = 10\nmodel = "Llama-3.1-8B"\n'
                        'gpu = ["H100", "H999"]\nmode = "concurrent"\n')
    assert main(["sweep", str(g), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{g.name}, line 5, field 'gpu'" in err and "unknown GPU 'H999'" in err
    assert not (tmp_path / "out").exists()


def test_a_trace_that_cannot_be_read_leaves_no_results_directory(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{not json\n')
    g = tmp_path / "grid.toml"
    g.write_text(f'traces = ["{bad}"]\npolicies = "vllm:16"\ncapacity_tokens = 1000\n')
    assert main(["sweep", str(g), "--out", str(tmp_path / "out")]) == 2
    assert "bad.jsonl, line 2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # a results directory that existed before keeps what it held
    (tmp_path / "kept" / "cells").mkdir(parents=True)
    assert main(["sweep", str(g), "--out", str(tmp_path / "kept")]) == 2
    assert (tmp_path / "kept" / "cells").is_dir()


@pytest.mark.parametrize("keys,line,field,what", [
    ('model = "Llama-3.1-8B"\ngpu = "H999"\n', 4, "gpu", "unknown GPU 'H999'"),        # sequential
    ('model = "Llama-9"\ngpu = "H100"\nmode = "concurrent"\n', 3, "model", "unknown model 'Llama-9'"),
])
def test_unknown_model_or_gpu_is_refused_when_the_grid_is_read(tmp_path, capsys, keys, line, field, what):
    # before: each cell failed when it ran (exit 1, an errors/ record per cell, a results folder)
    g = _grid(tmp_path, 'traces = ["{demo}"]\npolicies = "vllm:16"\n' + keys)
    assert main(["sweep", str(g), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{g.name}, line {line}, field '{field}'" in err and what in err
    assert not (tmp_path / "out").exists()
