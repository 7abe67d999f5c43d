"""A trace file with a header and no request: every verb that reads it refuses it the same
way (exit 2, the file named, "no requests in the file"), for the Azure CSV as for the
native JSONL — before, ``trace inspect`` printed an empty table (exit 0) and ``replay``
failed on field 'limit'."""
from __future__ import annotations

import pytest

from radixkv.cli import main


@pytest.mark.parametrize("name, text", [
    ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"),
    ("native.jsonl", '{"radixkv_trace": 1, "unit_tokens": 1}\n'),
])
@pytest.mark.parametrize("verb", [["trace", "inspect"], ["replay"]])
def test_header_only_trace_is_refused_naming_the_file(tmp_path, capsys, name, text, verb):
    p = tmp_path / name
    p.write_text(text)
    argv = [*verb, str(p)] + (["--policy", "vllm:16", "--capacity-tokens", "1000"] if verb == ["replay"] else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"radixkv: error: {p}: no requests in the file: it holds only the header (line 1); a trace needs at " \
           "least one request" in err, err
    assert "limit" not in err and "Traceback" not in err
