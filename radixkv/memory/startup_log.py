"""Read the KV pool an engine actually built from its own start-up log.

A vLLM or SGLang server prints what it allocated while it starts; that figure is the most
exact pool there is (no estimated term). :func:`read_startup_log` finds it in a log file
and returns a :class:`LoggedPool`, which ``--pool-from-log LOG`` turns into the replay
pool.

Lines recognised (by meaning; timestamps, process prefixes and ANSI colour are ignored):

vLLM
    * ``GPU KV cache size: N tokens`` (v1 engine, vLLM ``v1/core/kv_cache_utils.py``; in
      current vLLM the same line carries ``Maximum concurrency for L tokens per request``).
      Up to vLLM 0.10 the figure is ``num_blocks × block_size``; since vLLM made it
      ``int(max_concurrency × max_model_len)`` (``get_kv_cache_capacity``), with
      ``max_concurrency = num_blocks / ceil(L / block_size)`` for full attention, it is
      ``num_blocks × block_size`` exactly when ``L`` is a multiple of ``block_size`` and
      a little less otherwise; ``num_blocks`` is then recovered as the integer that
      reproduces the logged figure. Either way ``num_blocks`` counts block 0 (the null
      block), so the pool is ``num_gpu_blocks = num_blocks``.
    * ``# GPU blocks: N`` (v0 engine, ``worker/worker.py`` / ``executor``; vLLM 0.6.6–0.7
      print ``# CUDA blocks: N`` from ``executor/executor_base.py``), which is
      ``num_gpu_blocks`` itself.
    * ``Available KV cache memory: X GiB`` (v1 ``gpu_worker.py ::
      determine_available_memory``; v0 logs ``kv_cache_size=XGiB`` or "the rest of the
      memory reserved for KV Cache is X GiB"): the KV budget, rounded to 0.01 GiB.
    * ``block_size=B`` / ``--block-size B`` where the log shows it (default 16).
SGLang
    * ``max_total_num_tokens=N`` (``managers/scheduler.py``), else ``KV Cache is
      allocated. ... #tokens: N, K size: X GB, V size: Y GB`` (``mem_cache/memory_pool.py``;
      MLA pools log ``KV size``; SGLang's "GB" is GiB, ``2**30`` bytes).
    * ``page_size=P`` (the ``server_args=ServerArgs(...)`` line), default 1.

For a hybrid (sliding-window / linear-attention) model vLLM's token figure is derived from
a concurrency, not a capacity (vLLM issue 51041); radixkv models full attention only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from radixkv.errors import InputError

GiB = 2**30

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*)"
_FLOAT = r"([0-9]+(?:\.[0-9]+)?)"

_VLLM_TOKENS = re.compile(r"KV cache size:\s*" + _NUM + r"\s*tokens")
_VLLM_MAXLEN = re.compile(r"Maximum concurrency for\s*" + _NUM + r"\s*tokens per request")
_VLLM_BLOCKS = re.compile(r"#\s*(?:GPU|CUDA) blocks:\s*" + _NUM + r"|GPU blocks:\s*" + _NUM
                          + r",\s*#?\s*CPU blocks")
_VLLM_AVAIL = re.compile(
    r"(?:Available KV cache memory:\s*|kv_cache_size=|reserved for KV Cache is\s*)"
    + _FLOAT + r"\s*GiB")
_BLOCK_SIZE = re.compile(r"(?:block_size[=:]\s*|--block-size[= ]\s*)([0-9]+)")
_SGL_MAXTOT = re.compile(r"max_total_num_tokens=" + _NUM)
_SGL_ALLOC = re.compile(r"KV Cache is allocated\..*?#tokens:\s*" + _NUM)
_SGL_KV = re.compile(r"K size:\s*" + _FLOAT + r"\s*GB,\s*V size:\s*" + _FLOAT + r"\s*GB")
_SGL_KV1 = re.compile(r"KV size:\s*" + _FLOAT + r"\s*GB")
_PAGE_SIZE = re.compile(r"page_size=([0-9]+)")
_VLLM_VERSION = re.compile(r"(?:vLLM API server version|LLM engine \(v)\s*v?([0-9][0-9.a-z+]*)")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass(frozen=True)
class LoggedPool:
    """The pool found in a start-up log.

    Attributes
    ----------
    engine : str
        ``"vllm"`` or ``"sglang"``.
    path : str
        The log file.
    line : int
        1-based line of the pool figure.
    num_gpu_blocks : int or None
        vLLM ``num_gpu_blocks`` (null block included); None for SGLang.
    max_total_num_tokens : int or None
        SGLang ``max_total_num_tokens``; None for vLLM.
    logged_tokens : int or None
        vLLM's "GPU KV cache size" figure (tokens), when that is the line found.
    unit_tokens : int
        ``block_size`` (vLLM) or ``page_size`` (SGLang) shown in the log, else the default
        (16 / 1).
    kv_cache_gib : float or None
        KV budget (vLLM "Available KV cache memory") or pool size (SGLang K + V size), GiB
        as logged (two decimals); None when the log does not show it.
    max_model_len : int or None
        From vLLM's "Maximum concurrency for L tokens per request", when shown.
    engine_version : str or None
        The vLLM version the log prints, when it does.
    """

    engine: str
    path: str
    line: int
    num_gpu_blocks: int | None
    max_total_num_tokens: int | None
    logged_tokens: int | None
    unit_tokens: int
    kv_cache_gib: float | None
    max_model_len: int | None
    engine_version: str | None

    @property
    def capacity_tokens(self) -> int:
        """Tokens the pool holds: vLLM ``(num_gpu_blocks − 1) × block_size``; SGLang
        ``max_total_num_tokens``."""
        if self.engine == "vllm":
            return (self.num_gpu_blocks - 1) * self.unit_tokens
        return self.max_total_num_tokens


def _blocks_from_tokens(tokens: int, block_size: int, max_model_len: int | None,
                        path: str, line: int) -> int:
    """``num_blocks`` that makes vLLM log ``tokens`` (see the module docstring)."""
    if max_model_len is None or max_model_len % block_size == 0:
        if tokens % block_size:
            raise InputError(
                f"vLLM's KV cache size {tokens:,} tokens is not a multiple of block_size "
                f"{block_size}; give the log line with 'Maximum concurrency for L tokens "
                "per request' or the block size (--block-size)", path=path, line=line,
                field="block_size")
        return tokens // block_size
    per_req = -(-max_model_len // block_size)
    guess = tokens * per_req // max_model_len
    for nb in range(max(guess - 2, 1), guess + 3):
        if int(nb / per_req * max_model_len) == tokens:
            return nb
    raise InputError(
        f"no whole number of blocks of {block_size} tokens gives vLLM's KV cache size "
        f"{tokens:,} tokens at max_model_len {max_model_len:,}", path=path, line=line,
        field="block_size")


def parse_startup_log(text: str, *, path: str = "<log>", engine: str | None = None,
                      block_size: int | None = None) -> LoggedPool:
    """Find the KV pool in the text of a vLLM or SGLang start-up log.

    Parameters
    ----------
    text : str
        The log.
    path : str
        Name used in errors.
    engine : {"vllm", "sglang"} or None
        Restrict to one engine's lines; None accepts either (the first engine whose pool
        line appears wins).
    block_size : int or None
        vLLM block size when the log does not show it (default 16).

    Returns
    -------
    LoggedPool

    Raises
    ------
    InputError
        No pool line in the log (names the file and the lines looked for), or a figure
        that cannot be turned into whole blocks (names the line).
    """
    v_tokens = v_blocks = v_avail = v_maxlen = v_bs = v_ver = None
    s_tot = s_alloc = s_kv = s_page = None
    for i, raw in enumerate(text.splitlines(), 1):
        ln = _ANSI.sub("", raw)
        if v_tokens is None and (m := _VLLM_TOKENS.search(ln)):
            v_tokens = (_int(m.group(1)), i)
            if mm := _VLLM_MAXLEN.search(ln):
                v_maxlen = _int(mm.group(1))
        if v_maxlen is None and (m := _VLLM_MAXLEN.search(ln)):
            v_maxlen = _int(m.group(1))
        if v_blocks is None and (m := _VLLM_BLOCKS.search(ln)):
            v_blocks = (_int(m.group(1) or m.group(2)), i)
        if v_avail is None and (m := _VLLM_AVAIL.search(ln)):
            v_avail = float(m.group(1))
        if v_bs is None and (m := _BLOCK_SIZE.search(ln)):
            v_bs = int(m.group(1))
        if v_ver is None and (m := _VLLM_VERSION.search(ln)):
            v_ver = m.group(1).rstrip(".")
        if s_tot is None and (m := _SGL_MAXTOT.search(ln)):
            s_tot = (_int(m.group(1)), i)
        if s_alloc is None and (m := _SGL_ALLOC.search(ln)):
            s_alloc = (_int(m.group(1)), i)
            if mk := _SGL_KV.search(ln):
                s_kv = float(mk.group(1)) + float(mk.group(2))
            elif mk := _SGL_KV1.search(ln):
                s_kv = float(mk.group(1))
        if s_page is None and (m := _PAGE_SIZE.search(ln)):
            s_page = int(m.group(1))

    want = (engine or "").lower()
    if want not in ("", "vllm", "sglang"):
        raise InputError(f"unknown engine {engine!r}; one of: vllm, sglang", field="engine")
    has_v = v_tokens is not None or v_blocks is not None
    has_s = s_tot is not None or s_alloc is not None
    if has_v and has_s and not want:
        first_v = min(x[1] for x in (v_tokens, v_blocks) if x is not None)
        first_s = min(x[1] for x in (s_tot, s_alloc) if x is not None)
        want = "vllm" if first_v <= first_s else "sglang"
    if has_v and want in ("", "vllm"):
        bs = v_bs or block_size or 16
        if v_blocks is not None and (v_tokens is None or v_blocks[1] <= v_tokens[1]):
            nb, line, tok = v_blocks[0], v_blocks[1], None
        else:
            tok, line = v_tokens
            nb = _blocks_from_tokens(tok, bs, v_maxlen, path, line)
        if nb < 2:
            raise InputError(f"vLLM logged {nb} GPU block(s): no usable pool",
                             path=path, line=line, field="num_gpu_blocks")
        return LoggedPool("vllm", path, line, nb, None, tok, bs, v_avail, v_maxlen, v_ver)
    if has_s and want in ("", "sglang"):
        n, line = s_tot if s_tot is not None else s_alloc
        if n < 1:
            raise InputError("SGLang logged an empty KV pool", path=path, line=line,
                             field="max_total_num_tokens")
        return LoggedPool("sglang", path, line, None, n, None, s_page or 1, s_kv, None, None)
    looked = {
        "vllm": "'GPU KV cache size: N tokens' or '# GPU blocks: N'",
        "sglang": "'max_total_num_tokens=N' or 'KV Cache is allocated. ... #tokens: N'",
    }
    what = " or ".join(looked[e] for e in (("vllm", "sglang") if not want else (want,)))
    raise InputError(f"no such line: the log has no KV pool size ({what})", path=path,
                     field="pool_from_log")


def read_startup_log(path, *, engine: str | None = None,
                     block_size: int | None = None) -> LoggedPool:
    """:func:`parse_startup_log` on a file (UTF-8; undecodable bytes replaced).

    Raises
    ------
    InputError
        The file cannot be read, or has no pool line (see :func:`parse_startup_log`).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise InputError(f"cannot read start-up log: {e.strerror}", path=str(p),
                         field="pool_from_log") from None
    return parse_startup_log(text, path=str(p), engine=engine, block_size=block_size)


__all__ = ["LoggedPool", "parse_startup_log", "read_startup_log"]
