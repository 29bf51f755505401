"""Packing: a loaded checkpoint -> the kernels' PackedModel (lite_llm/_kernels/packed.py).

The policy lives here: which weights keep their stored ggml block types, which are quantized at
load (--quantization), which run in the engine dtype, and what a tensor-parallel rank keeps.
The layouts themselves are the kernels' (lite_llm/_kernels/layout.py); the cache that keeps a
pack between starts is packed_cache.py.

    loaded.iter_tensors(streamed=True)        canonical names, 2-D weights as StackedRows
      -> shard (tensor parallel: the rank's rows or columns, still not read)
      -> _block_form: stored blocks | quantized view | None (engine dtype)
      -> layout.pack_blocks / pack_gated / pack_rows -> PackedMatrix (panels, shape, parts)
      1-D and plain tables -> float32 vectors
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from lite_llm._kernels import kernels, layout
from lite_llm._kernels.packed import PackedMatrix, PackedModel, Part
from lite_llm.config import QUANTIZATIONS, check_quantization  # noqa: F401  (callers' names)
from lite_llm.model.packed_cache import PackedWeights
from lite_llm.model.weights import bf16_to_f32, convert

def quantized_view(rows, type_name: str):
    """The same weight (a model.weights.StackedRows of float parts) seen as ggml blocks of
    type_name, every part quantized a slice at a time when pack_blocks reads it (quantization
    at load: a bf16 checkpoint run in Q8_0 / Q4_0)."""
    threads = layout.load_threads()

    def reader(read):
        return lambda r0, r1: kernels.quantize_ggml(convert(read(r0, r1), "float32"), type_name, threads)
    return replace(rows, blocks=tuple((type_name, reader(read)) for _, read in rows.parts))


def _blocks_fit(base: str, t, cfg) -> bool:
    """Whether weight `base` can run on block-quantized kernels: rows of whole 32-value
    blocks, and the o projection's int8 input blocks within one KV group's output."""
    if t.shape[1] % 32:
        return False
    return (not base.endswith(".o") or cfg.is_mla   # MLA's o input is converted a whole row at a time
            or (cfg.num_heads // cfg.num_kv_heads * cfg.head_dim) % 32 == 0)


def _block_form(base: str, t, cfg, quantization: str | None):
    """The weight as ggml blocks to pack, or None for the engine dtype: as stored where every
    part is a type the kernels take (gguf.NATIVE_TYPES), else quantized at load when asked
    (the LM head, and a tied embedding, in Q8_0 for q4_0, as llama.cpp keeps its output
    layer in more bits)."""
    if t.block_types() is not None and set(t.block_types()) == {"F8_E4M3"}:
        return t                    # FP8 rows run on the float GEMM, any K
    if not _blocks_fit(base, t, cfg):
        return None
    if t.block_types() is not None and "F8_E4M3" not in t.block_types():
        return t
    if quantization is None:
        return None
    head = base == "lm_head" or (base == "embed" and cfg.tie_word_embeddings)
    return quantized_view(t, "Q8_0" if head else QUANTIZATIONS[quantization])


def pack_matrix(base: str, t, cfg, dtype: str, threads: int, quantization: str | None) -> PackedMatrix:
    """Weight `base` (a StackedRows) packed: in its block types, or in the engine dtype `dtype`."""
    shape = (int(t.shape[0]), int(t.shape[1]))
    blocks = _block_form(base, t, cfg, quantization)
    if blocks is not None and set(blocks.block_types()) == {"F8_E4M3"}:   # FP8 checkpoints: one byte a weight
        data = layout.pack_fp8_rows(blocks, gated=base.endswith(".gate_up"))
        return PackedMatrix(data, shape, (Part("F8_E4M3", 0, int(data.shape[0]), 0, shape[0], 0),))
    if blocks is not None:
        data, parts = layout.pack_blocks(blocks, threads)
        return PackedMatrix(data, shape, tuple(Part(*p) for p in parts))
    if base.endswith(".gate_up"):   # the fused gated-MLP kernel's layout (an expert's too)
        return PackedMatrix.of_float(layout.pack_gated(t, t.shape[0] // 2, dtype, threads), shape, dtype)
    return PackedMatrix.of_float(layout.pack_rows(t, dtype, threads=threads), shape, dtype)


def _is_matrix(name: str, t) -> bool:
    """A 2-D weight the GEMM runs (not read yet); pos_embed and a router are plain fp32 tables
    (the router's logits pick experts), and arrays read whole stay arrays."""
    return t.ndim == 2 and not isinstance(t, np.ndarray) and name != "pos_embed" \
        and not name.endswith(".router.weight")


def pack_checkpoint(loaded, dtype: str, threads: int, quantization: str | None = None,
                    shard=None) -> PackedModel:
    """Every tensor of the checkpoint, for the kernel Model: 2-D weights packed (in their stored
    block format where the kernels take it, else in the engine dtype `dtype`; straight from the
    mapped file where it is stored as the packer takes it), each with its bias; vectors as
    float32. Runs its parallel loops on `threads` threads of the calling thread's OpenMP pool
    (the engine thread's), into huge-page-backed segments.
    shard: a tensor-parallel rank's RankShard (engine/tp.py: .config, .weight(name, rows),
    .tensor(name, array), .head_of_embedding(rows), .first_vocab_row), or None: each tensor is
    cut to the rank's part before it is read (block formats stay blocks), and the block-format
    checks use the rank's config."""
    cfg = loaded.config if shard is None else shard.config
    packed = PackedModel()
    with layout.WeightArena():
        embedding = None
        for name, t in loaded.iter_tensors(streamed=True):   # 2-D: StackedRows, not read yet
            if shard is not None:
                if name in ("embed", "embed.weight"):
                    embedding = t
                t = shard.weight(name, t) if t.ndim == 2 else shard.tensor(name, t)
                if t is None:
                    continue
            if _is_matrix(name, t):
                base = name[: -len(".weight")] if name.endswith(".weight") else name
                packed.matrices[base] = pack_matrix(base, t, cfg, dtype, threads, quantization)
                continue
            arr = t.read(0, t.shape[0]) if t.ndim == 2 and not isinstance(t, np.ndarray) else t   # plain tables
            if arr.dtype == np.uint16:   # bf16 bits (pos_embed, router): widen, the kernel reads fp32
                packed.vectors[name] = np.ascontiguousarray(bf16_to_f32(arr))
            else:
                packed.vectors[name] = np.ascontiguousarray(arr, dtype=np.float32)
            del t, arr
        if shard is not None:     # a vocabulary-parallel LM head; of a tied embedding, its rows
            packed.vocab_first_row = shard.first_vocab_row
            if "lm_head" not in packed.matrices and embedding is not None:
                packed.matrices["lm_head"] = pack_matrix("lm_head", shard.head_of_embedding(embedding), cfg, dtype,
                                                         threads, quantization)
    for base, m in packed.matrices.items():     # a matrix's bias travels with it
        bias = packed.vectors.pop(base + ".bias", None)
        if bias is not None:
            packed.matrices[base] = replace(m, bias=bias)
    return packed


def packed_weights(loaded, dtype: str, threads: int, quantization: str | None, shard=None,
                   kernels_module=None) -> PackedWeights:
    """The checkpoint's PackedModel (`.model`): mapped from the packed-weights cache when an
    earlier start kept it, else packed here (pack_checkpoint); `.keep()` then writes the fresh
    pack for the next start. kernels_module: the kernel build the pack is for (its file is part
    of the cache key); the dispatcher's by default."""
    found = PackedWeights(loaded, dtype, quantization, shard, kernels_module or kernels)
    if found.model is None:
        found.packed(pack_checkpoint(loaded, dtype, threads, quantization, shard))
    return found
