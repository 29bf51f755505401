"""LLaVA's language model (HF LlavaForConditionalGeneration): a Llama decoder under
language_model.* (the layout the hub's llava-hf checkpoints and transformers' save_pretrained
write; model.language_model.* + lm_head.* too). The CLIP tower and projector ("vision_tower.*",
"multi_modal_projector.*") are not decoder tensors: lite_llm/multimodal/llava.py reads them. As
a GGUF, LLaVA's language model is a plain "llama" file beside an mmproj file."""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.arch.qwen2_vl import text_config
from lite_llm.model.files import ModelLoadError

HF_ARCHITECTURES = ("LlavaForConditionalGeneration",)
# file tensors left unread (arch/__init__.py unread_tensors): (pattern, reason)
HF_UNREAD = ((r"(?:model\.)?(?:vision_tower|multi_modal_projector)\..+",
              "the image encoder and its projector: lite_llm/multimodal/llava.py reads them (when images are served), not the decoder"),)


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    text = text_config(raw)
    model_type = text.get("model_type", "llama")
    if model_type not in ("llama", "mistral"):
        raise ModelLoadError(f"{where}: {arch} with a {model_type!r} language model is not supported (llama is)")
    return llama.decoder_config(text, arch, where)


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    if "language_model.model.embed_tokens.weight" in ckpt:
        return llama.decoder_hf_tensors(ckpt, config, prefix="language_model.model.",
                                        lm_head="language_model.lm_head.weight")
    if "model.language_model.embed_tokens.weight" in ckpt:
        return llama.decoder_hf_tensors(ckpt, config, prefix="model.language_model.")
    raise ModelLoadError(f"{config.architecture}: no language_model.model.embed_tokens.weight: not a LLaVA checkpoint")
