"""Row-wise kernels vs tests/ref_ops.py on every variant: RMSNorm, LayerNorm, neox RoPE,
activation-and-multiply, logit soft-capping, and the KV-cache write.

Widths are odd or not multiples of 16 so the vector loops and their scalar tails both run;
row counts are not multiples of the thread counts.
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
THREADS = [1, 2, 3]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_tokens,dim", [(1, 64), (5, 37), (7, 200), (3, 15)])
@pytest.mark.parametrize("num_threads", THREADS)
def test_rmsnorm(variant, num_tokens, dim, num_threads, rng):
    mod = _kernels.load(variant)
    x = (rng.standard_normal((num_tokens, dim)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, dim).astype(np.float32)
    out = np.full_like(x, np.nan)
    mod.rmsnorm(x, w, out, 1e-5, num_threads=num_threads)
    # one fp32 sum of squares and a few products per element
    np.testing.assert_allclose(out, ref_ops.rmsnorm(x, w, 1e-5), rtol=2e-6 * np.sqrt(dim) + 1e-6, atol=1e-6)
    # in place (out aliases x), as the forward pass uses it
    y = x.copy()
    mod.rmsnorm(y, w, y, 1e-5, num_threads=num_threads)
    np.testing.assert_allclose(y, out, rtol=1e-6, atol=1e-7)


def test_rmsnorm_eps_matters():
    """eps is inside the square root: a zero row gives 0, a tiny row is damped by eps."""
    for variant in VARIANTS:
        mod = _kernels.load(variant)
        x = np.array([[0.0] * 20, [1e-3] * 20], np.float32)
        out = np.empty_like(x)
        mod.rmsnorm(x, np.ones(20, np.float32), out, 1e-6)
        np.testing.assert_allclose(out, ref_ops.rmsnorm(x, np.ones(20), 1e-6), rtol=1e-5, err_msg=variant)
        assert abs(out[1, 0] - 1e-3 / np.sqrt(1e-6 + 1e-6)) < 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_tokens,dim", [(1, 64), (5, 37), (7, 200)])
@pytest.mark.parametrize("num_threads", THREADS)
def test_layernorm(variant, num_tokens, dim, num_threads, rng):
    mod = _kernels.load(variant)
    # an offset mean (5) so a one-pass variance would lose digits; the kernel is two-pass
    x = (rng.standard_normal((num_tokens, dim)) * 2 + 5).astype(np.float32)
    w = rng.uniform(0.5, 1.5, dim).astype(np.float32)
    b = rng.standard_normal(dim).astype(np.float32)
    out = np.full_like(x, np.nan)
    mod.layernorm(x, w, b, out, 1e-5, num_threads=num_threads)
    np.testing.assert_allclose(out, ref_ops.layernorm(x, w, b, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_norms_reject_mismatched_shapes(variant):
    mod = _kernels.load(variant)
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError):
        mod.rmsnorm(x, np.ones(7, np.float32), np.empty_like(x), 1e-5)
    with pytest.raises(ValueError):
        mod.layernorm(x, np.ones(8, np.float32), np.zeros(8, np.float32), np.empty((3, 8), np.float32), 1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("head_dim", [24, 64, 80, 128])    # half = 12 (tail only), 32, 40 (32 + tail), 64
@pytest.mark.parametrize("num_threads", THREADS)
def test_rope_neox(variant, head_dim, num_threads, rng):
    mod = _kernels.load(variant)
    num_tokens, num_heads, max_positions = 7, 3, 300
    cos, sin = ref_ops.rope_tables(max_positions, head_dim, theta=10000.0)
    positions = rng.integers(0, max_positions, num_tokens).astype(np.int32)
    positions[0] = 0                        # identity rotation
    positions[1] = max_positions - 1        # last table row
    x = rng.standard_normal((num_tokens, num_heads, head_dim), dtype=np.float32)
    y = x.copy()
    mod.rope(y, positions, cos, sin, num_threads=num_threads)
    np.testing.assert_allclose(y, ref_ops.rope_neox(x, positions, cos, sin), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y[0], x[0])   # cos 1, sin 0 at position 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_rope_rejects_positions_outside_the_table(variant, rng):
    mod = _kernels.load(variant)
    cos, sin = ref_ops.rope_tables(16, 32)
    x = rng.standard_normal((2, 1, 32), dtype=np.float32)
    with pytest.raises(ValueError):
        mod.rope(x, np.array([3, 16], np.int32), cos, sin)
    with pytest.raises(ValueError):
        mod.rope(x, np.array([-1, 0], np.int32), cos, sin)
    with pytest.raises(ValueError):
        mod.rope(x, np.array([0], np.int32), cos, sin)       # positions do not match T


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh", "relu", "quick_gelu", "relu2"])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("num_tokens,ffn_dim", [(1, 96), (5, 37), (4, 200)])
def test_act_mul(variant, act, gated, num_tokens, ffn_dim, rng):
    mod = _kernels.load(variant)
    gate = (rng.standard_normal((num_tokens, ffn_dim)) * 4).astype(np.float32)
    gate[0, :8] = [-100.0, -30.0, -0.0, 0.0, 1e-8, 30.0, 100.0, -1e-8]   # exp over/underflow ends
    up = rng.standard_normal((num_tokens, ffn_dim), dtype=np.float32) if gated else None
    out = np.full_like(gate, np.nan)
    mod.act_mul(gate, up, out, act, num_threads=2)
    # SiLU's vector exp is a polynomial (rel. error ~2e-7), erf-GELU's erfc too (abs. ~1.5e-7 x)
    np.testing.assert_allclose(out, ref_ops.act_mul(gate, up, act), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rows,vocab,cap", [(1, 320, 30.0), (3, 37, 5.0), (2, 15, 50.0)])
def test_softcap(variant, rows, vocab, cap, rng):
    mod = _kernels.load(variant)
    x = (rng.standard_normal((rows, vocab)) * 3 * cap).astype(np.float32)
    x[0, :6] = [0.0, 1e-6, -1e-6, 1e4, -1e4, cap]      # tanh's flat ends and its linear middle
    want = ref_ops.softcap(x, cap)
    mod.softcap(x, cap)
    # the vector tanh is 1 - 2 / (1 + exp(2y)): absolute error ~1e-7 of the cap near 0
    np.testing.assert_allclose(x, want, rtol=2e-6, atol=2e-7 * cap)
    with pytest.raises(ValueError):
        mod.softcap(x, 0.0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_act_mul_in_place_and_errors(variant, rng):
    mod = _kernels.load(variant)
    gate = rng.standard_normal((3, 40), dtype=np.float32)
    up = rng.standard_normal((3, 40), dtype=np.float32)
    expected = ref_ops.act_mul(gate, up, "silu")
    mod.act_mul(gate, up, gate, "silu")                  # out aliases gate
    np.testing.assert_allclose(gate, expected, rtol=2e-6, atol=1e-6)
    with pytest.raises(KeyError):
        mod.act_mul(gate, up, gate, "swish")
    with pytest.raises(ValueError):
        mod.act_mul(gate, up[:, :39].copy(), gate, "silu")


@pytest.mark.parametrize("cache_dtype", [np.float32, np.uint16])
def test_kv_layouts_round_trip(cache_dtype, rng):
    """layout.kv_to_layout / kv_from_layout are inverses, with the shapes kv_cache_shapes gives."""
    logical = rng.integers(0, 2 ** 16, (3, 2, 16, 32)).astype(cache_dtype)
    k_shape, v_shape = layout.kv_cache_shapes(3, 2, 16, 32, cache_dtype == np.uint16)
    for which, shape in (("k", k_shape), ("v", v_shape)):
        cache = layout.kv_to_layout(logical, which)
        assert cache.shape == shape
        assert layout.kv_geometry(cache, which) == (3, 2, 16, 32)
        np.testing.assert_array_equal(layout.kv_from_layout(cache, which), logical)
    with pytest.raises(ValueError):
        layout.kv_geometry(np.zeros(logical.shape, np.float16), "k")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cache_dtype", [np.float32, np.uint16])
@pytest.mark.parametrize("which", ["k", "v"])
def test_write_kv(variant, cache_dtype, which, rng):
    """Rows land at block slot // B, row slot % B of every kv head, in the kernel's K or V
    layout; nothing else changes; a bf16 cache rounds to nearest even (and keeps NaN a NaN)."""
    mod = _kernels.load(variant)
    num_blocks, num_kv_heads, block_size, head_dim = 6, 3, 6, 32
    logical = rng.integers(0, 2 ** 16, (num_blocks, num_kv_heads, block_size, head_dim)).astype(np.uint16)
    if cache_dtype == np.float32:
        logical = rng.standard_normal(logical.shape, dtype=np.float32)
    slots = np.array([0, 5, 6, 35, 17, 11, 12], np.int64)    # first, block ends, last slot, shuffled
    src = rng.standard_normal((len(slots), num_kv_heads, head_dim), dtype=np.float32)
    src[0, 0, :3] = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, np.nan]   # a tie, a round-up, a NaN
    expected = ref_ops.write_kv(logical, src, slots)
    cache = layout.kv_to_layout(logical, which)
    mod.write_kv(src, cache, slots, which)
    got = layout.kv_from_layout(cache, which)
    if cache_dtype == np.uint16:
        nan = np.isnan(ref_ops.bf16_bits_to_f32(expected))
        assert np.isnan(ref_ops.bf16_bits_to_f32(got))[nan].all()
        np.testing.assert_array_equal(got[~nan], expected[~nan])
    else:
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError):
        mod.write_kv(src[:1], cache, np.array([num_blocks * block_size], np.int64), which)
    with pytest.raises(ValueError):
        mod.write_kv(src[:1], cache, np.array([-1], np.int64), which)
    with pytest.raises(ValueError):
        mod.write_kv(src[:1], cache, slots[:1], "q")


KV8 = ["int8", "fp8_e4m3", "fp8_e5m2"]


@pytest.mark.parametrize("kv_dtype", KV8)
def test_kv8_layouts_round_trip(kv_dtype, rng):
    """8-bit caches: codes and scales in, the same codes and scales out, in the shapes
    kv_cache_shapes gives; a region is (D + 4) B bytes, the scales after the codes."""
    codes = rng.integers(0, 256, (3, 2, 16, 32)).astype(layout.KV_NUMPY[kv_dtype])
    scales = rng.random((3, 2, 16), dtype=np.float32)
    k_shape, v_shape = layout.kv_cache_shapes(3, 2, 16, 32, kv_dtype)
    assert layout.kv_region_bytes(kv_dtype, 16, 32) == 36 * 16
    for which, shape in (("k", k_shape), ("v", v_shape)):
        cache = layout.kv_to_layout(codes, which, scales)
        assert cache.shape == shape and cache.dtype == codes.dtype
        assert layout.kv_geometry(cache, which) == (3, 2, 16, 32)
        got_codes, got_scales = layout.kv_from_layout(cache, which)
        np.testing.assert_array_equal(got_codes, codes)
        np.testing.assert_array_equal(got_scales, scales)
        flat = cache.reshape(3, 2, -1)
        np.testing.assert_array_equal(flat[1, 0, 32 * 16:].view(np.float32), scales[1, 0])
    np.testing.assert_array_equal(layout.kv_to_layout(codes, "k", scales).reshape(3, 2, -1)[2, 1, :32 * 16],
                                  codes[2, 1].T.ravel())          # K codes transposed: [D][B]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_dtype", KV8)
@pytest.mark.parametrize("which", ["k", "v"])
def test_write_kv_8bit(variant, kv_dtype, which, rng):
    """8-bit caches: each written (token, kv head) row gets exactly the codes and scale of
    ref_ops.quantize_kv (round to nearest even, ties included; saturation; a zero row);
    rows not written keep their bytes."""
    mod = _kernels.load(variant)
    num_blocks, num_kv_heads, block_size, head_dim = 6, 3, 6, 32
    codes = rng.integers(0, 256, (num_blocks, num_kv_heads, block_size, head_dim)).astype(layout.KV_NUMPY[kv_dtype])
    scales = rng.random((num_blocks, num_kv_heads, block_size), dtype=np.float32)
    slots = np.array([0, 5, 6, 35, 17, 11, 12], np.int64)
    src = (rng.standard_normal((len(slots), num_kv_heads, head_dim)) *
           10.0 ** rng.uniform(-4, 4, (len(slots), num_kv_heads, 1))).astype(np.float32)
    top = np.float32(ref_ops.KV8_MAX[kv_dtype])
    # a row whose scale is exactly 1: its values are the codes' own, so ties are real ties
    ties = {"int8": [2.5, -2.5, 3.5, 0.5, 126.5, -126.49],
            "fp8_e4m3": [1.0625, 1.1875, -2 ** -10, 3 * 2 ** -11, 2 ** -6 * 0.999, 440.0],
            "fp8_e5m2": [1.125, 1.375, -2 ** -17, 3 * 2 ** -18, 2 ** -14 * 0.999, 53248.0]}[kv_dtype]
    src[1, 1] = 0.0
    src[1, 1, :len(ties)] = ties
    src[1, 1, -1] = top
    src[2, 0] = 0.0                                              # a zero row: scale 0, codes 0
    exp_codes, exp_scales = ref_ops.write_kv8(codes, scales, src, slots, kv_dtype)
    cache = layout.kv_to_layout(codes, which, scales)
    mod.write_kv(src, cache, slots, which, kv_dtype=kv_dtype)
    got_codes, got_scales = layout.kv_from_layout(cache, which)
    np.testing.assert_array_equal(got_scales, exp_scales)
    np.testing.assert_array_equal(got_codes, exp_codes)
    assert exp_scales[slots[1] // block_size, 1, slots[1] % block_size] == 1.0
    assert exp_scales[slots[2] // block_size, 0, slots[2] % block_size] == 0.0
    # round trip: every value back within half a code step of its row's scale
    deq = ref_ops.dequantize_kv(got_codes, got_scales, kv_dtype)
    for tok, slot in enumerate(slots):
        row = deq[slot // block_size, :, slot % block_size]
        x = src[tok].astype(np.float64)
        scale = got_scales[slot // block_size, :, slot % block_size, None].astype(np.float64)
        if kv_dtype == "int8":
            bound = 0.5 * scale * (1 + 1e-6)
        else:
            mant = 3 if kv_dtype == "fp8_e4m3" else 2
            bound = np.abs(x) * 2.0 ** -(mant + 1) + scale * 2.0 ** (-(ref_ops.FP8[kv_dtype][1] - 1) - mant - 1)
        assert (np.abs(row - x) <= bound * (1 + 1e-6)).all(), (tok, np.abs(row - x).max())




@pytest.mark.parametrize("shape", [(3, 5), (64, 3, 64, 128)])   # below and above the own-mapping size
def test_aligned_zeros(shape):
    a = layout.aligned_zeros(shape, np.uint16)
    assert a.shape == shape and a.dtype == np.uint16 and a.ctypes.data % 64 == 0
    assert a.flags.writeable and a.flags.c_contiguous and not a.any()
    a[-1] = 7
    assert a.sum() == 7 * np.prod(shape[1:])
