"""A blend of the five scenarios, each keeping its own structure, arrivals and content.

Component scenario c runs as it would alone, at request rate ``rate · w_c / Σ w``, with
its own random streams; the blend is the n earliest requests of the union (ties in
arrival: component order below, then session, then turn). So the long-run share of
requests from c is ``w_c / Σ w``, and components never share content (their token ids
are independent). Default shares (of requests):

==================  ======  ==========================================================
component           share   why
==================  ======  ==========================================================
long_doc_qa         0.10    few requests but by far the longest prompts
agent_tools         0.25    the article's main beneficiary of caching
enterprise          0.20    one fixed prompt: the easiest sharing
customer_service    0.25    short, little shared: the article's case against caching
multi_turn          0.20    conversation history reuse
==================  ======  ==========================================================

With ``arrival="gamma"`` each component's session starts have the stated ``cv``; their
superposition is smoother (measured: cv 2 per component gives about 1.4 for the blend of
6,000 requests, cv 3 about 2.0), so pass a larger ``cv`` for a given burstiness of the
blend. Multi-turn components also add within-session think-time structure.

Request and session ids keep their scenario's prefix (``"agent_tools:17:3"``), so every
metric can be split by scenario. Component parameters are nested: on the command line,
``--param long_doc_qa.document_len=loguniform:1000,4000``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from radixkv.synth._check import require
from radixkv.synth.agent_tools import AgentTools, AgentToolsParams
from radixkv.errors import InputError
from radixkv.synth.arrivals import Schedule, check_arrival
from radixkv.synth.base import contents, schedule
from radixkv.synth.customer_service import CustomerService, CustomerServiceParams
from radixkv.synth.enterprise import Enterprise, EnterpriseParams
from radixkv.synth.long_doc_qa import LongDocQA, LongDocQAParams
from radixkv.synth.multi_turn import MultiTurn, MultiTurnParams
from radixkv.synth.rng import check_seed
from radixkv.trace.types import Trace

#: components in tie-break order
COMPONENTS = (LongDocQA(), AgentTools(), Enterprise(), CustomerService(), MultiTurn())


@dataclass(frozen=True)
class MixParams:
    """Parameters of :class:`Mix`: a request share ``w_<scenario>`` (≥ 0, need not sum to 1)
    and the parameters of each component scenario.

    Attributes
    ----------
    w_long_doc_qa, w_agent_tools, w_enterprise, w_customer_service, w_multi_turn : float
        Defaults 0.10, 0.25, 0.20, 0.25, 0.20 (see module docstring).
    long_doc_qa, agent_tools, enterprise, customer_service, multi_turn
        Each component's parameter dataclass; defaults as when run alone.
    """

    w_long_doc_qa: float = 0.10
    w_agent_tools: float = 0.25
    w_enterprise: float = 0.20
    w_customer_service: float = 0.25
    w_multi_turn: float = 0.20
    long_doc_qa: LongDocQAParams = field(default_factory=LongDocQAParams)
    agent_tools: AgentToolsParams = field(default_factory=AgentToolsParams)
    enterprise: EnterpriseParams = field(default_factory=EnterpriseParams)
    customer_service: CustomerServiceParams = field(default_factory=CustomerServiceParams)
    multi_turn: MultiTurnParams = field(default_factory=MultiTurnParams)

    def __post_init__(self):
        for f in fields(self):
            if f.name.startswith("w_"):
                v = getattr(self, f.name)
                require(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0, f"{f.name} must be a number ≥ 0, got {v!r}", f.name)
        require(sum(self.weights()) > 0, "at least one component share must be > 0", "w_")

    def weights(self) -> list[float]:
        """Shares in :data:`COMPONENTS` order."""
        return [float(getattr(self, "w_" + c.name)) for c in COMPONENTS]


class Mix:
    """The blend (see module docstring). Same interface as a scenario's ``generate``."""

    name = "mix"
    params_cls = MixParams
    summary = "blend: 10% long_doc_qa, 25% agent_tools, 20% enterprise, 25% customer_service, 20% multi_turn"

    def generate(self, n_requests: int, seed: int, *, rate: float = 1.0, arrival: str = "poisson", cv: float = 2.0, params=None) -> Trace:
        """Generate *n_requests* requests of the blend; arguments as :func:`radixkv.synth.base.run`."""
        seed = check_seed(seed)
        if isinstance(n_requests, bool) or not isinstance(n_requests, (int, np.integer)) or n_requests < 1:
            raise InputError(f"need an integer number of requests ≥ 1, got {n_requests!r}", field="requests")
        check_arrival(rate, arrival, cv)
        p = MixParams() if params is None else params
        w = np.asarray(p.weights())
        share = w / w.sum()
        active = [k for k in range(len(COMPONENTS)) if share[k] > 0]
        want = {k: int(math.ceil(1.25 * n_requests * share[k])) + 32 for k in active}
        while True:
            scheds = {
                k: schedule(COMPONENTS[k], getattr(p, COMPONENTS[k].name), want[k], seed,
                            rate=rate * float(share[k]), arrival=arrival, cv=cv)
                for k in active
            }
            comp = np.concatenate([np.full(scheds[k].arrival_s.size, k, dtype=np.int64) for k in active])
            sess = np.concatenate([scheds[k].session for k in active])
            turn = np.concatenate([scheds[k].turn for k in active])
            arr = np.concatenate([scheds[k].arrival_s for k in active])
            order = np.lexsort((turn, sess, comp, arr))[:n_requests]
            cutoff = arr[order[-1]]
            # a component whose drawn requests all arrive before the cutoff may have more to give
            short = [k for k in active if scheds[k].arrival_s[-1] <= cutoff]
            if not short:
                break
            for k in short:
                want[k] *= 2
        picked = {}
        for k in active:
            sel = order[comp[order] == k]
            base = sum(scheds[j].arrival_s.size for j in active if j < k)
            idx = sel - base  # rows of component k's schedule, already in its own order
            picked[k] = (sel, Schedule(session=scheds[k].session[idx], turn=scheds[k].turn[idx], arrival_s=scheds[k].arrival_s[idx]))
        pos = {int(r): i for i, r in enumerate(order)}
        n = order.size
        prompts, outputs, rid, sid = [None] * n, [None] * n, [None] * n, [None] * n
        for k, (sel, sub) in picked.items():
            c = COMPONENTS[k]
            pr, ou, ri, si = contents(c, getattr(p, c.name), seed, sub)
            for j, r in enumerate(sel.tolist()):
                i = pos[r]
                prompts[i], outputs[i], rid[i], sid[i] = pr[j], ou[j], ri[j], si[j]
        return Trace.from_requests(
            req_id=rid,
            arrival_s=arr[order],
            prompt_len=[len(x) for x in prompts],
            output_len=[len(x) for x in outputs],
            prompt_ids=prompts,
            output_ids=outputs,
            session_id=sid,
            turn=turn[order],
            name="synth:mix",
        )
