#!/usr/bin/env bash
# Re-record every synthetic trace in this folder. Same commands → byte-identical files
# (tests/test_synth_cli.py checks demo.jsonl). Run from the repository root:
#   bash traces/record.sh
set -euo pipefail
synth() { python -m radixkv.cli.synth_cmd "$@"; }   # = radixkv trace synth "$@"

synth long_doc_qa --requests 100 --seed 1 --rate 0.5 \
  --param n_documents=12 --param document_len=loguniform:5000,20000 \
  --out traces/long_doc_qa.npz
synth agent_tools --requests 100 --seed 1 --rate 1 --out traces/agent_tools.jsonl
synth enterprise --requests 300 --seed 1 --rate 2 --out traces/enterprise.jsonl
synth customer_service --requests 1000 --seed 1 --rate 5 --out traces/customer_service.jsonl
synth multi_turn --requests 400 --seed 1 --rate 1 --out traces/multi_turn.jsonl
synth mix --requests 300 --seed 1 --rate 2 \
  --param long_doc_qa.n_documents=8 --param long_doc_qa.document_len=loguniform:300,800 \
  --param long_doc_qa.system_len=213 --param long_doc_qa.output_len=lognormal:60,0.6,10,300 \
  --param agent_tools.system_len=uniform:120,300 --param agent_tools.toolset_len=uniform:100,400 \
  --param agent_tools.steps=uniform:2,4 --param agent_tools.tool_result_len=lognormal:50,0.8,10,300 \
  --param enterprise.prompt_len=301 --param enterprise.output_len=lognormal:60,0.6,10,300 \
  --param customer_service.output_len=lognormal:60,0.6,10,300 \
  --param multi_turn.system_len=uniform:80,250 --param multi_turn.turns=uniform:2,5 \
  --param multi_turn.output_len=lognormal:60,0.6,10,300 --param multi_turn.user_len=lognormal:30,0.8,5,300 \
  --param multi_turn.think_time=lognormal_s:10,0.8 \
  --out traces/demo.jsonl
