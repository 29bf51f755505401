"""Paged attention (ops.pxi `paged_attention`, src/kernels/attention.h) vs tests/ref_ops.py on
every variant.

One call mixes what an engine step holds: a decode token deep in a long context, a
one-token sequence, and a prefill chunk in the middle of a sequence (attending to its cached
context plus itself causally). Block tables are shuffled, non-contiguous block ids; every
cache row a query must not see (beyond its sequence, unused table entries, a poison block)
holds NaN, so any read out of bounds or past the causal limit shows up as NaN.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ref_ops  # noqa: E402
from lite_llm import _kernels  # noqa: E402
from lite_llm._kernels.layout import kv_to_layout  # noqa: E402

VARIANTS = _kernels.available()


@dataclass(frozen=True)
class Step:
    q: np.ndarray             # [T, H, D]
    k_cache: np.ndarray       # [num_blocks, Hkv, B, D] float32 or bf16 bits (logical; the kernel takes it transposed)
    v_cache: np.ndarray
    block_tables: np.ndarray  # [S, max_blocks] int32
    tok_seq: np.ndarray       # [T] int32
    positions: np.ndarray     # [T] int32


def make_step(rng: np.random.Generator, *, num_heads: int, num_kv_heads: int, head_dim: int,
              block_size: int, queries: list[tuple[int, int]], kv_bf16: bool) -> Step:
    """queries: per sequence (first query position, number of query tokens); the sequence's
    cache holds positions 0 .. first + count - 1 (its own chunk already written, as the forward
    pass writes K/V before attending)."""
    lengths = [first + count for first, count in queries]
    blocks_needed = [-(-n // block_size) for n in lengths]
    max_blocks = max(blocks_needed) + 2                       # unused tail entries in every table
    num_blocks = sum(blocks_needed) + 3
    poison = num_blocks - 1
    ids = rng.permutation(num_blocks - 1)                     # shuffled, shared by no two sequences
    block_tables = np.full((len(queries), max_blocks), poison, np.int32)
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    k = np.full(shape, np.nan, np.float32)
    v = np.full(shape, np.nan, np.float32)
    used = 0
    for seq, n in enumerate(lengths):
        table = ids[used:used + blocks_needed[seq]]
        used += blocks_needed[seq]
        block_tables[seq, :len(table)] = table
        for pos in range(n):
            blk, row = table[pos // block_size], pos % block_size
            k[blk, :, row] = rng.standard_normal((num_kv_heads, head_dim))
            v[blk, :, row] = rng.standard_normal((num_kv_heads, head_dim))
    tok_seq = np.concatenate([np.full(count, seq, np.int32) for seq, (_, count) in enumerate(queries)])
    positions = np.concatenate([np.arange(first, first + count, dtype=np.int32) for first, count in queries])
    q = (rng.standard_normal((len(positions), num_heads, head_dim)) * 2).astype(np.float32)
    if kv_bf16:
        k, v = ref_ops.f32_to_bf16_bits(k), ref_ops.f32_to_bf16_bits(v)
    return Step(q, k, v, block_tables, tok_seq, positions)


def run(mod, step: Step, scale: float, sliding_window: int = 0, num_threads: int = 1) -> np.ndarray:
    out = np.full(step.q.shape, np.nan, np.float32)
    mod.paged_attention(step.q, kv_to_layout(step.k_cache, "k"), kv_to_layout(step.v_cache, "v"),
                        step.block_tables, step.tok_seq, step.positions, out, scale,
                        sliding_window=sliding_window, num_threads=num_threads)
    return out


def expected(step: Step, scale: float, sliding_window: int = 0) -> np.ndarray:
    return ref_ops.paged_attention(step.q, step.k_cache, step.v_cache, step.block_tables,
                                   step.tok_seq, step.positions, scale, sliding_window)


# (H, Hkv): multi-head, grouped-query, multi-query
GEOMETRIES = [(2, 2), (8, 2), (4, 1)]
# decode at position 36, a lone first token, a 13-token prefill chunk at positions 50..62
MIXED = [(36, 1), (0, 1), (50, 13)]
# Tolerance: fp32 dot products of length D and an online softmax whose exp is a polynomial
# (rel. error ~2e-7). A bf16 cache is compared against its own decoded values and q * scale
# rounded as the kernel rounds it; its probabilities are rounded to bf16 (rel. 2^-9 each)
# before P @ V, which the reference cannot repeat: a looser bound.
TOL = dict(rtol=2e-5, atol=2e-5)
TOL_BF16 = dict(rtol=5e-3, atol=5e-3)


def tol(kv_bf16: bool) -> dict:
    return TOL_BF16 if kv_bf16 else TOL


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_heads,num_kv_heads", GEOMETRIES)
@pytest.mark.parametrize("kv_bf16", [False, True])
@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_mixed_step(variant, num_heads, num_kv_heads, kv_bf16, num_threads, rng):
    mod = _kernels.load(variant)
    head_dim = 32
    step = make_step(rng, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     block_size=16, queries=MIXED, kv_bf16=kv_bf16)
    scale = head_dim ** -0.5
    np.testing.assert_allclose(run(mod, step, scale, num_threads=num_threads), expected(step, scale),
                               **tol(kv_bf16))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("block_size", [16, 32, 48])
@pytest.mark.parametrize("head_dim", [16, 80])
def test_block_sizes_and_head_dims(variant, block_size, head_dim, rng):
    """Odd block size (score tails, chunk boundaries inside blocks), blocks longer than the
    16-lane exp loop, and head_dim 80 (5 vectors)."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=head_dim, block_size=block_size,
                     queries=[(3, 9), (70, 1), (0, 4)], kv_bf16=False)
    np.testing.assert_allclose(run(mod, step, 0.2, num_threads=2), expected(step, 0.2), **TOL)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("window", [1, 8, 17, 1000])
@pytest.mark.parametrize("kv_bf16", [False, True])
def test_sliding_window(variant, window, kv_bf16, rng):
    """Each query sees positions > its own - window: a window of 1 returns V at its own
    position; a window longer than the context changes nothing."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     queries=MIXED, kv_bf16=kv_bf16)
    out = run(mod, step, 0.125, sliding_window=window, num_threads=3)
    np.testing.assert_allclose(out, expected(step, 0.125, window), **tol(kv_bf16))
    if window == 1:
        v = ref_ops.kv_values(step.v_cache)
        for t, (seq, pos) in enumerate(zip(step.tok_seq, step.positions)):
            blk = step.block_tables[seq, pos // 16]
            np.testing.assert_allclose(out[t], v[blk, np.arange(4) // 2, pos % 16], rtol=1e-6)
    if window == 1000:
        np.testing.assert_allclose(out, expected(step, 0.125), **tol(kv_bf16))


@pytest.mark.parametrize("variant", VARIANTS)
def test_chunk_is_causal_and_independent_of_later_cache_rows(variant, rng):
    """A prefill chunk's query at position p must not change when K/V after p change."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=2, num_kv_heads=1, head_dim=16, block_size=16,
                     queries=[(26, 6)], kv_bf16=False)
    before = run(mod, step, 0.25)
    k, v = step.k_cache.copy(), step.v_cache.copy()
    last_blk, row = step.block_tables[0, 31 // 16], 31 % 16        # position 31, the chunk's last
    k[last_blk, :, row] += 10.0
    v[last_blk, :, row] -= 10.0
    after = run(mod, Step(step.q, k, v, step.block_tables, step.tok_seq, step.positions), 0.25)
    np.testing.assert_array_equal(after[:-1], before[:-1])
    assert not np.allclose(after[-1], before[-1])


@pytest.mark.parametrize("variant", VARIANTS)
def test_large_scores_do_not_overflow(variant, rng):
    """Online softmax rescaling: scores in the hundreds (exp would overflow without the max)."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=2, num_kv_heads=2, head_dim=32, block_size=16,
                     queries=[(20, 3)], kv_bf16=False)
    q = step.q * 30
    step = Step(q, step.k_cache, step.v_cache, step.block_tables, step.tok_seq, step.positions)
    out = run(mod, step, 1.0)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, expected(step, 1.0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_bf16", [False, True])
def test_variants_agree(variant, kv_bf16, rng):
    """Same step on this variant and on the generic build: summation order differs, and with
    a bf16 cache a probability may round to a neighbouring bf16 value."""
    generic = _kernels.load("generic")
    step = make_step(rng, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16,
                     queries=MIXED, kv_bf16=kv_bf16)
    np.testing.assert_allclose(run(_kernels.load(variant), step, 0.125, num_threads=2),
                               run(generic, step, 0.125), **tol(kv_bf16))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_bf16", [False, True])
def test_write_kv_then_attend(variant, kv_bf16, rng):
    """The forward pass's order: write a chunk's K/V through write_kv into a shuffled paged
    cache (NaN everywhere else), then attend; equals attention over the contiguous rows."""
    mod = _kernels.load(variant)
    num_kv_heads, head_dim, block_size, n = 2, 16, 16, 41
    table = np.array([[5, 1, 3, 0]], np.int32)
    keys = rng.standard_normal((n, num_kv_heads, head_dim), dtype=np.float32)
    vals = rng.standard_normal((n, num_kv_heads, head_dim), dtype=np.float32)
    logical = np.full((6, num_kv_heads, block_size, head_dim), np.nan, np.float32)
    if kv_bf16:
        logical = ref_ops.f32_to_bf16_bits(logical)
        keys_seen, vals_seen = (ref_ops.bf16_bits_to_f32(ref_ops.f32_to_bf16_bits(x)) for x in (keys, vals))
    else:
        keys_seen, vals_seen = keys, vals
    k_cache, v_cache = kv_to_layout(logical, "k"), kv_to_layout(logical, "v")
    pos = np.arange(n)
    slots = (table[0, pos // block_size] * block_size + pos % block_size).astype(np.int64)
    mod.write_kv(keys, k_cache, slots, "k")
    mod.write_kv(vals, v_cache, slots, "v")
    q = rng.standard_normal((n, 4, head_dim), dtype=np.float32)
    out = np.empty_like(q)
    mod.paged_attention(q, k_cache, v_cache, table, np.zeros(n, np.int32), pos.astype(np.int32), out, 0.25,
                        num_threads=2)
    for t in range(n):
        for h in range(4):
            qs = q[t, h] * np.float32(0.25)
            if kv_bf16:
                qs = ref_ops.bf16_bits_to_f32(ref_ops.f32_to_bf16_bits(qs))
            s = keys_seen[:t + 1, h // 2].astype(np.float64) @ qs
            p = np.exp(s - s.max())
            np.testing.assert_allclose(out[t, h], p @ vals_seen[:t + 1, h // 2] / p.sum(), **tol(kv_bf16))


@pytest.mark.parametrize("variant", VARIANTS)
def test_rejects_bad_geometry(variant, rng):
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16,
                     queries=[(0, 3)], kv_bf16=False)
    out = np.empty_like(step.q)
    k, v = kv_to_layout(step.k_cache, "k"), step.v_cache
    with pytest.raises(ValueError):      # head_dim not a multiple of 16
        mod.paged_attention(step.q[:, :, :8].copy(), k[:, :, :8].copy(), v[..., :8].copy(),
                            step.block_tables, step.tok_seq, step.positions, out[:, :, :8].copy(), 1.0)
    with pytest.raises(ValueError):      # H not a multiple of Hkv
        mod.paged_attention(step.q[:, :3].copy(), k, v, step.block_tables,
                            step.tok_seq, step.positions, out[:, :3].copy(), 1.0)
    with pytest.raises(ValueError):      # a position beyond the block table
        mod.paged_attention(step.q, k, v, step.block_tables, step.tok_seq,
                            np.array([0, 1, 16 * step.block_tables.shape[1]], np.int32), out, 1.0)
    wide = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, queries=[(0, 3)], kv_bf16=False)
    with pytest.raises(ValueError):      # K given in V's layout
        mod.paged_attention(wide.q, wide.v_cache, wide.v_cache, wide.block_tables, wide.tok_seq,
                            wide.positions, np.empty_like(wide.q), 1.0)
    small = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, queries=[(0, 3)], kv_bf16=False)
    with pytest.raises(ValueError):      # block_size not a multiple of 16
        mod.paged_attention(small.q, kv_to_layout(small.k_cache, "k"), small.v_cache, small.block_tables, small.tok_seq,
                            small.positions, np.empty_like(small.q), 1.0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_bf16", [False, True])
@pytest.mark.parametrize("window", [0, 16, 100])
@pytest.mark.parametrize("num_threads", [2, 3])
def test_decode_split_over_keys(variant, kv_bf16, window, num_threads, rng):
    """Few decode tokens over long contexts: each (token, KV head) is split into key ranges on
    several threads and merged (ll_attention_combine); equals one pass. Splits of 700 keys
    start mid-block; a window of 16 leaves two chunks for three splits: one sees no key."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     queries=[(700, 1), (90, 1)], kv_bf16=kv_bf16)
    np.testing.assert_allclose(run(mod, step, 0.125, sliding_window=window, num_threads=num_threads),
                               expected(step, 0.125, window), **tol(kv_bf16))
