"""Preset models and GPUs, and name lookup.

Model presets copy the values of each model's ``config.json`` on the Hugging Face Hub
(named per preset below); ``num_params`` is the published parameter count, which the
shape formula of :func:`radixkv.memory.hf_config.estimate_num_params` reproduces exactly.

GPU presets: ``total_bytes`` is ``nvidia-smi``'s ``memory.total`` (MiB × 2**20) for the
SKU, the figure SGLang's memory heuristics read (see :class:`GPUSpec`); FLOP/s are dense
(no 2:4 sparsity) bf16 tensor-core peaks and bandwidths are from the vendor datasheets
named in each ``source``.
"""
from __future__ import annotations

from pathlib import Path

from radixkv.errors import InputError
from radixkv.memory.specs import GPUSpec, ModelSpec, SSMSpec

MODEL_PRESETS: dict[str, ModelSpec] = {
    # meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096, 32 heads, 32 KV heads
    # (MHA), intermediate 11008, vocab 32000, max_position_embeddings 4096, float16.
    # 6,738,415,616 parameters (safetensors metadata; "7B" on the model card).
    "Llama-2-7B": ModelSpec(
        name="Llama-2-7B", num_layers=32, num_attention_heads=32, num_kv_heads=32,
        head_dim=128, v_head_dim=128, hidden_size=4096, intermediate_size=11008,
        vocab_size=32000, num_params=6_738_415_616, dtype="fp16", weight_dtype="fp16",
        max_position_embeddings=4096),
    # meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, hidden 4096, 32 heads,
    # 8 KV heads, head_dim 128, intermediate 14336, vocab 128256, max_position_embeddings
    # 131072, bfloat16. 8,030,261,248 parameters ("8B").
    "Llama-3.1-8B": ModelSpec(
        name="Llama-3.1-8B", num_layers=32, num_attention_heads=32, num_kv_heads=8,
        head_dim=128, v_head_dim=128, hidden_size=4096, intermediate_size=14336,
        vocab_size=128256, num_params=8_030_261_248, max_position_embeddings=131072),
    # mistralai/Mistral-7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV
    # heads, intermediate 14336, vocab 32000, max_position_embeddings 32768, bfloat16.
    # 7,241,732,096 parameters ("7.3B" on the release blog rounds this up).
    "Mistral-7B": ModelSpec(
        name="Mistral-7B", num_layers=32, num_attention_heads=32, num_kv_heads=8,
        head_dim=128, v_head_dim=128, hidden_size=4096, intermediate_size=14336,
        vocab_size=32000, num_params=7_241_732_096, max_position_embeddings=32768),
    # Qwen/Qwen2.5-7B-Instruct config.json: 28 layers, hidden 3584, 28 heads, 4 KV heads,
    # intermediate 18944, vocab 152064, max_position_embeddings 32768, q/k/v biases,
    # untied embeddings, bfloat16. 7,615,616,512 parameters ("7.61B" on the model card).
    "Qwen2.5-7B": ModelSpec(
        name="Qwen2.5-7B", num_layers=28, num_attention_heads=28, num_kv_heads=4,
        head_dim=128, v_head_dim=128, hidden_size=3584, intermediate_size=18944,
        vocab_size=152064, num_params=7_615_616_512, max_position_embeddings=32768),
    # meta-llama/Llama-2-70b-hf config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads,
    # intermediate 28672, vocab 32000, max_position_embeddings 4096, float16.
    # 68,976,648,192 parameters (shapes).
    "Llama-2-70B": ModelSpec(
        name="Llama-2-70B", num_layers=80, num_attention_heads=64, num_kv_heads=8,
        head_dim=128, v_head_dim=128, hidden_size=8192, intermediate_size=28672,
        vocab_size=32000, num_params=68_976_648_192, dtype="fp16", weight_dtype="fp16",
        max_position_embeddings=4096),
    # deepseek-ai/deepseek-coder-6.7b-instruct config.json (LlamaForCausalLM): 32 layers,
    # hidden 4096, 32 heads = 32 KV heads (MHA), intermediate 11008, vocab 32256,
    # max_position_embeddings 16384, bfloat16. 6,740,512,768 parameters (shapes).
    "deepseek-coder-6.7B": ModelSpec(
        name="deepseek-coder-6.7B", num_layers=32, num_attention_heads=32, num_kv_heads=32,
        head_dim=128, v_head_dim=128, hidden_size=4096, intermediate_size=11008,
        vocab_size=32256, num_params=6_740_512_768, max_position_embeddings=16384),
    # Qwen/Qwen3-30B-A3B config.json: 48 layers, hidden 2048, 32 heads, 4 KV heads,
    # head_dim 128, MoE 128 experts (8 active) of moe_intermediate_size 768, dense
    # intermediate_size 6144, vocab 151936 (untied), max_position_embeddings 40960,
    # bfloat16. 30,532,122,624 parameters (shapes; the model card's "30.5B").
    "Qwen3-30B-A3B": ModelSpec(
        name="Qwen3-30B-A3B", num_layers=48, num_attention_heads=32, num_kv_heads=4,
        head_dim=128, v_head_dim=128, hidden_size=2048, intermediate_size=6144,
        vocab_size=151936, num_params=30_532_122_624, max_position_embeddings=40960),
    # Qwen/Qwen3-235B-A22B-FP8 config.json: 94 layers, hidden 4096, 64 heads, 4 KV heads,
    # head_dim 128, MoE 128 experts (8 active) of moe_intermediate_size 1536, dense
    # intermediate_size 12288, vocab 151936 (untied), max_position_embeddings 40960;
    # bfloat16 activations with an fp8 (e4m3, 128×128 blocks) quantization_config.
    # 235,093,634,560 parameters (shapes; the card's "235B"), counted as fp8 (the bf16
    # embeddings, norms and routers are < 1.1 % of them).
    "Qwen3-235B-A22B-FP8": ModelSpec(
        name="Qwen3-235B-A22B-FP8", num_layers=94, num_attention_heads=64, num_kv_heads=4,
        head_dim=128, v_head_dim=128, hidden_size=4096, intermediate_size=12288,
        vocab_size=151936, num_params=235_093_634_560, weight_dtype="fp8",
        max_position_embeddings=40960),
    # meta-llama/Llama-3.1-70B-Instruct config.json: 80 layers, hidden 8192, 64 heads,
    # 8 KV heads, intermediate 28672, vocab 128256, max_position_embeddings 131072,
    # bfloat16. 70,553,706,496 parameters ("70B").
    "Llama-3.1-70B": ModelSpec(
        name="Llama-3.1-70B", num_layers=80, num_attention_heads=64, num_kv_heads=8,
        head_dim=128, v_head_dim=128, hidden_size=8192, intermediate_size=28672,
        vocab_size=128256, num_params=70_553_706_496, max_position_embeddings=131072),
    # Qwen/Qwen2.5-72B-Instruct config.json: 80 layers, hidden 8192, 64 heads, 8 KV
    # heads, intermediate 29568, vocab 152064, max_position_embeddings 32768, q/k/v
    # biases, bfloat16. 72,706,203,648 parameters ("72.7B" on the model card).
    "Qwen2.5-72B": ModelSpec(
        name="Qwen2.5-72B", num_layers=80, num_attention_heads=64, num_kv_heads=8,
        head_dim=128, v_head_dim=128, hidden_size=8192, intermediate_size=29568,
        vocab_size=152064, num_params=72_706_203_648, max_position_embeddings=32768),
    # deepseek-ai/DeepSeek-V3 config.json: 61 layers, hidden 7168, 128 heads, MLA with
    # kv_lora_rank 512, q_lora_rank 1536, qk_nope_head_dim 128, qk_rope_head_dim 64,
    # v_head_dim 128; MoE: 256 routed + 1 shared experts of moe_intermediate_size 2048,
    # first_k_dense_replace 3 (dense intermediate 18432); vocab 129280,
    # max_position_embeddings 163840; torch_dtype bfloat16 with an fp8 (e4m3, 128×128
    # blocks) quantization_config. 671B parameters without the 14B multi-token-prediction
    # module (DeepSeek-V3 technical report, §1 and the model card's "685B" = 671B + 14B).
    "DeepSeek-V3": ModelSpec(
        name="DeepSeek-V3", num_layers=61, num_attention_heads=128, num_kv_heads=128,
        head_dim=192, v_head_dim=128, hidden_size=7168, intermediate_size=18432,
        vocab_size=129280, num_params=671_026_419_200, dtype="bf16", weight_dtype="fp8",
        kv_lora_rank=512, qk_rope_head_dim=64, max_position_embeddings=163840, q_lora_rank=1536),
    # google/gemma-3-27b-it config.json, text_config: 62 layers, hidden 5376, 32 heads,
    # 16 KV heads, head_dim 128, intermediate 21504, vocab 262208 (tied),
    # max_position_embeddings 131072, sliding_window 1024, sliding_window_pattern 6
    # (layers 5, 11, …, 59 full attention: 10 full, 52 sliding), bfloat16.
    # 27,009,346,304 parameters of the text model (shapes, with Gemma's q/k norms and four
    # norms per layer; the card's "27B" adds the 0.4B SigLIP vision tower).
    "Gemma-3-27B": ModelSpec(
        name="Gemma-3-27B", num_layers=62, num_attention_heads=32, num_kv_heads=16,
        head_dim=128, v_head_dim=128, hidden_size=5376, intermediate_size=21504,
        vocab_size=262208, num_params=27_009_346_304, max_position_embeddings=131072,
        layer_types=tuple("sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(62)),
        sliding_window=1024),
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers, full_attention_interval 4
    # (layers 3, 7, …, 47 full attention: 12 full, 36 gated-delta-net linear attention),
    # hidden 2048, 16 heads, 2 KV heads, head_dim 256; linear_conv_kernel_dim 4,
    # linear_num_key_heads 16, linear_num_value_heads 32, linear_key_head_dim 128,
    # linear_value_head_dim 128; MoE 512 experts (10 active) of moe_intermediate_size 512,
    # intermediate_size 5120, vocab 151936, max_position_embeddings 262144, bfloat16.
    # num_params: the model card's "80B in total" (rounded; the shape formula of
    # estimate_num_params does not cover gated delta nets).
    "Qwen3-Next-80B-A3B": ModelSpec(
        name="Qwen3-Next-80B-A3B", num_layers=48, num_attention_heads=16, num_kv_heads=2,
        head_dim=256, v_head_dim=256, hidden_size=2048, intermediate_size=5120,
        vocab_size=151936, num_params=80_000_000_000, max_position_embeddings=262144,
        layer_types=tuple("linear_attention" if (i + 1) % 4 else "full_attention" for i in range(48)),
        ssm=SSMSpec(conv_kernel=4, num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)),
    # deepseek-ai/DeepSeek-V3.2-Exp config.json: DeepSeek-V3's shapes (above) plus the
    # sparse-attention indexer (index_head_dim 128, index_n_heads 64, index_topk 2048);
    # the indexer's key cache adds 61 × (128 + 4) B per token (ModelSpec.index_head_dim).
    # Parameters counted as DeepSeek-V3's 671B (the indexer adds < 0.1 %).
    "DeepSeek-V3.2-Exp": ModelSpec(
        name="DeepSeek-V3.2-Exp", num_layers=61, num_attention_heads=128, num_kv_heads=128,
        head_dim=192, v_head_dim=128, hidden_size=7168, intermediate_size=18432,
        vocab_size=129280, num_params=671_026_419_200, dtype="bf16", weight_dtype="fp8",
        kv_lora_rank=512, qk_rope_head_dim=64, max_position_embeddings=163840, q_lora_rank=1536,
        index_head_dim=128),
    # meta-llama/Llama-3.2-11B-Vision-Instruct config.json, text_config: 40 layers (32
    # self-attention + 8 cross-attention, each with its own KV cache in vLLM), hidden
    # 4096, 32 heads, 8 KV heads, head_dim 128, intermediate 14336, vocab 128256,
    # max_position_embeddings 131072, bfloat16. 10,670,220,835 parameters (safetensors
    # index total_size 21,340,441,670 B / 2; the card's "10.6B"), vision encoder included.
    "Llama-3.2-11B-Vision": ModelSpec(
        name="Llama-3.2-11B-Vision", num_layers=40, num_attention_heads=32, num_kv_heads=8,
        head_dim=128, v_head_dim=128, hidden_size=4096, intermediate_size=14336,
        vocab_size=128256, num_params=10_670_220_835, max_position_embeddings=131072),
    # Qwen/Qwen3-0.6B config.json: 28 layers, hidden 1024, 16 heads, 8 KV heads, head_dim
    # 128, intermediate 3072, vocab 151936 (tied), max_position_embeddings 40960,
    # bfloat16. 596,049,920 parameters (shapes; the card's "0.6B").
    "Qwen3-0.6B": ModelSpec(
        name="Qwen3-0.6B", num_layers=28, num_attention_heads=16, num_kv_heads=8,
        head_dim=128, v_head_dim=128, hidden_size=1024, intermediate_size=3072,
        vocab_size=151936, num_params=596_049_920, max_position_embeddings=40960),
    # Qwen/Qwen2.5-VL-7B-Instruct config.json: the language model of Qwen2.5-7B (28
    # layers, hidden 3584, 28 heads, 4 KV heads, intermediate 18944, vocab 152064) plus a
    # 32-layer vision encoder; max_position_embeddings 128000, bfloat16. 8,292,166,656
    # parameters (the card's "8.29B"), vision encoder included.
    "Qwen2.5-VL-7B": ModelSpec(
        name="Qwen2.5-VL-7B", num_layers=28, num_attention_heads=28, num_kv_heads=4,
        head_dim=128, v_head_dim=128, hidden_size=3584, intermediate_size=18944,
        vocab_size=152064, num_params=8_292_166_656, max_position_embeddings=128000),
}

_MiB = 2**20
_T = 1e12

GPU_PRESETS: dict[str, GPUSpec] = {
    "A100-40GB": GPUSpec(
        name="A100-40GB", total_bytes=40_960 * _MiB, bf16_flops=312 * _T,
        hbm_bytes_per_s=1_555e9,
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB: 312 TFLOPS BF16 dense, "
               "1,555 GB/s HBM2); nvidia-smi memory.total 40,960 MiB"),
    "A100-80GB": GPUSpec(
        name="A100-80GB", total_bytes=81_920 * _MiB, bf16_flops=312 * _T,
        hbm_bytes_per_s=2_039e9,
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: 312 TFLOPS BF16 dense, "
               "2,039 GB/s HBM2e); nvidia-smi memory.total 81,920 MiB"),
    "H100-80GB": GPUSpec(
        name="H100-80GB", total_bytes=81_559 * _MiB, bf16_flops=989.4 * _T,
        hbm_bytes_per_s=3.35e12,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5: 1,979 TFLOPS BF16 with "
               "sparsity = 989.4 dense, 3.35 TB/s HBM3); nvidia-smi memory.total 81,559 MiB"),
    "H200-141GB": GPUSpec(
        name="H200-141GB", total_bytes=143_771 * _MiB, bf16_flops=989.4 * _T,
        hbm_bytes_per_s=4.8e12,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM: 1,979 TFLOPS BF16 with "
               "sparsity = 989.4 dense, 4.8 TB/s HBM3e, 141 GB); nvidia-smi memory.total "
               "143,771 MiB"),
    "L40S": GPUSpec(
        name="L40S", total_bytes=46_068 * _MiB, bf16_flops=362.05 * _T,
        hbm_bytes_per_s=864e9,
        source="NVIDIA L40S datasheet (362.05 TFLOPS BF16 dense, 733 with sparsity; "
               "48 GB GDDR6, 864 GB/s); nvidia-smi memory.total 46,068 MiB"),
    "T4": GPUSpec(
        name="T4", total_bytes=15_360 * _MiB, bf16_flops=65 * _T, hbm_bytes_per_s=320e9,
        source="NVIDIA T4 Tensor Core GPU datasheet (65 TFLOPS FP16 mixed precision; "
               "Turing has no bf16, the fp16 figure is given; 16 GB GDDR6, 320 GB/s); "
               "nvidia-smi memory.total 15,360 MiB"),
    "RTX-3090": GPUSpec(
        name="RTX-3090", total_bytes=24_576 * _MiB, bf16_flops=71 * _T,
        hbm_bytes_per_s=936e9,
        source="NVIDIA Ampere GA102 GPU Architecture whitepaper (GeForce RTX 3090: 71 "
               "TFLOPS BF16 dense with FP32 accumulate; 24 GB GDDR6X, 936 GB/s); nvidia-smi "
               "memory.total 24,576 MiB"),
    "RTX-4090": GPUSpec(
        name="RTX-4090", total_bytes=24_564 * _MiB, bf16_flops=165.2 * _T,
        hbm_bytes_per_s=1_008e9,
        source="NVIDIA Ada Lovelace GPU Architecture whitepaper, appendix table "
               "(GeForce RTX 4090: 165.2 TFLOPS BF16 dense with FP32 accumulate; 24 GB "
               "GDDR6X, 1,008 GB/s); nvidia-smi memory.total 24,564 MiB"),
    "B200": GPUSpec(
        name="B200", total_bytes=183_359 * _MiB, bf16_flops=2_250 * _T,
        hbm_bytes_per_s=8e12,
        source="NVIDIA HGX B200 datasheet (B200 SXM: 4.5 PFLOPS FP16/BF16 with sparsity "
               "= 2.25 dense, 8 TB/s HBM3e); nvidia-smi memory.total 183,359 MiB"),
}


def _lookup(table: dict, name: str, kind: str, field: str):
    key = str(name).lower()
    for k, v in table.items():
        if k.lower() == key:
            return v
    raise InputError(f"unknown {kind} {name!r}; presets: {', '.join(table)}", field=field)


def get_model(name_or_path) -> ModelSpec:
    """A model preset by name (case-insensitive), or a ``config.json`` (or its directory).

    Raises
    ------
    InputError
        Neither a preset name nor an existing path; lists the presets.
    """
    key = str(name_or_path)
    if key.lower() in {k.lower() for k in MODEL_PRESETS}:
        return _lookup(MODEL_PRESETS, key, "model", "model")
    p = Path(key)
    if p.exists() or key.endswith(".json"):
        return ModelSpec.from_hf_config(p)
    return _lookup(MODEL_PRESETS, key, "model", "model")


def get_gpu(name) -> GPUSpec:
    """A GPU preset by name (case-insensitive), or by its family alone when that names one
    preset (``H100`` is ``H100-80GB``; ``A100`` is refused: 40GB or 80GB).

    Raises
    ------
    InputError
        Unknown or ambiguous name; lists the presets (or the candidates).
    """
    key = str(name).lower()
    if key not in {k.lower() for k in GPU_PRESETS}:
        fam = [k for k in GPU_PRESETS if k.lower().split("-")[0] == key]
        if len(fam) == 1:
            return GPU_PRESETS[fam[0]]
        if len(fam) > 1:
            raise InputError(f"GPU {name!r} has several presets: {', '.join(fam)}; give one", field="gpu")
    return _lookup(GPU_PRESETS, name, "GPU", "gpu")
