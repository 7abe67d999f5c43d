"""``--miss-fix``: the smaller block size is replayed on the same pool in usable tokens,
however the pool was given (issue 32: a pool in num_gpu_blocks kept its block count at half
the block size, i.e. half the tokens, and reported a 'gain' that was a lost half pool)."""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.cli import main

DEMO = str(Path(__file__).resolve().parent.parent / "traces" / "demo.jsonl")


def _replay(capsys, *argv):
    assert main(["replay", DEMO, "--limit", "80", "--quiet", "--no-timing", "--json", "-", *argv]) == 0
    return json.loads(capsys.readouterr().out)["results"][0]["summary"]


def test_gain_at_half_the_block_size_is_measured_on_the_same_tokens(capsys):
    # 1,001 blocks of 8 (block 0 is the null block): 8,000 usable tokens
    by_blocks = _replay(capsys, "--policy", "vllm:8", "--num-gpu-blocks", "1001", "--miss-fix")
    by_tokens = _replay(capsys, "--policy", "vllm:8", "--capacity-tokens", "8000", "--miss-fix")
    assert by_blocks["pool_capacity_tokens"] == by_tokens["pool_capacity_tokens"] == 8000
    # the gain is vllm:4 on 8,000 tokens (a separate replay) minus vllm:8's hits
    half = _replay(capsys, "--policy", "vllm:4", "--capacity-tokens", "8000")
    want = half["hit_tokens"] - by_blocks["hit_tokens"]
    for s in (by_blocks, by_tokens):
        fix = s["miss_causes"]["fix"]
        assert fix["smaller_size"] == 4 and fix["hit_tokens_gained_at_smaller_size"] == want
