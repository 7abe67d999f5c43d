"""Streaming sequential replay: a JSONL trace read and replayed a chunk at a time.

:func:`replay_stream` gives the summary :func:`radixkv.replay.run.run_replay` gives (the
same bytes as JSON) without holding the trace or the per-request records: it reads
``chunk_requests`` request lines, parses them with the format's own reader, replays them
(:func:`radixkv.replay.sequential.replay_rows`, the in-memory replay's loop), folds their
rows into running aggregates (:class:`StreamAggregates`) and drops them. Resident memory
is the policy's cache state plus one chunk; the address space holds a few int64 columns
of the whole trace's length (:class:`_Window`) whose pages are handed back to the
system as soon as their chunk is done, so they cost no memory.

Why the columns span the whole trace: a request's unique content (a prompt tail that
matches nothing, an output without ids) is named by the request's row in the replay
(:func:`radixkv.trace.types._unique_prompt_id`), so the kernels must see each request at
its global row; the window trace shows row ``i`` of the replay at index ``i``.

Limits: JSONL formats only (``native``, ``mooncake``), sequential mode, a file already in
time order (a chunk out of order is an error: the in-memory reader sorts, a stream
cannot), policies built without the trace, no per-request output or miss causes. The
checks that span the whole file (a request id used twice, a unit id covering two
lengths, a field given on some lines only) are made within each chunk.
"""
from __future__ import annotations

import mmap
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from radixkv.errors import ConfigError, InputWarning, TraceFormatError
from radixkv.metrics import _PCTS, hit_length_histogram, summary_of
from radixkv.replay.sequential import COLUMNS, DETAIL_SAMPLES, replay_rows
from radixkv.trace.types import Trace

#: formats :func:`replay_stream` reads (one request per line)
STREAM_FORMATS = ("native", "mooncake")
#: requests per chunk by default
CHUNK_REQUESTS = 1 << 16
_BLANK = b" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"


# --------------------------------------------------------------------------- aggregates
def _pairwise_leaves(n: int) -> list[tuple[int, int]]:
    """The blocks (start, length ≤ 128) numpy's ``pairwise_sum`` splits *n* items into,
    in order (``numpy/_core/src/umath/loops_utils.h.src``: halves cut at a multiple of 8)."""
    out, stack = [], [(0, n)]
    while stack:
        lo, m = stack.pop()
        if m <= 128:
            out.append((lo, m))
            continue
        h = m // 2
        h -= h % 8
        stack.append((lo + h, m - h))
        stack.append((lo, h))
    return out


def _block_sums(a: np.ndarray, m: int) -> np.ndarray:
    """numpy's pairwise sum of each row of *a* (float64, shape (k, m), m ≤ 128): below 8
    items a plain loop from 0.0; else eight interleaved partial sums combined as
    ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the rest added one by one."""
    if m < 8:
        res = np.zeros(a.shape[0])
        for j in range(m):
            res = res + a[:, j]
        return res
    r = [a[:, j].copy() for j in range(8)]
    top = m - m % 8
    for i in range(8, top, 8):
        for j in range(8):
            r[j] += a[:, i + j]
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for i in range(top, m):
        res = res + a[:, i]
    return res


class _PairwiseMean:
    """``np.mean`` of *n* float64 values given in order, a chunk at a time: numpy's
    pairwise sum (leaf blocks summed as they complete, then combined in numpy's order)
    over *n*. Holds one sum per leaf (≤ 128 values) and the values of the open leaf."""

    def __init__(self, n: int):
        self.n = n
        leaves = np.array(_pairwise_leaves(n) if n else [], dtype=np.int64).reshape(-1, 2)
        self.lo, self.len = leaves[:, 0], leaves[:, 1]
        self.end = self.lo + self.len
        self.sums = np.zeros(len(leaves))
        self.done = 0  # leaves summed
        self.carry = np.zeros(0)
        self.carry_at = 0  # replay row of carry[0]

    def add(self, values: np.ndarray) -> None:
        buf = np.concatenate([self.carry, values]) if self.carry.size else values
        end = self.carry_at + len(buf)
        k = self.done
        j = int(np.searchsorted(self.end, end, side="right"))  # leaves complete now: k … j−1
        for m in np.unique(self.len[k:j]).tolist():
            idx = k + np.flatnonzero(self.len[k:j] == m)
            rows = buf[(self.lo[idx] - self.carry_at)[:, None] + np.arange(m)]
            self.sums[idx] = _block_sums(rows, m)
        self.done = j
        start = int(self.lo[j]) if j < len(self.lo) else end
        self.carry = buf[start - self.carry_at:].copy()
        self.carry_at = start

    def mean(self) -> float:
        if not self.n:
            return 0.0
        sums = iter(self.sums.tolist())

        def total(m: int) -> float:
            if m <= 128:
                return next(sums)
            h = m // 2
            h -= h % 8
            left = total(h)
            return left + total(m - h)

        return total(self.n) / self.n


def _lerp(a: int, b: int, t: float) -> float:
    """numpy's ``_lerp`` (``np.percentile``'s linear method) of two integers."""
    d = float(b - a)
    return float(b) - d * (1.0 - t) if t >= 0.5 else float(a) + d * t


class StreamAggregates:
    """:func:`radixkv.metrics.column_aggregates` of a replay of *n* requests, built from
    its rows a chunk at a time (:meth:`add`), in O(distinct hit lengths + n / 128)
    memory. Equal to the in-memory dict value for value (``tests/test_stream.py``)."""

    def __init__(self, n: int):
        self.n = n
        self.ints = dict.fromkeys(("prompt_tokens", "hit_tokens", "hit_requests", "alignment_loss_tokens",
                                   "held_tokens", "evicted_tokens", "valid_half"), 0)
        self.hit_max = 0
        self.meta_max = None
        self.ratio = _PairwiseMean(n)
        self.values = np.zeros(0, dtype=np.int64)  # distinct hit lengths, ascending
        self.counts = np.zeros(0, dtype=np.int64)
        self.sampled = {"dup": [], "run": [], "free": [], "cached": []}

    def add(self, cols: dict, i0: int, i1: int) -> None:
        """Fold rows ``i0 … i1−1`` of *cols* (the replay's columns, indexed by row)."""
        c = {k: v[i0:i1] for k, v in cols.items()}
        hit, prompt = c["hit_tokens"], c["prompt_tokens"]
        for k, col in (("prompt_tokens", prompt), ("hit_tokens", hit), ("alignment_loss_tokens",
                       c["alignment_loss_tokens"]), ("held_tokens", c["held_tokens"]),
                       ("evicted_tokens", c["evicted_tokens"])):
            self.ints[k] += int(col.sum())
        self.ints["hit_requests"] += int((hit > 0).sum())
        if i1 > i0:
            self.hit_max = max(self.hit_max, int(hit.max()))
            m = int(c["metadata_bytes"].max())
            self.meta_max = m if self.meta_max is None else max(self.meta_max, m)
        self.ratio.add(hit / prompt)
        v, k = np.unique(hit, return_counts=True)
        allv = np.concatenate([self.values, v])
        allk = np.concatenate([self.counts, k])
        order = np.argsort(allv, kind="stable")
        allv, allk = allv[order], allk[order]
        first = np.flatnonzero(np.r_[True, allv[1:] != allv[:-1]]) if allv.size else np.zeros(0, dtype=np.int64)
        self.values, self.counts = allv[first], np.add.reduceat(allk, first) if allv.size else allk
        dup = c["duplicate_tokens"]
        self.sampled["dup"].append(dup[dup >= 0])
        run, free = c["largest_free_run"], c["free_slots"]
        ok = (run >= 0) & (free > 0)
        self.sampled["run"].append(run[ok])
        self.sampled["free"].append(free[ok])
        h = max(i0, self.n // 2)
        if h < i1:
            cached = c["cached_tokens"][h - i0:]
            self.sampled["cached"].append(cached[cached >= 0])
            self.ints["valid_half"] += int(c["valid_tokens"][h - i0:].sum())

    def _at_rank(self, r: int) -> int:
        return int(self.values[np.searchsorted(np.cumsum(self.counts), r, side="right")])

    def result(self) -> dict:
        """The dict :func:`radixkv.metrics.column_aggregates` returns for all rows."""
        n = self.n
        pct = {}
        for p in _PCTS:
            v = (n - 1) * (p / 100)
            lo = int(np.floor(v))
            hi = min(lo + 1, n - 1)
            pct[p] = _lerp(self._at_rank(lo), self._at_rank(hi), v - lo) if n else 0.0
        second = n - n // 2
        if self.ints["valid_half"] >= 2 ** 53:  # np.mean's float sum is exact below 2^53 only
            raise ConfigError("valid tokens too large to average exactly in a streaming replay")
        cat = {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in self.sampled.items()}
        return {
            "requests": n,
            **{k: self.ints[k] for k in ("prompt_tokens", "hit_tokens", "hit_requests")},
            "mean_request_hit_ratio": self.ratio.mean(),
            "hit_percentiles": pct,
            "hit_max": self.hit_max,
            "hit_length_histogram": hit_length_histogram(self.values, counts=self.counts),
            **{k: self.ints[k] for k in ("alignment_loss_tokens", "held_tokens", "evicted_tokens")},
            "duplicate_sampled": cat["dup"],
            "scatter_sampled": (cat["run"], cat["free"]),
            "metadata_bytes_max": self.meta_max,
            "cached_sampled_second_half": cat["cached"],
            "valid_second_half_mean": float(self.ints["valid_half"]) / second if n else 0.0,
        }


# --------------------------------------------------------------------------- the window
class _Pages:
    """An int64 array of *n* zeros in an anonymous private mapping, whose pages can be
    handed back (:meth:`release`): they read as zeros again and hold no memory."""

    def __init__(self, n: int):
        self.map = mmap.mmap(-1, max(8 * n, 8), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(self.map, dtype=np.int64, count=n)

    def release(self, i0: int, i1: int) -> None:
        """Hand back the whole pages inside elements ``i0 … i1−1``."""
        page = mmap.PAGESIZE
        a = -(-8 * i0 // page) * page
        b = (8 * i1 // page) * page
        if b > a and hasattr(self.map, "madvise"):
            self.map.madvise(mmap.MADV_DONTNEED, a, b - a)


class _Rows:
    """``req_id`` of the window trace: row ``i`` of the replay is ``ids[i − start]``."""

    def __init__(self, n: int):
        self.n, self.start, self.ids = n, 0, np.zeros(0, dtype=str)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.ids[i - self.start]


class _Window:
    """The columns of an *n*-request replay that the kernels index by row, with only the
    current chunk's rows filled (:meth:`load`); ids are the chunk's own arrays."""

    def __init__(self, n: int, unit_tokens: int, partial_last_unit: bool, has_out: bool, name: str):
        self.n = n
        self.pages = {k: _Pages(n) for k in ("prompt_len", "output_len")}
        self.pages["id_offsets"] = _Pages(n + 1)
        if has_out:
            self.pages["out_offsets"] = _Pages(n + 1)
        self.cols = {k: _Pages(n) for k in COLUMNS}
        self.rows = _Rows(n)
        self.trace = Trace(req_id=self.rows, arrival_s=np.zeros(0), prompt_len=self.pages["prompt_len"].array,
                           output_len=self.pages["output_len"].array, ids=np.zeros(0, dtype=np.int64),
                           id_offsets=self.pages["id_offsets"].array, unit_tokens=unit_tokens,
                           partial_last_unit=partial_last_unit, out_ids=None, out_offsets=None, name=name)

    def load(self, chunk: Trace, i0: int) -> None:
        """Show *chunk*'s requests as rows ``i0 …`` of the replay."""
        i1 = i0 + len(chunk)
        t = self.trace
        t.prompt_len[i0:i1] = chunk.prompt_len
        t.output_len[i0:i1] = chunk.output_len
        t.id_offsets[i0:i1 + 1] = chunk.id_offsets
        t.ids = chunk.ids
        if "out_offsets" in self.pages:
            t.out_offsets = self.pages["out_offsets"].array
            t.out_offsets[i0:i1 + 1] = chunk.out_offsets
            t.out_ids = chunk.out_ids
        self.rows.start, self.rows.ids = i0, chunk.req_id
        t._seq_cache.clear()

    def release(self, i0: int, i1: int) -> None:
        """Hand back the pages of rows ``i0 … i1−1`` (done and aggregated)."""
        for p in list(self.pages.values()) + list(self.cols.values()):
            p.release(i0, i1)


# --------------------------------------------------------------------------- reading
def _count_requests(path: Path, fmt: str) -> tuple[int, bytes | None]:
    """(request lines, the native header line or None): non-blank lines, less a header."""
    n, header, first = 0, None, True
    with open(path, "rb") as f:
        for line in f:
            if not line.strip(_BLANK):
                continue
            if first and fmt == "native" and b'"radixkv_trace"' in line:
                header = line if line.endswith(b"\n") else line + b"\n"
            else:
                n += 1
            first = False
    return n, header


def _chunks(path: Path, fmt: str, header: bytes | None, size: int, limit: int):
    """Yield each chunk of up to *size* request lines as (Trace, first request's line)."""
    import importlib

    from radixkv.trace.load import _READERS

    module, func = _READERS[fmt]
    reader = getattr(importlib.import_module(module), func)
    with tempfile.TemporaryDirectory(prefix="radixkv-stream-") as tmp, open(path, "rb") as f:
        part = os.path.join(tmp, "chunk.jsonl")
        lines, where, ln, done, seen_header = [], [], 0, 0, header is None
        for line in f:
            ln += 1
            if not line.strip(_BLANK):
                continue
            if not seen_header:
                seen_header = True
                continue
            lines.append(line if line.endswith(b"\n") else line + b"\n")
            where.append(ln)
            if len(lines) == size or done + len(lines) == limit:
                yield _parse(reader, part, path, header, lines, where), where[0]
                done += len(lines)
                lines, where = [], []
                if done == limit:
                    return
        if lines:
            yield _parse(reader, part, path, header, lines, where), where[0]


def _parse(reader, part: str, path: Path, header, lines, where) -> Trace:
    """Parse one chunk with the format's reader; errors and warnings name *path* and the
    file's own line numbers."""
    with open(part, "wb") as f:
        if header is not None:
            f.write(header)
        f.writelines(lines)
    skip = 1 if header is not None else 0

    def line_of(local):
        return None if local is None or local <= skip else where[local - skip - 1]

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", InputWarning)
            return reader(part)
    except InputWarning as w:
        raise TraceFormatError(f"{w.reason}: a streaming replay needs the requests in time order",
                               path=path, line=line_of(w.line), field=w.field) from None
    except TraceFormatError as e:
        raise TraceFormatError(e.reason, path=path, line=line_of(e.line), field=e.field) from None


# --------------------------------------------------------------------------- the replay
def replay_stream(path, spec, pool, *, format: str | None = None,  # noqa: A002 (the CLI's --format)
                  chunk_requests: int = CHUNK_REQUESTS, limit: int | None = None) -> dict:
    """Replay the JSONL trace *path* sequentially through a fresh *spec* policy on *pool*,
    reading it *chunk_requests* requests at a time (module docstring).

    Parameters
    ----------
    path : str or Path
        A native or Mooncake JSONL trace, in time order.
    spec : radixkv.policies.registry.PolicySpec
    pool : radixkv.policies.registry.PoolSpec
    format : str, optional
        ``native`` or ``mooncake``; detected when None.
    chunk_requests : int
        Requests per chunk (≥ 1).
    limit : int, optional
        Replay the first *limit* requests only.

    Returns
    -------
    dict
        The summary :func:`radixkv.replay.run.run_replay` returns for the same trace,
        policy and pool, with ``timing_s`` (``compile``, ``replay``: seconds of the chunks'
        replays; ``read``: seconds reading and parsing; ``kernels``), and ``stream`` (chunk
        size, chunks).

    Raises
    ------
    radixkv.errors.TraceFormatError
        A malformed record (file, line and field as the reader words them), a chunk out
        of time order, or a format that is not one request per line.
    radixkv.errors.ConfigError
        No requests, a bad *chunk_requests*, or a request that does not fit the pool.
    """
    from radixkv.policies.host_tier import host_tier_summary
    from radixkv.policies.registry import build_policy, measured_metrics
    from radixkv.replay.run import warmup
    from radixkv.trace.detect import canonical_format, detect_format

    path = Path(path)
    fmt = detect_format(path) if format is None else canonical_format(format)
    if fmt not in STREAM_FORMATS:
        raise TraceFormatError(f"a streaming replay reads {' or '.join(STREAM_FORMATS)} JSONL, not {fmt}", path=path)
    if int(chunk_requests) < 1:
        raise ConfigError(f"chunk size must be ≥ 1 request, got {chunk_requests}", field="chunk_requests")
    n, header = _count_requests(path, fmt)
    if limit is not None:
        if limit < 0:
            raise ConfigError(f"--limit must be ≥ 0, got {limit}", field="limit")
        n = min(n, int(limit))
    if n == 0:
        raise ConfigError("no requests to replay (empty trace or --limit 0)", path=path, field="limit")
    compile_s = warmup(spec, concurrent=False)
    half = n // 2
    every = max(1, (n - half) // DETAIL_SAMPLES)
    agg = StreamAggregates(n)
    policy = window = None
    replay_s = read_s = 0.0
    chunks = 0
    prev_arrival = None
    t_read = time.perf_counter()
    i0 = 0
    for chunk, first_line in _chunks(path, fmt, header, int(chunk_requests), n):
        read_s += time.perf_counter() - t_read
        if prev_arrival is not None and len(chunk) and chunk.arrival_s[0] < prev_arrival:
            raise TraceFormatError(f"arrives at {chunk.arrival_s[0]:g} s, before the previous request "
                                   f"({prev_arrival:g} s): a streaming replay needs the requests in time order",
                                   path=path, line=first_line)
        prev_arrival = chunk.arrival_s[-1]
        if window is None:
            window = _Window(n, chunk.unit_tokens, chunk.partial_last_unit, chunk.out_ids is not None, str(path))
            policy = build_policy(spec, pool, unit_tokens=chunk.unit_tokens)
            if getattr(policy, "unit_granular", False):
                # vLLM's unit-granular pool (radixkv.policies._hash_unit_kernels.UnitPool.span)
                # registers a trace's unit ids once, on its first span, and keeps them while
                # cached blocks refer to them; the window shows each chunk's ids in turn and
                # keeps none, so the stream runs the per-block kernels (same results)
                policy.unit_granular = False
        elif (chunk.out_ids is not None) != ("out_offsets" in window.pages):
            raise TraceFormatError("output_tokens given on some lines only", path=path, line=first_line,
                                   field="output_tokens")
        i1 = i0 + len(chunk)
        window.load(chunk, i0)
        t0 = time.perf_counter()
        cols = {k: p.array for k, p in window.cols.items()}
        replay_rows(window.trace, policy, cols, i0, i1, n, half, every, label=spec.label, name=str(path))
        replay_s += time.perf_counter() - t0
        cols["alignment_loss_tokens"][i0:i1] = cols["held_tokens"][i0:i1] - cols["hit_tokens"][i0:i1]
        agg.add(cols, i0, i1)
        window.release(i0, i1)
        chunks += 1
        i0 = i1
        t_read = time.perf_counter()
    summary = summary_of(agg.result(), policy=spec.label or policy.name, num_slots=policy.num_slots,
                         slot_tokens=policy.slot_tokens, capacity_tokens=policy.num_slots * policy.slot_tokens,
                         evictions=policy.evictions, measures=measured_metrics(policy),
                         kv_cache_groups=policy.group_metrics() if hasattr(policy, "group_metrics") else None)
    summary["timing_s"] = {"compile": compile_s, "replay": replay_s, "read": read_s, "kernels": "compiled"}
    summary.update(host_tier_summary(policy, summary["prompt_tokens"]))  # n/a without a host tier
    summary["timing_s"]["prompt_tokens_per_s"] = summary["prompt_tokens"] / replay_s if replay_s > 0 else None
    summary["stream"] = {"chunk_requests": int(chunk_requests), "chunks": chunks}
    return summary
