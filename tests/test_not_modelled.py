"""Metrics a policy or mode does not model are n/a (tables) and null (JSON), never 0
(issue 16): decided by the policy's capability flags, not by the formatter."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cli.replay_cmd import format_table
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.registry import PoolSpec, build_policy, measured_metrics, parse_policy
from radixkv.replay.run import run_replay
from radixkv.trace.load import load_trace

DEMO = Path(__file__).resolve().parents[1] / "traces" / "demo.jsonl"
# metric key -> capability flag it needs
_NEEDS = {"duplicate_share_mean": "duplication", "duplicate_share_peak": "duplication",
          "metadata_bytes_peak": "metadata", "free_space_scatter_mean": "slot_positions"}


@pytest.fixture(scope="module")
def demo():
    return load_trace(DEMO)


@pytest.mark.parametrize("label", ["vllm:16", "sglang:1", "unit-lru", "none", "static:16"])
def test_unmodelled_metrics_are_null_and_print_n_a(demo, label):
    spec = parse_policy(label)
    _, s = run_replay(demo, spec, PoolSpec(capacity_tokens=4000), limit=40, quiet=True)
    flags = measured_metrics(build_policy(spec, PoolSpec(capacity_tokens=4000)))
    # a sequential replay samples an idle pool: internal fragmentation is the concurrent mode's
    assert s["internal_fragmentation_share_mean"] is None
    for key, flag in _NEEDS.items():
        if not flags[flag]:
            assert s[key] is None, (label, key)
    table = format_table([s], timing=False)
    for line in table.splitlines():
        if line.startswith(("internal fragmentation", "duplication")) or (
                line.startswith("metadata") and not flags["metadata"]):
            if line.startswith("duplication") and flags["duplication"]:
                continue
            assert line.split()[-1] == "n/a", line
    # JSON null, not 0
    assert json.loads(json.dumps(s))["internal_fragmentation_share_mean"] is None


def test_flags_as_declared_by_hand():
    """The engines' models as docs/DESIGN.md states them: vLLM measures duplicate blocks,
    block-table metadata and free block positions; SGLang's tree has no slot positions;
    unit-lru has no duplicates."""
    from radixkv.policies.radix import RadixCache
    from radixkv.policies.unit_lru import UnitLRUCache

    assert measured_metrics(BlockHashCache) == {"duplication": True, "metadata": True, "slot_positions": True}
    assert measured_metrics(RadixCache) == {"duplication": True, "metadata": True, "slot_positions": False}
    assert measured_metrics(UnitLRUCache)["duplication"] is False


def test_a_policy_class_turning_a_flag_off_gets_null(demo):
    """The flag is read from the class (a new policy's declaration), not from a name table."""
    class NoDupVLLM(BlockHashCache):
        models_duplication = False

    from radixkv.metrics import summarize
    from radixkv.replay.sequential import replay_sequential

    pol = NoDupVLLM.from_capacity_tokens(4000, 16)
    rec = replay_sequential(demo, pol, limit=40, quiet=True)
    s = summarize(rec, measures=measured_metrics(pol))
    assert s["duplicate_share_mean"] is None and s["duplicate_share_peak"] is None
    assert s["metadata_bytes_peak"] > 0  # still modelled: 16-token blocks were cached
    base = summarize(rec, measures=measured_metrics(BlockHashCache))
    assert base["duplicate_share_mean"] == 0.0  # sequential vLLM: no two copies of a block
