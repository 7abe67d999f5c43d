"""Multi-turn chat: each turn resends the whole conversation so far.

A session picks a system prompt (uniformly from a small pool); turn 0's prompt is system
prompt + user message; turn k's prompt is turn k−1's prompt + turn k−1's output + a new
user message. Consecutive turns arrive ``think_time`` apart.

Shared-prefix lengths by construction (up to chance matches, :mod:`radixkv.synth.rng`):
turn k of a session starts with turn j's prompt + output for every j < k; two sessions
with the same system prompt share ``len(system)`` tokens; otherwise nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixkv.synth._check import check_params, require
from radixkv.synth.base import WORLD, Scenario, Turn
from radixkv.synth.distributions import IntDist, LogNormalInt, LogNormalTime, TimeDist, UniformInt
from radixkv.synth.rng import fresh_tokens, stream


@dataclass(frozen=True)
class MultiTurnParams:
    """Parameters of :class:`MultiTurn` (lengths in tokens, times in seconds).

    Attributes
    ----------
    n_system_prompts : int, default 4
    system_len : IntDist, default ``uniform:150,900``
        Length of each system prompt, drawn once per prompt.
    turns : IntDist, default ``uniform:2,10``
        Turns per conversation.
    user_len : IntDist, default ``lognormal:60,0.8,5,1000``
    output_len : IntDist, default ``lognormal:200,0.7,10,1500``
    think_time : TimeDist, default ``lognormal_s:25,0.8``
        Gap between the arrivals of consecutive turns (reading the answer + typing), s.
    """

    n_system_prompts: int = 4
    system_len: IntDist = UniformInt(150, 900)
    turns: IntDist = UniformInt(2, 10)
    user_len: IntDist = LogNormalInt(60, 0.8, 5, 1000)
    output_len: IntDist = LogNormalInt(200, 0.7, 10, 1500)
    think_time: TimeDist = LogNormalTime(25.0, 0.8)

    def __post_init__(self):
        check_params(self)
        require(self.turns.lo >= 1, f"a session needs at least 1 turn, got {self.turns}", "turns")
        require(self.system_len.lo + self.user_len.lo >= 1, "prompts could be empty", "user_len")


class MultiTurn(Scenario):
    """Multi-turn chat (see module docstring)."""

    name = "multi_turn"
    code = 5
    params_cls = MultiTurnParams
    summary = "conversations of 2-10 turns; turn k resends turns 1..k-1 with their outputs"

    def turns(self, params):
        return params.turns

    def think_time(self, params):
        return params.think_time

    def make_world(self, params, seed):
        r = stream(seed, self.code, WORLD, 0)
        return [fresh_tokens(r, int(n)) for n in params.system_len.sample(r, params.n_system_prompts)]

    def session(self, world, params, rng, session, n_turns):
        si = int(rng.integers(params.n_system_prompts))
        prompt = world[si]
        out = []
        for k in range(n_turns):
            user = fresh_tokens(rng, params.user_len.draw(rng))
            prompt = np.concatenate([prompt] + ([out[-1].output] if k else []) + [user])
            answer = fresh_tokens(rng, params.output_len.draw(rng))
            out.append(Turn(prompt, answer))
        return out
