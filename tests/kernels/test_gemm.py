"""GEMM on packed weights (ops.pxi `gemm`, src/kernels/gemm.h) and the packed layout (layout.py),
every variant this machine runs vs tests/ref_ops.py.

Sizes are chosen to hit every tail: N not a multiple of 16 (partial panel), panel counts not
a multiple of the 4-panel tile nor of the thread count, K odd (bf16 pair padding), T not a
multiple of the 4-token tile, and T = 1 (decode).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ref_ops  # noqa: E402
from lite_llm import _kernels  # noqa: E402
from lite_llm._kernels import layout  # noqa: E402

VARIANTS = _kernels.available()
DTYPES = ("float32", "bfloat16", "float16")
# (T, K, N): decode, odd K with a lone partial panel, 13 panels over 3 threads, N < 16, full
# 4-panel tiles next to a partial panel over a long odd K
SHAPES = [(1, 64, 96), (7, 129, 33), (5, 33, 200), (13, 255, 17), (4, 16, 5), (1, 1, 1), (6, 301, 70),
          (9, 1001, 128)]


def _weight(rng: np.random.Generator, n: int, k: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(w as stored: float32 / float16 / bf16 bits, the same values as float32)."""
    w = rng.standard_normal((n, k), dtype=np.float32)
    if dtype == "float32":
        return w, w
    if dtype == "float16":
        w16 = w.astype(np.float16)
        return w16, w16.astype(np.float32)
    bits = ref_ops.f32_to_bf16_bits(w)
    return bits, ref_ops.bf16_bits_to_f32(bits)


def _activations_seen(mod, x: np.ndarray, dtype: str) -> np.ndarray:
    """The activations the kernel actually multiplies: builds with bf16 dot products (vdpbf16ps,
    bfdot) round x to bf16 before a bf16-weight GEMM; every other path uses fp32 x."""
    return ref_ops.bf16_round(x) if dtype == "bfloat16" and _has_bf16_dot(mod) else x


def _has_bf16_dot(mod) -> bool:
    """The build multiplies bf16 pairs with a dot-product instruction (avx512bf16, neon_bf16_i8mm)."""
    return "dpbf16" in mod.BF16_PATHS


def _tolerance(k: int) -> dict:
    # fp32 accumulation of K products of N(0,1) values: the error grows ~ eps * K at worst;
    # products of bf16 x bf16 are exact in fp32, so the bf16 path keeps the same bound once
    # the reference sees the same rounded inputs.
    return dict(rtol=1e-5, atol=2e-6 * k + 1e-6)


def _grid(argnames: str, shapes: list[tuple[int, ...]], num_threads: list[int]):
    """The GEMM tests' parameters: every variant this machine runs x every weight dtype x shapes
    (named by argnames) x thread counts."""
    def parametrize(test):
        for name, values in (("num_threads", num_threads), (argnames, shapes), ("dtype", DTYPES),
                             ("variant", VARIANTS)):
            test = pytest.mark.parametrize(name, values)(test)
        return test
    return parametrize


def _inputs(rng: np.random.Generator, variant: str, dtype: str, num_tokens: int, k: int, n: int):
    """(variant's kernels module, x [T, K] float32, w [N, K] as stored, w's values as float32)."""
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    return (_kernels.load(variant), x, *_weight(rng, n, k, dtype))


@_grid("num_tokens,k,n", SHAPES, [1, 2, 3])
def test_gemm_matches_reference(variant, dtype, num_tokens, k, n, num_threads, rng):
    mod, x, w, w_values = _inputs(rng, variant, dtype, num_tokens, k, n)
    out = np.full((num_tokens, n), np.nan, np.float32)      # every element must be written
    mod.gemm(x, layout.pack(w, dtype), dtype, n, out, num_threads=num_threads)
    expected = ref_ops.gemm(_activations_seen(mod, x, dtype), w_values)
    np.testing.assert_allclose(out, expected, **_tolerance(k))


@_grid("num_tokens,k,n", [(1, 64, 96), (7, 129, 33), (6, 31, 70), (5, 401, 96)], [1, 3])
def test_gemm_bias_and_accumulate(variant, dtype, num_tokens, k, n, num_threads, rng):
    """accumulate=True adds to out (residual connection); bias adds once per output."""
    mod, x, w, w_values = _inputs(rng, variant, dtype, num_tokens, k, n)
    bias = rng.standard_normal(n, dtype=np.float32)
    packed = layout.pack(w, dtype)
    xs = _activations_seen(mod, x, dtype)

    out = np.full((num_tokens, n), np.nan, np.float32)
    mod.gemm(x, packed, dtype, n, out, bias=bias, num_threads=num_threads)
    np.testing.assert_allclose(out, ref_ops.gemm(xs, w_values, bias), **_tolerance(k))

    residual = rng.standard_normal((num_tokens, n), dtype=np.float32)
    out = residual.copy()
    mod.gemm(x, packed, dtype, n, out, accumulate=True, num_threads=num_threads)
    np.testing.assert_allclose(out, residual + ref_ops.gemm(xs, w_values), **_tolerance(k))

    out = residual.copy()
    mod.gemm(x, packed, dtype, n, out, bias=bias, accumulate=True, num_threads=num_threads)
    np.testing.assert_allclose(out, residual + ref_ops.gemm(xs, w_values, bias), **_tolerance(k))


@pytest.mark.variants
@pytest.mark.parametrize("dtype", DTYPES)
def test_variants_agree_with_each_other(dtype, rng):
    """Every variant on one prefill-sized GEMM: they differ only by summation order (and the
    avx512bf16 activation rounding, compared against its own rounded reference above)."""
    num_tokens, k, n = 9, 97, 45
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    w, _ = _weight(rng, n, k, dtype)
    packed = layout.pack(w, dtype)
    results = {}
    for variant in VARIANTS:
        mod = _kernels.load(variant)
        if dtype == "bfloat16" and _has_bf16_dot(mod):
            continue
        out = np.empty((num_tokens, n), np.float32)
        mod.gemm(x, packed, dtype, n, out, num_threads=2)
        results[variant] = out
    first = next(iter(results.values()))
    for variant, out in results.items():
        np.testing.assert_allclose(out, first, rtol=1e-5, atol=2e-6 * k, err_msg=variant)


def test_bf16_activation_rounding_is_round_to_nearest_even(rng):
    """Ties in x must round to even exactly like ll_f32_to_bf16 (and vcvtne2ps2bf16): with a
    one-hot weight the output is the rounded activation itself, for K over and under 32."""
    for variant in VARIANTS:
        mod = _kernels.load(variant)
        k = 70   # 2 full vector chunks of 32 plus a scalar tail of 6
        # bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie (rounds down to 1), 1 + 3*2^-8 rounds up
        x = np.array([[1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 1 + 2.0 ** -9] * 17 + [1 + 2.0 ** -8] * 2],
                     np.float32)
        w = np.eye(k, dtype=np.float32)              # out[t, j] = x[t, j] * 1
        bits = ref_ops.f32_to_bf16_bits(w)
        out = np.empty((1, k), np.float32)
        mod.gemm(x, layout.pack(bits, "bfloat16"), "bfloat16", k, out)
        expected = ref_ops.bf16_round(x) if _has_bf16_dot(mod) else x
        np.testing.assert_array_equal(out, expected, err_msg=variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_rejects_mismatched_shapes(variant, rng):
    mod = _kernels.load(variant)
    x = rng.standard_normal((3, 20), dtype=np.float32)
    packed = layout.pack(rng.standard_normal((33, 20), dtype=np.float32), "float32")
    with pytest.raises(ValueError):
        mod.gemm(x, packed, "float32", 33, np.empty((3, 32), np.float32))       # out too narrow
    with pytest.raises(ValueError):
        mod.gemm(x, packed, "float32", 49, np.empty((3, 49), np.float32))       # n needs a 4th panel
    with pytest.raises(ValueError):
        mod.gemm(x[:, :19].copy(), packed, "float32", 33, np.empty((3, 33), np.float32))   # K differs
    with pytest.raises(ValueError):
        mod.gemm(x, packed, "float32", 33, np.empty((3, 33), np.float32), bias=np.zeros(32, np.float32))


# ---- packed layout ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(1, 1), (16, 2), (17, 3), (33, 129), (48, 64)])
def test_pack_unpack_roundtrip(dtype, n, k, rng):
    w, _ = _weight(rng, n, k, dtype)
    packed = layout.pack(w, dtype)
    assert packed.ctypes.data % 64 == 0
    num_panels = -(-n // 16)
    if dtype == "bfloat16":
        assert packed.shape == (num_panels, -(-k // 2), 16, 2) and packed.dtype == np.uint16
    else:
        assert packed.shape == (num_panels, k, 16) and packed.dtype == w.dtype
    np.testing.assert_array_equal(layout.unpack(packed, n, k, dtype), w)
    # padding rows (and the odd-K bf16 pair column) are zero: the kernel multiplies them
    full = layout.unpack(packed, num_panels * 16, packed.shape[1] * (2 if dtype == "bfloat16" else 1), dtype)
    assert not full[n:].any() and not full[:, k:].any()


def test_pack_element_positions():
    """The documented layout, element by element: f32 (n, k) at [n/16][k][n%16];
    bf16 (n, k) at [n/16][k/2][n%16][k%2]."""
    n, k = 35, 7
    w = (np.arange(n)[:, None] * 100 + np.arange(k)[None, :]).astype(np.float32)
    p32 = layout.pack(w, "float32")
    pbf = layout.pack(w.astype(np.uint16), "bfloat16")
    for row in (0, 15, 16, 34):
        for col in (0, 5, 6):
            assert p32[row // 16, col, row % 16] == w[row, col]
            assert pbf[row // 16, col // 2, row % 16, col % 2] == w[row, col]


def test_pack_rejects_non_matrix():
    with pytest.raises(ValueError):
        layout.pack(np.zeros(5, np.float32), "float32")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_16_bit_weight_code_decodes_exactly(variant, dtype):
    """All 65536 codes as a [65536, 1] weight times x = 1: out is each decoded value, exactly
    (subnormals, infinities, NaN and both zeros included). vdpbf16ps and bfdot treat bf16
    subnormals as zero by design, so builds with bf16 dot products are held to that for them."""
    mod = _kernels.load(variant)
    codes = np.arange(2 ** 16, dtype=np.uint16)
    if dtype == "float16":
        w, values = codes.view(np.float16)[:, None], codes.view(np.float16).astype(np.float32)
    else:
        w, values = codes[:, None], ref_ops.bf16_bits_to_f32(codes)
        if _has_bf16_dot(mod):
            values = np.where((codes & 0x7F80) == 0, np.float32(0), values)
    out = np.empty((1, codes.size), np.float32)
    mod.gemm(np.ones((1, 1), np.float32), layout.pack(w, dtype), dtype, codes.size, out, num_threads=2)
    np.testing.assert_array_equal(out[0], values)


# (T, K, F): decode (the streaming path), odd K and F (pair padding), F not a multiple of 16
# (each half's partial panel), feature panels not a multiple of the 2-panel tile or of the
# thread count, T not a multiple of the 4-token tile, decode past one run of 32 gate then 32 up
# panels (gemm.h LL_GATED_RUN)
GATED_SHAPES = [(1, 64, 96), (1, 33, 37), (7, 129, 33), (5, 48, 200), (13, 16, 5), (1, 32, 1100)]


@_grid("num_tokens,k,ffn_dim", GATED_SHAPES, [1, 2, 3])
def test_gated_mlp_matches_reference(variant, dtype, num_tokens, k, ffn_dim, num_threads, rng):
    """act(x @ Wg.T + bg) * (x @ Wu.T + bu) in one fused pass over layout.pack_gated panels."""
    mod, x, w, w_values = _inputs(rng, variant, dtype, num_tokens, k, 2 * ffn_dim)
    for act in ("silu", "gelu", "relu"):
        for bias in (None, rng.standard_normal(2 * ffn_dim, dtype=np.float32)):
            out = np.full((num_tokens, ffn_dim), np.nan, np.float32)
            mod.gated_mlp(x, layout.pack_gated(w, ffn_dim, dtype), dtype, ffn_dim, out, act, bias=bias,
                          num_threads=num_threads)
            h = ref_ops.gemm(_activations_seen(mod, x, dtype), w_values, bias)
            expected = ref_ops.act_mul(h[:, :ffn_dim], h[:, ffn_dim:], act)
            tol = _tolerance(k)
            if dtype == "bfloat16" and _has_bf16_dot(mod):   # handed on as bf16, as the next GEMM reads it
                expected = ref_ops.bf16_round(expected.astype(np.float32))
                tol = dict(rtol=8e-3, atol=tol["atol"] * 4)
            np.testing.assert_allclose(out, expected, **tol, err_msg=f"{act}, bias {bias is not None}")


def test_pack_gated_layout(rng):
    """Feature panel q is gate panel q and up panel ceil(F/16) + q, each half padded alone."""
    w = rng.standard_normal((2 * 37, 5), dtype=np.float32)
    packed = layout.pack_gated(w, 37, "float32")
    assert packed.shape[0] == 2 * 3 and packed.ctypes.data % 64 == 0
    np.testing.assert_array_equal(layout.unpack(packed[:3], 37, 5, "float32"), w[:37])
    np.testing.assert_array_equal(layout.unpack(packed[3:], 37, 5, "float32"), w[37:])
    with pytest.raises(ValueError):
        layout.pack_gated(w, 36, "float32")


def test_weight_arena_packs_the_same_into_shared_segments(rng):
    """Inside a WeightArena packed weights share 2 MB-aligned segments (huge-page backed where
    the kernel allows), each array 64-byte aligned, none overlapping; the values are pack()'s."""
    ws = [rng.standard_normal((n, k), dtype=np.float32) for n, k in [(33, 70), (16, 5), (200, 129)]]
    plain = [layout.pack(w, "float32") for w in ws]
    with layout.WeightArena():
        packed = [layout.pack(w, "float32") for w in ws] + [layout.pack_gated(ws[2][:200], 100, "float32")]
    spans = sorted((p.ctypes.data, p.ctypes.data + p.nbytes) for p in packed)
    assert all(a % 64 == 0 for a, _ in spans)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    assert packed[0].base is not None and packed[0].ctypes.data % (2 << 20) == 0   # first in a segment
    for p, q in zip(packed, plain):
        np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(packed[3], layout.pack_gated(ws[2][:200], 100, "float32"))
