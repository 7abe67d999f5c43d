"""Seeded synthetic workloads at token granularity (``unit_tokens = 1``).

The public traces identify prefixes only in 64–512-token units; these generators make
token-level traces whose shared prefixes have stated lengths that are not multiples of
the block size, so block 16 vs 32 vs token-level radix sharing can be compared.

Scenarios (one module each): ``long_doc_qa``, ``agent_tools``, ``enterprise``,
``customer_service``, ``multi_turn``, and ``mix`` (a blend). Shared machinery:
:mod:`~radixkv.synth.distributions` (named distributions, Zipf),
:mod:`~radixkv.synth.arrivals` (Poisson / Gamma session arrivals, think times),
:mod:`~radixkv.synth.rng` (seeded streams, 32,000-id vocabulary),
:mod:`~radixkv.synth.base` (scenario interface, trace assembly),
:mod:`~radixkv.synth.registry` (names, ``name=value`` parameters).

Example
-------
>>> from radixkv.synth import generate
>>> t = generate("multi_turn", 500, seed=1, rate=2.0, arrival="gamma", cv=2.0)
"""
from radixkv.synth.registry import SCENARIOS, generate, get_scenario, params_from_text
from radixkv.synth.rng import VOCAB_SIZE

__all__ = ["SCENARIOS", "VOCAB_SIZE", "generate", "get_scenario", "params_from_text"]
