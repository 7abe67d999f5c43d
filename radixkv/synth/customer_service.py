"""Short customer-service chat: diverse short prompts with only tens of tokens in common.

Each request starts with one of a few short openings (a brand's greeting / instruction
template, tens of tokens, chosen uniformly) followed by the customer's own message.
Single-turn. This is the workload where prefix caching is expected to buy little.

Shared-prefix lengths by construction (up to chance matches, :mod:`radixkv.synth.rng`):
two requests with the same opening share ``len(opening)`` tokens; otherwise nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixkv.synth._check import check_params, require
from radixkv.synth.base import WORLD, Scenario, Turn
from radixkv.synth.distributions import IntDist, LogNormalInt, UniformInt
from radixkv.synth.rng import fresh_tokens, stream


@dataclass(frozen=True)
class CustomerServiceParams:
    """Parameters of :class:`CustomerService` (lengths in tokens).

    Attributes
    ----------
    n_openings : int, default 12
        Short templates requests start with.
    opening_len : IntDist, default ``uniform:20,60``
        Length of each opening, drawn once per opening.
    message_len : IntDist, default ``lognormal:80,0.6,10,400``
        The customer's message.
    output_len : IntDist, default ``lognormal:120,0.6,10,600``
    """

    n_openings: int = 12
    opening_len: IntDist = UniformInt(20, 60)
    message_len: IntDist = LogNormalInt(80, 0.6, 10, 400)
    output_len: IntDist = LogNormalInt(120, 0.6, 10, 600)

    def __post_init__(self):
        check_params(self)
        require(self.opening_len.lo + self.message_len.lo >= 1, "prompts could be empty", "message_len")


class CustomerService(Scenario):
    """Short customer-service chat (see module docstring)."""

    name = "customer_service"
    code = 4
    params_cls = CustomerServiceParams
    summary = "one of 12 short openings (20-60 tokens) + a distinct customer message"

    def make_world(self, params, seed):
        r = stream(seed, self.code, WORLD, 0)
        return [fresh_tokens(r, int(n)) for n in params.opening_len.sample(r, params.n_openings)]

    def session(self, world, params, rng, session, n_turns):
        o = int(rng.integers(params.n_openings))
        msg = fresh_tokens(rng, params.message_len.draw(rng))
        out = fresh_tokens(rng, params.output_len.draw(rng))
        return [Turn(np.concatenate([world[o], msg]), out)]
