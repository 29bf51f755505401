"""What the vision-language model tests share: a small runner, a tiny checkpoint's module
fixtures, a prompt with images, every position's logits through the runner's own step path
(VisionRunner.step_inputs), and the check that another image moves them. The checkpoints
themselves are built in vl_checkpoint.py, llava_checkpoint.py and gemma3_checkpoint.py."""
from __future__ import annotations

import numpy as np
import pytest

from lite_llm import _kernels
from lite_llm.multimodal import MediaConfig, whole_images as cut_at_images
from vl_checkpoint import Chunk, Req, image

BLOCK = 16
VARIANTS = _kernels.available()
TEXT_IDS = ((40, 41, 42), (50, 51), (60, 61, 62, 63))   # before the first image, then after each in turn


def small_runner(loaded):
    """A ModelRunner of the tiny vision checkpoints' tests: 64 blocks of BLOCK, 256-token steps, 2 threads."""
    from lite_llm.engine.runner import ModelRunner
    return ModelRunner(loaded, num_blocks=64, block_size=BLOCK, max_num_batched_tokens=256, max_num_seqs=8,
                       num_threads=2)


def checkpoint_fixtures(make_checkpoint, hf_class: str):
    """A tiny vision checkpoint's module-scoped fixtures: ckpt (the directory make_checkpoint()
    writes), hf_model (transformers' hf_class on it, fp32) and runner (small_runner on it, fp32).
    A test module binds them by name: `ckpt, hf_model, runner = checkpoint_fixtures(...)`."""
    @pytest.fixture(scope="module", name="ckpt")
    def ckpt():
        return make_checkpoint()

    @pytest.fixture(scope="module", name="hf_model")
    def hf_model(ckpt):
        import torch
        import transformers
        return getattr(transformers, hf_class).from_pretrained(ckpt, dtype=torch.float32).eval()

    @pytest.fixture(scope="module", name="runner")
    def runner(ckpt):
        from lite_llm.model.loader import load_model
        return small_runner(load_model(str(ckpt), dtype="float32", progress=False))
    return ckpt, hf_model, runner


def image_prompt(processor, placeholder: list[int], images, text_ids=TEXT_IDS):
    """[text, placeholder, text, ...]: text_ids[0], then placeholder and text_ids[1] or [2] in
    turn for each image, expanded by processor (a multimodal.Processor): (ids, mm)."""
    ids = list(text_ids[0])
    for k, _ in enumerate(images):
        ids += list(placeholder) + list(text_ids[1 + k % 2])
    return processor.process(ids, images, MediaConfig())


def prefill_logits(runner, ids, mm, chunk=None, whole_images: bool = False, perturb=None):
    """Every position's logits [len(ids), V], one sequence prefilled `chunk` tokens a step (None:
    at once). whole_images: a step never ends inside an image, as the scheduler cuts them (a
    chunk that would start inside one takes the whole image); else steps end anywhere.
    perturb(mm_arrays): changes a step's arrays in place before its forward."""
    table = np.arange(64, dtype=np.int32).reshape(1, 64)
    out = np.zeros((len(ids), runner.config.vocab_size), np.float32)
    done = 0
    while done < len(ids):
        n = len(ids) - done if chunk is None else min(chunk, len(ids) - done)
        if whole_images:
            n = cut_at_images(Req(mm), done, n) or next(it.offset + it.length - done for it in mm.items
                                                        if it.offset <= done < it.offset + it.length)
        pos = np.arange(done, done + n, dtype=np.int32)
        toks = np.asarray(ids[done:done + n], np.int32)
        seq = np.zeros(n, np.int32)
        slots = table[0, pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK
        mm_arrays = runner.vision.step_inputs([Chunk(Req(mm), done, n)], n, pos)
        if perturb is not None:
            perturb(mm_arrays)
        out[done:done + n] = runner.forward(toks, pos, slots, seq, table, np.arange(n, dtype=np.int32), mm_arrays)
        done += n
    return out


def check_another_image_moves_the_logits(prompt, runner) -> None:
    """Two images of one size: the same prompt ids (prompt(images) -> (ids, mm)), different
    image hashes, and last-position logits (prefill_logits) at least 1e-3 apart."""
    ids_a, mm_a = prompt([image(100, 70, seed=1)])
    ids_b, mm_b = prompt([image(100, 70, seed=2)])
    assert ids_a == ids_b and mm_a.items[0].hash != mm_b.items[0].hash
    la, lb = prefill_logits(runner, ids_a, mm_a)[-1], prefill_logits(runner, ids_b, mm_b)[-1]
    assert np.abs(la - lb).max() > 1e-3
