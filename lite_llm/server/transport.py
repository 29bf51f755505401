"""The HTTP transport of `serve`: the stdlib's ThreadingHTTPServer with the limits a public
server needs, and the request handler that turns a socket's bytes into a routing.Request and a
routing.Response back into bytes.

Here: framing (one unambiguous body length, chunked bodies), body size and time limits, keep-alive,
the connection limits (in all and per client address, the few connections reserved for probes,
evicting idle and slow ones), the watch on a waiting client's socket (_DisconnectWatch: a FIN or
reset aborts its request), the access log, and the SSE writer (one write per event). Routes,
auth and error shapes come from the route table (routing.RouteTable, built in routes.py); what
a route answers is its handler's.

Each connection gets a daemon thread (HTTP/1.1 keep-alive).
"""
from __future__ import annotations

import errno
import io
import logging
import re
import select
import socket
import socketserver
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

from lite_llm import __version__
from lite_llm.server.routing import ClientGone, Request, Response, ServerState, check_api_key
from lite_llm.server.validation import ApiError, dumps

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
# What a request line may carry into a log line only escaped: control characters (a NUL, a
# newline forging a second line, terminal escapes), and the quote and backslash that delimit
# and escape fields (as nginx writes them: \xHH).
_LOG_UNSAFE = re.compile(r'[\x00-\x1f\x7f-\x9f"\\]')


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



# ---- the handler: bytes <-> Request / Response ---------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.1"   # so even a garbled request line gets a JSON error
    server_version = f"lite-llm/{__version__}"
    sys_version = ""
    disable_nagle_algorithm = True      # SSE chunks are small and latency matters
    server: "LiteServer"

    def setup(self) -> None:
        srv = self.server
        self.timeout = srv.write_timeout             # writes; reads go through _DeadlineReader
        super().setup()
        self._conn = srv.connection_of(self.connection)
        self._reader = _DeadlineReader(self.connection, self._conn, srv.header_timeout, srv.write_timeout)
        self.rfile = io.BufferedReader(self._reader, 1 << 16)

    def handle_one_request(self) -> None:
        self._reader.wait_request(self.server.request_timeout)
        self._status, self._tokens, self._started, self._label = None, None, None, None
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
        """Route one request: framing, the probe-only check, the API key, 404/405, then the
        route's handler; its Response written, its close run, one access log line."""
        self._body_read = False
        self._body_limit = self.state.max_body_bytes     # the route's own when it has one
        self._headers_sent = False
        self._error_body: Callable[[ApiError], dict] | None = None
        self._conn.enter("busy")
        self._started = time.monotonic()
        path, response = "?", None
        try:
            parts = urlsplit(self.path)
            path = parts.path.rstrip("/") if len(parts.path) > 1 else parts.path
            group, arg = self.state.routes.find(path)
            if group is not None:
                self._error_body, self._label = group.error, group.log_label
            self._check_framing()
            if self._conn.probe_only:
                self._check_probe(group is not None and group.probe)
            if group is None or group.auth:
                check_api_key(self.headers, self.state.api_key)
            if group is None:
                raise ApiError(404, f"Not Found: {method} {path[:200]}", code="not_found")
            route = group.methods.get("GET" if method == "HEAD" else method)
            if route is None:
                raise ApiError(405, f"Method {method} not allowed for {path}; use {', '.join(group.methods)}",
                               headers={"Allow": ", ".join(group.methods)})
            if route.body_limit is not None:
                self._body_limit = route.body_limit(self.state)
            request = Request(method, path, parts.query, self.headers,
                              str(self.client_address[0]) if self.client_address else "", arg,
                              self._read_body, self._watch)
            response = route.handler(request, self.state)
            self._write(response)
        except ApiError as e:
            self._send_error(e)
        except (ClientGone, ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception:
            logger.exception("internal error on %s %s", log_safe(method), log_safe(self.path[:200]))
            self._send_error(ApiError(500, "internal server error"))
        finally:
            if response is not None:
                self._close(response)
            self._log_access(method, path)

    def _close(self, response: Response) -> None:
        """A stream that did not run to its end is closed (its generator's cleanup runs), then
        the response's own close (its engine requests released)."""
        close_stream = getattr(response.stream, "close", None)
        try:
            if close_stream is not None:
                close_stream()
        finally:
            if response.close is not None:
                response.close()
            self._tokens = response.tokens

    def _watch(self, on_gone: Callable[[], None]) -> "_DisconnectWatch":
        return _DisconnectWatch(self.connection, on_gone, self._reader.has_buffered(self.rfile))

    def _log_access(self, method: str, path: str) -> None:
        if not self.server.log_requests or not access_logger.isEnabledFor(logging.INFO):
            return
        route = self._label or path[:100]
        tokens = "-" if self._tokens is None else "%d+%d" % self._tokens
        access_logger.info('%s "%s %s" %s tokens=%s %.0fms', self.client_address[0], log_safe(method), log_safe(route),
                           self._status or "-", tokens, (time.monotonic() - self._started) * 1e3)

    # ---- reading a request -----------------------------------------------------------------------

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

    def _check_probe(self, is_probe: bool) -> None:
        """A connection taken beyond the limits answers one probe and closes; anything else
        gets the 503 the limits give (429 when its own address's cap was the one reached)."""
        self.close_connection = True
        if not is_probe:
            self._linger = self._has_unread_body()     # so the client reads the refusal, not a reset
            raise _connection_refusal(self._conn.over_client, self.state.retry_after)

    def _start_body(self) -> None:
        self._conn.enter("body")
        self._reader.set_deadline(self.server.body_timeout)

    def _read_body(self) -> bytes:
        limit = self._body_limit
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
            raise ClientGone()
        return data

    def _read_chunked(self, limit: int) -> bytes:
        parts, total = [], 0
        while True:
            try:
                line = self.rfile.readline(1026)
            except TimeoutError:
                raise ApiError(408, "timed out reading the request body") from None
            if not line:
                raise ClientGone()
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

    def _send_error(self, e: ApiError) -> None:
        if getattr(self, "_headers_sent", False):
            self.close_connection = True      # mid-answer: the only honest signal left
            return
        if e.status in (408, 411, 413):
            self.close_connection = True
            self._linger = e.status == 413 and self._has_unread_body()
        shape = getattr(self, "_error_body", None)
        try:
            self._send_bytes(e.status, dumps(e.body() if shape is None else shape(e)), "application/json", e.headers)
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
        data = dumps(err.body())
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

    # ---- writing a response ----------------------------------------------------------------------

    def _write(self, response: Response) -> None:
        """A whole body with its length, or a stream as HTTP/1.1 chunks, one write per event
        (to an HTTP/1.0 client the bare events, the end of the stream closing the connection)."""
        if response.stream is None:
            self._send_bytes(response.status, response.body, response.content_type, response.headers)
            return
        self._chunked = self.request_version != "HTTP/1.0"
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        for k, v in response.headers.items():
            self.send_header(k, v)
        if self._chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        self._headers_sent = True
        for data in response.stream:
            self._write_chunk(data)
        if not self._chunked:
            return
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            raise ClientGone() from None

    def _write_chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk (or the bare bytes to an HTTP/1.0 client); a failed write means
        the client left."""
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        except (ConnectionError, TimeoutError, OSError):
            raise ClientGone() from None


# ---- the server: connections and their limits ----------------------------------------------------

class LiteServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024          # listen backlog: bursts of clients must not be refused
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: ServerState, request_timeout: float, *,
                 header_timeout: float = 10.0, body_timeout: float = 30.0, write_timeout: float | None = None,
                 max_connections: int = MAX_CONNECTIONS, max_connections_per_client: int | None = None,
                 log_requests: bool = True):
        self.state = state
        self.request_timeout = request_timeout          # idle keep-alive: first byte of a request
        self.header_timeout = header_timeout            # request line + headers, in total
        self.body_timeout = body_timeout                # the whole body, in total
        self.write_timeout = request_timeout if write_timeout is None else write_timeout
        self.max_connections = max_connections
        # None: half of max_connections, so one address cannot take them all; 0: no per-address cap
        self.max_connections_per_client = (default_connections_per_client(max_connections)
                                           if max_connections_per_client is None else max_connections_per_client)
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
        body = dumps(e.body())
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
