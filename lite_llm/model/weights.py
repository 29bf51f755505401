"""Weight dtype helpers: float32 <-> bfloat16 bits, conversion to the engine dtype, and
StackedRows, a 2-D weight read a slice of rows at a time.

bfloat16 has no NumPy dtype, so it travels as np.uint16 holding the top 16 bits of a float32.
Repacking into kernel layouts lives with the kernels, not here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

DTYPES = ("float32", "bfloat16", "float16")


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float array (any shape) -> bf16 bits as uint16, rounding to nearest even.

    NaNs stay NaNs (quiet, sign kept): plain rounding could carry a NaN's low mantissa bits
    into the exponent and turn it into an infinity.
    """
    src = np.ascontiguousarray(x, dtype=np.float32)
    if src.size >= 4096:    # large tensors: the compiled, parallel conversion (same rounding)
        # deferred: the compiled kernels load on first use, so the checkpoint readers work where
        # no kernel variant is built (lite_llm info)
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


RowReader = Callable[[int, int], np.ndarray]   # (r0, r1) -> rows r0..r1 [r1 - r0, K], new memory


@dataclass(frozen=True)
class StoredPart:
    """Where a part's rows lie in the checkpoint, untouched: the loader packs them straight from
    there (kernels.load_panels) instead of reading, converting and packing slices.

        view       () -> the part's bytes as a read-only uint8 array (a view of the mapped file)
        nbytes     how many bytes that is
        type_name  "F32" | "F16" | "BF16" (little-endian), or the ggml block type of the rows
        perm       > 0: llama.cpp's q/k row order, pairs interleaved within heads of perm rows
        release    () -> None: drop the part's mapped pages from the resident set once packed
    """
    view: Callable[[], np.ndarray]
    nbytes: int
    type_name: str
    perm: int = 0
    release: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class StackedRows:
    """A canonical 2-D weight [N, K] not read yet: the rows of its stored parts stacked in order
    (q, k, v; gate, up; or one part), so a slice of rows can be read without the rest.

        parts  ((rows of part, reader of its rows), ...)   rows sum to N
        align  a slice must start and end on a multiple of it (or at N): llama q/k rows are
               un-permuted a whole head at a time
        dtype  None: each part's own float dtype (mixed parts widen to float32);
               else the engine dtype every slice is converted to (see convert)
        blocks per part, None or (ggml block type, reader of its raw rows): a part stored in
               a block-quantized format, which the kernels can run as it is stored; the raw
               reader gives uint8 [r1 - r0, bytes per row] (rows in the same order as `parts`)
        stored per part, None or where its rows lie in the file as stored (StoredPart)
    """
    parts: tuple[tuple[int, RowReader], ...]
    cols: int
    align: int = 1
    dtype: str | None = None
    blocks: tuple[tuple[str, RowReader] | None, ...] | None = None
    stored: tuple[StoredPart | None, ...] | None = None

    def stored_parts(self) -> tuple[StoredPart, ...] | None:
        """Every part's StoredPart, or None unless all parts have one."""
        if not self.stored or any(p is None for p in self.stored):
            return None
        return self.stored

    def part(self, i: int) -> "StackedRows":
        """Part i alone, as a weight of its own."""
        def one(seq):
            return None if seq is None else (seq[i],)
        return replace(self, parts=(self.parts[i],), blocks=one(self.blocks), stored=one(self.stored))

    def block_types(self) -> tuple[str, ...] | None:
        """The ggml block type of every part, or None unless every part is block-quantized."""
        if not self.blocks or any(b is None for b in self.blocks):
            return None
        return tuple(b[0] for b in self.blocks)

    @property
    def shape(self) -> tuple[int, int]:
        return sum(n for n, _ in self.parts), self.cols

    @property
    def ndim(self) -> int:
        return 2

    def to(self, dtype: str) -> "StackedRows":
        """The same rows, read in the engine dtype `dtype`."""
        if dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        return replace(self, dtype=dtype)

    def read(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1 [r1 - r0, K], C-contiguous, new memory."""
        n = self.shape[0]
        if not (0 <= r0 <= r1 <= n) or r0 % self.align or (r1 % self.align and r1 != n):
            raise ValueError(f"rows {r0}..{r1} of a [{n}, {self.cols}] weight read in steps of {self.align}")
        pieces = []
        start = 0
        for rows, reader in self.parts:
            a, b = max(r0, start), min(r1, start + rows)
            if a < b:
                pieces.append(reader(a - start, b - start))
            start += rows
        if len({p.dtype for p in pieces}) > 1:      # mixed shards (rare): widen to float32 first
            pieces = [convert(p, "float32") for p in pieces]
        if not pieces:
            out = np.empty((0, self.cols), np.float32)
        elif len(pieces) == 1:
            out = pieces[0]
        else:
            out = np.concatenate(pieces)
        if self.dtype is not None:
            out = convert(out, self.dtype)
        return out if out.flags.writeable else out.copy()
