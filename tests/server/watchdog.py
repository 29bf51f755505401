"""A watchdog for attack tests: while an attack runs, another client probes the server.

Every `interval` seconds it asks `/health` and, on a separate thread, a 4-token completion, each
on a connection of its own (as a monitoring probe or an unrelated client would), and records
every probe's status and latency. Tests assert that every probe was answered (status 200) and
that none stalled beyond a liveness bound; the latencies themselves are figures to report
(`summary()`), not speed assertions.

    with Watchdog(served.port, served.model) as dog:
        ... the attack ...
    dog.check()                    # every probe answered, none stalled
    print(dog.summary())
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field

STALL_SECONDS = 10.0     # a probe slower than this is a stall: the server let one client block the rest


@dataclass
class Probe:
    kind: str              # "health" or "completion"
    status: int            # HTTP status, or 0 when the probe failed at the transport level
    seconds: float
    error: str = ""


@dataclass
class Watchdog:
    port: int
    model: str
    interval: float = 0.5
    completion: bool = True
    max_tokens: int = 4
    timeout: float = 60.0
    source: str | None = None   # local address to probe from, e.g. "127.0.0.2": another client than the attack
    probes: list[Probe] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # -- probes ---------------------------------------------------------------------------------

    def _one(self, kind: str, method: str, path: str, body: dict | None) -> None:
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout,
                                          source_address=(self.source, 0) if self.source else None)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            probe = Probe(kind, resp.status, time.monotonic() - start)
        except (OSError, http.client.HTTPException) as e:
            probe = Probe(kind, 0, time.monotonic() - start, f"{type(e).__name__}: {e}")
        finally:
            conn.close()
        with self._lock:
            self.probes.append(probe)

    def _loop(self, kind: str, method: str, path: str, body: dict | None) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self._one(kind, method, path, body)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def __enter__(self) -> "Watchdog":
        self._threads = [threading.Thread(target=self._loop, args=("health", "GET", "/health", None),
                                          name="watchdog-health", daemon=True)]
        if self.completion:
            body = {"model": self.model, "prompt": "Hello", "max_tokens": self.max_tokens, "temperature": 0}
            self._threads.append(threading.Thread(target=self._loop,
                                                  args=("completion", "POST", "/v1/completions", body),
                                                  name="watchdog-completion", daemon=True))
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)

    # -- results --------------------------------------------------------------------------------

    def of(self, kind: str) -> list[Probe]:
        with self._lock:
            return [p for p in self.probes if p.kind == kind]

    def max_seconds(self, kind: str) -> float:
        return max((p.seconds for p in self.of(kind)), default=0.0)

    def summary(self) -> str:
        parts = []
        for kind in ("health", "completion"):
            probes = self.of(kind)
            if probes:
                ok = sum(p.status == 200 for p in probes)
                parts.append(f"{kind}: {ok}/{len(probes)} ok, max {self.max_seconds(kind) * 1000:.0f} ms")
        return "; ".join(parts)

    def check(self, min_probes: int = 1, stall_seconds: float = STALL_SECONDS) -> None:
        """Every probe answered 200 within the stall bound, and each kind probed at least min_probes times."""
        kinds = ("health", "completion") if self.completion else ("health",)
        for kind in kinds:
            probes = self.of(kind)
            assert len(probes) >= min_probes, f"{kind}: {len(probes)} probes, expected >= {min_probes}"
            bad = [p for p in probes if p.status != 200]
            assert not bad, f"{kind} probes failed: {bad[:3]} ({self.summary()})"
            slow = [p for p in probes if p.seconds > stall_seconds]
            assert not slow, f"{kind} probes stalled > {stall_seconds} s: {slow[:3]} ({self.summary()})"
