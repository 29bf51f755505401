"""Clients that leave early (a reset or a FIN) get their requests aborted and their sequences
freed; a client that pipelines its next request is still there; 16 concurrent streams are batched."""
from __future__ import annotations

import itertools
import json
import socket
import struct
import threading
import time

import pytest

from .conftest import metric_value, start_server, stop_server
from .test_hardening import post_bytes


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
    if not stream:      # a reset here; FINs below
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    assert _wait_metric(slow.port, "lite_llm:num_requests_running", lambda v: v == 0) == 0
    after = _wait_metric(slow.port, "lite_llm:request_success_total", lambda v: v == aborts + 1,
                         {"finished_reason": "abort"})
    assert after == aborts + 1
    if hasattr(slow.engine, "aborted"):
        assert len(slow.engine.aborted) >= 1
    assert metric_value(slow.port, "lite_llm:num_requests_waiting") == 0


def _seconds_until(pred, deadline: float = 10.0) -> float | None:
    """Seconds until pred() held (polled every 5 ms), or None if it did not within deadline."""
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        if pred():
            return time.monotonic() - start
        time.sleep(0.005)
    return None


@pytest.mark.parametrize("stream,how", [(False, "half-close"), (False, "close"), (True, "half-close")])
def test_fin_aborts_the_request_and_frees_its_sequences(slow, stream, how):
    """A client that closes politely (FIN: a half-close after its request, or a full close)
    while its answer is computed has left, as uvicorn and Go's net/http treat it: its engine
    request is aborted and its sequence and KV blocks are freed within a second, not when the
    400 tokens (4 s) are done. A stream is aborted before it writes anything (a long prefill)."""
    engine = slow.engine
    before = len(engine.aborted)
    assert _seconds_until(lambda: engine.stats().num_running == 0) is not None
    idle_usage = engine.stats().kv_cache_usage
    sock = _post(slow.port, {"prompt": "Hello", "max_tokens": 400, "stream": stream})
    try:
        assert _seconds_until(lambda: engine.stats().num_running == 1) is not None
        if how == "half-close":
            sock.shutdown(socket.SHUT_WR)
        else:
            sock.close()
        to_abort = _seconds_until(lambda: len(engine.aborted) > before)
        to_free = _seconds_until(lambda: engine.stats().num_running == 0
                                 and engine.stats().kv_cache_usage <= idle_usage)
        print(f"\nFIN ({how}, stream={stream}) -> abort after {to_abort} s, sequences freed after {to_free} s")
        assert to_abort is not None and to_abort < 1.0, to_abort
        assert to_free is not None and to_free < 1.0, to_free
        if how == "half-close":           # the client can still read: nothing more comes
            sock.settimeout(5)
            got = b""
            while part := sock.recv(65536):
                got += part
            assert stream or got == b""
            assert b'"finish_reason":"length"' not in got
    finally:
        sock.close()


@pytest.mark.parametrize("when", ["with the first", "while the first runs"])
def test_a_client_that_pipelines_is_alive(slow, when):
    """Bytes of a next request before the FIN (already read into the server's buffer, or readable
    on the socket while the first answer is computed) show the client is there: both answered."""
    before = len(slow.engine.aborted)
    first = post_bytes("/v1/completions", {"prompt": "Hello", "max_tokens": 40, "temperature": 0}, close=False)
    second = b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", slow.port), timeout=10)
    try:
        if when == "with the first":
            sock.sendall(first + second)
        else:
            sock.sendall(first)
            assert _seconds_until(lambda: slow.engine.stats().num_running == 1) is not None
            sock.sendall(second)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while part := sock.recv(65536):
            got += part
    finally:
        sock.close()
    assert got.count(b"HTTP/1.1 200 ") == 2, got[:300]
    answer = json.loads(got.split(b"\r\n\r\n", 1)[1].split(b"HTTP/1.1 ", 1)[0])
    assert answer["usage"]["completion_tokens"] == 40
    assert slow.engine.aborted[before:] == []


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
