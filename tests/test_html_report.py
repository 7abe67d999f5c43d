"""``radixkv report`` and ``--report``: a self-contained HTML page, checked as data and in a
real headless browser (Debian's chromium). The browser tests skip only when chromium is
absent and CI is not set; in CI they must run (.ci/run installs chromium)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.html_report import FIGURES, format_value

DEMO = str(Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                                   reason="chromium not installed (CI installs it: .ci/run)")


class _Cells(HTMLParser):
    """Every <td data-key data-value> of every table, and every <img> src, in page order."""

    def __init__(self):
        super().__init__()
        self.tables, self.imgs, self.scripts, self.links = [], [], 0, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.tables.append({"id": a.get("id"), "cells": []})
        elif tag == "td" and "data-key" in a and self.tables:
            self.tables[-1]["cells"].append((a["data-key"], a["data-value"]))
        elif tag == "img":
            self.imgs.append(a.get("src", ""))
        elif tag == "script":
            self.scripts += 1
        for k in ("href", "src"):
            if k in a:
                self.links.append(a[k])


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    """The bundled demo: a sequential compare (with miss causes), a curve and a concurrent replay (timeline and
    per-request rows), reported on one page."""
    d = tmp_path_factory.mktemp("report")
    common = ["--limit", "120", "--quiet", "--no-timing"]
    assert main(["compare", DEMO, "--policies", "vllm:16,vllm:32,sglang:1,none", "--capacity-tokens", "8000",
                 "--miss-causes", "--json", str(d / "compare.json")] + common) == 0
    assert main(["curve", DEMO, "--policies", "vllm:16,unit-lru", "--capacities", "2000,8000,32000",
                 "--json", str(d / "curve.json")] + common) == 0
    assert main(["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "8000", "--mode", "concurrent",
                 "--model", "Llama-3.1-8B", "--gpu", "A100-80GB", "--arrival", "poisson", "--request-rate", "20",
                 "--timeline", str(d / "timeline.csv"), "--per-request", str(d / "requests.csv"),
                 "--json", str(d / "concurrent.json")] + common) == 0
    ins = [d / "compare.json", d / "curve.json", d / "concurrent.json", d / "timeline.csv", d / "requests.csv"]
    out = d / "report.html"
    assert main(["report", *map(str, ins), "--out", str(out)]) == 0
    return d, out


def _expected_cells(d):
    """(key, value) of every summary cell, straight from the JSON files, sorted (a table's
    rows are in the text tables' order, the all-n/a rows folded into a second table)."""
    want = []
    for name in ("compare.json", "concurrent.json"):
        doc = json.loads((d / name).read_text())
        keys = []
        for r in doc["results"]:
            for k, v in r["summary"].items():
                if k not in keys and k != "policy" and (v is None or isinstance(v, (int, float, str))):
                    keys.append(k)
        want.append(sorted(((k, r["summary"].get(k)) for k in keys for r in doc["results"]), key=repr))
    return want


def _summary_cells(tables):
    """Per result document, the cells of its summary table and of its folded n/a table."""
    out = {}
    for t in tables:
        m = re.fullmatch(r"summary-(\d+)(-na)?", t["id"] or "")
        if m:
            out.setdefault(int(m.group(1)), []).extend(t["cells"])
    return [out[i] for i in sorted(out)]


def _matches(cells, want) -> bool:
    """The page's cells are the JSON's (key, value) pairs, each once."""
    if len(cells) != len(want):
        return False
    rest = list(want)
    for k, cv in cells:
        hit = next((n for n, (wk, wv) in enumerate(rest) if wk == k and _same(cv, wv)), None)
        if hit is None:
            return False
        rest.pop(hit)
    return True


def _same(cell_value: str, v) -> bool:
    if v is None:
        return cell_value == "null"
    return float(cell_value) == float(v) if isinstance(v, (int, float)) else cell_value == str(v)


def test_page_is_self_contained_and_holds_the_json_numbers(demo_report):
    d, out = demo_report
    page = out.read_text()
    p = _Cells()
    p.feed(page)
    assert p.scripts == 0
    assert all(s.startswith("data:image/png;base64,") for s in p.imgs)
    assert not [u for u in p.links if re.match(r"(https?:)?//", u)]  # no network
    assert len(p.imgs) == len(FIGURES)  # every figure drawn from these inputs
    summaries = _summary_cells(p.tables)
    want = _expected_cells(d)
    assert len(summaries) == len(want) == 2
    for cells, w in zip(summaries, want):
        assert _matches(cells, w)
    # the folded tables hold exactly the rows that are n/a in every column, and only those
    for t in p.tables:
        if re.fullmatch(r"summary-\d+", t["id"] or ""):
            rows = {}
            for k, v in t["cells"]:
                rows.setdefault(k, []).append(v)
            assert not [k for k, vs in rows.items() if all(v == "null" for v in vs)]
        if re.fullmatch(r"summary-\d+-na", t["id"] or ""):
            assert t["cells"] and all(v == "null" for _, v in t["cells"])
    assert page.count("<details>") == 2 and page.index('id="headline"') < page.index('id="summary-0"')
    curve = json.loads((d / "curve.json").read_text())
    cells = [c for t in p.tables if (t["id"] or "").startswith("curve-") for c in t["cells"]]
    hit = [pt["token_hit_rate"] for cap in (2000, 8000, 32000) for c in curve["curves"]
           for pt in c["points"] if pt["capacity_tokens"] == cap]
    assert [float(v) for _, v in cells] == hit
    # the sequential replay does not model internal fragmentation: n/a, never 0
    assert re.search(r'data-key="internal_fragmentation_share_mean" data-value="null">n/a<', page)


def test_report_is_deterministic_and_named_on_bad_input(demo_report, tmp_path, capsys):
    d, out = demo_report
    again = tmp_path / "again.html"
    args = [str(d / "compare.json"), str(d / "curve.json")]
    assert main(["report", *args, "--out", str(again)]) == 0
    assert main(["report", *args, "--out", str(tmp_path / "b.html")]) == 0
    assert again.read_bytes() == (tmp_path / "b.html").read_bytes()
    bad = tmp_path / "x.json"
    bad.write_text('{"results": [\n')
    assert main(["report", str(bad), "--out", str(tmp_path / "c.html")]) == 2
    assert "x.json, line 2" in capsys.readouterr().err
    assert not (tmp_path / "c.html").exists()


def test_format_value():
    assert [format_value(v) for v in (None, float("nan"), 1234567, 0.25, "a")] == ["n/a", "n/a", "1,234,567", "0.25", "a"]


# ---------------------------------------------------------------------- real browser
def _chromium(tmp_path, *args, url):
    if CHROMIUM is None:
        pytest.fail("CI is set but chromium is not installed")
    prof = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--disable-component-update", "--disable-sync", f"--user-data-dir={prof}",
           "--enable-logging=stderr", "--v=0", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln and ("ERROR" in ln or "Uncaught" in ln)]


_PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) if (imgs[i].complete && imgs[i].naturalWidth > 300) ok++;
  var p = document.createElement('p'); p.id = 'probe';
  p.textContent = 'images ' + imgs.length + ' rendered ' + ok;
  document.body.appendChild(p);
});
</script>"""


@needs_browser
def test_console_error_detection_can_fail(tmp_path):
    """The console check sees a page's errors (so its silence below means something)."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>console.error('boom'); undefinedCall();</script></body></html>")
    r = _chromium(tmp_path, "--dump-dom", url=bad.as_uri())
    assert _console_errors(r.stderr), r.stderr[-2000:]


@needs_browser
def test_report_in_headless_chromium(demo_report, tmp_path):
    d, out = demo_report
    # 1. the page as written: no console errors, and the DOM holds the JSON's numbers
    r = _chromium(tmp_path, "--dump-dom", url=out.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    assert not _console_errors(r.stderr), _console_errors(r.stderr)
    p = _Cells()
    p.feed(r.stdout)
    summaries = _summary_cells(p.tables)
    want = _expected_cells(d)
    assert len(summaries) == len(want)
    for cells, w in zip(summaries, want):
        assert _matches(cells, w)
    # 2. every figure decodes and renders: a probe script on a copy of the page
    probe = tmp_path / "probe.html"
    probe.write_text(out.read_text().replace("</body>", _PROBE + "</body>"))
    r = _chromium(tmp_path, "--dump-dom", "--virtual-time-budget=5000", url=probe.as_uri())
    m = re.search(r'id="probe">images (\d+) rendered (\d+)<', r.stdout)
    assert m and int(m.group(1)) == len(FIGURES) and int(m.group(2)) == len(FIGURES), r.stdout[-500:]
    # 3. a screenshot of the whole page: the size asked for, and not blank
    shot = tmp_path / "shot.png"
    r = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,3000", "--hide-scrollbars", url=out.as_uri())
    assert shot.exists(), r.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(str(shot))
    assert img.shape[:2] == (3000, 1200)
    assert shot.stat().st_size > 100_000  # tables and six figures, not an empty page
    assert float(img[..., :3].std()) > 0.05


def test_check_and_sweep_write_reports_holding_their_numbers(tmp_path, capsys):
    """``--report`` on ``check`` and ``sweep``: the page's cells are the JSON's numbers."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[[trace]]\nname = "demo"\npath = "{DEMO}"\nlimit = 60\n\n'
                   '[[policy]]\npolicy = "vllm:16"\ncapacity_tokens = 4000\n\n'
                   '[[assert]]\nmin_token_hit_rate = 0.01\n')
    js, page = tmp_path / "c.json", tmp_path / "c.html"
    assert main(["check", str(cfg), "--json", str(js), "--report", str(page), "--quiet"]) == 0
    doc = json.loads(js.read_text())
    p = _Cells()
    p.feed(page.read_text())
    cells = dict(p.tables[0]["cells"])
    assert float(cells["token_hit_rate"]) == doc["results"][0]["token_hit_rate"]
    grid = tmp_path / "g.toml"
    grid.write_text(f'traces = ["{DEMO}"]\npolicies = ["vllm:16"]\nlimit = 60\ncapacity_tokens = [2000, 8000]\n')
    out, page = tmp_path / "sw", tmp_path / "s.html"
    assert main(["sweep", str(grid), "--out", str(out), "--executor", "local", "--quiet", "--report", str(page)]) == 0
    from radixkv.sweep.store import read_rows

    rows = {r["settings"]["capacity_tokens"]: r["metrics"]["token_hit_rate"] for r in read_rows(out)}
    p = _Cells()
    p.feed(page.read_text())
    curve = [float(v) for t in p.tables if (t["id"] or "").startswith("curve-") for _, v in t["cells"]]
    assert curve == [rows[2000], rows[8000]]
    assert len(p.imgs) == 3  # curve, histogram, alignment loss (no timeline or per-request rows)


# ---------------------------------------------------------------------- issue 32: a readable page
def test_headline_table_first_with_the_policies_as_columns(demo_report):
    d, out = demo_report
    page = out.read_text()
    p = _Cells()
    p.feed(page)
    head = next(t for t in p.tables if t["id"] == "headline")
    cmp_ = json.loads((d / "compare.json").read_text())["results"]
    conc = json.loads((d / "concurrent.json").read_text())["results"]
    cols = [r["summary"] for r in cmp_ + conc]
    keys = ["token_hit_rate", "hit_tokens", "evictions", "ttft_p50_s", "ttft_p99_s"]
    assert [k for k, _ in head["cells"]] == [k for k in keys for _ in cols]
    assert all(_same(v, cols[n % len(cols)].get(k)) for n, (k, v) in enumerate(head["cells"]))
    # the policies head the columns; the concurrent replay reads apart from the sequential one
    m = re.search(r'<table class="headline" id="headline"><thead><tr><th></th>(.*?)</tr>', page)
    assert re.findall(r"<th>(.*?)</th>", m.group(1)) == ["vllm:16", "vllm:32", "sglang:1", "none:16",
                                                          "vllm:16 (concurrent)"]
    # a sequential replay has no TTFT, a concurrent one counts no evictions: n/a, never 0
    assert dict(head["cells"][3 * len(cols):3 * len(cols) + 4]) == {"ttft_p50_s": "null"}
    assert head["cells"][3 * len(cols) - 1] == ("evictions", "null")


def test_rows_read_as_words_with_the_key_on_hover(demo_report):
    _, out = demo_report
    page = out.read_text()
    assert '<th class="metric" title="token_hit_rate">token hit rate</th>' in page
    assert '<th class="metric" title="ttft_p99_s">TTFT p99 (s)</th>' in page
    assert '<th class="metric" title="tpot_mean_s">TPOT mean (s)</th>' in page
    heads = re.findall(r'<th class="metric" title="[^"]*">([^<]*)</th>', page)
    assert heads and not [h for h in heads if "_" in h]  # no raw snake_case row
    # in the text tables' order: the sequential table starts with requests, pool, prompt, hit tokens
    first = re.search(r'id="summary-0">.*?</table>', page).group(0)
    assert re.findall(r'<th class="metric" title="([^"]*)"', first)[:5] == [
        "requests", "pool_capacity_tokens", "pool_slots", "prompt_tokens", "hit_tokens"]


def test_csv_tables_are_named_by_the_policy_of_their_run(demo_report):
    from radixkv.html_report import name_tables, read_input

    d, _ = demo_report
    docs = [read_input(d / n)["doc"] for n in ("compare.json", "concurrent.json")]
    tl, pr = read_input(d / "timeline.csv"), read_input(d / "requests.csv")
    assert (tl["label"], pr["label"]) == ("timeline", "requests")  # the files' names
    assert [t["label"] for t in name_tables(docs, [tl, pr])] == ["vllm:16 (concurrent)"] * 2
    # without the concurrent JSON nothing matches (the sequential vllm:16 hit other tokens): the file name stays
    assert [t["label"] for t in name_tables(docs[:1], [tl, pr])] == ["timeline", "requests"]
    # one request fewer is another run
    short = dict(pr, columns={k: v[:-1] for k, v in pr["columns"].items()})
    assert name_tables(docs, [short])[0]["label"] == "requests"


def test_provenance_says_not_recorded_instead_of_question_marks(tmp_path):
    from radixkv.html_report import render_report, sweep_doc

    row = {"key": "k", "trace": {"path": "t.jsonl", "sha256": "0"}, "settings": {"policy": "vllm:16"},
           "metrics": {"token_hit_rate": 0.5}, "pool": {"capacity_tokens": 100}}
    page = render_report([{"kind": "json", "doc": sweep_doc([row]), "label": "sweep"},
                          {"kind": "json", "doc": {"results": [{"policy": "x", "summary": {}}]}, "label": "bare"}])
    prov = page[page.index('class="provenance"'):]
    assert "?" not in prov and "not recorded" in prov


@needs_browser
@pytest.mark.slow
def test_docs_report_demo_png_is_the_readme_report_today(tmp_path):
    """docs/report-demo.png is the page the README's report commands make now: a fresh
    screenshot (tools/report_demo.py) has its size and nearly all its pixels."""
    import sys

    import matplotlib.image as mpimg

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import report_demo

    page = report_demo.run_commands(tmp_path)
    shot = tmp_path / "shot.png"
    report_demo.screenshot(page, shot, browser=CHROMIUM)
    new, old = mpimg.imread(str(shot))[..., :3], mpimg.imread(str(report_demo.ROOT / "docs" / "report-demo.png"))[..., :3]
    assert new.shape == old.shape, "docs/report-demo.png is stale: python tools/report_demo.py"
    assert float((abs(new - old) > 0.1).mean()) < 0.01, "docs/report-demo.png is stale: python tools/report_demo.py"


# ---------------------------------------------------------------------- issue 30: the plan's section
def _pt(replicas, *, cache=True, gpu="A100-80GB"):
    return {"engine": "vllm", "gpu": gpu, "tp": 1, "replicas": replicas, "gpus": replicas,
            "gpu_memory_utilization": 0.9, "max_num_batched_tokens": 8192, "max_num_seqs": 256, "block_size": 16,
            "prefix_caching": cache, "kv_cache_dtype": None, "router": None if replicas == 1 else "prefix-aware"}


def _outcome(point, cost, ttft, tpot, meets, overloaded=False):
    return {"point": point, "cost_per_hour": cost, "replayed": True, "pruned": None, "meets_slo": meets,
            "overloaded": overloaded, "misses": {} if meets else {"ttft_p99": 2.0},
            "ttft_p50_s": None if overloaded else ttft / 2, "ttft_p99_s": None if overloaded else ttft,
            "tpot_p50_s": None if overloaded else tpot / 2, "tpot_p99_s": None if overloaded else tpot,
            "throughput_output_tokens_per_s": 900.0, "throughput_total_tokens_per_s": 9000.0,
            "token_hit_rate": 0.25, "preemptions": 0, "queue_growth_s_per_s": 0.9 if overloaded else 0.0,
            "rejected_requests": 0}


def _plan_doc():
    """A plan's document written by hand (the shape ``radixkv plan --json`` writes): 2 A100s
    recommended; 1 A100 is the next cheaper point and is overloaded; caching off is a
    runner-up at the same cost."""
    rec = _outcome(_pt(2), 3.2, 0.080, 0.030, True)
    off = _outcome(_pt(2, cache=False), 3.2, 0.095, 0.031, True)
    one = _outcome(_pt(1), 1.6, None, None, False, overloaded=True)
    rec.update(engine_command="vllm serve Llama-3.1-8B --tensor-parallel-size 1", replicas_note="2 replicas of this "
               "command behind a prefix-aware router", replay_command="radixkv replay t.jsonl --replicas 2",
               replay_argv=["replay", "t.jsonl", "--replicas", "2"])
    return {"radixkv": "0.0", "trace": {"path": "t.jsonl", "requests": 40, "prompt_tokens": 4000, "output_tokens": 400,
                                        "span_s": 10.0, "rate_scale": 1.0, "offered_tokens_per_s": 440.0,
                                        "hit_rate_bound": 0.3},
            "model": "Llama-3.1-8B", "slo": {"ttft_p99": 0.1, "tpot_p99": 0.04}, "cost_unit": "$/h",
            "prices": {"A100-80GB": 1.6}, "cost_model": "roofline", "uncertainty": "no interval",
            "recommendation": rec, "runner_ups": [off], "next_cheaper": dict(one, replay_argv=[]),
            "prefix_caching": {"verdict": "on", "on": rec, "off": off,
                               "text": "prefix caching: turn it ON — hit rate 25.0% (both meet the SLO)"},
            "sensitivity": [{"knob": "prefix_caching", **off}],
            "search": {"replayed": 3, "pruned": {"cost bound": 1}, "budget": 40, "budget_exhausted": False,
                       "min_replicas_by_throughput": {"vllm/A100-80GB/tp1": 1}},
            "points": [one, rec, off]}


def test_plan_section_holds_the_plan_and_flags_overload(tmp_path):
    from radixkv.html_report import render_report

    doc = _plan_doc()
    page = render_report([{"kind": "plan", "doc": doc, "label": "plan.json"}])
    p = _Cells()
    p.feed(page)
    assert p.scripts == 0 and not [u for u in p.links if re.match(r"(https?:)?//", u)]
    assert len(p.imgs) == 1 and p.imgs[0].startswith("data:image/png;base64,")  # the Pareto plot only
    assert 'id="fig-plan-pareto-0"' in page and "Cost vs TTFT p99" in page
    assert "At a glance" not in page and "Not in these inputs" not in page  # a plan alone: no replay figures
    tables = {t["id"]: t["cells"] for t in p.tables}
    rows = tables["plan-0"]
    # recommended, runner-up (caching off), next cheaper: each row's cost and latencies are the document's
    assert [float(v) for k, v in rows if k == "cost_per_hour"] == [3.2, 3.2, 1.6]
    assert [v for k, v in rows if k == "ttft_p99_s"] == ["0.08", "0.095", "overload"]
    assert [v for k, v in rows if k == "tpot_p99_s"] == ["0.03", "0.031", "overload"]
    assert [v for k, v in rows if k == "meets_slo"] == ["yes", "yes", "no"]
    # overload is flagged, never shown as a latency
    assert re.search(r'id="plan-0-overload">.*1 of 3 replayed points never catch up', page)
    assert "vllm A100-80GB tp1 x2 gmu=0.9 mnbt=8192 seqs=256 block=16 cache=off" in page
    assert 'id="plan-0-verdict"' in page and "turn it ON" in page
    assert [v for k, v in tables["plan-0-sensitivity"] if k == "ttft_p99_s"] == ["0.095"]
    assert "vllm serve Llama-3.1-8B" in page and "radixkv replay t.jsonl --replicas 2" in page
    assert "Search: 3 points replayed (budget 40); pruned: 1 by cost bound." in page
    # same document, same bytes
    assert render_report([{"kind": "plan", "doc": doc, "label": "plan.json"}]) == page


def test_plan_report_from_the_cli_and_from_its_json(tmp_path, capsys):
    """``radixkv plan --report`` and ``radixkv report plan.json`` give the same plan section;
    a plan next to a replay result gets both; a plan document missing a field exits 2 naming it."""
    trace = tmp_path / "t.jsonl"
    assert main(["trace", "synth", "multi_turn", "--requests", "12", "--seed", "1", "--rate", "2",
                 "--out", str(trace)]) == 0
    js, page = tmp_path / "plan.json", tmp_path / "plan.html"
    assert main(["plan", str(trace), "--model", "Llama-3.1-8B", "--slo", "ttft_p99=2s,tpot_p99=100ms",
                 "--gpus", "A100-80GB", "--tp", "1", "--budget", "4", "--json", str(js), "--report", str(page)]) == 0
    doc = json.loads(js.read_text())
    again = tmp_path / "again.html"
    assert main(["report", str(js), "--out", str(again)]) == 0

    def section(text):
        return text[text.index('<section class="plan"'):text.index("<h2>Provenance</h2>")]

    assert section(page.read_text()) == section(again.read_text())
    p = _Cells()
    p.feed(page.read_text())
    rows = dict(next(t for t in p.tables if t["id"] == "plan-0")["cells"][:6])
    assert float(rows["cost_per_hour"]) == doc["recommendation"]["cost_per_hour"]
    assert float(rows["ttft_p99_s"]) == doc["recommendation"]["ttft_p99_s"]
    assert doc["prefix_caching"]["text"] in html_unescape(page.read_text())
    # with a replay result: the plan's section and the replay's tables on one page
    rj = tmp_path / "replay.json"
    assert main(["replay", DEMO, "--policy", "vllm:16", "--capacity-tokens", "8000", "--limit", "60", "--quiet",
                 "--json", str(rj)]) == 0
    both = tmp_path / "both.html"
    assert main(["report", str(js), str(rj), "--out", str(both)]) == 0
    text = both.read_text()
    assert 'id="plan-0"' in text and 'id="summary-0"' in text
    # a plan document without its recommendation's point: named
    bad = dict(doc, recommendation={k: v for k, v in doc["recommendation"].items() if k != "point"})
    (tmp_path / "bad.json").write_text(json.dumps(bad, indent=1))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "bad.json"), "--out", str(tmp_path / "bad.html")]) == 2
    assert "recommendation.point" in capsys.readouterr().err


def html_unescape(s: str) -> str:
    import html

    return html.unescape(s)


@pytest.mark.parametrize("text, what", [
    ('{"id": "a", "tokens": [1, 2, 3], "output_length": 1}\n{"id": "b", "tokens": [1, 2], "output_length": 1}\n',
     "is a native trace (JSON Lines, one request per line), not a radixkv result"),
    ('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n'
     '{"timestamp": 9, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n',
     "is a mooncake trace (JSON Lines, one request per line), not a radixkv result"),
    ('{"a": 1}\n{"b": 2}\n', "is JSON Lines (one JSON object per line), not a radixkv result"),
])
def test_a_json_lines_input_is_named_as_such_not_as_invalid_json(tmp_path, capsys, text, what):
    # before the fix: "line 2: invalid JSON: Extra data (column 1)"
    p = tmp_path / "given.jsonl"
    p.write_text(text)
    assert main(["report", str(p), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"{p}, field 'results': {what}" in err and "--json" in err
    assert "Extra data" not in err and "Traceback" not in err and not (tmp_path / "r.html").exists()
