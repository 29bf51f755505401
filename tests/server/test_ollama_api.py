"""Ollama's native API (lite_llm/server/ollama.py) over real HTTP on 127.0.0.1: the official `ollama`
client's chat, generate, embed, list, show and ps, streaming and not, tools, format and think, each
answer equal to what the OpenAI routes give for the same prompt and sampling; raw HTTP for the
NDJSON framing and Ollama's error shape; /api/pull against a Hub stand-in."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import ollama
import openai
import pytest

from lite_llm.server.app import create_server

from .conftest import MAX_MODEL_LEN, request, start_server, stop_server
from .fake_model import GuidedScriptedRunner, ScriptedRunner
from .test_hardening import scripted_server
from .test_tool_calls import TOOLS, ToolRunner, scripted_tool_server

USER = [{"role": "user", "content": "Hello there, how are you?"}]


@pytest.fixture(scope="module")
def served():
    s = start_server(engine_overrides={"step_seconds": 0.001})
    yield s
    stop_server(s)


def _clients(url: str) -> tuple[ollama.Client, openai.OpenAI]:
    return (ollama.Client(host=url, timeout=30),
            openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30))


def _lines(data: bytes) -> list[dict]:
    """An NDJSON body: every line one JSON object, the body ending with a newline."""
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def _error(status_data: tuple) -> str:
    """Ollama's error shape: {"error": str} and nothing else."""
    body = json.loads(status_data[2])
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    return body["error"]


# ---- chat and generate answer as the OpenAI routes -------------------------------------------------

@pytest.mark.parametrize("options,sampling", [
    ({"temperature": 0, "num_predict": 12}, {"temperature": 0, "max_tokens": 12}),
    # Continue's own num_ctx, more than the server's length: capped to it, as Ollama caps it
    ({"temperature": 0, "num_predict": 12, "num_ctx": 8192}, {"temperature": 0, "max_tokens": 12}),
    ({"temperature": 0.9, "seed": 7, "top_p": 0.8, "top_k": 20, "num_predict": 10},
     {"temperature": 0.9, "seed": 7, "top_p": 0.8, "extra_body": {"top_k": 20}, "max_tokens": 10}),
])
def test_chat_equals_openai_chat_streaming_and_not(served, options, sampling):
    client, oai = _clients(served.url)
    want = oai.chat.completions.create(model="tiny", messages=USER, **sampling)
    got = client.chat(model="tiny", messages=USER, options=options, stream=False)
    assert got.message.role == "assistant" and got.message.content == want.choices[0].message.content
    assert got.done and got.done_reason == "length" == want.choices[0].finish_reason
    assert got.prompt_eval_count == want.usage.prompt_tokens and got.eval_count == want.usage.completion_tokens
    for name in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert got[name] > 0, name
    assert got.total_duration >= got.prompt_eval_duration + got.eval_duration
    parts = list(client.chat(model="tiny", messages=USER, options=options, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == want.choices[0].message.content
    assert parts[-1].message.content == "" and parts[-1].eval_count == want.usage.completion_tokens


def test_generate_is_one_user_turn_and_raw_is_a_completion(served):
    client, oai = _clients(served.url)
    chat = oai.chat.completions.create(model="tiny", temperature=0, max_tokens=9,
                                       messages=[{"role": "system", "content": "Be brief."}] + USER)
    got = client.generate(model="tiny", prompt=USER[0]["content"], system="Be brief.",
                          options={"temperature": 0, "num_predict": 9})
    assert got.response == chat.choices[0].message.content and got.prompt_eval_count == chat.usage.prompt_tokens
    streamed = list(client.generate(model="tiny", prompt=USER[0]["content"], system="Be brief.",
                                    options={"temperature": 0, "num_predict": 9}, stream=True))
    assert "".join(p.response for p in streamed) == chat.choices[0].message.content and streamed[-1].done
    completion = oai.completions.create(model="tiny", prompt="The quick brown", temperature=0, max_tokens=9)
    raw = client.generate(model="tiny", prompt="The quick brown", raw=True, options={"temperature": 0, "num_predict": 9})
    assert raw.response == completion.choices[0].text and raw.prompt_eval_count == completion.usage.prompt_tokens


def test_raw_generate_without_num_predict_runs_to_the_context_not_to_16_tokens(served):
    """Ollama's num_predict defaults to no limit; a completions request's max_tokens to 16."""
    client, _ = _clients(served.url)
    got = client.generate(model="tiny", prompt="The quick brown", raw=True, options={"temperature": 0})
    assert got.done_reason == "length" and got.prompt_eval_count + got.eval_count == MAX_MODEL_LEN


def test_stop_and_penalties_map_onto_sampling(served):
    client, oai = _clients(served.url)
    want = oai.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=20)
    text = want.choices[0].message.content
    stop = text[5:7]
    stopped = oai.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=20, stop=[stop],
                                          presence_penalty=0.5, frequency_penalty=0.5,
                                          extra_body={"repetition_penalty": 1.1, "min_p": 0.05})
    got = client.chat(model="tiny", messages=USER, options={
        "temperature": 0, "num_predict": 20, "stop": [stop], "presence_penalty": 0.5, "frequency_penalty": 0.5,
        "repeat_penalty": 1.1, "min_p": 0.05, "num_thread": 4, "mirostat": 0, "not_an_option": {}})
    assert got.message.content == stopped.choices[0].message.content == text[:text.index(stop)]
    assert got.done_reason == "stop"


# ---- the NDJSON framing, over raw HTTP -------------------------------------------------------------

def test_stream_is_the_default_and_is_ndjson(served):
    status, headers, data = request(served.port, "POST", "/api/chat",
                                    {"model": "tiny", "messages": USER, "options": {"temperature": 0, "num_predict": 6}})
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    assert headers.get("transfer-encoding") == "chunked"
    lines = _lines(data)
    assert len(lines) >= 2 and all(not line["done"] for line in lines[:-1]) and lines[-1]["done"]
    for line in lines:
        assert line["model"] == "tiny" and line["message"]["role"] == "assistant"
        assert line["created_at"].endswith("Z") and "T" in line["created_at"]
    last = lines[-1]
    assert set(last) >= {"done_reason", "total_duration", "load_duration", "prompt_eval_count",
                         "prompt_eval_duration", "eval_count", "eval_duration"}
    assert last["eval_count"] == 6
    status, headers, data = request(served.port, "POST", "/api/chat", {
        "model": "tiny:latest", "messages": USER, "stream": False, "options": {"temperature": 0, "num_predict": 6}})
    whole = json.loads(data)
    assert status == 200 and headers["content-type"] == "application/json" and "\n" not in data.decode()
    assert whole["message"]["content"] == "".join(line["message"]["content"] for line in lines)


def test_an_empty_chat_or_prompt_answers_loaded(served):
    for path, body, key in (("/api/chat", {"messages": []}, "message"), ("/api/generate", {}, "response")):
        status, _, data = request(served.port, "POST", path, {"model": "tiny", "keep_alive": "5m", **body})
        answer = json.loads(data)
        assert status == 200 and answer["done"] and answer["done_reason"] == "load" and key in answer


def test_a_client_leaving_mid_stream_aborts_its_request(served):
    import http.client
    import time
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    conn.request("POST", "/api/generate", json.dumps({"model": "tiny", "prompt": "Go on"}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert json.loads(resp.readline())["done"] is False
    before = len(served.engine.aborted)
    conn.close()
    deadline = time.monotonic() + 10
    while len(served.engine.aborted) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(served.engine.aborted) > before


# ---- models: tags, show, ps, version ----------------------------------------------------------------

def test_list_show_ps_and_version(served):
    client, _ = _clients(served.url)
    listed = client.list().models
    assert [m.model for m in listed] == ["tiny"] and listed[0].size == 1 << 20 and len(listed[0].digest) == 64
    running = client.ps().models
    assert [m.model for m in running] == ["tiny"] and running[0].context_length == MAX_MODEL_LEN
    shown = client.show("tiny")
    assert shown.capabilities == ["completion"] and "<|im_start|>" in shown.template
    assert shown.modelinfo["general.basename"] == "tiny"
    status, _, data = request(served.port, "GET", "/api/version")
    assert status == 200 and isinstance(json.loads(data)["version"], str)


# ---- tools, format, think ---------------------------------------------------------------------------

def test_tool_calls_arguments_are_objects_and_results_go_back():
    with scripted_tool_server() as (server, tok):
        client, oai = _clients(server.url)
        n = len(tok.encode(ToolRunner.script, add_special_tokens=False))
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        want = oai.chat.completions.create(model="tiny", messages=ask, tools=TOOLS, temperature=0, max_tokens=n + 4)
        got = client.chat(model="tiny", messages=ask, tools=TOOLS, options={"temperature": 0, "num_predict": n + 4})
        assert got.message.content == want.choices[0].message.content == "Let me check.\n"
        call = got.message.tool_calls[0].function
        assert call.name == "get_weather" and call.arguments == {"city": "Paris"}
        assert json.loads(want.choices[0].message.tool_calls[0].function.arguments) == call.arguments
        assert got.done_reason == "stop"
        parts = list(client.chat(model="tiny", messages=ask, tools=TOOLS, stream=True,
                                 options={"temperature": 0, "num_predict": n + 4}))
        calls = [c for p in parts for c in p.message.tool_calls or []]
        assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
        # the call and its result sent back, as Ollama's clients do: the same prompt as OpenAI's shape
        history = ask + [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}]
        oai_history = ask + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_1"}]
        again = client.chat(model="tiny", messages=history, tools=TOOLS, options={"temperature": 0, "num_predict": 3})
        want = oai.chat.completions.create(model="tiny", messages=oai_history, tools=TOOLS, temperature=0, max_tokens=3)
        assert again.prompt_eval_count == want.usage.prompt_tokens


JSON_SCRIPT = '{"age": 22, "available": true}<|im_end|>'


@pytest.mark.parametrize("fmt,response_format", [
    ("json", {"type": "json_object"}),
    ({"type": "object", "properties": {"age": {"type": "integer"}, "available": {"type": "boolean"}},
      "required": ["age", "available"]}, None),
    ({"type": "object", "properties": {"name": {"type": "string", "enum": ["Ada", "Bob"]}}, "required": ["name"],
      "additionalProperties": False}, None),
])
def test_format_is_the_structured_output_of_the_openai_routes(fmt, response_format):
    runner = type("JsonRunner", (GuidedScriptedRunner,), {"script": JSON_SCRIPT})
    with scripted_server(runner) as (server, _):
        client, oai = _clients(server.url)
        response_format = response_format or {"type": "json_schema", "json_schema": {"name": "f", "schema": fmt}}
        want = oai.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=40,
                                           response_format=response_format)
        got = client.chat(model="tiny", messages=USER, format=fmt, options={"temperature": 0, "num_predict": 40})
        assert got.message.content == want.choices[0].message.content
        generated = client.generate(model="tiny", prompt=USER[0]["content"], format=fmt,
                                    options={"temperature": 0, "num_predict": 40})
        assert generated.response == want.choices[0].message.content
        if isinstance(fmt, dict) and "name" in fmt["properties"]:      # the script breaks this schema
            assert json.loads(got.message.content)["name"] in ("Ada", "Bob")
        else:
            assert json.loads(got.message.content) == {"age": 22, "available": True}


THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
                  "{% endif %}")


def test_think_splits_thinking_from_the_answer():
    with scripted_server(ScriptedRunner, reasoning_parser="qwen3", chat_template=THINK_TEMPLATE) as (server, tok):
        client, oai = _clients(server.url)
        n = len(tok.encode(ScriptedRunner.script, add_special_tokens=False))
        want = oai.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=n)
        got = client.chat(model="tiny", messages=USER, think=True, options={"temperature": 0, "num_predict": n})
        assert (got.message.thinking, got.message.content) == ("I should greet.", "Hello there!")
        assert want.choices[0].message.content == "Hello there!"
        parts = list(client.chat(model="tiny", messages=USER, think=True, stream=True,
                                 options={"temperature": 0, "num_predict": n}))
        assert "".join(p.message.thinking or "" for p in parts) == "I should greet."
        assert "".join(p.message.content for p in parts) == "Hello there!"
        generated = client.generate(model="tiny", prompt=USER[0]["content"], think=True,
                                    options={"temperature": 0, "num_predict": n})
        assert (generated.thinking, generated.response) == ("I should greet.", "Hello there!")
        # think false reaches the template as enable_thinking false (its empty think block)
        off = client.chat(model="tiny", messages=USER, think=False, options={"temperature": 0, "num_predict": 1})
        assert off.prompt_eval_count > got.prompt_eval_count
        assert client.show("tiny").capabilities == ["completion", "thinking"]


def test_think_without_a_reasoning_parser_is_a_400(served):
    status, _, data = request(served.port, "POST", "/api/chat", {"model": "tiny", "messages": USER, "think": True})
    assert status == 400 and "thinking" in _error((status, _, data))


# ---- embeddings ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def embedder():
    from lite_llm.engine.assemble import build_async_engine
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from conftest import tiny_checkpoint_path
    engine, tokenizer, info = build_async_engine(str(tiny_checkpoint_path("bert")), dtype="float32", runner="pooling")
    server = create_server(engine, tokenizer, "bert", info["max_model_len"], kernel_info=info,
                           vocab_size=info["vocab_size"], request_timeout=2.0)
    server.start()
    yield server
    server.drain(2.0)


def test_embed_equals_openai_embeddings(embedder):
    client, oai = _clients(embedder.url)
    texts = ["hello world", "a paged KV cache"]
    want = [d.embedding for d in oai.embeddings.create(model="bert", input=texts).data]
    got = client.embed(model="bert", input=texts)
    assert got.embeddings == want and got.prompt_eval_count > 0
    assert client.embed(model="bert", input=texts[0]).embeddings == want[:1]
    assert client.embeddings(model="bert", prompt=texts[1]).embedding == want[1]
    assert client.show("bert").capabilities == ["embedding"]


def test_embed_truncates_by_default_and_refuses_without(embedder):
    long = "word " * 400
    status, _, data = request(embedder.port, "POST", "/api/embed", {"model": "bert", "input": long})
    assert status == 200 and len(json.loads(data)["embeddings"]) == 1
    status, _, data = request(embedder.port, "POST", "/api/embed", {"model": "bert", "input": long, "truncate": False})
    assert status == 400 and "tokens" in _error((status, _, data))


def test_embed_on_a_generative_model_and_chat_on_an_embedder_are_400(served, embedder):
    status, _, data = request(served.port, "POST", "/api/embed", {"model": "tiny", "input": "x"})
    assert status == 400 and "embeddings" in _error((status, _, data))
    status, _, data = request(embedder.port, "POST", "/api/chat", {"model": "bert", "messages": USER})
    assert status == 400 and "pooling" in _error((status, _, data))


# ---- errors: Ollama's shape, no echo, the server keeps serving -----------------------------------

MARK = "zq-marker-9d1"


@pytest.mark.parametrize("path,body,status,words", [
    ("/api/chat", {"model": MARK, "messages": USER}, 404, "not found"),
    ("/api/generate", {"model": MARK, "prompt": "x"}, 404, "not found"),
    ("/api/show", {"model": MARK}, 404, "not found"),
    ("/api/embed", {"model": MARK, "input": "x"}, 404, "not found"),
    ("/api/chat", {"messages": USER}, 400, "model is required"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": MARK, "content": "x"}]}, 400, "role"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("/api/chat", {"model": "tiny", "messages": "hi"}, 400, "messages"),
    ("/api/chat", {"model": "tiny", "messages": USER, "options": {"temperature": "hot"}}, 400, "temperature"),
    ("/api/chat", {"model": "tiny", "messages": USER, "options": {"num_predict": 0}}, 400, "num_predict"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "word " * 40}],
                   "options": {"num_ctx": 16}}, 400, "maximum context length is 16"),
    ("/api/chat", {"model": "tiny", "messages": USER, "format": MARK}, 400, "format"),
    ("/api/chat", {"model": "tiny", "messages": USER, "keep_alive": MARK}, 400, "keep_alive"),
    ("/api/chat", {"model": "tiny", "messages": USER, "stream": MARK}, 400, "stream"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400,
     "image"),
    ("/api/chat", {"model": "tiny", "messages": USER, "tools": TOOLS}, 400, "tool call parser"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "context": [1, 2]}, 400, "context"),
    ("/api/generate", {"model": "tiny", "prompt": 7}, 400, "prompt"),
    ("/api/pull", {"model": MARK}, 400, "Hugging Face"),
])
def test_bad_requests_answer_in_ollamas_shape(served, caplog, path, body, status, words):
    with caplog.at_level(logging.INFO, logger="lite_llm"):
        got = request(served.port, "POST", path, body)
    assert got[0] == status
    message = _error(got)
    assert words in message and MARK not in message
    assert "Traceback" not in caplog.text
    assert request(served.port, "POST", "/api/chat", {"model": "tiny", "messages": USER, "stream": False,
                                                      "options": {"num_predict": 2}})[0] == 200


def test_bad_json_and_unknown_methods_answer_in_ollamas_shape(served):
    got = request(served.port, "POST", "/api/chat", raw=b"{not json")
    assert got[0] == 400 and "JSON" in _error(got)
    got = request(served.port, "GET", "/api/chat")
    assert got[0] == 405 and "POST" in _error(got)


def test_the_api_key_guards_ollamas_routes():
    s = start_server(api_key="sekret")
    try:
        got = request(s.port, "GET", "/api/tags")
        assert got[0] == 401 and "API key" in _error(got)
        client = ollama.Client(host=s.url, headers={"Authorization": "Bearer sekret"})
        assert [m.model for m in client.list().models] == ["tiny"]
    finally:
        stop_server(s)


def test_the_official_client_raises_on_errors(served):
    client, _ = _clients(served.url)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MARK, messages=USER)
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        list(client.chat(model="tiny", messages=USER, options={"temperature": "hot"}, stream=True))
    assert e.value.status_code == 400


# ---- pull ---------------------------------------------------------------------------------------

_PULL_SERVER = """
import sys
from tests.server.conftest import start_server, stop_server
s = start_server()
print(s.port, flush=True)
sys.stdin.read()
stop_server(s)
"""


@pytest.fixture()
def hub_server(tmp_path):
    """(port, the HF cache): a server in its own process whose huggingface_hub reads HF_ENDPOINT (at
    import, as `serve` does) pointing at a Hub stand-in on 127.0.0.1 serving acme/tiny-model."""
    import os
    import subprocess
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))
    from fake_hub import FakeHub
    hub = FakeHub()
    hub.add_repo("acme/tiny-model", {"config.json": b'{"model_type": "llama"}', "model.safetensors": bytes(4096),
                                     "tokenizer.json": b"{}", "README.md": b"# tiny\n"})
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.start(),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for k in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        env.pop(k, None)
    proc = subprocess.Popen([sys.executable, "-c", _PULL_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=env["PYTHONPATH"])
    try:
        yield int(proc.stdout.readline()), tmp_path / "hf" / "hub"
    finally:
        proc.stdin.close()
        proc.wait(30)
        hub.stop()


def test_pull_streams_progress_and_fills_the_hub_cache(hub_server):
    port, cache = hub_server
    status, headers, data = request(port, "POST", "/api/pull", {"model": "acme/tiny-model"})
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    lines = _lines(data)
    assert lines[0] == {"status": "pulling manifest"} and lines[-1] == {"status": "success"}
    files = {line["status"].removeprefix("pulling "): line["total"] for line in lines if "total" in line}
    assert files == {"config.json": 23, "model.safetensors": 4096, "tokenizer.json": 2}
    snapshots = list((cache / "models--acme--tiny-model" / "snapshots").iterdir())
    assert {p.name for p in snapshots[0].iterdir()} == set(files)
    client, _ = _clients(f"http://127.0.0.1:{port}")
    assert client.pull("acme/tiny-model").status == "success"          # not streamed: the last line alone
    assert client.pull("tiny").status == "success"                     # the served model is here already
    status, _, data = request(port, "POST", "/api/pull", {"model": "acme/missing"})
    assert status == 200 and "acme/missing" in _lines(data)[-1]["error"]
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("acme/missing")
    assert e.value.status_code == 404


def test_a_failed_pull_names_the_model_not_the_servers_paths(served, monkeypatch, tmp_path):
    from lite_llm.model import hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")          # the cache alone is asked: the error names where it looked
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    got = request(served.port, "POST", "/api/pull", {"model": "acme/nothing-here", "stream": False})
    assert got[0] == 404
    message = _error(got)
    assert "acme/nothing-here" in message and hub.cache_dir() not in message and str(tmp_path) not in message


class _FailingRunner(ScriptedRunner):
    """Fails its fifth step: the engine stops while a stream runs."""
    steps = 0

    def execute(self, sched_out, masks=None):
        type(self).steps += 1
        if type(self).steps == 5:
            raise RuntimeError("the model failed")
        return super().execute(sched_out, masks)


def test_a_failure_mid_stream_is_an_error_line():
    with scripted_server(_FailingRunner) as (server, _):
        status, headers, data = request(server.port, "POST", "/api/chat", {"model": "tiny", "messages": USER})
        lines = _lines(data)
        assert status == 200 and headers["content-type"] == "application/x-ndjson"
        assert set(lines[-1]) == {"error"} and not any(line.get("done") for line in lines)
        assert lines[0]["message"]["content"]       # the stream had begun
        got = request(server.port, "POST", "/api/chat", {"model": "tiny", "messages": USER, "stream": False})
        assert got[0] == 503 and "engine" in _error(got)


def test_hostile_values_in_every_field_are_4xx_in_ollamas_shape(served):
    """Every field of the chat, generate, embed, show and pull bodies (and each option, and each
    message field) set to each hostile value: never a 5xx, every error {"error": str}; the
    server still answers afterwards."""
    from .test_bad_input_sweep import HOSTILE_VALUES
    chat = {"model": "tiny", "messages": USER, "stream": False, "options": {"num_predict": 2}}
    cases = []
    for value in HOSTILE_VALUES:
        for name in ("model", "messages", "tools", "format", "options", "stream", "keep_alive", "think", "logprobs"):
            cases.append(("/api/chat", {**chat, name: value}))
        for name in ("temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "stop", "repeat_penalty",
                     "num_ctx", "mirostat"):
            cases.append(("/api/chat", {**chat, "options": {"num_predict": 2, name: value}}))
        for name in ("role", "content", "images", "tool_calls", "thinking", "tool_name"):
            cases.append(("/api/chat", {**chat, "messages": [{"role": "user", "content": "x", name: value}]}))
        for name in ("prompt", "system", "raw", "images", "suffix", "template", "context"):
            cases.append(("/api/generate", {"model": "tiny", "prompt": "x", "stream": False,
                                             "options": {"num_predict": 2}, name: value}))
        for name in ("model", "input", "truncate", "dimensions"):
            cases.append(("/api/embed", {"model": "tiny", "input": "x", name: value}))
        cases += [("/api/show", {"model": value}), ("/api/pull", {"model": value, "stream": False}),
                  ("/api/embeddings", {"model": "tiny", "prompt": value})]
    for path, body in cases:
        got = request(served.port, "POST", path, body)
        assert got[0] < 500, (path, body, got)
        if got[0] >= 400:
            _error(got)
    assert request(served.port, "POST", "/api/chat", chat)[0] == 200


@pytest.mark.parametrize("info,details", [
    ({"model_path": "/models/Qwen3-8B-Q4_K_M.gguf", "architecture": "Qwen3ForCausalLM", "dtype": "bfloat16"},
     {"format": "gguf", "family": "qwen3", "quantization_level": "Q4_K_M"}),
    ({"model_path": "/models/SmolLM2", "architecture": "LlamaForCausalLM", "dtype": "bfloat16"},
     {"format": "safetensors", "family": "llama", "quantization_level": "BF16"}),
])
def test_details_name_the_family_and_quantization_as_ollama_does(info, details):
    from .conftest import make_tokenizer
    from .fake_model import fake_runner_engine
    tok = make_tokenizer()
    engine = fake_runner_engine(tok, max_model_len=MAX_MODEL_LEN)
    server = create_server(engine, tok, "tiny", MAX_MODEL_LEN, kernel_info={**info, "weight_bytes": 123})
    server.start()
    try:
        client, _ = _clients(server.url)
        for got in (client.show("tiny").details, client.list().models[0].details, client.ps().models[0].details):
            assert {k: got[k] for k in details} == details
        assert "/models" not in request(server.port, "POST", "/api/show", {"model": "tiny"})[2].decode()
    finally:
        server.drain(2.0)
