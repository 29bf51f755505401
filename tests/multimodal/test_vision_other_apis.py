"""Images through the Responses API (input_image) and the Messages API (image blocks, base64) on a
tiny random Qwen2.5-VL over real HTTP: each answers as the chat completion of the same image does
(same prompt tokens, same greedy text), count_tokens counts the image's tokens, and a model
without a vision tower refuses an image in each API's error shape."""
from __future__ import annotations

import base64
import io
import json

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("PIL")

from vl_checkpoint import image, qwen2_5_vl_checkpoint  # noqa: E402

QUESTION = "What is in the picture?"


def _png_b64(seed: int) -> str:
    buf = io.BytesIO()
    image(84, 56, seed=seed).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def server():
    from lite_llm.llm import build_async_engine
    from lite_llm.server.app import create_server
    engine, tokenizer, info = build_async_engine(str(qwen2_5_vl_checkpoint()), dtype="float32", block_size=16,
                                                 max_num_batched_tokens=64, kv_cache_space=0.01, max_num_seqs=4,
                                                 serving=True)
    server = create_server(engine, tokenizer, "tiny-vl", info["max_model_len"], kernel_info=info,
                           model_root=info["model_path"], vocab_size=info["vocab_size"])
    server.start()
    yield server
    server.drain(5.0)


def _chat(server, b64: str):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    content = [{"type": "text", "text": QUESTION},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}]
    return client.chat.completions.create(model="tiny-vl", messages=[{"role": "user", "content": content}],
                                          max_tokens=6, temperature=0, extra_body={"ignore_eos": True})


def test_responses_input_image_answers_as_chat(server):
    b64 = _png_b64(1)
    chat = _chat(server, b64)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = client.responses.create(model="tiny-vl", max_output_tokens=6, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_text", "text": QUESTION},
        {"type": "input_image", "image_url": "data:image/png;base64," + b64}]}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens > 6
    assert r.output_text == chat.choices[0].message.content


def test_messages_image_block_answers_as_chat_and_is_counted(server):
    b64 = _png_b64(2)
    chat = _chat(server, b64)
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": [
        {"type": "text", "text": QUESTION},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]
    m = client.messages.create(model="tiny-vl", max_tokens=6, messages=messages, extra_body={"temperature": 0})
    assert m.usage.input_tokens == chat.usage.prompt_tokens > 6
    if m.stop_reason == "max_tokens":            # the chat side ignores EOS; equal while neither stopped
        assert m.content[0].text == chat.choices[0].message.content
    assert client.messages.count_tokens(model="tiny-vl", messages=messages).input_tokens == m.usage.input_tokens


def test_a_text_model_refuses_images_in_each_apis_shape():
    from tests.server.conftest import request, start_server, stop_server
    s = start_server()
    try:
        status, _, data = request(s.port, "POST", "/v1/messages", {"model": "tiny", "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": _png_b64(3)}}]}]})
        body = json.loads(data)
        assert status == 400 and body["type"] == "error" and "does not take image inputs" in body["error"]["message"]
        status, _, data = request(s.port, "POST", "/v1/responses", {"model": "tiny", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64," + _png_b64(3)}]}]})
        err = json.loads(data)["error"]
        assert status == 400 and "does not take image inputs" in err["message"]
    finally:
        stop_server(s)


def test_ollama_images_answer_as_chat(server):
    """Ollama's base64 `images` on a user message (chat) and on a prompt (generate): the chat
    completion of the same image and question, token for token."""
    ollama = pytest.importorskip("ollama")
    b64 = _png_b64(3)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    content = [{"type": "text", "text": QUESTION},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}]
    want = client.chat.completions.create(model="tiny-vl", messages=[{"role": "user", "content": content}],
                                          max_tokens=6, temperature=0)
    o = ollama.Client(host=server.url, timeout=60)
    got = o.chat(model="tiny-vl", messages=[{"role": "user", "content": QUESTION, "images": [b64]}],
                 options={"temperature": 0, "num_predict": 6})
    assert got.prompt_eval_count == want.usage.prompt_tokens > 6
    assert got.message.content == want.choices[0].message.content
    generated = o.generate(model="tiny-vl", prompt=QUESTION, images=[b64], options={"temperature": 0, "num_predict": 6})
    assert (generated.prompt_eval_count, generated.response) == (got.prompt_eval_count, got.message.content)
