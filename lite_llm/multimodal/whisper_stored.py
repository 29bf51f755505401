"""Weights kept as a whisper.cpp file stores them (F32, F16 or ggml blocks), read when packed,
and their packing for the Whisper encoder's and decoder's kernels: below whisper.py,
whisper_decoder.py and whisper_ggml.py (the file reader), which all use it."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from lite_llm.model.files import pread_into
from lite_llm.model.gguf import NATIVE_TYPES, TENSOR_TYPES, dequantize


@dataclass(frozen=True)
class StoredMatrix:
    """A 2-D weight [N, K] as the file stores it (read when packed): F32 / F16 values or rows of
    ggml blocks."""
    path: str
    type_name: str
    shape: tuple[int, int]
    offset: int
    nbytes: int

    def raw(self) -> np.ndarray:
        """The stored bytes as rows: uint8 [N, bytes per row]."""
        out = np.empty(self.nbytes, np.uint8)
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            pread_into(fd, self.offset, out, self.path)
        finally:
            os.close(fd)
        return out.reshape(self.shape[0], -1)

    def values(self) -> np.ndarray:
        """float32 [N, K] (F16 widened, blocks dequantized)."""
        return dequantize(self.raw().reshape(-1), _TYPE_IDS[self.type_name], self.shape)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), K] of rows ids (the token embedding's lookup)."""
        raw = getattr(self, "_rows_cache", None)
        if raw is None:
            raw = self.raw()
            object.__setattr__(self, "_rows_cache", raw)
        picked = np.ascontiguousarray(raw[np.asarray(ids, np.int64)])
        return dequantize(picked.reshape(-1), _TYPE_IDS[self.type_name], (picked.shape[0], self.shape[1]))


_TYPE_IDS = {name: tid for tid, (name, _, _) in TENSOR_TYPES.items()}


def is_stored(t: dict) -> bool:
    return any(isinstance(v, StoredMatrix) for v in t.values())


def dense(t: dict) -> dict[str, np.ndarray]:
    """The same tensors all float32 (the NumPy references of tests)."""
    return {k: v.values() if isinstance(v, StoredMatrix) else v for k, v in t.items()}


def pack_stored(parts: list, bias: np.ndarray | None, threads: int | None = None):
    """One matrix from parts stacked by rows (q, k, v: one matrix), as a PackedMatrix in the parts'
    stored format: ggml blocks repacked into the GEMM's block panels, F16 / F32 into float panels.
    Parts of mixed formats (no whisper.cpp file has them) are widened to float32."""
    from lite_llm._kernels import layout     # deferred: the reader works without a kernel build
    from lite_llm._kernels.packed import PackedMatrix
    threads = threads or layout.load_threads()
    ks = {p.shape[1] for p in parts}
    if len(ks) != 1:
        raise ValueError("parts of one matrix with different widths")
    k, n = ks.pop(), sum(p.shape[0] for p in parts)
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    types = {p.type_name if isinstance(p, StoredMatrix) else "F32" for p in parts}
    fmt = types.pop() if len(types) == 1 else "F32"
    if fmt in NATIVE_TYPES:
        raw = np.concatenate([p.raw() for p in parts]) if len(parts) > 1 else parts[0].raw()
        return _pack_blocks(raw, fmt, n, k, b, threads)
    if fmt == "F16":
        w = np.concatenate([np.frombuffer(p.raw(), "<f2").reshape(p.shape) for p in parts]).astype(np.float16)
        return replace(PackedMatrix.of_float(layout.pack(w, "float16"), (n, k), "float16"), bias=b)
    w = np.concatenate([p.values() if isinstance(p, StoredMatrix) else np.asarray(p, np.float32) for p in parts])
    return replace(PackedMatrix.of_float(layout.pack(np.ascontiguousarray(w, np.float32), "float32"), (n, k),
                                         "float32"), bias=b)


def _pack_blocks(raw: np.ndarray, fmt: str, n: int, k: int, bias: np.ndarray | None, threads: int):
    """ggml block rows raw uint8 [n, bytes per row] of fmt -> a PackedMatrix of the block GEMM's panels."""
    from lite_llm._kernels import kernels, layout     # deferred: the reader works without a kernel build
    from lite_llm._kernels.packed import Part, PackedMatrix
    panels = -(-n // layout.PANEL)
    out = layout.aligned_empty((panels, kernels.qpanel_bytes(fmt, k)), np.uint8, weights=True)
    kernels.qpack_into(np.ascontiguousarray(raw), out, fmt, k, threads)
    return PackedMatrix(out, (n, k), (Part(fmt, 0, panels, 0, n, 0),), bias)


def quantizable(k: int) -> bool:
    """Whether rows of k values quantize to ggml blocks (whole 32-value blocks): not conv1's
    3 x 80 columns, which stay in the float dtype."""
    return k % 32 == 0


def pack_quantized(w: np.ndarray, bias: np.ndarray | None, type_name: str, threads: int | None = None):
    """A float32 weight [N, K] (K a multiple of 32) quantized at load to ggml blocks of type_name
    (Q8_0 or Q4_0, as ggml's quantizers make them) and packed as a whisper.cpp file's blocks are:
    the int8 GEMMs of a quantized file, from an HF checkpoint."""
    from lite_llm._kernels import kernels, layout     # deferred: the reader works without a kernel build
    threads = threads or layout.load_threads()
    n, k = w.shape
    raw = kernels.quantize_ggml(np.ascontiguousarray(w, np.float32), type_name, threads)
    return _pack_blocks(raw, type_name, n, k, None if bias is None else np.ascontiguousarray(bias, np.float32),
                        threads)


def pack_encoder(t: dict, cfg):
    """The encoder's PackedModel (whisper.WhisperEncoder._pack's names) from stored tensors."""
    from lite_llm._kernels.packed import PackedModel   # deferred: the reader works without a kernel build
    packed = PackedModel()
    packed.matrices["conv1"] = pack_stored([t["conv1.w"]], t["conv1.b"])
    packed.matrices["conv2"] = pack_stored([t["conv2.w"]], t["conv2.b"])
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        packed.matrices[p + "qkv"] = pack_stored([t[p + "q.w"], t[p + "k.w"], t[p + "v.w"]],
                                                 np.concatenate([t[p + "q.b"], t[p + "k.b"], t[p + "v.b"]]))
        for part in ("o", "up", "down"):
            packed.matrices[p + part] = pack_stored([t[p + part + ".w"]], t[p + part + ".b"])
        for part in ("ln1", "ln2"):
            packed.vectors[p + part + ".w"], packed.vectors[p + part + ".b"] = t[p + part + ".w"], t[p + part + ".b"]
    for name in ("pos", "ln.w", "ln.b"):
        packed.vectors[name] = np.ascontiguousarray(t[name], np.float32)
    return packed
