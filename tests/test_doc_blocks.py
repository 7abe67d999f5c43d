"""Every code block of README.md and docs/*.md runs (issue 32).

A block is a fenced block with a language: ``bash`` (or ``sh``), ``python``, ``toml``;
``yaml`` and blocks without a language (diagrams, printed output) are not code. Each
block is one test, named ``FILE:LINE``:

- ``bash``: every command runs in a fresh temporary folder that links the repository's
  ``traces/``, ``tests/`` and ``examples/`` folders. ``radixkv ...`` and ``python -m
  radixkv ...`` run in this process through :func:`radixkv.cli.main` (exit status 0
  wanted), with the trace placeholder ``TRACE`` and traces under ``$RADIXKV_SHARED`` replaced
  by the bundled demo trace; installing lines (``python3 -m venv``, ``. .venv/...``,
  ``pip install``) are not run; any other command runs in ``bash``.
- ``python``: executed with ``examples/`` importable, in the temporary folder; the blocks
  of one file share a namespace, in order (a later block may use an earlier one's names).
- ``toml``: parsed.

A block that cannot run here (it needs the network, a GPU, your own files, or a long run)
carries an explicit marker on the line before its fence, ``<!-- doc-test: skip REASON -->``;
it is skipped with that reason, and :data:`SKIPPED_AT_MOST` bounds how many there are.
"""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGS = {"bash", "sh", "python", "toml"}
#: blocks marked ``doc-test: skip``: at most this many (a new one needs a reason and a look)
SKIPPED_AT_MOST = 6
_FENCE = re.compile(r"^```(\S*)\s*$")
_SKIP = re.compile(r"<!--\s*doc-test:\s*skip\s*(.*?)\s*-->")
_INSTALL = re.compile(r"^(python3? -m venv|\. |source |(python3? -m )?pip3? install|cd )")
_RADIXKV = re.compile(r"^(radixkv|python3? -m radixkv)(\s|$)")
_DEMO = "traces/demo.jsonl"


def _blocks():
    """(file, line of the fence, language, text, skip reason or None) of every fenced block."""
    out = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            skip = _SKIP.search(lines[i - 1]) if i else None
            out.append((path, i + 1, m.group(1).lower(), "\n".join(lines[i + 1:j]),
                        (skip.group(1) or "marked skip") if skip else None))
            i = j + 1
    return out


BLOCKS = _blocks()
CODE = [b for b in BLOCKS if b[2] in RUN_LANGS or b[4] is not None]


def _commands(text: str) -> list[str]:
    """Shell commands of a bash block: continuation lines joined, comments dropped,
    ``a && b`` split."""
    joined = re.sub(r"\\\n\s*", " ", text)
    cmds = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            cmds += [c.strip() for c in line.split(" && ")]
    return cmds


def _demo_paths(argv: list[str]) -> list[str]:
    """The placeholder ``TRACE`` and traces under ``$RADIXKV_SHARED`` → the demo trace."""
    return [_DEMO if a == "TRACE" or a.startswith("$RADIXKV_SHARED/traces/") else a for a in argv]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    for name in ("traces", "tests", "examples"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    return tmp_path


_NAMESPACES: dict = {}


@pytest.mark.parametrize("path, line, lang, text, skip", CODE,
                         ids=[f"{b[0].relative_to(ROOT)}:{b[1]}" for b in CODE])
def test_doc_block_runs(path, line, lang, text, skip, workdir, capsys):
    if skip is not None:
        pytest.skip(f"doc-test: skip {skip}")
    where = f"{path.relative_to(ROOT)}:{line}"
    if lang == "toml":
        tomllib.loads(text)
        return
    if lang == "python":
        # the file's earlier python blocks first, where this worker has not run them (pytest-
        # xdist may hand a file's blocks to different workers): a block sees the names of
        # every block before it, whichever worker runs it
        ns, done = _NAMESPACES.setdefault(path, ({"__name__": f"doc_block_{path.stem}"}, set()))
        for p2, l2, lang2, text2, skip2 in CODE:
            if p2 == path and lang2 == "python" and skip2 is None and l2 < line and l2 not in done:
                exec(compile(text2, f"{path.relative_to(ROOT)}:{l2}", "exec"), ns)  # noqa: S102
                done.add(l2)
        exec(compile(text, where, "exec"), ns)  # noqa: S102
        done.add(line)
        return
    from radixkv.cli import main

    ran = 0
    for cmd in _commands(text):
        if _INSTALL.match(cmd):
            continue
        if _RADIXKV.match(cmd):
            argv = _demo_paths(shlex.split(cmd, comments=True))
            argv = argv[1:] if argv[0] == "radixkv" else argv[3:]
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse's own exits
                rc = e.code
            assert rc in (0, None), f"{where}: `{cmd}` exited {rc}:\n{capsys.readouterr().err[-2000:]}"
        else:
            r = subprocess.run(["bash", "-c", cmd], cwd=workdir, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, f"{where}: `{cmd}` exited {r.returncode}: {r.stderr[-2000:]}"
        ran += 1
    assert ran, f"{where}: a bash block with nothing to run (mark it `<!-- doc-test: skip REASON -->`)"


def test_skipped_blocks_are_few_and_give_a_reason():
    skipped = [(str(p.relative_to(ROOT)), n, why) for p, n, _, _, why in BLOCKS if why is not None]
    assert len(skipped) <= SKIPPED_AT_MOST, skipped
    assert all(why and why != "marked skip" for _, _, why in skipped), skipped


def test_every_language_tag_is_known():
    # a new language must be run here, or be one that is not code
    assert {b[2] for b in BLOCKS} <= RUN_LANGS | {"", "yaml"}, sorted({b[2] for b in BLOCKS})


def test_the_readme_recipe_of_issue_32():
    import radixkv

    t = radixkv.load_trace(ROOT / _DEMO)
    table = radixkv.format_table([radixkv.summarize(radixkv.replay(t, "vllm:16", capacity_tokens=20_000, limit=50))])
    # radixkv.summarize gives no timing (a summary is deterministic): no timing rows, no KeyError
    assert "token hit rate" in table and "replay time" not in table
