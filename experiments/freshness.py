"""Is each result file as new as the code it was computed by?  (``python -m experiments --check-fresh``)

Every result JSON written by :func:`_common.write_result` carries a ``provenance`` block with
the commit of the repository that produced it (``git_commit``) and whether ``radixkv/`` or
``experiments/`` had uncommitted changes then (``git_dirty``). A result is *fresh* when the
code it depends on is the same now as at that commit.

**What a result depends on** (:func:`dependencies`), as paths of the repository:

* the radixkv modules the script loaded, recorded in the provenance (``radixkv_modules``:
  every ``radixkv/...py`` in ``sys.modules`` when the result was written, plus those its
  worker processes loaded). Policies, kernels and cost models picked by name at run time
  are imported when used, so they are in the list; a module the script never loaded cannot
  have changed its numbers, and a newly added module it would load now can only be reached
  through a change to one it loaded. With the list, a change to e.g. the CLI or ``plan``
  leaves a paper result fresh;
* every file of ``radixkv/`` that is not Python (the clock's measured tables under
  ``radixkv/clock/data``), at the recorded commit and now;
* ``radixkv/`` as a whole when the provenance has no module list (results written before
  it was recorded, or by a radixkv imported from outside the repository): the safe
  superset;
* ``experiments/_common.py`` (trace loading, provenance, result writing);
* the script named in the provenance (``experiments/NAME.py``) and every experiment module
  it imports, transitively (read from its ``import`` statements: ``fig_mooncake_kvsim``
  imports ``fig_mooncake_curve``);
* the repository data files the script reads (:data:`DATA`: the scheduler goldens for
  ``tab_fidelity``, the published runs for ``tab_e2e_clock``, …).

Inputs outside the repository (the public traces and engine goldens in ``$RADIXKV_SHARED``)
are not under this repository's git; the provenance records their sha256 instead.

**The test** (:func:`check_result`): with C the recorded commit, the result is

* ``fresh`` when C is in this clone and ``git diff --quiet C -- DEPS`` finds the
  dependencies identical in C and in the working tree (so: no commit after C changed them,
  or a later one changed them back, and nothing uncommitted changes them);
* ``stale`` otherwise; the reason names the commits in ``C..HEAD`` that touched the
  dependencies (``git log C..HEAD -- DEPS``) and says if uncommitted edits do;
* ``dirty`` when the provenance says the code had uncommitted changes: C does not describe
  the code that ran, so freshness cannot be shown;
* ``unknown`` when C is not in this clone (a shallow clone, or a commit rebased away);
* ``unchecked`` for a JSON without a provenance block (the benchmark files that are not part
  of the paper).

Exit status of :func:`main`: 0 when every checked result is fresh, 1 when any is stale,
dirty or unknown, 2 when git or the repository's history is not available.
"""
from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: paths every result depends on; ``radixkv`` stands for the whole package only when the
#: provenance does not list the modules loaded (module docstring)
COMMON = ("radixkv", "experiments/_common.py")

#: repository files a script reads besides code (script name → paths)
DATA = {
    "tab_fidelity": ("tests/data/concurrent/vllm", "tests/_vllm_sched_golden.py"),
    "tab_e2e_clock": ("tests/data/published_serving_runs.json",),
    "tab_memory_calibration": ("tests/data/memory_calibration.json",),
    "tab_scenarios": ("traces",),
}

STATES = ("fresh", "stale", "dirty", "unknown", "unchecked")


class GitUnavailable(RuntimeError):
    """git is not installed, or *repo* is not a git work tree."""


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        cp = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    except OSError as e:
        raise GitUnavailable(f"git not runnable: {e}") from None
    if check and cp.returncode != 0:
        raise GitUnavailable(f"git {' '.join(args)} in {repo}: {cp.stderr.strip()}")
    return cp


def _imported_experiments(script: Path, exp_dir: Path, seen: set) -> None:
    """Add to *seen* the experiment modules *script* imports, transitively (by file stem)."""
    try:
        tree = ast.parse(script.read_text(), filename=str(script))
    except (OSError, SyntaxError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            stem = parts[1] if parts[0] == "experiments" and len(parts) > 1 else parts[0]
            if stem not in seen and (exp_dir / f"{stem}.py").is_file():
                seen.add(stem)
                _imported_experiments(exp_dir / f"{stem}.py", exp_dir, seen)


def _package_data(repo: Path, commit: str | None) -> set:
    """The non-Python files under ``radixkv/`` now (tracked) and at *commit*."""
    names = set(_git(repo, "ls-files", "--", "radixkv", check=False).stdout.split())
    if commit:
        names |= set(_git(repo, "ls-tree", "-r", "--name-only", commit, "--", "radixkv", check=False).stdout.split())
    return {n for n in names if not n.endswith(".py")}


def dependencies(script: str, repo: Path = REPO, modules: list | None = None, commit: str | None = None) -> list:
    """The repository paths (relative, ``/``-separated, sorted) a result of *script* depends on.

    *script* is the provenance's ``script`` (``experiments/NAME.py``) or a bare ``NAME``;
    *modules* the provenance's ``radixkv_modules`` (``radixkv/...py`` paths; ``None`` or empty:
    the whole ``radixkv/``); *commit* the recorded commit, whose non-Python package files are
    added to today's. Raises ``ValueError`` when the script is not a file under
    ``experiments/`` or a module path is not under ``radixkv/``."""
    stem = Path(script).stem
    exp_dir = repo / "experiments"
    path = exp_dir / f"{stem}.py"
    if not path.is_file():
        raise ValueError(f"{script}: no such experiment script in {exp_dir}")
    stems = {stem}
    _imported_experiments(path, exp_dir, stems)
    deps = set(COMMON) | {f"experiments/{s}.py" for s in stems}
    if modules:
        bad = [m for m in modules if not (isinstance(m, str) and m.startswith("radixkv/") and m.endswith(".py")
                                          and ".." not in m.split("/"))]
        if bad:
            raise ValueError(f"{script}: provenance radixkv_modules entry {bad[0]!r} is not a radixkv/...py path")
        deps.discard("radixkv")
        deps.update(modules)
        deps.update(_package_data(repo, commit))
    for s in stems:
        deps.update(DATA.get(s, ()))
    return sorted(deps)


def is_shallow(repo: Path = REPO) -> bool:
    """Whether *repo* is a shallow clone (history cut off: old commits absent)."""
    return _git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"


def check_result(path: Path, repo: Path = REPO) -> dict:
    """The freshness of result file *path*: ``{"file", "state", "commit", "script", "deps",
    "changed_by", "reason"}``; ``state`` is one of :data:`STATES` (module docstring).

    Raises :class:`GitUnavailable` when *repo* is not a git work tree, ``ValueError`` when
    *path* is not JSON (message names the file)."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    out = {"file": Path(path).name, "commit": None, "script": None, "deps": [], "changed_by": [], "reason": ""}
    prov = doc.get("provenance") if isinstance(doc, dict) else None
    if not isinstance(prov, dict) or not prov.get("git_commit") or not prov.get("script"):
        return {**out, "state": "unchecked", "reason": "no provenance block (commit and script)"}
    commit, script = prov["git_commit"], prov["script"]
    out.update(commit=commit, script=script)
    try:
        deps = dependencies(script, repo, prov.get("radixkv_modules") or None, commit)
    except ValueError as e:
        return {**out, "state": "unknown", "reason": str(e)}
    out["deps"] = deps
    if prov.get("git_dirty"):
        return {**out, "state": "dirty",
                "reason": "produced with uncommitted changes to radixkv/ or experiments/: the commit does not describe it"}
    if _git(repo, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
        why = "this clone is shallow" if is_shallow(repo) else "not in this repository's history"
        return {**out, "state": "unknown", "reason": f"commit {commit[:10]} not found ({why})"}
    diff = _git(repo, "diff", "--quiet", commit, "--", *deps, check=False)
    if diff.returncode == 0:
        return {**out, "state": "fresh", "reason": f"dependencies unchanged since {commit[:10]}"}
    if diff.returncode != 1:
        raise GitUnavailable(f"git diff {commit[:10]}: {diff.stderr.strip()}")
    log = _git(repo, "log", "--format=%h %s", f"{commit}..HEAD", "--", *deps, check=False)
    changed = [ln for ln in log.stdout.splitlines() if ln.strip()]
    out["changed_by"] = changed
    uncommitted = _git(repo, "diff", "--quiet", "HEAD", "--", *deps, check=False).returncode == 1
    parts = [f"{len(changed)} later commit(s) changed its code"] if changed else []
    if uncommitted:
        parts.append("uncommitted edits change its code")
    if not parts:
        parts.append(f"its code differs from {commit[:10]}")
    return {**out, "state": "stale", "reason": "; ".join(parts)}


def check_dir(results: Path, repo: Path = REPO) -> list:
    """:func:`check_result` for every ``*.json`` in *results* (sorted by name)."""
    return [check_result(p, repo) for p in sorted(Path(results).glob("*.json"))]


def main(results: Path | None = None, repo: Path = REPO, out=None) -> int:
    """Print one line per result file in *results* (default ``experiments/results``) and
    return 0 (all checked fresh), 1 (any stale / dirty / unknown) or 2 (no git history)."""
    import sys

    out = out or sys.stdout
    results = Path(results) if results else repo / "experiments" / "results"
    try:
        rows = check_dir(results, repo)
        shallow = is_shallow(repo)
    except GitUnavailable as e:
        print(f"cannot check freshness: {e}", file=out)
        return 2
    width = max((len(r["file"]) for r in rows), default=4)
    for r in rows:
        c = (r["commit"] or "-")[:10]
        print(f"{r['file']:<{width}}  {r['state']:<9}  {c:<10}  {r['reason']}", file=out)
        for ln in r["changed_by"][:3]:
            print(f"{'':<{width}}    {ln if len(ln) <= 90 else ln[:89] + '…'}", file=out)
        if len(r["changed_by"]) > 3:
            print(f"{'':<{width}}    … and {len(r['changed_by']) - 3} more", file=out)
    counts = {s: sum(r["state"] == s for r in rows) for s in STATES}
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no result files", file=out)
    if shallow:
        print("note: shallow clone; commits older than its history show as unknown", file=out)
    bad = counts["stale"] + counts["dirty"] + counts["unknown"]
    return 1 if bad else 0
