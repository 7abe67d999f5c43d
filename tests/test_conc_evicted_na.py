"""Per-request ``evicted_tokens`` of a concurrent replay: SGLang's scheduler evicts as a
formed batch's KV is allocated (``prepare_for_extend`` / decode: ``alloc_token_slots`` ->
``evict_from_tree_cache``), for no one request, so the column is not modelled there: NaN
in the columns, an empty cell (n/a) in the per-request CSV, read back as n/a by
``radixkv report`` — never 0, though the pool did evict. vLLM's admissions evict for the
request admitted (``allocate_slots``): whole numbers, as before."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache
from radixkv.replay import conc_sglang
from radixkv.replay.concurrent import replay_concurrent
from radixkv.trace.types import Trace

from _conc_cases import COST_OVERHEAD as COST


def _trace() -> Trace:
    # r0 decodes long; r1 … r4 share its 8-token prefix and their decodes outgrow a
    # 300-token pool: the pool evicts (and retracts)
    prompts = [list(range(8))] + [list(range(8)) + [1000 + 10 * i + j for j in range(4)] for i in range(1, 5)]
    return Trace.from_requests(req_id=[f"r{i}" for i in range(5)], arrival_s=[0.0] + [0.5 + 0.01 * i for i in range(4)],
                               prompt_len=[len(p) for p in prompts], output_len=[280] + [200] * 4, prompt_ids=prompts)


def _csv_cells(path, column: str) -> list[str]:
    lines = path.read_text().splitlines()
    i = lines[0].split(",").index(column)
    return [ln.split(",")[i] for ln in lines[1:]]


@pytest.mark.parametrize("compiled", [False, True])
def test_sglang_concurrent_evicted_tokens_is_na_not_zero(monkeypatch, tmp_path, compiled):
    from radixkv.html_report import read_input

    monkeypatch.setattr(conc_sglang, "ENABLED", compiled)
    policy = RadixCache(300, 1)
    res = replay_concurrent(_trace(), policy, COST)
    assert policy.evicted_tokens_total > 0  # the pool evicted: a 0 would have been wrong, not n/a
    ev = res.columns["evicted_tokens"]
    assert ev.shape == (5,) and np.isnan(ev).all()
    res.write_csv(tmp_path / "r.csv")
    assert _csv_cells(tmp_path / "r.csv", "evicted_tokens") == [""] * 5
    assert _csv_cells(tmp_path / "r.csv", "preemptions") != [""] * 5  # other columns as before
    back = read_input(tmp_path / "r.csv")
    assert back["kind"] == "per_request" and np.isnan(back["columns"]["evicted_tokens"]).all()


def test_vllm_concurrent_evicted_tokens_stay_whole_numbers(tmp_path):
    policy = BlockHashCache(300, 4)
    res = replay_concurrent(_trace(), policy, COST)
    ev = res.columns["evicted_tokens"]
    assert ev.dtype == np.int64 and (ev >= 0).all()
    res.write_csv(tmp_path / "r.csv")
    assert _csv_cells(tmp_path / "r.csv", "evicted_tokens") == [str(v) for v in ev.tolist()]
