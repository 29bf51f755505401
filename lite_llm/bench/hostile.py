"""`lite-llm bench hostile`: a hostile sweep against a running server, with a watchdog.

Seven attacks run in turn, each for about --seconds, against --url:

  1 template     request-supplied chat templates: a 500 MB string constant, then loop bombs
  2 monopoly     one completions request of 256 prompts x n 4 x max_tokens 4000 (streamed)
  3 fin          long non-streamed requests whose clients close politely (FIN): how long
                 until /metrics' lite_llm:num_requests_running drops
  4 connections  520 concurrent long requests from this one address
  5 schema       JSON schemas nested 300-450 deep (object, anyOf) and 900 deep (array) on
                 response_format json_schema, guided_json and Responses text.format
  6 leaks        lora_path probes (/etc/passwd, a directory, a missing path) and a
                 100,000-entry guided_choice
  7 small        /tokenize of ~80k tokens, a 7070x7070 PNG (Pillow) x1 and x4, a colliding
                 request_id, a NUL in the request line, three Responses {"input": ""} at once

During each attack a watchdog asks /health and a 4-token completion every 0.5 s, each on a
connection of its own (as an unrelated client would), and keeps every probe's status and
latency. Per attack the sweep reports requests sent, status counts (5xx apart), stalls (probes
slower than 2 s, with their durations), the slowest /health and completion probes, answers
that echo what the client sent or what a file it named holds, and, after the server is idle
again, KV blocks still held and the server's resident memory (/proc/PID/status with --pid;
/metrics' process_resident_memory_bytes when the server exports it). With --server-log it
also counts what each attack added to the server's log (bytes, tracebacks, raw NUL bytes).

Every attack ends its own requests at its deadline: streamed ones and held connections are
closed with a reset (the server aborts on a reset), and every request has a timeout, so the
sweep has a total time bound (--max-total). Only the stdlib, plus Pillow for the image
attack (skipped without it). Deliberately not here: fuzzing (schemathesis does that), load
tests (bench serve), anything needing a second machine.
"""
from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import platform
import selectors
import socket
import ssl
import struct
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from lite_llm.config import env

STALL_SECONDS = 2.0           # a probe slower than this is a stall
READ_CAP = 1 << 20            # bytes of an answer kept for the echo checks; the rest is not read
GRACE = 20.0                  # seconds a request may overrun its attack's deadline before it is cut
ATTACKS = ("template", "monopoly", "fin", "connections", "schema", "leaks", "small")
TITLES = {
    "template": "1 template bomb, loop bomb",
    "monopoly": "2 monopolising request",
    "fin": "3 FIN-closed clients",
    "connections": "4 connection slots",
    "schema": "5 deep JSON schemas",
    "leaks": "6 lora_path, guided_choice",
    "small": "7 smaller ones",
}
# Strings that only appear in an answer when the server shows its internals.
INTERNALS = ("Traceback (most recent", "RecursionError", "panicked at", "panic: ", "<backtrace>", "RUST_BACKTRACE",
             "stack backtrace")
BOMB = "{{ 'a' * 500000000 }}"


# ---- one request ----------------------------------------------------------------------------


@dataclass
class Reply:
    status: int               # HTTP status; 0 when there was none (see error)
    seconds: float
    body: bytes = b""         # at most READ_CAP bytes of it
    size: int = 0             # the answer's length (Content-Length, else bytes read)
    error: str = ""           # "timeout", "reset", "refused", or an exception's name


def _reset_close(sock: socket.socket | None) -> None:
    """Close with a TCP reset (SO_LINGER 0): the server sees the client gone, as at a crash."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _error_name(e: BaseException) -> str:
    if isinstance(e, (TimeoutError, socket.timeout)):
        return "timeout"
    if isinstance(e, ConnectionResetError):
        return "reset"
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    return type(e).__name__


class Target:
    """The server under test: its address, key, and the ways the sweep talks to it."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 30.0, source: str | None = None):
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise SystemExit(f"--url must be http(s)://host:port, got {url!r}")
        self.url, self.https = url.rstrip("/"), u.scheme == "https"
        self.host, self.port = u.hostname, u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        self.source = (source, 0) if source else None      # the local address connections come from
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, source_address=self.source,
                                               context=ssl._create_unverified_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout, source_address=self.source)

    def call(self, method: str, path: str, body: Any = None, *, data: bytes | None = None,
             timeout: float | None = None) -> Reply:
        """One request on a connection of its own; the answer read up to READ_CAP bytes."""
        start = time.monotonic()
        conn = self.connection(timeout or self.timeout)
        partial = True
        try:
            if data is None and body is not None:
                data = json.dumps(body).encode()
            conn.request(method, self.prefix + path, body=data, headers=self.headers)
            resp = conn.getresponse()
            kept = resp.read(READ_CAP)
            size = len(kept) + (resp.length or 0)
            partial = not resp.isclosed()
            return Reply(resp.status, time.monotonic() - start, kept, size)
        except (OSError, http.client.HTTPException) as e:
            return Reply(0, time.monotonic() - start, error=_error_name(e))
        finally:
            if partial:                 # unanswered or partly read: reset, so the server stops on it
                _reset_close(conn.sock)
                conn.sock = None
            conn.close()

    def metrics(self) -> dict[str, float]:
        """GET /metrics as {sample name: value summed over label sets}; {} when unreadable."""
        reply = self.call("GET", "/metrics", timeout=10.0)
        if reply.status != 200:
            return {}
        out: dict[str, float] = {}
        for line in reply.body.decode("utf-8", "replace").splitlines():
            if not line or line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            try:
                number = float(value)
            except ValueError:
                continue
            name = key.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + number
        return out

    def engine_stats(self) -> dict:
        reply = self.call("GET", "/v1/engine/stats", timeout=10.0)
        try:
            return json.loads(reply.body) if reply.status == 200 else {}
        except ValueError:
            return {}

    def socket(self, timeout: float) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=timeout, source_address=self.source)
        if self.https:
            sock = ssl._create_unverified_context().wrap_socket(sock, server_hostname=self.host)
        return sock

    def from_address(self, source: str | None) -> "Target":
        """The same server, reached from another local address (another client to the server)."""
        other = Target.__new__(Target)
        other.__dict__.update(self.__dict__, source=(source, 0) if source else None)
        return other

    def request_bytes(self, method: str, path: str, body: Any = None) -> bytes:
        data = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                *(f"{k}: {v}" for k, v in self.headers.items()), f"Content-Length: {len(data)}"]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + data


def _status_of(head: bytes) -> int:
    """The status of an answer's first bytes (b'HTTP/1.1 503 ...'); 0 if none yet."""
    parts = head.split(b"\r\n", 1)[0].split()
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return 0


# ---- the watchdog ---------------------------------------------------------------------------


@dataclass
class Probe:
    kind: str                 # "health" or "completion"
    status: int               # 0: no answer (error says why)
    seconds: float
    at: float                 # seconds from the attack's start to the probe's start
    error: str = ""


def read_rss(pid: int | None) -> int | None:
    """Resident bytes of process pid (/proc/PID/status VmRSS), None when unknown."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class Watchdog:
    """/health and a 4-token completion every `interval` s, each on a connection of its own;
    with a pid, the server's resident memory sampled as often (its peak kept)."""

    def __init__(self, target: Target, model: str, interval: float = 0.5, completion: bool = True,
                 timeout: float = 20.0, rss: Callable[[], int | None] | None = None):
        self.target, self.model, self.interval = target, model, interval
        self.completion, self.timeout, self.rss = completion, timeout, rss
        self.probes: list[Probe] = []
        self.rss_peak: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._t0 = time.monotonic()

    def _loop(self, kind: str, method: str, path: str, body: Any) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            reply = self.target.call(method, path, body, timeout=self.timeout)
            with self._lock:
                self.probes.append(Probe(kind, reply.status, reply.seconds, began - self._t0, reply.error))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def _rss_loop(self) -> None:
        while not self._stop.is_set():
            value = self.rss()
            if value is not None:
                with self._lock:
                    self.rss_peak = max(self.rss_peak or 0, value)
            self._stop.wait(self.interval / 2)

    def __enter__(self) -> "Watchdog":
        self._t0 = time.monotonic()
        loops = [("health", "GET", "/health", None)]
        if self.completion:
            loops.append(("completion", "POST", "/v1/completions",
                          {"model": self.model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}))
        self._threads = [threading.Thread(target=self._loop, args=a, name=f"hostile-{a[0]}", daemon=True)
                         for a in loops]
        if self.rss is not None:
            self._threads.append(threading.Thread(target=self._rss_loop, name="hostile-rss", daemon=True))
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)


# ---- results ----------------------------------------------------------------------------------


@dataclass
class AttackResult:
    name: str
    title: str
    seconds: float = 0.0                     # the attack itself, settling not included
    sent: int = 0
    statuses: dict[str, int] = field(default_factory=dict)   # "200", "400", ..., "timeout", "reset"
    probes: list[Probe] = field(default_factory=list)
    echoes: list[str] = field(default_factory=list)          # "what: which marker" per echoing answer
    notes: list[str] = field(default_factory=list)           # the attack's own figures
    settle_seconds: float = 0.0              # after the attack, until nothing ran or waited
    idle: bool | None = None                 # whether the server got idle within --settle
    kv_blocks_after: int | None = None       # KV blocks held once idle (leaked if > 0)
    kv_usage_after: float | None = None
    rss_before: int | None = None
    rss_peak: int | None = None
    rss_after: int | None = None
    log_bytes: int | None = None             # bytes the attack added to --server-log
    log_tracebacks: int | None = None
    log_nul_bytes: int | None = None
    skipped: str = ""

    def count(self, key: str) -> None:
        self.statuses[key] = self.statuses.get(key, 0) + 1

    def record(self, reply: Reply, what: str, markers: Iterable[str] = ()) -> Reply:
        """One attack request's answer: its status counted, an error's body checked for what the
        client sent (markers) and any answer for the server's internals."""
        self.sent += 1
        self.count(str(reply.status) if reply.status else (reply.error or "error"))
        self.check_echo(reply.body, what, markers if not 200 <= reply.status < 300 else ())
        return reply

    def check_echo(self, body: bytes, what: str, markers: Iterable[str] = ()) -> None:
        for m in (*markers, *INTERNALS):
            if m and m.encode() in body:
                self.echoes.append(f"{what}: {m[:40]!r}")
                return

    @property
    def num_5xx(self) -> int:
        return sum(n for k, n in self.statuses.items() if k.isdigit() and int(k) >= 500)

    def of(self, kind: str) -> list[Probe]:
        return [p for p in self.probes if p.kind == kind]

    def stalls(self, bound: float = STALL_SECONDS) -> list[Probe]:
        return [p for p in self.probes if p.seconds > bound]

    def max_seconds(self, kind: str) -> float | None:
        probes = self.of(kind)
        return max(p.seconds for p in probes) if probes else None

    def failed_probes(self, kind: str | None = None) -> list[Probe]:
        return [p for p in self.probes if p.status != 200 and (kind is None or p.kind == kind)]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["num_5xx"] = self.num_5xx
        d["stalls"] = [{"kind": p.kind, "seconds": round(p.seconds, 3), "at": round(p.at, 2)}
                       for p in self.stalls()]
        d["probes_summary"] = {kind: {"sent": len(self.of(kind)),
                                      "ok": sum(p.status == 200 for p in self.of(kind)),
                                      "max_ms": None if self.max_seconds(kind) is None
                                      else round(self.max_seconds(kind) * 1000, 1),
                                      "failed": _counts(str(p.status or p.error) for p in self.failed_probes(kind))}
                               for kind in ("health", "completion")}
        return d


def _counts(keys: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return out


# ---- the attacks ------------------------------------------------------------------------------


def default_probe_source(target: Target) -> str | None:
    """127.0.0.2 when the server is on this machine's loopback (every 127/8 address is local on
    Linux), so that the watchdog and the scrapes are another client than the attacks; else None."""
    return "127.0.0.2" if target.host in ("127.0.0.1", "localhost") and sys.platform == "linux" else None


class Sweep:
    """Runs the attacks in turn; each is a method `_<name>(res, deadline)`. The attacks use
    `target`; the watchdog and the figures (/metrics, /v1/engine/stats) use `probe`: the same
    server, from another address when one is given (probe_source)."""

    def __init__(self, target: Target, model: str, seconds: float = 20.0, settle: float = 30.0,
                 pid: int | None = None, server_log: str | None = None, interval: float = 0.5,
                 probe_timeout: float = 20.0, monopoly: tuple[int, int, int] = (256, 4, 4000),
                 fin_clients: int = 4, fin_max_tokens: int = 2000, connections: int = 520,
                 connection_max_tokens: int = 4000, loop_iterations: int = 20_000_000,
                 choices: int = 100_000, probe_source: str | None = None,
                 log: Callable[[str], None] | None = None):
        self.target, self.model = target, model
        self.probe = target.from_address(probe_source) if probe_source else target
        self.seconds, self.settle, self.pid, self.server_log = seconds, settle, pid, server_log
        self.interval, self.probe_timeout = interval, probe_timeout
        self.monopoly, self.fin_clients, self.fin_max_tokens = monopoly, fin_clients, fin_max_tokens
        self.connections, self.connection_max_tokens = connections, connection_max_tokens
        self.loop_iterations, self.choices = loop_iterations, choices
        self.log = log or (lambda s: None)
        self.rss_source = "none"
        self.has_gauges = True         # /metrics has the running and waiting gauges (checked by run)

    # -- helpers --------------------------------------------------------------------------------

    def rss(self) -> int | None:
        value = read_rss(self.pid)
        if value is not None:
            self.rss_source = f"/proc/{self.pid}/status VmRSS"
            return value
        if self.pid is None:
            m = self.probe.metrics().get("process_resident_memory_bytes")
            if m is not None:
                self.rss_source = "/metrics process_resident_memory_bytes"
                return int(m)
        return None

    def _rss_sampler(self) -> Callable[[], int | None] | None:
        if self.pid is not None and read_rss(self.pid) is not None:
            return lambda: read_rss(self.pid)
        return None      # /metrics scrapes every 0.25 s would load the server: before/after only

    def busy(self) -> tuple[float, float]:
        """(running, waiting) requests from /metrics; (-1, -1) when unreadable."""
        m = self.probe.metrics()
        if "lite_llm:num_requests_running" not in m and "vllm:num_requests_running" not in m:
            return -1.0, -1.0
        get = lambda n: m.get(f"lite_llm:{n}", m.get(f"vllm:{n}", 0.0))   # noqa: E731
        return get("num_requests_running"), get("num_requests_waiting")

    def kv_blocks(self) -> tuple[int | None, float | None]:
        """(KV blocks held, usage 0..1): /v1/engine/stats' blocks_used, else /metrics' usage."""
        kv = (self.probe.engine_stats() or {}).get("kv_cache") or {}
        usage = kv.get("usage")
        if usage is None:
            m = self.probe.metrics()
            usage = m.get("lite_llm:kv_cache_usage_perc", m.get("vllm:kv_cache_usage_perc"))
        return kv.get("blocks_used"), usage

    def wait_idle(self, bound: float) -> tuple[float, bool | None]:
        """Seconds until nothing runs or waits (polled every 0.2 s), at most bound; None for
        idle when the server exports no such gauges. A scrape that fails (a server still busy
        closing an attack's connections) is polled again."""
        start = time.monotonic()
        while True:
            running, waiting = self.busy()
            if running < 0 and not self.has_gauges:
                return time.monotonic() - start, None
            if running == 0 and waiting == 0:
                return time.monotonic() - start, True
            if time.monotonic() - start >= bound:
                return time.monotonic() - start, False
            time.sleep(0.2)

    def kv_when_idle(self, bound: float) -> tuple[int | None, float | None]:
        """KV blocks held once idle: polled until none (the engine frees an aborted request's
        blocks a step after it stops counting it), at most bound; what is held then is leaked."""
        end = time.monotonic() + bound
        while True:
            blocks, usage = self.kv_blocks()
            if usage == 0 or (usage is None and not self.has_gauges) or time.monotonic() >= end:
                return blocks, usage
            time.sleep(0.2)

    def log_size(self) -> int | None:
        """The server log's size now (None without one): where an attack's log lines start."""
        try:
            return os.path.getsize(self.server_log) if self.server_log else None
        except OSError:
            return None

    def log_delta(self, res: AttackResult, start: int | None) -> None:
        """What the server logged since start (log_size before the attack): its bytes, tracebacks
        and raw NUL bytes into res."""
        end = self.log_size()
        if start is None or end is None:
            return
        res.log_bytes = max(0, end - start)
        mark = b"Traceback (most recent call last)"
        res.log_tracebacks = res.log_nul_bytes = 0
        with open(self.server_log, "rb") as f:
            f.seek(start)
            tail = b""
            while f.tell() < end:
                chunk = f.read(min(8 << 20, end - f.tell()))
                if not chunk:
                    break
                res.log_tracebacks += (tail + chunk).count(mark) - tail.count(mark)
                res.log_nul_bytes += chunk.count(b"\x00")
                tail = chunk[-(len(mark) - 1):]

    def _timeout(self, deadline: float) -> float:
        return max(2.0, deadline - time.monotonic()) + GRACE

    # -- the run --------------------------------------------------------------------------------

    def run_attack(self, name: str, total_deadline: float) -> AttackResult:
        res = AttackResult(name, TITLES[name])
        left = total_deadline - time.monotonic()
        if left < min(self.seconds, 5.0):
            res.skipped = "the sweep's total time bound was reached"
            return res
        res.rss_before = self.rss()
        log_start = self.log_size()
        seconds = min(self.seconds, left)
        start = time.monotonic()
        dog = Watchdog(self.probe, self.model, self.interval, completion=(name != "fin"),
                       timeout=self.probe_timeout, rss=self._rss_sampler())
        with dog:
            try:
                getattr(self, f"_{name}")(res, start + seconds)
            except (OSError, http.client.HTTPException) as e:   # the sweep's own trouble, kept
                res.notes.append(f"attack stopped early: {_error_name(e)}: {e}")
        res.seconds = time.monotonic() - start
        res.probes = list(dog.probes)
        res.rss_peak = dog.rss_peak
        res.settle_seconds, res.idle = self.wait_idle(self.settle)
        res.kv_blocks_after, res.kv_usage_after = self.kv_when_idle(max(1.0, self.settle - res.settle_seconds))
        res.rss_after = self.rss()
        if res.rss_peak is not None:
            res.rss_peak = max(res.rss_peak, *(v for v in (res.rss_before, res.rss_after) if v is not None))
        self.log_delta(res, log_start)
        return res

    def run(self, attacks: Iterable[str] = ATTACKS, max_total: float | None = None) -> dict:
        started = time.time()
        t0 = time.monotonic()
        attacks = list(attacks)
        if max_total is None:
            max_total = len(attacks) * (self.seconds + self.settle + GRACE + self.probe_timeout) + 60
        total_deadline = t0 + max_total
        load_before = _loadavg()
        self.has_gauges = self.busy()[0] >= 0
        settle0, idle0 = self.wait_idle(self.settle)
        rss_start = self.rss()
        kv0 = self.kv_blocks()
        results = []
        for name in attacks:
            self.log(f"[{time.monotonic() - t0:6.1f} s] {TITLES[name]} ...")
            res = self.run_attack(name, total_deadline)
            results.append(res)
            self.log(f"[{time.monotonic() - t0:6.1f} s]   sent {res.sent}, statuses {res.statuses}, "
                     f"stalls {len(res.stalls())}, settled in {res.settle_seconds:.1f} s"
                     + (f" ({res.skipped})" if res.skipped else ""))
        settle_end, idle_end = self.wait_idle(self.settle)
        kv_end = self.kv_when_idle(max(1.0, self.settle - settle_end))
        rss_end = self.rss()
        return {
            "url": self.target.url, "model": self.model,
            "probe_source": None if self.probe.source is None else self.probe.source[0], "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                              time.gmtime(started)),
            "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                        "loadavg_before": load_before, "loadavg_after": _loadavg()},
            "seconds_per_attack": self.seconds, "duration_s": round(time.monotonic() - t0, 1),
            "settings": {"monopoly": list(self.monopoly), "fin_clients": self.fin_clients,
                         "fin_max_tokens": self.fin_max_tokens, "connections": self.connections,
                         "connection_max_tokens": self.connection_max_tokens,
                         "loop_iterations": self.loop_iterations, "choices": self.choices},
            "start": {"idle": idle0, "settle_s": round(settle0, 1), "kv_blocks_used": kv0[0],
                      "kv_usage": kv0[1], "rss_bytes": rss_start},
            "end": {"idle": idle_end, "settle_s": round(settle_end, 1), "kv_blocks_used": kv_end[0],
                    "kv_usage": kv_end[1], "rss_bytes": rss_end,
                    "rss_growth_bytes": None if rss_start is None or rss_end is None else rss_end - rss_start},
            "rss_source": self.rss_source,
            "attacks": [r.to_dict() for r in results],
        }

    # -- 1: templates ---------------------------------------------------------------------------

    def _template(self, res: AttackResult, deadline: float) -> None:
        messages = [{"role": "user", "content": "Hi"}]
        bombs = {"/tokenize": {"model": self.model, "messages": messages},
                 "/v1/chat/completions": {"model": self.model, "messages": messages, "max_tokens": 1}}
        markers = ("a" * 64, "'a' * 500000000")
        for path, body in bombs.items():      # the 500 MB string, once per route
            r = res.record(self.target.call("POST", path, {**body, "chat_template": BOMB},
                                            timeout=self._timeout(deadline)), f"{path} string bomb", markers)
            res.notes.append(f"string bomb {path}: {r.status or r.error} in {r.seconds:.1f} s")
        # nested: jinja2's sandbox refuses one range() over 100,000 items, not a loop inside a loop
        inner = min(self.loop_iterations, 100_000)
        outer = max(1, self.loop_iterations // inner)
        n = inner * outer
        loop = ("{% for i in range(" + str(outer) + ") %}{% for j in range(" + str(inner) + ") %}{% endfor %}"
                "{% endfor %}{{ messages[0]['content'] }}")
        times, statuses = [], []
        while not times or time.monotonic() < deadline:   # then loop bombs: each route once, more while time is left
            for path, body in bombs.items():
                r = res.record(self.target.call("POST", path, {**body, "chat_template": loop},
                                                timeout=self._timeout(deadline)), f"{path} loop bomb",
                               ("range(" + str(inner),))
                times.append(r.seconds)
                statuses.append(str(r.status or r.error))
        res.notes.append(f"loop bomb ({n:.0e} iterations) x{len(times)}: "
                         + " ".join(f"{k}x{v}" for k, v in sorted(_counts(statuses).items()))
                         + f", {min(times):.1f}-{max(times):.1f} s each")

    # -- 2: one request for all the slots ---------------------------------------------------------

    def _monopoly(self, res: AttackResult, deadline: float) -> None:
        prompts, n, max_tokens = self.monopoly
        body = {"model": self.model, "prompt": [f"Write a long story about the number {i}." for i in range(prompts)],
                "n": n, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.8, "stream": True}
        sock = self.target.socket(timeout=10.0)
        peak_running = peak_waiting = 0.0
        events = 0
        start = time.monotonic()
        head = b""
        try:
            sock.sendall(self.target.request_bytes("POST", "/v1/completions", body))
            res.sent += 1
            sock.settimeout(0.5)
            next_scrape = time.monotonic()
            while time.monotonic() < deadline:
                try:
                    chunk = sock.recv(1 << 16)
                except (TimeoutError, socket.timeout):
                    chunk = None
                if chunk == b"":
                    break
                if chunk:
                    if len(head) < 4096:
                        head += chunk[:4096]
                    events += chunk.count(b"data: ")
                if time.monotonic() >= next_scrape:
                    running, waiting = self.busy()
                    peak_running, peak_waiting = max(peak_running, running), max(peak_waiting, waiting)
                    next_scrape = time.monotonic() + 1.0
        finally:
            _reset_close(sock)
        status = _status_of(head)
        res.count(str(status) if status else "no answer")
        res.check_echo(head, "monopolising request")
        res.notes.append(f"{prompts} prompts x n {n} x max_tokens {max_tokens}: {events} stream events "
                         f"in {time.monotonic() - start:.0f} s; peak running {peak_running:.0f}, waiting {peak_waiting:.0f}")

    # -- 3: clients that leave politely -----------------------------------------------------------

    def _fin(self, res: AttackResult, deadline: float) -> None:
        body = {"model": self.model, "prompt": "Tell me everything about rivers.", "max_tokens": self.fin_max_tokens,
                "ignore_eos": True, "temperature": 0}
        base_running, _ = self.busy()
        gen0 = self._generated()
        socks = []
        sent_at = time.monotonic()
        for _ in range(self.fin_clients):
            s = self.target.socket(timeout=10.0)
            s.sendall(self.target.request_bytes("POST", "/v1/completions", body))
            socks.append(s)
            res.sent += 1
        until = min(deadline, time.monotonic() + 10.0)     # until they all run (or 10 s)
        running = 0.0
        while time.monotonic() < until:
            running, waiting = self.busy()
            if running - max(base_running, 0) >= self.fin_clients:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        for s in socks:
            s.close()            # FIN: the client is done with this request
            res.count("closed (FIN)")
        closed = time.monotonic()
        gen_closed = self._generated()
        freed = None
        while time.monotonic() < max(deadline, closed + 5.0):
            running, waiting = self.busy()
            if running <= 0 and waiting <= 0:
                freed = time.monotonic() - closed
                break
            time.sleep(0.2)
        gen_after = self._generated()
        res.notes.append(f"{self.fin_clients} non-streamed requests of max_tokens {self.fin_max_tokens}, "
                         f"closed (FIN) {closed - sent_at:.1f} s after sending")
        if freed is not None:
            res.notes.append(f"freed {freed:.1f} s after the FIN")
        else:
            waited = time.monotonic() - closed
            more, idle = self.wait_idle(self.settle)
            total = waited + more
            res.notes.append(f"NOT freed within {waited:.1f} s of the FIN; still running "
                             + (f"until {total:.1f} s after it" if idle else f"> {total:.1f} s after it"))
        if gen0 is not None and gen_closed is not None:
            gen_final = self._generated()
            res.notes.append(f"tokens generated after the FIN: {int((gen_final or gen_after or 0) - gen_closed)}"
                             f" (before it: {int(gen_closed - gen0)}; asked for: {self.fin_clients * self.fin_max_tokens})")

    def _generated(self) -> float | None:
        m = self.probe.metrics()
        return m.get("lite_llm:generation_tokens_total", m.get("vllm:generation_tokens_total"))

    # -- 4: every connection slot ---------------------------------------------------------------

    def _connections(self, res: AttackResult, deadline: float) -> None:
        body = {"model": self.model, "prompt": "Count slowly to a million.", "max_tokens": self.connection_max_tokens,
                "ignore_eos": True, "temperature": 0, "stream": True}
        request = self.target.request_bytes("POST", "/v1/completions", body)
        sel = selectors.DefaultSelector()
        heads: dict[socket.socket, bytes] = {}
        failed = 0
        try:
            for _ in range(self.connections):
                if time.monotonic() >= deadline:
                    break
                try:
                    s = self.target.socket(timeout=5.0)
                    s.sendall(request)
                except OSError as e:
                    res.sent += 1
                    res.count(_error_name(e))
                    failed += 1
                    continue
                res.sent += 1
                s.setblocking(False)
                heads[s] = b""
                sel.register(s, selectors.EVENT_READ)
            opened = time.monotonic()
            open_now = len(heads)
            while time.monotonic() < deadline:
                for key, _ in sel.select(timeout=0.5):
                    s = key.fileobj
                    try:
                        chunk = s.recv(1 << 16)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        chunk = b""
                    if len(heads[s]) < 256:
                        heads[s] += chunk[:256]
                    if not chunk:
                        sel.unregister(s)
                        open_now -= 1
            held = open_now
        finally:
            for s in heads:
                _reset_close(s)
            sel.close()
        for s, head in heads.items():
            status = _status_of(head)
            res.count(str(status) if status else "no answer yet")
            res.check_echo(head, "held connection")
        res.notes.append(f"{self.connections} streamed requests of max_tokens {self.connection_max_tokens} opened "
                         f"({failed} could not connect); {held} still open after "
                         f"{max(0.0, deadline - opened):.0f} s, then reset")

    # -- 5: deep schemas -------------------------------------------------------------------------

    MARK = "hostile_q7"

    @classmethod
    def deep_schema(cls, kind: str, depth: int) -> str:
        """JSON text of a schema nested depth levels deep (built as text: no recursion here)."""
        if kind == "object":
            return ('{"type":"object","properties":{"' + cls.MARK + '":') * depth + '{"type":"string"}' + "}}" * depth
        if kind == "anyOf":
            return '{"anyOf":[' * depth + '{"type":"integer","description":"' + cls.MARK + '"}' + "]}" * depth
        if kind == "array":
            return '{"type":"array","items":' * depth + '{"type":"integer","description":"' + cls.MARK + '"}' + "}" * depth
        raise ValueError(kind)

    def _schema(self, res: AttackResult, deadline: float) -> None:
        cases = [("object", 300), ("object", 450), ("anyOf", 300), ("anyOf", 450), ("array", 900)]
        hole = '"__SCHEMA__"'
        routes = {
            "chat json_schema": ("/v1/chat/completions",
                                 {"model": self.model, "messages": [{"role": "user", "content": "JSON please"}],
                                  "max_tokens": 8, "response_format": {"type": "json_schema", "json_schema": {
                                      "name": "deep", "schema": "__SCHEMA__"}}}),
            "completions guided_json": ("/v1/completions", {"model": self.model, "prompt": "JSON:", "max_tokens": 8,
                                                            "guided_json": "__SCHEMA__"}),
            "responses text.format": ("/v1/responses", {"model": self.model, "input": "JSON please",
                                                        "max_output_tokens": 8, "text": {"format": {
                                                            "type": "json_schema", "name": "deep",
                                                            "schema": "__SCHEMA__"}}}),
        }
        by_case: dict[str, list[str]] = {}
        while not by_case or time.monotonic() < deadline:   # every case once, more while time is left
            for kind, depth in cases:
                schema = self.deep_schema(kind, depth)
                for what, (path, body) in routes.items():
                    if by_case.get(f"{kind} {depth}") and len(by_case[f"{kind} {depth}"]) >= len(routes) \
                            and time.monotonic() >= deadline:
                        break
                    data = json.dumps(body).replace(hole, schema).encode()
                    r = res.record(self.target.call("POST", path, data=data, timeout=self._timeout(deadline)),
                                   f"{what} {kind} {depth}", (self.MARK,))
                    by_case.setdefault(f"{kind} {depth}", []).append(str(r.status or r.error))
        for case, statuses in by_case.items():
            res.notes.append(f"{case}: " + " ".join(f"{k}x{v}" for k, v in sorted(_counts(statuses).items())))

    # -- 6: what errors say ------------------------------------------------------------------------

    def _leaks(self, res: AttackResult, deadline: float) -> None:
        # what /etc/passwd holds, as an error could quote it: its first line's start, its magic as bytes
        head = b""
        try:
            with open("/etc/passwd", "rb") as f:
                head = f.read(16)
        except OSError:
            pass
        file_markers = tuple(m for m in (head[:12].decode("ascii", "replace"), repr(head[:4])) if len(m) >= 6)
        messages = {}
        for path in ("/etc/passwd", "/etc", "/nonexistent/hostile/adapter"):
            r = res.record(self.target.call("POST", "/v1/load_lora_adapter",
                                            {"lora_name": f"hostile-{uuid.uuid4().hex[:8]}", "lora_path": path},
                                            timeout=self._timeout(deadline)),
                           f"lora_path {path}", file_markers)
            messages[path] = (r.status, _message_of(r.body))
            res.notes.append(f"lora_path {path}: {r.status or r.error}")
        if all(status == 404 for status, _ in messages.values()):
            res.notes.append("lora_path: 404 (no runtime adapter loading on this server: nothing probed)")
        elif len(set(messages.values())) > 1:
            res.notes.append("lora_path: the answers differ between a file, a directory and a missing path "
                             "(they tell which exist)")
        else:
            res.notes.append("lora_path: one answer for a file, a directory and a missing path")
        # entries as short as can be (x0 .. x1869f) so that 100,000 of them fit a 1 MiB body limit
        choices = [f"x{i:x}" for i in range(self.choices)]
        body = {"model": self.model, "prompt": "Pick one:", "max_tokens": 4, "guided_choice": choices}
        data = json.dumps(body, separators=(",", ":")).encode()
        markers = (f"x{self.choices - 1:x}", '"x1"', "'x1'", "x1,")
        times, statuses, sizes = [], [], []
        for _ in range(3):      # a few: each may take seconds of the server's time
            r = res.record(self.target.call("POST", "/v1/completions", data=data, timeout=self._timeout(deadline)),
                           f"guided_choice x{self.choices}", markers)
            times.append(r.seconds)
            statuses.append(str(r.status or r.error))
            sizes.append(r.size)
            if time.monotonic() + r.seconds >= deadline:
                break
        res.notes.append(f"guided_choice of {self.choices} ({len(data) / 2**20:.2f} MiB body) x{len(times)}: "
                         f"{' '.join(statuses)} in {min(times):.1f}-{max(times):.1f} s, "
                         f"answers of {max(sizes)} bytes at most")

    # -- 7: the smaller ones -------------------------------------------------------------------------

    def _small(self, res: AttackResult, deadline: float) -> None:
        t = self._timeout(deadline)
        text = "hello world " * 40_000
        r = res.record(self.target.call("POST", "/tokenize", {"model": self.model, "prompt": text}, timeout=t),
                       "/tokenize huge text")
        count = _json_field(r.body, "count")
        res.notes.append(f"/tokenize of {len(text)} chars: {r.status or r.error} in {r.seconds:.1f} s"
                         + (f", {count} tokens returned" if count is not None else ""))
        png = pixel_bomb_png()
        if png is None:
            res.notes.append("PNG 7070x7070: not sent (Pillow is not installed)")
        else:
            url = "data:image/png;base64," + base64.b64encode(png).decode()
            for count in (1, 4):
                content = [{"type": "text", "text": "What is this?"}] + [{"type": "image_url",
                                                                          "image_url": {"url": url}}] * count
                r = res.record(self.target.call("POST", "/v1/chat/completions",
                                                {"model": self.model, "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": content}]}, timeout=t),
                               f"PNG 7070x7070 x{count}")
                res.notes.append(f"PNG 7070x7070 ({len(png) // 1024} KB) x{count}: {r.status or r.error} in "
                                 f"{r.seconds:.1f} s" + (f": {_message_of(r.body)[:90]}" if r.status != 200 else ""))
        self._collide(res, deadline)
        raw = b"GET /hea\x00lth HTTP/1.1\r\nHost: x\r\n\r\n"
        sock = self.target.socket(timeout=10.0)
        try:
            sock.sendall(raw)
            start = time.monotonic()
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) < READ_CAP and time.monotonic() - start < 10:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    head += chunk
            except OSError:
                pass
        finally:
            _reset_close(sock)
        status = _status_of(head)
        res.sent += 1
        res.count(str(status) if status else "no answer")
        res.check_echo(head, "NUL in the request line", ("\x00",))
        res.notes.append(f"NUL in the request line: {status or 'no answer'}")
        # last, three at once: each may run to the context's end (how long depends on the sampling)
        left = max(self.seconds, deadline - time.monotonic())
        replies: list[Reply] = []

        def empty_input() -> None:
            replies.append(self.target.call("POST", "/v1/responses", {"model": self.model, "input": ""}, timeout=left))
        threads = [threading.Thread(target=empty_input, daemon=True) for _ in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(left + 5)
        for r in list(replies):
            res.record(r, "Responses input ''")
            tokens = _json_field(r.body, "usage", "output_tokens")
            res.notes.append("Responses {\"input\": \"\"}: " + (f"{r.status} in {r.seconds:.1f} s, {tokens} output tokens"
                                                               if r.status else f"no answer within {left:.0f} s (reset)"))

    def _collide(self, res: AttackResult, deadline: float) -> None:
        rid = f"hostile-{uuid.uuid4().hex[:12]}"
        first = {"model": self.model, "prompt": "Tell a long story.", "max_tokens": 200, "ignore_eos": True,
                 "stream": True, "request_id": rid}
        sock = self.target.socket(timeout=10.0)
        try:
            sock.sendall(self.target.request_bytes("POST", "/v1/completions", first))
            res.sent += 1
            head = b""
            start = time.monotonic()
            try:
                while b"data: " not in head and time.monotonic() - start < 10:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    head += chunk
            except OSError:
                pass
            res.count(str(_status_of(head) or "no answer"))
            r = res.record(self.target.call("POST", "/v1/completions",
                                            {"model": self.model, "prompt": "Hi", "max_tokens": 4, "request_id": rid},
                                            timeout=self._timeout(deadline)), "colliding request_id", (rid,))
            res.notes.append(f"request_id in use by another request: {r.status or r.error}"
                             + (" (names it in use)" if b"in use" in r.body else ""))
        finally:
            _reset_close(sock)


def pixel_bomb_png(side: int = 7070) -> bytes | None:
    """A side x side RGBA PNG of one colour (~194 KB at 7070), built in memory; None without Pillow."""
    try:
        from PIL import Image
    except ImportError:
        return None
    buf = io.BytesIO()
    Image.new("RGBA", (side, side), (200, 30, 30, 255)).save(buf, format="PNG", optimize=False, compress_level=9)
    return buf.getvalue()


def _message_of(body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body[:80].decode("utf-8", "replace")
    if isinstance(err, dict):
        return str(err.get("message", ""))
    return str(err or "")


def _json_field(body: bytes, *keys: str) -> Any:
    try:
        value = json.loads(body)
        for k in keys:
            value = value[k]
        return value
    except (ValueError, KeyError, TypeError):
        return None


def _loadavg() -> str | None:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


# ---- the report ------------------------------------------------------------------------------


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def format_report(report: dict) -> str:
    """The sweep's table, then each attack's own figures."""
    m = report["machine"]
    lines = [f"hostile sweep of {report['url']} ({report['model']}), {report['date']}, "
             f"{report['seconds_per_attack']:g} s per attack, {report['duration_s']:.0f} s in all",
             f"client machine: {m['host']}, {m['cpus']} CPUs, load {m['loadavg_before']} -> {m['loadavg_after']}; "
             f"watchdog from {report.get('probe_source') or 'the address of the attacks'}",
             ""]
    header = ("attack", "sent", "5xx", "statuses", "stalls > 2 s (s)", "health max ms", "compl. max ms",
              "probes !200", "echoes", "RSS MB before/peak/after", "KV blocks after", "settle s")
    rows = []
    for a in report["attacks"]:
        if a["skipped"]:
            rows.append((a["title"], "-", "-", f"skipped: {a['skipped']}", "", "", "", "", "", "", "", ""))
            continue
        stalls = a["stalls"]
        stall_text = (f"{len(stalls)}: " + " ".join(f"{s['seconds']:.1f}" for s in stalls[:6])
                      + (" ..." if len(stalls) > 6 else "")) if stalls else "0"
        ps = a["probes_summary"]
        failed = sum(sum(ps[k]["failed"].values()) for k in ps)
        sent = sum(ps[k]["sent"] for k in ps)
        kv = a["kv_blocks_after"] if a["kv_blocks_after"] is not None else (
            "-" if a["kv_usage_after"] is None else f"{a['kv_usage_after'] * 100:.1f}%")
        rows.append((a["title"], str(a["sent"]), str(a["num_5xx"]),
                     " ".join(f"{k}:{v}" for k, v in sorted(a["statuses"].items())),
                     stall_text, "-" if ps["health"]["max_ms"] is None else f"{ps['health']['max_ms']:.0f}",
                     "-" if ps["completion"]["max_ms"] is None else f"{ps['completion']['max_ms']:.0f}",
                     f"{failed}/{sent}", str(len(a["echoes"])),
                     f"{_mb(a['rss_before'])}/{_mb(a['rss_peak'])}/{_mb(a['rss_after'])}", str(kv),
                     f"{a['settle_seconds']:.1f}" + ("" if a["idle"] is not False else " (busy)")))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if i in (0, 3, 4) else c.rjust(w)     # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    lines += [fmt(header), fmt(tuple("-" * w for w in widths)), *map(fmt, rows), ""]
    for a in report["attacks"]:
        if a["skipped"]:
            continue
        lines.append(f"{a['title']}:")
        lines += [f"  {n}" for n in a["notes"]]
        ps = a["probes_summary"]
        for kind in ("health", "completion"):
            if ps[kind]["failed"]:
                lines.append(f"  {kind} probes without a 200: " + " ".join(f"{k}x{v}" for k, v in ps[kind]["failed"].items()))
        if a["echoes"]:
            shown = sorted(set(a["echoes"]))
            lines.append(f"  echoes ({len(a['echoes'])}): " + "; ".join(shown[:6]) + (" ..." if len(shown) > 6 else ""))
        if a["log_bytes"] is not None:
            lines.append(f"  server log: +{a['log_bytes']} bytes, {a['log_tracebacks']} tracebacks, "
                         f"{a['log_nul_bytes']} raw NUL bytes")
    s, e = report["start"], report["end"]
    kv = (f"{e['kv_blocks_used']} blocks" if e["kv_blocks_used"] is not None
          else "-" if e["kv_usage"] is None else f"usage {e['kv_usage'] * 100:.1f}%")
    growth = e["rss_growth_bytes"]
    lines += ["", f"at the end: KV held while idle {kv} (start: {s['kv_blocks_used']}); "
                  f"idle {e['idle']} after {e['settle_s']} s",
              f"server RSS: {_mb(s['rss_bytes'])} MB -> {_mb(e['rss_bytes'])} MB "
              f"(growth {'-' if growth is None else f'{growth / 2**20:+.0f}'} MB; {report['rss_source']})"]
    return "\n".join(lines)


# ---- command line -----------------------------------------------------------------------------


def parse_attacks(text: str) -> list[str]:
    """'all', or names / numbers separated by commas: 'template,5' -> ['template', 'schema']."""
    if text.strip() in ("", "all"):
        return list(ATTACKS)
    out = []
    for part in text.split(","):
        part = part.strip()
        name = ATTACKS[int(part) - 1] if part.isdigit() and 1 <= int(part) <= len(ATTACKS) else part
        if name not in ATTACKS:
            raise SystemExit(f"--attacks: unknown attack {part!r}; known: {', '.join(ATTACKS)} (or 1-7)")
        out.append(name)
    return list(dict.fromkeys(out))


def _triple(text: str) -> tuple[int, int, int]:
    try:
        p, n, m = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError("expected PROMPTSxNxMAX_TOKENS, e.g. 256x4x4000") from None
    return p, n, m


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    a("--api-key", default=None, help="bearer key (default: env LITE_LLM_API_KEY)")
    a("--model", default=None, help="model name (default: the first of GET /v1/models)")
    a("--seconds", type=float, default=20.0, help="length of each attack (default 20)")
    a("--attacks", default="all", help=f"which attacks, by name or number: {','.join(ATTACKS)} (default all)")
    a("--settle", type=float, default=30.0,
      help="after each attack, seconds to wait at most for the server to be idle (default 30)")
    a("--max-total", type=float, default=None,
      help="bound on the whole sweep in seconds (default: attacks x (seconds + settle + probe timeout + 10) + 60)")
    a("--pid", type=int, default=None, help="the server's process id, for its resident memory (/proc/PID/status)")
    a("--server-log", default=None, help="the server's log file: what each attack added to it")
    a("--monopoly", type=_triple, default=(256, 4, 4000), metavar="PxNxM",
      help="the monopolising request: prompts x n x max_tokens (default 256x4x4000)")
    a("--fin-clients", type=int, default=4, help="non-streamed requests closed with a FIN (default 4)")
    a("--fin-max-tokens", type=int, default=2000, help="max_tokens of each (default 2000)")
    a("--connections", type=int, default=520, help="concurrent long requests from this address (default 520)")
    a("--connection-max-tokens", type=int, default=4000, help="max_tokens of each (default 4000)")
    a("--loop-iterations", type=int, default=20_000_000, help="iterations of the template loop bomb (default 2e7)")
    a("--choices", type=int, default=100_000, help="entries of the guided_choice (default 100000)")
    a("--probe-source", default="auto", metavar="ADDR",
      help="local address of the watchdog's connections and the scrapes, so that the server sees them as "
           "another client than the attacks (default auto: 127.0.0.2 against a server on 127.0.0.1; none: "
           "the attacks' address)")
    a("--probe-timeout", type=float, default=20.0, help="seconds before a watchdog probe gives up (default 20)")
    a("--json", default=None, metavar="FILE", help="also write every figure to FILE as JSON")


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0 or args.settle < 0:
        raise SystemExit("--seconds must be > 0 and --settle >= 0")
    attacks = parse_attacks(args.attacks)
    target = Target(args.url, args.api_key or env("API_KEY"))
    source = {"auto": default_probe_source(target), "none": None}.get(args.probe_source, args.probe_source)
    model = args.model
    if model is None:
        reply = target.call("GET", "/v1/models", timeout=10.0)
        try:
            model = json.loads(reply.body)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            print(f"bench hostile: cannot list the models of {args.url}: {reply.status or reply.error}",
                  file=sys.stderr)
            return 1
    sweep = Sweep(target, model, seconds=args.seconds, settle=args.settle, pid=args.pid,
                  server_log=args.server_log, probe_timeout=args.probe_timeout, monopoly=args.monopoly,
                  fin_clients=args.fin_clients, fin_max_tokens=args.fin_max_tokens,
                  connections=args.connections, connection_max_tokens=args.connection_max_tokens,
                  loop_iterations=args.loop_iterations, choices=args.choices, probe_source=source,
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    report = sweep.run(attacks, max_total=args.max_total)
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0
