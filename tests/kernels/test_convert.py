"""Load-time conversions, compiled vs their NumPy specs: ggml dequantization, fp32 -> bf16
rounding, and packing into the GEMM's panel layout."""
from __future__ import annotations

import numpy as np
import pytest

import ref_ops
from conftest import GGML_WIDE_FIELDS, ggml_file_order, set_iq1m_scale
from lite_llm._kernels import layout
from lite_llm.model import gguf
from lite_llm.model.weights import to_bf16

# ggml type id, bytes per block, byte offsets of the fp16 scales (kept finite)
BLOCKS = {"Q8_0": (8, 34, [0]), "Q4_0": (2, 18, [0]), "Q4_1": (3, 20, [0, 2]), "Q5_0": (6, 22, [0]),
          "Q5_1": (7, 24, [0, 2]), "Q4_K": (12, 144, [0, 2]), "Q5_K": (13, 176, [0, 2]), "Q6_K": (14, 210, [208]),
          "IQ4_NL": (20, 18, [0]), "IQ4_XS": (23, 136, [0]), "Q2_K": (10, 84, [80, 82]), "Q3_K": (11, 110, [108]),
          "TQ2_0": (35, 66, [64]), "TQ1_0": (34, 54, [52]), "MXFP4": (39, 17, []), "IQ2_XXS": (16, 66, [0]),
          "IQ2_XS": (17, 74, [0]), "IQ2_S": (22, 82, [0]), "IQ3_XXS": (18, 98, [0]), "IQ3_S": (21, 110, [0]),
          "IQ1_S": (19, 50, [0]), "IQ1_M": (29, 56, [])}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_dequantize_matches_the_gguf_package(name, rng):
    """Random block bytes (every bit pattern of the quants and 6-bit scales) with finite fp16
    scales: the compiled dequantization equals gguf.quants.dequantize exactly."""
    import gguf as gguf_package
    type_id, nbytes, scales = BLOCKS[name]
    raw = rng.integers(0, 256, (7, nbytes)).astype(np.uint8)       # 7 blocks: uneven per thread
    for off in scales:
        raw[:, off:off + 2] = rng.uniform(-0.1, 0.1, (7, 1)).astype("<f2").view(np.uint8)   # as files store them
    if name == "MXFP4":
        raw[:, 0] = rng.integers(100, 150, 7)                      # e8m0 scales of finite values
    if name == "IQ1_M":                                            # its d: the top nibbles of its scales
        set_iq1m_scale(raw, rng.uniform(-0.1, 0.1, (7, 1)).astype("<f2").view(np.uint8))
    per = 32 if name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4") else 256
    got = gguf.dequantize(raw.reshape(-1), type_id, (7 * per,))
    want = gguf_package.quants.dequantize(ggml_file_order(raw, name), gguf_package.GGMLQuantizationType[name]).reshape(-1)
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_file_order_of_the_gguf_package_bytes(name, rng):
    """What lets the gguf package be the reference on big-endian hosts (s390x): put in file order
    for a big-endian host, each fp16 scale and wide mask reads back, big-endian, as the same
    number the little-endian file holds; single bytes stay; the swap is its own inverse."""
    type_id, nbytes, scales = BLOCKS[name]
    raw = rng.integers(0, 256, (5, nbytes)).astype(np.uint8)
    assert ggml_file_order(raw, name, "little") is raw
    big = ggml_file_order(raw, name, "big")
    np.testing.assert_array_equal(ggml_file_order(big, name, "big"), raw)
    wide = np.zeros(nbytes, bool)
    for off, size in GGML_WIDE_FIELDS[name]:
        wide[off:off + size] = True
        np.testing.assert_array_equal(big[:, off:off + size].copy().view(f">u{size}"),
                                      raw[:, off:off + size].copy().view(f"<u{size}"))
    assert set(scales) <= {off for off, size in GGML_WIDE_FIELDS[name] if size == 2}
    np.testing.assert_array_equal(big[:, ~wide], raw[:, ~wide])


def test_bf16_rounding_matches_the_numpy_spec(rng):
    x = rng.standard_normal(10_001).astype(np.float32)            # large enough for the compiled path
    x[:4] = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, np.inf, -0.0]      # a tie, a round-up, inf, -0
    np.testing.assert_array_equal(to_bf16(x), ref_ops.f32_to_bf16_bits(x))
    x[5] = np.nan
    assert np.isnan(ref_ops.bf16_bits_to_f32(to_bf16(x)[5:6])).all()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (16, 64), (33, 129)])
def test_pack_matches_the_numpy_spec(dtype, shape, rng):
    w = rng.standard_normal(shape).astype(np.float32)
    w = ref_ops.f32_to_bf16_bits(w) if dtype == "bfloat16" else w.astype(dtype)
    np.testing.assert_array_equal(layout.pack(w, dtype), layout.pack_reference(w, dtype))
