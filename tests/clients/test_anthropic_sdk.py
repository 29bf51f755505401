"""The anthropic SDK on /v1/messages as its documentation calls a compatible base URL:
messages.create, the messages.stream() helper (text_stream, snapshots, the final message),
messages.parse with a Pydantic model, tools with tool_choice auto / any / a named tool, and a
tool_use -> tool_result round trip, against answers the test wrote."""
from __future__ import annotations

import anthropic
import pytest
from pydantic import BaseModel

from .conftest import (COMMON_BOOK, HELLO, MODEL, PARIS, RESULT, WEATHER_PARAMS,
                       WEATHER_RESULT, book_server, call, tokens_of)

BOOK = {**COMMON_BOOK,
    "Weather in Paris and Rome": call("get_weather", PARIS) + "\n" + call("get_weather", {"city": "Rome"}),
}
WEATHER = {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_PARAMS}


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def client():
    with book_server(BOOK) as server:
        yield anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _final_message(client, stream: bool, **kw):
    """The answer as the SDK gives it: the stream helper's final message, or create()'s."""
    if stream:
        with client.messages.stream(**kw) as s:
            return s.get_final_message()
    return client.messages.create(**kw)


def _blocks(message) -> list[tuple]:
    """The content blocks, text stripped (test_stream_helper_tool_use holds streamed and whole
    texts to one another, whitespace included)."""
    return [(b.type, b.text.strip()) if b.type == "text" else (b.type, b.name, b.input) for b in message.content]


def test_messages_create(client):
    out = client.messages.create(model=MODEL, max_tokens=200, messages=user("Say hello"))
    assert _blocks(out) == [("text", HELLO)] and out.stop_reason == "end_turn"
    assert out.role == "assistant" and out.type == "message" and out.model == MODEL
    assert out.usage.output_tokens >= tokens_of(HELLO)


def test_count_tokens_matches_the_usage(client):
    messages = user("Weather in Paris?")
    counted = client.messages.count_tokens(model=MODEL, messages=messages, tools=[WEATHER])
    out = client.messages.create(model=MODEL, max_tokens=200, messages=messages, tools=[WEATHER])
    assert counted.input_tokens == out.usage.input_tokens > 0


def test_messages_create_stops_at_max_tokens(client):
    out = client.messages.create(model=MODEL, max_tokens=tokens_of("Hello there!"), messages=user("Say hello"))
    assert _blocks(out) == [("text", "Hello there!")] and out.stop_reason == "max_tokens"


def test_messages_stream_helper(client):
    pieces, snapshots = [], []
    with client.messages.stream(model=MODEL, max_tokens=200, messages=user("Say hello")) as stream:
        for text in stream.text_stream:
            pieces.append(text)
            snapshots.append(stream.current_message_snapshot.content[0].text)
        final = stream.get_final_message()
    assert "".join(pieces) == HELLO
    assert all(s == "".join(pieces[:i + 1]) for i, s in enumerate(snapshots))
    assert _blocks(final) == [("text", HELLO)] and final.stop_reason == "end_turn"
    assert final.usage.output_tokens >= tokens_of(HELLO)


def test_messages_parse_into_a_pydantic_model(client):
    out = client.messages.parse(model=MODEL, max_tokens=200, messages=user("Who is Ada?"), output_format=Person)
    assert out.parsed_output == Person(name="Ada", age=36) and out.stop_reason == "end_turn"


def test_tool_use_auto(client):
    out = client.messages.create(model=MODEL, max_tokens=200, messages=user("Weather in Paris?"), tools=[WEATHER])
    assert _blocks(out) == [("text", "Let me check."), ("tool_use", "get_weather", PARIS)]
    assert out.stop_reason == "tool_use" and out.content[1].id


def test_parallel_tool_use(client):
    out = client.messages.create(model=MODEL, max_tokens=300, messages=user("Weather in Paris and Rome"),
                                 tools=[WEATHER])
    assert _blocks(out) == [("tool_use", "get_weather", PARIS), ("tool_use", "get_weather", {"city": "Rome"})]
    assert len({b.id for b in out.content}) == 2 and out.stop_reason == "tool_use"


@pytest.mark.parametrize("tool_choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_use(client, tool_choice):
    out = client.messages.create(model=MODEL, max_tokens=300, messages=user("Call the weather tool"), tools=[WEATHER],
                                 tool_choice=tool_choice)
    assert _blocks(out) == [("tool_use", "get_weather", PARIS)] and out.stop_reason == "tool_use"


def test_named_tool_choice_gives_exactly_one_call(client):
    out = client.messages.create(model=MODEL, max_tokens=300, messages=user("Weather in Paris and Rome"),
                                 tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    assert _blocks(out) == [("tool_use", "get_weather", PARIS)]


def test_tool_use_round_trip(client):
    messages = user("Weather in Paris?")
    first = client.messages.create(model=MODEL, max_tokens=200, messages=messages, tools=[WEATHER])
    (tool_use,) = [b for b in first.content if b.type == "tool_use"]
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                               "content": WEATHER_RESULT}]}]
    out = client.messages.create(model=MODEL, max_tokens=200, messages=messages, tools=[WEATHER])
    assert _blocks(out) == [("text", RESULT)] and out.stop_reason == "end_turn"


def test_stream_helper_tool_use(client):
    with client.messages.stream(model=MODEL, max_tokens=200, messages=user("Weather in Paris?"),
                                tools=[WEATHER]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    whole = client.messages.create(model=MODEL, max_tokens=200, messages=user("Weather in Paris?"), tools=[WEATHER])
    assert _blocks(final) == [("text", "Let me check."), ("tool_use", "get_weather", PARIS)]
    assert [b.text for b in final.content if b.type == "text"] == [b.text for b in whole.content if b.type == "text"]
    assert final.stop_reason == "tool_use" and "input_json" in kinds


@pytest.mark.parametrize("tool_choice", [{"type": "auto"}, {"type": "any"}])
@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_cut_by_max_tokens(client, tool_choice, stream):
    """Cut inside a call: stop_reason max_tokens, and the call's markup is never a text block."""
    question = "Weather in Paris?" if tool_choice["type"] == "auto" else "Call the weather tool"
    answer = BOOK[question]
    kw = {"model": MODEL, "max_tokens": tokens_of(answer[:answer.index('"city"')]), "messages": user(question),
          "tools": [WEATHER], "tool_choice": tool_choice}
    out = _final_message(client, stream, **kw)
    assert out.stop_reason == "max_tokens"
    text = "".join(b.text for b in out.content if b.type == "text")
    assert "<tool_call" not in text and "get_weather" not in text
    assert text.strip() == ("Let me check." if tool_choice["type"] == "auto" else "")


@pytest.mark.parametrize("stream", [False, True])
def test_second_call_cut_by_max_tokens(client, stream):
    """A whole call, then a second cut by max_tokens: stop_reason max_tokens (not tool_use), the
    whole call kept, no markup as text."""
    answer = BOOK["Weather in Paris and Rome"]
    kw = {"model": MODEL, "max_tokens": tokens_of(answer[:answer.index("Rome")]),
          "messages": user("Weather in Paris and Rome"), "tools": [WEATHER], "tool_choice": {"type": "any"}}
    out = _final_message(client, stream, **kw)
    assert out.stop_reason == "max_tokens"
    assert _blocks(out)[0] == ("tool_use", "get_weather", PARIS)
    assert not [b for b in out.content if b.type == "text" and "<tool_call" in b.text]
