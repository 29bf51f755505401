"""gpt-oss's harmony format over real HTTP: a fake model that answers harmony messages (analysis,
then a final answer or a call to a function) through a tokenizer whose markers are special
tokens, served with --reasoning-parser openai_gptoss and --tool-call-parser openai (lite_llm/
server/harmony.py): reasoning_content, content and tool_calls on chat completions (whole and
streamed), the Responses API's reasoning item, Anthropic's thinking block, reasoning_effort
reaching the template, a forced call, and the parser alone on split deltas."""
from __future__ import annotations

import contextlib
import json

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from lite_llm.model.tokenizer import Tokenizer
from lite_llm.server.harmony import HarmonyReasoningSplitter, HarmonyToolParser

from .conftest import CORPUS, error_of, request
from .fake_model import GuidedScriptedRunner, ScriptedRunner, fake_runner_engine

MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]
# the shape of gpt-oss's template: a system message naming the reasoning effort, the messages,
# the assistant's header to continue from
TEMPLATE = ("<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>"
            "{% for m in messages %}{% if m['role'] == 'assistant' %}<|start|>assistant<|channel|>final"
            "<|message|>{{ m['content'] }}<|end|>{% else %}<|start|>{{ m['role'] }}<|message|>"
            "{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|start|>assistant{% endif %}")
ANALYSIS = "The user asks about the weather in Oslo."
FINAL = "It is sunny in Oslo, 21 degrees."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
QUESTION = [{"role": "user", "content": "Weather in Oslo?"}]


class AnswerRunner(ScriptedRunner):
    script = f"<|channel|>analysis<|message|>{ANALYSIS}<|end|><|start|>assistant<|channel|>final<|message|>{FINAL}<|return|>"


class CallRunner(ScriptedRunner):
    script = (f"<|channel|>analysis<|message|>{ANALYSIS}<|end|><|start|>assistant<|channel|>commentary "
              'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>')


class ForcedCallRunner(GuidedScriptedRunner):
    """The call alone, where a grammar allows it (a forced tool_choice)."""
    script = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'


def harmony_tokenizer(eos: str) -> Tokenizer:
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", *MARKERS], show_progress=False)
    backend.train_from_iterator(CORPUS + [ANALYSIS, FINAL], trainer)
    return Tokenizer(backend, bos_token="<|endoftext|>", eos_token=eos, chat_template=TEMPLATE)


@contextlib.contextmanager
def harmony_server(runner_cls: type, eos: str, **server_kwargs):
    from lite_llm.server.app import create_server
    tok = harmony_tokenizer(eos)
    engine = fake_runner_engine(tok, runner_cls=runner_cls, step_seconds=0.0005, max_model_len=512)
    server = create_server(engine, tok, "gpt-oss", 512, reasoning_parser="openai_gptoss",
                           **{"tool_call_parser": "openai", **server_kwargs})
    server.start()
    try:
        yield server, tok
    finally:
        server.drain(2.0)


def chat(port: int, **body) -> tuple[int, dict]:
    status, _, data = request(port, "POST", "/v1/chat/completions", {"model": "gpt-oss", "messages": QUESTION,
                                                                      "max_tokens": 200, **body})
    return status, json.loads(data)


def stream_chat(port: int, **body) -> tuple[str, str, list[dict], list[str], list[dict]]:
    """(reasoning, content, tool call deltas, finish reasons, every delta) of a streamed chat."""
    status, _, data = request(port, "POST", "/v1/chat/completions",
                              {"model": "gpt-oss", "messages": QUESTION, "max_tokens": 200, "stream": True, **body})
    assert status == 200, data
    reasoning, content, calls, finishes, deltas = "", "", [], [], []
    for line in data.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for c in json.loads(line[6:])["choices"]:
            d = c["delta"]
            deltas.append(d)
            reasoning += d.get("reasoning_content") or ""
            content += d.get("content") or ""
            calls += d.get("tool_calls") or []
            if c.get("finish_reason"):
                finishes.append(c["finish_reason"])
    return reasoning, content, calls, finishes, deltas


def _no_markers(*texts: str) -> None:
    for t in texts:
        assert not any(m in (t or "") for m in MARKERS), t


def test_answer_splits_into_reasoning_and_content():
    with harmony_server(AnswerRunner, "<|return|>") as (server, _):
        status, body = chat(server.port)
        assert status == 200, body
        msg, choice = body["choices"][0]["message"], body["choices"][0]
        assert msg["reasoning_content"] == ANALYSIS and msg["content"] == FINAL
        assert choice["finish_reason"] == "stop" and not msg.get("tool_calls")
        reasoning, content, calls, finishes, deltas = stream_chat(server.port)
        assert (reasoning, content, calls, finishes) == (ANALYSIS, FINAL, [], ["stop"])
        assert len([d for d in deltas if d.get("content")]) > 1          # streamed, not one piece at the end
        _no_markers(*(d.get("content") for d in deltas), *(d.get("reasoning_content") for d in deltas))


def test_a_call_to_a_function_is_a_tool_call():
    with harmony_server(CallRunner, "<|call|>") as (server, _):
        status, body = chat(server.port, tools=TOOLS)
        assert status == 200, body
        choice = body["choices"][0]
        msg = choice["message"]
        assert msg["reasoning_content"] == ANALYSIS and msg["content"] is None
        assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] \
            == [("function", "get_weather", {"city": "Oslo"})]
        assert choice["finish_reason"] == "tool_calls"
        reasoning, content, calls, finishes, _ = stream_chat(server.port, tools=TOOLS)
        assert reasoning == ANALYSIS and content == "" and finishes == ["tool_calls"]
        assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
            == [(0, "get_weather", {"city": "Oslo"})]


def test_the_template_shows_the_tool_parser_and_a_forced_call_follows_harmony():
    """Without --tool-call-parser the template's harmony markers select the openai parser; a
    forced call (tool_choice naming the function) is generated under a harmony grammar."""
    with harmony_server(ForcedCallRunner, "<|call|>", tool_call_parser=None) as (server, _):
        status, body = chat(server.port, tools=TOOLS)
        assert status == 200 and body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        status, body = chat(server.port, tools=TOOLS,
                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert status == 200 and body["choices"][0]["finish_reason"] == "stop", body   # named: OpenAI says stop
        calls = body["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["get_weather"]
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}


def test_reasoning_effort_reaches_the_template():
    with harmony_server(AnswerRunner, "<|return|>") as (server, tok):
        counts = {}
        for effort in (None, "high", "low"):
            status, body = chat(server.port, **({"reasoning_effort": effort} if effort else {}))
            assert status == 200, body
            counts[effort] = body["usage"]["prompt_tokens"]
            want = tok.encode(tok.apply_chat_template(QUESTION, add_generation_prompt=True,
                                                      **({"reasoning_effort": effort} if effort else {})),
                              add_special_tokens=False)
            assert counts[effort] == len(want)
        assert tok.apply_chat_template(QUESTION, add_generation_prompt=True, reasoning_effort="high") \
            .startswith("<|start|>system<|message|>Reasoning: high")
        status, body = chat(server.port, reasoning_effort="extreme")
        err = error_of(json.dumps(body).encode())
        assert status == 400 and err["param"] == "reasoning_effort" and "extreme" not in err["message"]


def test_responses_and_messages_apis_get_the_reasoning():
    with harmony_server(AnswerRunner, "<|return|>") as (server, _):
        status, _, data = request(server.port, "POST", "/v1/responses",
                                  {"model": "gpt-oss", "input": "Weather in Oslo?", "max_output_tokens": 200})
        assert status == 200, data
        out = json.loads(data)["output"]
        assert [o["type"] for o in out] == ["reasoning", "message"]
        assert out[0]["content"][0]["text"] == ANALYSIS and out[1]["content"][0]["text"] == FINAL
        status, _, data = request(server.port, "POST", "/v1/messages",
                                  {"model": "gpt-oss", "max_tokens": 200, "messages": QUESTION})
        assert status == 200, data
        blocks = json.loads(data)["content"]
        assert [(b["type"], b.get("thinking", b.get("text"))) for b in blocks] == [("thinking", ANALYSIS),
                                                                                  ("text", FINAL)]


SPLIT = ("<|channel|>analysis<|message|>think <|end|><|start|>assistant<|channel|>commentary<|message|>Checking."
         "<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"a\": 1}<|call|>"
         "<|start|>assistant<|channel|>final<|message|>done<|return|>")


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(SPLIT)])
def test_parsers_give_the_same_answer_whatever_the_deltas(step):
    """Markers split across deltas are held back; the header form with the recipient first
    (to=functions.f<|channel|>commentary json) is a call too; a preamble is content."""
    split, tools = HarmonyReasoningSplitter(), HarmonyToolParser()
    reasoning = content = ""
    calls = []
    pieces = [SPLIT[i:i + step] for i in range(0, len(SPLIT), step)]
    for i, piece in enumerate(pieces):
        r, rest = split.feed(piece, final=i == len(pieces) - 1)
        c, got = tools.feed(rest, final=i == len(pieces) - 1)
        reasoning, content, calls = reasoning + r, content + c, calls + got
    assert reasoning == "think " and content == "Checking.done"
    assert [(c["index"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [(0, "f", '{"a": 1}')]


def test_plain_text_and_a_call_cut_off_mid_arguments():
    split = HarmonyReasoningSplitter()
    assert split.feed("Just text, no harmony.", final=True) == ("", "Just text, no harmony.")
    tools = HarmonyToolParser()
    assert tools.feed('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": ', final=True) \
        == ("", [])
