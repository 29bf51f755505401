"""Gemma 3 (vision) through LLM: vLLM's multi_modal_data and chat image parts give the same
prompt and answer, a chunked prefill never splits an image, and the same image twice is a
prefix-cache hit encoded once (a different image is neither)."""
from __future__ import annotations

import pytest
from gemma3_checkpoint import IMAGE, TOKENS_PER_IMAGE, gemma3_checkpoint
from test_llava_engine import (
    _url,
    ask_about_image,
    check_generate_and_chat_agree,
    check_same_image_cached_once,
    vision_server,
)
from vl_checkpoint import image

from lite_llm import LLM, SamplingParams

pytest.importorskip("PIL")
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
TAIL = " what is it? The quick brown fox jumps over the lazy dog, the cat sat on the mat."
PROMPT = f"<|im_start|>user\nLook: <start_of_image>{TAIL}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def llm():
    # steps of 16 tokens: an image's 11 (boi, 9 rows, eoi) never split over two of them
    engine = LLM(str(gemma3_checkpoint()), dtype="float32", block_size=16, max_num_batched_tokens=16,
                 kv_cache_space=0.01, max_num_seqs=4)
    yield engine
    engine.shutdown()


def test_generate_and_chat_with_an_image_agree(llm):
    check_generate_and_chat_agree(llm, PROMPT, TAIL, IMAGE, TOKENS_PER_IMAGE)


def test_same_image_is_a_prefix_cache_hit_and_encoded_once(llm):
    check_same_image_cached_once(llm, PROMPT, IMAGE)


def test_the_openai_client_gets_an_answer_streaming_and_not():
    openai = pytest.importorskip("openai")
    with vision_server("tiny-gemma3", str(gemma3_checkpoint())) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        url = _url(image(90, 60, seed=1))
        whole = ask_about_image(client, "tiny-gemma3", url)
        assert whole.usage.completion_tokens == 5 and whole.usage.prompt_tokens > TOKENS_PER_IMAGE + 4
        pieces = [c.choices[0].delta.content or "" for c in ask_about_image(client, "tiny-gemma3", url, stream=True)
                  if c.choices]
        assert "".join(pieces) == whole.choices[0].message.content
