"""The two compiled concurrent engines read their state through one set of readouts
(:class:`radixkv.replay._engine_readout.EngineReadout`): written once, each engine naming
only its slots. The readouts' values are checked end to end by the multi-replica tests
(tests/test_multi_concurrent.py, tests/test_replicas_per_request.py) against the Python
engines; here, that neither engine keeps a copy of its own, and that each engine's slots
name its loop's state (distinct slots, inside the state vectors)."""
from __future__ import annotations

import pytest

READOUTS = ("give", "in_flight_at", "refused_row", "now", "peak", "steps", "intervals", "_nothing_to_run")


@pytest.mark.parametrize("module, cls", [("radixkv.replay.conc_sglang", "CompiledSglangEngine"),
                                         ("radixkv.replay.conc_vllm_fast", "CompiledVllmEngine")])
def test_readouts_written_once(module, cls):
    import importlib

    from radixkv.replay._engine_readout import EngineReadout

    c = getattr(importlib.import_module(module), cls)
    assert issubclass(c, EngineReadout)
    for name in READOUTS:
        assert name not in vars(c), f"{cls} defines its own {name}"
        assert getattr(c, name) is vars(EngineReadout)[name]


def test_slots_name_the_loops_state():
    import radixkv.replay._conc_sglang_kernels as C
    import radixkv.replay._conc_vllm_kernels as CK
    from radixkv.replay.conc_vllm_fast import _SLOTS

    # the vLLM loop's slots, by hand from its layout (an int vector of CK.NI, floats of CK.NFS)
    ints = [v for k, v in _SLOTS._asdict().items() if k != "now"]
    assert len(set(ints)) == len(ints) and all(0 <= v < CK.NI for v in ints)
    assert 0 <= _SLOTS.now < CK.NFS and _SLOTS.refused == CK.I_ARG and _SLOTS.now == CK.F_NOW
    # SGLang's loop stops on the request it cannot admit at I_ERR; its clock is V_NOW
    assert C.I_ERR < C.NIV and C.V_NOW < C.NFV
