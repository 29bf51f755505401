"""Paged attention (ops.pxi `paged_attention`, src/kernels/attention.h) vs tests/ref_ops.py on
every variant.

One call mixes what an engine step holds: a decode token deep in a long context, a
one-token sequence, and a prefill chunk in the middle of a sequence (attending to its cached
context plus itself causally). Block tables are shuffled, non-contiguous block ids; every
cache row a query must not see (beyond its sequence, unused table entries, a poison block)
holds NaN, so any read out of bounds or past the causal limit shows up as NaN (8-bit caches:
random codes and a NaN scale).

Every test runs on each KV cache format: float32, bfloat16 and the 8-bit ones (int8, fp8 e4m3,
fp8 e5m2: codes and a scale per row), the 8-bit ones against the reference on the dequantized
cache: the kernel decodes codes in registers, so only fp32 rounding separates the two.
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
from lite_llm._kernels import layout  # noqa: E402
from lite_llm._kernels.layout import kv_to_layout  # noqa: E402

VARIANTS = _kernels.available()


KV_DTYPES = ["float32", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2"]
KV8 = ["int8", "fp8_e4m3", "fp8_e5m2"]


@dataclass(frozen=True)
class Step:
    q: np.ndarray             # [T, H, D]
    k_cache: np.ndarray       # [num_blocks, Hkv, B, D] float32, bf16 bits or 8-bit codes (logical)
    v_cache: np.ndarray
    block_tables: np.ndarray  # [S, max_blocks] int32
    tok_seq: np.ndarray       # [T] int32
    positions: np.ndarray     # [T] int32
    kv_dtype: str = "float32"
    k_scales: np.ndarray | None = None   # [num_blocks, Hkv, B] float32: 8-bit caches only
    v_scales: np.ndarray | None = None

    def values(self, which: str) -> np.ndarray:
        """The logical cache as the reference reads it: bf16 bits as they are (the reference
        rounds q like the kernel), 8-bit codes dequantized to float64."""
        cache, scales = (self.k_cache, self.k_scales) if which == "k" else (self.v_cache, self.v_scales)
        return cache if scales is None else ref_ops.dequantize_kv(cache, scales, self.kv_dtype)

    def layout(self, which: str) -> np.ndarray:
        cache, scales = (self.k_cache, self.k_scales) if which == "k" else (self.v_cache, self.v_scales)
        return kv_to_layout(cache, which, scales)

    def with_kv(self, k: np.ndarray, v: np.ndarray, kv_dtype: str) -> Step:
        """The same queries over float32 logical caches k, v (NaN rows unwritten), stored as kv_dtype."""
        k_cache, v_cache, _, k_scales, v_scales = _store(k, v, kv_dtype, np.random.default_rng(0))
        return Step(self.q, k_cache, v_cache, self.block_tables, self.tok_seq, self.positions, kv_dtype,
                    k_scales, v_scales)


def _store(k: np.ndarray, v: np.ndarray, kv_dtype: str, rng: np.random.Generator) -> tuple:
    """(k_cache, v_cache, kv_dtype, k_scales, v_scales) of float32 logical caches with NaN rows
    unwritten: 8-bit rows quantized, unwritten ones random codes with a NaN scale."""
    if kv_dtype == "float32":
        return k, v, kv_dtype, None, None
    if kv_dtype == "bfloat16":
        return ref_ops.f32_to_bf16_bits(k), ref_ops.f32_to_bf16_bits(v), kv_dtype, None, None
    out = []
    for x in (k, v):
        unwritten = np.isnan(x).any(axis=-1)
        codes, scales = ref_ops.quantize_kv(np.nan_to_num(x), kv_dtype)
        codes[unwritten] = rng.integers(0, 256, (int(unwritten.sum()), x.shape[-1])).astype(codes.dtype)
        scales[unwritten] = np.nan
        out.append((codes, scales))
    return out[0][0], out[1][0], kv_dtype, out[0][1], out[1][1]


def make_step(rng: np.random.Generator, *, num_heads: int, num_kv_heads: int, head_dim: int,
              block_size: int, queries: list[tuple[int, int]], kv_dtype: str = "float32") -> Step:
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
    k_cache, v_cache, kv_dtype, k_scales, v_scales = _store(k, v, kv_dtype, rng)
    return Step(q, k_cache, v_cache, block_tables, tok_seq, positions, kv_dtype, k_scales, v_scales)


def run(mod, step: Step, scale: float, sliding_window: int = 0, num_threads: int = 1,
        path: str = "direct") -> np.ndarray:
    """The kernel's output; path "direct" unless named (attention.h LL_ATTN_*: the dot products
    on the cache's own elements, which the tests below hold to the tightest tolerances)."""
    out = np.full(step.q.shape, np.nan, np.float32)
    mod.paged_attention(step.q, step.layout("k"), step.layout("v"),
                        step.block_tables, step.tok_seq, step.positions, out, scale,
                        sliding_window=sliding_window, num_threads=num_threads, kv_dtype=step.kv_dtype,
                        path=path)
    return out


def expected(step: Step, scale: float, sliding_window: int = 0, round_q: bool | None = None) -> np.ndarray:
    return ref_ops.paged_attention(step.q, step.values("k"), step.values("v"), step.block_tables,
                                   step.tok_seq, step.positions, scale, sliding_window, round_q=round_q)


# (H, Hkv): multi-head, grouped-query, multi-query
GEOMETRIES = [(2, 2), (8, 2), (4, 1)]
# decode at position 36, a lone first token, a 13-token prefill chunk at positions 50..62
MIXED = [(36, 1), (0, 1), (50, 13)]
# Tolerance: fp32 dot products of length D and an online softmax whose exp is a polynomial
# (rel. error ~2e-7). A bf16 cache is compared against its own decoded values and q * scale
# rounded as the kernel rounds it; its probabilities are rounded to bf16 (rel. 2^-9 each)
# before P @ V, which the reference cannot repeat: a looser bound.
# 8-bit caches: the kernel's scores are (q . codes) x scale in fp32, the reference's q . (codes
# x scale) in float64; codes reach 448 (e4m3) or 57344 (e5m2), so partial sums are larger
# than the fp32 cache's, by the code range over the values' range: a little looser.
TOL = dict(rtol=2e-5, atol=2e-5)
TOL_BF16 = dict(rtol=5e-3, atol=5e-3)
TOL_KV8 = dict(rtol=5e-5, atol=5e-5)


def tol(kv_dtype: str) -> dict:
    return TOL_BF16 if kv_dtype == "bfloat16" else TOL_KV8 if kv_dtype in KV8 else TOL


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_heads,num_kv_heads", GEOMETRIES)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_mixed_step(variant, num_heads, num_kv_heads, kv_dtype, num_threads, rng):
    mod = _kernels.load(variant)
    head_dim = 32
    step = make_step(rng, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     block_size=16, queries=MIXED, kv_dtype=kv_dtype)
    scale = head_dim ** -0.5
    np.testing.assert_allclose(run(mod, step, scale, num_threads=num_threads), expected(step, scale),
                               **tol(kv_dtype))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("block_size", [16, 32, 48])
@pytest.mark.parametrize("head_dim", [16, 80])
@pytest.mark.parametrize("kv_dtype", ["float32", "int8", "fp8_e4m3"])
def test_block_sizes_and_head_dims(variant, block_size, head_dim, kv_dtype, rng):
    """Odd block size (score tails, chunk boundaries inside blocks), blocks longer than the
    16-lane exp loop, and head_dim 80 (5 vectors; 8-bit regions of 84 x B bytes)."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=head_dim, block_size=block_size,
                     queries=[(3, 9), (70, 1), (0, 4)], kv_dtype=kv_dtype)
    np.testing.assert_allclose(run(mod, step, 0.2, num_threads=2), expected(step, 0.2), **tol(kv_dtype))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("softcap,window", [(2.0, 0), (50.0, 0), (3.0, 17)])
def test_softcapped_scores(variant, kv_dtype, softcap, window, rng):
    """Gemma 2's attention soft-capping: scaled scores -> cap * tanh(score / cap) before the
    softmax, in the split path of a long decode too; a cap of 2 changes the result."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                     queries=MIXED + [(600, 1)], kv_dtype=kv_dtype)
    out = np.full(step.q.shape, np.nan, np.float32)
    mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                        step.positions, out, 0.5, sliding_window=window, num_threads=3, kv_dtype=step.kv_dtype,
                        softcap=softcap, path="direct")
    want = ref_ops.paged_attention(step.q, step.values("k"), step.values("v"), step.block_tables, step.tok_seq,
                                   step.positions, 0.5, window, softcap=softcap)
    np.testing.assert_allclose(out, want, **tol(kv_dtype))
    if softcap == 2.0:
        assert np.abs(want - expected(step, 0.5, window)).max() > 0.1


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("window", [1, 8, 17, 1000])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_sliding_window(variant, window, kv_dtype, rng):
    """Each query sees positions > its own - window: a window of 1 returns V at its own
    position; a window longer than the context changes nothing."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     queries=MIXED, kv_dtype=kv_dtype)
    out = run(mod, step, 0.125, sliding_window=window, num_threads=3)
    np.testing.assert_allclose(out, expected(step, 0.125, window), **tol(kv_dtype))
    if window == 1:
        v = ref_ops.kv_values(step.values("v"))
        for t, (seq, pos) in enumerate(zip(step.tok_seq, step.positions)):
            blk = step.block_tables[seq, pos // 16]
            # atol: hidden keys get exp(-87.3) ~ 1e-38, not 0 (ll_exp clamps its input); where an
            # int8 code 0 makes the expected value exactly 0, their share shows
            np.testing.assert_allclose(out[t], v[blk, np.arange(4) // 2, pos % 16], rtol=1e-6, atol=1e-30)
    if window == 1000:
        np.testing.assert_allclose(out, expected(step, 0.125), **tol(kv_dtype))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("window", [0, 5, 40])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("num_threads,path", [(1, "direct"), (3, "direct"), (2, None)])
def test_key_limit_past_the_query(variant, window, kv_dtype, num_threads, path, rng):
    """last_positions: a query sees keys from the window behind its own position up to its
    limit (Gemma 3's image tokens see their whole image): spans of a prefill chunk whose rows
    see to the span's end, beside causal rows, a decode token and a lone one; staged tiles
    (path None) and key splits too. Spans longer than the window 5 keep the window behind
    the query, not behind the limit."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     queries=[(36, 1), (0, 1), (20, 40)], kv_dtype=kv_dtype)
    last = step.positions.copy()
    chunk = np.flatnonzero(step.tok_seq == 2)                     # positions 20..59
    for lo, hi in ((22, 31), (40, 41), (45, 60)):                 # spans [lo, hi): 9 rows, 1 row, 15 rows
        last[chunk[(step.positions[chunk] >= lo) & (step.positions[chunk] < hi)]] = hi - 1
    out = np.full(step.q.shape, np.nan, np.float32)
    mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                        step.positions, out, 0.125, sliding_window=window, num_threads=num_threads,
                        kv_dtype=step.kv_dtype, path=path, last_positions=last)
    want = ref_ops.paged_attention(step.q, step.values("k"), step.values("v"), step.block_tables, step.tok_seq,
                                   step.positions, 0.125, window, last_positions=last)
    # the staged path (None) rounds q and the probabilities of bf16 and 8-bit caches to bf16
    close = dict(rtol=1.5e-2, atol=1.5e-2) if path is None else tol(kv_dtype)
    np.testing.assert_allclose(out, want, **close)
    causal = expected(step, 0.125, window)
    spans = last != step.positions
    assert np.abs(want[spans] - causal[spans]).max() > 5e-2       # the limit mattered
    np.testing.assert_allclose(out[~spans], causal[~spans], **close)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", ["float32", "int8", "fp8_e5m2"])
def test_chunk_is_causal_and_independent_of_later_cache_rows(variant, kv_dtype, rng):
    """A prefill chunk's query at position p must not change when K/V after p change."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=2, num_kv_heads=1, head_dim=16, block_size=16,
                     queries=[(26, 6)])
    k, v = step.k_cache.copy(), step.v_cache.copy()                # float32, NaN where unwritten
    before = run(mod, step.with_kv(k, v, kv_dtype), 0.25)
    last_blk, row = step.block_tables[0, 31 // 16], 31 % 16        # position 31, the chunk's last
    k[last_blk, :, row] += 10.0
    v[last_blk, :, row] -= 10.0
    after = run(mod, step.with_kv(k, v, kv_dtype), 0.25)
    np.testing.assert_array_equal(after[:-1], before[:-1])
    assert not np.allclose(after[-1], before[-1])


@pytest.mark.parametrize("variant", VARIANTS)
def test_large_scores_do_not_overflow(variant, rng):
    """Online softmax rescaling: scores in the hundreds (exp would overflow without the max)."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=2, num_kv_heads=2, head_dim=32, block_size=16,
                     queries=[(20, 3)])
    q = step.q * 30
    step = Step(q, step.k_cache, step.v_cache, step.block_tables, step.tok_seq, step.positions)
    out = run(mod, step, 1.0)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, expected(step, 1.0), rtol=1e-4, atol=1e-4)


@pytest.mark.variants
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_variants_agree(variant, kv_dtype, rng):
    """Same step on this variant and on the generic build: summation order differs, and with
    a bf16 cache a probability may round to a neighbouring bf16 value."""
    generic = _kernels.load("generic")
    step = make_step(rng, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16,
                     queries=MIXED, kv_dtype=kv_dtype)
    np.testing.assert_allclose(run(_kernels.load(variant), step, 0.125, num_threads=2),
                               run(generic, step, 0.125), **tol(kv_dtype))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_write_kv_then_attend(variant, kv_dtype, rng):
    """The forward pass's order: write a chunk's K/V through write_kv into a shuffled paged
    cache (NaN everywhere else), then attend; equals attention over the contiguous rows (as
    stored: rounded to bf16, or quantized and dequantized by the 8-bit spec)."""
    mod = _kernels.load(variant)
    num_kv_heads, head_dim, block_size, n = 2, 16, 16, 41
    table = np.array([[5, 1, 3, 0]], np.int32)
    keys = rng.standard_normal((n, num_kv_heads, head_dim), dtype=np.float32)
    vals = rng.standard_normal((n, num_kv_heads, head_dim), dtype=np.float32)
    nan = np.full((6, num_kv_heads, block_size, head_dim), np.nan, np.float32)
    _, _, _, k_scales, v_scales = _store(nan, nan, kv_dtype, rng)
    if kv_dtype == "bfloat16":
        logical = ref_ops.f32_to_bf16_bits(nan)
        keys_seen, vals_seen = (ref_ops.bf16_bits_to_f32(ref_ops.f32_to_bf16_bits(x)) for x in (keys, vals))
    elif kv_dtype in KV8:
        logical = rng.integers(0, 256, nan.shape).astype(layout.KV_NUMPY[kv_dtype])
        keys_seen, vals_seen = (ref_ops.dequantize_kv(*ref_ops.quantize_kv(x, kv_dtype), kv_dtype) for x in (keys, vals))
    else:
        logical, keys_seen, vals_seen = nan, keys, vals
    k_cache, v_cache = kv_to_layout(logical, "k", k_scales), kv_to_layout(logical, "v", v_scales)
    pos = np.arange(n)
    slots = (table[0, pos // block_size] * block_size + pos % block_size).astype(np.int64)
    mod.write_kv(keys, k_cache, slots, "k", kv_dtype=kv_dtype)
    mod.write_kv(vals, v_cache, slots, "v", kv_dtype=kv_dtype)
    q = rng.standard_normal((n, 4, head_dim), dtype=np.float32)
    out = np.empty_like(q)
    mod.paged_attention(q, k_cache, v_cache, table, np.zeros(n, np.int32), pos.astype(np.int32), out, 0.25,
                        num_threads=2, kv_dtype=kv_dtype, path="direct")
    for t in range(n):
        for h in range(4):
            qs = q[t, h] * np.float32(0.25)
            if kv_dtype == "bfloat16":
                qs = ref_ops.bf16_bits_to_f32(ref_ops.f32_to_bf16_bits(qs))
            s = keys_seen[:t + 1, h // 2].astype(np.float64) @ qs
            p = np.exp(s - s.max())
            np.testing.assert_allclose(out[t, h], p @ vals_seen[:t + 1, h // 2] / p.sum(), **tol(kv_dtype))


@pytest.mark.parametrize("variant", VARIANTS)
def test_rejects_bad_geometry(variant, rng):
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16,
                     queries=[(0, 3)])
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
    wide = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, queries=[(0, 3)])
    with pytest.raises(ValueError):      # K given in V's layout
        mod.paged_attention(wide.q, wide.v_cache, wide.v_cache, wide.block_tables, wide.tok_seq,
                            wide.positions, np.empty_like(wide.q), 1.0)
    small = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, queries=[(0, 3)])
    with pytest.raises(ValueError):      # block_size not a multiple of 16
        mod.paged_attention(small.q, kv_to_layout(small.k_cache, "k"), small.v_cache, small.block_tables, small.tok_seq,
                            small.positions, np.empty_like(small.q), 1.0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("window", [0, 16, 100])
@pytest.mark.parametrize("num_threads", [2, 3])
def test_decode_split_over_keys(variant, kv_dtype, window, num_threads, rng):
    """Few decode tokens over long contexts: each (token, KV head) is split into key ranges on
    several threads and merged (ll_attention_combine); equals one pass. Splits of 700 keys
    start mid-block; a window of 16 leaves two chunks for three splits: one sees no key."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                     queries=[(700, 1), (90, 1)], kv_dtype=kv_dtype)
    np.testing.assert_allclose(run(mod, step, 0.125, sliding_window=window, num_threads=num_threads),
                               expected(step, 0.125, window), **tol(kv_dtype))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV8)
def test_prefill_chunk_across_spans(variant, kv_dtype, rng):
    """8-bit caches: a prefill chunk whose keys cross the 256-key span boundary (two spans, an
    edge chunk at each end of the window), beside a first chunk of another sequence."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=6, num_kv_heads=2, head_dim=48, block_size=32,
                     queries=[(250, 19), (0, 20)], kv_dtype=kv_dtype)
    for window in (0, 40):
        np.testing.assert_allclose(run(mod, step, 0.15, sliding_window=window, num_threads=3),
                                   expected(step, 0.15, window), **tol(kv_dtype))


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_cache_needs_its_format_named(variant, rng):
    """A uint8 cache is e4m3 or e5m2: the array cannot say which, so the call must."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=2, num_kv_heads=1, head_dim=16, block_size=16, queries=[(0, 3)],
                     kv_dtype="fp8_e4m3")
    out = np.empty_like(step.q)
    with pytest.raises(ValueError, match="fp8_e4m3, fp8_e5m2"):
        mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                            step.positions, out, 1.0)
    with pytest.raises(ValueError, match="int8"):      # the name must match the array's dtype
        mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                            step.positions, out, 1.0, kv_dtype="int8")


# Staged tiles (attention.h): a span of K and V converted once into the compute type, then
# every row block's dot products on the copy. "bf16" stages 8-bit caches into bf16 pairs (q
# and the probabilities rounded to bf16, as with a bf16 cache: the reference rounds q too);
# "fma" stages bf16 and 8-bit caches into fp32 (nothing rounded: the fp32 tolerances, with the
# reference on unrounded q); "auto" stages tiles of at least ATTENTION_STAGE_ROWS rows into
# the bf16 GEMM path's type and runs the others direct.
def _tile_paths(mod, step: Step, path: str) -> list[str]:
    """The path each query token's tile runs ("direct", "bf16" or "fma")."""
    if path != "auto":
        return [path] * len(step.positions)
    group = step.q.shape[1] // step.k_cache.shape[1]
    staged = "fma" if mod.BF16_PATHS[0] == "fma" else "bf16"     # the build's default bf16 path first
    out, t = [], 0
    while t < len(step.positions):   # tiles: consecutive tokens of one sequence, at most QTILE
        n = 1
        while (t + n < len(step.positions) and step.tok_seq[t + n] == step.tok_seq[t]
               and n < mod.ATTENTION_QTILE):
            n += 1
        out += [staged if n * group >= mod.ATTENTION_STAGE_ROWS else "direct"] * n
        t += n
    return out


def _path_reference(kv_dtype: str, path: str) -> tuple[bool, dict]:
    """(round_q for the reference, tolerance) of a tile run on `path` over a kv_dtype cache."""
    if kv_dtype == "float32":
        return False, TOL
    if path == "fma":
        return False, TOL_KV8
    if path == "bf16" or kv_dtype == "bfloat16":
        return True, TOL_BF16
    return False, TOL_KV8


def _check_paths(mod, step: Step, scale: float, window: int, num_threads: int, path: str) -> None:
    out = run(mod, step, scale, sliding_window=window, num_threads=num_threads, path=path)
    refs = {}
    for t, tile_path in enumerate(_tile_paths(mod, step, path)):
        round_q, tolerance = _path_reference(step.kv_dtype, tile_path)
        if round_q not in refs:
            refs[round_q] = expected(step, scale, window, round_q=round_q)
        np.testing.assert_allclose(out[t], refs[round_q][t], **tolerance)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("path", ["auto", "direct", "bf16", "fma"])
def test_every_path(variant, kv_dtype, path, rng):
    """Each path on each cache type: a mixed step (decode tiles, a lone token, prefill tiles of
    8 and 5 tokens x 4 heads) and a chunk across the 256-key span with an edge chunk at each end
    of a window; unwritten rows are NaN (8-bit: a NaN scale), which staging must not let in."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=8, num_kv_heads=2, head_dim=32, block_size=16, queries=MIXED,
                     kv_dtype=kv_dtype)
    _check_paths(mod, step, 0.2, 0, 2, path)
    step = make_step(rng, num_heads=6, num_kv_heads=2, head_dim=48, block_size=32,
                     queries=[(250, 19), (0, 20)], kv_dtype=kv_dtype)
    for window in (0, 40):
        _check_paths(mod, step, 0.15, window, 3, path)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("path", ["auto", "direct", "bf16", "fma"])
@pytest.mark.parametrize("window", [0, 16])
def test_attention_sinks_on_every_path(variant, kv_dtype, path, window, rng):
    """gpt-oss's sinks (a logit per head in the softmax's denominator) on every path: a mixed
    step (decode, a lone first token, prefill tiles) and a decode of two sequences over long
    contexts split over keys on three threads (the sinks added once, in the combine); sinks
    from below the scores to far above them (a head whose weight is nearly all on its sink)."""
    mod = _kernels.load(variant)
    sinks = np.array([-3.0, 0.0, 1.5, 9.0, -0.5, 2.5, 0.3, 5.0], np.float32)
    for queries, threads in ((MIXED, 2), ([(700, 1), (90, 1)], 3)):
        step = make_step(rng, num_heads=8, num_kv_heads=2, head_dim=32, block_size=16, queries=queries,
                         kv_dtype=kv_dtype)
        out = np.full(step.q.shape, np.nan, np.float32)
        mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                            step.positions, out, 0.2, sliding_window=window, num_threads=threads,
                            kv_dtype=step.kv_dtype, path=path, sinks=sinks)
        for t, tile_path in enumerate(_tile_paths(mod, step, path)):
            round_q, tolerance = _path_reference(step.kv_dtype, tile_path)
            want = ref_ops.paged_attention(step.q[t:t + 1], step.values("k"), step.values("v"), step.block_tables,
                                           step.tok_seq[t:t + 1], step.positions[t:t + 1], 0.2, window,
                                           round_q=round_q, sinks=sinks)
            np.testing.assert_allclose(out[t:t + 1], want, **tolerance)
        plain = ref_ops.paged_attention(step.q, step.values("k"), step.values("v"), step.block_tables,
                                        step.tok_seq, step.positions, 0.2, window)
        assert np.abs(out - plain).max() > 0.1        # the sinks change the result


@pytest.mark.parametrize("variant", VARIANTS)
def test_sinks_refused_unless_one_per_head(variant, rng):
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, queries=[(0, 3)])
    out = np.empty_like(step.q)
    with pytest.raises(ValueError, match="3 sinks for 4 heads"):
        mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                            step.positions, out, 1.0, sinks=np.zeros(3, np.float32))


@pytest.mark.parametrize("variant", VARIANTS)
def test_unknown_path_refused(variant, rng):
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=2, num_kv_heads=1, head_dim=16, block_size=16, queries=[(0, 3)])
    with pytest.raises(ValueError, match="auto, direct, bf16, fma"):
        run(mod, step, 1.0, path="fastest")


# forward()'s attention phase (ops.pxi _attention_phase) is what paged_attention runs in a team
# of num_threads: the same query tiles, key splits and work hand-out. attention_plan tells what a
# step gets, so the cases above are held to reaching the schedules they are written for.


@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_cases_reach_forward_schedules(num_threads, rng):
    """Few-sequence decode over long contexts splits keys with 2+ threads (not with 1: four
    items already feed it); a 13-token prefill chunk spans two query tiles; short contexts
    never split."""
    mod = _kernels.load(VARIANTS[0])
    decode = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, queries=[(700, 1), (90, 1)])
    tiles, nsplit = mod.attention_plan(decode.tok_seq, decode.positions, 2, num_threads)
    assert tiles == 2 and (nsplit > 1) == (num_threads > 1)
    mixed = make_step(rng, num_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                      queries=[(36, 1), (0, 1), (50, 13)])
    tiles, nsplit = mod.attention_plan(mixed.tok_seq, mixed.positions, 2, num_threads)
    assert tiles == 2 + -(-13 // mod.ATTENTION_QTILE) and nsplit == 1   # 8 items; 3 threads: contexts < 128 keys
    short = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, queries=[(40, 1)])
    assert mod.attention_plan(short.tok_seq, short.positions, 2, num_threads) == (1, 1)   # < 128 keys: no split


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("form", ["bf16", "q8"])
@pytest.mark.parametrize("queries,num_threads", [([(700, 1), (90, 1)], 3), ([(700, 1), (90, 1)], 1),
                                                 ([(36, 1), (0, 1), (50, 13)], 2)])
def test_o_input_made_as_rows_finish(variant, form, queries, num_threads, rng):
    """The o projection's input forward() makes inside the phase (after each item without key
    splits, after each merge with them) is out's final rows in that form, bit for bit."""
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, queries=queries,
                     kv_dtype="bfloat16")
    nsplit = mod.attention_plan(step.tok_seq, step.positions, 2, num_threads)[1]
    assert (nsplit > 1) == (len(queries) == 2 and num_threads > 1)
    out = np.full(step.q.shape, np.nan, np.float32)
    got = mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                              step.positions, out, 0.125, num_threads=num_threads, kv_dtype="bfloat16",
                              o_input=form)
    np.testing.assert_allclose(out, expected(step, 0.125), **tol("bfloat16"))
    rows = out.reshape(len(out), -1)
    if form == "bf16":
        np.testing.assert_array_equal(got.view(np.uint16), ref_ops.f32_to_bf16_bits(rows))
    else:
        for part, want in zip(got, mod.quantize_q8(rows)):
            np.testing.assert_array_equal(part, want)


@pytest.mark.parametrize("variant", VARIANTS)
def test_o_input_rejects_what_it_cannot_make(variant, rng):
    mod = _kernels.load(variant)
    step = make_step(rng, num_heads=1, num_kv_heads=1, head_dim=16, block_size=16, queries=[(3, 1)])
    out = np.empty_like(step.q)
    with pytest.raises(ValueError, match="not whole int8 blocks"):
        mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                            step.positions, out, 1.0, o_input="q8")
    with pytest.raises(ValueError, match="o_input 'fp16'"):
        mod.paged_attention(step.q, step.layout("k"), step.layout("v"), step.block_tables, step.tok_seq,
                            step.positions, out, 1.0, o_input="fp16")
