"""RoPE tables against transformers' rotary-embedding modules for every supported scaling type."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lite_llm.config import ModelConfig
from lite_llm.model.rope import inv_freq, rope_tables

BASE = ModelConfig(architecture="LlamaForCausalLM", vocab_size=32, dim=128, ffn_dim=256, num_layers=1,
                   num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=4096)

CASES = [
    (10000.0, None, 32),
    (500000.0, None, 64),
    (10000.0, {"rope_type": "linear", "factor": 4.0}, 32),
    (500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 512}, 64),
    (10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 32),
    (1000000.0, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                 "beta_fast": 16, "beta_slow": 2, "truncate": False}, 64),
    (10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
               "attention_factor": 1.3}, 32),
    (10000.0, {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256,
               "mscale": 0.707, "mscale_all_dim": 1.0}, 32),
]


def _reference(theta: float, scaling: dict | None, head_dim: int, positions: np.ndarray):
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    params = {"rope_type": "default", "rope_theta": theta} if scaling is None else {**scaling, "rope_theta": theta}
    cfg = LlamaConfig(hidden_size=BASE.dim, num_attention_heads=BASE.num_heads, head_dim=head_dim,
                      max_position_embeddings=BASE.max_position_embeddings, rope_parameters=params)
    module = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, len(positions), head_dim)
    cos, sin = module(x, torch.from_numpy(positions)[None])
    half = head_dim // 2
    cos, sin = cos[0].numpy(), sin[0].numpy()
    np.testing.assert_array_equal(cos[:, :half], cos[:, half:])      # rotate-half: both halves equal
    return cos[:, :half], sin[:, :half], module.inv_freq.numpy(), module.attention_scaling


@pytest.mark.parametrize("theta,scaling,head_dim", CASES)
def test_rope_tables_match_transformers(theta, scaling, head_dim):
    config = dataclasses.replace(BASE, head_dim=head_dim, rope_theta=theta,
                                 rope_scaling=dict(scaling) if scaling else None)
    cos, sin = rope_tables(config, 4096)
    assert cos.shape == sin.shape == (4096, head_dim // 2) and cos.dtype == sin.dtype == np.float32
    positions = np.array([0, 1, 2, 7, 100, 511, 1000, 2047, 4095], dtype=np.int64)
    ref_cos, ref_sin, ref_inv, ref_scale = _reference(theta, scaling, head_dim, positions)
    freq, scale = inv_freq(config)
    # transformers blends yarn's two frequency sets in float32, we in float64: a few ulp apart
    np.testing.assert_allclose(freq, ref_inv, rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-12)
    # angles reach ~4e3 rad in float32 (ulp ~5e-4) where torch's float32 cos/sin and ours diverge by rounding
    np.testing.assert_allclose(cos[positions], ref_cos, atol=1e-3 * scale, rtol=0)
    np.testing.assert_allclose(sin[positions], ref_sin, atol=1e-3 * scale, rtol=0)
    np.testing.assert_allclose(cos[positions[:4]], ref_cos[:4], atol=2e-6, rtol=0)
    np.testing.assert_allclose(sin[positions[:4]], ref_sin[:4], atol=2e-6, rtol=0)


def test_rope_identity_at_position_zero_and_unit_circle():
    cos, sin = rope_tables(BASE, 64)
    np.testing.assert_array_equal(cos[0], 1.0)
    np.testing.assert_array_equal(sin[0], 0.0)
    np.testing.assert_allclose(cos ** 2 + sin ** 2, 1.0, atol=1e-6)


def test_unknown_rope_type():
    with pytest.raises(ValueError, match="dynamic.*supported: default, linear, llama3, yarn"):
        rope_tables(dataclasses.replace(BASE, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), 8)


def test_longrope_table_rows_match_transformers_short_and_long():
    """A LongRoPE table of P = 96 positions over an original context of 32: rows 0..31 the short
    factors, rows 32..95 the long ones (a sequence that long), rows 96..127 the long factors of
    positions 0..31; each against transformers' Phi3RotaryEmbedding at a sequence length that
    picks those factors. A table for P <= 32 is the short one alone."""
    import torch
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
    short, long = [1.0, 1.2, 1.7, 2.9, 3.0, 4.0, 5.5, 7.0], [1.0, 2.0, 4.5, 9.0, 11.0, 13.0, 20.0, 31.0]
    scaling = {"rope_type": "longrope", "original_max_position_embeddings": 32, "short_factor": short,
               "long_factor": long}
    config = dataclasses.replace(BASE, head_dim=16, num_heads=8, dim=128, max_position_embeddings=128,
                                 rope_scaling=scaling)
    cos, sin = rope_tables(config, 96)
    assert cos.shape == sin.shape == (128, 8)
    hf = Phi3Config(hidden_size=128, num_attention_heads=8, max_position_embeddings=128,
                    original_max_position_embeddings=32,
                    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short,
                                     "long_factor": long})

    def ref(positions, seq_len):
        module = Phi3RotaryEmbedding(hf)
        c, s = module(torch.zeros(1, 1, 16), torch.tensor([list(positions) + [seq_len - 1]]))
        return c[0, :-1, :8].numpy(), s[0, :-1, :8].numpy()

    for rows, positions, seq_len in ((range(0, 32), range(0, 32), 32), (range(32, 96), range(32, 96), 96),
                                     (range(96, 128), range(0, 32), 96)):
        want_cos, want_sin = ref(positions, seq_len)
        np.testing.assert_allclose(cos[list(rows)], want_cos, atol=2e-6, rtol=0)
        np.testing.assert_allclose(sin[list(rows)], want_sin, atol=2e-6, rtol=0)
    assert rope_tables(config, 32)[0].shape == (32, 8)
    np.testing.assert_array_equal(rope_tables(config, 32)[0], cos[:32])
