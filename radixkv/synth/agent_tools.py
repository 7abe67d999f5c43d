"""Agent tool chains: an agent loops model call → tool call → tool result → model call.

Each session (one agent run) picks a system prompt and a tool-definition block (uniformly
and independently from small pools of long blocks), adds a task, then runs ``steps``
model calls. Step 0's prompt is system prompt + tool definitions + task; step k's prompt
is step k−1's prompt + step k−1's output (the tool call) + the tool's result. So every
step resends the whole run so far, and runs that share a system prompt (and tool block)
share that prefix.

Shared-prefix lengths by construction (up to chance matches, :mod:`radixkv.synth.rng`):
two steps of the same run share the whole earlier step's prompt + output; two runs with
the same system prompt and tool block share ``len(system) + len(tools)``; with the same
system prompt only, ``len(system)``; otherwise nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixkv.synth._check import check_params, require
from radixkv.synth.base import WORLD, Scenario, Turn
from radixkv.synth.distributions import IntDist, LogNormalInt, LogNormalTime, TimeDist, UniformInt
from radixkv.synth.rng import fresh_tokens, stream


@dataclass(frozen=True)
class AgentToolsParams:
    """Parameters of :class:`AgentTools` (lengths in tokens, times in seconds).

    Attributes
    ----------
    n_system_prompts : int, default 2
    system_len : IntDist, default ``uniform:1200,3500``
        Length of each system prompt, drawn once per prompt.
    n_toolsets : int, default 4
        Tool-definition blocks (JSON schemas of the agent's tools).
    toolset_len : IntDist, default ``uniform:1500,6000``
    task_len : IntDist, default ``uniform:40,400``
        The user's task, once per run.
    steps : IntDist, default ``uniform:2,10``
        Model calls per run (turns per session).
    output_len : IntDist, default ``lognormal:60,0.6,10,400``
        A step's output (the tool call).
    tool_result_len : IntDist, default ``lognormal:250,1.0,10,4000``
    tool_time : TimeDist, default ``lognormal_s:2,1``
        Gap between the arrivals of consecutive steps (model + tool latency), seconds.
    """

    n_system_prompts: int = 2
    system_len: IntDist = UniformInt(1200, 3500)
    n_toolsets: int = 4
    toolset_len: IntDist = UniformInt(1500, 6000)
    task_len: IntDist = UniformInt(40, 400)
    steps: IntDist = UniformInt(2, 10)
    output_len: IntDist = LogNormalInt(60, 0.6, 10, 400)
    tool_result_len: IntDist = LogNormalInt(250, 1.0, 10, 4000)
    tool_time: TimeDist = LogNormalTime(2.0, 1.0)

    def __post_init__(self):
        check_params(self)
        require(self.steps.lo >= 1, f"a session needs at least 1 turn, got {self.steps}", "steps")
        require(self.system_len.lo + self.toolset_len.lo + self.task_len.lo >= 1, "prompts could be empty", "task_len")


class _World:
    def __init__(self, p: AgentToolsParams, seed: int, code: int):
        r = stream(seed, code, WORLD, 0)
        self.system = [fresh_tokens(r, int(n)) for n in p.system_len.sample(r, p.n_system_prompts)]
        r = stream(seed, code, WORLD, 1)
        self.tools = [fresh_tokens(r, int(n)) for n in p.toolset_len.sample(r, p.n_toolsets)]


class AgentTools(Scenario):
    """Agent tool chains (see module docstring)."""

    name = "agent_tools"
    code = 2
    params_cls = AgentToolsParams
    summary = "system prompt + tool definitions (thousands of tokens) + task, then steps that append tool call + tool result"

    def turns(self, params):
        return params.steps

    def think_time(self, params):
        return params.tool_time

    def make_world(self, params, seed):
        return _World(params, seed, self.code)

    def session(self, world, params, rng, session, n_turns):
        si = int(rng.integers(params.n_system_prompts))
        ti = int(rng.integers(params.n_toolsets))
        task = fresh_tokens(rng, params.task_len.draw(rng))
        prompt = np.concatenate([world.system[si], world.tools[ti], task])
        out = []
        for k in range(n_turns):
            if k:
                result = fresh_tokens(rng, params.tool_result_len.draw(rng))
                prompt = np.concatenate([prompt, out[-1].output, result])
            call = fresh_tokens(rng, params.output_len.draw(rng))
            out.append(Turn(prompt, call))
        return out
