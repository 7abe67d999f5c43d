"""The committed paper agrees with the committed result files (no number typed by hand).

``paper/paper.md`` is rendered from ``paper/paper.tmpl.md`` and ``experiments/results/*.json``
by ``experiments/render_paper.py``. These tests re-render and compare, and show the
comparison fails when a result number the paper quotes changes. They read only files in
the repository (no public traces), so they always run.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"


@pytest.fixture(scope="module")
def rp():
    import importlib
    import sys

    sys.path.insert(0, str(REPO))
    return importlib.import_module("experiments.render_paper")


def test_committed_paper_matches_results(rp):
    fresh = rp.HEADER + rp.render(rp.TEMPLATE.read_text(), RESULTS)
    committed = (REPO / "paper" / "paper.md").read_text()
    assert committed == fresh, "paper/paper.md is stale: run python experiments/render_paper.py"


def test_drift_is_detected_when_a_quoted_number_changes(rp, tmp_path):
    # copy the results, change one number the paper quotes (Llama-2-7B KV bytes per token,
    # quoted in Table 1 and C12) and check the rendering — and --check — now disagree
    res = tmp_path / "results"
    shutil.copytree(RESULTS, res, ignore=shutil.ignore_patterns("quick", "*.png"))
    before = rp.render(rp.TEMPLATE.read_text(), res)
    doc = json.loads((res / "memory.json").read_text())
    old = doc["models"]["Llama-2-7B"]["kv_mib_per_token"]
    doc["models"]["Llama-2-7B"]["kv_mib_per_token"] = old * 2
    (res / "memory.json").write_text(json.dumps(doc))
    after = rp.render(rp.TEMPLATE.read_text(), res)
    assert before != after
    assert f"{old:.4f}" in before and f"{old * 2:.4f}" in after
    out = REPO / "paper" / "paper.md"
    assert rp.main(["--check", "--results", str(res), "--out", str(out)]) == 1
    assert rp.main(["--check", "--results", str(RESULTS), "--out", str(out)]) == 0


def test_every_placeholder_resolves_and_no_template_syntax_leaks():
    text = (REPO / "paper" / "paper.md").read_text()
    assert "{{" not in text and "}}" not in text
    assert "—|" not in text.replace(" ", "")  # the quick-mode missing marker never reaches the paper


def test_renderer_arithmetic_selectors_and_formats(rp, tmp_path):
    # hand-worked values: a list selector, arithmetic over two references, each format
    (tmp_path / "r.json").write_text(json.dumps({
        "rows": [{"engine": "vllm", "tp": 1, "x": 0.25}, {"engine": "sglang", "tp": 2, "x": 0.5}],
        "n": 1234567, "none": None, "row": {"cell": None}}))
    t = ("{{ $r/rows/engine=sglang&tp=2/x | pct1 }} {{ $r/rows/0/x / $r/rows/1/x | .2f }} "
         "{{ $r/n | int }} {{ $r/none | .3f }} {{ $r/rows/-1/x | +.0% }}")
    assert rp.render(t, tmp_path) == "50.0 0.50 1,234,567 n/a +50%"
    # a null on the way (a cell not computed) is n/a too, alone or in arithmetic
    assert rp.render("{{ $r/row/cell/x | .3f }} {{ $r/row/cell/x + 1 }}", tmp_path) == "n/a n/a"


def test_renderer_direction_words_follow_the_sign(rp, tmp_path):
    # the word is picked by the sign of the rendered value: 3 - 5 < 0, 5 - 3 > 0, 4 - 4 = 0
    (tmp_path / "r.json").write_text(json.dumps({"a": 3, "b": 5, "c": 4}))
    t = ("{{ $r/a - $r/b | dir:higher/lower/the same }} {{ $r/b - $r/a | dir:higher/lower/the same }} "
         "{{ $r/c - $r/c | dir:higher/lower/the same }} {{ $r/c - $r/c | dir:at least/below }}")
    assert rp.render(t, tmp_path) == "lower higher the same at least"
    with pytest.raises(rp.RenderError, match="dir"):
        rp.render("{{ $r/a | dir:up }}", tmp_path)


def test_renderer_errors_name_the_line(rp, tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"a": 1}))
    with pytest.raises(rp.RenderError, match=r":2: .*no key 'b'"):
        rp.render("ok\n{{ $r/b }}\n", tmp_path)
    with pytest.raises(rp.RenderError, match="only"):
        rp.render("{{ $r/a + __import__ }}", tmp_path)
    with pytest.raises(rp.RenderError, match="not found"):
        rp.render("{{ $missing/a }}", tmp_path)


def test_a_range_whose_ends_print_alike_prints_once(rp, tmp_path):
    # {{ A }}–{{ B }}: 0.674 and 0.668 both print 67 at pct0 -> "67 %", not "67–67 %";
    # 0.5 and 0.75 -> "50–75"; a dash between a placeholder and text is left alone
    (tmp_path / "r.json").write_text(json.dumps({"lo": 0.668, "hi": 0.674, "a": 0.5, "b": 0.75}))
    t = ("{{ $r/lo | pct0 }}–{{ $r/hi | pct0 }} % | {{ $r/a | pct0 }}–{{ $r/b | pct0 }} % | "
         "{{ $r/lo | .3f }}–{{ $r/hi | .3f }} | {{ $r/a | pct0 }}–x")
    assert rp.render(t, tmp_path) == "67 % | 50–75 % | 0.668–0.674 | 50–x"


def test_the_quick_rendering_says_it_is_the_reduced_run(rp, tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"a": 1}))
    tmpl = tmp_path / "t.md"
    tmpl.write_text("x {{ $r/a }} {{ $r/missing }}\n")
    text = rp.render_to(tmp_path, tmp_path / "out.md", tmpl, strict=False, note=rp.QUICK_NOTE)
    assert text == rp.HEADER + rp.QUICK_NOTE + "x 1 —\n"
    assert "Reduced run" in rp.QUICK_NOTE and "--quick" in rp.QUICK_NOTE
