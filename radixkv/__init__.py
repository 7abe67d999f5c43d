"""radixkv: replay LLM request traces through faithful models of vLLM's block-hash prefix
cache and SGLang's RadixAttention tree over a fixed-size GPU memory pool."""
__version__ = "0.1.0"
