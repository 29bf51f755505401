"""DeepSeek's pieces of the kernels against NumPy references, on every variant: the grouped
router (src/kernels/moe.h ll_moe_route_grouped: V2's softmax with group_limited_greedy, V3's
sigmoid with the correction bias and the groups scored by their two best) and the latent
attention over the compressed cache (src/kernels/mla.h), whose absorbed form must equal the
naive one: per-head keys and values expanded from the latent by W_UK / W_UV."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lite_llm import _kernels  # noqa: E402

VARIANTS = _kernels.available()


def _topk(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest, the larger first, the lower index first among equals."""
    return np.argsort(-values, kind="stable")[:k]


def route_reference(logits, k, n_group, topk_group, renorm, sigmoid, scale, bias=None):
    """DeepSeek-V2 / V3's routers (transformers' DeepseekV2TopkRouter / DeepseekV3TopkRouter) in
    float64, one row at a time: (expert ids [T, k], weights [T, k])."""
    sels, weights = [], []
    for row in logits.astype(np.float64):
        if sigmoid:
            score = 1 / (1 + np.exp(-row))
            choice = score + (bias if bias is not None else 0)
        else:
            score = np.exp(row - row.max())
            score /= score.sum()
            choice = score.copy()
        groups = choice.reshape(n_group, -1)
        if sigmoid:
            gscore = np.sort(groups, axis=1)[:, -2:].sum(axis=1)
        else:
            gscore = groups.max(axis=1)
        keep = np.zeros(n_group, bool)
        keep[_topk(gscore, topk_group)] = True
        masked = np.where(np.repeat(keep, len(row) // n_group), choice, -np.inf if sigmoid else 0.0)
        sel = _topk(masked, k)
        w = score[sel] if sigmoid else masked[sel]
        if renorm:
            w = w / (w.sum() + 1e-20)
        sels.append(sel)
        weights.append(w * scale)
    return np.array(sels, np.int32), np.array(weights)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("sigmoid,renorm,n_group,topk_group,k", [
    (False, False, 1, 1, 6),     # V2's greedy (V2-Lite: top-6 of 64)
    (False, False, 8, 3, 6),     # V2's group_limited_greedy (V2: 8 groups, the best 3)
    (False, True, 4, 2, 4),
    (True, True, 8, 4, 8),       # V3: 8 groups, the best 4, top-8, renormalised
    (True, False, 4, 1, 2),      # a single group kept
])
def test_grouped_routing_matches_the_reference(variant, sigmoid, renorm, n_group, topk_group, k):
    mod = _kernels.load(variant)
    rng = np.random.default_rng(7)
    X, T = 64, 40
    logits = (rng.standard_normal((T, X)) * 2).astype(np.float32)
    bias = (rng.standard_normal(X) * 0.3).astype(np.float32) if sigmoid else None
    sel, w = mod.moe_route_grouped(logits, k, n_group, topk_group, renorm, sigmoid, 2.5, bias)
    want_sel, want_w = route_reference(logits, k, n_group, topk_group, renorm, sigmoid, 2.5, bias)
    np.testing.assert_array_equal(sel, want_sel)
    np.testing.assert_allclose(w, want_w, rtol=2e-6, atol=1e-7)
    if n_group > 1:   # every chosen expert lies in one of the topk_group groups kept
        assert all(len(set(s // (X // n_group))) <= topk_group for s in sel)


def test_the_correction_bias_changes_the_choice_not_the_weights():
    """V3: the bias picks the experts, the weights are the chosen experts' unbiased scores."""
    mod = _kernels.kernels
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((16, 32)).astype(np.float32)
    bias = np.zeros(32, np.float32)
    bias[5] = 10.0      # expert 5 is always chosen
    sel, w = mod.moe_route_grouped(logits, 4, 1, 1, False, True, 1.0, bias)
    assert (sel[:, 0] == 5).all()
    np.testing.assert_allclose(w[:, 0], 1 / (1 + np.exp(-logits[:, 5].astype(np.float64))), rtol=1e-6)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)     # nearest even


def _cache_of(rows: np.ndarray, block_size: int, bf16: bool) -> tuple[np.ndarray, np.ndarray]:
    """(cache [blocks, B, Dk] holding rows [n, Dk] in shuffled blocks, NaN everywhere else;
    block table [1, blocks])."""
    n, dk = rows.shape
    nb = -(-n // block_size)
    table = np.random.default_rng(1).permutation(nb + 2)[:nb].astype(np.int32)
    cache = np.full((nb + 2, block_size, dk), np.nan, np.float32)
    for j in range(n):
        cache[table[j // block_size], j % block_size] = rows[j]
    return (_bf16_bits(cache) if bf16 else cache), table[None, :]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bf16", [False, True])
# heads: whole groups of four and a rest; latent widths below, at and past four vectors and a tail
@pytest.mark.parametrize("H,r", [(4, 32), (5, 72), (3, 144)])
def test_absorbed_latent_attention_equals_the_naive_form(variant, bf16, H, r):
    """Keys k_h = [W_UK,h c, k_pe], values v_h = W_UV,h c expanded per head (what transformers
    computes) against the kernel's attention over the cached [c, k_pe] rows with the absorbed
    query [W_UK,h^T q_nope,h, q_pe,h], W_UV,h applied to its latent output afterwards."""
    mod = _kernels.load(variant)
    rng = np.random.default_rng(11)
    dr, dn, dv, n, B = 16, 24, 20, 70, 16
    scale = (dn + dr) ** -0.5
    c = rng.standard_normal((n, r)).astype(np.float32)
    k_pe = rng.standard_normal((n, dr)).astype(np.float32)
    w_uk = (rng.standard_normal((H, dn, r)) * 0.3).astype(np.float32)
    w_uv = (rng.standard_normal((H, dv, r)) * 0.3).astype(np.float32)
    q_nope = rng.standard_normal((n, H, dn)).astype(np.float32)
    q_pe = rng.standard_normal((n, H, dr)).astype(np.float32)
    rows = np.concatenate([c, k_pe], axis=1)
    cache, table = _cache_of(rows, B, bf16)
    if bf16:   # the naive form over the same rounded rows
        rows = (_bf16_bits(rows).astype(np.uint32) << 16).view(np.float32)
    c64, kpe64 = rows[:, :r].astype(np.float64), rows[:, r:].astype(np.float64)
    q_abs = np.concatenate([np.einsum("hnr,thn->thr", w_uk, q_nope), q_pe], axis=2).astype(np.float32)
    positions = np.array([0, 1, 15, 16, 40, 69], np.int32)     # each query sees keys 0..its position
    got = mod.mla_attention(np.ascontiguousarray(q_abs[positions]), cache, table,
                            np.zeros(len(positions), np.int32), positions, r, scale)
    for i, p in enumerate(positions):
        k = np.einsum("hnr,jr->hjn", w_uk, c64[:p + 1])                          # [H, j, dn]
        s = (np.einsum("hn,hjn->hj", q_nope[p], k) + q_pe[p] @ kpe64[:p + 1].T) * scale
        prob = np.exp(s - s.max(axis=1, keepdims=True))
        prob /= prob.sum(axis=1, keepdims=True)
        want = np.einsum("hj,hvr,jr->hv", prob, w_uv, c64[:p + 1])                # naive values
        out = np.einsum("hvr,hr->hv", w_uv, got[i])
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
