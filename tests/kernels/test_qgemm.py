"""Block-quantized weights kept quantized (src/kernels/qgemm.h, matmul.h): int8 activation
blocks, the interleaved panels every ggml type is repacked into, and the int8 GEMM / fused
gated MLP on them, every variant this machine runs vs tests/ref_ops.py.

Shapes hit the tails: N not a multiple of 16 (a partial panel), token counts below, at and
past the 8-token tile and past the 64 tokens a codebook panel is decoded once for, one token
(decode), and 1..3 threads over few panels.
"""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ref_ops  # noqa: E402
from conftest import ggml_file_order, ggml_rows  # noqa: E402
from lite_llm import _kernels  # noqa: E402

VARIANTS = _kernels.available()
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K",
         "TQ2_0", "TQ1_0", "MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")


def _packed(mod, raw: np.ndarray, qname: str, n: int, k: int) -> np.ndarray:
    out = np.zeros(((n + 15) // 16, mod.qpanel_bytes(qname, k)), np.uint8)
    mod.qpack_into(np.ascontiguousarray(raw), out, qname, k, 2)
    return out


def _close(got: np.ndarray, want: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """fp32 sums of per-block products: errors of a few ulps of sum |x| |w| per output."""
    scale = np.abs(ref_ops.dequantize_q8(*ref_ops.quantize_q8(x)[:2])) @ np.abs(w.astype(np.float64)).T
    np.testing.assert_array_less(np.abs(got - want), 2e-6 * scale + 1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_tokens,k", [(1, 32), (3, 96), (9, 512), (0, 64)])
def test_quantize_q8_matches_reference(variant, num_tokens, k, rng):
    x = (rng.standard_normal((num_tokens, k)) * rng.uniform(0.01, 10.0, (num_tokens, 1))).astype(np.float32)
    if num_tokens > 2:
        x[1, :32] = 0.0                         # an all-zero block: scale 0, quants 0
        x[2, 5] = 1e4                           # one outlier sets its block's scale
    q, d, s, n = _kernels.load(variant).quantize_q8(x)
    qr, dr, sr, nr = ref_ops.quantize_q8(x)
    np.testing.assert_array_equal(q, qr)
    np.testing.assert_array_equal(d, dr)
    np.testing.assert_array_equal(s, sr)
    assert n.dtype == np.int32
    np.testing.assert_array_equal(n, nr)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qname", TYPES)
@pytest.mark.parametrize("n", [1, 16, 37])
def test_packed_panels_dequantize_like_the_gguf_package(variant, qname, n, rng):
    """Packing keeps every value: the panels read back equal gguf's own dequantization."""
    mod = _kernels.load(variant)
    k = 512
    raw, values = ggml_rows(rng, n, k, qname)
    np.testing.assert_array_equal(mod.qdequantize_packed(_packed(mod, raw, qname, n, k), qname, n, k), values)


def test_packing_refuses_what_does_not_fit(rng):
    mod = _kernels.kernels
    raw, _ = ggml_rows(rng, 4, 64, "Q8_0")
    with pytest.raises(ValueError, match="not 96 values of Q8_0"):
        mod.qpack_into(raw, np.zeros((1, mod.qpanel_bytes("Q8_0", 96)), np.uint8), "Q8_0", 96)
    with pytest.raises(ValueError, match=r"dst .* is not uint8 \[1, 1088\]"):
        mod.qpack_into(raw, np.zeros((2, 1088), np.uint8), "Q8_0", 64)
    with pytest.raises(ValueError, match="BF16 is not a block-quantized format"):
        mod.qpack_into(raw, np.zeros((1, 1088), np.uint8), "BF16", 64)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qname", TYPES)
@pytest.mark.parametrize("num_tokens,n", [(1, 37), (3, 16), (8, 5), (11, 53), (17, 40), (70, 21)])
@pytest.mark.parametrize("num_threads", [1, 3])
def test_qgemm_matches_reference(variant, qname, num_tokens, n, num_threads, rng):
    mod = _kernels.load(variant)
    k = 512
    raw, w = ggml_rows(rng, n, k, qname)
    x = rng.standard_normal((num_tokens, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    out = rng.standard_normal((num_tokens, n)).astype(np.float32)
    before = out.copy()
    mod.gemm(x, _packed(mod, raw, qname, n, k), qname, n, out, bias=bias, accumulate=True, num_threads=num_threads)
    _close(out, before + ref_ops.qgemm(x, w, bias), x, w)


_IQ4_VALUES = np.array(gguf.quants.IQ4_NL.kvalues, np.int32)
_MXFP4_VALUES = np.array(gguf.quants.MXFP4.kvalues, np.int32)   # doubled e2m1


def _nibble_values(qs: np.ndarray, table: np.ndarray) -> np.ndarray:
    """[..., 16] bytes of packed nibbles -> [..., 32] table values: low nibbles first, then high."""
    return np.concatenate([table[qs & 15], table[qs >> 4]], axis=-1)


def _signed_blocks(raw: np.ndarray, qname: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(int weights [n, k / 32, 32], float32 scale [n, k / 32]) of the signed block types, from the
    ggml bytes as a GGUF file stores them: w = scale x int, the scale as the kernel makes it
    (IQ4_XS: d x its sub-block's scale, MXFP4: 2^(e - 128) for doubled values)."""
    nb = k // 32
    if qname == "Q8_0":
        b = raw.reshape(n, nb, 34)
        return b[..., 2:].view(np.int8).astype(np.int32), b[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    if qname == "IQ4_NL":
        b = raw.reshape(n, nb, 18)
        return _nibble_values(b[..., 2:], _IQ4_VALUES), b[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    if qname == "MXFP4":
        b = raw.reshape(n, nb, 17)
        e = b[..., 0].astype(np.int32)
        return _nibble_values(b[..., 1:], _MXFP4_VALUES), np.ldexp(np.float32(1), e - 128).astype(np.float32)
    b = raw.reshape(n, k // 256, 136)   # IQ4_XS: d, scales_h (u16), scales_l[4], qs[8][16]
    d = b[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    sh = b[..., 2:4].copy().view("<u2")[..., 0].astype(np.int32)
    j = np.arange(8)
    ls = ((b[..., 4 + j // 2] >> (4 * (j % 2))) & 15) | (((sh[..., None] >> (2 * j)) & 3) << 4)
    scale = (d[..., None] * (ls - 32).astype(np.float32)).astype(np.float32)
    vals = _nibble_values(b[..., 8:].reshape(n, k // 256, 8, 16), _IQ4_VALUES)
    return vals.reshape(n, nb, 32), scale.reshape(n, nb)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qname", ["Q8_0", "IQ4_NL", "IQ4_XS", "MXFP4"])
@pytest.mark.parametrize("num_tokens", [1, 9, 70])
def test_signed_block_types_are_exact_integer_dots(variant, qname, num_tokens, rng):
    """Signed weight blocks: each block's dot is an exact int32 sum of int8 products, whatever
    instructions make it (w + 128 on unsigned VNNI products, 128 x the activation block's sum
    taken off in int32, or signed products): so every output is, bit for bit, the float32
    sequence acc = fma(w scale, float(int dot) x d_x, acc) over the blocks in order, for every
    token alone or in any tile. A correction made in float instead (128 sum(x) off after the
    conversion) moves the last bits, and which ones with how the compiler fused it. The plain-C
    backend's ll_fma is a * b + c, one rounding or two as its build contracts it (the generic
    variants of aarch64 and s390x: -ffp-contract=off; x86-64's baseline has no FMA)."""
    mod = _kernels.load(variant)
    n, k = 37, 512
    raw, w = ggml_rows(rng, n, k, qname)
    wi, ws = _signed_blocks(raw, qname, n, k)     # ggml_rows' bytes are in file order on every host
    np.testing.assert_array_equal(ws[..., None] * wi.astype(np.float32), w.reshape(n, k // 32, 32))
    x = (rng.standard_normal((num_tokens, k)) * rng.uniform(0.1, 10.0, (num_tokens, 1))).astype(np.float32)
    out = np.full((num_tokens, n), np.nan, np.float32)
    mod.gemm(x, _packed(mod, raw, qname, n, k), qname, n, out, num_threads=2)
    q, dx, _, _ = ref_ops.quantize_q8(x)
    dots = np.einsum("tbi,rbi->trb", q.reshape(num_tokens, k // 32, 32).astype(np.int64), wi.astype(np.int64))
    fused = unfused = np.zeros((num_tokens, n), np.float32)
    for b in range(k // 32):   # fma: the float64 product of two float32 is exact, one rounding after the add
        f = (dots[:, :, b].astype(np.float32) * dx[:, b, None]).astype(np.float32)
        fused = (ws[None, :, b].astype(np.float64) * f.astype(np.float64) + fused).astype(np.float32)
        unfused = (ws[None, :, b] * f).astype(np.float32) + unfused
    if mod.ISA == "scalar" and not np.array_equal(out, fused):
        np.testing.assert_array_equal(out, unfused)
    else:
        np.testing.assert_array_equal(out, fused)


def _emulated_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fma as test_signed_block_types_are_exact_integer_dots emulates it: the float64
    product of two float32 is exact, one rounding after the add (then to float32)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qname", ["Q2_K", "Q3_K"])
@pytest.mark.parametrize("num_tokens", [1, 9, 70])
def test_k_quant_sums_are_exact_integer_dots(variant, qname, num_tokens, rng):
    """Q3_K's and Q2_K's blocks: each 32-value block's dot is the exact int32 sum of its integer
    weights sc x (u - 4) (Q3_K) or sc x q (Q2_K) times the int8 activations, whether made from
    unsigned dot products and the half-blocks' int sums (one token, a tile) or from the weights
    turned into scaled bytes once for many tokens (VBMI): so every output is, bit for bit, the
    float32 sequence acc = fma(d, float(int dot) x d_x, acc) (Q2_K: then the mins, fma(dmin x min,
    -s, acc) for each half) over the blocks in order, for a token alone or in any tile."""
    mod = _kernels.load(variant)
    n, k = 37, 512
    raw, w = ggml_rows(rng, n, k, qname)
    nsb = k // 256
    b = raw.reshape(n, nsb, -1)
    if qname == "Q3_K":                 # hmask[32], qs[64], scales[12], d
        d = b[..., 108:110].copy().view("<f2")[..., 0].astype(np.float32)
        mins = None
        wi = np.rint(w.reshape(n, nsb, 256) / d[..., None]).astype(np.int64)
    else:                               # scales[16] (scale | min << 4), qs[64], d, dmin
        d = b[..., 80:82].copy().view("<f2")[..., 0].astype(np.float32)
        dmin = b[..., 82:84].copy().view("<f2")[..., 0].astype(np.float32)
        mins = (dmin[..., None] * (b[..., :16] >> 4).astype(np.float32)).astype(np.float32)     # [n, nsb, 16]
        wi = np.rint((w.reshape(n, nsb, 256).astype(np.float64) + np.repeat(mins, 16, -1)) / d[..., None]).astype(np.int64)
    x = (rng.standard_normal((num_tokens, k)) * rng.uniform(0.1, 10.0, (num_tokens, 1))).astype(np.float32)
    out = np.full((num_tokens, n), np.nan, np.float32)
    mod.gemm(x, _packed(mod, raw, qname, n, k), qname, n, out, num_threads=2)
    q, dx, sx, _ = ref_ops.quantize_q8(x)
    dots = np.einsum("tbi,rbi->trb", q.reshape(num_tokens, k // 32, 32).astype(np.int64), wi.reshape(n, k // 32, 32))
    scalar = mod.ISA == "scalar"
    acc = np.zeros((num_tokens, n), np.float32)
    for blk in range(k // 32):
        sb = blk // 8
        f = (dots[:, :, blk].astype(np.float32) * dx[:, blk, None]).astype(np.float32)
        acc = (d[None, :, sb] * f + acc).astype(np.float32) if scalar else _emulated_fma(d[None, :, sb], f, acc)
        if mins is not None:
            for h in range(2):
                m, s = mins[None, :, sb, 2 * (blk % 8) + h], -sx[:, 2 * blk + h, None]
                acc = (m * s + acc).astype(np.float32) if scalar else _emulated_fma(m, s, acc)
    if scalar and not np.array_equal(out, acc):    # the plain-C backend's fma: one rounding or two
        acc = np.zeros((num_tokens, n), np.float32)
        for blk in range(k // 32):
            sb = blk // 8
            f = (dots[:, :, blk].astype(np.float32) * dx[:, blk, None]).astype(np.float32)
            acc = _emulated_fma(d[None, :, sb], f, acc)
            if mins is not None:
                for h in range(2):
                    acc = _emulated_fma(mins[None, :, sb, 2 * (blk % 8) + h], -sx[:, 2 * blk + h, None], acc)
    np.testing.assert_array_equal(out, acc)


CODEBOOK = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")


@pytest.mark.parametrize("qname", CODEBOOK + ("Q2_K", "Q3_K"))
def test_codebook_sums_are_the_same_bits_alone_in_a_tile_and_on_every_variant(qname, rng):
    """A codebook (or Q2_K, Q3_K) panel's sums are one kernel's per output: a token computed alone
    (decode) gets the bits it gets inside a tile of 9 and inside the 70 tokens a panel is decoded
    once for, and every x86 vector variant gets the same bits (the decode with VBMI's byte tables
    and BITALG's sign masks on avx512bf16, the gathers and sign bytes on avx512 and avx2; Q2_K's
    and Q3_K's scaled bytes from VBMI's tables, the tile path's int sums elsewhere)."""
    k, n = 512, 37
    raw, w = ggml_rows(rng, n, k, qname)
    x = rng.standard_normal((70, k)).astype(np.float32)
    results = {}
    for variant in VARIANTS:
        mod = _kernels.load(variant)
        packed = _packed(mod, raw, qname, n, k)
        outs = []
        for rows in (slice(0, 70), slice(0, 9), slice(0, 1), slice(5, 6), slice(69, 70)):
            out = np.zeros((rows.stop - rows.start, n), np.float32)
            mod.gemm(np.ascontiguousarray(x[rows]), packed, qname, n, out, num_threads=2)
            outs.append((rows, out))
        many = outs[0][1]
        for rows, out in outs[1:]:
            np.testing.assert_array_equal(out, many[rows], err_msg=f"{variant}: rows {rows} differ from the 70-token step")
        _close(many, ref_ops.qgemm(x, w, None), x, w)
        results[variant] = many
    vector = [v for v in VARIANTS if v in ("avx512bf16", "avx512", "avx2")]
    for v in vector[1:]:
        np.testing.assert_array_equal(results[v], results[vector[0]], err_msg=f"{v} vs {vector[0]}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("gate_type,up_type", [("Q4_K", "Q4_K"), ("Q4_0", "Q8_0"), ("Q6_K", "Q4_1"),
                                               ("Q5_K", "Q5_0"), ("Q5_1", "Q4_K"), ("IQ4_XS", "IQ4_NL"),
                                               ("Q3_K", "Q2_K"), ("Q2_K", "Q6_K"), ("TQ2_0", "TQ1_0"),
                                               ("MXFP4", "Q3_K"), ("IQ2_XXS", "IQ3_XXS"), ("IQ2_XS", "IQ1_S"),
                                               ("IQ2_S", "IQ3_S"), ("IQ1_M", "IQ2_XXS")])
@pytest.mark.parametrize("num_tokens", [1, 5, 10, 70])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("f", [40, 1100])
def test_quantized_gated_mlp_matches_reference(variant, gate_type, up_type, num_tokens, act, f, rng):
    """Gate and up parts of their own types, F not a multiple of 16 (a padded panel in each part);
    1100 features: 69 panels, past the decode path's runs of 32 gate then 32 up panels."""
    mod = _kernels.load(variant)
    k = 256
    graw, wg = ggml_rows(rng, f, k, gate_type)
    uraw, wu = ggml_rows(rng, f, k, up_type)
    x = rng.standard_normal((num_tokens, k)).astype(np.float32)
    out = np.zeros((num_tokens, f), np.float32)
    mod.gated_mlp(x, (_packed(mod, graw, gate_type, f, k), _packed(mod, uraw, up_type, f, k)),
                  (gate_type, up_type), f, out, act, num_threads=2)
    gate, up = ref_ops.qgemm(x, wg), ref_ops.qgemm(x, wu)
    want = ref_ops.act_mul(gate, up, act)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qname", ["Q8_0", "Q4_0"])
def test_quantizing_at_load_writes_the_gguf_package_bytes(variant, qname, rng):
    """ggml's reference quantizers, byte for byte (gguf.quants is their NumPy port): zero
    blocks, outliers, tiny and huge scales."""
    x = (rng.standard_normal((37, 512)) * rng.uniform(1e-3, 1e2, (37, 1))).astype(np.float32)
    x[3, :32] = 0.0
    x[4, 40] = 1e5
    x[5, 64:96] = 1e-9
    got = _kernels.load(variant).quantize_ggml(x, qname, 2)
    want = ggml_file_order(gguf.quants.quantize(x, gguf.GGMLQuantizationType[qname]), qname)
    np.testing.assert_array_equal(got, want)


def test_quantizing_at_load_refuses_other_types(rng):
    x = rng.standard_normal((2, 48)).astype(np.float32)
    with pytest.raises(ValueError, match="not whole 32-value blocks"):
        _kernels.kernels.quantize_ggml(x, "Q8_0")
    with pytest.raises(ValueError, match="quantizing to Q4_K is not supported"):
        _kernels.kernels.quantize_ggml(np.ascontiguousarray(x[:, :32]), "Q4_K")
