"""The ``RADIXKV_JIT`` setting, and whether Numba's cache already holds a kernel.

Shared by the replay (:mod:`radixkv.replay.jit`, which runs small replays' kernels
interpreted on a cold cache) and the trace readers (which skip a Numba fast path whose
compile would cost more than it saves). No radixkv dependencies beyond the errors.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from radixkv.errors import ConfigError

MODES = ("auto", "compile", "interpret")

#: the folder name of radixkv's part of Numba's cache: this prefix + :func:`source_key`
CACHE_PREFIX = "radixkv-numba-"


#: a line that imports Numba: the mark of a module that may hold kernels (a module that only
#: mentions Numba, e.g. the package's ``__init__`` calling :func:`keyed_cache_dir`, holds none)
_IMPORTS_NUMBA = re.compile(rb"^[ \t]*(?:import numba|from numba)\b", re.M)


#: ``(path, st_mtime_ns, st_size)`` of each source the last :func:`keyed_cache_dir` keyed
#: Numba's cache by (empty before it ran): what :func:`sources_changed` compares with
_keyed_stamps: list = []


def source_key(root: Path | None = None, stamps: list | None = None) -> str:
    """A digest of every radixkv module that imports Numba (12 hex digits of sha256 over the
    modules' paths and bytes, in path order) — the key of :func:`keyed_cache_dir`.

    Numba checks a cached kernel against its own file's time stamp only; a kernel that
    inlines functions of another module (the span, batch and priority kernels call
    ``_hash_kernels``) is loaded stale after only that other module changed. Keying the
    whole cache by all kernel sources makes any such change a cold cache instead.

    *stamps*: a list to which ``(path, st_mtime_ns, st_size)`` of each module hashed is
    appended (taken before its bytes are read)."""
    root = Path(__file__).resolve().parent if root is None else Path(root)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        st = p.stat()
        b = p.read_bytes()
        if _IMPORTS_NUMBA.search(b):
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + b + b"\0")
            if stamps is not None:
                stamps.append((str(p), st.st_mtime_ns, st.st_size))
    return h.hexdigest()[:12]


def sources_changed() -> bool:
    """Whether a source :func:`keyed_cache_dir` keyed Numba's cache by has changed (time stamp
    or size) or gone since; False before it ran. A few ``stat`` calls."""
    for path, mtime_ns, size in _keyed_stamps:
        try:
            st = os.stat(path)
        except OSError:
            return True
        if st.st_mtime_ns != mtime_ns or st.st_size != size:
            return True
    return False


def _keep_off_stale_cache(dispatcher) -> None:
    """Before a radixkv kernel compiles: when its sources changed after radixkv was imported
    (:func:`sources_changed`), drop Numba's on-disk cache of *dispatcher* (its ``NullCache``).

    Why: the key is taken when radixkv is imported, a kernel module is read when it is first
    imported, later. A kernel module read after an edit would compile the new source and
    save it in the folder of the old sources' key, where a later process running the old
    sources (the edit undone) would load it for a kernel whose own file's time stamp still
    matches — the stale load the key exists to prevent. So such a kernel neither loads from
    nor saves into that folder: it compiles in memory (the next process keys a new folder)."""
    if not _keyed_stamps:
        return
    fn = getattr(dispatcher, "py_func", None)
    if not (getattr(fn, "__module__", None) or "").startswith("radixkv."):
        return
    if type(getattr(dispatcher, "_cache", None)).__name__ in ("NullCache", "NoneType"):
        return
    if sources_changed():
        from numba.core.caching import NullCache

        dispatcher._cache = NullCache()


def keyed_cache_dir() -> str:
    """Point Numba's cache at ``<base>/radixkv-numba-<source_key>`` and return that folder;
    *base* is ``NUMBA_CACHE_DIR`` when set (one already keyed this way is re-keyed, so
    child processes agree), else ``__pycache__`` in the radixkv package. Sets
    ``NUMBA_CACHE_DIR`` (and ``numba.config.CACHE_DIR`` when Numba is already imported).
    Called when radixkv is imported; where the folder cannot be written, Numba falls back
    to its own locations. A kernel compiled after its sources changed stays out of the
    folder (:func:`_keep_off_stale_cache`)."""
    cur = os.environ.get("NUMBA_CACHE_DIR", "").rstrip("/\\")
    if cur and os.path.basename(cur).startswith(CACHE_PREFIX):
        cur = os.path.dirname(cur)
    base = cur or str(Path(__file__).resolve().parent / "__pycache__")
    stamps: list = []
    target = os.path.join(base, CACHE_PREFIX + source_key(stamps=stamps))
    _keyed_stamps[:] = stamps
    os.environ["NUMBA_CACHE_DIR"] = target
    nb = sys.modules.get("numba")
    if nb is not None:
        nb.config.CACHE_DIR = target
    _install_when_numba_loads()
    return target


def mode() -> str:
    """The ``RADIXKV_JIT`` setting: ``auto`` (default), ``compile`` or ``interpret``.

    Raises
    ------
    radixkv.errors.ConfigError
        For any other value.
    """
    m = os.environ.get("RADIXKV_JIT", "auto").strip().lower() or "auto"
    if m not in MODES:
        raise ConfigError(f"RADIXKV_JIT={m!r}; known: {', '.join(MODES)}", field="RADIXKV_JIT")
    return m


class ColdCache(Exception):
    """Raised inside :func:`without_compiling` when Numba starts compiling."""


def without_compiling(fn, *args, **kwargs):
    """Call ``fn(*args, **kwargs)`` but stop, raising :class:`ColdCache`, at the first
    Numba compile it would start: kernels already loaded or in Numba's on-disk cache
    (``NUMBA_CACHE_DIR``) run; a kernel that would compile ends the call (nothing is
    left half-compiled). Compiles of Numba's own helpers (``numba.*``, e.g. the
    constructor of a ``numba.typed.List``, which Numba compiles in every process and never
    caches on disk) do not count: they cost well under a second and no warm-up avoids them."""
    from numba.core import event

    class _Stop(event.Listener):
        def on_start(self, ev):
            fn = getattr(ev.data.get("dispatcher"), "py_func", None)
            if (getattr(fn, "__module__", None) or "").split(".")[0] == "numba":
                return
            raise ColdCache()

        def on_end(self, ev):
            pass

    listener = _Stop()
    event.register("numba:compile", listener)
    _no_wait[0] += 1
    try:
        return fn(*args, **kwargs)
    finally:
        _no_wait[0] -= 1
        event.unregister("numba:compile", listener)


def is_cached(fn, *args) -> bool:
    """True when calling the Numba kernel *fn* on *args* needs no compile (then it is loaded)."""
    try:
        without_compiling(fn, *args)
    except ColdCache:
        return False
    return True


class compile_notice:
    """Context manager: while it is open, each Numba compile of a radixkv kernel (a cold
    cache) is shown on stderr — a tqdm line on a terminal naming *what* is compiled and
    the kernel compiling now, one plain line otherwise — so that a cold cache is never a
    silent wait. Nothing is printed when every kernel loads from the cache.

    Parameters
    ----------
    what : str
        What the kernels are for (e.g. ``"vllm:16"``).
    why : str
        Why they compile now (shown after *what*).
    """

    def __init__(self, what: str, why: str = "Numba's cache does not hold them yet: compiled once, into NUMBA_CACHE_DIR"):
        self.what, self.why, self.bar, self.depth, self._listener = what, why, None, 0, None
        self.n, self.t0 = 0, None

    def __enter__(self):
        from numba.core import event

        notice = self

        class _Show(event.Listener):
            def on_start(self, ev):
                notice.depth += 1
                fn = getattr(ev.data.get("dispatcher"), "py_func", None)
                mod = getattr(fn, "__module__", None) or ""
                if notice.depth == 1 and mod.startswith("radixkv"):
                    notice._show(f"{mod.rsplit('.', 1)[-1]}.{fn.__name__}")

            def on_end(self, ev):
                notice.depth -= 1
                if notice.depth == 0 and notice.bar is not None:
                    notice.n += 1
                    notice.bar.update(1)

        self._listener = _Show()
        event.register("numba:compile", self._listener)
        return self

    def _show(self, kernel: str) -> None:
        if self.bar is None:
            import time

            from tqdm import tqdm

            self.t0 = time.perf_counter()
            tty = sys.stderr.isatty()
            if not tty:
                print(f"radixkv: compiling the kernels of {self.what} ({self.why}) ...", file=sys.stderr, flush=True)
            self.bar = tqdm(desc=f"compiling {self.what} ({self.why})", unit=" kernel", file=sys.stderr,
                            disable=not tty, leave=False)
        self.bar.set_postfix_str(kernel, refresh=True)

    def __exit__(self, *exc):
        from numba.core import event

        event.unregister("numba:compile", self._listener)
        if self.bar is not None:
            import time

            self.bar.close()
            kernels = "1 kernel" if self.n == 1 else f"{self.n} kernels"
            print(f"radixkv: compiled {kernels} of {self.what} in {time.perf_counter() - self.t0:.1f} s",
                  file=sys.stderr, flush=True)
        return False


# ---------------------------------------------------------------- one compile per kernel at a time

#: seconds a process waits for another's compile of the same kernel before compiling it
#: itself (a safety net: a compile takes seconds to a minute; a holder that dies frees its lock)
LOCK_WAIT_S = 900.0

_held: dict = {}  # lock path -> open file, in this process (re-entrant: a kernel compiled inside its own compile)
_no_wait = [0]  # > 0 inside without_compiling: a kernel another process is compiling counts as cold
_waited = [0.0]  # seconds this process has waited for other processes' compiles (RADIXKV_COMPILE_LOG)


def _lock_path(dispatcher, args) -> str | None:
    """The lock file of *dispatcher*'s kernel specialised for the argument types *args*
    (a tuple of Numba types) under Numba's cache folder, or None when it is not a radixkv
    kernel cached on disk (only those are locked). One file per kernel and signature:
    two processes compiling two specialisations of one kernel (the vLLM pool's kernels
    for each free order) go on side by side; their saves to the kernel's one cache index
    are put in turn by :func:`_locked_save`."""
    fn = getattr(dispatcher, "py_func", None)
    mod = getattr(fn, "__module__", None) or ""
    if not mod.startswith("radixkv.") or type(getattr(dispatcher, "_cache", None)).__name__ == "NullCache":
        return None
    from numba.core import config

    base = config.CACHE_DIR or os.environ.get("NUMBA_CACHE_DIR")
    if not base:
        return None
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{mod}.{fn.__qualname__}")
    sig = hashlib.sha1(_sig_text(tuple(args)).encode()).hexdigest()[:16]
    return os.path.join(base, "locks", f"{name}.{sig}.lock")


def _locked_save(orig):
    """Wrap Numba's ``IndexDataCacheFile.save`` (*orig*) so that the processes saving
    specialisations of one kernel to its cache do it one at a time (an exclusive ``flock``
    of ``<index>.lock``).

    Why: Numba's save reads the kernel's index, picks the first data file name the index
    does not list, writes the index, then the data. Two processes saving two signatures
    at once would both pick the same name: the index would keep one signature and the
    data file could hold the other's code. In turn, each reads the index the other wrote."""
    import fcntl

    def save(self, key, data):
        try:
            f = open(self._index_path + ".lock", "a+b")
        except OSError:
            return orig(self, key, data)
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
            return orig(self, key, data)
        finally:
            f.close()  # closing lets go of the lock

    save.__wrapped__ = orig
    return save


def _locked_compile(orig, lock: bool = True):
    """Wrap ``Dispatcher.compile`` (*orig*) so that two processes on one Numba cache never
    compile the same radixkv kernel for the same argument types at once: the second waits
    (under an exclusive ``flock`` of the lock file of that kernel and signature,
    :func:`_lock_path`) and then loads the first's result from the cache. Two signatures
    of one kernel compile side by side (their saves to its cache index in turn,
    :func:`_locked_save`).

    Why: a cold cache is paid by every process that needs a kernel at the same time — the
    test suite's two pytest-xdist workers and the CLI processes its tests start,
    ``warmup_many``'s children, a sweep's workers — each compiling the same kernels side by
    side on the same cores. Waiting costs no more wall time than compiling, and the CPU
    goes to other work. Deadlock-free: a process holds the locks of the (kernel, signature)
    pairs on its compile stack (callers, then callees), and the call graph has no cycle
    (a kernel calling itself with its own signature finds its lock already held); the wait is
    bounded by :data:`LOCK_WAIT_S` all the same. Inside :func:`without_compiling` a kernel
    being compiled elsewhere is not waited for (it counts as not cached). Before either,
    :func:`_keep_off_stale_cache`; with *lock* False only that."""
    import time

    from numba.core import sigutils
    from numba.core.compiler_lock import global_compiler_lock

    if lock:
        import fcntl

    def compile(self, sig):
        _keep_off_stale_cache(self)
        args, _ = sigutils.normalize_signature(sig)
        if tuple(args) in self.overloads:
            return orig(self, sig)
        path = _lock_path(self, args) if lock else None
        if path is None or path in _held:
            return orig(self, sig)
        with global_compiler_lock:  # Numba's own (re-entrant): one thread of this process compiles
            if path in _held:
                return orig(self, sig)
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                f = open(path, "a+b")
            except OSError:
                return orig(self, sig)
            try:
                t0 = time.monotonic()
                try:
                    while True:
                        try:
                            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                            break
                        except BlockingIOError:
                            if _no_wait[0]:
                                raise ColdCache() from None
                            if time.monotonic() > t0 + LOCK_WAIT_S:
                                return orig(self, sig)  # compile unlocked rather than wait longer
                            time.sleep(0.05)
                finally:
                    _waited[0] += time.monotonic() - t0
                _held[path] = f
                try:
                    return orig(self, sig)  # loads from the cache what the other process compiled
                finally:
                    del _held[path]
                    fcntl.flock(f, fcntl.LOCK_UN)
            finally:
                f.close()

    compile.__wrapped__ = orig
    return compile


def install_compile_lock() -> None:
    """Install :func:`_locked_compile` on Numba's CPU dispatcher (once; idempotent). Done
    when radixkv is imported (:func:`keyed_cache_dir`: at once when Numba is loaded, else
    as soon as it is); ``RADIXKV_COMPILE_LOCK=0`` leaves out the lock, and so does a
    platform without ``fcntl`` (Windows): then only :func:`_keep_off_stale_cache` runs."""
    lock = os.environ.get("RADIXKV_COMPILE_LOCK", "1").strip() != "0"
    try:
        import fcntl  # noqa: F401
    except ImportError:
        lock = False
    from numba.core.dispatcher import Dispatcher

    if getattr(Dispatcher.compile, "__wrapped__", None) is None:
        Dispatcher.compile = _locked_compile(Dispatcher.compile, lock)
        if lock:
            from numba.core.caching import IndexDataCacheFile

            if getattr(IndexDataCacheFile.save, "__wrapped__", None) is None:
                IndexDataCacheFile.save = _locked_save(IndexDataCacheFile.save)
        log = os.environ.get("RADIXKV_COMPILE_LOG", "").strip()
        if log:
            Dispatcher.compile = _logged_compile(Dispatcher.compile, log)


def _sig_text(t) -> str:
    """A signature (or type) as text, each type prefixed with its class's name."""
    if hasattr(t, "args") and hasattr(t, "return_type"):  # a Signature: its argument types
        t = t.args
    if isinstance(t, (tuple, list)):
        return "(" + ", ".join(_sig_text(x) for x in t) + ")"
    inner = getattr(t, "types", None)
    if isinstance(inner, tuple):
        return f"{type(t).__name__}{_sig_text(inner)}"
    return f"{type(t).__name__}:{t}"


def _logged_compile(orig, folder: str):
    """Wrap ``Dispatcher.compile`` (*orig*, the locked one) to append one JSON line per call
    that compiled or loaded a kernel to ``<folder>/<pid>.jsonl`` (``RADIXKV_COMPILE_LOG``, a
    diagnostic: where a cold cache's CPU goes, per process). Fields: ``pid``, ``who`` (the
    xdist worker, else the command), ``fn`` (module.qualname), ``sig``, ``how`` (``compiled``:
    Numba compiled it here; ``loaded``: from the disk cache), ``cpu`` (this process's CPU
    seconds in the call, callees' calls apart), ``wall`` (seconds, callees included),
    ``wait`` (of those, waiting for another process's compile: the compile lock),
    ``depth`` (0: not inside another's compile), ``t`` (the end, Unix time), ``test`` (the
    pytest test running, ``PYTEST_CURRENT_TEST``, else null). ``sig`` names each argument's type class
    (a borrowed view and a plain array print alike but are two compiles)."""
    import json
    import time

    stack = [0.0]  # CPU seconds spent in the calls nested in the current one
    who = " ".join(os.path.basename(a) for a in sys.argv[:3])

    def compile(self, sig):
        before = (sum(self._cache_hits.values()), sum(self._cache_misses.values()))
        t0, c0, w0 = time.perf_counter(), time.process_time(), _waited[0]
        stack.append(0.0)
        try:
            return orig(self, sig)
        finally:
            inner = stack.pop()
            cpu = time.process_time() - c0
            stack[-1] += cpu
            hits, misses = sum(self._cache_hits.values()) - before[0], sum(self._cache_misses.values()) - before[1]
            if hits or misses:
                fn = getattr(self, "py_func", None)
                rec = dict(pid=os.getpid(), who=(os.environ.get("PYTEST_XDIST_WORKER") if "pytest" in sys.modules
                                                  else None) or who,
                           fn=f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}",
                           sig=_sig_text(sig), how="compiled" if misses else "loaded", cpu=round(cpu - inner, 4),
                           wall=round(time.perf_counter() - t0, 4), wait=round(_waited[0] - w0, 4),
                           depth=len(stack) - 1, t=round(time.time(), 2),
                           test=os.environ.get("PYTEST_CURRENT_TEST"))
                try:
                    os.makedirs(folder, exist_ok=True)
                    with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as f:
                        f.write(json.dumps(rec) + "\n")
                except OSError:
                    pass

    compile.__wrapped__ = orig
    return compile


class _PatchOnImport:
    """A ``sys.meta_path`` finder that installs the compile lock right after
    ``numba.core.dispatcher`` is executed (so importing radixkv does not import Numba)."""

    def find_spec(self, name, path=None, target=None):
        if name != "numba.core.dispatcher":
            return None
        import importlib.machinery

        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            install_compile_lock()

        loader.exec_module = exec_module
        return spec


def _install_when_numba_loads() -> None:
    """:func:`install_compile_lock` now when Numba's dispatcher is loaded, else when it is."""
    if "numba.core.dispatcher" in sys.modules:
        install_compile_lock()
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
