"""The openai SDK as its documentation uses an OpenAI-compatible base URL: Chat Completions
(create, stream, the `chat.completions.stream()` helper, `parse` with Pydantic models, tools
auto / required / named and a round trip) and Responses (create, the `responses.stream()`
helper, `parse`, function calls and their outputs), against answers the test wrote."""
from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from tests.server.conftest import CHATML

from .conftest import (COMMON_BOOK, HELLO, MODEL, PARIS, RESULT, WEATHER_PARAMS,
                       WEATHER_RESULT, book_server, call, tokens_of)

BOOK = {**COMMON_BOOK,
    "Weather in Paris and Rome": call("get_weather", PARIS) + "\n" + call("get_weather", {"city": "Rome"}),
    "Weather, with units": call("get_weather", {"city": "Paris", "units": "metric"}),
    "Weather, whatever the format": '[{"name": "get_weather", "parameters": {"city": "Paris"}}]',
    "Describe Ada fully": '{"name": "Ada", "age": 36, "email": "ada@example.com"}',
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": WEATHER_PARAMS}}
RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                     "parameters": WEATHER_PARAMS}


class Person(BaseModel):
    name: str
    age: int


class GetWeather(BaseModel):
    """Current weather in a city"""
    city: str


@pytest.fixture(scope="module")
def client():
    # trusted request templates: one test sends a template that shows no tool call format
    with book_server(BOOK, trust_request_chat_template=True) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


# ---- Chat Completions ----------------------------------------------------------------------

def test_chat_create(client):
    out = client.chat.completions.create(model=MODEL, messages=user("Say hello"))
    choice = out.choices[0]
    assert (choice.message.content, choice.finish_reason, choice.message.role) == (HELLO, "stop", "assistant")
    assert out.model == MODEL and out.object == "chat.completion"
    assert out.usage.completion_tokens >= tokens_of(HELLO)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_stream_iterates_deltas_and_usage(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=user("Say hello"), stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == HELLO and finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= tokens_of(HELLO)
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_continuous_usage_stats(client):
    """vLLM's extension (guidellm's default body): usage on every chunk, counting up."""
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=user("Say hello"), stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == HELLO
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] >= tokens_of(HELLO)
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}


def test_chat_stream_helper_snapshots(client):
    deltas, snapshots = [], []
    with client.chat.completions.stream(model=MODEL, messages=user("Say hello")) as stream:
        for event in stream:
            if event.type == "content.delta":
                deltas.append(event.delta)
                snapshots.append(event.snapshot)
        final = stream.get_final_completion()
    assert "".join(deltas) == HELLO and snapshots[-1] == HELLO
    assert all(s == "".join(deltas[:i + 1]) for i, s in enumerate(snapshots))
    assert final.choices[0].message.content == HELLO and final.choices[0].finish_reason == "stop"


def test_chat_parse_into_a_pydantic_model(client):
    out = client.chat.completions.parse(model=MODEL, messages=user("Who is Ada?"), response_format=Person)
    message = out.choices[0].message
    assert message.parsed == Person(name="Ada", age=36) and out.choices[0].finish_reason == "stop"


def test_chat_stream_helper_parses_the_model(client):
    with client.chat.completions.stream(model=MODEL, messages=user("Who is Ada?"), response_format=Person) as stream:
        done = [e for e in stream if e.type == "content.done"]
        final = stream.get_final_completion()
    assert [e.parsed for e in done] == [Person(name="Ada", age=36)]
    assert final.choices[0].message.parsed == Person(name="Ada", age=36)


@pytest.mark.parametrize("closed", [True, False])
def test_strict_json_schema_admits_only_declared_keys(client, closed):
    """strict: every object closed (additionalProperties false) even where the schema leaves it
    open, as OpenAI's strict mode; the answer tries a third key. (closed: the schema says so
    itself, the control: the fake model keeps to what a grammar allows.)"""
    schema = Person.model_json_schema()
    assert "additionalProperties" not in schema
    if closed:
        schema["additionalProperties"] = False
    out = client.chat.completions.create(model=MODEL, messages=user("Describe Ada fully"), max_tokens=200,
                                         response_format={"type": "json_schema", "json_schema": {
                                             "name": "Person", "schema": schema, "strict": True}})
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"name", "age"} and value["name"] == "Ada"


def test_tool_call_auto(client):
    out = client.chat.completions.create(model=MODEL, messages=user("Weather in Paris?"), tools=[WEATHER])
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content.strip() == "Let me check."
    assert _calls(choice.message) == [("get_weather", PARIS)]
    assert choice.message.tool_calls[0].id and choice.message.tool_calls[0].type == "function"


def test_parallel_tool_calls_auto(client):
    out = client.chat.completions.create(model=MODEL, messages=user("Weather in Paris and Rome"), tools=[WEATHER])
    message = out.choices[0].message
    assert _calls(message) == [("get_weather", PARIS), ("get_weather", {"city": "Rome"})]
    assert len({c.id for c in message.tool_calls}) == 2 and out.choices[0].finish_reason == "tool_calls"


def test_tool_choice_required(client):
    out = client.chat.completions.create(model=MODEL, messages=user("Call the weather tool"), tools=[WEATHER],
                                         tool_choice="required")
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert _calls(choice.message) == [("get_weather", PARIS)]


def test_named_tool_choice_gives_exactly_one_call(client):
    out = client.chat.completions.create(model=MODEL, messages=user("Weather in Paris and Rome"), tools=[WEATHER],
                                         tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = out.choices[0]
    assert _calls(choice.message) == [("get_weather", PARIS)]
    assert choice.finish_reason == "stop" and not choice.message.content     # OpenAI's finish for a named choice


def test_strict_tool_admits_only_declared_arguments(client):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS, "strict": True}}
    out = client.chat.completions.create(model=MODEL, messages=user("Weather, with units"), tools=[tool],
                                         tool_choice="required", max_tokens=200)
    calls = _calls(out.choices[0].message)
    assert [name for name, _ in calls] == ["get_weather"] and set(calls[0][1]) == {"city"}


def test_tool_call_round_trip(client):
    messages = user("Weather in Paris?")
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER]).choices[0].message
    (tool_call,) = first.tool_calls
    messages += [first.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": tool_call.id, "content": WEATHER_RESULT}]
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    assert out.choices[0].message.content == RESULT and out.choices[0].finish_reason == "stop"
    assert not out.choices[0].message.tool_calls


def test_parse_with_a_pydantic_function_tool(client):
    out = client.chat.completions.parse(model=MODEL, messages=user("Weather in Paris?"),
                                        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")])
    (tool_call,) = out.choices[0].message.tool_calls
    assert tool_call.function.parsed_arguments == GetWeather(city="Paris")


def test_stream_helper_tool_call_events(client):
    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")
    with client.chat.completions.stream(model=MODEL, messages=user("Weather in Paris?"), tools=[tool]) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert [(e.name, e.parsed_arguments) for e in done] == [("get_weather", GetWeather(city="Paris"))]
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert [c.function.parsed_arguments for c in message.tool_calls] == [GetWeather(city="Paris")]
    whole = client.chat.completions.create(model=MODEL, messages=user("Weather in Paris?"), tools=[WEATHER])
    assert message.content == whole.choices[0].message.content      # streamed or not, the same text


def test_raw_stream_tool_call_deltas(client):
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(model=MODEL, messages=user("Weather in Paris?"), tools=[WEATHER],
                                                stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = entry["id"] or tc.id
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert content.strip() == "Let me check." and finish == "tool_calls"
    assert [(e["name"], json.loads(e["arguments"])) for e in calls.values()] == [("get_weather", PARIS)]
    assert calls[0]["id"]


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_cut_by_max_tokens_is_no_text(client, tool_choice, stream):
    """A call cut off by max_tokens: never its markup as content; finish_reason "length"."""
    question = "Weather in Paris?" if tool_choice == "auto" else "Call the weather tool"
    answer = BOOK[question]
    cut = tokens_of(answer[:answer.index('"city"')])
    kw = {"model": MODEL, "messages": user(question), "tools": [WEATHER], "tool_choice": tool_choice,
          "max_tokens": cut}
    if stream:
        content, finish = "", None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                content += c.delta.content or ""
                finish = c.finish_reason or finish
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        content, finish = choice.message.content or "", choice.finish_reason
    assert finish == "length"
    assert "<tool_call" not in content and "get_weather" not in content
    assert content.strip() == ("Let me check." if tool_choice == "auto" else "")


@pytest.mark.parametrize("tool_choice,finish", [
    ("required", "tool_calls"), ({"type": "function", "function": {"name": "get_weather"}}, "stop")])
def test_forced_tool_call_needs_no_tool_call_parser(client, tool_choice, finish):
    """A template that shows no tool call format and no --tool-call-parser: a forced call is the
    server's own grammar, so it knows the format it forced (as vLLM answers it)."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
    out = client.chat.completions.create(model=MODEL, messages=user("Weather, whatever the format"), tools=[tool],
                                         tool_choice=tool_choice, max_tokens=200, extra_body={"chat_template": CHATML})
    choice = out.choices[0]
    ((name, arguments),) = _calls(choice.message)
    assert name == "get_weather" and set(arguments) == {"city"} and isinstance(arguments["city"], str)
    assert choice.finish_reason == finish and not choice.message.content


@pytest.mark.parametrize("stream", [False, True])
def test_second_call_cut_by_max_tokens(client, stream):
    """A whole call, then a second cut by max_tokens: finish_reason "length", the whole call
    kept, no markup as content."""
    answer = BOOK["Weather in Paris and Rome"]
    kw = {"model": MODEL, "messages": user("Weather in Paris and Rome"), "tools": [WEATHER],
          "tool_choice": "required", "max_tokens": tokens_of(answer[:answer.index("Rome")])}
    if stream:
        content, finish, names = "", None, []
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                content += c.delta.content or ""
                finish = c.finish_reason or finish
                names += [tc.function.name for tc in c.delta.tool_calls or [] if tc.function.name]
        assert names[:1] == ["get_weather"]
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        content, finish = choice.message.content or "", choice.finish_reason
        assert _calls(choice.message)[:1] == [("get_weather", PARIS)]
    assert finish == "length" and "<tool_call" not in content


# ---- Responses -------------------------------------------------------------------------------

def test_responses_create(client):
    out = client.responses.create(model=MODEL, input="Say hello")
    assert out.status == "completed" and out.output_text == HELLO
    (message,) = out.output
    assert message.type == "message" and [p.text for p in message.content] == [HELLO]
    assert out.usage.output_tokens >= tokens_of(HELLO)


def test_responses_stream_helper_snapshots(client):
    deltas, snapshots, types = [], [], []
    with client.responses.stream(model=MODEL, input="Say hello") as stream:
        for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
                snapshots.append(event.snapshot)
        final = stream.get_final_response()
    assert "".join(deltas) == HELLO
    assert all(s == "".join(deltas[:i + 1]) for i, s in enumerate(snapshots))
    assert final.output_text == HELLO and final.status == "completed"
    (message,) = final.output
    assert [p.text for p in message.content] == [HELLO]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert types.count("response.content_part.added") == 1 and types.count("response.output_item.added") == 1


def test_responses_stream_ends_incomplete_at_max_output_tokens(client):
    """Cut by max_output_tokens: the stream ends with response.incomplete (reason
    max_output_tokens), the text so far in its snapshot; no response.completed."""
    limit = tokens_of("Hello there!")
    deltas, snapshots, types, last = [], [], [], None
    with client.responses.stream(model=MODEL, input="Say hello", max_output_tokens=limit) as stream:
        for event in stream:
            last = event
            types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
                snapshots.append(event.snapshot)
    text = "".join(deltas)
    assert text == "Hello there!" and snapshots[-1] == text
    assert last.type == "response.incomplete" and "response.completed" not in types
    assert last.response.status == "incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output_text == text
    assert [item.status for item in last.response.output] == ["incomplete"]     # the message was cut too


def test_responses_create_incomplete_at_max_output_tokens(client):
    out = client.responses.create(model=MODEL, input="Say hello", max_output_tokens=tokens_of("Hello there!"))
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.output_text == "Hello there!"
    assert [item.status for item in out.output] == ["incomplete"]        # as OpenAI marks the cut item


def test_responses_function_call_cut_by_max_output_tokens_is_no_text(client):
    answer = BOOK["Call the weather tool"]
    out = client.responses.create(model=MODEL, input="Call the weather tool", tools=[RESPONSES_WEATHER],
                                  tool_choice="required", max_output_tokens=tokens_of(answer[:answer.index('"city"')]))
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert "<tool_call" not in out.output_text and "get_weather" not in out.output_text


def test_responses_parse_into_a_pydantic_model(client):
    out = client.responses.parse(model=MODEL, input="Who is Ada?", text_format=Person)
    assert out.output_parsed == Person(name="Ada", age=36)


def test_responses_function_call_round_trip(client):
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[RESPONSES_WEATHER])
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", PARIS)]
    assert calls[0].call_id and first.output_text.strip() == "Let me check."
    history = [{"role": "user", "content": "Weather in Paris?"},
               *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": WEATHER_RESULT}]
    final = client.responses.create(model=MODEL, input=history, tools=[RESPONSES_WEATHER])
    assert final.output_text == RESULT and not [i for i in final.output if i.type == "function_call"]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_responses_forced_function_call(client, tool_choice):
    out = client.responses.create(model=MODEL, input="Weather in Paris and Rome", tools=[RESPONSES_WEATHER],
                                  tool_choice=tool_choice, parallel_tool_calls=False)
    calls = [(i.name, json.loads(i.arguments)) for i in out.output if i.type == "function_call"]
    assert calls == [("get_weather", PARIS)] and out.status == "completed"


def test_responses_stream_helper_function_call(client):
    with client.responses.stream(model=MODEL, input="Call the weather tool", tools=[RESPONSES_WEATHER],
                                 tool_choice="required") as stream:
        done = [e for e in stream if e.type == "response.function_call_arguments.done"]
        final = stream.get_final_response()
    assert [json.loads(e.arguments) for e in done] == [PARIS]
    (item,) = final.output
    assert item.type == "function_call" and item.name == "get_weather" and json.loads(item.arguments) == PARIS
