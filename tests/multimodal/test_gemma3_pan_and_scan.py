"""Gemma 3's pan-and-scan (Gemma3ImageProcessor do_pan_and_scan): a long image is seen whole and
as 2..max crops along its long edge, each crop an image of its own, the prompt written as
Gemma3Processor writes it ("Here is the original image ... and here are some crops to help you
see better ..."): crops, pixel values, prompt ids and fp32 logits against transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gemma3_checkpoint import BOI, IMAGE, TOKENS_PER_IMAGE, gemma3_pan_and_scan_checkpoint
from lite_llm.multimodal import MediaConfig, Processor, gemma3
from test_gemma3 import _lite_logits
from vl_checkpoint import image
from vl_common import small_runner

pytest.importorskip("PIL")

# (width, height) -> crops transformers cuts: 3.3 : 1 -> 3; 1 : 2.6 -> 3 capped at max 3 (not 3 by
# rounding alone); 2.2 : 1 -> 2; under the 1.2 ratio -> none; 2 crops of 15 px < 20 -> none
SIZES = {(200, 60): 3, (50, 130): 3, (150, 68): 2, (84, 80): 0, (30, 12): 0, (100, 30): 3}


@pytest.fixture(scope="module")
def ckpt():
    return gemma3_pan_and_scan_checkpoint()


@pytest.fixture(scope="module")
def hf_processor(ckpt):
    from transformers import AutoTokenizer, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    return Gemma3Processor(Gemma3ImageProcessorPil.from_pretrained(ckpt), AutoTokenizer.from_pretrained(ckpt),
                           image_seq_length=TOKENS_PER_IMAGE)


def _hf(hf_processor, text, images):
    return hf_processor(text=[text], images=[images], return_tensors="np", do_pan_and_scan=True,
                        pan_and_scan_min_crop_size=20, pan_and_scan_max_num_crops=3,
                        pan_and_scan_min_ratio_to_activate=1.2)


def test_the_config_turns_pan_and_scan_on(ckpt):
    pas = Processor.for_model(str(ckpt)).vision.pan_and_scan
    assert (pas.min_crop_size, pas.max_num_crops, pas.min_ratio_to_activate) == (20, 3, 1.2)
    assert pas.intro_ids and pas.crops_ids and pas.space_ids


@pytest.mark.parametrize("size", list(SIZES))
def test_crops_pixels_and_prompt_match_gemma3_processor(ckpt, hf_processor, size):
    from transformers import AutoTokenizer
    img = image(*size, seed=sum(size))
    text = "look\n<start_of_image>what is it?"
    ref = _hf(hf_processor, text, [img])
    assert ref["pixel_values"].shape[0] == 1 + SIZES[size]      # the image, then its crops
    proc = Processor.for_model(str(ckpt))
    crops = gemma3.pan_and_scan(img, proc.vision)
    assert len(crops) == SIZES[size]
    ids, mm = proc.process(AutoTokenizer.from_pretrained(ckpt)(text)["input_ids"], [img], MediaConfig())
    assert ids == ref["input_ids"][0].tolist()
    assert len(mm.items) == 1 + SIZES[size] and ids.count(BOI) == 1 + SIZES[size]
    ours = np.stack([gemma3.pixel_values_of(it.pixel_values, proc.vision) for it in mm.items])
    np.testing.assert_allclose(ours, ref["pixel_values"], rtol=0, atol=1e-5)


def test_an_image_without_crops_keeps_the_plain_expansion(ckpt):
    """A square image beside a long one: only the long one gets the crop text."""
    proc = Processor.for_model(str(ckpt))
    ids, mm = proc.process([40, BOI, 41, BOI], [image(84, 80, seed=1), image(200, 60, seed=2)], MediaConfig())
    assert len(mm.items) == 1 + 1 + 3
    assert ids[:3] == [40, ids[1], BOI] and list(proc.vision.pan_and_scan.intro_ids) == \
        ids[ids.index(41) + 1:ids.index(41) + 1 + len(proc.vision.pan_and_scan.intro_ids)]


@pytest.mark.parametrize("chunk", [None, 7])
def test_fp32_logits_with_crops_match_transformers(ckpt, hf_processor, chunk):
    from transformers import AutoTokenizer, Gemma3ForConditionalGeneration
    from lite_llm.model.loader import load_model
    images = [image(150, 68, seed=4), image(84, 80, seed=5)]
    text = "look\n<start_of_image>and\n<start_of_image>what is it?"
    ref_inputs = _hf(hf_processor, text, images)
    proc = Processor.for_model(str(ckpt))
    ids, mm = proc.process(AutoTokenizer.from_pretrained(ckpt)(text)["input_ids"], images, MediaConfig())
    assert ids == ref_inputs["input_ids"][0].tolist() and ids.count(IMAGE) == 4 * TOKENS_PER_IMAGE
    model = Gemma3ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    t = torch.tensor([ids])
    with torch.no_grad():
        ref = model(input_ids=t, pixel_values=torch.from_numpy(ref_inputs["pixel_values"]),
                    token_type_ids=(t == IMAGE).long()).logits[0].numpy()
    runner = small_runner(load_model(str(ckpt), dtype="float32", progress=False))
    np.testing.assert_allclose(_lite_logits(runner, ids, mm, chunk), ref, rtol=1e-4, atol=2e-4)
