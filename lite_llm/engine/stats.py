"""Engine statistics: a frozen EngineStats snapshot and the accumulators behind it.

The engine thread updates counters and latency histograms as requests progress and
publishes an EngineStats value; readers (the Prometheus exporter in server/metrics.py,
benchmarks, logs) only ever see immutable snapshots. Histograms are cumulative like
Prometheus' (never drained), so any number of readers can scrape them. Bucket bounds follow
vLLM's metrics of the same names.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
NUM_RECENT_REQUESTS = 256      # finished-request records kept for logs and benchmarks


@dataclass(frozen=True)
class Histogram:
    """Prometheus-style: counts[i] observations <= bounds[i] (cumulative); +Inf is `count`."""
    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int


class HistogramAccumulator:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self._bucket_counts = [0] * (len(bounds) + 1)   # per bucket, last = above every bound
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._bucket_counts[bisect.bisect_left(self.bounds, value)] += 1
        self._sum += value

    def snapshot(self) -> Histogram:
        cumulative, total = [], 0
        for c in self._bucket_counts[:-1]:
            total += c
            cumulative.append(total)
        return Histogram(self.bounds, tuple(cumulative), self._sum, sum(self._bucket_counts))


@dataclass(frozen=True)
class FinishedRequestRecord:
    """One finished engine request (one completion of a user request with n > 1)."""
    request_id: str
    finish_reason: str
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    queue_time: float | None      # arrival -> first scheduled, seconds
    ttft: float | None            # arrival -> first token
    tpot: float | None            # mean time per output token after the first
    e2e: float                    # arrival -> finished


@dataclass(frozen=True)
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    num_preempted_total: int = 0
    kv_cache_usage: float = 0.0                  # 0..1
    prefix_cache_queries: int = 0                # tokens looked up
    prefix_cache_hits: int = 0                   # tokens found
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    request_success_total: dict[str, int] = field(default_factory=dict)  # finish reason -> count
    num_steps_total: int = 0
    ttft: Histogram = field(default_factory=lambda: HistogramAccumulator(TTFT_BUCKETS).snapshot())
    tpot: Histogram = field(default_factory=lambda: HistogramAccumulator(TPOT_BUCKETS).snapshot())
    e2e: Histogram = field(default_factory=lambda: HistogramAccumulator(LATENCY_BUCKETS).snapshot())
    queue_time: Histogram = field(
        default_factory=lambda: HistogramAccumulator(LATENCY_BUCKETS).snapshot())
    recent_requests: tuple[FinishedRequestRecord, ...] = ()   # newest last

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


class StatsCollector:
    """Mutable counters owned by the engine thread; snapshot() makes an EngineStats."""

    def __init__(self):
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_steps_total = 0
        self.request_success_total: dict[str, int] = {}
        self.ttft = HistogramAccumulator(TTFT_BUCKETS)
        self.tpot = HistogramAccumulator(TPOT_BUCKETS)
        self.e2e = HistogramAccumulator(LATENCY_BUCKETS)
        self.queue_time = HistogramAccumulator(LATENCY_BUCKETS)
        self.recent: deque[FinishedRequestRecord] = deque(maxlen=NUM_RECENT_REQUESTS)
        self._finished_part: dict | None = None   # what only record_finished changes, as snapshotted

    def record_finished(self, record: FinishedRequestRecord) -> None:
        self._finished_part = None
        reason = record.finish_reason
        self.request_success_total[reason] = self.request_success_total.get(reason, 0) + 1
        if record.queue_time is not None:
            self.queue_time.observe(record.queue_time)
        if record.ttft is not None:
            self.ttft.observe(record.ttft)
        if record.tpot is not None:
            self.tpot.observe(record.tpot)
        self.e2e.observe(record.e2e)
        self.recent.append(record)

    def snapshot(self, *, num_running: int, num_waiting: int, num_preempted_total: int,
                 kv_cache_usage: float, prefix_cache_queries: int,
                 prefix_cache_hits: int) -> EngineStats:
        if self._finished_part is None:   # the engine snapshots every step; requests finish rarely
            self._finished_part = dict(
                request_success_total=dict(self.request_success_total),
                ttft=self.ttft.snapshot(), tpot=self.tpot.snapshot(), e2e=self.e2e.snapshot(),
                queue_time=self.queue_time.snapshot(), recent_requests=tuple(self.recent))
        return EngineStats(
            num_running=num_running, num_waiting=num_waiting,
            num_preempted_total=num_preempted_total, kv_cache_usage=kv_cache_usage,
            prefix_cache_queries=prefix_cache_queries, prefix_cache_hits=prefix_cache_hits,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            num_steps_total=self.num_steps_total, **self._finished_part)
