"""Requests longer than the model's context, as each engine handles them: a step before
the replay that removes the requests the engine refuses and clips the outputs it caps,
so the replay loops themselves are untouched.

The context length ``max_model_len`` (tokens) comes from ``--max-model-len`` or, when a
model is given (``--model``: a preset or a Hugging Face ``config.json``), from its
``max_position_embeddings`` (:class:`radixkv.memory.specs.ModelSpec`; vLLM's default
``max_model_len``, SGLang's ``context_len``). With neither, nothing changes: the trace
is replayed as it is and no ``rejected_requests`` key is added (outputs byte-identical).

Rules (P = prompt tokens, N = the trace's output tokens, L = ``max_model_len``):

* vLLM (``engine = "vllm"`` policies, and every policy that names no SGLang engine):
  ``InputProcessor._validate_model_input`` (vllm/v1/engine/input_processor.py) refuses a
  prompt with P > L, and one with P == L (no room for the at least one output token a
  generate request asks for): served only when P ≤ L − 1. A served request stops at
  L tokens in all (``check_stop``, vllm/v1/core/sched/utils.py: ``num_tokens >=
  max_model_len`` finishes it, length capped): N is clipped to L − P.
* SGLang (``engine = "sglang"``): the scheduler's ``max_req_len = context_len − 1`` and
  ``max_req_input_len = max_req_len − 5`` (sglang/srt/managers/scheduler.py); the
  request is aborted when P ≥ ``max_req_input_len`` (``validate_input_length``,
  sglang/srt/managers/utils.py, without ``--allow-auto-truncate``): served only when
  P ≤ L − 7. A served request's ``max_new_tokens`` is clipped to ``max_req_len − P − 1``
  = L − P − 2 (``Scheduler.handle_generate_request``). SGLang also bounds
  ``max_req_len`` by ``max_total_num_tokens − 1``; a request the pool cannot hold is the
  replay's own "cannot fit the pool" error, not counted here.

A refused request is never served: it takes no pool space, hits nothing and leaves
nothing cached; the later requests see the cache they would without it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: SGLang: ``max_req_input_len = max_req_len − 5`` and ``max_req_len = context_len − 1``
_SGLANG_INPUT_MARGIN = 6
#: SGLang: ``max_new_tokens ≤ max_req_len − P − 1`` = ``context_len − P − 2``
_SGLANG_OUTPUT_MARGIN = 2


@dataclass(frozen=True)
class ContextLimit:
    """What :func:`apply_context_limit` did: the limit (tokens), the engine rule, the
    refused requests' ids (in trace order) and how many outputs were clipped."""

    max_model_len: int
    engine: str
    rejected_ids: tuple
    clipped_outputs: int

    @property
    def rejected_requests(self) -> int:
        return len(self.rejected_ids)


def resolve_max_model_len(model=None, max_model_len=None) -> int | None:
    """The context length in tokens: *max_model_len* when given, else the model's
    ``max_position_embeddings`` (*model*: a preset name, a ``config.json`` path or a
    :class:`~radixkv.memory.specs.ModelSpec`), else None (no limit).

    Raises
    ------
    radixkv.errors.ConfigError
        *max_model_len* < 1.
    """
    from radixkv.errors import ConfigError

    if max_model_len is not None:
        if isinstance(max_model_len, bool) or int(max_model_len) < 1:
            raise ConfigError(f"--max-model-len must be a whole number of tokens ≥ 1, got {max_model_len!r}",
                              field="max_model_len")
        return int(max_model_len)
    if model is None:
        return None
    from radixkv.memory.presets import get_model

    spec = model if hasattr(model, "max_position_embeddings") else get_model(model)
    return int(spec.max_position_embeddings)


def engine_of(policy) -> str:
    """``"sglang"`` for a policy (class, instance or spec) of an SGLang engine, else ``"vllm"``."""
    cls = getattr(policy, "build_class", None) or (policy if isinstance(policy, type) else type(policy))
    return "sglang" if getattr(cls, "engine", "vllm") == "sglang" else "vllm"


def limits(max_model_len: int, engine: str) -> tuple[int, int]:
    """``(longest prompt served, total tokens a served request may reach)`` in tokens."""
    if engine == "sglang":
        return max_model_len - _SGLANG_INPUT_MARGIN, max_model_len - _SGLANG_OUTPUT_MARGIN
    return max_model_len - 1, max_model_len


def apply_context_limit(trace, max_model_len: int | None, engine: str):
    """The requests of *trace* the engine serves, outputs clipped (module docstring).

    Parameters
    ----------
    trace : radixkv.trace.Trace
    max_model_len : int or None
        Context length in tokens; None returns *trace* unchanged.
    engine : ``"vllm"`` or ``"sglang"``

    Returns
    -------
    (Trace, ContextLimit or None)
        The same *trace* object when nothing is refused or clipped.
    """
    if max_model_len is None:
        return trace, None
    longest, total = limits(int(max_model_len), engine)
    P = np.asarray(trace.prompt_len, dtype=np.int64)  # tokens (also on hash-id traces)
    keep = P <= longest
    out = np.asarray(trace.output_len, dtype=np.int64)
    cap = np.minimum(out, np.maximum(total - P, 0))
    clipped = int(np.count_nonzero(keep & (cap < out)))
    info = ContextLimit(int(max_model_len), engine, tuple(str(x) for x in trace.req_id[~keep]), clipped)
    if len(P) and not keep.any():  # (an empty trace: the replay says there is nothing to replay)
        from radixkv.errors import ConfigError

        raise ConfigError(f"every request's prompt is longer than the {engine} engine serves with max_model_len "
                          f"{max_model_len} (the longest served: {longest} tokens); nothing to replay",
                          field="max_model_len")
    if keep.all() and clipped == 0:
        return trace, info
    return _subset(trace, keep, cap), info


def _subset(trace, keep: np.ndarray, out_len: np.ndarray):
    """*trace* with the requests where *keep* is True, output lengths *out_len*."""
    from radixkv.trace.types import Trace

    idx = np.flatnonzero(keep)
    o = trace.id_offsets
    ids = np.concatenate([trace.ids[o[i]:o[i + 1]] for i in idx]) if len(idx) else trace.ids[:0]
    offs = np.concatenate([[0], np.cumsum(o[idx + 1] - o[idx])]).astype(np.int64)
    new_out = out_len[idx].astype(np.int64)
    out_ids = out_offsets = None
    if trace.out_offsets is not None:
        oo = trace.out_offsets
        out_ids = np.concatenate([trace.out_ids[oo[i]:oo[i] + n] for i, n in zip(idx, new_out)]) \
            if len(idx) else trace.out_ids[:0]
        out_offsets = np.concatenate([[0], np.cumsum(new_out)]).astype(np.int64)
    return Trace(
        req_id=trace.req_id[idx], arrival_s=trace.arrival_s[idx], prompt_len=trace.prompt_len[idx],
        output_len=new_out, ids=np.ascontiguousarray(ids, dtype=np.int64), id_offsets=offs,
        unit_tokens=trace.unit_tokens, partial_last_unit=trace.partial_last_unit,
        out_ids=None if out_ids is None else np.ascontiguousarray(out_ids, dtype=np.int64), out_offsets=out_offsets,
        session_id=None if trace.session_id is None else trace.session_id[idx],
        turn=None if trace.turn is None else trace.turn[idx], name=trace.name)


def serve_with_arrivals(trace, arrivals, max_model_len: int | None, engine: str):
    """:func:`apply_context_limit` for a concurrent replay whose *arrivals* (seconds,
    float64, one per request of *trace*) were drawn for every request: the refused
    requests' arrivals are dropped, so the others keep theirs. Returns
    ``(trace, arrivals, ContextLimit or None)``."""
    served, info = apply_context_limit(trace, max_model_len, engine)
    if served is trace:
        return trace, arrivals, info
    keep = np.isin(trace.req_id, np.asarray(info.rejected_ids, dtype=trace.req_id.dtype), invert=True)
    return served, np.asarray(arrivals)[keep], info


def record(meta: dict, info) -> None:
    """Put *info* in a result's ``meta`` (the summaries read ``rejected_requests`` there)."""
    if info is not None:
        meta["rejected_requests"] = info.rejected_requests
        meta["context"] = {"max_model_len": info.max_model_len, "engine": info.engine,
                           "rejected_ids": list(info.rejected_ids), "clipped_outputs": info.clipped_outputs}
