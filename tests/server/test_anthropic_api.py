"""Anthropic's Messages API through the official anthropic client over real HTTP on 127.0.0.1:
a tiny random Qwen2 on the real engine with a Qwen-style tool template (text streamed and not, a
tool_use forced by tool_choice and its tool_result sent back, count_tokens against usage,
output_config's JSON schema), and the engine over a fake model runner for stop sequences, thinking
blocks, Anthropic's error shape, ping events and the key from x-api-key or Authorization."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from .conftest import request, start_server, stop_server
from .fake_model import ScriptedRunner
from .test_hardening import scripted_server
from .test_responses_api import ANSWER, recording_qwen_server
from .test_tool_choice import WEATHER

TOOL = {"name": "get_weather", "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}
GREEDY = {"temperature": 0}         # this SDK no longer sends sampling fields itself


@pytest.fixture(scope="module")
def qwen(tiny_checkpoint):
    with recording_qwen_server(tiny_checkpoint) as served:
        yield served


def _client(server, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, max_retries=0, timeout=60, **({"api_key": "x"} | kw))


def _streamed(events) -> tuple[list, dict]:
    """Raw stream events -> (their types, the content blocks they build)."""
    kinds, blocks, stop = [], {}, None
    for e in events:
        kinds.append(e.type)
        if e.type == "content_block_start":
            blocks[e.index] = e.content_block.model_dump()
            blocks[e.index]["partial"] = ""
        elif e.type == "content_block_delta":
            d = e.delta
            b = blocks[e.index]
            if d.type == "text_delta":
                b["text"] += d.text
            elif d.type == "thinking_delta":
                b["thinking"] += d.thinking
            elif d.type == "input_json_delta":
                b["partial"] += d.partial_json
        elif e.type == "message_delta":
            stop = (e.delta.stop_reason, e.delta.stop_sequence, e.usage.output_tokens)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    return kinds, {"blocks": [blocks[i] for i in sorted(blocks)], "stop": stop}


def test_text_streamed_and_not_agree(qwen):
    server, _ = qwen
    client = _client(server)
    kw = dict(model="tiny-qwen", max_tokens=10, system="Be brief.", extra_body=GREEDY,
              messages=[{"role": "user", "content": "Tell me a story."}])
    whole = client.messages.create(**kw)
    assert whole.type == "message" and whole.role == "assistant" and whole.content[0].type == "text"
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens <= 10
    assert (whole.stop_reason == "max_tokens") == (whole.usage.output_tokens == 10)
    kinds, got = _streamed(client.messages.create(**kw, stream=True))
    assert [b["text"] for b in got["blocks"]] == [whole.content[0].text]
    assert got["stop"] == (whole.stop_reason, None, whole.usage.output_tokens)
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1


def test_tool_use_round_trip_and_count_tokens(qwen):
    server, engine = qwen
    client = _client(server)
    question = {"role": "user", "content": "Weather in Oslo?"}
    first = client.messages.create(model="tiny-qwen", max_tokens=200, tools=[TOOL], extra_body=GREEDY,
                                   tool_choice={"type": "tool", "name": "get_weather"}, messages=[question])
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, TOOL["input_schema"])
    history = [question, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                             "content": '{"temp_c": 4}'}]}]
    second = client.messages.create(model="tiny-qwen", max_tokens=6, tools=[TOOL], system="Use tools.",
                                    messages=history, extra_body=GREEDY)
    prompt = engine.prompts[-1]
    args = json.dumps(uses[0].input, ensure_ascii=False)
    assert prompt.index("<|im_start|>system\nUse tools.") < prompt.index("Weather in Oslo?") \
        < prompt.index(f'<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>') \
        < prompt.index('<tool_response>\n{"temp_c": 4}\n</tool_response>')
    counted = client.messages.count_tokens(model="tiny-qwen", tools=[TOOL], system="Use tools.", messages=history)
    assert counted.input_tokens == second.usage.input_tokens
    assert client.messages.count_tokens(model="tiny-qwen", tools=[TOOL], messages=[question],
                                        tool_choice={"type": "tool", "name": "get_weather"}
                                        ).input_tokens == first.usage.input_tokens
    assert client.messages.count_tokens(model="tiny-qwen", messages=[question]).input_tokens \
        < first.usage.input_tokens                       # the tools are part of the prompt
    # streamed: the same call, its input as one JSON delta
    kinds, got = _streamed(client.messages.create(
        model="tiny-qwen", max_tokens=200, tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"},
        messages=[question], extra_body=GREEDY, stream=True))
    tool_blocks = [b for b in got["blocks"] if b["type"] == "tool_use"]
    assert len(tool_blocks) == 1 and json.loads(tool_blocks[0]["partial"]) == uses[0].input
    assert got["stop"][0] == "tool_use" and "ping" not in kinds      # (the SDK drops pings)


def test_output_config_json_schema(qwen):
    server, _ = qwen
    client = _client(server)
    for text in ("Where?", "Rank it."):
        m = client.messages.create(model="tiny-qwen", max_tokens=200, messages=[{"role": "user", "content": text}],
                                   output_config={"format": {"type": "json_schema", "schema": ANSWER}},
                                   extra_body={"temperature": 1.0})
        assert m.stop_reason == "end_turn"
        jsonschema.validate(json.loads(m.content[0].text), ANSWER)


# ---- the fake model runner -------------------------------------------------------------------

@pytest.fixture(scope="module")
def fake():
    s = start_server(engine_overrides={"step_seconds": 0.001})
    yield s
    stop_server(s)


def test_stop_sequences(fake):
    client = _client(fake)
    kw = dict(model="tiny", max_tokens=12, messages=[{"role": "user", "content": "Go"}], extra_body=GREEDY)
    text = client.messages.create(**kw).content[0].text
    stop = text[4:6]
    assert stop.strip()
    m = client.messages.create(**kw, stop_sequences=[stop])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    assert m.content[0].text == text[:text.index(stop)]
    _, got = _streamed(client.messages.create(**kw, stop_sequences=[stop], stream=True))
    assert got["stop"][:2] == ("stop_sequence", stop) and got["blocks"][0]["text"] == m.content[0].text


def test_raw_stream_has_ping_and_anthropic_event_lines(fake):
    status, headers, data = request(fake.port, "POST", "/v1/messages", {
        "model": "tiny", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [block.split("\n") for block in data.decode().strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
    for lines, name in zip(events, names):
        assert json.loads(lines[1].removeprefix("data: "))["type"] == name


def test_thinking_blocks_whole_and_streamed():
    with scripted_server(reasoning_parser="qwen3") as (server, tok):
        client = _client(server)
        n = len(tok.encode(ScriptedRunner.script, add_special_tokens=False))
        kw = dict(model="tiny", max_tokens=n, messages=[{"role": "user", "content": "Hi"}], extra_body=GREEDY,
                  thinking={"type": "enabled", "budget_tokens": 1024})
        m = client.messages.create(**kw)
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == "I should greet." and m.content[1].text == "Hello there!"
        kinds, got = _streamed(client.messages.create(**kw, stream=True))
        assert [(b["type"], b.get("thinking") or b.get("text")) for b in got["blocks"]] == \
            [("thinking", "I should greet."), ("text", "Hello there!")]
        # a thinking block sent back is the assistant turn's reasoning
        again = client.messages.create(model="tiny", max_tokens=2, extra_body=GREEDY, messages=[
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": m.content},
            {"role": "user", "content": "Again"}])
        assert again.usage.output_tokens == 2


def _anthropic_error(data: bytes) -> dict:
    body = json.loads(data)
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


@pytest.mark.parametrize("path,body", [
    ("/v1/messages", {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}),          # no max_tokens
    ("/v1/messages", {"model": "tiny", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 5, "messages": []}),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),          # no model
    ("/v1/messages", {"model": "tiny", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 5, "bogus": 1, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 5, "temperature": 1.5,
                      "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 5, "tools": [{"name": "x"}],
                      "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 5, "tool_choice": {"type": "any"},
                      "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages/count_tokens", {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages/count_tokens", {"model": "tiny"}),
])
def test_malformed_bodies_get_anthropic_errors(fake, path, body):
    status, _, data = request(fake.port, "POST", path, body)
    assert status == 400 and _anthropic_error(data)["type"] == "invalid_request_error", data


def test_other_errors_keep_anthropic_shape_and_the_server_serves_on(fake):
    status, _, data = request(fake.port, "POST", "/v1/messages", raw=b"{not json")
    assert status == 400 and _anthropic_error(data)["type"] == "invalid_request_error"
    status, _, data = request(fake.port, "POST", "/v1/messages", {
        "model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert status == 404 and _anthropic_error(data)["type"] == "not_found_error"
    status, _, data = request(fake.port, "GET", "/v1/messages")
    assert status == 405 and _anthropic_error(data)
    with pytest.raises(anthropic.BadRequestError):
        _client(fake).messages.create(model="tiny", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert request(fake.port, "GET", "/health")[0] == 200
    m = _client(fake).messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert m.usage.output_tokens == 2


def test_key_from_x_api_key_or_authorization():
    s = start_server(api_key="sekret")
    try:
        msg = [{"role": "user", "content": "Hi"}]
        ok = _client(s, api_key="sekret").messages.create(model="tiny", max_tokens=2, messages=msg)
        assert ok.usage.output_tokens == 2
        bearer = anthropic.Anthropic(base_url=s.url, auth_token="sekret", max_retries=0)
        assert bearer.messages.count_tokens(model="tiny", messages=msg).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError):
            _client(s, api_key="wrong").messages.create(model="tiny", max_tokens=2, messages=msg)
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
                status, _, data = request(s.port, "POST", path, {"model": "tiny", "max_tokens": 2, "messages": msg},
                                          headers=headers)
                assert status == 401 and _anthropic_error(data)["type"] == "authentication_error"
    finally:
        stop_server(s)


def test_text_then_a_parsed_tool_use_whole_and_streamed():
    from .test_tool_calls import ToolRunner, scripted_tool_server
    with scripted_tool_server() as (server, tok):
        client = _client(server)
        kw = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=GREEDY,
                  tools=[TOOL], max_tokens=len(tok.encode(ToolRunner.script, add_special_tokens=False)))
        m = client.messages.create(**kw)           # tool_choice auto: the call is parsed from the text
        assert [b.type for b in m.content] == ["text", "tool_use"] and m.stop_reason == "tool_use"
        assert m.content[0].text.strip() == "Let me check." and m.content[1].input == {"city": "Paris"}
        _, got = _streamed(client.messages.create(**kw, stream=True))
        assert [b["type"] for b in got["blocks"]] == ["text", "tool_use"] and got["stop"][0] == "tool_use"
        assert json.loads(got["blocks"][1]["partial"]) == {"city": "Paris"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["auto", "any"])
def test_max_tokens_is_the_stop_reason_even_after_a_whole_tool_use(stream, choice):
    from .fake_model import GuidedScriptedRunner
    from .test_tool_calls import CALL, TOOL_TEMPLATE, ToolRunner

    class CallRunner(GuidedScriptedRunner):       # what a forced grammar lets the model write
        script = CALL.replace('"Paris"', '"Paris", "unit": "celsius"') + "<|im_end|>"     # TOOL's schema

    runner = ToolRunner if choice == "auto" else CallRunner
    with scripted_server(runner, step_seconds=0.0005, chat_template=TOOL_TEMPLATE) as (server, tok):
        client = _client(server)
        n = len(tok.encode(runner.script, add_special_tokens=False))
        text = ["text"] if choice == "auto" else []
        for max_tokens, kinds in ((n, text + ["tool_use"]), (n - 1, text + ["tool_use"]), (n - 8, text)):
            kw = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=GREEDY,
                      tools=[TOOL], tool_choice={"type": choice}, max_tokens=max_tokens)
            if stream:
                _, got = _streamed(client.messages.create(**kw, stream=True))
                blocks, stop = got["blocks"], got["stop"][0]
            else:
                m = client.messages.create(**kw)
                blocks, stop = [b.model_dump() for b in m.content], m.stop_reason
            want = "tool_use" if max_tokens == n else "max_tokens"     # n: the answer ended by itself
            assert [b["type"] for b in blocks] == kinds and stop == want, (max_tokens, blocks, stop)
            assert "<tool_call" not in json.dumps(blocks)
