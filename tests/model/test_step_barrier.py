"""The step barrier (src/omp_util.h): forward()'s phases separated by the spin-then-yield
barrier compute exactly what they compute with libgomp's barrier, at 2 threads and with more
threads than this machine has cores (waiters then yield their CPU to partners that are not
running), over many steps; a bad LITE_LLM_BARRIER_SPINS is refused by name."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import tiny_checkpoint_path
from lite_llm.engine.runner import ModelRunner
from lite_llm.model.loader import load_model
from test_parity import BLOCK, lite_logits, prompts_for


def _logits(path, threads: int, prompts, chunk) -> list[np.ndarray]:
    loaded = load_model(str(path), dtype="float32", progress=False)
    runner = ModelRunner(loaded, num_blocks=64, block_size=BLOCK, max_num_batched_tokens=256, max_num_seqs=256,
                         num_threads=threads)
    return lite_logits(runner, prompts, chunk)


@pytest.mark.parametrize("threads", [2, 5])
@pytest.mark.parametrize("spins", ["0", "2000"])
def test_the_step_barrier_computes_what_libgomps_does(monkeypatch, threads, spins):
    """spins 0: every wait yields at once (the path of an oversubscribed machine)."""
    path = tiny_checkpoint_path("qwen2")
    prompts = prompts_for(320, lens=[3, 9, 30])
    monkeypatch.setenv("LITE_LLM_BARRIER_SPINS", "-1")
    want = _logits(path, threads, prompts, chunk=4)
    monkeypatch.setenv("LITE_LLM_BARRIER_SPINS", spins)
    for _ in range(2):
        for a, b in zip(want, _logits(path, threads, prompts, chunk=4)):
            np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("raw", ["fast", "-5", "1.5"])
def test_a_bad_barrier_setting_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv("LITE_LLM_BARRIER_SPINS", raw)
    with pytest.raises(ValueError, match="LITE_LLM_BARRIER_SPINS"):
        _logits(tiny_checkpoint_path("qwen2"), 2, prompts_for(320, lens=[3]), chunk=None)
