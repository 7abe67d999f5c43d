"""Read a Hugging Face ``config.json`` into the fields of a :class:`~radixkv.memory.specs.ModelSpec`.

:func:`read_hf_config` returns the fields as keywords;
:meth:`ModelSpec.from_hf_config <radixkv.memory.specs.ModelSpec.from_hf_config>` (and
:func:`radixkv.memory.specs.load_hf_config`, its function form) builds the spec from them.
This module imports nothing of :mod:`radixkv.memory`, so :mod:`radixkv.memory.specs` can
import it (the layer kinds, :data:`LAYER_KINDS`, are Hugging Face's spelling and live here).

Fields read (Hugging Face ``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config`` /
DeepSeek-V3's ``DeepseekV3Config``):

========================== ========================================================
``num_hidden_layers``      layers (required)
``hidden_size``            residual width (required)
``num_attention_heads``    query heads (required)
``num_key_value_heads``    KV heads (default: ``num_attention_heads``, as HF does)
``head_dim``               per-head width (default ``hidden_size // num_attention_heads``)
``v_head_dim``             per-head V width (default ``head_dim``)
``intermediate_size``      dense MLP width (required)
``vocab_size``             vocabulary (required)
``torch_dtype`` / ``dtype`` model dtype (default ``bfloat16``)
``quantization_config``    ``quant_method == "fp8"`` -> weights stored in fp8
``max_position_embeddings`` longest context (required)
``tie_word_embeddings``    LM head shares the embedding (default false)
``attention_bias``         q/k/v biases (default: true for ``model_type == "qwen2"``)
``kv_lora_rank``, ``qk_rope_head_dim``, ``q_lora_rank``, ``qk_nope_head_dim``  MLA
``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``,
``first_k_dense_replace``, ``moe_layer_freq``  DeepSeek MoE
``num_local_experts``      Mixtral-style MoE (every layer)
``layer_types``            per-layer kind: ``full_attention``, ``sliding_attention``,
                           ``linear_attention`` (hybrid models); when absent, the default
                           pattern of ``model_type`` ``gemma3_text`` (``sliding_window_pattern``,
                           default 6: every 6th layer full), ``gpt_oss`` (even layers
                           slide) and ``qwen3_next`` (``full_attention_interval``, default 4:
                           every 4th layer full, the rest linear), as Hugging Face's
                           ``Gemma3TextConfig`` / ``GptOssConfig`` / ``Qwen3NextConfig`` fill
                           it; other models: every layer full (a bare ``sliding_window``,
                           e.g. Mistral-7B-v0.1's, is not read as a hybrid)
``sliding_window``         window of the sliding layers (tokens)
``linear_conv_kernel_dim``, ``linear_num_key_heads``, ``linear_num_value_heads``,
``linear_key_head_dim``, ``linear_value_head_dim``  linear-attention state (Qwen3-Next)
``text_config``            a multimodal config (Gemma 3): the text model's fields are read
                           from it
========================== ========================================================

A missing required field or a value of the wrong type is an
:class:`~radixkv.errors.InputError` naming the file and the field.
"""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.errors import InputError

#: the per-layer attention kinds a :class:`~radixkv.memory.specs.ModelSpec` knows, in Hugging
#: Face's ``layer_types`` spelling (``Gemma3TextConfig``, ``GptOssConfig``, ``Qwen3NextConfig``)
LAYER_KINDS = ("full_attention", "sliding_attention", "linear_attention")


def _get_int(cfg: dict, field: str, path, default=None, *, required=True, allow_zero=False):
    if field not in cfg or cfg[field] is None:
        if default is not None or not required:
            return default
        raise InputError("missing required field", path=path, field=field)
    v = cfg[field]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (v == 0 and not allow_zero):
        raise InputError(f"must be a positive integer, got {v!r}", path=path, field=field)
    return v


def estimate_num_params(cfg: dict, path=None) -> int:
    """Parameter count of a decoder-only model from the shapes in its config.

    Formula (each term a weight matrix's rows × columns, or a vector's length; h =
    ``hidden_size``, L = layers, V = vocabulary, d = ``head_dim``, H = query heads,
    K = KV heads, I = ``intermediate_size``)::

        embeddings   V·h, plus V·h again for the LM head unless tie_word_embeddings
        final norm   h
        per layer    attention + MLP + 2·h (two RMSNorms)
          attention  MHA/GQA: h·H·d (q) + 2·h·K·d (k, v) + H·d·h (o)
                              + H·d + 2·K·d biases when attention_bias (Qwen2)
                     MLA:     q_lora_rank>0: h·r_q + r_q + r_q·H·(d_nope+d_rope)
                              else h·H·(d_nope+d_rope);
                              + h·(r_kv+d_rope) + r_kv + r_kv·H·(d_nope+d_v) + H·d_v·h
          MLP        dense (SwiGLU): 3·h·I
                     DeepSeek MoE layer (index ≥ first_k_dense_replace and a multiple of
                     moe_layer_freq): (n_routed + n_shared)·3·h·I_moe + n_routed·h (router)
                     + n_routed (e_score_correction_bias, DeepSeek-V3 only)
                     Mixtral (num_local_experts = E): E·3·h·I + E·h

    It reproduces the published counts of the presets exactly (e.g. Llama-3.1-8B
    8,030,261,248; Qwen2.5-7B 7,615,616,512; DeepSeek-V3 671,026,419,200 without its
    multi-token-prediction module, which serving does not load by default).

    Raises
    ------
    InputError
        A field the formula needs is missing or malformed.
    """
    h = _get_int(cfg, "hidden_size", path)
    L = _get_int(cfg, "num_hidden_layers", path)
    V = _get_int(cfg, "vocab_size", path)
    H = _get_int(cfg, "num_attention_heads", path)
    K = _get_int(cfg, "num_key_value_heads", path, default=H)
    d = _get_int(cfg, "head_dim", path, default=h // H)
    I = _get_int(cfg, "intermediate_size", path)
    tied = bool(cfg.get("tie_word_embeddings", False))
    n = V * h * (1 if tied else 2) + h

    if cfg.get("kv_lora_rank") is not None:
        r_kv = _get_int(cfg, "kv_lora_rank", path)
        d_rope = _get_int(cfg, "qk_rope_head_dim", path)
        d_nope = _get_int(cfg, "qk_nope_head_dim", path)
        d_v = _get_int(cfg, "v_head_dim", path)
        r_q = _get_int(cfg, "q_lora_rank", path, required=False, allow_zero=True) or 0
        q = h * r_q + r_q + r_q * H * (d_nope + d_rope) if r_q else h * H * (d_nope + d_rope)
        attn = q + h * (r_kv + d_rope) + r_kv + r_kv * H * (d_nope + d_v) + H * d_v * h
    else:
        attn = h * H * d + 2 * h * K * d + H * d * h
        bias = cfg.get("attention_bias", cfg.get("model_type") == "qwen2")
        if bias:
            attn += H * d + 2 * K * d

    dense_mlp = 3 * h * I
    n_routed = _get_int(cfg, "n_routed_experts", path, required=False)
    n_local = _get_int(cfg, "num_local_experts", path, required=False)
    for layer in range(L):
        if n_routed:
            n_shared = _get_int(cfg, "n_shared_experts", path, required=False,
                                allow_zero=True) or 0
            I_moe = _get_int(cfg, "moe_intermediate_size", path)
            first_dense = _get_int(cfg, "first_k_dense_replace", path, required=False,
                                   allow_zero=True) or 0
            freq = _get_int(cfg, "moe_layer_freq", path, default=1)
            if layer >= first_dense and layer % freq == 0:
                mlp = (n_routed + n_shared) * 3 * h * I_moe + n_routed * h
                if cfg.get("topk_method") == "noaux_tc":
                    mlp += n_routed  # e_score_correction_bias
            else:
                mlp = dense_mlp
        elif n_local:
            mlp = n_local * 3 * h * I + n_local * h
        else:
            mlp = dense_mlp
        n += attn + mlp + 2 * h
    return n


def _dtype_name(cfg: dict, path) -> str:
    raw = cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))
    if not isinstance(raw, str):
        raise InputError(f"must be a dtype name, got {raw!r}", path=path, field="torch_dtype")
    name = raw.lower().removeprefix("torch.")
    mapping = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    if name not in mapping:
        raise InputError(f"unsupported model dtype {raw!r} (bfloat16, float16, float32)",
                         path=path, field="torch_dtype")
    return mapping[name]


def _layer_types(cfg: dict, path, n_layers: int):
    """Per-layer kinds (tuple) or None (all full), and the keywords of the
    :class:`~radixkv.memory.specs.SSMSpec` (a dict) or None."""
    lt = cfg.get("layer_types")
    mt = str(cfg.get("model_type", ""))
    if lt is not None:
        if not isinstance(lt, list) or len(lt) != n_layers:
            raise InputError(f"must be a list of {n_layers} layer kinds, got {lt!r:.80}", path=path,
                             field="layer_types")
        for i, k in enumerate(lt):
            if k not in LAYER_KINDS:
                raise InputError(f"entry {i}: unknown layer kind {k!r} (known: {', '.join(LAYER_KINDS)})",
                                 path=path, field="layer_types")
        kinds = tuple(lt)
    elif mt in ("gemma3_text", "gemma3"):
        pat = _get_int(cfg, "sliding_window_pattern", path, default=6)
        kinds = tuple("sliding_attention" if (i + 1) % pat else "full_attention" for i in range(n_layers))
    elif mt == "gpt_oss":
        kinds = tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers))
    elif mt == "qwen3_next":
        k = _get_int(cfg, "full_attention_interval", path, default=4)
        kinds = tuple("linear_attention" if (i + 1) % k else "full_attention" for i in range(n_layers))
    else:
        return None, None
    if all(k == "full_attention" for k in kinds):
        return None, None
    ssm = None
    if "linear_attention" in kinds:
        ssm = dict(
            conv_kernel=_get_int(cfg, "linear_conv_kernel_dim", path),
            num_k_heads=_get_int(cfg, "linear_num_key_heads", path),
            num_v_heads=_get_int(cfg, "linear_num_value_heads", path),
            head_k_dim=_get_int(cfg, "linear_key_head_dim", path),
            head_v_dim=_get_int(cfg, "linear_value_head_dim", path),
        )
    return kinds, ssm


def read_hf_config(path, *, name: str | None = None, num_params: int | None = None) -> dict:
    """Read a Hugging Face ``config.json`` into the keywords of a
    :class:`~radixkv.memory.specs.ModelSpec` (:meth:`ModelSpec.from_hf_config
    <radixkv.memory.specs.ModelSpec.from_hf_config>` builds the spec from them).

    Parameters
    ----------
    path : str or Path
        The ``config.json`` file (or a directory holding one).
    name : str, optional
        Display name; default: the ``_name_or_path`` field, else the file's parent
        directory name.
    num_params : int, optional
        Parameter count; default: :func:`estimate_num_params`.

    Returns
    -------
    dict
        ``ModelSpec``'s fields by name (``name``, ``num_layers``, … ``q_lora_rank``);
        ``ssm`` is the keywords of its :class:`~radixkv.memory.specs.SSMSpec` (a dict) or
        None.

    Raises
    ------
    InputError
        The file is missing or not a JSON object (with the JSON error's line), or a field
        is missing or malformed (naming the file and field).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read model config: {e.strerror or e}", path=p) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason} at byte {e.start}): not a config.json", path=p) from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON: {e.msg}", path=p, line=e.lineno) from None
    if not isinstance(cfg, dict):
        raise InputError("a config.json must hold a JSON object", path=p)
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        # multimodal wrapper (Gemma 3): the text model's fields; the wrapper's dtype and name
        outer = cfg
        cfg = dict(cfg["text_config"])
        for f in ("torch_dtype", "dtype", "_name_or_path", "quantization_config"):
            if f in outer and f not in cfg:
                cfg[f] = outer[f]

    H = _get_int(cfg, "num_attention_heads", p)
    h = _get_int(cfg, "hidden_size", p)
    head_dim = _get_int(cfg, "head_dim", p, default=h // H)
    mla = cfg.get("kv_lora_rank") is not None
    kv_lora_rank = _get_int(cfg, "kv_lora_rank", p) if mla else None
    qk_rope = _get_int(cfg, "qk_rope_head_dim", p) if mla else None
    if mla:
        # per-head q/k width of MLA's attention, informational (the KV cache holds the latent)
        head_dim = _get_int(cfg, "qk_nope_head_dim", p) + qk_rope
    v_head_dim = _get_int(cfg, "v_head_dim", p, default=head_dim)

    dtype = _dtype_name(cfg, p)
    weight_dtype = dtype
    q = cfg.get("quantization_config")
    if isinstance(q, dict) and str(q.get("quant_method", "")).lower() == "fp8":
        weight_dtype = "fp8"

    n_layers = _get_int(cfg, "num_hidden_layers", p)
    layer_types, ssm = _layer_types(cfg, p, n_layers)
    sliding = None
    if layer_types is not None and "sliding_attention" in layer_types:
        sliding = _get_int(cfg, "sliding_window", p)
    if num_params is None:
        # hybrid models: an estimate that counts every layer as attention (pass num_params)
        num_params = estimate_num_params(cfg, p)
    if name is None:
        nm = cfg.get("_name_or_path")
        name = nm.rstrip("/").split("/")[-1] if isinstance(nm, str) and nm else (
            p.parent.name or p.stem)
    return dict(
        name=name,
        num_layers=_get_int(cfg, "num_hidden_layers", p),
        num_attention_heads=H,
        num_kv_heads=_get_int(cfg, "num_key_value_heads", p, default=H),
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        hidden_size=h,
        intermediate_size=_get_int(cfg, "intermediate_size", p),
        vocab_size=_get_int(cfg, "vocab_size", p),
        num_params=num_params,
        dtype=dtype,
        weight_dtype=weight_dtype,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope,
        max_position_embeddings=_get_int(cfg, "max_position_embeddings", p),
        layer_types=layer_types,
        sliding_window=sliding,
        ssm=ssm,
        q_lora_rank=(_get_int(cfg, "q_lora_rank", p)
                     if mla and cfg.get("q_lora_rank") is not None else None),
    )
