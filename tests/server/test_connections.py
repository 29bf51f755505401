"""Connection slots under a flood: probes answered from reserved connections, a per-address cap
on by default, and connections reset by their clients logged as one debug line, not a traceback.

A flood (520 long requests from one address against 512 connection slots) is
scaled down: 8 slots, a dozen long requests."""
from __future__ import annotations

import logging
import socket
import struct
import time

import pytest

from lite_llm.server.app import PROBE_CONNECTIONS

from .conftest import error_of, request, start_server, stop_server
from .test_hardening import post_bytes, split_response
from .watchdog import Watchdog

LONG = {"prompt": "Hi", "max_tokens": 400}      # 20 s at 50 ms a step: busy for the whole test


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def _read_to_end(sock: socket.socket) -> bytes:
    got = b""
    while part := sock.recv(65536):
        got += part
    return got


def _in_engine(served) -> int:
    st = served.engine.stats()
    return st.num_running + st.num_waiting


def _occupy(served, n: int, source: str = "127.0.0.1") -> tuple[list[socket.socket], list[bytes]]:
    """Open n connections from source, one at a time, each sending a long request: (the ones
    whose request reached the engine, the refusals the others got)."""
    busy, refused = [], []
    for _ in range(n):
        before = _in_engine(served)
        sock = _connect(served.port, source)
        sock.sendall(post_bytes("/v1/completions", LONG, close=False))
        sock.settimeout(0.01)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _in_engine(served) > before:
                busy.append(sock)
                break
            try:
                got = sock.recv(65536)
            except TimeoutError:
                continue
            sock.settimeout(10)
            refused.append(got + _read_to_end(sock))
            sock.close()
            break
        else:
            raise AssertionError("a connection was neither served nor refused")
    return busy, refused


def _assert_connection_limit(data: bytes, status_expected: int = 503) -> None:
    """A refusal for want of a connection: 503 when the server is full, 429 when the client's
    own address holds its share."""
    status, headers, body = split_response(data)
    assert status == status_expected and "retry-after" in headers
    assert error_of(body[:int(headers["content-length"][0])])["code"] == "too_many_connections"


def test_probes_answer_when_every_connection_is_busy():
    """Every slot busy with a long request: new connections get 503 for work, but /health (every
    0.5 s from the watchdog), /ping, /metrics, /version and /v1/models still answer."""
    s = start_server(max_connections=8, max_connections_per_client=0, engine_overrides={"step_seconds": 0.05})
    busy: list[socket.socket] = []
    try:
        busy, refused = _occupy(s, 8)
        assert len(busy) == 8 and not refused
        refusals, probes = [], {}
        with Watchdog(s.port, s.model, completion=False) as dog:
            for _ in range(PROBE_CONNECTIONS + 4):        # more than the reserved slots, one at a time
                sock = _connect(s.port)
                sock.sendall(post_bytes("/v1/completions", LONG))
                refusals.append(_read_to_end(sock))
                sock.close()
            for path in ("/ping", "/metrics", "/version", "/v1/models"):
                status, headers, _ = request(s.port, "GET", path)
                probes[path] = (status, headers.get("connection"))
            time.sleep(2.0)
        print(f"\n8/8 connections busy: {dog.summary()}")
        dog.check(min_probes=3)
        for data in refusals:
            _assert_connection_limit(data)
        # a reserved connection serves one request
        assert probes == {path: (200, "close") for path in probes}
        assert _in_engine(s) == 8                                 # the refused ones never reached it
    finally:
        for sock in busy:
            sock.close()
        stop_server(s)


def test_one_address_cannot_take_every_connection():
    """The per-address cap is on by default (half the slots): a client flooding from one address
    gets 429 beyond it, its own /health probes still answer, and a client on another address
    is served throughout (watchdog: /health and a 4-token completion from 127.0.0.2)."""
    s = start_server(max_connections=8, engine_overrides={"step_seconds": 0.05})
    busy: list[socket.socket] = []
    try:
        busy, refused = _occupy(s, 12)
        with Watchdog(s.port, s.model, source="127.0.0.2") as dog:
            time.sleep(3.0)
            own_health = request(s.port, "GET", "/health")[0]       # from the flooding address
        print(f"\n12 long requests from one address, 8 slots ({len(busy)} taken): {dog.summary()}")
        dog.check(min_probes=3)
        assert s.server.max_connections_per_client == 4
        assert len(busy) == 4 and len(refused) == 8
        for data in refused:
            _assert_connection_limit(data, 429)
        assert own_health == 200
    finally:
        for sock in busy:
            sock.close()
        stop_server(s)


# ---- resets ------------------------------------------------------------------------------------

def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # RST, not FIN
    sock.close()


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        part = sock.recv(65536)
        assert part, got
        got += part
    return got


def _idle_keep_alive(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    _read_until(sock, b"\r\n\r\n")
    return sock


def _mid_headers(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nAcc")
    return sock


def _mid_body(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
    return sock


def _mid_answer(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(post_bytes("/v1/completions", {"prompt": "Hello", "max_tokens": 200}, close=False))
    return sock


def _mid_stream(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(post_bytes("/v1/completions", {"prompt": "Hello", "max_tokens": 200, "stream": True},
                            close=False))
    _read_until(sock, b"data: {")
    return sock


def _unread_response(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: t\r\n\r\n" * 20)    # its answers fill the buffers
    return sock


PHASES = {"idle keep-alive": _idle_keep_alive, "mid-headers": _mid_headers, "mid-body": _mid_body,
          "mid-answer": _mid_answer, "mid-stream": _mid_stream, "unread response": _unread_response}


@pytest.mark.parametrize("phase", PHASES)
def test_a_reset_is_one_debug_line_not_a_traceback(phase, caplog, capfd):
    """A client resetting its connection (as load tools do to idle keep-alive connections) is
    routine: no traceback on stderr or in the log, the server keeps serving."""
    s = start_server(engine_overrides={"step_seconds": 0.01})
    try:
        caplog.set_level(logging.DEBUG, logger="lite_llm")
        for _ in range(3):
            sock = PHASES[phase](s.port)
            time.sleep(0.2)                      # the server is waiting on it in that phase
            _reset(sock)
        deadline = time.monotonic() + 10
        while s.server.num_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.server.num_connections == 0
        assert request(s.port, "GET", "/health")[0] == 200
        err = capfd.readouterr().err
        assert "Traceback" not in err, err[-2000:]
        noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
        assert not noisy, [(r.levelname, r.getMessage()) for r in noisy]
        if phase in ("idle keep-alive", "mid-headers"):      # the thread ended on the reset itself
            ended = [r for r in caplog.records if "ConnectionResetError" in r.getMessage()]
            assert ended and all(r.levelno == logging.DEBUG for r in ended)
    finally:
        stop_server(s)


def test_an_unexpected_connection_error_is_logged_with_its_traceback(caplog):
    """Only the peer's departures are quiet: another exception that ends a connection's thread
    is an error in the log, with its traceback."""
    s = start_server()
    try:
        caplog.set_level(logging.DEBUG, logger="lite_llm")
        try:
            raise RuntimeError("a bug")
        except RuntimeError:
            s.server.handle_error(None, ("127.0.0.1", 1))
        [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert record.exc_info and "127.0.0.1" in record.getMessage()
    finally:
        stop_server(s)
