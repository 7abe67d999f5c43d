"""The experiment pipeline's plumbing: the one command, confidence intervals, trace digests.

The experiments themselves read public traces and take minutes; here only what they are
built from is checked, against values worked out by hand.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def common():
    sys.path.insert(0, str(REPO / "experiments"))
    import _common

    return _common


def test_mean_ci_by_hand(common):
    # values 1..5: mean 3, sample sd sqrt(2.5), t(0.975, 4) = 2.776 → half-width 2.776·1.5811/√5
    r = common.mean_ci([1, 2, 3, 4, 5])
    assert r["mean"] == 3.0 and r["n"] == 5
    assert r["ci95"] == pytest.approx(2.776 * (2.5 ** 0.5) / 5 ** 0.5, rel=1e-12)


def test_directory_digest_is_independent_of_location(common, tmp_path):
    for root in (tmp_path / "a", tmp_path / "b"):
        (root / "sub").mkdir(parents=True)
        (root / "x.json").write_text("1")
        (root / "sub" / "y.json").write_text("22")
    da, db = common.sha256_path(tmp_path / "a"), common.sha256_path(tmp_path / "b")
    assert da == db
    h = hashlib.sha256()
    for name, data in (("sub/y.json", b"22"), ("x.json", b"1")):
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256(data).digest())
    assert da == h.hexdigest()
    f = tmp_path / "a" / "x.json"
    assert common.sha256_path(f) == hashlib.sha256(b"1").hexdigest()


def test_provenance_names_no_absolute_path(common):
    p = common.provenance({"seed": 3})
    assert p["settings"] == {"seed": 3}
    for key in ("radixkv_version", "python", "numpy", "numba"):
        assert p[key]
    assert str(REPO) not in repr(p)


def test_one_command_lists_and_rejects(tmp_path):
    out = subprocess.run([sys.executable, "-m", "experiments", "--help"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "--quick" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "experiments", "--only", "nope"], cwd=REPO, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "unknown script(s): nope" in bad.stderr


def test_every_script_is_listed_in_the_readme():
    sys.path.insert(0, str(REPO))
    from experiments.run_all import SCRIPTS

    readme = (REPO / "experiments" / "README.md").read_text()
    for name, *_ in SCRIPTS:
        assert (REPO / "experiments" / f"{name}.py").exists()
        assert f"`{name}.py`" in readme


def test_a_full_run_and_plot_only_draw_from_the_same_document(common, tmp_path, monkeypatch):
    # the result file's keys are sorted; a figure drawn from main()'s in-memory dict (insertion
    # order) would differ from a --plot-only redraw (file order), so both draw from the file
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(common, "REPO", tmp_path)
    seen = []

    def main():
        common.write_result("t.json", {"zeta": 1, "alpha": 2}, {})

    def plot(doc):
        seen.append([k for k in doc if k != "provenance"])

    monkeypatch.setattr(sys, "argv", ["fig_t.py"])
    common.main_or_plot(main, plot, "t.json")
    monkeypatch.setattr(sys, "argv", ["fig_t.py", "--plot-only"])
    common.main_or_plot(main, plot, "t.json")
    assert seen == [["alpha", "zeta"], ["alpha", "zeta"]]
