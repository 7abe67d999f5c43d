"""Random streams and token content for the workload generators.

Determinism
-----------
Every random quantity comes from a numpy ``Generator(PCG64)`` seeded by a
``SeedSequence([seed, *key])``, where *key* names what the stream is for (scenario,
purpose, index). Independent things get independent streams, so one session's content
does not depend on how many other sessions were generated: generating more requests
keeps the earlier ones unchanged (the first k requests of an n-request trace equal the
k-request trace), and the same arguments always give the same trace.

Token content
-------------
Token ids are drawn independently and uniformly from a vocabulary of
:data:`VOCAB_SIZE` = 32,000 ids (the size of the Llama-2 and Mistral-7B tokenizers).
Two pieces of unrelated content therefore agree on their first m tokens with probability
32,000^(−m): a prefix match that the scenario did not intend is one token long with
probability 1/32,000 and two tokens long with probability about 1e-9.
"""
from __future__ import annotations

import numpy as np

from radixkv.errors import InputError

#: token ids are drawn from ``0 .. VOCAB_SIZE − 1`` (Llama-2 / Mistral-7B vocabulary size)
VOCAB_SIZE = 32_000


def check_seed(seed) -> int:
    """Return *seed* as an int ≥ 0, or raise :class:`InputError` (field ``seed``)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be an integer ≥ 0, got {seed!r}", field="seed")
    return int(seed)


def stream(seed: int, *key: int) -> np.random.Generator:
    """The random stream named by ``(seed, *key)``: ``Generator(PCG64(SeedSequence([seed, *key])))``.

    Parameters
    ----------
    seed : int ≥ 0
    key : ints ≥ 0
        What the stream is for (scenario code, purpose, index).
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), *map(int, key)])))


def fresh_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    """*n* new token ids, i.i.d. uniform on ``0 .. VOCAB_SIZE − 1``; int64, shape (n,)."""
    return rng.integers(0, VOCAB_SIZE, size=int(n), dtype=np.int64)
