"""``radixkv check`` baselines record the pool: a changed pool reads as a configuration
change (its own message), not as a regression of the metrics."""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.cli import main

DEMO = Path(__file__).resolve().parent.parent / "traces" / "demo.jsonl"


def _cfg(tmp_path, capacity):
    p = tmp_path / "c.toml"
    p.write_text(f'baseline = "base.json"\n\n[[trace]]\nname = "demo"\npath = "{DEMO}"\nlimit = 60\n\n'
                 f'[[policy]]\npolicy = "vllm:16"\ncapacity_tokens = {capacity}\n\n'
                 '[[assert]]\n[assert.baseline]\ntoken_hit_rate = 0.001\n')
    return p


def test_baseline_records_the_pool_and_a_pool_change_is_its_own_message(tmp_path, capsys):
    assert main(["check", str(_cfg(tmp_path, 4000)), "--update-baseline", "--quiet"]) == 0
    base = json.loads((tmp_path / "base.json").read_text())
    # 4,000 tokens in blocks of 16: 250 blocks (worked by hand)
    assert base["pools"] == {"demo": {"vllm:16": {"pool_capacity_tokens": 4000, "pool_slots": 250,
                                                  "pool_slot_tokens": 16}}}
    assert main(["check", str(_cfg(tmp_path, 4000)), "--quiet"]) == 0
    capsys.readouterr()
    # the configuration halves the pool: not compared, reported as the change it is
    assert main(["check", str(_cfg(tmp_path, 2000)), "--quiet", "--json", "-"]) == 1
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    detail = json.dumps(doc)
    assert ("pool changed since the baseline: 4,000 tokens (250 slots of 16) -> 2,000 tokens (125 slots of 16): "
            "a configuration change, not a regression; rerun with --update-baseline") in detail
    assert "pool changed since the baseline" in cap.err


def test_a_baseline_without_pools_is_compared_as_before(tmp_path, capsys):
    assert main(["check", str(_cfg(tmp_path, 4000)), "--update-baseline", "--quiet"]) == 0
    base = json.loads((tmp_path / "base.json").read_text())
    del base["pools"]
    (tmp_path / "base.json").write_text(json.dumps(base))
    assert main(["check", str(_cfg(tmp_path, 4000)), "--quiet"]) == 0
    # a smaller pool hits less on this trace: without recorded pools that is a failed comparison
    capsys.readouterr()
    assert main(["check", str(_cfg(tmp_path, 2000)), "--quiet"]) == 1
    assert "pool changed" not in capsys.readouterr().err
