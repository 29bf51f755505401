"""engine/live.py: per-thread busy from /proc/<...>/task/<tid>/stat, token rates over one shared
window, and /metrics and /v1/engine/stats rendering that same window (server side only; the
browser tests in tests/browser read them on a real server)."""
from __future__ import annotations

import os
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lite_llm.engine.live import CLOCK_TICKS, LiveMeter, LiveStats, ThreadLoad, merge_live, read_thread_stat
from lite_llm.engine.stats import EngineStats, StepRecord, merge_stats
from lite_llm.server.metrics import ServerMetrics
from lite_llm.server.webui import engine_stats


def write_stat(task_dir, tid: int, comm: str, utime: int, stime: int, cpu: int) -> None:
    """A /proc/<pid>/task/<tid>/stat line: 52 fields, utime 14, stime 15, processor 39."""
    fields = ["S"] + ["0"] * 49            # fields 3..52
    fields[14 - 3], fields[15 - 3], fields[39 - 3] = str(utime), str(stime), str(cpu)
    (task_dir / str(tid)).mkdir(exist_ok=True)
    (task_dir / str(tid) / "stat").write_text(f"{tid} ({comm}) " + " ".join(fields) + "\n")


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_stat_fields_are_counted_after_the_last_parenthesis(tmp_path):
    write_stat(tmp_path, 7, "a) (b c", utime=250, stime=50, cpu=3)   # a command name can hold both
    assert read_thread_stat(str(tmp_path), 7) == (300 / CLOCK_TICKS, 3)
    assert read_thread_stat(str(tmp_path), 8) is None


def test_real_thread_stat_follows_the_threads_own_cpu_time():
    """/proc/self/task/<tid>/stat of a spinning thread against its own thread_time()."""
    out = {}

    def spin():
        tid = threading.get_native_id()
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        out["mine"] = time.thread_time()
        out["proc"] = read_thread_stat("/proc/self/task", tid)[0]

    t = threading.Thread(target=spin)
    t.start()
    t.join()
    assert abs(out["proc"] - out["mine"]) <= 2.0 / CLOCK_TICKS + 0.02   # ticks vs ns accounting


def test_busy_and_rates_over_one_window_shared_by_every_reader(tmp_path):
    clock, wall = Clock(), Clock()
    meter = LiveMeter(interval=0.9, task_dir=str(tmp_path), clock=clock, wall=wall)
    write_stat(tmp_path, 11, "python", 1000, 0, 0)
    write_stat(tmp_path, 12, "python", 500, 0, 1)
    meter.attach([11, 12], (0, 1), measured_bandwidth=20e9)
    clock.t += 2.0
    write_stat(tmp_path, 11, "python", 1000 + 180, 10, 0)     # 1.9 s of 2 s: busy 0.95
    write_stat(tmp_path, 12, "python", 500 + 2, 0, 0)         # 0.02 s, and it moved to CPU 0
    a = meter.sample(prompt_tokens_total=40, generation_tokens_total=300)
    assert a.window_seconds == pytest.approx(2.0)
    assert a.prompt_tokens_per_second == pytest.approx(20.0)
    assert a.generation_tokens_per_second == pytest.approx(150.0)
    assert [(t.thread, t.tid, t.cpu, t.last_cpu) for t in a.threads] == [(0, 11, 0, 0), (1, 12, 1, 0)]
    assert a.threads[0].busy == pytest.approx(0.95) and a.threads[1].busy == pytest.approx(0.01)
    assert a.measured_bandwidth == 20e9
    clock.t += 0.5                         # within the window: every reader gets the same sample
    write_stat(tmp_path, 11, "python", 5000, 0, 0)
    assert meter.sample(10_000, 10_000) is a
    clock.t += 0.5                         # 1.0 s after the first sample: a new window
    (tmp_path / "12" / "stat").unlink()    # thread 12 exited
    b = meter.sample(prompt_tokens_total=40, generation_tokens_total=350)
    assert b is not a and b.window_seconds == pytest.approx(1.0)
    assert b.generation_tokens_per_second == pytest.approx(50.0) and b.prompt_tokens_per_second == 0.0
    assert b.threads[0].busy == 1.0        # 38.1 s of CPU in 1 s (a stale tick burst): capped at one CPU
    assert b.threads[1].busy is None and b.threads[1].cpu_seconds is None


def test_no_window_before_attach_and_unbound_threads(tmp_path):
    meter = LiveMeter(task_dir=str(tmp_path), clock=Clock(), wall=Clock())
    first = meter.sample(0, 0)
    assert first.threads == () and first.generation_tokens_per_second is None
    write_stat(tmp_path, 5, "x", 0, 0, 1)
    meter.attach([5, -2], ())             # -2: a thread that never ran; () : nobind
    assert [(t.cpu, t.tid) for t in meter.sample(0, 0).threads] in ([], [(None, 5)])


def _stats(live) -> EngineStats:
    return EngineStats(num_running=3, num_waiting=1, kv_cache_usage=0.25, prompt_tokens_total=10,
                       generation_tokens_total=99, live=live,
                       recent_steps=(StepRecord(4, 4, 0.001, 0.01, 10**8),))   # 10 GB/s decode


def test_metrics_and_stats_json_show_the_same_window():
    live = LiveStats(time=1.7e9, window_seconds=1.25, prompt_tokens_per_second=12.5,
                     generation_tokens_per_second=321.0625,
                     threads=(ThreadLoad(0, 101, 0, 0, 3.5, 0.875), ThreadLoad(1, 102, 1, 1, 1.0, 0.0625)),
                     measured_bandwidth=20e9)
    st = _stats(live)
    info = {"kernel_variant": "avx2", "num_threads": 2, "kv_cache_blocks": 36, "thread_plan": ["rank 0: ..."]}
    text = ServerMetrics("m", info).render(st)
    samples = {(s.name, s.labels.get("thread")): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    doc = engine_stats(st, info, ("m",))
    assert samples[("lite_llm:generation_tokens_per_second", None)] == doc["live"]["generation_tokens_per_second"]
    assert samples[("lite_llm:prompt_tokens_per_second", None)] == doc["live"]["prompt_tokens_per_second"]
    assert samples[("lite_llm:stats_window_end_timestamp_seconds", None)] == doc["live"]["time"]
    for t in doc["live"]["threads"]:
        assert samples[("lite_llm:engine_thread_busy_ratio", str(t["thread"]))] == t["busy"]
        assert samples[("lite_llm:engine_thread_cpu_seconds_total", str(t["thread"]))] == t["cpu_seconds_total"]
    assert doc["bandwidth"]["decode_bytes_per_second"] == pytest.approx(1e10)
    assert samples[("lite_llm:decode_memory_bandwidth_roofline_ratio", None)] == doc["bandwidth"]["roofline_ratio"] \
        == pytest.approx(0.5)
    assert samples[("lite_llm:memory_bandwidth_measured_bytes_per_second", None)] == 20e9
    assert doc["kv_cache"]["blocks_used"] == 9 and doc["kv_cache"]["blocks_free"] == 27
    assert samples[("lite_llm:kv_cache_usage_perc", None)] == doc["kv_cache"]["usage"]
    # each thread's series is labelled with its planned CPU, as `info` prints the plan
    cpus = {s.labels["thread"]: s.labels["cpu"] for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "lite_llm:engine_thread_busy_ratio"}
    assert cpus == {"0": "0", "1": "1"}


def test_replicas_merge_rates_and_keep_each_replicas_threads():
    a = LiveStats(10.0, 1.0, 5.0, 50.0, (ThreadLoad(0, 1, 0, 0, 1.0, 0.5),), 10e9)
    b = LiveStats(11.0, 1.1, 1.0, 30.0, (ThreadLoad(0, 2, 8, 8, 2.0, 0.25),), 12e9)
    m = merge_stats([EngineStats(live=a), EngineStats(live=b)]).live
    assert (m.prompt_tokens_per_second, m.generation_tokens_per_second, m.measured_bandwidth) == (6.0, 80.0, 22e9)
    assert [(t.engine, t.tid, t.cpu) for t in m.threads] == [(0, 1, 0), (1, 2, 8)]
    assert merge_live([None, None]) is None
    text = ServerMetrics("m").render(None, [EngineStats(live=a), EngineStats(live=b)])
    busy = {(s.labels["engine"], s.labels["cpu"]): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "lite_llm:engine_thread_busy_ratio"}
    assert busy == {("0", "0"): 0.5, ("1", "8"): 0.25}


def test_the_engine_thread_attaches_its_own_openmp_threads():
    """The pool's thread ids come from the compiled probe on the thread that calls it (the
    engine thread); they are this process's threads while that thread lives (libgomp ends a
    thread's pool with it)."""
    from lite_llm.cpu import cpu_probe
    meter = LiveMeter()
    done = {}

    def engine_thread():
        tids = cpu_probe().thread_ids(2)
        meter.attach(tids, (0, 1))
        done.update(tids=tids, me=threading.get_native_id(),
                    exist=[os.path.exists(f"/proc/self/task/{tid}") for tid in tids],
                    sampled=[x.tid for x in meter.sample(0, 0).threads])

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert done["tids"][0] == done["me"]                        # OpenMP thread 0 is the caller
    assert len(set(done["tids"])) == 2 and all(done["exist"])
    assert done["sampled"] == done["tids"]
