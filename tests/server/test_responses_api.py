"""OpenAI's Responses API through the official openai client over real HTTP on 127.0.0.1:
a tiny random Qwen2 on the real engine with a Qwen-style tool template (text streamed and not,
a function call forced by tool_choice and its output sent back with previous_response_id,
json_schema text format), and the fake model runner for the store (bounds, ttl, store false),
background polling and cancel, reasoning items, malformed bodies and the API key."""
from __future__ import annotations

import contextlib
import json
import time

import jsonschema
import openai
import pytest

from .conftest import error_of, request, serving, start_server, stop_server
from .fake_model import ScriptedRunner
from .test_hardening import scripted_server
from .test_tool_calls import TOOL_TEMPLATE
from .test_tool_choice import WEATHER

FLAT_WEATHER = {"type": "function", **WEATHER["function"]}
ANSWER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "rank": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["city", "rank"], "additionalProperties": False}


class Recording:
    """An engine that remembers the prompt text of every request it is given."""

    def __init__(self, engine):
        self.engine, self.prompts = engine, []

    def add_request(self, request_id, prompt_token_ids, sampling_params, prompt=None, **kwargs):
        self.prompts.append(prompt)
        return self.engine.add_request(request_id, prompt_token_ids, sampling_params, prompt=prompt, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@contextlib.contextmanager
def recording_qwen_server(tiny_checkpoint):
    """(server, Recording engine): a tiny random Qwen2 checkpoint on the real engine (fp32), served
    with the Qwen-style tool template; every prompt the server renders is kept."""
    from lite_llm.llm import build_async_engine
    path = tiny_checkpoint("qwen2", max_position_embeddings=1024)
    engine, tokenizer, info = build_async_engine(model=str(path), max_model_len=1024, kv_cache_space=0.05,
                                                 max_num_seqs=4, dtype="float32")
    engine = Recording(engine)
    with serving(engine, tokenizer, info, "tiny-qwen", chat_template=TOOL_TEMPLATE) as server:
        yield server, engine


@pytest.fixture(scope="module")
def qwen(tiny_checkpoint):
    with recording_qwen_server(tiny_checkpoint) as served:
        yield served


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def _collect(stream) -> tuple[list, dict]:
    events = list(stream)
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events, events[-1].response


def test_text_streamed_and_not_agree(qwen):
    server, _ = qwen
    client = _client(server)
    kw = dict(model="tiny-qwen", input="Tell me a story.", instructions="Be brief.", max_output_tokens=12,
              temperature=0)
    whole = client.responses.create(**kw)
    assert whole.object == "response" and whole.status in ("completed", "incomplete")
    assert whole.output[0].type == "message" and whole.output_text
    usage = whole.usage
    assert usage.output_tokens <= 12 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert (whole.status == "incomplete") == (whole.usage.output_tokens == 12)
    events, final = _collect(client.responses.create(**kw, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    assert deltas == done[0] == whole.output_text
    assert events[-1].type == f"response.{whole.status}" and final.output_text == whole.output_text
    kinds = [e.type for e in events]
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta") \
        < kinds.index("response.output_item.done")
    assert client.responses.retrieve(final.id).output_text == whole.output_text      # streamed ones are stored too


def test_forced_function_call_round_trips_through_previous_response_id(qwen):
    server, engine = qwen
    client = _client(server)
    first = client.responses.create(model="tiny-qwen", input="Weather in Oslo?", tools=[FLAT_WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=200,
                                    temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    second = client.responses.create(
        model="tiny-qwen", previous_response_id=first.id, tools=[FLAT_WEATHER], max_output_tokens=6, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp_c": 4}'}])
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    prompt = engine.prompts[-1]
    assert "<|im_start|>user\nWeather in Oslo?<|im_end|>" in prompt
    call = json.dumps(args, ensure_ascii=False)
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {call}}}\n</tool_call>' in prompt
    assert prompt.index("Weather in Oslo?") < prompt.index("<tool_call>") < prompt.index(
        '<tool_response>\n{"temp_c": 4}\n</tool_response>')
    # the same call streamed: its arguments arrive as deltas of the function_call item
    events, final = _collect(client.responses.create(
        model="tiny-qwen", input="Weather in Oslo?", tools=[FLAT_WEATHER], max_output_tokens=200, temperature=0,
        tool_choice={"type": "function", "name": "get_weather"}, stream=True))
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(streamed) == args and done[0].arguments == streamed
    assert [o.arguments for o in final.output if o.type == "function_call"] == [streamed]


def test_previous_response_id_continues_the_conversation(qwen):
    server, engine = qwen
    client = _client(server)
    first = client.responses.create(model="tiny-qwen", input="My name is Ada.", instructions="Answer in French.",
                                    max_output_tokens=5, temperature=0)
    second = client.responses.create(model="tiny-qwen", input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=5, temperature=0)
    prompt = engine.prompts[-1]
    assert (f"<|im_start|>user\nMy name is Ada.<|im_end|>\n<|im_start|>assistant\n{first.output_text}<|im_end|>\n"
            f"<|im_start|>user\nWhat is my name?<|im_end|>") in prompt
    assert "Answer in French." not in prompt           # instructions are not carried over (as OpenAI's)
    assert second.usage.input_tokens > first.usage.input_tokens - 5 + first.usage.output_tokens
    third = client.responses.create(model="tiny-qwen", input="And again?", previous_response_id=second.id,
                                    max_output_tokens=3, temperature=0)
    assert third.status in ("completed", "incomplete")
    assert engine.prompts[-1].index("My name is Ada.") < engine.prompts[-1].index("What is my name?") \
        < engine.prompts[-1].index("And again?")


def test_json_schema_text_format(qwen):
    server, _ = qwen
    client = _client(server)
    fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
    for seed_text in ("Where?", "Rank it."):
        r = client.responses.create(model="tiny-qwen", input=seed_text, text={"format": fmt}, max_output_tokens=200,
                                    temperature=1.0)
        assert r.status == "completed"
        jsonschema.validate(json.loads(r.output_text), ANSWER)
        assert r.text.format.type == "json_schema"


# ---- the fake model runner: store, background, reasoning, errors -------------------------------

@pytest.fixture(scope="module")
def fake():
    s = start_server(engine_overrides={"step_seconds": 0.002}, responses_store_max=3)
    yield s
    stop_server(s)


def test_store_false_and_unknown_ids_are_404(fake):
    client = _client(fake)
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=3, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="tiny", input="Hi", previous_response_id=r.id)
    assert e.value.body["code"] == "previous_response_not_found" and e.value.body["param"] == "previous_response_id"


def test_store_keeps_at_most_its_bound_and_forgets_on_delete(fake):
    client = _client(fake)
    ids = [client.responses.create(model="tiny", input=f"Hi {i}", max_output_tokens=2).id for i in range(4)]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])               # the oldest went first
    assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
    client.responses.delete(ids[1])
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[1])


def test_store_ttl():
    s = start_server(engine_overrides={"step_seconds": 0.001}, responses_store_ttl=0.3)
    try:
        client = _client(s)
        rid = client.responses.create(model="tiny", input="Hi", max_output_tokens=2).id
        assert client.responses.retrieve(rid).id == rid
        time.sleep(0.5)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(rid)
    finally:
        stop_server(s)


def test_background_is_polled_and_matches_the_foreground_answer(fake):
    client = _client(fake)
    kw = dict(model="tiny", input="Background please", max_output_tokens=20, temperature=0)
    queued = client.responses.create(**kw, background=True)
    assert queued.background is True and queued.status in ("queued", "in_progress")
    deadline = time.monotonic() + 30
    while (polled := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert polled.status == "incomplete" and polled.usage.output_tokens == 20
    assert polled.output_text == client.responses.create(**kw).output_text
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(polled.id)               # finished: nothing to cancel


def test_cancel_stops_a_background_response():
    s = start_server(engine_overrides={"step_seconds": 0.02})
    try:
        client = _client(s)
        queued = client.responses.create(model="tiny", input="Long", max_output_tokens=400, background=True)
        time.sleep(0.2)
        cancelled = client.responses.cancel(queued.id)
        assert cancelled.status == "cancelled"
        assert any(rid.startswith(queued.id) for rid in s.engine.aborted)
        assert client.responses.retrieve(queued.id).status == "cancelled"
        assert cancelled.usage is None and len(cancelled.output_text) < 400
        fg = client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
        with pytest.raises(openai.BadRequestError):
            client.responses.cancel(fg.id)               # only background responses
    finally:
        stop_server(s)


def test_reasoning_items_whole_and_streamed():
    with scripted_server(reasoning_parser="qwen3") as (server, tok):
        client = _client(server)
        n = len(tok.encode(ScriptedRunner.script, add_special_tokens=False))
        r = client.responses.create(model="tiny", input="Hi", max_output_tokens=n, temperature=0,
                                    reasoning={"effort": "low"})
        assert [o.type for o in r.output] == ["reasoning", "message"]
        assert r.output[0].content[0].text == "I should greet." and r.output_text == "Hello there!"
        assert r.reasoning.effort == "low"
        events, final = _collect(client.responses.create(model="tiny", input="Hi", max_output_tokens=n,
                                                         temperature=0, stream=True))
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "I should greet."
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello there!"
        assert [o.type for o in final.output] == ["reasoning", "message"]
        # the reasoning item goes back in as the assistant turn's reasoning
        again = client.responses.create(model="tiny", input="More", previous_response_id=r.id,
                                        max_output_tokens=2, temperature=0)
        assert again.status == "incomplete"


@pytest.mark.parametrize("body,param", [
    ({"model": "tiny"}, "input"),
    ({"model": "tiny", "input": []}, "input"),
    ({"model": "tiny", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"model": "tiny", "input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"model": "tiny", "input": "x", "bogus": 1}, "bogus"),
    ({"model": "tiny", "input": "x", "background": True, "store": False}, "background"),
    ({"model": "tiny", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "tiny", "input": "x", "max_output_tokens": 100000}, "max_output_tokens"),
    ({"model": "tiny", "input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id"),
    ({"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"model": "tiny", "input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"model": "tiny", "input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
])
def test_malformed_bodies_get_openai_errors(fake, body, param):
    status, _, data = request(fake.port, "POST", "/v1/responses", body)
    err = error_of(data)
    assert status == 400 and err["type"] == "invalid_request_error" and err["param"] == param, err


def test_unknown_model_and_routes(fake):
    status, _, data = request(fake.port, "POST", "/v1/responses", {"model": "nope", "input": "x"})
    assert status == 404 and error_of(data)["code"] == "model_not_found"
    status, _, data = request(fake.port, "GET", "/v1/responses/resp_nope")
    assert status == 404 and error_of(data)["type"] == "not_found_error"
    assert request(fake.port, "PUT", "/v1/responses/resp_nope")[0] == 405
    status, _, data = request(fake.port, "POST", "/v1/responses", raw=b"{not json")
    assert status == 400 and error_of(data)["type"] == "invalid_request_error"
    assert request(fake.port, "GET", "/health")[0] == 200
    again = _client(fake).responses.create(model="tiny", input="still serving", max_output_tokens=2)
    assert again.status == "incomplete"


def test_key_is_required_on_every_responses_route():
    s = start_server(api_key="sekret")
    try:
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        rid = ok.responses.create(model="tiny", input="Hi", max_output_tokens=2).id
        for method, path, body in (("POST", "/v1/responses", {"model": "tiny", "input": "x"}),
                                   ("GET", f"/v1/responses/{rid}", None), ("DELETE", f"/v1/responses/{rid}", None),
                                   ("POST", f"/v1/responses/{rid}/cancel", None)):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                status, _, data = request(s.port, method, path, body, headers=headers)
                assert status == 401 and error_of(data)["type"] == "authentication_error", (method, path)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).responses.retrieve(rid)
        assert ok.responses.retrieve(rid).id == rid
    finally:
        stop_server(s)


def test_openapi_schemas_cover_every_accepted_field():
    from lite_llm.server import anthropic as messages_api
    from lite_llm.server import responses
    from lite_llm.server.openapi import SCHEMAS
    assert responses.FIELDS - responses._UNSUPPORTED == set(SCHEMAS["ResponsesRequest"]["properties"])
    assert messages_api.FIELDS == set(SCHEMAS["MessagesRequest"]["properties"])
    assert messages_api.COUNT_FIELDS == set(SCHEMAS["CountTokensRequest"]["properties"])


def test_background_needs_the_store():
    s = start_server(responses_store_max=0)
    try:
        client = _client(s)
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="tiny", input="Hi", background=True)
        rid = client.responses.create(model="tiny", input="Hi", max_output_tokens=2).id     # store: kept nowhere
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(rid)
    finally:
        stop_server(s)


def test_text_then_a_parsed_call_whole_and_streamed():
    from .test_tool_calls import TOOLS as CHAT_TOOLS
    from .test_tool_calls import ToolRunner, scripted_tool_server
    with scripted_tool_server() as (server, tok):
        client = _client(server)
        kw = dict(model="tiny", input="Weather in Paris?", tools=[{"type": "function", **CHAT_TOOLS[0]["function"]}],
                  temperature=0, max_output_tokens=len(tok.encode(ToolRunner.script, add_special_tokens=False)) - 1)
        r = client.responses.create(**kw)          # tool_choice auto: the call is parsed from the text
        assert [o.type for o in r.output] == ["message", "function_call"]
        assert r.output[0].content[0].text.strip() == "Let me check."
        assert (r.output[1].name, json.loads(r.output[1].arguments)) == ("get_weather", {"city": "Paris"})
        events, final = _collect(client.responses.create(**kw, stream=True))
        assert [e.item.type for e in events if e.type == "response.output_item.added"] == ["message", "function_call"]
        assert json.loads("".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")) \
            == {"city": "Paris"}
        assert [o.type for o in final.output] == ["message", "function_call"]


@pytest.mark.parametrize("flag", [["--responses-store-max", "-1"], ["--responses-store-ttl", "0"]])
def test_bad_store_flags_stop_serve_before_loading(flag):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "lite_llm", "serve", "--port", "0", *flag], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "--responses-store-max must be >= 0" in proc.stderr
