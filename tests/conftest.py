"""Shared fixtures.

Public traces and the full golden set are read from ``$RADIXKV_SHARED`` (``.ci/run``
exports ``RADIXKV_SHARED=../shared``); tests that need them skip with a reason when it is
unset. The small token-level golden traces and their golden runs are copied into
``tests/data/golden`` and always run.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

#: the suite tests the compiled kernels unless a test asks otherwise (radixkv.replay.jit)
os.environ.setdefault("RADIXKV_JIT", "compile")

#: examples of the big property tests (they read RADIXKV_HYPOTHESIS_EXAMPLES, some a fraction
#: of it): 500 in the default tier, 2,000 in the slow one (RADIXKV_SLOW=1); set it to choose
os.environ.setdefault("RADIXKV_HYPOTHESIS_EXAMPLES", "2000" if os.environ.get("RADIXKV_SLOW") == "1" else "500")

try:  # hypothesis: fewer examples in the default tier, hypothesis's 100 with RADIXKV_SLOW=1
    from hypothesis import settings as _hyp_settings

    #: examples per property test without its own max_examples, default tier
    FAST_MAX_EXAMPLES = 40
    _hyp_settings.register_profile("radixkv-fast", max_examples=FAST_MAX_EXAMPLES)
    _hyp_settings.register_profile("radixkv-slow", max_examples=100)
    _hyp_settings.load_profile("radixkv-slow" if os.environ.get("RADIXKV_SLOW") == "1" else "radixkv-fast")
except ModuleNotFoundError:
    pass

#: parsed traces are cached (radixkv.trace.cache) in a folder of this run, not the user's
if "RADIXKV_CACHE_DIR" not in os.environ:
    os.environ["RADIXKV_CACHE_DIR"] = tempfile.mkdtemp(prefix="radixkv-test-cache-")
    atexit.register(shutil.rmtree, os.environ["RADIXKV_CACHE_DIR"], True)

DATA = Path(__file__).parent / "data"
GOLDEN_LOCAL = DATA / "golden"


def shared_path(*parts: str) -> Path:
    """Path under ``$RADIXKV_SHARED``; skips the calling test when unset or missing."""
    root = os.environ.get("RADIXKV_SHARED")
    if not root:
        pytest.skip("RADIXKV_SHARED is not set: public traces and golden files are not available")
    p = Path(root).joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} does not exist under RADIXKV_SHARED")
    return p


@pytest.fixture(scope="module")
def mooncake_seqs():
    """The replay benchmarks' input (test_bench_block_hash / _radix / _hicache): the KV
    sequences of the first ``RADIXKV_BENCH_LIMIT`` requests of the Mooncake conversation
    trace (default 500; 0 = all 12,031) and their prompt tokens; skips without
    ``RADIXKV_SHARED``."""
    from radixkv.trace.load import load_trace

    limit = int(os.environ.get("RADIXKV_BENCH_LIMIT", 500)) or None
    path = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    trace = load_trace(path, format="mooncake").head(limit)
    return [trace.kv_seq(i) for i in range(len(trace))], trace.total_prompt_tokens


@pytest.fixture
def data_dir() -> Path:
    return DATA


def draw_prompt_len(draw, st, k: int, U: int, partial: bool) -> int:
    """For hypothesis strategies: a prompt length in tokens that *k* ids of *U* tokens
    cover, as the trace readers accept it (U = 1: k; a partial last unit: (k−1)·U + 1 … k·U;
    otherwise k full units plus a unique tail of 0 … U−1 tokens). *draw* and *st* are the
    strategy's ``draw`` and ``hypothesis.strategies``."""
    if U == 1:
        return k
    if partial:
        return (k - 1) * U + draw(st.integers(1, U))
    return k * U + draw(st.integers(0, U - 1))


def draw_stem_requests(draw, st, max_n: int, stem_max: int, out_max: int) -> tuple[list, list, list]:
    """For hypothesis strategies: 1 … *max_n* requests whose prompts are a cut of one of
    three shared stems (4 … *stem_max* token ids) plus a unique tail of 0 … 12 ids, with
    0 … *out_max* output tokens and arrivals spaced 0, 3 ms, 50 ms or 0.4 s apart.
    Returns (prompts: lists of int, outputs, arrival seconds), in arrival order."""
    n = draw(st.integers(1, max_n))
    stems = [list(range(100 * k, 100 * k + draw(st.integers(4, stem_max)))) for k in range(3)]
    prompts, outputs, arrivals, t = [], [], [], 0.0
    for i in range(n):
        stem = stems[draw(st.integers(0, 2))]
        cut = draw(st.integers(1, len(stem)))
        tail = [5000 + 50 * i + j for j in range(draw(st.integers(0, 12)))]
        prompts.append(stem[:cut] + tail)
        outputs.append(draw(st.integers(0, out_max)))
        t += draw(st.sampled_from([0.0, 0.0, 0.003, 0.05, 0.4]))
        arrivals.append(t)
    return prompts, outputs, arrivals


class _OnceBenchmark:
    """Stand-in for pytest-benchmark where it is not installed (or disabled with
    ``-p no:benchmark``): ``benchmark(fn, *args)`` calls *fn* once, so the benchmarks
    still check their results."""

    @pytest.fixture
    def benchmark(self):
        def run(fn, *args, **kwargs):
            return fn(*args, **kwargs)

        run.pedantic = lambda fn, args=(), kwargs=None, **_: fn(*args, **(kwargs or {}))
        run.extra_info, run.stats = {}, None  # None: not timed (as when disabled)
        return run


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Benchmarks run once, untimed, unless ``--benchmark-enable`` is given — set here, not
    in ``addopts``, so that plain ``pytest`` works where pytest-benchmark is not installed.
    Runs before the plugin's own ``pytest_configure``, which reads the option."""
    if config.pluginmanager.hasplugin("benchmark"):  # the entry point's name
        config.option.benchmark_disable = True
    else:
        config.pluginmanager.register(_OnceBenchmark(), "radixkv-once-benchmark")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (long replays of full public traces) run only with
    ``RADIXKV_SLOW=1`` (the slow tier, which also runs the property tests with 2,000
    examples and hypothesis's default 100 instead of 500 and 40); the marker alone is
    enough, no test has to check the variable."""
    if os.environ.get("RADIXKV_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="marked slow: runs only with RADIXKV_SLOW=1")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


def pytest_sessionfinish(session):
    """With ``RADIXKV_COMPILE_LOG`` set (radixkv.numba_cache: every compile logged per
    process), add this process's CPU seconds (its own and its finished children's) to the log."""
    folder = os.environ.get("RADIXKV_COMPILE_LOG", "").strip()
    if folder:
        import json
        import resource

        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        rec = dict(pid=os.getpid(), who=os.environ.get("PYTEST_XDIST_WORKER", "main"), how="rusage",
                   cpu=round(me.ru_utime + me.ru_stime, 2), children_cpu=round(kids.ru_utime + kids.ru_stime, 2))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")


#: the parts of a cold cache's compile dealt out to the xdist workers up front
#: (docs/performance.md, "Compile time on a cold cache"), with the wall seconds each took to
#: warm on a cold cache (2026-12-03, 2 cores, both workers warming): a policy (the kernels of
#: its replays, ``radixkv.replay.warm``; every eviction order shares its engine's, so
#: ``vllm:16@lfu`` and ``sglang:1@lfu`` load what these compile) or ``units:B`` (the
#: unit-keyed pool of hash-id traces at block size B, ``_hash_unit_kernels.warm``: 37 s of
#: ``vllm:16``'s 209 s, moved to the other worker). Dealt out by :func:`warmup_shares`.
WARMUP_SHARES = (("vllm:16", 172.0), ("sglang:1", 131.0), ("units:16", 37.0))


def warmup_shares(n: int) -> list:
    """The parts of :data:`WARMUP_SHARES` each of *n* workers warms, in the order it warms
    them. Dealt heaviest first, each to the worker with the least seconds so far (the longest
    processing time rule; ties to the lower worker); each worker then warms its share
    lightest first, so that a part another worker's share also reaches (``vllm:16`` reaches
    the unit-keyed pool ~50 s in) is in the cache by then. With 2 workers: ``vllm:16`` on one
    (172 s), ``units:16`` then ``sglang:1`` on the other (168 s)."""
    load = [0.0] * n
    out: list = [[] for _ in range(n)]
    for part, sec in sorted(WARMUP_SHARES, key=lambda x: -x[1]):
        k = min(range(n), key=lambda j: (load[j], j))
        out[k].append((sec, part))
        load[k] += sec
    return [[part for _, part in sorted(share)] for share in out]


def _warm_part(part: str) -> None:
    """Compile (or load) the kernels of one part of :data:`WARMUP_SHARES`."""
    if part.startswith("units:"):
        from radixkv.policies._hash_unit_kernels import warm as warm_units

        warm_units(int(part.split(":")[1]))
        return
    from radixkv.policies.registry import parse_policy
    from radixkv.replay import warm

    warm._tiny_run(parse_policy(part))


#: the smallest run (tests collected) for which the workers warm WARMUP_SHARES up front
WARMUP_MIN_TESTS = 500


@pytest.fixture(scope="session", autouse=True)
def _split_warmup(request):
    """On a parallel run of most of the suite (pytest-xdist, 2+ workers, at least
    :data:`WARMUP_MIN_TESTS` tests), worker *k* first compiles the kernels of its share of
    :data:`WARMUP_SHARES` (:func:`warmup_shares`; a tiny replay each: ``radixkv.replay.warm``).

    Why: on a cold Numba cache each kernel is compiled once, by the first worker to need it
    (radixkv.numba_cache's compile lock); a second worker needing it meanwhile waits, its core
    idle. Dealing the heaviest kernels out at the start keeps both workers compiling different
    kernels; the tests then load them from the cache. On a warm cache this only loads them.
    ``RADIXKV_TEST_WARMUP=0`` turns it off; a failure here is left to the tests to report."""
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    wid = os.environ.get("PYTEST_XDIST_WORKER", "")
    if (n < 2 or not wid.startswith("gw") or os.environ.get("RADIXKV_TEST_WARMUP", "1") == "0"
            or os.environ.get("RADIXKV_JIT") == "interpret" or len(request.session.items) < WARMUP_MIN_TESTS):
        return
    for part in warmup_shares(n)[int(wid[2:]) % n]:
        try:
            _warm_part(part)
        except Exception:  # noqa: BLE001 - the tests of that policy report it
            pass
