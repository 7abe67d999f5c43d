"""Helpers shared by the experiment scripts: traces, result files and their provenance.

Every script writes its numbers with :func:`write_result`, which adds a ``provenance``
block: radixkv version and git commit, Python / numpy / numba / matplotlib versions, the
script, its settings (seeds included) and the sha256 of every trace read (named relative
to ``$RADIXKV_SHARED``; never a machine's absolute path).

``--quick`` (or ``RADIXKV_QUICK=1``) selects reduced sizes and writes to
``experiments/results/quick/`` (not committed); the paper renders from the full results in
``experiments/results/``.
"""
from __future__ import annotations

import hashlib
import io
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # scripts run as files: make the package importable
    sys.path.insert(0, str(REPO))

QUICK = "--quick" in sys.argv[1:] or os.environ.get("RADIXKV_QUICK") == "1"
RESULTS = HERE / "results" / "quick" if QUICK else HERE / "results"

#: public traces the paper reads: name → (path under $RADIXKV_SHARED, what it is)
TRACES = {
    "mooncake": ("traces/mooncake-fast25/conversation_trace.jsonl", "Mooncake FAST'25 conversation (Kimi chat), 512-token hash blocks"),
    "weka": ("traces/weka-claude-code/traces", "WEKA / kv-cache-tester Claude Code agentic coding sessions, 64-token hash blocks"),
    "ragpulse": ("traces/ragpulse/0_trace.jsonl", "RAGPulse university RAG Q&A service, 16-token hash blocks"),
    "azure_conv": ("traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv", "Azure LLM inference 2023 conversation (lengths only)"),
    "azure_code": ("traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv", "Azure LLM inference 2023 code (lengths only)"),
}
#: the three public traces with prefix identity (Azure has lengths only)
PREFIX_TRACES = ("mooncake", "weka", "ragpulse")


def shared_root() -> Path:
    return Path(os.environ.get("RADIXKV_SHARED", REPO.parent / "shared"))


def shared(*parts: str) -> Path:
    """A path under ``$RADIXKV_SHARED`` (default ``../shared`` beside the repository)."""
    p = shared_root().joinpath(*parts)
    if not p.exists():
        sys.exit(f"{p} not found: set RADIXKV_SHARED to the folder holding traces/ (see traces/README.md)")
    return p


def result(name: str) -> Path:
    """Where result *name* goes (the quick folder under ``--quick``)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / name


_SHA: dict = {}
_TRACE_CACHE: dict = {}
_READ: dict = {}


def weka_session_files(context: int) -> list:
    """The WEKA agentic-coding session files whose longest prompt fits *context* tokens,
    by name (quick mode: the 5 with the fewest prompt tokens); records the folder's digest
    in the provenance."""
    import json

    root = shared("traces/weka-claude-code/traces")
    out = []
    for f in sorted(root.glob("*.json")):
        ins = [r["in"] for r in json.loads(f.read_text())["requests"] if "in" in r]
        if ins and max(ins) <= context:
            out.append((sum(ins), f))
    if QUICK:
        out = sorted(out)[:5]
    _READ["weka"] = {"path": "$RADIXKV_SHARED/traces/weka-claude-code/traces", "sha256": sha256_path(root)}
    return [f for _, f in sorted(out, key=lambda t: t[1].name)]


def sha256_path(p: Path) -> str:
    """sha256 of a file, or of a directory (its files' relative names and bytes, sorted)."""
    key = str(p)
    if key in _SHA:
        return _SHA[key]
    h = hashlib.sha256()
    if p.is_dir():
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            h.update(str(f.relative_to(p)).encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    else:
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    _SHA[key] = h.hexdigest()
    return _SHA[key]


def load(name: str, limit: int | None = None):
    """The public trace *name* (a key of :data:`TRACES`), first *limit* requests; recorded
    for the provenance block."""
    from radixkv.trace.load import load_trace

    rel, _ = TRACES[name]
    if name not in _TRACE_CACHE:
        _TRACE_CACHE[name] = load_trace(shared(rel))
    _READ[name] = {"path": "$RADIXKV_SHARED/" + rel, "sha256": sha256_path(shared(rel))}
    t = _TRACE_CACHE[name]
    return t.head(limit) if limit else t


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


#: repository paths of radixkv modules worker processes of :func:`map_jobs` loaded
_WORKER_MODULES: set = set()


def loaded_radixkv_modules() -> list:
    """The repository-relative paths (``radixkv/...py``, sorted) of every radixkv module loaded
    in this process, plus those loaded by :func:`map_jobs`' workers: the Python code a result
    can depend on (policies, kernels and cost models picked by name are imported when used,
    so they are here once they ran). :mod:`experiments.freshness` reads it from provenance."""
    root = (REPO / "radixkv").resolve()
    out = set(_WORKER_MODULES)
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not f or not (name == "radixkv" or name.startswith("radixkv.")):
            continue
        try:
            out.add(Path(f).resolve().relative_to(REPO.resolve()).as_posix())
        except ValueError:  # a radixkv imported from elsewhere (an installed copy)
            return []
    return sorted(m for m in out if m.startswith(root.name + "/"))


def _call_recording(arg: tuple):
    fn, job = arg
    return fn(job), loaded_radixkv_modules()


def map_jobs(fn, jobs: list, k: int = 1) -> list:
    """``[fn(j) for j in jobs]``, on *k* forked worker processes when ``k > 1`` (results in
    order). The radixkv modules the workers load are added to the provenance's
    ``radixkv_modules`` (a worker can import a policy the parent never did)."""
    if k <= 1:
        return [fn(j) for j in jobs]
    import multiprocessing as mp

    with mp.get_context("fork").Pool(k) as pool:
        pairs = pool.map(_call_recording, [(fn, j) for j in jobs], chunksize=1)
    for _, mods in pairs:
        _WORKER_MODULES.update(mods)
    return [r for r, _ in pairs]


def provenance(settings: dict) -> dict:
    """What produced a result: versions, commit, script, settings, traces read, and the
    radixkv modules loaded (``radixkv_modules``: :func:`loaded_radixkv_modules`, the
    dependencies :mod:`experiments.freshness` checks; empty when radixkv was not imported
    from this repository, and the check then takes the whole package)."""
    import matplotlib
    import numba
    import numpy

    import radixkv

    # uncommitted changes to the code (result files being rewritten do not count)
    dirty = _git("status", "--porcelain", "--", "radixkv", "experiments", ":(exclude)experiments/results")
    return {
        "radixkv_version": radixkv.__version__,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(dirty) if dirty is not None else None,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "matplotlib": matplotlib.__version__,
        "script": "experiments/" + Path(sys.argv[0]).name,
        "quick": QUICK,
        "settings": settings,
        "traces": dict(sorted(_READ.items())),
        "radixkv_modules": loaded_radixkv_modules(),
    }


def write_result(name: str, doc: dict, settings: dict) -> Path:
    """Write *doc* plus its provenance block as JSON (sorted keys, atomic)."""
    from radixkv.util import atomic_write_text, dumps_json

    out = dict(doc)
    out["provenance"] = provenance(settings)
    path = result(name)
    atomic_write_text(path, dumps_json(out))
    print(f"wrote {path.relative_to(REPO)}", flush=True)
    return path


def save_fig(fig, name: str) -> Path:
    """Write a matplotlib figure as PNG (no timestamp metadata: same bytes each run)."""
    from radixkv.util import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    path = result(name)
    atomic_write_bytes(path, buf.getvalue())
    print(f"wrote {path.relative_to(REPO)}", flush=True)
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mean_ci(xs) -> dict:
    """Mean and 95 % confidence half-width (Student t) of a list of ≥ 2 values."""
    import numpy as np

    x = np.asarray(xs, dtype=np.float64)
    n = x.size
    # two-sided 95 % t quantiles for n-1 = 1..30 degrees of freedom
    t = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042]
    half = float(t[min(n - 1, 30) - 1] * x.std(ddof=1) / np.sqrt(n)) if n >= 2 else float("nan")
    return {"mean": float(x.mean()), "ci95": half, "n": int(n), "values": [float(v) for v in x]}


def logx(ax) -> None:
    """Log x axis with labels on the decades only (minor labels overlap)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())


def main_or_plot(main, plot, name: str) -> None:
    """Run *main* (which writes the result file *name*), then draw the figures from that
    file; with ``--plot-only`` only draw them. Figures are drawn from the file in both
    cases, so a redraw gives the same bytes as a full run."""
    import json

    if "--plot-only" not in sys.argv[1:]:
        main()
    plot(json.loads(result(name).read_text()))
