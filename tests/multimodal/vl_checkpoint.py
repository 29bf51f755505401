"""A tiny random Qwen2.5-VL checkpoint built by transformers, with a tokenizer holding the
model's vision special tokens, a few test images (PIL), and the scheduled-chunk stand-ins
VisionRunner.step_inputs reads."""
from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from conftest import TINY_SPECIAL, TINY_VOCAB, cache_dir, randomize_weights, tiny_hf_tokenizer


class Chunk(NamedTuple):     # what VisionRunner.step_inputs reads of a scheduled chunk
    request: object
    start: int
    num_new_tokens: int


class Req(NamedTuple):       # ... and of its request
    mm: object

VISION_SPECIAL = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
SPECIAL = TINY_SPECIAL + VISION_SPECIAL
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = (SPECIAL.index(t) for t in VISION_SPECIAL)
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"

QWEN2_5_VL = dict(
    text_config=dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=0, eos_token_id=2,
                     rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
    # window 56 px = 2x2 merge units per window: 28x84 and 84x56 images have several windows
    vision_config=dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                       patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                       fullatt_block_indexes=[1, 3]),
    image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
    vision_end_token_id=VISION_END, tie_word_embeddings=False)

_BUILT: dict[str, Path] = {}


def qwen2_5_vl_checkpoint(std: float = 0.05, seed: int = 0, window_size: int = 56) -> Path:
    """QWEN2_5_VL's checkpoint (its windows of window_size pixels) with the tokenizer and processor
    settings, built once per argument set."""
    key = f"{std}-{seed}-{window_size}"
    if key in _BUILT:
        return _BUILT[key]
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    out = cache_dir("qwen2_5_vl_")
    torch.manual_seed(seed)
    config = json.loads(json.dumps(QWEN2_5_VL))
    config["vision_config"]["window_size"] = window_size
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**config)).eval()
    randomize_weights(model, std, is_norm=lambda name: "norm" in name or "ln_q" in name)
    model.save_pretrained(out, safe_serialization=True)
    tiny_hf_tokenizer(SPECIAL).save_pretrained(out)
    with open(out / "preprocessor_config.json", "w") as fh:   # the released model's processor settings
        json.dump({"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 56 * 56,
                   "max_pixels": 28 * 28 * 1280, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711]}, fh)
    _BUILT[key] = out
    return out


def flat_png(width: int, height: int, channels: int = 3) -> bytes:
    """A PNG of one flat colour (8-bit gray or RGB), written row by row without decoding it: a
    7070x7070 one is ~150 KB of file and 150 MB of RGB pixels once decoded (a pixel bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row, z = bytes(1 + width * channels), zlib.compressobj(9)
    idat = b"".join([z.compress(row) for _ in range(height)] + [z.flush()])
    head = struct.pack(">IIBBBBB", width, height, 8, 2 if channels == 3 else 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def image(width: int, height: int, seed: int):
    """A smooth random RGB picture (gradients and noise: resizing has work to do)."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], axis=-1)
    pixels = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")
