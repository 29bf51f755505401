"""Live engine figures over the latest sample window: token rates, per-thread busy, bandwidth.

Cumulative counters (engine/stats.py) say how much was done; a dashboard and a person reading
/metrics by hand want "how much per second, right now" and "is every planned core working".
LiveMeter turns counters into those, once per window, and every reader of the same window
(the /v1/engine/stats JSON the dashboard polls, /metrics' named gauges) gets the SAME
LiveStats object, so the two can never disagree.

Per-core busy comes from the engine's own threads' counters, /proc/self/task/<tid>/stat
(utime + stime, in clock ticks), never from /proc/stat, which also counts every other process
on the CPU. The thread ids are those of the engine thread's OpenMP pool (thread 0 is the
engine thread itself), read once on the engine thread right after binding
(attach_engine_threads); thread i was pinned to the plan's i-th CPU (lite_llm/cpu.py).

What does not live here: the counters themselves (engine/stats.py), rendering (server/).
Only this process's threads are read: tensor-parallel worker ranks (other processes) are not
shown; data-parallel replicas each sample their own and send LiveStats with their stats.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from lite_llm import cpu

SAMPLE_SECONDS = 0.9     # readers within this share one sample: the dashboard polls every second
TASK_DIR = "/proc/self/task"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100   # utime/stime unit
log = logging.getLogger(__name__)

BANDWIDTH_SECONDS = 0.2  # start-up read-bandwidth test of a server (the roofline's denominator)
BANDWIDTH_BYTES = 256 << 20      # source array of the read test: well past any cache


@dataclass(frozen=True)
class ThreadLoad:
    """One engine thread over the latest window."""
    thread: int                    # OpenMP thread number (0: the engine thread)
    tid: int                       # kernel thread id: /proc/self/task/<tid>
    cpu: int | None                # planned CPU (None: not bound, nobind)
    last_cpu: int | None           # CPU it last ran on (field 39 of its stat); None once gone
    cpu_seconds: float | None      # utime + stime since the thread started; None once gone
    busy: float | None             # share of one CPU it ran in the window, 0..1; None: no window yet
    engine: int = 0                # data-parallel replica index


@dataclass(frozen=True)
class LiveStats:
    time: float                    # wall clock (Unix seconds) at the end of the window
    window_seconds: float          # 0.0 for the first sample (no rates yet)
    prompt_tokens_per_second: float | None
    generation_tokens_per_second: float | None
    threads: tuple[ThreadLoad, ...] = ()
    measured_bandwidth: float | None = None     # bytes/s the engine's threads read at start-up


def read_thread_stat(task_dir: str, tid: int) -> tuple[float, int] | None:
    """(utime + stime in seconds, CPU last run on) of one thread; None if it no longer exists.
    The command name (field 2) may hold spaces and parentheses: fields are counted after the
    last ')'."""
    try:
        with open(f"{task_dir}/{tid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    rest = text[text.rfind(")") + 2:].split()    # rest[0] is field 3 (state)
    utime, stime, processor = int(rest[11]), int(rest[12]), int(rest[36])   # fields 14, 15, 39
    return (utime + stime) / CLOCK_TICKS, processor


class LiveMeter:
    """Samples counters and thread CPU times at most once per `interval`; thread-safe.

    busy = (cpu_seconds now - at the previous sample) / window: a thread that computed through
    the whole window is 1.0, one asleep is 0.0. Resolution is one clock tick (10 ms) per
    window; a window is the time since the previous sample, so it is longer when nobody asked
    meanwhile (the first read after an hour averages over the hour)."""

    def __init__(self, interval: float = SAMPLE_SECONDS, task_dir: str = TASK_DIR,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.interval = interval
        self.task_dir = task_dir
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()
        self._threads: tuple[tuple[int, int, int | None], ...] = ()   # (thread, tid, planned cpu)
        self.measured_bandwidth: float | None = None
        self._prev: tuple[float, int, int, list] | None = None    # (t, prompt, gen, per-thread stat)
        self._last: LiveStats | None = None
        self._last_t = 0.0

    def attach(self, tids: list[int], cpus: tuple[int, ...] | list[int] = (),
               measured_bandwidth: float | None = None) -> None:
        """The engine's thread ids (thread i pinned to cpus[i]; cpus empty: not bound); starts
        the first window now."""
        with self._lock:
            self._threads = tuple((i, tid, cpus[i] if i < len(cpus) else None)
                                  for i, tid in enumerate(tids) if tid > 0)
            self.measured_bandwidth = measured_bandwidth
            self._prev = (self._clock(), 0, 0, [read_thread_stat(self.task_dir, t[1]) for t in self._threads])
            self._last = None

    def sample(self, prompt_tokens_total: int, generation_tokens_total: int) -> LiveStats:
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last_t < self.interval:
                return self._last
            stats = [read_thread_stat(self.task_dir, t[1]) for t in self._threads]
            prev = self._prev
            window = now - prev[0] if prev is not None else 0.0
            loads = []
            for k, (thread, tid, cpu) in enumerate(self._threads):
                cur = stats[k]
                before = prev[3][k] if prev is not None else None
                busy = None
                if cur is not None and before is not None and window > 0:
                    # a tick counted at the window's edge can push a saturated thread past 1.0
                    busy = min(1.0, max(0.0, (cur[0] - before[0]) / window))
                loads.append(ThreadLoad(thread, tid, cpu, None if cur is None else cur[1],
                                        None if cur is None else cur[0], busy))
            rates = (None, None)
            if prev is not None and window > 0:
                rates = ((prompt_tokens_total - prev[1]) / window,
                         (generation_tokens_total - prev[2]) / window)
            self._last = LiveStats(self._wall(), window, rates[0], rates[1], tuple(loads),
                                   self.measured_bandwidth)
            self._last_t = now
            self._prev = (now, prompt_tokens_total, generation_tokens_total, stats)
            return self._last


def attach_engine_threads(meter: LiveMeter, num_threads: int, planned: tuple[int, ...],
                          measure_bandwidth: bool) -> None:
    """On the engine thread, right after binding: the pool's thread ids (gettid of each OpenMP
    thread, the same pool every later kernel call reuses) and, for a server, the read bandwidth
    those threads reach (the decode roofline's denominator; ~0.3 s, 256 MB read)."""
    tids = cpu.cpu_probe().thread_ids(num_threads)
    bandwidth = None
    if measure_bandwidth:
        bandwidth = read_bandwidth(num_threads, seconds=BANDWIDTH_SECONDS, max_threads=num_threads) * 1e9
        log.info("memory read bandwidth %.1f GB/s on the engine's %d threads (the decode roofline)",
                 bandwidth / 1e9, num_threads)
    meter.attach(tids, planned, bandwidth)


def merge_live(parts: list[LiveStats | None]) -> LiveStats | None:
    """Replicas' samples as one: rates summed, threads listed per replica, bandwidth summed
    (each replica measured its own cores' share)."""
    live = [(i, p) for i, p in enumerate(parts) if p is not None]
    if not live:
        return None

    def total(name: str) -> float | None:
        vals = [getattr(p, name) for _, p in live]
        return None if any(v is None for v in vals) else sum(vals)

    return LiveStats(max(p.time for _, p in live), max(p.window_seconds for _, p in live),
                     total("prompt_tokens_per_second"), total("generation_tokens_per_second"),
                     tuple(replace(t, engine=i) for i, p in live for t in p.threads),
                     total("measured_bandwidth"))


def read_bandwidth(num_threads: int = 1, nbytes: int = BANDWIDTH_BYTES,
                   seconds: float = 0.3, max_threads: int = 64) -> float:
    """Read bandwidth in GB/s (1e9 B/s): num_threads OpenMP threads each read a contiguous slice
    of an nbytes array once, as a decode step streams its weights; the best of repeated reads
    over about `seconds`. (A copy also writes, and counting both streams overstates what a
    read-only stream gets: 64 GB/s copying vs 45 GB/s reading on one 2-core VM here.)"""
    # imported here, not at the top: _cpu loads libgomp, which reads its environment once, as it
    # loads (cpu.configure_openmp_env sets it first); numpy (~6 MiB resident) stays out of the
    # processes that never measure
    import numpy as np

    from lite_llm._kernels import _cpu
    words = np.ones(nbytes // 8, dtype=np.uint64)   # written once: every page is resident
    num_threads = max(1, min(num_threads, max_threads))
    best = math.inf
    deadline = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        _cpu.stream_read(words, num_threads)
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() >= deadline:
            break
    return words.nbytes / best / 1e9

