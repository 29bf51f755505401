"""Qwen3-MoE (HF Qwen3MoeForCausalLM, llama.cpp's "qwen3moe"): the Qwen3 decoder (q/k RMSNorm)
whose MLP is num_experts gated experts of moe_intermediate_size features, top
num_experts_per_tok per token, renormalised when norm_topk_prob (the released models: true;
llama.cpp's qwen3moe graph always renormalises unless expert_weights_norm says otherwise)."""
from __future__ import annotations

from functools import partial
from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama, moe

HF_ARCHITECTURES = ("Qwen3MoeForCausalLM",)
GGUF_ARCHITECTURES = {"qwen3moe": "Qwen3MoeForCausalLM"}
_MLP = partial(moe.hf_mlp, block="mlp.", names=("gate_proj", "up_proj", "down_proj"))


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    sliding = raw.get("sliding_window") if raw.get("use_sliding_window") else None
    attention_bias = bool(raw.get("attention_bias", False))
    return llama.decoder_config(raw, arch, where, sliding_window=int(sliding) if sliding else None,
                                qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True,
                                **moe.hf_fields(raw, where, ffn_key="moe_intermediate_size", norm_topk=None))


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_hf_tensors(ckpt, config, mlp=_MLP)


def gguf_config(f, arch: str) -> ModelConfig:
    return llama.gguf_decoder_config(f, arch, GGUF_ARCHITECTURES[arch], **moe.gguf_fields(f, arch, norm_default=True))


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_gguf_tensors(f, config, permuted=False, mlp=moe.gguf_mlp)
