"""The packed model: what packing builds (lite_llm/model/pack.py), what the packed-weights cache
writes and maps (lite_llm/model/packed_cache.py) and what the kernels' Model reads
(forward.pxi). One typed value instead of string keys the three would have to agree on.

    PackedModel
      matrices         {canonical name without ".weight": PackedMatrix}
                       "embed", "lm_head" (absent when tied), "layers.{i}.qkv", "layers.{i}.o",
                       "layers.{i}.gate_up" | "layers.{i}.up", "layers.{i}.down",
                       "layers.{i}.experts.{j}.gate_up" / ".down", "layers.{i}.shared.gate_up" / ".down"
                       (ungated experts: ".up" in place of ".gate_up")
      vectors          {canonical name: float32 array} read as stored: norm weights and biases,
                       biases of non-matrix tensors, pos_embed [P, E], type_embed [types, E],
                       MoE routers [X, E] and shared gates [E] (lite_llm/model/__init__.py)
      vocab_first_row  the first vocabulary row of the LM head: a tensor-parallel rank holds
                       rows vocab_first_row .. + N of it (engine/tp.py); 0 otherwise

    PackedMatrix       one 2-D weight [N, K] (rows = output features) in the GEMM's panels
      data             float panels of layout.pack (float32 / float16 [ceil(N/16), K, 16],
                       bf16 bits [ceil(N/16), ceil(K/2), 16, 2]) or the uint8 bytes of
                       block-format panels (layout.pack_blocks)
      shape            (N, K), the logical shape
      parts            Part per stored part, in row order: a float matrix is one part of its
                       dtype; a block matrix has one per stored tensor, each in its own type
                       (Q4_K q and k with a Q6_K v)
      bias             float32 [N], or None

Pure data and NumPy: no packing here (layout.py packs, model/pack.py decides how).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

import numpy as np


class Part(NamedTuple):
    """Rows row0..row1 of a matrix, stored in panels panel0..panel1 of its buffer from byte
    `offset`, in one format: an engine float dtype ("float32", "bfloat16", "float16") or a ggml
    block type ("Q8_0", "Q4_K", ...; the kernels' WTYPES in common.pxi name what a build runs)."""
    format: str
    panel0: int
    panel1: int
    row0: int
    row1: int
    offset: int


@dataclass(frozen=True)
class PackedMatrix:
    data: np.ndarray
    shape: tuple[int, int]
    parts: tuple[Part, ...]
    bias: np.ndarray | None = None

    @classmethod
    def of_float(cls, data: np.ndarray, shape: tuple[int, int], dtype: str) -> "PackedMatrix":
        """Panels of one float dtype (layout.pack / pack_rows / pack_gated): one part."""
        return cls(data, (int(shape[0]), int(shape[1])), (Part(dtype, 0, int(data.shape[0]), 0, int(shape[0]), 0),))

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(p.format for p in self.parts)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.bias is None else self.bias.nbytes)


@dataclass
class PackedModel:
    matrices: dict[str, PackedMatrix] = field(default_factory=dict)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    vocab_first_row: int = 0

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, array) of every array the model holds: each matrix's panels under its name (and
        its bias under name + ".bias"), then the vectors."""
        for name, m in self.matrices.items():
            yield name, m.data
            if m.bias is not None:
                yield name + ".bias", m.bias
        yield from self.vectors.items()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for _, a in self.arrays())

    @property
    def lm_head(self) -> PackedMatrix:
        """The matrix the logits come from: the LM head, or the embedding it is tied to."""
        return self.matrices.get("lm_head") or self.matrices["embed"]
