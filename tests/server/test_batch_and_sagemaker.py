"""vLLM's /v1/chat/completions/batch and SageMaker's /invocations and /ping over real HTTP: every
conversation of a batch gets the choice its own chat request gets; /invocations answers a chat,
batch or completion body as its own route does; bad bodies, the key."""
from __future__ import annotations

import json

import openai
import pytest

from .conftest import error_of, request, start_server, stop_server

CONVERSATIONS = [[{"role": "user", "content": "Hello"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A longer question, then?"}],
                 [{"role": "user", "content": "Third"}, {"role": "assistant", "content": "Yes?"},
                  {"role": "user", "content": "Go on"}]]


@pytest.fixture(scope="module")
def served():
    s = start_server(engine_overrides={"step_seconds": 0.001})
    yield s
    stop_server(s)


def _post(served, path, body, **kw):
    status, headers, data = request(served.port, "POST", path, body, **kw)
    return status, json.loads(data) if headers.get("content-type", "").startswith("application/json") else data


def test_batch_gives_each_conversation_its_own_answer(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0)
    alone = [client.chat.completions.create(model="tiny", messages=c, max_tokens=6, temperature=0)
             for c in CONVERSATIONS]
    status, body = _post(served, "/v1/chat/completions/batch",
                         {"model": "tiny", "messages": CONVERSATIONS, "max_tokens": 6, "temperature": 0})
    assert status == 200 and body["object"] == "chat.completion"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in body["choices"]] == [a.choices[0].message.content for a in alone]
    assert len(set(c["message"]["content"] for c in body["choices"])) == 3
    assert body["usage"]["prompt_tokens"] == sum(a.usage.prompt_tokens for a in alone)
    assert body["usage"]["completion_tokens"] == 18
    # without max_tokens every conversation still fits: the batch takes the least room left
    status, body = _post(served, "/v1/chat/completions/batch", {"messages": CONVERSATIONS[:2], "max_tokens": 3})
    assert status == 200 and len(body["choices"]) == 2


@pytest.mark.parametrize("body,param", [
    ({"messages": CONVERSATIONS, "stream": True}, "stream"),
    ({"messages": CONVERSATIONS, "n": 2}, "n"),
    ({"messages": CONVERSATIONS, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"messages": [{"role": "user", "content": "not a list of conversations"}]}, "messages"),
    ({"messages": [[]]}, "messages"),
    ({"messages": [[{"role": "user", "content": "ok"}], [{"role": "wizard", "content": "x"}]]}, "messages[1][0].role"),
    ({"messages": CONVERSATIONS, "max_tokens": 10 ** 6}, "max_tokens"),
])
def test_batch_refuses_what_vllm_refuses(served, body, param):
    status, data = _post(served, "/v1/chat/completions/batch", body)
    assert status == 400 and data["error"]["param"] == param, data


def test_invocations_route_by_the_body_shape(served):
    chat = {"messages": CONVERSATIONS[1], "max_tokens": 5, "temperature": 0}
    assert _post(served, "/invocations", chat)[1]["choices"] == \
        _post(served, "/v1/chat/completions", chat)[1]["choices"]
    completion = {"prompt": "Once upon", "max_tokens": 5, "temperature": 0}
    got = _post(served, "/invocations", completion)[1]
    assert got["object"] == "text_completion"
    assert got["choices"] == _post(served, "/v1/completions", completion)[1]["choices"]
    batch = {"messages": CONVERSATIONS, "max_tokens": 4, "temperature": 0}
    assert _post(served, "/invocations", batch)[1]["choices"] == \
        _post(served, "/v1/chat/completions/batch", batch)[1]["choices"]
    status, data = _post(served, "/invocations", {**chat, "stream": True})
    assert status == 200 and data.endswith(b"data: [DONE]\n\n")
    for bad in ({"max_tokens": 3}, {"prompt": "x", "messages": CONVERSATIONS[0]}, {"input": "x"}):
        status, data = _post(served, "/invocations", bad)
        assert status == 400 and error_of(json.dumps(data).encode())["type"] == "invalid_request_error"
    assert _post(served, "/invocations", {"messages": [{"role": "user", "content": "still serving"}]})[0] == 200


def test_ping_and_the_key():
    s = start_server(api_key="sekret")
    try:
        assert request(s.port, "GET", "/ping")[0] == 200 and request(s.port, "POST", "/ping")[0] == 200
        body = {"messages": CONVERSATIONS, "max_tokens": 2}
        for path in ("/v1/chat/completions/batch", "/invocations"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
                status, _, data = request(s.port, "POST", path, body, headers=headers)
                assert status == 401 and error_of(data)["type"] == "authentication_error"
            assert request(s.port, "POST", path, body, headers={"Authorization": "Bearer sekret"})[0] == 200
            assert request(s.port, "POST", path, body, headers={"x-api-key": "sekret"})[0] == 200
    finally:
        stop_server(s)
