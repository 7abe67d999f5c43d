"""The paper's statements about concurrent replay follow from ``concurrent.json``.

Three checks on the committed template and result file (no public traces needed):

1. **No typed numbers.** The concurrent text — section 4.4, and every table row or
   paragraph that quotes ``$concurrent`` (the verdict rows of C1, C2, C4, C8, C9, C10, C14,
   the abstract, the threats) — holds no numeral outside a ``{{ }}`` placeholder, except
   names: claim ids, table/figure numbers, GPU and model names, policy names, the arrival
   scales ×1/×10, p50/p99, and thresholds quoted from the claims themselves. The claim
   column of the verdict table (the claim's own words) is not checked.
2. **The counts are right.** The ``findings`` block that the paper's quantifiers ("in N of
   M cells") render from is recounted here from the grid rows, by a separate loop.
3. **Verdicts follow the data.** Each concurrent verdict word is the one its rule below
   gives on the committed numbers; when a re-run changes a direction, this fails and names
   the claim whose wording must be revisited.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "paper" / "paper.tmpl.md"
RESULT = REPO / "experiments" / "results" / "concurrent.json"

#: numerals that are names or quoted claim thresholds, not results (removed before the check)
ALLOWED = [
    r"\bC\d{1,2}\b",                                   # claim ids
    r"\b(?:Tables?|Figs?\.|Fig\.)\s[\d–\-, a-z]*\d[a-z]?\b",  # table / figure numbers
    r"^#+ [\d.]+",                                     # section numbers
    r"§\d(?:\.\d)?",
    r"\b[AH]100-\d+GB(?:@| at )0\.\d+",                 # pressure labels (GPU at gpu_memory_utilization)
    r"\b[AH]100-\d+GB",                               # GPU names
    r"Llama-3\.1-8B", r"\b8B\b",
    r"\bp50\b", r"\bp99\b",
    r"×1\b", r"×10\b",                                 # arrival scales (settings)
    r"\bvllm:16\b", r"\bsglang:1\b", r"\bblock 16\b", r"\bpage 1\b",
    r"below 20 %", r"< 20 %",                          # C9's own threshold
    r"FAST'25", r"\b512-token hash blocks", r"sha256",
    r"vLLM 0\.33(?:\.0)?(?:'s v1)?", r"SGLang 0\.5\.23",  # engine versions
    r"\bV[01]\b",                                      # vLLM's engine generations (V0, V1)
]
_PLACEHOLDER = re.compile(r"\{\{.+?\}\}")


def _concurrent_text() -> list:
    """(line number, sentence) of each concurrent sentence, placeholders removed.

    Section 4.4 is checked whole; elsewhere, each sentence that quotes ``$concurrent``
    (blocks are paragraphs, table rows and list items; sentences end at ``. `` before a
    capital)."""
    lines = TEMPLATE.read_text().splitlines()
    blocks, cur = [], []
    for no, line in enumerate(lines, 1):
        if not line.strip() or line.startswith(("|", "- ", "#")):  # table rows, list items, headings stand alone
            if cur:
                blocks.append(cur)
            cur = [(no, line)] if line.strip() else []
            if line.startswith(("|", "#")):
                blocks.append(cur)
                cur = []
        else:
            cur.append((no, line))
    if cur:
        blocks.append(cur)
    start = next(i for i, ln in enumerate(lines, 1) if ln.startswith("### 4.4"))
    end = next(i for i, ln in enumerate(lines, 1) if i > start and ln.startswith("#"))
    out = []
    for block in blocks:
        no = block[0][0]
        text = " ".join(t for _, t in block)
        if re.match(r"\| C\d+ \|", text):  # verdict row: the claim's own words are not ours
            text = "|".join(text.split("|")[3:])
        marked = _PLACEHOLDER.sub(lambda m: " ⟦C⟧ " if "$concurrent" in m.group() else " ⟦⟧ ", text)
        if start <= no < end:
            out.append((no, marked))
            continue
        for sent in re.split(r"(?<=[.;])\s+(?=[A-Z*(])", marked):
            if "⟦C⟧" in sent:
                out.append((no, sent))
    return [(no, t.replace("⟦C⟧", " ").replace("⟦⟧", " ")) for no, t in out]


def test_no_number_in_the_concurrent_text_is_typed_by_hand():
    text = _concurrent_text()
    assert len(text) > 30, "the concurrent text was not found (section 4.4 renamed?)"
    bad = []
    for no, t in text:
        for pat in ALLOWED:
            t = re.sub(pat, " ", t)
        for m in re.finditer(r"\d[\d,.]*", t):
            bad.append(f"paper.tmpl.md:{no}: typed number {m.group()!r} in: {t.strip()[:120]}")
    assert not bad, "\n".join(bad)


def test_the_checker_catches_a_typed_number(monkeypatch, tmp_path):
    # the same check on a copy of the template with one rendered number replaced by text
    tmpl = TEMPLATE.read_text()
    m = re.search(r"\{\{ \$concurrent/grid/[^}]*concurrency_mean \| \.1f \}\}", tmpl)
    assert m
    bad = tmp_path / "paper.tmpl.md"
    bad.write_text(tmpl[: m.start()] + "12.3" + tmpl[m.end():])
    monkeypatch.setitem(globals(), "TEMPLATE", bad)
    with pytest.raises(AssertionError, match="typed number '12.3'"):
        test_no_number_in_the_concurrent_text_is_typed_by_hand()


@pytest.fixture(scope="module")
def doc():
    return json.loads(RESULT.read_text())


def _pairs(grid, scale, a="on", b="off"):
    """(row a, row b) per (pressure, engine) at *scale*, both with numbers."""
    out = []
    for ra in grid:
        if ra["time_scale"] != scale or ra["mode"] != a:
            continue
        for rb in grid:
            if (rb["time_scale"], rb["pressure"], rb["engine"], rb["mode"]) == (scale, ra["pressure"], ra["engine"], b):
                out.append((ra, rb))
    return out


def test_findings_recounted_from_the_grid(doc):
    f = doc["findings"]
    for scale in (1.0, 10.0):
        key = f"x{scale:g}"
        ran = [(a, b) for a, b in _pairs(doc["grid"], scale) if a["concurrency_mean"] is not None]
        n_ge = 0
        n_tp = 0
        n_t50 = 0
        n_t99 = 0
        for a, b in ran:
            n_ge += a["concurrency_mean"] >= b["concurrency_mean"]
            n_tp += a["throughput_total_tokens_per_s"] >= b["throughput_total_tokens_per_s"]
            n_t50 += a["ttft_p50_s"] <= b["ttft_p50_s"]
            n_t99 += a["ttft_p99_s"] <= b["ttft_p99_s"]
        assert (f[key]["cells"], f[key]["conc_on_ge_off"], f[key]["tput_on_ge_off"],
                f[key]["ttft_p50_on_le_off"], f[key]["ttft_p99_on_le_off"]) == (len(ran), n_ge, n_tp, n_t50, n_t99)
        st = _pairs(doc["grid"], scale, "static", "on")
        ran_st = [(s, o) for s, o in st if s["concurrency_mean"] is not None]
        assert f[key]["static_cells"] == len(st)
        assert f[key]["static_not_run"] == len(st) - len(ran_st)
        assert f[key]["static_conc_lt_on"] == sum(s["concurrency_mean"] < o["concurrency_mean"] for s, o in ran_st)
        assert f[key]["static_tput_lt_on"] == sum(
            s["throughput_total_tokens_per_s"] < o["throughput_total_tokens_per_s"] for s, o in ran_st)
        assert f[key]["preempt_on_gt_off"] == sum(a["preemptions"] > b["preemptions"] for a, b in ran)
        if ran_st:
            r = sorted(s["concurrency_mean"] / o["concurrency_mean"] for s, o in ran_st)
            assert f[key]["static_over_on_conc"] == {"min": pytest.approx(r[0]), "max": pytest.approx(r[-1])}
        hits = [r["token_hit_rate"] for r in doc["grid"] if r["time_scale"] == scale and r["token_hit_rate"] is not None]
        assert f[key]["hit_max"] == max(hits)


def _verdict(claim: str) -> str:
    row = next(ln for ln in TEMPLATE.read_text().splitlines() if ln.startswith(f"| {claim} |"))
    return row.split("|")[3].strip()


def test_concurrent_verdicts_follow_the_data(doc):
    f = doc["findings"]
    x1, x10 = f["x1"], f["x10"]
    # C2 / C8: the engines' caches never lower concurrency at saturation (x1), a static
    # reservation does; C8 also needs throughput on >= off there.
    on_never_lower = x1["conc_on_ge_off"] == x1["cells"]
    static_lower = x1["static_conc_lt_on"] == x1["static_cells"] - x1["static_not_run"] > 0
    tput_never_lower = x1["tput_on_ge_off"] == x1["cells"]
    assert on_never_lower and static_lower, "C2: the data no longer say 'on never lowers concurrency'"
    assert _verdict("C2").startswith("**does not hold**") and "static" in _verdict("C2")
    assert on_never_lower and tput_never_lower, "C8: revisit the verdict"
    assert _verdict("C8").startswith("**does not hold**")
    # C8 for the static design: the batch shrinks and throughput falls, but not by half
    ran_st = x1["static_cells"] - x1["static_not_run"]
    assert x1["static_tput_lt_on"] == ran_st and x1["static_over_on_conc"]["min"] > 0.5
    assert "not halved" in _verdict("C8")
    # C9: the claim's condition (hit rate < 20 %) holds in every cell, and turning the cache
    # off helps in no cell, scale or MFU/MBU pair (throughput and TTFT p50)
    s = f["sensitivity"]
    never_helps = all(x["tput_on_ge_off"] == x["cells"] and x["ttft_p50_on_le_off"] == x["cells"] for x in (x1, x10)) \
        and s["tput_on_ge_off"] == s["ttft_p50_on_le_off"] == s["pairs"]
    assert max(x1["hit_max"], x10["hit_max"]) < 0.2
    assert never_helps, "C9: turning the cache off helps in some cell: revisit the verdict"
    assert _verdict("C9").startswith("**does not hold**")
    # C14: the step token budget moves the hit rate by < 5 % (relative) for both engines
    for e, m in f["max_num_batched_tokens"].items():
        assert m["hit_max"] - m["hit_min"] <= 0.05 * m["hit_max"], f"C14: {e} hit rate moves with the budget"
    assert _verdict("C14").startswith("**does not hold**")
    # C4: more memory (0.80 -> 0.95) never lowers concurrency or hit rate at the real rate
    g = {(r["pressure"], r["engine"]): r for r in doc["grid"] if r["time_scale"] == 1 and r["mode"] == "on"}
    for e in ("vllm", "sglang"):
        lo, hi = g[("A100-80GB@0.80", e)], g[("A100-80GB@0.95", e)]
        assert hi["concurrency_mean"] >= lo["concurrency_mean"] and hi["token_hit_rate"] >= lo["token_hit_rate"], f"C4 ({e})"
    assert "trade-off does not" in _verdict("C4")
