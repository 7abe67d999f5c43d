"""The sequential replay's in-kernel request loop (``replay_span``) gives the same records
as the Python loop over ``run_request`` + ``stats``; its segment builder equals
``Trace.kv_seq``."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.errors import ConfigError
from radixkv.policies.registry import PoolSpec, build_policy, parse_policy
from radixkv.replay.sequential import replay_sequential
from radixkv.trace._seq_kernel import (kv_seq_ids_then_output_into, kv_seq_into, kv_seq_is_ids_then_output,
                                       kv_seq_is_prompt_ids, kv_seq_len)
from radixkv.trace.types import Trace
from conftest import draw_prompt_len

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000)) // 10
TRACES = Path(__file__).resolve().parent.parent / "traces"
SPAN_POLICIES = ["sglang:1", "sglang:4", "vllm:16", "vllm:8", "vllm:4", "unit-lru"]


@st.composite
def traces(draw):
    U = draw(st.sampled_from([1, 1, 4, 16]))
    partial = draw(st.booleans())
    with_out = U == 1 and draw(st.booleans())
    n = draw(st.integers(1, 40))
    prompts, lens, outs, oids = [], [], [], []
    for _ in range(n):
        k = draw(st.integers(1, 10))
        ids = draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
        P = draw_prompt_len(draw, st, k, U, partial)
        N = draw(st.integers(0, 6))
        prompts.append(ids)
        lens.append(P)
        outs.append(N)
        oids.append(draw(st.lists(st.integers(0, 3), min_size=N, max_size=N)))
    return Trace.from_requests(
        req_id=[f"r{i}" for i in range(n)], arrival_s=[0.0] * n, prompt_len=lens, output_len=outs,
        prompt_ids=prompts, unit_tokens=U, partial_last_unit=partial,
        output_ids=oids if with_out else None,
    )


def _python_loop(t, spec, cap):
    pol = build_policy(spec, PoolSpec(capacity_tokens=cap), unit_tokens=t.unit_tokens)
    pol.replay_span = None  # the Python loop
    return pol, replay_sequential(t, pol)


def _same(t, spec, cap):
    try:
        pb, b = _python_loop(t, spec, cap)
    except ConfigError as e:
        with pytest.raises(ConfigError) as got:
            replay_sequential(t, build_policy(spec, PoolSpec(capacity_tokens=cap), unit_tokens=t.unit_tokens))
        assert str(got.value) == str(e)
        return
    pa = build_policy(spec, PoolSpec(capacity_tokens=cap), unit_tokens=t.unit_tokens)
    assert getattr(pa, "replay_span", None) is not None
    a = replay_sequential(t, pa)
    for c in b.columns:
        assert np.array_equal(a[c], b[c]), c
    assert (pa.evictions, pa.evicted_tokens_total) == (pb.evictions, pb.evicted_tokens_total)


@settings(max_examples=EXAMPLES, deadline=None)
@given(traces())
def test_kv_seq_kernel_equals_trace_kv_seq(t):
    has_out = t.out_ids is not None
    oids = t.out_ids if has_out else t.ids[:0]
    ooff = t.out_offsets if has_out else t.id_offsets[:1]
    for i in range(len(t)):
        want = t.kv_seq(i)
        m = kv_seq_len(t.id_offsets, ooff, has_out, t.prompt_len, t.output_len, t.unit_tokens, i)
        sid = np.full(m + 3, 99, dtype=np.int64)
        send = np.full(m + 3, 99, dtype=np.int64)
        got = kv_seq_into(t.ids, t.id_offsets, oids, ooff, has_out, t.prompt_len, t.output_len, t.unit_tokens, i,
                          sid, send)
        assert got == m == len(want.seg_id)
        assert sid[:m].tolist() == want.seg_id.tolist() and send[:m].tolist() == want.seg_end.tolist()
        if kv_seq_is_prompt_ids(t.id_offsets, t.prompt_len, t.output_len, t.unit_tokens, i):
            # the span's views: the prompt ids, ending at 1 … P
            assert want.seg_id.tolist() == t.prompt_ids(i).tolist()
            assert want.seg_end.tolist() == list(range(1, int(t.prompt_len[i]) + 1))
        if kv_seq_is_ids_then_output(t.id_offsets, t.prompt_len, t.output_len, t.unit_tokens, has_out, i):
            # the span's copy of the ids then the output id, its ends 1 … P then the KV extent
            P = int(t.prompt_len[i])
            assert want.seg_id[:P].tolist() == t.prompt_ids(i).tolist() and len(want.seg_id) == P + 1
            assert want.seg_end.tolist() == list(range(1, P + 1)) + [t.kv_len(i)] and t.kv_len(i) > P
            sid2 = np.full(m + 3, 99, dtype=np.int64)
            assert kv_seq_ids_then_output_into(t.ids, t.id_offsets, t.prompt_len, i, sid2) == P + 1
            assert sid2[:P + 1].tolist() == want.seg_id.tolist()


@settings(max_examples=EXAMPLES, deadline=None)
@given(traces(), st.sampled_from(SPAN_POLICIES), st.integers(8, 200))
def test_span_equals_python_loop(t, policy, cap):
    _same(t, parse_policy(policy), cap)


@pytest.mark.parametrize("policy", SPAN_POLICIES)
@pytest.mark.parametrize("name", ["demo.jsonl", "multi_turn.jsonl"])
def test_bundled_traces(name, policy):
    from radixkv.trace.load import load_trace

    t = load_trace(TRACES / name)
    for cap in (6000, 60_000):
        _same(t, parse_policy(policy), cap)


def test_subclasses_that_override_the_hooks_keep_the_python_loop():
    from radixkv.policies.block_hash import BlockHashCache
    from radixkv.policies.radix import RadixCache
    from radixkv.replay.sequential import span_method

    class Mine(BlockHashCache):
        def run_request(self, rid, seq):
            return super().run_request(rid, seq)

    class Plain(RadixCache):
        pass

    assert span_method(Mine(100, 16)) is None
    assert span_method(BlockHashCache(100, 16)) is not None
    assert span_method(Plain(64, 1)) is not None


@pytest.mark.parametrize("policy", ["vllm:16@lfu", "sglang:1@lfu"])
def test_priority_policies_replay_as_before(policy):
    from radixkv.replay.sequential import span_method

    try:
        spec = parse_policy(policy)
    except ConfigError:
        pytest.skip(f"{policy} is not a registered policy here")
    pol = build_policy(spec, PoolSpec(capacity_tokens=4096))
    assert span_method(pol) is None


def _rows(t, spec, cap, half, every, span=True, calls=None):
    """The columns of ``replay_rows`` over the whole of *t* with detail rows *half*, *every*
    (``span=False``: the Python loop, ``run_request`` then ``stats``), and the policy;
    *calls*: a list that gets one entry per ``replay_span`` call."""
    from radixkv.records import COLUMNS
    from radixkv.replay.sequential import replay_rows

    pol = build_policy(spec, PoolSpec(capacity_tokens=cap), unit_tokens=t.unit_tokens)
    if not span:
        pol.replay_span = None
    elif calls is not None:
        run = pol.replay_span

        def counted(*a, **k):
            calls.append(a[1:3])
            return run(*a, **k)

        pol.replay_span = counted
    cols = {c: np.zeros(len(t), dtype=np.int64) for c in COLUMNS}
    replay_rows(t, pol, cols, 0, len(t), len(t), half, every)
    return cols, pol


def _detail_rows_same(t, spec, cap, half, every, calls=None):
    """The span's rows (detail rows inside the kernel) equal the Python loop's, whose
    detail rows are ``stats(detail=True)``; False when the replay raised (the same
    error both ways)."""
    try:
        want, pb = _rows(t, spec, cap, half, every, span=False)
    except ConfigError as e:
        with pytest.raises(ConfigError) as got:
            _rows(t, spec, cap, half, every)
        assert str(got.value) == str(e)
        return False
    got, pa = _rows(t, spec, cap, half, every, calls=calls)
    n = len(t)
    for c in want:
        assert np.array_equal(got[c], want[c]), c
    # the detail rows hold the detailed stats (≥ 0), the others −1
    is_detail = np.zeros(n, dtype=bool)
    is_detail[[i for i in range(n) if (i >= half and (i - half) % every == 0) or i == n - 1]] = True
    for c in ("largest_free_run", "cached_tokens"):
        assert (want[c][is_detail] >= 0).all() and (want[c][~is_detail] == -1).all(), c
    assert (pa.evictions, pa.evicted_tokens_total) == (pb.evictions, pb.evicted_tokens_total)
    return True


@settings(max_examples=EXAMPLES, deadline=None)
@given(traces(), st.sampled_from(["vllm:16", "vllm:8", "vllm:4", "vllm:2"]), st.integers(8, 200),
       st.integers(0, 45), st.integers(1, 5))
def test_block_hash_span_detail_rows_equal_stats(t, policy, cap, half, every):
    """vLLM's span with its detail rows inside the kernel (``span_detail_rows``; the
    unit-granular pool for hash-id traces whose unit is a multiple of the block)."""
    _detail_rows_same(t, parse_policy(policy), cap, half, every)


@pytest.mark.parametrize("policy", ["vllm:16", "vllm:8", "vllm:32"])
@pytest.mark.parametrize("name", ["demo.jsonl", "multi_turn.jsonl", "agent_tools.jsonl"])
def test_block_hash_span_detail_rows_bundled(name, policy):
    from radixkv.trace.load import load_trace

    t = load_trace(TRACES / name)
    n = len(t)
    for cap, half, every in ((60_000, n // 2, max(1, (n - n // 2) // 32)), (60_000, n // 3, 7), (14_000, 0, 1)):
        calls = []
        assert _detail_rows_same(t, parse_policy(policy), cap, half, every, calls=calls)
        # the detail rows ran inside the span: fewer calls than detail rows
        assert 0 < len(calls) < len(range(half, n, every)), (len(calls), cap, half, every)
