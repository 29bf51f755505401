"""Qwen2.5-VL's language model (HF Qwen2_5_VLForConditionalGeneration): the Qwen2 decoder
(q/k/v biases) with multimodal RoPE, whose mrope_section splits each head's frequency pairs
between a token's temporal, height and width positions. The vision tower ("visual.*") is not
a decoder tensor: lite_llm/multimodal/qwen2_5_vl.py reads it."""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.files import ModelLoadError

HF_ARCHITECTURES = ("Qwen2_5_VLForConditionalGeneration",)
# file tensors left unread (arch/__init__.py unread_tensors): (pattern, reason)
HF_UNREAD = ((r"(?:model\.)?visual\..+",
              "the vision tower: lite_llm/multimodal/qwen2_5_vl.py reads it (when images are served), not the decoder"),)


def text_config(raw: dict) -> dict:
    """The language model's fields: text_config (transformers >= 4.52) over the top level
    (older files keep them there), tie_word_embeddings from the top level where it is set."""
    text = {**raw, **(raw.get("text_config") or {})}
    if "tie_word_embeddings" in raw:
        text["tie_word_embeddings"] = raw["tie_word_embeddings"]
    return text


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    text = text_config(raw)
    params = dict(text.get("rope_scaling") or text.get("rope_parameters") or {})
    section = params.get("mrope_section")
    if not section or len(section) != 3:
        raise ModelLoadError(f"{where}: {arch} needs rope mrope_section [t, h, w]")
    # "mrope" is the position layout, not a frequency scaling: the frequencies are the default ones
    text["rope_scaling"] = {"rope_theta": params.get("rope_theta", text.get("rope_theta", 1000000.0)),
                            "rope_type": "default"}
    text.pop("rope_parameters", None)
    return llama.decoder_config(text, arch, where, qkv_bias=True, o_bias=False,
                                mrope_section=tuple(int(s) for s in section))


def _prefix(ckpt) -> str:
    return "model.language_model." if "model.language_model.embed_tokens.weight" in ckpt else "model."


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return llama.decoder_hf_tensors(ckpt, config, prefix=_prefix(ckpt))
