"""One registry: policies are known by their class; outside policies load through the
``radixkv.policies`` entry-point group and as ``package.module:Class[:SIZE]`` and run
through every verb like the built-ins, without touching radixkv's code."""
from __future__ import annotations

import json
import textwrap

import pytest

from conftest import DATA
from radixkv.cli import main
from radixkv.errors import ConfigError
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.no_cache import NoCache
from radixkv.policies.radix import RadixCache
from radixkv.policies.registry import PoolSpec, available_policies, build_policy, parse_policy

MIXED = str(DATA / "golden" / "traces" / "mixed200.jsonl")
GOLDEN_VLLM = DATA / "golden" / "vllm" / "vllm_mixed200_b16_n120.jsonl"
GOLDEN_SGLANG = DATA / "golden" / "sglang" / "sglang_mixed200_p1_c1904.jsonl"

# An outside package, as a user would ship it: two policy classes, one registered under
# the entry point ``myvllm``; neither is known to radixkv by name.
POLICY_SRC = '''
from radixkv.policies.block_hash import BlockHashCache
from radixkv.policies.radix import RadixCache


class MyBlocks(BlockHashCache):
    """vLLM's block pool under another name, admitted by SGLang's rules."""
    name = "myblocks"
    admission_rule = "sglang"


class MyTree(RadixCache):
    """SGLang's tree with no name of its own (reports call it package.module:Class)."""
'''


@pytest.fixture
def outside_package(tmp_path, monkeypatch):
    site = tmp_path / "site"
    pkg = site / "outsidepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "policies.py").write_text(textwrap.dedent(POLICY_SRC))
    dist = site / "outsidepkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: outsidepkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[radixkv.policies]\nmyvllm = outsidepkg.policies:MyBlocks\n"
                                          "mytree = outsidepkg.policies:MyTree\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def _golden_hits(path):
    return [json.loads(x)["hit_tokens"] for x in path.read_text().splitlines() if x]


def _csv_hits(path):
    return [int(line.split(",")[2]) for line in path.read_text().splitlines()[1:]]


def test_builtins_are_declared_by_their_classes():
    assert {"vllm", "sglang", "unit-lru", "none", "static"} <= set(available_policies())
    v, s = parse_policy("vllm"), parse_policy("radix")  # an alias
    assert (v.cls, v.size, v.label) == (BlockHashCache, 16, "vllm:16")
    assert (s.cls, s.size, s.label) == (RadixCache, 1, "sglang:1")
    assert RadixCache.admission_rule == "sglang" and BlockHashCache.admission_rule == "vllm"
    assert parse_policy("static").label == "static:16@0.3"
    assert parse_policy("none", block_size=4).size == 4
    assert parse_policy("sglang", block_size=4).size == 1  # --block-size is not SGLang's knob
    with pytest.raises(ConfigError, match="takes no '@option'"):
        parse_policy("none:16@x")
    with pytest.raises(ConfigError, match="unknown eviction policy"):
        parse_policy("vllm:16@arc")
    assert parse_policy("sglang:4@LFU").label == "sglang:4@lfu" and parse_policy("sglang:4@lfu").build_class.__name__ == "PriorityRadixCache"
    with pytest.raises(ConfigError, match="unit-lru takes no size"):
        parse_policy("unit-lru:4")


def test_eviction_options_build_the_priority_subclasses_and_import_them_only_when_asked():
    """``lru`` or no option builds the class itself; another order its priority subclass;
    a subclass of the base that is not a priority class cannot take another order; a
    priority subclass keeps itself. A fresh interpreter: the priority modules compile on
    import, so a spec without an eviction option must not load them
    (radixkv.policies.eviction decides, above both)."""
    import subprocess
    import sys

    code = textwrap.dedent("""
        import json, sys
        from radixkv.policies.registry import PolicySpec, PoolSpec, build_policy, parse_policy
        from radixkv.policies.radix import RadixCache
        out = []
        def loaded():
            return [m for m in ("radixkv.policies.block_priority", "radixkv.policies.radix_priority") if m in sys.modules]
        for text in ("vllm:16", "sglang:1", "sglang:1@fifo", "vllm:16@lru", "vllm:16@lfu"):
            spec = parse_policy(text)
            pol = build_policy(spec, PoolSpec(capacity_tokens=4096))
            out.append([text, spec.build_class.__name__, type(pol).__name__, getattr(pol, "eviction_priority", None).__class__.__name__, loaded()])
        class Mine(RadixCache):
            name = "mine"
        try:
            PolicySpec("mine", 1, "lfu", Mine).build_class
        except Exception as e:
            out.append([type(e).__name__, str(e)])
        from radixkv.policies.radix_belady import BeladyRadixCache
        out.append([PolicySpec("b", 1, "lfu", BeladyRadixCache).build_class.__name__])
        print(json.dumps(out))
    """)
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    got = json.loads(cp.stdout.splitlines()[-1])
    bp, rp = "radixkv.policies.block_priority", "radixkv.policies.radix_priority"
    assert got == [
        ["vllm:16", "BlockHashCache", "BlockHashCache", "NoneType", []],
        ["sglang:1", "RadixCache", "RadixCache", "NoneType", []],
        ["sglang:1@fifo", "PriorityRadixCache", "PriorityRadixCache", "FIFO", [rp]],
        # naming the order reads the block module's list of orders; lru stays the base class
        ["vllm:16@lru", "BlockHashCache", "BlockHashCache", "NoneType", [bp, rp]],
        ["vllm:16@lfu", "PriorityBlockHashCache", "PriorityBlockHashCache", "BlockLFU", [bp, rp]],
        ["ConfigError", "field 'policy': Mine has no eviction hook for 'lfu': subclass PriorityRadixCache"],
        ["BeladyRadixCache"],
    ]


def test_entry_point_policy_is_found_and_built(outside_package):
    assert "myvllm" in available_policies()
    spec = parse_policy("myvllm:16")
    assert spec.label == "myvllm:16" and spec.cls.__name__ == "MyBlocks"
    # num_gpu_blocks is taken in vLLM's own terms (block 0 reserved), inherited from the class
    pol = build_policy(spec, PoolSpec(num_gpu_blocks=120))
    assert pol.num_slots == 119 and pol.admission_rule == "sglang"


def test_module_class_spec(outside_package):
    a = parse_policy("outsidepkg.policies:MyBlocks:32")
    assert (a.label, a.size) == ("myblocks:32", 32)
    b = parse_policy("outsidepkg.policies:MyTree")
    assert b.label == "outsidepkg.policies:MyTree:1"
    for bad, msg in (("outsidepkg.nothere:X", "cannot import module"), ("outsidepkg.policies:Nope", "has no 'Nope'"),
                     ("radixkv.errors:ConfigError", "not a subclass")):
        with pytest.raises(ConfigError, match=msg):
            parse_policy(bad)


@pytest.mark.parametrize("policy", ["myvllm:16", "outsidepkg.policies:MyBlocks:16"])
def test_outside_policy_replay_matches_real_vllm(outside_package, tmp_path, capsys, policy):
    out, csv = tmp_path / "r.json", tmp_path / "r.csv"
    assert main(["replay", MIXED, "--policy", policy, "--num-gpu-blocks", "120", "--json", str(out),
                 "--per-request", str(csv), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    label = "myvllm:16" if policy.startswith("myvllm") else "myblocks:16"
    assert doc["results"][0]["policy"] == label
    assert _csv_hits(csv) == _golden_hits(GOLDEN_VLLM)  # the real vLLM's hits, request by request


def test_outside_policy_in_compare_and_curve(outside_package, tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["compare", MIXED, "--policies", "vllm:16,myvllm:16,outsidepkg.policies:MyTree",
                 "--max-total-num-tokens", "1904", "--quiet", "--json", str(out)]) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if line.startswith("metric")][0]
    assert header.split()[1:] == ["vllm:16", "myvllm:16", "outsidepkg.policies:MyTree:1"]
    res = {r["policy"]: r["summary"] for r in json.loads(out.read_text())["results"]}
    assert res["outsidepkg.policies:MyTree:1"]["hit_tokens"] == sum(_golden_hits(GOLDEN_SGLANG))
    assert res["myvllm:16"]["hit_tokens"] == res["vllm:16"]["hit_tokens"]
    cur = tmp_path / "cv"
    assert main(["curve", MIXED, "--policies", "mytree,outsidepkg.policies:MyBlocks:16", "--capacities", "2e3,1e5",
                 "--out", str(cur), "--quiet"]) == 0
    doc = json.loads((tmp_path / "cv.json").read_text())
    assert [c["policy"] for c in doc["curves"]] == ["mytree:1", "myblocks:16"]
    assert (tmp_path / "cv.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("policy", ["myvllm:16", "outsidepkg.policies:MyBlocks:16"])
def test_outside_policy_concurrent_reads_admission_rule_from_class(outside_package, tmp_path, capsys, policy):
    common = ["--capacity-tokens", "8000", "--mode", "concurrent", "--model", "Llama-3.1-8B", "--gpu", "A100-80GB",
              "--arrival", "poisson", "--request-rate", "50", "--quiet"]
    runs = {}
    for name, extra in (("class", []), ("sglang", ["--admission", "sglang"])):
        csv = tmp_path / f"{name}.csv"
        assert main(["replay", MIXED, "--policy", policy, "--per-request", str(csv)] + common + extra) == 0
        runs[name] = csv.read_text()
    # the class says admission_rule = "sglang": the same replay as asking for it
    assert runs["class"] == runs["sglang"]
    from radixkv.replay.scheduler import admission_rule_of

    pol = build_policy(parse_policy(policy), PoolSpec(capacity_tokens=8000))
    assert admission_rule_of(pol) == "sglang" and admission_rule_of(NoCache(10, 1)) == "vllm"


def test_entry_point_that_fails_to_load_names_itself(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist = site / "brokenpkg-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[radixkv.policies]\nbroken = brokenpkg_missing.mod:Cls\n")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ConfigError, match="entry point radixkv.policies:broken"):
        parse_policy("broken:16")
    assert parse_policy("vllm:16").size == 16  # a broken plug-in breaks nothing else
