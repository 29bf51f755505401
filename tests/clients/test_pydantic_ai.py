"""pydantic-ai's Agent on an OpenAI-compatible base URL (OpenAIProvider(base_url=...)), through
its chat and its responses model, as its documentation uses them: a plain run, a tool run once
and its result answered, Pydantic output types (the default output tool, NativeOutput's JSON
schema) and a streamed run, against answers the test wrote."""
from __future__ import annotations

import json

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from .conftest import ADA, COMMON_BOOK, HELLO, MODEL, RESULT, WEATHER_RESULT, book_server, call

BOOK = {**COMMON_BOOK,
    "Ada, by the output tool": call("final_result", json.loads(ADA)),
}
MODELS = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel}


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def url():
    with book_server(BOOK) as server:
        yield server.url + "/v1"


@pytest.fixture(params=sorted(MODELS))
def model(request, url):
    return MODELS[request.param](MODEL, provider=OpenAIProvider(base_url=url, api_key="unused"))


def test_plain_run(model):
    result = Agent(model).run_sync("Say hello")
    assert result.output == HELLO
    assert result.usage.output_tokens > 0


def test_tool_runs_once_and_its_result_is_answered(model):
    agent = Agent(model, instructions="You answer briefly.")
    cities = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        cities.append(city)
        return WEATHER_RESULT

    result = agent.run_sync("Weather in Paris?")
    assert result.output == RESULT and cities == ["Paris"]
    returns = [p for m in result.all_messages() for p in m.parts if p.part_kind == "tool-return"]
    assert [(p.tool_name, p.content) for p in returns] == [("get_weather", WEATHER_RESULT)]


def test_output_type_through_the_output_tool(model):
    result = Agent(model, output_type=Person).run_sync("Ada, by the output tool")
    assert result.output == Person(name="Ada", age=36)


def test_native_output_json_schema(model):
    result = Agent(model, output_type=NativeOutput(Person)).run_sync("Who is Ada?")
    assert result.output == Person(name="Ada", age=36)


def test_streamed_run(model):
    with Agent(model).run_stream_sync("Say hello") as result:
        deltas = list(result.stream_text(delta=True, debounce_by=None))
    assert "".join(deltas) == HELLO
