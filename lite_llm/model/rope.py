"""Rotary position tables: cos/sin per position for neox-style (rotate-half) RoPE.

Frequencies follow transformers' ROPE_INIT_FUNCTIONS (default, linear, llama3, yarn, longrope)
and its rotary-embedding modules: freqs = position * inv_freq in float32, and yarn's / longrope's
attention factor multiplies cos and sin. With partial rotary (Phi-4-mini) the tables cover the
first rope_dim(config) components of each head. Applying the rotation is the kernels' job.

LongRoPE (Phi-3) has short and long factors, and transformers (as Microsoft's reference code)
picks them by the length of the sequence: the long ones past original_max_position_embeddings
(O), the short ones otherwise, for every token of it. A sequence that grows past O while
decoding has its cache dropped and recomputed with the long factors (Phi3ForCausalLM.
prepare_inputs_for_generation), and so does the engine (Scheduler: a sequence whose keys were
turned by the short factors is recomputed when it outgrows O). The table of a model that can
switch (O < max_positions) has P + O rows: row p < P turns position p as a sequence of p + 1
tokens would (short below O, long from O on), row P + p (p < O) turns it with the long
factors, for the first O tokens of a sequence longer than O (longrope_rows() picks the rows).
"""
from __future__ import annotations

import math

import numpy as np

from lite_llm.config import ModelConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_dim(config: ModelConfig) -> int:
    """Components of each head that rotate: all, or the first head_dim x partial_rotary_factor."""
    factor = float((config.rope_scaling or {}).get("partial_rotary_factor", config.partial_rotary_factor))
    return int(config.head_dim * factor)


def longrope_switch(config: ModelConfig, max_positions: int) -> int:
    """O = original_max_position_embeddings of a LongRoPE model serving sequences longer than
    O (its factors then switch), else 0."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) not in ("longrope", "su"):
        return 0
    original = int(scaling["original_max_position_embeddings"])
    return original if max_positions > original else 0


def longrope_rows(positions: np.ndarray, long_seq: np.ndarray, switch: int, max_positions: int) -> np.ndarray | None:
    """The RoPE table row of each token (module docstring): positions [T] int32, long_seq [T]
    bool (the token's sequence is longer than switch = O); None where every row is the token's
    position."""
    move = long_seq & (positions < switch)
    if not move.any():
        return None
    return (positions + move * np.int32(max_positions)).astype(np.int32)


def inv_freq(config: ModelConfig, max_positions: int | None = None) -> tuple[np.ndarray, float]:
    """(inv_freq float32 [rope_dim/2], attention_factor) for config's rope type; max_positions:
    the sequence length LongRoPE picks its factors by (None: short)."""
    scaling = dict(config.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    dim = rope_dim(config)
    base = float(config.rope_theta)
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim                    # [D/2]
    freq = 1.0 / base ** exponents                                              # [D/2], float64
    if kind == "default":
        return freq.astype(np.float32), 1.0
    if kind in ("longrope", "su"):
        original = int(scaling["original_max_position_embeddings"])
        factor = scaling.get("factor") or config.max_position_embeddings / original
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        long = max_positions is not None and max_positions > original
        ext = np.asarray(scaling["long_factor" if long else "short_factor"], np.float32)
        if ext.shape != (dim // 2,):
            raise ValueError(f"longrope: {ext.shape[0]} factors for {dim // 2} frequencies")
        # transformers: 1 / (ext * base ** (arange / dim)) in float32
        powers = np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
        return (np.float32(1.0) / (ext * powers)).astype(np.float32), float(attention_factor)
    if kind == "freq_factors":   # a GGUF file's rope_freqs tensor: each frequency divided by its factor
        factors = np.asarray(scaling["factors"], np.float32)
        if factors.shape != (dim // 2,):
            raise ValueError(f"rope_freqs: {factors.shape[0]} factors for {dim // 2} frequencies")
        return (freq.astype(np.float32) / factors).astype(np.float32), 1.0
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
    """cos, sin float32 [max_positions, R/2] (R = rope_dim(config)): angle of position p for
    frequency pair i; [max_positions + O, R/2] for a LongRoPE model whose factors switch at O
    (module docstring).

    Rotate-half layout: pair i rotates elements (i, i + R/2) of each head.
    """
    switch = longrope_switch(config, max_positions)
    if not switch:
        return _table(*inv_freq(config, max_positions), np.arange(max_positions))
    short = _table(*inv_freq(config, switch), np.arange(switch))
    long = _table(*inv_freq(config, switch + 1), np.arange(max_positions))
    return tuple(np.concatenate([s, l[switch:], l[:switch]]) for s, l in zip(short, long))


def _table(freq: np.ndarray, attention_factor: float, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    angles = positions.astype(np.float32)[:, None] * freq[None, :]              # [P, D/2] float32
    cos = (np.cos(angles.astype(np.float64)) * attention_factor).astype(np.float32)
    sin = (np.sin(angles.astype(np.float64)) * attention_factor).astype(np.float32)
    return cos, sin
