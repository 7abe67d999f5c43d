"""The three input faults of issue 16: one unit id covering two lengths, duplicate request
ids, a UTF-8 byte-order mark."""
from __future__ import annotations

import json

import numpy as np
import pytest

from radixkv.errors import InputError, TraceFormatError
from radixkv.trace.load import load_trace
from radixkv.trace.types import Trace

_MOONCAKE = ('{"timestamp":0,"input_length":40,"output_length":1,"hash_ids":[7]}\n'
             '{"timestamp":1000,"input_length":500,"output_length":1,"hash_ids":[7]}\n')


def test_one_id_two_lengths_mooncake_is_a_located_error(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(_MOONCAKE)
    with pytest.raises(TraceFormatError) as e:
        load_trace(p)
    msg = str(e.value)
    assert "line 2" in msg and "hash_ids" in msg and "unit id 7" in msg
    assert "500 tokens here but 40 tokens in line 1" in msg


def test_one_id_two_lengths_native_header_is_a_located_error(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"radixkv_trace":1,"unit_tokens":64,"partial_last_unit":true}\n'
                 '{"id":"a","hash_ids":[1,2],"input_length":100,"output_length":0}\n'
                 '{"id":"b","hash_ids":[1,2],"input_length":128,"output_length":0}\n')
    with pytest.raises(TraceFormatError) as e:
        load_trace(p)
    assert e.value.line == 3 and "unit id 2" in str(e.value) and "64 tokens here but 36" in str(e.value)


def test_one_id_same_length_everywhere_is_fine(tmp_path):
    """A partial last unit reused at the same length is consistent (shared short prompt)."""
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp":0,"input_length":40,"output_length":1,"hash_ids":[7]}\n'
                 '{"timestamp":1,"input_length":552,"output_length":1,"hash_ids":[9,8]}\n'
                 '{"timestamp":2,"input_length":40,"output_length":1,"hash_ids":[7]}\n')
    assert len(load_trace(p)) == 3


@pytest.mark.parametrize("policy", ["unit-lru", "vllm:16", "sglang:1"])
def test_every_policy_sees_the_same_rule(tmp_path, policy):
    """The rule lives in the trace, so no policy replays the inconsistent trace (unit-lru
    used to report a 500-token hit, vllm:16 32 and sglang:1 40), whichever file format
    carries it (.npz included)."""
    from radixkv.cli import main
    from radixkv.trace.binary import write_npz

    p = tmp_path / "t.jsonl"
    p.write_text(_MOONCAKE)
    assert main(["replay", str(p), "--policy", policy, "--capacity-tokens", "4096", "--quiet"]) == 2
    t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[40, 500], output_len=[1, 1],
                            prompt_ids=[[7], [7]], unit_tokens=512, partial_last_unit=True)
    z = tmp_path / "t.npz"
    write_npz(t, z)
    assert main(["replay", str(z), "--policy", policy, "--capacity-tokens", "4096", "--quiet"]) == 2
    with pytest.raises(TraceFormatError, match="request 'b': unit id 7 .* covers 500 tokens here but 40"):
        load_trace(z)


def test_duplicate_request_ids_native_is_a_located_error(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"id":"x","tokens":[1,2,3],"output_length":1}\n'
                 '{"id":"y","tokens":[1,2],"output_length":1}\n'
                 '\n'
                 '{"id":"x","tokens":[4],"output_length":1}\n')
    with pytest.raises(TraceFormatError) as e:
        load_trace(p)
    assert e.value.line == 4 and e.value.field == "id" and "line 1" in str(e.value)


def test_duplicate_request_ids_npz_are_refused(tmp_path):
    from radixkv.trace.binary import read_npz

    t = Trace.from_requests(req_id=["a", "b"], arrival_s=[0, 1], prompt_len=[2, 1], output_len=[0, 0],
                            prompt_ids=[[1, 2], [3]])
    p = tmp_path / "t.npz"
    from radixkv.trace.binary import write_npz

    write_npz(t, p)
    t.req_id = np.asarray(["a", "a"])
    with pytest.raises(InputError, match="repeats id 'a'"):
        t.validate()
    assert len(read_npz(p)) == 2


@pytest.mark.parametrize("text", [
    _MOONCAKE.splitlines()[0] + "\n",
    '{"radixkv_trace":1,"unit_tokens":1}\n{"tokens":[1,2,3],"output_length":1}\n',
    '{"tokens":[1,2,3],"output_length":1}\n',
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n",
])
def test_utf8_bom_is_accepted(tmp_path, text):
    plain, bom = tmp_path / "plain", tmp_path / "bom"
    plain.write_bytes(text.encode())
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    a, b = load_trace(plain), load_trace(bom)
    assert len(a) == len(b) == 1
    assert a.ids.tolist() == b.ids.tolist() and a.prompt_len.tolist() == b.prompt_len.tolist()


def test_bom_weka_document(tmp_path):
    doc = {"block_size": 64, "requests": []}
    d = tmp_path / "w.json"
    d.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    from radixkv.trace.detect import detect_format

    assert detect_format(d) == "weka"


@pytest.mark.parametrize("text", ["", "\n\n   \n"])
def test_empty_trace_file_says_empty(tmp_path, text):
    p = tmp_path / "t.jsonl"
    p.write_text(text)
    with pytest.raises(TraceFormatError, match="empty") as e:
        load_trace(p)
    assert "t.jsonl" in str(e.value)


@pytest.mark.parametrize("flag,policy", [("--hicache-ratio", "sglang-hicache:1"),
                                         ("--hicache-size", "sglang-hicache:1"),
                                         ("--kv-offloading-size", "vllm-offload:16")])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_host_tier_size_is_a_named_error(tmp_path, capsys, flag, policy, value):
    """argparse's float() accepts 'nan' and 'inf'; a host pool of that size used to end in a
    ValueError / OverflowError traceback (int(nan)) instead of exit code 2 naming the flag."""
    from radixkv.cli import main

    p = tmp_path / "t.jsonl"
    p.write_text('{"id":"a","tokens":[1,2,3],"output_length":1}\n')
    rc = main(["replay", str(p), "--policy", policy, "--model", "Llama-3.1-8B", "--gpu", "H100",
               "--quiet", flag, value])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert flag in err and "finite" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_non_finite_hicache_ratio_in_the_spec_is_a_named_error(tmp_path, capsys, value):
    """The same ratio given in the policy spec (not the flag) used to end in a traceback."""
    from radixkv.cli import main

    p = tmp_path / "t.jsonl"
    p.write_text('{"id":"a","tokens":[1,2,3],"output_length":1}\n')
    rc = main(["replay", str(p), "--policy", f"sglang-hicache:1@hicache_ratio={value}",
               "--capacity-tokens", "64", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "hicache_ratio" in err and "Traceback" not in err
