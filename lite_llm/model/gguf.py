"""GGUF reader: header, metadata, tensor infos and dequantization.

Holds the file format (GGUF v2/v3, llama.cpp's layout); the mapping of llama.cpp's graphs
onto ModelConfig and canonical tensor names is each architecture's recipe (lite_llm/model/arch/). The
tokenizer stored in the metadata is rebuilt in tokenizer.py; dtype conversion in loader.py.
A split model (llama.cpp's gguf-split: X-00001-of-0000N.gguf holds the metadata, every shard
its own tensors) is opened by its first shard and read as one file.
The header is parsed from a memory map that is dropped once parsed; tensor bytes are read
with pread into new buffers, a slice of rows at a time if asked (pages of a mapped file
would count in the resident set until unmapped), and dequantized to float32 by the
compiled kernels (the gguf package's quants.dequantize is their spec, in the tests).
"""
from __future__ import annotations

import dataclasses
import os
import re
import struct
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from lite_llm.model.files import MappedFile, ModelLoadError, pread_into
from lite_llm.model.weights import StoredPart

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32      # general.alignment when the file does not say
_SHARD_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")     # llama.cpp's split names

# metadata value types -> struct format (scalars); 8 = string, 9 = array
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
                6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}

# ggml tensor types we read: id -> (name, elements per block, bytes per block)
TENSOR_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
                6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144),
                13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136),
                30: ("BF16", 1, 2), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 34: ("TQ1_0", 256, 54),
                35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
                22: ("IQ2_S", 256, 82), 18: ("IQ3_XXS", 256, 98), 21: ("IQ3_S", 256, 110), 19: ("IQ1_S", 256, 50),
                29: ("IQ1_M", 256, 56)}
# block types the kernels run as stored (src/kernels/qgemm.h); other types are dequantized
NATIVE_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K",
                "TQ2_0", "TQ1_0", "MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
# metadata arrays only the tokenizer reads: ~10 MB of Python objects for a 50k vocabulary
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.scores")
# ids of ggml types we recognise but do not dequantize, for a readable error
_KNOWN_UNSUPPORTED = {9: "Q8_1", 15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]   # numpy order (outermost first): ggml's ne reversed
    type_id: int
    offset: int              # absolute byte offset in the file
    nbytes: int
    part: int = 0            # the shard holding it, of a split model (0: the first, the file opened)

    @property
    def type_name(self) -> str:
        return TENSOR_TYPES.get(self.type_id, (_KNOWN_UNSUPPORTED.get(self.type_id, f"type {self.type_id}"),))[0]


class GGUFFile:
    """One GGUF file: .metadata (dict key -> value), .tensors (dict name -> TensorInfo), read()."""

    def __init__(self, path: str, _shard: bool = False):
        self.path = str(path)
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{self.path}: cannot map GGUF file: {e}") from e
        self._pos = 0
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.read_names: set[str] = set()   # tensors info() served: those a recipe used (loader.unread_tensors)
        self.names_only = False     # True: reads give zeros, no tensor data (the loader's check of names first)
        self._fd: int | None = None
        self.mapped = MappedFile(self.path)
        try:
            self._parse()
        finally:
            self._map = None        # every value is copied out: unmap the header's pages now
        self._parts: list[GGUFFile] = []    # shards 2..N of a split model
        self._first: GGUFFile | None = None  # a shard's first shard
        count = int(self.metadata.get("split.count", 1) or 1)
        if count > 1 and not _shard:
            self._join_shards(count)

    def _join_shards(self, count: int) -> None:
        """Add the tensors of shards 2..count, found beside this first one by llama.cpp's names."""
        number = int(self.metadata.get("split.no", 0))
        if number != 0:
            raise ModelLoadError(f"{self.path}: shard {number + 1} of {count} of a split GGUF model: "
                                 f"pass its first shard (-00001-of-{count:05d}.gguf)")
        m = _SHARD_NAME.match(self.path)
        if m is None:
            raise ModelLoadError(f"{self.path}: a split GGUF model of {count} shards, but its name does not end "
                                 f"in -00001-of-{count:05d}.gguf, so the other shards cannot be found")
        for i in range(2, count + 1):
            shard = f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf"
            if not os.path.isfile(shard):
                raise ModelLoadError(f"{shard}: shard {i} of {count} of {self.path} is missing")
            part = GGUFFile(shard, _shard=True)
            part._first = self
            self._parts.append(part)
            for name, info in part.tensors.items():
                self.tensors[name] = dataclasses.replace(info, part=len(self._parts))
        expected = self.metadata.get("split.tensors.count")
        if expected is not None and len(self.tensors) != int(expected):
            raise ModelLoadError(f"{self.path}: the {count} shards hold {len(self.tensors)} tensors, the "
                                 f"first says {expected}")

    def _source(self, info: TensorInfo) -> "GGUFFile":
        """The shard whose file holds tensor `info`."""
        return self if info.part == 0 else self._parts[info.part - 1]

    # ---- header parsing -------------------------------------------------------------

    def _need(self, n: int, what: str) -> None:
        if self._pos + n > len(self._map):
            raise ModelLoadError(f"{self.path}: truncated GGUF file: {what} runs past the end "
                                 f"(needs byte {self._pos + n}, file has {len(self._map)})")

    def _unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self._need(size, what)
        value = struct.unpack_from(fmt, self._map, self._pos)[0]
        self._pos += size
        return value

    def _string(self, what: str) -> str:
        n = self._unpack("<Q", what)
        self._need(n, what)
        raw = bytes(self._map[self._pos:self._pos + n])
        self._pos += n
        return raw.decode("utf-8", errors="replace")

    def _value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self._unpack(_SCALAR_FORMATS[vtype], f"metadata {key!r}")
        if vtype == 8:
            return self._string(f"metadata {key!r}")
        if vtype == 9:
            item_type = self._unpack("<I", f"metadata {key!r}")
            count = self._unpack("<Q", f"metadata {key!r}")
            if item_type in _NUMPY_TYPES:
                dt = np.dtype(_NUMPY_TYPES[item_type]).newbyteorder("<")
                self._need(count * dt.itemsize, f"metadata {key!r}")
                arr = np.frombuffer(self._map, dtype=dt, count=count, offset=self._pos).copy()
                self._pos += count * dt.itemsize
                return arr.tolist()
            if item_type == 8:
                return self._strings(count, key)
            return [self._value(item_type, key) for _ in range(count)]
        raise ModelLoadError(f"{self.path}: metadata {key!r} has unknown value type {vtype}")

    def _strings(self, count: int, key: str) -> list[str]:
        # tight loop over a bytes copy of the remaining header: vocabularies hold ~10^5 strings
        buf = memoryview(self._map)
        out = []
        pos, end = self._pos, len(self._map)
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                self._pos = pos
                self._need(8, f"metadata {key!r}")
            n = unpack(buf, pos)[0]
            pos += 8
            if pos + n > end:
                self._pos = pos
                self._need(n, f"metadata {key!r}")
            out.append(bytes(buf[pos:pos + n]).decode("utf-8", errors="replace"))
            pos += n
        self._pos = pos
        return out

    def _parse(self) -> None:
        self._need(4, "magic")
        if bytes(self._map[:4]) != GGUF_MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (magic {bytes(self._map[:4])!r})")
        self._pos = 4
        version = self._unpack("<I", "version")
        if version not in (2, 3):
            raise ModelLoadError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        num_tensors = self._unpack("<Q", "tensor count")
        num_kv = self._unpack("<Q", "metadata count")
        for _ in range(num_kv):
            key = self._string("metadata key")
            vtype = self._unpack("<I", f"metadata {key!r}")
            self.metadata[key] = self._value(vtype, key)
        raw_infos = []
        for _ in range(num_tensors):
            name = self._string("tensor name")
            ndim = self._unpack("<I", f"tensor {name!r}")
            dims = [self._unpack("<Q", f"tensor {name!r}") for _ in range(ndim)]
            type_id = self._unpack("<I", f"tensor {name!r}")
            offset = self._unpack("<Q", f"tensor {name!r}")
            raw_infos.append((name, tuple(reversed(dims)), type_id, offset))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = (self._pos + alignment - 1) // alignment * alignment
        for name, shape, type_id, offset in raw_infos:
            count = int(np.prod(shape, dtype=np.int64))
            if type_id in TENSOR_TYPES:
                _, block, block_bytes = TENSOR_TYPES[type_id]
                if shape and shape[-1] % block:
                    raise ModelLoadError(f"{self.path}: tensor {name!r}: row length {shape[-1]} is not "
                                         f"a multiple of the {block}-element block")
                nbytes = count // block * block_bytes
            else:
                nbytes = 0
            info = TensorInfo(name, shape, type_id, data_start + offset, nbytes)
            if info.offset + nbytes > len(self._map):
                raise ModelLoadError(f"{self.path}: truncated GGUF file: tensor {name!r} needs bytes "
                                     f"{info.offset}..{info.offset + nbytes}, file has {len(self._map)}")
            self.tensors[name] = info

    def close(self) -> None:
        """Close the file (metadata and tensor infos stay; a later read opens it again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.mapped.close()
        for part in self._parts:
            part.close()

    def stored(self, name: str, perm: int = 0, r0: int = 0, r1: int | None = None, flat: bool = False) -> StoredPart:
        """Where rows r0..r1 (default: all) of tensor `name` lie, for packing straight from the
        mapped file (ggml rows are whole blocks: a row range is a byte range). flat: rows of
        the tensor seen as 2-D [prod(shape[:-1]), shape[-1]] (3-D expert tensors)."""
        info = self.info(name)
        rows = _num_rows(info.shape, flat)
        row_bytes = info.nbytes // rows if rows else 0
        begin, nbytes = info.offset + r0 * row_bytes, ((rows if r1 is None else r1) - r0) * row_bytes
        mapped = self._source(info).mapped
        return StoredPart(view=partial(mapped.view, begin, nbytes), nbytes=nbytes, type_name=info.type_name,
                          perm=perm, release=partial(mapped.release, begin, nbytes))

    def drop_tokenizer_arrays(self) -> None:
        """Forget the vocabulary arrays (TOKENIZER_ARRAYS) once the tokenizer is built from
        them; scalar keys (special token ids, chat template, ...) stay."""
        for key in TOKENIZER_ARRAYS:
            self.metadata.pop(key, None)

    # ---- tensor data ----------------------------------------------------------------

    def info(self, name: str, shape: tuple[int, ...] | None = None) -> TensorInfo:
        """TensorInfo of `name`, checked: present, of a type we read, and of `shape` if given."""
        info = self.tensors.get(name)
        if info is None:
            raise ModelLoadError(f"{self.path}: tensor {name!r} is missing")
        if info.type_id not in TENSOR_TYPES:
            raise ModelLoadError(f"{self.path}: tensor {name!r} has GGUF type {info.type_name}, which is "
                                 f"not supported (supported: {', '.join(t[0] for t in TENSOR_TYPES.values())})")
        if shape is not None and info.shape != tuple(shape):
            raise ModelLoadError(f"{self.path}: tensor {name!r} has shape {info.shape}, expected {tuple(shape)}")
        self.read_names.add(name)
        return info

    def read(self, name: str) -> np.ndarray:
        """Tensor `name` dequantized to float32, numpy shape (outermost first); new memory."""
        info = self.info(name)
        return dequantize(self._source(info)._pread(info.offset, info.nbytes), info.type_id, info.shape)

    def read_rows(self, name: str, r0: int, r1: int, flat: bool = False) -> np.ndarray:
        """Rows r0..r1 (outermost axis; flat: as stored() says) of tensor `name`, dequantized to
        float32; new memory. ggml rows are whole blocks, so a slice of rows is a contiguous
        slice of the bytes."""
        info = self.info(name)
        rows = _num_rows(info.shape, flat)
        if not 0 <= r0 <= r1 <= rows:
            raise ValueError(f"{self.path}: rows {r0}..{r1} of tensor {name!r} with {rows} rows")
        row_bytes = info.nbytes // rows if rows else 0
        raw = self._source(info)._pread(info.offset + r0 * row_bytes, (r1 - r0) * row_bytes)
        return dequantize(raw, info.type_id, (r1 - r0, *(info.shape[-1:] if flat else info.shape[1:])))

    def read_raw_rows(self, name: str, r0: int, r1: int, flat: bool = False) -> np.ndarray:
        """Rows r0..r1 of 2-D tensor `name` (flat: of any tensor seen as 2-D) as stored:
        uint8 [r1 - r0, bytes per row]; new memory."""
        info = self.info(name)
        rows = _num_rows(info.shape, flat)
        if (len(info.shape) != 2 and not flat) or not 0 <= r0 <= r1 <= rows:
            raise ValueError(f"{self.path}: rows {r0}..{r1} of tensor {name!r} of shape {info.shape}")
        row_bytes = info.nbytes // rows if rows else 0
        return self._source(info)._pread(info.offset + r0 * row_bytes, (r1 - r0) * row_bytes).reshape(r1 - r0, row_bytes)

    def _pread(self, offset: int, nbytes: int) -> np.ndarray:
        """nbytes of the file from offset, as a new uint8 array (zeros while the first shard's
        names_only is set: nothing is read)."""
        if self.names_only or (self._first is not None and self._first.names_only):
            return np.zeros(nbytes, np.uint8)
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            except OSError as e:
                raise ModelLoadError(f"{self.path}: cannot open GGUF file: {e}") from e
        out = np.empty(nbytes, np.uint8)
        pread_into(self._fd, offset, out, self.path)
        return out


def split_shards(path: str) -> list[str] | None:
    """Every shard beside `path` of the split model it names by llama.cpp's names, first to last,
    those present; None for a file of another name."""
    m = _SHARD_NAME.match(str(path))
    if m is None:
        return None
    count = int(m.group(3))
    shards = [f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    return [s for s in shards if os.path.isfile(s)]


def _num_rows(shape: tuple[int, ...], flat: bool) -> int:
    """Rows of a tensor of `shape`: its outermost axis, or (flat) all but its innermost."""
    if not shape:
        return 1
    return int(np.prod(shape[:-1], dtype=np.int64)) if flat else shape[0]


def dequantize(raw: np.ndarray, type_id: int, shape: tuple[int, ...]) -> np.ndarray:
    """Bytes of one ggml tensor (uint8 [nbytes]) -> float32 array of `shape`."""
    name, block, block_bytes = TENSOR_TYPES[type_id]
    if name == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    if name == "F16":
        return np.frombuffer(raw, dtype="<f2").reshape(shape).astype(np.float32)
    if name == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    # compiled and parallel (tests hold it to gguf.quants); deferred so the file reader works
    # where no kernel variant is built (lite_llm info)
    from lite_llm._kernels import kernels
    from lite_llm._kernels.layout import load_threads
    out = np.empty(int(np.prod(shape)), np.float32)
    kernels.dequantize(np.asarray(raw, np.uint8).reshape(-1), name, out, load_threads())
    return out.reshape(shape)
