"""langchain-openai's ChatOpenAI on an OpenAI-compatible base URL, as its documentation uses it:
invoke, stream, with_structured_output (json_schema, function_calling, json_mode), bind_tools
with tool_choice auto / "any" / a named tool, a ToolMessage round trip, and the Responses API
(use_responses_api), against answers the test wrote."""
from __future__ import annotations

import json

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from .conftest import ADA, COMMON_BOOK, HELLO, MODEL, PARIS, RESULT, WEATHER_RESULT, book_server, call

BOOK = {**COMMON_BOOK,
    "Ada, as a tool call": call("Person", json.loads(ADA)),
}


class Person(BaseModel):
    """A person"""
    name: str
    age: int


@tool
def get_weather(city: str) -> str:
    """Current weather in a city"""
    return WEATHER_RESULT


@pytest.fixture(scope="module")
def url():
    with book_server(BOOK) as server:
        yield server.url + "/v1"


def chat(url: str, **kw) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=url, api_key="unused", max_retries=0, timeout=30, **kw)


def test_invoke(url):
    msg = chat(url).invoke("Say hello")
    assert msg.content == HELLO and msg.response_metadata["finish_reason"] == "stop"
    assert msg.usage_metadata["output_tokens"] > 0


def test_stream(url):
    chunks = list(chat(url, stream_usage=True).stream("Say hello"))
    assert "".join(c.content for c in chunks) == HELLO
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert whole.content == HELLO and whole.response_metadata["finish_reason"] == "stop"
    assert whole.usage_metadata["output_tokens"] == chat(url).invoke("Say hello").usage_metadata["output_tokens"]


@pytest.mark.parametrize("method,question", [("json_schema", "Who is Ada?"), ("json_mode", "Who is Ada?"),
                                             ("function_calling", "Ada, as a tool call")])
def test_with_structured_output(url, method, question):
    assert chat(url).with_structured_output(Person, method=method).invoke(question) == Person(name="Ada", age=36)


def test_with_structured_output_include_raw(url):
    out = chat(url).with_structured_output(Person, include_raw=True).invoke("Who is Ada?")
    assert out["parsed"] == Person(name="Ada", age=36) and out["parsing_error"] is None
    assert out["raw"].content == ADA


def test_bind_tools_auto(url):
    msg = chat(url).bind_tools([get_weather]).invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather", PARIS)]
    assert msg.tool_calls[0]["id"] and msg.content.strip() == "Let me check."
    assert msg.response_metadata["finish_reason"] == "tool_calls" and not msg.invalid_tool_calls


@pytest.mark.parametrize("tool_choice", ["any", "required", "get_weather"])
def test_bind_tools_forced(url, tool_choice):
    msg = chat(url).bind_tools([get_weather], tool_choice=tool_choice).invoke("Call the weather tool")
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather", PARIS)]
    assert not msg.content and not msg.invalid_tool_calls


def test_streamed_tool_call_chunks(url):
    chunks = list(chat(url).bind_tools([get_weather]).stream("Weather in Paris?"))
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [("get_weather", PARIS)]
    assert not whole.invalid_tool_calls


def test_tool_message_round_trip(url):
    llm = chat(url).bind_tools([get_weather])
    messages = [HumanMessage("Weather in Paris?")]
    ai = llm.invoke(messages)
    messages.append(ai)
    for tool_call in ai.tool_calls:
        result = get_weather.invoke(tool_call)
        assert isinstance(result, ToolMessage) and result.tool_call_id == tool_call["id"]
        messages.append(result)
    final = llm.invoke(messages)
    assert final.content == RESULT and not final.tool_calls


def test_responses_api(url):
    llm = chat(url, use_responses_api=True)
    assert llm.invoke("Say hello").text == HELLO
    chunks = list(llm.stream("Say hello"))
    assert "".join(c.text for c in chunks) == HELLO
    msg = llm.bind_tools([get_weather]).invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather", PARIS)]
