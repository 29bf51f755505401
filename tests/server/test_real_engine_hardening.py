"""The server's defences and OpenAI extras over real HTTP on 127.0.0.1 with the real engine
(a tiny random llama checkpoint): huge prompts refused while /health answers, drip-feeding
connections, framing, HTTP/1.0, half-closing clients aborted, the key on every route, models.retrieve,
logit_bias on greedy output, reasoning_content."""
from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest

from lite_llm.server.app import create_server

from .conftest import error_of, request
from .test_hardening import _health_while, post_bytes, raw, split_response

KEY = "real-key"
THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


@pytest.fixture(scope="module")
def engine_parts(tiny_checkpoint):
    from lite_llm.llm import build_async_engine
    path = tiny_checkpoint("llama", max_position_embeddings=256)
    engine, tokenizer, info = build_async_engine(model=str(path), max_model_len=256, kv_cache_space=0.05,
                                                 max_num_seqs=8, dtype="float32")
    yield engine, tokenizer, info
    engine.shutdown(5.0)


def _serve(engine_parts, **kwargs):
    engine, tokenizer, info = engine_parts
    server = create_server(engine, tokenizer, "tiny-llama", info["max_model_len"], kernel_info=info,
                           vocab_size=info.get("vocab_size"), **kwargs)
    server.start()
    return server


def _close(server) -> None:
    # the engine is shared by the module: stop only the HTTP side
    server.state.draining = True
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def real(engine_parts):
    server = _serve(engine_parts, api_key=KEY, max_body_bytes=64 << 20, max_connections=64,
                    header_timeout=2.0, reasoning_parser="deepseek_r1",
                    trust_request_chat_template=True)
    yield server
    _close(server)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


AUTH = {"Authorization": f"Bearer {KEY}"}


class _EncodeSpy:
    """The tokenizer, remembering the longest text it was asked to encode."""

    def __init__(self, tokenizer):
        self._tokenizer, self.longest = tokenizer, 0

    def encode(self, text, *args, **kwargs):
        self.longest = max(self.longest, len(text))
        return self._tokenizer.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


@pytest.mark.parametrize("limit", [None, 64 << 20])
def test_30mb_prompt_refused_fast_while_health_answers(engine_parts, limit):
    """With the default body limit (derived from max_model_len) the body is refused from its
    Content-Length; with a limit that lets it in, from its byte length before tokenizing."""
    engine, tokenizer, info = engine_parts
    spy = _EncodeSpy(tokenizer)
    server = _serve((engine, spy, info), max_body_bytes=limit)
    try:
        body = json.dumps({"prompt": "the cat sat on the mat; " * (30_000_000 // 24), "max_tokens": 4}).encode()
        result = {}

        def work() -> None:
            try:
                result["r"] = request(server.port, "POST", "/v1/completions", raw=body)
            except ConnectionError as e:      # refused before the client finished sending
                result["r"] = (413, {}, str(e).encode())

        took, latencies = _health_while(server.port, work)
        status, _, data = result["r"]
        if limit is None:
            assert status == 413
        else:
            assert status == 400 and "maximum context length" in error_of(data)["message"]
        # refused before any tokenizing (what would make it slow), and /health kept answering
        # meanwhile: a server thread held by the body would leave a probe waiting for seconds
        assert spy.longest < 1 << 20, spy.longest
        assert len(latencies) >= 3 and max(latencies) < 2.0, (took, latencies)
    finally:
        _close(server)


def test_300_drip_feeding_connections_do_not_stop_a_request(real):
    stop = threading.Event()
    opened = [0]

    def attacker() -> None:
        socks: list[socket.socket] = []
        while not stop.is_set():
            while len(socks) < 300 and not stop.is_set():     # keep 300 open, reconnecting
                try:
                    s = socket.create_connection(("127.0.0.1", real.port), timeout=1)
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                    socks.append(s)
                    opened[0] += 1
                except OSError:
                    break
            alive = []
            for s in socks:                                     # a byte each, every 0.5 s
                try:
                    s.sendall(b"X")
                    alive.append(s)
                except OSError:
                    s.close()
            socks = alive
            stop.wait(0.5)
        for s in socks:
            s.close()

    t = threading.Thread(target=attacker)
    t.start()
    try:
        time.sleep(2.0)
        assert opened[0] >= 300
        t0 = time.monotonic()
        out = _client(real).completions.create(model="tiny-llama", prompt="Hello", max_tokens=8, temperature=0)
        assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 8
        assert time.monotonic() - t0 < 10
        assert real.num_connections <= 64
    finally:
        stop.set()
        t.join()


def test_duplicate_content_length_is_400(real):
    data = raw(real.port, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + KEY.encode()
               + b"\r\nContent-Length: 2\r\nContent-Length: 30\r\n\r\n{}")
    assert split_response(data)[0] == 400


def test_http10_stream_is_not_chunked(real):
    body = {"prompt": "Hello", "max_tokens": 6, "temperature": 0, "stream": True}
    data = raw(real.port, post_bytes("/v1/completions", body, version="HTTP/1.0", close=False,
                                     extra=f"Authorization: Bearer {KEY}\r\n".encode()))
    status, headers, payload = split_response(data)
    assert status == 200 and "transfer-encoding" not in headers
    events = [e for e in payload.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)


@pytest.mark.parametrize("stream", [False, True])
def test_half_closed_client_is_aborted(real, engine_parts, stream, monkeypatch):
    """A FIN after the request: the client left, its request is aborted and its sequence freed.
    The engine steps only once the server has asked for the abort, so the tiny model cannot
    finish its 200 tokens before the FIN is noticed (a race a loaded machine once lost)."""
    engine = engine_parts[0]
    asked = threading.Event()
    abort = engine.abort

    def spy(request_id):
        asked.set()
        abort(request_id)

    monkeypatch.setattr(engine, "abort", spy)
    gate = threading.Lock()
    gate.acquire()
    monkeypatch.setattr(engine, "step_lock", gate)
    aborts = engine.stats().request_success_total.get("abort", 0)

    def open_gate():
        asked.wait(20)
        gate.release()

    opener = threading.Thread(target=open_gate)
    opener.start()
    body = {"prompt": "Hello", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": stream}
    try:
        data = raw(real.port, post_bytes("/v1/completions", body, extra=f"Authorization: Bearer {KEY}\r\n".encode()),
                   half_close=True)
    finally:
        opener.join()
    assert asked.is_set()
    if stream:
        assert split_response(data)[0] == 200 and b'"finish_reason":"length"' not in data
    else:
        assert data == b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (engine.stats().request_success_total.get("abort", 0) == aborts
                                           or engine.stats().num_running):
        time.sleep(0.01)
    assert engine.stats().request_success_total.get("abort", 0) == aborts + 1
    assert engine.stats().num_running == 0


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v1/models", None), ("GET", "/v1/models/tiny-llama", None),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}),
    ("POST", "/tokenize", {"prompt": "a"}), ("POST", "/detokenize", {"tokens": [1]}),
    ("GET", "/version", None), ("GET", "/metrics", None), ("GET", "/openapi.json", None)])
def test_authed_routes_are_401_without_the_key(real, method, path, body):
    assert request(real.port, method, path, body)[0] == 401
    assert request(real.port, method, path, body, headers=AUTH)[0] == 200
    assert request(real.port, "GET", "/health")[0] == 200


def test_models_retrieve(real):
    client = _client(real)
    assert client.models.retrieve("tiny-llama").id == "tiny-llama"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    root = client.models.list().data[0].model_extra["root"]
    assert "/" not in root


def test_logit_bias_changes_greedy_output(real, engine_parts):
    from lite_llm.server.logprobs import token_bytes
    tok = engine_parts[1]
    client = _client(real)
    kw = dict(model="tiny-llama", messages=[{"role": "user", "content": "Hello world"}], max_tokens=6,
              temperature=0, logprobs=True, extra_body={"ignore_eos": True})
    plain = client.chat.completions.create(**kw)
    first = plain.choices[0].logprobs.content[0].bytes
    greedy = [i for i in range(tok.vocab_size)
              if token_bytes(tok, i, tok.decode([i], skip_special_tokens=False)) == first]
    assert greedy
    banned = client.chat.completions.create(**kw, logit_bias={str(i): -100 for i in greedy})
    assert banned.choices[0].logprobs.content[0].bytes != first
    # a +100 bias makes one token win every step
    target = next(i for i in range(100, 200) if i not in greedy)
    forced = client.chat.completions.create(**kw, logit_bias={str(target): 100})
    assert [c.bytes for c in forced.choices[0].logprobs.content] == [token_bytes(
        tok, target, tok.decode([target], skip_special_tokens=False))] * 6


def test_reasoning_content_split_on_a_think_template(real):
    client = _client(real)
    msgs = [{"role": "user", "content": "Hi"}]
    kw = dict(model="tiny-llama", messages=msgs, max_tokens=10, temperature=0,
              extra_body={"chat_template": THINK_TEMPLATE, "ignore_eos": True})
    out = client.chat.completions.create(**kw).choices[0].message
    plain = client.completions.create(model="tiny-llama", prompt=json.loads(request(
        real.port, "POST", "/tokenize", {"messages": msgs, "chat_template": THINK_TEMPLATE,
                                         "return_token_strs": False}, headers=AUTH)[2])["tokens"],
        max_tokens=10, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    # deepseek_r1: the template opened <think>; without a </think> the whole answer is reasoning
    if "</think>" in plain:
        reasoning, content = plain.split("</think>", 1)
    else:
        reasoning, content = plain, ""
    assert out.reasoning_content == (reasoning or None)
    assert out.content == content
    streamed_r, streamed_c = "", ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed_r += getattr(c.delta, "reasoning_content", None) or ""
            streamed_c += c.delta.content or ""
    assert (streamed_r, streamed_c) == (reasoning, content)


def test_tool_call_and_result_round_trip_on_a_qwen3_checkpoint(tiny_checkpoint):
    """A tiny Qwen3 model behind a Qwen-style tool template: tools and a tool call + result are
    rendered into the prompt the real engine runs (the random weights will not call a tool:
    parsing is covered by test_tool_calls.py)."""
    from lite_llm.llm import build_async_engine

    from .test_tool_calls import TOOL_TEMPLATE, TOOLS
    path = tiny_checkpoint("qwen3", head_dim=16, max_position_embeddings=512)
    engine, tokenizer, info = build_async_engine(model=str(path), max_model_len=512, kv_cache_space=0.05,
                                                 max_num_seqs=4, dtype="float32")
    server = create_server(engine, tokenizer, "tiny-qwen3", info["max_model_len"], kernel_info=info,
                           vocab_size=info.get("vocab_size"), chat_template=TOOL_TEMPLATE)
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": None, "tool_calls": [{
                        "id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
        out = client.chat.completions.create(model="tiny-qwen3", messages=messages, tools=TOOLS,
                                             max_tokens=4, temperature=0)
        assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
        ids = json.loads(request(server.port, "POST", "/tokenize", {"messages": messages, "tools": TOOLS})[2])["tokens"]
        assert out.usage.prompt_tokens == len(ids)
        text = tokenizer.decode(ids, skip_special_tokens=False)
        assert '"name": "get_weather"' in text and "<tool_response>\n21 C\n</tool_response>" in text
    finally:
        server.drain(5.0)
