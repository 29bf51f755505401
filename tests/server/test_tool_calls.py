"""Tool calling: tools rendered through the chat template, Hermes/Qwen <tool_call> blocks parsed
into OpenAI tool_calls (whole and streamed), tool results sent back as role "tool" messages; a
call cut off by max_tokens (never content, in chat, Messages and Responses); forced calls on a
server without a tool call parser."""
from __future__ import annotations

import contextlib
import json

import openai
import pytest

from lite_llm.server.app import create_server
from lite_llm.server.parsers import HermesToolParser

from .conftest import MAX_MODEL_LEN, error_of, make_tokenizer, request
from .fake_model import GuidedScriptedRunner, ScriptedRunner, fake_runner_engine
from .test_hardening import scripted_server

# Qwen2.5's tool template, cut down: tools listed in a system turn, calls as <tool_call> JSON,
# results as <tool_response> in a user turn
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n<tools>{% for tool in tools %}\n{{ tool | tojson }}"
    "{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant"
    "{% for tc in m.tool_calls %}\n<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


class ToolRunner(ScriptedRunner):
    script = "Let me check.\n" + CALL + "<|im_end|>"


@contextlib.contextmanager
def scripted_tool_server():
    """(server, tokenizer): a server whose engine always answers ToolRunner.script (text, then a
    hermes call), with the Qwen-style tool template; drained at the end of the block."""
    with scripted_server(ToolRunner, step_seconds=0.0005, chat_template=TOOL_TEMPLATE) as served:
        yield served


@pytest.fixture(scope="module")
def tool_server():
    with scripted_tool_server() as served:
        yield served


def _ask(server, tok, **kw):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20)
    n = len(tok.encode(ToolRunner.script, add_special_tokens=False))
    end = tok.token_to_id("<|im_end|>")
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=n + 4,
        temperature=0, extra_body={"stop_token_ids": [end]}, **kw)


@pytest.mark.parametrize("text,content,calls", [
    ("Let me check.\n" + CALL, "Let me check.\n", [("get_weather", {"city": "Paris"})]),
    (CALL + "\n" + CALL.replace("Paris", "Rome"), "",
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    ("no call <tool_cal", "no call <tool_cal", []),
    ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    ('<tool_call>{"name": "f", "arguments": "{}"}', "", [("f", {})]),        # unterminated at the end
    ("Hm.  \n\n" + CALL + "\n\n" + CALL + " \nDone. ", "Hm.  \n\n \nDone. ", [("get_weather", {"city": "Paris"})] * 2),
    ("\n " + CALL + "\n", "", [("get_weather", {"city": "Paris"})]),      # whitespace alone beside calls: none
    ("\n <tool_call>{\"name\": ", "\n ", []),       # no call after all: the answer as written, less the cut call
    (" \n", " \n", []),
])
def test_hermes_parser_at_every_delta_boundary(text, content, calls):
    for cut in range(len(text) + 1):
        p = HermesToolParser()
        a, ca = p.feed(text[:cut])
        b, cb = p.feed(text[cut:], final=True)
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in ca + cb]
        assert (a + b, got) == (content, calls), cut
        assert [c["index"] for c in ca + cb] == list(range(len(calls)))


def test_tool_call_parsed_from_the_answer(tool_server):
    server, tok = tool_server
    out = _ask(server, tok, tools=TOOLS)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"        # as written, as streamed (vLLM's hermes parser)
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_tool_call_streamed_as_deltas(tool_server):
    server, tok = tool_server
    content, calls, finish = "", {}, None
    for chunk in _ask(server, tok, tools=TOOLS, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": tc.id})
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert content == "Let me check.\n" and finish == "tool_calls"
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


def test_tool_choice_none_leaves_the_text_alone(tool_server):
    server, tok = tool_server
    choice = _ask(server, tok, tools=TOOLS, tool_choice="none").choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert CALL in choice.message.content


def test_tool_call_and_result_round_trip_through_the_template(tool_server):
    server, tok = tool_server
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
    status, _, data = request(server.port, "POST", "/tokenize", {"messages": messages})
    assert status == 200
    text = json.loads(request(server.port, "POST", "/detokenize", {"tokens": json.loads(data)["tokens"]})[2])["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<tool_response>\n{"temp_c": 21}\n</tool_response>' in text
    with_tools = json.loads(request(server.port, "POST", "/tokenize", {"messages": messages, "tools": TOOLS})[2])
    assert with_tools["count"] > json.loads(data)["count"]       # the tools' system turn comes first
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20)
    answer = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=4)
    assert answer.usage.prompt_tokens == with_tools["count"]


@pytest.mark.parametrize("body,param", [
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": "x"}, "tools"),
])
def test_bad_tool_requests_are_400(tool_server, body, param):
    server, _ = tool_server
    status, _, data = request(server.port, "POST", "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "x"}], **body})
    assert status == 400 and error_of(data)["param"] == param


def test_tools_need_a_known_format():
    tok = make_tokenizer()                    # its ChatML template shows no tool call format
    engine = fake_runner_engine(tok, runner_cls=ScriptedRunner, max_model_len=MAX_MODEL_LEN)
    server = create_server(engine, tok, "tiny", MAX_MODEL_LEN)
    server.start()
    try:
        status, _, data = request(server.port, "POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS})
        assert status == 400 and "--tool-call-parser" in error_of(data)["message"]
    finally:
        server.drain(2.0)


def test_hostile_values_in_the_new_fields_are_never_5xx(tool_server):
    from .test_bad_input_sweep import HOSTILE_VALUES
    server, _ = tool_server
    extra = [[{"type": "function", "function": {"name": "f", "parameters": v}}] for v in (1, "x", [], None)] + [
        [{"type": "function", "function": {"name": "f"}}] * 129, {"type": "function"}, "required",
        {"enable_thinking": None, "tools": 1}, {"messages": 1}, {"x" * 10000: 1}, {"1": 1e308}, {"1": -1e-320}]
    user = {"role": "user", "content": "x"}
    cases = []
    for value in HOSTILE_VALUES + extra:
        for name in ("tools", "tool_choice", "chat_template_kwargs", "logit_bias"):
            cases.append({"messages": [user], "tools": TOOLS, name: value})
        cases.append({"messages": [user, {"role": "assistant", "content": None, "tool_calls": value}]})
        cases.append({"messages": [user, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": value}}]}]})
        cases.append({"messages": [user, {"role": "tool", "tool_call_id": value, "content": "r"}]})
        cases.append({"messages": [user, {"role": "assistant", "content": "a", "reasoning_content": value}]})
    for body in cases:
        status, _, data = request(server.port, "POST", "/v1/chat/completions", {**body, "max_tokens": 2})
        assert status in (200, 400), (body, data[:300])
        status, _, data = request(server.port, "POST", "/tokenize",
                                  {k: v for k, v in body.items() if k != "tool_choice" and k != "logit_bias"})
        assert status in (200, 400), (body, data[:300])


# ---- a call cut off by max_tokens; forced calls without a parser ---------------------------

def _chat(client, stream: bool, **kw) -> tuple[str | None, list[tuple[str, dict]], str]:
    """(content, [(name, arguments)], finish_reason) of one chat answer, whole or streamed."""
    if not stream:
        choice = client.chat.completions.create(model="tiny", temperature=0, **kw).choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        return choice.message.content, calls, choice.finish_reason
    content, calls, finish = None, {}, None
    for chunk in client.chat.completions.create(model="tiny", temperature=0, stream=True, **kw):
        for c in chunk.choices:
            if c.delta.content:
                content = (content or "") + c.delta.content
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, ["", ""])
                entry[0] += tc.function.name or ""
                entry[1] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return content, [(n, json.loads(a)) for _, (n, a) in sorted(calls.items())], finish


def _cuts_inside_calls(tok, script: str) -> list[tuple[int, str]]:
    """(max_tokens, the text those tokens decode to) for each cut of script inside a <tool_call> block."""
    ids = tok.encode(script, add_special_tokens=False)
    cuts = []
    for k in range(1, len(ids)):
        text = tok.decode(ids[:k])
        if text.count("<tool_call>") > text.count("</tool_call>"):
            cuts.append((k, text))
    return cuts


def _whole_calls(text: str) -> list[tuple[str, dict]]:
    """The calls of text whose JSON is whole (the last block may be open: its JSON may still be whole)."""
    calls = []
    for block in text.split("<tool_call>")[1:]:
        try:
            value = json.loads(block.split("</tool_call>")[0])
        except ValueError:
            continue
        calls.append((value["name"], value["arguments"]))
    return calls


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_off_by_max_tokens_is_never_content(tool_server, stream):
    server, tok = tool_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20)
    cuts = _cuts_inside_calls(tok, ToolRunner.script)
    assert len(cuts) > 10
    for max_tokens, text in cuts:
        content, calls, finish = _chat(client, stream, messages=[{"role": "user", "content": "Weather?"}],
                                       tools=TOOLS, max_tokens=max_tokens)
        assert "<tool_call" not in (content or "") and content.strip() == "Let me check.", (max_tokens, content)
        assert calls == _whole_calls(text) and finish == "length", (max_tokens, calls, finish)


class TwoCallsRunner(GuidedScriptedRunner):
    script = CALL + "\n" + CALL.replace("Paris", "Rome") + "<|im_end|>"


@pytest.fixture(scope="module")
def two_calls_server():
    with scripted_server(TwoCallsRunner, step_seconds=0.0005, chat_template=TOOL_TEMPLATE) as served:
        yield served


@pytest.mark.parametrize("stream", [False, True])
def test_forced_calls_cut_off_keep_the_whole_ones_and_finish_with_length(two_calls_server, stream):
    server, tok = two_calls_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20)
    cuts = _cuts_inside_calls(tok, TwoCallsRunner.script)
    for max_tokens, text in cuts[::3] + cuts[-1:]:
        content, calls, finish = _chat(client, stream, messages=[{"role": "user", "content": "Weather?"}],
                                       tools=TOOLS, tool_choice="required", max_tokens=max_tokens)
        assert content is None and finish == "length", (max_tokens, content, finish)
        assert calls == _whole_calls(text), (max_tokens, calls)
    n = len(tok.encode(TwoCallsRunner.script, add_special_tokens=False))
    content, calls, finish = _chat(client, stream, messages=[{"role": "user", "content": "Weather?"}],
                                   tools=TOOLS, tool_choice="required", max_tokens=n)
    assert (content, calls, finish) == (None, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})],
                                        "tool_calls")


def test_a_cut_off_call_is_no_text_in_messages_and_responses(tool_server):
    import anthropic
    server, tok = tool_server
    (max_tokens, text), = [c for c in _cuts_inside_calls(tok, ToolRunner.script) if c[1].endswith('"city')][:1]
    question = [{"role": "user", "content": "Weather in Paris?"}]
    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=20)
    tool = {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}
    kw = dict(model="tiny", max_tokens=max_tokens, messages=question, tools=[tool], extra_body={"temperature": 0})
    m = claude.messages.create(**kw)
    assert [(b.type, b.text) for b in m.content] == [("text", "Let me check.\n")] and m.stop_reason == "max_tokens"
    texts, stop = "", None
    for event in claude.messages.create(**kw, stream=True):
        if event.type == "content_block_delta":
            texts += getattr(event.delta, "text", "") or getattr(event.delta, "partial_json", "")
        elif event.type == "message_delta":
            stop = event.delta.stop_reason
    assert (texts, stop) == ("Let me check.\n", "max_tokens")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20)
    rkw = dict(model="tiny", input="Weather in Paris?", tools=[{"type": "function", **TOOLS[0]["function"]}],
               max_output_tokens=max_tokens, temperature=0)
    r = client.responses.create(**rkw)
    assert r.status == "incomplete" and r.output_text == "Let me check.\n"
    assert [o.type for o in r.output] == ["message"]
    deltas = [e for e in client.responses.create(**rkw, stream=True)
              if e.type in ("response.output_text.delta", "response.function_call_arguments.delta")]
    assert "".join(e.delta for e in deltas) == "Let me check.\n"


class JsonCallRunner(GuidedScriptedRunner):
    script = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]<|im_end|>'


@pytest.fixture(scope="module")
def parserless_server():
    """A server whose chat template shows no tool call format, without --tool-call-parser."""
    with scripted_server(JsonCallRunner, step_seconds=0.0005) as served:
        yield served


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_need_no_parser(parserless_server, stream):
    server, tok = parserless_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20)
    ask = dict(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=60)
    assert _chat(client, stream, tool_choice="required", **ask) == \
        (None, [("get_weather", {"city": "Paris"})], "tool_calls")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert _chat(client, stream, tool_choice=named, **ask) == (None, [("get_weather", {"city": "Paris"})], "stop")
    content, calls, finish = _chat(client, stream, tool_choice="required", **{**ask, "max_tokens": 12})
    assert (content, calls, finish) == (None, [], "length")
    with pytest.raises(openai.BadRequestError) as err:           # "auto" still needs a parser
        _chat(client, stream, **ask)
    assert err.value.body["param"] == "tools" and "--tool-call-parser" in err.value.body["message"]


def test_forced_tool_calls_need_no_parser_in_messages_and_responses(parserless_server):
    import anthropic
    server, _ = parserless_server
    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=20)
    tool = {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}
    m = claude.messages.create(model="tiny", max_tokens=60, tools=[tool], tool_choice={"type": "any"},
                               messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert [(b.type, b.name, b.input) for b in m.content] == [("tool_use", "get_weather", {"city": "Paris"})]
    assert m.stop_reason == "tool_use"
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20)
    r = client.responses.create(model="tiny", input="Weather in Paris?", max_output_tokens=60, tool_choice="required",
                                tools=[{"type": "function", **TOOLS[0]["function"]}])
    assert [(o.type, o.name, json.loads(o.arguments)) for o in r.output] == \
        [("function_call", "get_weather", {"city": "Paris"})] and r.status == "completed"


# ---- the text beside calls: streamed and whole answers agree -------------------------------

ROME = CALL.replace("Paris", "Rome")
BESIDE_CALLS = {        # answer -> its content: the text before a call as written (as vLLM's hermes
    "text then call": ("Let me check.\n" + CALL, "Let me check.\n"),    # parser); whitespace alone is none
    "trailing blanks": ("Let me check.  \n\n" + CALL, "Let me check.  \n\n"),
    "call only": (CALL, None),
    "blank then call": ("\n \n" + CALL, None),
    "two calls": (CALL + "\n" + ROME, None),
    "text, two calls": ("Checking both.\n" + CALL + "\n\n" + ROME, "Checking both.\n"),
    "text after a call": (CALL + "\nDone.", "\nDone."),
}


@pytest.fixture(scope="module", params=sorted(BESIDE_CALLS))
def beside_calls(request):
    answer, content = BESIDE_CALLS[request.param]
    runner = type("Runner", (ScriptedRunner,), {"script": answer + "<|im_end|>"})
    with scripted_server(runner, step_seconds=0.0002, chat_template=TOOL_TEMPLATE) as (server, _):
        yield server, answer, content


def test_text_beside_calls_is_the_same_streamed_or_whole(beside_calls):
    """Chat Completions, Messages and Responses: the text an answer writes around its calls is one
    and the same whole, streamed, and through the SDKs' stream helpers (whatever the deltas)."""
    import anthropic
    server, answer, content = beside_calls
    calls = _whole_calls(answer)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20)
    question = [{"role": "user", "content": "Weather?"}]
    for stream in (False, True):
        assert _chat(client, stream, messages=question, tools=TOOLS, max_tokens=200) == \
            (content, calls, "tool_calls"), stream
    with client.chat.completions.stream(model="tiny", messages=question, tools=TOOLS, max_tokens=200) as s:
        final = s.get_final_completion().choices[0].message
    # (the role chunk's content "" is the helper's start, as with vLLM: no text reads "" there)
    assert (final.content or None) == content and len(final.tool_calls) == len(calls)

    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=20)
    tool = {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}
    kw = dict(model="tiny", max_tokens=200, messages=question, tools=[tool])
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as s:
        streamed = s.get_final_message()
    for m in (whole, streamed):      # (text after a call: a block after the call streamed, before it whole)
        assert [b.text for b in m.content if b.type == "text"] == ([content] if content else [])
        assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == calls
        assert m.stop_reason == "tool_use"

    rkw = dict(model="tiny", input="Weather?", tools=[{"type": "function", **TOOLS[0]["function"]}],
               max_output_tokens=200)
    whole = client.responses.create(**rkw)
    with client.responses.stream(**rkw) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        streamed = s.get_final_response()
    for r in (whole, streamed):
        assert r.output_text == (content or "") and r.status == "completed"
        assert [json.loads(o.arguments) for o in r.output if o.type == "function_call"] == [a for _, a in calls]
    assert deltas == (content or "")
