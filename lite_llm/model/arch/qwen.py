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


def window_fields(raw: dict, is_sliding=lambda i, max_window_layers: i >= max_window_layers) -> dict:
    """sliding_window and layer_types of a Qwen config with use_sliding_window: the layers
    config.json's layer_types names (transformers 5 writes them), else those is_sliding(i,
    max_window_layers) picks as transformers does (Qwen2 / Qwen3: i >= max_window_layers; its
    default 28); no window when no layer slides."""
    if not raw.get("use_sliding_window") or not raw.get("sliding_window"):
        return {"sliding_window": None}
    n = int(raw["num_hidden_layers"])
    types = tuple(raw.get("layer_types") or ("sliding_attention" if is_sliding(i, int(raw.get("max_window_layers", 28)))
                                             else "full_attention" for i in range(n)))
    if "sliding_attention" not in types:
        return {"sliding_window": None}
    return {"sliding_window": int(raw["sliding_window"]), "layer_types": types}


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    attention_bias = bool(raw.get("attention_bias", False))
    qwen2 = arch.startswith("Qwen2")
    extra = {"tie_word_embeddings": True} if arch.endswith("Model") else {}
    return llama.decoder_config(raw, arch, where, **window_fields(raw),
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
