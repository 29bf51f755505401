"""Images through the engine: LLM.generate with vLLM's multi_modal_data, LLM.chat with OpenAI
image parts; prefill chunks never split an image; each image is encoded once (by hash); the
prefix cache keys blocks on the image (same image: a hit; a different one: no shared blocks)."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from lite_llm import LLM, SamplingParams
from lite_llm.multimodal import MediaError, MMItem, MMPrompt, whole_images
from vl_checkpoint import IMAGE_PAD, PLACEHOLDER, image, qwen2_5_vl_checkpoint

pytest.importorskip("PIL")
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    # 16-token blocks and steps of 32 tokens: a 140x112 image (20 tokens) lands across steps and blocks
    engine = LLM(str(qwen2_5_vl_checkpoint()), dtype="float32", block_size=16, max_num_batched_tokens=32,
                 kv_cache_space=0.01, max_num_seqs=4, limit_mm_per_prompt='{"image": 2}')
    yield engine
    engine.shutdown()


def _prompt(images: int = 1) -> str:
    return "<|im_start|>user\n" + "Look: " + " and ".join([PLACEHOLDER] * images) + " what is it?<|im_end|>\n<|im_start|>assistant\n"


def test_generate_with_multi_modal_data_and_chat_with_image_parts_agree(llm):
    img = image(140, 112, seed=5)
    out = llm.generate({"prompt": _prompt(), "multi_modal_data": {"image": img}}, GREEDY)[0]
    assert out.prompt_token_ids.count(IMAGE_PAD) == 20 and len(out.outputs[0].token_ids) == 4
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    chat = llm.chat([{"role": "user", "content": [{"type": "text", "text": "Look: "},
                                                   {"type": "image_url", "image_url": {"url": url}},
                                                   {"type": "text", "text": " what is it?"}]}], GREEDY)[0]
    assert chat.prompt_token_ids == out.prompt_token_ids
    assert chat.outputs[0].token_ids == out.outputs[0].token_ids


def test_same_image_is_a_prefix_cache_hit_and_encoded_once(llm):
    vision = llm.llm_engine.runner.vision
    img = image(84, 84, seed=11)
    first = llm.generate({"prompt": _prompt(), "multi_modal_data": {"image": img}}, GREEDY)[0]
    encoded = vision.num_encoded
    second = llm.generate({"prompt": _prompt(), "multi_modal_data": {"image": img.copy()}}, GREEDY)[0]
    assert second.num_cached_tokens >= 16 * (len(first.prompt_token_ids) // 16) - 16 > 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert vision.num_encoded == encoded     # the second prefill read the cached blocks or encoder rows


def test_a_different_image_shares_no_block_holding_image_tokens(llm):
    a, b = image(84, 84, seed=21), image(84, 84, seed=22)
    out_a = llm.generate({"prompt": _prompt(), "multi_modal_data": {"image": a}}, GREEDY)[0]
    out_b = llm.generate({"prompt": _prompt(), "multi_modal_data": {"image": b}}, GREEDY)[0]
    first_image_token = out_b.prompt_token_ids.index(IMAGE_PAD)
    assert out_b.num_cached_tokens <= first_image_token          # only the text blocks before it
    assert out_a.prompt_token_ids == out_b.prompt_token_ids


def test_too_many_images_and_a_wrong_placeholder_count_are_refused(llm):
    imgs = [image(56, 56, seed=k) for k in range(3)]
    with pytest.raises(MediaError, match="3 images in one prompt, more than the limit of 2"):
        llm.generate({"prompt": _prompt(3), "multi_modal_data": {"image": imgs}}, GREEDY)
    with pytest.raises(MediaError, match="2 image placeholders for 1 images"):
        llm.generate({"prompt": _prompt(2), "multi_modal_data": {"image": imgs[0]}}, GREEDY)


def test_an_image_larger_than_the_step_budget_is_refused(llm):
    with pytest.raises(ValueError, match="more than max_num_batched_tokens 32"):
        llm.generate({"prompt": _prompt(), "multi_modal_data": {"image": image(200, 200, seed=1)}}, GREEDY)


def test_a_chunk_never_ends_inside_an_image():
    class R:
        mm = MMPrompt((MMItem(10, 20, b"x", np.zeros((1, 1), np.float32), (1, 2, 2)),), None)
    assert whole_images(R, 0, 15) == 10          # cut back to the image's start
    assert whole_images(R, 10, 15) == 0          # cannot hold the image: wait for room
    assert whole_images(R, 10, 20) == 20 and whole_images(R, 0, 40) == 40 and whole_images(R, 0, 8) == 8
    assert whole_images(R, 15, 10) == 0 and whole_images(R, 15, 15) == 15   # resumed mid-image (prefix hit)


def test_mm_processor_kwargs_max_pixels_caps_the_image_tokens():
    from lite_llm.multimodal import MediaConfig, Processor, media_config
    proc = Processor.for_model(str(qwen2_5_vl_checkpoint()))
    ids = [1, 3, IMAGE_PAD, 4, 2]
    full, _ = proc.process(ids, [image(280, 280, seed=1)], MediaConfig())
    capped, _ = proc.process(ids, [image(280, 280, seed=1)], media_config(mm_processor_kwargs='{"max_pixels": 12544}'))
    assert full.count(IMAGE_PAD) == 100 and capped.count(IMAGE_PAD) == 16       # 112 x 112: 4 x 4 merged
    with pytest.raises(ValueError, match="--limit-mm-per-prompt"):
        media_config(limit_mm_per_prompt='{"video": 1}')
    with pytest.raises(ValueError, match="--mm-processor-kwargs"):
        media_config(mm_processor_kwargs="[1]")
