"""Each synthetic scenario checked against its stated structure, on its own output.

Expected values come from the scenario parameters (stated in each test) and brute-force
longest common prefixes between prompts, never from running the generator and copying.
Unrelated content may agree by chance on a token or two (probability 1/32,000 per
position, radixkv.synth.rng), so LCP checks allow ``designed ≤ lcp ≤ designed + 2`` and
require the exact designed value for at least 99% of pairs.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.errors import InputError
from radixkv.synth import SCENARIOS, VOCAB_SIZE, generate
from radixkv.synth.distributions import (
    ExponentialTime,
    IntDist,
    LogNormalInt,
    LogNormalTime,
    LogUniformInt,
    TimeDist,
    UniformInt,
    parse_dist,
    zipf_pmf,
)


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Longest common prefix of two id arrays, by direct comparison."""
    n = min(a.size, b.size)
    ne = np.flatnonzero(a[:n] != b[:n])
    return int(ne[0]) if ne.size else n


def pair_lcps(trace, rows):
    return {(i, j): lcp(trace.prompt_ids(i), trace.prompt_ids(j)) for i, j in itertools.combinations(rows, 2)}


def assert_designed(actual: dict, designed: dict):
    """Every pair within +2 tokens of its designed LCP; ≥ 99% exact."""
    exact = 0
    for k, d in designed.items():
        a = actual[k]
        assert d <= a <= d + 2, (k, a, d)
        exact += a == d
    assert exact >= 0.99 * len(designed)


def sessions(trace):
    by = defaultdict(list)
    for i in range(len(trace)):
        by[str(trace.session_id[i])].append(i)
    return by


# ---------------------------------------------------------------- long-document Q&A
LDQA = ["n_documents=8", "document_len=loguniform:300,900", "system_len=347", "question_len=uniform:10,60"]


def test_long_doc_qa_prefix_lengths():
    t = generate("long_doc_qa", 120, seed=3, params=LDQA)
    assert t.unit_tokens == 1 and t.out_ids is not None
    # group requests by the document they hold: tokens right after the 347-token system prompt
    doc_of = [tuple(t.prompt_ids(i)[347:363].tolist()) for i in range(len(t))]
    groups = defaultdict(list)
    for i, d in enumerate(doc_of):
        groups[d].append(i)
    assert 2 <= len(groups) <= 8  # at most n_documents distinct documents
    actual = pair_lcps(t, range(len(t)))
    # a document's length: the most common LCP − 347 among the pairs asking about it
    doc_len = {}
    for d, rows in groups.items():
        if len(rows) > 1:
            c = Counter(actual[(i, j)] for i, j in itertools.combinations(rows, 2))
            doc_len[d] = c.most_common(1)[0][0] - 347
            assert 300 <= doc_len[d] <= 900  # document_len=loguniform:300,900
    designed = {}
    for (i, j) in actual:
        if doc_of[i] == doc_of[j]:
            designed[(i, j)] = 347 + doc_len[doc_of[i]]
        else:
            designed[(i, j)] = 347  # only the system prompt in common
    assert_designed(actual, designed)
    for i in range(len(t)):  # question after the document: uniform 10..60 tokens
        if doc_of[i] in doc_len:
            assert 10 <= t.prompt_len[i] - 347 - doc_len[doc_of[i]] <= 60
    # shared-prefix lengths are not all multiples of 16
    assert any((347 + L) % 16 for L in doc_len.values())


def test_long_doc_qa_default_document_range():
    # defaults: loguniform 5,000..50,000-token documents, 347-token system prompt, 10..60-token question
    t = generate("long_doc_qa", 12, seed=1)
    body = t.prompt_len - 347
    assert np.all(body >= 5000 + 10) and np.all(body <= 50000 + 60)


def test_long_doc_qa_zipf_popularity():
    n_docs, s, n = 20, 1.0, 3000
    t = generate("long_doc_qa", n, seed=11, params=[f"n_documents={n_docs}", f"zipf_s={s}",
                                                     "document_len=uniform:40,60", "system_len=5",
                                                     "question_len=const:3", "output_len=const:1"])
    counts = np.array(sorted(Counter(tuple(t.prompt_ids(i)[5:13].tolist()) for i in range(n)).values(), reverse=True))
    # P(rank r) = r^-1 / H_20, H_20 = Σ 1/r = 3.5977; top share 1/3.5977 = 0.2780
    h20 = sum(1 / r for r in range(1, 21))
    assert abs(h20 - 3.5977) < 1e-4
    assert abs(counts[0] / n - 1 / h20) < 0.03  # binomial SE 0.008
    # rank-frequency slope on log-log axes over the 8 most popular documents ≈ −s
    r = np.arange(1, 9)
    slope = np.polyfit(np.log(r), np.log(counts[:8]), 1)[0]
    assert -1.3 < slope < -0.7
    # zipf_s = 0 is uniform: top document ≈ 1/20 of requests
    u = generate("long_doc_qa", n, seed=11, params=[f"n_documents={n_docs}", "zipf_s=0",
                                                     "document_len=uniform:40,60", "system_len=5",
                                                     "question_len=const:3", "output_len=const:1"])
    cu = Counter(tuple(u.prompt_ids(i)[5:13].tolist()) for i in range(n))
    assert max(cu.values()) / n < 0.08


# ---------------------------------------------------------------- agent tool chains
def test_agent_tools_step_structure():
    t = generate("agent_tools", 300, seed=5, rate=2.0)
    for sid, rows in sessions(t).items():
        assert [int(t.turn[i]) for i in rows] == list(range(len(rows)))  # steps in order
        assert np.all(np.diff(t.arrival_s[rows]) > 0)
        assert len(rows) <= 10  # steps=uniform:2,10
        for a, b in zip(rows, rows[1:]):
            prev = np.concatenate([t.prompt_ids(a), t.output_ids(a)])
            cur = t.prompt_ids(b)
            # step k prompt = step k−1 prompt + its output + a tool result of 10..4000 tokens
            assert np.array_equal(cur[: prev.size], prev)
            assert 10 <= cur.size - prev.size <= 4000
            assert 10 <= t.output_len[a] <= 400
    first = [rows[0] for rows in sessions(t).values()]
    lcps = pair_lcps(t, first).values()
    # runs share nothing, a system prompt (1,200..3,500) or system + tools (2,700..9,500)
    for v in lcps:
        assert v <= 2 or 1200 <= v <= 9500 + 2
    # 2 system prompts × 4 tool blocks: at most 2 + 8 distinct shared lengths besides 0
    distinct = {v for v in lcps if v > 2}
    assert len(distinct) <= 10
    assert any(v % 16 for v in distinct)


# ---------------------------------------------------------------- enterprise
def test_enterprise_shared_prompt():
    t = generate("enterprise", 80, seed=2)
    actual = pair_lcps(t, range(len(t)))
    assert_designed(actual, {k: 1843 for k in actual})  # prompt_len default 1,843 (1843 % 16 = 3)
    q = t.prompt_len - 1843
    assert np.all((q >= 8) & (q <= 80))  # question_len=uniform:8,80
    assert np.all(t.turn == 0)


# ---------------------------------------------------------------- customer service
def test_customer_service_short_openings():
    t = generate("customer_service", 200, seed=4)
    actual = pair_lcps(t, range(len(t)))
    # same opening: 20..60 tokens in common; different: nothing (chance: ≤ 2)
    assert all(v <= 2 or 20 <= v <= 62 for v in actual.values())
    openings = {tuple(t.prompt_ids(i)[:20].tolist()) for i in range(len(t))}
    assert len(openings) <= 12
    assert max(actual.values()) >= 20  # some sharing exists
    assert np.median(t.prompt_len) < 200  # short prompts (opening ≤ 60 + message median 80)


# ---------------------------------------------------------------- multi-turn chat
def test_multi_turn_resends_history():
    t = generate("multi_turn", 400, seed=9, rate=1.0)
    by = sessions(t)
    for sid, rows in by.items():
        assert [int(t.turn[i]) for i in rows] == list(range(len(rows)))
        assert len(rows) <= 10  # turns=uniform:2,10
        for a, b in zip(rows, rows[1:]):
            prev = np.concatenate([t.prompt_ids(a), t.output_ids(a)])
            cur = t.prompt_ids(b)
            assert np.array_equal(cur[: prev.size], prev)  # turn k = turn k−1 prompt + output + …
            assert 5 <= cur.size - prev.size <= 1000  # … + a user message (user_len 5..1000)
            assert t.arrival_s[b] > t.arrival_s[a]  # think time > 0
    firsts = [rows[0] for rows in by.values()]
    sys_lcps = {v for v in pair_lcps(t, firsts[:60]).values() if v > 2}
    assert all(150 <= v <= 902 for v in sys_lcps)  # system_len=uniform:150,900
    assert any(v % 16 for v in sys_lcps)


def test_multi_turn_think_time():
    # think_time = lognormal_s:25,0.8 → median gap between consecutive turns 25 s
    t = generate("multi_turn", 2000, seed=1, rate=5.0, params=["system_len=uniform:1,3", "user_len=uniform:1,3", "output_len=const:2"])
    gaps = []
    for rows in sessions(t).values():
        gaps.extend(np.diff(t.arrival_s[rows]).tolist())
    med = float(np.median(gaps))
    assert 22 < med < 28  # SE of a median of ~1,700 lognormal(σ=0.8) gaps ≈ 2.5%


# ---------------------------------------------------------------- arrivals
SMALL_ENT = ["prompt_len=5", "question_len=uniform:1,3", "output_len=const:1"]


def test_poisson_rate_and_cv():
    t = generate("enterprise", 2000, seed=21, rate=5.0, params=SMALL_ENT)
    d = np.diff(t.arrival_s)
    assert abs(d.mean() - 0.2) < 0.02  # mean inter-arrival 1/rate within 10%
    assert 0.9 < d.std() / d.mean() < 1.1  # exponential: CV 1


def test_gamma_bursty_rate_and_cv():
    t = generate("enterprise", 2000, seed=21, rate=5.0, arrival="gamma", cv=2.0, params=SMALL_ENT)
    d = np.diff(t.arrival_s)
    assert abs(d.mean() - 0.2) < 0.02
    assert 1.7 < d.std() / d.mean() < 2.3  # gamma shape 1/cv² = 0.25 → CV 2


def test_multi_turn_request_rate():
    # rate is requests/s: sessions start at rate / E[turns] = 4 / 6
    t = generate("multi_turn", 8000, seed=2, rate=4.0, params=["system_len=uniform:1,3", "user_len=uniform:1,3", "output_len=const:1"])
    d = np.diff(t.arrival_s)
    assert abs(d.mean() - 0.25) < 0.025
    assert np.all(d >= 0)


def test_mix_shares_and_scenario_ids():
    tiny = ["long_doc_qa.document_len=uniform:20,40", "long_doc_qa.system_len=3",
            "agent_tools.system_len=uniform:5,9", "agent_tools.toolset_len=uniform:5,9",
            "agent_tools.tool_result_len=uniform:1,3", "agent_tools.task_len=uniform:1,3",
            "enterprise.prompt_len=5", "multi_turn.system_len=uniform:1,3",
            "multi_turn.user_len=uniform:1,3", "multi_turn.output_len=const:1",
            # short think time: the start-up deficit of multi-turn requests (≈ rate · mean
            # delay after session start ≈ 2/s · 3 turns · 1.1 s ≈ 7 requests) stays negligible
            "multi_turn.think_time=lognormal_s:1,0.5"]
    t = generate("mix", 6000, seed=8, rate=10.0, params=tiny)
    kind = Counter(s.split(":")[0] for s in t.session_id)
    want = {"long_doc_qa": 0.10, "agent_tools": 0.25, "enterprise": 0.20, "customer_service": 0.25, "multi_turn": 0.20}
    for k, w in want.items():
        assert abs(kind[k] / len(t) - w) < 0.03, (k, kind[k])
    assert len(set(t.req_id.tolist())) == len(t)
    d = np.diff(t.arrival_s)
    assert abs(d.mean() - 0.1) < 0.01
    assert t.ids.max() < VOCAB_SIZE and t.ids.min() >= 0


# ---------------------------------------------------------------- block rounding shows
@pytest.mark.parametrize("name", ["long_doc_qa", "agent_tools", "enterprise", "customer_service", "multi_turn"])
def test_shared_prefixes_not_all_multiples_of_16(name):
    small = {"long_doc_qa": ["document_len=uniform:200,400", "n_documents=4"]}.get(name)
    t = generate(name, 40, seed=6, params=small)
    vals = [v for v in pair_lcps(t, range(len(t))).values() if v > 2]
    assert vals and any(v % 16 for v in vals)


# ---------------------------------------------------------------- determinism
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_prefix_consistent_and_seeded(name):
    small = {"long_doc_qa": ["document_len=uniform:200,400"],
             "mix": ["long_doc_qa.document_len=uniform:200,400"]}.get(name)
    a = generate(name, 60, seed=12, params=small)
    b = generate(name, 25, seed=12, params=small)
    head = a.head(25)
    # the first 25 requests of a 60-request trace are the 25-request trace
    for col in ("req_id", "arrival_s", "prompt_len", "output_len", "ids", "id_offsets", "out_ids", "out_offsets", "session_id", "turn"):
        assert np.array_equal(getattr(head, col), getattr(b, col)), col
    c = generate(name, 25, seed=13, params=small)
    assert not np.array_equal(b.ids[:1000], c.ids[:1000])


# ---------------------------------------------------------------- distributions
def test_distribution_means_and_pmfs():
    rng = np.random.default_rng(0)
    u = UniformInt(2, 10)
    assert u.mean() == pytest.approx(6.0)  # (2 + 10) / 2
    lu = LogUniformInt(5, 9)
    # P(k) = ln((k+1)/k) / ln(10/5)
    assert lu.pmf() == pytest.approx([math.log((k + 1) / k) / math.log(2) for k in range(5, 10)])
    for d in (u, lu, LogNormalInt(60, 0.8, 5, 1000), LogNormalInt(3, 0.5, 1, 8)):
        assert d.pmf().sum() == pytest.approx(1.0)
        x = d.sample(rng, 200_000)
        assert x.min() >= d.lo and x.max() <= d.hi
        assert x.mean() == pytest.approx(d.mean(), rel=0.01)
    assert LogNormalTime(25.0, 0.8).mean() == pytest.approx(25.0 * math.exp(0.32))
    assert zipf_pmf(3, 1.0) == pytest.approx([6 / 11, 3 / 11, 2 / 11])  # 1, 1/2, 1/3 over 11/6


def test_parse_dist():
    assert parse_dist("uniform:2,10", IntDist) == UniformInt(2, 10)
    assert parse_dist("const:7", IntDist) == UniformInt(7, 7)
    assert parse_dist("loguniform:5000,50000", IntDist) == LogUniformInt(5000, 50000)
    assert parse_dist("lognormal:200,0.7,10,1500", IntDist) == LogNormalInt(200, 0.7, 10, 1500)
    assert parse_dist("lognormal_s:25,0.8", TimeDist) == LogNormalTime(25.0, 0.8)
    assert parse_dist("exponential_s:2", TimeDist) == ExponentialTime(2.0)
    for bad in ("normal:1,2", "uniform:1", "uniform:1,x", "uniform:5,2", "uniform:1.5,3", "lognormal_s:1,1"):
        with pytest.raises(InputError):
            parse_dist(bad, IntDist, field="x")


@pytest.mark.parametrize("params, field", [
    (["nope=3"], "--param nope"),
    (["n_documents=0"], "--param n_documents"),
    (["zipf_s=-1"], "--param zipf_s"),
    (["document_len=uniform:9,3"], "--param document_len"),
    (["document_len"], "--param"),
    (["document_len.x=3"], "--param document_len.x"),
])
def test_bad_params_name_the_field(params, field):
    with pytest.raises(InputError) as e:
        generate("long_doc_qa", 5, seed=1, params=params)
    assert e.value.field == field


@pytest.mark.parametrize("kw, field", [
    (dict(seed=-1), "seed"), (dict(seed=1.5), "seed"), (dict(rate=0.0), "rate"),
    (dict(arrival="uniform"), "arrival"), (dict(arrival="gamma", cv=0.0), "cv"), (dict(n_requests=0), "requests"),
])
@pytest.mark.parametrize("name", ["enterprise", "mix"])
def test_bad_arguments_name_the_field(kw, field, name):
    args = dict(n_requests=5, seed=1) | kw
    with pytest.raises(InputError) as e:
        generate(name, args.pop("n_requests"), args.pop("seed"), **args)
    assert e.value.field == field


def test_unknown_scenario():
    with pytest.raises(InputError) as e:
        generate("chatbot", 5, seed=1)
    assert e.value.field == "scenario"


# ---------------------------------------------------------------- properties over seeds and parameters
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 60), lo=st.integers(1, 4), span=st.integers(0, 5),
       name=st.sampled_from(["multi_turn", "agent_tools"]), arrival=st.sampled_from(["poisson", "gamma"]))
def test_sessions_resend_history_for_any_seed(seed, n, lo, span, name, arrival):
    turns = f"{'turns' if name == 'multi_turn' else 'steps'}=uniform:{lo},{lo + span}"
    small = (["system_len=uniform:3,40", "user_len=uniform:1,30", "output_len=uniform:0,20"] if name == "multi_turn"
             else ["system_len=uniform:3,40", "toolset_len=uniform:3,40", "tool_result_len=uniform:1,30", "output_len=uniform:0,20"])
    t = generate(name, n, seed, rate=3.0, arrival=arrival, params=small + [turns])
    assert len(t) == n and np.all(np.diff(t.arrival_s) >= 0)
    for rows in sessions(t).values():
        assert [int(t.turn[i]) for i in rows] == list(range(len(rows)))
        assert len(rows) <= lo + span
        for a, b in zip(rows, rows[1:]):
            prev = np.concatenate([t.prompt_ids(a), t.output_ids(a)])
            assert np.array_equal(t.prompt_ids(b)[: prev.size], prev)
            assert t.prompt_len[b] > prev.size


def test_params_as_object_dict_or_text():
    from radixkv.synth.multi_turn import MultiTurnParams

    a = generate("multi_turn", 20, seed=4, params=MultiTurnParams(turns=UniformInt(1, 2)))
    b = generate("multi_turn", 20, seed=4, params={"turns": "uniform:1,2"})
    c = generate("multi_turn", 20, seed=4, params=["turns=uniform:1,2"])
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.ids, c.ids)
    assert int(a.turn.max()) <= 1  # at most 2 turns: 0 and 1
    with pytest.raises(InputError) as e:
        generate("long_doc_qa", 3, seed=1, params=MultiTurnParams())
    assert e.value.field == "params"
