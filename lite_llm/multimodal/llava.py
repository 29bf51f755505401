"""LLaVA-1.5's image side: a CLIP ViT and the 2-layer MLP projector, read from a llama.cpp
`mmproj` GGUF (clip.cpp's layout) or from an HF LlavaForConditionalGeneration directory, and
CLIP's preprocessing as transformers' CLIPImageProcessor (PIL backend, the "slow" one). The
language model is a plain Llama (a GGUF file or the checkpoint's language_model.*): image rows
replace its `<image>` placeholder tokens, one per patch, positions stay 1-D. A GGUF vocabulary
without `<image>` (the llava-v1.5 files llama.cpp users have) takes llama.cpp's media marker
`<__media__>` in the prompt text instead (MEDIA_MARKER).

    image --shortest edge to S (bicubic), centre crop S x S, /255, mean/std--> [3, S, S]
    patches (P x P) @ patch_embd^T -> [N, C]; [class, patches] + position_embd; pre_ln
    L x [x += attn(ln1(x)) (bidirectional, all N + 1), x += fc2(act(fc1(ln2(x))))]
    drop the class row -> [N, C] -> mm.0, GELU, mm.2 -> [N, E]

L is the feature layer: transformers' vision_feature_layer (-2: all but the last block), or,
for an mmproj file, block_count - 1 as llama.cpp's clip.cpp runs a llava projector (v.post_ln is
never used: the features are taken before it). encode_reference is the NumPy float32 spec the
compiled tower is tested against.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass

import numpy as np

from lite_llm.model.gguf import GGUFFile
from lite_llm.model.hf import SafetensorsCheckpoint
from lite_llm.model.weights import bf16_to_f32
from lite_llm.multimodal.qwen2_5_vl import _gelu
from lite_llm.multimodal.towers import vit_packer

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HF_ARCHITECTURES = ("LlavaForConditionalGeneration",)


class LlavaError(ValueError):
    """An mmproj file or LLaVA checkpoint this module cannot run, with the reason."""


@dataclass(frozen=True)
class ClipConfig:
    image_size: int             # S: the square the image is cropped to
    patch_size: int             # P
    hidden_size: int            # C
    intermediate_size: int      # F
    num_heads: int
    num_layers: int             # L: the blocks run (the feature layer), not the blocks stored
    out_dim: int                # E of the language model
    eps: float = 1e-5
    act: str = "quick_gelu"     # the ViT's MLP activation: "quick_gelu" (OpenAI CLIP) or "gelu"
    keep_class: bool = False    # vision_feature_select_strategy "full": the class row goes too
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    resize_to: int = 0          # the shortest edge before the crop (0: image_size)
    image_token_id: int = -1    # of the language model's vocabulary; -1: not known yet

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_image_tokens(self) -> int:
        return self.num_patches + (1 if self.keep_class else 0)


def _feature_layers(layer, depth: int, where: str) -> int:
    if not isinstance(layer, int):
        raise LlavaError(f"{where}: vision_feature_layer {layer!r}: only one feature layer is supported")
    n = layer if layer >= 0 else depth + 1 + layer          # hidden_states[k]: after k blocks
    if not 0 < n <= depth:
        raise LlavaError(f"{where}: vision_feature_layer {layer} is outside the {depth} vision blocks")
    return n


def _strategy(value, where: str) -> bool:
    if value not in ("default", "full"):
        raise LlavaError(f"{where}: vision_feature_select_strategy {value!r} is not default / full")
    return value == "full"


# ---- reading the weights -----------------------------------------------------------------------
#
# canonical names, float32, numpy shapes (outermost first):
#   patch [C, 3 P P]  class [C]  pos [N + 1, C]  pre_ln.w / pre_ln.b [C]
#   blk.{i}.ln1.w/.b  .q.w/.b .k.w/.b .v.w/.b .o.w/.b [C, C] / [C]  .ln2.w/.b  .up.w [F, C] .up.b
#   .down.w [C, F] .down.b     mm0.w [E, C] mm0.b   mm2.w [E, E] mm2.b


MMPROJ_PROJECTORS = ("mlp", "gemma3")     # LLaVA-1.5's (here) and Gemma 3's (gemma3.py)


def mmproj_projector(path: str) -> str:
    """The projector type of an mmproj GGUF: "mlp" (LLaVA-1.5) or "gemma3"; another type, or a
    file that is no mmproj, is refused naming it."""
    if not os.path.isfile(path):
        raise LlavaError(f"--mmproj {path}: no such file")
    f = GGUFFile(path)
    try:
        return _projector(f, path)
    finally:
        f.close()


def _projector(f, path: str) -> str:
    md = f.metadata
    if md.get("general.architecture") != "clip":
        raise LlavaError(f"{path}: general.architecture {md.get('general.architecture')!r} is not an mmproj "
                         "(clip) file")
    proj = md.get("clip.projector_type") or md.get("clip.vision.projector_type") or "mlp"
    if proj not in MMPROJ_PROJECTORS:
        raise LlavaError(f"{path}: projector type {proj!r} is not supported (LLaVA-1.5's \"mlp\" and Gemma 3's "
                         "\"gemma3\" are)")
    if not md.get("clip.has_vision_encoder", True):
        raise LlavaError(f"{path}: the file holds no vision encoder")
    return proj


@contextlib.contextmanager
def mmproj_file(path: str, projector: str, error: type[ValueError], what: str):
    """The mmproj GGUF at `path`, opened and checked to hold `projector` (else `error` saying it
    is not `what`): yields (file, metadata, key(name) -> a metadata value that must be there)."""
    f = GGUFFile(path)
    try:
        md = f.metadata
        if _projector(f, path) != projector:
            raise error(f"{path}: projector type {md.get('clip.projector_type')!r} is not {what}")
        yield f, md, lambda name: mmproj_key(f, path, name)
    finally:
        f.close()


def mmproj_key(f, path: str, name: str):
    """Metadata key `name` of the open mmproj file f, refused naming it when missing."""
    if name not in f.metadata:
        raise LlavaError(f"{path}: mmproj key {name!r} is missing")
    return f.metadata[name]


def mmproj_blocks(get, num_layers: int, hidden_size: int) -> dict[str, np.ndarray]:
    """The first num_layers encoder blocks of an mmproj file (v.blk.{i}.*) by canonical name;
    get(name) reads one tensor as float32."""
    t = {}
    for i in range(num_layers):
        p, q = f"v.blk.{i}.", f"blk.{i}."
        for ours, theirs in (("ln1", "ln1"), ("ln2", "ln2"), ("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"),
                             ("o", "attn_out"), ("up", "ffn_up"), ("down", "ffn_down")):
            t[q + ours + ".w"] = get(p + theirs + ".weight")
            t[q + ours + ".b"] = get(p + theirs + ".bias")
        if t[q + "down.w"].shape[0] != hidden_size:   # older converters swapped the names: clip.cpp swaps back
            for part in ("w", "b"):
                t[q + "up." + part], t[q + "down." + part] = t[q + "down." + part], t[q + "up." + part]
    return t


def read_mmproj(path: str, with_tensors: bool = True) -> tuple[ClipConfig, dict[str, np.ndarray]]:
    """An mmproj GGUF (clip.cpp's layout, projector type "mlp") -> (config, canonical tensors;
    {} without with_tensors)."""
    if not os.path.isfile(path):
        raise LlavaError(f"--mmproj {path}: no such file")
    with mmproj_file(path, "mlp", LlavaError, 'LLaVA-1.5\'s "mlp"') as (f, md, key):
        depth = int(key("clip.vision.block_count"))
        feature = md.get("clip.vision.feature_layer")
        if feature:
            n = max(int(v) for v in (feature if isinstance(feature, list) else [feature]))
        else:                                       # clip.cpp: the llava projector reads block n - 2's output
            n = depth - 1 if md.get("clip.has_llava_projector", True) else depth
        if not 0 < n <= depth:
            raise LlavaError(f"{path}: {depth} vision blocks leave none to run")
        t = {}
        C = int(key("clip.vision.embedding_length"))
        size = int(key("clip.vision.image_size"))
        for name in ("v.class_embd", "v.patch_embd.weight", "mm.0.weight", "mm.2.weight"):
            if name not in f.tensors:
                raise LlavaError(f"{path}: tensor {name} is missing: not a LLaVA-1.5 (CLIP + MLP) mmproj file")
        cfg = ClipConfig(image_size=size, patch_size=int(key("clip.vision.patch_size")), hidden_size=C,
                         intermediate_size=int(key("clip.vision.feed_forward_length")),
                         num_heads=int(key("clip.vision.attention.head_count")), num_layers=n,
                         out_dim=int(f.info("mm.2.weight").shape[0]),
                         eps=float(md.get("clip.vision.attention.layer_norm_epsilon", 1e-5)),
                         act="gelu" if md.get("clip.use_gelu", False) else "quick_gelu",
                         image_mean=tuple(float(v) for v in md.get("clip.vision.image_mean", OPENAI_CLIP_MEAN)),
                         image_std=tuple(float(v) for v in md.get("clip.vision.image_std", OPENAI_CLIP_STD)))
        if not with_tensors:
            return cfg, t
        get = f.read
        t["patch"] = get("v.patch_embd.weight").reshape(C, -1)
        t["class"] = get("v.class_embd").reshape(C)
        t["pos"] = get("v.position_embd.weight")
        for part in ("w", "b"):
            t[f"pre_ln.{part}"] = get(f"v.pre_ln.{'weight' if part == 'w' else 'bias'}")
        t.update(mmproj_blocks(get, n, C))
        for ours, theirs in (("mm0", "mm.0"), ("mm2", "mm.2")):
            t[ours + ".w"], t[ours + ".b"] = get(theirs + ".weight"), get(theirs + ".bias")
    _check(cfg, t, path)
    return cfg, t


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def hf_config(source: str, raw: dict) -> ClipConfig:
    """ClipConfig of an HF LlavaForConditionalGeneration directory (config.json as `raw`)."""
    where = os.path.join(source, "config.json")
    v = raw.get("vision_config") or {}
    if v.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise LlavaError(f"{where}: vision tower {v.get('model_type')!r} is not supported (CLIP is)")
    if raw.get("projector_hidden_act", "gelu") != "gelu" or not raw.get("multimodal_projector_bias", True):
        raise LlavaError(f"{where}: only the GELU projector with biases (LLaVA-1.5's) is supported")
    act = v.get("hidden_act", "quick_gelu")
    if act not in ("quick_gelu", "gelu"):
        raise LlavaError(f"{where}: vision hidden_act {act!r} is not supported")
    depth = int(v.get("num_hidden_layers", 24))
    pre = _read_json(os.path.join(source, "preprocessor_config.json"))
    size = int(v.get("image_size", 336))
    crop = pre.get("crop_size") or {}
    crop = crop.get("height", size) if isinstance(crop, dict) else int(crop)
    if int(crop) != size:
        raise LlavaError(f"{where}: the processor crops to {crop}, the vision tower takes {size}")
    short = (pre.get("size") or {}).get("shortest_edge", size)
    text = raw.get("text_config") or {}
    return ClipConfig(image_size=size, patch_size=int(v.get("patch_size", 14)), hidden_size=int(v.get("hidden_size", 1024)),
                      intermediate_size=int(v.get("intermediate_size", 4096)),
                      num_heads=int(v.get("num_attention_heads", 16)),
                      num_layers=_feature_layers(raw.get("vision_feature_layer", -2), depth, where),
                      out_dim=int(text.get("hidden_size", raw.get("hidden_size", 4096))),
                      eps=float(v.get("layer_norm_eps", 1e-5)), act=act,
                      keep_class=_strategy(raw.get("vision_feature_select_strategy", "default"), where),
                      image_mean=tuple(pre.get("image_mean", OPENAI_CLIP_MEAN)),
                      image_std=tuple(pre.get("image_std", OPENAI_CLIP_STD)), resize_to=int(short),
                      image_token_id=int(raw.get("image_token_id", raw.get("image_token_index", 32000))))


def read_hf(source: str, cfg: ClipConfig) -> dict[str, np.ndarray]:
    """The vision tower and projector of an HF LLaVA directory as canonical float32 tensors."""
    ckpt = SafetensorsCheckpoint(source)
    try:
        names = {n.removeprefix("model."): n for n in ckpt.entries}

        def get(name):
            a = ckpt.read(names[name])
            return bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)
        # the hub's files: vision_tower.vision_model.*; transformers 5 saves vision_tower.*
        v = "vision_tower.vision_model." if "vision_tower.vision_model.pre_layrnorm.weight" in names else "vision_tower."
        C = cfg.hidden_size
        t = {"patch": get(v + "embeddings.patch_embedding.weight").reshape(C, -1),
             "class": get(v + "embeddings.class_embedding").reshape(C),
             "pos": get(v + "embeddings.position_embedding.weight"),
             "pre_ln.w": get(v + "pre_layrnorm.weight"), "pre_ln.b": get(v + "pre_layrnorm.bias")}
        t.update(hf_vit_blocks(get, v, cfg.num_layers))
        for ours, theirs in (("mm0", "linear_1"), ("mm2", "linear_2")):
            m = "multi_modal_projector." + theirs
            t[ours + ".w"], t[ours + ".b"] = get(m + ".weight"), get(m + ".bias")
    finally:
        ckpt.close()
    _check(cfg, t, source)
    return t


def hf_vit_blocks(get, prefix: str, num_layers: int) -> dict[str, np.ndarray]:
    """The encoder blocks of an HF CLIP / SigLIP vision tower under prefix, by canonical name
    (blk.{i}.{ln1, ln2, q, k, v, o, up, down}.{w, b}); get(name) reads one tensor as float32."""
    t = {}
    for i in range(num_layers):
        p, q = f"{prefix}encoder.layers.{i}.", f"blk.{i}."
        for ours, theirs in (("ln1", "layer_norm1"), ("ln2", "layer_norm2"), ("q", "self_attn.q_proj"),
                             ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"), ("o", "self_attn.out_proj"),
                             ("up", "mlp.fc1"), ("down", "mlp.fc2")):
            t[q + ours + ".w"], t[q + ours + ".b"] = get(p + theirs + ".weight"), get(p + theirs + ".bias")
    return t


def check_vit(cfg, t: dict[str, np.ndarray], want: dict[str, tuple[int, ...]], where: str, error: type) -> None:
    """Raise error (naming where) unless the tower's own tensors have the shapes in want, its
    blocks' q, o, fc1 and fc2 theirs, and width / heads and image size / patch divide."""
    C, F = cfg.hidden_size, cfg.intermediate_size
    want = dict(want)
    for i in range(cfg.num_layers):
        want.update({f"blk.{i}.q.w": (C, C), f"blk.{i}.o.w": (C, C), f"blk.{i}.up.w": (F, C),
                     f"blk.{i}.down.w": (C, F)})
    for name, shape in want.items():
        if t[name].shape != shape:
            raise error(f"{where}: vision tensor {name} is {t[name].shape}, expected {shape}")
    if C % cfg.num_heads or cfg.image_size % cfg.patch_size:
        raise error(f"{where}: width {C} / {cfg.num_heads} heads or image size {cfg.image_size} / patch "
                    f"{cfg.patch_size} do not divide")


def _check(cfg: ClipConfig, t: dict[str, np.ndarray], where: str) -> None:
    C, E, P = cfg.hidden_size, cfg.out_dim, cfg.patch_size
    check_vit(cfg, t, {"patch": (C, 3 * P * P), "class": (C,), "pos": (cfg.num_patches + 1, C), "pre_ln.w": (C,),
                       "mm0.w": (E, C), "mm2.w": (E, E)}, where, LlavaError)


# ---- preprocessing -------------------------------------------------------------------------


def preprocess(image, cfg: ClipConfig) -> np.ndarray:
    """PIL image -> patches float32 [N, 3 P P] (row-major patch grid, channel-major inside a
    patch, the Conv2d weight's order), as CLIPImageProcessor: shortest edge resized (bicubic),
    centre crop, /255, mean/std."""
    from PIL import Image
    image = image.convert("RGB")
    S, P = cfg.image_size, cfg.patch_size
    short = cfg.resize_to or S
    width, height = image.size
    if width <= height:
        new_w, new_h = short, int(short * height / width)
    else:
        new_w, new_h = int(short * width / height), short
    if (new_w, new_h) != (width, height):
        image = image.resize((new_w, new_h), resample=Image.BICUBIC)
    x = np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)          # [3, h, w]
    if new_h < S or new_w < S:                                          # too small: zero padding, centred
        padded = np.zeros((3, max(S, new_h), max(S, new_w)), np.uint8)
        top, left = math.ceil((padded.shape[1] - new_h) / 2), math.ceil((padded.shape[2] - new_w) / 2)
        padded[:, top:top + new_h, left:left + new_w] = x
        x = padded
    top, left = (x.shape[1] - S) // 2, (x.shape[2] - S) // 2
    x = (x[:, top:top + S, left:left + S].astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(cfg.image_mean, np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, np.float32)[:, None, None]
    x = (x - mean) / std
    g = S // P
    return np.ascontiguousarray(x.reshape(3, g, P, g, P).transpose(1, 3, 0, 2, 4).reshape(g * g, 3 * P * P))


def pixel_values_of(patches: np.ndarray, cfg: ClipConfig) -> np.ndarray:
    """preprocess()'s patches back to the [3, S, S] image transformers' processor returns."""
    g, P = cfg.image_size // cfg.patch_size, cfg.patch_size
    return patches.reshape(g, g, 3, P, P).transpose(2, 0, 3, 1, 4).reshape(3, g * P, g * P)


# ---- the encoder ------------------------------------------------------------------------------


def _layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + np.float32(eps)) * w + b


def _act(x: np.ndarray, act: str) -> np.ndarray:
    if act == "quick_gelu":
        return x / (1.0 + np.exp(np.float32(-1.702) * x))
    return _gelu(x)


def pack_vit_blocks(t: dict[str, np.ndarray], num_layers: int, packed, mat) -> None:
    """The pre-norm blocks (CLIP's and SigLIP's alike) into the PackedModel `packed`
    (towers.vit_packer): q/k/v as one matrix, o, fc1 (up), fc2 (down), the two LayerNorms."""
    for i in range(num_layers):
        p = f"blk.{i}."
        qkv_w = np.concatenate([t[p + "q.w"], t[p + "k.w"], t[p + "v.w"]])
        qkv_b = np.concatenate([t[p + "q.b"], t[p + "k.b"], t[p + "v.b"]])
        mat(p + "qkv", qkv_w, qkv_b)
        for part in ("o", "up", "down"):
            mat(p + part, t[p + part + ".w"], t[p + part + ".b"])
        for part in ("ln1", "ln2"):
            packed.vectors[p + part + ".w"], packed.vectors[p + part + ".b"] = t[p + part + ".w"], t[p + part + ".b"]


def vit_blocks_reference(x: np.ndarray, t: dict[str, np.ndarray], cfg, act) -> np.ndarray:
    """The pre-norm blocks in NumPy float32 over rows x [n, C]: full bidirectional attention,
    then fc2(act(fc1(ln2(x)))) (act(values, cfg.act) gives the activation)."""
    H, C = cfg.num_heads, cfg.hidden_size
    D = C // H
    n = x.shape[0]
    scale = np.float32(D ** -0.5)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        h = _layernorm(x, t[p + "ln1.w"], t[p + "ln1.b"], cfg.eps)
        q, k, v = ((h @ t[p + s + ".w"].T + t[p + s + ".b"]).reshape(n, H, D).transpose(1, 0, 2) for s in "qkv")
        s = (q @ k.transpose(0, 2, 1)) * scale
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, C)
        x = x + a @ t[p + "o.w"].T + t[p + "o.b"]
        h = _layernorm(x, t[p + "ln2.w"], t[p + "ln2.b"], cfg.eps)
        x = x + act(h @ t[p + "up.w"].T + t[p + "up.b"], cfg.act) @ t[p + "down.w"].T + t[p + "down.b"]
    return x


class ClipEncoder:
    """CLIP ViT + MLP projector over images of its one size (encode_many: several in one compiled
    call). tensors: canonical float32 arrays
    (read_mmproj / read_hf). kernels: the kernel module to run it on (None: NumPy only)."""

    def __init__(self, cfg: ClipConfig, tensors: dict[str, np.ndarray], kernels=None, dtype: str = "float32",
                 num_threads: int = 1, bf16_path: str | None = None):
        self.cfg, self.t = cfg, tensors
        self.kernels, self.num_threads = kernels, num_threads
        self.model = None if kernels is None else self._pack(kernels, dtype, bf16_path)

    def _pack(self, kernels, dtype: str, bf16_path: str | None):
        t, cfg = self.t, self.cfg
        packed, mat = vit_packer(dtype)
        mat("patch", t["patch"], None)
        pack_vit_blocks(t, cfg.num_layers, packed, mat)
        mat("mm0", t["mm0.w"], t["mm0.b"])
        mat("mm2", t["mm2.w"], t["mm2.b"])
        for name in ("class", "pos", "pre_ln.w", "pre_ln.b"):
            packed.vectors[name] = np.ascontiguousarray(t[name], np.float32)
        return kernels.ClipModel(packed, dtype, cfg.num_layers, cfg.num_heads, cfg.eps, cfg.act, cfg.keep_class,
                                 bf16_path)

    def num_rows(self) -> int:
        """Language-model rows of one image: the patches (and the class row under keep_class)."""
        return self.cfg.num_image_tokens

    def encode(self, pixel_values: np.ndarray, grid=None) -> np.ndarray:
        """One image's patches [N, 3 P P] -> its language-model rows [num_rows(), E]."""
        return self.encode_many([(pixel_values, grid)])[0]

    def encode_many(self, images: list[tuple[np.ndarray, object]]) -> list[np.ndarray]:
        """Images (patches [N, 3 P P], grid) -> each one's rows [num_rows(), E]: ONE compiled call
        over all their patches, every image being the tower's one size (the NumPy reference, image
        by image, without kernels)."""
        if self.model is None:
            return [self.encode_reference(p) for p, _ in images]
        rows = self.num_rows()
        out = np.empty((len(images) * rows, self.cfg.out_dim), np.float32)
        self.kernels.clip_forward(self.model, np.ascontiguousarray(np.concatenate([p for p, _ in images]), np.float32),
                                  out, self.num_threads)
        return [out[k * rows:(k + 1) * rows] for k in range(len(images))]

    def encode_reference(self, pixel_values: np.ndarray, grid=None) -> np.ndarray:
        """encode() in NumPy float32: the plain reference."""
        cfg, t = self.cfg, self.t
        x = np.concatenate([t["class"][None, :], pixel_values.astype(np.float32) @ t["patch"].T]) + t["pos"]
        x = vit_blocks_reference(_layernorm(x, t["pre_ln.w"], t["pre_ln.b"], cfg.eps), t, cfg, _act)
        if not cfg.keep_class:
            x = x[1:]
        x = _act(x @ t["mm0.w"].T + t["mm0.b"], "gelu") @ t["mm2.w"].T + t["mm2.b"]
        return np.ascontiguousarray(x, np.float32)


# llama.cpp's mtmd_default_marker(): where an image stands in a prompt whose vocabulary has no
# image token (the llava-v1.5 GGUFs most users have): llama.cpp splits the text there and
# splices the image's embeddings in, with no token id at all. Here the marker is one added
# special token (id: the vocabulary size, never given to the model) that the processor expands
# to the image's rows, which carry the unknown token's id (their embeddings replace it).
MEDIA_MARKER = "<__media__>"


def gguf_placeholder(metadata: dict) -> tuple[str, int, int]:
    """(placeholder text, its token id, the id an image's rows carry) of a GGUF language model:
    "<image>" where the vocabulary has it (an HF LlavaForConditionalGeneration converted),
    else llama.cpp's media marker."""
    tokens = list(metadata.get("tokenizer.ggml.tokens") or [])
    if "<image>" in tokens:
        i = tokens.index("<image>")
        return "<image>", i, i
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    return MEDIA_MARKER, len(tokens), int(unk) if unk is not None and 0 <= int(unk) < len(tokens) else 0


def gguf_placeholder_of(lm_path: str) -> tuple[str, int, int]:
    """gguf_placeholder of the GGUF file at lm_path."""
    f = GGUFFile(lm_path)
    try:
        return gguf_placeholder(f.metadata)
    finally:
        f.close()


def add_media_marker(tokenizer, metadata: dict) -> None:
    """A GGUF language model loaded with an mmproj file: when its vocabulary has no "<image>",
    the tokenizer learns llama.cpp's media marker as one special token, at the id
    gguf_placeholder gives it."""
    text, tid, _ = gguf_placeholder(metadata)
    if text == MEDIA_MARKER and tokenizer.add_special_token(MEDIA_MARKER) != tid:
        raise LlavaError(f"the tokenizer gave {MEDIA_MARKER} id {tokenizer.token_to_id(MEDIA_MARKER)}, "
                         f"expected {tid} (the vocabulary size)")
