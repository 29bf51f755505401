"""Phi-3 / Phi-3.5 / Phi-4-mini (HF Phi3ForCausalLM): the Llama decoder with fused qkv_proj and
gate_up_proj (split into q, k, v and gate, up at load), LongRoPE (rope_scaling type "longrope",
or "su" in older configs: short and long factors, lite_llm/model/rope.py says which is used),
partial rotary (partial_rotary_factor, Phi-4-mini), and a sliding window where the config sets one.
"""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama

HF_ARCHITECTURES = ("Phi3ForCausalLM",)


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
