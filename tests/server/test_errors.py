"""Every error status over raw HTTP: OpenAI's error shape, and the server keeps serving after it."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from .conftest import error_of, request, start_server, stop_server

PATH = "/v1/completions"


def _ok(port: int) -> None:
    status, _, data = request(port, "POST", PATH, {"prompt": "Hello", "max_tokens": 2})
    assert status == 200, data
    assert request(port, "GET", "/health")[0] == 200


@pytest.mark.parametrize("raw", [b"{", b"not json", b"[1, 2]", b'"text"', b"\xff\xfe{}",
                                 b'{"prompt": NaN}', b'{"prompt": "a", "max_tokens": Infinity}', b""])
def test_400_bad_json(served, raw):
    status, headers, data = request(served.port, "POST", PATH, raw=raw)
    assert status == 400 and error_of(data)["type"] == "invalid_request_error"
    assert headers["content-type"] == "application/json"
    _ok(served.port)


@pytest.mark.parametrize("body,param", [
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [10 ** 9]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "a", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "a", "max_tokens": True}, "max_tokens"),
    ({"prompt": "a", "temperature": -1}, "temperature"),
    ({"prompt": "a", "temperature": "hot"}, "temperature"),
    ({"prompt": "a", "top_p": 0}, "top_p"),
    ({"prompt": "a", "top_p": 1.5}, "top_p"),
    ({"prompt": "a", "top_k": -5}, "top_k"),
    ({"prompt": "a", "min_p": 2}, "min_p"),
    ({"prompt": "a", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "a", "frequency_penalty": -2.5}, "frequency_penalty"),
    ({"prompt": "a", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "a", "n": 0}, "n"),
    ({"prompt": "a", "n": 10 ** 6}, "n"),
    ({"prompt": "a", "seed": 2 ** 70}, "seed"),
    ({"prompt": "a", "seed": 1.5}, "seed"),
    ({"prompt": "a", "stop": [""]}, "stop"),
    ({"prompt": "a", "stop": 3}, "stop"),
    ({"prompt": "a", "stop_token_ids": [1, -2]}, "stop_token_ids"),
    ({"prompt": "a", "logprobs": 21}, "logprobs"),
    ({"prompt": "a", "stream": "yes"}, "stream"),
    ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "a", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"prompt": "a", "model": 7}, "model"),
    ({"prompt": "a", "tools": [{"type": "function"}]}, "tools"),
    ({"prompt": "a", "response_format": {"type": "xml"}}, "response_format"),
    ({"prompt": "a", "suffix": "end"}, "suffix"),
    ({"prompt": "a", "logit_bias": {"5": 1000}}, "logit_bias"),
    ({"prompt": "a", "best_of": 3}, "best_of"),
    ({"prompt": "a", "frobnicate": 1}, "frobnicate"),
    ({"prompt": "a", "max_tokens": 100000}, "max_tokens"),
    ({"prompt": "word " * 600}, "prompt"),        # stretched past max_model_len below
])
def test_400_field_errors_name_the_field(served, body, param):
    if body["prompt"] == "word " * 600:
        body = {"prompt": "word " * (served.server.state.ctx.max_model_len + 8)}
    status, _, data = request(served.port, "POST", PATH, body)
    err = error_of(data)
    assert status == 400, data
    assert err["param"] == param and err["type"] == "invalid_request_error"
    _ok(served.port)


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 10 ** 6}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ raise_exception('no') }}"},
     "chat_template"),      # refused: the server does not trust request-supplied templates
])
def test_400_chat_errors(served, body, param):
    status, _, data = request(served.port, "POST", "/v1/chat/completions", body)
    assert status == 400, data
    assert error_of(data)["param"] == param
    _ok(served.port)


def test_404_unknown_model_and_route(served):
    status, _, data = request(served.port, "POST", PATH, {"model": "gpt-4", "prompt": "x"})
    assert status == 404 and error_of(data)["code"] == "model_not_found"
    for method, path in (("GET", "/nope"), ("POST", "/v1/audio/speech"), ("GET", "/v1/models/x/y")):
        status, _, data = request(served.port, method, path, {"a": 1} if method == "POST" else None)
        assert status == 404 and error_of(data)["type"] == "not_found_error"
    _ok(served.port)


def test_405_wrong_method(served):
    for method, path in (("GET", PATH), ("POST", "/health"), ("DELETE", "/v1/models"), ("PUT", "/tokenize"),
                         ("FROB", "/v1/models")):
        status, headers, data = request(served.port, method, path, {} if method != "GET" else None)
        assert status == 405 and "allow" in headers
        error_of(data)
    _ok(served.port)


def test_413_rejected_before_the_body_is_read():
    s = start_server(max_body_bytes=1024)
    try:
        # the header alone announces 1 GiB: the answer must come without us sending a byte of it
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1073741824\r\n\r\n")
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        assert resp.status == 413
        error_of(resp.read())
        sock.close()
        status, _, _ = request(s.port, "POST", PATH, raw=b'{"prompt": "' + b"a" * 2000 + b'"}')
        assert status == 413
        _ok(s.port)
    finally:
        stop_server(s)


def test_429_queue_full_has_retry_after():
    s = start_server(engine_overrides={"max_queue": 0})
    try:
        status, headers, data = request(s.port, "POST", PATH, {"prompt": "Hello", "max_tokens": 2})
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert error_of(data)["type"] == "rate_limit_error"
        assert request(s.port, "GET", "/health")[0] == 200
    finally:
        stop_server(s)


def test_503_while_draining_and_in_flight_requests_finish():
    s = start_server(engine_overrides={"step_seconds": 0.01})
    try:
        keep = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        keep.request("GET", "/health")
        assert keep.getresponse().read() == b""
        long = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        long.request("POST", PATH, body=json.dumps({"prompt": "Hello", "max_tokens": 60, "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = long.getresponse()
        assert resp.status == 200
        first = resp.readline()              # the stream has begun
        assert first.startswith(b"data: ")
        result = {}
        drainer = threading.Thread(target=lambda: result.setdefault("finished", s.server.drain(20.0)))
        drainer.start()
        while not s.server.state.draining:
            time.sleep(0.005)
        keep.request("POST", PATH, body=json.dumps({"prompt": "x"}), headers={"Content-Type": "application/json"})
        r = keep.getresponse()
        assert r.status == 503 and error_of(r.read())["type"] == "service_unavailable_error"
        rest = first + resp.read()
        drainer.join()
        events = [json.loads(e[6:]) for e in rest.decode().split("\n\n") if e.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "length"     # finished, not cut off
        assert result["finished"] is True
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", s.port), timeout=2).recv(1)
    finally:
        s.server.drain(0.0)


def test_http_level_errors_are_json(served):
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    sock.sendall(b"GARBAGE\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):     # the server closes after a garbled request
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and json.loads(body)["error"]["code"] == 400
    _ok(served.port)


def test_503_when_the_engine_is_stopped():
    s = start_server()
    try:
        assert request(s.port, "GET", "/health")[0] == 200
        s.engine.shutdown(0.0)
        status, _, data = request(s.port, "GET", "/health")
        assert status == 503 and error_of(data)["type"] == "service_unavailable_error"
        status, _, data = request(s.port, "POST", PATH, {"prompt": "x", "max_tokens": 2})
        assert status == 503
        assert request(s.port, "GET", "/metrics")[0] == 200      # still scrapeable
    finally:
        s.server.drain(0.0)


def test_chunked_request_body_and_keep_alive(served):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    body = json.dumps({"prompt": "Hello", "max_tokens": 3}).encode()
    conn.request("POST", PATH, body=iter([body[:7], body[7:]]), encode_chunked=True,
                 headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    first = conn.getresponse()
    assert first.status == 200 and json.loads(first.read())["usage"]["completion_tokens"] == 3
    conn.request("GET", "/v1/models")                     # same connection, kept alive
    second = conn.getresponse()
    assert second.status == 200 and json.loads(second.read())["data"]
    conn.close()
