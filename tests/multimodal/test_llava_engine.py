"""LLaVA as llama-server users run it: a GGUF language model with --mmproj, through LLM (vLLM's
multi_modal_data, chat image parts; the same image twice is a prefix-cache hit, encoded once)
and over HTTP with the official openai client, streaming and not."""
from __future__ import annotations

import base64
import io
from contextlib import contextmanager

import pytest
from llava_checkpoint import IMAGE, llava_checkpoint, lm_gguf_without_image_token
from vl_checkpoint import image

from lite_llm import LLM, SamplingParams

openai = pytest.importorskip("openai")
pytest.importorskip("PIL")
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
TAIL = " what is it? The quick brown fox jumps over the lazy dog, the cat sat on the mat."
PROMPT = f"<|im_start|>user\nLook: <image>{TAIL}<|im_end|>\n<|im_start|>assistant\n"


def _url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@contextmanager
def vision_server(name: str, model: str, **engine_args):
    """A real server on 127.0.0.1 over a tiny vision checkpoint, small fp32 engine settings."""
    from lite_llm.llm import build_async_engine
    from lite_llm.server.app import create_server
    engine, tokenizer, info = build_async_engine(model, dtype="float32", block_size=16, max_num_batched_tokens=64,
                                                 kv_cache_space=0.01, max_num_seqs=4, serving=True, **engine_args)
    server = create_server(engine, tokenizer, name, info["max_model_len"], kernel_info=info,
                           model_root=info["model_path"], vocab_size=info["vocab_size"])
    server.start()
    try:
        yield server
    finally:
        server.drain(5.0)


def ask_about_image(client, name: str, url: str, stream: bool = False):
    """One chat turn of text and an image_url part, 5 tokens at temperature 0."""
    content = [{"type": "text", "text": "What is in "}, {"type": "image_url", "image_url": {"url": url}}]
    return client.chat.completions.create(model=name, messages=[{"role": "user", "content": content}],
                                          max_tokens=5, temperature=0, stream=stream,
                                          extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def llm():
    _, lm, mm = llava_checkpoint()
    # steps of 16 tokens: the 9 image rows are never split over two of them
    engine = LLM(str(lm), mmproj=str(mm), dtype="float32", block_size=16, max_num_batched_tokens=16,
                 kv_cache_space=0.01, max_num_seqs=4)
    yield engine
    engine.shutdown()


def check_generate_and_chat_agree(llm, prompt: str, tail: str, image_id: int, tokens_per_image: int) -> None:
    """The offline form (prompt + multi_modal_data) and a chat with an image_url part give the same
    prompt ids (the image expanded to tokens_per_image ids) and greedy tokens."""
    img = image(100, 70, seed=5)
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": img}}, GREEDY)[0]
    assert out.prompt_token_ids.count(image_id) == tokens_per_image and len(out.outputs[0].token_ids) == 4
    chat = llm.chat([{"role": "user", "content": [{"type": "text", "text": "Look: "},
                                                   {"type": "image_url", "image_url": {"url": _url(img)}},
                                                   {"type": "text", "text": tail}]}], GREEDY)[0]
    assert chat.prompt_token_ids == out.prompt_token_ids
    assert chat.outputs[0].token_ids == out.outputs[0].token_ids


def check_same_image_cached_once(llm, prompt: str, image_id: int) -> None:
    """The same image again is a prefix-cache hit past its rows and is not encoded again; another
    image is encoded and shares no block holding image rows."""
    vision = llm.llm_engine.runner.vision
    img = image(64, 64, seed=11)
    first = llm.generate({"prompt": prompt, "multi_modal_data": {"image": img}}, GREEDY)[0]
    encoded = vision.num_encoded
    second = llm.generate({"prompt": prompt, "multi_modal_data": {"image": img.copy()}}, GREEDY)[0]
    start = first.prompt_token_ids.index(image_id)
    assert second.num_cached_tokens >= 16 * (len(first.prompt_token_ids) // 16) - 16 > start
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert vision.num_encoded == encoded
    other = llm.generate({"prompt": prompt, "multi_modal_data": {"image": image(64, 64, seed=12)}}, GREEDY)[0]
    assert vision.num_encoded == encoded + 1
    assert other.num_cached_tokens <= start   # no block holding image rows


def test_generate_and_chat_with_an_image_agree(llm):
    check_generate_and_chat_agree(llm, PROMPT, TAIL, IMAGE, 9)


def test_same_image_is_a_prefix_cache_hit_and_encoded_once(llm):
    check_same_image_cached_once(llm, PROMPT, IMAGE)


def test_a_vocabulary_without_image_token_answers_as_with_one(llm):
    """The hub's llava-v1.5 GGUFs have no "<image>": images stand at llama.cpp's <__media__>
    (the chat's image parts put it there); the answers are those of the same model whose
    vocabulary has "<image>"."""
    _, _, mm = llava_checkpoint()
    marker = LLM(str(lm_gguf_without_image_token()), mmproj=str(mm), dtype="float32", block_size=16,
                 max_num_batched_tokens=16, kv_cache_space=0.01, max_num_seqs=4)
    try:
        img = image(100, 70, seed=5)
        want = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": img}}, GREEDY)[0]
        out = marker.generate({"prompt": PROMPT.replace("<image>", "<__media__>"),
                               "multi_modal_data": {"image": img}}, GREEDY)[0]
        assert out.prompt_token_ids.count(IMAGE) == 0 and len(out.prompt_token_ids) == len(want.prompt_token_ids)
        assert out.outputs[0].token_ids == want.outputs[0].token_ids
        chat = marker.chat([{"role": "user", "content": [{"type": "text", "text": "Look: "},
                                                         {"type": "image_url", "image_url": {"url": _url(img)}},
                                                         {"type": "text", "text": TAIL}]}], GREEDY)[0]
        assert chat.prompt_token_ids == out.prompt_token_ids and chat.outputs[0].token_ids == want.outputs[0].token_ids
    finally:
        marker.shutdown()


def test_the_openai_client_gets_an_answer_streaming_and_not():
    _, lm, mm = llava_checkpoint()
    with vision_server("tiny-llava", str(lm), mmproj=str(mm)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        url = _url(image(90, 60, seed=1))
        whole = ask_about_image(client, "tiny-llava", url)
        assert whole.usage.completion_tokens == 5 and whole.usage.prompt_tokens > 9
        pieces = [c.choices[0].delta.content or "" for c in ask_about_image(client, "tiny-llava", url, stream=True)
                  if c.choices]
        assert "".join(pieces) == whole.choices[0].message.content
        with pytest.raises(openai.BadRequestError, match="not a readable image|not a valid image|cannot|decode|corrupt"):
            ask_about_image(client, "tiny-llava", "data:image/png;base64," + base64.b64encode(b"not a png").decode())


@pytest.mark.peers
def test_bench_llava_runs_all_three_engines_on_the_tiny_shape(capsys, tmp_path):
    pytest.importorskip("llama_cpp")
    from lite_llm.bench import llava as bench
    assert bench.main(["--shape", "tiny", "--repeats", "1", "--image", "64", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "16 image tokens" in out and "transformers" in out and "llama.cpp" in out
    assert out.count("x") >= 4 and "encode (s)" in out and "TTFT (s)" in out
