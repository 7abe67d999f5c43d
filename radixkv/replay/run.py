"""One sequential replay end to end: build the policy, compile, replay, summarise
(:func:`run_replay`), and the kernels' warm-up (:func:`warmup`, :func:`warmup_many`).

:func:`run_replay` is the sequential mode of :func:`radixkv.replay.spec.run`, the one replay
call of the library, the command line, sweeps and checks; the replicas' sequential replay
(:mod:`radixkv.replay.routing`) and the capacity curves (:mod:`radixkv.replay.curve`) call it
per pool.
"""
from __future__ import annotations

import time

import numpy as np

from radixkv.metrics import summarize
from radixkv.policies.registry import PolicySpec, PoolSpec, build_policy, measured_metrics
import radixkv.replay.jit as jit
import radixkv.replay.warm as warm
from radixkv.records import Records
from radixkv.replay.sequential import replay_sequential
from radixkv.trace.types import Trace

#: spec -> wall seconds its kernels took to compile or load in this process and not yet
#: reported by a replay (a warm-up ahead of the replays: warmup_many)
_UNREPORTED: dict = {}


def warmup(spec: PolicySpec, *, concurrent: bool = True, lean: bool = False) -> float:
    """Compile (or load from Numba's cache) the kernels *spec*'s policy uses, and use the
    compiled kernels for its family from now on (:mod:`radixkv.replay.jit`;
    ``RADIXKV_JIT=interpret``: does nothing). *concurrent* False: only the sequential
    replay's kernels (a process that replays sequentially skips loading the batched and
    concurrent kernels from the cache: ~1–3 s of CPU per process on this machine).
    *lean* (with *concurrent*): the concurrent replay's kernels only for a token-id trace
    under the default settings — ``vllm``'s compiled loop on its per-block pool, not the
    piece pool's loop and unit-keyed pool (hash-id traces) nor the batched decode (the
    Python loop: priority scheduling, subclasses); about half of ``vllm:16``'s compile
    (docs/performance.md, "Compile time"). A kernel left out compiles when first used.

    Returns the seconds it took (0 when already warm in this process).
    """
    if jit.mode() == "interpret":
        return 0.0
    jit.mark_compiled(spec)
    scope = _scope(concurrent, lean)
    if _is_warm(spec, scope):
        return 0.0
    from radixkv.numba_cache import compile_notice

    t0 = time.perf_counter()
    with compile_notice(spec.label):
        warm._tiny_run(spec, concurrent, lean)
    warm._WARM.add((spec, scope))
    return time.perf_counter() - t0


def _scope(concurrent: bool, lean: bool = False) -> int:
    """The warm-up scope of :data:`radixkv.replay.warm._WARM`: 0 sequential, 1 lean
    concurrent, 2 all."""
    return 0 if not concurrent else 1 if lean else 2


def _is_warm(spec: PolicySpec, scope: int) -> bool:
    return any((spec, k) in warm._WARM for k in range(scope, 3))


def compile_seconds(spec: PolicySpec) -> float:
    """Seconds *spec*'s kernels took to compile or load in this process that no replay has
    reported yet (then 0): what ``timing_s["compile"]`` of its first replay reports when
    the warm-up ran ahead of it (:func:`warmup_many`)."""
    return _UNREPORTED.pop(spec, 0.0)


def _loads_from_cache(spec: PolicySpec, concurrent: bool, lean: bool) -> bool:
    """Load every kernel of *spec*'s warm-up scope from Numba's cache, compiling none
    (:func:`radixkv.numba_cache.without_compiling`): True when all were there (the policy
    is then warm in this process), False at the first that would compile (what loaded
    stays loaded)."""
    from radixkv.numba_cache import ColdCache, without_compiling

    jit.mark_compiled(spec)
    try:
        without_compiling(warm._tiny_run, spec, concurrent, lean)
    except ColdCache:
        return False
    warm._WARM.add((spec, _scope(concurrent, lean)))
    return True


def warmup_many(specs, work=None, *, concurrent: bool = True, lean: bool = False) -> float:
    """Compile the kernels of several policies, different kernel families in parallel.

    Numba compiles one function at a time, and a cold cache costs tens of seconds per
    policy family (SGLang's tree, vLLM's block pool). When two or more families are
    needed, each family after the first is compiled by a child process (which fills
    Numba's on-disk cache) while this process compiles the first; this process then
    loads the others from the cache. A family whose kernels are all in the cache already
    is loaded here first and gets no child (a warm cache starts no process). A child that
    fails changes nothing: the in-process :func:`warmup` compiles what is missing.

    Parameters
    ----------
    specs : iterable of PolicySpec
    work : iterable of (PolicySpec, tokens) or None
        The replays planned (prompt + output tokens each). When given, families that
        :func:`radixkv.replay.jit.plan` sets to run interpreted (a cold cache and little
        work, under ``RADIXKV_JIT=auto``) are not compiled.
    concurrent : bool
        As :func:`warmup`'s (False: the sequential replay's kernels only).
    lean : bool
        As :func:`warmup`'s (the concurrent loop's kernels for token-id traces only).

    Returns the wall seconds spent.
    """
    import subprocess
    import sys

    t0 = time.perf_counter()
    specs = list(specs)
    scope = _scope(concurrent, lean)
    cold_at_entry = {s for s in specs if not _is_warm(s, scope)}
    if work is not None:
        jit.plan(work)
    if jit.mode() == "interpret":
        return time.perf_counter() - t0
    specs = [s for s in specs if not (jit.family_of(s) and jit.is_interpreted(jit.family_of(s)))]
    cold = {}  # one spec per kernel family (the class's ``kernel_family``), in order of first use
    for s in specs:
        fam = s.build_class.kernel_family
        if not _is_warm(s, scope) and fam is not None:
            cold.setdefault(fam, s)
    fams = list(cold.values())
    if len(fams) >= 2:  # children pay off only for families that must compile
        fams = [s for s in fams if not (jit.is_warm(s) if not concurrent else _loads_from_cache(s, concurrent, lean))]
    procs = []
    if len(fams) >= 2:
        code = ("import sys; from radixkv.policies.registry import parse_policy; "
                "from radixkv.replay.run import warmup; "
                "warmup(parse_policy(sys.argv[1]), concurrent=sys.argv[2] == '1', lean=sys.argv[3] == '1')")
        procs = [subprocess.Popen([sys.executable, "-c", code, s.ref_text, str(int(concurrent)), str(int(lean))],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for s in fams[1:]]
    try:
        if fams:
            warmup(fams[0], concurrent=concurrent, lean=lean)
        if procs and any(pr.poll() is None for pr in procs):
            print(f"radixkv: waiting for the kernels of {', '.join(s.label for s in fams[1:])}, compiling in "
                  f"{len(procs)} child process(es) ...", file=sys.stderr, flush=True)
        for pr in procs:
            pr.wait()
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
    for s in specs:
        warmup(s, concurrent=concurrent, lean=lean)
        if s in cold_at_entry:  # wall seconds until its kernels were ready (children waited for)
            _UNREPORTED.setdefault(s, time.perf_counter() - t0)
    return time.perf_counter() - t0


def refuse_unfittable(trace: Trace, spec: PolicySpec, pool: PoolSpec, *, limit: int | None = None,
                      max_model_len: int | None = None, **options) -> None:
    """Refuse, before any kernel is compiled, a request that cannot fit the empty pool.

    The same rule and message for every engine and mode: the policy's
    :meth:`~radixkv.policies.base.PrefixCache.fits_alone_all` on the requests that would
    be replayed (the first *limit*, after the context-length step of
    :mod:`radixkv.replay.context` when *max_model_len* is given). Building the policy
    costs a pool's arrays, not a compile; without this check a request of 10^12 output
    tokens compiled the kernels for minutes and then ran out of memory (vLLM) or was
    refused (SGLang).

    Raises
    ------
    radixkv.errors.ConfigError
        Naming the first such request, its KV tokens and the pool.
    """
    from radixkv.replay.context import apply_context_limit, engine_of

    t = trace.head(limit)
    if max_model_len is not None:
        t, _ = apply_context_limit(t, max_model_len, engine_of(spec))
    policy = build_policy(spec, pool, unit_tokens=t.unit_tokens, trace=t, **options)
    over = np.asarray(policy.fits_alone_all(t))
    bad = np.flatnonzero(over > 0)
    if bad.size == 0:
        return
    from radixkv.replay.sequential import cannot_fit_error

    i = int(bad[0])
    raise cannot_fit_error(policy, t.kv_seq(i), int(over[i]), t.req_id[i], i, spec.label, trace.name)


def run_replay(
    trace: Trace,
    spec: PolicySpec,
    pool: PoolSpec,
    *,
    limit: int | None = None,
    quiet: bool = True,
    miss_causes: bool = False,
    max_model_len: int | None = None,
    measure_last: float | None = None,
    **options,
) -> tuple[Records, dict]:
    """Replay *trace* sequentially through a fresh *spec* policy on *pool*.

    *max_model_len* (tokens; None: no limit) removes the requests the policy's engine
    refuses for the context length and clips outputs first
    (:func:`radixkv.replay.context.apply_context_limit`); the summary then has
    ``rejected_requests``. *measure_last* (a share F in (0, 1]; None: off) adds
    ``summary["measure_window"]``, the hit metrics over the last F of the replayed requests
    (:func:`radixkv.metrics.window_summary`).

    Returns
    -------
    (records, summary)
        ``summary`` is :func:`radixkv.metrics.summarize` plus ``compile_s`` and
        ``replay_s`` (seconds) and ``kernels`` (``compiled``, ``interpreted`` on a cold
        Numba cache and a small replay, see :mod:`radixkv.replay.jit`, or ``none``)
        under ``summary["timing_s"]``. With *miss_causes* the records gain the columns of
        :data:`radixkv.replay.misses.MISS_COLUMNS` and the summary ``miss_causes``
        (:func:`radixkv.metrics.summarize_causes`); ``timing_s["miss_causes"]`` is
        the seconds the breakdown took (its shadows are reused across pool sizes).
        ``miss_causes="fix"`` adds ``summary["miss_causes"]["fix"]``
        (:func:`radixkv.replay.misses.what_would_fix`: more replays).

    Raises
    ------
    radixkv.errors.ConfigError
        From the policy (pool too small) or the replay (a request larger than the pool), or
        a *measure_last* outside (0, 1] (checked before the replay).
    """
    if measure_last is not None:
        from radixkv.metrics import window_start

        window_start(0, measure_last)  # a bad fraction fails before any work
    ctx = None
    if max_model_len is not None:
        from radixkv.replay.context import apply_context_limit, engine_of

        trace, ctx = apply_context_limit(trace.head(limit), max_model_len, engine_of(spec))
        limit = None
    refuse_unfittable(trace, spec, pool, limit=limit, **options)
    kernels = jit.before_replay(spec, jit.trace_tokens(trace, limit))
    compile_s = 0.0 if kernels == "interpreted" else (warmup(spec, concurrent=False) or compile_seconds(spec))
    policy = build_policy(spec, pool, unit_tokens=trace.unit_tokens, trace=trace.head(limit), **options)
    if kernels == "interpreted":
        with np.errstate(over="ignore"):  # numpy scalars wrap as the compiled kernels do
            rec = replay_sequential(trace, policy, limit=limit, quiet=quiet, label=spec.label)
    else:
        rec = replay_sequential(trace, policy, limit=limit, quiet=quiet, label=spec.label)
    if ctx is not None:
        from radixkv.replay.context import record

        record(rec.meta, ctx)
    miss_s = None
    if miss_causes:
        from radixkv.replay.misses import attach_miss_causes, what_would_fix

        miss_s = attach_miss_causes(trace, spec, rec, limit=limit, **options)
    summary = summarize(rec, evictions=policy.evictions, measures=measured_metrics(policy),
                        measure_last=measure_last)
    summary["timing_s"] = {"compile": compile_s, "replay": rec.meta["replay_s"], "kernels": kernels or "none"}
    if miss_causes:
        summary["timing_s"]["miss_causes"] = miss_s
        if miss_causes == "fix":
            t0 = time.perf_counter()
            summary["miss_causes"]["fix"] = what_would_fix(trace, spec, pool, rec, summary, replay=run_replay,
                                                           limit=limit, **options)
            summary["timing_s"]["miss_fix"] = time.perf_counter() - t0
    tokens = int(np.sum(rec["prompt_tokens"]))
    summary["timing_s"]["prompt_tokens_per_s"] = tokens / rec.meta["replay_s"] if rec.meta["replay_s"] > 0 else None
    return rec, summary

