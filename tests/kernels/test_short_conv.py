"""LFM2's gated short convolution and Mamba2's convolution with SiLU (src/kernels/conv.h) vs
tests/ref_ops.py on every variant:
a chunk of tokens from an incoming state, the state it leaves, a sequence fed in chunks or a
token at a time (decode as a state update) equal to one pass, and a reset that ignores the
stored state. Channel counts are not multiples of 16 so the vector blocks and the scalar tail
both run, over thread counts that split them unevenly."""
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


def _inputs(rng, n, E, L, bias):
    bcx = rng.standard_normal((n, 3 * E)).astype(np.float32)
    w = rng.standard_normal((L, E)).astype(np.float32)
    b = rng.standard_normal(E).astype(np.float32) if bias else None
    state = rng.standard_normal((L - 1, E)).astype(np.float32)
    return bcx, w, b, state


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n,E,L", [(1, 64, 3), (7, 37, 3), (13, 40, 4), (5, 16, 2), (3, 21, 1)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("num_threads", [1, 3])
def test_chunk_from_a_state(variant, n, E, L, bias, num_threads, rng):
    mod = _kernels.load(variant)
    bcx, w, b, state = _inputs(rng, n, E, L, bias)
    want, want_state = ref_ops.short_conv(bcx, state, w, b)
    out = np.full((n, E), np.nan, np.float32)
    got_state = state.copy()
    mod.short_conv(bcx, got_state, w, b, out, False, num_threads=num_threads)
    # L products and a sum per value: fp32 rounding only
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got_state, want_state)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("E,L", [(37, 3), (48, 4)])
def test_reset_ignores_the_stored_state(variant, E, L, rng):
    mod = _kernels.load(variant)
    bcx, w, b, state = _inputs(rng, 6, E, L, True)
    want, want_state = ref_ops.short_conv(bcx, state, w, b, reset=True)
    out = np.empty((6, E), np.float32)
    mod.short_conv(bcx, state, w, b, out, True, num_threads=2)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(state, want_state)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk", [1, 2, 7])
def test_chunks_and_decode_equal_one_pass(variant, chunk, rng):
    """A sequence of 19 tokens in chunks (1: decode, a token per call) carries the state from
    call to call and gives what one pass from an empty state gives."""
    mod = _kernels.load(variant)
    E, L, n = 35, 3, 19
    bcx, w, b, _ = _inputs(rng, n, E, L, True)
    whole = np.empty((n, E), np.float32)
    whole_state = np.full((L - 1, E), np.nan, np.float32)
    mod.short_conv(bcx, whole_state, w, b, whole, True, num_threads=2)
    want, want_state = ref_ops.short_conv(bcx, np.zeros((L - 1, E), np.float32), w, b)
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-5)
    state = np.full((L - 1, E), np.nan, np.float32)
    parts = []
    for start in range(0, n, chunk):
        piece = np.ascontiguousarray(bcx[start:start + chunk])
        out = np.empty((len(piece), E), np.float32)
        mod.short_conv(piece, state, w, b, out, start == 0, num_threads=2)
        parts.append(out)
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    np.testing.assert_array_equal(state, whole_state)
    np.testing.assert_array_equal(state, want_state)


@pytest.mark.parametrize("variant", VARIANTS[:1])
def test_shapes_are_checked(variant, rng):
    mod = _kernels.load(variant)
    bcx, w, b, state = _inputs(rng, 4, 16, 3, False)
    with pytest.raises(ValueError, match="short_conv"):
        mod.short_conv(bcx, state[:1].copy(), w, b, np.empty((4, 16), np.float32), False)
    with pytest.raises(ValueError, match="short_conv"):
        mod.short_conv(bcx, state, np.zeros((9, 16), np.float32), b, np.empty((4, 16), np.float32), False)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n,E,L", [(1, 64, 4), (7, 37, 4), (13, 40, 3), (5, 16, 2)])
@pytest.mark.parametrize("bias", [False, True])
def test_mamba_conv_with_silu_from_a_state(variant, n, E, L, bias, rng):
    """Mamba2's convolution of its x | B | C channels with SiLU: a chunk from a state, the state
    it leaves, and the same tokens fed one at a time (decode) giving the same outputs."""
    mod = _kernels.load(variant)
    x = rng.standard_normal((n, E)).astype(np.float32)
    w = rng.standard_normal((L, E)).astype(np.float32)
    b = rng.standard_normal(E).astype(np.float32) if bias else None
    state = rng.standard_normal((L - 1, E)).astype(np.float32)
    want, want_state = ref_ops.causal_conv_silu(x, state, w, b)
    out, got_state = np.full((n, E), np.nan, np.float32), state.copy()
    mod.causal_conv_silu(x, got_state, w, b, out, False, num_threads=3)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got_state, want_state)
    one, steps = state.copy(), []
    for t in range(n):
        o = np.empty((1, E), np.float32)
        mod.causal_conv_silu(np.ascontiguousarray(x[t:t + 1]), one, w, b, o, False, num_threads=2)
        steps.append(o)
    np.testing.assert_array_equal(np.concatenate(steps), out)
    np.testing.assert_array_equal(one, got_state)
    reset_out = np.empty((n, E), np.float32)
    mod.causal_conv_silu(x, state.copy(), w, b, reset_out, True)
    np.testing.assert_allclose(reset_out, ref_ops.causal_conv_silu(x, state, w, b, reset=True)[0], rtol=1e-5, atol=1e-5)
