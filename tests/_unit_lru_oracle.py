"""The plain-Python unit-lru oracle and its hypothesis traces, shared by test_unit_lru.py
(the policy, one capacity) and test_lru_curve.py (every capacity in one pass).

unit-lru caches a request's units keyed by the whole id prefix that ends with them (here a
tuple), least recently used first; a request hits its leading cached units (capped at
its prompt length), then touches every unit in prompt order, a new one evicting the least
recent when the cache holds *capacity_units* units.
"""
from __future__ import annotations

from collections import OrderedDict

from conftest import draw_prompt_len
from radixkv.trace.types import Trace


def unit_lru_oracle(prompts, lens, U, capacity_units):
    """Per request ``(hit tokens, evicted tokens, units cached, valid tokens)`` after it.

    *prompts*: lists of unit ids; *lens*: prompt lengths in tokens; *U*: tokens per id (a
    unit covers ``min((j + 1)·U, P) − min(j·U, P)`` tokens of its prompt)."""
    cache: OrderedDict = OrderedDict()  # prefix tuple -> tokens it was inserted with
    valid = 0  # Σ of the cache's values, kept as it changes (a whole trace stays linear)
    out = []
    for ids, P in zip(prompts, lens):
        keys = [tuple(ids[: j + 1]) for j in range(len(ids))]
        toks = [min((j + 1) * U, P) - min(j * U, P) for j in range(len(ids))]
        h = 0
        while h < len(keys) and keys[h] in cache:
            h += 1
        ev = 0
        for k, nt in zip(keys, toks):
            if k in cache:
                cache.move_to_end(k)
            else:
                if len(cache) == capacity_units:
                    ev += cache.popitem(last=False)[1]
                cache[k] = nt
                valid += nt
        valid -= ev
        out.append((min(h * U, P), ev, len(cache), valid))
    return out


def draw_unit_prompts(draw, st, max_n: int):
    """``(U, partial, prompts, lens)``: U of 1, 4 or 512 tokens per id, 1 … *max_n*
    prompts of 1 … 8 ids from {0, 1, 2, 3} (so prefixes repeat), lengths as the readers
    accept (:func:`conftest.draw_prompt_len`)."""
    U = draw(st.sampled_from([1, 4, 512]))
    partial = draw(st.booleans())
    n = draw(st.integers(1, max_n))
    prompts, lens = [], []
    for _ in range(n):
        k = draw(st.integers(1, 8))
        prompts.append(draw(st.lists(st.integers(0, 3), min_size=k, max_size=k)))
        lens.append(draw_prompt_len(draw, st, k, U, partial))
    return U, partial, prompts, lens


def unit_trace(prompts, lens, U, partial) -> Trace:
    """The trace of :func:`draw_unit_prompts`' requests (ids ``0, 1, …``, all at time 0)."""
    return Trace.from_requests(
        req_id=[str(i) for i in range(len(prompts))], arrival_s=[0.0] * len(prompts), prompt_len=lens,
        output_len=[1] * len(prompts), prompt_ids=prompts, unit_tokens=U, partial_last_unit=partial,
    )
