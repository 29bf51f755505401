"""A tiny random LLaVA-1.5 built by transformers (CLIP ViT, 2-layer GELU projector, Llama), saved
three ways: the HF LlavaForConditionalGeneration directory, its language model as a llama.cpp
"llama" GGUF, and its vision side as a llama.cpp mmproj GGUF (clip.cpp's tensor names and keys);
and the language model once more as a GGUF whose vocabulary has no "<image>" (the llava-v1.5
files on the hub: the same token ids, id 3 named otherwise)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from conftest import ARCH_DEFAULTS, TINY_SPECIAL, cache_dir, gguf_from_hf, randomize_weights, tiny_hf_tokenizer, write_gguf

SPECIAL = TINY_SPECIAL + ["<image>"]
IMAGE = SPECIAL.index("<image>")
# 42 px of 14-px patches: 9 patches; 3 blocks, of which vision_feature_layer -2 runs 2
VISION = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=3,
              num_attention_heads=2, image_size=42, patch_size=14, hidden_act="quick_gelu", layer_norm_eps=1e-5,
              projection_dim=32)
TEXT = {k: v for k, v in ARCH_DEFAULTS["llama"].items() if k != "tie_word_embeddings"}
TEXT = dict(TEXT, model_type="llama", max_position_embeddings=256)

SPECIAL_WITHOUT_IMAGE = TINY_SPECIAL + ["<unused0>"]
_BUILT: dict[str, tuple[Path, Path, Path]] = {}


def llava_checkpoint(std: float = 0.05, seed: int = 0) -> tuple[Path, Path, Path]:
    """(HF directory, language model GGUF, mmproj GGUF) of one tiny random LLaVA."""
    key = f"{std}-{seed}"
    if key in _BUILT:
        return _BUILT[key]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration

    out = cache_dir("llava_")
    hf, lm = out / "hf", out / "lm"
    torch.manual_seed(seed)
    config = LlavaConfig(vision_config=dict(VISION), text_config=dict(TEXT), image_token_id=IMAGE,
                         vision_feature_layer=-2, vision_feature_select_strategy="default",
                         projector_hidden_act="gelu", tie_word_embeddings=False)
    model = LlavaForConditionalGeneration(config).eval()
    randomize_weights(model, std)
    model.save_pretrained(hf, safe_serialization=True)
    tok = tiny_hf_tokenizer(SPECIAL)
    tok.save_pretrained(hf)
    with open(hf / "preprocessor_config.json", "w") as fh:     # llava-1.5-hf's settings at this size
        json.dump({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 42},
                   "crop_size": {"height": 42, "width": 42}, "do_center_crop": True, "resample": 3,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711]}, fh)

    # the language model alone, as llama.cpp's converter would see it
    text = LlamaForCausalLM(LlamaConfig(**TEXT)).eval()
    text.model.load_state_dict(model.model.language_model.state_dict())
    text.lm_head.load_state_dict(model.lm_head.state_dict())
    text.save_pretrained(lm, safe_serialization=True)
    tok.save_pretrained(lm)
    lm_gguf = gguf_from_hf(lm, out / "llava-lm.gguf", "llama")
    mmproj = write_mmproj(hf, out / "mmproj.gguf")
    _BUILT[key] = (hf, lm_gguf, mmproj)
    return _BUILT[key]


def lm_gguf_without_image_token(std: float = 0.05, seed: int = 0) -> Path:
    """llava_checkpoint's language model as a GGUF whose vocabulary lacks "<image>"."""
    _, lm_gguf, _ = llava_checkpoint(std, seed)
    out = lm_gguf.parent / "llava-lm-no-image.gguf"
    if out.exists():
        return out
    lm = lm_gguf.parent / "lm-no-image"
    shutil.copytree(lm_gguf.parent / "lm", lm)
    tiny_hf_tokenizer(SPECIAL_WITHOUT_IMAGE).save_pretrained(lm)
    return gguf_from_hf(lm, out, "llama")


def write_mmproj(hf: Path, path: Path) -> Path:
    """The vision tower and projector as llama.cpp's mmproj GGUF (F32), every stored block kept:
    clip.cpp runs block_count - 1 of them for a llava projector, as vision_feature_layer -2; no
    v.post_ln (llama.cpp's LLaVA converter leaves it out: clip.cpp would apply it)."""
    from safetensors.numpy import load_file
    sd = load_file(str(hf / "model.safetensors"))
    v = "vision_tower."          # as transformers 5 saves it (the hub's files add "vision_model.")
    t = {"v.patch_embd.weight": sd[v + "embeddings.patch_embedding.weight"],
         "v.class_embd": sd[v + "embeddings.class_embedding"],
         "v.position_embd.weight": sd[v + "embeddings.position_embedding.weight"],
         "v.pre_ln.weight": sd[v + "pre_layrnorm.weight"], "v.pre_ln.bias": sd[v + "pre_layrnorm.bias"]}
    for i in range(VISION["num_hidden_layers"]):
        p = f"{v}encoder.layers.{i}."
        for ours, theirs in (("ln1", "layer_norm1"), ("ln2", "layer_norm2"), ("attn_q", "self_attn.q_proj"),
                             ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
                             ("attn_out", "self_attn.out_proj"), ("ffn_up", "mlp.fc1"), ("ffn_down", "mlp.fc2")):
            for part in ("weight", "bias"):
                t[f"v.blk.{i}.{ours}.{part}"] = sd[f"{p}{theirs}.{part}"]
    for ours, theirs in (("mm.0", "linear_1"), ("mm.2", "linear_2")):
        for part in ("weight", "bias"):
            t[f"{ours}.{part}"] = sd[f"multi_modal_projector.{theirs}.{part}"]
    meta = {"clip.has_text_encoder": False, "clip.has_vision_encoder": True, "clip.has_llava_projector": True,
            "clip.projector_type": "mlp", "clip.use_gelu": False,
            "clip.vision.image_size": VISION["image_size"], "clip.vision.patch_size": VISION["patch_size"],
            "clip.vision.embedding_length": VISION["hidden_size"],
            "clip.vision.feed_forward_length": VISION["intermediate_size"],
            "clip.vision.projection_dim": VISION["projection_dim"],
            "clip.vision.attention.head_count": VISION["num_attention_heads"],
            "clip.vision.attention.layer_norm_epsilon": VISION["layer_norm_eps"],
            "clip.vision.block_count": VISION["num_hidden_layers"],
            "clip.vision.image_mean": [0.48145466, 0.4578275, 0.40821073],
            "clip.vision.image_std": [0.26862954, 0.26130258, 0.27577711],
            "general.file_type": 0, "general.name": "tiny llava mmproj"}
    return write_gguf(path, {k: (np.ascontiguousarray(a), None) for k, a in t.items()}, "clip", meta)
