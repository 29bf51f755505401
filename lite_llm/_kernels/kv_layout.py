"""The paged KV cache's layout, NumPy only: the compiled kernels (forward.pxi, ops.pxi,
vision.pxi) check caches against it, the runner allocates them with it, and nothing here calls
the kernels (layout.py, which packs weights with them, re-exports these names).

The paged KV cache of one layer, per (block, kv head) (see src/kernels/attention.h):
    float32: K [D, B] (transposed), V [B, D]
    bfloat16 (uint16 bits): K [D/2, B, 2] (pairs of components), V [B/2, D, 2] (pairs of keys)
    int8, fp8_e4m3, fp8_e5m2 (one byte per value: int8 / uint8 arrays): K codes [D, B] or
        V codes [B, D], then the B rows' fp32 scales as 4 B bytes; the array's shape is
        [blocks, Hkv, D + 4, B] for K and V alike (it counts bytes: (D + 4) B per region).
        value = decode(code) * scale, one scale per (token, kv head) row, set when the row is
        written: scale = max |x| / qmax (127, 448, 57344), code = x / scale rounded to nearest
        even (int8: clamped to +-127; fp8: OCP e4m3fn / e5m2, saturating). A block fills a
        token at a time in decode, so a scale per block could not be known when its first
        row is written; per row it costs 4 / D bytes per value (1.06 bytes at D = 64, against
        2 for bf16). fp8 gets the same per-row scale rather than vLLM's per-tensor 1.0: the
        same kernel path, and no value falls into fp8's subnormal range or past its maximum.
kv_to_layout / kv_from_layout are the NumPy spec, from and to the logical [blocks, Hkv, B, D]
(8-bit: codes [blocks, Hkv, B, D] and scales [blocks, Hkv, B]).
"""
from __future__ import annotations

import mmap

import numpy as np


def advise(mm: mmap.mmap, advice: str, start: int, length: int) -> None:
    """madvise(advice) on a range of an anonymous mapping, where the platform has it: page-size
    hints only, never a reason to fail."""
    if hasattr(mm, "madvise") and hasattr(mmap, advice):
        try:
            mm.madvise(getattr(mmap, advice), start, length)
        except OSError:
            pass


def aligned_zeros(shape, dtype, align: int = 64) -> np.ndarray:
    """Zeros the OS maps lazily, so a large KV cache costs neither start-up time nor resident
    memory until blocks are written. Large arrays get their own anonymous mapping with small
    pages: numpy asks for transparent huge pages on big arrays, and then the first write to a
    48 KB cache block would make 2 MB resident."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes >= 1 << 20 and hasattr(mmap, "MAP_PRIVATE"):
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advise(mm, "MADV_NOHUGEPAGE", 0, nbytes)
        return np.frombuffer(mm, dtype).reshape(shape)   # page-aligned; the array keeps mm alive
    raw = np.zeros(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


KV_DTYPES = ("float32", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2")   # index = LL_KV_* in attention.h
KV_NUMPY = {"float32": np.float32, "bfloat16": np.uint16, "int8": np.int8, "fp8_e4m3": np.uint8, "fp8_e5m2": np.uint8}
KV_SCALE_BYTES = 4     # one fp32 scale per (token, kv head) row of an 8-bit cache


def kv_is_8bit(kv_dtype: str) -> bool:
    return np.dtype(KV_NUMPY[kv_dtype]).itemsize == 1


def kv_region_bytes(kv_dtype: str, block_size: int, head_dim: int) -> int:
    """Bytes of one (block, kv head) of a K or V cache (attention.h ll_kv_region_bytes)."""
    if kv_is_8bit(kv_dtype):
        return (head_dim + KV_SCALE_BYTES) * block_size
    return head_dim * block_size * np.dtype(KV_NUMPY[kv_dtype]).itemsize


def kv_type(cache: np.ndarray, kv_dtype: str | None = None) -> int:
    """The kernel's LL_KV_* code of a cache array: kv_dtype names it (it must match the array's
    dtype), else the array's dtype does; uint8 is fp8 of either kind, so it needs the name."""
    if kv_dtype is None:
        names = [n for n in KV_DTYPES if KV_NUMPY[n] == cache.dtype]
        if len(names) != 1:
            raise ValueError(f"a KV cache of dtype {cache.dtype} needs its format named: "
                             f"kv_dtype one of {', '.join(names or KV_DTYPES)}")
        kv_dtype = names[0]
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"KV cache dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
    if cache.dtype != KV_NUMPY[kv_dtype]:
        raise ValueError(f"a {kv_dtype} KV cache is a {np.dtype(KV_NUMPY[kv_dtype])} array, not {cache.dtype}")
    return KV_DTYPES.index(kv_dtype)


def kv_cache_shapes(num_blocks: int, num_kv_heads: int, block_size: int, head_dim: int,
                    kv_dtype: str | bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(K shape, V shape) of one layer's cache in the kernel's layout, for a KV_DTYPES name
    (True / False: bfloat16 / float32)."""
    if isinstance(kv_dtype, bool):
        kv_dtype = "bfloat16" if kv_dtype else "float32"
    nb, hkv, b, d = num_blocks, num_kv_heads, block_size, head_dim
    if kv_is_8bit(kv_dtype):
        return (nb, hkv, d + KV_SCALE_BYTES, b), (nb, hkv, d + KV_SCALE_BYTES, b)
    if kv_dtype == "bfloat16":
        if b % 2 or d % 2:
            raise ValueError(f"a bf16 KV cache needs an even block_size and head_dim, got {b} and {d}")
        return (nb, hkv, d // 2, b, 2), (nb, hkv, b // 2, d, 2)
    return (nb, hkv, d, b), (nb, hkv, b, d)


def kv_geometry(cache: np.ndarray, which: str) -> tuple[int, int, int, int]:
    """(num_blocks, num_kv_heads, block_size, head_dim) of a K (which="k") or V cache array."""
    if which not in ("k", "v"):
        raise ValueError(f"which must be 'k' or 'v', not {which!r}")
    if cache.dtype == np.uint16 and cache.ndim == 5 and cache.shape[4] == 2:
        nb, hkv, a, b = cache.shape[:4]
        return (nb, hkv, b, 2 * a) if which == "k" else (nb, hkv, 2 * a, b)
    if cache.dtype == np.float32 and cache.ndim == 4:
        nb, hkv, a, b = cache.shape
        return (nb, hkv, b, a) if which == "k" else (nb, hkv, a, b)
    if cache.dtype in (np.int8, np.uint8) and cache.ndim == 4 and cache.shape[2] > KV_SCALE_BYTES:
        nb, hkv, a, b = cache.shape
        return nb, hkv, b, a - KV_SCALE_BYTES
    raise ValueError(f"{which.upper()} cache of shape {cache.shape} and dtype {cache.dtype} is not a KV cache "
                     "(float32 K [blocks, Hkv, D, B] / V [blocks, Hkv, B, D], bf16 bits "
                     "K [blocks, Hkv, D/2, B, 2] / V [blocks, Hkv, B/2, D, 2], or 8-bit codes and scales "
                     "[blocks, Hkv, D + 4, B])")


def kv_to_layout(logical: np.ndarray, which: str, scales: np.ndarray | None = None) -> np.ndarray:
    """Logical [blocks, Hkv, B, D] (float32, bf16 bits, or 8-bit codes with their scales
    [blocks, Hkv, B] float32) -> the kernel's K or V layout."""
    nb, hkv, b, d = logical.shape
    if scales is not None:
        if logical.dtype not in (np.int8, np.uint8) or scales.shape != (nb, hkv, b):
            raise ValueError(f"8-bit KV codes {logical.shape} {logical.dtype} with scales {scales.shape}")
        codes = logical.transpose(0, 1, 3, 2) if which == "k" else logical
        out = np.empty((nb, hkv, (d + KV_SCALE_BYTES) * b), logical.dtype)
        out[:, :, :d * b] = codes.reshape(nb, hkv, d * b)
        out[:, :, d * b:] = np.ascontiguousarray(scales, np.float32).view(logical.dtype).reshape(nb, hkv, -1)
        return out.reshape(nb, hkv, d + KV_SCALE_BYTES, b)
    if logical.dtype == np.uint16:
        if which == "k":
            out = logical.reshape(nb, hkv, b, d // 2, 2).transpose(0, 1, 3, 2, 4)
        else:
            out = logical.reshape(nb, hkv, b // 2, 2, d).transpose(0, 1, 2, 4, 3)
    else:
        out = logical.transpose(0, 1, 3, 2) if which == "k" else logical
    return np.ascontiguousarray(out)


def kv_from_layout(cache: np.ndarray, which: str):
    """Inverse of kv_to_layout: logical [blocks, Hkv, B, D], or (codes, scales) of an 8-bit cache."""
    nb, hkv, b, d = kv_geometry(cache, which)
    if cache.dtype in (np.int8, np.uint8):
        flat = np.ascontiguousarray(cache).reshape(nb, hkv, -1)
        scales = np.ascontiguousarray(flat[:, :, d * b:]).view(np.float32).reshape(nb, hkv, b)
        codes = flat[:, :, :d * b].reshape(nb, hkv, d, b).transpose(0, 1, 3, 2) if which == "k" \
            else flat[:, :, :d * b].reshape(nb, hkv, b, d)
        return np.ascontiguousarray(codes), scales.copy()
    if cache.dtype == np.uint16:
        if which == "k":
            out = cache.transpose(0, 1, 3, 2, 4).reshape(nb, hkv, b, d)
        else:
            out = cache.transpose(0, 1, 2, 4, 3).reshape(nb, hkv, b, d)
    else:
        out = cache.transpose(0, 1, 3, 2) if which == "k" else cache
    return np.ascontiguousarray(out)
