"""``python -m experiments --check-fresh``: a result is stale when the code it depends on
changed after the commit its provenance records (experiments/freshness.py).

The checker is tested on a small git repository built here, whose history is worked out
by hand: which commit touched which file, so which result is fresh, stale, dirty, unknown.
On the real repository, one test checks that the command classifies every result, and
the CI gate (``test_every_committed_result_is_fresh``) that every committed result is
fresh; both skip where the clone has no history (shallow).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import freshness as F  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args], check=True,
                          capture_output=True, text=True, env=_ENV).stdout.strip()


def _commit(repo: Path, files: dict, msg: str) -> str:
    for rel, text in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", msg)
    return _git(repo, "rev-parse", "HEAD")


def _result(folder: Path, name: str, script: str | None, commit: str | None = None, dirty: bool = False):
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"x": 1}
    if script:
        doc["provenance"] = {"git_commit": commit, "git_dirty": dirty, "script": f"experiments/{script}.py"}
    (folder / f"{name}.json").write_text(json.dumps(doc))


@pytest.fixture()
def history(tmp_path):
    """c1: everything; c2: tab_c.py; c3: fig_b.py (imported by fig_a.py); c4: a new
    scheduler golden (read by tab_fidelity); c5 edits fig_b.py, c6 puts it back."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    c = {}
    c[1] = _commit(repo, {"radixkv/__init__.py": "v = 1\n", "experiments/_common.py": "# common\n",
                          "experiments/fig_a.py": "import _common\nimport fig_b\n", "experiments/fig_b.py": "B = 1\n",
                          "experiments/tab_c.py": "from experiments import _common\n",
                          "experiments/tab_fidelity.py": "import _common\n",
                          "tests/data/concurrent/vllm/g1.jsonl": "{}\n"}, "c1")
    c[2] = _commit(repo, {"experiments/tab_c.py": "from experiments import _common\nC = 2\n"}, "c2")
    c[3] = _commit(repo, {"experiments/fig_b.py": "B = 3\n"}, "c3")
    c[4] = _commit(repo, {"tests/data/concurrent/vllm/g2.jsonl": "{}\n"}, "c4")
    c[5] = _commit(repo, {"experiments/fig_b.py": "B = 5\n"}, "c5")
    c[6] = _commit(repo, {"experiments/fig_b.py": "B = 3\n"}, "c6 (back to c3's fig_b)")
    res = tmp_path / "results"
    _result(res, "a_c1", "fig_a", c[1])
    _result(res, "a_c3", "fig_a", c[3])
    _result(res, "c_c1", "tab_c", c[1])
    _result(res, "c_c2", "tab_c", c[2])
    _result(res, "fid_c3", "tab_fidelity", c[3])
    _result(res, "dirty", "fig_a", c[6], dirty=True)
    _result(res, "ghost", "fig_a", "0" * 40)
    _result(res, "bench", None)
    return repo, res, c


def test_dependencies_follow_imports_and_declared_data(history):
    repo, _, _ = history
    assert F.dependencies("experiments/fig_a.py", repo) == [
        "experiments/_common.py", "experiments/fig_a.py", "experiments/fig_b.py", "radixkv"]
    assert F.dependencies("tab_c", repo) == ["experiments/_common.py", "experiments/tab_c.py", "radixkv"]
    assert F.dependencies("tab_fidelity", repo) == [
        "experiments/_common.py", "experiments/tab_fidelity.py", "radixkv", "tests/_vllm_sched_golden.py",
        "tests/data/concurrent/vllm"]
    with pytest.raises(ValueError, match="no_such"):
        F.dependencies("experiments/no_such.py", repo)


def test_states_worked_out_by_hand(history):
    repo, res, c = history
    rows = {r["file"]: r for r in F.check_dir(res, repo)}
    state = {k: r["state"] for k, r in rows.items()}
    assert state == {
        "a_c1.json": "stale",     # c3 changed fig_b.py, which fig_a imports (c5 and c6 too)
        "a_c3.json": "fresh",     # c5 changed fig_b.py but c6 put it back: same code as at c3
        "c_c1.json": "stale",     # c2 changed tab_c.py
        "c_c2.json": "fresh",     # c3..c6 touched fig_b.py and a golden, neither read by tab_c
        "fid_c3.json": "stale",   # c4 added a scheduler golden tab_fidelity reads
        "dirty.json": "dirty",    # recorded with uncommitted code
        "ghost.json": "unknown",  # commit not in the history
        "bench.json": "unchecked",  # no provenance block
    }
    short = {k: _git(repo, "rev-parse", "--short", v) for k, v in c.items()}
    assert [ln.split()[0] for ln in rows["a_c1.json"]["changed_by"]] == [short[6], short[5], short[3]]
    assert [ln.split()[0] for ln in rows["c_c1.json"]["changed_by"]] == [short[2]]
    assert [ln.split()[0] for ln in rows["fid_c3.json"]["changed_by"]] == [short[4]]
    assert "not found" in rows["ghost.json"]["reason"]


def test_uncommitted_edits_make_a_result_stale(history):
    repo, res, _ = history
    (repo / "radixkv" / "__init__.py").write_text("v = 2\n")
    r = F.check_result(res / "c_c2.json", repo)
    assert r["state"] == "stale" and r["changed_by"] == [] and "uncommitted" in r["reason"]


def test_exit_status_and_report(history, tmp_path):
    repo, res, _ = history
    out = io.StringIO()
    assert F.main(res, repo, out) == 1
    text = out.getvalue()
    assert "2 fresh, 3 stale, 1 dirty, 1 unknown, 1 unchecked" in text
    good = tmp_path / "good"
    good.mkdir()
    for name in ("a_c3", "c_c2", "bench"):
        shutil.copy(res / f"{name}.json", good)
    assert F.main(good, repo, io.StringIO()) == 0
    plain = tmp_path / "plain"
    plain.mkdir()
    out = io.StringIO()
    assert F.main(res, plain, out) == 2 and "cannot check freshness" in out.getvalue()


def test_a_shallow_clone_cannot_show_freshness(history, tmp_path):
    repo, res, _ = history
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True,
                   capture_output=True, env=_ENV)
    assert F.is_shallow(shallow) and not F.is_shallow(repo)
    r = F.check_result(res / "a_c3.json", shallow)  # c3 is below the one commit kept
    assert r["state"] == "unknown" and "shallow" in r["reason"]
    out = io.StringIO()
    assert F.main(res, shallow, out) == 1 and "shallow clone" in out.getvalue()


def test_the_repository_results_are_classified():
    try:
        shallow = F.is_shallow(REPO)
    except F.GitUnavailable as e:
        pytest.skip(f"no git repository here: {e}")
    if shallow:
        pytest.skip("shallow clone: the commits the results record are not in its history")
    results = REPO / "experiments" / "results"
    rows = F.check_dir(results, REPO)
    assert {r["file"] for r in rows} == {p.name for p in results.glob("*.json")}
    assert all(r["state"] in F.STATES for r in rows)
    out = subprocess.run([sys.executable, "-m", "experiments", "--check-fresh"], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode in (0, 1), out.stderr
    for r in rows:
        assert f"{r['file']}" in out.stdout


def test_a_recorded_module_list_narrows_the_package_dependency(tmp_path):
    """With ``radixkv_modules`` in the provenance, only the modules loaded and the package's
    non-Python files count. m1: a.py, b.py, data/t.json; m2 edits b.py (not loaded: fresh);
    m3 edits data/t.json (stale); m4 edits a.py (stale). Worked out by hand."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    m = {1: _commit(repo, {"radixkv/__init__.py": "", "radixkv/a.py": "A = 1\n", "radixkv/b.py": "B = 1\n",
                           "radixkv/data/t.json": "{}\n", "experiments/_common.py": "#\n",
                           "experiments/fig_a.py": "import _common\n"}, "m1")}
    m[2] = _commit(repo, {"radixkv/b.py": "B = 2\n"}, "m2")
    mods = ["radixkv/__init__.py", "radixkv/a.py"]
    assert F.dependencies("fig_a", repo, mods, m[1]) == [
        "experiments/_common.py", "experiments/fig_a.py", "radixkv/__init__.py", "radixkv/a.py", "radixkv/data/t.json"]
    res = tmp_path / "res"
    res.mkdir()

    def result(name, commit, modules):
        doc = {"provenance": {"git_commit": commit, "git_dirty": False, "script": "experiments/fig_a.py",
                              "radixkv_modules": modules}}
        (res / f"{name}.json").write_text(json.dumps(doc))
        return res / f"{name}.json"

    narrow, whole = result("narrow", m[1], mods), result("whole", m[1], [])
    assert F.check_result(narrow, repo)["state"] == "fresh"   # b.py was never loaded
    assert F.check_result(whole, repo)["state"] == "stale"    # no list: all of radixkv/
    m[3] = _commit(repo, {"radixkv/data/t.json": "{\"x\": 1}\n"}, "m3")
    r = F.check_result(narrow, repo)
    assert r["state"] == "stale" and [ln.split()[1] for ln in r["changed_by"]] == ["m3"]
    fresh_at_3 = result("at3", m[3], mods)
    m[4] = _commit(repo, {"radixkv/a.py": "A = 4\n"}, "m4")
    assert F.check_result(fresh_at_3, repo)["state"] == "stale"
    bad = result("bad", m[4], ["radixkv/../setup.py"])
    assert F.check_result(bad, repo)["state"] == "unknown"


def test_provenance_lists_the_modules_workers_loaded():
    """A module imported only inside a forked worker of ``map_jobs`` is in the list; the
    parent process (a fresh interpreter) never imported it."""
    code = (
        "import sys, json\n"
        f"sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'experiments')!r}]\n"
        "import _common as C\n"
        "def job(j):\n"
        "    import radixkv.trace.stats\n"
        "    return j * 2\n"
        "out = C.map_jobs(job, [1, 2], 2)\n"
        "print(json.dumps([out, 'radixkv.trace.stats' in sys.modules, C.loaded_radixkv_modules()]))\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert cp.returncode == 0, cp.stderr
    out, in_parent, mods = json.loads(cp.stdout.splitlines()[-1])
    assert out == [2, 4] and not in_parent
    assert "radixkv/trace/stats.py" in mods and "radixkv/__init__.py" in mods


def test_every_committed_result_is_fresh():
    """The CI gate of issue 29: every result file of the paper was produced by the code now
    in the repository (its recorded commit's dependencies equal today's). A change to code
    a result depends on fails this test until the result is regenerated; the message names
    the scripts to rerun."""
    try:
        shallow = F.is_shallow(REPO)
    except F.GitUnavailable as e:
        pytest.skip(f"no git repository here: {e}")
    if shallow:
        pytest.skip("shallow clone: the commits the results record are not in its history")
    rows = F.check_dir(REPO / "experiments" / "results", REPO)
    bad = [r for r in rows if r["state"] in ("stale", "dirty", "unknown")]
    scripts = sorted({Path(r["script"]).stem for r in bad if r["script"]})
    assert not bad, ("results older than the code they depend on:\n" + "\n".join(
        f"  {r['file']}: {r['state']} ({r['reason']})" for r in bad)
        + f"\nrerun: python -m experiments --only {','.join(scripts)} --parallel 2, and commit the results")
