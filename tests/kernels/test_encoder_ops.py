"""What encoders (BERT-family pooling models) add to the kernels: bidirectional attention (the
paged attention kernel with each token's key limit at its sequence's last position, as
forward() runs it with attn_positions) and the vectorised erf-GELU, on every variant."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ref_ops  # noqa: E402
from lite_llm import _kernels  # noqa: E402
from lite_llm._kernels.layout import kv_to_layout  # noqa: E402

VARIANTS = _kernels.available()


def _full_attention(q, k, v, scale):
    """softmax(q k^T * scale) v over every key of the sequence: q [n, H, D], k/v [n, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), kk) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, vv)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lens,num_heads,num_kv_heads", [((37, 5, 1), 4, 4), ((70, 16), 4, 2), ((300,), 2, 1)])
def test_bidirectional_attention(variant, lens, num_heads, num_kv_heads, rng):
    mod = _kernels.load(variant)
    D, B = 32, 16
    T = sum(lens)
    blocks = [-(-n // B) for n in lens]
    # shuffled block ids, a NaN block nobody may read
    ids = rng.permutation(sum(blocks) + 1).astype(np.int32)
    poison = ids[-1]
    k = np.full((sum(blocks) + 1, num_kv_heads, B, D), np.nan, np.float32)
    v = np.full_like(k, np.nan)
    tables = np.zeros((len(lens), max(blocks)), np.int32)
    q = rng.standard_normal((T, num_heads, D)).astype(np.float32)
    tok_seq = np.repeat(np.arange(len(lens), dtype=np.int32), lens)
    positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    ks, vs, at = [], [], 0
    for s, n in enumerate(lens):
        tables[s, :blocks[s]] = ids[at:at + blocks[s]]
        tables[s, blocks[s]:] = poison
        at += blocks[s]
        kn = rng.standard_normal((n, num_kv_heads, D)).astype(np.float32)
        vn = rng.standard_normal((n, num_kv_heads, D)).astype(np.float32)
        for p in range(n):
            k[tables[s, p // B], :, p % B] = kn[p]
            v[tables[s, p // B], :, p % B] = vn[p]
        ks.append(kn)
        vs.append(vn)
    last = np.array(lens, np.int32)[tok_seq] - 1          # every token sees its whole sequence
    out = np.full_like(q, np.nan)
    mod.paged_attention(q, kv_to_layout(k, "k"), kv_to_layout(v, "v"), tables, tok_seq, last, out, D ** -0.5,
                        num_threads=2)
    starts = np.concatenate([[0], np.cumsum(lens)])
    for s in range(len(lens)):
        want = _full_attention(q[starts[s]:starts[s + 1]], ks[s], vs[s], D ** -0.5)
        np.testing.assert_allclose(out[starts[s]:starts[s + 1]], want, rtol=1e-4, atol=2e-5)
    # and the reference's causal limit is not what ran: the first token of a sequence differs
    causal = ref_ops.paged_attention(q, k, v, tables, tok_seq, positions, D ** -0.5)
    assert not np.allclose(out[0], causal[0], atol=1e-3)


@pytest.mark.parametrize("variant", VARIANTS)
def test_erf_gelu_over_a_wide_range(variant):
    """The vector erf-GELU (Abramowitz-Stegun erfc, |error| <= 1.5e-7) against math.erf."""
    mod = _kernels.load(variant)
    x = np.linspace(-12.0, 12.0, 16 * 1001, dtype=np.float32)[None, :].copy()
    out = np.empty_like(x)
    mod.act_mul(x, None, out, "gelu", num_threads=1)
    want = ref_ops.act_mul(x, None, "gelu")
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=4e-7)
