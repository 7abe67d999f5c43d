"""Cache keys of a request's content: tenants' cache salts, LoRA adapters and multimodal items.

The prefix caches of both engines key a request's KV by more than its token ids. radixkv
folds those extra keys into the ids themselves, when a trace is built, so that every policy
(and every compiled kernel) compares ids exactly as before: two token positions of two
requests hold the same cached KV iff their **key ids** are equal (and, as always, the
prefixes before them). :func:`cache_key_ids` computes the key ids; :class:`Trace` keeps
the file's ids in ``raw_ids`` / ``raw_out_ids`` when they differ, so writers round-trip
the trace as the file gave it.

The engines' rules
------------------
vLLM 0.33 (``vllm/v1/core/kv_cache_utils.py``: ``hash_block_tokens`` hashes
``(parent_hash, block_token_ids, extra_keys)``; ``generate_block_hash_extra_keys`` builds
the extra keys; docs/engines/vllm.md §1):

* ``cache_salt``: ``("cache_salt", salt)`` enters the **first** block's hash only (when
  ``start_token_idx == 0`` and the salt is not empty); the chain carries it into every
  later block, prompt and output alike.
* LoRA (``_gen_lora_extra_hash_keys``): ``("lora", lora_name, lora_path)`` enters
  **every** block's hash.
* multimodal items (``_gen_mm_extra_hash_keys``): each item whose placeholder range
  ``[offset, offset + length)`` overlaps the block adds ``("mm", identifier, offset −
  block_start)``; the placeholder tokens themselves are the same token ids for every image.

SGLang 0.5.23 (``python/sglang/srt/mem_cache/radix_cache.py``: ``RadixKey(token_ids,
extra_key, cache_salt)``; ``RadixKey.child_key_at`` wraps every child key with
``(extra_key, cache_salt)`` when a salt is set, with ``extra_key`` when only that is, so
keys of different namespaces never share a node; docs/engines/sglang.md §1):

* ``cache_salt`` (``Req.cache_salt``) and LoRA (``Req.__init__`` appends ``lora_id`` to
  ``extra_key``) partition the tree: two requests share a node only when both are equal.
* multimodal items: before the request reaches the tree the scheduler pads its prompt
  (``duplicate_pad_mm_input_ids`` with the model's ``pad_input_ids``, e.g. Qwen2.5-VL's
  ``pad_mm_tokens``): each item's span is replaced by its ``padding_sequence``, four wide
  sentinel values derived from the item's hash (``_compute_pad_values``: SHA-256, 62 bits,
  shifted above the vocabulary) repeated over the span.

What radixkv does (exact, and where it is)
-------------------------------------------
1. **Images** (token traces, ``U = 1``): position ``k`` of an item with content hash ``h``
   gets the key id of the pair ``(h, k)``, a fresh id used by no text token. Two prompts
   then agree on a prefix iff they agree on its text tokens and on which item with which
   hash covers each position. vLLM: two blocks with equal parents hash equally iff their
   token ids and the (identifier, offset in block) of every overlapping item are equal —
   the same condition, given that one content hash names one item length and one run of
   placeholder tokens (every reader checks both, :func:`first_mm_conflict`). So a vLLM
   block that straddles an image's start differs from one without that image, and two
   prompts with the same text and different images share exactly the blocks before the
   block holding the first image (tokens before it, rounded down to the block). SGLang:
   its key at position ``k`` of the item is sentinel ``k mod 4`` of ``h``; two prompts
   that agree on a prefix agree on where each run of sentinels starts (sentinels are
   above every text token id) and on the first item's hash there (its first sentinel),
   hence on its length and on the next item's start: item boundaries are the same, so
   ``(h, k mod 4)`` and ``(h, k)`` give the same prefix equality. The only difference is
   a collision of two hashes' 62-bit sentinels, which radixkv does not reproduce.
2. **Namespaces**: the pair ``(cache_salt, lora)`` of a request ('' = none) names its
   namespace; every key id of a request in a namespace other than ``('', '')`` — prompt and
   output ids — is replaced by the fresh id of ``(namespace, id)``. Requests share a prefix
   iff they share namespace and key ids. vLLM: a salt changes the first block's hash and so
   the whole chain; a LoRA name changes every block: two requests share a block iff they
   have the same salt and adapter — the same condition. SGLang: the namespace is the tree
   partition, the same condition. Exact for both engines, with no hash collisions at all
   (ids are renumbered through a table, not hashed).
3. **Hash-id traces** (``U > 1``: Mooncake, WEKA, Qwen-Bailian): the file's unit ids
   already stand for hashed token content. Namespaces apply as in 2 (exact: every unit of
   a salted or LoRA request is in its namespace). An image makes every unit that overlaps
   it distinct: the unit's key id is the fresh id of ``(unit id, (h, item start − unit
   start) for each overlapping item)``. This is exact at unit granularity and loses the up
   to ``U − 1`` tokens of the unit before the image that a token-level cache could still
   share (a unit id names one content; radixkv does not split it).

Fresh ids are numbered after the largest id of the trace, in a deterministic order, so the
same trace gives the same key ids.
"""
from __future__ import annotations

import numpy as np

#: isolation modes: which column is the cache salt
ISOLATION_MODES = ("cache_salt", "tenant", "none")


def namespace_codes(salt, lora, n: int) -> np.ndarray | None:
    """Namespace code of every request: 0 for ``('', '')``, 1, 2, … for the others in sorted
    order of ``(salt, lora)``; None when every request is in namespace 0.

    Parameters
    ----------
    salt, lora : np.ndarray of str, shape (n,), or None
    n : int, number of requests

    Returns
    -------
    np.ndarray, int64, shape (n,), or None
    """
    cols = [np.asarray(c, dtype=str) for c in (salt, lora) if c is not None]
    if not cols:
        return None
    default = np.ones(n, dtype=bool)
    code = np.zeros(n, dtype=np.int64)
    for c in cols:
        u, inv = np.unique(c, return_inverse=True)
        code = code * len(u) + inv.ravel()
        default &= c == ""
    if default.all():
        return None
    _, ns = np.unique(code, return_inverse=True)
    ns = ns.ravel().astype(np.int64) + 1
    ns[default] = 0
    return ns


def first_mm_conflict(mm_offsets, mm_hash, mm_start, mm_length, ids, id_offsets, unit_tokens: int):
    """The first multimodal item whose content hash names another length (or, in a token
    trace, other placeholder tokens) than where the hash first appeared.

    Parameters
    ----------
    mm_offsets : int64 (n+1,) — request ``k``'s items are ``mm_offsets[k]:mm_offsets[k+1]``
    mm_hash : str (m,); mm_start, mm_length : int64 (m,) — tokens
    ids, id_offsets : the trace's file ids (token ids when ``unit_tokens == 1``)

    Returns
    -------
    None, or ``(k, q, k_first, reason)``: request ``k``'s item ``q`` (0-based within the
    request) disagrees with the first item of its hash, in request ``k_first``.
    """
    first: dict = {}
    req_of = np.repeat(np.arange(len(mm_offsets) - 1), np.diff(mm_offsets))
    for j in range(len(mm_hash)):
        h = str(mm_hash[j])
        k = int(req_of[j])
        a, L = int(mm_start[j]), int(mm_length[j])
        span = ids[id_offsets[k] + a:id_offsets[k] + a + L] if unit_tokens == 1 else None
        if h not in first:
            first[h] = (k, L, span)
            continue
        kf, Lf, spf = first[h]
        if L != Lf:
            return k, j - int(mm_offsets[k]), kf, f"covers {L} tokens here but {Lf} tokens"
        if span is not None and not np.array_equal(span, spf):
            return k, j - int(mm_offsets[k]), kf, "covers other placeholder token ids here than"
    return None


def cache_key_ids(trace, isolation: str = "cache_salt"):
    """The key ids of *trace*'s prompts and outputs (module docstring).

    Parameters
    ----------
    trace : radixkv.trace.types.Trace
        Its file ids are ``trace.raw_ids`` when set, else ``trace.ids`` (same for outputs).
    isolation : str
        Which column is the cache salt: ``"cache_salt"`` (the trace's), ``"tenant"`` (every
        tenant its own salt: what isolating tenants would cost) or ``"none"`` (no salt:
        tenants share).

    Returns
    -------
    (ids, out_ids) : int64 arrays shaped as the trace's ``ids`` / ``out_ids`` (``out_ids``
        None when the trace has none), or None when the keys equal the file's ids.

    Raises
    ------
    ValueError
        An unknown *isolation* mode.
    """
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
    ids = trace.ids if trace.raw_ids is None else trace.raw_ids
    out = trace.out_ids if trace.raw_out_ids is None else trace.raw_out_ids
    n = len(trace)
    salt = {"cache_salt": trace.cache_salt, "tenant": trace.tenant, "none": None}[isolation]
    ns = namespace_codes(salt, trace.lora, n)
    has_mm = trace.mm_hash is not None and len(trace.mm_hash) > 0
    if ns is None and not has_mm:
        return None
    top = max(int(ids.max()) if ids.size else -1, int(out.max()) if out is not None and out.size else -1)
    keys = np.array(ids, dtype=np.int64, copy=True)
    if has_mm:
        top = _key_images(trace, keys, top)
    out_keys = None if out is None else np.array(out, dtype=np.int64, copy=True)
    if ns is not None:
        _key_namespaces(trace, keys, out_keys, ns, top)
    return keys, out_keys


def _key_images(trace, keys: np.ndarray, top: int) -> int:
    """Write the image key ids into *keys* (in place); returns the largest id now used."""
    off, start, length = trace.mm_offsets, trace.mm_start, trace.mm_length
    _, hcode = np.unique(np.asarray(trace.mm_hash, dtype=str), return_inverse=True)
    hcode = hcode.ravel().astype(np.int64)
    req = np.repeat(np.arange(len(trace), dtype=np.int64), np.diff(off))
    U = int(trace.unit_tokens)
    if U == 1:
        maxlen = int(length.max())
        base = top + 1
        k = np.arange(int(length.sum()), dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
        pos = np.repeat(trace.id_offsets[req] + start, length) + k
        keys[pos] = base + np.repeat(hcode, length) * maxlen + k
        return int(base + (int(hcode.max()) + 1) * maxlen - 1)
    # hash-id trace: a unit overlapping items gets the id of (unit id, ((h, start − unit start), ...))
    per_unit: dict = {}
    for j in range(len(hcode)):
        i = int(req[j])
        a, b = int(start[j]), int(start[j] + length[j])
        nunits = int(trace.id_offsets[i + 1] - trace.id_offsets[i])
        for u in range(a // U, min(-(-b // U), nunits)):
            per_unit.setdefault(int(trace.id_offsets[i]) + u, []).append((int(hcode[j]), a - u * U))
    table: dict = {}
    for p in sorted(per_unit):
        key = (int(keys[p]), tuple(per_unit[p]))
        if key not in table:
            top += 1
            table[key] = top
        keys[p] = table[key]
    return top


def _key_namespaces(trace, keys, out_keys, ns, top) -> None:
    """Replace the key ids of every request in a namespace ≠ 0 by the fresh id of
    ``(namespace, id)``, prompt and output ids through one table (in place)."""
    parts_k = [keys]
    parts_ns = [np.repeat(ns, np.diff(trace.id_offsets))]
    if out_keys is not None:
        parts_k.append(out_keys)
        parts_ns.append(np.repeat(ns, np.diff(trace.out_offsets)))
    allk = np.concatenate(parts_k)
    alln = np.concatenate(parts_ns)
    sel = np.flatnonzero(alln > 0)
    if not sel.size:
        return
    pairs = np.stack([alln[sel], allk[sel]], axis=1)
    _, inv = np.unique(pairs, axis=0, return_inverse=True)
    allk[sel] = top + 1 + inv.ravel()
    keys[:] = allk[:keys.size]
    if out_keys is not None:
        out_keys[:] = allk[keys.size:]
