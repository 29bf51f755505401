"""Qwen2.5-VL against transformers on a tiny random checkpoint: the image processor's pixel
values, the vision tower, and the language model's logits with images in the prompt (one shot
and through chunked prefill), through the runner's own step path (VisionRunner.step_inputs)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lite_llm.multimodal import Processor, qwen2_5_vl
from vl_checkpoint import IMAGE_PAD, VISION_END, VISION_START, image, qwen2_5_vl_checkpoint
from vl_common import (TEXT_IDS, VARIANTS, check_another_image_moves_the_logits, checkpoint_fixtures, image_prompt,
                       prefill_logits)

pytest.importorskip("PIL")

SIZES = [(56, 56), (100, 70), (28, 84), (300, 200)]


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


def _prompt(ckpt, images, text_ids=TEXT_IDS):
    """[text, <vision_start><image_pad><vision_end>, text, ...] expanded by the processor."""
    return image_prompt(Processor.for_model(str(ckpt)), [VISION_START, IMAGE_PAD, VISION_END], images, text_ids)


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
    np.testing.assert_allclose(prefill_logits(runner, ids, mm, chunk), ref, rtol=1e-4, atol=2e-4)


def test_a_different_image_gives_different_logits(ckpt, runner):
    check_another_image_moves_the_logits(lambda images: _prompt(ckpt, images), runner)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("size", [(56, 56), (140, 84)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_tower_matches_the_numpy_reference(ckpt, runner, dtype, tol, size, variant):
    from lite_llm import _kernels
    from lite_llm.multimodal import VisionRunner
    vr = VisionRunner(str(ckpt), runner.config, kernels=_kernels.load(variant), dtype=dtype, num_threads=2)
    pixels, grid = qwen2_5_vl.preprocess(image(*size, seed=7), vr.vision)
    ref = vr.encoder.encode_reference(pixels, grid)
    ours = vr.encoder.encode(pixels, grid)
    assert np.abs(ours - ref).max() <= tol * np.abs(ref).max()
