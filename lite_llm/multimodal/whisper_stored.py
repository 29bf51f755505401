"""Weights kept where a file stores them, read when packed: a whisper.cpp file's (F32, F16 or
ggml blocks: StoredMatrix) and an HF checkpoint's float matrices (CheckpointMatrix), and their
packing for the Whisper encoder's and decoder's kernels: below whisper.py, whisper_decoder.py
and whisper_ggml.py (the file reader), which all use it."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from lite_llm.model.files import pread_into
from lite_llm.model.gguf import NATIVE_TYPES, TENSOR_TYPES, dequantize
from lite_llm.model.hf import SafetensorsCheckpoint
from lite_llm.model.weights import bf16_to_f32


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


@dataclass(frozen=True, eq=False)
class CheckpointMatrix:
    """A float weight of an HF safetensors checkpoint (F32, F16, BF16) seen as [N, K] (a conv1d
    weight [C, C_in, 3] as its rows flattened), read as float32 when packed, a slice of rows at a
    time where it is quantized: loading never holds the checkpoint's float32 matrices at once."""
    ckpt: SafetensorsCheckpoint
    name: str                           # as stored
    shape: tuple[int, int]

    @classmethod
    def of(cls, ckpt: SafetensorsCheckpoint, name: str) -> "CheckpointMatrix":
        shape = ckpt.entry(name).shape or (1,)
        return cls(ckpt, name, (shape[0], int(np.prod(shape[1:], dtype=np.int64))))

    def read(self, r0: int, r1: int) -> np.ndarray:
        """float32 [r1 - r0, K] of rows r0..r1 (F16 / BF16 widened, exactly); new memory. The
        file is closed again after each read (the next one opens it)."""
        try:
            a = self.ckpt.read_rows(self.name, r0, r1)
        finally:
            self.ckpt.close()
        a = a.reshape(r1 - r0, self.shape[1])
        return bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32, copy=False)

    def values(self) -> np.ndarray:
        """float32 [N, K]."""
        return self.read(0, self.shape[0])


def checkpoint_matrices(ckpt: SafetensorsCheckpoint, names: dict[str, str], get, lazy: bool):
    """mat(name): a weight of the checkpoint as [N, K] (more axes flattened into K): a float32
    array read now (get: towers.float_tensors', which raises for a missing name), or with lazy a
    CheckpointMatrix read when packed."""
    def mat(name: str):
        if not lazy or name not in names:
            a = get(name)
            return a.reshape(a.shape[0] if a.ndim else 1, -1)
        return CheckpointMatrix.of(ckpt, names[name])
    return mat


def is_stored(t: dict) -> bool:
    return any(isinstance(v, StoredMatrix) for v in t.values())


def dense(t: dict) -> dict[str, np.ndarray]:
    """The same tensors all float32 arrays (the NumPy references)."""
    return {k: v.values() if isinstance(v, (StoredMatrix, CheckpointMatrix)) else v for k, v in t.items()}


def stack_rows(parts: list) -> np.ndarray:
    """float32 [N, K] of parts (arrays, CheckpointMatrix) stacked by rows: q, k, v as one matrix,
    each part read into its rows (one part's float32 beside the whole at most)."""
    if len(parts) == 1:
        p = parts[0]
        return np.ascontiguousarray(p.values() if isinstance(p, CheckpointMatrix) else p, np.float32)
    return _float_rows(parts, 0, sum(p.shape[0] for p in parts))


def _float_rows(parts: list, r0: int, r1: int) -> np.ndarray:
    """float32 [r1 - r0, K]: rows r0..r1 of parts stacked by rows, each part's share read (from
    the file for a CheckpointMatrix) into its rows."""
    out = np.empty((r1 - r0, parts[0].shape[1]), np.float32)
    start = 0
    for p in parts:
        a, b = max(r0, start), min(r1, start + p.shape[0])
        if a < b:
            out[a - r0:b - r0] = p.read(a - start, b - start) if isinstance(p, CheckpointMatrix) else p[a - start:b - start]
        start += p.shape[0]
    return out


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


def pack_quantized(w, bias: np.ndarray | None, type_name: str, threads: int | None = None):
    """A float weight [N, K] (K a multiple of 32: an array, a CheckpointMatrix, or a list of them
    stacked by rows, as q, k, v) quantized at load to ggml blocks of type_name (Q8_0 or Q4_0, as
    ggml's quantizers make them) and packed as a whisper.cpp file's blocks are: the int8 GEMMs of
    a quantized file, from an HF checkpoint. A slice of rows (whole 16-row panels) is read,
    quantized and packed at a time, into the panels of the whole matrix: no float32 copy of the
    whole matrix, nor of its blocks unpacked (the same panels as quantizing it whole: ggml
    blocks are per row)."""
    from lite_llm._kernels import kernels, layout     # deferred: the reader works without a kernel build
    from lite_llm._kernels.packed import Part, PackedMatrix
    threads = threads or layout.load_threads()
    parts = [w] if isinstance(w, (np.ndarray, CheckpointMatrix)) else list(w)
    ks = {p.shape[1] for p in parts}
    if len(ks) != 1:
        raise ValueError("parts of one matrix with different widths")
    k, n = ks.pop(), sum(p.shape[0] for p in parts)
    panels = -(-n // layout.PANEL)
    out = layout.aligned_empty((panels, kernels.qpanel_bytes(type_name, k)), np.uint8, weights=True)
    per_slice = max(layout.PANEL, max(layout.STREAM_ELEMENTS, threads * (1 << 14)) // max(k, 1)
                    // layout.PANEL * layout.PANEL)
    for r0 in range(0, n, per_slice):
        r1 = min(n, r0 + per_slice)
        raw = kernels.quantize_ggml(_float_rows(parts, r0, r1), type_name, threads)
        kernels.qpack_into(raw, out[r0 // layout.PANEL: -(-r1 // layout.PANEL)], type_name, k, threads)
        del raw
    return PackedMatrix(out, (n, k), (Part(type_name, 0, panels, 0, n, 0),),
                        None if bias is None else np.ascontiguousarray(bias, np.float32))


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
