"""Prefix-chained keys of trace units (Numba).

A unit's *prefix key* stands for the unit together with every unit before it in its
prompt: ``key[0] = mix64(SEED, id[0])``, ``key[j] = mix64(key[j-1], id[j])``; the
``unit-lru`` policy (:mod:`radixkv.policies.unit_lru`) chains them this way inside its
Numba kernel. Two units have
equal keys iff (up to hash collisions) their prompts agree on every id up to and including
them — the rule a prefix cache keyed by units applies. Mooncake and WEKA ids are already
prefix-chained (SOURCE.md: every id has one predecessor and one position), so chaining
them changes nothing there; token-id traces and RAGPulse need it.

Hash: a 64-bit mix of the splitmix64 finaliser (Steele, Lea, Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014) applied to ``parent * K + id``. The chance of
any collision among n distinct keys is about n² / 2^65: 2.7 % for 10^9 keys, 3·10^-8 for
10^6 (the largest public trace here has 5.3·10^6 unit references).
"""
from __future__ import annotations

import numba as nb
import numpy as np

SEED = np.uint64(0x9E3779B97F4A7C15)


@nb.njit(cache=True, inline="always")
def mix64(parent, x):
    """Chain one 64-bit value *x* onto *parent* (both uint64); returns uint64."""
    z = parent * np.uint64(0xBF58476D1CE4E5B9) + x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
