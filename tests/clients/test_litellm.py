"""litellm's completion() on an OpenAI-compatible server, as its documentation calls one
(model "openai/<name>", api_base): plain, streamed (and rebuilt by stream_chunk_builder), a
Pydantic response_format, tools auto / required / named and a round trip, and litellm.responses(),
against answers the test wrote."""
from __future__ import annotations

import json

import litellm
import pytest
from pydantic import BaseModel

from .conftest import COMMON_BOOK, HELLO, MODEL, PARIS, RESULT, WEATHER_PARAMS, WEATHER_RESULT, book_server

BOOK = COMMON_BOOK
# litellm's own TypedDicts warn as pydantic builds their schemas
pytestmark = pytest.mark.filterwarnings("ignore:Items? .* using the .ReadOnly. qualifier:UserWarning")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": WEATHER_PARAMS}}


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def complete():
    """complete(question or messages, **kw): litellm.completion on this server."""
    with book_server(BOOK) as server:
        def run(messages, **kw):
            if isinstance(messages, str):
                messages = [{"role": "user", "content": messages}]
            return litellm.completion(model="openai/" + MODEL, api_base=server.url + "/v1", api_key="unused",
                                      messages=messages, num_retries=0, timeout=30, **kw)
        run.api_base = server.url + "/v1"
        yield run


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_completion(complete):
    out = complete("Say hello")
    assert out.choices[0].message.content == HELLO and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens > 0


def test_streamed_completion(complete):
    chunks = list(complete("Say hello", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == HELLO
    rebuilt = litellm.stream_chunk_builder(chunks)
    assert rebuilt.choices[0].message.content == HELLO and rebuilt.choices[0].finish_reason == "stop"


def test_pydantic_response_format(complete):
    out = complete("Who is Ada?", response_format=Person)
    assert Person.model_validate_json(out.choices[0].message.content) == Person(name="Ada", age=36)


def test_tool_call_auto(complete):
    out = complete("Weather in Paris?", tools=[WEATHER])
    assert _calls(out.choices[0].message) == [("get_weather", PARIS)]
    assert out.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_call_forced(complete, tool_choice):
    out = complete("Call the weather tool", tools=[WEATHER], tool_choice=tool_choice)
    assert _calls(out.choices[0].message) == [("get_weather", PARIS)] and not out.choices[0].message.content


def test_streamed_tool_call(complete):
    rebuilt = litellm.stream_chunk_builder(list(complete("Weather in Paris?", tools=[WEATHER], stream=True)))
    assert _calls(rebuilt.choices[0].message) == [("get_weather", PARIS)]
    assert rebuilt.choices[0].finish_reason == "tool_calls"


def test_tool_call_round_trip(complete):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = complete(messages, tools=[WEATHER]).choices[0].message
    messages.append(first.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": WEATHER_RESULT} for c in first.tool_calls]
    out = complete(messages, tools=[WEATHER])
    assert out.choices[0].message.content == RESULT and not out.choices[0].message.tool_calls


def test_responses(complete):
    out = litellm.responses(model="openai/" + MODEL, api_base=complete.api_base, api_key="unused", input="Say hello")
    texts = [part.text for item in out.output if item.type == "message" for part in item.content]
    assert texts == [HELLO] and out.status == "completed"
