"""vLLM's stream_options.continuous_usage_stats over real HTTP: with include_usage, every streamed
chunk carries the usage so far (the prompt's tokens, the choice's completion tokens up to and
including that chunk), then the final usage chunk sums every choice; without include_usage it
asks for nothing. Chunk token counts are read from per-token logprobs, one entry a token."""
from __future__ import annotations

import json

import pytest

from .conftest import error_of, request

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def _chunks(data: bytes) -> list[dict]:
    events = data.decode("utf-8").split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    return [json.loads(e[len("data: "):]) for e in events[:-2]]


def _stream(served, path: str, body: dict) -> list[dict]:
    status, _, data = request(served.port, "POST", path, {"model": served.model, "temperature": 0,
                                                          "stream": True, **body})
    assert status == 200, data
    return _chunks(data)


def _whole(served, path: str, body: dict) -> dict:
    status, _, data = request(served.port, "POST", path, {"model": served.model, "temperature": 0, **body})
    assert status == 200, data
    return json.loads(data)


def _tokens_in(kind: str, choice: dict) -> int:
    lps = choice.get("logprobs")
    if lps is None:
        return 0
    return len(lps["content"]) if kind == "chat" else len(lps["tokens"])


def _check_running_usage(kind: str, chunks: list[dict], prompt_tokens: dict[int, int]) -> dict[int, int]:
    """Every chunk but the last carries one choice and the usage of that choice so far; returns
    each choice's completion tokens as its last chunk counted them."""
    seen: dict[int, int] = {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        i = choice["index"]
        seen[i] = seen.get(i, 0) + _tokens_in(kind, choice)
        u = c["usage"]
        assert u == {"prompt_tokens": prompt_tokens[i], "completion_tokens": seen[i],
                     "total_tokens": prompt_tokens[i] + seen[i]}, (c, seen)
    return seen


def test_chat_usage_on_every_chunk(served):
    whole = _whole(served, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 9})
    chunks = _stream(served, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 9, "logprobs": True,
                                                      "stream_options": CONTINUOUS})
    p = whole["usage"]["prompt_tokens"]
    # the role chunk first: the prompt counted, nothing generated yet
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[0]["usage"] == {"prompt_tokens": p, "completion_tokens": 0, "total_tokens": p}
    seen = _check_running_usage("chat", chunks, {0: p})
    assert seen == {0: 9} and len(chunks) > 4
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == whole["choices"][0]["message"]["content"]
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"] == whole["usage"] == {
        "prompt_tokens": p, "completion_tokens": 9, "total_tokens": p + 9}


def test_chat_n_counts_each_choice_then_sums(served):
    p = _whole(served, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})["usage"]["prompt_tokens"]
    chunks = _stream(served, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 5, "n": 2,
                                                      "temperature": 1.0, "seed": 3, "logprobs": True,
                                                      "stream_options": CONTINUOUS})
    assert _check_running_usage("chat", chunks, {0: p, 1: p}) == {0: 5, 1: 5}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": p, "completion_tokens": 10, "total_tokens": p + 10}


def test_completions_usage_per_prompt_and_choice(served):
    prompts = ["Hello world", "The quick brown fox jumps"]
    lens = [len(served.tokenizer.encode(t)) for t in prompts]
    assert lens[0] != lens[1]
    chunks = _stream(served, "/v1/completions", {"prompt": prompts, "max_tokens": 4, "n": 2, "logprobs": 0,
                                                 "temperature": 1.0, "seed": 5, "stream_options": CONTINUOUS})
    # response index = prompt * n + choice: each chunk counts its own prompt
    seen = _check_running_usage("completion", chunks, {0: lens[0], 1: lens[0], 2: lens[1], 3: lens[1]})
    assert seen == {0: 4, 1: 4, 2: 4, 3: 4}
    # the total counts each prompt once, whatever n (as the non-streamed usage and vLLM)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": lens[0] + lens[1], "completion_tokens": 16, "total_tokens": lens[0] + lens[1] + 16}


def test_completions_echo_chunk_counts_the_prompt(served):
    n = len(served.tokenizer.encode("Hello world"))
    chunks = _stream(served, "/v1/completions", {"prompt": "Hello world", "max_tokens": 3, "echo": True,
                                                 "stream_options": CONTINUOUS})
    assert chunks[0]["choices"][0]["text"] == "Hello world"
    assert chunks[0]["usage"] == {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n}
    assert all(c["usage"]["prompt_tokens"] == n for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 3 and chunks[-1]["choices"] == []


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {"messages": CHAT}),
                                       ("/v1/completions", {"prompt": "Hello"})])
def test_continuous_without_include_usage_asks_for_nothing(served, path, body):
    """vLLM: continuous usage only rides on include_usage; alone it is accepted and adds nothing."""
    chunks = _stream(served, path, {**body, "max_tokens": 4,
                                    "stream_options": {"continuous_usage_stats": True}})
    assert all(c.get("usage") is None for c in chunks) and all(c["choices"] for c in chunks)
    chunks = _stream(served, path, {**body, "max_tokens": 4,
                                    "stream_options": {"include_usage": False, "continuous_usage_stats": True}})
    assert all(c.get("usage") is None for c in chunks) and all(c["choices"] for c in chunks)


def test_include_usage_alone_keeps_usage_for_the_last_chunk(served):
    chunks = _stream(served, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4,
                                                      "stream_options": {"include_usage": True,
                                                                         "continuous_usage_stats": False}})
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_openai_client_reads_usage_on_every_chunk(client, served):
    chunks = list(client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=6, temperature=0,
                                                 stream=True, stream_options=CONTINUOUS))
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 6
    assert chunks[-1].choices == []


@pytest.mark.parametrize("opts", [{"include_usage": True, "continuous_usage_stats": "yes"},
                                  {"include_usage": True, "continuous_usage_stats": 1}])
def test_continuous_usage_stats_must_be_a_boolean(served, opts):
    status, _, data = request(served.port, "POST", "/v1/chat/completions", {
        "model": served.model, "messages": CHAT, "stream": True, "stream_options": opts})
    assert status == 400
    err = error_of(data)
    assert err["param"] == "stream_options.continuous_usage_stats" and "boolean" in err["message"]
    assert "yes" not in err["message"]


def test_stream_options_need_stream(served):
    status, _, data = request(served.port, "POST", "/v1/chat/completions", {
        "model": served.model, "messages": CHAT, "stream_options": CONTINUOUS})
    assert status == 400 and error_of(data)["param"] == "stream_options"


def test_openapi_documents_continuous_usage_stats(served):
    import jsonschema
    status, _, data = request(served.port, "GET", "/openapi.json")
    assert status == 200
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        schema = json.loads(data)["components"]["schemas"][name]["properties"]["stream_options"]
        jsonschema.validate(CONTINUOUS, schema)
        for bad in ({"include_usage": True, "continuous_usage_stats": "yes"}, {"include_usage": True, "other": 1}):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(bad, schema)
