"""``check_policy``: does a new cache policy keep the contract the replays rely on?

In the spirit of scikit-learn's ``check_estimator`` and gymnasium's ``check_env``: run it
on your own :class:`~radixkv.policies.base.PrefixCache` subclass and it tells you, with a
message, which rule you broke::

    from radixkv.policies.check import check_policy
    check_policy(lambda capacity_tokens: MyCache.from_capacity_tokens(capacity_tokens))

Rules checked, on small seeded token traces with shared prefixes:

1. ``stats()`` accounts for every slot: ``used + cached + free == num_slots``, none negative.
2. A hit never exceeds the prompt, nor the longest prefix the request shares with the KV
   content of any earlier request (no hit out of thin air), and ``held ≥ hit``.
3. After ``finish``, no slot stays ``used`` when no request runs.
4. A refused ``admit`` (None) leaves ``stats()`` unchanged.
5. The same trace on a fresh instance gives the same hits (determinism).
6. With the pool large enough to hold everything, a request that repeats an earlier
   prompt exactly hits something (unless its prompt is at most one block/page long).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from radixkv.policies.base import PrefixCache
from radixkv.trace.types import Trace


class PolicyContractError(AssertionError):
    """A policy broke a rule of the :class:`PrefixCache` contract (the message says which)."""


def _traces(seed: int) -> list[Trace]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(3):
        shared = rng.integers(0, 50, size=int(rng.integers(5, 60))).tolist()
        prompts, outs = [], []
        for i in range(30):
            if rng.random() < 0.25 and prompts:
                p = list(prompts[int(rng.integers(len(prompts)))])  # exact repeat
            else:
                p = shared[: int(rng.integers(1, len(shared) + 1))] + rng.integers(0, 50, size=int(rng.integers(0, 40))).tolist()
            prompts.append(p)
            outs.append(rng.integers(0, 50, size=int(rng.integers(0, 6))).tolist())
        out.append(
            Trace.from_requests(
                req_id=[f"q{i}" for i in range(30)], arrival_s=[0.0] * 30,
                prompt_len=[len(p) for p in prompts], output_len=[len(o) for o in outs],
                prompt_ids=prompts, output_ids=outs, name=f"check-{seed}-{k}",
            )
        )
    return out


def _kv_tokens(trace: Trace, i: int) -> list[int]:
    o = trace.output_ids(i)
    P = int(trace.prompt_len[i])
    kv = trace.kv_len(i)
    return trace.prompt_ids(i).tolist() + (o.tolist()[: kv - P] if o is not None else [])


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _fail(name, rule, detail):
    raise PolicyContractError(f"{name}: rule {rule} broken: {detail}")


def check_policy(
    factory: Callable[[int], PrefixCache],
    *,
    capacities=(64, 256, 100_000),
    seed: int = 0,
    expect_hits: bool = True,
) -> None:
    """Run the contract checks on policies built by ``factory(capacity_tokens)``.

    Parameters
    ----------
    factory : callable
        ``factory(capacity_tokens) -> PrefixCache``, a fresh policy on a pool of about that
        many usable tokens.
    capacities : tuple of int
        Pool sizes in tokens to try (small ones force eviction and refusals).
    seed : int
        Seed of the generated traces.
    expect_hits : bool
        Apply rule 6 (False for a policy that never caches, such as ``NoCache``).

    Raises
    ------
    PolicyContractError
        Naming the rule broken, the request and the numbers.
    """
    for trace in _traces(seed):
        for cap in capacities:
            hits_a = _run(factory, cap, trace, expect_hits)
            hits_b = _run(factory, cap, trace, expect_hits)
            if hits_a != hits_b:
                _fail(trace.name, 5, f"two fresh instances at capacity {cap} gave different hits")


def _run(factory, cap, trace, expect_hits) -> list:
    pol = factory(cap)
    name = f"{type(pol).__name__} on {trace.name} at {cap} tokens"
    seen: list[list[int]] = []
    hits = []
    for i in range(len(trace)):
        seq = trace.kv_seq(i)
        before = pol.stats()
        _check_stats(name, before)
        if pol.fits_alone(seq) > 0:
            hits.append(None)
            continue
        adm = pol.admit(i, seq)
        if adm is None:
            after = pol.stats()
            if after != before:
                _fail(name, 4, f"request {i} was refused but stats changed: {before} -> {after}")
            hits.append(None)
            continue
        prompt = trace.prompt_ids(i).tolist()
        bound = max((_lcp(prompt, s) for s in seen), default=0)
        if adm.hit_tokens > seq.prompt_len:
            _fail(name, 2, f"request {i} hit {adm.hit_tokens} tokens of a {seq.prompt_len}-token prompt")
        if adm.hit_tokens > bound:
            _fail(name, 2, f"request {i} hit {adm.hit_tokens} tokens but shares at most {bound} with earlier requests")
        if adm.held_tokens < adm.hit_tokens:
            _fail(name, 2, f"request {i}: held_tokens {adm.held_tokens} < hit_tokens {adm.hit_tokens}")
        if expect_hits and cap >= 100_000 and prompt in [s[: len(prompt)] for s in seen] and adm.hit_tokens == 0 and len(prompt) > 64:
            _fail(name, 6, f"request {i} repeats an earlier prompt of {len(prompt)} tokens in a large pool but hit 0")
        _check_stats(name, pol.stats())
        if seq.kv_len > seq.prompt_len:
            pol.extend(i, seq.kv_len - seq.prompt_len)  # a False here is allowed: the request just ends
        pol.finish(i)
        st = pol.stats()
        _check_stats(name, st)
        if st.used_slots != 0:
            _fail(name, 3, f"after request {i} finished, {st.used_slots} slots are still used with nothing running")
        seen.append(_kv_tokens(trace, i))
        hits.append(adm.hit_tokens)
    return hits


def _check_stats(name, st):
    if min(st.used_slots, st.cached_slots, st.free_slots) < 0:
        _fail(name, 1, f"negative slot count in {st}")
    if st.used_slots + st.cached_slots + st.free_slots != st.num_slots:
        _fail(name, 1, f"used {st.used_slots} + cached {st.cached_slots} + free {st.free_slots} != {st.num_slots} slots")
