"""Engine statistics: a frozen EngineStats snapshot and the accumulators behind it.

The engine thread updates counters and latency histograms as requests progress and
publishes an EngineStats value; readers (the Prometheus exporter in server/metrics.py,
benchmarks, logs) only ever see immutable snapshots. This is the one home of every engine
figure /metrics shows: request latencies (TTFT, ITL, TPOT, queue, end to end) and per-step
costs (Python time vs kernel time, bytes read). Histograms are cumulative like
Prometheus' (never drained), so any number of readers can scrape them. Bucket bounds follow
vLLM's metrics of the same names.
"""
from __future__ import annotations

import bisect
from array import array
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from lite_llm.engine.live import LiveStats, merge_live

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# Per engine step: seconds of Python (scheduler, step arrays, outputs, text) and of kernels
STEP_BUCKETS = (1e-5, 2.5e-5, 5e-5, 7.5e-5, 1e-4, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 2.5e-3, 5e-3,
                7.5e-3, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
NUM_RECENT_REQUESTS = 256      # finished-request records kept for logs and benchmarks
NUM_RECENT_STEPS = 4096        # StepRecords kept for `bench --profile-step` and the bandwidth gauge
STEP_SNAPSHOT_SECONDS = 0.25   # how stale per-step figures in a non-fresh snapshot may be


@dataclass(frozen=True)
class Histogram:
    """Prometheus-style: counts[i] observations <= bounds[i] (cumulative); +Inf is `count`."""
    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int


class HistogramAccumulator:
    """Counts per bucket of bounds (the last: above every bound) and the sum of the values. The
    bounds, counts and sum are kept in flat arrays as well (lows, counts, total), which the
    engine's compiled step (_step.pyx) updates without a Python object per bucket: a steady
    step observes after forward() has evicted every cache line, and each object read then is a
    miss."""
    __slots__ = ("bounds", "lows", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.lows = array("d", bounds)
        self.counts = array("q", bytes(8 * (len(bounds) + 1)))
        self.total = array("d", [0.0])

    def observe(self, value: float, count: int = 1) -> None:
        """count observations of value (a decode step's inter-token latency is the same for
        every sequence that also had a token in the step before)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.total[0] += value * count

    def snapshot(self) -> Histogram:
        cumulative, total = [], 0
        for c in self.counts[:-1]:
            total += c
            cumulative.append(total)
        return Histogram(self.bounds, tuple(cumulative), self.total[0], sum(self.counts))


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


class StepRecord(NamedTuple):
    """One engine step: how big it was and where its time went (seconds)."""
    num_seqs: int
    num_tokens: int
    python_seconds: float      # wall time of step() minus kernel_seconds
    kernel_seconds: float      # the compiled forward pass and sampler
    bytes_read: int            # weights streamed + KV read by attention


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
    itl: Histogram = field(default_factory=lambda: HistogramAccumulator(TPOT_BUCKETS).snapshot())
    step_python: Histogram = field(default_factory=lambda: HistogramAccumulator(STEP_BUCKETS).snapshot())
    step_kernel: Histogram = field(default_factory=lambda: HistogramAccumulator(STEP_BUCKETS).snapshot())
    step_bytes_read_total: int = 0
    recent_requests: tuple[FinishedRequestRecord, ...] = ()   # newest last
    recent_steps: tuple[StepRecord, ...] = ()                 # newest last
    # speculative decoding: verified draft runs, drafted tokens, accepted ones (and per position)
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()
    # rates and per-thread busy over the latest window (engine/live.py), added by AsyncEngine.stats()
    live: LiveStats | None = None

    @property
    def spec_decode_acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens; None before any draft."""
        if not self.spec_decode_num_draft_tokens:
            return None
        return self.spec_decode_num_accepted_tokens / self.spec_decode_num_draft_tokens

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def achieved_bandwidth(self) -> float | None:
        """Bytes read per second of kernel time over the recent decode steps (one token per
        sequence: memory-bound, so this is the figure to hold against the machine's bandwidth);
        None before any."""
        decode = [s for s in self.recent_steps if s.num_tokens == s.num_seqs]
        kernel = sum(s.kernel_seconds for s in decode)
        return sum(s.bytes_read for s in decode) / kernel if kernel > 0 else None

    @property
    def roofline_ratio(self) -> float | None:
        """achieved_bandwidth / the read bandwidth the engine's threads measured at start-up:
        how close recent decode steps ran to the memory-bandwidth limit; None without both."""
        achieved = self.achieved_bandwidth
        measured = self.live.measured_bandwidth if self.live is not None else None
        return achieved / measured if achieved is not None and measured else None


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
        self.itl = HistogramAccumulator(TPOT_BUCKETS)
        self.step_python = HistogramAccumulator(STEP_BUCKETS)
        self.step_kernel = HistogramAccumulator(STEP_BUCKETS)
        self.step_bytes_read_total = 0
        self.recent: deque[FinishedRequestRecord] = deque(maxlen=NUM_RECENT_REQUESTS)
        self.recent_steps: deque[StepRecord] = deque(maxlen=NUM_RECENT_STEPS)
        self._finished_part: dict | None = None   # what only record_finished changes, as snapshotted
        self._step_part: dict | None = None       # the per-step histograms, as snapshotted
        self._step_part_time = 0.0
        self.spec_num_drafts = 0
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.spec_accepted_per_pos: list[int] = []

    def record_drafts(self, num_drafted: int, num_accepted: int) -> None:
        """One sequence's verified drafts: num_accepted of num_drafted, a prefix of them."""
        self.spec_num_drafts += 1
        self.spec_num_draft_tokens += num_drafted
        self.spec_num_accepted_tokens += num_accepted
        per_pos = self.spec_accepted_per_pos
        if len(per_pos) < num_drafted:
            per_pos.extend([0] * (num_drafted - len(per_pos)))
        for pos in range(num_accepted):
            per_pos[pos] += 1

    def add_itl(self, itl: dict[float, int], now: float) -> None:
        """Plain samples' inter-token latencies, counted per previous token time ({time:
        samples}; the reference of _step.add_itl)."""
        for last, count in itl.items():
            self.itl.observe(now - last, count)
            self.generation_tokens_total += count

    def record_step(self, record: StepRecord) -> None:
        self.num_steps_total += 1
        self.step_python.observe(record.python_seconds)
        self.step_kernel.observe(record.kernel_seconds)
        self.step_bytes_read_total += record.bytes_read
        self.recent_steps.append(record)

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
                 prefix_cache_hits: int, fresh: bool = True) -> EngineStats:
        """fresh=False may reuse per-step figures up to STEP_SNAPSHOT_SECONDS old: the async
        engine snapshots after every step, and copying 4096 step records each time would cost
        more than the step's own Python."""
        if self._finished_part is None:   # the engine snapshots every step; requests finish rarely
            self._finished_part = dict(
                request_success_total=dict(self.request_success_total),
                ttft=self.ttft.snapshot(), tpot=self.tpot.snapshot(), e2e=self.e2e.snapshot(),
                queue_time=self.queue_time.snapshot(), recent_requests=tuple(self.recent))
        now = time.monotonic()
        if fresh or self._step_part is None or now - self._step_part_time > STEP_SNAPSHOT_SECONDS:
            self._step_part = dict(
                itl=self.itl.snapshot(), step_python=self.step_python.snapshot(),
                step_kernel=self.step_kernel.snapshot(), step_bytes_read_total=self.step_bytes_read_total,
                recent_steps=tuple(self.recent_steps))
            self._step_part_time = now
        return EngineStats(
            num_running=num_running, num_waiting=num_waiting,
            num_preempted_total=num_preempted_total, kv_cache_usage=kv_cache_usage,
            prefix_cache_queries=prefix_cache_queries, prefix_cache_hits=prefix_cache_hits,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            num_steps_total=self.num_steps_total, spec_decode_num_drafts=self.spec_num_drafts,
            spec_decode_num_draft_tokens=self.spec_num_draft_tokens,
            spec_decode_num_accepted_tokens=self.spec_num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=tuple(self.spec_accepted_per_pos),
            **self._finished_part, **self._step_part)


def merge_stats(parts: list[EngineStats]) -> EngineStats:
    """Several engines' snapshots as one (data-parallel replicas): gauges and counters summed,
    KV usage averaged, histograms added bucket by bucket, recent records concatenated."""
    if not parts:
        return EngineStats()

    def hist(name: str) -> Histogram:
        hs = [getattr(p, name) for p in parts]
        return Histogram(hs[0].bounds, tuple(map(sum, zip(*(h.counts for h in hs)))),
                         sum(h.sum for h in hs), sum(h.count for h in hs))

    success: dict[str, int] = {}
    for p in parts:
        for reason, count in p.request_success_total.items():
            success[reason] = success.get(reason, 0) + count
    total = lambda name: sum(getattr(p, name) for p in parts)   # noqa: E731
    return EngineStats(
        num_running=total("num_running"), num_waiting=total("num_waiting"),
        num_preempted_total=total("num_preempted_total"),
        kv_cache_usage=total("kv_cache_usage") / len(parts),
        prefix_cache_queries=total("prefix_cache_queries"), prefix_cache_hits=total("prefix_cache_hits"),
        prompt_tokens_total=total("prompt_tokens_total"),
        generation_tokens_total=total("generation_tokens_total"),
        request_success_total=success, num_steps_total=total("num_steps_total"),
        spec_decode_num_drafts=total("spec_decode_num_drafts"),
        spec_decode_num_draft_tokens=total("spec_decode_num_draft_tokens"),
        spec_decode_num_accepted_tokens=total("spec_decode_num_accepted_tokens"),
        spec_decode_num_accepted_tokens_per_pos=tuple(
            map(sum, itertools.zip_longest(*(p.spec_decode_num_accepted_tokens_per_pos for p in parts), fillvalue=0))),
        step_bytes_read_total=total("step_bytes_read_total"),
        recent_requests=tuple(r for p in parts for r in p.recent_requests),
        recent_steps=tuple(s for p in parts for s in p.recent_steps),
        live=merge_live([p.live for p in parts]),
        **{name: hist(name) for name in ("ttft", "tpot", "e2e", "queue_time", "itl",
                                         "step_python", "step_kernel")})
