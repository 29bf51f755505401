"""Gated DeltaNet's chunked delta rule (src/kernels/delta.h) vs the token-by-token recurrence of
tests/ref_ops.py on every variant: runs shorter than, equal to and across chunks (64 tokens)
from an incoming state, the state they leave, runs fed in pieces (1: decode as a state update)
equal to one pass, query / key heads shared by several value heads, and a reset."""
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


def _inputs(rng, n, Hk, Hv, Dk, Dv):
    """Inputs as a Gated DeltaNet layer hands them over: q and k L2-normalised per head (q
    scaled by Dk^-1/2), beta in (0, 1), g = -exp(A_log) softplus(a + dt_bias) <= 0."""
    q = ref_ops.l2norm(rng.standard_normal((n, Hk, Dk))).reshape(n, Hk * Dk) * np.float32(Dk ** -0.5)
    k = ref_ops.l2norm(rng.standard_normal((n, Hk, Dk))).reshape(n, Hk * Dk)
    v = rng.standard_normal((n, Hv * Dv)).astype(np.float32)
    beta = (1.0 / (1.0 + np.exp(-rng.standard_normal((n, Hv))))).astype(np.float32)
    g = (-np.exp(rng.uniform(-3.0, 0.5, Hv)) * np.log1p(np.exp(rng.standard_normal((n, Hv))))).astype(np.float32)
    state = rng.standard_normal((Hv, Dk, Dv)).astype(np.float32)
    return np.ascontiguousarray(q, np.float32), k, v, g, beta, state


def _close(got, want):
    # fp32 sums of up to 64 decayed products per chunk and a triangular solve, vs a float64 recurrence
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [1, 5, 64, 130])
@pytest.mark.parametrize("Hk,Hv,Dk,Dv", [(2, 4, 16, 8), (1, 3, 7, 21), (2, 2, 32, 16)])
@pytest.mark.parametrize("num_threads", [1, 3])
def test_delta_rule_from_a_state(variant, n, Hk, Hv, Dk, Dv, num_threads, rng):
    mod = _kernels.load(variant)
    q, k, v, g, beta, state = _inputs(rng, n, Hk, Hv, Dk, Dv)
    want, want_state = ref_ops.gated_delta(q, k, v, g, beta, state)
    o = np.full((n, Hv * Dv), np.nan, np.float32)
    got_state = state.copy()
    mod.gated_delta(q, k, v, g, beta, o, got_state, False, num_threads=num_threads)
    _close(o, want)
    _close(got_state, want_state)


@pytest.mark.parametrize("variant", VARIANTS)
def test_reset_ignores_the_stored_state(variant, rng):
    mod = _kernels.load(variant)
    q, k, v, g, beta, state = _inputs(rng, 9, 2, 4, 16, 8)
    want, want_state = ref_ops.gated_delta(q, k, v, g, beta, state, reset=True)
    o = np.empty_like(v)
    mod.gated_delta(q, k, v, g, beta, o, state, True, num_threads=2)
    _close(o, want)
    _close(state, want_state)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("piece", [1, 7, 64])
def test_pieces_and_decode_equal_one_pass(variant, piece, rng):
    """150 tokens fed `piece` at a time (1: decode), the state carried from call to call, give
    the one-pass outputs and state (fp32 rounding apart: the chunks fall differently)."""
    mod = _kernels.load(variant)
    n, Hk, Hv, Dk, Dv = 150, 2, 4, 16, 8
    q, k, v, g, beta, _ = _inputs(rng, n, Hk, Hv, Dk, Dv)
    whole = np.empty_like(v)
    whole_state = np.full((Hv, Dk, Dv), np.nan, np.float32)
    mod.gated_delta(q, k, v, g, beta, whole, whole_state, True, num_threads=2)
    want, want_state = ref_ops.gated_delta(q, k, v, g, beta, whole_state, reset=True)
    _close(whole, want)
    state = np.full((Hv, Dk, Dv), np.nan, np.float32)
    parts = []
    for s in range(0, n, piece):
        sl = slice(s, s + piece)
        out = np.empty((len(q[sl]), Hv * Dv), np.float32)
        mod.gated_delta(*(np.ascontiguousarray(a[sl]) for a in (q, k, v, g, beta)), out, state, s == 0, num_threads=2)
        parts.append(out)
    _close(np.concatenate(parts), whole)
    _close(state, whole_state)


@pytest.mark.parametrize("variant", VARIANTS[:1])
def test_shapes_are_checked(variant, rng):
    mod = _kernels.load(variant)
    q, k, v, g, beta, state = _inputs(rng, 4, 2, 4, 16, 8)
    with pytest.raises(ValueError, match="gated_delta"):
        mod.gated_delta(q, k[:, :20].copy(), v, g, beta, np.empty_like(v), state, False)
    with pytest.raises(ValueError, match="gated_delta"):
        mod.gated_delta(q, k, v, g[:, :3].copy(), beta, np.empty_like(v), state, False)
