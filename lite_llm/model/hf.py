"""Hugging Face checkpoints: config.json (mapped onto ModelConfig by the architecture's recipe,
lite_llm/model/arch/), and safetensors (single or sharded) read with pread into new buffers (a
slice of rows at a time if asked); the recipes map their names onto the canonical tensor names
of lite_llm/model/__init__.py.

Tensors come out in the file's own dtype (float32, float16, or bf16 bits as uint16); dtype
conversion and progress reporting are the loader's. Names on the Hub are hub.py's.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from functools import partial

import numpy as np

from lite_llm.model import hfquant
from lite_llm.model.files import MappedFile, ModelLoadError, pread_into
from lite_llm.model.weights import StackedRows, StoredPart

_SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
                       "F64": np.dtype("<f8"), "I32": np.dtype("<i4"),   # I32: AWQ / GPTQ packed values
                       "I8": np.dtype("i1"),                              # I8: W8A8 weights
                       "U8": np.dtype("u1"),                              # U8: MXFP4 blocks and scales (gpt-oss)
                       "F8_E4M3": np.dtype("u1"),                         # FP8 weights, as their bytes
                       "I64": np.dtype("<i8")}        # I64: buffers saved beside weights (BERT's position_ids)
_STORED_TYPES = {"<f4": "F32", "<f2": "F16", "<u2": "BF16"}     # numpy dtype str -> type the packer takes


# ---- config ------------------------------------------------------------------------------


def read_config_json(path: str) -> dict:
    """The raw config.json dict of the HF directory `path` (arch.read_config makes the
    ModelConfig of it)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise ModelLoadError(f"{cfg_path}: missing config.json (not a Hugging Face model directory?)")
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{cfg_path}: unreadable config.json: {e}") from e
    return raw


# ---- safetensors ---------------------------------------------------------------------------


def _num_rows(shape: tuple[int, ...], flat: bool) -> int:
    """Rows of a tensor of `shape`: its outermost axis, or (flat) all but its innermost."""
    if not shape:
        return 1
    return int(np.prod(shape[:-1], dtype=np.int64)) if flat else shape[0]


@dataclass(frozen=True)
class _Entry:
    file: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int          # absolute byte offsets in file
    end: int
    stype: str = ""     # the safetensors dtype ("F8_E4M3" is read as its bytes, uint8)


class SafetensorsCheckpoint:
    """All tensors of a directory's *.safetensors (one file, or shards listed in the index)."""

    def __init__(self, path: str):
        self.path = path
        index_path = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index_path):
            with open(index_path, encoding="utf-8") as fh:
                weight_map = json.load(fh).get("weight_map", {})
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise ModelLoadError(f"{path}: no *.safetensors weights found")
        self.entries: dict[str, _Entry] = {}
        self.read_names: set[str] = set()   # tensors entry() served: those a recipe used (loader.unread_tensors)
        self.names_only = False     # True: reads give zeros, no tensor data (the loader's check of names first)
        self._fds: dict[str, int] = {}
        self._maps: dict[str, MappedFile] = {}
        self.quant = None       # hfquant.QuantSpec of an AWQ / GPTQ checkpoint (the loader sets it)
        for name in files:
            self._read_header(os.path.join(path, name))

    def close(self) -> None:
        """Close the files (headers stay; a later read opens them again)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
        maps, self._maps = self._maps, {}
        for m in maps.values():
            m.close()

    def stored(self, name: str, r0: int = 0, r1: int | None = None, flat: bool = False) -> StoredPart | None:
        """Where rows r0..r1 (default: all) of tensor `name` lie, for packing straight from the
        mapped file; None for a type the packer does not take as stored (float64, integers).
        flat: rows of the tensor seen as 2-D [prod(shape[:-1]), shape[-1]] (3-D expert tensors)."""
        e = self.entry(name)
        type_name = _STORED_TYPES.get(e.dtype.str)
        if type_name is None:
            return None
        rows = _num_rows(e.shape, flat)
        row_bytes = (e.end - e.begin) // rows if rows else 0
        begin, nbytes = e.begin + r0 * row_bytes, ((rows if r1 is None else r1) - r0) * row_bytes
        mapped = self._maps.get(e.file) or self._maps.setdefault(e.file, MappedFile(e.file))
        return StoredPart(view=partial(mapped.view, begin, nbytes), nbytes=nbytes, type_name=type_name,
                          release=partial(mapped.release, begin, nbytes))

    def _read_header(self, file: str) -> None:
        if not os.path.exists(file):
            raise ModelLoadError(f"{file}: safetensors shard listed in the index is missing")
        size = os.path.getsize(file)
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{file}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                raise ModelLoadError(f"{file}: truncated safetensors file: header of {n} bytes, file has {size}")
            try:
                header = json.loads(fh.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ModelLoadError(f"{file}: corrupt safetensors header: {e}") from e
        data_start = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            begin, end = (data_start + int(o) for o in meta["data_offsets"])
            if end > size:
                raise ModelLoadError(f"{file}: truncated safetensors file: tensor {name!r} needs bytes "
                                     f"{begin}..{end}, file has {size}")
            dt = _SAFETENSORS_DTYPES.get(meta["dtype"])
            if dt is None:
                raise ModelLoadError(f"{file}: tensor {name!r} has dtype {meta['dtype']}, not a type "
                                     f"this loader reads (F32, F16, BF16, F64; I32 / I8 for AWQ, GPTQ, W8A8 values; U8 for MXFP4; "
                                     "F8_E4M3 for FP8)")
            shape = tuple(int(s) for s in meta["shape"])
            if (end - begin) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
                raise ModelLoadError(f"{file}: tensor {name!r}: {end - begin} bytes do not hold "
                                     f"{meta['dtype']} {list(shape)}")
            self.entries[name] = _Entry(file, dt, shape, begin, end, meta["dtype"])

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def entry(self, name: str, shape: tuple[int, ...] | None = None) -> _Entry:
        """The entry of tensor `name`, checked: present, and of `shape` if given."""
        e = self.entries.get(name)
        if e is None:
            raise ModelLoadError(f"{self.path}: tensor {name!r} is missing from the safetensors files")
        if shape is not None and e.shape != tuple(shape):
            raise ModelLoadError(f"{e.file}: tensor {name!r} has shape {list(e.shape)}, expected {list(shape)}")
        self.read_names.add(name)
        return e

    def read(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor `name` (float32/float16/bf16-as-uint16; float64 narrowed to float32), shape
        checked; new memory."""
        e = self.entry(name, shape)
        return self.read_rows(name, 0, e.shape[0] if e.shape else 1)

    def read_rows(self, name: str, r0: int, r1: int, flat: bool = False) -> np.ndarray:
        """Rows r0..r1 (outermost axis; flat: of the tensor seen as 2-D, as stored() says) of
        tensor `name`, as read(); new memory."""
        e = self.entry(name)
        rows = _num_rows(e.shape, flat)
        if not 0 <= r0 <= r1 <= rows:
            raise ValueError(f"{e.file}: rows {r0}..{r1} of tensor {name!r} with {rows} rows")
        row_bytes = (e.end - e.begin) // rows if rows else 0
        out = np.empty(((r1 - r0) * row_bytes) // e.dtype.itemsize, e.dtype)
        self._pread(e.file, e.begin + r0 * row_bytes, out)
        out = out.reshape((r1 - r0, *(e.shape[-1:] if flat else e.shape[1:])) if e.shape else ())
        return out.astype(np.float32) if e.dtype == np.float64 else out.astype(e.dtype.newbyteorder("="), copy=False)

    def _pread(self, file: str, offset: int, out: np.ndarray) -> None:
        if self.names_only:
            out[...] = 0
            return
        fd = self._fds.get(file)
        if fd is None:
            try:
                fd = self._fds[file] = os.open(file, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            except OSError as e:
                raise ModelLoadError(f"{file}: cannot open safetensors file: {e}") from e
        pread_into(fd, offset, out, file)

    @property
    def total_bytes(self) -> int:
        return sum(e.end - e.begin for e in self.entries.values())


# ---- stacked weights for the recipes (lite_llm/model/arch/) ------------------------------


def stacked(ckpt: SafetensorsCheckpoint, parts: tuple[tuple[str, tuple[int, int]], ...]) -> StackedRows:
    """StackedRows of the named 2-D tensors (shapes checked now, rows read when asked); a linear
    of an AWQ / GPTQ checkpoint (X.qweight beside no X.weight) comes as ggml blocks, an FP8 one
    as "F8_E4M3" rows (hfquant.QuantLinear)."""
    rows, blocks, stored = [], [], []
    for name, shape in parts:
        prefix = name[: -len(".weight")]
        if hfquant.is_quantized_linear(ckpt, prefix):
            q = hfquant.QuantLinear(ckpt, prefix, ckpt.quant, shape)
            rows.append((shape[0], q.read_rows))
            blocks.append((q.type_name, q.read_blocks))
            stored.append(None)
        else:
            _not_fp8(ckpt, ckpt.entry(name, shape), name)
            rows.append((shape[0], partial(ckpt.read_rows, name)))
            blocks.append(None)
            stored.append(ckpt.stored(name))
    return StackedRows(tuple(rows), parts[0][1][1], blocks=tuple(blocks), stored=tuple(stored))


def quantized_rows(q: hfquant.QuantLinear, first: int, n: int) -> StackedRows:
    """StackedRows of rows first..first + n of a quantized linear (a head's rows of a fused
    projection), kept in its stored form as stacked() keeps a whole one."""
    return StackedRows(((n, lambda a, b: q.read_rows(first + a, first + b)),), q.shape[1],
                       blocks=((q.type_name, lambda a, b: q.read_blocks(first + a, first + b)),), stored=(None,))


def _not_fp8(ckpt: SafetensorsCheckpoint, e: _Entry, name: str) -> None:
    """FP8 bytes are values only with their scales: refuse one read as a plain float tensor."""
    if e.stype == "F8_E4M3":
        raise ModelLoadError(f"{ckpt.path}: tensor {name!r} is float8_e4m3fn, which runs only as an FP8 linear "
                             "(quantization_config quant_method fp8 or compressed-tensors float, with its "
                             "weight_scale / weight_scale_inv; fused and 3-D FP8 tensors are not supported)")


def split(ckpt: SafetensorsCheckpoint, name: str, sizes: tuple[int, ...], cols: int, first: int | None = None) -> StackedRows:
    """StackedRows of the fused 2-D tensor `name` [sum(sizes), cols] cut into parts of `sizes`
    rows (Phi-3's qkv_proj into q, k, v; gate_up_proj into gate, up): the same parts as
    separate tensors would give, each read or packed where it lies. first: the parts start at
    row `first` of a 3-D tensor seen as 2-D (one expert of experts.gate_up_proj [X, 2F, E])."""
    if hfquant.is_quantized_linear(ckpt, name[: -len(".weight")]):
        raise ModelLoadError(f"{ckpt.path}: {name}: a fused projection in AWQ / GPTQ / FP8 form is not supported")
    flat = first is not None
    _not_fp8(ckpt, ckpt.entry(name), name)
    if not flat:
        ckpt.entry(name, (sum(sizes), cols))
    rows, stored, r0 = [], [], first or 0
    for n in sizes:
        rows.append((n, lambda a, b, r0=r0: ckpt.read_rows(name, r0 + a, r0 + b, flat=flat)))
        stored.append(ckpt.stored(name, r0, r0 + n, flat=flat))
        r0 += n
    return StackedRows(tuple(rows), cols, blocks=(None,) * len(sizes), stored=tuple(stored))


def concat(*parts: np.ndarray) -> np.ndarray:
    dtypes = {p.dtype for p in parts}
    if len(dtypes) != 1:    # mixed shards (rare): widen everything to float32 via the loader's rules
        from lite_llm.model.weights import convert
        parts = tuple(convert(p, "float32") for p in parts)
    return np.concatenate(parts)
