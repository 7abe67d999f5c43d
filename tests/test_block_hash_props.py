"""BlockHashCache against the brute-force vLLM model (tests/reference_vllm.py).

Random traces with tiny vocabularies (so prefixes collide), random prompt and output
lengths (including 0/1 outputs, block-multiple lengths and exact repeats), random block
sizes and pool sizes. Every admission must agree (refused or hit / held / evicted tokens),
and so must the free-queue order and the pool statistics.
Examples per test: ``RADIXKV_HYPOTHESIS_EXAMPLES`` (tests/conftest.py: 500, 2,000 with ``RADIXKV_SLOW=1``).
"""
from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixkv.policies import BlockHashCache
from radixkv.policies import _hash_kernels as K
from radixkv.trace.types import Trace

from reference_vllm import ReferenceVLLM

N_EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000))
SETTINGS = settings(max_examples=N_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

STAT_FIELDS = ("used_slots", "cached_slots", "free_slots", "valid_tokens", "cached_tokens",
               "duplicate_tokens", "largest_free_run")


def _stats(c):
    s = c.stats()
    assert s.used_slots + s.cached_slots + s.free_slots == s.num_slots
    # the incrementally kept reachable-key count equals a breadth-first search
    assert s.cached_tokens == K.reachable_keys(c._blk, c._b32, c._kt, c._k32) * c.block_size
    return {f: getattr(s, f) for f in STAT_FIELDS}


def _ref_stats(r):
    s = r.stats()
    return {f: getattr(s, f) for f in STAT_FIELDS}


def _same(a, r):
    if a is None or r is None:
        return a is None and r is None
    return (a.hit_tokens, a.held_tokens, a.evicted_tokens) == (r.hit_tokens, r.held_tokens, r.evicted_tokens)


def _token_trace(rng, B, vocab, m):
    """A U = 1 trace of *m* requests whose prompts reuse earlier prompts + outputs."""
    prompts, outputs, history = [], [], []
    for _ in range(m):
        kind = rng.choice(["fresh", "extend", "repeat"])
        if kind == "repeat" and prompts:
            p = list(rng.choice(prompts))
        else:
            base = rng.choice(history) if (kind == "extend" and history) else []
            cut = rng.randint(0, len(base))
            p = base[:cut] + [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
            if rng.random() < 0.5 and len(p) >= B:  # block-multiple length
                p = p[: len(p) // B * B]
            if not p:
                p = [rng.randrange(vocab)]
        n_out = rng.choice([0, 1, rng.randint(0, 20)])
        o = [rng.randrange(vocab) for _ in range(n_out)]
        prompts.append(p)
        outputs.append(o)
        history.append(p + o)
    return Trace.from_requests(
        req_id=[str(i) for i in range(m)], arrival_s=[0.0] * m,
        prompt_len=[len(p) for p in prompts], output_len=[len(o) for o in outputs],
        prompt_ids=prompts, output_ids=outputs,
    )


@st.composite
def token_traces(draw):
    """(trace, B, rng): token content from a drawn seed (fast to generate, still shrinks)."""
    B = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    vocab = draw(st.integers(1, 3))
    m = draw(st.integers(1, 16))
    rng = random.Random(draw(st.integers(0, 2**32)))
    return _token_trace(rng, B, vocab, m), B, rng


@st.composite
def unit_traces(draw):
    """A hash-id trace (U > 1, partial last unit or unique tail, unique outputs)."""
    U = draw(st.sampled_from([2, 3, 4, 5]))
    B = draw(st.sampled_from([1, 2, 3, 4, 8]))
    partial = draw(st.booleans())
    m = draw(st.integers(1, 14))
    rng = random.Random(draw(st.integers(0, 2**32)))
    ids, plen, olen, hist = [], [], [], []
    for _ in range(m):
        base = rng.choice(hist) if hist and rng.random() < 0.6 else []
        p = base[: rng.randint(0, len(base))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 6))]
        if not p:
            p = [rng.randint(0, 3)]
        k = len(p)
        P = rng.randint((k - 1) * U + 1, k * U) if partial else rng.randint(k * U, k * U + U - 1)
        ids.append(p)
        hist.append(p)
        plen.append(P)
        olen.append(rng.randint(0, 7))
    t = Trace.from_requests(
        req_id=[str(i) for i in range(m)], arrival_s=[0.0] * m, prompt_len=plen, output_len=olen,
        prompt_ids=ids, unit_tokens=U, partial_last_unit=partial,
    )
    return t, B, rng


def _sequential(t, B, nb):
    c = BlockHashCache(nb, B, verify=True)
    r = ReferenceVLLM(nb, B)
    for i in range(len(t)):
        s = t.kv_seq(i)
        a, e = c.run_request(i, s), r.run_request(i, s)
        assert _same(a, e), (i, a, e)
        assert c.free_queue().tolist() == r.queue
    assert _stats(c) == _ref_stats(r)
    assert c.evicted_tokens_total == r.evicted_blocks * B


@SETTINGS
@given(tb=token_traces(), nb=st.integers(2, 40))
def test_sequential_token_traces_match_reference(tb, nb):
    t, B, _ = tb
    _sequential(t, B, nb)


@SETTINGS
@given(tb=unit_traces(), nb=st.integers(2, 40))
def test_sequential_unit_traces_match_reference(tb, nb):
    t, B, _ = tb
    _sequential(t, B, nb)


@SETTINGS
@given(tb=token_traces(), nb=st.integers(2, 30))
def test_interleaved_requests_match_reference(tb, nb):
    """Several running requests: admits (whole prompt, first chunk, resumed), extends
    (chunks and decode steps), finishes and preemptions in a random order."""
    t, B, rng = tb
    c = BlockHashCache(nb, B, verify=True)
    r = ReferenceVLLM(nb, B)
    running = {}  # rid -> seq
    next_rid = 0
    for _ in range(rng.randint(1, 30)):
        op = rng.choice(["admit", "admit", "extend", "extend", "finish", "preempt"])
        if op == "admit" or not running:
            s = t.kv_seq(rng.randrange(len(t)))
            how = rng.choice(["prompt", "chunk", "resume"])
            n = None
            if how == "chunk":
                n = rng.randint(1, s.prompt_len)
            elif how == "resume" and s.kv_len > s.prompt_len:
                n = rng.randint(s.prompt_len + 1, s.kv_len)
            # peek_hit: no side effect (pool arrays, queue, stats) and equal to the admission's hit
            before = [x.copy() for x in (c._blk, c._kt, c._pcid, c._pcs, c._st)]
            q_before, st_before = c.free_queue().tolist(), _stats(c)
            peek = c.peek_hit(s, n)
            assert all((x == y).all() for x, y in zip(before, (c._blk, c._kt, c._pcid, c._pcs, c._st)))
            assert c.free_queue().tolist() == q_before and _stats(c) == st_before
            a, e = c.admit(next_rid, s, n), r.admit(next_rid, s, n)
            if e is not None:
                assert peek == e.hit_tokens, (peek, e)
            assert _same(a, e), (op, a, e)
            if a is not None:
                running[next_rid] = s
            next_rid += 1
        else:
            rid = rng.choice(sorted(running))
            if op == "extend":
                n = rng.randint(0, running[rid].kv_len - r.running[rid]["ntok"])
                assert c.extend(rid, n) == r.extend(rid, n)
            else:
                getattr(c, op)(rid)
                getattr(r, op)(rid)
                del running[rid]
        assert c.free_queue().tolist() == r.queue
        assert _stats(c) == _ref_stats(r)
    assert c.evicted_tokens_total == r.evicted_blocks * B
