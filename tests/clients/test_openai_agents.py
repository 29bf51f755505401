"""openai-agents' Runner on an OpenAI-compatible base URL, through both of its OpenAI models
(OpenAIChatCompletionsModel and OpenAIResponsesModel), as its documentation sets up a custom
provider: a plain answer, a function tool run once and its result answered, tool_choice
"required", a Pydantic output_type, and a streamed run, against answers the test wrote."""
from __future__ import annotations

import asyncio

import openai
import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)
from openai.types.responses import ResponseTextDeltaEvent
from pydantic import BaseModel

from .conftest import COMMON_BOOK, HELLO, MODEL, RESULT, WEATHER_RESULT, book_server

BOOK = COMMON_BOOK
MODELS = {"chat": OpenAIChatCompletionsModel, "responses": OpenAIResponsesModel}
calls: list[str] = []          # the cities get_weather ran for


class Person(BaseModel):
    name: str
    age: int


@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    calls.append(city)
    return WEATHER_RESULT


@pytest.fixture(scope="module")
def url():
    set_tracing_disabled(True)
    with book_server(BOOK) as server:
        yield server.url + "/v1"


@pytest.fixture(params=sorted(MODELS))
def agent(request, url):
    """agent(**kw): an Agent on this server through the chat or the responses model."""
    calls.clear()

    def make(**kw) -> Agent:
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
        return Agent(name="assistant", instructions="You answer briefly.",
                     model=MODELS[request.param](model=MODEL, openai_client=client), **kw)
    return make


def test_plain_answer(agent):
    result = Runner.run_sync(agent(), "Say hello")
    assert result.final_output == HELLO


def test_tool_runs_once_and_its_result_is_answered(agent):
    result = Runner.run_sync(agent(tools=[get_weather]), "Weather in Paris?")
    assert result.final_output == RESULT and calls == ["Paris"]
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == 1 and kinds.count("tool_call_output_item") == 1
    assert kinds[-1] == "message_output_item"


def test_tool_choice_required_runs_the_tool_once(agent):
    result = Runner.run_sync(agent(tools=[get_weather], model_settings=ModelSettings(tool_choice="required")),
                             "Call the weather tool")
    assert calls == ["Paris"] and result.final_output == RESULT


def test_pydantic_output_type(agent):
    result = Runner.run_sync(agent(output_type=Person), "Who is Ada?")
    assert result.final_output == Person(name="Ada", age=36)


def test_streamed_run(agent):
    async def run():
        result = Runner.run_streamed(agent(), "Say hello")
        deltas = [e.data.delta async for e in result.stream_events()
                  if e.type == "raw_response_event" and isinstance(e.data, ResponseTextDeltaEvent)]
        return deltas, result.final_output

    deltas, final = asyncio.run(run())
    assert "".join(deltas) == final == HELLO
