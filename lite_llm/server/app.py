"""`lite-llm serve`: the OpenAI-compatible HTTP server on the stdlib's ThreadingHTTPServer.

Here: command-line flags, routes, auth, body limits, SSE streaming, client-disconnect aborts,
draining on SIGINT/SIGTERM. Request validation and response shapes live in openai.py (the
other APIs, answered through run_prepared: responses.py, anthropic.py, vllm_routes.py),
metrics text in metrics.py, the OpenAPI document in openapi.py; the engine (its own thread)
is reached only through AsyncEngine.add_request / abort / stats / shutdown.

Each connection gets a daemon thread (HTTP/1.1 keep-alive). A generation request submits
one engine request per prompt, then its thread only reads that request's stream of deltas.
"""
from __future__ import annotations

import argparse
import errno
import hmac
import io
import logging
import os
import re
import select
import signal
import socket
import socketserver
import sys
import threading
import time
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator
from urllib.parse import unquote, urlsplit

from lite_llm import __version__
from lite_llm.config import KV_CACHE_DTYPES, env, speculative_config_arg
from lite_llm.engine.async_engine import EngineDeadError, EngineShutdownError, QueueFullError
from lite_llm.model.loader import check_model
from lite_llm.sampling_params import RequestOutputKind
from lite_llm.server import anthropic, lora_routes, openai, responses, vllm_routes, webui
from lite_llm.server import pooling as pooling_routes
from lite_llm.server.metrics import ServerMetrics
from lite_llm.server.openai import (ApiError, Choice, PreparedRequest, ServingContext, TokenizeSlots,
                                    max_token_bytes, system_fingerprint)
from lite_llm.server.openapi import openapi_document

logger = logging.getLogger("lite_llm.server")
access_logger = logging.getLogger("lite_llm.server.access")

MAX_BODY_BYTES = 32 * 1024 * 1024      # largest derived body limit (413 beyond it)
MIN_BODY_BYTES = 1 << 20
BODY_BYTES_PER_TOKEN = 64   # a full-context prompt as JSON: ~4 bytes of text a token, x6 when
                            # every character is a \uXXXX escape, and room for a few prompts
MAX_CONNECTIONS = 512
PROBE_CONNECTIONS = 16                 # beyond the connection limits, for /health and the like only
CONNECTION_LIMIT_MESSAGE = "the server is at its connection limit; retry later"
CLIENT_LIMIT_MESSAGE = "too many connections from this client address; retry later"
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
_PEER_GONE_ERRNOS = {errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ENOTCONN, errno.ETIMEDOUT}
_WATCH_INTERVAL = 0.05                 # seconds between polls of a waiting client's socket
DEFAULT_MAX_TOKENS = 2048              # output cap of a chat/Responses request naming none (--default-max-tokens)
# What a request line may carry into a log line only escaped: control characters (a NUL, a
# newline forging a second line, terminal escapes), and the quote and backslash that delimit
# and escape fields (as nginx writes them: \xHH).
_LOG_UNSAFE = re.compile(r'[\x00-\x1f\x7f-\x9f"\\]')
_GEN_CONFIG_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                    "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                    "max_new_tokens": "max_tokens"}


class _ClientGone(Exception):
    """The client closed its connection or stopped reading; nothing more can be sent."""


def default_connections_per_client(max_connections: int) -> int:
    """--max-connections-per-client when none is given: half of all, so one address (a client
    opening hundreds of connections) always leaves the other half to everyone else."""
    return max(1, max_connections // 2)


def log_safe(text: str) -> str:
    """text for one log line: each control character, quote and backslash as \\xHH."""
    return _LOG_UNSAFE.sub(lambda m: "\\x%02x" % ord(m.group()), text)


def default_body_limit(max_model_len: int) -> int:
    """The request body limit when none is set: room for a full-context prompt in its most
    escaped JSON form (and a few of them), so a body cannot carry far more text than the
    model could ever read, between 1 MiB and 32 MiB."""
    return max(MIN_BODY_BYTES, min(MAX_BODY_BYTES, BODY_BYTES_PER_TOKEN * int(max_model_len)))


def generation_defaults(generation_config: dict | None) -> dict:
    """SamplingParams defaults from a generation_config.json, as vLLM's --generation-config auto."""
    out = {}
    for src, dst in _GEN_CONFIG_KEYS.items():
        v = (generation_config or {}).get(src)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[dst] = int(v) if dst in ("top_k", "max_tokens") else float(v)
    return out


# ---- shared server state ---------------------------------------------------------------------

class ServerState:
    """What every handler thread shares: engine, model facts, metrics, the draining flag."""

    def __init__(self, engine: Any, ctx: ServingContext, metrics: ServerMetrics, api_key: str | None,
                 kernel_info: dict, max_body_bytes: int, model_root: str | None, retry_after: int):
        self.engine, self.ctx, self.metrics = engine, ctx, metrics
        self.api_key = api_key
        self.kernel_info = kernel_info
        self.max_body_bytes = max_body_bytes
        # /v1/models shows a model's name, never where it sits on this machine
        self.model_root = os.path.basename(model_root.rstrip("/\\")) if model_root else None
        self.retry_after = retry_after
        self.started = int(time.time())
        self.draining = False
        self._inflight = 0
        self._idle = threading.Condition()

    def engine_alive(self) -> bool:
        alive = getattr(self.engine, "is_alive", True)
        return bool(alive() if callable(alive) else alive)

    def check_serving(self) -> None:
        if self.draining:
            raise ApiError(503, "the server is shutting down", code="server_draining")
        if not self.engine_alive():
            raise ApiError(503, self.engine_dead_message(), code="engine_dead")

    def engine_dead_message(self) -> str:
        why = getattr(self.engine, "failure", None)     # a data-parallel replica names itself
        return f"the engine is not running: {why}" if why else "the engine is not running"

    @contextmanager
    def inflight(self) -> Iterator[None]:
        with self._idle:
            self._inflight += 1
        try:
            yield
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True


def _connection_refusal(over_client: bool, retry_after: int) -> ApiError:
    """A connection beyond the limits: 429 when its own address holds its share (the client's
    doing, as a rate limit), 503 when the server as a whole is full."""
    status, message = (429, CLIENT_LIMIT_MESSAGE) if over_client else (503, CONNECTION_LIMIT_MESSAGE)
    return ApiError(status, message, code="too_many_connections", headers={"Retry-After": str(retry_after)})


class _Conn:
    """One open connection as the server's capacity accounting sees it.

    phase: "idle" (waiting for a request), "headers", "body" (reading one) or "busy"
    (dispatched). Connections not busy can be evicted when the server is full. probe_only: one
    of the few taken beyond the limits, which serves one request on a probe route and closes;
    over_client: it was taken beyond its address's cap (a 429 for work), not the server's (503).
    """
    __slots__ = ("sock", "client", "phase", "since", "probe_only", "over_client")

    def __init__(self, sock: socket.socket, client: str = "", probe_only: bool = False, over_client: bool = False):
        self.sock, self.client, self.phase, self.since = sock, client, "idle", time.monotonic()
        self.probe_only = probe_only
        self.over_client = over_client

    def enter(self, phase: str) -> None:
        self.phase, self.since = phase, time.monotonic()


class _DeadlineReader(io.RawIOBase):
    """The socket's read side with one total deadline per phase instead of a per-recv timeout:
    a client that sends a byte every few seconds cannot stretch its headers or body forever.

    While idle (between requests) the deadline is the keep-alive timeout; the first byte of a
    request starts the header deadline; _read_body sets the body deadline. Writes keep the
    socket's own timeout (write_timeout)."""

    def __init__(self, sock: socket.socket, conn: _Conn, header_timeout: float, write_timeout: float):
        self.sock, self.conn = sock, conn
        self.header_timeout, self.write_timeout = header_timeout, write_timeout
        self.deadline = time.monotonic() + write_timeout
        self._peeking = False

    def readable(self) -> bool:
        return True

    def has_buffered(self, rfile: io.BufferedReader) -> bool:
        """Whether rfile (the BufferedReader over this reader) holds bytes not yet consumed,
        such as a pipelined next request; never reads the socket."""
        self._peeking = True
        try:
            return bool(rfile.peek(1))
        finally:
            self._peeking = False

    def wait_request(self, idle_timeout: float) -> None:
        self.conn.enter("idle")
        self.deadline = time.monotonic() + idle_timeout

    def set_deadline(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def readinto(self, buf: Any) -> int | None:
        if self._peeking:
            return None      # "no data yet": a peek sees only what is buffered
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)
        try:
            n = self.sock.recv_into(buf)
        finally:
            self.sock.settimeout(self.write_timeout)
        if n and self.conn.phase == "idle":
            self.conn.enter("headers")
            self.deadline = time.monotonic() + self.header_timeout
        return n


class _DisconnectWatch:
    """Polls a client's socket while its request runs and calls on_gone once if the client left.

    Used for streaming and non-streaming answers alike, so a client that leaves during a long
    prefill or a long non-streamed answer frees its sequences at once. Leaving is a reset or an
    end of stream (FIN): like uvicorn and Go's net/http, an EOF on a request's connection means
    the client is gone (one that gave up and closed is common; one that half-closes and waits
    for its answer is rare). A client whose next request is already readable (pipelining), or
    was already read into the handler's buffer (`pipelined`), is alive: the watch stops.
    """

    def __init__(self, sock: socket.socket, on_gone: Callable[[], None], pipelined: bool = False):
        self.sock, self.on_gone = sock, on_gone
        self.pipelined = pipelined
        self.gone = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lite-llm-watch", daemon=True)

    def __enter__(self) -> "_DisconnectWatch":
        if not self.pipelined:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                readable, _, _ = select.select([self.sock], [], [], _WATCH_INTERVAL)
                if not readable:
                    continue
                data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except (OSError, ValueError):     # reset by peer, or closed under us
                data = b""
            if data:
                return      # the client is already sending its next request: it is alive
            if not self._done.is_set():
                self.gone = True
                self.on_gone()
            return


# ---- the handler -------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.1"   # so even a garbled request line gets a JSON error
    server_version = f"lite-llm/{__version__}"
    sys_version = ""
    disable_nagle_algorithm = True      # SSE chunks are small and latency matters
    server: "LiteServer"

    ROUTES: dict[str, dict[str, str]] = {
        "/v1/models": {"GET": "_models"},
        "/v1/completions": {"POST": "_completions"},
        "/v1/chat/completions": {"POST": "_chat"},
        "/tokenize": {"POST": "_tokenize"},
        "/detokenize": {"POST": "_detokenize"},
        "/health": {"GET": "_health"},
        "/ping": {"GET": "_health", "POST": "_health"},
        "/version": {"GET": "_version"},
        "/metrics": {"GET": "_metrics"},
        "/openapi.json": {"GET": "_openapi"},
        **{route: {"POST": "_pooling"} for route in pooling_routes.ROUTES},   # embeddings, score, rerank
        "/v1/responses": {"POST": responses.create},
        "/v1/messages": {"POST": anthropic.messages},
        "/v1/messages/count_tokens": {"POST": anthropic.count_tokens},
        "/v1/chat/completions/batch": {"POST": vllm_routes.chat_batch},
        "/invocations": {"POST": vllm_routes.invocations},
        "/v1/engine/stats": {"GET": "_engine_stats"},
        "/": {"GET": "_web"}, "/dashboard": {"GET": "_web"},     # the web UI (server/webui.py)
        "/v1/load_lora_adapter": {"POST": "_load_lora_adapter"},
        "/v1/unload_lora_adapter": {"POST": "_unload_lora_adapter"},
    }
    _load_lora_adapter, _unload_lora_adapter = lora_routes.load_adapter, lora_routes.unload_adapter
    # (path pattern, its name in the access log, methods): the pattern's group is _route_arg
    PATTERN_ROUTES = (
        (re.compile(r"/v1/responses/([^/]+)"), "/v1/responses/{id}",
         {"GET": responses.retrieve, "DELETE": responses.delete}),
        (re.compile(r"/v1/responses/([^/]+)/cancel"), "/v1/responses/{id}/cancel", {"POST": responses.cancel}),
    )
    # routes whose errors have another API's shape than OpenAI's
    ERROR_SHAPES = {"/v1/messages": anthropic.error_body, "/v1/messages/count_tokens": anthropic.error_body}

    # Routes anyone may call when an API key is set (/metrics too with --metrics-no-auth).
    OPEN_ROUTES = ("/health", "/ping")
    # Cheap routes a monitor polls: served even when every connection slot is taken
    PROBE_ROUTES = ("/health", "/ping", "/metrics", "/version", "/v1/models")

    def setup(self) -> None:
        srv = self.server
        self.timeout = srv.write_timeout             # writes; reads go through _DeadlineReader
        super().setup()
        self._conn = srv.connection_of(self.connection)
        self._reader = _DeadlineReader(self.connection, self._conn, srv.header_timeout, srv.write_timeout)
        self.rfile = io.BufferedReader(self._reader, 1 << 16)

    def handle_one_request(self) -> None:
        self._reader.wait_request(self.server.request_timeout)
        self._status, self._tokens, self._started = None, None, None
        super().handle_one_request()

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    # every method goes through one dispatcher so unknown ones get 405, not 501
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):        # any other method: 405 on a known route, else 404
            return lambda: self._dispatch(name[3:])
        raise AttributeError(name)

    def version_string(self) -> str:
        return self.server_version

    @property
    def state(self) -> ServerState:
        return self.server.state

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), log_safe(format % args))

    def _dispatch(self, method: str) -> None:
        self._body_read = False
        self._headers_sent = False
        self._conn.enter("busy")
        self._started = time.monotonic()
        path = "?"
        try:
            path = urlsplit(self.path).path
            if len(path) > 1:
                path = path.rstrip("/")
            self._error_body = self.ERROR_SHAPES.get(path)
            self._check_framing()
            if self._conn.probe_only:
                self._check_probe(path)
            is_page = self.server.web_ui and webui.is_page_route(path)
            if not is_page and path not in self.OPEN_ROUTES and not (
                    path == "/metrics" and self.server.metrics_no_auth):
                self._check_auth()
            methods = self.ROUTES.get(path) if is_page or not webui.is_page_route(path) else None
            if is_page and methods is None:
                methods = {"GET": "_web"}
            self._route_arg = path if is_page else None
            if methods is None and path.startswith("/v1/models/"):
                methods, self._route_arg = {"GET": "_model"}, unquote(path[len("/v1/models/"):])
            for pattern, _, routes in self.PATTERN_ROUTES if methods is None else ():
                m = pattern.fullmatch(path)
                if m:
                    methods, self._route_arg = routes, unquote(m.group(1))
                    break
            if methods is None:
                raise ApiError(404, f"Not Found: {method} {path[:200]}", code="not_found")
            name = methods.get("GET" if method == "HEAD" else method)
            if name is None:
                raise ApiError(405, f"Method {method} not allowed for {path}; use {', '.join(methods)}",
                               headers={"Allow": ", ".join(methods)})
            name(self) if callable(name) else getattr(self, name)()
        except ApiError as e:
            self._send_error(e)
        except _ClientGone:
            self.close_connection = True
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception:
            logger.exception("internal error on %s %s", log_safe(method), log_safe(self.path[:200]))
            self._send_error(ApiError(500, "internal server error"))
        finally:
            self._log_access(method, path)

    def _log_access(self, method: str, path: str) -> None:
        if not self.server.log_requests or not access_logger.isEnabledFor(logging.INFO):
            return
        route = path if path in self.ROUTES else ("/v1/models/{id}" if path.startswith("/v1/models/")
                                                  else next((label for pattern, label, _ in self.PATTERN_ROUTES
                                                             if pattern.fullmatch(path)), path[:100]))
        tokens = "-" if self._tokens is None else "%d+%d" % self._tokens
        access_logger.info('%s "%s %s" %s tokens=%s %.0fms', self.client_address[0], log_safe(method), log_safe(route),
                           self._status or "-", tokens, (time.monotonic() - self._started) * 1e3)

    # ---- plumbing ----------------------------------------------------------------------------

    def _check_framing(self) -> None:
        """One unambiguous body length or none: a duplicate Content-Length or one beside a
        Transfer-Encoding is how requests are smuggled past a proxy (RFC 9112 6.3), so 400 and close."""
        lengths = self.headers.get_all("Content-Length") or []
        codings = self.headers.get_all("Transfer-Encoding") or []
        problem = None
        if len(lengths) > 1:
            problem = "more than one Content-Length header"
        elif lengths and codings:
            problem = "both Content-Length and Transfer-Encoding headers"
        elif lengths and not _CONTENT_LENGTH.fullmatch(lengths[0].strip()):
            problem = "invalid Content-Length header"
        elif codings and (len(codings) > 1 or codings[0].strip().lower() != "chunked"):
            problem = "Transfer-Encoding other than 'chunked'"
        elif codings and self.request_version == "HTTP/1.0":
            problem = "Transfer-Encoding in an HTTP/1.0 request"
        if problem:
            self.close_connection = True
            self._body_read = True        # its length is unknowable: nothing more is read
            raise ApiError(400, f"ambiguous request framing: {problem}", code="bad_framing")

    def _check_probe(self, path: str) -> None:
        """A connection taken beyond the limits answers one probe and closes; anything else
        gets the 503 the limits give (429 when its own address's cap was the one reached)."""
        self.close_connection = True
        if path not in self.PROBE_ROUTES:
            self._linger = self._has_unread_body()     # so the client reads the refusal, not a reset
            raise _connection_refusal(self._conn.over_client, self.state.retry_after)

    def _check_auth(self) -> None:
        key = self.state.api_key
        if key is None:
            return
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
            return
        other = self.headers.get("x-api-key")      # Anthropic's SDKs send the key here
        if other is not None and hmac.compare_digest(other.strip().encode(), key.encode()):
            return
        raise ApiError(401, "Incorrect or missing API key: pass 'Authorization: Bearer <key>' "
                            "(or 'x-api-key: <key>')",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def _start_body(self) -> None:
        self._conn.enter("body")
        self._reader.set_deadline(self.server.body_timeout)

    def _read_body(self) -> bytes:
        limit = self.state.max_body_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._start_body()
            try:
                return self._read_chunked(limit)
            finally:
                self._conn.enter("busy")
        length = self.headers.get("Content-Length")
        if length is None:
            raise ApiError(411, "a request body needs a Content-Length header")
        try:
            n = int(length.strip())
        except ValueError:
            raise ApiError(400, "invalid Content-Length header") from None
        if n < 0:
            raise ApiError(400, "invalid Content-Length header")
        if n > limit:
            raise ApiError(413, f"request body of {n} bytes is over the limit of {limit} bytes")
        self._start_body()
        data = self._read_exact(n)
        self._conn.enter("busy")
        self._body_read = True
        return data

    def _read_exact(self, n: int) -> bytes:
        try:
            data = self.rfile.read(n)
        except TimeoutError:
            raise ApiError(408, "timed out reading the request body") from None
        if len(data) < n:
            raise _ClientGone()
        return data

    def _read_chunked(self, limit: int) -> bytes:
        parts, total = [], 0
        while True:
            try:
                line = self.rfile.readline(1026)
            except TimeoutError:
                raise ApiError(408, "timed out reading the request body") from None
            if not line:
                raise _ClientGone()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ApiError(400, "malformed chunked request body") from None
            if size < 0:
                raise ApiError(400, "malformed chunked request body")
            if size == 0:
                try:
                    while self.rfile.readline(1026).strip():    # trailers, then the blank line
                        pass
                except TimeoutError:
                    raise ApiError(408, "timed out reading the request body") from None
                self._body_read = True
                return b"".join(parts)
            total += size
            if total > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes")
            parts.append(self._read_exact(size))
            self._read_exact(2)                               # CRLF after each chunk

    def _has_unread_body(self) -> bool:
        if getattr(self, "_body_read", False) or not hasattr(self, "headers") or self.headers is None:
            return False
        return (self.headers.get("Content-Length", "0").strip() not in ("", "0")
                or "chunked" in self.headers.get("Transfer-Encoding", "").lower())

    def _send_bytes(self, status: int, data: bytes, content_type: str,
                    headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection or self._has_unread_body():
            self.send_header("Connection", "close")   # also sets close_connection
        self.end_headers()
        self._headers_sent = True
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, openai.dumps(body), "application/json", headers)

    def _send_error(self, e: ApiError) -> None:
        if getattr(self, "_headers_sent", False):
            self.close_connection = True      # mid-answer: the only honest signal left
            return
        if e.status in (408, 411, 413):
            self.close_connection = True
            self._linger = e.status == 413 and self._has_unread_body()
        shape = getattr(self, "_error_body", None)
        try:
            self._send_json(e.status, e.body() if shape is None else shape(e), e.headers)
        except (ConnectionError, TimeoutError, OSError):
            self.close_connection = True

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if getattr(self, "_linger", False):
                self._linger_close()

    def _linger_close(self) -> None:
        """Drop what a refused client is still sending (for at most 2 s) before closing, so its
        send completes and it reads our 413 instead of a connection reset (nginx's lingering close)."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.5)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and self.connection.recv(1 << 16):
                pass
        except OSError:
            pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors raised by http.server itself (bad request line, too many headers...): JSON too."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        err = ApiError(code, message or phrase)
        data = openai.dumps(err.body())
        try:
            self.send_response(code, message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD" and code >= 200 and code not in (204, 304):
                self.wfile.write(data)
        except OSError:
            pass

    def _json_body(self) -> dict:
        return openai.parse_json(self._read_body())

    # ---- simple routes -----------------------------------------------------------------------

    def _model_card(self, name: str) -> dict:
        # root names the model, never a filesystem path of this machine
        st = self.state
        return {"id": name, "object": "model", "created": st.started, "owned_by": "lite-llm",
                "root": st.model_root or st.ctx.model_names[0], "parent": None,
                "max_model_len": st.ctx.max_model_len}

    def _models(self) -> None:
        self._send_json(200, {"object": "list",
                              "data": [self._model_card(name) for name in self.state.ctx.model_names]
                              + lora_routes.model_cards(self)})

    def _model(self) -> None:
        name = self._route_arg
        card = next((c for c in lora_routes.model_cards(self) if c["id"] == name), None)
        if card is not None:
            return self._send_json(200, card)
        if name not in self.state.ctx.model_names:
            raise ApiError(404, f"The model '{openai.show(name)[1:-1]}' does not exist.", "model",
                           code="model_not_found")
        self._send_json(200, self._model_card(name))

    def _health(self) -> None:
        if self.state.draining:
            raise ApiError(503, "the server is shutting down", code="server_draining")
        if not self.state.engine_alive():
            raise ApiError(503, self.state.engine_dead_message(), code="engine_dead")
        self._send_bytes(200, b"", "text/plain")

    def _version(self) -> None:
        info = self.state.kernel_info
        self._send_json(200, {"version": __version__, "kernel_variant": info.get("kernel_variant"),
                              "num_threads": info.get("num_threads")})

    def _metrics(self) -> None:
        engine, stats, replicas = self.state.engine, None, None
        try:
            if hasattr(engine, "replica_stats"):      # data parallel: a series per replica
                replicas = engine.replica_stats()
            else:
                stats = engine.stats()
        except Exception:         # a dead engine still lets us export what we observed
            logger.exception("engine.stats() failed")
        text = self.state.metrics.render(stats, replicas)
        self._send_bytes(200, text.encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8")

    def _web(self) -> None:
        found = webui.web_file(self._route_arg)
        if found is None:
            raise ApiError(404, f"Not Found: {self.command} {self._route_arg[:200]}", code="not_found")
        self._send_bytes(200, found[0], found[1], webui.HEADERS)

    def _engine_stats(self) -> None:
        engine, stats = self.state.engine, None
        try:
            stats = engine.stats()
        except Exception:
            logger.exception("engine.stats() failed")
        self._send_json(200, webui.engine_stats(stats, self.state.kernel_info, self.state.ctx.model_names))

    def _openapi(self) -> None:
        st = self.state
        self._send_json(200, openapi_document(__version__, metrics_auth=not self.server.metrics_no_auth,
                                              api_key=st.api_key is not None,
                                              pooling=pooling_routes.is_pooling(st.engine),
                                              vocab_size=st.ctx.vocab_size, max_model_len=st.ctx.max_model_len,
                                              images=st.ctx.mm_processor is not None,
                                              request_templates=st.ctx.trust_request_chat_template,
                                              tools=st.ctx.tool_parser_of() is not None))

    def _pooling(self) -> None:
        pooling_routes.handle(self, urlsplit(self.path).path.rstrip("/"))

    def _tokenize(self) -> None:
        self._send_json(200, openai.tokenize(self._json_body(), self.state.ctx))

    def _detokenize(self) -> None:
        self._send_json(200, openai.detokenize(self._json_body(), self.state.ctx))

    # ---- generation --------------------------------------------------------------------------

    def _completions(self) -> None:
        self._generate(openai.prepare_completion)

    def _chat(self) -> None:
        self._generate(openai.prepare_chat)

    def _generate(self, prepare: Callable[[dict, ServingContext], PreparedRequest], api: Any = None) -> None:
        st = self.state
        st.check_serving()
        pooling_routes.refuse_generation(st.engine)
        body = self._json_body()
        self.run_prepared(prepare(body, st.ctx), api)

    def run_prepared(self, prep: PreparedRequest, api: Any = None) -> None:
        """Submit a prepared (chat or completion) request and answer it: in OpenAI's shape, or,
        given api, in that API's (api.answer(prep, chat_body) -> body for a whole answer,
        api.stream(prep, chunks) -> SSE bytes for a stream; chunks are openai.stream_chunks'
        dicts, an ApiError last if the request failed)."""
        st = self.state
        with st.inflight():
            st.check_serving()
            submitted = self.submit(prep, final_only=not prep.stream)
            aborted = threading.Event()

            def abort_all() -> None:
                aborted.set()
                for rid, _ in submitted:
                    st.engine.abort(rid)

            pipelined = self._reader.has_buffered(self.rfile)
            with _DisconnectWatch(self.connection, abort_all, pipelined) as watch:
                try:
                    if prep.stream:
                        self._stream(prep, submitted, watch, api)
                    else:
                        self._answer(prep, submitted, watch, api)
                except BaseException:
                    if not aborted.is_set():
                        abort_all()
                    raise

    def submit(self, prep: PreparedRequest, final_only: bool = False) -> list[tuple[str, Any]]:
        """final_only: the answer is whole, so each engine request hands its output over once."""
        st = self.state
        submitted: list[tuple[str, Any]] = []
        params = prep.params.replace(output_kind=RequestOutputKind.FINAL_ONLY) if final_only else prep.params
        try:
            for k, p in enumerate(prep.prompts):
                rid = prep.engine_request_id(k)
                extra = {} if prep.model in st.ctx.model_names else {"lora_request": prep.model}   # an adapter's name
                # its prompts and samples share this request's fair share of slots, and its client's
                # requests together one client's share (the scheduler's "client|request" owners)
                extra["owner"] = f"{self.client_address[0] if self.client_address else ''}|{prep.id}"
                if p.mm is not None:
                    extra["mm"] = p.mm
                stream = st.engine.add_request(rid, p.token_ids, params, prompt=p.text, **extra)
                submitted.append((rid, stream))
        except QueueFullError:
            for rid, _ in submitted:
                st.engine.abort(rid)
            raise ApiError(429, "The server is at capacity (request queue full); retry later.",
                           code="queue_full", headers={"Retry-After": str(st.retry_after)}) from None
        except ValueError as e:      # the engine's own checks on a request
            for rid, _ in submitted:
                st.engine.abort(rid)
            raise ApiError(400, str(e)) from None
        except (EngineShutdownError, EngineDeadError) as e:
            for rid, _ in submitted:
                st.engine.abort(rid)
            raise ApiError(503, f"the engine is not accepting requests: {e}", code="engine_unavailable") from None
        except Exception:
            for rid, _ in submitted:
                st.engine.abort(rid)
            st.check_serving()       # a stopped engine is a 503, anything else a 500
            raise
        return submitted

    def _answer(self, prep: PreparedRequest, submitted: list, watch: _DisconnectWatch, api: Any = None) -> None:
        tok = self.state.ctx.tokenizer
        choices: dict[int, Choice] = {}
        offsets: dict[int, int] = {}
        try:
            deltas = list(openai.iter_deltas(submitted))
        except ValueError as e:             # refused by the engine thread
            raise ApiError(400, str(e)) from None
        except EngineDeadError as e:
            raise ApiError(503, f"the engine failed: {e}", code="engine_dead") from None
        for k, out in deltas:
            if out.prompt_logprobs is not None:
                for i in range(prep.params.n):
                    choices.setdefault(k * prep.params.n + i, Choice()).prompt_logprobs = out.prompt_logprobs
            for o in out.outputs:
                index = k * prep.params.n + o.index
                c = choices.setdefault(index, Choice())
                c.text.append(o.text)
                c.num_tokens += len(o.token_ids)
                lps, offsets[index] = openai.format_logprobs(prep, tok, o, offsets.get(index, 0))
                if lps is not None:
                    c.logprobs.append(lps)
                if o.finish_reason is not None:
                    c.finish_reason, c.stop_reason = o.finish_reason, o.stop_reason
        if watch.gone:
            raise _ClientGone()
        if any(c.finish_reason == "abort" for c in choices.values()):
            raise self._aborted()
        body = openai.final_response(prep, choices, tok)
        self._tokens = (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])
        self._send_json(200, body if api is None else api.answer(prep, body))

    def _aborted(self) -> ApiError:
        """An engine request that ended with "abort" (never a finish reason on the wire)."""
        if self.state.draining:
            return ApiError(503, "the server shut down before the request finished", code="server_draining")
        return ApiError(503, "the engine aborted the request (it cannot fit the KV cache, or the "
                             "engine is stopping)", code="request_aborted")

    def _write_chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk (or the bare bytes to an HTTP/1.0 client); a failed write means
        the client left."""
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        except (ConnectionError, TimeoutError, OSError):
            raise _ClientGone() from None

    def _stream(self, prep: PreparedRequest, submitted: list, watch: _DisconnectWatch, api: Any = None) -> None:
        # HTTP/1.0 has no chunked encoding: the end of the stream is the end of the connection
        self._chunked = self.request_version != "HTTP/1.0"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        if self._chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        self._headers_sent = True
        tally = openai.StreamTally(sum(len(p.token_ids) for p in prep.prompts))
        self._tokens = (tally.num_prompt, 0)
        items = self._chunk_items(prep, submitted, tally)
        try:
            for data in (api.stream(prep, items) if api is not None else self._openai_events(items)):
                if watch.gone:
                    raise _ClientGone()
                self._write_chunk(data)
        finally:
            self._tokens = (tally.num_prompt, tally.num_tokens)
        if not self._chunked:
            return
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            raise _ClientGone() from None

    def _chunk_items(self, prep: PreparedRequest, submitted: list, tally: openai.StreamTally
                     ) -> Iterator[dict | ApiError]:
        """The request's chunks (openai.stream_chunks), then an ApiError if it was aborted or the
        engine failed mid-stream: each API says so in its own stream."""
        try:
            yield from openai.stream_chunks(prep, openai.iter_deltas(submitted), self.state.ctx.tokenizer, tally)
            if tally.aborted:
                yield self._aborted()
        except Exception as e:     # the engine failed mid-stream: say so in the stream itself
            logger.exception("stream %s failed", prep.id)
            yield ApiError(503 if not self.state.engine_alive() else 500, f"generation failed: {e}")

    @staticmethod
    def _openai_events(items: Iterator[dict | ApiError]) -> Iterator[bytes]:
        for item in items:
            yield openai.sse(item.body() if isinstance(item, ApiError) else item)
        yield openai.sse("[DONE]")


# ---- the server --------------------------------------------------------------------------------

class LiteServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024          # listen backlog: bursts of clients must not be refused
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: ServerState, request_timeout: float, *,
                 header_timeout: float = 10.0, body_timeout: float = 30.0, write_timeout: float | None = None,
                 max_connections: int = MAX_CONNECTIONS, max_connections_per_client: int | None = None,
                 metrics_no_auth: bool = False, log_requests: bool = True, web_ui: bool = True):
        self.state = state
        self.web_ui = web_ui                            # / and /dashboard (server/webui.py)
        self.request_timeout = request_timeout          # idle keep-alive: first byte of a request
        self.header_timeout = header_timeout            # request line + headers, in total
        self.body_timeout = body_timeout                # the whole body, in total
        self.write_timeout = request_timeout if write_timeout is None else write_timeout
        self.max_connections = max_connections
        # None: half of max_connections, so one address cannot take them all; 0: no per-address cap
        self.max_connections_per_client = (default_connections_per_client(max_connections)
                                           if max_connections_per_client is None else max_connections_per_client)
        self.metrics_no_auth = metrics_no_auth
        self.log_requests = log_requests
        self._conns: dict[socket.socket, _Conn] = {}
        self._probes: dict[socket.socket, _Conn] = {}       # probe-only connections, beyond the limits
        self._refused: dict[socket.socket, float] = {}      # refused socket -> when to close it
        self._refuser: threading.Thread | None = None
        self._conns_lock = threading.Lock()
        self._serving = threading.Event()
        super().__init__(address, _Handler)

    # ---- capacity: one thread per connection, at most max_connections of them ---------------

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accepting thread. When full (in all, or for this client address), the connection
        that has been idle or reading its request the longest makes room (keep-alive idlers and
        slow senders are the cheap ones to drop); if every one is busy with a dispatched request,
        the newcomer gets one of PROBE_CONNECTIONS reserved slots, which answer /health and the
        other PROBE_ROUTES and refuse anything else with 503 (a monitor still sees a live server
        however many requests are in flight); when those are taken too, it gets the 503 at once."""
        client = str(client_address[0]) if isinstance(client_address, tuple) else ""
        with self._conns_lock:
            full = over_client = False
            if self.max_connections_per_client:
                own = [c for c in self._conns.values() if c.client == client]
                full = over_client = (len(own) >= self.max_connections_per_client
                                      and not self._evict_locked(own, self._conns))
            if not full and len(self._conns) >= self.max_connections:
                full = not self._evict_locked(self._conns.values(), self._conns)
            if not full:
                self._conns[request] = _Conn(request, client)
            elif len(self._probes) < PROBE_CONNECTIONS or self._evict_locked(self._probes.values(), self._probes):
                self._probes[request] = _Conn(request, client, probe_only=True, over_client=over_client)
            else:
                request, refused = None, request
        if request is None:
            self._refuse(refused, over_client)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._conns_lock:
                self._conns.pop(request, None)
                self._probes.pop(request, None)
            raise

    def _evict_locked(self, among: Any, pool: dict[socket.socket, _Conn]) -> bool:
        idle = [c for c in among if c.phase != "busy"]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.since)
        del pool[victim.sock]
        try:
            victim.sock.shutdown(socket.SHUT_RDWR)    # its thread's read returns: it closes
        except OSError:
            pass
        return True

    def _refuse(self, sock: socket.socket, over_client: bool = False) -> None:
        e = _connection_refusal(over_client, self.state.retry_after)
        body = openai.dumps(e.body())
        head = (f"HTTP/1.1 {e.status} {HTTPStatus(e.status).phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: {e.headers['Retry-After']}\r\n"
                f"Connection: close\r\n\r\n").encode()
        try:
            sock.send(head + body, socket.MSG_DONTWAIT)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.close_request(sock)
            return
        # Closing now, with the client's request unread, would reset the connection before the
        # client reads the 503: one thread drains refused sockets for a second, then closes them.
        with self._conns_lock:
            if len(self._refused) >= self.max_connections:
                self.close_request(sock)
                return
            self._refused[sock] = time.monotonic() + 1.0
            if self._refuser is None or not self._refuser.is_alive():
                self._refuser = threading.Thread(target=self._drain_refused, name="lite-llm-refused",
                                                 daemon=True)
                self._refuser.start()

    def _drain_refused(self) -> None:
        while True:
            with self._conns_lock:
                now = time.monotonic()
                for sock in [k for k, t in self._refused.items() if t <= now]:
                    del self._refused[sock]
                    self.close_request(sock)
                socks = list(self._refused)
                if not socks:
                    self._refuser = None
                    return
            try:
                readable, _, _ = select.select(socks, [], [], 0.05)
            except (OSError, ValueError):
                readable = socks
            for sock in readable:
                try:
                    data = sock.recv(65536, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    with self._conns_lock:
                        if self._refused.pop(sock, None) is not None:
                            self.close_request(sock)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """An exception that ended a connection's thread. A peer that resets or stops reading
        (a load tool dropping its idle keep-alive connections) is routine: one debug line.
        Anything else is a bug worth its traceback, in the log rather than on stderr."""
        exc = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) else client_address
        if isinstance(exc, (ConnectionError, TimeoutError)) or (
                isinstance(exc, OSError) and exc.errno in _PEER_GONE_ERRNOS):
            logger.debug("connection from %s ended: %s", client, type(exc).__name__)
            return
        logger.exception("error on the connection from %s", client)

    def connection_of(self, sock: socket.socket) -> _Conn:
        with self._conns_lock:
            conn = self._conns.get(sock) or self._probes.get(sock)
        return conn if conn is not None else _Conn(sock)    # evicted already: untracked

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.pop(request, None)
            self._probes.pop(request, None)
        super().shutdown_request(request)

    @property
    def num_connections(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can stall start-up
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), port

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{'[' + host + ']' if ':' in str(host) else host}:{self.port}"

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving.set()
        try:
            super().serve_forever(poll_interval)
        finally:
            self._serving.clear()

    def start(self) -> threading.Thread:
        """Serve on a daemon thread (tests, embedding); returns the thread."""
        t = threading.Thread(target=self.serve_forever, args=(0.05,), name="lite-llm-http", daemon=True)
        t.start()
        return t

    def drain(self, grace_seconds: float) -> bool:
        """Stop accepting, let in-flight requests finish within the grace, stop the engine.

        Returns True if every in-flight request finished on its own.
        """
        st = self.state
        st.draining = True                  # new requests on open connections: 503
        if self._serving.is_set():
            self.shutdown()
        self.server_close()                 # new connections: refused
        deadline = time.monotonic() + grace_seconds
        finished = st.wait_idle(grace_seconds)
        try:
            st.engine.shutdown(max(0.0, deadline - time.monotonic()))
        except Exception:
            logger.exception("engine shutdown failed")
        st.wait_idle(5.0)                   # handlers write their last (aborted) chunks
        return finished


def create_server(engine: Any, tokenizer: Any, model_name: str | list[str] | tuple[str, ...],
                  max_model_len: int, api_key: str | None = None,
                  generation_config: dict | None = None, kernel_info: dict | None = None, *,
                  host: str = "127.0.0.1", port: int = 0, chat_template: str | None = None,
                  trust_request_chat_template: bool = False, lora_root: str | None = None,
                  vocab_size: int | None = None, max_body_bytes: int | None = None,
                  request_timeout: float = 10.0, model_root: str | None = None,
                  retry_after: int = 1, header_timeout: float = 10.0, body_timeout: float = 30.0,
                  max_connections: int = MAX_CONNECTIONS, max_connections_per_client: int | None = None,
                  metrics_no_auth: bool = False, web_ui: bool = True,
                  log_requests: bool = True, max_tokenizing: int | None = None,
                  reasoning_parser: str | None = None, tool_call_parser: str | None = None,
                  responses_store_max: int = responses.DEFAULT_STORE_MAX,
                  responses_store_ttl: float = responses.DEFAULT_STORE_TTL, media: Any = None,
                  default_max_tokens: int | None = DEFAULT_MAX_TOKENS) -> LiteServer:
    """A bound (not yet serving) server for `engine`; `.start()` or `.serve_forever()` it.

    generation_config is the model's generation_config.json dict (empty for
    --generation-config vllm); kernel_info carries kernel_variant, num_threads, weight_bytes.
    max_body_bytes None derives the limit from max_model_len (default_body_limit).
    default_max_tokens caps the output of a chat-shaped request that sets no max_tokens (None
    or 0: the room its prompt leaves in the context, as vLLM).
    """
    names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
    if not names:
        raise ValueError("at least one served model name is needed")
    if vocab_size is None:
        vocab_size = getattr(tokenizer, "vocab_size", None)
        if callable(vocab_size):
            vocab_size = vocab_size()
    if not vocab_size:
        raise ValueError("vocab_size unknown: pass vocab_size=")
    if max_body_bytes is None:
        max_body_bytes = default_body_limit(max_model_len)
    info = dict(kernel_info or {})
    ctx = ServingContext(model_names=names, max_model_len=int(max_model_len), vocab_size=int(vocab_size),
                         tokenizer=tokenizer, generation_defaults=generation_defaults(generation_config),
                         chat_template=chat_template, trust_request_chat_template=trust_request_chat_template,
                         max_token_bytes=max_token_bytes(tokenizer),
                         tokenize_slots=TokenizeSlots(max_tokenizing or max(1, (os.cpu_count() or 2) // 2),
                                                      retry_after),
                         reasoning_parser=reasoning_parser, tool_parser=tool_call_parser,
                         system_fingerprint=system_fingerprint(info), loras=lora_routes.manager(engine),
                         mm_processor=_mm_processor(model_root, info.get("mmproj")), media=media or _default_media(),
                         default_max_tokens=default_max_tokens or None)
    state = ServerState(engine, ctx, ServerMetrics(names[0], info), api_key, info, max_body_bytes,
                        model_root, retry_after)
    state.responses = responses.ResponseStore(responses_store_max, responses_store_ttl)
    state.lora_root = os.path.realpath(lora_root) if lora_root else None   # runtime adapter loading: off
    return LiteServer((host, port), state, request_timeout, header_timeout=header_timeout,
                      body_timeout=body_timeout, max_connections=max_connections,
                      max_connections_per_client=max_connections_per_client,
                      metrics_no_auth=metrics_no_auth, log_requests=log_requests, web_ui=web_ui)


# ---- command line ------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("model", nargs="?", default=None,
      help="HF directory, .gguf file or hub id in the local cache (default: embedded SmolLM2-135M-Instruct)")
    a("--model", dest="model_flag", default=None, help=argparse.SUPPRESS)
    a("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    a("--port", type=port_number, default=8000, help="TCP port to listen on (default 8000; 0: any free port)")
    a("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "half", "float"],
      help="weight/activation dtype (auto: from the checkpoint)")
    a("--quantization", "-q", default=None, choices=["none", "q8_0", "q4_0"],
      help="weights as stored (none), or float weights quantized at load to q8_0 / q4_0 (ggml block types)")
    a("--tensor-parallel-size", "-tp", type=int, default=1,
      help="ranks of tensor parallelism, one process each (default 1): one per CPU list of LITE_LLM_CPU_OMP_THREADS_BIND (0-47|48-95), or per NUMA node under auto")
    a("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    a("--block-size", type=int, default=None, help="tokens per KV-cache block (a multiple of 16; default 128)")
    a("--max-num-seqs", type=int, default=None,
      help="most sequences in one step (default: vLLM's 128, at most 32 per computing thread)")
    a("--max-num-batched-tokens", type=int, default=2048, help="token budget of one step")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
      help="reuse KV blocks of shared prompt prefixes")
    a("--kv-cache-space", type=float, default=None,
      help="GiB of KV cache (default: LITE_LLM_CPU_KVCACHE_SPACE or automatic)")
    a("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
      help="KV cache element type: auto (the model's: fp32, else bf16), bfloat16, int8, fp8 (= fp8_e4m3), "
      "fp8_e5m2 (8-bit: a byte per value and a scale per row, ~2x the tokens per GiB)")
    a("--disable-sliding-window", action="store_true", help="attend over the full context")
    a("--speculative-config", default=None, type=speculative_config_arg, help='speculative decoding, as vLLM spells it: \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}\' (drafts looked up in the sequence) or \'{"method": "draft_model", "model": PATH, "num_speculative_tokens": 4}\' (a small model of the same vocabulary)')
    a("--served-model-name", nargs="+", default=None, help="model name(s) the API answers to")
    a("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every "
                                      "route but /health and /ping (env LITE_LLM_API_KEY)")
    a("--chat-template", default=None, help="chat template: a file path or the Jinja text itself")
    a("--trust-request-chat-template", action="store_true",
      help="accept a chat_template sent with a request (chat completions, /tokenize); refused by default")
    a("--generation-config", default="auto", choices=["auto", "vllm"],
      help="auto: default sampling from the model's generation_config.json; vllm: vLLM's defaults")
    a("--seed", type=int, default=0, help="seed of the sampler for requests without one")
    a("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
      help=f"output tokens at most of a chat, Responses, batch or /invocations chat request that sets no "
           f"max_tokens / max_completion_tokens / max_output_tokens (default {DEFAULT_MAX_TOKENS}; the model's "
           f"generation_config max_new_tokens, when smaller, wins; 0: the rest of the context, as vLLM); "
           f"completions keep OpenAI's 16"),
    a("--max-queue", type=int, default=1024, help="waiting requests before answering 429")
    a("--max-request-bytes", type=int, default=None,
      help=f"largest request body, 413 beyond (default: {BODY_BYTES_PER_TOKEN} bytes per token of "
           f"--max-model-len, between 1 MiB and 32 MiB)")
    a("--timeout-keep-alive", type=float, default=10.0,
      help="seconds an idle connection may wait for its next request")
    a("--header-timeout", type=float, default=10.0,
      help="seconds a client has to send a request's line and headers, in total")
    a("--body-timeout", type=float, default=30.0, help="seconds a client has to send a request body, in total")
    a("--max-connections", type=int, default=MAX_CONNECTIONS,
      help="open connections at most; when full, the longest idle or slowest-sending one is closed, "
           "or the newcomer gets 503 if all are busy")
    a("--max-connections-per-client", type=int, default=None,
      help="open connections per client address at most, enforced like --max-connections "
           "(default: half of --max-connections; 0: no cap, e.g. behind a proxy, where every "
           "client has the proxy's address)")
    a("--disable-log-requests", action="store_true",
      help="no access log line (method, route, status, tokens, ms) per request")
    a("--metrics-no-auth", action="store_true", help="serve /metrics without the API key")
    a("--disable-web-ui", action="store_true",
      help="no web pages: the chat playground at / and the live engine dashboard at /dashboard "
           "(both open without the key, every call they make sends the key typed into them)")
    a("--tool-call-parser", default=None, choices=list(openai.TOOL_PARSERS),
      help="how the model writes tool calls (hermes: <tool_call>{json}</tool_call>, as Qwen2.5/Qwen3; "
           "llama3_json: {\"name\", \"parameters\"} as Llama 3.x; mistral: [TOOL_CALLS][{...}]; openai: "
           "gpt-oss's harmony messages to functions.NAME); "
           "default: chosen from the chat template where unambiguous (only tool_choice auto needs one: "
           "a forced call follows the server's own grammar)")
    a("--reasoning-parser", default=None, choices=["deepseek_r1", "qwen3", *openai.REASONING_PARSER_CLASSES],
      help="split <think>...</think> from the answer into reasoning_content (deepseek_r1: the "
           "output starts inside the thinking; qwen3: only when it opens with <think>; openai_gptoss: "
           "gpt-oss's harmony analysis channel)")
    a("--responses-store-max", type=int, default=responses.DEFAULT_STORE_MAX,
      help="responses of /v1/responses kept in memory for previous_response_id and GET (the oldest go "
           "first; 0: none kept)")
    a("--responses-store-ttl", type=float, default=responses.DEFAULT_STORE_TTL,
      help="seconds a stored response is kept")
    a("--mmproj", default=None, metavar="FILE",
      help="llama.cpp's multimodal projector GGUF beside a GGUF model: a LLaVA-1.5 CLIP encoder + MLP (images "
           "at <image> or, where the vocabulary has none, llama.cpp's <__media__>) or Gemma 3's SigLIP + "
           "projector (images at <start_of_image>)")
    a("--limit-mm-per-prompt", default=None,
      help='images one prompt may carry, as vLLM\'s JSON: \'{"image": 4}\' (the default)')
    a("--mm-processor-kwargs", default=None,
      help='image preprocessing overrides as JSON: \'{"max_pixels": 1003520}\' caps the pixels an image is '
           "resized to (fewer image tokens)")
    a("--max-image-pixels-per-request", type=int, default=None, metavar="N",
      help="decoded pixels (width x height) of all a request's images together at most, read from each image's "
           "header before it is decoded (a small PNG can decode to 150 MB); beyond it a 400 (default 33554432, "
           "e.g. two 12-megapixel photos; 0: no cap)")
    a("--allowed-media-domains", nargs="*", default=None,
      help="hosts whose http(s) image URLs the server may fetch (redirects re-checked; default: none, "
           "only data: URLs)")
    a("--data-parallel-size", "-dp", type=int, default=1,
      help="independent engine replicas, each a process on its own cores (the thread plan split N ways, "
           "or one CPU list per replica in LITE_LLM_CPU_OMP_THREADS_BIND: '0-15|16-31'), behind this one "
           "server, which routes each request to the replica holding its prompt's prefix, else the least "
           "loaded; each replica has its own --kv-cache-space (pooling models: to the replica with the fewest "
           "input tokens in flight)")
    a("--runner", default="auto", choices=["auto", "generate", "pooling"],
      help="generate text, or pool (embeddings /v1/embeddings, scores /score and /rerank); auto: from the "
           "checkpoint (an encoder, a sentence-transformers directory or a classifier head pools)")
    a("--pooler-config", default=None,
      help='pooling models: \'{"pooling_type": "MEAN"|"CLS"|"LAST", "normalize": true}\' over the checkpoint\'s own')
    a("--hf-overrides", default=None,
      help='JSON over config.json, as vLLM: \'{"architectures": ["Qwen3ForSequenceClassification"], '
           '"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}\' scores a Qwen3-Reranker')
    a("--shutdown-grace", type=float, default=30.0,
      help="seconds in-flight requests get to finish on SIGINT/SIGTERM")
    lora_routes.add_arguments(parser)
    a("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])


def _mm_processor(model_root: str | None, mmproj: str | None = None):
    from lite_llm.multimodal import Processor
    return Processor.for_model(model_root, mmproj) if model_root else None


def _default_media():
    from lite_llm.multimodal import MediaConfig
    return MediaConfig()


def port_number(value: str) -> int:
    """--port: an integer from 0 to 65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value[:20]!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 to 65535)")
    return port


def check_address(host: str, port: int) -> None:
    """Bind the address the server will listen on, before the model loads (which can take
    minutes), so that a port in use or a host that is not this machine's fails at once."""
    def failed(what: str) -> OSError:
        err = OSError(f"cannot listen on {host}:{port}: {what}")
        err.lite_llm_user_error = True          # one line for the user (cli.user_error)
        return err

    try:
        with socket.socket(LiteServer.address_family, socket.SOCK_STREAM) as s:
            if LiteServer.allow_reuse_address:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except socket.gaierror as e:
        raise failed(f"unknown host ({e.strerror})") from None
    except OSError as e:
        hint = {errno.EADDRINUSE: " (another server is using it: pick another --port)",
                errno.EACCES: " (ports below 1024 need privileges: pick a --port from 1024 up)",
                errno.EADDRNOTAVAIL: " (not an address of this machine: check --host)"}.get(e.errno or 0, "")
        raise failed(f"{e.strerror or e}{hint}") from None


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a path to a file, or the template text itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value and (os.sep in value or value.endswith((".jinja", ".j2", ".txt"))):
        raise SystemExit(f"--chat-template: no such file: {value}")
    return value


def start_engine(args: argparse.Namespace) -> tuple[Any, Any, dict]:
    """The engine `serve` flags ask for: (engine, tokenizer, info); one AsyncEngine, or the
    data-parallel front end over --data-parallel-size replicas."""
    model = args.model or args.model_flag
    engine_kwargs = dict(
        dtype=args.dtype, max_model_len=args.max_model_len, block_size=args.block_size,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=args.enable_prefix_caching, seed=args.seed, max_queue=args.max_queue,
        kv_cache_space=args.kv_cache_space, disable_sliding_window=args.disable_sliding_window,
        quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
        speculative_config=args.speculative_config,
        tensor_parallel_size=args.tensor_parallel_size, mmproj=getattr(args, "mmproj", None),
        **lora_routes.engine_kwargs(args))
    # flags left unset keep the builder's defaults
    engine_kwargs = {k: v for k, v in engine_kwargs.items() if v is not None}
    if args.data_parallel_size < 1:
        raise SystemExit(f"--data-parallel-size must be >= 1, got {args.data_parallel_size}")
    from lite_llm import pooling
    hf_overrides = getattr(args, "hf_overrides", None)
    if pooling.runner_for_model(model, getattr(args, "runner", "auto"), hf_overrides) == "pooling":
        try:
            pooling.check_parallel(args.tensor_parallel_size, model)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        pool_kwargs = dict(dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=args.max_num_batched_tokens, quantization=args.quantization,
                           pooler_config=getattr(args, "pooler_config", None), hf_overrides=hf_overrides)
        if args.data_parallel_size > 1:     # replicas, each a pooling engine (lite_llm/pooling_dp.py)
            from lite_llm.pooling_dp import build_pooling_replicas
            return build_pooling_replicas(model, args.data_parallel_size, **pool_kwargs)
        engine, loaded, info = pooling.build_pooling_engine(model, serving=True, **pool_kwargs)
        return engine, loaded.tokenizer, info
    if args.data_parallel_size > 1:
        from lite_llm.engine.data_parallel import build_data_parallel_engine
        return build_data_parallel_engine(model, args.data_parallel_size, **engine_kwargs)
    from lite_llm.llm import build_async_engine
    return build_async_engine(model=model, **engine_kwargs)


def build_server(args: argparse.Namespace, engine: Any, tokenizer: Any, info: dict, *,
                 host: str | None = None, port: int | None = None) -> LiteServer:
    """The server `serve` flags ask for over a started engine (host/port override the flags)."""
    model = args.model or args.model_flag
    gen_config = (info.get("generation_config") or {}) if args.generation_config == "auto" else {}
    names = args.served_model_name or [info.get("model_name") or model or "default"]
    return create_server(
        engine, tokenizer, names, info["max_model_len"], api_key=args.api_key or env("API_KEY"),
        generation_config=gen_config, kernel_info=info, host=args.host if host is None else host,
        port=args.port if port is None else port, chat_template=load_chat_template(args.chat_template),
        trust_request_chat_template=args.trust_request_chat_template, lora_root=lora_routes.lora_root(args),
        vocab_size=info.get("vocab_size"), max_body_bytes=args.max_request_bytes,
        request_timeout=args.timeout_keep_alive, model_root=info.get("model_path"),
        header_timeout=args.header_timeout, body_timeout=args.body_timeout,
        max_connections=args.max_connections, max_connections_per_client=args.max_connections_per_client,
        metrics_no_auth=args.metrics_no_auth, web_ui=not getattr(args, "disable_web_ui", False),
        log_requests=not args.disable_log_requests, reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser, responses_store_max=args.responses_store_max,
        responses_store_ttl=args.responses_store_ttl, media=_media_config(args),
        default_max_tokens=getattr(args, "default_max_tokens", DEFAULT_MAX_TOKENS))


def _media_config(args: argparse.Namespace):
    """Image input settings from --limit-mm-per-prompt, --mm-processor-kwargs, --allowed-media-domains,
    --max-image-pixels-per-request."""
    from lite_llm.multimodal import DEFAULT_PIXELS_PER_REQUEST, media_config
    pixels = getattr(args, "max_image_pixels_per_request", None)
    try:
        return media_config(getattr(args, "limit_mm_per_prompt", None), getattr(args, "mm_processor_kwargs", None),
                            getattr(args, "allowed_media_domains", None),
                            DEFAULT_PIXELS_PER_REQUEST if pixels is None else pixels)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model = args.model or args.model_flag
    load_chat_template(args.chat_template)          # a missing file fails before the model loads
    lora_routes.lora_root(args)
    check_address(args.host, args.port)             # and so does a port in use
    check_model(model)                              # or a path that holds no model
    if args.responses_store_max < 0 or not args.responses_store_ttl > 0:
        raise SystemExit("--responses-store-max must be >= 0 and --responses-store-ttl > 0")
    if args.default_max_tokens < 0:
        raise SystemExit(f"--default-max-tokens must be >= 0, got {args.default_max_tokens}")
    api_key = args.api_key or env("API_KEY")
    t0 = time.perf_counter()
    engine, tokenizer, info = start_engine(args)
    server = build_server(args, engine, tokenizer, info)
    gen_config = server.state.ctx.generation_defaults
    names = server.state.ctx.model_names
    logger.info("lite-llm %s serving %s on %s (ready in %.1f s)", __version__, names[0], server.url,
                time.perf_counter() - t0)
    logger.info("model %s, max_model_len %s, dtype %s", info.get("model_path") or model,
                info["max_model_len"], info.get("dtype", args.dtype))
    logger.info("kernel variant %s, %s threads, KV cache capacity %s tokens",
                info.get("kernel_variant"), info.get("num_threads"), info.get("kv_cache_tokens"))
    if gen_config:
        logger.info("default sampling from generation_config.json: %s", gen_config)
    if api_key:
        logger.info("API key required on every route but /health, /ping%s%s",
                    " and /metrics" if args.metrics_no_auth else "",
                    "" if args.disable_web_ui else " and the web pages (their calls send the key typed in)")
    if not args.disable_web_ui:
        logger.info("chat playground at %s/, engine dashboard at %s/dashboard", server.url, server.url)

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        logger.info("%s: draining (grace %.0f s)", signal.Signals(signum).name, args.shutdown_grace)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    failed = False
    try:
        server.start()
        while not stop.wait(0.5):
            if not server.state.engine_alive():     # answering 503 for ever helps nobody
                failed = True
                logger.error("stopping: the engine is not running (%s)",
                             getattr(engine, "failure", None) or "its thread failed; see the error above")
                break
        finished = server.drain(args.shutdown_grace)
        logger.info("stopped%s", "" if finished else " (some requests were aborted)")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    failure = getattr(getattr(engine, "tp_group", None), "failure", None)
    if failure:     # a tensor-parallel rank died: the stop was not asked for
        logger.critical("exiting: %s", failure)
        return 1
    return 1 if failed else 0
