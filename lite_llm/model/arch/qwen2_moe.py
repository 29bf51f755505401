"""Qwen2-MoE (HF Qwen2MoeForCausalLM, llama.cpp's "qwen2moe"; Qwen1.5-MoE, Qwen2-57B-A14B):
the Qwen2 decoder (q/k/v biases) whose MLP is num_experts routed experts of
moe_intermediate_size features (top num_experts_per_tok, renormalised when norm_topk_prob)
plus a shared expert of shared_expert_intermediate_size features that every token runs,
scaled by sigmoid(shared_expert_gate . x)."""
from __future__ import annotations

from functools import partial
from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama, moe, qwen

HF_ARCHITECTURES = ("Qwen2MoeForCausalLM",)
GGUF_ARCHITECTURES = {"qwen2moe": "Qwen2MoeForCausalLM"}
_MLP = partial(moe.hf_mlp, block="mlp.", names=("gate_proj", "up_proj", "down_proj"), shared="shared_expert")


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    # transformers' Qwen2-MoE slides the window on the even-numbered layers below max_window_layers
    window = qwen.window_fields(raw, lambda i, max_window_layers: i % 2 == 0 and i < max_window_layers)
    return llama.decoder_config(raw, arch, where, **window,
                                qkv_bias=bool(raw.get("qkv_bias", True)),
                                **moe.hf_fields(raw, where, ffn_key="moe_intermediate_size", norm_topk=None, shared=True))


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_hf_tensors(ckpt, config, mlp=_MLP)


def gguf_config(f, arch: str) -> ModelConfig:
    return llama.gguf_decoder_config(f, arch, GGUF_ARCHITECTURES[arch],
                                     **moe.gguf_fields(f, arch, norm_default=False, shared=True))


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_gguf_tensors(f, config, permuted=False, mlp=moe.gguf_mlp)
