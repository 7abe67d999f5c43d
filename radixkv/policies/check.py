"""``check_policy``: does a cache policy keep the contract the replays rely on?

In the spirit of scikit-learn's ``check_estimator`` / ``parametrize_with_checks``: one
named check per rule, run on small seeded token traces with shared prefixes, at pool
sizes that force eviction and refusals and at one that never evicts::

    from radixkv import check_policy
    check_policy(lambda capacity_tokens: MyCache.from_capacity_tokens(capacity_tokens, 16))
    check_policy("vllm:16")            # any spec the command line accepts
    check_policy(MyCache)              # a class: MyCache.from_capacity_tokens(capacity)

It raises :class:`PolicyContractError` listing every rule broken (``err.failures`` maps
the broken rule's name → message). A policy that raises inside a hook fails the checks that
reached the call, each message naming the exception and the policy's line, with the
traceback in ``err.tracebacks`` (and the first one in the error's text). In pytest, one
test per rule::

    from radixkv.policies.check import parametrize_with_checks

    @parametrize_with_checks({"mine": lambda cap: MyCache.from_capacity_tokens(cap, 16)})
    def test_my_policy(factory, check):
        check(factory)

The checks (:data:`CHECKS`, in order):

========================== ================================================================
``slot_accounting``        ``stats()``: ``used + cached + free == num_slots``, none negative,
                           after every call
``stats_detail_agrees``    ``stats(detail=False)`` equals ``stats()`` except the fields it may
                           leave at −1 (``cached_tokens``, ``duplicate_tokens``,
                           ``largest_free_run``)
``no_hit_out_of_thin_air`` a hit never exceeds the looked-up length, nor the longest prefix
                           shared with KV computed earlier; ``hit ≤ held ≤ looked-up length``
``hits_held_by_pool``      a hit never exceeds what the pool held before the admission:
                           ``hit ≤ cached_tokens`` and ``hit ≤ (used + cached) × slot_tokens``
                           (less ``host_loaded_tokens``, loaded from a host tier)
``finish_releases_all``    with nothing running, no slot is ``used``
``refusal_changes_nothing`` a refused ``admit`` (None) or ``extend`` (False) leaves
                           ``stats()`` unchanged
``deterministic``          the same calls on a fresh instance give the same answers
``repeats_hit``            in a pool that never evicts, an exact repeat of a prompt longer
                           than 64 tokens hits (skipped with ``expect_hits=False``)
``several_running``        the rules above hold with several requests running at once,
                           chunked prefill, decode, finish and preemption interleaved (what
                           it finds is reported under the rule broken, e.g.
                           ``slot_accounting``, "found by the 'several_running' check")
``running_kv_resident``    while requests run, ``used`` slots cover each running request's
                           KV: ``used_slots ≥ ceil(tokens with KV / slot_tokens)`` for each
                           (a block shared with a request that finished is not freed)
``chunked_admit``          ``admit(n)`` + ``extend`` chunks give the same hit as one
                           ``admit``, and leave the same cache for later requests
``preempt``                ``preempt`` ends the request (it can be admitted again, with
                           ``n_tokens`` = prompt + generated) and keeps the accounting
``run_request_equivalent`` ``run_request`` = ``admit`` / ``extend`` / ``finish`` (same
                           admissions, same ``stats()``)
``peek_hit_pure``          ``peek_hit`` equals the next admission's hit and has no side
                           effect (skipped when the class has no ``peek_hit``)
========================== ================================================================

Policies that model no running requests (class attribute ``holds_running_kv = False``,
e.g. ``unit-lru``) skip ``running_kv_resident``.
"""
from __future__ import annotations

import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from radixkv.policies.base import PrefixCache
from radixkv.policies.toolkit import common_prefix_len
from radixkv.trace.types import Trace

__all__ = ["PolicyContractError", "PolicyCheck", "CHECKS", "check_policy", "parametrize_with_checks",
           "CheckNotApplicable"]

DEFAULT_CAPACITIES = (64, 256, 8192)
#: a capacity at which no check's trace evicts (a trace holds at most 30 × 104 tokens)
_LARGE = 8192


class PolicyContractError(AssertionError):
    """A policy broke rules of the :class:`PrefixCache` contract.

    Attributes
    ----------
    failures : dict
        Check name → message (one line), for every check that failed.
    tracebacks : dict
        Check name → the formatted traceback, for every check that failed because the
        policy raised inside a hook (``admit``, ``extend``, ``stats``, …); the message then
        names the exception and the policy's line that raised it.
    """

    def __init__(self, message: str, failures: dict | None = None, tracebacks: dict | None = None):
        super().__init__(message)
        self.failures = dict(failures or {})
        self.tracebacks = dict(tracebacks or {})


class CheckNotApplicable(Exception):
    """A check does not apply to this policy (e.g. ``peek_hit_pure`` without ``peek_hit``)."""


class _Broken(Exception):
    """A rule broken; *rule* names it when the check that found it is another (e.g.
    ``several_running`` finding slot accounting broken with several requests running)."""

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


def _as_factory(policy) -> Callable[[int], PrefixCache]:
    """A factory ``capacity_tokens -> PrefixCache`` from a factory, a class or a spec text."""
    if isinstance(policy, str):
        from radixkv.policies.registry import PoolSpec, build_policy, parse_policy

        spec = parse_policy(policy)
        return lambda cap: build_policy(spec, PoolSpec(capacity_tokens=max(int(cap), spec.size or 1)))
    if isinstance(policy, type) and issubclass(policy, PrefixCache):
        return lambda cap: policy.from_capacity_tokens(max(int(cap), int(policy.default_size or 1)))
    if callable(policy):
        return policy
    raise TypeError(f"check_policy needs a factory capacity_tokens -> PrefixCache, a class or a spec, got {policy!r}")


# ---------------------------------------------------------------------- workloads
def _traces(seed: int) -> list[Trace]:
    """Three seeded token traces of 30 requests: prefixes shared at random lengths,
    exact repeats, short outputs."""
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


@dataclass
class _Ctx:
    factory: Callable[[int], PrefixCache]
    capacities: tuple
    seed: int
    expect_hits: bool
    _tr: list | None = None

    @property
    def traces(self) -> list[Trace]:
        if self._tr is None:
            self._tr = _traces(self.seed)
        return self._tr

    def cells(self):
        for trace in self.traces:
            for cap in self.capacities:
                yield trace, cap


def _where(pol, trace, cap):
    return f"{type(pol).__name__} on {trace.name} at {cap} tokens"


def _stats_ok(pol, st, where):
    if min(st.used_slots, st.cached_slots, st.free_slots) < 0:
        raise _Broken(f"{where}: negative slot count in {st}", "slot_accounting")
    if st.used_slots + st.cached_slots + st.free_slots != st.num_slots:
        raise _Broken(f"{where}: used {st.used_slots} + cached {st.cached_slots} + free {st.free_slots} "
                      f"!= {st.num_slots} slots", "slot_accounting")


class _Observer:
    """Hooks a check attaches to a workload; each raises :class:`_Broken`. ``ended`` is
    the last call that ended a request (``finish`` or ``preempt``)."""

    ended = "finish"

    def after(self, pol, where, running): ...

    def admitted(self, pol, where, i, seq, n, adm, before, holders): ...

    def refused(self, pol, where, what, before): ...


def _sequential(ctx, obs: _Observer, trace, cap):
    """admit / extend / finish one request at a time; returns the admissions."""
    pol = ctx.factory(cap)
    where = _where(pol, trace, cap)
    holders = []
    log = []
    obs.after(pol, where, {})
    for i in range(len(trace)):
        seq = trace.kv_seq(i)
        if pol.fits_alone(seq) > 0:
            log.append("too big")
            continue
        before = pol.stats()
        adm = pol.admit(i, seq)
        if adm is None:
            obs.refused(pol, where, f"admit of request {i}", before)
            log.append(None)
            continue
        obs.admitted(pol, where, i, seq, seq.prompt_len, adm, before, holders)
        n = max(seq.prompt_len, adm.hit_tokens)
        obs.after(pol, where, {i: n})
        if seq.kv_len > n:
            before = pol.stats()
            if pol.extend(i, seq.kv_len - n):
                n = seq.kv_len
            else:
                obs.refused(pol, where, f"extend of request {i}", before)
            obs.after(pol, where, {i: n})
        pol.finish(i)
        holders.append((seq, n))
        obs.ended = "finish"
        obs.after(pol, where, {})
        log.append((adm.hit_tokens, adm.held_tokens, adm.evicted_tokens))
    return log, pol


def _peeks(pol, trace, i, where):
    """peek_hit on request *i* and two others; raises when stats() changes."""
    before = pol.stats()
    for j in (i, (i * 7 + 3) % len(trace), (i * 13 + 5) % len(trace)):
        pol.peek_hit(trace.kv_seq(j))
    after = pol.stats()
    if after != before:
        raise _Broken(f"{where}: peek_hit before request {i} changed stats(): {before} -> {after}")


def _interleaved(ctx, obs: _Observer, trace, cap, seed):
    """Several requests at once: chunked admissions, extends, finishes, preemptions and
    re-admissions in a seeded random order (at most 4 running). Returns the call log."""
    rng = np.random.default_rng(seed)
    pol = ctx.factory(cap)
    where = _where(pol, trace, cap) + " with several running"
    S = pol.slot_tokens
    waiting = deque(i for i in range(len(trace)) if pol.fits_alone(trace.kv_seq(i)) == 0)
    running: dict[int, int] = {}  # rid -> tokens with KV
    generated: dict[int, int] = {}  # rid -> tokens with KV at its last preemption beyond the prompt
    holders: list = []
    log: list = []
    steps = 0
    obs.after(pol, where, running)

    # a policy without running requests caches a prompt when it admits it
    at_admit = not getattr(pol, "holds_running_kv", True)

    def end(rid, how):
        n = running.pop(rid)
        holders.append((trace.kv_seq(rid), max(n, trace.kv_seq(rid).prompt_len) if at_admit else n))
        if how == "finish":
            pol.finish(rid)
        else:
            pol.preempt(rid)
            generated[rid] = max(0, n - trace.kv_seq(rid).prompt_len)
            waiting.appendleft(rid)
        log.append((how, rid))
        obs.ended = how  # which call emptied the pool, for the rule a leak breaks
        obs.after(pol, where, running)

    while (waiting or running) and steps < 4000:
        steps += 1
        if waiting and len(running) < 4 and (not running or rng.random() < 0.35):
            i = waiting[0]
            seq = trace.kv_seq(i)
            P = seq.prompt_len
            g = generated.get(i, 0)
            if g:
                n = min(P + g, seq.kv_len)
            else:
                n = P if rng.random() < 0.5 else int(rng.integers(1, P + 1))
            before = pol.stats()
            try:
                adm = pol.admit(i, seq, n)
            except ValueError:
                if n <= P:
                    raise
                n = P  # the policy does not take re-admissions beyond the prompt
                adm = pol.admit(i, seq, n)
            if adm is None:
                obs.refused(pol, where, f"admit of request {i} ({n} tokens)", before)
                log.append(("refused", i, n))
                if not running:
                    waiting.popleft()  # cannot fit even alone with its re-admission length
                else:
                    end(min(running), "preempt" if rng.random() < 0.5 else "finish")
                continue
            waiting.popleft()
            now = [(trace.kv_seq(r), max(t, trace.kv_seq(r).prompt_len) if at_admit else t) for r, t in running.items()]
            obs.admitted(pol, where, i, seq, n, adm, before, holders + now)
            running[i] = max(n, adm.hit_tokens)
            log.append(("admit", i, n, adm.hit_tokens, adm.held_tokens, adm.evicted_tokens))
            obs.after(pol, where, running)
            continue
        rid = sorted(running)[int(rng.integers(len(running)))]
        seq = trace.kv_seq(rid)
        n = running[rid]
        u = rng.random()
        if u < 0.08:
            end(rid, "preempt")
        elif n < seq.kv_len and (n < seq.prompt_len or u < 0.85):
            k = min(int(rng.integers(1, 2 * S + 9)), seq.kv_len - n)
            before = pol.stats()
            ok = pol.extend(rid, k)
            log.append(("extend", rid, k, bool(ok)))
            if ok:
                running[rid] = n + k
                obs.after(pol, where, running)
            else:
                obs.refused(pol, where, f"extend of request {rid} by {k} tokens", before)
                end(rid, "preempt")
        else:
            end(rid, "finish")
    for rid in sorted(running):
        end(rid, "finish")
    log.append(("stats", pol.stats()))
    return log, pol


def _both(ctx, obs, *, interleaved=True, sequential=True):
    for trace, cap in ctx.cells():
        if sequential:
            _sequential(ctx, obs, trace, cap)
        if interleaved:
            _interleaved(ctx, obs, trace, cap, ctx.seed + cap)


# ---------------------------------------------------------------------- the checks
def _check_slot_accounting(ctx):
    class O(_Observer):
        def after(self, pol, where, running):
            _stats_ok(pol, pol.stats(), where)

    _both(ctx, O(), interleaved=False)


def _check_stats_detail(ctx):
    class O(_Observer):
        def after(self, pol, where, running):
            full, fast = pol.stats(), pol.stats(detail=False)
            for f in full.__dataclass_fields__:
                a, b = getattr(full, f), getattr(fast, f)
                if a != b and not (b == -1 and f in ("cached_tokens", "duplicate_tokens", "largest_free_run")):
                    raise _Broken(f"{where}: stats(detail=False).{f} = {b} but stats().{f} = {a}")

    _both(ctx, O())


def _hit_bounds(pol, where, i, seq, n, adm, holders):
    L = max(seq.prompt_len, n)
    if adm.hit_tokens < 0 or adm.hit_tokens > L:
        raise _Broken(f"{where}: request {i} hit {adm.hit_tokens} tokens of a {L}-token lookup",
                      "no_hit_out_of_thin_air")
    bound = 0
    for other, valid in holders:
        if valid > bound:
            bound = max(bound, common_prefix_len(seq, other, 0, min(valid, L)))
    if adm.hit_tokens > bound:
        raise _Broken(f"{where}: request {i} hit {adm.hit_tokens} tokens but shares at most {bound} "
                      f"with KV computed before it", "no_hit_out_of_thin_air")
    # held is a prefix of what was looked up: the prompt, or prompt + generated tokens on a
    # re-admission (a policy may cap it at the prompt)
    if not min(adm.hit_tokens, seq.prompt_len) <= adm.held_tokens <= L:
        raise _Broken(f"{where}: request {i}: need min(hit_tokens {adm.hit_tokens}, prompt {seq.prompt_len}) "
                      f"≤ held_tokens {adm.held_tokens} ≤ looked-up length {L}",
                      "no_hit_out_of_thin_air")


def _check_thin_air(ctx):
    class O(_Observer):
        def admitted(self, pol, where, i, seq, n, adm, before, holders):
            _hit_bounds(pol, where, i, seq, n, adm, holders)

    _both(ctx, O())


def _check_held_by_pool(ctx):
    class O(_Observer):
        def admitted(self, pol, where, i, seq, n, adm, before, holders):
            held = (before.used_slots + before.cached_slots) * before.slot_tokens
            # tokens loaded back from a host-memory tier were not in the GPU pool
            hit = adm.hit_tokens - adm.host_loaded_tokens
            if hit > held:
                raise _Broken(f"{where}: request {i} hit {hit} tokens but the pool held "
                              f"{before.used_slots} used + {before.cached_slots} cached slots "
                              f"({held} tokens) before admission")
            if before.cached_tokens >= 0 and hit > before.cached_tokens:
                raise _Broken(f"{where}: request {i} hit {hit} tokens but stats() said the pool "
                              f"held {before.cached_tokens} cached tokens before admission")

    _both(ctx, O())


def _leak_rule(ended: str) -> str:
    """The rule a pool with slots still used and nothing running breaks: ``preempt`` when
    a preemption ended the last request, else ``finish_releases_all``."""
    return "preempt" if ended == "preempt" else "finish_releases_all"


def _check_finish_releases(ctx):
    class O(_Observer):
        def after(self, pol, where, running):
            if not running:
                st = pol.stats()
                if st.used_slots != 0:
                    raise _Broken(f"{where}: {st.used_slots} slots are still used with nothing running "
                                  f"(the last request ended by {self.ended})", _leak_rule(self.ended))

    _both(ctx, O())


def _check_refusal(ctx):
    class O(_Observer):
        def refused(self, pol, where, what, before):
            after = pol.stats()
            if after != before:
                raise _Broken(f"{where}: the {what} was refused but stats() changed: {before} -> {after}")

    _both(ctx, O())


def _check_deterministic(ctx):
    obs = _Observer()
    for trace, cap in ctx.cells():
        a, _ = _sequential(ctx, obs, trace, cap)
        b, _ = _sequential(ctx, obs, trace, cap)
        if a != b:
            raise _Broken(f"{trace.name} at {cap} tokens: two fresh instances gave different admissions")
        a, _ = _interleaved(ctx, obs, trace, cap, ctx.seed + cap)
        b, _ = _interleaved(ctx, obs, trace, cap, ctx.seed + cap)
        if a != b:
            raise _Broken(f"{trace.name} at {cap} tokens with several running: two fresh instances gave "
                          f"different answers")


def _check_repeats_hit(ctx):
    if not ctx.expect_hits:
        raise CheckNotApplicable("expect_hits=False")
    obs = _Observer()
    for trace in ctx.traces:
        log, pol = _sequential(ctx, obs, trace, _LARGE)
        seen = []
        for i in range(len(trace)):
            prompt = trace.prompt_ids(i).tolist()
            rec = log[i]
            if isinstance(rec, tuple) and rec[0] == 0 and len(prompt) > 64 and prompt in seen:
                raise _Broken(f"{_where(pol, trace, _LARGE)}: request {i} repeats an earlier prompt of "
                              f"{len(prompt)} tokens in a pool that never evicts but hit 0")
            seen.append(prompt)


def _check_several_running(ctx):
    class O(_Observer):
        def after(self, pol, where, running):
            st = pol.stats()
            _stats_ok(pol, st, where)
            if not running and st.used_slots:
                raise _Broken(f"{where}: {st.used_slots} slots are still used with nothing running "
                              f"(the last request ended by {self.ended})", _leak_rule(self.ended))

        def admitted(self, pol, where, i, seq, n, adm, before, holders):
            _hit_bounds(pol, where, i, seq, n, adm, holders)

        def refused(self, pol, where, what, before):
            after = pol.stats()
            if after != before:
                raise _Broken(f"{where}: the {what} was refused but stats() changed: {before} -> {after}",
                              "refusal_changes_nothing")

    for trace, cap in ctx.cells():
        _interleaved(ctx, O(), trace, cap, ctx.seed + cap)


def _check_resident(ctx):
    probe = ctx.factory(ctx.capacities[0])
    if not getattr(probe, "holds_running_kv", True):
        raise CheckNotApplicable(f"{type(probe).__name__} models no running requests (holds_running_kv = False)")

    class O(_Observer):
        def after(self, pol, where, running):
            if not running:
                return
            S = pol.slot_tokens
            rid, n = max(running.items(), key=lambda kv: kv[1])
            st = pol.stats(detail=False)
            need = -(-n // S)
            if st.used_slots < need:
                raise _Broken(f"{where}: request {rid} runs with {n} tokens of KV ({need} slots) but only "
                              f"{st.used_slots} slots are used: KV a running request holds was freed")

    for trace, cap in ctx.cells():
        _interleaved(ctx, O(), trace, cap, ctx.seed + cap)


def _check_chunked(ctx):
    probe = ctx.factory(_LARGE)
    if getattr(probe, "chunked_prefill_changes_cache", False):
        # the engine itself caches differently per chunk (e.g. SGLang's SWA and Mamba
        # trees checkpoint every chunk: out-of-window frees, states at chunk ends)
        raise CheckNotApplicable(f"{type(probe).__name__} caches per prefill chunk (chunked_prefill_changes_cache)")
    for trace in ctx.traces:
        whole = ctx.factory(_LARGE)
        chunked = ctx.factory(_LARGE)
        where = _where(whole, trace, _LARGE)
        S = whole.slot_tokens
        for i in range(len(trace)):
            seq = trace.kv_seq(i)
            a = whole.admit(i, seq)
            chunk = max(1, (i % 3 + 1) * S - (i % 2))
            first = min(chunk, seq.prompt_len)
            b = chunked.admit(i, seq, first)
            if a is None or b is None:
                raise _Broken(f"{where}: request {i} refused in a pool that never fills")
            if a.hit_tokens != b.hit_tokens:
                raise _Broken(f"{where}: request {i} hit {a.hit_tokens} admitted whole but {b.hit_tokens} when "
                              f"admit(n_tokens={first}) starts a chunked prefill")
            n = max(first, b.hit_tokens)
            while n < seq.kv_len:
                k = min(chunk, seq.kv_len - n)
                if not chunked.extend(i, k):
                    raise _Broken(f"{where}: extend of request {i} refused in a pool that never fills")
                n += k
            m = max(seq.prompt_len, a.hit_tokens)
            if seq.kv_len > m and not whole.extend(i, seq.kv_len - m):
                raise _Broken(f"{where}: extend of request {i} refused in a pool that never fills")
            whole.finish(i)
            chunked.finish(i)
            ca, cb = whole.stats().cached_tokens, chunked.stats().cached_tokens
            if ca != cb:
                raise _Broken(f"{where}: after request {i} the cache holds {ca} tokens when prompts are admitted "
                              f"whole but {cb} when they are prefilled in chunks of {chunk}")


def _check_preempt(ctx):
    for trace, cap in ctx.cells():
        pol = ctx.factory(cap)
        where = _where(pol, trace, cap)
        for i in range(len(trace)):
            seq = trace.kv_seq(i)
            if pol.fits_alone(seq) > 0 or seq.kv_len <= seq.prompt_len:
                continue
            adm = pol.admit(i, seq)
            if adm is None:
                continue
            n = max(seq.prompt_len, adm.hit_tokens)
            g = 0
            if seq.kv_len > n and pol.extend(i, 1):
                g = n + 1 - seq.prompt_len
            pol.preempt(i)
            st = pol.stats()
            _stats_ok(pol, st, where)
            if st.used_slots:
                raise _Broken(f"{where}: after preempting request {i}, the only one running, "
                              f"{st.used_slots} slots are still used")
            try:
                again = pol.admit(i, seq, min(seq.prompt_len + g, seq.kv_len))
            except ValueError as e:
                if g == 0 or "already running" in str(e):
                    raise _Broken(f"{where}: request {i} cannot be admitted again after preempt: {e}") from None
                again = pol.admit(i, seq)
            if again is not None:
                _stats_ok(pol, pol.stats(), where)
                pol.finish(i)
                st = pol.stats()
                if st.used_slots:
                    raise _Broken(f"{where}: {st.used_slots} slots still used after the re-admitted request "
                                  f"{i} finished", "finish_releases_all")


def _check_run_request(ctx):
    for trace, cap in ctx.cells():
        a = ctx.factory(cap)
        b = ctx.factory(cap)
        where = _where(a, trace, cap)
        for i in range(len(trace)):
            seq = trace.kv_seq(i)
            if a.fits_alone(seq) > 0:
                continue
            ra = a.run_request(i, seq)
            rb = b.admit(i, seq)
            if rb is not None and seq.kv_len > max(seq.prompt_len, rb.hit_tokens):
                if not b.extend(i, seq.kv_len - max(seq.prompt_len, rb.hit_tokens)):
                    b.finish(i)
                    rb = None
                else:
                    b.finish(i)
            elif rb is not None:
                b.finish(i)
            ta = None if ra is None else (ra.hit_tokens, ra.held_tokens, ra.evicted_tokens)
            tb = None if rb is None else (rb.hit_tokens, rb.held_tokens, rb.evicted_tokens)
            if ta != tb:
                raise _Broken(f"{where}: request {i}: run_request gave {ta} but admit/extend/finish gave {tb} "
                              f"(hit, held, evicted)")
            sa, sb = a.stats(), b.stats()
            if sa != sb:
                raise _Broken(f"{where}: after request {i}, run_request left {sa} but admit/extend/finish {sb}")


def _check_peek(ctx):
    probe = ctx.factory(ctx.capacities[0])
    if not probe.can_peek_hit():
        raise CheckNotApplicable(f"{type(probe).__name__} has no peek_hit")

    for trace, cap in ctx.cells():
        plain, _ = _sequential(ctx, _Observer(), trace, cap)
        peeked_pol = ctx.factory(cap)
        where = _where(peeked_pol, trace, cap)
        # the same life with peeks before every admission (own and other requests)
        peeked = []
        for i in range(len(trace)):
            seq = trace.kv_seq(i)
            if peeked_pol.fits_alone(seq) > 0:
                peeked.append("too big")
                continue
            _peeks(peeked_pol, trace, i, where)
            promised = int(peeked_pol.peek_hit(seq))
            adm = peeked_pol.admit(i, seq)
            if adm is None:
                peeked.append(None)
                continue
            if adm.hit_tokens != promised:
                raise _Broken(f"{where}: peek_hit said {promised} hit tokens for request {i} but admit gave "
                              f"{adm.hit_tokens}")
            n = max(seq.prompt_len, adm.hit_tokens)
            if seq.kv_len > n:
                peeked_pol.extend(i, seq.kv_len - n)
            peeked_pol.finish(i)
            peeked.append((adm.hit_tokens, adm.held_tokens, adm.evicted_tokens))
        if peeked != plain:
            k = next(j for j, (x, y) in enumerate(zip(plain, peeked)) if x != y)
            raise _Broken(f"{where}: with peek_hit calls before each admission, request {k} got {peeked[k]} "
                          f"instead of {plain[k]}: peek_hit has side effects")


@dataclass(frozen=True)
class PolicyCheck:
    """One rule of the contract, callable on a policy factory.

    ``check(factory, capacities=..., seed=..., expect_hits=...)`` raises
    :class:`PolicyContractError` (naming ``name``) when the rule is broken and
    :class:`CheckNotApplicable` when it does not apply.
    """

    name: str
    rule: str
    _run: Callable

    def __call__(self, policy, *, capacities=DEFAULT_CAPACITIES, seed: int = 0, expect_hits: bool = True) -> None:
        ctx = _Ctx(_as_factory(policy), tuple(capacities), int(seed), bool(expect_hits))
        self.run(ctx)

    def run(self, ctx) -> None:
        try:
            self._run(ctx)
        except _Broken as e:
            rule = e.rule or self.name
            found = "" if rule == self.name else f", found by the {self.name!r} check"
            msg = f"rule {rule!r} broken ({_RULE_TEXT.get(rule, self.rule)}{found}): {e}"
            raise PolicyContractError(msg, {rule: msg}) from None
        except (CheckNotApplicable, PolicyContractError):
            raise
        except Exception as e:  # the policy raised inside a hook: a failed check, not a crash
            tb = traceback.format_exc()
            frames = traceback.extract_tb(e.__traceback__)
            own = [f for f in frames if not f.filename.endswith(("policies/check.py", "policies\\check.py"))]
            at = own[-1] if own else frames[-1]
            msg = (f"rule {self.name!r} not checked ({self.rule}): the policy raised {type(e).__name__}: {e} "
                   f"(in {at.name}, {at.filename}:{at.lineno}; traceback in err.tracebacks[{self.name!r}])")
            raise PolicyContractError(msg + "\n" + tb, {self.name: msg}, {self.name: tb}) from e

    def __repr__(self):
        return f"PolicyCheck({self.name!r})"


CHECKS: tuple[PolicyCheck, ...] = (
    PolicyCheck("slot_accounting", "used + cached + free == num_slots, none negative", _check_slot_accounting),
    PolicyCheck("stats_detail_agrees", "stats(detail=False) agrees with stats()", _check_stats_detail),
    PolicyCheck("no_hit_out_of_thin_air", "a hit is a prefix of KV computed earlier", _check_thin_air),
    PolicyCheck("hits_held_by_pool", "a hit never exceeds what the pool held before admission", _check_held_by_pool),
    PolicyCheck("finish_releases_all", "with nothing running no slot is used", _check_finish_releases),
    PolicyCheck("refusal_changes_nothing", "a refused admit/extend leaves stats() unchanged", _check_refusal),
    PolicyCheck("deterministic", "the same calls give the same answers", _check_deterministic),
    PolicyCheck("repeats_hit", "an exact repeat hits in a pool that never evicts", _check_repeats_hit),
    PolicyCheck("several_running", "the rules hold with several requests running at once", _check_several_running),
    PolicyCheck("running_kv_resident", "KV a running request holds is never freed, shared or not", _check_resident),
    PolicyCheck("chunked_admit", "chunked admit(n_tokens) + extend = one admit", _check_chunked),
    PolicyCheck("preempt", "preempt ends the request and keeps the accounting", _check_preempt),
    PolicyCheck("run_request_equivalent", "run_request = admit/extend/finish", _check_run_request),
    PolicyCheck("peek_hit_pure", "peek_hit equals the next hit and has no side effect", _check_peek),
)

_RULE_TEXT = {c.name: c.rule for c in CHECKS}


def check_policy(
    policy,
    *,
    capacities=DEFAULT_CAPACITIES,
    seed: int = 0,
    expect_hits: bool = True,
    checks=None,
) -> list[str]:
    """Run the contract checks on a policy.

    Parameters
    ----------
    policy : callable, PrefixCache subclass or str
        ``factory(capacity_tokens) -> PrefixCache`` building a fresh policy on a pool of
        about that many usable tokens; or a class (``cls.from_capacity_tokens``); or a
        spec the command line accepts (``"vllm:16"``, ``"package.module:Class:16"``).
    capacities : tuple of int
        Pool sizes in tokens to try (small ones force eviction and refusals); include
        one ≥ 4,096 tokens: a pool that never evicts.
    seed : int
        Seed of the generated traces and of the interleaving.
    expect_hits : bool
        Apply ``repeats_hit`` (False for a policy that never caches, such as ``NoCache``).
    checks : iterable of str or None
        Names of the checks to run (default all of :data:`CHECKS`).

    Returns
    -------
    list of str
        Names of the checks skipped as not applicable.

    Raises
    ------
    PolicyContractError
        Listing every rule broken, with the request and the numbers; ``failures`` maps
        each broken check's name to its message. A policy that raises inside a hook fails
        every check that reached the call, each message naming the exception and the
        policy's line; ``tracebacks`` maps those checks to the traceback (the first one
        is appended to the error's text, and the exception is its ``__cause__``).
    """
    ctx = _Ctx(_as_factory(policy), tuple(capacities), int(seed), bool(expect_hits))
    wanted = None if checks is None else set(checks)
    if wanted is not None and wanted - {c.name for c in CHECKS}:
        raise ValueError(f"unknown checks {sorted(wanted - {c.name for c in CHECKS})}")
    failures, tracebacks, skipped, cause = {}, {}, [], None
    for c in CHECKS:
        if wanted is not None and c.name not in wanted:
            continue
        try:
            c.run(ctx)
        except PolicyContractError as e:
            for rule, msg in e.failures.items():  # a rule found broken by two checks: the first report
                failures.setdefault(rule, msg)
            tracebacks.update(e.tracebacks)
            cause = cause or e.__cause__
        except CheckNotApplicable:
            skipped.append(c.name)
    if failures:
        msg = "; ".join(failures.values())
        if tracebacks:  # the first one in full (the others: err.tracebacks)
            first = next(iter(tracebacks))
            msg += f"\n\nTraceback of the exception in {first!r}:\n" + tracebacks[first]
        raise PolicyContractError(msg, failures, tracebacks) from cause
    return skipped


def parametrize_with_checks(policies: dict, **options):
    """A ``pytest.mark.parametrize`` over (policy, check): one test per policy and rule.

    Parameters
    ----------
    policies : dict
        Test id → policy (a factory, a class or a spec; as :func:`check_policy`).
    **options
        ``capacities``, ``seed``, ``expect_hits`` for every check.

    The decorated test takes ``factory`` and ``check`` and calls ``check(factory)``; a
    check that does not apply skips the test.
    """
    import pytest

    def bind(c):
        def run(factory):
            try:
                c(factory, **options)
            except CheckNotApplicable as e:
                pytest.skip(f"{c.name}: {e}")

        run.__name__ = c.name
        return run

    params = [pytest.param(p, bind(c), id=f"{label}-{c.name}") for label, p in policies.items() for c in CHECKS]
    return pytest.mark.parametrize("factory, check", params)
