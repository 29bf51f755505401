"""Rotary position tables: cos/sin per position for neox-style (rotate-half) RoPE.

Frequencies follow transformers' ROPE_INIT_FUNCTIONS (default, linear, llama3, yarn) and its
rotary-embedding modules: freqs = position * inv_freq in float32, and yarn's attention factor
multiplies cos and sin. Applying the rotation is the kernels' job.
"""
from __future__ import annotations

import math

import numpy as np

from lite_llm.config import ModelConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def inv_freq(config: ModelConfig) -> tuple[np.ndarray, float]:
    """(inv_freq float32 [D/2], attention_factor) for config's rope type."""
    scaling = dict(config.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    dim = int(config.head_dim * float(scaling.get("partial_rotary_factor", 1.0)))
    base = float(config.rope_theta)
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim                    # [D/2]
    freq = 1.0 / base ** exponents                                              # [D/2], float64
    if kind == "default":
        return freq.astype(np.float32), 1.0
    if kind == "linear":
        return (freq.astype(np.float32) / np.float32(scaling["factor"])).astype(np.float32), 1.0
    original = int(scaling.get("original_max_position_embeddings") or config.max_position_embeddings)
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        low_wavelen, high_wavelen = original / low, original / high
        wavelen = 2 * math.pi / freq
        scaled = np.where(wavelen > low_wavelen, freq / factor, freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    if kind == "yarn":
        factor = scaling.get("factor")
        if factor is None:
            factor = config.max_position_embeddings / original
        factor = float(factor)
        attention_factor = scaling.get("attention_factor")
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
            else:
                attention_factor = get_mscale(factor)
        beta_fast = scaling.get("beta_fast") or 32
        beta_slow = scaling.get("beta_slow") or 1

        def correction_dim(rotations: float) -> float:
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001         # transformers' guard against a zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extrapolation = 1 - ramp
        interp = freq / factor
        mixed = interp * (1 - extrapolation) + freq * extrapolation
        return mixed.astype(np.float32), float(attention_factor)
    raise ValueError(f"rope scaling {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")


def rope_tables(config: ModelConfig, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 [max_positions, D/2]: angle of position p for frequency pair i.

    Rotate-half layout: pair i rotates elements (i, i + D/2) of each head.
    """
    freq, attention_factor = inv_freq(config)
    positions = np.arange(max_positions, dtype=np.float32)
    angles = positions[:, None] * freq[None, :]                                 # [P, D/2] float32
    cos = (np.cos(angles.astype(np.float64)) * attention_factor).astype(np.float32)
    sin = (np.sin(angles.astype(np.float64)) * attention_factor).astype(np.float32)
    return cos, sin
