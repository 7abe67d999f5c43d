"""A deployment the plan considers (:class:`Point`), its knobs' neighbours, and the forms it
is written in: the sweep cell that replays it, the ``radixkv replay`` command that replays
it again, and the engine's own command line.

Knob names are the engines': vLLM ``gpu_memory_utilization``, ``max_num_batched_tokens``,
``max_num_seqs``, ``block_size``, ``enable_prefix_caching``, ``kv_cache_dtype``,
``tensor_parallel_size`` (vLLM ``vllm/engine/arg_utils.py :: EngineArgs``); SGLang
``mem_fraction_static``, ``chunked_prefill_size``, ``max_running_requests``, ``page_size``,
``disable_radix_cache``, ``kv_cache_dtype``, ``tp_size`` (SGLang
``python/sglang/srt/server_args.py :: ServerArgs``). In the replay, vLLM's
``max_num_batched_tokens`` and SGLang's ``chunked_prefill_size`` are the same knob (tokens
per engine step), as are ``max_num_seqs`` and ``max_running_requests`` (running requests).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from radixkv.memory import vllm_start_max_model_len

#: the replay's defaults for the knobs the plan varies (radixkv.flags.concurrent); a
#: plan's base point takes the engine's own defaults for its GPU instead (:func:`base_point`)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256
#: alternatives tried around a point, knob by knob (assumed: the values operators try
#: first; they hold vLLM's defaults of every GPU class, 2048 / 8192 / 16384 tokens and
#: 256 / 1024 requests, :func:`radixkv.memory.engine_batch_defaults`)
NEIGHBOURS = {
    "max_num_batched_tokens": (2048, 4096, 8192, 16384),
    "max_num_seqs": (64, 128, 256, 512, 1024),
    "block_size": (16, 32),          # vLLM block_size
    "page_size": (1, 16),            # SGLang page_size
    "memory_fraction_step": 0.05,    # ± this around gpu_memory_utilization / mem_fraction_static
}
#: the router of a point with several replicas (the SGLang router's cache-aware policy) and its alternative
ROUTERS = ("prefix-aware", "round-robin")


@dataclass(frozen=True, order=True)
class Point:
    """One deployment: an engine on ``replicas`` × ``tp`` GPUs of one type, with its knobs.

    Attributes
    ----------
    engine : {"vllm", "sglang"}
    gpu : str
        GPU preset name.
    tp : int
        Tensor-parallel degree (GPUs per replica).
    replicas : int
        Engine replicas behind a router (data parallel).
    memory_fraction : float
        vLLM ``gpu_memory_utilization`` / SGLang ``mem_fraction_static``.
    max_num_batched_tokens : int
        Tokens per engine step (SGLang ``chunked_prefill_size``).
    max_num_seqs : int
        Most running requests (SGLang ``max_running_requests``).
    unit : int
        vLLM ``block_size`` / SGLang ``page_size``, tokens.
    prefix_caching : bool
    kv_cache_dtype : str or None
        None = the model's dtype.
    router : str or None
        Router over the replicas (None with one replica).
    """

    engine: str
    gpu: str
    tp: int
    replicas: int
    memory_fraction: float
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    unit: int = 16
    prefix_caching: bool = True
    kv_cache_dtype: str | None = None
    router: str | None = None

    @property
    def gpus(self) -> int:
        """GPUs the deployment holds (replicas × tp)."""
        return self.replicas * self.tp

    @property
    def structure(self) -> tuple:
        """What fixes the hardware: ``(engine, gpu, tp)``."""
        return (self.engine, self.gpu, self.tp)

    def with_replicas(self, r: int) -> "Point":
        """This point on *r* replicas (router: prefix-aware above one replica, kept if set)."""
        router = None if r == 1 else (self.router or ROUTERS[0])
        return replace(self, replicas=r, router=router)

    def label(self) -> str:
        """Short description for tables."""
        unit = "block" if self.engine == "vllm" else "page"
        fr = "gmu" if self.engine == "vllm" else "mfs"
        s = (f"{self.engine} {self.gpu} tp{self.tp} x{self.replicas} {fr}={self.memory_fraction:g} "
             f"mnbt={self.max_num_batched_tokens} seqs={self.max_num_seqs} {unit}={self.unit}")
        if not self.prefix_caching:
            s += " cache=off"
        if self.kv_cache_dtype:
            s += f" kv={self.kv_cache_dtype}"
        if self.router and self.router != ROUTERS[0]:
            s += f" router={self.router}"
        return s

    def to_dict(self) -> dict:
        """The point's fields as JSON-ready values."""
        return {"engine": self.engine, "gpu": self.gpu, "tp": self.tp, "replicas": self.replicas,
                "gpus": self.gpus, self.fraction_knob: self.memory_fraction,
                "max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs,
                self.unit_knob: self.unit, "prefix_caching": self.prefix_caching,
                "kv_cache_dtype": self.kv_cache_dtype, "router": self.router}

    @classmethod
    def from_dict(cls, d: dict) -> "Point":
        """The point of :meth:`to_dict`'s output *d* (a plan JSON's ``point``).

        Raises
        ------
        KeyError
            A field missing from *d*.
        """
        vllm = d["engine"] == "vllm"
        return cls(d["engine"], d["gpu"], int(d["tp"]), int(d["replicas"]),
                   float(d["gpu_memory_utilization" if vllm else "mem_fraction_static"]),
                   int(d["max_num_batched_tokens"]), int(d["max_num_seqs"]),
                   int(d["block_size" if vllm else "page_size"]), bool(d["prefix_caching"]),
                   d["kv_cache_dtype"], d["router"])

    @property
    def fraction_knob(self) -> str:
        return "gpu_memory_utilization" if self.engine == "vllm" else "mem_fraction_static"

    @property
    def unit_knob(self) -> str:
        return "block_size" if self.engine == "vllm" else "page_size"


def pool_of(point: Point, model: str):
    """The :class:`~radixkv.memory.PoolSize` the memory model gives one replica of *point*.

    Raises
    ------
    radixkv.errors.ConfigError or InputError
        The weights and overheads leave no KV pool, or a knob is out of range.
    """
    from radixkv.memory import pool_for

    kw = dict(tp=point.tp, kv_cache_dtype=point.kv_cache_dtype)
    if point.engine == "vllm":
        kw.update(gpu_memory_utilization=point.memory_fraction, block_size=point.unit,
                  max_num_batched_tokens=point.max_num_batched_tokens)
    else:
        kw.update(mem_fraction_static=point.memory_fraction, page_size=point.unit)
    return pool_for(point.engine, model, point.gpu, **kw)


def default_memory_fraction(engine: str, gpu: str, tp: int) -> float:
    """vLLM's default ``gpu_memory_utilization``
    (:data:`radixkv.memory.pool.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION`, 0.92) or SGLang's
    default ``mem_fraction_static`` for the GPU and TP
    (:func:`radixkv.memory.sglang_default_mem_fraction_static`)."""
    if engine == "vllm":
        from radixkv.memory.pool import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION

        return VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    from radixkv.memory import get_gpu, sglang_default_mem_fraction_static

    return round(sglang_default_mem_fraction_static(get_gpu(gpu), tp), 3)


def base_point(engine: str, gpu: str, tp: int, replicas: int = 1) -> Point:
    """The engine's defaults on *gpu* × *tp*: its memory fraction
    (:func:`default_memory_fraction`), the ``max_num_batched_tokens`` / ``max_num_seqs``
    (SGLang ``chunked_prefill_size`` / ``max_running_requests``) it picks for the GPU
    (:func:`radixkv.memory.engine_batch_defaults`), block_size 16, page_size 1.

    Raises
    ------
    radixkv.errors.InputError
        An unknown engine or GPU.
    """
    from radixkv.memory import engine_batch_defaults

    d = engine_batch_defaults(engine, gpu)
    return Point(engine, gpu, tp, 1, default_memory_fraction(engine, gpu, tp),
                 max_num_batched_tokens=d["max_num_batched_tokens"], max_num_seqs=d["max_num_seqs"],
                 unit=16 if engine == "vllm" else 1).with_replicas(replicas)


def neighbours(point: Point) -> list[tuple[str, Point]]:
    """``(knob, point)`` for every single-knob change of *point* the refinement tries, in a
    fixed order: prefix caching, memory fraction, max_num_batched_tokens, max_num_seqs,
    block/page size, KV dtype (fp8), router (several replicas only)."""
    out = [("prefix_caching", replace(point, prefix_caching=not point.prefix_caching))]
    step = NEIGHBOURS["memory_fraction_step"]
    for f in (round(point.memory_fraction - step, 3), round(point.memory_fraction + step, 3)):
        if 0.05 <= f <= 0.98:
            out.append((point.fraction_knob, replace(point, memory_fraction=f)))
    for v in NEIGHBOURS["max_num_batched_tokens"]:
        if v != point.max_num_batched_tokens:
            out.append(("max_num_batched_tokens", replace(point, max_num_batched_tokens=v)))
    for v in NEIGHBOURS["max_num_seqs"]:
        if v != point.max_num_seqs:
            out.append(("max_num_seqs", replace(point, max_num_seqs=v)))
    for v in NEIGHBOURS[point.unit_knob]:
        if v != point.unit:
            out.append((point.unit_knob, replace(point, unit=v)))
    out.append(("kv_cache_dtype", replace(point, kv_cache_dtype=None if point.kv_cache_dtype else "fp8")))
    if point.replicas > 1:
        for r in ROUTERS:
            if r != point.router:
                out.append(("router", replace(point, router=r)))
    return out


def replay_settings(point: Point, model: str, pool, rate_scale: float, cost_kw: dict) -> dict:
    """The ``radixkv replay`` settings (flag destinations, as a sweep cell takes them) that
    replay *point* in the concurrent mode on *pool* (:func:`pool_of`).

    vLLM points size their pool by the memory model from ``gpu_memory_utilization``
    (``radixkv replay``'s own rule); SGLang points give the pool SGLang's rule computed
    (``max_total_num_tokens``), since ``radixkv replay`` sizes pools by vLLM's rule.
    A vLLM point whose pool cannot hold one request of the model's context (vLLM would
    refuse to start, :func:`vllm_start_max_model_len`) gets ``max_model_len``: the largest
    length vLLM starts with, as the printed ``vllm serve`` command sets it
    (:func:`engine_command`); requests longer than it are refused by the replay
    (:mod:`radixkv.replay.context`) as the engine refuses them.
    *cost_kw*: the cost model's flags (``mfu``, ``mbu``, ``step_overhead_s``).
    """
    s = {"policy": f"{point.engine}:{point.unit}", "mode": "concurrent", "model": model, "gpu": point.gpu,
         "tp": point.tp, "kv_cache_dtype": point.kv_cache_dtype,
         "max_num_batched_tokens": point.max_num_batched_tokens, "max_num_seqs": point.max_num_seqs,
         "enable_prefix_caching": point.prefix_caching, "time_scale": 1.0 / rate_scale, **cost_kw}
    if point.engine == "vllm":
        s["gpu_memory_utilization"] = point.memory_fraction
        from radixkv.memory import get_model

        m = get_model(model)
        start = vllm_start_max_model_len(pool, m.max_position_embeddings, hybrid=m.is_hybrid)
        if start is not None:
            s["max_model_len"] = start
    else:
        s["max_total_num_tokens"] = int(pool.max_total_num_tokens)
    if point.replicas > 1:
        s["replicas"] = point.replicas
        s["router"] = point.router
    return s


def replay_argv(trace: str, settings: dict) -> list[str]:
    """The ``radixkv replay`` arguments of *settings* (:func:`replay_settings`; values at the
    replay's defaults are left out), for replaying a point again by hand."""
    from radixkv.sweep.grid import replay_defaults

    d = replay_defaults()
    argv = ["replay", str(trace)]
    for k in sorted(settings):
        v = settings[k]
        if k != "policy" and v == d.get(k):
            continue
        if k == "enable_prefix_caching":
            argv.append("--enable-prefix-caching" if v else "--no-enable-prefix-caching")
            continue
        argv += [f"--{k.replace('_', '-')}", format(v, "g") if isinstance(v, float) else str(v)]
    return argv


def engine_command(point: Point, model: str, max_model_len: int | None = None) -> str:
    """The engine's own launch command for one replica of *point* (flag names: vLLM
    ``vllm serve --help``; SGLang ``python -m sglang.launch_server --help``);
    *max_model_len* (tokens; a point's replay settings' ``max_model_len``,
    :func:`replay_settings`) adds vLLM's ``--max-model-len``."""
    if point.engine == "vllm":
        args = ["vllm", "serve", model, "--tensor-parallel-size", str(point.tp)]
        if max_model_len is not None:
            args += ["--max-model-len", str(int(max_model_len))]
        args += ["--gpu-memory-utilization", f"{point.memory_fraction:g}",
                 "--max-num-batched-tokens", str(point.max_num_batched_tokens),
                 "--max-num-seqs", str(point.max_num_seqs), "--block-size", str(point.unit)]
        if point.kv_cache_dtype:
            args += ["--kv-cache-dtype", point.kv_cache_dtype]
        args.append("--enable-prefix-caching" if point.prefix_caching else "--no-enable-prefix-caching")
    else:
        args = ["python", "-m", "sglang.launch_server", "--model-path", model, "--tp", str(point.tp),
                "--mem-fraction-static", f"{point.memory_fraction:g}",
                "--chunked-prefill-size", str(point.max_num_batched_tokens),
                "--max-running-requests", str(point.max_num_seqs), "--page-size", str(point.unit)]
        if point.kv_cache_dtype:
            args += ["--kv-cache-dtype", point.kv_cache_dtype]
        if not point.prefix_caching:
            args.append("--disable-radix-cache")
    return shlex.join(args)
