"""The binary cache of parsed text traces (radixkv.trace.cache): a hit gives the columns a
parse gives; a changed file, an unclean read or a bad entry is never served from it."""
import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from radixkv.errors import InputWarning, TraceFormatError
from radixkv.trace.load import load_trace

TRACES = Path(__file__).resolve().parent.parent / "traces"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(d))
    monkeypatch.delenv("RADIXKV_TRACE_CACHE", raising=False)
    return d / "traces"


def _parsed(path, **kw):
    """The trace as the reader parses it, cache off."""
    old = os.environ.get("RADIXKV_TRACE_CACHE")
    os.environ["RADIXKV_TRACE_CACHE"] = "off"
    try:
        return load_trace(path, **kw)
    finally:
        if old is None:
            del os.environ["RADIXKV_TRACE_CACHE"]
        else:
            os.environ["RADIXKV_TRACE_CACHE"] = old


def _same(a, b):
    for f in dataclasses.fields(a):
        if not f.compare:
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray), f.name
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), f.name
        else:
            assert type(x) is type(y) and x == y, f.name


def _mooncake(path, rows):
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 3, "hash_ids": ids}) + "\n"
                            for t, n, ids in rows))


@pytest.mark.parametrize("name", ["multi_turn.jsonl", "agent_tools.jsonl"])
def test_a_hit_gives_the_parsed_columns(cache, tmp_path, name):
    src = tmp_path / name
    shutil.copyfile(TRACES / name, src)
    first = load_trace(src)
    assert len(list(cache.glob("*.npz"))) == 1
    _same(first, _parsed(src))
    _same(load_trace(src), _parsed(src))


def test_a_hit_is_read_from_the_cache_and_not_next_to_the_input(cache, tmp_path, monkeypatch):
    src = tmp_path / "in" / "t.jsonl"
    src.parent.mkdir()
    _mooncake(src, [(0, 600, [0, 1]), (5, 1030, [0, 2, 3])])
    load_trace(src)
    assert sorted(p.name for p in src.parent.iterdir()) == ["t.jsonl"]
    import radixkv.trace.mooncake as m

    monkeypatch.setattr(m, "read_mooncake", lambda *a, **k: pytest.fail("parsed, not read from the cache"))
    t = load_trace(src)
    assert list(t.prompt_len) == [600, 1030] and t.unit_tokens == 512


def test_same_size_and_time_other_bytes_is_parsed_again(cache, tmp_path):
    src = tmp_path / "t.jsonl"
    _mooncake(src, [(0, 600, [0, 1]), (5, 1030, [0, 2, 3])])
    st = src.stat()
    assert list(load_trace(src).ids) == [0, 1, 0, 2, 3]
    _mooncake(src, [(0, 600, [0, 7]), (5, 1030, [0, 2, 3])])  # same length, other ids
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert src.stat().st_size == st.st_size and src.stat().st_mtime_ns == st.st_mtime_ns
    assert list(load_trace(src).ids) == [0, 7, 0, 2, 3]
    assert len(list(cache.glob("*.npz"))) == 1  # the entry was replaced, not added


def test_a_read_that_warns_is_never_cached(cache, tmp_path):
    src = tmp_path / "t.jsonl"
    _mooncake(src, [(5, 600, [0, 1]), (0, 1030, [0, 2, 3])])  # out of time order
    for _ in range(2):
        with pytest.warns(InputWarning, match="time order|not in"):
            load_trace(src)
    assert not list(cache.glob("*.npz"))


def test_bad_entries_and_errors(cache, tmp_path):
    src = tmp_path / "t.jsonl"
    _mooncake(src, [(0, 600, [0, 1])])
    load_trace(src)
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(b"not a zip")
    assert list(load_trace(src).ids) == [0, 1]  # a bad entry is a miss, then rewritten
    assert entry.read_bytes()[:2] == b"PK"
    src.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}\n')
    with pytest.raises(TraceFormatError, match="hash_ids"):
        load_trace(src)


def test_off_writes_nothing(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXKV_TRACE_CACHE", "off")
    src = tmp_path / "t.jsonl"
    _mooncake(src, [(0, 600, [0, 1])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_trace(src)
    assert not cache.exists()
