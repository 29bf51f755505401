"""Weight dtype helpers: float32 <-> bfloat16 bits, and conversion to the engine dtype.

bfloat16 has no NumPy dtype, so it travels as np.uint16 holding the top 16 bits of a float32.
Repacking into kernel layouts lives with the kernels, not here.
"""
from __future__ import annotations

import numpy as np

DTYPES = ("float32", "bfloat16", "float16")


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float array (any shape) -> bf16 bits as uint16, rounding to nearest even.

    NaNs stay NaNs (quiet, sign kept): plain rounding could carry a NaN's low mantissa bits
    into the exponent and turn it into an infinity.
    """
    src = np.ascontiguousarray(x, dtype=np.float32)
    if src.size >= 4096:    # large tensors: the compiled, parallel conversion (same rounding)
        from lite_llm._kernels import kernels
        from lite_llm._kernels.layout import load_threads
        out = np.empty(src.shape, np.uint16)
        kernels.f32_to_bf16(src.reshape(-1), out.reshape(-1), load_threads())
        return out
    bits = src.view(np.uint32)
    # round to nearest even: add 0x7FFF plus the lowest kept bit, then truncate
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    out = rounded.astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16, any shape) -> float32, exact."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def convert(x: np.ndarray, dtype: str) -> np.ndarray:
    """Any float array (or bf16 uint16 bits) -> contiguous array in dtype.

    dtype: "float32" | "float16" | "bfloat16" (returned as uint16 bits). A uint16 input is
    taken as bf16 bits, the one way this package ever holds bf16.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if x.dtype == np.uint16:
        if dtype == "bfloat16":
            return np.ascontiguousarray(x)
        x = bf16_to_f32(x)
    if dtype == "bfloat16":
        return to_bf16(x)
    return np.ascontiguousarray(x, dtype=np.float32 if dtype == "float32" else np.float16)
