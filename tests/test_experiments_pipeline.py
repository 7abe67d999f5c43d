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


def test_mooncake_kvsim_trace_variants_by_hand(common):
    # fig_mooncake_kvsim's hypotheses as traces, U = 512: r0 = 900 tokens over ids [1, 2]
    # (a partial last block of 388), r1 = 1,024 tokens over [1, 3] (two whole blocks)
    from radixkv.trace.types import Trace

    import fig_mooncake_kvsim as K

    t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[900, 1024], output_len=[7, 9],
                            prompt_ids=[[1, 2], [1, 3]], unit_tokens=512, partial_last_unit=True)

    def ids(tr, i):
        return tr.ids[tr.id_offsets[i]:tr.id_offsets[i + 1]].tolist()

    d = K.variant(t, "drop_partial")  # 900 -> 512 over [1]; 1,024 unchanged
    assert d.prompt_len.tolist() == [512, 1024] and ids(d, 0) == [1] and ids(d, 1) == [1, 3]
    u = K.variant(t, "round_up")  # the partial block counted whole: 900 -> 1,024
    assert u.prompt_len.tolist() == [1024, 1024] and ids(u, 0) == [1, 2]
    o = K.variant(t, "no_outputs")
    assert o.output_len.tolist() == [0, 0] and o.prompt_len.tolist() == [900, 1024]
    assert K.variant(t, None) is t
    # 10,000 tokens -> 19 blocks -> 1.1875 GiB of Llama-3.1-8B bf16 (2^26 bytes per block) -> 19 blocks
    assert (10_000 // K.UNIT) / K.BLOCKS_PER_GIB * 2 ** 30 / 2 ** 26 == 19
