"""Make docs/report-demo.png: run the README's report commands (the ``bash`` block under
"A report you can open in a browser") on the bundled demo trace, then take a screenshot of
the page in headless chromium (1100 px wide, the blank rows below the page cut off).

    python tools/report_demo.py                 # writes docs/report-demo.png
    python tools/report_demo.py --out shot.png  # elsewhere

tests/test_html_report.py runs the same commands and checks the committed image against
a fresh screenshot. Needs chromium (Debian: ``apt-get install chromium``).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 1100
#: the window's height; the screenshot is cut below the page's last non-white row
MAX_HEIGHT = 6000


def readme_commands(readme: Path = ROOT / "README.md") -> list[list[str]]:
    """The ``radixkv`` commands of the README's report block, each as argv without
    ``radixkv`` (continuation lines joined)."""
    text = readme.read_text(encoding="utf-8")
    sec = text[text.index("### A report you can open in a browser"):]
    block = re.search(r"```bash\n(.*?)```", sec, re.S).group(1)
    cmds = [shlex.split(c) for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    assert all(c[0] == "radixkv" for c in cmds), cmds
    return [c[1:] for c in cmds]


def run_commands(workdir: Path) -> Path:
    """Run :func:`readme_commands` in *workdir* (with ``traces/`` linked to the repository's)
    and return the report they write."""
    from radixkv.cli import main

    workdir = Path(workdir)
    if not (workdir / "traces").exists():
        (workdir / "traces").symlink_to(ROOT / "traces")
    old, old_argv = os.getcwd(), sys.argv
    os.chdir(workdir)
    try:
        out = None
        for argv in readme_commands():
            sys.argv = ["radixkv", *argv]  # the report's provenance names the command as typed
            with contextlib.redirect_stdout(io.StringIO()):
                rc = main(argv + (["--quiet"] if argv[0] in ("compare", "curve", "replay") else []))
            if rc != 0:
                raise SystemExit(f"radixkv {' '.join(argv)}: exit {rc}")
            if argv[0] == "report":
                out = workdir / argv[argv.index("--out") + 1]
        return out
    finally:
        os.chdir(old)
        sys.argv = old_argv


def chromium() -> str | None:
    """The chromium binary, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(page: Path, png: Path, *, browser: str | None = None) -> None:
    """A screenshot of *page*, :data:`WIDTH` wide, cut below its last non-white row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import numpy as np

    browser = browser or chromium()
    with tempfile.TemporaryDirectory() as prof:
        raw = Path(prof) / "raw.png"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--no-first-run", "--disable-component-update", f"--user-data-dir={prof}/p",
                        f"--window-size={WIDTH},{MAX_HEIGHT}", f"--screenshot={raw}", page.resolve().as_uri()],
                       check=True, capture_output=True, timeout=180)
        img = mpimg.imread(str(raw))[..., :3]
    ink = np.nonzero((img < 0.98).any(axis=(1, 2)))[0]
    bottom = min(img.shape[0], int(ink[-1]) + 24) if ink.size else img.shape[0]
    mpimg.imsave(str(png), img[:bottom], format="png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "report-demo.png"), help="the PNG to write")
    args = ap.parse_args(argv)
    if chromium() is None:
        print("report_demo: chromium is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        page = run_commands(Path(d))
        screenshot(page, Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
