"""Phi-3 / Phi-3.5 / Phi-4-mini (HF Phi3ForCausalLM): the Llama decoder with fused qkv_proj and
gate_up_proj (split into q, k, v and gate, up at load), LongRoPE (rope_scaling type "longrope",
or "su" in older configs: short and long factors, lite_llm/model/rope.py says which is used),
partial rotary (partial_rotary_factor, Phi-4-mini), and a sliding window where the config sets one.
"""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.files import ModelLoadError

HF_ARCHITECTURES = ("Phi3ForCausalLM",)
GGUF_ARCHITECTURES = {"phi3": "Phi3ForCausalLM"}


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    theta, scaling = llama.rope(raw)
    if scaling is not None and scaling["rope_type"] == "su":
        scaling["rope_type"] = "longrope"
    if scaling is not None and scaling["rope_type"] == "longrope":
        scaling.setdefault("original_max_position_embeddings",
                           raw.get("original_max_position_embeddings") or raw["max_position_embeddings"])
    partial = float((scaling or {}).get("partial_rotary_factor", raw.get("partial_rotary_factor") or 1.0))
    sliding = raw.get("sliding_window")
    return llama.decoder_config(raw, arch, where, rope_types=(*llama.ROPE_TYPES, "longrope", "su"),
                                rope_scaling=scaling, sliding_window=int(sliding) if sliding else None,
                                partial_rotary_factor=partial)


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_hf_tensors(ckpt, config, fused=True)


def gguf_config(f, arch: str) -> ModelConfig:
    """llama.cpp's "phi3" graph: LongRoPE factors as the tensors rope_factors_long / _short,
    phi3.rope.scaling.original_context_length and .attn_factor; rope.dimension_count < head_dim
    for partial rotary."""
    meta = f.metadata
    dim, heads = int(meta.get(f"{arch}.embedding_length", 0)), int(meta.get(f"{arch}.attention.head_count", 1))
    head_dim = int(meta.get(f"{arch}.attention.key_length", 0)) or dim // heads
    rot = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    scaling = None
    if "rope_factors_long.weight" in f.tensors:
        original = meta.get(f"{arch}.rope.scaling.original_context_length")
        if original is None:
            raise ModelLoadError(f"{f.path}: LongRoPE factors without {arch}.rope.scaling.original_context_length")
        scaling = {"rope_type": "longrope", "original_max_position_embeddings": int(original),
                   "long_factor": f.read("rope_factors_long.weight").tolist(),
                   "short_factor": f.read("rope_factors_short.weight").tolist()}
        if meta.get(f"{arch}.rope.scaling.attn_factor") is not None:
            scaling["attention_factor"] = float(meta[f"{arch}.rope.scaling.attn_factor"])
    window = meta.get(f"{arch}.attention.sliding_window")
    return llama.gguf_decoder_config(f, arch, GGUF_ARCHITECTURES[arch], head_dim=head_dim,
                                     partial_rotary_factor=rot / head_dim, rope_scaling=scaling,
                                     sliding_window=int(window) if window else None)


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_gguf_tensors(f, config, permuted=False, fused=True)
