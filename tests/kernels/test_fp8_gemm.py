"""FP8 weights kept at one byte a weight (gemm.h LL_W_FP8, layout.pack_fp8): e4m3 bytes with a
per-row scale for every 128 columns, widened inside the float GEMM. Every variant this machine
runs vs tests/ref_ops.py on the dequantized weights (e4m3 value times its scale, rounded once
to float32: what transformers' and vLLM's dequantization computes).

Shapes hit the tails: K below one 128-column chunk, a whole number of chunks and a short last
chunk; N not a multiple of 16; one token (decode) and token counts past the register tiles.
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
SHAPES = [(1, 64, 96), (7, 300, 33), (13, 256, 17), (1, 384, 200), (9, 130, 48)]


def _fp8_weight(rng: np.random.Generator, n: int, k: int, block: tuple[int, int] | None, top: float = 1e-1):
    """(q uint8 [N, K] e4m3 bytes (no NaN codes), per-row scales [N, ceil(K / 128)] as pack_fp8
    takes them, the dequantized weight float32 [N, K]). block: [bn, bk] block scales, or None:
    one scale per row (a channel); scales drawn from [top / 100, top]."""
    q = rng.integers(0, 256, (n, k), dtype=np.uint8)
    q[(q & 0x7F) == 0x7F] = 0x3C                           # 0x7F / 0xFF are NaN in e4m3fn
    chunks = -(-k // 128)
    if block is None:
        row_scales = np.repeat(rng.uniform(top / 100, top, (n, 1)).astype(np.float32), chunks, axis=1)
    else:
        bn, bk = block
        table = rng.uniform(top / 100, top, (-(-n // bn), -(-k // bk))).astype(np.float32)
        row_scales = table[np.arange(n)[:, None] // bn, (np.arange(chunks) * 128)[None, :] // bk]
    full = np.repeat(row_scales, 128, axis=1)[:, :k]
    w = (ref_ops.fp8_bits_to_f32(q, "fp8_e4m3").astype(np.float32) * full).astype(np.float32)
    return q, np.ascontiguousarray(row_scales), w


def test_pack_round_trip(rng):
    for n, k in ((33, 300), (16, 128), (5, 64)):
        q, scales, _ = _fp8_weight(rng, n, k, (128, 128))
        packed = layout.pack_fp8(q, scales)
        assert packed.shape == (-(-n // 16), layout.fp8_panel_bytes(k))
        q2, s2 = layout.unpack_fp8(packed, n, k)
        np.testing.assert_array_equal(q2, q)
        np.testing.assert_array_equal(s2, scales)


@pytest.mark.parametrize("block", [(128, 128), None, (16, 256)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_weights_widen_exactly(variant, block, rng):
    """x = identity rows: each output is one weight times 1, so the kernel's widened weights
    must equal e4m3 * scale in float32 bit for bit (no second rounding)."""
    mod = _kernels.load(variant)
    n, k = 40, 300
    q, scales, w = _fp8_weight(rng, n, k, block)
    x = np.eye(k, dtype=np.float32)
    out = np.full((k, n), np.nan, np.float32)
    packed = layout.pack_fp8(q, scales)
    mod.gemm(x, packed, "F8_E4M3", n, out, num_threads=2)
    np.testing.assert_array_equal(out, w.T)
    for j in (0, 127, 128, 299):     # one token (the decode path, scaled once per chunk)
        one = np.full((1, n), np.nan, np.float32)
        mod.gemm(x[j:j + 1], packed, "F8_E4M3", n, one, num_threads=2)
        np.testing.assert_array_equal(one[0], w[:, j])


@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("num_tokens,k,n", SHAPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_gemm_matches_reference(variant, num_tokens, k, n, num_threads, rng):
    mod = _kernels.load(variant)
    q, scales, w = _fp8_weight(rng, n, k, (128, 128))
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    out = np.full((num_tokens, n), np.nan, np.float32)
    mod.gemm(x, layout.pack_fp8(q, scales), "F8_E4M3", n, out, bias=bias, num_threads=num_threads)
    expected = ref_ops.gemm(x, w, bias)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-6 * k * np.abs(w).max() + 1e-6)


@pytest.mark.parametrize("num_tokens", [1, 5, 11, 70])   # 70: past one 64-token group
@pytest.mark.parametrize("variant", VARIANTS)
def test_gated_mlp_matches_reference(variant, num_tokens, rng):
    """The fused gated MLP on FP8 gate and up halves (pack_gated's order: gate panels, then up)."""
    mod = _kernels.load(variant)
    f, k = 40, 260
    qg, sg, wg = _fp8_weight(rng, f, k, None, top=1e-3)      # weights under 0.5: sums of a few units
    qu, su, wu = _fp8_weight(rng, f, k, None, top=1e-3)
    packed = np.concatenate([layout.pack_fp8(qg, sg), layout.pack_fp8(qu, su)])
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    out = np.full((num_tokens, f), np.nan, np.float32)
    mod.gated_mlp(x, packed, "F8_E4M3", f, out, "silu", num_threads=2)
    g, u = ref_ops.gemm(x, wg), ref_ops.gemm(x, wu)
    expected = g / (1 + np.exp(-g)) * u
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
