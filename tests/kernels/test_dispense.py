"""The work dispenser (src/work.h): every parallel phase of forward() and every kernel wrapper
hands out its units through it. Checked on its own (ops.pxi `dispense`): in every phase each
unit is taken exactly once, over many phases on one counter that is never reset (the
generations), static runs are the even contiguous split the o projection's prefetch relies on,
dynamic takes are whole chunks; and through the wrappers: a GEMM / gated MLP gives the same
bits whichever threads took its panels, statically (prefill) or dynamically (decode)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ref_ops  # noqa: E402
from lite_llm import _kernels  # noqa: E402
from lite_llm._kernels import layout  # noqa: E402

VARIANTS = _kernels.available()
# consecutive phases on one counter: empty ones, one unit, fewer units than threads, many
PHASES = [7, 0, 33, 1, 100, 16, 0, 0, 5, 257, 3, 64]


def _static_run(units: int, chunk: int, tid: int, nth: int) -> range:
    """The plain spec of a static run: whole chunks split as evenly as integers allow."""
    num_chunks = -(-units // chunk)
    return range(min(num_chunks * tid // nth * chunk, units), min(num_chunks * (tid + 1) // nth * chunk, units))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("num_threads", [1, 2, 3, 5])
@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_every_unit_is_taken_once_in_every_phase(variant, mode, num_threads, chunk):
    mod = _kernels.load(variant)
    for _ in range(5):   # dynamic hand-outs vary from run to run: several runs
        taken = mod.dispense(PHASES, chunk, mode, num_threads)
        total = taken.sum(axis=0)   # [phases, max units]
        for ph, units in enumerate(PHASES):
            assert (total[ph, :units] == 1).all(), f"phase {ph}: units taken {total[ph, :units].tolist()}"
            assert (total[ph, units:] == 0).all(), f"phase {ph}: units past {units} taken"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_threads", [2, 3, 5])
@pytest.mark.parametrize("chunk", [1, 16])
def test_static_runs_are_the_even_split(variant, num_threads, chunk):
    """A thread's static run depends only on (units, chunk, team size): forward() prefetches the
    o projection's run during attention and takes the same run afterwards."""
    taken = _kernels.load(variant).dispense(PHASES, chunk, "static", num_threads)
    for ph, units in enumerate(PHASES):
        for tid in range(num_threads):
            got = np.flatnonzero(taken[tid, ph])
            want = list(_static_run(units, chunk, tid, num_threads))
            assert got.tolist() == want, f"phase {ph} thread {tid}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk", [3, 8])
def test_dynamic_takes_are_whole_chunks(variant, chunk):
    """A dynamic take is one chunk (the last one cut at the end): a gated phase's chunk of
    feature panel pairs keeps every int8 block of its output within one thread."""
    taken = _kernels.load(variant).dispense(PHASES, chunk, "dynamic", 3)
    for ph, units in enumerate(PHASES):
        for c0 in range(0, units, chunk):
            owners = {tid for tid in range(3) if taken[tid, ph, c0:c0 + chunk].any()}
            assert len(owners) == 1, f"phase {ph}: chunk at {c0} split between threads {owners}"


def test_a_bad_mode_or_count_is_refused():
    mod = _kernels.kernels
    with pytest.raises(ValueError, match="mode"):
        mod.dispense([4], 1, "guided", 2)
    with pytest.raises(ValueError, match="units"):
        mod.dispense([4, -1], 1, "static", 2)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_tokens", [1, 4, 5, 17])   # decode hands panels out dynamically, prefill statically
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemm_bits_do_not_depend_on_the_hand_out(variant, num_tokens, dtype, rng):
    """forward()'s logits are the same bits at any thread count because a panel's result does
    not depend on which thread took it: the wrappers take panels as forward() does."""
    mod = _kernels.load(variant)
    k, n = 200, 16 * 37 + 5
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    if dtype == "bfloat16":
        w = ref_ops.f32_to_bf16_bits(w)
    packed = layout.pack(w, dtype)
    outs = []
    for num_threads in (1, 2, 3, 5):
        out = np.zeros((num_tokens, n), np.float32)
        mod.gemm(x, packed, dtype, n, out, num_threads=num_threads)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_tokens", [1, 3, 9])
def test_gated_mlp_bits_do_not_depend_on_the_hand_out(variant, num_tokens, rng):
    mod = _kernels.load(variant)
    k, f = 96, 16 * 21 + 3
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    w = rng.standard_normal((2 * f, k), dtype=np.float32)
    packed = layout.pack_gated(w, f, "float32")
    outs = []
    for num_threads in (1, 2, 3, 5):
        out = np.zeros((num_tokens, f), np.float32)
        mod.gated_mlp(x, packed, "float32", f, out, "silu", num_threads=num_threads)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
