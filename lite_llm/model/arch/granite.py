"""Granite (HF GraniteForCausalLM, llama.cpp's "granite" graph): the Llama decoder with four
multipliers: embeddings x embedding_multiplier, each sub-layer's output x residual_multiplier
before its residual add, attention_multiplier as the attention scale (not head_dim ** -0.5),
and logits / logits_scaling. llama.cpp's converter permutes q/k as for Llama."""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama

HF_ARCHITECTURES = ("GraniteForCausalLM",)
GGUF_ARCHITECTURES = {"granite": "GraniteForCausalLM"}


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    return llama.decoder_config(
        raw, arch, where,
        embedding_multiplier=float(raw.get("embedding_multiplier", 1.0)),
        residual_multiplier=float(raw.get("residual_multiplier", 1.0)),
        attention_multiplier=float(raw.get("attention_multiplier", 1.0)),
        logits_scaling=float(raw.get("logits_scaling", 1.0)))


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_hf_tensors(ckpt, config)


def gguf_config(f, arch: str) -> ModelConfig:
    meta = f.metadata
    return llama.gguf_decoder_config(
        f, arch, GGUF_ARCHITECTURES[arch],
        embedding_multiplier=float(meta.get(f"{arch}.embedding_scale", 1.0)),
        residual_multiplier=float(meta.get(f"{arch}.residual_scale", 1.0)),
        attention_multiplier=float(meta.get(f"{arch}.attention.scale", 1.0)),
        logits_scaling=float(meta.get(f"{arch}.logit_scale", 1.0)))


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_gguf_tensors(f, config, permuted=True)
