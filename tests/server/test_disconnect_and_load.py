"""Clients that leave early get their requests aborted; 16 concurrent streams are batched."""
from __future__ import annotations

import itertools
import json
import socket
import struct
import threading
import time

import pytest

from .conftest import metric_value, start_server, stop_server


@pytest.fixture(scope="module")
def slow():
    # 10 ms per step: a 400-token request runs for seconds unless aborted
    s = start_server(engine_overrides={"step_seconds": 0.01})
    yield s
    stop_server(s)


def _post(port: int, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def _wait_metric(port: int, name: str, pred, labels: dict | None = None, deadline: float = 20.0) -> float:
    end = time.monotonic() + deadline
    while True:
        value = metric_value(port, name, labels)
        if pred(value) or time.monotonic() > end:
            return value
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_aborts_the_request(slow, stream):
    aborts = metric_value(slow.port, "lite_llm:request_success_total", {"finished_reason": "abort"})
    sock = _post(slow.port, {"prompt": "Hello", "max_tokens": 400, "stream": stream})
    if stream:
        got = b""
        while b"data: {" not in got:          # the stream has started
            got += sock.recv(4096)
    running = _wait_metric(slow.port, "lite_llm:num_requests_running", lambda v: v == 1)
    assert running == 1
    if not stream:
        # a FIN may be a half-close (the client still reads): only a reset aborts before the
        # answer; a stream's next write fails either way
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    assert _wait_metric(slow.port, "lite_llm:num_requests_running", lambda v: v == 0) == 0
    after = _wait_metric(slow.port, "lite_llm:request_success_total", lambda v: v == aborts + 1,
                         {"finished_reason": "abort"})
    assert after == aborts + 1
    if hasattr(slow.engine, "aborted"):
        assert len(slow.engine.aborted) >= 1
    assert metric_value(slow.port, "lite_llm:num_requests_waiting") == 0


def test_16_concurrent_streams_complete_and_run_together(slow):
    """All 16 first tokens arrive before any request finishes: they ran in one batch."""
    import openai
    order = itertools.count()
    firsts: list[int] = []
    finishes: list[int] = []
    texts: list[str] = []
    barrier = threading.Barrier(16)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            client = openai.OpenAI(base_url=slow.url + "/v1", api_key="x", max_retries=0, timeout=60)
            barrier.wait()
            parts, seen_first = [], False
            for chunk in client.chat.completions.create(
                    model=slow.model, messages=[{"role": "user", "content": f"request {i}"}],
                    max_tokens=64, temperature=0, stream=True):
                if not chunk.choices:
                    continue
                c = chunk.choices[0]
                if c.delta.content and not seen_first:
                    seen_first = True
                    with lock:
                        firsts.append(next(order))
                parts.append(c.delta.content or "")
                if c.finish_reason:
                    with lock:
                        finishes.append(next(order))
            texts.append("".join(parts))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(texts) == 16 and all(texts)
    assert len(finishes) == 16 and max(firsts) < min(finishes)
    assert metric_value(slow.port, "lite_llm:num_requests_running") == 0
