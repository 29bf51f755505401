"""A tiny random Gemma 3 vision-language model built by transformers (SigLIP tower, Gemma 3's
projector, the Gemma 3 text model of tests/conftest.py: sliding layers beside global ones),
with a tokenizer holding the model's image tokens and single tokens for runs of newlines, as
Gemma's vocabulary has them (Gemma3Processor's "\\n\\n" merges with its neighbours); and the same
model as llama.cpp and Ollama users have it: a "gemma3" GGUF language model beside an mmproj GGUF
written as convert_hf_to_gguf.py's Gemma3VisionModel writes it (gemma3_gguf_pair)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from conftest import ARCH_DEFAULTS, TINY_SPECIAL, cache_dir, gguf_from_hf, randomize_weights, tiny_hf_tokenizer, write_gguf

IMAGE_SPECIAL = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
NEWLINES = ["\n\n", "\n\n\n", "\n\n\n\n"]
SPECIAL = TINY_SPECIAL + IMAGE_SPECIAL + NEWLINES
BOI, EOI, IMAGE = (SPECIAL.index(t) for t in IMAGE_SPECIAL)
NL2, NL3, NL4 = (SPECIAL.index(t) for t in NEWLINES)
# 84 px of 14-px patches: a 6 x 6 grid pooled 2 x 2 -> 9 image tokens; the text model's sliding
# window (6) is shorter than an image, so the window and the image's bidirectional span both bite
VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, image_size=84,
              patch_size=14, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=False)
TOKENS_PER_IMAGE = 9
TEXT = dict(copy.deepcopy(ARCH_DEFAULTS["gemma3"]), sliding_window=6, max_position_embeddings=256)

_BUILT: dict[str, Path] = {}


def gemma3_checkpoint(std: float = 0.05, seed: int = 0, **text) -> Path:
    """The HF Gemma3ForConditionalGeneration directory of one tiny random model (text: fields of
    its text config changed)."""
    key = f"{std}-{seed}-{sorted(text.items())}"
    if key in _BUILT:
        return _BUILT[key]
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    out = cache_dir("gemma3_vl_")
    torch.manual_seed(seed)
    config = Gemma3Config(text_config=dict(copy.deepcopy(TEXT), **text), vision_config=dict(VISION),
                          mm_tokens_per_image=TOKENS_PER_IMAGE, boi_token_index=BOI, eoi_token_index=EOI,
                          image_token_index=IMAGE, tie_word_embeddings=True)
    model = Gemma3ForConditionalGeneration(config).eval()
    # Gemma's RMSNorms scale by (1 + w); the tower's LayerNorms by w
    randomize_weights(model, std, norm_low=lambda name: 0.5 if "vision_tower" in name else -0.5)
    model.save_pretrained(out, safe_serialization=True)
    tok = tiny_hf_tokenizer(SPECIAL, extra_special_tokens={"boi_token": "<start_of_image>",
                                                           "eoi_token": "<end_of_image>",
                                                           "image_token": "<image_soft_token>"})
    tok.save_pretrained(out)
    with open(out / "preprocessor_config.json", "w") as fh:   # gemma-3-4b-it's settings at this size
        json.dump({"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 84, "width": 84},
                   "resample": 2, "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
                   "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                   "do_convert_rgb": None, "do_pan_and_scan": None}, fh)
    _BUILT[key] = out
    return out


def gemma3_gguf_pair(std: float = 0.05, seed: int = 0) -> tuple[Path, Path, Path]:
    """(HF directory, "gemma3" language model GGUF, mmproj GGUF) of one tiny random Gemma 3. Its
    query_pre_attn_scalar is head_dim, as in the released models: llama.cpp's gemma3 graph
    scales attention by head_dim ** -0.5 (no GGUF key carries the scalar)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    hf = gemma3_checkpoint(std, seed, query_pre_attn_scalar=TEXT["head_dim"])
    lm_gguf, mmproj = hf / "gemma3-lm.gguf", hf / "mmproj-gemma3.gguf"
    if lm_gguf.exists() and mmproj.exists():
        return hf, lm_gguf, mmproj
    # the language model alone, as llama.cpp's converter sees a Gemma3ForConditionalGeneration
    from transformers import Gemma3ForConditionalGeneration
    model = Gemma3ForConditionalGeneration.from_pretrained(hf, dtype=torch.float32).eval()
    text = Gemma3ForCausalLM(Gemma3TextConfig(**model.config.text_config.to_dict())).eval()
    text.model.load_state_dict(model.model.language_model.state_dict())
    lm = hf / "lm"
    text.save_pretrained(lm, safe_serialization=True)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (lm / name).write_bytes((hf / name).read_bytes())
    # Gemma's newline runs are ordinary vocabulary entries: user-defined tokens in the GGUF (as
    # llama.cpp's converter writes added tokens that are not special), so text finds them
    tok = json.loads((hf / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:
        if added["content"] in NEWLINES:
            added["special"] = False
    (lm / "tokenizer.json").write_text(json.dumps(tok))
    gguf_from_hf(lm, lm_gguf, "gemma3")
    write_gemma3_mmproj(hf, mmproj)
    return hf, lm_gguf, mmproj


def write_gemma3_mmproj(hf: Path, path: Path, projection_f16: bool = False) -> Path:
    """The SigLIP tower and Gemma 3's projector as convert_hf_to_gguf.py's Gemma3VisionModel
    writes them: names through gguf-py's own tensor map (v.*, mm.input_projection,
    mm.soft_emb_norm), mm.input_projection.weight kept [C, E] as HF stores it, the soft
    embedding norm with its + 1, the pooling kernel as clip.vision.projector.scale_factor
    (written because it is not 4). projection_f16: the projection as F16, as the converter
    forces it; F32 otherwise, for exact comparisons."""
    import gguf
    from gguf.tensor_mapping import get_tensor_name_map
    from safetensors.numpy import load_file
    sd = load_file(str(hf / "model.safetensors"))
    names = get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, VISION["num_hidden_layers"])
    tensors = {}
    for key, value in sd.items():
        if not key.startswith(("vision_tower.", "multi_modal_projector.")):
            continue
        # the converter's names: the hub layout (vision_tower.vision_model.*), "_weight" -> ".weight"
        key = key.replace("vision_tower.", "vision_tower.vision_model.", 1).replace("_weight", ".weight")
        base, part = key.rsplit(".", 1)
        mapped = names.get_name(base)
        assert mapped is not None, key
        if mapped == "mm.soft_emb_norm":
            value = value + np.float32(1.0)
        if mapped == "mm.input_projection" and projection_f16:
            value = value.astype(np.float16)
        tensors[f"{mapped}.{part}"] = (np.ascontiguousarray(value), None)
    side = VISION["image_size"] // VISION["patch_size"]
    meta = {"clip.has_vision_encoder": True, "clip.projector_type": "gemma3", "clip.use_gelu": True,
            "clip.vision.image_size": VISION["image_size"], "clip.vision.patch_size": VISION["patch_size"],
            "clip.vision.embedding_length": VISION["hidden_size"],
            "clip.vision.feed_forward_length": VISION["intermediate_size"],
            "clip.vision.projection_dim": TEXT["hidden_size"],
            "clip.vision.block_count": VISION["num_hidden_layers"],
            "clip.vision.attention.head_count": VISION["num_attention_heads"],
            "clip.vision.attention.layer_norm_epsilon": VISION["layer_norm_eps"],
            "clip.vision.image_mean": [0.5, 0.5, 0.5], "clip.vision.image_std": [0.5, 0.5, 0.5],
            "clip.vision.projector.scale_factor": side // int(TOKENS_PER_IMAGE ** 0.5),
            "general.file_type": 0, "general.name": "tiny gemma3 mmproj"}
    return write_gguf(path, tensors, "clip", meta)


def gemma3_pan_and_scan_checkpoint(std: float = 0.05, seed: int = 0) -> Path:
    """gemma3_checkpoint's model with pan-and-scan turned on in its preprocessor config, crops as
    small as 20 px (the tiny tower takes 84 px) and at most 3 of them."""
    import shutil
    src = gemma3_checkpoint(std, seed)
    out = src.parent / (src.name + "-pas")
    if not out.exists():
        shutil.copytree(src, out)
        pre = json.loads((out / "preprocessor_config.json").read_text())
        pre.update(do_pan_and_scan=True, pan_and_scan_min_crop_size=20, pan_and_scan_max_num_crops=3,
                   pan_and_scan_min_ratio_to_activate=1.2)
        (out / "preprocessor_config.json").write_text(json.dumps(pre))
    return out
