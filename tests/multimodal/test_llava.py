"""LLaVA-1.5 against transformers on a tiny random checkpoint, as an HF directory and as a GGUF
language model + llama.cpp mmproj file: CLIP's pixel values, the vision tower + projector, and
the language model's logits with images in the prompt (one shot and through chunked prefill)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lite_llm.multimodal import MediaConfig, Processor, llava
from llava_checkpoint import IMAGE, llava_checkpoint, lm_gguf_without_image_token
from vl_checkpoint import image
from vl_common import TEXT_IDS, VARIANTS, check_another_image_moves_the_logits, image_prompt, prefill_logits, small_runner

pytest.importorskip("PIL")

SIZES = [(42, 42), (100, 70), (30, 80), (61, 45)]


@pytest.fixture(scope="module")
def files():
    return llava_checkpoint()


@pytest.fixture(scope="module")
def hf_model(files):
    from transformers import LlavaForConditionalGeneration
    return LlavaForConditionalGeneration.from_pretrained(files[0], dtype=torch.float32).eval()


def _runner(model: str, mmproj: str | None):
    from lite_llm.model.loader import load_model
    return small_runner(load_model(model, dtype="float32", progress=False, mmproj=mmproj))


@pytest.fixture(scope="module", params=["gguf+mmproj", "hf"])
def source(request, files):
    """(model, mmproj) of each way LLaVA is given, with its runner."""
    hf, lm, mm = files
    model, mmproj = (str(lm), str(mm)) if request.param == "gguf+mmproj" else (str(hf), None)
    return model, mmproj, _runner(model, mmproj)


def _hf_pixels(files, images):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    return CLIPImageProcessorPil.from_pretrained(files[0])(images=images, return_tensors="np")["pixel_values"]


@pytest.mark.parametrize("size", SIZES)
def test_pixel_values_match_the_hf_slow_processor(files, size):
    img = image(*size, seed=sum(size))
    ref = _hf_pixels(files, [img])[0]
    for proc in (Processor.for_model(str(files[0])), Processor.for_model(str(files[1]), str(files[2]))):
        patches = llava.preprocess(img, proc.vision)
        np.testing.assert_allclose(llava.pixel_values_of(patches, proc.vision), ref, rtol=0, atol=1e-5)


def test_vision_tower_and_projector_match_transformers(files, hf_model, source):
    model, mmproj, runner = source
    img = image(100, 70, seed=1)
    with torch.no_grad():
        ref = hf_model.model.get_image_features(pixel_values=torch.from_numpy(_hf_pixels(files, [img])),
                                                vision_feature_layer=-2,
                                                vision_feature_select_strategy="default").pooler_output[0]
    proc = Processor.for_model(model, mmproj)
    ours = runner.vision.encoder.encode(llava.preprocess(img, proc.vision))
    assert ours.shape == tuple(ref.shape) == (9, 64)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-4, atol=1e-5)


def _prompt(model, mmproj, images, text_ids=TEXT_IDS):
    """[text, <image>, text, ...] expanded by the processor."""
    return image_prompt(Processor.for_model(model, mmproj), [IMAGE], images, text_ids)


@pytest.mark.parametrize("sizes", [[(100, 70)], [(56, 112), (84, 56)]], ids=["one-image", "two-images"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_fp32_logits_match_transformers(files, hf_model, source, sizes, chunk):
    model, mmproj, runner = source
    images = [image(*s, seed=i + 3) for i, s in enumerate(sizes)]
    ids, mm = _prompt(model, mmproj, images)
    assert ids.count(IMAGE) == 9 * len(images) and mm.rope_pos is None
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([ids]),
                       pixel_values=torch.from_numpy(_hf_pixels(files, images))).logits[0].numpy()
    np.testing.assert_allclose(prefill_logits(runner, ids, mm, chunk), ref, rtol=1e-4, atol=2e-4)


def test_a_different_image_gives_different_logits(source):
    model, mmproj, runner = source
    check_another_image_moves_the_logits(lambda images: _prompt(model, mmproj, images), runner)


def test_a_gguf_vocabulary_without_image_token_takes_llama_cpps_media_marker(files, hf_model):
    """llama.cpp (tools/mtmd) marks an image's place in the prompt text with <__media__>, not a
    token id: the hub's llava-v1.5 GGUFs have no "<image>". The marker is one special token past
    the vocabulary, expanded to the image's rows (the unknown token's id, their embeddings
    replacing it): the same logits as transformers with its <image> tokens there."""
    from lite_llm.model.loader import load_model
    lm, mmproj = str(lm_gguf_without_image_token()), str(files[2])
    loaded = load_model(lm, dtype="float32", progress=False, mmproj=mmproj)
    vocab = loaded.config.vocab_size
    assert loaded.tokenizer.token_to_id("<image>") is None and loaded.tokenizer.token_to_id(llava.MEDIA_MARKER) == vocab
    text = loaded.tokenizer.encode("Look: <__media__> what is it?", add_special_tokens=False)
    assert text.count(vocab) == 1 and max(t for t in text if t != vocab) < vocab
    proc = Processor.for_model(lm, mmproj)
    assert proc.placeholder == llava.MEDIA_MARKER and proc.placeholder_id == vocab
    images = [image(100, 70, seed=3), image(56, 112, seed=4)]
    at = text.index(vocab)
    ids, mm = proc.process(text[:at + 1] + [50, 51] + text[at:], images, MediaConfig())
    assert vocab not in ids and [(it.offset, it.length) for it in mm.items] == [(at, 9), (at + 11, 9)]
    hf_ids = list(ids)
    for it in mm.items:
        hf_ids[it.offset:it.offset + it.length] = [IMAGE] * it.length
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([hf_ids]),
                       pixel_values=torch.from_numpy(_hf_pixels(files, images))).logits[0].numpy()
    runner = small_runner(loaded)
    np.testing.assert_allclose(prefill_logits(runner, ids, mm, 7), ref, rtol=1e-4, atol=2e-4)
    # a vocabulary with "<image>" keeps it: no marker is added
    with_image = load_model(str(files[1]), dtype="float32", progress=False, mmproj=mmproj)
    assert with_image.tokenizer.token_to_id(llava.MEDIA_MARKER) is None
    assert Processor.for_model(str(files[1]), mmproj).placeholder == "<image>"


def test_bad_mmproj_files_are_refused_naming_the_problem(files, tmp_path):
    from conftest import write_gguf
    from lite_llm.model.loader import ModelLoadError, load_model
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(str(files[1]), mmproj=str(tmp_path / "missing.gguf"))
    with pytest.raises(llava.LlavaError, match="not an mmproj"):
        llava.read_mmproj(str(files[1]))
    other = write_gguf(tmp_path / "other.gguf", {"v.patch_embd.weight": (np.zeros((4, 3, 2, 2), np.float32), None)},
                       "clip", {"clip.projector_type": "resampler"})
    with pytest.raises(llava.LlavaError, match="projector type 'resampler'"):
        llava.read_mmproj(str(other))


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("keep_class", [False, True])
@pytest.mark.parametrize("num_heads", [2, 4])   # heads of 16 run the attention tiles, of 8 the plain loop
@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_tower_matches_the_numpy_reference(files, dtype, tol, keep_class, num_heads, variant):
    import dataclasses
    from lite_llm import _kernels
    cfg, tensors = llava.read_mmproj(str(files[2]))
    assert cfg.num_heads == 2 and cfg.hidden_size == 32
    cfg = dataclasses.replace(cfg, keep_class=keep_class, num_heads=num_heads)
    enc = llava.ClipEncoder(cfg, tensors, kernels=_kernels.load(variant), dtype=dtype, num_threads=2)
    pixels = llava.preprocess(image(61, 45, seed=7), cfg)
    ref = enc.encode_reference(pixels)
    ours = enc.encode(pixels)
    assert ours.shape == ref.shape == (9 + keep_class, 64)
    assert np.abs(ours - ref).max() <= tol * np.abs(ref).max()
