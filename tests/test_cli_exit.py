"""The ``radixkv`` program ends through radixkv.cli.leave (os._exit after the atexit
functions and a flush of stdout/stderr): what it prints, writes and returns is what the
in-process main() gives; an error keeps exit status 2."""
import os
import subprocess
import sys
from pathlib import Path

from radixkv.cli import main

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "traces" / "demo.jsonl")


def _run(*argv, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "radixkv", *argv], capture_output=True, text=True, env=env, **kw)


def test_stdout_of_the_program_is_main_s_whole_output(capsys):
    # a JSON document of the trace's statistics, printed to stdout: the program's bytes
    # (a pipe, block-buffered: lost without the flush before os._exit) equal main()'s
    assert main(["trace", "inspect", DEMO, "--json"]) == 0
    expect = capsys.readouterr().out
    p = _run("trace", "inspect", DEMO, "--json")
    assert p.returncode == 0, p.stderr
    assert p.stdout == expect and expect.rstrip().endswith("}")


def test_bad_input_still_exits_2_with_its_message(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "arrival_s": 0, "tokens": [1, 2], "output_length": -1}\n')
    p = _run("trace", "inspect", str(bad))
    assert p.returncode == 2
    assert p.stderr.startswith("radixkv: error:") and "bad.jsonl" in p.stderr


def test_atexit_functions_still_run(tmp_path):
    # leave() runs the atexit functions (e.g. weakref.finalize's temporary folders) before os._exit
    flag = tmp_path / "ran"
    code = (f"import atexit, pathlib; atexit.register(pathlib.Path({str(flag)!r}).write_text, 'yes'); "
            "from radixkv.cli import leave; print('out'); leave(3)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert (p.returncode, p.stdout, flag.read_text()) == (3, "out\n", "yes")
