"""Mamba2's chunked state-space scan (src/kernels/ssm.h) vs the token-by-token recurrence of
tests/ref_ops.py on every variant: runs shorter than, equal to and across chunks (64 tokens)
from an incoming state, the state they leave, runs fed in pieces (1: decode as a state update)
equal to one pass, grouped B and C shared by several heads, and a reset."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ref_ops  # noqa: E402
from lite_llm import _kernels  # noqa: E402

VARIANTS = _kernels.available()


def _inputs(rng, n, H, P, N, G):
    x = rng.standard_normal((n, H * P)).astype(np.float32)
    dt = np.log1p(np.exp(rng.standard_normal((n, H)) - 1.0)).astype(np.float32)    # softplus: > 0
    A = -np.exp(rng.uniform(-1.0, 1.5, H)).astype(np.float32)
    D = rng.standard_normal(H).astype(np.float32)
    B = (rng.standard_normal((n, G * N)) * 0.5).astype(np.float32)
    C = (rng.standard_normal((n, G * N)) * 0.5).astype(np.float32)
    state = rng.standard_normal((H, P, N)).astype(np.float32)
    return x, dt, A, D, B, C, state


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [1, 5, 64, 130])
@pytest.mark.parametrize("H,P,N,G", [(4, 8, 16, 1), (6, 5, 7, 2), (2, 16, 4, 2)])
@pytest.mark.parametrize("num_threads", [1, 3])
def test_scan_from_a_state(variant, n, H, P, N, G, num_threads, rng):
    mod = _kernels.load(variant)
    x, dt, A, D, B, C, state = _inputs(rng, n, H, P, N, G)
    want, want_state = ref_ops.ssd_scan(x, dt, A, D, B, C, state)
    y = np.full((n, H * P), np.nan, np.float32)
    got_state = state.copy()
    mod.ssd_scan(x, dt, A, D, B, C, y, got_state, False, num_threads=num_threads)
    # fp32 sums of up to 64 decayed products per chunk against a float64 recurrence
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(got_state, want_state, rtol=1e-4, atol=1e-4 * np.abs(want_state).max())


@pytest.mark.parametrize("variant", VARIANTS)
def test_reset_ignores_the_stored_state(variant, rng):
    mod = _kernels.load(variant)
    x, dt, A, D, B, C, state = _inputs(rng, 9, 4, 8, 16, 2)
    want, want_state = ref_ops.ssd_scan(x, dt, A, D, B, C, state, reset=True)
    y = np.empty_like(x)
    mod.ssd_scan(x, dt, A, D, B, C, y, state, True, num_threads=2)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-4 * np.abs(want_state).max())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("piece", [1, 7, 64])
def test_pieces_and_decode_equal_one_pass(variant, piece, rng):
    """150 tokens fed `piece` at a time (1: decode), the state carried from call to call, give
    the one-pass outputs and state (fp32 rounding apart: the chunks fall differently)."""
    mod = _kernels.load(variant)
    n, H, P, N, G = 150, 4, 8, 16, 2
    x, dt, A, D, B, C, _ = _inputs(rng, n, H, P, N, G)
    whole = np.empty_like(x)
    whole_state = np.full((H, P, N), np.nan, np.float32)
    mod.ssd_scan(x, dt, A, D, B, C, whole, whole_state, True, num_threads=2)
    state = np.full((H, P, N), np.nan, np.float32)
    parts = []
    for s in range(0, n, piece):
        sl = slice(s, s + piece)
        out = np.empty((len(x[sl]), H * P), np.float32)
        mod.ssd_scan(*(np.ascontiguousarray(a[sl]) for a in (x, dt)), A, D,
                     *(np.ascontiguousarray(a[sl]) for a in (B, C)), out, state, s == 0, num_threads=2)
        parts.append(out)
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-4, atol=1e-4 * np.abs(whole).max())
    np.testing.assert_allclose(state, whole_state, rtol=1e-4, atol=1e-4 * np.abs(whole_state).max())


@pytest.mark.parametrize("variant", VARIANTS[:1])
def test_shapes_are_checked(variant, rng):
    mod = _kernels.load(variant)
    x, dt, A, D, B, C, state = _inputs(rng, 4, 4, 8, 16, 2)
    with pytest.raises(ValueError, match="ssd_scan"):
        mod.ssd_scan(x, dt, A, D, B[:, :20].copy(), C, np.empty_like(x), state, False)
    with pytest.raises(ValueError, match="ssd_scan"):
        mod.ssd_scan(x, dt[:, :3].copy(), A, D, B, C, np.empty_like(x), state, False)
