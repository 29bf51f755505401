"""Connection slots under a flood: probes answered from reserved connections, a per-address cap
on by default.

A flood (520 long requests from one address against 512 connection slots) is
scaled down: 8 slots, a dozen long requests."""
from __future__ import annotations

import socket
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


def _assert_connection_limit(data: bytes) -> None:
    status, headers, body = split_response(data)
    assert status == 503 and "retry-after" in headers
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
    gets 503 beyond it, its own /health probes still answer, and a client on another address
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
            _assert_connection_limit(data)
        assert own_health == 200
    finally:
        for sock in busy:
            sock.close()
        stop_server(s)
