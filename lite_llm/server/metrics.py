"""Prometheus text exposition for GET /metrics: vLLM's metric names under a `lite_llm:` prefix.

Request-level figures (tokens, finish reasons, latency histograms) are observed here by the
HTTP threads as each request's deltas arrive; engine-level gauges (running, waiting, KV
usage, prefix cache) are read from `engine.stats()` at scrape time. No prometheus_client at
run time: the text format is small enough to write by hand.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from typing import Any

from lite_llm.engine.stats import LATENCY_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS

PREFIX = "lite_llm:"

# Buckets as vLLM uses them (seconds), so dashboards built for vLLM read ours unchanged; the
# engine's histograms are kept on the same bounds.
ITL_BUCKETS, REQUEST_BUCKETS = TPOT_BUCKETS, LATENCY_BUCKETS


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    esc = (lambda v: str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"'))
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v)) if isinstance(v, float) else str(v)


class Histogram:
    """Cumulative buckets, sum and count; observe() is thread-safe."""

    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help, buckets
        self._counts = [0] * (len(buckets) + 1)       # last: above the largest bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sum += value

    def snapshot(self) -> tuple[tuple[float, ...], list[int], float, int]:
        """(bounds, cumulative counts per bound, sum, count), the shape engine stats use too."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for c in counts[:-1]:
            running += c
            cumulative.append(running)
        return self.buckets, cumulative, total, sum(counts)


def render_histogram(name: str, help: str, bounds: tuple[float, ...], cumulative: list[int],
                     total: float, count: int, labels: dict[str, str]) -> list[str]:
    name = PREFIX + name
    lines = [f"# HELP {name} {help}", f"# TYPE {name} histogram"]
    for bound, c in zip(bounds, cumulative):
        lines.append(f"{name}_bucket{_labels({**labels, 'le': _num(float(bound))})} {c}")
    lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {count}")
    lines.append(f"{name}_sum{_labels(labels)} {_num(float(total))}")
    lines.append(f"{name}_count{_labels(labels)} {count}")
    return lines


class RequestTimer:
    """Times one engine request from submission to its last delta (HTTP thread only)."""

    def __init__(self, metrics: "ServerMetrics", num_prompt_tokens: int):
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.arrival = time.perf_counter()
        self.last_token: float | None = None
        self.first_token: float | None = None
        self.num_tokens = 0

    def on_delta(self, num_new_tokens: int) -> None:
        if num_new_tokens <= 0:
            return
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
            self.metrics.ttft.observe(now - self.arrival)
        else:
            gap = now - self.last_token
            self.metrics.itl.observe(gap)
            self.metrics.note_step(gap / num_new_tokens)
        self.last_token = now
        self.num_tokens += num_new_tokens

    def on_finish(self, finish_reasons: list[str | None], engine_metrics: Any = None) -> None:
        now = time.perf_counter()
        m = self.metrics
        m.e2e.observe(now - self.arrival)
        if self.first_token is not None and self.num_tokens > 1:
            m.tpot.observe((now - self.first_token) / (self.num_tokens - 1))
        queued = _queue_time(engine_metrics)
        if queued is not None:
            m.queue.observe(queued)
        m.count_request(self.num_prompt_tokens, self.num_tokens, finish_reasons)


def _queue_time(engine_metrics: Any) -> float | None:
    arrival = getattr(engine_metrics, "arrival_time", None)
    scheduled = getattr(engine_metrics, "first_scheduled_time", None)
    if arrival is None or scheduled is None:
        return None
    return max(0.0, scheduled - arrival)


class ServerMetrics:
    """Every figure GET /metrics reports that the server itself observes."""

    def __init__(self, model_name: str, kernel_info: dict | None = None):
        self.model_name = model_name
        self.kernel_info = dict(kernel_info or {})
        self.ttft = Histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = Histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.tpot = Histogram("request_time_per_output_token_seconds",
                              "Histogram of time per output token in seconds.", ITL_BUCKETS)
        self.e2e = Histogram("e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.", REQUEST_BUCKETS)
        self.queue = Histogram("request_queue_time_seconds",
                               "Histogram of time spent waiting in the queue in seconds.", REQUEST_BUCKETS)
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self._steps: deque[float] = deque(maxlen=256)    # recent seconds per decoded token

    def timer(self, num_prompt_tokens: int) -> RequestTimer:
        return RequestTimer(self, num_prompt_tokens)

    def note_step(self, seconds_per_token: float) -> None:
        with self._lock:
            self._steps.append(seconds_per_token)

    def count_request(self, prompt_tokens: int, generation_tokens: int,
                      finish_reasons: list[str | None]) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens
            for reason in finish_reasons:
                key = reason or "abort"
                self.success[key] = self.success.get(key, 0) + 1

    def decode_bandwidth(self, stats: Any) -> float | None:
        """Bytes of weights streamed per second of decode: weight bytes / median step time."""
        direct = getattr(stats, "decode_bandwidth_bytes_per_second", None)
        if direct is not None:
            return float(direct)
        weight_bytes = self.kernel_info.get("weight_bytes")
        with self._lock:
            steps = sorted(self._steps)
        if not weight_bytes or not steps:
            return None
        median = steps[len(steps) // 2]
        return weight_bytes / median if median > 0 else None

    def render(self, stats: Any) -> str:
        labels = {"model_name": self.model_name}
        lines: list[str] = []

        def metric(name: str, kind: str, help: str, value: float | None,
                   extra: dict[str, str] | None = None) -> None:
            if value is None:
                return
            full = PREFIX + name
            family = full[:-len("_total")] if kind == "counter" and full.endswith("_total") else full
            lines.append(f"# HELP {family} {help}")
            lines.append(f"# TYPE {family} {kind}")
            sample = family + "_total" if kind == "counter" else family
            lines.append(f"{sample}{_labels({**labels, **(extra or {})})} {_num(value)}")

        get = (lambda name, default=None: getattr(stats, name, default) if stats is not None else default)
        metric("num_requests_running", "gauge", "Number of requests in model execution batches.",
               get("num_running", 0))
        metric("num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               get("num_waiting", 0))
        kv = get("kv_cache_usage")
        metric("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               float(kv) if kv is not None else 0.0)
        metric("num_preemptions_total", "counter", "Cumulative number of preemptions.",
               get("num_preempted_total", 0))
        metric("prefix_cache_queries_total", "counter",
               "Prefix cache queries, in terms of number of queried tokens.", get("prefix_cache_queries", 0))
        metric("prefix_cache_hits_total", "counter",
               "Prefix cache hits, in terms of number of cached tokens.", get("prefix_cache_hits", 0))
        # Engine figures when the engine keeps them (EngineStats), else what the server saw.
        with self._lock:
            prompt, gen, success = self.prompt_tokens, self.generation_tokens, dict(self.success)
        prompt = get("prompt_tokens_total", prompt)
        gen = get("generation_tokens_total", gen)
        success = {"stop": 0, "length": 0, "abort": 0, **(get("request_success_total") or success)}
        metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.", prompt)
        metric("generation_tokens_total", "counter", "Number of generation tokens processed.", gen)
        name = PREFIX + "request_success"
        lines += [f"# HELP {name} Count of successfully processed requests.", f"# TYPE {name} counter"]
        for reason, count in sorted(success.items()):
            lines.append(f"{name}_total{_labels({**labels, 'finished_reason': reason})} {count}")
        for h, attr in ((self.ttft, "ttft"), (self.itl, None), (self.tpot, "tpot"), (self.e2e, "e2e"),
                        (self.queue, "queue_time")):
            snap = get(attr) if attr else None
            if snap is not None and hasattr(snap, "bounds"):
                parts = (tuple(snap.bounds), list(snap.counts), snap.sum, snap.count)
            else:
                parts = h.snapshot()
            lines += render_histogram(h.name, h.help, *parts, labels)
        # CPU facts nobody else exports
        info = {k: str(v) for k, v in self.kernel_info.items()
                if k in ("kernel_variant", "num_threads", "isa", "cpu")}
        metric("kernel_info", "gauge", "Kernel build and thread plan of this server (value is 1).", 1,
               info)
        threads = self.kernel_info.get("num_threads")
        metric("num_threads", "gauge", "OpenMP threads the forward pass runs on.",
               int(threads) if threads is not None else None)
        metric("decode_memory_bandwidth_bytes_per_second", "gauge",
               "Achieved decode weight-streaming bandwidth (weight bytes / step time).",
               self.decode_bandwidth(stats))
        return "\n".join(lines) + "\n"
