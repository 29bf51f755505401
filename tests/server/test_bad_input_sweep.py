"""Hundreds of malformed or hostile requests: never a 5xx, never a dead server, /health stays 200."""
from __future__ import annotations

import http.client
import json
import random
import socket
import threading

import pytest

from .conftest import request, start_server, stop_server

HOSTILE_VALUES = [None, True, False, 0, -1, 1, 2 ** 31, -(2 ** 63) - 1, 2 ** 64, 10 ** 40, 1e308, -1e308,
                  1e-320, 0.5, "", "x", "x" * 20000, "\u0000", "🙂" * 50, "<|im_end|>", [], {}, [[]],
                  [None], [1, 2, 3], [-1], ["a", 1], [[1], ["a"]], {"a": 1}, {"include_usage": "yes"},
                  [{"role": "user", "content": None}], [{"role": "user"}], [{"content": "x"}],
                  [{"role": "user", "content": [{"type": "text"}]}], [[[[[[[[[[[]]]]]]]]]]]]
FIELDS = ["prompt", "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop",
          "stop_token_ids", "ignore_eos", "n", "logprobs", "top_logprobs", "echo", "stream",
          "stream_options", "user", "min_tokens", "tools", "logit_bias", "best_of", "chat_template",
          "add_generation_prompt", "skip_special_tokens", "include_stop_str_in_output"]
RAW_BODIES = [
    b"", b" ", b"{", b"}", b"[", b"null", b"true", b"1e999999", b'{"prompt": 1e999}',
    b"\xff" * 64, b"\xc3\x28", b'{"prompt": "\xed\xa0\x80"}', b'{"prompt": "\\ud800"}',
    b'{"messages": [{"role": "user", "content": "\\udfff"}]}', b'{"prompt": "a" "b"}',
    b"[" * 100000 + b"]" * 100000, b'{"prompt": ' + b"[" * 50000 + b"]" * 50000 + b"}",
    b'{"a":' * 20000 + b"1" + b"}" * 20000, b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}",
    b'{"prompt": "a", "prompt": 5}', b'{"prompt": NaN}', b'{"prompt": "a", "temperature": -Infinity}',
    b"\x00\x00\x00", b'{"prompt":"a"}\x00', b'\xef\xbb\xbf{"prompt": "a"}',
    json.dumps({"prompt": "a", "n": 128, "max_tokens": 1}).encode()[:-3],
]


def _bodies(rng: random.Random) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for path in ("/v1/completions", "/v1/chat/completions"):
        base = {"prompt": "Hello"} if path == "/v1/completions" else {
            "messages": [{"role": "user", "content": "Hello"}]}
        for field in FIELDS:
            for value in rng.sample(HOSTILE_VALUES, 6):
                body = {**base, "max_tokens": 2, field: value}
                out.append((path, json.dumps(body).encode()))
        for raw in RAW_BODIES:
            out.append((path, raw))
    for path in ("/tokenize", "/detokenize"):
        for value in rng.sample(HOSTILE_VALUES, 15):
            out.append((path, json.dumps({"prompt": value, "tokens": value, "messages": value}).encode()))
            out.append((path, json.dumps({"tokens": [value]}).encode()))
    return out


@pytest.fixture(scope="module")
def sweep_server():
    s = start_server(max_body_bytes=1 << 20, request_timeout=1.0, header_timeout=1.0, body_timeout=1.0,
                     engine_overrides={"step_seconds": 0.0005})
    yield s
    stop_server(s)


def post_all(port: int, bodies: list[tuple[str, bytes]], check_error) -> dict[int, int]:
    """POST every (path, body) over keep-alive connections: never a 5xx, each error body passed
    to check_error(path, data), /health answering every 25 bodies and after the last. Returns
    {status: count}."""
    statuses: dict[int, int] = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for i, (path, body) in enumerate(bodies):
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (ConnectionError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            continue
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        assert resp.status < 500, (path, body[:200], data[:300])
        if resp.status != 200:
            check_error(path, data)
        if resp.will_close:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        if i % 25 == 0:
            assert request(port, "GET", "/health")[0] == 200
    conn.close()
    assert request(port, "GET", "/health")[0] == 200
    return statuses


def _is_an_error(path: str, data: bytes) -> None:
    assert "error" in json.loads(data), data[:200]


def test_bad_json_bodies_never_5xx(sweep_server):
    bodies = _bodies(random.Random(0))
    assert len(bodies) > 300
    assert post_all(sweep_server.port, bodies, _is_an_error).get(400, 0) > 200
    assert request(sweep_server.port, "POST", "/v1/completions", {"prompt": "ok", "max_tokens": 2})[0] == 200


RAW_REQUESTS = [
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffff\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
    b"GET /health HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
    b"GET /health HTTP/1.1\r\nX: " + b"b" * 70000 + b"\r\n\r\n",
    b"GET /health HTTP/7.0\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),   # a TLS hello
    b"FOO /health HTTP/1.1\r\n\r\n",
    b"GET /health?x=%ff%00 HTTP/1.1\r\n\r\n",
    b"GET //..//..//etc/passwd HTTP/1.1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n" + b"{}" + b"\r\n" * 4,
    b"POST /tokenize HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n",
]


def _raw(port: int, data: bytes) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got
    except ConnectionResetError:
        return b""
    finally:
        sock.close()


def test_raw_protocol_abuse_never_5xx(sweep_server):
    port = sweep_server.port
    for data in RAW_REQUESTS:
        got = _raw(port, data)
        for line in got.split(b"\r\n"):
            if line.startswith(b"HTTP/1."):
                status = int(line.split()[1])
                assert status < 500 or status == 505, (data[:80], got[:300])   # 505: HTTP/7.0
        assert request(port, "GET", "/health")[0] == 200


def test_half_sent_requests_time_out_and_server_keeps_serving(sweep_server):
    port = sweep_server.port
    partials = [
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"",
        b"POST /v1/completions HTTP/1.1\r\nContent-Le",
        b"GET /health HTTP/1.1\r\nHost: x\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"mess",
        b"P",
    ] * 4
    results: list[bytes | None] = [None] * len(partials)

    def one(i: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        try:
            sock.sendall(partials[i])         # ...and never the rest
            got = b""
            while chunk := sock.recv(65536):  # the server must give up on us and close
                got += chunk
            results[i] = got
        except ConnectionResetError:
            results[i] = b""
        finally:
            sock.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(partials))]
    for t in threads:
        t.start()
    # while they hang, others are served
    assert request(port, "POST", "/v1/completions", {"prompt": "ok", "max_tokens": 2})[0] == 200
    for t in threads:
        t.join()
    for got in results:
        assert got is not None
        assert not got or got.startswith(b"HTTP/1.1 408") or got.startswith(b"HTTP/1.1 400"), got[:200]
    assert request(port, "GET", "/health")[0] == 200


def test_oversized_body_rejected(sweep_server):
    big = b'{"prompt": "' + b"a" * (2 << 20) + b'"}'
    status, headers, data = request(sweep_server.port, "POST", "/v1/completions", raw=big)
    assert status == 413 and json.loads(data)["error"]["code"] == 413
    assert request(sweep_server.port, "GET", "/health")[0] == 200
