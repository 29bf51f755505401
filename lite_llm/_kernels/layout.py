"""Packed weight layouts the GEMM kernel streams (see src/kernels/gemm.h), built once at load.

Pure NumPy and the same for every ISA variant: a 2-D weight [N, K] (rows = output features)
becomes 16-row panels so that one vector load yields 16 outputs' weights:
    float32 / float16: [ceil(N/16), K, 16]
    bfloat16 (uint16 bits): [ceil(N/16), ceil(K/2), 16, 2]   (pairs feed vdpbf16ps)
Padding rows/columns are zero. Weights stored in ggml block types keep them: pack_blocks
repacks each part into the interleaved panels of src/kernels/qgemm.h (one part per stored
tensor, each its own type).

The paged KV cache's layouts, and the zeroed arrays it lives in, are kv_layout.py's (the
compiled kernels read them); this module re-exports them for its callers.
"""
from __future__ import annotations

import math
import mmap
import os
import sys
import threading

import numpy as np

from lite_llm._kernels import kernels
from lite_llm._kernels.kv_layout import (KV_DTYPES, KV_NUMPY, KV_SCALE_BYTES, advise,  # noqa: F401  (re-exported)
                                         aligned_zeros, kv_cache_shapes, kv_from_layout, kv_geometry, kv_is_8bit,
                                         kv_region_bytes, kv_to_layout, kv_type)

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


FP8_CHUNK = 128      # columns per scale of a row (LL_FP8_CHUNK in gemm.h)


def fp8_panel_bytes(k: int) -> int:
    """Bytes of one FP8 panel (gemm.h LL_W_FP8): per 128 columns, 16 float32 scales, then 16 bytes a column."""
    return -(-k // FP8_CHUNK) * 64 + k * 16


def pack_fp8(q: np.ndarray, scales: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """FP8 weights kept at one byte a weight: q uint8 [N, K] (float8_e4m3fn bytes) and scales
    float32 [N, ceil(K / 128)] (row n's scale for its columns 128 c .. 128 c + 127; W[n, k] =
    e4m3(q[n, k]) * scales[n, k // 128]) -> uint8 panels [ceil(N / 16), fp8_panel_bytes(K)]:
    per 128-column chunk of a panel, its 16 rows' scales times 256 (float32, machine order),
    then the chunk's bytes column by column, 16 rows a column; padding rows are zero."""
    n, k = q.shape
    chunks = -(-k // FP8_CHUNK)
    if scales.shape != (n, chunks):
        raise ValueError(f"pack_fp8: scales {scales.shape} for a [{n}, {k}] weight, want [{n}, {chunks}]")
    num_panels = -(-n // PANEL)
    if out is None:
        out = aligned_empty((num_panels, fp8_panel_bytes(k)), np.uint8, weights=True)
    if out.shape != (num_panels, fp8_panel_bytes(k)) or out.dtype != np.uint8:
        raise ValueError(f"pack_fp8: out {out.shape} {out.dtype} is not uint8 [{num_panels}, {fp8_panel_bytes(k)}]")
    qp = np.zeros((num_panels * PANEL, k), np.uint8)
    qp[:n] = q
    qp = qp.reshape(num_panels, PANEL, k).transpose(0, 2, 1)               # [P, K, 16]
    sp = np.zeros((num_panels * PANEL, chunks), np.float32)
    sp[:n] = np.asarray(scales, np.float32) * np.float32(256)              # exact: a power of two
    sp = np.ascontiguousarray(sp.reshape(num_panels, PANEL, chunks).transpose(0, 2, 1))   # [P, C, 16]
    whole = k // FP8_CHUNK
    if whole:
        body = out[:, :whole * (64 + FP8_CHUNK * 16)].reshape(num_panels, whole, 64 + FP8_CHUNK * 16)
        body[:, :, :64] = sp[:, :whole].view(np.uint8).reshape(num_panels, whole, 64)
        body[:, :, 64:] = qp[:, :whole * FP8_CHUNK].reshape(num_panels, whole, FP8_CHUNK * 16)
    if k > whole * FP8_CHUNK:
        tail = out[:, whole * (64 + FP8_CHUNK * 16):]
        tail[:, :64] = sp[:, whole].view(np.uint8).reshape(num_panels, 64)
        tail[:, 64:] = qp[:, whole * FP8_CHUNK:].reshape(num_panels, -1)
    return out


def unpack_fp8(packed: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of pack_fp8 (tests): (q uint8 [N, K], scales float32 [N, ceil(K / 128)])."""
    num_panels, chunks = packed.shape[0], -(-k // FP8_CHUNK)
    q = np.empty((num_panels, k, PANEL), np.uint8)
    s = np.empty((num_panels, chunks, PANEL), np.float32)
    for c in range(chunks):
        c0, c1 = c * FP8_CHUNK, min(k, (c + 1) * FP8_CHUNK)
        at = c * (64 + FP8_CHUNK * 16)
        s[:, c] = np.ascontiguousarray(packed[:, at:at + 64]).view(np.float32)
        q[:, c0:c1] = packed[:, at + 64:at + 64 + (c1 - c0) * 16].reshape(num_panels, c1 - c0, PANEL)
    return (q.transpose(0, 2, 1).reshape(-1, k)[:n],
            s.transpose(0, 2, 1).reshape(-1, chunks)[:n] / np.float32(256))


def _fp8_raw(rows, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows r0..r1 of an all-"F8_E4M3" StackedRows: (q uint8 [r1 - r0, K], scales float32
    [r1 - r0, ceil(K / 128)]), from its parts' raw readers (hfquant.QuantLinear.read_blocks)."""
    k, chunks = rows.cols, -(-rows.cols // FP8_CHUNK)
    pieces, start = [], 0
    for (count, _), (_, read_raw) in zip(rows.parts, rows.blocks):
        a, b = max(r0, start), min(r1, start + count)
        if a < b:
            pieces.append(read_raw(a - start, b - start))
        start += count
    raw = np.concatenate(pieces) if len(pieces) != 1 else pieces[0]
    scales = np.ascontiguousarray(raw[:, :4 * chunks]).view("<f4").astype(np.float32)
    return raw[:, 4 * chunks:4 * chunks + k], scales


def pack_fp8_rows(rows, gated: bool = False) -> np.ndarray:
    """pack_fp8 of a weight whose every part is "F8_E4M3" (rows.block_types()), a slice of rows
    at a time; gated: a gated MLP's [2F, K] (gate part, then up) in pack_gated's panel order,
    each half padded to 16 rows on its own."""
    n, k = rows.shape
    if gated:
        f = n // 2
        ng = -(-f // PANEL)
        out = aligned_empty((2 * ng, fp8_panel_bytes(k)), np.uint8, weights=True)
        halves = [rows.part(0), rows.part(1)] if [c for c, _ in rows.parts] == [f, f] else None
        if halves is None:
            raise ValueError("pack_fp8_rows: a gated FP8 weight must be a gate part and an up part of F rows")
        for i, half in enumerate(halves):
            _fp8_slices(half, out[i * ng:(i + 1) * ng])
        return out
    out = aligned_empty((-(-n // PANEL), fp8_panel_bytes(k)), np.uint8, weights=True)
    _fp8_slices(rows, out)
    return out


def _fp8_slices(rows, out: np.ndarray) -> None:
    n, k = rows.shape
    step = math.lcm(PANEL, getattr(rows, "align", 1))
    per_slice = max(step, STREAM_ELEMENTS // max(k, 1) // step * step)
    for r0 in range(0, n, per_slice):
        r1 = min(n, r0 + per_slice)
        q, scales = _fp8_raw(rows, r0, r1)
        pack_fp8(q, scales, out=out[r0 // PANEL: -(-r1 // PANEL)])


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
            advise(mm, "MADV_HUGEPAGE", head, size)
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
