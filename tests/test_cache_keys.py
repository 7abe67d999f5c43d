"""Cache salts, LoRA adapters and images as cache keys (issue 33), hand-worked.

Every expected hit is worked out from the engines' rules (docs/SEMANTICS.md and
radixkv/trace/cache_keys.py), pool large enough that nothing is evicted, one request at a
time: vLLM hits whole 16-token blocks of the longest shared prefix, at most
``(P − 1) // 16`` blocks; SGLang (page 1) hits the shared prefix, at most ``P − 1`` tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from radixkv.policies.registry import PoolSpec, parse_policy
from radixkv.replay.run import run_replay
from radixkv.trace.load import load_trace
from radixkv.trace.types import Trace

TENANTS = Path(__file__).parent / "data" / "traffic" / "tenants.jsonl"
POOL = PoolSpec(capacity_tokens=1 << 20)


def _hits(trace, spec):
    rec, _ = run_replay(trace, parse_policy(spec), POOL, quiet=True)
    return rec["hit_tokens"].tolist()


def _two(P, **cols):
    """Two requests with the same P tokens 100…, output length 1 (extent = prompt)."""
    toks = list(range(100, 100 + P))
    return Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[P, P], output_len=[1, 1],
                               prompt_ids=[toks, toks], **cols)


@pytest.mark.parametrize("spec,shared", [("vllm:16", 48), ("sglang:1", 63)])
def test_two_tenants_same_prompt(spec, shared):
    """64 tokens: salted, the second tenant hits nothing; unsalted, it hits what the rules
    allow of the whole prompt (vLLM 3 of 4 blocks, SGLang 63 tokens)."""
    salted = _two(64, tenant=["t1", "t2"], cache_salt=["s1", "s2"])
    assert _hits(salted, spec) == [0, 0]
    assert _hits(salted.with_isolation("none"), spec) == [0, shared]
    assert _hits(salted.with_isolation("tenant"), spec) == [0, 0]
    same_salt = _two(64, cache_salt=["s1", "s1"])
    assert _hits(same_salt, spec) == [0, shared]
    one_salted = _two(64, cache_salt=["s1", ""])  # a salt never matches the unsalted chain
    assert _hits(one_salted, spec) == [0, 0]


@pytest.mark.parametrize("spec,shared", [("vllm:16", 48), ("sglang:1", 63)])
def test_lora_adapters_share_nothing(spec, shared):
    assert _hits(_two(64, lora=["x", "y"]), spec) == [0, 0]
    assert _hits(_two(64, lora=["x", ""]), spec) == [0, 0]
    assert _hits(_two(64, lora=["x", "x"]), spec) == [0, shared]
    # salt and adapter together: both must agree
    assert _hits(_two(64, lora=["x", "x"], cache_salt=["s", "t"]), spec) == [0, 0]


@pytest.mark.parametrize("spec,diff,same", [("vllm:16", 16, 32), ("sglang:1", 20, 39)])
def test_same_text_different_images(spec, diff, same):
    """40 tokens with an image at [20, 30): different images share exactly the 20 tokens
    before it (vLLM: rounded down to the block, 16); the same image shares the whole prompt
    up to the cap (vLLM 2 blocks = 32; SGLang 39)."""
    assert _hits(_two(40, mm=[[("h1", 20, 10)], [("h2", 20, 10)]]), spec) == [0, diff]
    assert _hits(_two(40, mm=[[("h1", 20, 10)], [("h1", 20, 10)]]), spec) == [0, same]
    # the same image (placeholder 7) at another offset: b's text at 20..23 differs from a's image
    text = list(range(100, 140))
    a = text[:20] + [7] * 10 + text[30:]
    b = text[:24] + [7] * 10 + text[34:]
    t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[40, 40], output_len=[1, 1],
                            prompt_ids=[a, b], mm=[[("h1", 20, 10)], [("h1", 24, 10)]])
    assert _hits(t, spec) == [0, diff]


def test_image_straddling_a_block():
    """vLLM block 16, image at [10, 20): the block [0, 16) holds the image's start, so two
    prompts with different images share no block (hit 0), and SGLang shares 10 tokens."""
    t = _two(40, mm=[[("h1", 10, 10)], [("h2", 10, 10)]])
    assert _hits(t, "vllm:16") == [0, 0]
    assert _hits(t, "sglang:1") == [0, 10]


def test_outputs_are_in_the_namespace():
    """A token trace with output ids: request b's prompt is a's prompt + output. Same salt:
    b hits a's prompt and output (extent 20 + 12 − 1 = 31 tokens → vLLM 1 block = 16 of
    b's 32, cap (32−1)//16 = 1; SGLang 31); another salt: nothing."""
    a_p, a_o = list(range(20)), list(range(50, 62))
    b_p = a_p + a_o
    for salts, want in ((["s", "s"], [0, 16]), (["s", "u"], [0, 0])):
        t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[20, 32], output_len=[12, 1],
                                prompt_ids=[a_p, b_p], output_ids=[a_o, [9]], cache_salt=salts)
        assert _hits(t, "vllm:16") == want
        assert _hits(t, "sglang:1") == [0, 31 if want[1] else 0]


def test_hash_id_trace_namespaces_and_images():
    """U = 16 units: salts apply to every unit; an image makes the units it overlaps distinct
    (here unit 1 of 3), so different images share unit 0 only."""
    ids = [[1, 2, 3], [1, 2, 3]]
    kw = dict(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[48, 48], output_len=[1, 1], prompt_ids=ids,
              unit_tokens=16)
    assert _hits(Trace.from_requests(**kw), "vllm:16") == [0, 32]
    assert _hits(Trace.from_requests(**kw, cache_salt=["x", "y"]), "vllm:16") == [0, 0]
    t = Trace.from_requests(**kw, mm=[[("h1", 20, 8)], [("h2", 20, 8)]])
    assert _hits(t, "vllm:16") == [0, 16]
    assert _hits(t, "sglang:1") == [0, 16]  # the unit-granular rule: tokens 16..19 are not shared
    t = Trace.from_requests(**kw, mm=[[("h1", 20, 8)], [("h1", 20, 8)]])
    assert _hits(t, "vllm:16") == [0, 32]


def test_no_fields_keys_are_the_ids():
    t = _two(8)
    assert t.raw_ids is None and t.ids.tolist() == list(range(100, 108)) * 2
    t = _two(8, cache_salt=["", ""], lora=["", ""], tenant=["x", "y"], mm=[None, []])
    assert t.raw_ids is None and t.ids.tolist() == list(range(100, 108)) * 2


def test_keys_deterministic_and_disjoint():
    t1 = _two(8, cache_salt=["a", "b"])
    t2 = _two(8, cache_salt=["a", "b"])
    assert np.array_equal(t1.ids, t2.ids)
    a, b = t1.ids[:8], t1.ids[8:]
    assert not set(a.tolist()) & set(b.tolist()) and not set(a.tolist()) & set(range(100, 108))


def test_tenants_file_isolation_price(tmp_path):
    """tests/data/traffic/tenants.jsonl: a (t1) and b (t2) send the same 64 tokens; c (t1)
    extends a's prompt by one block. vllm:16 salted: c hits a's 4 blocks (64), b nothing;
    unsalted b hits 48 too: 48 hit tokens are the price, all of them tenant t2's."""
    from radixkv.cli import main

    out = tmp_path / "o.json"
    rc = main(["replay", str(TENANTS), "--policy", "vllm:16", "--capacity-tokens", "100000", "--no-timing",
               "--by", "tenant", "--isolation-price", "--json", str(out), "--quiet"])
    assert rc == 0
    s = json.loads(out.read_text())["results"][0]["summary"]
    assert s["hit_tokens"] == 64
    price = s["isolation_price"]
    assert (price["hit_tokens_isolated"], price["hit_tokens_shared"], price["hit_tokens_lost"]) == (64, 112, 48)
    assert [(g["group"], g["hit_tokens_lost"]) for g in price["groups"]] == [("t1", 0), ("t2", 48)]
    assert [(g["group"], g["requests"], g["prompt_tokens"], g["hit_tokens"]) for g in s["by"]["groups"]] == [
        ("t1", 2, 144, 64), ("t2", 1, 64, 0)]
    assert s["by"]["groups"][0]["ttft_mean_s"] is None and s["by"]["groups"][0]["miss_causes"] is None


def test_by_turn_concurrent_has_ttft(tmp_path):
    from radixkv.cli import main

    out = tmp_path / "o.json"
    rc = main(["replay", str(TENANTS), "--policy", "sglang:1", "--capacity-tokens", "100000", "--no-timing",
               "--by", "turn", "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
               "--json", str(out), "--quiet"])
    assert rc == 0
    g = json.loads(out.read_text())["results"][0]["summary"]["by"]["groups"]
    assert [(x["group"], x["requests"], x["hit_tokens"]) for x in g] == [("1", 2, 0), ("2", 1, 64)]
    assert all(x["ttft_mean_s"] is not None and x["ttft_mean_s"] > 0 for x in g)


def test_by_needs_the_column(capsys, monkeypatch):
    from radixkv.cli import main
    from radixkv.replay import run as run_mod

    def no_replay(*a, **k):
        raise AssertionError("the replay ran before the missing column was refused")

    monkeypatch.setattr(run_mod, "run_replay", no_replay)
    assert main(["replay", str(Path(__file__).parent / "data" / "bailian" / "hand.jsonl"), "--policy", "vllm:16",
                 "--capacity-tokens", "100000", "--by", "tenant", "--quiet"]) == 2
    out = capsys.readouterr()
    assert "gives no tenant" in out.err and out.out == ""  # refused before any table is printed
