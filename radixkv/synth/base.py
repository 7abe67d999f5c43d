"""What every scenario shares: the session interface and the driver that makes a Trace.

A scenario is a :class:`Scenario` subclass with a frozen parameter dataclass. It says how
many turns its sessions have and how long users think between them; it builds its shared
content once (the *world*: system prompts, documents, tool definitions) and the content
of one session at a time. :func:`run` draws the arrival schedule
(:mod:`radixkv.synth.arrivals`), asks for the content of every session that has a request
in the trace, and assembles a :class:`radixkv.trace.Trace` at token granularity
(``unit_tokens = 1``) with output ids.

Naming in the trace: ``session_id = "<scenario>:<session>"`` and
``req_id = "<scenario>:<session>:<turn>"`` (turn 0-based), so a report can group requests
by scenario with ``session_id.split(":")[0]`` (this is how the ``mix`` scenario stays
analysable per scenario).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from radixkv.errors import InputError
from radixkv.synth.arrivals import Schedule, session_schedule
from radixkv.synth.distributions import IntDist, TimeDist, UniformInt
from radixkv.synth.rng import check_seed, stream
from radixkv.trace.types import Trace

#: stream purposes under a scenario's code
WORLD, SESSION, SCHEDULE = 0, 1, 2


@dataclass(frozen=True)
class Turn:
    """One request's content: prompt and output token ids (int64 arrays)."""

    prompt: np.ndarray
    output: np.ndarray


class Scenario:
    """Base class of a workload scenario.

    Subclasses set :attr:`name`, :attr:`code` (a distinct small int naming its random
    streams), :attr:`params_cls`, and implement :meth:`make_world` and :meth:`session`;
    multi-turn scenarios override :meth:`turns` and :meth:`think_time`.
    """

    name: ClassVar[str]
    code: ClassVar[int]
    params_cls: ClassVar[type]
    summary: ClassVar[str] = ""

    def turns(self, params) -> IntDist:
        """Requests per session; single-turn by default."""
        return UniformInt(1, 1)

    def think_time(self, params) -> TimeDist | None:
        """Gap between the arrivals of consecutive turns (seconds); None when single-turn."""
        return None

    def make_world(self, params, seed: int) -> Any:
        """Shared content, built once per trace from stream ``(seed, code, WORLD, …)``."""
        raise NotImplementedError

    def session(self, world, params, rng: np.random.Generator, session: int, n_turns: int) -> list[Turn]:
        """Content of the first *n_turns* turns of one session, drawn from *rng*.

        Must draw turn j's content before turn j + 1's and never depend on *n_turns*
        otherwise, so that a longer trace extends a session without changing it.
        """
        raise NotImplementedError

    def generate(self, n_requests: int, seed: int, *, rate: float = 1.0, arrival: str = "poisson", cv: float = 2.0, params=None) -> Trace:
        """A trace of this scenario; see :func:`run`."""
        return run(self, n_requests, seed, rate=rate, arrival=arrival, cv=cv, params=params)


def run(scn: Scenario, n_requests: int, seed: int, *, rate: float = 1.0, arrival: str = "poisson", cv: float = 2.0, params=None) -> Trace:
    """Generate *n_requests* requests of scenario *scn*.

    Parameters
    ----------
    scn : Scenario
    n_requests : int ≥ 1
    seed : int ≥ 0
    rate : float
        Long-run request rate, requests/s.
    arrival : {"poisson", "gamma"}
        Session start process (:mod:`radixkv.synth.arrivals`).
    cv : float
        Coefficient of variation of gamma inter-start gaps (ignored for poisson).
    params : scn.params_cls or None
        Scenario parameters; None for the defaults.

    Returns
    -------
    Trace
        ``unit_tokens = 1``, output ids given, ``session_id`` and ``turn`` set, name
        ``"synth:<scenario>"``, requests in arrival order.

    Raises
    ------
    radixkv.errors.InputError
        Bad seed, count, rate, arrival process or parameter.
    """
    seed = check_seed(seed)
    p = scn.params_cls() if params is None else params
    return assemble(scn, p, seed, schedule(scn, p, n_requests, seed, rate=rate, arrival=arrival, cv=cv))


def schedule(scn: Scenario, p, n_requests: int, seed: int, *, rate: float, arrival: str, cv: float) -> Schedule:
    """Arrival schedule of the first *n_requests* requests of *scn* (stream ``(seed, code, SCHEDULE)``)."""
    if isinstance(n_requests, bool) or not isinstance(n_requests, (int, np.integer)):
        raise InputError(f"requests must be an integer, got {n_requests!r}", field="requests")
    return session_schedule(
        int(n_requests), rate=rate, arrival=arrival, cv=cv, seed=seed, key=(scn.code, SCHEDULE),
        turns=scn.turns(p), think=scn.think_time(p),
    )


def assemble(scn: Scenario, p, seed: int, sched: Schedule) -> Trace:
    """Build the session contents the schedule needs and lay them out as a Trace."""
    prompts, outputs, rid, sid = contents(scn, p, seed, sched)
    return Trace.from_requests(
        req_id=rid,
        arrival_s=sched.arrival_s,
        prompt_len=[len(x) for x in prompts],
        output_len=[len(x) for x in outputs],
        prompt_ids=prompts,
        output_ids=outputs,
        session_id=sid,
        turn=sched.turn,
        name=f"synth:{scn.name}",
    )


def contents(scn: Scenario, p, seed: int, sched: Schedule):
    """Prompt ids, output ids, request ids and session ids of the scheduled requests.

    Session s's content comes from stream ``(seed, scn.code, SESSION, s)`` and the world
    from ``(seed, scn.code, WORLD, …)``, so it does not depend on the other sessions.

    Returns
    -------
    prompts, outputs : lists of int64 arrays, one per request in schedule order
    req_ids, session_ids : lists of str
    """
    world = scn.make_world(p, seed)
    kept = sched.turns_per_session()
    content: dict[int, list[Turn]] = {}
    for s in np.flatnonzero(kept):
        s = int(s)
        turns = scn.session(world, p, stream(seed, scn.code, SESSION, s), s, int(kept[s]))
        assert len(turns) == kept[s]
        content[s] = turns
    prompts, outputs, rid, sid = [], [], [], []
    for s, t in zip(sched.session.tolist(), sched.turn.tolist()):
        tr = content[s][t]
        prompts.append(tr.prompt)
        outputs.append(tr.output)
        sid.append(f"{scn.name}:{s}")
        rid.append(f"{scn.name}:{s}:{t}")
    return prompts, outputs, rid, sid
