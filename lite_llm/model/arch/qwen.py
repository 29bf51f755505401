"""Qwen2 (q/k/v biases) and Qwen3 (q/k RMSNorm per head): the Llama decoder with those flags;
llama.cpp's "qwen2" and "qwen3" graphs keep q/k rows in HF order (no permutation)."""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama

# Qwen2Model / Qwen3Model: the bare decoders embedding models ship (Qwen3-Embedding, gte-Qwen2),
# without an LM head (the tied embedding stands in for the one nobody calls)
HF_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2Model", "Qwen3Model")
GGUF_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    sliding = raw.get("sliding_window") if raw.get("use_sliding_window") else None
    attention_bias = bool(raw.get("attention_bias", False))
    qwen2 = arch.startswith("Qwen2")
    extra = {"tie_word_embeddings": True} if arch.endswith("Model") else {}
    return llama.decoder_config(raw, arch, where, sliding_window=int(sliding) if sliding else None,
                                qkv_bias=qwen2 or attention_bias, o_bias=attention_bias and not qwen2,
                                qk_norm=arch.startswith("Qwen3"), **extra)


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    # a bare Qwen*Model saved alone has no "model." prefix
    prefix = "model." if "model.embed_tokens.weight" in ckpt else ""
    return llama.decoder_hf_tensors(ckpt, config, prefix=prefix)


def gguf_config(f, arch: str) -> ModelConfig:
    return llama.gguf_decoder_config(f, arch, GGUF_ARCHITECTURES[arch])


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_gguf_tensors(f, config, permuted=False)
