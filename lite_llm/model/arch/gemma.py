"""Gemma 2 and Gemma 3 (text): the Llama decoder with embeddings x sqrt(dim), RMSNorm of
(1 + w) (the 1 is added to the weights at load; llama.cpp's converter stores it added), four
norms per layer (before and after attention and the MLP), GeGLU (gelu tanh), tied embeddings,
an attention scale of query_pre_attn_scalar ** -0.5, and sliding-window layers alternating
with global ones. Gemma 2: attention and final logit soft-capping. Gemma 3: q/k norm, and the
sliding layers' own RoPE base (rope_local_base_freq, 10k) beside the global one (1M, with
linear scaling in the larger models); no attention soft-capping (transformers' Gemma 3 ignores
attn_logit_softcapping).

HF names: model.layers.{i}.{input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
post_feedforward_layernorm}; llama.cpp (gemma2 / gemma3 graphs): blk.{i}.{attn_norm,
post_attention_norm, ffn_norm, post_ffw_norm}. Gemma3ForConditionalGeneration's language model
is the Gemma 3 decoder under model.language_model.* (transformers 5) or language_model.model.*
(the hub's files), its fields in text_config; the SigLIP tower and projector are
lite_llm/multimodal/gemma3.py's.
"""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.arch.qwen2_vl import text_config
from lite_llm.model.files import ModelLoadError

HF_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
GGUF_ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}


def HF_UNREAD(config: ModelConfig) -> tuple[tuple[str, str], ...]:
    """File tensors left unread (arch/__init__.py unread_tensors): Gemma 3 vision's image encoder."""
    if config.architecture != "Gemma3ForConditionalGeneration":
        return ()
    return ((r"(?:model\.)?(?:vision_tower|multi_modal_projector)\..+",
             "the image encoder and its projector: lite_llm/multimodal/gemma3.py reads them (when images are "
             "served), not the decoder"),)
_HF_NORMS = (("post_attn_norm", "post_attention_layernorm"), ("mlp_norm", "pre_feedforward_layernorm"),
             ("post_mlp_norm", "post_feedforward_layernorm"))
_GGUF_NORMS = (("post_attn_norm", "post_attention_norm"), ("post_mlp_norm", "post_ffw_norm"))
_SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6}    # every n-th layer is global (llama.cpp's default)


def _layer_types(num_layers: int, pattern: int) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers))


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    if arch == "Gemma3ForConditionalGeneration":
        raw = text_config(raw)
    gemma3 = arch in ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
    num_layers = int(raw["num_hidden_layers"])
    layer_types = tuple(raw.get("layer_types") or ())
    if not layer_types:
        pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or (6 if gemma3 else 2)
        layer_types = _layer_types(num_layers, int(pattern))
    if len(layer_types) != num_layers or not set(layer_types) <= {"sliding_attention", "full_attention"}:
        raise ModelLoadError(f"{where}: layer_types {list(layer_types)} do not name {num_layers} layers "
                             "as sliding_attention / full_attention")
    local_theta = None
    if gemma3:
        local_theta, local_scaling = llama.rope(raw, "sliding_attention")
        local_theta = float(raw.get("rope_local_base_freq") or local_theta)
        if local_scaling is not None and "rope_local_base_freq" not in raw:
            raise ModelLoadError(f"{where}: rope scaling of Gemma 3's sliding layers is not supported")
    # transformers' Gemma 3 keeps attn_logit_softcapping in its config but never applies it
    attn_cap = raw.get("attn_logit_softcapping") if not gemma3 else None
    return llama.decoder_config(
        raw, arch, where,
        act=llama.activation(raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh", where),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        qk_norm=gemma3,
        sliding_window=int(raw["sliding_window"]) if raw.get("sliding_window") else None,
        layer_types=layer_types,
        rope_local_theta=local_theta,
        embed_scale=True,
        post_norms=True,
        query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar") or 0) or None,
        attn_softcap=float(attn_cap) if attn_cap else None,
        final_softcap=float(raw["final_logit_softcapping"]) if raw.get("final_logit_softcapping") else None,
    )


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    if config.architecture != "Gemma3ForConditionalGeneration":
        return llama.decoder_hf_tensors(ckpt, config, norm_offset=1.0, extra_norms=_HF_NORMS)
    if "model.language_model.embed_tokens.weight" in ckpt:
        return llama.decoder_hf_tensors(ckpt, config, prefix="model.language_model.", norm_offset=1.0,
                                        extra_norms=_HF_NORMS)
    if "language_model.model.embed_tokens.weight" in ckpt:
        return llama.decoder_hf_tensors(ckpt, config, prefix="language_model.model.", norm_offset=1.0,
                                        extra_norms=_HF_NORMS, lm_head="language_model.lm_head.weight")
    raise ModelLoadError(f"{config.architecture}: no model.language_model.embed_tokens.weight: "
                         "not a Gemma 3 vision checkpoint")


def gguf_config(f, arch: str) -> ModelConfig:
    meta = f.metadata

    def value(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    num_layers = int(value("block_count", 0))
    # llama.cpp: a period (every n-th layer global) or one flag per layer (non-zero: sliding)
    pattern = value("attention.sliding_window_pattern", _SLIDING_PATTERN[arch])
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ModelLoadError(f"{f.path}: {arch}.attention.sliding_window_pattern has {len(pattern)} "
                                 f"entries for {num_layers} layers")
        layer_types = tuple("sliding_attention" if p else "full_attention" for p in pattern)
    else:
        layer_types = _layer_types(num_layers, int(pattern))
    attn_cap = value("attn_logit_softcapping")
    final_cap = value("final_logit_softcapping")
    window = value("attention.sliding_window")
    return llama.gguf_decoder_config(
        f, arch, GGUF_ARCHITECTURES[arch], act="gelu_tanh",
        sliding_window=int(window) if window else None,
        layer_types=layer_types,
        rope_local_theta=float(value("rope.freq_base_swa", 10000.0)) if arch == "gemma3" else None,
        embed_scale=True, post_norms=True,
        attn_softcap=float(attn_cap) if attn_cap else None,
        final_softcap=float(final_cap) if final_cap else None)


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_gguf_tensors(f, config, permuted=False, extra_norms=_GGUF_NORMS)
