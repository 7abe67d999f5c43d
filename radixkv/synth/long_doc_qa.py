"""Long-document Q&A: users ask questions about long documents from a shared pool.

Prompt = system prompt + document + question. Documents are drawn with Zipf popularity,
so popular documents get many questions and their prefix (system prompt + document) is
reused; requests about different documents share only the system prompt. Single-turn.

Shared-prefix lengths by construction (up to a chance match of unrelated tokens, see
:mod:`radixkv.synth.rng`): two requests about the same document share
``system_len + len(document)`` tokens; about different documents, ``system_len``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixkv.synth._check import check_params, require
from radixkv.synth.base import WORLD, Scenario, Turn
from radixkv.synth.distributions import IntDist, LogNormalInt, LogUniformInt, UniformInt, zipf_pmf
from radixkv.synth.rng import fresh_tokens, stream


@dataclass(frozen=True)
class LongDocQAParams:
    """Parameters of :class:`LongDocQA` (lengths in tokens).

    Attributes
    ----------
    n_documents : int, default 40
        Documents in the pool; document d (0-based) has popularity rank d + 1.
    document_len : IntDist, default ``loguniform:5000,50000``
        Length of each document, drawn once per document.
    zipf_s : float, default 1.0
        Zipf exponent of document popularity: P(document d) ∝ (d + 1)^(−zipf_s).
    system_len : int, default 347
        The one system prompt, shared by every request (not a multiple of 16 on purpose).
    question_len : IntDist, default ``uniform:10,60``
    output_len : IntDist, default ``lognormal:150,0.6,10,800``
    """

    n_documents: int = 40
    document_len: IntDist = LogUniformInt(5000, 50000)
    zipf_s: float = 1.0
    system_len: int = 347
    question_len: IntDist = UniformInt(10, 60)
    output_len: IntDist = LogNormalInt(150, 0.6, 10, 800)

    def __post_init__(self):
        check_params(self)
        require(self.system_len + self.document_len.lo + self.question_len.lo >= 1, "prompts could be empty", "question_len")


class _World:
    def __init__(self, p: LongDocQAParams, seed: int, code: int):
        self.seed, self.code = seed, code
        self.system = fresh_tokens(stream(seed, code, WORLD, 0), p.system_len)
        self.doc_len = p.document_len.sample(stream(seed, code, WORLD, 1), p.n_documents)
        self.popularity = zipf_pmf(p.n_documents, p.zipf_s)
        self.cdf = np.cumsum(self.popularity)
        self._docs: dict[int, np.ndarray] = {}

    def document(self, d: int) -> np.ndarray:
        doc = self._docs.get(d)
        if doc is None:
            doc = fresh_tokens(stream(self.seed, self.code, WORLD, 2, d), int(self.doc_len[d]))
            self._docs[d] = doc
        return doc


class LongDocQA(Scenario):
    """Long-document Q&A (see module docstring)."""

    name = "long_doc_qa"
    code = 1
    params_cls = LongDocQAParams
    summary = "system prompt + Zipf-popular long document (5k-50k tokens) + short question"

    def make_world(self, params, seed):
        return _World(params, seed, self.code)

    def session(self, world, params, rng, session, n_turns):
        # inverse-CDF draw of the Zipf rank (document d has rank d + 1)
        d = min(int(np.searchsorted(world.cdf, rng.random(), side="right")), params.n_documents - 1)
        q = fresh_tokens(rng, params.question_len.draw(rng))
        out = fresh_tokens(rng, params.output_len.draw(rng))
        return [Turn(np.concatenate([world.system, world.document(d), q]), out)]
