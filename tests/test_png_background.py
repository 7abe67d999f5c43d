"""A PNG drawn by a forked process (radixkv.plots.PngInBackground, used by ``radixkv curve
--out``): the bytes are those drawn in this process, an error there is raised here with its
type and message, and an abandoned or failed drawing leaves no file and no process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import radixkv.plots as plots
from radixkv.plots import PngInBackground, PngInProcess, curves_png, plot_curves, png_writer

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "traces" / "demo.jsonl")

#: a curve document as ``radixkv curve`` writes it (two policies, three capacities)
DOC = {"trace": {"path": "t.jsonl", "name": "t"},
       "curves": [{"policy": "unit-lru", "points": [{"capacity_tokens": c, "token_hit_rate": r}
                                                    for c, r in ((1000, 0.1), (10_000, 0.4), (100_000, 0.5))]},
                  {"policy": "sglang:1", "points": [{"capacity_tokens": c, "token_hit_rate": r}
                                                    for c, r in ((1000, 0.2), (10_000, 0.45), (100_000, 0.5))]}]}


def _fails(message):
    raise ValueError(message)


def _dies():
    os.kill(os.getpid(), signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_bytes_are_those_drawn_in_this_process(tmp_path):
    with PngInBackground.fork() as bg:
        bg.submit(curves_png, DOC, metric="token_hit_rate")
        bg.write(tmp_path / "a.png")
    plot_curves(DOC, tmp_path / "b.png")
    a = (tmp_path / "a.png").read_bytes()
    assert a[:8] == b"\x89PNG\r\n\x1a\n" and a == (tmp_path / "b.png").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.png", "b.png"]  # no temporary file left


def test_an_error_while_drawing_is_raised_here_and_nothing_is_written(tmp_path):
    bg = PngInBackground.fork()
    pid = bg._pid
    bg.submit(_fails, "no such metric 'x'")
    with pytest.raises(ValueError, match="no such metric 'x'") as e:
        bg.write(tmp_path / "a.png")
    bg.close()
    assert os.listdir(tmp_path) == [] and _gone(pid)
    if sys.version_info >= (3, 11):  # the drawing process's traceback comes along
        assert "_fails" in "".join(e.value.__notes__)


def test_a_write_error_is_the_same_oserror_as_in_this_process(tmp_path):
    missing = tmp_path / "no_folder" / "a.png"
    p = PngInProcess()
    p.submit(curves_png, DOC)
    with pytest.raises(FileNotFoundError) as here:
        p.write(missing)
    with PngInBackground.fork() as bg:
        bg.submit(curves_png, DOC)
        with pytest.raises(FileNotFoundError) as there:
            bg.write(missing)
    assert here.value.filename == str(missing)
    assert (there.value.errno, there.value.strerror, there.value.filename) == (
        here.value.errno, here.value.strerror, here.value.filename)
    assert os.listdir(tmp_path) == []


def test_a_killed_drawing_process_is_an_error_naming_the_signal(tmp_path):
    with PngInBackground.fork() as bg:
        bg.submit(_dies)
        with pytest.raises(RuntimeError, match=f"killed by signal {int(signal.SIGKILL)}"):
            bg.write(tmp_path / "a.png")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("submitted", [False, True])
def test_an_abandoned_drawing_writes_nothing_and_is_reaped(tmp_path, submitted):
    with pytest.raises(KeyError):
        with PngInBackground.fork() as bg:
            pid = bg._pid
            if submitted:
                bg.submit(curves_png, DOC)
            raise KeyError("an error before the PNG is asked for")
    assert _gone(pid) and os.listdir(tmp_path) == []


def test_write_goes_once_after_submit(tmp_path):
    with PngInBackground.fork() as bg:
        with pytest.raises(RuntimeError, match="after submit"):
            bg.write(tmp_path / "a.png")  # nothing to draw: refused, not an empty success
        bg.submit(curves_png, DOC)
        with pytest.raises(RuntimeError, match="called already"):
            bg.submit(curves_png, DOC)
    assert os.listdir(tmp_path) == []


def test_png_writer_forks_only_where_it_can_help():
    import matplotlib  # noqa: F401 - already imported: nothing to overlap

    assert type(png_writer(True)) is PngInProcess
    assert type(png_writer(False)) is PngInProcess


def _curve_in_a_fresh_process(tmp_path, cpu_free: bool, program: bool) -> list[str]:
    """Run ``radixkv curve --out`` through main() in a fresh process (matplotlib not imported)
    with radixkv.plots._cpu_free answering *cpu_free* and radixkv.cli.PROGRAM = *program*;
    check the PNG is the one plot_curves draws here from its JSON, and no other file is left.
    Returns what the process printed last: main's status, the forks (counted by wrapping
    PngInBackground.fork), whether it imported matplotlib, and what sys.modules holds for the
    3-D toolkit."""
    out = tmp_path / "c"
    code = ("import sys, radixkv.cli, radixkv.plots as p; n = []; f = p.PngInBackground.fork\n"
            "p.PngInBackground.fork = classmethod(lambda cls: n.append(1) or f())\n"
            f"p._cpu_free = lambda: {cpu_free}; radixkv.cli.PROGRAM = {program}\n"
            f"rc = radixkv.cli.main(['curve', {DEMO!r}, '--policies', 'unit-lru,sglang:1', '--capacities',"
            f" '2e3,2e4,2e5', '--out', {str(out)!r}, '--no-timing', '--quiet'])\n"
            "m = sys.modules.get('mpl_toolkits.mplot3d', 'absent')\n"
            "print(rc, len(n), 'matplotlib' in sys.modules, m if m in (None, 'absent') else 'module')")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "Axes3D" not in p.stderr  # where the import left the 3-D toolkit out, it did so silently
    doc = json.loads((tmp_path / "c.json").read_text())
    plot_curves(doc, tmp_path / "here.png")
    assert (tmp_path / "c.png").read_bytes() == (tmp_path / "here.png").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["c.json", "c.png", "here.png"]
    return p.stdout.splitlines()[-1].split()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the drawing process is forked only with os.fork")
def test_with_a_free_cpu_the_program_draws_in_a_forked_process_with_the_same_bytes(tmp_path):
    # drawn there: this process never imported matplotlib
    assert _curve_in_a_fresh_process(tmp_path, cpu_free=True, program=False) == ["0", "1", "False", "absent"]


@pytest.mark.parametrize("program", [False, True])
def test_without_a_free_cpu_the_png_is_drawn_here_with_the_same_bytes(tmp_path, program):
    # drawn in the process; the program (which ends after it) imports matplotlib without the
    # 3-D toolkit, a caller of main() that lives on with it
    assert _curve_in_a_fresh_process(tmp_path, cpu_free=False, program=program) == [
        "0", "0", "True", "None" if program else "module"]


def _savefig_png(fig) -> bytes:
    """matplotlib's own ``savefig`` of a laid-out figure (its placeholder layout engine kept:
    drawn twice), the reference for radixkv.plots._png (one draw)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def test_one_draw_writes_the_bytes_of_savefig_s_two(tmp_path, monkeypatch):
    causes = [("vllm:16", {"share": {"hit": 0.5, "compulsory": 0.3, "capacity": 0.2, "alignment": None}}),
              ("sglang:1", {"share": {"hit": 0.6, "compulsory": 0.3, "capacity": 0.1, "alignment": 0.0}})]
    ours = [curves_png(DOC), curves_png({**DOC, "curves": DOC["curves"][:1]}, metric="token_hit_rate")]
    plots.plot_miss_causes(causes, tmp_path / "a.png", title="t")
    monkeypatch.setattr(plots, "_png", _savefig_png)
    assert ours == [curves_png(DOC), curves_png({**DOC, "curves": DOC["curves"][:1]}, metric="token_hit_rate")]
    plots.plot_miss_causes(causes, tmp_path / "b.png", title="t")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
