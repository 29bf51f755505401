"""Mixtral (HF MixtralForCausalLM): the Mistral decoder whose MLP is num_local_experts gated
experts (w1 gate, w3 up, w2 down) of intermediate_size features, top num_experts_per_tok of
them per token, their softmax weights always renormalised over the chosen ones. llama.cpp files
it under its "llama" graph (q/k rows permuted) with llama.expert_count and ffn_*_exps tensors;
llama.py hands such files over to this module."""
from __future__ import annotations

from functools import partial
from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama, moe

HF_ARCHITECTURES = ("MixtralForCausalLM",)


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    sliding = raw.get("sliding_window")
    return llama.decoder_config(raw, arch, where, sliding_window=int(sliding) if sliding else None,
                                **moe.hf_fields(raw, where, ffn_key=None,
                                                norm_topk=True))


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    mlp = partial(moe.hf_mlp, block="block_sparse_moe.", names=("w1", "w3", "w2"))
    if "model.layers.0.mlp.gate.weight" in ckpt:      # transformers 5 module names
        mlp = partial(moe.hf_mlp, block="mlp.", names=("gate_proj", "up_proj", "down_proj"))
    return llama.decoder_hf_tensors(ckpt, config, mlp=mlp)


def gguf_config(f, arch: str) -> ModelConfig:
    return llama.gguf_decoder_config(f, arch, "MixtralForCausalLM",
                                     **moe.gguf_fields(f, arch, norm_default=True))


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_gguf_tensors(f, config, permuted=True, mlp=moe.gguf_mlp)
