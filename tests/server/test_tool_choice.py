"""Forced tool calls (tool_choice "required" and a named function, through the grammar engine),
parallel_tool_calls, the Llama 3.x JSON and Mistral [TOOL_CALLS] parsers, the parser chosen
from the chat template; real engine over HTTP: the default model with two tools, and a tiny
Qwen2 model with a Qwen-style template round-tripping a call and its result; strict schemas
(tools and response_format) and one call for a named choice, with a script under the grammar."""
from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import openai
import pytest

from lite_llm.engine.structured import Grammars
from lite_llm.model.tokenizer import Tokenizer
from lite_llm.server.parsers import MAX_FORCED_CALLS, JsonToolParser, forced_tool_calls, make_tool_parser, tool_parser_for

from .conftest import request, serving
from .test_tool_calls import TOOL_TEMPLATE

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30},
                                                    "hours24": {"type": "boolean"}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _check_call(call, names=tuple(PARAMS)) -> None:
    assert call.type == "function" and call.function.name in names and call.id
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


# ---- parsers and the grammar, without a model ---------------------------------------------

@pytest.mark.parametrize("parser,text,calls", [
    ("llama3_json", '{"name": "get_time", "parameters": {"zone": "UTC"}}', [("get_time", {"zone": "UTC"})]),
    ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}',
     [("a", {}), ("b", {"x": 1})]),
    ("llama3_json", "Hello {not a call}", []),
    ("llama3_json", "{broken", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}}]', [("get_time", {"zone": "CET"})]),
    ("mistral", '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": [1]}}]',
     [("a", {}), ("b", {"y": [1]})]),
    ("mistral", "[TOOL", []),
    ("mistral", "Plain answer.", []),
])
def test_json_tool_parsers_at_every_delta_boundary(parser, text, calls):
    for cut in range(len(text) + 1):
        p = JsonToolParser(parser)
        c1, k1 = p.feed(text[:cut])
        c2, k2 = p.feed(text[cut:], final=True)
        got = k1 + k2
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
        assert (c1 + c2) == ("" if calls else text)
        assert p.num_calls == len(calls)


def test_parallel_tool_calls_false_keeps_the_first_call():
    prep = SimpleNamespace(tool_parser="llama3_json", max_tool_calls=1, forced_tools=False)
    content, calls = make_tool_parser(prep).feed('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}',
                                                 final=True)
    assert [c["function"]["name"] for c in calls] == ["a"]


def test_parser_chosen_from_the_template_where_unambiguous():
    assert tool_parser_for(TOOL_TEMPLATE) == "hermes"
    assert tool_parser_for("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert tool_parser_for("{% if m.role == 'ipython' %}<|python_tag|>{% endif %}") == "llama3_json"
    assert tool_parser_for("<tool_call> and [TOOL_CALLS]") is None          # two formats: ambiguous
    assert tool_parser_for("{{ messages }}") is None and tool_parser_for(None) is None


@pytest.fixture(scope="module")
def grammars():
    from tests.conftest import tiny_tokenizer_json
    import tokenizers
    tok = Tokenizer(tokenizers.Tokenizer.from_str(tiny_tokenizer_json()), eos_token="<|im_end|>")
    return tok, Grammars(tok, tok.vocab_size, (tok.eos_token_id,))


@pytest.mark.parametrize("parser,good,bad", [
    ("hermes", ['<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>'
                '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC", "hours24": true}}\n</tool_call>'],
     ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',    # unit missing
      '<tool_call>\n{"name": "get_date", "arguments": {}}\n</tool_call>',                     # no such tool
      'Sure! <tool_call>']),
    ("llama3_json", ['{"name": "get_time", "parameters": {"zone": "UTC"}}'],
     ['{"name": "get_time", "arguments": {"zone": "UTC"}}']),
    ("mistral", ['[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]'],
     ['[{"name": "get_time", "arguments": {"zone": "UTC"}}]']),
])
def test_forced_grammar_admits_exactly_valid_calls(grammars, parser, good, bad):
    tok, g = grammars

    def accepts(text, params):
        m = g.matcher(params)
        return m.consume_tokens(tok.encode(text, add_special_tokens=False)) and m.is_accepting()

    params = forced_tool_calls(parser, TOOLS, "required", parallel=True)
    for text in good:
        assert accepts(text, params), text
    for text in bad:
        assert not accepts(text, params), text
    named = forced_tool_calls(parser, TOOLS, {"name": "get_weather"}, parallel=True)
    assert not accepts(good[0], named)            # a call of get_time
    single = forced_tool_calls(parser, TOOLS, "required", parallel=False)
    assert not (parser == "hermes" and accepts(good[1], single))     # two calls


def _nested(name: str, inner: dict) -> dict:
    """A tool whose parameters refer to their own definitions, as Pydantic writes nested models."""
    return {"type": "function", "function": {"name": name, "parameters": {
        "$defs": {"Item": inner}, "type": "object", "required": ["items"],
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                       "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}}}


@pytest.mark.parametrize("parser", ["hermes", "forced_json"])
def test_forced_grammar_resolves_the_tools_own_definitions(grammars, parser):
    """"$defs" and "#" references in a tool's parameters mean that tool's own, wherever the
    grammar puts its arguments, also beside another tool defining the same name."""
    tok, g = grammars
    users = _nested("users", {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]})
    tags = _nested("tags", {"type": "string", "maxLength": 5})

    def text(name, args):
        body = json.dumps({"name": name, ("arguments" if parser == "hermes" else "parameters"): args})
        return f"<tool_call>\n{body}\n</tool_call>" if parser == "hermes" else f"[{body}]"

    def accepts(name, args, tools, choice="required"):
        m = g.matcher(forced_tool_calls(parser, tools, choice, parallel=False))
        return m.consume_tokens(tok.encode(text(name, args), add_special_tokens=False)) and m.is_accepting()

    good_users = {"items": [{"age": 3}], "next": {"items": [], "next": None}}
    for tools, choice in (([users], {"name": "users"}), ([users, tags], "required")):
        assert accepts("users", good_users, tools, choice)
        assert not accepts("users", {"items": ["abc"]}, tools, choice)
        assert not accepts("users", {"items": [], "next": {"items": ["abc"]}}, tools, choice)
    assert accepts("tags", {"items": ["abc"]}, [users, tags])
    assert not accepts("tags", {"items": [{"age": 3}]}, [users, tags])


# ---- the default model over HTTP ----------------------------------------------------------

@pytest.fixture(scope="module")
def default_server():
    from lite_llm.llm import build_async_engine
    engine, tokenizer, info = build_async_engine(None, max_model_len=1024, kv_cache_space=0.25, max_num_seqs=16)
    with serving(engine, tokenizer, info, "smollm2", tool_call_parser="hermes") as server:
        yield server


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_tool_choice_required_gives_a_valid_call_every_time(default_server):
    client = _client(default_server)
    seen = set()
    for seed in range(8):
        answer = client.chat.completions.create(      # room for MAX_FORCED_CALLS calls
            model="smollm2", temperature=1.0, seed=seed, max_tokens=600, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=seed % 2 == 0,
            messages=[{"role": "user", "content": "What is the weather in Paris, and the time in Tokyo?"}])
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice.message
        assert choice.message.content is None and len(choice.message.tool_calls) <= MAX_FORCED_CALLS
        for call in choice.message.tool_calls:
            _check_call(call)
            seen.add(call.function.name)
    assert seen                                  # (which tools the model picks is its own business)


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_named_tool_choice_and_no_parallel_calls(default_server):
    client = _client(default_server)
    for seed in range(3):
        answer = client.chat.completions.create(
            model="smollm2", temperature=1.0, seed=seed, max_tokens=200, tools=TOOLS, parallel_tool_calls=False,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            messages=[{"role": "user", "content": "What time is it in Berlin?"}])
        calls = answer.choices[0].message.tool_calls
        assert len(calls) == 1
        _check_call(calls[0], names=("get_time",))
        assert answer.choices[0].finish_reason == "stop"     # as OpenAI answers a named tool_choice
    stream = client.chat.completions.create(
        model="smollm2", temperature=1.0, seed=5, max_tokens=600, tools=TOOLS, tool_choice="required", stream=True,
        messages=[{"role": "user", "content": "Weather in Rome?"}])
    calls, finish = [], None
    for chunk in stream:
        if chunk.choices:
            calls += chunk.choices[0].delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    assert calls and finish == "tool_calls"
    for call in calls:
        _check_call(call)


# ---- a tiny Qwen2 model with a Qwen-style template: a call and its result round-trip --------

@pytest.fixture(scope="module")
def qwen_server(tiny_checkpoint):
    from lite_llm.llm import build_async_engine
    path = tiny_checkpoint("qwen2", max_position_embeddings=1024)
    engine, tokenizer, info = build_async_engine(model=str(path), max_model_len=1024, kv_cache_space=0.05,
                                                 max_num_seqs=4, dtype="float32")
    with serving(engine, tokenizer, info, "tiny-qwen", chat_template=TOOL_TEMPLATE) as server:
        yield server


def test_qwen_style_template_round_trips_a_call_and_its_result(qwen_server):
    client = openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    question = {"role": "user", "content": "Weather in Oslo?"}
    tools = [WEATHER]
    answer = client.chat.completions.create(model="tiny-qwen", messages=[question], tools=tools,
                                            tool_choice="required", parallel_tool_calls=False, max_tokens=400,
                                            temperature=1.0, seed=1)
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    _check_call(call, names=("get_weather",))
    history = [question,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call.id, "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 4}'}]
    status, _, data = request(qwen_server.port, "POST", "/tokenize", {"messages": history, "tools": tools})
    assert status == 200
    rendered = json.loads(request(qwen_server.port, "POST", "/detokenize",
                                  {"tokens": json.loads(data)["tokens"]})[2])["prompt"]
    args = json.loads(call.function.arguments)
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {json.dumps(args, ensure_ascii=False)}}}\n</tool_call>' in rendered
    assert '<tool_response>\n{"temp_c": 4}\n</tool_response>' in rendered
    final = client.chat.completions.create(model="tiny-qwen", messages=history, tools=tools, max_tokens=8,
                                           temperature=0)
    assert final.usage.prompt_tokens == json.loads(data)["count"]
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")


# ---- strict schemas and one call for a named tool_choice (a script under the grammar) ------

PLACE = {"type": "object", "properties": {"place": {"type": "object", "properties": {"city": {"type": "string"}}},
                                          "unit": {"enum": ["C", "F"]}}, "required": ["place"]}
EXTRA_ARGS = '{"place": {"city": "Paris", "zip": 7}, "x": 1}'


def _strict_reading(value: dict) -> None:
    """value has exactly the keys strict mode allows PLACE: all of them, none other, at every depth."""
    assert set(value) == {"place", "unit"} and value["place"] == {"city": "Paris"}, value


@pytest.fixture(scope="module")
def extra_keys_server():
    from .fake_model import GuidedScriptedRunner
    from .test_hardening import scripted_server

    class ExtraKeysRunner(GuidedScriptedRunner):      # two calls whose arguments carry undeclared keys
        script = "".join(f'<tool_call>\n{{"name": "where", "arguments": {EXTRA_ARGS}}}\n</tool_call>\n'
                          for _ in range(2)) + "<|im_end|>"

    with scripted_server(ExtraKeysRunner, step_seconds=0.0005, chat_template=TOOL_TEMPLATE) as served:
        yield served


def _calls(server, tool: dict, **kw) -> list[dict]:
    answer = _client(server).chat.completions.create(
        model="tiny", temperature=0, max_tokens=210, tools=[{"type": "function", "function": tool}],
        messages=[{"role": "user", "content": "Where?"}], **kw)
    return [json.loads(c.function.arguments) for c in answer.choices[0].message.tool_calls]


def test_strict_tools_close_every_object_and_require_every_property(extra_keys_server):
    server, _ = extra_keys_server
    tool = {"name": "where", "parameters": PLACE}
    assert _calls(server, tool, tool_choice="required", parallel_tool_calls=False) == [json.loads(EXTRA_ARGS)]
    (args,) = _calls(server, {**tool, "strict": True}, tool_choice="required", parallel_tool_calls=False)
    _strict_reading(args)
    (args,) = _calls(server, {**tool, "strict": True}, tool_choice={"type": "function", "function": {"name": "where"}})
    _strict_reading(args)
    client = _client(server)                         # Responses: function tools are strict by default
    ask = dict(model="tiny", input="Where?", temperature=0, max_output_tokens=120, tool_choice="required",
               parallel_tool_calls=False)
    r = client.responses.create(tools=[{"type": "function", "name": "where", "parameters": PLACE}], **ask)
    _strict_reading(json.loads(r.output[0].arguments))
    r = client.responses.create(tools=[{"type": "function", "name": "where", "parameters": PLACE, "strict": False}],
                                **ask)
    assert json.loads(r.output[0].arguments) == json.loads(EXTRA_ARGS)


def test_a_named_tool_choice_is_exactly_one_call(extra_keys_server):
    server, _ = extra_keys_server
    tool = {"name": "where", "parameters": PLACE}
    assert len(_calls(server, tool, tool_choice="required")) == 2          # "required" may give several
    for parallel in (None, True):
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        assert _calls(server, tool, tool_choice={"type": "function", "function": {"name": "where"}}, **extra) == \
            [json.loads(EXTRA_ARGS)]


def test_strict_response_format_closes_every_object_and_requires_every_property():
    from .fake_model import GuidedScriptedRunner
    from .test_hardening import scripted_server

    class ExtraKeysRunner(GuidedScriptedRunner):
        script = EXTRA_ARGS + "<|im_end|>"

    with scripted_server(ExtraKeysRunner, step_seconds=0.0005) as (server, _):
        def answer(strict: bool | None) -> dict:
            js = {"name": "place", "schema": PLACE, **({} if strict is None else {"strict": strict})}
            out = _client(server).chat.completions.create(
                model="tiny", temperature=0, max_tokens=80, messages=[{"role": "user", "content": "Where?"}],
                response_format={"type": "json_schema", "json_schema": js})
            assert out.choices[0].finish_reason == "stop"
            return json.loads(out.choices[0].message.content)

        assert answer(None) == answer(False) == json.loads(EXTRA_ARGS)    # JSON Schema's default: open objects
        _strict_reading(answer(True))
