"""RadixCache against the brute-force reference model on random traces (hypothesis).

tests/reference_sglang.py implements the same SGLang rules independently (explicit token
tuples, SGLang's float LRU clock, the eviction heap rebuilt on every call) and reproduces
the golden files itself (test_radix_golden.py). Here both replay random traces request by
request and must agree on every request's hit, held tokens, evicted tokens and the tree
size afterwards. Vocabularies are tiny so prefixes collide; lengths include page
multiples, 0- and 1-token outputs, exact repeats and multi-turn extensions; pools range
from just big enough for the largest request (heavy eviction) upwards.

Examples per test: ``RADIXKV_HYPOTHESIS_EXAMPLES`` (tests/conftest.py: 500, 2,000 with ``RADIXKV_SLOW=1``).
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixkv.policies.radix import RadixCache
from radixkv.trace.types import Trace
from reference_sglang import RefRadixCache, expand

EXAMPLES = int(os.environ.get("RADIXKV_HYPOTHESIS_EXAMPLES", 2000))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def token_traces(draw):
    """A token trace (U = 1, real output ids) whose prompts share prefixes."""
    vocab = draw(st.integers(1, 4))
    tok = st.integers(0, vocab - 1)
    n = draw(st.integers(1, 10))
    prompts, outs = [], []
    for _ in range(n):
        kind = draw(st.sampled_from(["new", "repeat", "turn", "prefix"])) if prompts else "new"
        if kind == "new":
            pr = draw(st.lists(tok, min_size=1, max_size=24))
        else:
            j = draw(st.integers(0, len(prompts) - 1))
            if kind == "repeat":
                pr = list(prompts[j])
            elif kind == "turn":  # next turn: earlier prompt + its output + a new message
                pr = prompts[j] + outs[j] + draw(st.lists(tok, min_size=0, max_size=8))
            else:
                k = draw(st.integers(0, len(prompts[j])))
                pr = prompts[j][:k] + draw(st.lists(tok, min_size=0 if k else 1, max_size=8))
        prompts.append(pr)
        outs.append(draw(st.lists(tok, min_size=0, max_size=6)))
    return Trace.from_requests(
        req_id=[f"q{i}" for i in range(n)], arrival_s=[0.0] * n,
        prompt_len=[len(p) for p in prompts], output_len=[len(o) for o in outs],
        prompt_ids=prompts, output_ids=outs,
    )


@st.composite
def unit_traces(draw):
    """A hash-id trace (U = 2..4, unique outputs), Mooncake-style or WEKA-style tails."""
    U = draw(st.integers(2, 4))
    partial = draw(st.booleans())
    n = draw(st.integers(1, 8))
    idl = st.integers(0, draw(st.integers(0, 3)))
    ids, plen, olen = [], [], []
    for _ in range(n):
        if ids and draw(st.booleans()):
            j = draw(st.integers(0, len(ids) - 1))
            k = draw(st.integers(0, len(ids[j])))
            u = ids[j][:k] + draw(st.lists(idl, min_size=0, max_size=4))
        else:
            u = draw(st.lists(idl, min_size=0, max_size=6))
        if partial:
            if not u:
                u = [draw(idl)]
            P = len(u) * U - draw(st.integers(0, U - 1))
        else:
            P = len(u) * U + draw(st.integers(0 if u else 1, U - 1))
        ids.append(u)
        plen.append(P)
        olen.append(draw(st.integers(0, 7)))
    return Trace.from_requests(
        req_id=[f"q{i}" for i in range(n)], arrival_s=[0.0] * n, prompt_len=plen, output_len=olen,
        prompt_ids=ids, unit_tokens=U, partial_last_unit=partial,
    )


def _compare(trace, page_size, slack_pages, chunk, last_token):
    p = page_size
    seqs = [trace.kv_seq(i) for i in range(len(trace))]
    kvs = []
    for i, s in enumerate(seqs):
        kv = expand(s)
        if last_token and s.kv_len > s.prompt_len:
            # the overlap scheduler's extra token: unique content in both models
            kv = kv + (kv[-1][:2] + (kv[-1][2] + 1,),) if kv[-1][0] < 0 else kv + (("extra", i),)
        kvs.append(kv)
    pages = max(-(-len(kv) // p) for kv in kvs) + slack_pages
    cache = RadixCache(pages * p, p, chunked_prefill_size=chunk, cache_last_token_on_stop=last_token)
    ref = RefRadixCache(pages * p, p, chunked_prefill_size=chunk)
    for i, s in enumerate(seqs):
        before = cache.evicted_tokens_total
        adm = cache.run_request(i, s)
        assert adm is not None
        got = (adm.hit_tokens, adm.held_tokens, cache.evicted_tokens_total - before, cache.stats().cached_tokens)
        want = ref.run(kvs[i][: s.prompt_len], kvs[i]) + (ref.tree_tokens(),)
        assert got == want, (i, got, want)
        st_ = cache.stats()
        assert st_.used_slots == 0 and st_.free_slots == ref.free_pages
    cache.check_invariants()


@SETTINGS
@given(
    trace=token_traces(),
    page_size=st.sampled_from([1, 1, 2, 4]),
    slack=st.integers(0, 12),
    chunk=st.one_of(st.none(), st.integers(1, 10)),
    last_token=st.booleans(),
)
def test_token_traces_match_reference(trace, page_size, slack, chunk, last_token):
    if chunk is not None:
        chunk = max(chunk, page_size)
    _compare(trace, page_size, slack, chunk, last_token)


@SETTINGS
@given(
    trace=unit_traces(),
    page_size=st.sampled_from([1, 2, 3, 4]),
    slack=st.integers(0, 12),
    chunk=st.one_of(st.none(), st.integers(4, 12)),
)
def test_unit_traces_match_reference(trace, page_size, slack, chunk):
    _compare(trace, page_size, slack, chunk, False)
