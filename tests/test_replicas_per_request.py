"""``replay --replicas N --mode concurrent`` writes ``--per-request`` rows with the replica
that served each request, and ``--report``; refuses ``--timeline`` and the sequential
replicas' per-request rows with the reason."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from radixkv.cli import main

DEMO = str(Path(__file__).resolve().parent.parent / "traces" / "demo.jsonl")
BASE = ["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "20000", "--model", "Llama-3.1-8B",
        "--gpu", "A100-80GB", "--replicas", "2", "--router", "round-robin", "--limit", "40", "--quiet"]


def test_per_request_rows_name_the_replica_and_add_up(tmp_path, capsys):
    csv_path, page, js = tmp_path / "r.csv", tmp_path / "r.html", tmp_path / "r.json"
    assert main(BASE + ["--mode", "concurrent", "--per-request", str(csv_path), "--report", str(page),
                        "--json", str(js)]) == 0
    rows = list(csv.DictReader(csv_path.open()))
    summ = json.loads(js.read_text())["results"][0]["summary"]
    assert len(rows) == 40
    # round-robin in arrival order: replica 0, 1, 0, 1, ... (the trace's requests arrive in file order)
    by_arrival = sorted(rows, key=lambda r: float(r["arrival_s"]))
    assert [int(r["replica"]) for r in by_arrival] == [i % 2 for i in range(40)]
    # each replica's rows add up to its own summary, all rows to the aggregate
    for k in (0, 1):
        mine = [r for r in rows if int(r["replica"]) == k]
        assert len(mine) == summ["replicas"][k]["requests"] == summ["routing"]["requests_per_replica"][k]
        assert sum(int(r["hit_tokens"]) for r in mine) == summ["replicas"][k]["hit_tokens"]
    assert sum(int(r["hit_tokens"]) for r in rows) == summ["hit_tokens"]
    text = page.read_text()
    assert 'id="headline"' in text and "vllm:16 x2 round-robin" in text


def test_replicas_refuse_timeline_and_sequential_rows_with_the_reason(tmp_path, capsys):
    assert main(BASE + ["--mode", "concurrent", "--timeline", str(tmp_path / "t.csv")]) == 2
    assert "each replica steps on its own" in capsys.readouterr().err
    seq = [a for a in BASE if a not in ("--model", "Llama-3.1-8B", "--gpu", "A100-80GB")]
    assert main(seq + ["--per-request", str(tmp_path / "p.csv")]) == 2
    assert "need --mode concurrent" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
