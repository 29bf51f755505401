"""The contract between the transport (server/transport.py) and the route handlers: a typed
Request, a Response, the state every handler shares (ServerState), and the route table type.

A handler is a function `handler(req, state) -> Response`. It reads the request only through
Request (method, path, query, headers, body bytes or parsed JSON, client address, a watch on the
client leaving) and answers with a Response (a JSON body, bytes, or an iterator of encoded
stream events) that the transport writes. Handlers raise ApiError for a 4xx/5xx; the route's
error shape turns it into a body. What is not here: sockets, framing, limits and keep-alive
(transport.py), the table itself (routes.py).
"""
from __future__ import annotations

import hmac
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Protocol
from urllib.parse import unquote

from lite_llm.server.validation import ApiError, dumps, parse_json


class ClientGone(Exception):
    """The client closed its connection or stopped reading; nothing more can be sent."""


class Watch(Protocol):
    """A watch on the client while its request runs (transport._DisconnectWatch): gone turns
    True, once, when the client has left."""
    gone: bool


@dataclass
class Request:
    """One HTTP request as a handler sees it. The body is read (within the body limit and
    deadline) on the first call of body() or json(), never before."""
    method: str                        # HEAD is answered by the GET handler
    path: str                          # no query, no trailing slash
    query: str
    headers: Any                       # email.message.Message: .get(name), .get_all(name)
    client: str                        # the client's address ("" when unknown)
    route_arg: str | None = None       # the {name} part of a pattern route, percent-decoded
    read_body: Callable[[], bytes] = lambda: b""
    # watch(on_gone) -> a context manager yielding a Watch: on_gone runs (on another thread)
    # once if the client leaves while the block runs
    watch: Callable[[Callable[[], None]], ContextManager[Watch]] | None = None

    def body(self) -> bytes:
        return self.read_body()

    def json(self) -> dict:
        """The body as a JSON object, nesting bounded (validation.parse_json); else a 400."""
        return parse_json(self.read_body())


@dataclass
class Response:
    """What a handler answers: a whole body (`body`, with its content type), or a stream of
    already-encoded events (`stream`, each written as one chunk). close, if set, runs once the
    transport is done with the response, written or not (a stream's handler releases its engine
    requests there). tokens: (prompt, completion) for the access log; a stream sets it as it goes."""
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterator[bytes] | None = None
    close: Callable[[], None] | None = None
    tokens: tuple[int, int] | None = None

    @classmethod
    def json(cls, value: Any, status: int = 200, headers: dict[str, str] | None = None,
             tokens: tuple[int, int] | None = None) -> "Response":
        return cls(status, dumps(value), "application/json", dict(headers or {}), tokens=tokens)

    @classmethod
    def events(cls, stream: Iterator[bytes] | None = None, close: Callable[[], None] | None = None) -> "Response":
        """A server-sent event stream: each item one encoded event."""
        return cls(200, b"", "text/event-stream; charset=utf-8", {"Cache-Control": "no-cache"},
                   stream=stream, close=close)


Handler = Callable[[Request, "ServerState"], Response]


def openai_error(e: ApiError) -> dict:
    """OpenAI's error shape {"error": {"message", "type", "param", "code"}}."""
    return e.body()


@dataclass(frozen=True)
class Route:
    """One (method, path) of the server. path is exact, or a pattern with one `{name}` part
    (`{name:path}` also matches slashes). auth: the API key is needed (when the server has one);
    probe: served on the connections reserved beyond the limits for monitors; error: the shape
    of this route's errors; doc: its OpenAPI operation (server/openapi.py), None for none;
    log_path: the access log names the request's own path (a file), not the pattern's
    (`/v1/responses/{id}`: an id is the client's, not worth a log line's room);
    body_limit: this route's request body limit in bytes from the server's state (an upload's
    route), None: the server's max_body_bytes."""
    method: str
    path: str
    handler: Handler
    auth: bool = True
    probe: bool = False
    error: Callable[[ApiError], dict] = openai_error
    doc: dict | None = None
    log_path: bool = False
    body_limit: Callable[[Any], int] | None = None


@dataclass
class PathRoutes:
    """The routes of one path: the methods it answers, and what the path shares (auth, probe,
    error shape: a path is open, a probe or Anthropic-shaped whatever the method)."""
    label: str                              # the path as routed: "/v1/responses/{response_id}"
    methods: dict[str, Route]
    auth: bool
    probe: bool
    error: Callable[[ApiError], dict]
    pattern: re.Pattern | None = None
    log_label: str | None = None            # the access log's name of the path; None: the path itself


_PART = re.compile(r"\{(\w+)(:path)?\}")


class RouteTable:
    """Routes by path: exact paths first, then the patterns in table order."""

    def __init__(self, routes: list[Route]):
        self.routes = list(routes)
        self._exact: dict[str, PathRoutes] = {}
        self._patterns: list[PathRoutes] = []
        for r in self.routes:
            group = self._exact.get(r.path) or next((g for g in self._patterns if g.label == r.path), None)
            if group is None:
                m = _PART.search(r.path)
                pattern = None if m is None else re.compile(
                    re.escape(r.path[:m.start()]) + ("(.+)" if m.group(2) else "([^/]+)") + re.escape(r.path[m.end():]))
                log_label = None if r.log_path else _PART.sub("{id}", r.path)
                group = PathRoutes(r.path, {}, r.auth, r.probe, r.error, pattern, log_label)
                (self._exact.__setitem__(r.path, group) if pattern is None else self._patterns.append(group))
            if r.method in group.methods:
                raise ValueError(f"two routes for {r.method} {r.path}")
            group.methods[r.method] = r
            group.auth, group.probe = group.auth or r.auth, group.probe and r.probe

    def find(self, path: str) -> tuple[PathRoutes | None, str | None]:
        """(the path's routes, the decoded {name} part of a pattern route), or (None, None)."""
        group = self._exact.get(path)
        if group is not None:
            return group, None
        for group in self._patterns:
            m = group.pattern.fullmatch(path)
            if m:
                return group, unquote(m.group(1))
        return None, None

    def paths(self) -> list[PathRoutes]:
        return list(self._exact.values()) + self._patterns


def check_api_key(headers: Any, key: str | None) -> None:
    """A 401 unless the request carries key as a bearer token (or in x-api-key, as Anthropic's
    SDKs send it); compared in constant time."""
    if key is None:
        return
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
        return
    other = headers.get("x-api-key")
    if other is not None and hmac.compare_digest(other.strip().encode(), key.encode()):
        return
    raise ApiError(401, "Incorrect or missing API key: pass 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                   code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class ServerState:
    """What every handler shares: engine, model facts, metrics, the route table, the draining flag."""

    def __init__(self, engine: Any, ctx: Any, metrics: Any, api_key: str | None, kernel_info: dict,
                 max_body_bytes: int, model_root: str | None, retry_after: int, *, routes: RouteTable,
                 responses: Any = None, lora_root: str | None = None, pool: Any = None,
                 max_upload_bytes: int | None = None):
        self.engine, self.ctx, self.metrics = engine, ctx, metrics   # ctx: openai's ServingContext
        self.api_key = api_key
        self.kernel_info = kernel_info
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes or max_body_bytes   # the audio routes' (Route.body_limit)
        # /v1/models shows a model's name, never where it sits on this machine
        self.model_root = os.path.basename(model_root.rstrip("/\\")) if model_root else None
        self.retry_after = retry_after
        self.routes = routes
        self.responses = responses          # responses.ResponseStore of /v1/responses
        self.lora_root = lora_root          # runtime adapter loading's root; None: off
        self.pool = pool                    # models.ModelPool of a server of several models; None: one
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
