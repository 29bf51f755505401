"""A step's images through the vision tower: the images a step encodes go through ONE compiled
tower call (Qwen2.5-VL: patches of images of any sizes one after the other, attention within each
image as transformers' cu_seqlens; CLIP / SigLIP: images of the tower's one size), each image's
rows as when it is encoded alone; and the encoder cache never evicts an image the step takes from
it for one the step encodes (the scheduler counted it as cached)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lite_llm import _kernels
from lite_llm.multimodal import MediaConfig, Processor, VisionRunner, qwen2_5_vl
from vl_checkpoint import IMAGE_PAD, VISION_END, VISION_START, Chunk, Req, image, qwen2_5_vl_checkpoint

pytest.importorskip("PIL")

SIZES = [(56, 56), (140, 84), (28, 84)]     # 16, 60 and 12 patches; several windows in the last two


class _Counting:
    """A kernel module whose vision_forward calls are counted."""

    def __init__(self, kernels):
        self._k, self.calls = kernels, 0

    def vision_forward(self, *args):
        self.calls += 1
        return self._k.vision_forward(*args)

    def clip_forward(self, *args):
        self.calls += 1
        return self._k.clip_forward(*args)

    def __getattr__(self, name):
        return getattr(self._k, name)


@pytest.fixture(scope="module")
def ckpt():
    return qwen2_5_vl_checkpoint()


def _vision(ckpt, variant=None, dtype="float32", **kw) -> VisionRunner:
    from lite_llm.model.loader import load_model
    config = load_model(str(ckpt), dtype="float32", progress=False).config
    vr = VisionRunner(str(ckpt), config, kernels=_kernels.load(variant or _kernels.VARIANT.name), dtype=dtype,
                      num_threads=2, **kw)
    vr.encoder.kernels = _Counting(vr.encoder.kernels)
    return vr


def _images(vr, sizes=SIZES):
    return [qwen2_5_vl.preprocess(image(*s, seed=40 + k), vr.vision) for k, s in enumerate(sizes)]


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("variant", _kernels.available())
def test_several_images_are_one_tower_call_with_the_rows_of_each_alone(ckpt, dtype, tol, variant):
    vr = _vision(ckpt, variant, dtype)
    images = _images(vr)
    together = vr.encoder.encode_many(images)
    assert vr.encoder.kernels.calls == 1
    for (pixels, grid), rows in zip(images, together):
        alone = vr.encoder.encode(pixels, grid)
        ref = vr.encoder.encode_reference(pixels, grid)
        assert rows.shape == alone.shape == (grid[1] * grid[2] // 4, vr.dim)
        # the same arithmetic per image but for K/V blocks of 16 keys that start elsewhere in a batch
        np.testing.assert_allclose(rows, alone, rtol=0, atol=1e-5 * np.abs(alone).max())
        assert np.abs(rows - ref).max() <= tol * np.abs(ref).max()
    assert vr.encoder.kernels.calls == 1 + len(images)


def test_batched_images_without_the_attention_tiles_attend_within_each_image(ckpt):
    # heads of 8 (not a multiple of 16): the tower's plain fp32 attention loop, its full-attention
    # blocks bounded by each image instead of the whole batch
    vr = _vision(ckpt)
    narrow = qwen2_5_vl.VisionEncoder(dataclasses.replace(vr.vision, num_heads=4), _tensors(ckpt),
                                      vr.encoder.kernels, "float32", 2)
    images = _images(vr)
    together = narrow.encode_many(images)
    for (pixels, grid), rows in zip(images, together):
        ref = narrow.encode_reference(pixels, grid)
        np.testing.assert_allclose(rows, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("tower", ["llava", "llava-class-row", "llava-plain-loop", "gemma3"])
@pytest.mark.parametrize("variant", _kernels.available())
def test_clip_and_siglip_images_are_one_tower_call_with_the_rows_of_each_alone(tower, dtype, tol, variant):
    # CLIP with the class row dropped or kept (keep_class), with heads of 8 (the plain fp32
    # attention loop), and SigLIP with Gemma 3's pooling projector
    from gemma3_checkpoint import gemma3_checkpoint
    from llava_checkpoint import llava_checkpoint

    from lite_llm.multimodal import gemma3, llava
    kernels = _Counting(_kernels.load(variant))
    if tower == "gemma3":
        path = str(gemma3_checkpoint())
        with open(path + "/config.json") as fh:
            cfg = gemma3.config(path, json.load(fh))
        enc = gemma3.SiglipEncoder(cfg, gemma3.read_hf(path, cfg), kernels, dtype, 2)
        prep = gemma3.preprocess
    else:
        cfg, tensors = llava.read_mmproj(str(llava_checkpoint()[2]))
        cfg = dataclasses.replace(cfg, keep_class=tower == "llava-class-row",
                                  num_heads=4 if tower == "llava-plain-loop" else cfg.num_heads)
        enc = llava.ClipEncoder(cfg, tensors, kernels, dtype, 2)
        prep = llava.preprocess
    images = [(prep(image(*s, seed=50 + k), cfg), None) for k, s in enumerate(SIZES)]
    together = enc.encode_many(images)
    assert kernels.calls == 1
    for (pixels, _), rows in zip(images, together):
        alone = enc.encode(pixels)
        ref = enc.encode_reference(pixels)
        assert rows.shape == alone.shape == ref.shape
        np.testing.assert_allclose(rows, alone, rtol=0, atol=1e-5 * np.abs(alone).max())
        assert np.abs(rows - ref).max() <= tol * np.abs(ref).max()


def _tensors(ckpt) -> dict:
    from lite_llm.model.hf import SafetensorsCheckpoint
    c = SafetensorsCheckpoint(str(ckpt))
    try:
        return {n.removeprefix("model."): c.read(n).astype(np.float32) for n in c.entries
                if n.startswith(("visual.", "model.visual."))}
    finally:
        c.close()


def _request(ckpt, img):
    ids = [40, 41, VISION_START, IMAGE_PAD, VISION_END, 50, 51]
    return Req(Processor.for_model(str(ckpt)).process(ids, [img], MediaConfig())[1])


def _step(vr, requests):
    """One step prefilling each request whole: (step_inputs' arrays, number of tokens)."""
    chunks, n = [], 0
    for r in requests:
        length = r.mm.rope_pos.shape[0]
        chunks.append(Chunk(r, 0, length))
        n += length
    return vr.step_inputs(chunks, n, np.arange(n, dtype=np.int32)), n


def test_a_steps_images_are_one_tower_call(ckpt):
    vr = _vision(ckpt)
    a, b = (_request(ckpt, image(*s, seed=60 + k)) for k, s in enumerate(SIZES[:2]))
    (embeds, src, _, _), n = _step(vr, [a, b])
    assert vr.encoder.kernels.calls == 1 and vr.step_encoded == 2
    rows = [vr.encoder.encode(it.pixel_values, it.grid) for it in (a.mm.items[0], b.mm.items[0])]
    np.testing.assert_allclose(embeds, np.concatenate(rows), rtol=0, atol=1e-5 * np.abs(embeds).max())
    assert (src >= 0).sum() == embeds.shape[0]


def test_a_steps_images_go_in_calls_of_at_most_max_patches(ckpt, monkeypatch):
    # 16 + 60 + 12 patches with a cap of 76: the first two together, the third alone
    import lite_llm.multimodal as mm
    monkeypatch.setattr(mm, "MAX_PATCHES_PER_CALL", 76)
    vr = _vision(ckpt)
    reqs = [_request(ckpt, image(*s, seed=70 + k)) for k, s in enumerate(SIZES)]
    (embeds, _, _, _), _ = _step(vr, reqs)
    assert vr.encoder.kernels.calls == 2 and vr.step_encoded == 3
    rows = [vr.encoder.encode(r.mm.items[0].pixel_values, r.mm.items[0].grid) for r in reqs]
    np.testing.assert_allclose(embeds, np.concatenate(rows), rtol=0, atol=1e-5 * np.abs(embeds).max())


def test_an_image_the_step_takes_from_the_cache_is_not_evicted_by_one_it_encodes(ckpt):
    # the cache holds one 56x56 image's 4 rows; step 1 encodes A. Step 2 holds B (new) and A: the
    # scheduler counted A as cached (encoder_cut), so encoding B must not evict A and encode it
    # again, outside the step's budget
    vr = _vision(ckpt, max_cached_rows=4)
    a = _request(ckpt, image(56, 56, seed=1))
    b = _request(ckpt, image(56, 56, seed=2))
    _step(vr, [a])
    assert vr.num_encoded == 1 and a.mm.items[0].hash in vr.cache
    (embeds, _, _, _), _ = _step(vr, [b, a])
    assert vr.step_encoded == 1 and vr.num_encoded == 2
    assert a.mm.items[0].hash in vr.cache and b.mm.items[0].hash in vr.cache   # pinned through the step
    c = _request(ckpt, image(56, 56, seed=3))
    _step(vr, [c])                      # the next step's encoding evicts down to the limit again
    assert list(vr.cache) == [c.mm.items[0].hash] and vr.cached_rows == 4
