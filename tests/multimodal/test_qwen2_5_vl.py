"""Qwen2.5-VL against transformers on a tiny random checkpoint: the image processor's pixel
values, the vision tower, and the language model's logits with images in the prompt (one shot
and through chunked prefill), through the runner's own step path (VisionRunner.step_inputs)."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from lite_llm.multimodal import MediaConfig, Processor, qwen2_5_vl
from vl_checkpoint import IMAGE_PAD, VISION_END, VISION_START, Chunk, Req, image, qwen2_5_vl_checkpoint

pytest.importorskip("PIL")

BLOCK = 16
SIZES = [(56, 56), (100, 70), (28, 84), (300, 200)]


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
        import transformers
        return getattr(transformers, hf_class).from_pretrained(ckpt, dtype=torch.float32).eval()

    @pytest.fixture(scope="module", name="runner")
    def runner(ckpt):
        from lite_llm.model.loader import load_model
        return small_runner(load_model(str(ckpt), dtype="float32", progress=False))
    return ckpt, hf_model, runner


ckpt, hf_model, runner = checkpoint_fixtures(qwen2_5_vl_checkpoint, "Qwen2_5_VLForConditionalGeneration")


@pytest.mark.parametrize("size", SIZES)
def test_pixel_values_match_the_hf_slow_processor(ckpt, size):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    img = image(*size, seed=sum(size))
    ref = Qwen2VLImageProcessorPil()(images=[img], return_tensors="np")
    proc = Processor.for_model(str(ckpt))
    pixels, grid = qwen2_5_vl.preprocess(img, proc.vision)
    assert tuple(ref["image_grid_thw"][0]) == grid
    np.testing.assert_allclose(pixels, ref["pixel_values"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("size", [(56, 56), (100, 70), (28, 84)])
def test_vision_tower_matches_transformers(ckpt, hf_model, runner, size):
    proc = Processor.for_model(str(ckpt))
    pixels, grid = qwen2_5_vl.preprocess(image(*size, seed=1), proc.vision)
    with torch.no_grad():
        ref = hf_model.model.visual(torch.from_numpy(pixels), grid_thw=torch.tensor([grid])).pooler_output
    ours = runner.vision.encoder.encode(pixels, grid)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-4, atol=1e-5)


def _prompt(ckpt, images, text_ids=((40, 41, 42), (50, 51), (60, 61, 62, 63))):
    """[text, <vision_start><image_pad><vision_end>, text, ...] expanded by the processor."""
    ids = list(text_ids[0])
    for k, _ in enumerate(images):
        ids += [VISION_START, IMAGE_PAD, VISION_END] + list(text_ids[1 + k % 2])
    return Processor.for_model(str(ckpt)).process(ids, images, MediaConfig())


def _lite_logits(runner, ids, mm, chunk=None):
    """Every position's logits, one sequence prefilled `chunk` tokens a step (None: at once)."""
    table = np.arange(64, dtype=np.int32).reshape(1, 64)
    out = np.zeros((len(ids), runner.config.vocab_size), np.float32)
    done = 0
    while done < len(ids):
        n = len(ids) - done if chunk is None else min(chunk, len(ids) - done)
        pos = np.arange(done, done + n, dtype=np.int32)
        toks = np.asarray(ids[done:done + n], np.int32)
        seq = np.zeros(n, np.int32)
        slots = table[0, pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK
        mm_arrays = runner.vision.step_inputs([Chunk(Req(mm), done, n)], n, pos)
        out[done:done + n] = runner.forward(toks, pos, slots, seq, table, np.arange(n, dtype=np.int32), mm_arrays)
        done += n
    return out


def _hf_logits(hf_model, ckpt, ids, images):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    inputs = Qwen2VLImageProcessorPil()(images=images, return_tensors="pt")
    t = torch.tensor([ids])
    with torch.no_grad():
        return hf_model(input_ids=t, pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                        mm_token_type_ids=(t == IMAGE_PAD).int()).logits[0].numpy()


@pytest.mark.parametrize("sizes", [[(100, 70)], [(56, 112), (84, 56)]], ids=["one-image", "two-images"])
@pytest.mark.parametrize("chunk", [None, 7])
def test_fp32_logits_match_transformers(ckpt, hf_model, runner, sizes, chunk):
    images = [image(*s, seed=i + 3) for i, s in enumerate(sizes)]
    ids, mm = _prompt(ckpt, images)
    assert ids.count(IMAGE_PAD) == sum(it.length for it in mm.items) > len(images)
    ref = _hf_logits(hf_model, ckpt, ids, images)
    np.testing.assert_allclose(_lite_logits(runner, ids, mm, chunk), ref, rtol=1e-4, atol=2e-4)


def test_a_different_image_gives_different_logits(ckpt, runner):
    a, b = image(100, 70, seed=1), image(100, 70, seed=2)
    ids_a, mm_a = _prompt(ckpt, [a])
    ids_b, mm_b = _prompt(ckpt, [b])
    assert ids_a == ids_b and mm_a.items[0].hash != mm_b.items[0].hash
    la, lb = _lite_logits(runner, ids_a, mm_a)[-1], _lite_logits(runner, ids_b, mm_b)[-1]
    assert np.abs(la - lb).max() > 1e-3


def _variants():
    from lite_llm import _kernels
    return _kernels.available()


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("size", [(56, 56), (140, 84)])
@pytest.mark.parametrize("variant", _variants())
def test_compiled_tower_matches_the_numpy_reference(ckpt, runner, dtype, tol, size, variant):
    from lite_llm import _kernels
    from lite_llm.multimodal import VisionRunner
    vr = VisionRunner(str(ckpt), runner.config, kernels=_kernels.load(variant), dtype=dtype, num_threads=2)
    pixels, grid = qwen2_5_vl.preprocess(image(*size, seed=7), vr.vision)
    ref = vr.encoder.encode_reference(pixels, grid)
    ours = vr.encoder.encode(pixels, grid)
    assert np.abs(ours - ref).max() <= tol * np.abs(ref).max()
