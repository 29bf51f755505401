"""Packed weight layouts the GEMM kernel streams (see src/kernels/gemm.h), built once at load.

Pure NumPy and the same for every ISA variant: a 2-D weight [N, K] (rows = output features)
becomes 16-row panels so that one vector load yields 16 outputs' weights:
    float32 / float16: [ceil(N/16), K, 16]
    bfloat16 (uint16 bits): [ceil(N/16), ceil(K/2), 16, 2]   (pairs feed vdpbf16ps)
Padding rows/columns are zero. Weights stored in ggml block types keep them: pack_blocks
repacks each part into the interleaved panels of src/kernels/qgemm.h (one part per stored
tensor, each its own type).

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

import math
import mmap
import os
import sys
import threading

import numpy as np

W_F32, W_BF16, W_F16 = 0, 1, 2  # must match the LL_W_* enum in gemm.h
PANEL = 16


def wtype_of(dtype: str) -> int:
    return {"float32": W_F32, "bfloat16": W_BF16, "float16": W_F16}[dtype]


def load_threads() -> int:
    """Threads for load-time conversions: every CPU this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:
        return os.cpu_count() or 1


_NP_DTYPES = {"bfloat16": np.uint16, "float32": np.float32, "float16": np.float16}


def packed_shape(n: int, k: int, dtype: str) -> tuple[int, ...]:
    """Shape of pack()'s result for an [n, k] weight."""
    num_panels = -(-n // PANEL)
    return (num_panels, -(-k // 2), PANEL, 2) if dtype == "bfloat16" else (num_panels, k, PANEL)


def _packed_out(n: int, k: int, dtype: str, out: np.ndarray | None) -> np.ndarray:
    shape = packed_shape(n, k, dtype)
    if out is None:
        return aligned_empty(shape, _NP_DTYPES[dtype], weights=True)
    if out.shape != shape or out.dtype != _NP_DTYPES[dtype] or not out.flags.c_contiguous:
        raise ValueError(f"pack: out {out.shape} {out.dtype} is not the C-contiguous {shape} {dtype} layout")
    return out


def pack(w: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """[N, K] weight (float32, float16, or bf16 bits as uint16) -> packed panels, 64-byte aligned
    (into `out` when given). The compiled packer does the work; pack_reference is the plain
    NumPy spec of the layout."""
    from lite_llm._kernels import kernels
    if w.ndim != 2:
        raise ValueError(f"pack: expected a 2-D weight, got shape {w.shape}")
    n, k = w.shape
    src = np.ascontiguousarray(w, _NP_DTYPES[dtype])
    out = _packed_out(n, k, dtype, out)
    kernels.pack_into(src, out, dtype, load_threads())
    return out


STREAM_ELEMENTS = 1 << 18   # values per slice of pack_rows (1 MiB as float32): a few hundred rows


def _as_stored(rows, types) -> list[tuple] | None:
    """kernels.load_panels' segments for a weight whose every part lies in the file as stored in
    one of `types` (model.weights.StackedRows.stored_parts), else None."""
    stored = rows.stored_parts() if hasattr(rows, "stored_parts") else None
    if stored is None or any(s.type_name not in types for s in stored):
        return None
    return [(s.view(), n, s.type_name, s.perm) for (n, _), s in zip(rows.parts, stored)]


def _release(rows) -> None:
    for s in rows.stored_parts():
        s.release()


# float types the packer converts straight from the file (little-endian files, as it reads them)
_STORED_FLOATS = ("F32", "F16", "BF16") if sys.byteorder == "little" else ()


def pack_rows(rows, dtype: str, slice_elements: int | None = None, out: np.ndarray | None = None,
              threads: int | None = None) -> np.ndarray:
    """pack() of a weight not read yet: `rows` has .shape [N, K], .align and .read(r0, r1) ->
    rows r0..r1 in dtype (model.weights.StackedRows). Where its parts lie in the file as stored
    (float parts of one type), they are packed straight from the mapped file in one parallel
    pass; else a slice of rows at a time (a multiple of 16 rows and of .align) is read and fills
    its own panels of the preallocated output. Either way no full-size unpacked or float32 copy
    of the weight ever exists. Equals pack(rows.read(0, N), dtype)."""
    from lite_llm._kernels import kernels
    n, k = rows.shape
    np_dtype = _NP_DTYPES[dtype]
    out = _packed_out(n, k, dtype, out)
    threads = threads or load_threads()
    segments = None if slice_elements else _as_stored(rows, _STORED_FLOATS)
    if segments is not None and len({s[2] for s in segments}) == 1:
        kernels.load_panels(segments, out, dtype, k, threads)
        del segments
        _release(rows)
        return out
    step = math.lcm(PANEL, getattr(rows, "align", 1))
    target = slice_elements or max(STREAM_ELEMENTS, threads * (1 << 14))   # >= 16K values per thread
    per_slice = max(step, target // max(k, 1) // step * step)
    for r0 in range(0, n, per_slice):
        r1 = min(n, r0 + per_slice)
        src = np.ascontiguousarray(rows.read(r0, r1), np_dtype)     # [r1 - r0, K]
        if src.shape != (r1 - r0, k):
            raise ValueError(f"pack_rows: rows {r0}..{r1} came back with shape {src.shape}, want {(r1 - r0, k)}")
        kernels.pack_into(src, out[r0 // PANEL: -(-r1 // PANEL)], dtype, threads)
        del src
    return out


def pack_gated(w, ffn_dim: int, dtype: str, threads: int | None = None) -> np.ndarray:
    """A gated MLP's [2F, K] weight (gate rows, then up rows; an array or a row source as
    pack_rows takes) packed for the fused kernel (gemm.h ll_gemm_gated): the gate half's
    panels, then the up half's, each padded to 16 rows on its own, so feature panel q is gate
    panel q and up panel ceil(F/16) + q."""
    if w.ndim != 2 or w.shape[0] != 2 * ffn_dim:
        raise ValueError(f"pack_gated: expected [{2 * ffn_dim}, K] (gate then up), got {w.shape}")
    half = packed_shape(ffn_dim, w.shape[1], dtype)
    out = aligned_empty((2 * half[0],) + half[1:], _NP_DTYPES[dtype], weights=True)
    two_parts = hasattr(w, "part") and [n for n, _ in w.parts] == [ffn_dim, ffn_dim]
    for i, start in enumerate((0, ffn_dim)):
        part = out[i * half[0]:(i + 1) * half[0]]
        if isinstance(w, np.ndarray):
            pack(w[start:start + ffn_dim], dtype, out=part)
        else:
            pack_rows(w.part(i) if two_parts else _RowRange(w, start, start + ffn_dim), dtype, out=part,
                      threads=threads)
    return out


class _RowRange:
    """Rows start..stop of a row source (pack_rows' interface)."""

    def __init__(self, src, start: int, stop: int):
        self.src, self.start, self.shape = src, start, (stop - start, src.shape[1])
        self.align = getattr(src, "align", 1)
        if start % self.align:
            raise ValueError(f"rows from {start} of a weight read in steps of {self.align}")

    def read(self, r0: int, r1: int) -> np.ndarray:
        return self.src.read(self.start + r0, self.start + r1)


def pack_blocks(rows, threads: int | None = None) -> tuple[np.ndarray, list[tuple]]:
    """A weight whose parts are all stored in ggml block types (rows.block_types(), a
    model.weights.StackedRows) repacked as stored into the interleaved panels of
    src/kernels/qgemm.h: each part gets its own ceil(rows / 16) panels, in order, so a fused
    matrix may mix types (Q4_K q and k with a Q6_K v) and a gated MLP's gate part is panels
    0..ng and its up part ng..2 ng. A part that lies in the file as stored is packed straight
    from the mapped file in one parallel pass; others (quantized at load, converted from HF
    layouts) are read a slice at a time (a multiple of 16 rows and of rows.align), never the
    whole tensor.

    Returns (packed uint8 [bytes], parts [(type, first panel, end panel, first column,
    end column, byte offset)]) as the kernel Model takes them."""
    from lite_llm._kernels import kernels
    types = rows.block_types()
    if types is None:
        raise ValueError("pack_blocks: every part of the weight must be block-quantized")
    k = rows.cols
    sizes = [(-(-n // PANEL), kernels.qpanel_bytes(t, k)) for (n, _), t in zip(rows.parts, types)]
    out = aligned_empty((sum(p * b for p, b in sizes),), np.uint8, weights=True)
    threads = threads or load_threads()
    step = math.lcm(PANEL, getattr(rows, "align", 1))
    per_slice = max(step, STREAM_ELEMENTS // max(k, 1) // step * step)
    parts, panel, col, off = [], 0, 0, 0
    for i, (((n, _), (type_name, read_raw)), (num_panels, panel_bytes)) in enumerate(zip(zip(rows.parts, rows.blocks),
                                                                                         sizes)):
        region = out[off:off + num_panels * panel_bytes].reshape(num_panels, panel_bytes)
        one = rows.part(i) if hasattr(rows, "part") else None
        segments = None if one is None else _as_stored(one, (type_name,))
        if segments is not None:
            kernels.load_panels(segments, region, type_name, k, threads)
            del segments
            _release(one)
        else:
            for r0 in range(0, n, per_slice):
                r1 = min(n, r0 + per_slice)
                raw = np.ascontiguousarray(read_raw(r0, r1))
                kernels.qpack_into(raw, region[r0 // PANEL: -(-r1 // PANEL)], type_name, k, threads)
                del raw
        parts.append((type_name, panel, panel + num_panels, col, col + n, off))
        panel, col, off = panel + num_panels, col + n, off + num_panels * panel_bytes
    return out, parts


def pack_reference(w: np.ndarray, dtype: str) -> np.ndarray:
    """NumPy spec of pack()."""
    if w.ndim != 2:
        raise ValueError(f"pack: expected a 2-D weight, got shape {w.shape}")
    n, k = w.shape
    num_panels = -(-n // PANEL)
    if dtype == "bfloat16":
        k2 = -(-k // 2)
        padded = np.zeros((num_panels * PANEL, k2 * 2), np.uint16)
        padded[:n, :k] = w
        src = padded.reshape(num_panels, PANEL, k2, 2).transpose(0, 2, 1, 3)
    else:
        padded = np.zeros((num_panels * PANEL, k), np.float32 if dtype == "float32" else np.float16)
        padded[:n] = w
        src = padded.reshape(num_panels, PANEL, k).transpose(0, 2, 1)
    out = aligned_empty(src.shape, src.dtype)
    out[...] = src
    return out


def unpack(packed: np.ndarray, n: int, k: int, dtype: str) -> np.ndarray:
    """Inverse of pack (tests and debugging)."""
    if dtype == "bfloat16":
        num_panels, k2 = packed.shape[:2]
        return packed.transpose(0, 2, 1, 3).reshape(num_panels * PANEL, k2 * 2)[:n, :k]
    num_panels = packed.shape[0]
    return packed.transpose(0, 2, 1).reshape(num_panels * PANEL, k)[:n]


_HUGE_PAGE = 2 << 20


def _advise(mm: mmap.mmap, advice: str, start: int, length: int) -> None:
    """madvise(advice) on a range of an anonymous mapping, where the platform has it: page-size
    hints only, never a reason to fail."""
    if hasattr(mm, "madvise") and hasattr(mmap, advice):
        try:
            mm.madvise(getattr(mmap, advice), start, length)
        except OSError:
            pass
_arena = threading.local()


class WeightArena:
    """Packed weights of one model, in mappings the kernel may back with 2 MB pages: the
    decode step streams every weight byte once per token, and with 4 KB pages the same
    stream runs ~10 % slower (a plain read of 270 MB here: 9.5 ms with 4 KB pages, 8.5 ms
    with huge pages). numpy only asks for huge pages on arrays of 4 MB or more, and most
    per-layer matrices are smaller, so they share segments here instead.

        with WeightArena():       # aligned_empty(..., weights=True) allocates from it
            ...pack...
    """
    SEGMENT = 64 << 20

    def __init__(self):
        self._seg: np.ndarray | None = None
        self._off = 0

    def __enter__(self):
        _arena.current = self
        return self

    def __exit__(self, *exc):
        _arena.current = None
        self._seg = None    # each array keeps its own segment alive

    def alloc(self, nbytes: int, align: int) -> np.ndarray:
        """nbytes of uint8, `align`-aligned, from the current segment or a new one."""
        start = -(-self._off // align) * align
        if self._seg is None or start + nbytes > len(self._seg):
            size = max(self.SEGMENT, -(-nbytes // _HUGE_PAGE) * _HUGE_PAGE)
            mm = mmap.mmap(-1, size + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            raw = np.frombuffer(mm, np.uint8)
            head = (-raw.ctypes.data) % _HUGE_PAGE    # start the segment on a 2 MB boundary
            _advise(mm, "MADV_HUGEPAGE", head, size)
            self._seg, start = raw[head:head + size], 0
        self._off = start + nbytes
        return self._seg[start:start + nbytes]


def aligned_empty(shape, dtype, align: int = 64, weights: bool = False) -> np.ndarray:
    """An uninitialised array whose data starts on an `align`-byte boundary (cache lines);
    weights=True takes it from the active WeightArena, if any."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    arena = getattr(_arena, "current", None)
    if weights and arena is not None and hasattr(mmap, "MAP_PRIVATE"):
        return arena.alloc(nbytes, align).view(dtype).reshape(shape)
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_zeros(shape, dtype, align: int = 64) -> np.ndarray:
    """Zeros the OS maps lazily, so a large KV cache costs neither start-up time nor resident
    memory until blocks are written. Large arrays get their own anonymous mapping with small
    pages: numpy asks for transparent huge pages on big arrays, and then the first write to a
    48 KB cache block would make 2 MB resident."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes >= 1 << 20 and hasattr(mmap, "MAP_PRIVATE"):
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        _advise(mm, "MADV_NOHUGEPAGE", 0, nbytes)
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
