"""Malformed and hostile bodies on the Responses, Messages, count_tokens, chat batch and
/invocations routes: never a 5xx, each error in its API's shape, the server serving throughout;
a client that leaves a Responses or Messages request has it aborted."""
from __future__ import annotations

import json
import random

import pytest

from .conftest import request, start_server, stop_server
from .test_bad_input_sweep import HOSTILE_VALUES, RAW_BODIES, post_all, sweep_server  # noqa: F401 (a fixture)

ROUTES = {
    "/v1/responses": ({"model": "tiny", "input": "Hello", "max_output_tokens": 2},
                      ["input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
                       "text", "reasoning", "store", "previous_response_id", "background", "stream", "metadata",
                       "parallel_tool_calls", "truncation", "include", "model"]),
    "/v1/messages": ({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]},
                     ["messages", "max_tokens", "system", "stop_sequences", "temperature", "top_k", "top_p", "tools",
                      "tool_choice", "thinking", "stream", "metadata", "output_config", "model"]),
    "/v1/messages/count_tokens": ({"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]},
                                  ["messages", "system", "tools", "tool_choice", "thinking", "model"]),
    "/v1/chat/completions/batch": ({"messages": [[{"role": "user", "content": "Hello"}]], "max_tokens": 2},
                                   ["messages", "max_tokens", "temperature", "stop", "n", "stream", "tools"]),
    "/invocations": ({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2},
                     ["messages", "prompt", "max_tokens", "stream", "n"]),
}
ITEMS = [{"type": "function_call"}, {"type": "function_call_output", "call_id": 1}, {"type": "reasoning", "content": 5},
         {"role": "user", "content": [{"type": "input_text"}]}, {"type": "message", "role": "tool", "content": "x"},
         {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": []}]},
         {"role": "user", "content": [{"type": "tool_result"}]}, {"role": "user", "content": [{"type": "image"}]}]


def _bodies(rng: random.Random) -> list[tuple[str, bytes]]:
    out = []
    for path, (base, fields) in ROUTES.items():
        for field in fields:
            for value in rng.sample(HOSTILE_VALUES, 6) + [rng.choice(ITEMS), [rng.choice(ITEMS)]]:
                out.append((path, json.dumps({**base, field: value}).encode()))
        for raw in RAW_BODIES:
            out.append((path, raw))
    return out


def _error_in_its_apis_shape(path: str, data: bytes) -> None:
    err = json.loads(data)
    if path.startswith("/v1/messages"):
        assert err["type"] == "error" and set(err["error"]) == {"type", "message"}, data[:200]
    else:
        assert set(err["error"]) >= {"message", "type", "param", "code"}, data[:200]


def test_hostile_bodies_never_5xx_and_errors_keep_each_apis_shape(sweep_server):
    bodies = _bodies(random.Random(1))
    assert len(bodies) > 400
    statuses = post_all(sweep_server.port, bodies, _error_in_its_apis_shape)
    assert statuses.get(400, 0) > 300 and statuses.get(200, 0) > 10
    for path, (base, _) in ROUTES.items():
        assert request(sweep_server.port, "POST", path, base)[0] == 200, path


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"model": "tiny", "input": "Hello", "max_output_tokens": 400, "stream": True}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 400, "stream": True,
                      "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 400, "messages": [{"role": "user", "content": "Hi"}]}),
])
def test_a_client_leaving_aborts_its_request(path, body):
    import socket
    import struct
    import time
    s = start_server(engine_overrides={"step_seconds": 0.01})        # 400 tokens: seconds unless aborted
    try:
        data = json.dumps(body).encode()
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), len(data), data))
        if body.get("stream"):
            got = b""
            while b"delta" not in got:         # text deltas are flowing
                got += sock.recv(4096)
        else:
            time.sleep(0.2)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # a reset
        sock.close()
        deadline = time.monotonic() + 10
        while not s.engine.aborted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(s.engine.aborted) == 1 and s.engine.stats().num_running == 0
    finally:
        stop_server(s)
