"""Fixed-prompt enterprise assistant: one long shared prompt, short questions.

A private deployment where every request carries the same instructions and reference
material (``prompt_len`` tokens) followed by a short question. Single-turn.

Shared-prefix length by construction (up to chance matches, :mod:`radixkv.synth.rng`):
any two requests share exactly ``prompt_len`` tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixkv.synth._check import check_params, require
from radixkv.synth.base import WORLD, Scenario, Turn
from radixkv.synth.distributions import IntDist, LogNormalInt, UniformInt
from radixkv.synth.rng import fresh_tokens, stream


@dataclass(frozen=True)
class EnterpriseParams:
    """Parameters of :class:`Enterprise` (lengths in tokens).

    Attributes
    ----------
    prompt_len : int, default 1843
        The shared prompt (not a multiple of 16 on purpose).
    question_len : IntDist, default ``uniform:8,80``
    output_len : IntDist, default ``lognormal:150,0.7,10,800``
    """

    prompt_len: int = 1843
    question_len: IntDist = UniformInt(8, 80)
    output_len: IntDist = LogNormalInt(150, 0.7, 10, 800)

    def __post_init__(self):
        check_params(self)
        require(self.prompt_len + self.question_len.lo >= 1, "prompts could be empty", "question_len")


class Enterprise(Scenario):
    """Fixed-prompt enterprise assistant (see module docstring)."""

    name = "enterprise"
    code = 3
    params_cls = EnterpriseParams
    summary = "one shared prompt (1,843 tokens) + short question"

    def make_world(self, params, seed):
        return fresh_tokens(stream(seed, self.code, WORLD, 0), params.prompt_len)

    def session(self, world, params, rng, session, n_turns):
        q = fresh_tokens(rng, params.question_len.draw(rng))
        out = fresh_tokens(rng, params.output_len.draw(rng))
        return [Turn(np.concatenate([world, q]), out)]
