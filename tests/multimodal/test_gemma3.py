"""Gemma 3 (vision) against transformers on a tiny random Gemma3ForConditionalGeneration: the
prompt expansion of Gemma3Processor, the slow image processor's pixel values, the SigLIP tower +
projector, and the language model's logits with one and two images (one shot and through
chunked prefill), where an image's tokens attend to each other in both directions inside the
causal, partly sliding-window text model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gemma3_checkpoint import BOI, EOI, IMAGE, NL2, NL3, NL4, TOKENS_PER_IMAGE, gemma3_checkpoint
from lite_llm.multimodal import MediaConfig, MediaError, Processor, gemma3
from vl_checkpoint import image
from vl_common import (TEXT_IDS, VARIANTS, check_another_image_moves_the_logits, checkpoint_fixtures, image_prompt,
                       prefill_logits)

pytest.importorskip("PIL")

SIZES = [(84, 84), (100, 70), (30, 80), (300, 200)]


ckpt, hf_model, runner = checkpoint_fixtures(gemma3_checkpoint, "Gemma3ForConditionalGeneration")


def _hf_pixels(ckpt, images):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    return Gemma3ImageProcessorPil.from_pretrained(ckpt)(images=images, return_tensors="np")["pixel_values"]


@pytest.mark.parametrize("text", ["hi\n<start_of_image>\n\nthere <start_of_image><start_of_image>x",
                                  "<start_of_image>", "a\n\n<start_of_image>\nb", "no image at all"])
def test_prompt_expansion_matches_gemma3_processor(ckpt, text):
    """Each <start_of_image> -> "\\n\\n" <boi> 9 x <image> <eoi> "\\n\\n", the newlines merged
    with their neighbours into one token as the text tokenizer gives them (NL3, NL4)."""
    from transformers import AutoTokenizer, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    tok = AutoTokenizer.from_pretrained(ckpt)
    n = text.count("<start_of_image>")
    images = [image(60 + 10 * i, 50, seed=i) for i in range(n)]
    hf = Gemma3Processor(Gemma3ImageProcessorPil.from_pretrained(ckpt), tok, image_seq_length=TOKENS_PER_IMAGE)
    ref = hf(text=[text], images=[images] if images else None, return_tensors="np")
    proc = Processor.for_model(str(ckpt))
    ids, offsets = gemma3.expand(tok(text)["input_ids"], proc.vision)
    assert ids == ref["input_ids"][0].tolist()
    assert [i for i, t in enumerate(ref["token_type_ids"][0]) if t and not ref["token_type_ids"][0][i - 1]] == offsets
    if n == 3:
        assert NL3 in ids and ids.count(NL4) == 2 and ids.count(NL2) == 2


def test_processor_builds_one_item_per_image(ckpt):
    proc = Processor.for_model(str(ckpt))
    assert proc.placeholder == "<start_of_image>"
    ids, mm = proc.process([40, BOI, 41, BOI], [image(100, 70, seed=1), image(30, 80, seed=2)], MediaConfig())
    assert [(it.offset, it.length) for it in mm.items] == [(3, 9), (17, 9)] and mm.rope_pos is None
    assert ids[2] == BOI and ids[12] == EOI and set(ids[3:12]) == {IMAGE}
    with pytest.raises(MediaError, match="2 image placeholders .* for 1 images"):
        proc.process([40, BOI, 41, BOI], [image(100, 70, seed=1)], MediaConfig())


@pytest.mark.parametrize("size", SIZES)
def test_pixel_values_match_the_hf_slow_processor(ckpt, size):
    img = image(*size, seed=sum(size))
    ref = _hf_pixels(ckpt, [img])[0]
    cfg = Processor.for_model(str(ckpt)).vision
    np.testing.assert_allclose(gemma3.pixel_values_of(gemma3.preprocess(img, cfg), cfg), ref, rtol=0, atol=1e-5)


def test_vision_tower_and_projector_match_transformers(ckpt, hf_model, runner):
    img = image(100, 70, seed=1)
    with torch.no_grad():
        ref = hf_model.model.get_image_features(pixel_values=torch.from_numpy(_hf_pixels(ckpt, [img]))
                                                ).pooler_output[0].numpy()
    ours = runner.vision.encoder.encode(gemma3.preprocess(img, runner.vision.vision))
    assert ours.shape == ref.shape == (TOKENS_PER_IMAGE, 64)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)


def _prompt(ckpt, images, text_ids=TEXT_IDS):
    """[text, <start_of_image>, text, ...] expanded by the processor."""
    return image_prompt(Processor.for_model(str(ckpt)), [BOI], images, text_ids)


def _lite_logits(runner, ids, mm, chunk=None, perturb=None):
    """prefill_logits with steps never ending inside an image: an image's tokens see each other."""
    return prefill_logits(runner, ids, mm, chunk, whole_images=True, perturb=perturb)


def _hf_logits(hf_model, ckpt, ids, images, bidirectional=True):
    t = torch.tensor([ids])
    kw = {"token_type_ids": (t == IMAGE).long()} if bidirectional else {}
    with torch.no_grad():
        return hf_model(input_ids=t, pixel_values=torch.from_numpy(_hf_pixels(ckpt, images)), **kw).logits[0].numpy()


@pytest.mark.parametrize("sizes", [[(100, 70)], [(56, 112), (84, 56)]], ids=["one-image", "two-images"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_fp32_logits_match_transformers(ckpt, hf_model, runner, sizes, chunk):
    images = [image(*s, seed=i + 3) for i, s in enumerate(sizes)]
    ids, mm = _prompt(ckpt, images)
    assert ids.count(IMAGE) == TOKENS_PER_IMAGE * len(images) and len(ids) > 6 + TOKENS_PER_IMAGE   # past the window
    ref = _hf_logits(hf_model, ckpt, ids, images)
    np.testing.assert_allclose(_lite_logits(runner, ids, mm, chunk), ref, rtol=1e-4, atol=2e-4)


def test_image_tokens_see_later_tokens_of_their_image(ckpt, hf_model, runner):
    """The bidirectional span matters: the first image token's logits change with the last image
    row's embedding (a causal model could not see it), and transformers' causal mask (no
    token_type_ids) gives other logits than the ones matched above."""
    images = [image(100, 70, seed=3)]
    ids, mm = _prompt(ckpt, images)
    first, last = mm.items[0].offset, mm.items[0].offset + mm.items[0].length - 1

    def change_last_row(arrays):
        mm_embeds, src = arrays[0], arrays[1]
        if mm_embeds is not None and last < len(src):
            mm_embeds[src[last]] += 0.5

    base = _lite_logits(runner, ids, mm)
    changed = _lite_logits(runner, ids, mm, perturb=change_last_row)
    np.testing.assert_array_equal(changed[:first], base[:first])
    assert np.abs(changed[first] - base[first]).max() > 1e-3
    causal = _hf_logits(hf_model, ckpt, ids, images, bidirectional=False)
    assert np.abs(causal[first:last] - base[first:last]).max() > 1e-3


def test_a_different_image_gives_different_logits(ckpt, runner):
    check_another_image_moves_the_logits(lambda images: _prompt(ckpt, images), runner)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_tower_matches_the_numpy_reference(ckpt, runner, dtype, tol, variant):
    from lite_llm import _kernels
    cfg = runner.vision.vision
    enc = gemma3.SiglipEncoder(cfg, runner.vision.encoder.t, kernels=_kernels.load(variant), dtype=dtype,
                               num_threads=2)
    pixels = gemma3.preprocess(image(61, 45, seed=7), cfg)
    ref = enc.encode_reference(pixels)
    ours = enc.encode(pixels)
    assert ours.shape == ref.shape == (TOKENS_PER_IMAGE, 64)
    assert np.abs(ours - ref).max() <= tol * np.abs(ref).max()
