"""A tiny random Gemma 3 vision-language model built by transformers (SigLIP tower, Gemma 3's
projector, the Gemma 3 text model of tests/conftest.py: sliding layers beside global ones),
with a tokenizer holding the model's image tokens and single tokens for runs of newlines, as
Gemma's vocabulary has them (Gemma3Processor's "\\n\\n" merges with its neighbours)."""
from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

from conftest import ARCH_DEFAULTS, TINY_CHAT_TEMPLATE, TINY_SPECIAL, tiny_tokenizer_json

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


def gemma3_checkpoint(std: float = 0.05, seed: int = 0) -> Path:
    """The HF Gemma3ForConditionalGeneration directory of one tiny random model."""
    key = f"{std}-{seed}"
    if key in _BUILT:
        return _BUILT[key]
    import torch
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, PreTrainedTokenizerFast

    out = Path(tempfile.mkdtemp(prefix="lite_llm_gemma3_vl_"))
    torch.manual_seed(seed)
    config = Gemma3Config(text_config=copy.deepcopy(TEXT), vision_config=dict(VISION),
                          mm_tokens_per_image=TOKENS_PER_IMAGE, boi_token_index=BOI, eoi_token_index=EOI,
                          image_token_index=IMAGE, tie_word_embeddings=True)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std if "patch_embedding" not in name else 0.02)
            elif "norm" in name and name.endswith("weight"):
                # Gemma's RMSNorms scale by (1 + w); the tower's LayerNorms by w
                p.uniform_(-0.5, 0.5) if "vision_tower" not in name else p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, std)
    model.save_pretrained(out, safe_serialization=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=HFTokenizer.from_str(tiny_tokenizer_json(SPECIAL)),
                                  bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token=None, extra_special_tokens={"boi_token": "<start_of_image>",
                                                                        "eoi_token": "<end_of_image>",
                                                                        "image_token": "<image_soft_token>"})
    tok.chat_template = TINY_CHAT_TEMPLATE
    tok.save_pretrained(out)
    with open(out / "preprocessor_config.json", "w") as fh:   # gemma-3-4b-it's settings at this size
        json.dump({"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 84, "width": 84},
                   "resample": 2, "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
                   "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                   "do_convert_rgb": None, "do_pan_and_scan": None}, fh)
    _BUILT[key] = out
    return out
