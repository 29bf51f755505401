"""Gemma 3's image side (HF Gemma3ForConditionalGeneration): preprocessing as transformers'
Gemma3ImageProcessor (PIL backend, the "slow" one; with pan-and-scan crops when the config turns
them on: pan_and_scan, with_crops), the SigLIP vision tower, the multimodal projector, and the placeholder expansion of Gemma3Processor. The
language model is the Gemma 3 decoder (arch/gemma.py); what it adds for images is that an
image's tokens see each other in both directions (VisionRunner gives each image token its
image's last position as its attention limit: forward()'s attn_positions).

    image --resize to S x S (bilinear)--> /255, mean/std --> patches [N, 3 P P], N = (S / P)^2
    patches @ patch^T + b + position_embedding -> [N, C]     (no class row, no pre-norm)
    L x [x += attn(ln1(x)) (bidirectional), x += fc2(gelu_tanh(fc1(ln2(x))))], post_layernorm
    projector: avg-pool k x k over the (S / P)^2 grid -> [mm_tokens_per_image, C], RMSNorm (1 + w),
               @ mm_input_projection_weight [C, E] -> [mm_tokens_per_image, E]
    prompt: each <start_of_image> -> "\\n\\n" <start_of_image> mm_tokens x <image_soft_token>
            <end_of_image> "\\n\\n"   (newline tokens merged with neighbouring ones, as the text
            tokenizer would see the expanded text)

The same model from a Gemma 3 GGUF language model and its llama.cpp mmproj file: read_mmproj
(the layout is described there).

SiglipEncoder.encode_many runs tower and projector as one compiled call over several images
(kernels.clip_forward, lite_llm/_kernels/vision.pxi, shared with LLaVA's CLIP tower);
encode_reference is the NumPy float32 spec it is tested against.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from lite_llm.model.gguf import GGUFFile
from lite_llm.model.hf import SafetensorsCheckpoint
from lite_llm.model.tokenizer import Tokenizer
from lite_llm.multimodal.llava import (
    ClipEncoder,
    _layernorm,
    check_vit,
    hf_vit_blocks,
    mmproj_blocks,
    mmproj_file,
    pack_vit_blocks,
    vit_blocks_reference,
    vit_packer,
)
from lite_llm.multimodal.qwen2_5_vl import _gelu
from lite_llm.multimodal.towers import float_tensors

HF_ARCHITECTURES = ("Gemma3ForConditionalGeneration",)
MAX_NEWLINES = 31               # Gemma's vocabulary holds runs of 1..31 newlines as single tokens
# Gemma3Processor's text around an image's pan-and-scan crops (replace_image_token)
PAS_INTRO = "Here is the original image "
PAS_CROPS = " and here are some crops to help you see better "


class Gemma3VisionError(ValueError):
    """A Gemma 3 vision checkpoint this module cannot run, with the reason."""


@dataclass(frozen=True)
class PanAndScan:
    """Gemma3ImageProcessor's pan-and-scan settings (its processor's defaults where the file has
    null) and the token ids of the text Gemma3Processor writes around the crops."""
    min_crop_size: int = 256
    max_num_crops: int = 4
    min_ratio_to_activate: float = 1.2
    intro_ids: tuple[int, ...] = ()     # "Here is the original image "
    crops_ids: tuple[int, ...] = ()     # " and here are some crops to help you see better "
    space_ids: tuple[int, ...] = ()     # " " between two crops


@dataclass(frozen=True)
class SiglipConfig:
    image_size: int             # S: every image is resized to S x S
    patch_size: int             # P
    hidden_size: int            # C
    intermediate_size: int      # F
    num_heads: int
    num_layers: int             # L
    out_dim: int                # E of the language model
    mm_tokens_per_image: int    # rows per image after the pooling
    eps: float = 1e-6           # the tower's LayerNorms and the projector's RMSNorm
    act: str = "gelu_tanh"
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 2           # PIL's BILINEAR
    image_token_id: int = 262144
    boi_token_id: int = 255999
    eoi_token_id: int = 256000
    newline_ids: tuple[int, ...] = ()   # newline_ids[k - 1]: the token of k newlines (-1: none)
    pan_and_scan: PanAndScan | None = None   # do_pan_and_scan: crops of a long image beside it

    @property
    def side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.side ** 2

    @property
    def pool(self) -> int:
        """The projector's average-pooling kernel (and stride)."""
        return self.side // math.isqrt(self.mm_tokens_per_image)

    @property
    def num_image_tokens(self) -> int:
        return self.mm_tokens_per_image


_ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def newline_ids(source: str) -> tuple[int, ...]:
    """Ids of the tokens that are runs of 1..MAX_NEWLINES newlines in the tokenizer at source (a
    directory or a GGUF file; -1 where the run is not one token)."""
    try:
        if os.path.isfile(source):
            f = GGUFFile(source)
            try:
                tok = Tokenizer.from_gguf_metadata(f.metadata)
            finally:
                f.close()
        else:
            tok = Tokenizer.from_dir(source)
    except Exception:   # no tokenizer: the expansion's newlines stay as they are inserted
        return ()
    out = []
    for k in range(1, MAX_NEWLINES + 1):
        ids = tok.encode("\n" * k, add_special_tokens=False)
        out.append(ids[0] if len(ids) == 1 else -1)
    return tuple(out)


def config(source: str, raw: dict) -> SiglipConfig:
    """SiglipConfig of an HF Gemma3ForConditionalGeneration directory (config.json as `raw`)."""
    where = os.path.join(source, "config.json")
    v = raw.get("vision_config") or {}
    if v.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise Gemma3VisionError(f"{where}: vision tower {v.get('model_type')!r} is not supported (SigLIP is)")
    act = v.get("hidden_act", "gelu_pytorch_tanh")
    if act not in _ACTS:
        raise Gemma3VisionError(f"{where}: vision hidden_act {act!r} is not supported")
    pre = _read_json(os.path.join(source, "preprocessor_config.json"))
    size = int(v.get("image_size", 224))
    want = pre.get("size") or {}
    if want and (int(want.get("height", size)) != size or int(want.get("width", size)) != size):
        raise Gemma3VisionError(f"{where}: the processor resizes to {want}, the vision tower takes {size}")
    text = raw.get("text_config") or {}
    tokens = int(raw.get("mm_tokens_per_image", 256))
    side = size // int(v.get("patch_size", 14))
    if math.isqrt(tokens) ** 2 != tokens or side % math.isqrt(tokens):
        raise Gemma3VisionError(f"{where}: mm_tokens_per_image {tokens} is not a square that divides the "
                                f"{side} x {side} patch grid")
    return SiglipConfig(
        image_size=size, patch_size=int(v.get("patch_size", 14)), hidden_size=int(v.get("hidden_size", 768)),
        intermediate_size=int(v.get("intermediate_size", 3072)), num_heads=int(v.get("num_attention_heads", 12)),
        num_layers=int(v.get("num_hidden_layers", 12)), out_dim=int(text.get("hidden_size", 2304)),
        mm_tokens_per_image=tokens, eps=float(v.get("layer_norm_eps", 1e-6)), act=_ACTS[act],
        image_mean=tuple(pre.get("image_mean", (0.5, 0.5, 0.5))), image_std=tuple(pre.get("image_std", (0.5, 0.5, 0.5))),
        rescale_factor=float(pre.get("rescale_factor", 1 / 255)), resample=int(pre.get("resample", 2)),
        image_token_id=int(raw.get("image_token_index", raw.get("image_token_id", 262144))),
        boi_token_id=int(raw.get("boi_token_index", raw.get("boi_token_id", 255999))),
        eoi_token_id=int(raw.get("eoi_token_index", raw.get("eoi_token_id", 256000))),
        newline_ids=newline_ids(source), pan_and_scan=_pan_and_scan(source, pre))


def _pan_and_scan(source: str, pre: dict) -> PanAndScan | None:
    """The PanAndScan of a preprocessor config that turns it on (None: off, the default)."""
    if not pre.get("do_pan_and_scan"):
        return None
    try:
        tok = Tokenizer.from_dir(source)
    except FileNotFoundError as e:
        raise Gemma3VisionError(f"{source}: pan-and-scan needs the tokenizer for its prompt text: {e}") from None
    d = PanAndScan()

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special_tokens=False))
    out = PanAndScan(
        min_crop_size=int(pre.get("pan_and_scan_min_crop_size") or d.min_crop_size),
        max_num_crops=int(pre.get("pan_and_scan_max_num_crops") or d.max_num_crops),
        min_ratio_to_activate=float(pre.get("pan_and_scan_min_ratio_to_activate") or d.min_ratio_to_activate),
        intro_ids=ids(PAS_INTRO), crops_ids=ids(PAS_CROPS), space_ids=ids(" "))
    if out.min_crop_size <= 0 or out.max_num_crops < 2 or out.min_ratio_to_activate <= 0:
        raise Gemma3VisionError(f"{source}: pan-and-scan settings {out.min_crop_size}, {out.max_num_crops}, "
                                f"{out.min_ratio_to_activate} (min crop size, max crops >= 2, min ratio) are invalid")
    return out


# ---- reading the weights -----------------------------------------------------------------------
#
# canonical names, float32, numpy shapes (outermost first), as ClipModel takes them:
#   patch [C, 3 P P]  patch.b [C]  pos [N, C]  post_ln.w / post_ln.b [C]
#   blk.{i}.ln1.w/.b  .q.w/.b .k.w/.b .v.w/.b .o.w/.b [C, C] / [C]  .ln2.w/.b  .up.w [F, C] .up.b
#   .down.w [C, F] .down.b     proj.w [E, C] (mm_input_projection_weight transposed)
#   proj_norm [C] (mm_soft_emb_norm's weight + 1)


def read_hf(source: str, cfg: SiglipConfig) -> dict[str, np.ndarray]:
    """The SigLIP tower and projector of an HF Gemma 3 directory as canonical float32 tensors."""
    ckpt = SafetensorsCheckpoint(source)
    try:
        names, get = float_tensors(ckpt, lambda name: Gemma3VisionError(
            f"{source}: tensor {name} is missing: not a Gemma 3 vision checkpoint"))
        # the hub's files: vision_tower.vision_model.*; transformers 5 saves vision_tower.*
        v = "vision_tower.vision_model." if "vision_tower.vision_model.post_layernorm.weight" in names \
            else "vision_tower."
        C = cfg.hidden_size
        t = {"patch": get(v + "embeddings.patch_embedding.weight").reshape(C, -1),
             "patch.b": get(v + "embeddings.patch_embedding.bias"),
             "pos": get(v + "embeddings.position_embedding.weight"),
             "post_ln.w": get(v + "post_layernorm.weight"), "post_ln.b": get(v + "post_layernorm.bias")}
        t.update(hf_vit_blocks(get, v, cfg.num_layers))
        m = "multi_modal_projector."
        t["proj.w"] = np.ascontiguousarray(get(m + "mm_input_projection_weight").T)
        t["proj_norm"] = get(m + "mm_soft_emb_norm.weight") + np.float32(1.0)
    finally:
        ckpt.close()
    _check(cfg, t, source)
    return t


def _check(cfg: SiglipConfig, t: dict[str, np.ndarray], where: str) -> None:
    C, E, P = cfg.hidden_size, cfg.out_dim, cfg.patch_size
    check_vit(cfg, t, {"patch": (C, 3 * P * P), "patch.b": (C,), "pos": (cfg.num_patches, C), "post_ln.w": (C,),
                       "proj.w": (E, C), "proj_norm": (C,)}, where, Gemma3VisionError)


# ---- a GGUF language model + llama.cpp mmproj file ---------------------------------------------
#
# convert_hf_to_gguf.py's Gemma3VisionModel writes clip.cpp's PROJECTOR_TYPE_GEMMA3 layout: the
# SigLIP tower as v.* (v.patch_embd.weight [C, 3, P, P] and its bias, v.position_embd.weight
# [N, C], v.blk.{i}.{ln1, attn_q, attn_k, attn_v, attn_out, ln2, ffn_up, ffn_down}, v.post_ln),
# mm.input_projection.weight as HF's mm_input_projection_weight [C, E] (clip.cpp transposes it
# in the graph), mm.soft_emb_norm.weight with Gemma's + 1 added, and the pooling kernel in
# clip.vision.projector.scale_factor (absent: 4, every released size). The tower's GELU is
# ggml_gelu, the tanh form, as SigLIP's gelu_pytorch_tanh. The image tokens are the language
# model's vocabulary entries <start_of_image>, <end_of_image> and <image_soft_token>.

GGUF_IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
DEFAULT_POOL = 4                # clip.cpp's n_merge for Gemma 3 when the file does not say


def gguf_image_token_ids(lm_path: str) -> tuple[int, int, int]:
    """(boi, eoi, image) token ids of a Gemma 3 GGUF language model's vocabulary."""
    f = GGUFFile(lm_path)
    try:
        tokens = list(f.metadata.get("tokenizer.ggml.tokens") or [])
    finally:
        f.close()
    index = {t: i for i, t in enumerate(tokens) if t in GGUF_IMAGE_TOKENS}
    missing = [t for t in GGUF_IMAGE_TOKENS if t not in index]
    if missing:
        raise Gemma3VisionError(f"{lm_path}: the vocabulary has no {', '.join(missing)}: not a Gemma 3 language "
                                "model for a gemma3 mmproj file")
    return index["<start_of_image>"], index["<end_of_image>"], index["<image_soft_token>"]


def read_mmproj(path: str, lm_path: str | None, with_tensors: bool = True
                ) -> tuple[SiglipConfig, dict[str, np.ndarray]]:
    """A gemma3 mmproj GGUF (beside the GGUF language model at lm_path, whose vocabulary gives
    the image token ids) -> (config, canonical float32 tensors; {} without with_tensors)."""
    with mmproj_file(path, "gemma3", Gemma3VisionError, '"gemma3"') as (f, md, key):
        for name in ("v.patch_embd.weight", "v.post_ln.weight", "mm.input_projection.weight",
                     "mm.soft_emb_norm.weight"):
            if name not in f.tensors:
                raise Gemma3VisionError(f"{path}: tensor {name} is missing: not a Gemma 3 (SigLIP) mmproj file")
        size, patch = int(key("clip.vision.image_size")), int(key("clip.vision.patch_size"))
        pool = int(md.get("clip.vision.projector.scale_factor") or DEFAULT_POOL)
        side = size // patch
        if pool <= 0 or side % pool:
            raise Gemma3VisionError(f"{path}: pooling {pool} x {pool} does not divide the {side} x {side} patch grid")
        boi, eoi, image = gguf_image_token_ids(lm_path) if lm_path and os.path.isfile(lm_path) else (255999, 256000,
                                                                                                   262144)
        C = int(key("clip.vision.embedding_length"))
        cfg = SiglipConfig(
            image_size=size, patch_size=patch, hidden_size=C,
            intermediate_size=int(key("clip.vision.feed_forward_length")),
            num_heads=int(key("clip.vision.attention.head_count")), num_layers=int(key("clip.vision.block_count")),
            out_dim=int(f.info("mm.input_projection.weight").shape[1]), mm_tokens_per_image=(side // pool) ** 2,
            eps=float(md.get("clip.vision.attention.layer_norm_epsilon", 1e-6)), act="gelu_tanh",
            image_mean=tuple(float(v) for v in md.get("clip.vision.image_mean", (0.5, 0.5, 0.5))),
            image_std=tuple(float(v) for v in md.get("clip.vision.image_std", (0.5, 0.5, 0.5))),
            image_token_id=image, boi_token_id=boi, eoi_token_id=eoi,
            newline_ids=newline_ids(lm_path) if lm_path else ())
        if not with_tensors:
            return cfg, {}
        get = f.read
        t = {"patch": get("v.patch_embd.weight").reshape(C, -1), "patch.b": get("v.patch_embd.bias"),
             "pos": get("v.position_embd.weight"), "post_ln.w": get("v.post_ln.weight"),
             "post_ln.b": get("v.post_ln.bias"),
             "proj.w": np.ascontiguousarray(get("mm.input_projection.weight").T),
             "proj_norm": get("mm.soft_emb_norm.weight")}
        t.update(mmproj_blocks(get, cfg.num_layers, C))
    _check(cfg, t, path)
    return cfg, t


# ---- preprocessing -------------------------------------------------------------------------


def preprocess(image, cfg: SiglipConfig) -> np.ndarray:
    """PIL image -> patches float32 [N, 3 P P] (row-major patch grid, channel-major inside a
    patch, the Conv2d weight's order), as Gemma3ImageProcessor: resized to S x S, rescaled,
    mean/std."""
    from PIL import Image
    image = image.convert("RGB")
    S, P = cfg.image_size, cfg.patch_size
    if image.size != (S, S):
        image = image.resize((S, S), resample=Image.Resampling(cfg.resample))
    x = np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)          # [3, S, S]
    x = (x.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    mean = np.asarray(cfg.image_mean, np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, np.float32)[:, None, None]
    x = (x - mean) / std
    g = S // P
    return np.ascontiguousarray(x.reshape(3, g, P, g, P).transpose(1, 3, 0, 2, 4).reshape(g * g, 3 * P * P))


def pan_and_scan(image, cfg: SiglipConfig) -> list:
    """The crops Gemma3ImageProcessor's pan_and_scan cuts from a PIL image ([] when the image is
    not long enough, or its crops would be too small): 2..max_num_crops side by side along the
    long edge, ceil(edge / n) wide, the last one cut at the image's edge."""
    pas = cfg.pan_and_scan
    if pas is None:
        return []
    width, height = image.size
    long_edge, short_edge = max(width, height), min(width, height)
    if long_edge / short_edge < pas.min_ratio_to_activate:
        return []
    n = min(int(math.floor(long_edge / short_edge + 0.5)), int(math.floor(long_edge / pas.min_crop_size)))
    n = min(pas.max_num_crops, max(2, n))
    num_w, num_h = (n, 1) if width >= height else (1, n)
    crop_w, crop_h = math.ceil(width / num_w), math.ceil(height / num_h)
    if min(crop_w, crop_h) < pas.min_crop_size:
        return []
    return [image.crop((x, y, min(x + crop_w, width), min(y + crop_h, height)))
            for y in range(0, crop_h * num_h, crop_h) for x in range(0, crop_w * num_w, crop_w)]


def with_crops(prompt_token_ids: list[int], images: list, cfg: SiglipConfig) -> tuple[list[int], list]:
    """(ids, images) with each image that pan-and-scan cuts into crops followed by its crops, and
    its <start_of_image> replaced as Gemma3Processor replaces it: "Here is the original image "
    <boi> " and here are some crops to help you see better " <boi> " " <boi> ... (each <boi>
    then expands as an image of its own). The phrases are tokenized alone: text right before
    the placeholder that the tokenizer would merge with "Here" stays its own token."""
    if cfg.pan_and_scan is None:
        return prompt_token_ids, images
    pas = cfg.pan_and_scan
    at = [i for i, t in enumerate(prompt_token_ids) if t == cfg.boi_token_id]
    if len(at) != len(images):
        return prompt_token_ids, images          # the caller refuses the count, naming both
    ids: list[int] = []
    out: list = []
    prev = 0
    for pos, image in zip(at, images):
        crops = pan_and_scan(image.convert("RGB"), cfg)
        ids.extend(prompt_token_ids[prev:pos])
        if crops:
            ids += list(pas.intro_ids) + [cfg.boi_token_id] + list(pas.crops_ids)
            for k in range(len(crops)):
                ids += ([] if k == 0 else list(pas.space_ids)) + [cfg.boi_token_id]
        else:
            ids.append(cfg.boi_token_id)
        out += [image] + crops
        prev = pos + 1
    ids.extend(prompt_token_ids[prev:])
    return ids, out


def pixel_values_of(patches: np.ndarray, cfg: SiglipConfig) -> np.ndarray:
    """preprocess()'s patches back to the [3, S, S] image transformers' processor returns."""
    g, P = cfg.side, cfg.patch_size
    return patches.reshape(g, g, 3, P, P).transpose(2, 0, 3, 1, 4).reshape(3, g * P, g * P)


# ---- the prompt ----------------------------------------------------------------------------


def expand(prompt_token_ids: list[int], cfg: SiglipConfig) -> tuple[list[int], list[int]]:
    """(ids, first image token of each image): each <start_of_image> of the prompt becomes
    Gemma3Processor's full image sequence, "\n\n" <boi> n x <image> <eoi> "\n\n". The text
    tokenizer would have merged those newlines with newline tokens beside them ("\n" + "\n\n"
    is one "\n\n\n" token, as vLLM's Gemma 3 processor merges them too): so are they here, a
    run of k newlines becoming the vocabulary's token of k newlines (largest first past 31)."""
    runs = {tid: k + 1 for k, tid in enumerate(cfg.newline_ids) if tid >= 0}
    longest = max(runs.values(), default=0)
    mark = object()                 # an inserted "\n\n"
    seq: list = []
    for tid in prompt_token_ids:
        if tid == cfg.boi_token_id:
            seq += [mark, tid] + [cfg.image_token_id] * cfg.mm_tokens_per_image + [cfg.eoi_token_id, mark]
        else:
            seq.append(tid)
    ids: list[int] = []
    i = 0
    while i < len(seq):
        j = i
        while j < len(seq) and (seq[j] is mark or seq[j] in runs):   # a run of newlines
            j += 1
        if j == i:
            ids.append(seq[i])
            i += 1
            continue
        group = seq[i:j]
        if mark not in group:
            ids.extend(group)
        else:
            k = sum(2 if t is mark else runs[t] for t in group)
            while k > 0 and longest > 0:
                n = min(k, longest)
                while n > 1 and cfg.newline_ids[n - 1] < 0:
                    n -= 1
                if cfg.newline_ids[n - 1] < 0:
                    break
                ids.append(cfg.newline_ids[n - 1])
                k -= n
        i = j
    offsets = [i + 1 for i, t in enumerate(ids) if t == cfg.boi_token_id]
    return ids, offsets


# ---- the encoder ------------------------------------------------------------------------------


def _act(x: np.ndarray, act: str) -> np.ndarray:
    if act == "gelu_tanh":
        return np.float32(0.5) * x * (np.float32(1) + np.tanh(np.float32(math.sqrt(2 / math.pi))
                                                              * (x + np.float32(0.044715) * x ** 3)))
    return _gelu(x)


class SiglipEncoder(ClipEncoder):
    """SigLIP ViT + Gemma 3's projector over images of its one size, on the CLIP tower's compiled
    forward (its blocks are CLIP's: llava.pack_vit_blocks / vit_blocks_reference). tensors:
    canonical float32 arrays (read_hf). kernels: the kernel module to run it on (None: NumPy only)."""

    def _pack(self, kernels, dtype: str, bf16_path: str | None):
        t, cfg = self.t, self.cfg
        packed, mat = vit_packer(dtype)
        mat("patch", t["patch"], t["patch.b"])
        pack_vit_blocks(t, cfg.num_layers, packed, mat)
        mat("proj", t["proj.w"], None)
        for name in ("pos", "post_ln.w", "post_ln.b", "proj_norm"):
            packed.vectors[name] = np.ascontiguousarray(t[name], np.float32)
        return kernels.ClipModel(packed, dtype, cfg.num_layers, cfg.num_heads, cfg.eps, cfg.act, False, bf16_path,
                                 pool=cfg.pool)

    def num_rows(self) -> int:
        """Language-model rows of one image: the pooled patch grid."""
        return self.cfg.mm_tokens_per_image

    def encode_reference(self, pixel_values: np.ndarray, grid=None) -> np.ndarray:
        """encode() in NumPy float32: the plain reference."""
        cfg, t = self.cfg, self.t
        x = pixel_values.astype(np.float32) @ t["patch"].T + t["patch.b"] + t["pos"]
        x = _layernorm(vit_blocks_reference(x, t, cfg, _act), t["post_ln.w"], t["post_ln.b"], cfg.eps)
        g, k, C = cfg.side, cfg.pool, cfg.hidden_size
        pooled = x.reshape(g // k, k, g // k, k, C).mean(axis=(1, 3)).reshape(-1, C)
        normed = pooled / np.sqrt((pooled * pooled).mean(axis=-1, keepdims=True) + np.float32(cfg.eps))
        return np.ascontiguousarray((normed * t["proj_norm"]) @ t["proj.w"].T, np.float32)
