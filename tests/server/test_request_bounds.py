"""Small bounds over real HTTP: /tokenize holds no more tokens than the context; a client's
request_id names its response but never an engine request (two requests naming the same one
both run, neither can refuse or abort the other); a chat-shaped request naming no max_tokens
stops at --default-max-tokens; a request line's control bytes reach the access log escaped."""
from __future__ import annotations

import argparse
import json
import logging
import socket
import threading
import time

import pytest

from lite_llm.server.app import DEFAULT_MAX_TOKENS, add_arguments, build_server

from .conftest import MAX_MODEL_LEN, error_of, make_tokenizer, request, start_server, stop_server
from .fake_model import fake_runner_engine


@pytest.fixture(scope="module")
def srv():
    s = start_server(engine_overrides={"step_seconds": 0.002})
    yield s
    stop_server(s)


# ---- /tokenize -----------------------------------------------------------------------------------

def test_tokenize_refuses_more_tokens_than_the_context(srv):
    # '@' is in no merge of the test tokenizer: a token per character, so a text well within the
    # byte bound (a token is at most max_bytes_per_token bytes) still tokenizes past the context
    per_token = srv.tokenizer.max_bytes_per_token()
    text = "@" * (per_token * (MAX_MODEL_LEN - 1))
    assert len(srv.tokenizer.encode(text, add_special_tokens=False)) > MAX_MODEL_LEN
    status, _, body = request(srv.port, "POST", "/tokenize", {"prompt": text})
    err = error_of(body)
    assert status == 400 and err["param"] == "prompt"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in err["message"] and "@" not in err["message"]
    status, _, body = request(srv.port, "POST", "/tokenize",
                              {"messages": [{"role": "user", "content": text}]})
    err = error_of(body)
    assert status == 400 and err["param"] == "messages" and str(MAX_MODEL_LEN) in err["message"]
    # within the context: counted as before
    status, _, body = request(srv.port, "POST", "/tokenize", {"prompt": "@" * (MAX_MODEL_LEN - 8)})
    assert status == 200 and MAX_MODEL_LEN - 8 <= json.loads(body)["count"] <= MAX_MODEL_LEN


# ---- request_id ----------------------------------------------------------------------------------

def _in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=fn(*args)))
    t.start()
    return t, out


def test_two_requests_naming_the_same_request_id_both_run():
    s = start_server(engine_overrides={"step_seconds": 0.005})
    try:
        body = {"prompt": "Hello", "max_tokens": 60, "request_id": "job-7"}
        first, got = _in_thread(request, s.port, "POST", "/v1/completions", body)
        time.sleep(0.1)              # the first is running when the second arrives
        status, _, data = request(s.port, "POST", "/v1/completions",
                                  {"prompt": "Hi there", "max_tokens": 60, "request_id": "job-7"})
        first.join(30)
        assert status == 200, data
        assert json.loads(data)["id"] == "cmpl-job-7"           # the client's id names its response
        assert json.loads(data)["usage"]["completion_tokens"] == 60
        status, _, data = got["r"]
        assert status == 200 and json.loads(data)["id"] == "cmpl-job-7"
        assert json.loads(data)["usage"]["completion_tokens"] == 60
    finally:
        stop_server(s)


def test_a_client_leaving_aborts_only_its_own_request_of_a_shared_request_id():
    s = start_server(engine_overrides={"step_seconds": 0.005})
    try:
        other, got = _in_thread(request, s.port, "POST", "/v1/completions",
                                {"prompt": "Hello", "max_tokens": 150, "request_id": "shared"})
        time.sleep(0.1)
        data = json.dumps({"prompt": "Hello", "max_tokens": 150, "request_id": "shared", "stream": True}).encode()
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")     # streaming: it runs beside the other
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()                                                              # RST
        other.join(30)
        status, _, data = got["r"]
        answer = json.loads(data)
        assert status == 200 and answer["id"] == "cmpl-shared"
        assert answer["usage"]["completion_tokens"] == 150 and answer["choices"][0]["finish_reason"] == "length"
        deadline = time.monotonic() + 5
        while not s.engine.aborted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(s.engine.aborted) == 1            # the leaver's, and only it
    finally:
        stop_server(s)


# ---- --default-max-tokens ------------------------------------------------------------------------

def test_serve_defaults_cap_an_unbounded_responses_request():
    # `serve`'s own defaults over a model with a long context: {"input": ""} ran to the end of
    # the context (8k tokens on SmolLM2) before a default output cap
    tokenizer = make_tokenizer()
    max_model_len = 2 * DEFAULT_MAX_TOKENS + 64
    engine = fake_runner_engine(tokenizer, max_model_len=max_model_len, step_seconds=0.0)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    info = {"max_model_len": max_model_len, "kernel_variant": "fake", "num_threads": 1,
            "weight_bytes": 1 << 20, "model_name": "tiny", "vocab_size": tokenizer.vocab_size}
    server = build_server(parser.parse_args([]), engine, tokenizer, info, host="127.0.0.1", port=0)
    server.start()
    try:
        status, _, data = request(server.port, "POST", "/v1/responses", {"input": ""})
        assert status == 200, data
        assert json.loads(data)["usage"]["output_tokens"] == DEFAULT_MAX_TOKENS
    finally:
        server.drain(2.0)


@pytest.fixture(scope="module")
def capped():
    s = start_server(engine_overrides={"step_seconds": 0.0}, default_max_tokens=24)
    yield s
    stop_server(s)


@pytest.mark.parametrize("path,body,count", [
    ("/v1/responses", {"input": ""}, lambda r: r["usage"]["output_tokens"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]},
     lambda r: r["usage"]["completion_tokens"]),
    ("/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "Hi"}],
                                                 [{"role": "user", "content": "Yo"}]]},
     lambda r: r["usage"]["completion_tokens"] / 2),
    ("/invocations", {"messages": [{"role": "user", "content": "Hi"}]}, lambda r: r["usage"]["completion_tokens"]),
])
def test_default_max_tokens_caps_what_names_no_max_tokens(capped, path, body, count):
    status, _, data = request(capped.port, "POST", path, body)
    assert status == 200, data
    assert count(json.loads(data)) == 24


def test_default_max_tokens_leaves_explicit_ones_and_completions_alone(capped):
    status, _, data = request(capped.port, "POST", "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40})
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 40
    status, _, data = request(capped.port, "POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 40})
    assert status == 200 and json.loads(data)["usage"]["output_tokens"] == 40
    status, _, data = request(capped.port, "POST", "/v1/completions", {"prompt": "Hi"})
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 16     # OpenAI's default


def test_default_max_tokens_flag_is_checked():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--default-max-tokens", "0"]).default_max_tokens == 0
    assert parser.parse_args([]).default_max_tokens == DEFAULT_MAX_TOKENS


# ---- the access log ------------------------------------------------------------------------------

def _access_lines(caplog, port: int, raw: bytes) -> list[str]:
    with caplog.at_level(logging.INFO, logger="lite_llm.server.access"):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock.sendall(raw)
            got = sock.recv(65536)
        finally:
            sock.close()
        assert got.startswith(b"HTTP/1.1 4")
        deadline = time.monotonic() + 10      # the line is written once the answer is sent
        while time.monotonic() < deadline and not [r for r in caplog.records if r.name == "lite_llm.server.access"
                                                   and " 40" in r.getMessage()]:
            time.sleep(0.01)
    return [r.getMessage() for r in caplog.records if r.name == "lite_llm.server.access"]


@pytest.mark.parametrize("line,shown", [
    (b"GET /a\x00b HTTP/1.1", '"GET /a\\x00b"'),
    (b"GET /\x1b[2J\x7f\" HTTP/1.1", '"GET /\\x1b[2J\\x7f\\x22"'),
    (b"G\x01T /v1/models HTTP/1.1", '"G\\x01T /v1/models"'),
])
def test_access_log_escapes_control_bytes_of_the_request_line(srv, caplog, line, shown):
    lines = _access_lines(caplog, srv.port, line + b"\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert any(shown in x for x in lines), lines
    assert not [x for x in lines if any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in x)], lines


# ---- found by schemathesis -------------------------------------------------------------------------

@pytest.mark.parametrize("role", [{}, [], 3])
def test_a_role_that_is_no_string_is_a_400(srv, role):
    status, _, body = request(srv.port, "POST", "/v1/chat/completions",
                              {"messages": [{"role": role, "content": "Hi"}]})
    assert status == 400 and error_of(body)["param"] == "messages[0].role"


def test_integral_numbers_count_as_integers(srv):
    # JSON Schema (and pydantic, under vLLM) take 2.0 for an integer; the server does too
    status, _, body = request(srv.port, "POST", "/detokenize", {"tokens": [65.0, 66]})
    assert status == 200, body
    status, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3.0})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    status, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3.5})
    assert status == 400 and error_of(body)["param"] == "max_tokens"
