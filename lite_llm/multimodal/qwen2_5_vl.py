"""Qwen2.5-VL's image side: preprocessing as transformers' Qwen2VLImageProcessor (PIL backend,
the "slow" one), the vision transformer and patch merger, and the multimodal RoPE positions of
a prompt's tokens. What the language model computes is the kernel forward (arch/qwen2_vl.py).

    image --smart_resize(28)--> [H', W'] --/255, CLIP mean/std--> patches [gh*gw, 3*2*14*14]
    patches @ patch_embed^T -> [N, C]  (the Conv3d with stride = kernel is this GEMM)
    window order (2x2 merge units grouped in 112-pixel windows), 2-D rotary (h, w halves)
    depth x [x += attn(rms(x)) (window or full), x += swiglu(rms(x))]
    merger: rms, 2x2 units -> [N/4, 4C] -> Linear, GELU, Linear -> [N/4, E], original order

VisionEncoder.encode_many runs the tower as one compiled call over several images, their
patches one after the other (kernels.vision_forward, lite_llm/_kernels/vision.pxi; attention
within each image's windows, and within each image in the full-attention blocks, as
transformers' cu_seqlens), on the packed-weight GEMMs of the language model, in the engine's
dtype; encode_reference is one image in NumPy float32, the plain reference it is tested
against.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lite_llm.model.hf import SafetensorsCheckpoint
from lite_llm.model.weights import bf16_to_f32
from lite_llm.multimodal.towers import vit_packer

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int            # C
    intermediate_size: int
    num_heads: int
    out_hidden_size: int        # E of the language model
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    rope_theta: float = 10000.0
    in_channels: int = 3
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_token_id: int = 151655
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    @classmethod
    def from_hf(cls, raw: dict, preprocessor: dict | None = None) -> "VisionConfig":
        v = raw["vision_config"]
        rope = v.get("rope_parameters") or {}
        pre = preprocessor or {}
        size = pre.get("size") or {}
        return cls(depth=int(v["depth"]), hidden_size=int(v["hidden_size"]),
                   intermediate_size=int(v["intermediate_size"]), num_heads=int(v["num_heads"]),
                   out_hidden_size=int(v["out_hidden_size"]), patch_size=int(v.get("patch_size", 14)),
                   spatial_merge_size=int(v.get("spatial_merge_size", 2)),
                   temporal_patch_size=int(v.get("temporal_patch_size", 2)),
                   window_size=int(v.get("window_size", 112)),
                   fullatt_block_indexes=tuple(v.get("fullatt_block_indexes", (7, 15, 23, 31))),
                   rope_theta=float(rope.get("rope_theta", 10000.0)), in_channels=int(v.get("in_channels", 3)),
                   min_pixels=int(pre.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
                   max_pixels=int(pre.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
                   image_token_id=int(raw.get("image_token_id", 151655)),
                   vision_start_token_id=int(raw.get("vision_start_token_id", 151652)),
                   vision_end_token_id=int(raw.get("vision_end_token_id", 151653)))

    @property
    def factor(self) -> int:
        return self.patch_size * self.spatial_merge_size


# ---- preprocessing -------------------------------------------------------------------------


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(h, w) multiples of factor, h*w within [min_pixels, max_pixels], aspect kept (transformers')."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an image's aspect ratio must be below 200, got {max(height, width) / min(height, width):.0f}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def preprocess(image, cfg: VisionConfig, max_pixels: int | None = None, min_pixels: int | None = None
               ) -> tuple[np.ndarray, tuple[int, int, int]]:
    """PIL image -> (pixel_values float32 [gh*gw, 3*T*P*P], grid (1, gh, gw)), as the HF processor;
    max_pixels / min_pixels override the checkpoint's (--mm-processor-kwargs)."""
    from PIL import Image
    image = image.convert("RGB")
    width, height = image.size
    h, w = smart_resize(height, width, cfg.factor, min_pixels or cfg.min_pixels, max_pixels or cfg.max_pixels)
    if (h, w) != (height, width):
        image = image.resize((w, h), resample=Image.BICUBIC)
    x = np.asarray(image, dtype=np.float32).transpose(2, 0, 1)          # [3, h, w]
    x = x * np.float32(1 / 255)
    mean = np.asarray(OPENAI_CLIP_MEAN, np.float32)[:, None, None]
    std = np.asarray(OPENAI_CLIP_STD, np.float32)[:, None, None]
    x = (x - mean) / std
    P, M, T = cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size
    gh, gw = h // P, w // P
    x = x.reshape(3, gh // M, M, P, gw // M, M, P).transpose(1, 4, 2, 5, 0, 3, 6)   # (gh, gw, mh, mw, C, ph, pw)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], T, P, P))             # a still image: T copies
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * T * P * P), dtype=np.float32), (1, gh, gw)


def num_image_tokens(grid: tuple[int, int, int], cfg: VisionConfig) -> int:
    t, h, w = grid
    return t * h * w // (cfg.spatial_merge_size ** 2)


# ---- multimodal RoPE positions ---------------------------------------------------------------


def mrope_positions(token_ids: list[int], grids: list[tuple[int, int, int]], cfg: VisionConfig
                    ) -> tuple[np.ndarray, int]:
    """(positions int32 [n, 3] (temporal, height, width) of an expanded prompt, delta): text
    tokens count on in all three; an image's tokens sit at (s, s + row, s + col) of its merged
    grid, and the text after it resumes at s + max(rows, cols). A token at index p past the
    prompt has position p + delta in all three (transformers' get_rope_index)."""
    n = len(token_ids)
    ids = np.asarray(token_ids)
    pos = np.empty((n, 3), np.int32)
    image_at = np.flatnonzero(ids == cfg.image_token_id)
    i = cur = 0
    grid_iter = iter(grids)
    M = cfg.spatial_merge_size
    while i < n:
        if ids[i] != cfg.image_token_id:
            j = i
            while j < n and ids[j] != cfg.image_token_id:
                j += 1
            pos[i:j] = (cur + np.arange(j - i, dtype=np.int32))[:, None]
            cur += j - i
            i = j
            continue
        t, h, w = next(grid_iter)
        lh, lw = h // M, w // M
        count = t * lh * lw
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(lh), np.arange(lw), indexing="ij")
        pos[i:i + count, 0] = cur + tt.reshape(-1)
        pos[i:i + count, 1] = cur + hh.reshape(-1)
        pos[i:i + count, 2] = cur + ww.reshape(-1)
        cur += max(lh, lw)
        i += count
    del image_at
    delta = int(pos.max()) + 1 - n if n else 0
    return pos, delta


# ---- the vision transformer (reference, NumPy float32) -------------------------------------


def _rms(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))) * w


def _erf(z: np.ndarray) -> np.ndarray:
    """erf in float64 to 1.2e-7 (Numerical Recipes' erfc Chebyshev fit): exact GELU needs it."""
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r = 1.0 - t * np.exp(poly)
    return np.where(z >= 0, r, -r)


def _gelu(x: np.ndarray) -> np.ndarray:
    """nn.GELU(): x * Phi(x) with the exact erf."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))).astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def window_index(grid: tuple[int, int, int], cfg: VisionConfig) -> tuple[np.ndarray, list[int]]:
    """(merge units in window order [t*lh*lw], window boundaries in patches [num_windows + 1])."""
    t, h, w = grid
    M = cfg.spatial_merge_size
    lh, lw = h // M, w // M
    win = cfg.window_size // M // cfg.patch_size
    index = np.arange(t * lh * lw).reshape(t, lh, lw)
    pad_h, pad_w = win - lh % win, win - lw % win
    nh, nw = (lh + pad_h) // win, (lw + pad_w) // win
    padded = np.full((t, lh + pad_h, lw + pad_w), -100, np.int64)
    padded[:, :lh, :lw] = index
    padded = padded.reshape(t, nh, win, nw, win).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, win, win)
    seqlens = (padded != -100).sum(axis=(2, 3)).reshape(-1)
    flat = padded.reshape(-1)
    order = flat[flat != -100]
    bounds = [0]
    for s in seqlens:
        if s:
            bounds.append(bounds[-1] + int(s) * M * M)
    return order, bounds


def read_hf(source: str) -> dict[str, np.ndarray]:
    """The vision tower's tensors of the HF checkpoint at source, float32, by their names
    without "model." ("visual.blocks.0.attn.qkv.weight", ...)."""
    ckpt = SafetensorsCheckpoint(source)
    try:
        tensors = {}
        for name in ckpt.entries:
            if name.startswith(("visual.", "model.visual.")):
                a = ckpt.read(name)
                tensors[name.removeprefix("model.")] = bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)
        return tensors
    finally:
        ckpt.close()


class VisionEncoder:
    """Qwen2.5-VL's vision tower with its weights, image by image. tensors: the checkpoint's
    "visual.*" as float32 arrays. kernels: the kernel module to run it on (None: NumPy only);
    dtype: the packed weights' format there; num_threads: its OpenMP threads."""

    def __init__(self, cfg: VisionConfig, tensors: dict[str, np.ndarray], kernels=None, dtype: str = "float32",
                 num_threads: int = 1, bf16_path: str | None = None):
        self.cfg = cfg
        self.kernels, self.num_threads = kernels, num_threads
        self.model = None if kernels is None else self._pack(tensors, kernels, dtype, bf16_path)
        C = cfg.hidden_size
        self.patch_w = np.ascontiguousarray(tensors["visual.patch_embed.proj.weight"].reshape(C, -1).T)   # [K, C]
        self.blocks = []
        for i in range(cfg.depth):
            p = f"visual.blocks.{i}."
            g = lambda n: tensors[p + n]   # noqa: E731
            self.blocks.append(dict(
                norm1=g("norm1.weight"), norm2=g("norm2.weight"),
                qkv_w=np.ascontiguousarray(g("attn.qkv.weight").T), qkv_b=g("attn.qkv.bias"),
                proj_w=np.ascontiguousarray(g("attn.proj.weight").T), proj_b=g("attn.proj.bias"),
                gate_w=np.ascontiguousarray(g("mlp.gate_proj.weight").T), gate_b=g("mlp.gate_proj.bias"),
                up_w=np.ascontiguousarray(g("mlp.up_proj.weight").T), up_b=g("mlp.up_proj.bias"),
                down_w=np.ascontiguousarray(g("mlp.down_proj.weight").T), down_b=g("mlp.down_proj.bias")))
        self.ln_q = tensors["visual.merger.ln_q.weight"]
        self.m0_w = np.ascontiguousarray(tensors["visual.merger.mlp.0.weight"].T)
        self.m0_b = tensors["visual.merger.mlp.0.bias"]
        self.m2_w = np.ascontiguousarray(tensors["visual.merger.mlp.2.weight"].T)
        self.m2_b = tensors["visual.merger.mlp.2.bias"]
        head_dim = C // cfg.num_heads
        spatial = head_dim // 2
        self.inv_freq = (1.0 / (cfg.rope_theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))
                         ).astype(np.float32)

    def _rotary(self, grid: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [N, head_dim] of each patch in merge-block order (h angles, then w, twice)."""
        t, h, w = grid
        M = self.cfg.spatial_merge_size
        hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // M, M, w // M, M)
        hpos = np.tile(hpos.reshape(shape).transpose(0, 2, 1, 3).reshape(-1), t)
        wpos = np.tile(wpos.reshape(shape).transpose(0, 2, 1, 3).reshape(-1), t)
        fh = hpos[:, None].astype(np.float32) * self.inv_freq
        fw = wpos[:, None].astype(np.float32) * self.inv_freq
        emb = np.concatenate([fh, fw], axis=-1)
        emb = np.concatenate([emb, emb], axis=-1)
        return np.cos(emb), np.sin(emb)

    def _pack(self, tensors: dict[str, np.ndarray], kernels, dtype: str, bf16_path: str | None):
        cfg, C = self.cfg, self.cfg.hidden_size
        packed, mat = vit_packer(dtype)

        mat("patch_embed", tensors["visual.patch_embed.proj.weight"].reshape(C, -1))
        for i in range(cfg.depth):
            p, q = f"visual.blocks.{i}.", f"blocks.{i}."
            packed.vectors[q + "norm1"], packed.vectors[q + "norm2"] = tensors[p + "norm1.weight"], tensors[p + "norm2.weight"]
            mat(q + "qkv", tensors[p + "attn.qkv.weight"], tensors[p + "attn.qkv.bias"])
            mat(q + "proj", tensors[p + "attn.proj.weight"], tensors[p + "attn.proj.bias"])
            for part in ("gate", "up", "down"):
                mat(q + part, tensors[p + f"mlp.{part}_proj.weight"], tensors[p + f"mlp.{part}_proj.bias"])
        packed.vectors["merger.ln_q"] = tensors["visual.merger.ln_q.weight"]
        mat("merger.0", tensors["visual.merger.mlp.0.weight"], tensors["visual.merger.mlp.0.bias"])
        mat("merger.2", tensors["visual.merger.mlp.2.weight"], tensors["visual.merger.mlp.2.bias"])
        return kernels.VisionModel(packed, dtype, cfg.depth, cfg.num_heads, cfg.spatial_merge_size ** 2, bf16_path)

    def encode(self, pixel_values: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
        """One image's pixel_values [N, K] -> its language-model rows [N / 4, E]."""
        return self.encode_many([(pixel_values, grid)])[0]

    def encode_many(self, images: list[tuple[np.ndarray, tuple[int, int, int]]]) -> list[np.ndarray]:
        """Images (pixel_values [N_i, K], grid) -> each one's rows [N_i / 4, E]: ONE compiled call
        over all their patches (the NumPy reference, image by image, without kernels)."""
        if self.model is None:
            return [self.encode_reference(p, g) for p, g in images]
        cfg = self.cfg
        unit = cfg.spatial_merge_size ** 2
        xs, coss, sins, orders, bounds, img_bounds = [], [], [], [], [0], [0]
        for pixel_values, grid in images:
            order, win_bounds = window_index(grid, cfg)
            perm = (order[:, None] * unit + np.arange(unit)).reshape(-1)
            cos, sin = self._rotary(grid)
            half = cos.shape[1] // 2         # cos = [angles, angles]: the kernel takes one half
            xs.append(pixel_values[perm])
            coss.append(cos[perm, :half])
            sins.append(sin[perm, :half])
            orders.append(order)
            bounds.extend(img_bounds[-1] + b for b in win_bounds[1:])
            img_bounds.append(img_bounds[-1] + len(perm))
        full = np.array([i in cfg.fullatt_block_indexes for i in range(cfg.depth)], np.uint8)
        merged = np.empty((img_bounds[-1] // unit, cfg.out_hidden_size), np.float32)
        self.kernels.vision_forward(self.model, np.ascontiguousarray(np.concatenate(xs), np.float32),
                                    np.ascontiguousarray(np.concatenate(coss)), np.ascontiguousarray(np.concatenate(sins)),
                                    np.asarray(bounds, np.int32), full, merged, self.num_threads,
                                    np.asarray(img_bounds, np.int32))
        outs = []
        for k, order in enumerate(orders):
            rows = merged[img_bounds[k] // unit:img_bounds[k + 1] // unit]
            out = np.empty_like(rows)
            out[order] = rows                # back to raster order
            outs.append(out)
        return outs

    def encode_reference(self, pixel_values: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
        """encode() in NumPy float32: the plain reference."""
        cfg = self.cfg
        unit = cfg.spatial_merge_size ** 2
        N = pixel_values.shape[0]
        H, C = cfg.num_heads, cfg.hidden_size
        D = C // H
        x = pixel_values.astype(np.float32) @ self.patch_w                 # [N, C]
        order, win_bounds = window_index(grid, cfg)
        perm = (order[:, None] * unit + np.arange(unit)).reshape(-1)
        x = x[perm]
        cos, sin = self._rotary(grid)
        cos, sin = cos[perm][:, None, :], sin[perm][:, None, :]
        full_bounds = [0, N]
        scale = np.float32(D ** -0.5)
        for i, b in enumerate(self.blocks):
            bounds = full_bounds if i in cfg.fullatt_block_indexes else win_bounds
            hN = _rms(x, b["norm1"])
            qkv = (hN @ b["qkv_w"] + b["qkv_b"]).reshape(N, 3, H, D)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            out = np.empty((N, H, D), np.float32)
            for s0, s1 in zip(bounds[:-1], bounds[1:]):
                qs, ks, vs = (a[s0:s1].transpose(1, 0, 2) for a in (q, k, v))   # [H, n, D]
                scores = (qs @ ks.transpose(0, 2, 1)) * scale
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                scores /= scores.sum(axis=-1, keepdims=True)
                out[s0:s1] = (scores @ vs).transpose(1, 0, 2)
            x = x + (out.reshape(N, C) @ b["proj_w"] + b["proj_b"])
            hN = _rms(x, b["norm2"])
            x = x + ((_silu(hN @ b["gate_w"] + b["gate_b"]) * (hN @ b["up_w"] + b["up_b"])) @ b["down_w"] + b["down_b"])
        merged = _rms(x, self.ln_q).reshape(N // unit, unit * C)
        merged = _gelu(merged @ self.m0_w + self.m0_b) @ self.m2_w + self.m2_b
        out = np.empty_like(merged)
        out[order] = merged                                                 # back to raster order
        return np.ascontiguousarray(out, dtype=np.float32)
